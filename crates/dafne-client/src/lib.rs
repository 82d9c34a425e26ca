//! The dafne client library, in the application's process (DAFS style).
//!
//! This is its namespace half: [`MetaSession`] opens an authenticated
//! session to the metadata server and offers every namespace operation as a
//! blocking method and as an `async` one (`*_async`), plus path resolution
//! and compounds (several dependent operations in one round trip). Errors
//! are [`Errno`] values, 1:1 with what the server decided, so a FUSE layer
//! can return them as they are. The data half (layouts, striping, RMA) comes
//! with the io servers.
//!
//! # Open files
//! The metadata server keeps an unlinked file's data while some session
//! holds it open (see `dafne_meta::opens`): each successful `Open`, alone
//! or in a Compound, registers one open of the file's data object for the
//! connection, and [`MetaSession::close`] releases one. The session keeps
//! the same count (every reply passes through [`MetaSession::request_async`],
//! which records the opens it carries), because the server's table belongs
//! to a connection: after a reconnect the new connection re-announces them
//! (`Reopen`) right after authenticating, before any other call uses it. A
//! reply whose open was registered on a connection replaced meanwhile is
//! re-announced by itself. While the session holds any open, a thread pings
//! the server every [`KEEPALIVE`], so that a lost connection (a restarted
//! server) is noticed and replaced within the server's grace even when the
//! application makes no call.
//!
//! # Exactly-once
//! Every non-idempotent request (`Request::is_exactly_once`: create,
//! mkdir, link, rename, unlink, setattr, xattr changes, and compounds with
//! one of them) gets the next number of this session's sequence and goes
//! out with (client id, seq, acked_below), where acked_below is the
//! lowest seq still waiting for its answer (or the next seq when none
//! waits). When its connection is lost before the answer came, the call is
//! sent again, same bytes and same seq, on the next connection (waiting
//! for one for up to [`RETRY_DEADLINE`] in all), and the metadata server
//! answers from its replay cache if it had executed it (`dafne_meta`
//! store docs, "Exactly-once replay cache"): a retried exclusive create
//! gets its own `Ok`, not `EEXIST`; a retried unlink does not get
//! `ENOENT`. Past the deadline the call fails with `EIO` and its seq
//! counts as answered. The waits do not block the thread polling
//! [`MetaSession::request_async`] (a completion queue's driver runs its
//! other requests meanwhile): the pause between tries is `link::pause`,
//! and a reconnection runs on a thread of its own
//! (`link::Link::get_async`, waited for at most
//! `link::WAIT_FOR_RECONNECT`, 2 s, per try). The blocking calls block
//! their own thread on the same future.
//!
//! # Riding over a restart
//! A server that crashes and is restarted by the supervisor costs the
//! application a pause, not an error (NFS's hard mount, bounded): besides
//! the exactly-once requests above, the requests that do the same when done
//! twice are sent again, on the next connection, when their connection is
//! lost, for up to [`RETRY_DEADLINE`] (or `$DAFNE_RETRY_DEADLINE_S`
//! seconds, [`retry_deadline`]); a server still down then gets the caller
//! `EIO`, not a hang. The deadline also runs from when the server was
//! found out of reach: once it has been for the deadline, later calls fail
//! after one reconnection attempt instead of each waiting a deadline of
//! its own (a `cat` of a file on a server that stays down took two
//! deadlines, one per read the kernel made). One system call may still
//! take up to a deadline per request it makes before that point. Which
//! (`repeatable`, from `Request::changes_nothing`, the classification meta
//! uses to run a batch without a commit): reads of state (`Lookup`,
//! `GetAttr`, `Readdir`, `Readlink`, `Statfs`, `GetXattr`, `ListXattr`,
//! `Recap`), `Open` without `OPEN_TRUNC` (the open it registered went with
//! the lost connection, whose opens meta drops; the repeat's open is the
//! one counted, and re-announced like any other), and compounds of only
//! these. Not repeated: `Open` with truncation (a second truncate could cut
//! what another client wrote between the two), `Lock`, `TestLock` and
//! `Watch` (module [`locks`] and [`MetaSession::watch`] retry them their
//! own way), `Reopen` (sent by the reconnect itself), `ForgetOrphans` and
//! `RevokeCredential` (admin calls, for the caller to repeat), and the
//! tools' and services' calls (`Members`, `ListOrphans`, `Revocations`:
//! `dafne status` wants a quick answer, the reclaimer and the relay repeat
//! on their own). A `Close` whose connection is lost (or that finds none)
//! is done: the session's count was lowered before it was sent, so no later
//! connection was told of that open; sending it again would release another
//! open of the same object. For the same reason a `Close` goes only on the
//! connection that was current when the count was lowered: one made while
//! that connection is lost, or after it was replaced, is done without
//! being sent (a close made while meta was out of reach used to wait for
//! the reconnection and go out on the new connection, after its `Reopen`). The data half does the same for io requests
//! (module [`data`], "Riding over a restart"). The warnings of calls that
//! fail anyway are throttled ([`Throttle`]: one per server and kind every
//! [`WARN_EVERY`], with a count of those not shown). A call that times out
//! with its connection alive is not repeated (`EAGAIN`).
//!
//! # Locks
//! Byte-range locks ([`MetaSession::lock`], [`MetaSession::test_lock`])
//! are held by the metadata server for this session's client id, and
//! claimed back on every new connection like the opens (module [`locks`]).
//! The keepalive also runs while the session holds a lock.

pub mod calls;
pub mod cluster;
pub mod cq;
pub mod data;
#[cfg(test)]
mod fake_io;
pub mod file;
mod link;
pub use link::{retry_deadline, suppressed_note, throttle, Throttle, RETRY_DEADLINE_ENV, WARN_EVERY};
pub mod locks;
pub mod machine;
pub mod readahead;
pub mod regcache;
pub mod writebehind;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dafne_proto::{
    decode_reply, encode_request, Capability, Envelope, HeldOpen, Layout, Request, SessionSeq, MAX_REOPEN, SEQ_WINDOW,
};
pub use dafne_proto::{
    Attr, Change, CompoundOp, DirEntry, Errno, FileType, Groups, Ino, LayoutHint, LockHolder, LockKind, Orphan,
    Response, SetAttr, StatFs, TimeSet, RENAME_EXCHANGE, RENAME_NOREPLACE, ROOT_INO, XATTR_CREATE, XATTR_REPLACE,
    XATTR_SIZE_MAX,
};
use dafne_transport::{Client, Runtime, TransportError};

/// Errors of session set-up (operations themselves fail with [`Errno`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(
        "the metadata server refused the session: {0} (does this client use the cluster's secret file, or a \
         credential issued for this cluster and not revoked?)"
    )]
    Refused(Errno),
    #[error("protocol error opening the session: {0}")]
    Protocol(String),
    /// An io server did not accept the login (proven with this client's
    /// secret or credential), or the login did not reach it.
    #[error("the io server at {addr} did not accept the login: {why}{}", io_login_hint(why))]
    IoLogin { addr: std::net::SocketAddr, why: String },
}

/// What to look at when an io server's login failed: the secret only when
/// the server refused it (EACCES); a login that failed in transport (a
/// host cut off, seen in tests/multihost.rs as "no keepalive answer")
/// blamed the secret too.
fn io_login_hint(why: &str) -> &'static str {
    if why == Errno::EACCES.to_string() {
        " (does this client use the cluster's secret file, and was the server started with the same --secret?)"
    } else if why.contains("keepalive") || why.contains("timed out") {
        " (the server's host, or the network to it, did not answer in time)"
    } else {
        ""
    }
}

/// What `open` returns: attributes, where the data lives, and the
/// capability io servers will check.
#[derive(Debug, Clone)]
pub struct OpenFile {
    pub attr: Attr,
    pub layout: Layout,
    pub cap: Capability,
}

/// How often a session that holds open files pings the metadata server
/// (module docs, "Open files"); the server's grace must be longer.
pub const KEEPALIVE: Duration = Duration::from_secs(1);

/// How long a call whose connection was lost keeps being sent again on new
/// connections, by default (module docs, "Exactly-once" and "Riding over a
/// restart"; [`retry_deadline`] reads the override).
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);

/// This session's exactly-once sequence (module docs, "Exactly-once").
#[derive(Debug)]
struct Seqs {
    /// The next seq to hand out (from 1).
    next: u64,
    /// Seqs sent and not yet answered or given up.
    outstanding: std::collections::BTreeSet<u64>,
}

impl Seqs {
    /// The identity of a new request: the next seq, and the lowest seq
    /// still waiting, kept inside the server's window (a request more than
    /// [`SEQ_WINDOW`] behind gives up its protection rather than have the
    /// new one refused).
    fn start(&mut self, client: u64) -> SessionSeq {
        let seq = self.next;
        self.next += 1;
        self.outstanding.insert(seq);
        let lowest = self.outstanding.first().copied().unwrap_or(seq);
        SessionSeq { client, seq, acked_below: lowest.max(seq.saturating_sub(SEQ_WINDOW - 1)) }
    }
}

/// Marks a seq answered (or given up) when the call ends, however it ends.
struct SeqDone {
    inner: Arc<Inner>,
    seq: u64,
}

impl Drop for SeqDone {
    fn drop(&mut self) {
        self.inner.seqs.lock().unwrap_or_else(|p| p.into_inner()).outstanding.remove(&self.seq);
    }
}

/// The opens this session holds, as the server counts them.
#[derive(Debug, Default)]
struct Held {
    /// Data object → opens (≥ 1).
    objects: BTreeMap<u64, u32>,
    /// The generation of the connection the server last heard all of
    /// `objects` on.
    announced: link::Generation,
}

struct Inner {
    link: link::Link,
    next_tag: AtomicU64,
    root: Ino,
    held: Arc<Mutex<Held>>,
    /// This session's identity for its locks (module [`locks`]) and its
    /// exactly-once sequence.
    client_id: u64,
    seqs: Mutex<Seqs>,
    locks: Arc<locks::Locks>,
}

impl Inner {
    /// The connection to call on, made again first if it was lost,
    /// without blocking the thread that polls this: the reconnection (a
    /// connect that waits up to the connect timeout for a meta that
    /// accepts nothing, then the session's `hello`) runs on a thread of
    /// its own (`link::Link::get_async`). `None` as for `get_async`.
    async fn connection(self: &Arc<Self>) -> Option<(Client, link::Generation)> {
        let me = self.clone();
        self.link
            .get_async(move || {
                std::thread::Builder::new()
                    .name("dafne-meta-reconnect".into())
                    .spawn(move || me.link.reconnect_in_background())
                    .is_ok()
            })
            .await
    }
}

fn held(h: &Mutex<Held>) -> MutexGuard<'_, Held> {
    h.lock().unwrap_or_else(|p| p.into_inner())
}

/// The data objects a reply opened.
fn opened_objects(r: &Response) -> Vec<u64> {
    match r {
        Response::Opened { layout, .. } => vec![layout.object_id],
        Response::Compound { results } => results
            .iter()
            .filter_map(|r| match r {
                Ok(Response::Opened { layout, .. }) => Some(layout.object_id),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

impl Inner {
    /// Counts the opens of a reply that came on connection `generation`;
    /// those the current connection has not heard of (its re-announce ran
    /// before they were counted), to announce on it.
    fn record_opens(&self, objects: &[u64], generation: link::Generation) -> Vec<HeldOpen> {
        let mut h = held(&self.held);
        for &o in objects {
            *h.objects.entry(o).or_insert(0) += 1;
        }
        if h.announced == generation {
            return Vec::new();
        }
        let mut late: BTreeMap<u64, u32> = BTreeMap::new();
        for &o in objects {
            *late.entry(o).or_insert(0) += 1;
        }
        late.into_iter().map(|(object_id, count)| HeldOpen { object_id, count }).collect()
    }
}

/// Whether a request that is not exactly-once may be sent again after its
/// connection was lost, without changing what it does (module docs,
/// "Riding over a restart"): one that changes nothing stored
/// ([`Request::changes_nothing`], the list meta also runs without a
/// commit): reads of state, and `Open` without truncation (the open it
/// registers was on the lost connection; the answer to the repeat is the
/// one counted).
/// The services' polls (`ListOrphans`, `Revocations`) are not: their
/// callers want a quick answer and repeat on their own.
pub(crate) fn repeatable(req: &Request) -> bool {
    match req {
        Request::ListOrphans { .. } | Request::Revocations { .. } => false,
        Request::Compound { ops } => ops.iter().all(|o| repeatable(&o.req)),
        _ => req.changes_nothing(),
    }
}

/// Logs (throttled: module `link`) a metadata call that failed for a lost
/// connection after `began`.
fn warn_lost(link: &link::Link, began: std::time::Instant, why: &str) {
    let addr = link.addr();
    if let Some(n) = link::throttle().allow(&format!("meta call {addr}")) {
        tracing::warn!(
            "a call to the metadata server at {addr} failed after {:.1?} ({why}): EIO{}",
            began.elapsed(),
            link::suppressed_note(n)
        );
    }
}

/// 16 random bytes for a login: with the connection's token they make the
/// connection's frame keys (`dafne_auth::Secret::frame_keys`).
pub(crate) fn login_nonce() -> [u8; 16] {
    let mut nonce = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut nonce));
    if random.is_err() {
        // No randomness: time and pid. The keys stay unique to the
        // connection anyway, through its random token.
        for (i, b) in nonce.iter_mut().enumerate() {
            *b = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
                >> (i % 8 * 8)) as u8
                ^ (std::process::id() >> (i % 4 * 8)) as u8
                ^ i as u8;
        }
    }
    nonce
}

/// How this process names itself in io logins: host name and pid.
pub(crate) fn client_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}/pid {}", host.trim(), std::process::id())
}

/// An authenticated session to the metadata server, acting as one user.
/// Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct MetaSession {
    inner: Arc<Inner>,
    uid: u32,
    gid: u32,
    /// Supplementary groups sent with every request.
    groups: Groups,
}

impl std::fmt::Debug for MetaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaSession")
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("groups", &self.groups)
            .finish()
    }
}

pub(crate) fn io_err(e: TransportError) -> Errno {
    match e {
        TransportError::TimedOut { .. } => Errno::EAGAIN,
        TransportError::TooLarge { .. } => Errno::EINVAL,
        _ => Errno::EIO,
    }
}

impl MetaSession {
    /// Connects to the metadata server at `addr` and authenticates with
    /// `key`: the cluster secret (a `&Secret` will do) or a credential
    /// (`dafne_auth::LoginKey`). Operations run as `uid`/`gid`, which the
    /// server holds to the credential's policy.
    pub fn connect(
        rt: &Runtime,
        addr: SocketAddr,
        key: impl Into<dafne_auth::LoginKey>,
        client_name: &str,
        uid: u32,
        gid: u32,
    ) -> Result<MetaSession, ConnectError> {
        let secret: dafne_auth::LoginKey = key.into();
        let client = Client::connect(rt, addr)?;
        let root = Self::open_session(&client, &secret, client_name, uid, gid)?;
        // After a lost connection (meta restarted), the next call opens the
        // session again on a new one (see `link`), which then hears of the
        // files this session holds open.
        let name = client_name.to_string();
        let held = Arc::new(Mutex::new(Held::default()));
        let held2 = held.clone();
        let client_id = u64::from_le_bytes(login_nonce()[..8].try_into().unwrap_or_default());
        let locks = Arc::new(locks::Locks::default());
        let locks2 = locks.clone();
        let hello = Box::new(move |c: &Client, generation| {
            Self::open_session(c, &secret, &name, uid, gid).map_err(|e| e.to_string())?;
            Self::reannounce(c, &held2, generation, uid, gid)?;
            locks2.reclaim(c, client_id, uid, gid)
        });
        let link = link::Link::new(client, hello);
        let seqs = Mutex::new(Seqs { next: 1, outstanding: Default::default() });
        let inner = Arc::new(Inner { link, next_tag: AtomicU64::new(1), root, held, client_id, seqs, locks });
        Self::start_keepalive(Arc::downgrade(&inner), uid, gid);
        Ok(MetaSession { inner, uid, gid, groups: Groups::NONE })
    }

    /// Tells a new connection (of `generation`) every open this session
    /// holds. A refusal by the server (a bound) is logged, not fatal: the
    /// connection still serves; a lost connection fails the reconnect.
    fn reannounce(
        c: &Client,
        held: &Mutex<Held>,
        generation: link::Generation,
        uid: u32,
        gid: u32,
    ) -> Result<(), String> {
        let mut h = self::held(held);
        let all: Vec<HeldOpen> = h.objects.iter().map(|(&object_id, &count)| HeldOpen { object_id, count }).collect();
        for page in all.chunks(MAX_REOPEN) {
            let req = Request::Reopen { held: page.to_vec() };
            let bytes = c.call(encode_request(Envelope::new(0, uid, gid), &req)).map_err(|e| e.to_string())?;
            match decode_reply(&bytes) {
                Ok((_, _, Ok(_))) => {}
                Ok((_, _, Err(e))) => {
                    tracing::warn!("the metadata server refused {} re-announced opens: {e}", page.len())
                }
                Err(e) => return Err(format!("re-announcing open files: {e}")),
            }
        }
        h.announced = generation;
        Ok(())
    }

    /// The thread that pings the server while the session holds open files
    /// (module docs, "Open files"); it ends with the session.
    fn start_keepalive(inner: std::sync::Weak<Inner>, uid: u32, gid: u32) {
        let spawned = std::thread::Builder::new().name("dafne-meta-keepalive".into()).spawn(move || loop {
            std::thread::sleep(KEEPALIVE);
            let Some(inner) = inner.upgrade() else { return };
            if held(&inner.held).objects.is_empty() && !inner.locks.any() {
                continue;
            }
            let s = MetaSession { inner, uid, gid, groups: Groups::NONE };
            // A failure marks a lost connection; the next ping reconnects.
            let _ = s.getattr(s.root());
        });
        if let Err(e) = spawned {
            tracing::warn!(
                "no keepalive thread for the metadata session ({e}): a server restart is noticed only at the next call"
            );
        }
    }

    /// Authenticates a connection with `secret` (the cluster's, or a
    /// credential's key with its policy); the root inode.
    fn open_session(
        client: &Client,
        secret: &dafne_auth::LoginKey,
        client_name: &str,
        uid: u32,
        gid: u32,
    ) -> Result<Ino, ConnectError> {
        let nonce = login_nonce();
        let mac = secret.session_mac(client.token(), &nonce, client_name);
        // The frame keys come from the same key, token and nonce as the
        // login: the server derives them when the login verifies.
        let keys = secret.key().frame_keys(client.token(), &nonce);
        let req = Request::SessionOpen {
            client_name: client_name.to_string(),
            nonce,
            mac,
            credential: secret.credential().cloned(),
        };
        let bytes = client.login(encode_request(Envelope::new(0, uid, gid), &req), keys)?;
        let (_, _, result) = decode_reply(&bytes).map_err(|e| ConnectError::Protocol(e.to_string()))?;
        match result {
            Ok(Response::Session { root, .. }) => Ok(root),
            Ok(other) => Err(ConnectError::Protocol(format!("unexpected reply {other:?}"))),
            Err(e) => Err(ConnectError::Refused(e)),
        }
    }

    /// The transport connection the session uses now (tests: what a
    /// wiretap on it sees).
    #[doc(hidden)]
    pub fn transport(&self) -> Option<dafne_transport::Client> {
        self.inner.link.get().map(|(c, _)| c)
    }

    /// Connections opened again after the metadata server was lost.
    pub fn reconnects(&self) -> u64 {
        self.inner.link.reconnects()
    }

    /// The same session acting as another user (what a FUSE daemon does for
    /// each caller).
    pub fn as_user(&self, uid: u32, gid: u32) -> MetaSession {
        MetaSession { inner: self.inner.clone(), uid, gid, groups: Groups::NONE }
    }

    /// [`Self::as_user`] with the caller's supplementary groups (the
    /// server checks them like `gid`).
    pub fn as_caller(&self, uid: u32, gid: u32, groups: Groups) -> MetaSession {
        MetaSession { inner: self.inner.clone(), uid, gid, groups }
    }

    pub fn root(&self) -> Ino {
        self.inner.root
    }

    fn next_tag(&self) -> u64 {
        self.inner.next_tag.fetch_add(1, Ordering::Relaxed)
    }

    fn envelope(&self, tag: u64) -> Envelope {
        Envelope {
            tag,
            uid: self.uid,
            gid: self.gid,
            groups: self.groups,
            session: None,
            chain: None,
            forwarded: false,
        }
    }

    /// Sends one request; resolves with the server's answer. A
    /// non-idempotent one, and one that may be repeated, is sent again
    /// after a lost connection (module docs, "Exactly-once", "Riding over a
    /// restart").
    pub fn request_async(&self, req: Request) -> impl Future<Output = Result<Response, Errno>> + Send + 'static {
        self.request_on_async(req, None)
    }

    /// [`Self::request_async`], sent only on the connection of generation
    /// `only_on` when given (a `Close`: the connection that was current
    /// when the session lowered its count, [`Self::close_async`]): when
    /// that one is lost or was replaced, nothing is sent and the call is
    /// done, and no reconnection is made for it.
    fn request_on_async(
        &self,
        req: Request,
        only_on: Option<link::Generation>,
    ) -> impl Future<Output = Result<Response, Errno>> + Send + 'static {
        let tag = self.inner.next_tag.fetch_add(1, Ordering::Relaxed);
        let inner = self.inner.clone();
        let session = req.is_exactly_once().then(|| {
            let s = inner.seqs.lock().unwrap_or_else(|p| p.into_inner()).start(inner.client_id);
            (s, SeqDone { inner: inner.clone(), seq: s.seq })
        });
        let env = Envelope { session: session.as_ref().map(|(s, _)| *s), ..self.envelope(tag) };
        let payload = encode_request(env, &req);
        // Sent now when the connection serves, so that requests go out in
        // the order their futures were made; a connection to make again is
        // made when the future is polled, on a thread of its own
        // (`Inner::connection`), never on the caller's: a completion
        // queue's driver polls every request of the queue, and a
        // reconnection to a meta that accepts nothing blocks up to the
        // connect timeout.
        let first =
            self.inner.link.serving().filter(|&(_, g)| only_on.is_none_or(|on| on == g)).map(|(c, generation)| {
                calls::meta_sent();
                (c.call_async(payload.clone()), generation)
            });
        let (uid, gid) = (self.uid, self.gid);
        let retrying = session.is_some() || repeatable(&req);
        let is_close = matches!(req, Request::Close { .. });
        async move {
            let began = std::time::Instant::now();
            let _done = session.map(|(_, d)| d);
            let send = |(c, g): (Client, link::Generation)| {
                calls::meta_sent();
                (c.call_async(payload.clone()), g)
            };
            let mut call = match first {
                Some(sent) => Some(sent),
                // Not on another connection: the one it was for is gone.
                None if only_on.is_some() => None,
                None => inner.connection().await.map(send),
            };
            let (bytes, generation) = loop {
                let Some((pending, generation)) = call.take() else {
                    if retrying && !inner.link.past_deadline(began) {
                        link::pause(link::RETRY_EVERY).await;
                        call = inner.connection().await.map(send);
                        continue;
                    }
                    if is_close {
                        // Never sent: its open is on the broken connection.
                        return Ok(Response::Done);
                    }
                    warn_lost(&inner.link, began, "no connection");
                    return Err(Errno::EIO);
                };
                match pending.await {
                    Ok(bytes) => break (bytes, generation),
                    Err(e) => {
                        inner.link.failed(generation, &e);
                        if is_close && link::is_connection_loss(&e) {
                            // The open went with its connection: module
                            // docs, "Riding over a restart".
                            return Ok(Response::Done);
                        }
                        if !(retrying && link::is_connection_loss(&e) && !inner.link.past_deadline(began)) {
                            warn_lost(&inner.link, began, &e.to_string());
                            return Err(io_err(e));
                        }
                        tracing::debug!("connection lost under a call that may be repeated ({e}): sending it again");
                        call = inner.connection().await.map(send);
                    }
                }
            };
            let (rtag, _, result) = decode_reply(&bytes).map_err(|_| Errno::EPROTO)?;
            if rtag != tag {
                return Err(Errno::EPROTO);
            }
            if let Ok(r) = &result {
                let objects = opened_objects(r);
                if !objects.is_empty() {
                    let late = inner.record_opens(&objects, generation);
                    // Best effort: if this fails too, the connection is lost
                    // and the next one hears of them.
                    let current = if late.is_empty() { None } else { inner.connection().await };
                    if let Some((c, g)) = current {
                        let req = Request::Reopen { held: late };
                        let tag = inner.next_tag.fetch_add(1, Ordering::Relaxed);
                        calls::meta_sent();
                        if let Err(e) = c.call_async(encode_request(Envelope::new(tag, uid, gid), &req)).await {
                            inner.link.failed(g, &e);
                        }
                    }
                }
            }
            result
        }
    }

    /// Waits for the namespace changes other sessions made after change
    /// `since` of the server's log (0: from now on) and returns them with
    /// the cursor for the next call and whether some were lost
    /// (`dafne_meta::changes`). No call timeout: the server answers when
    /// there are changes; a broken connection fails it (`EIO`), and the
    /// next call reconnects.
    pub fn watch(&self, since: u64) -> Result<(u64, bool, Vec<dafne_proto::Change>), Errno> {
        match self.call_retrying(Request::Watch { since }, true, Duration::ZERO)? {
            Response::Changes { next, lost, changes } => Ok((next, lost, changes)),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Opens of data objects this session holds (as the server counts
    /// them for its connection).
    pub fn held_opens(&self) -> usize {
        held(&self.inner.held).objects.values().map(|&c| c as usize).sum()
    }

    pub fn request(&self, req: Request) -> Result<Response, Errno> {
        futures::executor::block_on(self.request_async(req))
    }

    fn entry(r: Result<Response, Errno>) -> Result<Attr, Errno> {
        match r? {
            Response::Entry { attr } | Response::Attr { attr } => Ok(attr),
            _ => Err(Errno::EPROTO),
        }
    }

    fn done(r: Result<Response, Errno>) -> Result<(), Errno> {
        match r? {
            Response::Done => Ok(()),
            _ => Err(Errno::EPROTO),
        }
    }

    pub async fn lookup_async(&self, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::Lookup { parent, name: name.to_vec() }).await)
    }

    pub async fn getattr_async(&self, ino: Ino) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::GetAttr { ino }).await)
    }

    pub async fn setattr_async(&self, ino: Ino, set: SetAttr) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::SetAttr { ino, set }).await)
    }

    pub async fn create_async(&self, parent: Ino, name: &[u8], mode: u32, exclusive: bool) -> Result<Attr, Errno> {
        self.create_with_async(parent, name, mode, exclusive, None).await
    }

    /// Create with layout advice (stripe unit and count; 0 = cluster default).
    pub async fn create_with_async(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        hint: Option<LayoutHint>,
    ) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::Create { parent, name: name.to_vec(), mode, exclusive, hint }).await)
    }

    pub async fn mkdir_async(&self, parent: Ino, name: &[u8], mode: u32) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::Mkdir { parent, name: name.to_vec(), mode }).await)
    }

    /// Makes a FIFO, socket, character or block device (`rdev` names the
    /// device, in `Attr::rdev`'s encoding), or a regular file without
    /// opening it. Devices need uid 0 (`EPERM`); `Directory` and `Symlink`
    /// are refused (they have `mkdir` and `symlink`).
    pub async fn mknod_async(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileType,
        mode: u32,
        rdev: u64,
    ) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::Mknod { parent, name: name.to_vec(), kind, mode, rdev }).await)
    }

    /// One page of a directory listing after `cookie` (0 = from the start);
    /// `true` when the listing is complete.
    pub async fn readdir_page_async(
        &self,
        ino: Ino,
        cookie: u64,
        max_entries: u32,
    ) -> Result<(Vec<DirEntry>, bool), Errno> {
        match self.request_async(Request::Readdir { ino, cookie, max_entries }).await? {
            Response::Dir { entries, eof } => Ok((entries, eof)),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The whole directory, paging with cookies.
    pub async fn readdir_async(&self, ino: Ino) -> Result<Vec<DirEntry>, Errno> {
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let (page, eof) = self.readdir_page_async(ino, cookie, 512).await?;
            if let Some(last) = page.last() {
                cookie = last.cookie;
            }
            out.extend(page);
            if eof {
                return Ok(out);
            }
        }
    }

    pub async fn unlink_async(&self, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        Self::done(self.request_async(Request::Unlink { parent, name: name.to_vec() }).await)
    }

    pub async fn rmdir_async(&self, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        Self::done(self.request_async(Request::Rmdir { parent, name: name.to_vec() }).await)
    }

    /// Atomic rename, replacing an existing destination.
    pub async fn rename_async(
        &self,
        src_parent: Ino,
        src_name: &[u8],
        dst_parent: Ino,
        dst_name: &[u8],
    ) -> Result<(), Errno> {
        self.rename_flags_async(src_parent, src_name, dst_parent, dst_name, 0).await
    }

    /// `renameat2(2)`: with [`RENAME_NOREPLACE`], `EEXIST` if the
    /// destination exists; with [`RENAME_EXCHANGE`], the two names swap
    /// (both must exist, `ENOENT`). The server checks and changes in one
    /// transaction, so no other client comes between. Other bits: `EINVAL`.
    pub async fn rename_flags_async(
        &self,
        src_parent: Ino,
        src_name: &[u8],
        dst_parent: Ino,
        dst_name: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 {
            return Err(Errno::EINVAL);
        }
        Self::done(
            self.request_async(Request::Rename {
                src_parent,
                src_name: src_name.to_vec(),
                dst_parent,
                dst_name: dst_name.to_vec(),
                flags,
            })
            .await,
        )
    }

    /// `setxattr(2)` on an inode: `name` with its namespace prefix
    /// (`user.`, `trusted.`, `security.`), `flags` [`XATTR_CREATE`] or
    /// [`XATTR_REPLACE`] or 0. The server applies Linux's rules and
    /// limits; a value above [`XATTR_SIZE_MAX`] is `E2BIG` here (the wire
    /// carries no more), a name above the wire's limit `ERANGE`.
    pub async fn setxattr_async(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Errno::EINVAL);
        }
        let name = xattr_name(name)?;
        Self::done(self.request_async(Request::SetXattr { ino, name, value: value.to_vec(), flags }).await)
    }

    /// `getxattr(2)`: the whole value (`ENODATA` if there is none).
    pub async fn getxattr_async(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let name = xattr_name(name)?;
        match self.request_async(Request::GetXattr { ino, name }).await? {
            Response::Xattr { value } => Ok(value),
            _ => Err(Errno::EPROTO),
        }
    }

    /// `listxattr(2)`: the names the caller may see (`trusted.*` only for
    /// root), in byte order.
    pub async fn listxattr_async(&self, ino: Ino) -> Result<Vec<Vec<u8>>, Errno> {
        match self.request_async(Request::ListXattr { ino }).await? {
            Response::XattrNames { names } => Ok(names),
            _ => Err(Errno::EPROTO),
        }
    }

    /// `removexattr(2)` (`ENODATA` if there is none).
    pub async fn removexattr_async(&self, ino: Ino, name: &[u8]) -> Result<(), Errno> {
        let name = xattr_name(name)?;
        Self::done(self.request_async(Request::RemoveXattr { ino, name }).await)
    }

    pub async fn symlink_async(&self, parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::Symlink { parent, name: name.to_vec(), target: target.to_vec() }).await)
    }

    pub async fn readlink_async(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        match self.request_async(Request::Readlink { ino }).await? {
            Response::Link { target } => Ok(target),
            _ => Err(Errno::EPROTO),
        }
    }

    pub async fn link_async(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr, Errno> {
        Self::entry(self.request_async(Request::Link { ino, new_parent, new_name: new_name.to_vec() }).await)
    }

    pub async fn statfs_async(&self) -> Result<StatFs, Errno> {
        match self.request_async(Request::Statfs).await? {
            Response::StatFs(s) => Ok(s),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Opens a regular file: its layout and a capability for the io servers.
    /// Each open holds the file's data until [`MetaSession::close`] (or the
    /// end of the session), also after its last link is gone.
    pub async fn open_async(&self, ino: Ino, flags: u32) -> Result<OpenFile, Errno> {
        match self.request_async(Request::Open { ino, flags }).await? {
            Response::Opened { attr, layout, cap } => Ok(OpenFile { attr, layout, cap }),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Releases one open of a data object (what `open`, `open_at` or an
    /// `Open` in a compound made): once no session holds it, the data of a
    /// file without links may be reclaimed. `EBADF` if this session holds
    /// no open of it. The server not knowing of the open (a reconnect's
    /// re-announce ran after this release began) is success.
    pub async fn close_async(&self, object_id: u64) -> Result<(), Errno> {
        // Lowered under the lock that a reconnection's re-announce holds:
        // a connection made after this hears of one open less, so the
        // close goes only on the connection current now (module docs,
        // "Riding over a restart"). Sent on the next one, it released
        // another open of the object there (an unlinked file still open
        // was named an orphan).
        let current = {
            let mut h = held(&self.inner.held);
            let count = h.objects.get_mut(&object_id).ok_or(Errno::EBADF)?;
            *count -= 1;
            if *count == 0 {
                h.objects.remove(&object_id);
            }
            self.inner.link.generation()
        };
        match self.request_on_async(Request::Close { object_id }, Some(current)).await {
            Ok(Response::Done) | Err(Errno::EBADF) => Ok(()),
            Ok(_) => Err(Errno::EPROTO),
            Err(e) => Err(e),
        }
    }

    /// Root only (`EPERM` otherwise): up to `max` data objects (at most
    /// [`dafne_proto::MAX_ORPHANS`]) whose file went at least
    /// `older_than_s` seconds ago, with the io servers that hold them.
    pub async fn list_orphans_async(&self, older_than_s: u32, max: u32) -> Result<Vec<Orphan>, Errno> {
        Ok(self.list_orphans_at_async(older_than_s, max).await?.0)
    }

    /// [`MetaSession::list_orphans`] with the capability generation of the
    /// listing: every capability of a listed object is older (what the
    /// reclaimer's removal carries, `dafne_auth`'s module docs).
    pub async fn list_orphans_at_async(&self, older_than_s: u32, max: u32) -> Result<(Vec<Orphan>, u64), Errno> {
        match self.request_async(Request::ListOrphans { older_than_s, max }).await? {
            Response::Orphans { orphans, generation } => Ok((orphans, generation)),
            _ => Err(Errno::EPROTO),
        }
    }

    /// A capability like `cap` at the current generation, for an object
    /// this session holds open (`EACCES` otherwise; `ESTALE` once its data
    /// is reclaimed): what the data client asks for when an io server
    /// answers `ESTALE` to a revoked capability (`dafne_auth`, "Revocation").
    pub async fn recap_async(&self, cap: Capability) -> Result<Capability, Errno> {
        match self.request_async(Request::Recap { cap }).await? {
            Response::Cap { cap } => Ok(cap),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Root only: meta's signed revocation log after entry `since` of meta
    /// instance `instance` (a reset otherwise), for the io servers.
    pub async fn revocations_async(&self, instance: u64, since: u64) -> Result<dafne_proto::Revocations, Errno> {
        match self.request_async(Request::Revocations { instance, since }).await? {
            Response::Revocations(batch) => Ok(batch),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Root only (`EPERM` otherwise): drops reclaimed objects (at most
    /// [`dafne_proto::MAX_FORGET_ORPHANS`]) from the orphan list.
    pub async fn forget_orphans_async(&self, objects: Vec<u64>) -> Result<(), Errno> {
        Self::done(self.request_async(Request::ForgetOrphans { objects }).await)
    }

    /// Admin only (a session of the cluster secret, as root): the
    /// credential `name` is refused from now on and its sessions end.
    pub fn revoke_credential(&self, name: &str) -> Result<(), Errno> {
        Self::done(self.request(Request::RevokeCredential { name: name.to_string() }))
    }

    /// Several dependent operations in one round trip. With `chain` set, an
    /// operation works on the inode the previous one produced. Results stop
    /// at the first error.
    pub async fn compound_async(&self, ops: Vec<CompoundOp>) -> Result<Vec<Result<Response, Errno>>, Errno> {
        match self.request_async(Request::Compound { ops }).await? {
            Response::Compound { results } => Ok(results),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Lookup + open of `name` in `parent` in one round trip.
    pub async fn open_at_async(&self, parent: Ino, name: &[u8], flags: u32) -> Result<OpenFile, Errno> {
        let ops = vec![
            CompoundOp { chain: false, req: Request::Lookup { parent, name: name.to_vec() } },
            CompoundOp { chain: true, req: Request::Open { ino: 0, flags } },
        ];
        let mut results = self.compound_async(ops).await?;
        match results.pop() {
            Some(Ok(Response::Opened { attr, layout, cap })) => Ok(OpenFile { attr, layout, cap }),
            Some(Err(e)) => Err(e),
            _ => Err(Errno::EPROTO),
        }
    }
}

/// An attribute name the wire can carry: longer than any name the server
/// accepts is `ERANGE` here, as the server would answer.
fn xattr_name(name: &[u8]) -> Result<Vec<u8>, Errno> {
    if name.len() > dafne_proto::MAX_NAME_WIRE {
        return Err(Errno::ERANGE);
    }
    Ok(name.to_vec())
}

/// The blocking twin of every `*_async` operation (never call these from a
/// task running on the transport's loop thread).
macro_rules! blocking {
    ($( $(#[$m:meta])* $name:ident => $async_name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {
        impl MetaSession {
            $( $(#[$m])* pub fn $name(&self, $($arg: $ty),*) -> $ret {
                futures::executor::block_on(self.$async_name($($arg),*))
            } )*
        }
    };
}

blocking! {
    lookup => lookup_async(parent: Ino, name: &[u8]) -> Result<Attr, Errno>;
    getattr => getattr_async(ino: Ino) -> Result<Attr, Errno>;
    setattr => setattr_async(ino: Ino, set: SetAttr) -> Result<Attr, Errno>;
    create => create_async(parent: Ino, name: &[u8], mode: u32, exclusive: bool) -> Result<Attr, Errno>;
    create_with => create_with_async(parent: Ino, name: &[u8], mode: u32, exclusive: bool, hint: Option<LayoutHint>) -> Result<Attr, Errno>;
    mkdir => mkdir_async(parent: Ino, name: &[u8], mode: u32) -> Result<Attr, Errno>;
    mknod => mknod_async(parent: Ino, name: &[u8], kind: FileType, mode: u32, rdev: u64) -> Result<Attr, Errno>;
    readdir_page => readdir_page_async(ino: Ino, cookie: u64, max_entries: u32) -> Result<(Vec<DirEntry>, bool), Errno>;
    readdir => readdir_async(ino: Ino) -> Result<Vec<DirEntry>, Errno>;
    unlink => unlink_async(parent: Ino, name: &[u8]) -> Result<(), Errno>;
    rmdir => rmdir_async(parent: Ino, name: &[u8]) -> Result<(), Errno>;
    rename => rename_async(src_parent: Ino, src_name: &[u8], dst_parent: Ino, dst_name: &[u8]) -> Result<(), Errno>;
    rename_flags => rename_flags_async(src_parent: Ino, src_name: &[u8], dst_parent: Ino, dst_name: &[u8], flags: u32) -> Result<(), Errno>;
    setxattr => setxattr_async(ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno>;
    getxattr => getxattr_async(ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno>;
    listxattr => listxattr_async(ino: Ino) -> Result<Vec<Vec<u8>>, Errno>;
    removexattr => removexattr_async(ino: Ino, name: &[u8]) -> Result<(), Errno>;
    symlink => symlink_async(parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr, Errno>;
    readlink => readlink_async(ino: Ino) -> Result<Vec<u8>, Errno>;
    link => link_async(ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr, Errno>;
    statfs => statfs_async() -> Result<StatFs, Errno>;
    open => open_async(ino: Ino, flags: u32) -> Result<OpenFile, Errno>;
    close => close_async(object_id: u64) -> Result<(), Errno>;
    compound => compound_async(ops: Vec<CompoundOp>) -> Result<Vec<Result<Response, Errno>>, Errno>;
    open_at => open_at_async(parent: Ino, name: &[u8], flags: u32) -> Result<OpenFile, Errno>;
    list_orphans => list_orphans_async(older_than_s: u32, max: u32) -> Result<Vec<Orphan>, Errno>;
    list_orphans_at => list_orphans_at_async(older_than_s: u32, max: u32) -> Result<(Vec<Orphan>, u64), Errno>;
    recap => recap_async(cap: Capability) -> Result<Capability, Errno>;
    revocations => revocations_async(instance: u64, since: u64) -> Result<dafne_proto::Revocations, Errno>;
    forget_orphans => forget_orphans_async(objects: Vec<u64>) -> Result<(), Errno>;
}

impl MetaSession {
    /// Resolves a path (`/a/b/c`, or relative to the root), component by
    /// component. Symlinks met before the last component are followed (the
    /// whole resolution follows at most 40, as Linux); the last component is
    /// followed only when the path ends in `/`.
    ///
    /// A path of at most [`MAX_COMPOUND`](dafne_proto::MAX_COMPOUND)
    /// components is first looked up in one round trip (a compound of
    /// chained lookups); only when it meets a symbolic link on the way, or
    /// ends in `/`, is it walked a component at a time, with the same
    /// answers (the server checks each lookup as it would alone).
    pub fn resolve(&self, path: &str) -> Result<Attr, Errno> {
        if let Some(r) = self.resolve_in_one_trip(path) {
            return r;
        }
        let mut budget = 40u32;
        let follow_last = path.ends_with('/');
        self.resolve_from(self.inner.root, path.as_bytes(), follow_last, &mut budget)
    }

    /// [`MetaSession::resolve`] following a symlink in the last component
    /// too, whatever it names (what `stat(2)` and `open(2)` do).
    pub fn resolve_follow(&self, path: &str) -> Result<Attr, Errno> {
        let mut budget = 40u32;
        self.resolve_from(self.inner.root, path.as_bytes(), true, &mut budget)
    }

    /// `resolve` in one compound; `None` when the walk must decide (a
    /// trailing `/`, the root alone, too many components, or a symbolic
    /// link before the last component).
    fn resolve_in_one_trip(&self, path: &str) -> Option<Result<Attr, Errno>> {
        if path.ends_with('/') || path.len() >= dafne_proto::MAX_SYMLINK {
            return None;
        }
        let comps: Vec<&[u8]> = path.as_bytes().split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
        if comps.is_empty() || comps.len() > dafne_proto::MAX_COMPOUND {
            return None;
        }
        let n = comps.len();
        let ops = comps
            .iter()
            .enumerate()
            .map(|(i, c)| CompoundOp {
                chain: i > 0,
                req: Request::Lookup { parent: self.inner.root, name: c.to_vec() },
            })
            .collect();
        let results = match self.compound(ops) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        // Results stop at the first error: all n of them, or an error last.
        if results.len() > n {
            return Some(Err(Errno::EPROTO));
        }
        let complete = results.len() == n;
        let mut last = None;
        for (i, r) in results.into_iter().enumerate() {
            match Self::entry(r) {
                // A link on the way: the walk follows it (a lookup chained
                // on it failed with ENOTDIR, which is not the answer).
                Ok(a) if a.kind == FileType::Symlink && i + 1 < n => return None,
                Ok(a) => last = Some(a),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(match last {
            Some(a) if complete => Ok(a),
            _ => Err(Errno::EPROTO),
        })
    }

    fn resolve_from(&self, start: Ino, path: &[u8], follow_last: bool, budget: &mut u32) -> Result<Attr, Errno> {
        if path.len() >= dafne_proto::MAX_SYMLINK {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut cur = if path.first() == Some(&b'/') { self.getattr(self.inner.root)? } else { self.getattr(start)? };
        let comps: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
        for (i, c) in comps.iter().enumerate() {
            if cur.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            let parent = cur.ino;
            let next = self.lookup(parent, c)?;
            let last = i + 1 == comps.len();
            cur = if next.kind == FileType::Symlink && (!last || follow_last) {
                if *budget == 0 {
                    return Err(Errno::ELOOP);
                }
                *budget -= 1;
                let target = self.readlink(next.ino)?;
                // A link's target is resolved completely, its own last
                // component included.
                self.resolve_from(parent, &target, true, budget)?
            } else {
                next
            };
        }
        if follow_last && cur.kind != FileType::Directory && path.ends_with(b"/") {
            return Err(Errno::ENOTDIR);
        }
        Ok(cur)
    }
}

#[cfg(test)]
mod io_login_tests {
    use super::*;

    #[test]
    fn only_reads_of_state_and_opens_without_truncation_are_repeated() {
        use dafne_proto::{OPEN_READ, OPEN_TRUNC, OPEN_WRITE};
        let lookup = Request::Lookup { parent: 1, name: b"a".to_vec() };
        assert!(repeatable(&lookup));
        assert!(repeatable(&Request::GetAttr { ino: 1 }));
        assert!(repeatable(&Request::Open { ino: 2, flags: OPEN_READ | OPEN_WRITE }));
        assert!(!repeatable(&Request::Open { ino: 2, flags: OPEN_WRITE | OPEN_TRUNC }), "a truncate done twice");
        assert!(!repeatable(&Request::Close { object_id: 3 }), "a second close releases another open");
        assert!(!repeatable(&Request::Watch { since: 0 }));
        assert!(!repeatable(&Request::Members), "dafne status wants a quick answer");
        let open_at = |flags| Request::Compound {
            ops: vec![
                CompoundOp { chain: false, req: lookup.clone() },
                CompoundOp { chain: true, req: Request::Open { ino: 0, flags } },
            ],
        };
        assert!(repeatable(&open_at(OPEN_READ)));
        assert!(!repeatable(&open_at(OPEN_TRUNC)));
        // Changes are exactly-once (the replay cache), not repeatable.
        let unlink = Request::Unlink { parent: 1, name: b"a".to_vec() };
        assert!(!repeatable(&unlink) && unlink.is_exactly_once());
    }

    #[test]
    fn only_a_refused_login_blames_the_secret() {
        let addr: SocketAddr = "10.0.0.2:7710".parse().unwrap();
        let refused = ConnectError::IoLogin { addr, why: Errno::EACCES.to_string() }.to_string();
        assert!(refused.contains("same --secret"), "{refused}");
        let cut = ConnectError::IoLogin {
            addr,
            why: "connection to 10.0.0.2:7710 failed: no keepalive answer for 5.2s".into(),
        };
        let cut = cut.to_string();
        assert!(!cut.contains("secret") && cut.contains("did not answer in time"), "{cut}");
    }
}
