//! `dafne bench nbd`: block access through the NBD export against file
//! access through the client library, at the same access sizes and
//! requests in flight (seed 001's figure 15 compares MXBD's block device
//! with ORFA's file access the same way).
//!
//! # What is compared
//! * **block**: `dafne nbd serve` runs as its own process (as deployed)
//!   on a fresh cluster; this process is its NBD client over TCP on
//!   127.0.0.1 (`dafne_nbd::client`, requests pipelined: `--depth` in
//!   flight on one connection). Each byte crosses the TCP socket once and
//!   travels between the NBD server's registered buffers and the io servers
//!   by RMA.
//! * **file**: this process opens the same file with the client library
//!   and keeps `--depth` zero-copy requests in flight on a completion
//!   queue, into registered regions (no socket, no extra process).
//!
//! The block side also reports the NBD server process's CPU time per
//! request (user + system, from `/proc/PID/stat`): the relay's cost.
//!
//! Both read and write random offsets aligned to the access size over the
//! whole file, which is written once through the export first, and take
//! turns within each row (the order alternates) so load from other users of
//! a shared machine falls on both. No timing is asserted anywhere.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use dafne_client::cq::CompletionQueue;
use dafne_client::data::RegionSlice;
use dafne_nbd::client::Client;
use dafne_proto::io::Stability;
use dafne_transport::Access;
use serde::Serialize;

use crate::benchmount::ScratchCluster;

#[derive(Debug, clap::Args)]
pub struct NbdBench {
    /// Access sizes (comma-separated; K and M suffixes; at most 32M).
    #[arg(long, default_value = "4K,64K,1M", value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Requests in flight on each side.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Size of the exported file (K/M/G).
    #[arg(long, default_value = "256M")]
    pub file_size: String,
    /// A short run (0.3 s per cell, a 32 MiB file) for smoke checks.
    #[arg(long)]
    pub quick: bool,
    /// Scratch directory for the cluster (a fresh directory inside; tmpfs
    /// measures the data path rather than a disk).
    #[arg(long, default_value = "/dev/shm")]
    pub scratch: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/nbd.json")]
    pub json: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Cell {
    pub mib_s: f64,
    pub iops: f64,
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub size: usize,
    pub op: &'static str,
    pub block: Cell,
    pub file: Cell,
    /// CPU time (user + system) of the NBD server process per request.
    pub server_cpu_us_per_op: f64,
    /// block ÷ file bandwidth.
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: String,
    pub io_servers: u32,
    pub file_size: u64,
    pub depth: usize,
    pub seconds: f64,
    pub rows: Vec<Row>,
}

/// xorshift64*: offsets reproducible from run to run.
struct Offsets {
    x: u64,
    blocks: u64,
    size: u64,
}

impl Offsets {
    fn new(file: u64, size: usize, seed: u64) -> Offsets {
        Offsets { x: seed | 1, blocks: (file / size as u64).max(1), size: size as u64 }
    }
    fn next(&mut self) -> u64 {
        self.x ^= self.x >> 12;
        self.x ^= self.x << 25;
        self.x ^= self.x >> 27;
        (self.x.wrapping_mul(0x2545_F491_4F6C_DD1D) % self.blocks) * self.size
    }
}

/// The export's process; stopped (SIGTERM) when dropped.
struct ServeProcess(Child);

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&self.0), rustix::process::Signal::TERM);
        let _ = self.0.wait();
    }
}

fn cell(bytes: u64, ops: u64, secs: f64) -> Cell {
    Cell { mib_s: bytes as f64 / (1 << 20) as f64 / secs, iops: ops as f64 / secs }
}

/// `depth` NBD requests in flight for `secs`.
fn block(c: &mut Client, write: bool, size: usize, depth: usize, secs: f64, off: &mut Offsets) -> Result<Cell> {
    let payload = vec![0x5au8; size];
    let mut submit = |c: &mut Client| -> Result<()> {
        let o = off.next();
        if write {
            c.submit_write(o, &payload, false)?;
        } else {
            c.submit_read(o, size as u32)?;
        }
        Ok(())
    };
    for _ in 0..depth {
        submit(c)?;
    }
    c.send()?;
    let (start, mut ops, mut data) = (Instant::now(), 0u64, Vec::with_capacity(size));
    let until = Duration::from_secs_f64(secs);
    while start.elapsed() < until {
        let r = c.complete(&mut data)?;
        if r.error != 0 {
            bail!("the NBD server answered error {} to a {}", r.error, if write { "write" } else { "read" });
        }
        ops += 1;
        submit(c)?;
        c.send()?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    for _ in 0..depth {
        c.complete(&mut data)?;
    }
    Ok(cell(ops * size as u64, ops, elapsed))
}

/// `depth` client library requests in flight for `secs`.
fn file(
    s: &crate::copy::Session,
    f: &dafne_client::OpenFile,
    write: bool,
    size: usize,
    depth: usize,
    secs: f64,
    off: &mut Offsets,
) -> Result<Cell> {
    let regions = (0..depth)
        .map(|_| s.data.allocate(size, Access::RemoteReadWrite).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("registering {depth} buffers of {size} bytes: {e}"))?;
    let cq = CompletionQueue::new();
    let mut slot_of = HashMap::new();
    let post = |slot: usize, o: u64| {
        let into = RegionSlice { region: regions[slot].clone(), offset: 0, len: size };
        if write {
            s.data.post_write(&cq, f, o, into, Stability::Unstable)
        } else {
            s.data.post_read(&cq, f, o, into)
        }
    };
    for slot in 0..depth {
        slot_of.insert(post(slot, off.next()), slot);
    }
    let (start, mut ops) = (Instant::now(), 0u64);
    let until = Duration::from_secs_f64(secs);
    let wait = Duration::from_secs(60);
    while start.elapsed() < until {
        let (t, r) = cq.wait_any(wait).ok_or_else(|| anyhow!("no completion within {wait:?}"))?;
        r.map_err(|e| anyhow!("a client library {}: {e}", if write { "write" } else { "read" }))?;
        ops += 1;
        let slot = slot_of.remove(&t).context("a completion for an unknown ticket")?;
        slot_of.insert(post(slot, off.next()), slot);
    }
    let elapsed = start.elapsed().as_secs_f64();
    while cq.wait_any(wait).is_some() {}
    Ok(cell(ops * size as u64, ops, elapsed))
}

pub fn run(a: NbdBench, parse_size: impl Fn(&str) -> Result<usize>) -> Result<()> {
    let report = measure(&a, parse_size, |line| println!("{line}"))?;
    if let Some(dir) = a.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", a.json.display()))?;
    println!("\nJSON: {}", a.json.display());
    Ok(())
}

/// Runs the comparison and returns its report; `emit` gets the table's
/// lines as they are measured (`dafne bench nbd` prints them on stdout,
/// `dafne bench seeds` as progress on stderr).
pub fn measure(a: &NbdBench, parse_size: impl Fn(&str) -> Result<usize>, mut emit: impl FnMut(&str)) -> Result<Report> {
    let sizes = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<Vec<_>>>()?;
    if let Some(s) = sizes.iter().find(|&&s| s > dafne_nbd::proto::MAX_PAYLOAD as usize) {
        bail!("--sizes: {s} is above what one NBD request may move (32M)");
    }
    if a.depth == 0 || a.depth > 64 {
        bail!("--depth {} must be between 1 and 64", a.depth);
    }
    let (secs, file_size) = if a.quick { (0.3, 32 << 20) } else { (a.seconds, parse_size(&a.file_size)? as u64) };
    if let Some(s) = sizes.iter().find(|&&s| s as u64 > file_size) {
        bail!("--sizes: {s} is larger than --file-size {file_size}");
    }
    let root = a.scratch.join(format!("dafne-bench-nbd-{}", std::process::id()));
    let cluster = ScratchCluster::start(&root, &[])?;
    let cluster_io_servers = cluster.io_servers;
    let d = cluster.dir.display().to_string();
    let exe = std::env::current_exe().context("locating the dafne executable")?;
    let mut child = Command::new(exe)
        .args(["nbd", "serve", "--dir", &d, "--file", "/bench.raw", "--listen", "127.0.0.1:0"])
        .args(["--size", &file_size.to_string(), "--workers", &a.depth.max(1).to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting dafne nbd serve")?;
    let out = child.stdout.take().context("the server's stdout")?;
    let server_pid = child.id();
    let serve = ServeProcess(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let uri = line.trim().rsplit(" at ").next().unwrap_or_default().to_string();
    let addr = uri
        .strip_prefix("nbd://")
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow!("dafne nbd serve did not print its address: {line:?}"))?;
    let mut c = Client::connect_tcp(addr, "dafne").context("connecting to the export")?;
    // Written once, so reads move data (1 MiB writes, 8 in flight).
    let unit = 1usize << 20;
    let chunk = vec![0xa5u8; unit];
    let mut at = 0u64;
    while at < file_size {
        let mut n = 0;
        while n < 8 && at < file_size {
            let len = unit.min((file_size - at) as usize);
            c.submit_write(at, &chunk[..len], false)?;
            at += len as u64;
            n += 1;
        }
        c.send()?;
        for _ in 0..n {
            c.complete(&mut Vec::new())?;
        }
    }
    let s = crate::copy::connect(&cluster.dir, "bench-nbd", None)?;
    let attr = s.meta.resolve("/bench.raw").map_err(|e| anyhow!("resolving /bench.raw: {e}"))?;
    let f = s
        .meta
        .open(attr.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE)
        .map_err(|e| anyhow!("opening /bench.raw: {e}"))?;

    let machine = dafne_bench::transport::machine();
    emit(&format!("machine: {machine}"));
    emit(&format!(
        "cluster: `dafne up` defaults ({} io servers) on {}; file {} MiB; {} requests in flight; {secs} s per cell",
        cluster.io_servers,
        a.scratch.display(),
        file_size >> 20,
        a.depth
    ));
    emit("block: NBD over TCP to `dafne nbd serve`; file: client library, zero-copy, completion queue\n");
    emit(&format!(
        "{:>6} {:>5} | {:>10} {:>9} {:>9} | {:>10} {:>9} | {:>10}",
        "size", "op", "block MiB/s", "IOPS", "srv µs/op", "file MiB/s", "IOPS", "block/file"
    ));
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        for (j, (op, write)) in [("read", false), ("write", true)].into_iter().enumerate() {
            let seed = (i * 2 + j) as u64 + 1;
            let (mut ob, mut of) = (Offsets::new(file_size, size, seed), Offsets::new(file_size, size, seed));
            let mut timed_block = |c: &mut Client| -> Result<(Cell, f64)> {
                let cpu0 = dafne_bench::posix::process_cpu_seconds(server_pid)?;
                let b = block(c, write, size, a.depth, secs, &mut ob)?;
                let cpu = dafne_bench::posix::process_cpu_seconds(server_pid)? - cpu0;
                let per_op = cpu * 1e6 / (b.iops * secs).max(1.0);
                Ok((b, per_op))
            };
            let ((b, cpu), fl) = if (i + j) % 2 == 0 {
                let b = timed_block(&mut c)?;
                (b, file(&s, &f, write, size, a.depth, secs, &mut of)?)
            } else {
                let fl = file(&s, &f, write, size, a.depth, secs, &mut of)?;
                (timed_block(&mut c)?, fl)
            };
            let ratio = b.mib_s / fl.mib_s.max(1e-9);
            emit(&format!(
                "{:>6} {:>5} | {:>11.1} {:>9.0} {:>9.1} | {:>10.1} {:>9.0} | {:>10.2}",
                human(size),
                op,
                b.mib_s,
                b.iops,
                cpu,
                fl.mib_s,
                fl.iops,
                ratio
            ));
            rows.push(Row { size, op, block: b, file: fl, server_cpu_us_per_op: cpu, ratio });
        }
    }
    let _ = s.meta.close(f.layout.object_id);
    let _ = c.disconnect();
    drop(serve);
    drop(cluster);
    Ok(Report { machine, io_servers: cluster_io_servers, file_size, depth: a.depth, seconds: secs, rows })
}

fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}
