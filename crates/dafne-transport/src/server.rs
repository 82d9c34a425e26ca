//! The server half: accepting connections, granting credits, running the
//! service's handlers, and the server-driven RMA they use.
//!
//! # Shared memory after the login
//! A client on this host gets shared memory (UCX `posix`/`sysv`, and `cma`)
//! only once the service verified its login ([`ConnHandle::set_frame_keys`]).
//! Until then its data endpoints have UCX error handling on, which in UCX
//! 1.13 keeps them on TCP, and the welcome carries this worker's
//! network-only address (`Worker::network_address`), so a peer that never
//! logs in never maps this worker's shared-memory receive FIFO through UCX
//! and this worker never maps the peer's. After the login the first reply
//! moves the connection: a new data endpoint with error handling off, and
//! a tagged `FrameKind::Upgrade` over it with the full worker address, from
//! which the client makes its own; the TCP endpoints stay open, idle, until
//! the connection ends.
//!
//! Why: UCX's shared-memory transports trust the peer. Each end uses its
//! *own* `UCX_MM_FIFO_SIZE` (and `FIFO_ELEM_SIZE`) for the other's FIFO; the
//! sizes travel nowhere. A same-host peer with a FIFO of 1024 elements
//! against this server's 256 wrote its messages where the server does not
//! read and advanced the FIFO's head past them: `uct_mm_iface_event_fd_arm`
//! then answers BUSY for ever (head > read index) while polling finds
//! nothing, so the loop spun a core for good, after the peer was killed
//! too, and no client was answered again (measured: 1.85–2.09 s of CPU per
//! 3 s, `tests/transport.rs`, `a_peer_with_another_shm_fifo_size_...`).
//! The rest of the FIFO is the peer's to write as well: element lengths,
//! the owner bits, and the descriptors (segment id, size and offset) that
//! a *sender* attaches and writes into, so a peer whose FIFO this server
//! sends to chooses which segment the server maps and where it writes.
//! No check on our side can make that safe; keeping unauthenticated peers
//! off shared memory does. A logged-in client is moved only if its hello
//! stated the same FIFO settings as this server's (`runtime::shm_geometry`;
//! else it stays on TCP, `upgrades_refused`): without that check a client
//! with the login and `MM_FIFO_SIZE=1024` left the server spinning and
//! itself crashed in UCX (SIGSEGV in `ucs_mpool_cleanup`), `tests/transport.rs`
//! `a_logged_in_client_with_another_shm_fifo_size_stays_on_tcp`. Its word
//! is trusted: it protects against a misconfigured client, not a hostile
//! one with the secret. Only a peer with the cluster's secret (or a
//! credential) gets there: it is trusted with it as with its data, and a
//! same-user process could `ptrace` the server anyway. What this does not
//! stop is a process that maps this worker's FIFO by itself, without UCX
//! telling it where: a `posix` FIFO is reached through `/proc/PID/fd`,
//! which needs ptrace rights on the server (its user, or root), but UCX
//! creates `sysv` segments with mode 0660, so a process of the server's
//! *group* can attach them (`ipcs` lists them). Where other users share
//! the servers' group, leave `sysv` out of the servers' `UCX_TLS`.
//!
//! The reference test service offers shared memory at once
//! (`RuntimeOptions::shm_before_login`): its tests and benchmarks measure it
//! without logging in.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Instant;

use dafne_ucx::{ConnRequest, Endpoint, Local as LocalMem, Op, RemoteKey};

use crate::auth::{ConnKeys, Refused};
use crate::error::{Result, TransportError};
use crate::frame::{FrameHeader, FrameKind, Hello, TransportStatus, Welcome, AM_ID};
use crate::runtime::{random_u64, Inbound, Local, Runtime, Shared};
use crate::stats::TransportStats;

/// What a server does with requests. Runs on the runtime's loop thread; the
/// returned future may await RMA on `req.conn` and timers.
pub trait Service: 'static {
    fn call(&self, req: Request) -> Pin<Box<dyn Future<Output = Vec<u8>>>>;

    /// The connection `conn_id` is gone (closed or dead): forget its state.
    fn disconnected(&self, _conn_id: u32) {}
}

/// One request as the service sees it.
#[derive(Debug)]
pub struct Request {
    pub conn: ConnHandle,
    pub payload: Vec<u8>,
}

/// Unpacked remote keys kept per connection. Unpacking costs ~8 µs
/// (UCX-NOTES); a client reuses a handful of regions, so a small bound
/// suffices, and overflowing it simply starts over.
const KEY_CACHE_ENTRIES: usize = 256;

pub(crate) struct ServerConn {
    id: u32,
    token: u64,
    ctrl: RefCell<Option<Endpoint>>,
    data: RefCell<Option<Endpoint>>,
    granted: u32,
    inflight: Cell<u32>,
    keys: RefCell<HashMap<Vec<u8>, Rc<RemoteKey>>>,
    /// The client's end of the control connection and our listener port,
    /// until the first key is unpacked: then the processes holding that
    /// socket are looked up once (`peer`) and given to the data endpoint.
    /// Lazily, so that the `/proc` scan runs only for a connection whose
    /// service is unpacking a key for it (io servers: after the request's
    /// capability was verified), never for a bare hello.
    peer_lookup: Cell<Option<(SocketAddr, u16)>>,
    /// Whether the client is on this host, once `peer_lookup` ran.
    local: Cell<Option<bool>>,
    dead: Cell<bool>,
    /// RMA waiters to wake if the connection dies or their deadline passes
    /// (checked by housekeeping: no timer per request), keyed by waiter id;
    /// each waiter replaces its own entry on every poll and removes it on drop.
    dead_wakers: RefCell<HashMap<u64, (Waker, Instant)>>,
    next_waiter: Cell<u64>,
    last_heard: Cell<Instant>,
    /// Set when the connection can no longer be used safely (a reply could
    /// not be sent, an RMA timed out); housekeeping tears it down.
    broken: Cell<bool>,
    /// Largest reply the client accepts (from its hello).
    max_reply: usize,
    shared: Arc<Shared>,
    /// The service vouched for this client (`ConnHandle::authenticated`).
    authenticated: Cell<bool>,
    /// When the hello arrived (the authentication deadline counts from it).
    created: Instant,
    /// A frame carrying this connection's token has arrived: the client
    /// received the welcome, which was sent to the worker address its
    /// hello claimed, so that address is the client's own (see
    /// `on_hello`). Until then the connection counts against
    /// [`MAX_UNPROVEN`].
    proven: Cell<bool>,
    /// The frame keys the service installed after a login
    /// (`ConnHandle::set_frame_keys`); from then on every frame is tagged.
    auth: RefCell<Option<ConnKeys>>,
    /// The client's worker address, while its data endpoint avoids shared
    /// memory until the login (module docs, "Shared memory after the
    /// login"): the first reply after `set_frame_keys` moves to a new
    /// endpoint made from it with error handling off.
    upgrade: RefCell<Option<Vec<u8>>>,
    /// Data endpoints replaced by that move, open until the connection
    /// ends (keys unpacked on them, and their operations, stay valid).
    retired: RefCell<Vec<Endpoint>>,
    /// The client's processes as `lookup_peer` found them, for the data
    /// endpoint that replaces the first.
    owners: RefCell<Option<Vec<u32>>>,
}

/// A client connection as seen by a handler: the way to reach the client's
/// memory. Cheap to clone; `!Send` (lives on the loop thread).
#[derive(Clone)]
pub struct ConnHandle(Rc<ServerConn>);

impl std::fmt::Debug for ConnHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnHandle").field("id", &self.0.id).field("dead", &self.0.dead.get()).finish()
    }
}

/// One segment of a vectored RMA: local memory and the remote range.
#[derive(Debug)]
pub struct RmaSeg {
    pub local: LocalMem,
    pub remote_addr: u64,
    pub rkey: Rc<RemoteKey>,
}

impl ConnHandle {
    pub fn id(&self) -> u32 {
        self.0.id
    }

    pub fn is_alive(&self) -> bool {
        !self.0.dead.get() && !self.0.broken.get()
    }

    /// Ends the connection as if it had broken: no reply leaves on it from
    /// now on (those of calls still running are dropped), the next
    /// housekeeping tick tears it down (the service's `disconnected`
    /// follows), and the client sees its calls fail with the connection
    /// lost. For a service that must cut a peer off, and for fault
    /// injection (a reply lost after its request was executed).
    pub fn close(&self) {
        self.0.broken.set(true);
    }

    /// The service checked this client's credentials (e.g. a session
    /// login): with `RuntimeOptions::auth_timeout` set, a connection that
    /// is not marked within that time is dropped, so an unauthenticated
    /// peer cannot hold a connection (and its buffers) by pinging forever.
    pub fn authenticated(&self) {
        self.0.authenticated.set(true);
    }

    /// Installs the keys of a login the service verified
    /// (`dafne_auth::Secret::frame_keys`): from now on every frame this
    /// server sends on the connection is tagged, and every frame it
    /// receives must be tagged with a fresh sequence number (`frame`
    /// module docs). Keys are set once: returns false, changing nothing,
    /// when the connection has them already (a second login).
    pub fn set_frame_keys(&self, keys: dafne_auth::FrameKeys) -> bool {
        let mut auth = self.0.auth.borrow_mut();
        if auth.is_some() {
            return false;
        }
        *auth = Some(ConnKeys::new(keys.to_client, keys.to_server, false));
        true
    }

    /// Whether the connection's frames are authenticated
    /// ([`ConnHandle::set_frame_keys`]).
    pub fn has_frame_keys(&self) -> bool {
        self.0.auth.borrow().is_some()
    }

    /// The connection's random token, known to both ends: protocols above
    /// bind authentication to it so that a captured login cannot be
    /// replayed on another connection.
    pub fn token(&self) -> u64 {
        self.0.token
    }

    fn data(&self) -> Result<Endpoint> {
        if self.0.dead.get() {
            return Err(TransportError::PeerFailed {
                peer: format!("connection {}", self.0.id),
                reason: "closed".into(),
            });
        }
        self.0.data.borrow().clone().ok_or(TransportError::Shutdown)
    }

    /// The counters of the runtime serving this connection.
    pub fn transport_stats(&self) -> crate::stats::TransportStatsSnapshot {
        self.0.shared.stats.snapshot()
    }

    /// Looks up, once, which processes of this host are the client (the
    /// kernel's word: `peer::socket_owners`) and gives them to the data
    /// endpoint (the System V rule of `KeyShape`).
    fn lookup_peer(&self) {
        if let Some((client, port)) = self.0.peer_lookup.take() {
            let owners = crate::peer::socket_owners(client, port);
            tracing::debug!("client {client} is local processes {owners:?}");
            if owners.as_ref().is_some_and(|o| o.is_empty()) && self.0.shared.log_limit.allow() {
                tracing::warn!(
                    "client {client} is on this host but /proc shows none of its processes (another user's, \
                     unreadable to this server): its shared-memory segments cannot be proven, so its keys are \
                     refused (EREMOTEIO). Run io servers as root, as the clients' user, or with CAP_SYS_PTRACE"
                );
            }
            self.0.local.set(Some(owners.is_some()));
            let owners = owners.unwrap_or_default();
            *self.0.owners.borrow_mut() = Some(owners.clone());
            if let Ok(data) = self.data() {
                data.set_peer_processes(owners);
            }
        }
    }

    /// Whether this server must refuse the client's keys that it cannot
    /// reach by itself ([`ConnHandle::reaches_directly`]). Why: UCX 1.13
    /// reaches other memory by RMA emulated over messages the client's own
    /// worker answers; on an endpoint UCX does not watch for failure, an
    /// operation to a client that stopped and then died never completes,
    /// keeping whatever memory the server gave it. So keys must be direct
    /// * on every data endpoint with error handling off (one host by the
    ///   hello's host id, or `DAFNE_DATA_PATH=none`; a client elsewhere
    ///   that copies this server's host id from a welcome lands here), and
    /// * for a client on this host as the kernel shows it (its end of the
    ///   control connection is a socket of this host) even on a watched
    ///   (TCP) endpoint: a client that claims another host gets one, and a
    ///   stopped client holds what its emulated operations hold,
    ///
    /// unless this runtime cannot keep System V parts (no `sysv` in its
    /// transports: then nothing is direct on one host, and emulated RMA is
    /// all there is) or treats every peer as remote (`DAFNE_DATA_PATH=peer`,
    /// which gives every endpoint error handling).
    pub fn requires_direct_keys(&self) -> bool {
        self.lookup_peer();
        let Ok(data) = self.data() else { return true };
        if !data.maps_peer_segments() {
            return false;
        }
        data.mode() == dafne_ucx::ErrMode::None
            || (self.0.shared.opts.data_path != crate::DataPath::PeerErrorHandling && self.0.local.get() == Some(true))
    }

    /// Whether RMA with `key` (from [`ConnHandle::remote_key`]) needs no
    /// help from the client.
    pub fn reaches_directly(&self, key: &RemoteKey) -> bool {
        self.data().is_ok_and(|d| d.reaches_directly(key))
    }

    /// The client's packed key, unpacked on this connection (cached).
    pub fn remote_key(&self, packed: &[u8]) -> Result<Rc<RemoteKey>> {
        if let Some(k) = self.0.keys.borrow().get(packed) {
            TransportStats::inc(&self.0.shared.stats.rkey_cache_hits);
            return Ok(k.clone());
        }
        TransportStats::inc(&self.0.shared.stats.rkey_cache_misses);
        let data = self.data()?;
        self.lookup_peer();
        let k = Rc::new(data.unpack_key(packed)?);
        let mut keys = self.0.keys.borrow_mut();
        if keys.len() >= KEY_CACHE_ENTRIES {
            keys.clear();
        }
        keys.insert(packed.to_vec(), k.clone());
        Ok(k)
    }

    /// Forgets cached keys (the client revoked its regions).
    pub fn forget_keys(&self) {
        self.0.keys.borrow_mut().clear();
    }

    /// Writes every segment's local bytes into the client's memory, then
    /// flushes so the data is at the client before this resolves.
    pub async fn put(&self, segs: Vec<RmaSeg>) -> Result<()> {
        self.rma(true, segs).await.map(|_| ())
    }

    /// Reads the client's memory into every segment's local memory. Returns,
    /// per segment, the filled `Vec` for `Local::Bytes` segments.
    pub async fn get(&self, segs: Vec<RmaSeg>) -> Result<Vec<Option<Vec<u8>>>> {
        let ops = self.rma(false, segs).await?;
        Ok(ops
            .into_iter()
            .map(|op| op.take_kept().into_iter().find_map(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b))
            .collect())
    }

    async fn rma(&self, put: bool, segs: Vec<RmaSeg>) -> Result<Vec<Op>> {
        let stats = &self.0.shared.stats;
        let ep = self.data()?;
        let mut ops = Vec::with_capacity(segs.len());
        let mut first_err: Option<TransportError> = None;
        for s in segs {
            let r = if put { ep.put(s.local, s.remote_addr, &s.rkey) } else { ep.get(s.local, s.remote_addr, &s.rkey) };
            match r {
                Ok(op) => ops.push(op),
                Err(e) => {
                    first_err = Some(e.into());
                    break;
                }
            }
        }
        // Fence what was posted, even after a failed post: the handler must
        // not answer (and the client must not reuse its buffers) while an
        // earlier put or get of this request may still land.
        let flush = match ep.flush() {
            Ok(f) => Some(f),
            Err(e) => {
                first_err.get_or_insert(e.into());
                None
            }
        };
        let deadline = Instant::now() + self.0.shared.opts.call_timeout;
        let waiter = self.0.next_waiter.get() + 1;
        self.0.next_waiter.set(waiter);
        let waited = Guarded { conn: self.0.clone(), waiter, ops: &ops, flush: flush.as_ref(), deadline }.await;
        let outcome = match waited {
            Err(e) => {
                // Timed out (or the connection died) with operations possibly
                // still in flight: the connection cannot be trusted with
                // another request, so it is torn down instead of answered.
                self.0.broken.set(true);
                Err(e)
            }
            Ok(()) => match first_err {
                Some(e) => Err(e),
                None => match ops.iter().chain(flush.as_ref()).find_map(|o| o.poll_done().and_then(|r| r.err())) {
                    Some(e) => Err(e.into()),
                    None => Ok(()),
                },
            },
        };
        if outcome.is_err() {
            TransportStats::inc(&stats.rma_failures);
        }
        outcome.map(|_| ops)
    }

    /// UCX's description of the data endpoint to this client.
    pub fn data_path_info(&self) -> String {
        self.data().map(|e| e.print_info()).unwrap_or_else(|e| e.to_string())
    }
}

/// Resolves `Ok` when every op and the flush completed (successfully or
/// not), `Err` if the connection died or the deadline passed first.
struct Guarded<'a> {
    conn: Rc<ServerConn>,
    waiter: u64,
    ops: &'a [Op],
    flush: Option<&'a Op>,
    deadline: Instant,
}

impl Future for Guarded<'_> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        if self.ops.iter().chain(self.flush).all(|op| op.poll_done().is_some()) {
            return Poll::Ready(Ok(()));
        }
        if self.conn.dead.get() {
            return Poll::Ready(Err(TransportError::PeerFailed {
                peer: format!("connection {}", self.conn.id),
                reason: "the client died during RMA".into(),
            }));
        }
        if Instant::now() >= self.deadline {
            return Poll::Ready(Err(TransportError::TimedOut {
                what: "RMA",
                after: self.conn.shared.opts.call_timeout,
            }));
        }
        // Register for completion of every op, death, and the deadline
        // (housekeeping wakes waiters whose deadline passed).
        for op in self.ops.iter().chain(self.flush) {
            let mut h = Op::clone_handle(op);
            let _ = Pin::new(&mut h).poll(cx);
        }
        let (id, deadline) = (self.waiter, self.deadline);
        self.conn.dead_wakers.borrow_mut().insert(id, (cx.waker().clone(), deadline));
        Poll::Pending
    }
}

impl Drop for Guarded<'_> {
    fn drop(&mut self) {
        self.conn.dead_wakers.borrow_mut().remove(&self.waiter);
    }
}

/// The server of one runtime (lives on the loop thread).
#[derive(Default)]
pub(crate) struct ServerSide {
    /// Resets sockets that never complete a UCX handshake (`sockguard`).
    /// First, so that it is dropped before the listener it pauses and
    /// resumes by descriptor number.
    guard: RefCell<Option<crate::sockguard::SockGuard>>,
    listener: RefCell<Option<dafne_ucx::Listener>>,
    service: RefCell<Option<Rc<dyn Service>>>,
    /// Control endpoints waiting for their hello.
    accepted: RefCell<HashMap<usize, Ungreeted>>,
    conns: RefCell<HashMap<u32, Rc<ServerConn>>>,
    by_ep: RefCell<HashMap<usize, u32>>,
    next_id: Cell<u32>,
    /// Connections in `conns` not yet proven (see `ServerConn::proven`).
    unproven: Cell<usize>,
}

/// A control endpoint waiting for its hello: when it was accepted, and the
/// client's address as the listener saw it (`peer`).
type Ungreeted = (Endpoint, Instant, Option<SocketAddr>);

/// UCX connections accepted but not yet greeted with a `Hello`, at most.
/// A genuine client sends its hello right after connecting, so only a
/// handful are ever pending; each holds a UCX endpoint until the connect
/// deadline, so the bound caps what a peer that connects and stays silent
/// can hold (256 endpoints, each a few KiB in UCX).
pub const MAX_UNGREETED: usize = 256;

/// Connections that sent a hello but no frame with their token yet, at
/// most. A hello costs the peer one message and the server a connection
/// record and a UCX endpoint to the address the hello claimed; only the
/// owner of that address learns the token (the welcome goes there), so a
/// peer that claims addresses it does not own leaves connections that can
/// never be used. They end at the silence limit (housekeeping); this bound
/// caps how many a flood of hellos holds meanwhile (256 records, each a
/// few hundred bytes, and 256 endpoints of a few KiB in UCX). A hello
/// beyond it evicts the oldest unproven connection rather than being
/// refused: an honest client proves its connection one round trip after
/// its welcome (it pings at once), so silent hellos cannot lock honest
/// clients out, while refusing new hellos would let 256 silent
/// connections (no secret needed) refuse every client for the silence
/// limit, renewed at will.
pub const MAX_UNPROVEN: usize = 256;

impl ServerSide {
    pub(crate) fn accept(l: &Rc<Local>, req: ConnRequest) {
        if l.server.service.borrow().is_none() {
            return; // dropping the request rejects it
        }
        if l.server.accepted.borrow().len() >= MAX_UNGREETED {
            TransportStats::inc(&l.stats().refused_before_receive);
            if l.shared.log_limit.allow() {
                tracing::warn!("{MAX_UNGREETED} connections wait for their hello: refusing new ones");
            }
            return;
        }
        let client = req.client_addr();
        match l.worker.accept(req) {
            Ok(ep) => {
                l.watch_failure(&ep);
                l.server.accepted.borrow_mut().insert(ep.id(), (ep, Instant::now(), client));
            }
            Err(e) => tracing::warn!("accepting a connection failed: {e}"),
        }
    }

    /// The connection a frame names, if its token matches and, once the
    /// connection has frame keys, its tag verifies and its sequence number
    /// is fresh. A refused frame is counted and logged (rate-limited) and
    /// gets no answer; the connection itself is untouched, so a peer that
    /// sends copies cannot close an honest session.
    fn conn_for(l: &Local, m: &Inbound) -> Option<Rc<ServerConn>> {
        let h = &m.hdr;
        let c = l.server.conns.borrow().get(&h.conn_id).cloned()?;
        if c.token != h.token {
            return None;
        }
        if let Err(why) = crate::auth::admit(c.auth.borrow().as_ref(), h, &m.payload, false) {
            Self::refused(l, h, why);
            return None;
        }
        if !c.proven.replace(true) {
            l.server.unproven.set(l.server.unproven.get() - 1);
        }
        Some(c)
    }

    /// Counts and logs a frame its connection's keys refused.
    pub(crate) fn refused(l: &Local, h: &FrameHeader, why: Refused) {
        let stats = l.stats();
        match why {
            Refused::Replayed(_) => TransportStats::inc(&stats.replayed_frames),
            _ => TransportStats::inc(&stats.unauthenticated_frames),
        }
        if l.shared.log_limit.allow() {
            tracing::warn!("refusing a {:?} frame for connection {}: {why}", h.kind, h.conn_id);
        }
    }

    pub(crate) fn on_frame(l: &Rc<Local>, m: Inbound) {
        let stats = l.stats();
        match m.hdr.kind {
            FrameKind::Hello => Self::on_hello(l, m),
            FrameKind::Request => {
                let Some(conn) = Self::conn_for(l, &m) else {
                    TransportStats::inc(&stats.malformed_frames);
                    if l.shared.log_limit.allow() {
                        tracing::warn!("request for unknown connection {} (or wrong token): dropped", m.hdr.conn_id);
                    }
                    return;
                };
                conn.last_heard.set(Instant::now());
                if m.payload.len() > l.options().max_request {
                    TransportStats::inc(&stats.malformed_frames);
                    return Self::reply(&conn, m.hdr.corr, TransportStatus::TooLarge, Vec::new());
                }
                if conn.inflight.get() >= conn.granted {
                    TransportStats::inc(&stats.credit_refusals);
                    return Self::reply(&conn, m.hdr.corr, TransportStatus::NoCredit, Vec::new());
                }
                let Some(service) = l.server.service.borrow().clone() else {
                    return Self::reply(&conn, m.hdr.corr, TransportStatus::ShuttingDown, Vec::new());
                };
                conn.inflight.set(conn.inflight.get() + 1);
                TransportStats::inc(&stats.requests_served);
                TransportStats::inc(&stats.requests_in_flight);
                let corr = m.hdr.corr;
                let fut = service.call(Request { conn: ConnHandle(conn.clone()), payload: m.payload });
                let weak = Rc::downgrade(l);
                l.spawn(async move {
                    let reply = fut.await;
                    if conn.auth.borrow().is_some() && conn.upgrade.borrow().is_some() {
                        if let Some(l) = weak.upgrade() {
                            Self::upgrade(&l, &conn);
                        }
                    }
                    conn.inflight.set(conn.inflight.get() - 1);
                    conn.shared.stats.requests_in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    Self::reply(&conn, corr, TransportStatus::Ok, reply);
                });
            }
            FrameKind::Ping => {
                let Some(conn) = Self::conn_for(l, &m) else {
                    TransportStats::inc(&stats.malformed_frames);
                    return;
                };
                conn.last_heard.set(Instant::now());
                let mut h = FrameHeader::new(FrameKind::Pong);
                h.conn_id = conn.id;
                h.token = conn.token;
                if let Some(k) = &*conn.auth.borrow() {
                    k.seal(&mut h, &[]);
                }
                let ctrl = conn.ctrl.borrow().clone();
                if let Some(ep) = ctrl {
                    let _ = ep.am_send(AM_ID, h.encode().to_vec(), Vec::new(), false);
                }
            }
            FrameKind::Bye => match Self::conn_for(l, &m) {
                Some(conn) => Self::drop_conn(l, conn.id, false),
                None => TransportStats::inc(&stats.malformed_frames),
            },
            _ => TransportStats::inc(&stats.malformed_frames),
        }
    }

    fn on_hello(l: &Rc<Local>, m: Inbound) {
        let stats = l.stats();
        let ctrl = m.reply_ep.and_then(|id| l.server.accepted.borrow_mut().remove(&id));
        let Some((ctrl, _, client)) = ctrl else {
            TransportStats::inc(&stats.malformed_frames);
            if l.shared.log_limit.allow() {
                tracing::warn!("hello on an endpoint that is not a fresh control connection: dropped");
            }
            return;
        };
        if l.server.unproven.get() >= MAX_UNPROVEN {
            // The oldest unproven connection makes room (see MAX_UNPROVEN).
            let oldest =
                l.server.conns.borrow().values().filter(|c| !c.proven.get()).min_by_key(|c| c.created).map(|c| c.id);
            TransportStats::inc(&stats.refused_before_receive);
            if l.shared.log_limit.allow() {
                tracing::warn!("{MAX_UNPROVEN} connections have not used their welcome yet: dropping the oldest");
            }
            if let Some(id) = oldest {
                Self::drop_conn(l, id, false);
            }
        }
        let hello = match Hello::decode(&m.payload) {
            Ok(h) => h,
            Err(e) => {
                TransportStats::inc(&stats.malformed_frames);
                if l.shared.log_limit.allow() {
                    tracing::warn!("bad hello ({e}): closing the connection");
                }
                return;
            }
        };
        let mode = l.options().data_path.mode_for(&hello.host_id, &l.shared.host_id);
        // Shared memory only after the login (module docs): until then the
        // data endpoint has error handling on, which keeps UCX 1.13 off
        // shared memory and cma, and the welcome carries this worker's
        // network-only address.
        // An empty geometry: transports without shared memory (this
        // server's: nothing to keep anyone off; the client's: it wants none).
        let gated =
            mode == dafne_ucx::ErrMode::None && !l.options().shm_before_login && !l.shared.shm_geometry.is_empty();
        let first_mode = if gated { dafne_ucx::ErrMode::Peer } else { mode };
        // After the login, only if both ends' FIFOs have the same shape
        // (`runtime::shm_geometry`): else this client stays on TCP.
        let same_geometry = hello.shm_geometry == l.shared.shm_geometry;
        if gated && !same_geometry && !hello.shm_geometry.is_empty() {
            TransportStats::inc(&stats.upgrades_refused);
            if l.shared.log_limit.allow() {
                tracing::warn!(
                    "a client on this host has other UCX shared-memory settings ({:?}) than this server ({:?}): \
                     it is served over TCP",
                    String::from_utf8_lossy(&hello.shm_geometry),
                    String::from_utf8_lossy(&l.shared.shm_geometry)
                );
            }
        }
        let data = match l.worker.connect_address(&hello.worker_address, first_mode) {
            Ok(ep) => ep,
            Err(e) => {
                TransportStats::inc(&stats.malformed_frames);
                if l.shared.log_limit.allow() {
                    tracing::warn!("cannot reach the client's worker address ({e}): closing the connection");
                }
                return;
            }
        };
        // The processes of this host that are the client are looked up from
        // the kernel when the first key is unpacked (`peer_lookup`).
        let port = l.server.listener.borrow().as_ref().and_then(|li| li.local_addr().ok()).map(|a| a.port());
        let peer_lookup = client.zip(port);
        let id = l.server.next_id.get().wrapping_add(1).max(1);
        l.server.next_id.set(id);
        if first_mode == dafne_ucx::ErrMode::Peer {
            // Across hosts the data endpoint detects failures itself (e.g. a
            // remote access error): it must tear the connection down too.
            l.watch_failure(&data);
            l.server.by_ep.borrow_mut().insert(data.id(), id);
        }
        let token = random_u64() | 1;
        let conn = Rc::new(ServerConn {
            id,
            token,
            ctrl: RefCell::new(None),
            data: RefCell::new(Some(data)),
            granted: l.options().credits.max(1),
            inflight: Cell::new(0),
            keys: RefCell::new(HashMap::new()),
            peer_lookup: Cell::new(peer_lookup),
            // Without the client's address the kernel cannot be asked:
            // then the hello's word is all there is.
            local: Cell::new(peer_lookup.is_none().then_some(mode == dafne_ucx::ErrMode::None)),
            dead: Cell::new(false),
            dead_wakers: RefCell::new(HashMap::new()),
            next_waiter: Cell::new(0),
            last_heard: Cell::new(Instant::now()),
            broken: Cell::new(false),
            max_reply: hello.max_reply as usize,
            shared: l.shared.clone(),
            authenticated: Cell::new(false),
            created: Instant::now(),
            proven: Cell::new(false),
            auth: RefCell::new(None),
            upgrade: RefCell::new((gated && same_geometry).then(|| hello.worker_address.clone())),
            retired: RefCell::new(Vec::new()),
            owners: RefCell::new(None),
        });
        let address = match if gated { l.worker.network_address() } else { l.worker.address() } {
            Ok(a) => a,
            Err(e) => return tracing::error!("worker address: {e}"),
        };
        let w =
            Welcome { host_id: l.shared.host_id, max_request: l.options().max_request as u32, worker_address: address }
                .encode();
        let mut h = FrameHeader::new(FrameKind::Welcome);
        h.corr = m.hdr.corr;
        h.conn_id = id;
        h.token = token;
        h.credits = conn.granted;
        h.payload_len = w.len() as u32;
        if gated {
            h.status = crate::frame::WELCOME_SHM_AFTER_LOGIN;
        }
        // The welcome (and with it the token every later frame must carry)
        // goes to the worker address the hello claimed, not back over the
        // control connection: only the process that owns that address can
        // then use the connection. A peer that claims another process's
        // address (this server's own, to make it move bytes within
        // itself; or another client's) never learns the token, so none of
        // its requests is served. That worker is where replies and RMA go
        // anyway.
        let sent = conn.data.borrow().as_ref().map(|d| d.am_send(AM_ID, h.encode().to_vec(), w, false));
        if let Some(Err(e)) = sent {
            tracing::warn!("sending welcome failed: {e}");
            return;
        }
        l.server.by_ep.borrow_mut().insert(ctrl.id(), id);
        *conn.ctrl.borrow_mut() = Some(ctrl);
        l.gate.conns.borrow_mut().insert(id, token);
        l.server.conns.borrow_mut().insert(id, conn);
        l.server.unproven.set(l.server.unproven.get() + 1);
        TransportStats::inc(&stats.connections_accepted);
    }

    /// Moves a connection whose login was just verified to a data endpoint
    /// with error handling off (shared memory and cma on one host) and
    /// sends the client this worker's full address over it
    /// (`FrameKind::Upgrade`, tagged). The old endpoint is retired, not
    /// closed. On failure the connection stays on the endpoint it has.
    fn upgrade(l: &Rc<Local>, conn: &Rc<ServerConn>) {
        let Some(address) = conn.upgrade.borrow_mut().take() else { return };
        if conn.dead.get() || conn.broken.get() {
            return;
        }
        let full = match l.worker.address() {
            Ok(a) => a,
            Err(e) => return tracing::warn!("worker address: {e}: connection {} stays on the network path", conn.id),
        };
        let data = match l.worker.connect_address(&address, dafne_ucx::ErrMode::None) {
            Ok(ep) => ep,
            Err(e) => {
                return tracing::warn!(
                    "cannot reach connection {}'s worker with shared memory ({e}): it stays on the network path",
                    conn.id
                )
            }
        };
        if let Some(owners) = conn.owners.borrow().clone() {
            data.set_peer_processes(owners);
        }
        let mut h = FrameHeader::new(FrameKind::Upgrade);
        h.conn_id = conn.id;
        h.token = conn.token;
        h.payload_len = full.len() as u32;
        if let Some(k) = &*conn.auth.borrow() {
            k.seal(&mut h, &full);
        }
        if let Err(e) = data.am_send(AM_ID, h.encode().to_vec(), full, false) {
            return tracing::warn!("upgrade of connection {} failed ({e}): it stays on the network path", conn.id);
        }
        conn.keys.borrow_mut().clear();
        if let Some(old) = conn.data.borrow_mut().replace(data) {
            conn.retired.borrow_mut().push(old);
        }
        TransportStats::inc(&l.stats().upgrades);
    }

    fn reply(conn: &ServerConn, corr: u64, status: TransportStatus, payload: Vec<u8>) {
        if conn.dead.get() || conn.broken.get() {
            return;
        }
        // A reply the client would refuse would also lose its credit:
        // answer TooLarge instead.
        let (status, payload) =
            if payload.len() > conn.max_reply { (TransportStatus::TooLarge, Vec::new()) } else { (status, payload) };
        let mut h = FrameHeader::new(FrameKind::Reply);
        h.status = status as i32;
        h.conn_id = conn.id;
        h.token = conn.token;
        h.corr = corr;
        h.credits = 1;
        h.payload_len = payload.len() as u32;
        if let Some(k) = &*conn.auth.borrow() {
            k.seal(&mut h, &payload);
        }
        if let Some(ep) = &*conn.data.borrow() {
            if let Err(e) = ep.am_send(AM_ID, h.encode().to_vec(), payload, false) {
                tracing::warn!("reply to connection {} failed ({e}): closing it", conn.id);
                conn.broken.set(true);
            }
        }
    }

    pub(crate) fn on_ep_failed(l: &Rc<Local>, ep_id: usize) {
        l.server.accepted.borrow_mut().remove(&ep_id);
        let id = l.server.by_ep.borrow().get(&ep_id).copied();
        if let Some(id) = id {
            Self::drop_conn(l, id, true);
        }
    }

    fn drop_conn(l: &Rc<Local>, id: u32, failed: bool) {
        let Some(conn) = l.server.conns.borrow_mut().remove(&id) else {
            return;
        };
        l.gate.conns.borrow_mut().remove(&id);
        if !conn.proven.get() {
            l.server.unproven.set(l.server.unproven.get() - 1);
        }
        if failed {
            TransportStats::inc(&l.stats().peer_failures);
            tracing::info!("client connection {id} failed: releasing it");
        }
        conn.dead.set(true);
        if let Some(svc) = l.server.service.borrow().clone() {
            svc.disconnected(id);
        }
        for (_, (w, _)) in conn.dead_wakers.borrow_mut().drain() {
            w.wake();
        }
        conn.keys.borrow_mut().clear();
        let retired = std::mem::take(&mut *conn.retired.borrow_mut());
        let data: Vec<Endpoint> = conn.data.borrow_mut().take().into_iter().chain(retired).collect();
        for ep in &data {
            // The connection is over (the client said Bye, or failed): a
            // graceful close of a data endpoint with error handling (TCP)
            // left its socket open until the client's runtime ended, one
            // descriptor per connection (`connections_leave_no_descriptors_
            // behind`). The client forces its side too. A no-op on
            // endpoints without error handling.
            ep.mark_peer_dead();
            l.server.by_ep.borrow_mut().remove(&ep.id());
        }
        let ctrl = conn.ctrl.borrow_mut().take();
        if let Some(ep) = ctrl {
            if failed {
                // Gone or silent: a graceful close would wait for it
                // forever (`Endpoint::mark_peer_dead`).
                ep.mark_peer_dead();
            }
            l.server.by_ep.borrow_mut().remove(&ep.id());
        }
    }

    pub(crate) fn housekeeping(l: &Rc<Local>, now: Instant) {
        let o = l.options();
        let limit = o.keepalive * o.keepalive_misses * 2;
        let silent: Vec<u32> = l
            .server
            .conns
            .borrow()
            .values()
            .filter(|c| now.duration_since(c.last_heard.get()) > limit)
            .map(|c| c.id)
            .collect();
        for id in silent {
            Self::drop_conn(l, id, true);
        }
        let broken: Vec<u32> = l.server.conns.borrow().values().filter(|c| c.broken.get()).map(|c| c.id).collect();
        for id in broken {
            Self::drop_conn(l, id, true);
        }
        if let Some(limit) = o.auth_timeout {
            let unauthenticated: Vec<u32> = l
                .server
                .conns
                .borrow()
                .values()
                .filter(|c| !c.authenticated.get() && now.duration_since(c.created) > limit)
                .map(|c| c.id)
                .collect();
            for id in unauthenticated {
                TransportStats::inc(&l.stats().unauthenticated_drops);
                if l.shared.log_limit.allow() {
                    tracing::warn!("connection {id} did not authenticate within {limit:?}: dropping it");
                }
                Self::drop_conn(l, id, false);
            }
        }
        for c in l.server.conns.borrow().values() {
            for (w, deadline) in c.dead_wakers.borrow().values() {
                if *deadline <= now {
                    w.wake_by_ref();
                }
            }
        }
        let timeout = o.connect_timeout;
        l.server.accepted.borrow_mut().retain(|_, (ep, t, _)| {
            let keep = now.duration_since(*t) < timeout;
            if !keep {
                // No hello within the deadline: do not wait on its close.
                ep.mark_peer_dead();
            }
            keep
        });
    }

    pub(crate) fn shutdown(l: &Rc<Local>) {
        l.server.guard.borrow_mut().take();
        l.server.listener.borrow_mut().take();
        l.server.service.borrow_mut().take();
        l.server.accepted.borrow_mut().clear();
        let ids: Vec<u32> = l.server.conns.borrow().keys().copied().collect();
        for id in ids {
            Self::drop_conn(l, id, false);
        }
    }
}

/// Sets this process's soft descriptor limit, once, before it listens: the
/// hard limit less a reserve when `dafne_ucx::acceptgate` is in effect
/// (the `dafne` executable), else the hard limit. At the 1,024 most shells
/// give, a flood of silent connections filled the table: UCX's `accept`
/// then failed with EMFILE in a loop (gigabytes of log, most of a core) and
/// the listener's guard could not run (tested: `dafne/tests/hostile.rs`).
/// The higher limit keeps honest clients from waiting behind a flood; the
/// reserve is what a flood past the hard limit cannot take (the gate's
/// module docs: UCX's data listener closes for good at a full table).
/// Best effort: a limit that cannot be set is logged, not fatal.
fn raise_descriptor_limit() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| match dafne_ucx::acceptgate::configure() {
        Ok(Some((soft, hard))) => {
            tracing::debug!("descriptor limit {soft}, {} more kept for UCX's data listener (hard {hard})", hard - soft)
        }
        Ok(None) => tracing::debug!(
            "descriptor limit raised to the hard one (no accept gate in this executable: dafne-cluster's docs say \
             how an executable gets it)"
        ),
        Err(e) => tracing::warn!("could not set the descriptor limit: {e}"),
    });
}

impl Runtime {
    /// Starts serving on `addr` (port 0 picks one); returns the bound address.
    /// `make` builds the service on the loop thread.
    pub fn serve<S: Service>(
        &self,
        addr: SocketAddr,
        make: impl FnOnce(&Rc<Local>) -> S + Send + 'static,
    ) -> Result<SocketAddr> {
        self.run_on_loop(move |l| -> Result<SocketAddr> {
            if l.server.listener.borrow().is_some() {
                return Err(TransportError::Protocol("this runtime already serves".into()));
            }
            raise_descriptor_limit();
            // Before listening: a flood may take every descriptor at once.
            let own = crate::sockguard::SockGuard::prepare();
            let q = l.accepts.clone();
            let listener = l.worker.listen(addr, move |req| q.borrow_mut().push(req))?;
            let bound = listener.local_addr()?;
            *l.server.guard.borrow_mut() = Some(crate::sockguard::SockGuard::start(
                own,
                bound.port(),
                l.options().connect_timeout,
                l.shared.clone(),
            ));
            *l.server.listener.borrow_mut() = Some(listener);
            *l.server.service.borrow_mut() = Some(Rc::new(make(l)));
            Ok(bound)
        })?
    }

    /// Number of live server connections.
    pub fn server_connections(&self) -> Result<usize> {
        self.run_on_loop(|l| l.server.conns.borrow().len())
    }
}
