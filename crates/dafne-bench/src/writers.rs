//! The writers benchmark: the ORFA/MX paper's figure 9 ("Storage over
//! high-speed networks", section 3.3, flow control) on dafne: one io
//! server, N client **processes** each writing 64 KiB requests, one in
//! flight, and the server's aggregate throughput as N grows.
//!
//! The paper measured 233 MB/s (of the link's 250) with 92 clients and
//! 163 MB/s with 184, and names the cause: under GM's rendezvous model the
//! server must post receive buffers in advance, the network interface holds
//! only 125 of them, and with more clients than buffers some requests
//! arrive to no buffer, are dropped and resent: bandwidth spent on data
//! that is never used. Its fix is server-driven transfers (the client sends
//! a request; the server RDMA-reads the data when it has the resources).
//! The text does not say whether the writes reached a disk; the fall it
//! explains is on the wire, in front of the server's storage.
//!
//! dafne's io server already works the way the paper's fix does: a write
//! request carries the client region's key and the server gets the data
//! from the client's memory when it serves the request (`Stability::
//! Unstable`, into a Unifier cache unit). So what this measures is not the
//! paper's starvation but what else many writers cost one server here. On
//! the 2-core VM it was CPU: each reply wakes a sleeping client process,
//! and once the clients outnumber the cores the scheduler's per-thread
//! share starves the server's one loop thread (`Options::client_nice`
//! moves it; docs/BENCHMARKS.md, "One server, many writers").
//!
//! Shape of a run:
//! - one metadata server and one io server (unifier mode, `cache_mib` of
//!   cache, `--storage` on `scratch`), processes of `program` started as
//!   in [`crate::io`];
//! - for each N, N client processes (`PROGRAM bench writers-client`, a
//!   hidden subcommand that calls [`client_main`]). Each in turn gets its
//!   job as one JSON line on stdin, connects, creates **its own file** and
//!   overwrites it once (the cache units exist before the clock starts),
//!   then says `ready`. Own files rather than one shared file: the paper's clients are
//!   independent, and a file per client keeps each one's stream sequential
//!   and lets every client's bytes be checked on their own afterwards;
//! - when all are ready the benchmark sends `go` to each (the barrier is
//!   the pipes, not a sleep); each writes 64 KiB requests, one in flight, at
//!   offsets cycling through its file (`file_size`, small so that 64 files
//!   stay within an eighth of the cache, half what the Unifier holds dirty
//!   before writing back: the writes hit the server's cache, and its
//!   write-backs are counted), for `duration`, then prints what it wrote and
//!   when (CLOCK_MONOTONIC, shared by the processes of one machine);
//! - aggregate throughput = all bytes / (last end − first start);
//! - with `verify`, the server's count of bytes it got from clients must
//!   equal the sum the clients reported: that is the check of the reported
//!   counts. Every file is also read back and compared block by block with
//!   the measured pattern (or the warm-up's, for a block no measured write
//!   reached): that proves the measured writes landed where they were
//!   sent, uncorrupted, but not how many there were, since every measured
//!   write of a client carries the same bytes;
//! - the client and server event loops do not spin (`spin = 0`): the CPU
//!   columns would otherwise count loops polling while they wait (the
//!   default spin is 50 µs on 4 cores or more).

use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use dafne_client::data::DataClient;
use dafne_client::MetaSession;
use dafne_io::server::ServingMode;
use dafne_transport::{Runtime, RuntimeOptions};
use serde::{Deserialize, Serialize};

use crate::io::{self, ClientSide, Load, Op, Proc, ServerCfg, Until, UCX_TLS};
use crate::seed::{Figure, Headline, Series};
use crate::transport::{human, machine, ucx_version};

/// What the paper's figure 9 reports, read from its text: (clients, MB/s).
pub const PAPER_POINTS: [(f64, f64); 2] = [(92.0, 233.0), (184.0, 163.0)];
const MB: f64 = 1e6;
/// A ratio within this of 1 is not claimed as a difference: a cell is one
/// run, so there is no spread of rounds to judge it by, and the machines
/// these run on are shared.
const WITHIN_NOISE: f64 = 0.05;
/// A server share of a core at or above this is a saturated loop thread.
const SATURATED: f64 = 0.9;

#[derive(Debug, Clone)]
pub struct Options {
    /// Client process counts, one cell each.
    pub clients: Vec<usize>,
    /// Bytes per write request (the paper's 64 kB).
    pub size: usize,
    /// Each client's file: its writes cycle through it.
    pub file_size: usize,
    /// How long each client writes.
    pub duration: Duration,
    /// The io server's cache (MiB).
    pub cache_mib: usize,
    /// Read every file back and check it against what its client reported.
    pub verify: bool,
    /// Nice value of the client processes (0: the server's; 10: the
    /// scheduler gives the io server's thread the CPU first). Set on each
    /// client before it starts its threads, which inherit it.
    pub client_nice: i32,
    /// The `dafne` executable (servers: `serve meta|io`; clients:
    /// `bench writers-client`).
    pub program: PathBuf,
    /// Where the servers keep their data (a fresh directory inside).
    pub scratch: PathBuf,
    pub storage: dafne_io::chunk::StorageMode,
}

impl Default for Options {
    /// The figure's run: 1 to 64 client processes, 3 s each.
    fn default() -> Options {
        Options {
            clients: vec![1, 2, 4, 8, 16, 32, 64],
            size: 64 << 10,
            file_size: 128 << 10,
            duration: Duration::from_secs(3),
            cache_mib: 64,
            verify: true,
            client_nice: 0,
            program: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("dafne")),
            scratch: std::env::temp_dir(),
            storage: dafne_io::chunk::StorageMode::Auto,
        }
    }
}

impl Options {
    /// A smoke run of about 15 s: 1 to 16 clients, 2 s each.
    pub fn quick() -> Options {
        Options { clients: vec![1, 2, 4, 8, 16], duration: Duration::from_secs(2), ..Options::default() }
    }
}

/// One client process's job, sent as a JSON line on its stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientJob {
    pub meta: SocketAddr,
    pub io: Vec<SocketAddr>,
    pub secret: PathBuf,
    pub ucx: Vec<(String, String)>,
    /// File name in the root directory (created by the client).
    pub file: String,
    pub size: usize,
    pub file_size: usize,
    pub seconds: f64,
    /// Seed of the pattern of the measured writes (the warm-up pass writes
    /// `seed ^ WARM`).
    pub seed: u64,
}

const WARM: u64 = 0x5741_524d;

/// What one client process reports, as a JSON line on its stdout.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ClientResult {
    pub requests: u64,
    pub bytes: u64,
    /// CLOCK_MONOTONIC at `go` and after the last reply (ns).
    pub start_ns: u64,
    pub end_ns: u64,
    /// The process's CPU time over the measured writes (ns).
    pub cpu_ns: u64,
    /// Peak resident set of the process (VmHWM, KiB).
    pub rss_kib: u64,
    /// Context switches over the measured writes: voluntary, involuntary.
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub clients: usize,
    pub bytes: u64,
    /// Last end − first start (s).
    pub window_s: f64,
    /// Last start − first start (ms): how far apart the `go`s landed.
    pub start_skew_ms: f64,
    /// Aggregate throughput in MB/s (10⁶ bytes, the paper's unit) and MiB/s.
    pub mb_per_s: f64,
    pub mib_per_s: f64,
    /// Slowest and fastest client (MB/s over its own time).
    pub client_min_mb_per_s: f64,
    pub client_max_mb_per_s: f64,
    /// Mean request latency (µs): a client's time / its requests, averaged.
    pub mean_latency_us: f64,
    /// io server CPU time per MiB written, and its share of one core over
    /// the window.
    pub server_cpu_us_per_mib: f64,
    pub server_cpu_share: f64,
    /// All client processes' CPU time per MiB written.
    pub client_cpu_us_per_mib: f64,
    /// Context switches per request: of the io server (voluntary: its loop
    /// went to sleep; involuntary: preempted), and of the clients (all).
    pub server_voluntary_switches_per_request: f64,
    pub server_involuntary_switches_per_request: f64,
    pub client_switches_per_request: f64,
    /// Peak RSS of the largest client process (KiB).
    pub client_rss_kib: u64,
    /// The io server's Unifier counters over the cell: dirty units written
    /// back (bounded write-behind and background), evictions, hits.
    pub writebacks: u64,
    pub background_writebacks: u64,
    pub evictions: u64,
    pub hits: u64,
    pub misses: u64,
    /// Bytes the io server got from the clients' memory over the cell.
    pub server_bytes_got: u64,
    /// Files read back and checked (0 without `verify`).
    pub verified_files: usize,
    pub per_client: Vec<ClientResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: String,
    /// CPUs this process may run on (the clients and servers share them).
    pub cores: usize,
    pub ucx_version: String,
    pub ucx_tls: &'static str,
    pub storage: &'static str,
    pub size: usize,
    pub file_size: usize,
    pub cache_mib: usize,
    pub seconds_per_cell: f64,
    pub client_nice: i32,
    pub rows: Vec<Row>,
}

/// Bytes that differ at every offset, reproducible from `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A number field of a `/proc/…/status` file (`VmHWM`, in KiB, or a
/// context switch count), 0 where it does not say.
fn status_field(path: &std::path::Path, field: &str) -> u64 {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Context switches of all of a process's threads so far (`/proc/<pid>/
/// status` counts only its first thread; the event loop is another):
/// voluntary (a thread slept: an event loop with nothing to do) and
/// involuntary (the scheduler took its core).
fn ctx_switches(pid: &str) -> (u64, u64) {
    let mut sum = (0, 0);
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let st = t.path().join("status");
            sum.0 += status_field(&st, "voluntary_ctxt_switches");
            sum.1 += status_field(&st, "nonvoluntary_ctxt_switches");
        }
    }
    sum
}

fn read_line(out: &mut impl BufRead, what: &str) -> Result<String> {
    let mut line = String::new();
    if out.read_line(&mut line).with_context(|| format!("reading {what}"))? == 0 {
        bail!("end of input while waiting for {what}");
    }
    Ok(line)
}

/// The client process (`dafne bench writers-client`): a job line on
/// stdin, `ready`, then `go`, then a result line on stdout.
pub fn client_main() -> Result<()> {
    let (mut rt, mut cl) = (None, None);
    let r = client_run(&mut rt, &mut cl);
    if let (Err(e), true) = (&r, rt.is_some() || cl.is_some()) {
        // Said before the teardown: UCX may abort while destroying a worker
        // that a failure left with requests outstanding, and the reason
        // would be lost. (Without a runtime, `dafne` says it on return.)
        eprintln!("writers-client: {e:#}");
    }
    drop(cl);
    drop(rt);
    r
}

/// [`client_main`]'s work; what it connects is left in the slots.
fn client_run(rt_slot: &mut Option<Runtime>, cl_slot: &mut Option<ClientSide>) -> Result<()> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let job: ClientJob = serde_json::from_str(&read_line(&mut input, "the job line")?)
        .context("the job line is not a writers-client job (this subcommand is started by `dafne bench writers`)")?;
    if job.size == 0 || job.file_size < job.size || !job.file_size.is_multiple_of(job.size) {
        bail!("bad job: size {} must divide file size {}", job.size, job.file_size);
    }
    let secret = dafne_auth::Secret::load(&job.secret)?;
    let rt = rt_slot.insert(Runtime::new(RuntimeOptions {
        name: format!("writers-{}", job.file),
        ucx_config: job.ucx.clone(),
        ..Default::default()
    })?);
    let meta =
        MetaSession::connect(rt, job.meta, &secret, &job.file, 0, 0).context("connecting to the metadata server")?;
    let data = DataClient::connect(rt, &job.io, &secret).context("connecting to the io server")?;
    let rt = rt_slot.take().ok_or_else(|| anyhow!("no runtime"))?;
    let cl = cl_slot.insert(ClientSide { meta, data, rt });
    let f = cl.create(&job.file, job.io.len())?;
    let region = |seed: u64| -> Result<Arc<dafne_transport::Region>> {
        let ctx = cl.data.context().ok_or_else(|| anyhow!("no io server"))?;
        let mut r = dafne_transport::Region::allocate(ctx, job.size, dafne_transport::Access::RemoteRead)?;
        r.as_mut_slice().copy_from_slice(&pattern(job.size, seed));
        Ok(Arc::new(r))
    };
    let load = Load { op: Op::Write, size: job.size, window: 1, file_size: job.file_size };
    cl.pump(&f, &region(job.seed ^ WARM)?, load, Until::Requests((job.file_size / job.size) as u64))?;
    let measured = region(job.seed)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let go = read_line(&mut input, "go")?;
    if go.trim() != "go" {
        bail!("expected `go`, got {go:?}");
    }
    let (start_ns, cpu0, sw0) = (monotonic_ns(), io::process_cpu_ns(), ctx_switches("self"));
    let (requests, _) = cl.pump(&f, &measured, load, Until::Time(Duration::from_secs_f64(job.seconds)))?;
    let (end_ns, cpu1, sw1) = (monotonic_ns(), io::process_cpu_ns(), ctx_switches("self"));
    let r = ClientResult {
        requests,
        bytes: requests * job.size as u64,
        start_ns,
        end_ns,
        cpu_ns: cpu1 - cpu0,
        rss_kib: status_field("/proc/self/status".as_ref(), "VmHWM"),
        voluntary_switches: sw1.0 - sw0.0,
        involuntary_switches: sw1.1 - sw0.1,
    };
    writeln!(out, "{}", serde_json::to_string(&r)?)?;
    out.flush()?;
    Ok(())
}

/// A client process of a cell.
struct ClientProc {
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    log: PathBuf,
    proc: Proc,
}

impl ClientProc {
    /// What went wrong, with the end of the process's stderr.
    fn failed(&mut self, i: usize, e: anyhow::Error) -> anyhow::Error {
        let _ = self.proc.0.wait();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let head: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).take(4).collect();
        anyhow!(
            "client process {i}: {e:#}; its stderr begins: {} (all of it: {}, kept)",
            head.join(" | "),
            self.log.display()
        )
    }
}

/// One cell: `n` client processes against the cluster.
fn cell(o: &Options, c: &mut io::Cluster, reader: &ClientSide, dir: &std::path::Path, n: usize) -> Result<Row> {
    let mut procs: Vec<ClientProc> = Vec::with_capacity(n);
    for i in 0..n {
        let log = dir.join(format!("client-{n}-{i}.log"));
        let mut cmd = Command::new(&o.program);
        cmd.args(["bench", "writers-client"]);
        if std::env::var_os("DAFNE_LOG").is_none() {
            cmd.env("DAFNE_LOG", "warn");
        }
        // CPU is measured: a client's loop must sleep when it waits, not
        // spin (the default on 4 cores or more), as the server's does.
        cmd.env("DAFNE_SPIN_US", "0");
        let err = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting client process {i} ({})", o.program.display()))?;
        if o.client_nice != 0 {
            // Before the job line: the client starts no thread before it.
            let pid = rustix::process::Pid::from_raw(child.id() as i32);
            rustix::process::setpriority_process(pid, o.client_nice)
                .with_context(|| format!("setting client process {i}'s nice value to {}", o.client_nice))?;
        }
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
        let out = BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?);
        procs.push(ClientProc { stdin, out, log, proc: Proc(child) });
    }
    // One client at a time connects and fills its file (64 handshakes at
    // once on a loaded 2-core machine can outlast the servers' handshake
    // deadlines); they were all started above, and all wait for `go`.
    for (i, p) in procs.iter_mut().enumerate() {
        let job = ClientJob {
            meta: c.meta_addr,
            io: c.ios.iter().map(|s| s.addr).collect(),
            secret: c.secret.clone(),
            ucx: io::ucx(),
            file: file_name(n, i),
            size: o.size,
            file_size: o.file_size,
            seconds: o.duration.as_secs_f64(),
            seed: seed(n, i),
        };
        let sent = writeln!(p.stdin, "{}", serde_json::to_string(&job)?).and_then(|_| p.stdin.flush());
        if let Err(e) = sent {
            return Err(p.failed(i, e.into()));
        }
        match read_line(&mut p.out, "`ready`") {
            Ok(l) if l.trim() == "ready" => {}
            Ok(l) => return Err(p.failed(i, anyhow!("said {l:?} instead of `ready`"))),
            Err(e) => return Err(p.failed(i, e)),
        }
    }
    let server = c.ios[0].pid().to_string();
    let (c0, ssw0) = (c.ios[0].counters()?, ctx_switches(&server));
    for (i, p) in procs.iter_mut().enumerate() {
        if let Err(e) = writeln!(p.stdin, "go").and_then(|_| p.stdin.flush()) {
            return Err(p.failed(i, e.into()));
        }
    }
    let mut results = Vec::with_capacity(n);
    for (i, p) in procs.iter_mut().enumerate() {
        let r = read_line(&mut p.out, "the result line")
            .and_then(|l| serde_json::from_str::<ClientResult>(&l).with_context(|| format!("result line {l:?}")));
        match r {
            Ok(r) => results.push(r),
            Err(e) => return Err(p.failed(i, e)),
        }
    }
    let (d, ssw1) = (c.ios[0].counters()?.since(&c0), ctx_switches(&server));
    drop(procs);
    let requests = results.iter().map(|r| r.requests).sum::<u64>().max(1) as f64;

    let bytes: u64 = results.iter().map(|r| r.bytes).sum();
    let first = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let last_start = results.iter().map(|r| r.start_ns).max().unwrap_or(0);
    let last = results.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let window_s = (last.saturating_sub(first)) as f64 / 1e9;
    let own = |r: &ClientResult| r.bytes as f64 / MB / ((r.end_ns - r.start_ns) as f64 / 1e9).max(1e-9);
    let mibs = io::mib(bytes).max(1e-9);
    if o.verify && d.ucx_bytes_got != bytes {
        bail!("{n} clients reported {bytes} bytes written, but the io server got {} bytes from them", d.ucx_bytes_got);
    }
    let mut verified_files = 0;
    for (i, r) in results.iter().enumerate() {
        let name = file_name(n, i);
        let f = open(reader, &name)?;
        if o.verify {
            verify(o, reader, &f, &name, seed(n, i), r.requests)?;
            verified_files += 1;
        }
        // Free the cache for the next cell.
        futures::executor::block_on(reader.data.remove(&f)).map_err(|e| anyhow!("removing {name}: {e:?}"))?;
        reader.meta.close(f.layout.object_id).map_err(|e| anyhow!("closing {name}: {e:?}"))?;
        reader.meta.unlink(dafne_client::ROOT_INO, name.as_bytes()).map_err(|e| anyhow!("unlinking {name}: {e:?}"))?;
    }
    Ok(Row {
        clients: n,
        bytes,
        window_s,
        start_skew_ms: last_start.saturating_sub(first) as f64 / 1e6,
        mb_per_s: bytes as f64 / MB / window_s.max(1e-9),
        mib_per_s: mibs / window_s.max(1e-9),
        client_min_mb_per_s: results.iter().map(own).fold(f64::INFINITY, f64::min),
        client_max_mb_per_s: results.iter().map(own).fold(0.0, f64::max),
        mean_latency_us: results
            .iter()
            .map(|r| (r.end_ns - r.start_ns) as f64 / 1e3 / r.requests.max(1) as f64)
            .sum::<f64>()
            / n as f64,
        server_cpu_us_per_mib: d.cpu_ns as f64 / 1e3 / mibs,
        server_cpu_share: d.cpu_ns as f64 / 1e9 / window_s.max(1e-9),
        client_cpu_us_per_mib: results.iter().map(|r| r.cpu_ns).sum::<u64>() as f64 / 1e3 / mibs,
        server_voluntary_switches_per_request: (ssw1.0 - ssw0.0) as f64 / requests,
        server_involuntary_switches_per_request: (ssw1.1 - ssw0.1) as f64 / requests,
        client_switches_per_request: results.iter().map(|r| r.voluntary_switches + r.involuntary_switches).sum::<u64>()
            as f64
            / requests,
        client_rss_kib: results.iter().map(|r| r.rss_kib).max().unwrap_or(0),
        writebacks: d.writebacks,
        background_writebacks: d.background_writebacks,
        evictions: d.evictions,
        hits: d.hits,
        misses: d.misses,
        server_bytes_got: d.ucx_bytes_got,
        verified_files,
        per_client: results,
    })
}

fn file_name(n: usize, i: usize) -> String {
    format!("writers-{n}-{i}")
}

fn seed(n: usize, i: usize) -> u64 {
    ((n as u64) << 32) | i as u64
}

fn open(cl: &ClientSide, name: &str) -> Result<dafne_client::OpenFile> {
    let a = cl.meta.resolve(&format!("/{name}")).map_err(|e| anyhow!("resolve /{name}: {e:?}"))?;
    cl.meta.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).map_err(|e| anyhow!("open /{name}: {e:?}"))
}

/// Reads `name` back: block `b` must hold the measured pattern if one of
/// the client's `requests` measured writes landed on it (the k-th went to
/// block `k mod blocks`), else the warm-up pattern.
fn verify(
    o: &Options,
    cl: &ClientSide,
    f: &dafne_client::OpenFile,
    name: &str,
    seed: u64,
    requests: u64,
) -> Result<()> {
    let (measured, warm) = (pattern(o.size, seed), pattern(o.size, seed ^ WARM));
    let blocks = (o.file_size / o.size) as u64;
    let mut buf = vec![0u8; o.size];
    for b in 0..blocks {
        let got = futures::executor::block_on(cl.data.read_at(f, b * o.size as u64, &mut buf))
            .map_err(|e| anyhow!("reading {name} back: {e:?}"))?;
        let want = if b < requests { &measured } else { &warm };
        if got != o.size || buf != *want {
            let at = buf.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got);
            bail!(
                "{name}: block {b} of {blocks} is not what its client's {requests} reported writes imply \
                 (read {got} bytes, first difference at byte {at})"
            );
        }
    }
    Ok(())
}

/// Runs the benchmark; `progress` is told what is being measured.
pub fn run(o: &Options, mut progress: impl FnMut(&str)) -> Result<Report> {
    if o.clients.is_empty() || o.clients.contains(&0) {
        bail!("nothing to measure: give client counts of at least 1");
    }
    if o.size == 0 || o.file_size < o.size || !o.file_size.is_multiple_of(o.size) {
        bail!("the request size ({}) must divide each client's file ({})", o.size, o.file_size);
    }
    let most = o.clients.iter().max().copied().unwrap_or(1);
    // The Unifier holds at most a quarter of its cache dirty before it
    // writes back (write-behind); the files together stay within half of
    // that, so that the writes stay in the cache (at 64 files of 256 KiB in
    // 64 MiB, exactly the quarter, the server wrote back thousands of units
    // and the slowest client fell below 1 MB/s).
    if most * o.file_size > (o.cache_mib << 20) / 8 {
        bail!(
            "{most} files of {} would fill more than an eighth of the {} MiB cache (the io server writes back \
             beyond a quarter dirty): the writes are meant to stay in the cache; give smaller files or a larger cache",
            human(o.file_size),
            o.cache_mib
        );
    }
    progress("starting the metadata server and the io server");
    let cfg = ServerCfg {
        mode: ServingMode::Unifier,
        cache_mib: o.cache_mib,
        strict: false,
        // Not spinning: the CPU columns then count work, not a loop
        // polling an empty queue (`crate::io`'s CPU table does the same).
        spin_us: Some(0),
        storage: o.storage,
    };
    let mut c = io::cluster_of(&o.program, &o.scratch, "writers", 1, cfg)?;
    let reader = io::client(&c, "writers-reader")?;
    // The clients' stderr, kept when a run fails.
    let dir = o.scratch.join(format!("dafne-writers-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut rows = Vec::new();
    for &n in &o.clients {
        progress(&format!("{n} client process{}", if n == 1 { "" } else { "es" }));
        let started = Instant::now();
        let row = cell(o, &mut c, &reader, &dir, n)?;
        progress(&format!(
            "{n} clients: {:.0} MB/s (cell took {:.1} s)",
            row.mb_per_s,
            started.elapsed().as_secs_f64()
        ));
        rows.push(row);
    }
    drop(reader);
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Report {
        machine: machine(),
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        ucx_version: ucx_version(),
        ucx_tls: UCX_TLS,
        storage: o.storage.name(),
        size: o.size,
        file_size: o.file_size,
        cache_mib: o.cache_mib,
        seconds_per_cell: o.duration.as_secs_f64(),
        client_nice: o.client_nice,
        rows,
    })
}

impl Report {
    /// The table as Markdown (what `dafne bench writers` prints).
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "machine: {}\nUCX: {} (UCX_TLS={}, loopback)\n\n\
             Server throughput vs client processes (the ORFA/MX paper's figure 9): one io server (unifier, \
             {} MiB cache, --storage {}), each client a process writing {} requests, one in flight, through \
             its own {} file for {:.1} s, clients at nice {}; MB = 10⁶ bytes; throughput = all bytes / (last end − first start); \
             CPU: io server per MiB and its share of one core, all clients per MiB; switches: the io server's voluntary + involuntary context switches per request / all clients' per request; wb: write-backs\n\n\
             | clients | MB/s | slowest / fastest client MB/s | mean latency µs | server CPU µs/MiB | server CPU share | \
             clients CPU µs/MiB | server / clients switches per request | client RSS MiB | wb | start skew ms | verified |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.machine,
            self.ucx_version,
            self.ucx_tls,
            self.cache_mib,
            self.storage,
            human(self.size),
            human(self.file_size),
            self.seconds_per_cell,
            self.client_nice
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {:.0} | {:.1} / {:.1} | {:.0} | {:.0} | {:.0}% | {:.0} | {:.2} + {:.2} / {:.2} | {:.1} | {} | {:.1} | {} |\n",
                r.clients,
                r.mb_per_s,
                r.client_min_mb_per_s,
                r.client_max_mb_per_s,
                r.mean_latency_us,
                r.server_cpu_us_per_mib,
                r.server_cpu_share * 100.0,
                r.client_cpu_us_per_mib,
                r.server_voluntary_switches_per_request,
                r.server_involuntary_switches_per_request,
                r.client_switches_per_request,
                r.client_rss_kib as f64 / 1024.0,
                r.writebacks + r.background_writebacks,
                r.start_skew_ms,
                if r.verified_files == r.clients { "yes" } else { "no" }
            ));
        }
        if let Some(h) = self.headlines().first() {
            s.push_str(&format!(
                "\n{}: {:.2}{} (paper: {:.2}{}, 163 MB/s at 184 clients / 233 MB/s at 92)\n{}\n",
                h.quantity, h.ours, h.unit, h.paper, h.unit, h.why
            ));
        }
        s
    }

    /// Aggregate MB/s vs client processes: this run's curve and the
    /// paper's two points.
    pub fn figure(&self) -> Figure {
        Figure {
            id: "orfa-writers".into(),
            title: "One server's write throughput vs client processes (64 KiB writes)".into(),
            x_label: "client processes".into(),
            y_label: "MB/s".into(),
            log_x: true,
            log_y: false,
            series: vec![
                Series {
                    name: "dafne (unifier io server, UCX shared memory)".into(),
                    points: self.rows.iter().map(|r| (r.clients as f64, r.mb_per_s)).collect(),
                },
                Series { name: "paper (GM on Myrinet, from the text)".into(), points: PAPER_POINTS.to_vec() },
            ],
        }
    }

    /// The two rows of the headline: the most clients N, and N/2 (the
    /// paper's 184 over 92, a doubling past saturation), or the nearest
    /// count below N/2 that was measured (else the fewest). `None` with
    /// fewer than two counts.
    pub fn headline_rows(&self) -> Option<(&Row, &Row)> {
        let hi = self.rows.iter().max_by_key(|r| r.clients)?;
        let half = hi.clients / 2;
        let lo = self
            .rows
            .iter()
            .filter(|r| r.clients <= half)
            .max_by_key(|r| r.clients)
            .or_else(|| self.rows.iter().filter(|r| r.clients < hi.clients).min_by_key(|r| r.clients))?;
        Some((lo, hi))
    }

    /// Throughput at the most clients N over at N/2 (the paper's 184 / 92),
    /// with a why built from the measured columns at those two counts.
    pub fn headlines(&self) -> Vec<Headline> {
        let Some((lo, hi)) = self.headline_rows() else {
            return Vec::new();
        };
        let ratio = hi.mb_per_s / lo.mb_per_s.max(1e-9);
        vec![Headline {
            paper_text: None,
            quantity: format!("write throughput at {} clients / at {} (the paper: 184 / 92)", hi.clients, lo.clients),
            ours: ratio,
            paper: PAPER_POINTS[1].1 / PAPER_POINTS[0].1,
            unit: "×".into(),
            why: self.why(lo, hi, ratio),
        }]
    }

    /// What the columns show between `lo` and `hi` clients, and only the
    /// cause they show.
    fn why(&self, lo: &Row, hi: &Row, ratio: f64) -> String {
        let (a, b) = (lo.clients, hi.clients);
        let cols = format!(
            "from {a} to {b} clients the io server's share of a core went {:.0}% → {:.0}%, the clients' CPU per MiB \
             {:.0} → {:.0} µs, context switches per request (server / clients) {:.2} → {:.2} / {:.2} → {:.2}",
            lo.server_cpu_share * 100.0,
            hi.server_cpu_share * 100.0,
            lo.client_cpu_us_per_mib,
            hi.client_cpu_us_per_mib,
            lo.server_voluntary_switches_per_request + lo.server_involuntary_switches_per_request,
            hi.server_voluntary_switches_per_request + hi.server_involuntary_switches_per_request,
            lo.client_switches_per_request,
            hi.client_switches_per_request
        );
        let base = "no receive-buffer starvation here (the io server gets each write from the client's memory when \
                    it serves it, the paper's fix)";
        if (ratio - 1.0).abs() <= WITHIN_NOISE {
            return format!(
                "{base}; {b} clients moved {:.0} MB/s and {a} moved {:.0}: within {:.0}%, which one run per cell does \
                 not tell apart from noise on a shared machine ({cols})",
                hi.mb_per_s,
                lo.mb_per_s,
                WITHIN_NOISE * 100.0
            );
        }
        let way = if ratio < 1.0 { "fell" } else { "rose" };
        let mut cause = String::new();
        if ratio < 1.0 {
            let server_busy = hi.server_cpu_share >= SATURATED;
            let clients_dearer = hi.client_cpu_us_per_mib > lo.client_cpu_us_per_mib * (1.0 + WITHIN_NOISE);
            let preempted = hi.server_involuntary_switches_per_request
                > lo.server_involuntary_switches_per_request * (1.0 + WITHIN_NOISE) + 0.01;
            cause = match (server_busy, clients_dearer || preempted) {
                (true, _) => format!(
                    "; the server's loop thread was busy {:.0}% of the time at {b}: what runs out is its core",
                    hi.server_cpu_share * 100.0
                ),
                (false, true) => format!(
                    "; the server was not saturated ({:.0}% of a core) while {b} client processes share {} cores: \
                     what runs out is CPU for the clients and the server's turns on it (more client CPU per MiB \
                     or more preemptions of the server)",
                    hi.server_cpu_share * 100.0,
                    self.cores
                ),
                (false, false) => "; none of these columns shows what ran out".into(),
            };
        }
        format!(
            "{base}; throughput {way} {:.0}% ({:.0} → {:.0} MB/s){cause} ({cols})",
            (ratio - 1.0).abs() * 100.0,
            lo.mb_per_s,
            hi.mb_per_s
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(clients: usize, mb_per_s: f64, server_share: f64, client_cpu: f64) -> Row {
        Row {
            clients,
            bytes: 0,
            window_s: 1.0,
            start_skew_ms: 0.0,
            mb_per_s,
            mib_per_s: mb_per_s / 1.048576,
            client_min_mb_per_s: 0.0,
            client_max_mb_per_s: 0.0,
            mean_latency_us: 0.0,
            server_cpu_us_per_mib: 0.0,
            server_cpu_share: server_share,
            client_cpu_us_per_mib: client_cpu,
            server_voluntary_switches_per_request: 0.5,
            server_involuntary_switches_per_request: 0.0,
            client_switches_per_request: 1.0,
            client_rss_kib: 0,
            writebacks: 0,
            background_writebacks: 0,
            evictions: 0,
            hits: 0,
            misses: 0,
            server_bytes_got: 0,
            verified_files: clients,
            per_client: vec![],
        }
    }

    fn report(rows: Vec<Row>) -> Report {
        Report {
            machine: "m".into(),
            cores: 2,
            ucx_version: "u".into(),
            ucx_tls: UCX_TLS,
            storage: "s",
            size: 64 << 10,
            file_size: 128 << 10,
            cache_mib: 64,
            seconds_per_cell: 1.0,
            client_nice: 0,
            rows,
        }
    }

    #[test]
    fn the_headline_is_the_most_clients_over_half_as_many() {
        // 64 over 32, not over 1: the paper's 184 / 92.
        let r = report(vec![
            row(1, 100.0, 0.3, 50.0),
            row(16, 400.0, 0.8, 60.0),
            row(32, 500.0, 0.95, 60.0),
            row(64, 250.0, 0.97, 70.0),
        ]);
        let h = &r.headlines()[0];
        assert!((h.ours - 0.5).abs() < 1e-9, "{h:?}");
        assert!(h.quantity.contains("at 64 clients / at 32"), "{h:?}");
        assert!((h.paper - 163.0 / 233.0).abs() < 1e-9);
        assert!(h.why.contains("fell 50%") && h.why.contains("busy 97%"), "{}", h.why);
        assert!(h.why.contains("95% → 97%"), "{}", h.why);

        // 32 was not measured: the nearest count below it, 16.
        let r = report(vec![row(1, 100.0, 0.3, 50.0), row(16, 400.0, 0.5, 60.0), row(64, 600.0, 0.6, 60.0)]);
        let h = &r.headlines()[0];
        assert!((h.ours - 1.5).abs() < 1e-9, "{h:?}");
        assert!(h.quantity.contains("at 64 clients / at 16") && h.why.contains("rose 50%"), "{h:?}");

        // Nothing at or below N/2: the fewest below N.
        let r = report(vec![row(3, 300.0, 0.5, 60.0), row(4, 100.0, 0.5, 200.0)]);
        let h = &r.headlines()[0];
        assert!((h.ours - 1.0 / 3.0).abs() < 1e-9 && h.quantity.contains("at 4 clients / at 3"), "{h:?}");
        assert!(h.why.contains("not saturated") && !h.why.contains("busy"), "{}", h.why);

        // One count: no ratio to state.
        assert!(report(vec![row(8, 1.0, 0.1, 1.0)]).headlines().is_empty());
    }

    #[test]
    fn a_small_difference_is_called_noise_and_no_cause_is_named_without_one() {
        let r = report(vec![row(8, 500.0, 0.5, 60.0), row(16, 490.0, 0.99, 90.0)]);
        let h = &r.headlines()[0];
        assert!(h.why.contains("within 5%") && !h.why.contains("runs out"), "{}", h.why);
        // A fall with nothing in the columns to show why.
        let r = report(vec![row(8, 500.0, 0.5, 60.0), row(16, 300.0, 0.5, 60.0)]);
        let h = &r.headlines()[0];
        assert!(h.why.contains("none of these columns shows what ran out"), "{}", h.why);
    }
}
