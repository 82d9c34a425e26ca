//! A connection to one server that heals: when the server fails (it
//! crashed and the supervisor restarted it, or the network broke), the next
//! call opens a new connection instead of failing forever.
//!
//! # What is and is not retried
//! Nothing is retried. A call in flight when the connection fails returns
//! its error (`EIO`): it may or may not have been applied (a create, a
//! write), and only the caller knows whether repeating it is safe. The
//! *following* calls reconnect first. Reconnection is tried at most every
//! [`RETRY_EVERY`], so a server that is down costs callers one fast error
//! each rather than a connection attempt each.
//!
//! A reconnect runs the owner's `hello` on the new connection before it is
//! used (the metadata session's authentication); capabilities held for io
//! servers stay valid, since they are signed by the cluster secret, not
//! bound to a connection.
//!
//! Reconnecting blocks the calling thread on the transport's loop, so these
//! calls must not be made from a runtime task (as the blocking client calls
//! already must not).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use dafne_transport::{Client, TransportError};

/// The least time between two reconnection attempts.
pub const RETRY_EVERY: Duration = Duration::from_millis(250);

type Hello = dyn Fn(&Client) -> Result<(), String> + Send + Sync;

pub(crate) struct Link {
    current: RwLock<Client>,
    broken: AtomicBool,
    last_try: Mutex<Option<Instant>>,
    hello: Box<Hello>,
    reconnects: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.peek().remote_addr())
            .field("broken", &self.broken.load(Ordering::Relaxed))
            .finish()
    }
}

/// Whether an error means the connection itself is gone.
pub(crate) fn is_connection_loss(e: &TransportError) -> bool {
    matches!(e, TransportError::PeerFailed { .. } | TransportError::Unreachable { .. })
}

impl Link {
    pub(crate) fn new(client: Client, hello: Box<Hello>) -> Link {
        Link {
            current: RwLock::new(client),
            broken: AtomicBool::new(false),
            last_try: Mutex::new(None),
            hello,
            reconnects: Default::default(),
        }
    }

    /// The current connection, whatever its state.
    pub(crate) fn peek(&self) -> Client {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The connection to call on: the current one, or a new one if it
    /// failed. `None` when it failed and no new one could be made (now or
    /// within the last [`RETRY_EVERY`]).
    pub(crate) fn get(&self) -> Option<Client> {
        if !self.broken.load(Ordering::Acquire) {
            return Some(self.peek());
        }
        let mut last = self.last_try.lock().unwrap_or_else(|p| p.into_inner());
        if !self.broken.load(Ordering::Acquire) {
            // Another thread reconnected while this one waited.
            return Some(self.peek());
        }
        if last.is_some_and(|t| t.elapsed() < RETRY_EVERY) {
            return None;
        }
        *last = Some(Instant::now());
        let old = self.peek();
        let fresh = match old.reconnect() {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("reconnecting to {}: {e}", old.remote_addr());
                return None;
            }
        };
        if let Err(e) = (self.hello)(&fresh) {
            tracing::warn!("reconnected to {} but the server refused the session: {e}", old.remote_addr());
            return None;
        }
        tracing::info!("reconnected to {}", old.remote_addr());
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        self.broken.store(false, Ordering::Release);
        Some(fresh)
    }

    /// Records a call's failure: a lost connection is replaced at the next
    /// call.
    pub(crate) fn failed(&self, e: &TransportError) {
        if is_connection_loss(e) {
            self.broken.store(true, Ordering::Release);
        }
    }

    /// New connections made so far.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }
}
