//! The client half of a connection: handshake, calls with credits,
//! keepalive, failure of everything pending when the peer dies.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dafne_ucx::{Context, Endpoint, ErrMode};
use futures::channel::oneshot;

use crate::auth::ConnKeys;
use crate::error::{Result, TransportError};
use crate::frame::{FrameHeader, FrameKind, Hello, TransportStatus, Welcome, AM_ID};
use crate::runtime::{random_u64, Inbound, Local, Runtime, Shared};
use crate::stats::TransportStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Connecting,
    Ready,
    Dead,
}

struct Pending {
    tx: oneshot::Sender<Result<Vec<u8>>>,
    /// `None`: the call waits as long as the connection lives
    /// ([`Client::call_async_unbounded`]).
    deadline: Option<Instant>,
}

/// A request waiting for a credit: correlation id, payload, and for a
/// login the frame keys to install once it is sent.
type Queued = (u64, Vec<u8>, Option<dafne_auth::FrameKeys>);

struct ClientConn {
    addr: SocketAddr,
    ctrl: RefCell<Option<Endpoint>>,
    data: RefCell<Option<Endpoint>>,
    conn_id: Cell<u32>,
    token: Cell<u64>,
    nonce: u64,
    granted: Cell<u32>,
    credits: Cell<u32>,
    max_request: Cell<usize>,
    /// Requests waiting for a credit; a login carries the keys to install
    /// once it is sent.
    queue: RefCell<VecDeque<Queued>>,
    pending: RefCell<HashMap<u64, Pending>>,
    next_corr: Cell<u64>,
    state: Cell<State>,
    failure: RefCell<Option<TransportError>>,
    ready_tx: RefCell<Option<oneshot::Sender<Result<()>>>>,
    connect_deadline: Instant,
    last_heard: Cell<Instant>,
    last_ping: Cell<Instant>,
    /// The server's worker address, from its welcome.
    server_worker: RefCell<Vec<u8>>,
    /// Frame keys, installed as the login request is sent (`Client::login`).
    auth: RefCell<Option<ConnKeys>>,
    /// The server's packed keys unpacked on the data endpoint, for
    /// [`Client::get_on_loop`] only (bounded like the server's cache).
    server_keys: RefCell<HashMap<Vec<u8>, Rc<dafne_ucx::RemoteKey>>>,
    /// The error mode the data endpoint gets from the welcome's host id
    /// (the first may have error handling on: `WELCOME_SHM_AFTER_LOGIN`):
    /// a server's `Upgrade` is followed only where it is `None`.
    data_mode: Cell<ErrMode>,
    /// Data endpoints replaced by an `Upgrade`, kept open until the
    /// connection ends: frames and keys still in flight on them stay valid.
    retired: RefCell<Vec<Endpoint>>,
}

/// Server keys a client keeps unpacked ([`Client::get_on_loop`]);
/// overflowing the bound starts over.
const SERVER_KEY_ENTRIES: usize = 256;

impl ClientConn {
    /// Tags `h` when the connection has keys.
    fn seal(&self, h: &mut FrameHeader, payload: &[u8]) {
        if let Some(k) = &*self.auth.borrow() {
            k.seal(h, payload);
        }
    }
}

/// The client connections of one runtime (lives on the loop thread).
#[derive(Default)]
pub(crate) struct ClientSide {
    conns: RefCell<HashMap<u64, Rc<ClientConn>>>,
    by_nonce: RefCell<HashMap<u64, u64>>,
    by_token: RefCell<HashMap<u64, u64>>,
    by_ep: RefCell<HashMap<usize, u64>>,
    next_id: Cell<u64>,
}

impl ClientSide {
    fn get(l: &Local, id: u64) -> Option<Rc<ClientConn>> {
        l.client.conns.borrow().get(&id).cloned()
    }

    /// `claim`: the worker address the hello states instead of this
    /// worker's own (tests of a lying peer only).
    fn connect(l: &Rc<Local>, addr: SocketAddr, claim: Option<Vec<u8>>, ready: oneshot::Sender<Result<()>>) -> u64 {
        let cs = &l.client;
        let id = cs.next_id.get() + 1;
        cs.next_id.set(id);
        let now = Instant::now();
        let conn = Rc::new(ClientConn {
            addr,
            ctrl: RefCell::new(None),
            data: RefCell::new(None),
            conn_id: Cell::new(0),
            token: Cell::new(0),
            nonce: random_u64(),
            granted: Cell::new(0),
            credits: Cell::new(0),
            max_request: Cell::new(l.options().max_request),
            queue: RefCell::new(VecDeque::new()),
            pending: RefCell::new(HashMap::new()),
            next_corr: Cell::new(1),
            state: Cell::new(State::Connecting),
            failure: RefCell::new(None),
            ready_tx: RefCell::new(Some(ready)),
            connect_deadline: now + l.options().connect_timeout,
            last_heard: Cell::new(now),
            last_ping: Cell::new(now),
            server_worker: RefCell::new(Vec::new()),
            auth: RefCell::new(None),
            server_keys: RefCell::new(HashMap::new()),
            data_mode: Cell::new(ErrMode::Peer),
            retired: RefCell::new(Vec::new()),
        });
        cs.conns.borrow_mut().insert(id, conn.clone());
        let ctrl = match l.worker.connect_sockaddr(addr) {
            Ok(ep) => ep,
            Err(e) => {
                Self::fail(l, id, TransportError::Unreachable { addr, reason: e.to_string() });
                return id;
            }
        };
        l.watch_failure(&ctrl);
        cs.by_ep.borrow_mut().insert(ctrl.id(), id);
        cs.by_nonce.borrow_mut().insert(conn.nonce, id);
        let hello = Hello {
            host_id: l.shared.host_id,
            max_reply: l.options().max_reply.min(u32::MAX as usize) as u32,
            worker_address: match claim.map_or_else(|| l.worker.address(), Ok) {
                Ok(a) => a,
                Err(e) => {
                    Self::fail(l, id, e.into());
                    return id;
                }
            },
            // None where this client will not follow an `Upgrade`
            // (`DAFNE_DATA_PATH=peer`): the server must not make the
            // endpoint it would send it on. UCX pairs the endpoints two
            // workers make to each other in the order each made them, so
            // one the client never matched paired the client's next data
            // endpoint with error handling on to one with it off: that
            // connection failed ("asymmetric endpoint configuration",
            // `a_client_that_keeps_error_handling_connects_again`).
            shm_geometry: if l.options().data_path == crate::DataPath::PeerErrorHandling {
                Vec::new()
            } else {
                l.shared.shm_geometry.clone()
            },
        }
        .encode();
        let mut h = FrameHeader::new(FrameKind::Hello);
        h.corr = conn.nonce;
        h.payload_len = hello.len() as u32;
        let sent = ctrl.am_send(AM_ID, h.encode().to_vec(), hello, true);
        *conn.ctrl.borrow_mut() = Some(ctrl);
        if let Err(e) = sent {
            Self::fail(l, id, TransportError::Unreachable { addr, reason: e.to_string() });
        }
        id
    }

    pub(crate) fn on_frame(l: &Rc<Local>, m: Inbound) {
        let cs = &l.client;
        let id = match m.hdr.kind {
            FrameKind::Welcome => cs.by_nonce.borrow().get(&m.hdr.corr).copied(),
            _ => cs.by_token.borrow().get(&m.hdr.token).copied(),
        };
        let Some(conn) = id.and_then(|id| Self::get(l, id)) else {
            TransportStats::inc(&l.stats().malformed_frames);
            tracing::debug!("client: {:?} frame for no known connection", m.hdr.kind);
            return;
        };
        let id = id.unwrap_or_default();
        if m.hdr.kind != FrameKind::Welcome {
            if let Err(why) = crate::auth::admit(conn.auth.borrow().as_ref(), &m.hdr, &m.payload, true) {
                crate::server::ServerSide::refused(l, &m.hdr, why);
                return;
            }
        }
        conn.last_heard.set(Instant::now());
        match m.hdr.kind {
            FrameKind::Welcome => Self::on_welcome(l, id, &conn, &m),
            FrameKind::Reply => {
                TransportStats::inc(&l.stats().replies_received);
                // A reply returns credits; never beyond what was granted.
                let c = conn.credits.get().saturating_add(m.hdr.credits).min(conn.granted.get());
                conn.credits.set(c);
                let p = conn.pending.borrow_mut().remove(&m.hdr.corr);
                if let Some(p) = p {
                    let r = match TransportStatus::from_i32(m.hdr.status) {
                        Some(TransportStatus::Ok) => Ok(m.payload),
                        Some(s) => Err(TransportError::Rejected(s)),
                        None => Err(TransportError::Protocol(format!("unknown transport status {}", m.hdr.status))),
                    };
                    let _ = p.tx.send(r);
                }
                Self::pump(l, &conn);
            }
            FrameKind::Pong => {}
            FrameKind::Upgrade => Self::on_upgrade(l, &conn, m.payload),
            _ => TransportStats::inc(&l.stats().malformed_frames),
        }
    }

    /// The server verified our login and offers its full worker address
    /// (`FrameKind::Upgrade`): requests move to an endpoint made from it
    /// (shared memory on one host). Only on a logged-in connection (the
    /// frame was then checked against the login's keys by `admit`), and
    /// only where the data endpoint may have error handling off: with it
    /// on, UCX would choose TCP again. On failure the connection stays on the
    /// endpoint it has, which works.
    fn on_upgrade(l: &Rc<Local>, conn: &Rc<ClientConn>, address: Vec<u8>) {
        if conn.auth.borrow().is_none() || conn.state.get() != State::Ready {
            TransportStats::inc(&l.stats().malformed_frames);
            return;
        }
        if conn.data_mode.get() != ErrMode::None {
            return;
        }
        let data = match l.worker.connect_address(&address, ErrMode::None) {
            Ok(ep) => ep,
            Err(e) => {
                tracing::warn!("cannot reach the server's full worker address ({e}): staying on the network path");
                return;
            }
        };
        conn.server_keys.borrow_mut().clear();
        if let Some(old) = conn.data.borrow_mut().replace(data) {
            conn.retired.borrow_mut().push(old);
        }
        *conn.server_worker.borrow_mut() = address;
    }

    fn on_welcome(l: &Rc<Local>, id: u64, conn: &Rc<ClientConn>, m: &Inbound) {
        if conn.state.get() != State::Connecting {
            TransportStats::inc(&l.stats().malformed_frames);
            return;
        }
        let w = match Welcome::decode(&m.payload) {
            Ok(w) => w,
            Err(e) => return Self::fail(l, id, TransportError::Protocol(format!("bad welcome: {e}"))),
        };
        if m.hdr.credits == 0 || m.hdr.token == 0 {
            return Self::fail(l, id, TransportError::Protocol("welcome granted no credit or no token".into()));
        }
        let eventual = l.options().data_path.mode_for(&w.host_id, &l.shared.host_id);
        // Until the login, a server may keep the data endpoints off shared
        // memory (`WELCOME_SHM_AFTER_LOGIN`): ours must then match its
        // error handling.
        let mode = if m.hdr.status == crate::frame::WELCOME_SHM_AFTER_LOGIN { ErrMode::Peer } else { eventual };
        let data = match l.worker.connect_address(&w.worker_address, mode) {
            Ok(ep) => ep,
            Err(e) => return Self::fail(l, id, TransportError::Protocol(format!("data endpoint: {e}"))),
        };
        if mode == ErrMode::Peer {
            l.watch_failure(&data);
            l.client.by_ep.borrow_mut().insert(data.id(), id);
        }
        *conn.data.borrow_mut() = Some(data);
        conn.data_mode.set(eventual);
        *conn.server_worker.borrow_mut() = w.worker_address;
        conn.conn_id.set(m.hdr.conn_id);
        conn.token.set(m.hdr.token);
        let granted = m.hdr.credits.min(4096);
        conn.granted.set(granted);
        conn.credits.set(granted);
        conn.max_request.set(conn.max_request.get().min(w.max_request as usize));
        conn.state.set(State::Ready);
        l.client.by_nonce.borrow_mut().remove(&conn.nonce);
        l.client.by_token.borrow_mut().insert(m.hdr.token, id);
        l.gate.client_tokens.borrow_mut().insert(m.hdr.token);
        // A first frame with the token at once: it proves to the server
        // that this process received the welcome, so the connection no
        // longer counts as unproven there (`server::MAX_UNPROVEN`, whose
        // oldest entries make room for new hellos).
        conn.last_ping.set(Instant::now());
        let mut p = FrameHeader::new(FrameKind::Ping);
        p.conn_id = m.hdr.conn_id;
        p.token = m.hdr.token;
        conn.seal(&mut p, &[]);
        if let Some(ep) = &*conn.ctrl.borrow() {
            let _ = ep.am_send(AM_ID, p.encode().to_vec(), Vec::new(), false);
        }
        if let Some(tx) = conn.ready_tx.borrow_mut().take() {
            let _ = tx.send(Ok(()));
        }
        Self::pump(l, conn);
    }

    fn call(
        l: &Rc<Local>,
        id: u64,
        payload: Vec<u8>,
        keys: Option<dafne_auth::FrameKeys>,
        bounded: bool,
        tx: oneshot::Sender<Result<Vec<u8>>>,
    ) {
        let Some(conn) = Self::get(l, id) else {
            let _ = tx.send(Err(TransportError::Shutdown));
            return;
        };
        if conn.state.get() == State::Dead {
            let e = conn.failure.borrow().clone().unwrap_or(TransportError::Shutdown);
            let _ = tx.send(Err(e));
            return;
        }
        if payload.len() > conn.max_request.get() {
            let _ = tx.send(Err(TransportError::TooLarge { len: payload.len(), limit: conn.max_request.get() }));
            return;
        }
        let corr = conn.next_corr.get();
        conn.next_corr.set(corr + 1);
        let deadline = bounded.then(|| Instant::now() + l.options().call_timeout);
        conn.pending.borrow_mut().insert(corr, Pending { tx, deadline });
        if conn.credits.get() == 0 {
            TransportStats::inc(&l.stats().credit_waits);
        }
        conn.queue.borrow_mut().push_back((corr, payload, keys));
        Self::pump(l, &conn);
    }

    /// Sends queued requests while credits last.
    fn pump(l: &Rc<Local>, conn: &Rc<ClientConn>) {
        if conn.state.get() != State::Ready {
            return;
        }
        while conn.credits.get() > 0 {
            let Some((corr, payload, keys)) = conn.queue.borrow_mut().pop_front() else {
                break;
            };
            if !conn.pending.borrow().contains_key(&corr) {
                continue; // timed out while queued
            }
            if keys.is_some() && conn.auth.borrow().is_some() {
                if let Some(p) = conn.pending.borrow_mut().remove(&corr) {
                    let _ = p.tx.send(Err(TransportError::Protocol("this connection has logged in already".into())));
                }
                continue;
            }
            conn.credits.set(conn.credits.get() - 1);
            let mut h = FrameHeader::new(FrameKind::Request);
            h.conn_id = conn.conn_id.get();
            h.token = conn.token.get();
            h.corr = corr;
            h.payload_len = payload.len() as u32;
            conn.seal(&mut h, &payload);
            let r = match &*conn.data.borrow() {
                Some(ep) => ep.am_send(AM_ID, h.encode().to_vec(), payload, false).map(|_| ()),
                None => Err(dafne_ucx::Error::Invalid { op: "send", reason: "no data endpoint".into() }),
            };
            TransportStats::inc(&l.stats().requests_sent);
            if let Some(k) = keys {
                // The login itself went untagged (the server has no keys
                // before it verifies it); everything after it is tagged.
                *conn.auth.borrow_mut() = Some(ConnKeys::new(k.to_server, k.to_client, true));
            }
            if let Err(e) = r {
                conn.credits.set(conn.credits.get() + 1);
                if let Some(p) = conn.pending.borrow_mut().remove(&corr) {
                    let _ = p.tx.send(Err(e.into()));
                }
            }
        }
    }

    /// See `Client::forge_request`.
    fn forge(conn: &ClientConn, payload: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
        let mut h = FrameHeader::new(FrameKind::Request);
        h.conn_id = conn.conn_id.get();
        h.token = conn.token.get();
        h.corr = u64::MAX - conn.next_corr.get();
        h.payload_len = payload.len() as u32;
        conn.seal(&mut h, &payload);
        (h.encode().to_vec(), payload)
    }

    pub(crate) fn housekeeping(l: &Rc<Local>, now: Instant) {
        let conns: Vec<(u64, Rc<ClientConn>)> = l.client.conns.borrow().iter().map(|(k, v)| (*k, v.clone())).collect();
        let ka = l.options().keepalive;
        for (id, c) in conns {
            match c.state.get() {
                State::Dead => continue,
                State::Connecting if now > c.connect_deadline => {
                    Self::fail(
                        l,
                        id,
                        TransportError::Unreachable {
                            addr: c.addr,
                            reason: format!("no answer within {:?}", l.options().connect_timeout),
                        },
                    );
                    continue;
                }
                State::Connecting => {}
                State::Ready => {
                    if now.duration_since(c.last_ping.get()) >= ka {
                        c.last_ping.set(now);
                        let mut h = FrameHeader::new(FrameKind::Ping);
                        h.conn_id = c.conn_id.get();
                        h.token = c.token.get();
                        c.seal(&mut h, &[]);
                        if let Some(ep) = &*c.ctrl.borrow() {
                            let _ = ep.am_send(AM_ID, h.encode().to_vec(), Vec::new(), false);
                        }
                    }
                    let silence = now.duration_since(c.last_heard.get());
                    if silence > ka * l.options().keepalive_misses {
                        Self::fail(
                            l,
                            id,
                            TransportError::PeerFailed {
                                peer: c.addr.to_string(),
                                reason: format!("no keepalive answer for {silence:?}"),
                            },
                        );
                        continue;
                    }
                }
            }
            let expired: Vec<u64> = c
                .pending
                .borrow()
                .iter()
                .filter(|(_, p)| p.deadline.is_some_and(|d| d <= now))
                .map(|(k, _)| *k)
                .collect();
            for corr in expired {
                if let Some(p) = c.pending.borrow_mut().remove(&corr) {
                    TransportStats::inc(&l.stats().call_timeouts);
                    let _ = p.tx.send(Err(TransportError::TimedOut { what: "call", after: l.options().call_timeout }));
                }
            }
        }
    }

    pub(crate) fn on_ep_failed(l: &Rc<Local>, ep_id: usize, st: dafne_ucx::Status) {
        let id = l.client.by_ep.borrow_mut().remove(&ep_id);
        if let Some(id) = id {
            let Some(c) = Self::get(l, id) else { return };
            let err = if c.state.get() == State::Connecting {
                TransportError::Unreachable { addr: c.addr, reason: format!("connection failed: {st}") }
            } else {
                TransportError::PeerFailed {
                    peer: c.addr.to_string(),
                    reason: format!("the peer closed or crashed: {st}"),
                }
            };
            Self::fail(l, id, err);
        }
    }

    /// Marks a connection dead and fails everything that waits on it.
    fn fail(l: &Rc<Local>, id: u64, err: TransportError) {
        let Some(c) = Self::get(l, id) else { return };
        if c.state.get() == State::Dead {
            return;
        }
        if c.state.get() == State::Ready {
            TransportStats::inc(&l.stats().peer_failures);
        }
        tracing::debug!("client connection to {} failed: {err}", c.addr);
        // The peer is known gone (it failed, or never answered: a shutdown
        // while still connecting too): its endpoints' closes are forced, a
        // graceful one would wait forever for it (`Endpoint::mark_peer_dead`).
        let peer_dead = !matches!(err, TransportError::Shutdown) || c.state.get() == State::Connecting;
        c.state.set(State::Dead);
        *c.failure.borrow_mut() = Some(err.clone());
        if let Some(tx) = c.ready_tx.borrow_mut().take() {
            let _ = tx.send(Err(err.clone()));
        }
        for (_, p) in c.pending.borrow_mut().drain() {
            let _ = p.tx.send(Err(err.clone()));
        }
        c.queue.borrow_mut().clear();
        if peer_dead {
            for ep in [&*c.ctrl.borrow(), &*c.data.borrow()].into_iter().flatten() {
                ep.mark_peer_dead();
            }
            for ep in c.retired.borrow().iter() {
                ep.mark_peer_dead();
            }
        }
        Self::forget_endpoints(l, &c);
    }

    fn forget_endpoints(l: &Local, c: &ClientConn) {
        let cs = &l.client;
        cs.by_token.borrow_mut().remove(&c.token.get());
        l.gate.client_tokens.borrow_mut().remove(&c.token.get());
        cs.by_nonce.borrow_mut().remove(&c.nonce);
        let retired = std::mem::take(&mut *c.retired.borrow_mut());
        for ep in [c.ctrl.borrow_mut().take(), c.data.borrow_mut().take()].into_iter().flatten().chain(retired) {
            cs.by_ep.borrow_mut().remove(&ep.id());
        }
    }

    fn close(l: &Rc<Local>, id: u64) {
        let Some(c) = l.client.conns.borrow_mut().remove(&id) else {
            return;
        };
        if c.state.get() == State::Ready {
            let mut h = FrameHeader::new(FrameKind::Bye);
            h.conn_id = c.conn_id.get();
            h.token = c.token.get();
            c.seal(&mut h, &[]);
            if let Some(ep) = &*c.ctrl.borrow() {
                let _ = ep.am_send(AM_ID, h.encode().to_vec(), Vec::new(), false);
            }
        }
        for (_, p) in c.pending.borrow_mut().drain() {
            let _ = p.tx.send(Err(TransportError::Shutdown));
        }
        // The data endpoints (nothing is pending on them any more) close in
        // force mode, the Bye's control endpoint gracefully. A graceful
        // close of a data endpoint with error handling (TCP: across hosts,
        // and on one host until the upgrade) left its socket open at both
        // ends until this runtime ended, one descriptor per connection in
        // the server too (`connections_leave_no_descriptors_behind`).
        // A no-op on the endpoints without error handling.
        for ep in c.data.borrow().iter().chain(c.retired.borrow().iter()) {
            ep.mark_peer_dead();
        }
        Self::forget_endpoints(l, &c);
    }

    pub(crate) fn shutdown(l: &Rc<Local>) {
        let ids: Vec<u64> = l.client.conns.borrow().keys().copied().collect();
        for id in ids {
            Self::fail(l, id, TransportError::Shutdown);
            Self::close(l, id);
        }
    }
}

struct ClientInner {
    shared: Arc<Shared>,
    id: u64,
    addr: SocketAddr,
    token: std::sync::atomic::AtomicU64,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let id = self.id;
        let _ = self.shared.submit(move |l| ClientSide::close(l, id));
    }
}

/// A connection to one dafne server. `Send + Sync + Clone`: any thread may
/// call; the calls run on the runtime's loop thread. Never call the
/// blocking methods from inside a runtime task (use [`Client::call_async`]).
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("addr", &self.inner.addr).finish()
    }
}

impl Client {
    /// Connects to the server listening at `addr` and completes the handshake
    /// (control endpoint, worker addresses, data endpoints, credits).
    pub fn connect(rt: &Runtime, addr: SocketAddr) -> Result<Client> {
        Self::connect_on(&rt.shared, addr, None)
    }

    /// Connects with a hello that claims `worker_address` as this client's
    /// worker: what a lying peer sends. For tests of the server's defence
    /// (the welcome goes to the claimed address, so the lie gets no
    /// connection); no dafne client calls it.
    #[doc(hidden)]
    pub fn connect_claiming(rt: &Runtime, addr: SocketAddr, worker_address: Vec<u8>) -> Result<Client> {
        Self::connect_on(&rt.shared, addr, Some(worker_address))
    }

    /// The server's worker address, as its welcome gave it (tests: what a
    /// lying peer would claim).
    #[doc(hidden)]
    pub fn server_worker_address(&self) -> Result<Vec<u8>> {
        let id = self.inner.id;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.inner.shared.submit(move |l| {
            let _ = tx.send(ClientSide::get(l, id).map(|c| c.server_worker.borrow().clone()).unwrap_or_default());
        })?;
        rx.recv().map_err(|_| TransportError::Shutdown)
    }

    /// A new connection to the same server on the same runtime: what a
    /// client does after the server restarted (the old connection stays
    /// failed; nothing is retried on the new one). Blocking: not from a
    /// runtime task.
    pub fn reconnect(&self) -> Result<Client> {
        Self::connect_on(&self.inner.shared, self.inner.addr, None)
    }

    /// A new connection to the server at `addr` on this connection's
    /// runtime: for a holder of connections but not of the runtime (the
    /// data client's first connection to an io server it could not reach
    /// when it started). Blocking: not from a runtime task.
    pub fn connect_to(&self, addr: SocketAddr) -> Result<Client> {
        Self::connect_on(&self.inner.shared, addr, None)
    }

    /// Connects to the server at `addr` from a task on `l`'s loop (a
    /// server's runtime reaching another server: an io server forwarding
    /// a chain's write to the next replica), without blocking the loop.
    /// The connection's memory is this runtime's, so keys packed from the
    /// runtime's registrations are valid for the peer's RMA on it. Unlike
    /// [`Client::connect`] it takes no part in the endpoint order of
    /// `Shared::endpoint_order`: its caller makes one connection to a
    /// server at a time and logs in on it ([`Client::login_on_loop`])
    /// before another.
    pub fn connect_from_loop(l: &Rc<Local>, addr: SocketAddr) -> impl Future<Output = Result<Client>> + 'static {
        let (tx, rx) = oneshot::channel();
        let id = ClientSide::connect(l, addr, None, tx);
        let shared = l.shared.clone();
        let l = l.clone();
        async move {
            rx.await.map_err(|_| TransportError::Shutdown)??;
            let token = ClientSide::get(&l, id).map(|c| c.token.get()).unwrap_or(0);
            let client = Client { inner: Arc::new(ClientInner { shared, id, addr, token: Default::default() }) };
            client.inner.token.store(token, std::sync::atomic::Ordering::Relaxed);
            Ok(client)
        }
    }

    /// [`Client::login`] from a task on this client's runtime loop
    /// (a connection made by [`Client::connect_from_loop`]).
    pub fn login_on_loop(
        &self,
        l: &Rc<Local>,
        payload: Vec<u8>,
        keys: dafne_auth::FrameKeys,
    ) -> impl Future<Output = Result<Vec<u8>>> + 'static {
        let (tx, rx) = oneshot::channel();
        if Arc::ptr_eq(&l.shared, &self.inner.shared) {
            ClientSide::call(l, self.inner.id, payload, Some(keys), true, tx);
        } else {
            let _ = tx.send(Err(TransportError::Protocol("login_on_loop from another runtime's loop".into())));
        }
        async move { rx.await.unwrap_or(Err(TransportError::Shutdown)) }
    }

    fn connect_on(shared: &Arc<Shared>, addr: SocketAddr, claim: Option<Vec<u8>>) -> Result<Client> {
        // No login with this server meanwhile (the data endpoints'
        // creation order: `Shared::endpoint_order`).
        let order = shared.endpoint_order(addr);
        let _order = order.read().unwrap_or_else(|p| p.into_inner());
        let (tx, rx) = oneshot::channel();
        let (idtx, idrx) = crossbeam_channel::bounded(1);
        shared.submit(move |l| {
            let _ = idtx.send(ClientSide::connect(l, addr, claim, tx));
        })?;
        let id = idrx.recv().map_err(|_| TransportError::Shutdown)?;
        let client =
            Client { inner: Arc::new(ClientInner { shared: shared.clone(), id, addr, token: Default::default() }) };
        // Waited for on a channel rather than with a futures executor, so
        // that a reconnect may happen inside a caller's `block_on`.
        let (rtx, rrx) = crossbeam_channel::bounded(1);
        shared.submit(move |l| {
            l.spawn(async move {
                let _ = rtx.send(rx.await);
            });
        })?;
        rrx.recv().map_err(|_| TransportError::Shutdown)?.map_err(|_| TransportError::Shutdown)??;
        let (ttx, trx) = crossbeam_channel::bounded(1);
        shared.submit(move |l| {
            let _ = ttx.send(ClientSide::get(l, id).map(|c| c.token.get()).unwrap_or(0));
        })?;
        let token = trx.recv().map_err(|_| TransportError::Shutdown)?;
        client.inner.token.store(token, std::sync::atomic::Ordering::Relaxed);
        Ok(client)
    }

    /// The connection id the server assigned (tests: what a wiretap reads
    /// from any frame of this connection).
    #[doc(hidden)]
    pub fn conn_id(&self) -> u32 {
        let id = self.inner.id;
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self
            .inner
            .shared
            .submit(move |l| {
                let _ = tx.send(ClientSide::get(l, id).map(|c| c.conn_id.get()).unwrap_or(0));
            })
            .is_err()
        {
            return 0;
        }
        rx.recv().unwrap_or(0)
    }

    /// The request frame (header, payload) this connection would send for
    /// `payload` now, as a wiretap would capture it, without sending it:
    /// for tests of what a copied frame is worth when another endpoint
    /// sends it. Its correlation id is one no call of this client uses.
    #[doc(hidden)]
    pub fn forge_request(&self, payload: Vec<u8>) -> Result<(Vec<u8>, Vec<u8>)> {
        let id = self.inner.id;
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.inner.shared.submit(move |l| {
            let _ = tx.send(ClientSide::get(l, id).map(|c| ClientSide::forge(&c, payload)));
        })?;
        rx.recv().map_err(|_| TransportError::Shutdown)?.ok_or(TransportError::Shutdown)
    }

    /// The connection's random token (see `ConnHandle::token` on the server):
    /// what session authentication binds to.
    pub fn token(&self) -> u64 {
        self.inner.token.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn remote_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The UCX context to register memory with (the runtime's).
    pub fn context(&self) -> &Context {
        &self.inner.shared.ctx
    }

    /// Sends a request and waits for its reply.
    ///
    /// Waits on a channel, not with a futures executor, so it may be used
    /// inside a caller's `block_on` (a session opened again while a
    /// blocking call reconnects).
    pub fn call(&self, payload: Vec<u8>) -> Result<Vec<u8>> {
        self.call_blocking(payload, None)
    }

    /// Sends an application login request and waits for its answer, like
    /// [`Client::call`], and installs `keys` (`dafne_auth::Secret::frame_keys`
    /// of the login's token and nonce) as the request leaves: the login
    /// is the last untagged frame this client sends on the connection, and
    /// from its answer on every frame it receives must carry a valid tag
    /// and a fresh sequence number (`frame` module docs). A refused login
    /// is answered untagged and still reaches the caller; the connection
    /// is then of no further use. Once per connection.
    pub fn login(&self, payload: Vec<u8>, keys: dafne_auth::FrameKeys) -> Result<Vec<u8>> {
        // The server may answer with an `Upgrade` (a new data endpoint on
        // each side): no connect with this server meanwhile
        // (`Shared::endpoint_order`).
        let order = self.inner.shared.endpoint_order(self.inner.addr);
        let _order = order.write().unwrap_or_else(|p| p.into_inner());
        self.call_blocking(payload, Some(keys))
    }

    fn call_blocking(&self, payload: Vec<u8>, keys: Option<dafne_auth::FrameKeys>) -> Result<Vec<u8>> {
        let fut = self.call_keyed(payload, keys, true);
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.inner.shared.submit(move |l| {
            l.spawn(async move {
                let _ = tx.send(fut.await);
            });
        })?;
        rx.recv().map_err(|_| TransportError::Shutdown)?
    }

    /// Sends a request; the future resolves with the reply. The future is
    /// `Send` and may be awaited on any executor.
    pub fn call_async(&self, payload: Vec<u8>) -> impl Future<Output = Result<Vec<u8>>> + Send + 'static {
        self.call_keyed(payload, None, true)
    }

    /// [`Client::call_async`] without the call timeout: the future resolves
    /// when the server answers or the connection fails (the keepalive
    /// notices a server that stopped answering). For requests the server
    /// may rightly hold for as long as it likes, such as a blocking lock
    /// that is granted when another client lets go.
    pub fn call_async_unbounded(&self, payload: Vec<u8>) -> impl Future<Output = Result<Vec<u8>>> + Send + 'static {
        self.call_keyed(payload, None, false)
    }

    fn call_keyed(
        &self,
        payload: Vec<u8>,
        keys: Option<dafne_auth::FrameKeys>,
        bounded: bool,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let id = self.inner.id;
        let submitted = self.inner.shared.submit(move |l| ClientSide::call(l, id, payload, keys, bounded, tx));
        async move {
            submitted?;
            rx.await.unwrap_or(Err(TransportError::Shutdown))
        }
    }

    /// Sends a request from a task running on this client's runtime loop
    /// (`l` proves the caller is on the loop thread): no thread hop on the
    /// way out or back, which is what the benchmark and a loop-resident
    /// client library use.
    pub fn call_on_loop(&self, l: &Rc<Local>, payload: Vec<u8>) -> impl Future<Output = Result<Vec<u8>>> + 'static {
        let (tx, rx) = oneshot::channel();
        if Arc::ptr_eq(&l.shared, &self.inner.shared) {
            ClientSide::call(l, self.inner.id, payload, None, true, tx);
        } else {
            let _ = tx.send(Err(TransportError::Protocol("call_on_loop from another runtime's loop".into())));
        }
        async move { rx.await.unwrap_or(Err(TransportError::Shutdown)) }
    }

    /// Reads `[remote_addr, remote_addr + len)` of the *server's* memory,
    /// named by its packed key, into `local`, driven by this client: the
    /// Read-Read design of `dafne_bench::designs` (an NFS/RDMA client that
    /// RDMA-reads a buffer the server exposed). dafne's own protocols never
    /// do this (the server drives every RMA; ARCHITECTURE.md), which is why
    /// it is hidden and exists for that comparison only. Resolves when the
    /// bytes are in `local` (or after the call timeout; the memory stays
    /// owned by the operation until UCX completes it). Returns, for a
    /// `Local::Bytes` destination, the filled `Vec`.
    #[doc(hidden)]
    pub fn get_on_loop(
        &self,
        l: &Rc<crate::runtime::Local>,
        local: dafne_ucx::Local,
        remote_addr: u64,
        packed_key: &[u8],
    ) -> impl Future<Output = Result<Option<Vec<u8>>>> + 'static {
        let op = self.post_get(l, local, remote_addr, packed_key);
        let timeout = l.options().call_timeout;
        async move {
            let op = op?;
            let handle = dafne_ucx::Op::clone_handle(&op);
            let timer = std::pin::pin!(crate::timer::sleep(timeout));
            match futures::future::select(handle, timer).await {
                futures::future::Either::Left((r, _)) => r?,
                futures::future::Either::Right(_) => {
                    return Err(TransportError::TimedOut { what: "RMA", after: timeout })
                }
            }
            Ok(op.take_kept().into_iter().find_map(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b))
        }
    }

    fn post_get(
        &self,
        l: &Rc<crate::runtime::Local>,
        local: dafne_ucx::Local,
        remote_addr: u64,
        packed_key: &[u8],
    ) -> Result<dafne_ucx::Op> {
        if !Arc::ptr_eq(&l.shared, &self.inner.shared) {
            return Err(TransportError::Protocol("get_on_loop from another runtime's loop".into()));
        }
        let conn = ClientSide::get(l, self.inner.id).ok_or(TransportError::Shutdown)?;
        if conn.state.get() != State::Ready {
            return Err(conn.failure.borrow().clone().unwrap_or(TransportError::Shutdown));
        }
        let ep = conn.data.borrow().clone().ok_or(TransportError::Shutdown)?;
        let cached = conn.server_keys.borrow().get(packed_key).cloned();
        let key = match cached {
            Some(k) => k,
            None => {
                let k = Rc::new(ep.unpack_key(packed_key)?);
                let mut keys = conn.server_keys.borrow_mut();
                if keys.len() >= SERVER_KEY_ENTRIES {
                    keys.clear();
                }
                keys.insert(packed_key.to_vec(), k.clone());
                k
            }
        };
        Ok(ep.get(local, remote_addr, &key)?)
    }

    /// UCX's description of this connection's data endpoint: which
    /// transports carry messages and RMA.
    pub fn data_path_info(&self) -> Result<String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let id = self.inner.id;
        self.inner.shared.submit(move |l| {
            let s = ClientSide::get(l, id)
                .and_then(|c| c.data.borrow().as_ref().map(|e| e.print_info()))
                .unwrap_or_else(|| "no data endpoint".into());
            let _ = tx.send(s);
        })?;
        rx.recv_timeout(Duration::from_secs(10)).map_err(|_| TransportError::Shutdown)
    }
}
