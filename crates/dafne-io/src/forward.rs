//! Chain writes (docs/REPLICATION.md, "Writes"; protocol 19): an io
//! server that is a chain's head forwards each of the chain's writes to
//! the next `serving` replica, which meta names in its answer to the
//! head's heartbeat ([`dafne_proto::ChainRoute`], kept by
//! [`crate::lease::Lease::route`]).
//!
//! The forward of a `Write` is a `Write` of its own
//! ([`dafne_proto::REQUEST_FLAG_FORWARDED`], the same capability, chain
//! and version, the same stability), sent over a connection of this
//! server's own runtime to the successor, logged in with the cluster
//! secret like any server tool: its keys are the packed keys of *this*
//! server's cache slabs and its extents the cache units that hold the
//! bytes (`dafne_unifier::WriteGuard::export`), so the successor gets them
//! from the head's memory by RMA, exactly as it gets a client's (the same
//! key window and same-host checks, `crate::modes::remote_keys`), with no
//! copy on either side and nothing through meta. The head holds its
//! units while the forward runs and commits them only once the successor
//! answered, so writes of one unit are ordered by the head alone; a
//! forward that fails aborts the head's units too, and the client is
//! answered `NOT_SERVING` (`ENOTCONN`), which it sends again after a
//! pause until its retry deadline (by then meta marked a dead successor
//! offline, and the next heartbeat's answer routes around it). `Sync`,
//! `Truncate` and `Allocate` of a chain are forwarded as they are, after
//! the head did them (`Sync`: so that an fsync reaches every replica's
//! device).
//!
//! The connection to a successor is made once (on this server's event
//! loop, [`dafne_transport::Client::connect_from_loop`]) and kept; one
//! that failed is made again at the next forward.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;

use futures::future::{FutureExt as _, LocalBoxFuture, Shared};

use dafne_auth::Secret;
use dafne_proto::io::{decode_io_reply, encode_io_request, IoRequest, IoResponse};
use dafne_proto::{Envelope, Errno};
use dafne_transport::{Client, LoopLocal as Local};

use crate::lease::NOT_SERVING;

/// What forwarding did (the metrics page: `dafne_io_chain_forward*`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ForwardStats {
    /// Requests forwarded to a successor and answered done.
    pub forwards: u64,
    /// Bytes of the forwarded writes (the successor got them by RMA from
    /// this server's cache units).
    pub forwarded_bytes: u64,
    /// Forwards that failed (no connection, a refusal, an error): their
    /// client was answered `NOT_SERVING`.
    pub failures: u64,
    /// Forwarded writes this server received from a predecessor and
    /// served, and their bytes (got by RMA from the predecessor's units).
    pub received: u64,
    pub received_bytes: u64,
}

type Peer = Shared<LocalBoxFuture<'static, Result<Client, String>>>;

/// The forwarding side of one io server (module docs).
pub struct Forwarder {
    local: Rc<Local>,
    secret: Secret,
    peers: RefCell<HashMap<SocketAddr, Peer>>,
    /// Packed keys of this server's slabs, by slab address (a slab is
    /// registered once and kept: `dafne_unifier`'s ready slabs).
    keys: RefCell<HashMap<u64, Vec<u8>>>,
    stats: Cell<ForwardStats>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").field("stats", &self.stats.get()).finish_non_exhaustive()
    }
}

/// Slab keys kept at most (beyond, the map starts over).
const MAX_KEYS: usize = 4096;

impl Forwarder {
    pub fn new(local: Rc<Local>, secret: Secret) -> Forwarder {
        Forwarder { local, secret, peers: Default::default(), keys: Default::default(), stats: Default::default() }
    }

    pub fn stats(&self) -> ForwardStats {
        self.stats.get()
    }

    fn count(&self, f: impl FnOnce(&mut ForwardStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Counts a forwarded write served here.
    pub fn received(&self, bytes: u64) {
        self.count(|s| {
            s.received += 1;
            s.received_bytes += bytes;
        });
    }

    /// The packed key of `slab` (made once per slab).
    pub fn key_of(&self, slab: &dafne_ucx::Slab) -> Result<Vec<u8>, Errno> {
        if let Some(k) = self.keys.borrow().get(&slab.addr()) {
            return Ok(k.clone());
        }
        let k = slab.pack_key().map_err(|e| {
            tracing::warn!("packing a cache slab's key to forward a write: {e}");
            Errno::EIO
        })?;
        let mut keys = self.keys.borrow_mut();
        if keys.len() >= MAX_KEYS {
            keys.clear();
        }
        keys.insert(slab.addr(), k.clone());
        Ok(k)
    }

    fn peer(&self, addr: SocketAddr) -> Peer {
        if let Some(p) = self.peers.borrow().get(&addr) {
            return p.clone();
        }
        let (l, secret) = (self.local.clone(), self.secret.clone());
        let p = async move {
            let c = Client::connect_from_loop(&l, addr).await.map_err(|e| e.to_string())?;
            let nonce: [u8; 16] = rand_nonce();
            let name = format!("io server forwarding (pid {})", std::process::id());
            let mac = secret.session_mac(c.token(), &nonce, &name);
            let keys = secret.frame_keys(c.token(), &nonce);
            let req = IoRequest::Login { client_name: name, nonce, mac, credential: None };
            let bytes = c
                .login_on_loop(&l, encode_io_request(Envelope::new(0, 0, 0), &req), keys)
                .await
                .map_err(|e| e.to_string())?;
            match decode_io_reply(&bytes).map_err(|e| e.to_string())?.2 {
                Ok(IoResponse::Done) => Ok(c),
                other => Err(format!("login answered {other:?}")),
            }
        }
        .boxed_local()
        .shared();
        self.peers.borrow_mut().insert(addr, p.clone());
        p
    }

    /// Sends `req` (with `env`, marked forwarded) to the successor at
    /// `addr` and waits for its answer: `Ok` once it is done there, else
    /// `NOT_SERVING` (logged at warn), the connection dropped so that the
    /// next forward makes a new one.
    pub async fn forward(&self, addr: SocketAddr, env: Envelope, req: &IoRequest, bytes: u64) -> Result<(), Errno> {
        let env = Envelope { forwarded: true, ..env };
        let result = async {
            let c = self.peer(addr).await.map_err(|e| (format!("connecting: {e}"), true))?;
            let answer = c
                .call_on_loop(&self.local, encode_io_request(env, req))
                .await
                .map_err(|e| (format!("call: {e}"), true))?;
            match decode_io_reply(&answer).map_err(|e| (format!("answer: {e}"), true))?.2 {
                Ok(IoResponse::Write { .. } | IoResponse::Done) => Ok(()),
                other => Err((format!("answered {other:?}"), false)),
            }
        }
        .await;
        match result {
            Ok(()) => {
                self.count(|s| {
                    s.forwards += 1;
                    s.forwarded_bytes += bytes;
                });
                Ok(())
            }
            Err((why, drop_conn)) => {
                self.count(|s| s.failures += 1);
                if drop_conn {
                    self.peers.borrow_mut().remove(&addr);
                }
                tracing::warn!("forwarding {} of chain {:?} to {addr} failed: {why}", req.op(), env.chain);
                Err(NOT_SERVING)
            }
        }
    }
}

fn rand_nonce() -> [u8; 16] {
    let mut nonce = [0u8; 16];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut nonce)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        nonce = (t ^ u128::from(std::process::id())).to_le_bytes();
    }
    nonce
}
