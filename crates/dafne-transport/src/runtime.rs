//! The event loop: one thread, one UCX worker, a local executor.
//!
//! # Why an event loop on the worker's fd, with a short spin
//! UCX-NOTES measured `ucp_worker_arm` + `poll` on the worker's event fd
//! within ~5% of busy polling on shared memory, while a shared worker driven
//! by a separate progress thread was far slower on 2 cores. So each runtime
//! thread owns its worker and sleeps in `poll(2)` when idle. After activity it
//! keeps progressing for `spin` before arming, which removes the
//! wakeup latency from back-to-back requests without burning a core when
//! idle (`spin = 0` is a pure event loop; a large `spin` is busy polling).
//! The transport benchmark reports both settings. On a machine with few
//! cores and many dafne processes the spins take the cores the other
//! processes need, so there the default is no spin ([`default_spin`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use dafne_ucx::{AmPayload, AmVerdict, ConnRequest, Context, ContextOptions, Status, Worker};
use rustix::event::{PollFd, PollFlags};

use crate::client::ClientSide;
use crate::error::{Result, TransportError};
use crate::frame::{FrameHeader, FrameKind, AM_ID, FRAME_HEADER_LEN};
use crate::server::ServerSide;
use crate::stats::TransportStats;

/// How data endpoints are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// Error handling off when both ends are on one host (shared memory and
    /// cma become possible), peer error handling otherwise.
    Auto,
    /// Always error handling off (shared memory / cma / RDMA without UCX
    /// failure detection; liveness from the control endpoint).
    NoErrorHandling,
    /// Always UCX peer error handling.
    PeerErrorHandling,
}

impl DataPath {
    /// From `DAFNE_DATA_PATH` (`auto`, `peer`, `none`), else `Auto`. `peer`
    /// serves one host as if its processes were on different hosts (UCX
    /// over TCP, peer failure detection, registered memory allowed): what
    /// the tests of cross-host behaviour use.
    pub fn from_env() -> DataPath {
        match std::env::var("DAFNE_DATA_PATH").as_deref() {
            Ok("peer") => DataPath::PeerErrorHandling,
            Ok("none") => DataPath::NoErrorHandling,
            Ok("auto") | Err(_) => DataPath::Auto,
            Ok(other) => {
                tracing::warn!("DAFNE_DATA_PATH={other} is not auto, peer or none: using auto");
                DataPath::Auto
            }
        }
    }

    /// The error-handling mode of a data endpoint to a peer on `peer_host`
    /// (its boot id) from this host.
    pub(crate) fn mode_for(self, peer_host: &[u8; 16], our_host: &[u8; 16]) -> dafne_ucx::ErrMode {
        match self {
            DataPath::Auto if peer_host == our_host && *peer_host != [0; 16] => dafne_ucx::ErrMode::None,
            DataPath::Auto | DataPath::PeerErrorHandling => dafne_ucx::ErrMode::Peer,
            DataPath::NoErrorHandling => dafne_ucx::ErrMode::None,
        }
    }
}

/// Parses `KEY=VALUE` UCX overrides as given on command lines (the `UCX_`
/// prefix is optional), with an error that shows the expected form.
pub fn parse_ucx_overrides(v: &[String]) -> std::result::Result<Vec<(String, String)>, String> {
    v.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, val)) if !k.is_empty() => Ok((k.trim_start_matches("UCX_").to_string(), val.to_string())),
            _ => Err(format!("--ucx {kv}: expected KEY=VALUE, e.g. TLS=tcp")),
        })
        .collect()
}

/// Whether a `UCX_TLS` value (`None`: unset, every transport) can include
/// a shared-memory transport: unset, `all`, an exclusion list (`^...`), or
/// one of `posix`, `sysv`, `sm`, `shm`, `mm` named.
pub fn tls_has_shared_memory(tls: Option<&str>) -> bool {
    tls.is_none_or(|t| {
        let t = t.trim();
        t.is_empty()
            || t.starts_with('^')
            || t.split(',').any(|x| matches!(x.trim(), "all" | "posix" | "sysv" | "mm" | "sm" | "shm"))
    })
}

/// The UCX settings both ends of a shared-memory connection must agree on,
/// as `KEY=VALUE` lines, sorted: every `UCX_...` setting in `config` (which
/// wins) or the environment whose name ends in `FIFO_SIZE`,
/// `FIFO_ELEM_SIZE` or `SEG_SIZE`, TCP's excepted. Why: UCX's `posix`/`sysv`
/// transports size the peer's receive FIFO, its elements and its receive
/// buffers with their *own* settings (they travel nowhere), so two ends
/// that differ write where the other does not read: a FIFO larger than a
/// server's wedged its loop for good (`server` module docs). A server moves
/// a logged-in client to shared memory only when the client's hello states
/// the same geometry. Values are compared as written (`8256` and `8.06K`
/// differ): a false difference only keeps that client on TCP. Empty when
/// the transports cannot include shared memory (no FIFO default is added
/// then) and nothing sets these keys.
pub(crate) fn shm_geometry(config: &[(String, String)]) -> Vec<u8> {
    let wanted =
        |k: &str| ["FIFO_SIZE", "FIFO_ELEM_SIZE", "SEG_SIZE"].iter().any(|s| k.ends_with(s)) && !k.starts_with("TCP_");
    let mut m = std::collections::BTreeMap::new();
    for (k, v) in std::env::vars() {
        if let Some(k) = k.strip_prefix("UCX_").filter(|k| wanted(k)) {
            m.insert(k.to_string(), v);
        }
    }
    for (k, v) in config {
        let k = k.strip_prefix("UCX_").unwrap_or(k);
        if wanted(k) {
            m.insert(k.to_string(), v.clone());
        }
    }
    let mut out: Vec<u8> = m.into_iter().flat_map(|(k, v)| format!("{k}={v}\n").into_bytes()).collect();
    out.truncate(crate::frame::MAX_SHM_GEOMETRY);
    out
}

/// `config` with [`crate::SHM_FIFO`] added when neither it nor the
/// environment (`UCX_MM_FIFO_SIZE`) sets the FIFO size and its transports
/// (its `TLS`, else `UCX_TLS`) can include shared memory.
///
/// Why every runtime: UCX's shared-memory transport assumes both ends use
/// one FIFO size; a hand-started io server without the cluster's setting
/// wedged the metadata server's loop over shared memory (issue 13 review,
/// defect 2). With the default here, every dafne process agrees unless one
/// is told otherwise.
pub fn with_shm_fifo(config: Vec<(String, String)>) -> Vec<(String, String)> {
    let env_fifo = std::env::var_os(format!("UCX_{}", crate::SHM_FIFO.0)).is_some();
    fifo_default(config, env_fifo, std::env::var("UCX_TLS").ok())
}

/// [`with_shm_fifo`] given the environment: whether it sets the FIFO size,
/// and its `UCX_TLS`.
fn fifo_default(mut config: Vec<(String, String)>, env_fifo: bool, env_tls: Option<String>) -> Vec<(String, String)> {
    let (fifo, size) = crate::SHM_FIFO;
    let set = |k: &str| config.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    if set(fifo).is_some() || env_fifo {
        return config;
    }
    let tls = set("TLS").or(env_tls);
    if tls_has_shared_memory(tls.as_deref()) {
        config.push((fifo.to_string(), size.to_string()));
    }
    config
}

/// Settings of a runtime; every limit has a stated default.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    pub name: String,
    /// UCX overrides (`UCX_` keys without prefix), on top of the environment.
    /// [`Runtime::new`] adds the shared-memory FIFO size ([`with_shm_fifo`]).
    pub ucx_config: Vec<(String, String)>,
    /// Keep progressing this long after activity before sleeping (default
    /// [`default_spin`], or `DAFNE_SPIN_US` microseconds: see
    /// [`spin_from_env`]).
    pub spin: Duration,
    /// Largest request payload a server accepts / a client sends (1 MiB:
    /// requests carry segment lists and inline small writes, not bulk data).
    pub max_request: usize,
    /// Largest reply payload a client accepts (16 MiB).
    pub max_reply: usize,
    /// Requests a server lets each connection have in flight (64).
    pub credits: u32,
    /// Deadline of every call and every RMA batch (30 s).
    pub call_timeout: Duration,
    /// Connect deadline (10 s).
    pub connect_timeout: Duration,
    /// Keepalive period on control endpoints (1 s); a peer silent for
    /// `keepalive * keepalive_misses` is declared dead.
    pub keepalive: Duration,
    pub keepalive_misses: u32,
    pub data_path: DataPath,
    /// A server drops a connection whose service has not called
    /// `ConnHandle::authenticated` this long after its hello (None: never;
    /// services whose every request carries its own proof, or test
    /// services, leave it off).
    pub auth_timeout: Option<Duration>,
    /// Abort the process when the event loop has not come round for this
    /// long (a handler blocked it, or it died): a server that answers
    /// nothing but stays alive is worse than one its supervisor restarts.
    /// The loop comes round at least every housekeeping tick (≤ 250 ms)
    /// even when idle. None: no watchdog (clients, tests).
    pub watchdog: Option<Duration>,
    /// The host id this runtime states in its hellos and welcomes instead
    /// of its own (the machine's boot id): for tests of a hostile client
    /// that claims to be on another host, as any modified client can.
    /// Servers do not take the claim for RMA decisions
    /// (`ConnHandle::requires_direct_keys`). None: the real one.
    pub claim_host_id: Option<[u8; 16]>,
    /// Whether a server gives a client on this host shared memory before
    /// the client logged in (`ConnHandle::set_frame_keys`). Off by default:
    /// until the login a same-host connection's data endpoints run over
    /// TCP, and the server moves them to shared memory when the login is
    /// verified (`server` module docs, "Shared memory after the login"),
    /// because UCX's shared-memory transports trust the peer (a peer with
    /// another FIFO size wedged the server's loop for good). On for the
    /// reference test service, whose tests and benchmarks measure shared
    /// memory without logging in.
    pub shm_before_login: bool,
}

/// How long an event loop keeps progressing after activity on a machine
/// with cores to spare.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Fewer cores than this: loops sleep as soon as they are idle.
pub const SPIN_MIN_CORES: usize = 4;

/// The spin a loop gets by default: [`DEFAULT_SPIN`], or none on a
/// machine with fewer than [`SPIN_MIN_CORES`] cores. Why: a local cluster
/// runs a metadata server, four io servers, the FUSE daemon and the
/// application, each loop spinning after every request; on the 2-core VM,
/// `dafne bench posix` with `DAFNE_SPIN_US=0` beat 50 µs on every row, two
/// runs each in turns (means: random 4 KiB qd16 +45%, 4 jobs +30%,
/// PostMark +35%, sequential write +19%, sequential read +8%) at 16–52%
/// less CPU per GB (docs/BENCHMARKS.md, "Spinning against sleeping"): the spinning
/// loops took the cores the others needed. Machines with more cores were
/// not measured here and keep the spin.
pub fn default_spin() -> Duration {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if cores < SPIN_MIN_CORES {
        Duration::ZERO
    } else {
        DEFAULT_SPIN
    }
}

/// `DAFNE_SPIN_US` (microseconds, at most 10 000) if set and valid, else
/// [`default_spin`]: every dafne process's loops read it, so that spinning
/// can be measured against sleeping on a whole cluster and its mount
/// (`dafne bench posix`, issue 9) without a rebuild.
pub fn spin_from_env() -> Duration {
    match std::env::var("DAFNE_SPIN_US") {
        Err(_) => default_spin(),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(us) if us <= 10_000 => Duration::from_micros(us),
            _ => {
                let d = default_spin();
                tracing::warn!("DAFNE_SPIN_US={v:?} is not a number of microseconds up to 10000: using {d:?}");
                d
            }
        },
    }
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            name: "dafne".into(),
            ucx_config: Vec::new(),
            spin: spin_from_env(),
            max_request: 1 << 20,
            max_reply: 16 << 20,
            credits: 64,
            call_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            keepalive: Duration::from_secs(1),
            keepalive_misses: 5,
            data_path: DataPath::from_env(),
            auth_timeout: None,
            claim_host_id: None,
            shm_before_login: false,
            watchdog: None,
        }
    }
}

pub(crate) type Cmd = Box<dyn FnOnce(&Rc<Local>) + Send>;

/// State shared between the loop thread and handles on other threads.
pub(crate) struct Shared {
    pub(crate) ctx: Context,
    pub(crate) opts: RuntimeOptions,
    pub(crate) stats: TransportStats,
    cmd_tx: Sender<Cmd>,
    run_tx: Sender<async_task::Runnable>,
    wake_fd: OwnedFd,
    sleeping: AtomicBool,
    stopping: AtomicBool,
    pub(crate) host_id: [u8; 16],
    /// This runtime's `shm_geometry`, stated in hellos and compared with
    /// clients' by servers.
    pub(crate) shm_geometry: Vec<u8>,
    /// Bounds warnings caused by peers (bad frames, refused hellos): a
    /// hostile peer must not be able to flood the log.
    pub(crate) log_limit: LogLimit,
    /// Milliseconds since `born` when the loop last came round (watchdog).
    heartbeat: std::sync::atomic::AtomicU64,
    born: Instant,
    /// Set by `Runtime::disarm_watchdog` (a clean stop's long write-back).
    watchdog_off: AtomicBool,
    /// One lock per server address, so that this runtime's worker and that
    /// server's make their data endpoints to each other in the same order
    /// where it matters: UCX pairs the endpoints two workers make to each
    /// other by creation order, and a connect racing another connection's
    /// upgrade paired an endpoint with error handling against one without
    /// ("asymmetric endpoint configuration": the connect failed, seen in CI
    /// under load). A login (which may bring an `Upgrade`: a shared-memory
    /// endpoint without error handling on each side) holds it exclusively
    /// until its answer; connects hold it shared until their welcome
    /// (their endpoints all have error handling, so their order among
    /// themselves does not matter, and a connect that never gets a welcome
    /// delays no other connect).
    pub(crate) endpoint_order:
        std::sync::Mutex<std::collections::HashMap<std::net::SocketAddr, Arc<std::sync::RwLock<()>>>>,
}

impl Shared {
    /// The lock that orders endpoint creation with the server at `addr`
    /// (see `endpoint_order`).
    pub(crate) fn endpoint_order(&self, addr: std::net::SocketAddr) -> Arc<std::sync::RwLock<()>> {
        let mut m = self.endpoint_order.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(addr).or_default().clone()
    }
}

/// At most one warning per period for events a peer can cause at will;
/// the counters (`TransportStats`) keep the exact numbers.
pub(crate) struct LogLimit {
    last: std::sync::Mutex<Option<Instant>>,
}

impl LogLimit {
    const PERIOD: Duration = Duration::from_secs(10);

    pub(crate) fn new() -> LogLimit {
        LogLimit { last: std::sync::Mutex::new(None) }
    }

    /// Whether a warning may be written now.
    pub(crate) fn allow(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Self::PERIOD) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// What the receive path checks before it takes a frame's payload: the
/// live server connections and their tokens (mirrors `ServerSide::conns`,
/// which the AM callback cannot reach). A request for a connection that is
/// not here is refused before a byte of its payload is received, so an
/// unauthenticated peer cannot make the server allocate.
#[derive(Default)]
pub(crate) struct Gate {
    pub(crate) conns: RefCell<std::collections::HashMap<u32, u64>>,
    /// Tokens of this runtime's live client connections: a reply (or pong)
    /// must carry one, so a peer that is not our server cannot make us
    /// receive a reply-sized payload.
    pub(crate) client_tokens: RefCell<std::collections::HashSet<u64>>,
}

/// Largest hello or welcome payload: host id, a u32, the address length and
/// a worker address of at most `MAX_ADDRESS` bytes.
pub(crate) const HANDSHAKE_MAX_PAYLOAD: usize =
    16 + 4 + 4 + crate::frame::MAX_ADDRESS + 4 + crate::frame::MAX_SHM_GEOMETRY;

impl Gate {
    /// The largest payload a frame of this kind may bring, or `None` if the
    /// frame is refused outright (a request for an unknown connection).
    pub(crate) fn admit(&self, hdr: &FrameHeader, opts: &RuntimeOptions) -> Option<usize> {
        match hdr.kind {
            FrameKind::Hello | FrameKind::Welcome => Some(HANDSHAKE_MAX_PAYLOAD),
            FrameKind::Ping | FrameKind::Pong | FrameKind::Bye => Some(0),
            FrameKind::Request => {
                (self.conns.borrow().get(&hdr.conn_id) == Some(&hdr.token)).then_some(opts.max_request)
            }
            FrameKind::Reply => self.client_tokens.borrow().contains(&hdr.token).then_some(opts.max_reply),
            FrameKind::Upgrade => self.client_tokens.borrow().contains(&hdr.token).then_some(crate::frame::MAX_ADDRESS),
        }
    }
}

impl Shared {
    /// Runs `f` on the loop thread.
    pub(crate) fn submit(&self, f: impl FnOnce(&Rc<Local>) + Send + 'static) -> Result<()> {
        if self.stopping.load(SeqCst) {
            return Err(TransportError::Shutdown);
        }
        self.cmd_tx.send(Box::new(f)).map_err(|_| TransportError::Shutdown)?;
        self.wake();
        Ok(())
    }

    fn wake(&self) {
        if self.sleeping.swap(false, SeqCst) {
            let _ = rustix::io::write(&self.wake_fd, &1u64.to_ne_bytes());
        }
    }
}

/// One event-loop thread with its UCX worker. Dropping it stops the loop,
/// fails what is pending with [`TransportError::Shutdown`], and joins.
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("name", &self.shared.opts.name).finish()
    }
}

impl Runtime {
    pub fn new(opts: RuntimeOptions) -> Result<Runtime> {
        let config = with_shm_fifo(opts.ucx_config.clone());
        let geometry = shm_geometry(&config);
        let ctx = Context::new(&ContextOptions { name: opts.name.clone(), config })?;
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded::<Cmd>();
        let (run_tx, run_rx) = crossbeam_channel::unbounded::<async_task::Runnable>();
        let wake_fd =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
                .map_err(|e| TransportError::Ucx(format!("eventfd: {e}")))?;
        let shared = Arc::new(Shared {
            ctx,
            opts: opts.clone(),
            stats: TransportStats::default(),
            cmd_tx,
            run_tx,
            wake_fd,
            sleeping: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            host_id: opts.claim_host_id.unwrap_or_else(host_id),
            shm_geometry: geometry,
            log_limit: LogLimit::new(),
            heartbeat: std::sync::atomic::AtomicU64::new(0),
            born: Instant::now(),
            watchdog_off: AtomicBool::new(false),
            endpoint_order: Default::default(),
        });
        let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<()>>(1);
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-ucx", opts.name))
            .spawn(move || run_loop(sh, cmd_rx, run_rx, ready_tx))
            .map_err(|e| TransportError::Ucx(format!("spawning the event loop thread: {e}")))?;
        ready_rx.recv().map_err(|_| TransportError::Shutdown)??;
        if let Some(limit) = opts.watchdog {
            let sh = Arc::downgrade(&shared);
            let name = opts.name.clone();
            std::thread::Builder::new()
                .name(format!("{}-watchdog", opts.name))
                .spawn(move || watchdog(sh, limit, &name))
                .map_err(|e| TransportError::Ucx(format!("spawning the watchdog thread: {e}")))?;
        }
        Ok(Runtime { shared, thread: Some(thread) })
    }

    /// Turns the loop watchdog off for good: for a clean stop whose final
    /// write-back may hold the loop longer than the watchdog allows (its
    /// supervisor bounds it instead).
    pub fn disarm_watchdog(&self) {
        self.shared.watchdog_off.store(true, SeqCst);
    }

    /// The UCX context: register memory here ([`crate::Region`]).
    pub fn context(&self) -> &Context {
        &self.shared.ctx
    }

    pub fn stats(&self) -> &TransportStats {
        &self.shared.stats
    }

    /// This runtime's UCX worker address (what its hellos state).
    pub fn worker_address(&self) -> Result<Vec<u8>> {
        self.run_on_loop(|l| l.worker.address())?.map_err(Into::into)
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.shared.opts
    }

    /// Runs `f` on the loop thread and waits for its result.
    pub fn run_on_loop<T: Send + 'static>(&self, f: impl FnOnce(&Rc<Local>) -> T + Send + 'static) -> Result<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.shared.submit(move |l| {
            let _ = tx.send(f(l));
        })?;
        rx.recv().map_err(|_| TransportError::Shutdown)
    }

    /// Runs the future built by `f` as a task on the loop and waits for its
    /// output. For work that should stay on the loop thread end to end.
    pub fn block_on_loop<T: Send + 'static, F>(&self, f: impl FnOnce(Rc<Local>) -> F + Send + 'static) -> Result<T>
    where
        F: std::future::Future<Output = T> + 'static,
    {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.shared.submit(move |l| {
            let fut = f(l.clone());
            l.spawn(async move {
                let _ = tx.send(fut.await);
            });
        })?;
        rx.recv().map_err(|_| TransportError::Shutdown)
    }

    /// The worker's UCX description (transports and devices in use).
    pub fn worker_info(&self) -> Result<String> {
        self.run_on_loop(|l| l.worker.print_info())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shared.stopping.store(true, SeqCst);
        let _ = self.shared.cmd_tx.send(Box::new(|_| {}));
        self.shared.sleeping.store(true, SeqCst);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A frame that arrived, queued by the AM callback for the loop.
pub(crate) struct Inbound {
    pub(crate) hdr: FrameHeader,
    pub(crate) payload: Vec<u8>,
    pub(crate) reply_ep: Option<usize>,
}

/// What the loop thread owns. Reached from tasks through `Rc<Local>`.
pub struct Local {
    pub(crate) worker: Worker,
    pub(crate) shared: Arc<Shared>,
    pub(crate) inbound: Rc<RefCell<VecDeque<Inbound>>>,
    pub(crate) gate: Rc<Gate>,
    rndv: RndvList,
    pub(crate) accepts: Rc<RefCell<Vec<ConnRequest>>>,
    pub(crate) failed_eps: Rc<RefCell<Vec<(usize, Status)>>>,
    pub(crate) server: ServerSide,
    pub(crate) client: ClientSide,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local").finish_non_exhaustive()
    }
}

impl Local {
    /// Spawns a task on this loop.
    pub fn spawn(&self, fut: impl std::future::Future<Output = ()> + 'static) {
        let tx = self.shared.run_tx.clone();
        let sh = Arc::downgrade(&self.shared);
        let schedule = move |r: async_task::Runnable| match tx.send(r) {
            Ok(()) => {
                if let Some(sh) = sh.upgrade() {
                    sh.wake();
                }
            }
            // The loop is gone. The task is local to it and may not be
            // dropped on this (possibly foreign) thread: leak it.
            Err(e) => std::mem::forget(e.into_inner()),
        };
        let (runnable, task) = async_task::spawn_local(fut, schedule);
        task.detach();
        runnable.schedule();
    }

    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    pub fn context(&self) -> &Context {
        &self.shared.ctx
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.shared.opts
    }

    pub(crate) fn stats(&self) -> &TransportStats {
        &self.shared.stats
    }

    /// Hook for a control endpoint's peer-failure callback: queue its id.
    pub(crate) fn watch_failure(&self, ep: &dafne_ucx::Endpoint) {
        let q = self.failed_eps.clone();
        let id = ep.id();
        ep.on_error(move |st: Status| q.borrow_mut().push((id, st)));
    }

    fn dispatch(self: &Rc<Self>, m: Inbound) {
        match m.hdr.kind {
            FrameKind::Hello | FrameKind::Request | FrameKind::Ping | FrameKind::Bye => ServerSide::on_frame(self, m),
            FrameKind::Welcome | FrameKind::Reply | FrameKind::Pong | FrameKind::Upgrade => {
                ClientSide::on_frame(self, m)
            }
        }
    }

    fn housekeeping(self: &Rc<Self>, now: Instant) {
        ClientSide::housekeeping(self, now);
        ServerSide::housekeeping(self, now);
    }
}

fn install_am_handler(
    worker: &Worker,
    shared: &Arc<Shared>,
    inbound: &Rc<RefCell<VecDeque<Inbound>>>,
    gate: &Rc<Gate>,
) -> Result<RndvList> {
    let gate = gate.clone();
    let q = inbound.clone();
    let sh = shared.clone();
    let max_payload = shared.opts.max_request.max(shared.opts.max_reply);
    let pending_rndv: RndvList = Rc::new(RefCell::new(Vec::new()));
    let pr = pending_rndv.clone();
    worker.set_am_handler(AM_ID, move |m| {
        // Rendezvous receives that completed since the last message.
        finish_rndv(&pr, &q);
        let len = match &m.payload {
            AmPayload::Inline(d) => d.len(),
            AmPayload::Rendezvous(r) => r.len(),
        };
        let hdr = match FrameHeader::decode(m.header, len, max_payload) {
            Ok(h) => h,
            Err(e) => {
                TransportStats::inc(&sh.stats.malformed_frames);
                if sh.log_limit.allow() {
                    tracing::warn!(
                        "dropping a malformed frame ({} header bytes, {len} payload bytes): {e}",
                        m.header.len()
                    );
                }
                return AmVerdict::Reject(Status::REJECTED);
            }
        };
        // Checked before the payload is taken: a rendezvous payload is only
        // received (allocated) for a frame that may carry that much.
        match gate.admit(&hdr, &sh.opts) {
            Some(max) if len <= max => {}
            _ => {
                TransportStats::inc(&sh.stats.refused_before_receive);
                TransportStats::inc(&sh.stats.malformed_frames);
                if sh.log_limit.allow() {
                    tracing::warn!(
                        "refusing a {:?} frame of {len} bytes for connection {} (unknown connection, wrong token, \
                         or too large for its kind)",
                        hdr.kind,
                        hdr.conn_id
                    );
                }
                return AmVerdict::Reject(Status::REJECTED);
            }
        }
        match m.payload {
            AmPayload::Inline(d) => {
                q.borrow_mut().push_back(Inbound { hdr, payload: d.to_vec(), reply_ep: m.reply_ep });
                AmVerdict::Done
            }
            AmPayload::Rendezvous(r) => {
                TransportStats::inc(&sh.stats.rndv_payloads);
                match r.receive(Vec::new()) {
                    Ok(op) => {
                        pr.borrow_mut().push((hdr, m.reply_ep, op));
                        finish_rndv(&pr, &q);
                        AmVerdict::Done
                    }
                    Err(e) => {
                        tracing::warn!("rendezvous receive failed: {e}");
                        AmVerdict::Done
                    }
                }
            }
        }
    })?;
    const _: () = assert!(FRAME_HEADER_LEN.is_multiple_of(8));
    Ok(pending_rndv)
}

/// Rendezvous payloads being received: (header, reply endpoint, receive op).
type RndvList = Rc<RefCell<Vec<(FrameHeader, Option<usize>, dafne_ucx::Op)>>>;

fn finish_rndv(pr: &RndvList, q: &Rc<RefCell<VecDeque<Inbound>>>) {
    let Ok(mut list) = pr.try_borrow_mut() else {
        return;
    };
    let mut i = 0;
    while i < list.len() {
        match list[i].2.poll_done() {
            None => i += 1,
            Some(res) => {
                let (hdr, reply_ep, op) = list.swap_remove(i);
                if res.is_ok() {
                    if let Some(v) = op.take_kept().into_iter().find_map(|b| b.downcast::<Vec<u8>>().ok()) {
                        q.borrow_mut().push_back(Inbound { hdr, payload: *v, reply_ep });
                    }
                } else {
                    tracing::warn!("rendezvous payload lost: {:?}", res);
                }
            }
        }
    }
}

fn run_loop(
    shared: Arc<Shared>,
    cmd_rx: Receiver<Cmd>,
    run_rx: Receiver<async_task::Runnable>,
    ready: Sender<Result<()>>,
) {
    let setup = || -> Result<Rc<Local>> {
        let worker = Worker::new(&shared.ctx)?;
        let inbound = Rc::new(RefCell::new(VecDeque::new()));
        let gate = Rc::new(Gate::default());
        let rndv = install_am_handler(&worker, &shared, &inbound, &gate)?;
        Ok(Rc::new(Local {
            worker,
            rndv,
            shared: shared.clone(),
            inbound,
            gate,
            accepts: Rc::new(RefCell::new(Vec::new())),
            failed_eps: Rc::new(RefCell::new(Vec::new())),
            server: ServerSide::default(),
            client: ClientSide::default(),
        }))
    };
    let local = match setup() {
        Ok(l) => {
            let _ = ready.send(Ok(()));
            l
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let tick = (shared.opts.keepalive / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
    let mut next_housekeeping = Instant::now() + tick;
    let mut last_activity = Instant::now();
    loop {
        shared.heartbeat.store(shared.born.elapsed().as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut active = local.worker.progress() > 0;
        finish_rndv(&local.rndv, &local.inbound);
        for (id, st) in std::mem::take(&mut *local.failed_eps.borrow_mut()) {
            active = true;
            ServerSide::on_ep_failed(&local, id);
            ClientSide::on_ep_failed(&local, id, st);
        }
        let accepts = std::mem::take(&mut *local.accepts.borrow_mut());
        for req in accepts {
            active = true;
            ServerSide::accept(&local, req);
        }
        loop {
            let m = local.inbound.borrow_mut().pop_front();
            let Some(m) = m else { break };
            active = true;
            local.dispatch(m);
        }
        while let Ok(r) = run_rx.try_recv() {
            active = true;
            r.run();
        }
        while let Ok(c) = cmd_rx.try_recv() {
            active = true;
            c(&local);
        }
        let now = Instant::now();
        let next_timer = crate::timer::fire(now);
        if now >= next_housekeeping {
            local.housekeeping(now);
            next_housekeeping = now + tick;
        }
        if shared.stopping.load(SeqCst) {
            break;
        }
        if active {
            last_activity = now;
            continue;
        }
        if now.duration_since(last_activity) < shared.opts.spin {
            continue;
        }
        // Going to sleep: announce it, then re-check every source of work
        // (a producer that pushed before seeing `sleeping` will not write
        // the eventfd, so we must see its item here).
        shared.sleeping.store(true, SeqCst);
        if !cmd_rx.is_empty() || !run_rx.is_empty() || !local.inbound.borrow().is_empty() {
            shared.sleeping.store(false, SeqCst);
            continue;
        }
        match local.worker.arm() {
            Ok(true) => {}
            Ok(false) => {
                shared.sleeping.store(false, SeqCst);
                continue;
            }
            Err(e) => tracing::error!("ucp_worker_arm: {e}"),
        }
        let mut deadline = next_housekeeping;
        if let Some(t) = next_timer {
            deadline = deadline.min(t);
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        let ts = rustix::time::Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: wait.subsec_nanos() as i64 };
        let (efd, wfd) = (local.worker.event_fd(), shared.wake_fd.as_fd());
        let mut fds = [PollFd::new(&efd, PollFlags::IN), PollFd::new(&wfd, PollFlags::IN)];
        let _ = rustix::event::poll(&mut fds, Some(&ts));
        let woke_by_fd = fds[1].revents().contains(PollFlags::IN);
        shared.sleeping.store(false, SeqCst);
        if woke_by_fd {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&shared.wake_fd, &mut b);
        }
        last_activity = Instant::now();
    }
    // Shutdown: fail everything pending, then release UCX objects in order
    // (keys and endpoints before the worker: enforced by Rc ownership).
    ClientSide::shutdown(&local);
    ServerSide::shutdown(&local);
    while let Ok(r) = run_rx.try_recv() {
        r.run();
    }
    for _ in 0..1000 {
        if local.worker.progress() == 0 {
            break;
        }
    }
    drop(local);
}

/// This host's identity: the kernel boot id, so that two processes agree
/// they share a machine (and shared memory) exactly when they do.
/// Aborts the process if the loop of `shared` stops coming round for
/// `limit`; ends when the runtime is dropped.
fn watchdog(shared: std::sync::Weak<Shared>, limit: Duration, name: &str) {
    let every = (limit / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let mut last_check = Instant::now();
    // The loop is judged from when the watchdog starts, not from the
    // runtime's birth: starting UCX on a loaded machine may take longer
    // than `limit` and is not a stuck loop.
    let mut baseline = match shared.upgrade() {
        Some(sh) => sh.born.elapsed(),
        None => return,
    };
    loop {
        std::thread::sleep(every);
        let now = Instant::now();
        let overslept = now.duration_since(last_check) > every * 2 + Duration::from_millis(200);
        last_check = now;
        let Some(sh) = shared.upgrade() else { return };
        if overslept {
            // The watchdog itself did not run on time: the whole process was
            // stopped (SIGSTOP, a frozen cgroup, a debugger) or starved. The
            // loop gets a fresh `limit` from now rather than being blamed.
            baseline = sh.born.elapsed();
            continue;
        }
        if sh.stopping.load(SeqCst) || sh.watchdog_off.load(SeqCst) {
            return;
        }
        let beat = Duration::from_millis(sh.heartbeat.load(std::sync::atomic::Ordering::Relaxed)).max(baseline);
        let silent = sh.born.elapsed().saturating_sub(beat);
        if silent > limit {
            eprintln!(
                "dafne: the {name} event loop has not come round for {silent:?} (limit {limit:?}): \
                 aborting so that a supervisor restarts this server"
            );
            std::process::abort();
        }
    }
}

/// Makes a panic on any thread abort the process, after the usual message.
/// Servers call this first: a thread that unwound out of an event loop or
/// a store leaves a process that is alive but answers nothing (or answers
/// `EIO` for good), which no supervisor notices; an aborted one is
/// restarted with clean state.
pub fn fail_fast_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        eprintln!("dafne: a thread panicked: aborting so that a supervisor restarts this server");
        std::process::abort();
    }));
}

fn host_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = s.trim().bytes().filter(|b| b.is_ascii_hexdigit()).collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            id[i] = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("0"), 16).unwrap_or(0);
        }
    }
    id
}

/// 64 random bits (connection tokens, nonces).
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        let t = Instant::now().elapsed().as_nanos() as u64 ^ std::process::id() as u64;
        return t.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FIFO settings both ends must share, from the configuration
    /// (its `UCX_` prefix optional), sorted; TCP's segment size and other
    /// settings are not part of it.
    #[test]
    fn shm_geometry_takes_the_fifo_settings_only() {
        let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
        let g = shm_geometry(&[
            kv("TLS", "posix,sysv,cma,self,tcp"),
            kv("MM_FIFO_SIZE", "256"),
            kv("UCX_MM_SEG_SIZE", "8256"),
            kv("TCP_SEG_SIZE", "64k"),
            kv("MM_FIFO_ELEM_SIZE", "128"),
        ]);
        let g = String::from_utf8(g).unwrap();
        for want in ["MM_FIFO_SIZE=256\n", "MM_SEG_SIZE=8256\n", "MM_FIFO_ELEM_SIZE=128\n"] {
            assert!(g.contains(want), "{g:?} lacks {want:?}");
        }
        assert!(!g.contains("TCP_") && !g.contains("TLS"), "{g:?}");
        let other = String::from_utf8(shm_geometry(&[kv("MM_FIFO_SIZE", "1024")])).unwrap();
        assert_ne!(g, other);
    }

    #[test]
    fn every_runtime_that_may_use_shared_memory_asks_for_one_fifo_size() {
        let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
        let fifo = kv(crate::SHM_FIFO.0, crate::SHM_FIFO.1);
        assert_eq!(fifo_default(vec![], false, None), vec![fifo.clone()], "unset TLS: every transport");
        let shm = vec![kv("TLS", "posix,sysv,cma,self,tcp")];
        assert_eq!(fifo_default(shm.clone(), false, None), [shm.clone(), vec![fifo.clone()]].concat());
        assert_eq!(fifo_default(vec![], false, Some("sm,tcp".into())), vec![fifo.clone()]);
        assert_eq!(fifo_default(vec![kv("TLS", "^ib")], false, None), vec![kv("TLS", "^ib"), fifo.clone()]);
        // Given elsewhere, or no shared memory: untouched.
        let own = vec![kv("MM_FIFO_SIZE", "64")];
        assert_eq!(fifo_default(own.clone(), false, None), own);
        assert_eq!(fifo_default(vec![], true, None), vec![]);
        let tcp = vec![kv("TLS", "tcp,self")];
        assert_eq!(fifo_default(tcp.clone(), false, Some("posix".into())), tcp, "the config's TLS wins");
        assert_eq!(fifo_default(vec![], false, Some("tcp".into())), vec![]);
    }

    #[test]
    fn ucx_overrides_parse_and_refuse_nonsense() {
        let ok = parse_ucx_overrides(&["TLS=tcp".into(), "UCX_NET_DEVICES=lo".into()]).unwrap();
        assert_eq!(ok, vec![("TLS".into(), "tcp".into()), ("NET_DEVICES".into(), "lo".into())]);
        let e = parse_ucx_overrides(&["TLS".into()]).unwrap_err();
        assert!(e.contains("KEY=VALUE"), "{e}");
        assert!(parse_ucx_overrides(&["=x".into()]).is_err());
    }

    #[test]
    fn data_path_modes() {
        let (a, b) = ([1u8; 16], [2u8; 16]);
        assert_eq!(DataPath::Auto.mode_for(&a, &a), dafne_ucx::ErrMode::None);
        assert_eq!(DataPath::Auto.mode_for(&a, &b), dafne_ucx::ErrMode::Peer);
        assert_eq!(
            DataPath::Auto.mode_for(&[0; 16], &[0; 16]),
            dafne_ucx::ErrMode::Peer,
            "unknown host: assume remote"
        );
        assert_eq!(DataPath::NoErrorHandling.mode_for(&a, &b), dafne_ucx::ErrMode::None);
        assert_eq!(DataPath::PeerErrorHandling.mode_for(&a, &a), dafne_ucx::ErrMode::Peer);
    }
}
