//! Memory registration cost, measured, and FRRWP against registering
//! first (the FRRWP paper, Ou, He and Han: its sections 2–4).
//!
//! # Why
//! The paper models the cost of registering `p` pages as `T = a·p + b`
//! (citing a = 0.77 µs/page and b = 7.42 µs on InfiniBand of 2003) and
//! argues that overlapping the client's registration with the server's
//! work (FRRWP: send the request first, register meanwhile, send the key
//! after it) saves `T_r = a·p + b` per request. Both claims depend on what
//! a registration costs *here*, with the UCX transports dafne runs on, so
//! this module measures the model's constants and the saving itself.
//!
//! 1. **The cost model**: `ucp_mem_map` of ordinary page-aligned heap memory
//!    (already faulted in), the key packed (`ucp_rkey_pack`, framed with its
//!    window by `dafne_ucx`), and `ucp_mem_unmap`, each timed separately
//!    for 1 to N pages, many repetitions (the sizes taking turns), median;
//!    a least-squares fit of
//!    `T = a·p + b` over the medians of map + pack + unmap (the paper's
//!    "registration and deregistration"), and of map alone. Per UCX
//!    transport set: the io servers' (`posix,sysv,cma,self,tcp`) and `tcp`.
//! 2. **FRRWP vs registering first**, through a real io server process:
//!    for each size, the median latency of one request from a buffer whose
//!    registration is not cached (so every request registers: the client's
//!    registration cache is bounded at 0 pinned bytes), with the key in the
//!    request (register first) or following it (FRRWP,
//!    `DataClient::set_frrwp`); and the same buffer with its registration
//!    cached, the floor neither can beat. The three take turns request by
//!    request, so that the machine's load weighs on each alike. The client and the server run as
//!    if on different hosts (`DAFNE_DATA_PATH=peer`, UCX over TCP): on one
//!    host io servers refuse keys to memory the client registered rather
//!    than allocated through UCX (`EREMOTEIO`, `dafne_io::modes`), so the
//!    registration cache, and FRRWP with it, only serve across hosts.
//!
//! Requests come from this thread (`futures::executor::block_on`), not the
//! client runtime's loop: the request frame leaves on the loop thread
//! while this thread registers, which is the overlap FRRWP is about.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use dafne_transport::{Access, Registration, Runtime, RuntimeOptions};
use serde::Serialize;

use crate::posix::median;
use crate::seed::{Figure, Headline, Series};
use crate::transport::{human, machine, ucx_version};

/// The io servers' UCX transports (`crate::io::UCX_TLS`), and TCP alone.
pub const TLS_SETS: [&str; 2] = [crate::io::UCX_TLS, "tcp"];

/// The paper's constants (its section 2.3, from Wu et al.): per page, per
/// registration (µs).
pub const PAPER_A_US: f64 = 0.77;
pub const PAPER_B_US: f64 = 7.42;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Region sizes of the cost model, in pages.
    pub pages: Vec<usize>,
    /// Repetitions per size (the median is reported).
    pub reps: usize,
    /// UCX transport sets (`UCX_TLS` values) of the cost model.
    pub tls_sets: Vec<String>,
    /// Request sizes of the latency comparison (bytes); empty: skip it.
    pub latency_sizes: Vec<usize>,
    /// Requests per size and way (the median is reported).
    pub latency_reps: usize,
    /// The `dafne` executable (servers run as `PROGRAM serve meta|io`).
    pub program: PathBuf,
    /// Where the io server keeps its data (a fresh directory inside).
    pub scratch: PathBuf,
}

impl Options {
    /// A few seconds in all.
    pub fn quick() -> Options {
        Options {
            pages: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            reps: 200,
            latency_sizes: vec![4 << 10, 64 << 10, 1 << 20],
            latency_reps: 50,
            ..Options::default()
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            pages: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            reps: 2000,
            tls_sets: TLS_SETS.iter().map(|s| s.to_string()).collect(),
            latency_sizes: vec![4 << 10, 16 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20],
            latency_reps: 1000,
            program: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("dafne")),
            scratch: std::env::temp_dir(),
        }
    }
}

/// Median cost of registering one region, per step.
#[derive(Debug, Clone, Serialize)]
pub struct RegRow {
    pub tls: String,
    pub pages: usize,
    pub bytes: usize,
    /// `ucp_mem_map` (µs, median).
    pub map_us: f64,
    /// `ucp_rkey_pack` and dafne's window frame (µs, median).
    pub pack_us: f64,
    /// `ucp_mem_unmap` (µs, median).
    pub unmap_us: f64,
    /// Median of map + pack + unmap per repetition (µs).
    pub total_us: f64,
}

/// A least-squares fit `T = a·p + b` over the rows of one transport set.
#[derive(Debug, Clone, Serialize)]
pub struct Fit {
    pub tls: String,
    /// What was fitted: "map+pack+unmap" or "map".
    pub what: &'static str,
    pub a_us_per_page: f64,
    pub b_us: f64,
    /// Coefficient of determination of the fit.
    pub r2: f64,
}

/// One size of the latency comparison.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub op: &'static str,
    pub size: usize,
    pub pages: usize,
    /// Median per request, registering first (key in the request).
    pub register_first_us: f64,
    /// Median per request, FRRWP (key following the request).
    pub frrwp_us: f64,
    /// Median per request on a cached registration (the floor).
    pub cached_us: f64,
    /// 25th and 75th percentiles per request, registering first and FRRWP:
    /// the spread the saving is judged against.
    pub register_first_iqr_us: [f64; 2],
    pub frrwp_iqr_us: [f64; 2],
    /// register_first − frrwp.
    pub saving_us: f64,
    /// The paper's saving for the same pages: 0.77·p + 7.42 (µs).
    pub paper_saving_us: f64,
    /// Requests the client sent the FRRWP way during the FRRWP cell, and
    /// those the server counted (both must equal the requests made).
    pub client_frrwp_requests: u64,
    pub server_frrwp_requests: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: String,
    pub ucx_version: String,
    pub reps: usize,
    pub registration: Vec<RegRow>,
    pub fits: Vec<Fit>,
    /// The data path of the latency comparison.
    pub latency_data_path: &'static str,
    pub latency_reps: usize,
    pub latency: Vec<LatencyRow>,
}

/// The `q`-quantile (0..=1) of `v`, interpolated between neighbours; 0
/// when empty.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let x = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (i, f) = (x.floor() as usize, x.fract());
    v[i] + (v[(i + 1).min(v.len() - 1)] - v[i]) * f
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Least squares `y = a·x + b`, with R².
pub fn fit_line(points: &[(f64, f64)]) -> (f64, f64, f64) {
    let n = points.len() as f64;
    if points.len() < 2 {
        return (0.0, points.first().map(|p| p.1).unwrap_or(0.0), 0.0);
    }
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let a = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let b = my - a * mx;
    let ss_tot: f64 = points.iter().map(|(_, y)| (y - my) * (y - my)).sum();
    let ss_res: f64 = points.iter().map(|(x, y)| (y - (a * x + b)).powi(2)).sum();
    let r2 = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 };
    (a, b, r2)
}

fn page_size() -> usize {
    rustix::param::page_size()
}

/// Page-aligned, faulted-in heap memory of `pages` pages (inside a Vec).
struct Aligned {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let page = page_size();
        let buf = vec![1u8; len + page];
        let at = (buf.as_ptr() as usize).next_multiple_of(page) - buf.as_ptr() as usize;
        Aligned { buf, at, len }
    }

    fn slice(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }

    fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

/// The cost model on one transport set.
fn cost_model(o: &Options, tls: &str, progress: &mut impl FnMut(&str)) -> Result<Vec<RegRow>> {
    let rt = Runtime::new(RuntimeOptions {
        name: "bench-registration".into(),
        ucx_config: vec![("TLS".into(), tls.into()), ("NET_DEVICES".into(), "lo".into())],
        ..Default::default()
    })
    .with_context(|| format!("a UCX context on {tls}"))?;
    let ctx = rt.context().clone();
    let page = page_size();
    progress(&format!("registration of {:?} pages on {tls}, sizes interleaved", o.pages));
    let mems: Vec<Aligned> = o.pages.iter().map(|&p| Aligned::new(p * page)).collect();
    // Per size: map, pack, unmap, total (µs). The sizes take turns,
    // repetition by repetition, so that the machine's load weighs on each
    // alike; a few unmeasured rounds first (UCX's first registration sets
    // up its caches).
    let mut t: Vec<[Vec<f64>; 4]> = o.pages.iter().map(|_| Default::default()).collect();
    for i in 0..o.reps + 10 {
        for (j, mem) in mems.iter().enumerate() {
            let t0 = Instant::now();
            let reg = Registration::covering(&ctx, mem.slice(), Access::RemoteReadWrite)
                .with_context(|| format!("registering {} pages on {tls}", o.pages[j]))?;
            let t1 = Instant::now();
            let key = reg.pack_key().context("packing a key")?;
            let t2 = Instant::now();
            drop(reg);
            let t3 = Instant::now();
            std::hint::black_box(key);
            if i >= 10 {
                for (v, d) in t[j].iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t3 - t0]) {
                    v.push(us(d));
                }
            }
        }
    }
    let rows = o
        .pages
        .iter()
        .zip(t)
        .map(|(&p, v)| RegRow {
            tls: tls.into(),
            pages: p,
            bytes: p * page,
            map_us: median(&v[0]),
            pack_us: median(&v[1]),
            unmap_us: median(&v[2]),
            total_us: median(&v[3]),
        })
        .collect();
    Ok(rows)
}

fn fits(rows: &[RegRow], tls: &str) -> Vec<Fit> {
    let of = |f: &dyn Fn(&RegRow) -> f64, what| {
        let pts: Vec<(f64, f64)> = rows.iter().filter(|r| r.tls == tls).map(|r| (r.pages as f64, f(r))).collect();
        let (a, b, r2) = fit_line(&pts);
        Fit { tls: tls.into(), what, a_us_per_page: a, b_us: b, r2 }
    };
    vec![of(&|r| r.total_us, "map+pack+unmap"), of(&|r| r.map_us, "map")]
}

/// Runs the measurements; `progress` hears what is being measured.
pub fn run(o: &Options, mut progress: impl FnMut(&str)) -> Result<Report> {
    if o.pages.is_empty() || o.pages.iter().any(|&p| p == 0 || p > 1 << 16) {
        bail!("pages: each size must be between 1 and 65536 pages");
    }
    if o.reps == 0 || o.tls_sets.is_empty() {
        bail!("at least one repetition and one transport set");
    }
    let mut registration = Vec::new();
    let mut all_fits = Vec::new();
    for tls in &o.tls_sets {
        let rows = cost_model(o, tls, &mut progress)?;
        all_fits.extend(fits(&rows, tls));
        registration.extend(rows);
    }
    let latency = if o.latency_sizes.is_empty() { Vec::new() } else { latency(o, &mut progress)? };
    Ok(Report {
        machine: machine(),
        ucx_version: ucx_version(),
        reps: o.reps,
        registration,
        fits: all_fits,
        latency_data_path: "peer (UCX over TCP, as across hosts)",
        latency_reps: o.latency_reps,
        latency,
    })
}

// ---------------------------------------------------------------------
// The latency comparison through a real io server.

/// A child process, killed on drop.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn banner(child: &mut Child, what: &str) -> Result<SocketAddr> {
    let out = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let addr = line.trim().strip_prefix("listening on ").ok_or_else(|| anyhow!("{what} did not start: {line:?}"))?;
    Ok(addr.parse()?)
}

/// `peer`: as across hosts (the io server accepts keys to registered
/// memory); else on this host's terms (the metadata server).
fn server(program: &Path, args: &[String], what: &str, peer: bool) -> Result<(Proc, SocketAddr)> {
    let mut c = Command::new(program);
    c.args(args);
    // The io servers' set, shared-memory FIFO included (crate::io::ucx).
    for (k, v) in crate::io::ucx() {
        c.arg("--ucx").arg(format!("{k}={v}"));
    }
    if std::env::var_os("DAFNE_LOG").is_none() {
        c.env("DAFNE_LOG", "warn");
    }
    c.env("DAFNE_DATA_PATH", if peer { "peer" } else { "auto" });
    let mut child = c.stdout(Stdio::piped()).spawn().with_context(|| format!("starting {what}"))?;
    let addr = banner(&mut child, what);
    let p = Proc(child);
    Ok((p, addr?))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    RegisterFirst,
    Frrwp,
    Cached,
}

fn latency(o: &Options, progress: &mut impl FnMut(&str)) -> Result<Vec<LatencyRow>> {
    use dafne_client::data::DataClient;
    use dafne_client::regcache::RegCacheConfig;
    use dafne_proto::io::Stability;

    let max = o.latency_sizes.iter().copied().max().unwrap_or(0);
    if max == 0 || max > 16 << 20 || o.latency_reps == 0 {
        bail!("latency sizes: 1 byte to 16 MiB, and at least one request per size");
    }
    let dir = o.scratch.join(format!("dafne-registration-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _cleanup = Cleanup(dir.clone());
    progress("FRRWP vs registering first: starting a metadata and an io server");
    let s = |x: &Path| x.display().to_string();
    let (_meta, meta_addr) = server(
        &o.program,
        &["serve", "meta", "--data-dir", &s(&dir.join("meta")), "--listen", "127.0.0.1:0"]
            .map(String::from)
            .into_iter()
            .chain(["--io-servers", "1", "--stripe-count", "1"].map(String::from))
            .collect::<Vec<_>>(),
        "the metadata server",
        false,
    )?;
    let secret_path = dir.join("meta").join("cluster.secret");
    let (_io, io_addr) = server(
        &o.program,
        &["serve", "io", "--data-dir", &s(&dir.join("io0")), "--listen", "127.0.0.1:0"]
            .map(String::from)
            .into_iter()
            .chain(["--secret".into(), s(&secret_path), "--cache-mib".into(), "64".into()])
            .collect::<Vec<_>>(),
        "the io server",
        true,
    )?;
    let secret = dafne_auth::Secret::load(&secret_path)?;
    let ucx = crate::io::ucx();
    let meta_rt =
        Runtime::new(RuntimeOptions { name: "bench-reg-meta".into(), ucx_config: ucx.clone(), ..Default::default() })?;
    let rt = Runtime::new(RuntimeOptions {
        name: "bench-reg-client".into(),
        ucx_config: ucx,
        data_path: dafne_transport::DataPath::PeerErrorHandling,
        ..Default::default()
    })?;
    let meta = dafne_client::MetaSession::connect(&meta_rt, meta_addr, &secret, "bench-registration", 0, 0)?;
    // Uncached: a registration cache that keeps nothing (every request
    // registers its buffer, and deregisters it when answered).
    let fresh =
        DataClient::connect_with(&rt, &[io_addr], &secret, RegCacheConfig { max_pinned: 0, ..Default::default() })?;
    let cached = DataClient::connect(&rt, &[io_addr], &secret)?;
    let hint = dafne_proto::LayoutHint { stripe_unit: 1 << 20, stripe_count: 1 };
    let a = meta
        .create_with(dafne_client::ROOT_INO, b"registration", 0o644, true, Some(hint))
        .map_err(|e| anyhow!("create: {e:?}"))?;
    let f = meta.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).map_err(|e| anyhow!("open: {e:?}"))?;
    let info_cap = dafne_client::data::info_capability(&secret);
    let server_frrwp = |d: &DataClient| -> Result<u64> {
        let i = futures::executor::block_on(d.server_info(0, info_cap)).map_err(|e| anyhow!("server info: {e:?}"))?;
        Ok(i.frrwp_requests)
    };
    let mut rows = Vec::new();
    let mut mem = Aligned::new(max);
    for &size in &o.latency_sizes {
        for op in ["write", "read"] {
            progress(&format!("{op} of {}: register first, FRRWP and cached, interleaved", human(size)));
            // The three ways take turns, request by request (rotating which
            // goes first), so that the machine's load weighs on each alike.
            const WAYS: [Way; 3] = [Way::RegisterFirst, Way::Frrwp, Way::Cached];
            let (c0, s0) = (fresh.frrwp_requests(), server_frrwp(&fresh)?);
            let mut lat: [Vec<f64>; 3] = Default::default();
            for i in 0..o.latency_reps + 5 {
                for k in 0..WAYS.len() {
                    let w = (i + k) % WAYS.len();
                    let way = WAYS[w];
                    let d = if way == Way::Cached { &cached } else { &fresh };
                    d.set_frrwp(way == Way::Frrwp);
                    let buf = &mut mem.slice_mut()[..size];
                    let t = Instant::now();
                    let r = if op == "write" {
                        futures::executor::block_on(d.write_from_registered(&f, 0, buf, Stability::Unstable))
                    } else {
                        futures::executor::block_on(d.read_into_registered(&f, 0, buf))
                    };
                    let el = t.elapsed();
                    r.map_err(|e| anyhow!("{op} of {} ({way:?}): {e:?}", human(size)))?;
                    if i >= 5 {
                        lat[w].push(us(el));
                    }
                }
            }
            fresh.set_frrwp(false);
            let (cn, sn) = (fresh.frrwp_requests() - c0, server_frrwp(&fresh)? - s0);
            // Every FRRWP-way request (warm-up included) went with its key
            // following: one server, one request each, under
            // FOLLOW_MAX_EXTENTS extents, never a cached registration.
            let made = (o.latency_reps + 5) as u64;
            if cn != made || sn != made {
                bail!(
                    "{op} of {}: {made} requests were made the FRRWP way, but the client sent {cn} with keys \
                     following and the server served {sn}: the FRRWP column would not measure FRRWP",
                    human(size)
                );
            }
            let iqr = |v: &[f64]| {
                let mut v = v.to_vec();
                [quantile(&mut v, 0.25), quantile(&mut v, 0.75)]
            };
            let (first_iqr, frrwp_iqr) = (iqr(&lat[0]), iqr(&lat[1]));
            let [first, frrwp, floor] = lat.map(|v| median(&v));
            let pages = size.div_ceil(page_size());
            rows.push(LatencyRow {
                op,
                size,
                pages,
                register_first_us: first,
                frrwp_us: frrwp,
                cached_us: floor,
                register_first_iqr_us: first_iqr,
                frrwp_iqr_us: frrwp_iqr,
                saving_us: first - frrwp,
                paper_saving_us: PAPER_A_US * pages as f64 + PAPER_B_US,
                client_frrwp_requests: cn,
                server_frrwp_requests: sn,
            });
        }
    }
    if fresh.regcache_stats().hits != 0 {
        bail!("the uncached client served a request from a cached registration: {:?}", fresh.regcache_stats());
    }
    Ok(rows)
}

struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Report {
    /// The tables as Markdown (what `dafne bench registration` prints).
    pub fn to_markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ =
            writeln!(s, "Machine: {}; UCX {}; median of {} repetitions.\n", self.machine, self.ucx_version, self.reps);
        let _ = writeln!(s, "### Registration cost (ucp_mem_map + rkey pack + ucp_mem_unmap), µs\n");
        let _ = writeln!(s, "| transports | pages | size | map | pack | unmap | total |");
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
        for r in &self.registration {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.tls,
                r.pages,
                human(r.bytes),
                r.map_us,
                r.pack_us,
                r.unmap_us,
                r.total_us
            );
        }
        let _ = writeln!(s, "\n### Fit T = a·pages + b (paper: a = {PAPER_A_US} µs/page, b = {PAPER_B_US} µs)\n");
        let _ = writeln!(s, "| transports | fitted | a (µs/page) | b (µs) | R² |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|");
        for f in &self.fits {
            let _ = writeln!(s, "| {} | {} | {:.4} | {:.2} | {:.3} |", f.tls, f.what, f.a_us_per_page, f.b_us, f.r2);
        }
        if !self.latency.is_empty() {
            let _ = writeln!(
                s,
                "\n### FRRWP vs registering first, one io server, data path {}; median of {} requests, µs\n",
                self.latency_data_path, self.latency_reps
            );
            let _ = writeln!(
                s,
                "| op | size | register first | FRRWP | saving | noise (±, half the wider IQR) | paper's T_r | cached (floor) | FRRWP requests (client/server) |"
            );
            let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
            for r in &self.latency {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {}/{} |",
                    r.op,
                    human(r.size),
                    r.register_first_us,
                    r.frrwp_us,
                    r.saving_us,
                    Self::saving_noise_us(r),
                    r.paper_saving_us,
                    r.cached_us,
                    r.client_frrwp_requests,
                    r.server_frrwp_requests
                );
            }
        }
        s
    }

    fn fit(&self, tls: &str) -> Option<&Fit> {
        self.fits.iter().find(|f| f.tls == tls && f.what == "map+pack+unmap")
    }

    /// The two figures: `frrwp-registration`, registration time vs pages
    /// (measured, the fitted line, the paper's line; log y, since the
    /// paper's line is ~10× ours), and `frrwp-latency`, request latency vs
    /// size registering first, FRRWP and on a cached registration (µs
    /// requests against ~1 µs registrations: apart, each on its own axis).
    pub fn figures(&self) -> Vec<Figure> {
        let mut series = Vec::new();
        let mut tls_sets: Vec<&str> = self.registration.iter().map(|r| r.tls.as_str()).collect();
        tls_sets.dedup();
        for tls in &tls_sets {
            let rows = || self.registration.iter().filter(|r| r.tls == *tls);
            series.push(Series {
                name: format!("{tls} (measured)"),
                points: rows().map(|r| (r.pages as f64, r.total_us)).collect(),
            });
            if let Some(f) = self.fit(tls) {
                series.push(Series {
                    name: format!("fit {:.3}·p + {:.2}, {tls}", f.a_us_per_page, f.b_us),
                    points: rows().map(|r| (r.pages as f64, f.a_us_per_page * r.pages as f64 + f.b_us)).collect(),
                });
            }
        }
        let mut xs: Vec<f64> = self.registration.iter().map(|r| r.pages as f64).collect();
        xs.sort_by(|a, b| a.total_cmp(b));
        xs.dedup();
        series.push(Series {
            name: format!("paper: {PAPER_A_US}·p + {PAPER_B_US}"),
            points: xs.iter().map(|&p| (p, PAPER_A_US * p + PAPER_B_US)).collect(),
        });
        let registration = Figure {
            id: "frrwp-registration".into(),
            title: "Registration cost (map + pack + unmap) vs pages, fit T = a·p + b, and the paper's".into(),
            x_label: "pages (4 KiB)".into(),
            y_label: "µs".into(),
            log_x: true,
            log_y: true,
            series,
        };
        let mut series = Vec::new();
        for op in ["write", "read"] {
            let rows: Vec<&LatencyRow> = self.latency.iter().filter(|r| r.op == op).collect();
            if rows.is_empty() {
                continue;
            }
            let kib = |r: &LatencyRow| r.size as f64 / 1024.0;
            for (way, f) in [
                ("register first", (|r: &LatencyRow| r.register_first_us) as fn(&LatencyRow) -> f64),
                ("FRRWP", |r| r.frrwp_us),
                ("cached registration", |r| r.cached_us),
            ] {
                series.push(Series {
                    name: format!("{op}, {way}"),
                    points: rows.iter().map(|r| (kib(r), f(r))).collect(),
                });
            }
        }
        let latency = Figure {
            id: "frrwp-latency".into(),
            title: format!(
                "Request latency (median) vs size: registering first, FRRWP, cached registration ({})",
                self.latency_data_path
            ),
            x_label: "request size (KiB)".into(),
            y_label: "µs".into(),
            log_x: true,
            log_y: true,
            series,
        };
        if self.latency.is_empty() {
            vec![registration]
        } else {
            vec![registration, latency]
        }
    }

    /// a and b against the paper's; FRRWP's saving at the largest size
    /// measured against the paper's T_r for the same pages.
    pub fn headlines(&self) -> Vec<Headline> {
        let mut h = Vec::new();
        if let Some(f) = self.fit(crate::io::UCX_TLS) {
            let map = self.fits.iter().find(|x| x.tls == f.tls && x.what == "map");
            let why = format!(
                "no NIC here: UCX {} registers ordinary memory without pinning it for a device (the fit of map \
                 alone gives a = {:.4} µs/page); the paper pinned pages and wrote them to an InfiniBand HCA",
                self.ucx_version,
                map.map(|m| m.a_us_per_page).unwrap_or(0.0)
            );
            h.push(Headline {
                paper_text: Some("0.77 µs/page (cited from its reference [18])".into()),
                quantity: format!("registration cost per page a, {} (map + pack + unmap)", f.tls),
                ours: f.a_us_per_page,
                paper: PAPER_A_US,
                unit: "µs/page".into(),
                why: why.clone(),
            });
            h.push(Headline {
                paper_text: Some("7.42 µs (cited from its reference [18])".into()),
                quantity: format!("registration cost per operation b, {} (map + pack + unmap)", f.tls),
                ours: f.b_us,
                paper: PAPER_B_US,
                unit: "µs".into(),
                why: "a system call and UCX's bookkeeping per registration, against the paper's user-kernel \
                      crossing and HCA register writes"
                    .into(),
            });
        }
        // The smallest and the largest size of each op. The paper's saving
        // is T_r + T_c: the registration it overlaps (T_r = 0.77·p + 7.42)
        // and its conditional RDMA write inside the NIC driver (T_c ≈ 14
        // µs), which dafne does not have; so ours is set beside T_r.
        for op in ["write", "read"] {
            let rows: Vec<&LatencyRow> = self.latency.iter().filter(|r| r.op == op).collect();
            let small = rows.iter().min_by_key(|r| r.size).copied();
            let large = rows.iter().max_by_key(|r| r.size).copied();
            let picked: Vec<&LatencyRow> = match (small, large) {
                (Some(a), Some(b)) if a.size != b.size => vec![a, b],
                (Some(a), _) => vec![a],
                _ => Vec::new(),
            };
            for r in picked {
                h.push(Headline {
                    paper_text: Some(format!("{:.0} µs (its registration share T_r)", r.paper_saving_us)),
                    quantity: format!("FRRWP saving per {} {op} (register first − FRRWP)", human(r.size)),
                    ours: r.saving_us,
                    paper: r.paper_saving_us,
                    unit: "µs".into(),
                    why: self.saving_why(r),
                });
            }
        }
        h
    }
}

impl Report {
    /// Half the wider interquartile range of the two ways at `r`: a saving
    /// within it is not told apart from noise (one run's medians move with
    /// the machine's load).
    pub fn saving_noise_us(r: &LatencyRow) -> f64 {
        let w = |q: [f64; 2]| (q[1] - q[0]).abs();
        w(r.register_first_iqr_us).max(w(r.frrwp_iqr_us)) / 2.0
    }

    /// Why FRRWP saved what it did at `r`, from the measured numbers: what
    /// it can save at most (the client's registration, by the fit), the
    /// saving and its noise.
    fn saving_why(&self, r: &LatencyRow) -> String {
        let reg = self.fit(crate::io::UCX_TLS).map(|f| f.a_us_per_page * r.pages as f64 + f.b_us);
        let most = match reg {
            Some(x) => format!("the client's registration, {x:.2} µs at {} pages here (the fit)", r.pages),
            None => "the client's registration (not fitted in this run)".into(),
        };
        let noise = Self::saving_noise_us(r);
        let spread = format!(
            "the middle half of the requests took {:.0}–{:.0} µs registering first, {:.0}–{:.0} µs FRRWP",
            r.register_first_iqr_us[0], r.register_first_iqr_us[1], r.frrwp_iqr_us[0], r.frrwp_iqr_us[1]
        );
        let s = r.saving_us;
        if s.abs() <= noise {
            format!(
                "FRRWP can save at most {most}; the measured {s:+.1} µs is within noise (±{noise:.1} µs, half \
                 the wider interquartile range: {spread})"
            )
        } else if s > 0.0 {
            let beyond = match reg {
                Some(x) if s > x => format!(
                    "; that is more than the registration it hides, and these figures do not show where the other \
                     {:.1} µs come from",
                    s - x
                ),
                _ => String::new(),
            };
            format!("FRRWP saved {s:.1} µs per request, beyond the noise (±{noise:.1} µs; {spread}); it can save at most {most}{beyond}")
        } else {
            format!(
                "FRRWP was {:.1} µs slower per request, beyond the noise (±{noise:.1} µs; {spread}); it can save at \
                 most {most}, and it adds a second message per request (the Keys that follow, counted on both sides)",
                -s
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_line_and_the_median_is_the_middle() {
        let pts: Vec<(f64, f64)> = [1.0, 2.0, 4.0, 8.0].iter().map(|&p| (p, 0.77 * p + 7.42)).collect();
        let (a, b, r2) = fit_line(&pts);
        assert!((a - 0.77).abs() < 1e-9 && (b - 7.42).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9, "{a} {b} {r2}");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(fit_line(&[(1.0, 5.0)]).1, 5.0);
        assert_eq!(quantile(&mut [4.0, 1.0, 3.0, 2.0, 5.0], 0.25), 2.0);
        assert_eq!(quantile(&mut [1.0, 2.0], 0.75), 1.75);
    }

    fn lat(op: &'static str, size: usize, first: f64, frrwp: f64, iqr: f64) -> LatencyRow {
        LatencyRow {
            op,
            size,
            pages: size / 4096,
            register_first_us: first,
            frrwp_us: frrwp,
            cached_us: 1.0,
            register_first_iqr_us: [first - iqr / 2.0, first + iqr / 2.0],
            frrwp_iqr_us: [frrwp - iqr / 2.0, frrwp + iqr / 2.0],
            saving_us: first - frrwp,
            paper_saving_us: PAPER_A_US * (size / 4096) as f64 + PAPER_B_US,
            client_frrwp_requests: 10,
            server_frrwp_requests: 10,
        }
    }

    fn report(latency: Vec<LatencyRow>) -> Report {
        let tls = crate::io::UCX_TLS.to_string();
        Report {
            machine: "m".into(),
            ucx_version: "u".into(),
            reps: 1,
            registration: [1, 2, 4]
                .iter()
                .map(|&p| RegRow {
                    tls: tls.clone(),
                    pages: p,
                    bytes: p * 4096,
                    map_us: 0.5,
                    pack_us: 0.1,
                    unmap_us: 0.2,
                    total_us: 0.01 * p as f64 + 1.0,
                })
                .collect(),
            fits: vec![Fit { tls, what: "map+pack+unmap", a_us_per_page: 0.01, b_us: 1.0, r2: 1.0 }],
            latency_data_path: "d",
            latency_reps: 10,
            latency,
        }
    }

    #[test]
    fn the_saving_is_register_first_minus_frrwp_judged_against_the_spread() {
        // Smallest and largest size per op; write: FRRWP 40 µs faster at
        // 1 MiB with a 20 µs IQR.
        let r = report(vec![
            lat("write", 4096, 100.0, 100.0, 20.0),
            lat("write", 1 << 20, 240.0, 200.0, 20.0),
            lat("read", 1 << 20, 200.0, 250.0, 20.0),
        ]);
        let h = r.headlines();
        assert_eq!(h.len(), 5, "a, b, the write's two sizes and the read's one");
        assert!(h[2].quantity.contains("4 KiB write") && h[2].ours.abs() < 1e-9, "{:?}", h[2]);
        assert!(h[2].paper_text.as_deref().is_some_and(|t| t.contains("T_r")), "{:?}", h[2]);
        let (w, rd) = (&h[3], &h[4]);
        assert!(w.quantity.contains("1 MiB write") && (w.ours - 40.0).abs() < 1e-9, "{w:?}");
        // The fit: 0.01·256 + 1 = 3.56 µs at most; 36.4 µs unexplained.
        assert!(w.why.contains("FRRWP saved 40.0 µs") && w.why.contains("3.56 µs"), "{}", w.why);
        assert!(w.why.contains("other 36.4 µs"), "{}", w.why);
        assert!((rd.ours + 50.0).abs() < 1e-9 && rd.why.contains("50.0 µs slower"), "{rd:?}");
        assert!(!rd.why.contains("saved"), "{}", rd.why);

        // +42.7 µs with requests spread over 200 µs: noise, not a saving.
        let r = report(vec![lat("write", 1 << 20, 642.7, 600.0, 200.0)]);
        let w = &r.headlines()[2];
        assert!(w.why.contains("+42.7 µs is within noise (±100.0 µs"), "{}", w.why);
        assert!(!w.why.contains("Keys message"), "{}", w.why);
    }

    #[test]
    fn registration_and_latency_are_two_figures() {
        let r = report(vec![lat("write", 4096, 100.0, 90.0, 1.0), lat("write", 8192, 120.0, 110.0, 1.0)]);
        let f = r.figures();
        assert_eq!(f.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(), ["frrwp-registration", "frrwp-latency"]);
        assert!(f.iter().all(|f| f.log_x && f.log_y));
        // Registration: measured, fit, paper; no request latency in it.
        assert_eq!(f[0].series.len(), 3);
        assert!(f[0].series.iter().all(|s| !s.name.contains("write")));
        assert_eq!(f[0].series[2].points[0], (1.0, PAPER_A_US + PAPER_B_US));
        // Latency: three ways of the one op measured, x in KiB.
        assert_eq!(f[1].series.len(), 3);
        assert_eq!(f[1].series[1].points, vec![(4.0, 90.0), (8.0, 110.0)]);
        assert_eq!(r.figures()[0].id, "frrwp-registration");
        assert_eq!(report(vec![]).figures().len(), 1, "no latency measured, no latency figure");
    }
}
