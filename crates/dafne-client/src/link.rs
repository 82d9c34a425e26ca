//! A connection to one server that heals: when the server fails (it
//! crashed and the supervisor restarted it, or the network broke), the next
//! call opens a new connection instead of failing forever.
//!
//! # What is and is not retried
//! The link retries nothing by itself. A call in flight when the
//! connection fails returns its error (`EIO`) to its caller, which decides
//! whether repeating it is safe: the metadata session repeats its
//! exactly-once calls (the server's replay cache makes that safe) and the
//! calls that do the same when done twice, the data client its io
//! requests that do (crate docs, "Exactly-once" and "Riding over a
//! restart"; `data`), on the next connection, until [`retry_deadline`].
//! The *following* calls reconnect first. Reconnection is tried at most
//! every [`RETRY_EVERY`], so a server that is down costs a caller that
//! does not repeat one fast error, and one that does a pause of that
//! length between tries, rather than a connection attempt each. While one
//! thread reconnects, the others wait for it (at most
//! [`WAIT_FOR_RECONNECT`]) and then use the new connection, so that the
//! threads of a program all go on after a server restart; they get no
//! connection when that attempt failed, or when it is still under way
//! after the wait (a server that does not answer). Warnings that would
//! repeat at every call while a server is down go through [`Throttle`].
//!
//! # A link not connected yet
//! A link can also start without a connection ([`Link::not_connected`]:
//! the data client's to an io server it could not reach when it started,
//! one restarting or down). It starts as one whose connection was just
//! lost: its first call makes the connection, through the same machinery
//! and with the same pauses, and its time out of reach counts from when
//! its maker first tried to reach the server (given to the link), so a
//! call to a server that never comes back fails as one to a server lost
//! at that moment would. The connection is made on
//! the runtime of another connection (`via`), which the link keeps.
//!
//! # Generations
//! Each connection has a generation: 0 for the first, one more for each
//! reconnection (a link made not connected has no connection 0: its first
//! is 1). [`Link::get`] hands it out with the connection, and a
//! caller reports a failure with the generation of the connection that
//! failed, so that a late error from a connection already replaced does
//! not break its successor. The generation is also the data client's write
//! verifier (see `data`): a reconnection may mean a restarted server that
//! lost what it had only in memory, and a client that knows which
//! connection carried a write can tell when that happened.
//!
//! A reconnect runs the owner's `hello` on the new connection before it is
//! used (the metadata session's authentication, and its re-announcing of
//! the files it holds open); capabilities held for io
//! servers stay valid, since they are signed by the cluster secret, not
//! bound to a connection.
//!
//! Reconnecting ([`Link::get`]) blocks the calling thread on the
//! transport's loop, so it must not be called from a runtime task (as the
//! blocking client calls already must not), and for up to the connect
//! timeout (10 s) where the server accepts no connection (a stopped
//! process). A caller that runs other work on its thread (a completion
//! queue's driver runs all its requests on one) uses [`Link::get_async`]
//! instead: the reconnection runs on a thread of its own, and the caller
//! waits for it without blocking. The data client's io requests and the
//! metadata session's calls (`MetaSession::request_async`) do.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, TryLockError};
use std::time::{Duration, Instant};

use dafne_transport::{Client, TransportError};

/// The least time between two reconnection attempts.
pub const RETRY_EVERY: Duration = Duration::from_millis(250);

/// Pauses of [`pause`] not over yet, and the thread that ends them.
struct Pauses {
    due: Mutex<Vec<(Instant, futures::channel::oneshot::Sender<()>)>>,
    changed: std::sync::Condvar,
}

impl Pauses {
    /// The process's, its thread started at the first pause; `None` when
    /// the thread could not be started.
    fn get() -> Option<&'static Pauses> {
        static PAUSES: std::sync::OnceLock<Option<&'static Pauses>> = std::sync::OnceLock::new();
        *PAUSES.get_or_init(|| {
            let p: &'static Pauses =
                Box::leak(Box::new(Pauses { due: Mutex::new(Vec::new()), changed: std::sync::Condvar::new() }));
            std::thread::Builder::new().name("dafne-pauses".into()).spawn(move || p.run()).ok().map(|_| p)
        })
    }

    /// Ends every pause that is over, then waits for the next one's end
    /// or a new pause.
    fn run(&self) {
        let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let now = Instant::now();
            let mut i = 0;
            while i < due.len() {
                if due[i].0 <= now {
                    // A pause whose future was dropped: nobody to wake.
                    let _ = due.swap_remove(i).1.send(());
                } else {
                    i += 1;
                }
            }
            due = match due.iter().map(|(t, _)| *t).min() {
                Some(next) => {
                    self.changed.wait_timeout(due, next - now).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0)
                }
                None => self.changed.wait(due).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

/// Waits `d` without blocking the thread that polls it: a completion
/// queue runs all its requests on one driver thread, and a request that
/// slept there held up every other (many refused at once by a server not
/// serving were each sent again only after all the others' sleeps, past
/// their deadline). Falls back to sleeping the thread if the pauses'
/// thread cannot be started.
pub(crate) async fn pause(d: Duration) {
    let Some(p) = Pauses::get() else {
        std::thread::sleep(d);
        return;
    };
    let (tx, rx) = futures::channel::oneshot::channel();
    p.due.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now() + d, tx));
    p.changed.notify_one();
    let _ = rx.await;
}

/// The longest a caller waits for another thread's reconnection: one
/// connection attempt to a server that is up takes milliseconds; one that
/// takes longer is to a server that is not answering, and callers should
/// not all hang on it.
pub const WAIT_FOR_RECONNECT: Duration = Duration::from_secs(2);

/// How often a waiting caller looks whether the reconnection finished.
const WAIT_POLL: Duration = Duration::from_millis(2);

/// The environment variable that sets the retry deadline (whole seconds,
/// 1 to 86400), read once per process: see [`retry_deadline`].
pub const RETRY_DEADLINE_ENV: &str = "DAFNE_RETRY_DEADLINE_S";

/// How long a call that may be repeated keeps being sent again on new
/// connections after its connection was lost (crate docs, "Riding over a
/// restart"): [`crate::RETRY_DEADLINE`], or the seconds in
/// `$DAFNE_RETRY_DEADLINE_S` (an unusable value is warned about once and
/// the default used).
pub fn retry_deadline() -> Duration {
    static DEADLINE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *DEADLINE.get_or_init(|| match std::env::var(RETRY_DEADLINE_ENV) {
        Err(_) => crate::RETRY_DEADLINE,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) if (1..=86_400).contains(&s) => Duration::from_secs(s),
            _ => {
                tracing::warn!(
                    "{RETRY_DEADLINE_ENV}={v:?} is not a number of seconds from 1 to 86400: using {:?}",
                    crate::RETRY_DEADLINE
                );
                crate::RETRY_DEADLINE
            }
        },
    })
}

/// How often a throttled warning of one kind is written at most.
pub const WARN_EVERY: Duration = Duration::from_secs(5);

/// Warnings that repeat while a server is down (one per failed call, one
/// per reconnect), written at most once per [`WARN_EVERY`] per key (a
/// server's address, a kind of failure), with the count of those held back
/// since the last one written.
#[derive(Debug, Default)]
pub struct Throttle {
    last: Mutex<std::collections::HashMap<String, (Instant, u64)>>,
}

impl Throttle {
    /// `Some(suppressed)` when a warning for `key` may be written now
    /// (`suppressed`: how many were held back since the last one); `None`
    /// when it is to be held back (and counted).
    pub fn allow(&self, key: &str) -> Option<u64> {
        self.allow_at(key, Instant::now())
    }

    /// [`Self::allow`] at time `now`.
    fn allow_at(&self, key: &str, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.get_mut(key) {
            Some((at, held)) if now.duration_since(*at) < WARN_EVERY => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                *at = now;
                Some(std::mem::take(held))
            }
            None => {
                // Bounded: keys are server addresses and kinds of failure;
                // a map grown past any real cluster is started afresh.
                if last.len() >= 4096 {
                    last.clear();
                }
                last.insert(key.to_string(), (now, 0));
                Some(0)
            }
        }
    }
}

/// The process's throttle for the client library's repeating warnings.
pub fn throttle() -> &'static Throttle {
    static T: std::sync::OnceLock<Throttle> = std::sync::OnceLock::new();
    T.get_or_init(Throttle::default)
}

/// " (N more like it in the last 5 s not shown)", or nothing.
pub fn suppressed_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more like it since the last one not shown)")
    }
}

/// What runs on a new connection before it is used, given the generation
/// it will have.
pub(crate) type Hello = dyn Fn(&Client, Generation) -> Result<(), String> + Send + Sync;

/// Which connection of a [`Link`] carried a call: 0 for the first, +1 for
/// each reconnection.
pub(crate) type Generation = u64;

/// The connection in use and its generation.
struct Current {
    /// `None` until the first connection of a link made not connected.
    client: Option<Client>,
    generation: Generation,
}

pub(crate) struct Link {
    /// The server's address.
    addr: SocketAddr,
    /// A connection to another server on the same runtime, through which
    /// the first connection of a link made not connected is made
    /// ([`Link::not_connected`]); `None` for a link made connected.
    via: Option<Client>,
    current: RwLock<Current>,
    /// The current connection failed (or there is none yet); set and
    /// cleared only under `current`'s lock (read to set, write to clear),
    /// so that setting it for one generation cannot break the next. Clear
    /// only while `current` holds a connection.
    broken: AtomicBool,
    /// Held by the thread that reconnects; when it last tried.
    attempt: Mutex<Option<Instant>>,
    /// When the current connection was found lost (`None` while it
    /// serves): calls stop repeating once the server has been out of reach
    /// for the retry deadline, so that a server that stays down costs each
    /// later call one reconnection attempt, not a whole deadline.
    down_since: Mutex<Option<Instant>>,
    hello: Box<Hello>,
    /// The reconnection [`Link::get_async`] runs on a thread of its own.
    background: Mutex<Background>,
}

/// Whether a reconnection of [`Link::get_async`] is under way, and the
/// callers waiting for its end.
#[derive(Default)]
struct Background {
    running: bool,
    waiting: Vec<futures::channel::oneshot::Sender<()>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.addr)
            .field("generation", &self.generation())
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
            addr: client.remote_addr(),
            via: None,
            current: RwLock::new(Current { client: Some(client), generation: 0 }),
            broken: AtomicBool::new(false),
            attempt: Mutex::new(None),
            down_since: Mutex::new(None),
            hello,
            background: Mutex::new(Background::default()),
        }
    }

    /// A link to the server at `addr` with no connection yet (module docs,
    /// "A link not connected yet"): as one whose connection was lost at
    /// `since` (when the first try to reach it began: a try that timed out
    /// already spent part of the retry deadline). Its connections are made
    /// on `via`'s runtime (`via`: a connection to another server, kept).
    pub(crate) fn not_connected(addr: SocketAddr, via: Client, hello: Box<Hello>, since: Instant) -> Link {
        Link {
            addr,
            via: Some(via),
            current: RwLock::new(Current { client: None, generation: 0 }),
            broken: AtomicBool::new(true),
            // No attempt yet: the first call tries at once.
            attempt: Mutex::new(None),
            down_since: Mutex::new(Some(since)),
            hello,
            background: Mutex::new(Background::default()),
        }
    }

    /// The server's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current connection, whatever its state, and its generation;
    /// `None` before the first connection of a link made not connected.
    pub(crate) fn peek(&self) -> Option<(Client, Generation)> {
        let c = self.current.read().unwrap_or_else(|p| p.into_inner());
        c.client.clone().map(|client| (client, c.generation))
    }

    /// The current connection unless it failed (or there is none yet):
    /// never reconnects, never blocks.
    pub(crate) fn serving(&self) -> Option<(Client, Generation)> {
        // `broken` first: it is cleared after the connection is installed,
        // so one seen clear comes with the connection that cleared it.
        if self.broken.load(Ordering::Acquire) {
            return None;
        }
        self.peek()
    }

    /// The current connection's generation (0 also before the first
    /// connection of a link made not connected).
    pub(crate) fn generation(&self) -> Generation {
        self.current.read().unwrap_or_else(|p| p.into_inner()).generation
    }

    /// The connection to call on and its generation: the current one, or
    /// a new one if it failed. While another thread reconnects, waits for
    /// it (at most [`WAIT_FOR_RECONNECT`]). `None` when it failed and no
    /// new one could be made: the attempt failed, one was made within the
    /// last [`RETRY_EVERY`], or another thread's attempt outlasted the wait.
    pub(crate) fn get(&self) -> Option<(Client, Generation)> {
        let waiting = Instant::now();
        loop {
            // Not broken: there is a connection (`broken` is cleared only
            // with one installed).
            if let Some(current) = self.serving() {
                return Some(current);
            }
            match self.attempt.try_lock() {
                Ok(last) => return self.reconnect(last),
                Err(TryLockError::Poisoned(p)) => return self.reconnect(p.into_inner()),
                // Another thread is reconnecting: its new connection is
                // this caller's too, unless the attempt fails or hangs.
                Err(TryLockError::WouldBlock) if waiting.elapsed() < WAIT_FOR_RECONNECT => {
                    std::thread::sleep(WAIT_POLL)
                }
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// [`Self::get`] without blocking the thread that polls it: the
    /// reconnection (a connect that waits up to the connect timeout for a
    /// server that accepts nothing, then the owner's `hello`) runs on a
    /// thread of its own, which `spawn` starts to run
    /// [`Self::reconnect_in_background`] (false: it could not, and this
    /// caller reconnects on its own thread instead). Callers that come
    /// while it runs wait for the same one. `None` as for [`Self::get`]:
    /// the attempt failed, one began within the last [`RETRY_EVERY`], or it
    /// outlasted [`WAIT_FOR_RECONNECT`].
    pub(crate) async fn get_async(&self, spawn: impl FnOnce() -> bool) -> Option<(Client, Generation)> {
        if let Some(current) = self.serving() {
            return Some(current);
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        {
            let mut b = self.background.lock().unwrap_or_else(|p| p.into_inner());
            if !b.running {
                // No thread for an attempt that would give up at once.
                if let Ok(last) = self.attempt.try_lock() {
                    if last.is_some_and(|t| t.elapsed() < RETRY_EVERY) {
                        return None;
                    }
                }
                b.running = true;
                // Under the lock: the thread's end, which takes it, wakes
                // this caller's `tx`, pushed below.
                if !spawn() {
                    b.running = false;
                    drop(b);
                    return self.get();
                }
            }
            b.waiting.push(tx);
        }
        futures::future::select(rx, Box::pin(pause(WAIT_FOR_RECONNECT))).await;
        self.serving()
    }

    /// The reconnection of [`Self::get_async`], on the thread it started:
    /// wakes the callers waiting for it when done, whatever came of it (a
    /// panic included: the next call starts another attempt instead of
    /// waiting for one that is gone).
    pub(crate) fn reconnect_in_background(&self) {
        /// Ends the attempt when dropped, also while unwinding.
        struct Done<'a>(&'a Mutex<Background>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut b = self.0.lock().unwrap_or_else(|p| p.into_inner());
                b.running = false;
                for tx in b.waiting.drain(..) {
                    // A caller that stopped waiting dropped its end.
                    let _ = tx.send(());
                }
            }
        }
        let _done = Done(&self.background);
        let last = self.attempt.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.reconnect(last);
    }

    /// Reconnects, holding the attempt (`last`: when the last one began).
    fn reconnect(&self, mut last: MutexGuard<'_, Option<Instant>>) -> Option<(Client, Generation)> {
        if let Some(current) = self.serving() {
            // Another thread reconnected just before.
            return Some(current);
        }
        if last.is_some_and(|t| t.elapsed() < RETRY_EVERY) {
            return None;
        }
        *last = Some(Instant::now());
        let addr = self.addr;
        // A new connection on the runtime of the old one, or, before the
        // first, of `via`'s.
        let dialed = match (self.peek(), &self.via) {
            (Some((old, _)), _) => old.reconnect(),
            (None, Some(via)) => via.connect_to(addr),
            (None, None) => {
                tracing::error!("the link to {addr} has neither a connection nor one to make one through");
                return None;
            }
        };
        let fresh = match dialed {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("reconnecting to {addr}: {e}");
                return None;
            }
        };
        // The attempt is held: no other connection is installed before this
        // one, which gets the next generation.
        let next = self.generation() + 1;
        if let Err(e) = (self.hello)(&fresh, next) {
            if let Some(n) = throttle().allow(&format!("refused {addr}")) {
                tracing::warn!("reconnected to {addr} but the server refused the session: {e}{}", suppressed_note(n));
            }
            return None;
        }
        tracing::info!("{} {addr}", if next == 1 && self.via.is_some() { "connected to" } else { "reconnected to" });
        let generation = self.install(fresh.clone());
        Some((fresh, generation))
    }

    /// Makes `fresh` the current connection (the attempt is held): its
    /// generation.
    fn install(&self, fresh: Client) -> Generation {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        cur.client = Some(fresh);
        cur.generation += 1;
        self.broken.store(false, Ordering::Release);
        *self.down_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        cur.generation
    }

    /// How long the server has been out of reach (since its connection
    /// was found lost, with no new one made since); zero while it serves.
    pub(crate) fn down_for(&self) -> Duration {
        self.down_since.lock().unwrap_or_else(|p| p.into_inner()).map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Whether a call that began at `began` and met a lost connection is
    /// past the retry deadline: its own time, or the server's time out of
    /// reach (module docs).
    pub(crate) fn past_deadline(&self, began: Instant) -> bool {
        self.past_deadline_of(began, retry_deadline())
    }

    /// [`Self::past_deadline`] with a deadline of the caller's.
    pub(crate) fn past_deadline_of(&self, began: Instant, deadline: Duration) -> bool {
        began.elapsed() >= deadline || self.down_for() >= deadline
    }

    /// Records the failure of a call made on the connection of
    /// `generation`: a lost connection is replaced at the next call, unless
    /// it was replaced already (a late error from an old connection leaves
    /// the new one alone).
    pub(crate) fn failed(&self, generation: Generation, e: &TransportError) {
        if !is_connection_loss(e) {
            return;
        }
        let cur = self.current.read().unwrap_or_else(|p| p.into_inner());
        if cur.generation == generation {
            self.broken.store(true, Ordering::Release);
            self.down_since.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Instant::now);
        }
    }

    /// New connections made so far (the first of a link made not
    /// connected included).
    pub(crate) fn reconnects(&self) -> u64 {
        self.generation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_io;

    fn loss() -> TransportError {
        TransportError::PeerFailed { peer: "test".into(), reason: "lost".into() }
    }

    fn link_to(rt: &dafne_transport::Runtime, addr: std::net::SocketAddr) -> Link {
        Link::new(Client::connect(rt, addr).unwrap(), Box::new(|_: &Client, _| Ok(())))
    }

    #[test]
    fn a_late_failure_of_a_replaced_connection_leaves_the_new_one_alone() {
        let (_server, addr, _) = fake_io::start();
        let rt = fake_io::runtime("link-late");
        let link = link_to(&rt, addr);
        let (_, first) = link.get().unwrap();
        assert_eq!(first, 0);
        assert_eq!(link.down_for(), Duration::ZERO);
        link.failed(first, &loss());
        std::thread::sleep(Duration::from_millis(5));
        assert!(link.down_for() > Duration::ZERO, "a lost connection starts the time out of reach");
        let (_, second) = link.get().expect("the server is up: the link reconnects");
        assert_eq!(second, 1);
        assert_eq!(link.down_for(), Duration::ZERO, "a new connection ends it");
        // Another call that was in flight on the first connection fails late.
        link.failed(first, &loss());
        assert!(!link.broken.load(Ordering::Acquire), "a late error of the old connection broke the new one");
        assert_eq!(link.get().map(|(_, g)| g), Some(1));
        assert_eq!(link.reconnects(), 1);
        // An error that is not a loss breaks nothing; a loss of the
        // current connection does.
        link.failed(second, &TransportError::TimedOut { what: "call", after: Duration::from_secs(1) });
        assert!(!link.broken.load(Ordering::Acquire));
        link.failed(second, &loss());
        assert!(link.broken.load(Ordering::Acquire));
    }

    #[test]
    fn a_throttled_warning_is_written_once_per_period_and_key_with_the_count_held_back() {
        let t = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(t.allow_at("io a", t0), Some(0));
        assert_eq!(t.allow_at("io a", t0 + Duration::from_secs(1)), None);
        assert_eq!(t.allow_at("io a", t0 + Duration::from_secs(2)), None);
        // Another key has its own turn.
        assert_eq!(t.allow_at("io b", t0 + Duration::from_secs(2)), Some(0));
        // After the period: written, with the two held back.
        assert_eq!(t.allow_at("io a", t0 + WARN_EVERY), Some(2));
        assert_eq!(t.allow_at("io a", t0 + WARN_EVERY + Duration::from_secs(1)), None);
    }

    /// A reconnection of [`Link::get_async`] whose thread panics (the
    /// owner's `hello` here: no real server can make one) still ends the
    /// attempt: the link's later calls reconnect. Failed before its end
    /// was a guard's: `running` stayed set, and every later call waited
    /// [`WAIT_FOR_RECONNECT`] for a thread that was gone and got no
    /// connection, for good.
    #[test]
    fn a_reconnection_thread_that_panics_leaves_the_link_able_to_reconnect() {
        let (_server, addr, _) = fake_io::start();
        let rt = fake_io::runtime("link-panic");
        let panic_once = std::sync::Arc::new(AtomicBool::new(true));
        let p = panic_once.clone();
        let link = std::sync::Arc::new(Link::new(
            Client::connect(&rt, addr).unwrap(),
            Box::new(move |_: &Client, _| {
                assert!(!p.swap(false, Ordering::SeqCst), "hello panics (test)");
                Ok(())
            }),
        ));
        let spawn = |l: std::sync::Arc<Link>| {
            move || std::thread::Builder::new().spawn(move || l.reconnect_in_background()).is_ok()
        };
        link.failed(0, &loss());
        assert_eq!(futures::executor::block_on(link.get_async(spawn(link.clone()))).map(|(_, g)| g), None);
        assert!(!panic_once.load(Ordering::SeqCst), "the first reconnection ran its hello");
        let deadline = Instant::now() + Duration::from_secs(30);
        let generation = loop {
            if let Some((_, g)) = futures::executor::block_on(link.get_async(spawn(link.clone()))) {
                break g;
            }
            assert!(Instant::now() < deadline, "the link never reconnected after its reconnection thread panicked");
            std::thread::sleep(RETRY_EVERY);
        };
        assert_eq!(generation, 1);
    }

    /// Two requests that find the same connection lost at once start one
    /// reconnection thread between them, and both go on on its connection.
    #[test]
    fn requests_that_need_one_reconnection_at_once_share_one_thread() {
        let (_server, addr, _) = fake_io::start();
        let rt = fake_io::runtime("link-share");
        let link = std::sync::Arc::new(link_to(&rt, addr));
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let spawn = |l: std::sync::Arc<Link>| {
            let started = started.clone();
            move || {
                started.fetch_add(1, Ordering::SeqCst);
                std::thread::Builder::new().spawn(move || l.reconnect_in_background()).is_ok()
            }
        };
        link.failed(0, &loss());
        // The first holds the attempt's lock as if its connect hung: the
        // second arrives while that reconnection is under way.
        let attempt = link.attempt.lock().unwrap();
        let (a, b) = futures::executor::block_on(async {
            let a = link.get_async(spawn(link.clone()));
            let b = async {
                // `a` was polled first (join polls in order) and started the thread.
                drop(attempt);
                link.get_async(spawn(link.clone())).await
            };
            futures::future::join(a, b).await
        });
        assert_eq!(started.load(Ordering::SeqCst), 1, "two reconnection threads for one lost connection");
        assert_eq!(a.map(|(_, g)| g), Some(1));
        assert_eq!(b.map(|(_, g)| g), Some(1));
    }

    /// A link made not connected is as one whose connection was lost when
    /// it was made: no connection to call on while its server is out of
    /// reach, the time out of reach counted from its making, and its first
    /// call after the server listens makes the connection (generation 1),
    /// on the runtime of the connection it was made through.
    #[test]
    fn a_link_made_not_connected_connects_once_its_server_listens() {
        let (_via_server, via_addr, _) = fake_io::start();
        let rt = fake_io::runtime("link-not-connected");
        let addr = fake_io::nothing_at();
        let link = Link::not_connected(
            addr,
            Client::connect(&rt, via_addr).unwrap(),
            Box::new(|_: &Client, _| Ok(())),
            Instant::now(),
        );
        assert_eq!(link.addr(), addr);
        assert!(link.peek().is_none());
        assert!(link.get().is_none(), "a connection to an address where nothing listens");
        std::thread::sleep(Duration::from_millis(5));
        assert!(link.down_for() > Duration::ZERO, "out of reach since the link was made");
        assert!(link.past_deadline_of(Instant::now(), Duration::from_millis(1)));
        let (_server, _, _) = fake_io::start_at(addr);
        std::thread::sleep(RETRY_EVERY); // the link tries again only after this
        let (c, generation) = link.get().expect("the server listens: the link connects");
        assert_eq!((c.remote_addr(), generation), (addr, 1));
        assert_eq!(link.down_for(), Duration::ZERO);
        assert_eq!(link.reconnects(), 1);
        assert_eq!(link.get().map(|(_, g)| g), Some(1), "the connection is kept");
    }

    #[test]
    fn callers_wait_for_another_threads_reconnection_and_use_it() {
        let (_server, addr, _) = fake_io::start();
        let rt = fake_io::runtime("link-busy");
        let link = link_to(&rt, addr);
        link.failed(0, &loss());
        let got = std::thread::scope(|s| {
            // This thread "is reconnecting": it holds the attempt while
            // another caller arrives.
            let attempt = link.attempt.lock().unwrap();
            let waiter = s.spawn(|| link.get().map(|(_, g)| g));
            std::thread::sleep(Duration::from_millis(50)); // let it reach the wait
            link.install(Client::connect(&rt, addr).unwrap());
            drop(attempt);
            waiter.join().unwrap()
        });
        assert_eq!(got, Some(1), "a caller failed while another thread was reconnecting successfully");
        assert_eq!(link.reconnects(), 1, "the waiting caller reconnected again");
    }
}
