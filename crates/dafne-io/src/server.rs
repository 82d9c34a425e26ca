//! Starting an io server: chunk store, serving mode (Unifier, or one of the
//! comparison modes), secret, runtime, service.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::{Rc, Weak};

use anyhow::{Context, Result};
use dafne_auth::Secret;
use dafne_transport::{Runtime, RuntimeOptions};

use dafne_unifier::{Unifier, UnifierConfig, UnifierStats};

use crate::chunk::{self, ChunkStore, StorageMode, StoragePath, StorageStats};
use crate::modes::{Direct, ModeStats};
use crate::service::{Backend, IoHandler, IoService};

/// The command-line arguments of an io server.
#[derive(Debug, Clone, clap::Args)]
pub struct IoArgs {
    /// Directory holding this server's chunk files.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7710")]
    pub listen: SocketAddr,
    /// The cluster secret file (written by the metadata server).
    #[arg(long)]
    pub secret: PathBuf,
    /// Cache size in MiB: the Unifier's registered cache (registered once at
    /// start), or in the `normal` and `mmap` modes the page cache the
    /// server counts on (see --mode and --strict-cache).
    #[arg(long, default_value_t = 64)]
    pub cache_mib: usize,
    /// UCX overrides as KEY=VALUE, repeatable.
    #[arg(long = "ucx", value_name = "KEY=VALUE")]
    pub ucx: Vec<String>,
    /// Storage path: auto (O_DIRECT via io_uring where the data directory's
    /// file system allows it, else buffered), direct (or refuse to start),
    /// buffered (pread/pwrite through the page cache).
    #[arg(long, value_enum, default_value_t = StorageMode::Auto)]
    pub storage: StorageMode,
}

/// How an io server serves reads and writes: the three methods of the
/// Unifier paper's micro-benchmarks (its section 6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum ServingMode {
    /// pread into a private buffer, copy into a pre-registered send buffer,
    /// put; writes: get into a pre-registered buffer, copy, pwrite. Two
    /// copies per byte; the page cache is the cache.
    Normal,
    /// Map the file range read-only, register it, put from it, deregister,
    /// unmap: no copy, a registration per request. Writes as `normal`
    /// (PVFS used mmap only for reads).
    Mmap,
    /// The Unifier: cache units are the registered buffers; put from and
    /// get into them. No copy, no registration on the cached path.
    #[default]
    Unifier,
}

impl ServingMode {
    pub const ALL: [ServingMode; 3] = [ServingMode::Normal, ServingMode::Mmap, ServingMode::Unifier];

    pub fn name(self) -> &'static str {
        match self {
            ServingMode::Normal => "normal",
            ServingMode::Mmap => "mmap",
            ServingMode::Unifier => "unifier",
        }
    }

    pub fn parse(s: &str) -> Option<ServingMode> {
        ServingMode::ALL.into_iter().find(|m| m.name() == s)
    }
}

impl std::fmt::Display for ServingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the server serves: mode and cache discipline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct ModeArgs {
    /// Serving mode: normal (copy through a registered pool), mmap (register
    /// a mapping per read) or unifier (the Unifier cache is the buffer pool).
    #[arg(long, value_enum, default_value_t = ServingMode::Unifier)]
    pub mode: ServingMode,
    /// Hold cached file data to about --cache-mib in every mode, as on a
    /// machine with that much memory for caching: `unifier` drops from the
    /// page cache what its storage reads and writes leave there
    /// (drop-behind: the Unifier is the only copy, as O_DIRECT would make
    /// it); `normal` and `mmap` keep an LRU of 64 KiB blocks holding
    /// --cache-mib less their registered pool and drop from the page cache
    /// what falls out of it (in 2 MiB chunks). Without it the page cache
    /// keeps what the kernel likes.
    #[arg(long)]
    pub strict_cache: bool,
    /// Busy-poll window of the server's event loop after activity, in µs
    /// (default: the transport's, `dafne_transport::default_spin`, or
    /// `DAFNE_SPIN_US`). 0 makes the loop sleep whenever it
    /// is idle, so that its CPU time is the work it did (benchmarks).
    #[arg(long, hide = true)]
    pub spin_us: Option<u64>,
    /// Share of the Unifier's cache, in percent, that is "raw" memory
    /// (the Unifier paper's raw buffers): registered slab by slab the first
    /// time the cache needs it rather than at start, so the memory
    /// registered (pinned by an RDMA NIC) grows with use up to the cache
    /// size. 0 (default): all registered at start.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub raw_percent: u8,
    /// Bound on the cache memory registered at once, MiB (default: none).
    /// With raw memory, cold clean raw slabs are deregistered ("parked",
    /// their data kept) to register others, so pinned memory stays under
    /// the bound while the whole cache holds data. At least the ready part
    /// plus two slabs.
    #[arg(long)]
    pub max_pinned_mib: Option<usize>,
    /// How long a Read or Write whose keys follow it (FRRWP) waits for
    /// them before it is answered `ETIMEDOUT`, in ms (default:
    /// `service::KEYS_DEADLINE`).
    #[arg(long, hide = true)]
    pub keys_deadline_ms: Option<u64>,
}

/// The command line of an io server process (`dafne serve io`, `dafne-io`):
/// [`IoArgs`] and the serving mode.
///
/// The mode lives beside `IoArgs` rather than in it so that code building
/// an `IoArgs` literal keeps compiling; [`start`] serves in the default
/// (`unifier`) mode and [`start_with`] in any.
#[derive(Debug, Clone, clap::Args)]
pub struct IoCommand {
    #[command(flatten)]
    pub args: IoArgs,
    #[command(flatten)]
    pub serving: ModeArgs,
    /// Answer each `stats` line on stdin with one [`Counters`] line on
    /// stdout, and exit when stdin closes (for benchmarks driving the
    /// server as a child process).
    #[arg(long, hide = true)]
    pub stats_on_stdin: bool,
    /// Serve this server's counters in the Prometheus text format at
    /// http://ADDR/metrics (port 0: any free port; the address is printed
    /// as `metrics on ADDR` before `listening on`). If ADDR cannot be
    /// taken, a free port of its host is (a warning says so), else none:
    /// the server serves either way. Off unless given;
    /// `dafne up` gives every server one. Use a loopback address unless
    /// the network is trusted: the page needs no login.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// The server's name in its metrics (the `server` label), e.g. `io-1`
    /// (`dafne up` passes the name it gives the server).
    #[arg(long, default_value = "io")]
    pub server_name: String,
    /// Joining the cluster through the metadata server (`--meta`,
    /// `--server-id`, `--host-name`, `--advertise`; [`crate::heartbeat`]).
    #[command(flatten)]
    pub join: crate::heartbeat::JoinArgs,
}

/// Everything an io server counts, as of the last request served.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IoStats {
    pub mode: ServingMode,
    /// The serving mode's counters (copies, registrations and the page-cache
    /// model in `normal`/`mmap`; zero in `unifier`).
    pub serving: ModeStats,
    /// The Unifier's counters (zero in `normal`/`mmap`).
    pub unifier: UnifierStats,
    /// The UCX counters of the server's context.
    pub ucx: dafne_ucx::StatsSnapshot,
    /// The chunk store's: which storage path, ops and bytes per path.
    pub storage: StorageStats,
    /// Requests, errors and bytes by op.
    pub ops: crate::service::OpStats,
    /// The lease from meta ([`crate::lease`]).
    pub lease: crate::service::LeaseStats,
}

impl IoStats {
    /// The Unifier's counters with the serving mode's merged in: the one
    /// view of hits, misses, evictions, bytes copied and registrations that
    /// holds for every mode.
    pub fn merged(&self) -> UnifierStats {
        let (u, m) = (&self.unifier, &self.serving);
        UnifierStats {
            hits: u.hits + m.hits,
            misses: u.misses + m.misses,
            evictions: u.evictions + m.evictions,
            bytes_copied: u.bytes_copied + m.bytes_copied,
            registrations: u.registrations + m.registrations,
            registration_ns: u.registration_ns + m.registration_ns,
            registered_bytes: u.registered_bytes + m.registered_bytes,
            startup_registrations: u.startup_registrations + m.startup_registrations,
            ..*u
        }
    }

    /// The counters a benchmark reads, plus the process's CPU time.
    pub fn counters(&self) -> Counters {
        let m = self.merged();
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        Counters {
            mode: self.mode,
            cpu_ns: cpu.tv_sec as u64 * 1_000_000_000 + cpu.tv_nsec as u64,
            bytes_copied: m.bytes_copied,
            registrations: m.registrations,
            registration_ns: m.registration_ns,
            deregistrations: self.serving.deregistrations,
            deregistration_ns: self.serving.deregistration_ns,
            hits: m.hits,
            misses: m.misses,
            read_ahead: m.read_ahead,
            evictions: m.evictions,
            fills: m.fills,
            writebacks: m.writebacks,
            pool_waits: self.serving.pool_waits,
            ucx_registrations: self.ucx.registrations,
            ucx_bytes_put: self.ucx.bytes_put,
            ucx_bytes_got: self.ucx.bytes_got,
            write_behind: m.write_behind,
            background_writebacks: m.background_writebacks,
            storage_direct: u64::from(self.storage.direct),
            storage_direct_ops: self.storage.direct_ops,
            storage_direct_bytes: self.storage.direct_bytes,
            storage_buffered_ops: self.storage.buffered_ops,
            storage_buffered_bytes: self.storage.buffered_bytes,
            checksum_errors: self.storage.checksum_errors,
        }
    }
}

macro_rules! counters {
    ($($f:ident),*) => {
        /// A flat summary of [`IoStats`] that travels as one text line
        /// (`stats mode=… cpu_ns=… …`) from a server process to a benchmark.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct Counters {
            pub mode: ServingMode,
            $(pub $f: u64,)*
        }

        impl Counters {
            pub fn to_line(&self) -> String {
                let mut s = format!("stats mode={}", self.mode);
                $(s.push_str(&format!(" {}={}", stringify!($f), self.$f));)*
                s
            }

            /// Parses [`Counters::to_line`]'s output (unknown keys ignored).
            pub fn parse_line(line: &str) -> Option<Counters> {
                let mut c = Counters::default();
                let mut words = line.split_whitespace();
                if words.next()? != "stats" {
                    return None;
                }
                for w in words {
                    let (k, v) = w.split_once('=')?;
                    match k {
                        "mode" => c.mode = ServingMode::parse(v)?,
                        $(stringify!($f) => c.$f = v.parse().ok()?,)*
                        _ => {}
                    }
                }
                Some(c)
            }

            /// Counter-wise `self - earlier` (saturating); `mode` is kept.
            pub fn since(&self, earlier: &Counters) -> Counters {
                Counters { mode: self.mode, $($f: self.$f.saturating_sub(earlier.$f),)* }
            }
        }
    };
}

counters!(
    cpu_ns,
    bytes_copied,
    registrations,
    registration_ns,
    deregistrations,
    deregistration_ns,
    hits,
    misses,
    read_ahead,
    evictions,
    fills,
    writebacks,
    pool_waits,
    ucx_registrations,
    ucx_bytes_put,
    ucx_bytes_got,
    write_behind,
    background_writebacks,
    storage_direct,
    storage_direct_ops,
    storage_direct_bytes,
    storage_buffered_ops,
    storage_buffered_bytes,
    checksum_errors
);

thread_local! {
    /// The io service served by this thread's runtime (a runtime serves one
    /// listener), so that its counters can be read on its loop thread when
    /// asked rather than published after every request.
    static SERVICE: RefCell<Option<Weak<IoService>>> = const { RefCell::new(None) };
}

/// A running io server; dropping it stops the server.
#[derive(Debug)]
pub struct IoServer {
    pub addr: SocketAddr,
    mode: ServingMode,
    rt: Runtime,
}

impl IoServer {
    /// Hits, misses, evictions, bytes copied and registrations so far: the
    /// Unifier's counters, with the serving mode's merged in
    /// ([`IoStats::merged`]) so that they mean the same in every mode.
    pub fn unifier_stats(&self) -> UnifierStats {
        self.stats().merged()
    }

    /// Every counter: serving mode, Unifier, UCX. Read on the server's loop
    /// thread (one round trip to it), so every request answered before the
    /// call is counted.
    pub fn stats(&self) -> IoStats {
        let s = self
            .rt
            .run_on_loop(|_| SERVICE.with(|s| s.borrow().as_ref().and_then(Weak::upgrade).map(|svc| svc.stats())))
            .ok()
            .flatten()
            .unwrap_or_default();
        IoStats {
            mode: self.mode,
            serving: s.mode,
            unifier: s.unifier,
            ucx: self.ucx_stats(),
            storage: s.storage,
            ops: s.ops,
            lease: s.lease,
        }
    }

    /// This server's metrics page (`crate::metrics`), every counter read
    /// on the loop thread at once; an error when the server is stopping.
    pub fn metrics_page(&self, server: &str) -> Result<String, String> {
        let (s, capacity) = self
            .rt
            .run_on_loop(|_| {
                SERVICE.with(|s| s.borrow().as_ref().and_then(Weak::upgrade).map(|svc| (svc.stats(), svc.capacity())))
            })
            .map_err(|e| format!("the server is stopping ({e})"))?
            .ok_or("the io service is not running")?;
        let stats = IoStats {
            mode: self.mode,
            serving: s.mode,
            unifier: s.unifier,
            ucx: self.ucx_stats(),
            storage: s.storage,
            ops: s.ops,
            lease: s.lease,
        };
        Ok(crate::metrics::render(server, &stats, &capacity.1, &self.rt.stats().snapshot()))
    }

    /// A clean stop's first half: refuse new requests (EAGAIN), then, until
    /// nothing is being served and nothing is dirty, wait for the requests
    /// being served and write back and sync everything. After `Ok`,
    /// everything this server acknowledged is on disk; an error says what
    /// could not be written (the process should exit non-zero).
    pub fn drain_and_flush(&self) -> Result<()> {
        // The final write-back may hold the loop for long; the supervisor
        // bounds a clean stop (120 s) instead of the watchdog.
        self.rt.disarm_watchdog();
        self.rt.run_on_loop(|_| {
            if let Some(svc) = SERVICE.with(|s| s.borrow().as_ref().and_then(Weak::upgrade)) {
                svc.drain();
            }
        })?;
        let deadline = std::time::Instant::now() + DRAIN_DEADLINE;
        loop {
            // Requests admitted before the drain may still acknowledge
            // writes: wait for them before each round.
            while self.rt.stats().snapshot().requests_in_flight > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let round = self.flush_all();
            let in_flight = self.rt.stats().snapshot().requests_in_flight;
            let dirty = self
                .rt
                .run_on_loop(|_| {
                    SERVICE.with(|s| s.borrow().as_ref().and_then(Weak::upgrade).map(|svc| svc.dirty_bytes()))
                })?
                .unwrap_or(0);
            match round {
                Ok(()) if in_flight == 0 && dirty == 0 => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(e) => tracing::warn!("stopping: {e:#}; trying again"),
                Ok(()) if std::time::Instant::now() >= deadline => {
                    anyhow::bail!(
                        "stopping: {dirty} bytes still dirty and {in_flight} requests in flight after {}s",
                        DRAIN_DEADLINE.as_secs()
                    )
                }
                Ok(()) => {}
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Writes back every dirty cache unit and syncs every object: after
    /// it, everything acknowledged is on disk.
    pub fn flush_all(&self) -> Result<()> {
        self.rt
            .block_on_loop(|_| async {
                match SERVICE.with(|s| s.borrow().as_ref().and_then(Weak::upgrade)) {
                    Some(svc) => svc.flush_all().await,
                    None => Ok(()),
                }
            })?
            .map_err(|e| anyhow::anyhow!("writing back the cache: {e}"))
    }

    /// The UCX counters of the server (RMA bytes, registrations).
    pub fn ucx_stats(&self) -> dafne_ucx::StatsSnapshot {
        self.rt.context().stats().snapshot()
    }

    pub fn mode(&self) -> ServingMode {
        self.mode
    }
}

/// How long a clean stop keeps trying to write everything back (below the
/// supervisor's grace for io servers, 120 s).
pub const DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(100);

/// Starts an io server in the default (`unifier`) mode.
pub fn start(a: &IoArgs) -> Result<IoServer> {
    start_with(a, ModeArgs::default())
}

/// Starts an io server in the given mode.
pub fn start_with(a: &IoArgs, m: ModeArgs) -> Result<IoServer> {
    start_leased(a, m, None)
}

/// Starts an io server in the given mode that serves data only while
/// `lease` holds, if given ([`crate::lease`]; a server that joined meta).
pub fn start_leased(a: &IoArgs, m: ModeArgs, lease: Option<std::sync::Arc<crate::lease::Lease>>) -> Result<IoServer> {
    let secret =
        Secret::load(&a.secret).context("the io server needs the cluster secret the metadata server created")?;
    ChunkStore::open(&a.data_dir).with_context(|| format!("opening {}", a.data_dir.display()))?;
    // The storage path, decided once for the data directory; the ring moves
    // to the loop thread, which is the only one to use it.
    // `normal` and `mmap` cache in the page cache (that is what they
    // compare against), so they never bypass it.
    let path = match (m.mode, a.storage) {
        (ServingMode::Unifier, _) | (_, StorageMode::Buffered) => {
            chunk::decide(a.storage, &ChunkStore::objects_dir(&a.data_dir), chunk::probe_direct)?
        }
        (mode, StorageMode::Direct) => anyhow::bail!("--storage direct needs --mode unifier, not {mode}"),
        (_, StorageMode::Auto) => StoragePath::Buffered(chunk::DirectRefused::PageCacheMode),
    };
    let line = path.describe(&a.data_dir);
    let ring = match path {
        StoragePath::Direct(ring) => {
            tracing::info!(target: "dafne_io::storage", "{line}");
            Some(*ring)
        }
        StoragePath::Buffered(chunk::DirectRefused::NotAsked | chunk::DirectRefused::PageCacheMode) => {
            tracing::info!(target: "dafne_io::storage", "{line}");
            None
        }
        StoragePath::Buffered(_) => {
            tracing::warn!(target: "dafne_io::storage", "{line}");
            None
        }
    };
    let ucx = dafne_transport::parse_ucx_overrides(&a.ucx).map_err(anyhow::Error::msg)?;
    // A loop that has not come round for a minute is stuck (a storage call
    // that never returns): abort, and the supervisor restarts the server.
    let mut opts = RuntimeOptions {
        name: "io".into(),
        ucx_config: ucx,
        watchdog: Some(std::time::Duration::from_secs(60)),
        auth_timeout: Some(crate::service::LOGIN_DEADLINE),
        ..Default::default()
    };
    if let Some(us) = m.spin_us {
        opts.spin = std::time::Duration::from_micros(us);
    }
    let rt = Runtime::new(opts)?;
    // Slabs of up to 8 MiB (the largest power of two ≤ 8 that divides
    // `cache_mib`, so the cache is exactly `cache_mib`), one registration
    // each, made here. Each is one SysV segment on one host (4096 per
    // machine): 8 MiB slabs allow 32 GiB of cache per machine, and a slab
    // is still small enough to move between unit sizes cheaply.
    // Write-behind may hold a quarter of the cache dirty.
    // With raw memory, at least 8 slabs, so that the share and the pinned
    // bound have slabs to count in.
    let cache_mib = a.cache_mib.max(1);
    let min_slabs = if m.raw_percent > 0 { 8 } else { 1 };
    let slab_mib =
        [8, 4, 2, 1].into_iter().find(|s| cache_mib.is_multiple_of(*s) && cache_mib / s >= min_slabs).unwrap_or(1);
    let cache = cache_mib << 20;
    let slabs = cache_mib / slab_mib;
    let raw_slabs = slabs * usize::from(m.raw_percent) / 100;
    let config = UnifierConfig {
        ready_slabs: slabs - raw_slabs,
        raw_slabs,
        max_pinned_bytes: m.max_pinned_mib.map(|p| (p as u64) << 20),
        slab_size: slab_mib << 20,
        max_dirty_bytes: cache / 4,
        ..Default::default()
    };
    config.validate().map_err(|e| {
        anyhow::anyhow!(
            "--cache-mib {} --raw-percent {} --max-pinned-mib {:?} ({} slabs of {slab_mib} MiB): {e}",
            a.cache_mib,
            m.raw_percent,
            m.max_pinned_mib,
            slabs
        )
    })?;
    let dir = a.data_dir.clone();
    let addr = rt.serve(a.listen, move |l| {
        let store = Rc::new(ChunkStore::open_with(&dir, ring).expect("chunk store opened above"));
        let backend = match m.mode {
            ServingMode::Unifier => {
                store.set_drop_behind(m.strict_cache);
                Backend::Unifier(
                    Unifier::new(l.context(), config, store.clone()).expect("registering the Unifier's slabs"),
                )
            }
            mode => Backend::Direct(Box::new(
                Direct::new(mode, l.context(), store.clone(), cache as u64, m.strict_cache)
                    .expect("registering the pool of send buffers"),
            )),
        };
        let mut service = IoService::new(secret, backend, store);
        if let Some(lease) = lease.clone() {
            service.set_lease(lease);
            service.set_forwarder(l.clone());
        }
        if let Some(ms) = m.keys_deadline_ms {
            service.set_keys_deadline(std::time::Duration::from_millis(ms));
        }
        let service = Rc::new(service);
        SERVICE.with(|s| *s.borrow_mut() = Some(Rc::downgrade(&service)));
        IoHandler(service)
    })?;
    Ok(IoServer { addr, mode: m.mode, rt })
}

/// How long a server that joins meta waits for its first lease before it
/// prints `listening on` (it serves data only under a lease). Milliseconds
/// when meta is up; 10 s so that a loaded machine's slow first answer
/// still leaves `dafne up` returning with servers that serve (2 s was
/// within reach of CI's load: a review found two tests that would then
/// see a refusal), while a meta not up yet delays the start by no more.
const FIRST_LEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts an io server, prints `listening on ADDR`, serves until killed
/// (or, with `--stats-on-stdin`, until stdin closes).
pub fn serve_forever(c: &IoCommand) -> Result<()> {
    use std::io::{BufRead as _, Write as _};
    dafne_transport::fail_fast_on_panic();
    // The join options are checked before the port is taken.
    let join = crate::heartbeat::prepare(&c.join, c.args.listen, &c.args.secret)?;
    let ucx = dafne_transport::parse_ucx_overrides(&c.args.ucx).map_err(anyhow::Error::msg)?;
    // A server that joins meta serves data only under a lease from it.
    let lease = join.as_ref().map(|j| j.lease());
    let s = std::sync::Arc::new(start_leased(&c.args, c.serving, lease.clone())?);
    // Dropped before the server (it holds a reference for its page).
    // A port it cannot take (a restart whose port something took
    // meanwhile) costs the metrics, never the server: another port, or
    // none (`start_or_elsewhere` logs which).
    let metrics = c.metrics_listen.and_then(|addr| {
        let (server, name) = (s.clone(), c.server_name.clone());
        dafne_metrics::MetricsServer::start_or_elsewhere(addr, move || server.metrics_page(&name))
    });
    if let Some(m) = &metrics {
        println!("metrics on {}", m.addr());
    }
    // After the server listens, so meta never counts up a server that
    // does not serve; kept until the process ends (its drop stops it).
    let _heartbeats = join.map(|j| j.start(s.addr, &c.args.data_dir, ucx)).transpose()?;
    // The first heartbeat is answered within milliseconds when meta is up:
    // waited for (briefly), so that a server announced as listening
    // serves. A meta not up yet costs at most this wait; the server then
    // serves once meta answers.
    if let Some(l) = &lease {
        let deadline = std::time::Instant::now() + FIRST_LEASE_WAIT;
        while !l.held() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        if !l.held() {
            tracing::info!("no lease from meta yet: data requests are refused until meta answers a heartbeat");
        }
    }
    println!("listening on {}", s.addr);
    std::io::stdout().flush()?;
    if c.stats_on_stdin {
        for line in std::io::stdin().lock().lines() {
            if line?.trim() == "stats" {
                println!("{}", s.stats().counters().to_line());
                std::io::stdout().flush()?;
            }
        }
        let r = s.drain_and_flush();
        drop(metrics);
        return r;
    }
    let stop = stop_on_signals()?;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::park_timeout(std::time::Duration::from_millis(100));
    }
    // A clean stop: what the cache holds dirty reaches the disk first,
    // and nothing is acknowledged after that.
    tracing::info!("stopping: writing back the cache");
    let r = s.drain_and_flush();
    drop(metrics);
    r
}

/// A flag raised by SIGTERM or SIGINT (a supervisor's `down`, or ^C).
pub fn stop_on_signals() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing the stop signal handlers")?;
    }
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_travel_as_a_line() {
        let c = Counters { mode: ServingMode::Mmap, cpu_ns: 7, hits: 3, ucx_bytes_got: u64::MAX, ..Default::default() };
        let line = c.to_line();
        assert!(line.starts_with("stats mode=mmap cpu_ns=7 "), "{line}");
        assert_eq!(Counters::parse_line(&line), Some(c));
        assert_eq!(Counters::parse_line(&format!("{line} future=1")), Some(c));
        assert_eq!(Counters::parse_line("listening on x"), None);
        assert_eq!(Counters::parse_line("stats mode=fast"), None);
        assert_eq!(c.since(&Counters { hits: 1, ..c }).hits, 2);
    }
}
