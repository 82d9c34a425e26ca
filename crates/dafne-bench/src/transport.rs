//! The transport benchmark: server-driven put and get bandwidth and
//! request/reply latency through dafne's real request → RMA → flush → reply
//! path, beside `ucx_perftest` on the same transports and sizes.
//!
//! For each transport a real server process runs the transport's reference
//! service (`dafne_transport::testsvc`); this process is the client. A
//! client keeps `window` requests in flight; each names one client segment of
//! `size` bytes and its packed key; the server puts into it (a client read)
//! or gets from it (a client write) and replies after a flush.
//!
//! Memory: `pooled` uses the server's registered pool and UCX-allocated
//! client regions (the design's data path); `plain` makes the server move
//! bytes from/to ordinary heap memory it allocates per request and the
//! client register ordinary `Vec`s, to show what the pools buy.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use dafne_transport::testsvc::{self, SegDesc, FLAG_PLAIN, OP_ECHO, OP_GET, OP_PUT};
use dafne_transport::{Access, Client, Region, Runtime, RuntimeOptions};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::perftest;

/// A UCX transport set to benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Transport {
    Tcp,
    Shm,
    Cma,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::Tcp, Transport::Shm, Transport::Cma];

    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Shm => "shm",
            Transport::Cma => "cma",
        }
    }

    /// `UCX_*` settings (without the prefix). TCP stays on loopback; the
    /// shared-memory and cma sets keep TCP for dafne's control endpoint.
    pub fn ucx(self) -> Vec<(String, String)> {
        let tls = match self {
            Transport::Tcp => "tcp",
            Transport::Shm => "posix,sysv,cma,self,tcp",
            Transport::Cma => "cma,sysv,self,tcp",
        };
        let mut v = vec![("TLS".into(), tls.into()), ("NET_DEVICES".into(), "lo".into())];
        if self != Transport::Tcp {
            // The shared-memory FIFO every dafne process uses (its docs).
            let (k, size) = dafne_transport::SHM_FIFO;
            v.push((k.into(), size.into()));
        }
        v
    }

    pub fn parse(s: &str) -> Result<Transport> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "shm" => Ok(Transport::Shm),
            "cma" => Ok(Transport::Cma),
            _ => bail!("unknown transport {s:?}: choose among tcp, shm, cma"),
        }
    }
}

/// How to start a server process running the reference service: a program
/// and the arguments that precede the peer's own (`--ucx K=V … serve`).
#[derive(Debug, Clone)]
pub struct ServerCommand {
    pub program: PathBuf,
    pub prefix: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub transports: Vec<Transport>,
    pub sizes: Vec<usize>,
    pub window: usize,
    /// Time per bandwidth cell.
    pub duration: Duration,
    /// Echo round trips per latency cell.
    pub latency_iters: usize,
    pub with_perftest: bool,
    pub server: ServerCommand,
    /// Echo sizes of the frame authentication comparison (empty: skip it).
    pub auth_sizes: Vec<usize>,
    /// Measure only the frame authentication comparison.
    pub auth_only: bool,
}

/// One cell of the frame authentication comparison: the same echo on two
/// connections to one server, one with frame keys and one without.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuthRow {
    pub transport: Transport,
    /// Echo payload bytes (request and reply each carry this many).
    pub size: usize,
    /// `untagged` (no keys) or `blake3-128` (keys installed: every
    /// frame tagged, checked and numbered, both ways).
    pub frames: &'static str,
    /// One echo in flight.
    pub p50_us: f64,
    pub p99_us: f64,
    pub iterations: usize,
    /// Echoes per second with `window` in flight.
    pub calls_per_s: f64,
    pub window: usize,
    /// CPU time to tag a frame of this payload and check it (sender and
    /// receiver together; a round trip is two frames), one thread, no
    /// network; 0 for untagged rows.
    pub tag_and_check_us: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BwRow {
    pub transport: Transport,
    /// `put` = server puts into client memory (a read); `get` = a write.
    pub op: &'static str,
    pub memory: &'static str,
    pub size: usize,
    pub window: usize,
    pub requests: u64,
    pub mib_per_s: f64,
    pub perftest_mib_per_s: Option<f64>,
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct LatRow {
    pub transport: Transport,
    /// Busy-poll window of both ends after activity (0 = pure event loop).
    pub spin_us: u64,
    pub iterations: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub perftest_am_lat_p50_us: Option<f64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub machine: String,
    pub ucx_version: String,
    pub bandwidth: Vec<BwRow>,
    pub latency: Vec<LatRow>,
    /// What frame authentication costs (`frame_auth` rows in pairs).
    pub frame_auth: Vec<AuthRow>,
    /// Which UCX lanes carried the data endpoint, per transport.
    pub lanes: Vec<(Transport, String)>,
}

pub(crate) struct ServerProc(Child);

impl ServerProc {
    /// The server process's id (for its CPU time in `/proc`).
    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn start_server(cmd: &ServerCommand, t: Transport, spin_us: u64) -> Result<(ServerProc, SocketAddr)> {
    start_server_with(cmd, &t.ucx(), spin_us)
}

/// [`start_server`] with the `UCX_*` settings given.
pub(crate) fn start_server_with(
    cmd: &ServerCommand,
    ucx: &[(String, String)],
    spin_us: u64,
) -> Result<(ServerProc, SocketAddr)> {
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.prefix);
    for (k, v) in ucx {
        c.arg("--ucx").arg(format!("{k}={v}"));
    }
    c.args(["--spin-us", &spin_us.to_string(), "serve", "--listen", "127.0.0.1:0"]);
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting the benchmark server {:?}", cmd.program))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?).read_line(&mut line)?;
    let proc_ = ServerProc(child);
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow!("benchmark server did not start: {line:?}"))?
        .parse()?;
    Ok((proc_, addr))
}

pub(crate) fn runtime(t: Transport, spin_us: u64) -> Result<Runtime> {
    runtime_with(t, t.ucx(), spin_us)
}

/// [`runtime`] with the `UCX_*` settings given.
pub(crate) fn runtime_with(t: Transport, ucx: Vec<(String, String)>, spin_us: u64) -> Result<Runtime> {
    Ok(Runtime::new(RuntimeOptions {
        name: format!("bench-{}", t.name()),
        ucx_config: ucx,
        spin: Duration::from_micros(spin_us),
        ..Default::default()
    })?)
}

type Call = Pin<Box<dyn std::future::Future<Output = (usize, Result<Vec<u8>, dafne_transport::TransportError>)>>>;

/// Keeps `reqs.len()` requests in flight for `dur`; returns completed count
/// and elapsed time. Runs as a task on the client's loop thread, so no
/// thread hop is measured (on 2 cores an extra busy thread would be).
fn pump(rt: &Runtime, client: &Client, reqs: Vec<Vec<u8>>, dur: Duration) -> Result<(u64, Duration)> {
    let client = client.clone();
    rt.block_on_loop(move |l| async move {
        let issue = |slot: usize| -> Call {
            let f = client.call_on_loop(&l, reqs[slot].clone());
            Box::pin(async move { (slot, f.await) })
        };
        // Warm-up: two rounds.
        for _ in 0..2 {
            let mut w: FuturesUnordered<Call> = (0..reqs.len()).map(issue).collect();
            while let Some((_, r)) = w.next().await {
                testsvc::parse_reply(&r?).map_err(|e| anyhow!("server: {e}"))?;
            }
        }
        let start = Instant::now();
        let mut inflight: FuturesUnordered<Call> = (0..reqs.len()).map(issue).collect();
        let mut done = 0u64;
        while let Some((slot, r)) = inflight.next().await {
            testsvc::parse_reply(&r?).map_err(|e| anyhow!("server: {e}"))?;
            done += 1;
            if start.elapsed() < dur {
                inflight.push(issue(slot));
            }
        }
        Ok((done, start.elapsed()))
    })?
}

fn bandwidth(
    rt: &Runtime,
    client: &Client,
    op: u8,
    size: usize,
    window: usize,
    plain: bool,
    dur: Duration,
) -> Result<(u64, f64)> {
    let access = if op == OP_PUT { Access::RemoteWrite } else { Access::RemoteRead };
    let regions: Vec<Region> = (0..window)
        .map(|_| {
            if plain {
                Region::register(client.context(), vec![1u8; size], access)
            } else {
                Region::allocate(client.context(), size, access)
            }
        })
        .collect::<Result<_, _>>()?;
    let flags = if plain { FLAG_PLAIN } else { 0 };
    let reqs: Vec<Vec<u8>> = regions
        .iter()
        .map(|r| {
            let seg = SegDesc { addr: r.addr(), len: size as u64, key: r.pack_key()? };
            Ok(testsvc::encode_rma(op, flags, 0, &[seg]))
        })
        .collect::<Result<_, dafne_transport::TransportError>>()?;
    let (n, el) = pump(rt, client, reqs, dur)?;
    Ok((n, (n as f64 * size as f64) / el.as_secs_f64() / (1u64 << 20) as f64))
}

/// Round-trip times of an 8-byte echo, one in flight, measured on the
/// loop thread (the application-thread hop is a property of the caller).
fn latency(rt: &Runtime, client: &Client, iters: usize) -> Result<(f64, f64)> {
    echo_latency(rt, client, 8, iters)
}

/// [`latency`] of an echo of `size` bytes.
fn echo_latency(rt: &Runtime, client: &Client, size: usize, iters: usize) -> Result<(f64, f64)> {
    Ok(percentiles(echo_samples(rt, client, size, iters)?))
}

/// (p50, p99) of round-trip times.
fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

/// Round-trip times (µs) of `iters` echoes of `size` bytes, one in flight.
fn echo_samples(rt: &Runtime, client: &Client, size: usize, iters: usize) -> Result<Vec<f64>> {
    let client = client.clone();
    let v: Vec<f64> = rt.block_on_loop(move |l| async move {
        let mut req = vec![OP_ECHO];
        req.resize(1 + size, 0x5a);
        for _ in 0..iters / 10 + 10 {
            client.call_on_loop(&l, req.clone()).await?;
        }
        let mut v = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            client.call_on_loop(&l, req.clone()).await?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok::<_, dafne_transport::TransportError>(v)
    })??;
    Ok(v)
}

/// Rounds of the frame authentication comparison: each round measures
/// both connections back to back, so that load from elsewhere on a shared
/// machine falls on both alike.
const AUTH_ROUNDS: usize = 5;

/// The frame authentication comparison on one transport: an untagged and
/// a keyed connection to one server, from one client runtime, each size
/// measured on both alternately in [`AUTH_ROUNDS`] rounds (latency, then
/// rate with `window` in flight). Latency percentiles are over every
/// round's samples, the rate is the median round's.
fn frame_auth(o: &Options, t: Transport, progress: &mut impl FnMut(&str)) -> Result<Vec<AuthRow>> {
    let spin = 50;
    let (_srv, addr) = start_server(&o.server, t, spin)?;
    let rt = runtime(t, spin)?;
    let plain = Client::connect(&rt, addr)?;
    let keyed = Client::connect(&rt, addr)?;
    let nonce = [0x11u8; 16];
    let r = keyed.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(keyed.token(), &nonce))?;
    testsvc::parse_reply(&r).map_err(|e| anyhow!("login: {e}"))?;
    let mut rows = Vec::new();
    let modes = [("untagged", &plain), ("blake3-128", &keyed)];
    let per_round = (o.latency_iters / AUTH_ROUNDS).max(10);
    for &size in &o.auth_sizes {
        let mut samples: [Vec<f64>; 2] = Default::default();
        let mut rates: [Vec<f64>; 2] = Default::default();
        let mut req = vec![OP_ECHO];
        req.resize(1 + size, 0x5a);
        for round in 0..AUTH_ROUNDS {
            progress(&format!("{} frame authentication: {} echo, round {}", t.name(), human(size), round + 1));
            for (i, (_, client)) in modes.iter().enumerate() {
                samples[i].extend(echo_samples(&rt, client, size, per_round)?);
                let (n, el) = pump(&rt, client, vec![req.clone(); o.window], o.duration)?;
                rates[i].push(n as f64 / el.as_secs_f64());
            }
        }
        for (i, (frames, _)) in modes.iter().enumerate() {
            let (p50, p99) = percentiles(std::mem::take(&mut samples[i]));
            rates[i].sort_by(|a, b| a.total_cmp(b));
            rows.push(AuthRow {
                transport: t,
                size,
                frames,
                p50_us: p50,
                p99_us: p99,
                iterations: per_round * AUTH_ROUNDS,
                calls_per_s: rates[i][AUTH_ROUNDS / 2],
                window: o.window,
                tag_and_check_us: if i == 0 { 0.0 } else { tag_and_check(size) },
            });
        }
    }
    // Every frame of the keyed connection, pings included, verified.
    let reply = plain.call(vec![testsvc::OP_STATS])?;
    let stats = testsvc::parse_reply(&reply).map_err(|e| anyhow!("stats: {e}"))?;
    let v: serde_json::Value = serde_json::from_slice(stats)?;
    let refused = ["unauthenticated_frames", "replayed_frames"]
        .iter()
        .map(|k| v["transport"][k].as_u64().unwrap_or(0))
        .sum::<u64>();
    if refused != 0 {
        return Err(anyhow!("the server refused {refused} frames of the benchmark's own connections"));
    }
    Ok(rows)
}

/// Microseconds to seal a request frame with `size` payload bytes and
/// verify it (what sender and receiver add per frame), over ~0.2 s.
fn tag_and_check(size: usize) -> f64 {
    use dafne_transport::frame::{FrameHeader, FrameKind};
    let keys = testsvc::test_frame_keys(1, &[2; 16]);
    let payload = vec![0x5au8; size];
    let mut h = FrameHeader::new(FrameKind::Request);
    h.payload_len = size as u32;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_millis(200) {
        for _ in 0..16 {
            n += 1;
            h.seal(&keys.to_server, n, &payload);
            assert!(h.verify(&keys.to_server, &payload));
        }
    }
    start.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn lanes_summary(info: &str) -> String {
    info.lines()
        .filter(|l| l.contains("lane[") || l.contains("put[") || l.contains("rma_bw"))
        .map(|l| l.trim_start_matches('#').trim())
        .collect::<Vec<_>>()
        .join("; ")
}

fn perftest_iters(size: usize) -> usize {
    ((1usize << 31) / size).clamp(500, 200_000)
}

/// Runs the whole benchmark; `progress` is told what is being measured.
pub fn run(o: &Options, mut progress: impl FnMut(&str)) -> Result<Report> {
    let mut report = Report {
        machine: machine(),
        ucx_version: ucx_version(),
        bandwidth: vec![],
        latency: vec![],
        frame_auth: vec![],
        lanes: vec![],
    };
    let perftest_ok = o.with_perftest && perftest::available();
    for &t in &o.transports {
        if !o.auth_sizes.is_empty() {
            report.frame_auth.extend(frame_auth(o, t, &mut progress)?);
        }
        if o.auth_only {
            continue;
        }
        let spin = 50;
        let (_srv, addr) = start_server(&o.server, t, spin)?;
        let rt = runtime(t, spin)?;
        let client = Client::connect(&rt, addr)?;
        report.lanes.push((t, lanes_summary(&client.data_path_info()?)));
        for &size in &o.sizes {
            for (op, name, pt) in [(OP_PUT, "put", "ucp_put_bw"), (OP_GET, "get", "ucp_get")] {
                let reference = if perftest_ok {
                    progress(&format!("{} {name} {size} B: ucx_perftest", t.name()));
                    match perftest::run(pt, size, o.window, perftest_iters(size), &t.ucx()) {
                        Ok(r) => Some(r.mib_per_s),
                        Err(e) => {
                            progress(&format!("ucx_perftest failed: {e:#}"));
                            None
                        }
                    }
                } else {
                    None
                };
                for plain in [false, true] {
                    let memory = if plain { "plain" } else { "pooled" };
                    progress(&format!("{} {name} {size} B {memory}: dafne", t.name()));
                    let (requests, mib) = bandwidth(&rt, &client, op, size, o.window, plain, o.duration)?;
                    report.bandwidth.push(BwRow {
                        transport: t,
                        op: name,
                        memory,
                        size,
                        window: o.window,
                        requests,
                        mib_per_s: mib,
                        perftest_mib_per_s: reference,
                        ratio: reference.map(|r| mib / r),
                    });
                }
            }
        }
        drop(client);
        drop(rt);
        for spin_us in [0u64, 50] {
            progress(&format!("{} latency, spin {spin_us} µs", t.name()));
            let (_srv, addr) = start_server(&o.server, t, spin_us)?;
            let rt = runtime(t, spin_us)?;
            let client = Client::connect(&rt, addr)?;
            let (p50, p99) = latency(&rt, &client, o.latency_iters)?;
            let am = if perftest_ok && spin_us == 0 {
                perftest::run("ucp_am_lat", 8, 1, 20_000, &t.ucx()).ok().map(|r| r.p50_lat_us)
            } else {
                None
            };
            report.latency.push(LatRow {
                transport: t,
                spin_us,
                iterations: o.latency_iters,
                p50_us: p50,
                p99_us: p99,
                perftest_am_lat_p50_us: am,
            });
        }
    }
    Ok(report)
}

pub(crate) fn human(size: usize) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

impl Report {
    /// The tables as Markdown (what `dafne bench transport` prints).
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!("machine: {}\nUCX: {}\n\n", self.machine, self.ucx_version));
        s.push_str("Bandwidth (MiB/s), server-driven RMA, one segment per request\n\n");
        s.push_str(
            "| transport | op | size | window | dafne pooled | dafne plain | ucx_perftest | pooled / perftest |\n",
        );
        s.push_str("|---|---|---|---|---|---|---|---|\n");
        let mut keys: Vec<(Transport, &str, usize)> = Vec::new();
        for r in &self.bandwidth {
            if !keys.contains(&(r.transport, r.op, r.size)) {
                keys.push((r.transport, r.op, r.size));
            }
        }
        for (t, op, size) in keys {
            let find = |m: &str| {
                self.bandwidth.iter().find(|r| r.transport == t && r.op == op && r.size == size && r.memory == m)
            };
            let (p, pl) = (find("pooled"), find("plain"));
            let pt = p.and_then(|r| r.perftest_mib_per_s);
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.0} | {:.0} | {} | {} |\n",
                t.name(),
                if op == "put" { "put (read)" } else { "get (write)" },
                human(size),
                p.map(|r| r.window).unwrap_or(0),
                p.map(|r| r.mib_per_s).unwrap_or(0.0),
                pl.map(|r| r.mib_per_s).unwrap_or(0.0),
                pt.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into()),
                p.and_then(|r| r.ratio).map(|v| format!("{:.0}%", v * 100.0)).unwrap_or_else(|| "-".into()),
            ));
        }
        s.push_str("\nRequest/reply latency (8-byte echo, one in flight, µs)\n\n");
        s.push_str("| transport | spin | p50 | p99 | ucx_perftest ucp_am_lat p50 |\n|---|---|---|---|---|\n");
        for r in &self.latency {
            s.push_str(&format!(
                "| {} | {} µs | {:.1} | {:.1} | {} |\n",
                r.transport.name(),
                r.spin_us,
                r.p50_us,
                r.p99_us,
                r.perftest_am_lat_p50_us.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into())
            ));
        }
        if !self.frame_auth.is_empty() {
            s.push_str(
                "\nFrame authentication: CPU per frame (tag by the sender + check by the receiver, one thread), \
                 and an echo on one connection with frame keys and one without (same server; latency one in \
                 flight, rate with the window in flight; median of 5 alternating rounds)\n\n",
            );
            s.push_str(
                "| transport | echo | tag + check per frame | p50 untagged | p50 tagged | p99 untagged | p99 tagged | \
                 calls/s untagged | calls/s tagged | rate cost |\n|---|---|---|---|---|---|---|---|---|---|\n",
            );
            for pair in self.frame_auth.chunks(2) {
                let [u, k] = pair else { continue };
                s.push_str(&format!(
                    "| {} | {} | {:.2} µs | {:.1} µs | {:.1} µs | {:.1} µs | {:.1} µs | {:.0} | {:.0} | {:+.1}% |\n",
                    u.transport.name(),
                    human(u.size),
                    k.tag_and_check_us,
                    u.p50_us,
                    k.p50_us,
                    u.p99_us,
                    k.p99_us,
                    u.calls_per_s,
                    k.calls_per_s,
                    (k.calls_per_s / u.calls_per_s - 1.0) * 100.0,
                ));
            }
        }
        s.push_str("\nData endpoint lanes\n\n");
        for (t, l) in &self.lanes {
            s.push_str(&format!("- {}: {}\n", t.name(), l));
        }
        s
    }
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string()))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{} GiB", kb >> 20))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, {mem}, Linux {}", kernel.trim())
}

pub(crate) fn ucx_version() -> String {
    Command::new("ucx_info")
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(|l| l.trim_start_matches('#').trim().to_string()))
        .unwrap_or_else(|| "unknown".into())
}
