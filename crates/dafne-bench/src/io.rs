//! The io benchmark: the Unifier paper's micro-benchmarks (its section 6.2)
//! on dafne's io server, in each serving mode (`normal`, `mmap`, `unifier`;
//! see `dafne_io::modes`).
//!
//! Every server is a process (`dafne serve meta`, `dafne serve io --mode …`)
//! of the current executable; this process is the client. The client side
//! is zero-copy: UCX-allocated regions, `DataClient::read_region` /
//! `write_region`, `window` requests in flight driven on the client
//! runtime's loop thread. Servers report their counters (and their CPU
//! time) on request over stdin/stdout (`--stats-on-stdin`).
//!
//! 1. **Cached bandwidth** vs access size: one io server, one file that fits
//!    its cache, written and read once before measuring.
//! 2. **Re-read**: a file of S bytes is written and synced, the io server
//!    restarted on it (its caches empty, as the paper's server found the
//!    file on disk) and the file dropped from the page cache; then it is
//!    read sequentially twice through a cache of C (`--strict-cache`, so
//!    every mode holds C: the Unifier its units, `normal`/`mmap` the page
//!    cache less their registered pool). The second pass is reported with
//!    its hits and misses.
//! 3. **Aggregate bandwidth**: 1 MiB reads and writes with N io servers ×
//!    M clients (each client its own runtime and thread, its own file
//!    striped over all servers).
//! 4. **CPU per MiB**: client (this process) and server CPU time per MiB
//!    moved, cached reads and writes of 128 KiB and 1 MiB, measured with
//!    both event loops set not to spin (`spin = 0`): a loop then sleeps
//!    whenever it has nothing to do, so its CPU time is its work. (With a
//!    50 µs spin, the default on 4 cores or more, a loop under steady load never sleeps, and CPU
//!    time per MiB is only the inverse of the bandwidth; table 1's rows
//!    carry those figures too, in the JSON.)

use std::future::Future;
use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use dafne_client::data::DataClient;
use dafne_client::{Errno, MetaSession, OpenFile, ROOT_INO};
use dafne_io::server::{Counters, ServingMode};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;
use dafne_transport::{Access, Region, Runtime, RuntimeOptions};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::transport::{human, machine, ucx_version};

const MIB: usize = 1 << 20;
/// The UCX transports of every process (client and servers).
pub const UCX_TLS: &str = "posix,sysv,cma,self,tcp";

pub(crate) fn ucx() -> Vec<(String, String)> {
    let (k, v) = dafne_transport::SHM_FIFO;
    vec![("TLS".into(), UCX_TLS.into()), ("NET_DEVICES".into(), "lo".into()), (k.into(), v.into())]
}

#[derive(Debug, Clone)]
pub struct Options {
    pub modes: Vec<ServingMode>,
    /// Access sizes of the cached-bandwidth table.
    pub sizes: Vec<usize>,
    /// Requests in flight per client.
    pub window: usize,
    /// Time per cached-bandwidth cell.
    pub duration: Duration,
    /// The cached-bandwidth file.
    pub file_size: usize,
    /// Cache of the io servers of tables 1 and 3 (MiB).
    pub cache_mib: usize,
    /// The re-read test: cache C (MiB), file sizes S = ratio × C, access size.
    pub reread_cache_mib: usize,
    pub reread_ratios: Vec<f64>,
    pub reread_size: usize,
    /// The aggregate table: io server and client counts, the servers'
    /// cache (MiB), time per cell, file per client.
    pub servers: Vec<usize>,
    pub scaling_cache_mib: usize,
    pub clients: Vec<usize>,
    pub scaling_duration: Duration,
    pub scaling_file: usize,
    /// The `dafne` executable (servers run as `PROGRAM serve meta|io`).
    pub program: PathBuf,
    /// Where servers keep their data (a fresh directory per run inside).
    pub scratch: PathBuf,
    /// The io servers' `--storage` (O_DIRECT via io_uring, or buffered).
    pub storage: dafne_io::chunk::StorageMode,
    /// Which tables to measure (`dafne bench seeds` runs them one by one).
    pub tables: Tables,
}

/// The tables of [`run`]; a table left out comes back empty.
#[derive(Debug, Clone, Copy)]
pub struct Tables {
    /// Table 1, cached bandwidth vs access size.
    pub cached: bool,
    /// Table 4, CPU per MiB (loops not spinning).
    pub cpu: bool,
    /// Table 2, the re-read test.
    pub reread: bool,
    /// Table 3, aggregate bandwidth over io servers × clients.
    pub scaling: bool,
}

impl Tables {
    pub const ALL: Tables = Tables { cached: true, cpu: true, reread: true, scaling: true };
    pub const NONE: Tables = Tables { cached: false, cpu: false, reread: false, scaling: false };
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CachedRow {
    pub mode: &'static str,
    pub op: &'static str,
    pub size: usize,
    pub window: usize,
    /// Busy-poll window of both event loops (µs).
    pub spin_us: u64,
    pub requests: u64,
    pub mib_per_s: f64,
    /// CPU time of this process (the client) per MiB moved.
    pub client_cpu_us_per_mib: f64,
    /// CPU time of the io server process per MiB moved.
    pub server_cpu_us_per_mib: f64,
    /// Bytes the server copied per byte moved.
    pub copies_per_byte: f64,
    /// Registrations the server made per request, and their cost
    /// (registration + deregistration, including mmap/munmap) per request.
    pub registrations_per_request: f64,
    pub registration_us_per_request: f64,
    pub hits: u64,
    pub misses: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RereadRow {
    pub mode: &'static str,
    pub cache_mib: usize,
    pub file_size: usize,
    /// S / C.
    pub ratio: f64,
    pub access_size: usize,
    pub first_mib_per_s: f64,
    /// The re-read (second pass), as the paper reports.
    pub second_mib_per_s: f64,
    /// Counters of the second pass. `hits` are uses of cached data
    /// (reuse); `read_ahead` units were brought in ahead of a sequential
    /// reader during this pass (the Unifier counts their use as a hit; it is
    /// taken out of `hits` here, so the hit rate measures reuse, as the
    /// paper's does).
    pub hits: u64,
    pub misses: u64,
    pub read_ahead: u64,
    pub evictions: u64,
    pub hit_rate: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleRow {
    pub mode: &'static str,
    pub servers: usize,
    pub clients: usize,
    pub read_mib_per_s: f64,
    pub write_mib_per_s: f64,
    pub read_client_cpu_us_per_mib: f64,
    pub read_server_cpu_us_per_mib: f64,
    pub write_client_cpu_us_per_mib: f64,
    pub write_server_cpu_us_per_mib: f64,
    /// Dirty units the Unifier wrote back during the write cell (bounded
    /// write-behind), over all servers.
    pub write_writebacks: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub machine: String,
    pub ucx_version: String,
    pub ucx_tls: &'static str,
    /// The unifier mode's storage path (`--storage`); normal and mmap
    /// always use the page cache.
    pub storage: &'static str,
    pub window: usize,
    pub file_size: usize,
    pub cache_mib: usize,
    pub seconds_per_cell: f64,
    pub cached: Vec<CachedRow>,
    /// Table 4: the cached runs at 128 KiB and 1 MiB again, loops not spinning.
    pub cpu: Vec<CachedRow>,
    pub reread: Vec<RereadRow>,
    pub scaling: Vec<ScaleRow>,
    /// unifier / normal cached bandwidth at 128 KiB (the issue's target: ≥ 1.5).
    pub unifier_over_normal_128k_read: Option<f64>,
    pub unifier_over_normal_128k_write: Option<f64>,
}

/// A child process, killed on drop.
pub(crate) struct Proc(pub(crate) Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An io server process that answers `stats`.
pub(crate) struct IoProc {
    pub(crate) addr: SocketAddr,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    proc: Proc,
}

impl IoProc {
    pub(crate) fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    pub(crate) fn counters(&mut self) -> Result<Counters> {
        writeln!(self.stdin, "stats")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        Counters::parse_line(&line).ok_or_else(|| anyhow!("io server answered {line:?} to `stats`"))
    }
}

fn banner(out: &mut BufReader<ChildStdout>, what: &str) -> Result<SocketAddr> {
    let mut line = String::new();
    out.read_line(&mut line)?;
    let addr = line.trim().strip_prefix("listening on ").ok_or_else(|| anyhow!("{what} did not start: {line:?}"))?;
    Ok(addr.parse()?)
}

fn ucx_args(c: &mut Command) {
    for (k, v) in ucx() {
        c.arg("--ucx").arg(format!("{k}={v}"));
    }
}

fn start_meta(program: &Path, dir: &Path, io_servers: usize) -> Result<(Proc, SocketAddr)> {
    let mut c = Command::new(program);
    c.args(["serve", "meta", "--data-dir", &dir.display().to_string(), "--listen", "127.0.0.1:0"]);
    c.args(["--io-servers", &io_servers.to_string(), "--stripe-count", &io_servers.to_string()]);
    ucx_args(&mut c);
    let mut child = c.stdout(Stdio::piped()).spawn().context("starting the metadata server")?;
    let mut out = BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?);
    let p = Proc(child);
    Ok((p, banner(&mut out, "the metadata server")?))
}

/// How io servers are started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerCfg {
    pub(crate) mode: ServingMode,
    pub(crate) cache_mib: usize,
    pub(crate) strict: bool,
    /// Busy-poll window of the server's loop (µs); `None`: the default.
    pub(crate) spin_us: Option<u64>,
    pub(crate) storage: dafne_io::chunk::StorageMode,
}

fn start_io(program: &Path, dir: &Path, secret: &Path, cfg: ServerCfg) -> Result<IoProc> {
    let mut c = Command::new(program);
    // The storage path is in the report; the servers' own line about it
    // would repeat for every cell of every table.
    if std::env::var_os("DAFNE_LOG").is_none() {
        c.env("DAFNE_LOG", "warn");
    }
    c.args(["serve", "io", "--data-dir", &dir.display().to_string(), "--listen", "127.0.0.1:0"]);
    c.args(["--secret", &secret.display().to_string(), "--cache-mib", &cfg.cache_mib.to_string()]);
    c.args(["--mode", cfg.mode.name(), "--stats-on-stdin"]);
    if cfg.mode == ServingMode::Unifier {
        // normal and mmap always serve through the page cache.
        c.args(["--storage", cfg.storage.name()]);
    }
    if cfg.strict {
        c.arg("--strict-cache");
    }
    if let Some(us) = cfg.spin_us {
        c.args(["--spin-us", &us.to_string()]);
    }
    ucx_args(&mut c);
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().context("starting an io server")?;
    let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
    let mut out = BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?);
    let p = Proc(child);
    let addr = banner(&mut out, "the io server")?;
    Ok(IoProc { addr, stdin, out, proc: p })
}

/// A metadata server and `n` io servers in one mode, in a fresh directory.
pub(crate) struct Cluster {
    pub(crate) ios: Vec<IoProc>,
    meta: Option<Proc>,
    pub(crate) meta_addr: SocketAddr,
    pub(crate) secret: PathBuf,
    dir: PathBuf,
    cfg: ServerCfg,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.ios.clear();
        self.meta.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A metadata server and `n` io servers of `program`, in a fresh directory
/// `dafne-io-bench-<pid>-<tag>` of `scratch` (removed on drop).
pub(crate) fn cluster_of(program: &Path, scratch: &Path, tag: &str, n: usize, cfg: ServerCfg) -> Result<Cluster> {
    let dir = scratch.join(format!("dafne-io-bench-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (meta, meta_addr) = start_meta(program, &dir.join("meta"), n)?;
    let secret = dir.join("meta").join("cluster.secret");
    let mut c = Cluster { ios: Vec::new(), meta: Some(meta), meta_addr, secret, dir, cfg };
    for i in 0..n {
        let io = start_io(program, &c.dir.join(format!("io{i}")), &c.secret, cfg)?;
        c.ios.push(io);
    }
    Ok(c)
}

fn cluster(o: &Options, tag: &str, n: usize, cfg: ServerCfg) -> Result<Cluster> {
    cluster_of(&o.program, &o.scratch, tag, n, cfg)
}

impl Cluster {
    pub(crate) fn counters(&mut self) -> Result<Vec<Counters>> {
        self.ios.iter_mut().map(|i| i.counters()).collect()
    }

    /// Stops io server `i` and starts it again on its data.
    fn restart_io(&mut self, o: &Options, i: usize) -> Result<()> {
        drop(self.ios.remove(i));
        let io = start_io(&o.program, &self.dir.join(format!("io{i}")), &self.secret, self.cfg)?;
        self.ios.insert(i, io);
        Ok(())
    }

    /// Drops io server `i`'s chunk files from the page cache (they must be
    /// synced: dirty pages are not dropped).
    fn drop_page_cache(&self, i: usize) -> Result<()> {
        let dir = self.dir.join(format!("io{i}")).join("objects");
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let f = std::fs::File::open(e?.path())?;
            rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
        }
        Ok(())
    }
}

/// One client: its own runtime (event-loop thread), sessions with meta and
/// every io server. Fields drop in order: connections before the runtime.
pub(crate) struct ClientSide {
    pub(crate) meta: MetaSession,
    pub(crate) data: DataClient,
    pub(crate) rt: Runtime,
}

/// A client whose loop spins like the cluster's servers.
pub(crate) fn client(c: &Cluster, name: &str) -> Result<ClientSide> {
    let mut opts = RuntimeOptions { name: format!("bench-io-{name}"), ucx_config: ucx(), ..Default::default() };
    if let Some(us) = c.cfg.spin_us {
        opts.spin = Duration::from_micros(us);
    }
    let rt = Runtime::new(opts)?;
    let secret = dafne_auth::Secret::load(&c.secret)?;
    let meta = MetaSession::connect(&rt, c.meta_addr, &secret, name, 0, 0)?;
    let addrs: Vec<SocketAddr> = c.ios.iter().map(|i| i.addr).collect();
    let data = DataClient::connect(&rt, &addrs, &secret)?;
    Ok(ClientSide { meta, data, rt })
}

impl ClientSide {
    /// A new file striped over `stripe_count` servers in 1 MiB units.
    pub(crate) fn create(&self, name: &str, stripe_count: usize) -> Result<OpenFile> {
        let hint = LayoutHint { stripe_unit: MIB as u32, stripe_count: stripe_count as u32 };
        let a = self
            .meta
            .create_with(ROOT_INO, name.as_bytes(), 0o644, true, Some(hint))
            .map_err(|e| anyhow!("create {name}: {e:?}"))?;
        self.meta
            .open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE)
            .map_err(|e| anyhow!("open {name}: {e:?}"))
    }

    pub(crate) fn region(&self, len: usize, op: Op) -> Result<Arc<Region>> {
        let ctx = self.data.context().ok_or_else(|| anyhow!("no io server"))?;
        let access = match op {
            Op::Read => Access::RemoteWrite,
            Op::Write => Access::RemoteRead,
        };
        Ok(Arc::new(Region::allocate(ctx, len, access)?))
    }

    pub(crate) fn pump(&self, f: &OpenFile, region: &Arc<Region>, load: Load, until: Until) -> Result<(u64, Duration)> {
        pump(&self.rt, &self.data, f, region, load, until)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// What one client does: `op`s of `size` bytes, `window` in flight, at
/// offsets `k × size mod file_size` for k = 0, 1, 2, … (sequential).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) op: Op,
    pub(crate) size: usize,
    pub(crate) window: usize,
    pub(crate) file_size: usize,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    Time(Duration),
    Requests(u64),
}

type Issued<'a> = Pin<Box<dyn Future<Output = (usize, Result<usize, Errno>)> + 'a>>;

/// Runs `load` on the client runtime's loop thread (no thread hop per
/// request) until `until`; slot `i` uses bytes `[i × size, (i+1) × size)`
/// of `region`. Returns requests completed and the time they took.
pub(crate) fn pump(
    rt: &Runtime,
    dc: &DataClient,
    f: &OpenFile,
    region: &Arc<Region>,
    load: Load,
    until: Until,
) -> Result<(u64, Duration)> {
    if region.len() < load.window * load.size || load.file_size < load.size {
        bail!("bad load {load:?} for a region of {} bytes", region.len());
    }
    let (dc, f, region) = (dc.clone(), f.clone(), region.clone());
    let r = rt.block_on_loop(move |_l| async move {
        let (dc, f, region) = (&dc, &f, &region);
        let issue = |slot: usize, k: u64| -> Issued<'_> {
            let off = (k * load.size as u64) % load.file_size as u64;
            let at = slot * load.size;
            Box::pin(async move {
                let r = match load.op {
                    Op::Read => dc.read_region(f, off, region, at, load.size).await,
                    Op::Write => dc.write_region(f, off, region, at, load.size, Stability::Unstable).await,
                };
                (slot, r)
            })
        };
        let limit = match until {
            Until::Requests(n) => n,
            Until::Time(_) => u64::MAX,
        };
        let start = Instant::now();
        let mut inflight = FuturesUnordered::new();
        let mut k = 0u64;
        while (k as usize) < load.window && k < limit {
            inflight.push(issue(k as usize, k));
            k += 1;
        }
        let mut done = 0u64;
        while let Some((slot, r)) = inflight.next().await {
            if let Err(e) = r {
                return Err(format!("{} of {} at request {done}: {e:?}", load.op.name(), human(load.size)));
            }
            done += 1;
            let more = match until {
                Until::Time(d) => start.elapsed() < d,
                Until::Requests(n) => k < n,
            };
            if more {
                inflight.push(issue(slot, k));
                k += 1;
            }
        }
        Ok((done, start.elapsed()))
    })?;
    r.map_err(|e| anyhow!(e))
}

/// CPU time of this process so far (all threads), in ns.
pub(crate) fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// Writes the whole file (1 MiB requests) and reads it once: afterwards it
/// is in the server's cache in every mode.
fn fill_and_warm(cl: &ClientSide, f: &OpenFile, file_size: usize, window: usize) -> Result<()> {
    let size = MIB.min(file_size);
    let n = file_size.div_ceil(size) as u64;
    for op in [Op::Write, Op::Read] {
        let r = cl.region(window * size, op)?;
        cl.pump(f, &r, Load { op, size, window, file_size }, Until::Requests(n))?;
    }
    Ok(())
}

/// Cached read and write bandwidth for each mode and size, one io server.
fn cached_bandwidth(
    o: &Options,
    sizes: &[usize],
    spin_us: Option<u64>,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<CachedRow>> {
    let mut rows = Vec::new();
    let spin_label = spin_us.map(|us| format!(", spin {us} µs")).unwrap_or_default();
    for &mode in &o.modes {
        progress(&format!("cached bandwidth, {mode}{spin_label}: starting the servers and filling the file"));
        let cfg = ServerCfg { mode, cache_mib: o.cache_mib, strict: false, spin_us, storage: o.storage };
        let mut c = cluster(o, &format!("cached-{mode}"), 1, cfg)?;
        let cl = client(&c, "cached")?;
        let f = cl.create("cached", 1)?;
        fill_and_warm(&cl, &f, o.file_size, o.window)?;
        for &size in sizes {
            for op in [Op::Read, Op::Write] {
                progress(&format!("cached {} {} {mode}{spin_label}", op.name(), human(size)));
                let load = Load { op, size, window: o.window, file_size: o.file_size };
                let region = cl.region(o.window * size, op)?;
                cl.pump(&f, &region, load, Until::Requests(2 * o.window as u64))?;
                let (c0, cpu0) = (c.ios[0].counters()?, process_cpu_ns());
                let (n, el) = cl.pump(&f, &region, load, Until::Time(o.duration))?;
                let (cpu1, c1) = (process_cpu_ns(), c.ios[0].counters()?);
                let d = c1.since(&c0);
                let bytes = n * size as u64;
                rows.push(CachedRow {
                    mode: mode.name(),
                    op: op.name(),
                    size,
                    window: o.window,
                    spin_us: spin_us.unwrap_or_else(|| dafne_transport::spin_from_env().as_micros() as u64),
                    requests: n,
                    mib_per_s: mib(bytes) / el.as_secs_f64().max(1e-9),
                    client_cpu_us_per_mib: (cpu1 - cpu0) as f64 / 1e3 / mib(bytes).max(1e-9),
                    server_cpu_us_per_mib: d.cpu_ns as f64 / 1e3 / mib(bytes).max(1e-9),
                    copies_per_byte: d.bytes_copied as f64 / bytes.max(1) as f64,
                    registrations_per_request: d.registrations as f64 / n.max(1) as f64,
                    registration_us_per_request: (d.registration_ns + d.deregistration_ns) as f64
                        / 1e3
                        / n.max(1) as f64,
                    hits: d.hits,
                    misses: d.misses,
                });
            }
        }
    }
    Ok(rows)
}

fn reread(o: &Options, progress: &mut impl FnMut(&str)) -> Result<Vec<RereadRow>> {
    let mut rows = Vec::new();
    let cache = o.reread_cache_mib * MIB;
    for &mode in &o.modes {
        for &ratio in &o.reread_ratios {
            // A whole number of access-size blocks.
            let size = (((ratio * cache as f64) as usize) / o.reread_size).max(1) * o.reread_size;
            progress(&format!("re-read {mode}: {} file, {} cache", human(size), human(cache)));
            let cfg =
                ServerCfg { mode, cache_mib: o.reread_cache_mib, strict: true, spin_us: None, storage: o.storage };
            let mut c = cluster(o, &format!("reread-{mode}-{ratio}"), 1, cfg)?;
            let n = (size / o.reread_size) as u64;
            let f = {
                let cl = client(&c, "writer")?;
                let f = cl.create("reread", 1)?;
                let write = Load { op: Op::Write, size: o.reread_size, window: o.window, file_size: size };
                cl.pump(&f, &cl.region(o.window * o.reread_size, Op::Write)?, write, Until::Requests(n))?;
                futures::executor::block_on(cl.data.sync(&f)).map_err(|e| anyhow!("sync: {e:?}"))?;
                f
            };
            c.restart_io(o, 0)?;
            c.drop_page_cache(0)?;
            let cl = client(&c, "reader")?;
            let region = cl.region(o.window * o.reread_size, Op::Read)?;
            let read = Load { op: Op::Read, size: o.reread_size, window: o.window, file_size: size };
            let (_, first) = cl.pump(&f, &region, read, Until::Requests(n))?;
            let c0 = c.ios[0].counters()?;
            let (_, second) = cl.pump(&f, &region, read, Until::Requests(n))?;
            let d = c.ios[0].counters()?.since(&c0);
            rows.push(RereadRow {
                mode: mode.name(),
                cache_mib: o.reread_cache_mib,
                file_size: size,
                ratio: size as f64 / cache as f64,
                access_size: o.reread_size,
                first_mib_per_s: mib(size as u64) / first.as_secs_f64().max(1e-9),
                second_mib_per_s: mib(size as u64) / second.as_secs_f64().max(1e-9),
                hits: d.hits.saturating_sub(d.read_ahead),
                misses: d.misses,
                read_ahead: d.read_ahead,
                evictions: d.evictions,
                hit_rate: d.hits.saturating_sub(d.read_ahead) as f64
                    / (d.hits.saturating_sub(d.read_ahead) + d.misses + d.read_ahead).max(1) as f64,
            });
        }
    }
    Ok(rows)
}

/// What one aggregate cell measured.
struct Aggregate {
    mib_per_s: f64,
    client_cpu_us_per_mib: f64,
    server_cpu_us_per_mib: f64,
    writebacks: u64,
}

/// All clients run `op` at once (1 MiB, `window` in flight each) for the
/// cell's time.
fn aggregate(
    o: &Options,
    c: &mut Cluster,
    clients: &[(ClientSide, OpenFile, Arc<Region>, Arc<Region>)],
    op: Op,
) -> Result<Aggregate> {
    let load = Load { op, size: MIB, window: o.window, file_size: o.scaling_file };
    let (c0, cpu0) = (c.counters()?, process_cpu_ns());
    let barrier = Barrier::new(clients.len());
    let results: Vec<Result<(u64, Duration)>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .map(|(cl, f, rd, wr)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let region = if op == Op::Read { rd } else { wr };
                    cl.pump(f, region, load, Until::Time(o.scaling_duration))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("client thread panicked")))).collect()
    });
    let cpu1 = process_cpu_ns();
    let c1 = c.counters()?;
    let (mut requests, mut longest) = (0u64, Duration::ZERO);
    for r in results {
        let (n, el) = r?;
        requests += n;
        longest = longest.max(el);
    }
    let moved = mib(requests * MIB as u64).max(1e-9);
    let server_cpu: u64 = c1.iter().zip(&c0).map(|(b, a)| b.since(a).cpu_ns).sum();
    Ok(Aggregate {
        mib_per_s: moved / longest.as_secs_f64().max(1e-9),
        client_cpu_us_per_mib: (cpu1 - cpu0) as f64 / 1e3 / moved,
        server_cpu_us_per_mib: server_cpu as f64 / 1e3 / moved,
        writebacks: c1.iter().zip(&c0).map(|(b, a)| b.since(a).writebacks).sum(),
    })
}

fn scaling(o: &Options, progress: &mut impl FnMut(&str)) -> Result<Vec<ScaleRow>> {
    let mut rows = Vec::new();
    for &mode in &o.modes {
        for &n in &o.servers {
            let cfg =
                ServerCfg { mode, cache_mib: o.scaling_cache_mib, strict: false, spin_us: None, storage: o.storage };
            let mut c = cluster(o, &format!("scale-{mode}-{n}"), n, cfg)?;
            for &m in &o.clients {
                progress(&format!("aggregate {mode}: {n} io server(s) × {m} client(s)"));
                let mut clients = Vec::new();
                for i in 0..m {
                    let cl = client(&c, &format!("c{i}"))?;
                    let f = cl.create(&format!("scale-{m}-{i}"), n)?;
                    fill_and_warm(&cl, &f, o.scaling_file, o.window)?;
                    let rd = cl.region(o.window * MIB, Op::Read)?;
                    let wr = cl.region(o.window * MIB, Op::Write)?;
                    clients.push((cl, f, rd, wr));
                }
                let r = aggregate(o, &mut c, &clients, Op::Read)?;
                let w = aggregate(o, &mut c, &clients, Op::Write)?;
                rows.push(ScaleRow {
                    mode: mode.name(),
                    servers: n,
                    clients: m,
                    read_mib_per_s: r.mib_per_s,
                    write_mib_per_s: w.mib_per_s,
                    read_client_cpu_us_per_mib: r.client_cpu_us_per_mib,
                    read_server_cpu_us_per_mib: r.server_cpu_us_per_mib,
                    write_client_cpu_us_per_mib: w.client_cpu_us_per_mib,
                    write_server_cpu_us_per_mib: w.server_cpu_us_per_mib,
                    write_writebacks: w.writebacks,
                });
                // Free the servers' caches for the next cell.
                for (cl, f, _, _) in &clients {
                    futures::executor::block_on(cl.data.remove(f)).map_err(|e| anyhow!("remove: {e:?}"))?;
                }
            }
        }
    }
    Ok(rows)
}

/// Runs the whole benchmark; `progress` is told what is being measured.
pub fn run(o: &Options, mut progress: impl FnMut(&str)) -> Result<Report> {
    if o.modes.is_empty() || o.window == 0 || o.sizes.is_empty() {
        bail!("nothing to measure: give modes, sizes and a window of at least 1");
    }
    if let Some(&s) = o.sizes.iter().find(|&&s| s > o.file_size || !o.file_size.is_multiple_of(s)) {
        bail!("access size {s} must divide the file size {}", o.file_size);
    }
    let t = o.tables;
    let cached = if t.cached { cached_bandwidth(o, &o.sizes, None, &mut progress)? } else { Vec::new() };
    let cpu = if t.cpu { cached_bandwidth(o, &[128 << 10, MIB], Some(0), &mut progress)? } else { Vec::new() };
    let reread = if t.reread { reread(o, &mut progress)? } else { Vec::new() };
    let scaling = if t.scaling { scaling(o, &mut progress)? } else { Vec::new() };
    let ratio = |op: &str| {
        let bw =
            |m: &str| cached.iter().find(|r| r.mode == m && r.op == op && r.size == 128 << 10).map(|r| r.mib_per_s);
        Some(bw("unifier")? / bw("normal")?)
    };
    Ok(Report {
        machine: machine(),
        ucx_version: ucx_version(),
        ucx_tls: UCX_TLS,
        storage: o.storage.name(),
        window: o.window,
        file_size: o.file_size,
        cache_mib: o.cache_mib,
        seconds_per_cell: o.duration.as_secs_f64(),
        unifier_over_normal_128k_read: ratio("read"),
        unifier_over_normal_128k_write: ratio("write"),
        cached,
        cpu,
        reread,
        scaling,
    })
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_else(|| "-".into())
}

impl Report {
    fn modes(&self) -> Vec<&'static str> {
        let mut m: Vec<&'static str> = Vec::new();
        for r in &self.cached {
            if !m.contains(&r.mode) {
                m.push(r.mode);
            }
        }
        m
    }

    fn cell(&self, mode: &str, op: &str, size: usize) -> Option<&CachedRow> {
        self.cached.iter().find(|r| r.mode == mode && r.op == op && r.size == size)
    }

    /// The tables as Markdown (what `dafne bench io` prints).
    pub fn to_markdown(&self) -> String {
        let modes = self.modes();
        let mut sizes: Vec<usize> = Vec::new();
        for r in &self.cached {
            if !sizes.contains(&r.size) {
                sizes.push(r.size);
            }
        }
        let mut s =
            format!(
                "machine: {}\nUCX: {} (UCX_TLS={}, loopback)\nstorage: unifier mode --storage {} (normal and mmap: the page cache)\n\n",
                self.machine, self.ucx_version, self.ucx_tls, self.storage
            );
        for op in ["read", "write"] {
            s.push_str(&format!(
                "Cached {op} bandwidth (MiB/s) vs access size: one io server, a {} file in a {} MiB cache, \
                 {} requests in flight, zero-copy client\n\n| access size |",
                human(self.file_size),
                self.cache_mib,
                self.window
            ));
            for m in &modes {
                s.push_str(&format!(" {m} |"));
            }
            s.push_str(" unifier / normal |\n|---|");
            s.push_str(&"---|".repeat(modes.len() + 1));
            s.push('\n');
            for &size in &sizes {
                s.push_str(&format!("| {} |", human(size)));
                for m in &modes {
                    s.push_str(&format!(" {} |", opt(self.cell(m, op, size).map(|r| r.mib_per_s), 0)));
                }
                let ratio = self
                    .cell("unifier", op, size)
                    .zip(self.cell("normal", op, size))
                    .map(|(u, n)| u.mib_per_s / n.mib_per_s.max(1e-9));
                s.push_str(&format!(" {} |\n", opt(ratio, 2)));
            }
            s.push('\n');
        }
        s.push_str(&format!(
            "unifier / normal at 128 KiB: read {}×, write {}× (target ≥ 1.5×)\n\n",
            opt(self.unifier_over_normal_128k_read, 2),
            opt(self.unifier_over_normal_128k_write, 2)
        ));

        if let Some(r) = self.reread.first() {
            s.push_str(&format!(
                "Re-read: a file of S on disk (server restarted, page cache dropped) read sequentially twice \
                 ({} requests, {} in flight) through a cache of C = {} MiB (--strict-cache: every mode holds C; \
                 normal and mmap lose their registered pool from it); counters of the second pass\n\n\
                 | mode | S / C | file | first read MiB/s | re-read MiB/s | hits | misses | read ahead | hit rate | evictions |\n\
                 |---|---|---|---|---|---|---|---|---|---|\n",
                human(r.access_size),
                self.window,
                r.cache_mib
            ));
        }
        for r in &self.reread {
            s.push_str(&format!(
                "| {} | {:.2} | {} | {:.0} | {:.0} | {} | {} | {} | {:.0}% | {} |\n",
                r.mode,
                r.ratio,
                human(r.file_size),
                r.first_mib_per_s,
                r.second_mib_per_s,
                r.hits,
                r.misses,
                r.read_ahead,
                r.hit_rate * 100.0,
                r.evictions
            ));
        }

        let mut clients: Vec<usize> = Vec::new();
        for r in &self.scaling {
            if !clients.contains(&r.clients) {
                clients.push(r.clients);
            }
        }
        if !self.scaling.is_empty() {
            s.push_str(&format!(
                "\nAggregate bandwidth (MiB/s), 1 MiB requests, {} in flight per client (each client its own runtime \
                 and thread, its own file striped over every io server in 1 MiB units), read / write; (N wb): dirty units \
                 the Unifier wrote back during the write cell (its write-behind bound is a quarter of the cache)\n\n\
                 | mode | io servers |",
                self.window
            ));
            for c in &clients {
                s.push_str(&format!(" {c} client{} |", if *c == 1 { "" } else { "s" }));
            }
            s.push_str("\n|---|---|");
            s.push_str(&"---|".repeat(clients.len()));
            s.push('\n');
            let mut keys: Vec<(&str, usize)> = Vec::new();
            for r in &self.scaling {
                if !keys.contains(&(r.mode, r.servers)) {
                    keys.push((r.mode, r.servers));
                }
            }
            for (mode, n) in keys {
                s.push_str(&format!("| {mode} | {n} |"));
                for &c in &clients {
                    match self.scaling.iter().find(|r| r.mode == mode && r.servers == n && r.clients == c) {
                        Some(r) if r.write_writebacks > 0 => s.push_str(&format!(
                            " {:.0} / {:.0} ({} wb) |",
                            r.read_mib_per_s, r.write_mib_per_s, r.write_writebacks
                        )),
                        Some(r) => s.push_str(&format!(" {:.0} / {:.0} |", r.read_mib_per_s, r.write_mib_per_s)),
                        None => s.push_str(" - |"),
                    }
                }
                s.push('\n');
            }
        }

        s.push_str(
            "\nCPU time per MiB moved, cached I/O as in the first tables but with neither event loop spinning \
             (spin 0: a loop sleeps when idle, so its CPU time is its work): client = this process, server = the \
             io server process; server copies per byte moved; server registrations per request and their cost \
             (register + deregister, with mmap + munmap)\n\n\
             | mode | op | access size | MiB/s | client CPU µs/MiB | server CPU µs/MiB | copies/byte | \
             registrations/request | µs/request |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        for op in ["read", "write"] {
            for size in [128usize << 10, MIB] {
                for r in self.cpu.iter().filter(|r| r.op == op && r.size == size) {
                    s.push_str(&format!(
                        "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} |\n",
                        r.mode,
                        r.op,
                        human(r.size),
                        r.mib_per_s,
                        r.client_cpu_us_per_mib,
                        r.server_cpu_us_per_mib,
                        r.copies_per_byte,
                        r.registrations_per_request,
                        r.registration_us_per_request
                    ));
                }
            }
        }
        s
    }
}

/// The Unifier seed's three experiments as `dafne bench seeds` shows them
/// (its figures 5–8): the points of each figure and its headline beside
/// the paper's (section 6: cached peaks 630 / 324 / 501 MB/s for unifier,
/// normal and mmap reads, 561 / 258 / 457 for writes; PVFS aggregate read
/// 1.7× normal, 1.3× mmap at peak).
pub mod seed {
    use super::Report;
    use crate::seed::{Figure, Headline, Series};
    use crate::transport::human;

    fn peak(r: &Report, mode: &str, op: &str) -> Option<f64> {
        r.cached.iter().filter(|c| c.mode == mode && c.op == op).map(|c| c.mib_per_s).reduce(f64::max)
    }

    fn ratio(quantity: String, ours: Option<f64>, paper: f64, why: &str) -> Option<Headline> {
        Some(Headline { quantity, ours: ours?, paper, paper_text: None, unit: "×".into(), why: why.into() })
    }

    /// Figures 5 and 6: cached read and write bandwidth vs access size.
    pub fn cached_figures(r: &Report) -> Vec<Figure> {
        ["read", "write"]
            .into_iter()
            .map(|op| Figure {
                id: format!("unifier-cached-{op}"),
                title: format!("Cached {op} bandwidth, one io server"),
                x_label: "access size (bytes)".into(),
                y_label: "MiB/s".into(),
                log_x: true,
                log_y: true,
                series: r
                    .modes()
                    .into_iter()
                    .map(|m| Series {
                        name: m.into(),
                        points: r
                            .cached
                            .iter()
                            .filter(|c| c.mode == m && c.op == op)
                            .map(|c| (c.size as f64, c.mib_per_s))
                            .collect(),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Ratios of peak cached bandwidths, as the paper states them.
    pub fn cached_headlines(r: &Report) -> Vec<Headline> {
        // Each row's why from the CPU table (loops not spinning) when it was
        // run: what a MiB cost the other mode's server beside the unifier's,
        // at the table's largest size.
        let cpu = |m: &str, op: &str| r.cpu.iter().filter(|c| c.mode == m && c.op == op).max_by_key(|c| c.size);
        let p = |m: &str, op: &str| peak(r, m, op);
        let why = |other: &str, op: &str, ours: Option<f64>| -> String {
            let (Some(o), Some(u)) = (cpu(other, op), cpu("unifier", op)) else {
                return "The CPU table (loops not spinning) was not run, so what each mode's work cost was not \
                        measured."
                    .into();
            };
            let work = if o.registrations_per_request > 0.0 {
                format!(
                    "{:.0} copies per byte, a registration per request at {:.0} µs",
                    o.copies_per_byte, o.registration_us_per_request
                )
            } else {
                format!("{:.0} copies per byte", o.copies_per_byte)
            };
            let mut s = format!(
                "At {} {op}s with loops not spinning, {other}'s server spent {:.0} µs of CPU per MiB ({work}) \
                 against the unifier's {:.0}",
                human(o.size),
                o.server_cpu_us_per_mib,
                u.server_cpu_us_per_mib
            );
            if other == "normal" && op == "read" && o.server_cpu_us_per_mib > 0.0 {
                let share = ((o.server_cpu_us_per_mib - u.server_cpu_us_per_mib) / o.server_cpu_us_per_mib).max(0.0);
                s.push_str(&format!(
                    ": the copies were {:.0}% of normal's work, where the paper's normal (324 of 630 MB/s) lost \
                     about half of each request to them",
                    share * 100.0
                ));
            }
            if ours.is_some_and(|v| v <= 1.0) {
                s.push_str("; the unifier was not ahead at its peak in this run, and these figures do not show why");
            }
            s.push('.');
            s
        };
        let q = |op: &str, other: &str| format!("unifier / {other}, cached {op}, peak over access sizes");
        let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?.max(1e-9));
        let row = |op: &str, other: &str, paper: f64| {
            let ours = div(p("unifier", op), p(other, op));
            ratio(q(op, other), ours, paper, &why(other, op, ours))
        };
        [
            row("read", "normal", 630.0 / 324.0),
            row("read", "mmap", 630.0 / 501.0),
            row("write", "normal", 561.0 / 258.0),
            // No unifier / mmap write row: dafne's mmap mode serves writes
            // as normal does (modes.rs), while the paper's Mmap wrote
            // through its mapping (457 MB/s); the ratio would compare
            // different things.
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Figure 7: re-read bandwidth (second pass) vs file size / cache size.
    pub fn reread_figures(r: &Report) -> Vec<Figure> {
        let mut modes: Vec<&str> = Vec::new();
        for row in &r.reread {
            if !modes.contains(&row.mode) {
                modes.push(row.mode);
            }
        }
        let fig = |id: &str, title: &str, y: &str, f: &dyn Fn(&super::RereadRow) -> f64| Figure {
            id: id.into(),
            title: title.into(),
            x_label: "file size / cache size".into(),
            y_label: y.into(),
            log_x: false,
            log_y: false,
            series: modes
                .iter()
                .map(|&m| Series {
                    name: m.into(),
                    points: r.reread.iter().filter(|row| row.mode == m).map(|row| (row.ratio, f(row))).collect(),
                })
                .collect(),
        };
        vec![
            fig("unifier-reread", "Re-read bandwidth through a cache of C", "MiB/s (second pass)", &|row| {
                row.second_mib_per_s
            }),
            fig("unifier-reread-hits", "Re-read hit rate through a cache of C", "hit rate (second pass, %)", &|row| {
                row.hit_rate * 100.0
            }),
        ]
    }

    /// The effective cache, on a file the size of the cache C (the paper's
    /// figure 7 at 360 MB: unifier and mmap "can still hold the entire
    /// file", normal, which lost 20 MB of it to its registered pool,
    /// "can not", and its re-read falls to the disk's 20 MB/s). Two rows:
    /// the share of the file the unifier serves from its cache on the
    /// second pass (its own counters; the paper's: all of it), and the
    /// re-read bandwidth of unifier over normal (the paper plots it but
    /// gives no number). Normal's share is not a row: a sequential re-read
    /// through an LRU smaller than the file hits nothing by arithmetic, here
    /// as in the paper, so it could not disagree.
    pub fn reread_headlines(r: &Report) -> Vec<Headline> {
        let at = |m: &str| {
            r.reread
                .iter()
                .filter(|row| row.mode == m)
                .min_by(|a, b| (a.ratio - 1.0).abs().total_cmp(&(b.ratio - 1.0).abs()))
        };
        let mut out = Vec::new();
        if let Some(u) = at("unifier") {
            out.push(Headline {
                quantity: format!(
                    "unifier: share of a file of S = {:.2} × C served from its cache on re-read",
                    u.ratio
                ),
                ours: u.hit_rate * 100.0,
                paper: 100.0,
                paper_text: Some("all of it (\"can still hold the entire file\")".into()),
                unit: "%".into(),
                why: format!(
                    "Measured from the Unifier's counters on the second pass: {} hits, {} misses, {} evictions.",
                    u.hits, u.misses, u.evictions
                ),
            });
        }
        if let (Some(u), Some(n)) = (at("unifier"), at("normal")) {
            let slower = n.second_mib_per_s < n.first_mib_per_s * 0.8;
            out.push(Headline {
                quantity: format!("unifier / normal, re-read bandwidth at S = {:.2} × C", u.ratio),
                ours: u.second_mib_per_s / n.second_mib_per_s.max(1e-9),
                paper: f64::NAN,
                paper_text: Some("normal falls to its IDE disk's 20 MB/s (no ratio given)".into()),
                unit: "×".into(),
                why: format!(
                    "Normal served {:.0}% of the re-read from its page cache (its 4 MiB pool taken from C) and read \
                     the rest from storage at {:.0} MiB/s against the unifier's {:.0}{}.",
                    n.hit_rate * 100.0,
                    n.second_mib_per_s,
                    u.second_mib_per_s,
                    if slower {
                        ""
                    } else {
                        ", no slower than its first pass: this VM's virtual disk has a host cache behind it, \
                         where the paper's IDE disk gave 20 MB/s"
                    }
                ),
            });
        }
        out
    }

    /// Figure 8: aggregate read over clients, with the most io servers measured.
    pub fn scaling_figures(r: &Report) -> Vec<Figure> {
        let Some(servers) = r.scaling.iter().map(|s| s.servers).max() else { return Vec::new() };
        let mut modes: Vec<&str> = Vec::new();
        for row in &r.scaling {
            if !modes.contains(&row.mode) {
                modes.push(row.mode);
            }
        }
        ["read", "write"]
            .into_iter()
            .map(|op| Figure {
                id: format!("unifier-aggregate-{op}"),
                title: format!("Aggregate {op}, {servers} io servers, 1 MiB requests"),
                x_label: "clients".into(),
                y_label: "MiB/s".into(),
                log_x: true,
                log_y: false,
                series: modes
                    .iter()
                    .map(|&m| Series {
                        name: m.into(),
                        points: r
                            .scaling
                            .iter()
                            .filter(|s| s.mode == m && s.servers == servers)
                            .map(|s| {
                                (s.clients as f64, if op == "read" { s.read_mib_per_s } else { s.write_mib_per_s })
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Peak aggregate read with the most io servers: unifier over normal
    /// and over mmap (the paper: 1.7× and 1.3×, four io servers).
    pub fn scaling_headlines(r: &Report) -> Vec<Headline> {
        let Some(servers) = r.scaling.iter().map(|s| s.servers).max() else { return Vec::new() };
        let peak = |m: &str| {
            r.scaling.iter().filter(|s| s.mode == m && s.servers == servers).map(|s| s.read_mib_per_s).reduce(f64::max)
        };
        // Why, from the cells: where each mode peaked and what a MiB cost
        // its servers there.
        let at_peak = |m: &str| {
            r.scaling
                .iter()
                .filter(|s| s.mode == m && s.servers == servers)
                .max_by(|a, b| a.read_mib_per_s.total_cmp(&b.read_mib_per_s))
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let why = match (at_peak("unifier"), at_peak("normal"), at_peak("mmap")) {
            (Some(u), Some(n), Some(m)) => format!(
                "Peaks at {}, {} and {} client(s) (unifier, normal, mmap), at {:.0}, {:.0} and {:.0} µs of server \
                 CPU per MiB read: the {servers} servers and the clients share {cores} cores here, where the \
                 paper's four io nodes each had their own CPU and NIC.",
                u.clients,
                n.clients,
                m.clients,
                u.read_server_cpu_us_per_mib,
                n.read_server_cpu_us_per_mib,
                m.read_server_cpu_us_per_mib
            ),
            _ => format!("The {servers} servers and the clients share {cores} cores here."),
        };
        let why = why.as_str();
        let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?.max(1e-9));
        let q = |other: &str| format!("unifier / {other}, peak aggregate read, {servers} io servers");
        [
            ratio(q("normal"), div(peak("unifier"), peak("normal")), 1.7, why),
            ratio(q("mmap"), div(peak("unifier"), peak("mmap")), 1.3, why),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

#[cfg(test)]
mod seed_tests {
    use super::seed::*;
    use super::*;

    fn cached(mode: &'static str, op: &'static str, size: usize, mib_per_s: f64, cpu: f64) -> CachedRow {
        CachedRow {
            mode,
            op,
            size,
            window: 8,
            spin_us: 0,
            requests: 1,
            mib_per_s,
            client_cpu_us_per_mib: 0.0,
            server_cpu_us_per_mib: cpu,
            copies_per_byte: if mode == "normal" { 2.0 } else { 0.0 },
            registrations_per_request: 0.0,
            registration_us_per_request: 0.0,
            hits: 0,
            misses: 0,
        }
    }

    fn report() -> Report {
        Report {
            machine: "m".into(),
            ucx_version: "1.13".into(),
            ucx_tls: UCX_TLS,
            storage: "buffered",
            window: 8,
            file_size: 8 << 20,
            cache_mib: 64,
            seconds_per_cell: 0.1,
            cached: vec![
                // Peaks at different sizes: the headline is peak over peak.
                cached("normal", "read", 4096, 100.0, 0.0),
                cached("normal", "read", 1 << 20, 1000.0, 0.0),
                cached("unifier", "read", 4096, 3000.0, 0.0),
                cached("unifier", "read", 1 << 20, 2000.0, 0.0),
                cached("mmap", "read", 1 << 20, 1500.0, 0.0),
                cached("normal", "write", 1 << 20, 500.0, 0.0),
                cached("unifier", "write", 1 << 20, 750.0, 0.0),
                cached("mmap", "write", 1 << 20, 500.0, 0.0),
            ],
            cpu: vec![
                cached("normal", "read", 1 << 20, 1.0, 200.0),
                cached("mmap", "read", 1 << 20, 1.0, 180.0),
                cached("unifier", "read", 1 << 20, 1.0, 150.0),
            ],
            reread: Vec::new(),
            scaling: Vec::new(),
            unifier_over_normal_128k_read: None,
            unifier_over_normal_128k_write: None,
        }
    }

    #[test]
    fn cached_headlines_are_peak_over_peak_unifier_on_top_and_no_mmap_write_row() {
        let h = cached_headlines(&report());
        let q: Vec<&str> = h.iter().map(|h| h.quantity.as_str()).collect();
        assert_eq!(h.len(), 3, "{q:?}");
        assert!((h[0].ours - 3.0).abs() < 1e-9, "3000 / 1000: {:?}", h[0]);
        assert!((h[1].ours - 2.0).abs() < 1e-9, "3000 / 1500: {:?}", h[1]);
        assert!((h[2].ours - 1.5).abs() < 1e-9, "750 / 500 writes: {:?}", h[2]);
        assert!((h[0].paper - 630.0 / 324.0).abs() < 1e-9);
        assert!(!q.iter().any(|q| q.contains("mmap, cached write")), "{q:?}");
        assert!(h[0].why.contains("25%"), "(200 - 150) / 200 of normal's work: {}", h[0].why);
    }

    #[test]
    fn reread_and_aggregate_headlines_come_from_their_rows() {
        let mut r = report();
        let row = |mode: &'static str, hit_rate: f64, second: f64| RereadRow {
            mode,
            cache_mib: 8,
            file_size: 8 << 20,
            ratio: 1.0,
            access_size: 128 << 10,
            first_mib_per_s: 500.0,
            second_mib_per_s: second,
            hits: (hit_rate * 64.0) as u64,
            misses: 64 - (hit_rate * 64.0) as u64,
            read_ahead: 0,
            evictions: 0,
            hit_rate,
        };
        r.reread = vec![row("normal", 0.0, 250.0), row("unifier", 1.0, 1000.0)];
        let h = reread_headlines(&r);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].ours, 100.0);
        assert!((h[1].ours - 4.0).abs() < 1e-9 && h[1].paper.is_nan(), "{:?}", h[1]);
        let scale = |mode: &'static str, clients: usize, read: f64| ScaleRow {
            mode,
            servers: 4,
            clients,
            read_mib_per_s: read,
            write_mib_per_s: 0.0,
            read_client_cpu_us_per_mib: 0.0,
            read_server_cpu_us_per_mib: 100.0,
            write_client_cpu_us_per_mib: 0.0,
            write_server_cpu_us_per_mib: 0.0,
            write_writebacks: 0,
        };
        r.scaling = vec![scale("normal", 1, 600.0), scale("normal", 4, 400.0), scale("unifier", 4, 900.0)];
        r.scaling.push(scale("mmap", 2, 450.0));
        let h = scaling_headlines(&r);
        assert!((h[0].ours - 1.5).abs() < 1e-9 && (h[1].ours - 2.0).abs() < 1e-9, "{h:?}");
        assert!(h[0].why.contains("Peaks at 4, 1 and 2 client(s)"), "{}", h[0].why);
    }
}
