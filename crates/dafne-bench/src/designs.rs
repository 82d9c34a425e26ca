//! The NFS/RDMA designs experiment (issue 14, the OpenSolaris NFS over
//! RDMA seed): multi-threaded read bandwidth of 128 KiB records under the
//! Read-Read and the Read-Write design, with the CPU time each costs, and
//! the impact of the client's registration cache.
//!
//! # Why
//! The seed reports that with IOzone threads reading 128 KiB records both
//! designs saturate near 350 MB/s, the Read-Write design "slightly better"
//! and with less CPU (fewer copies), and that a buffer registration cache
//! lifts the bandwidth from ~350 to ~700 MB/s. dafne is a Read-Write design
//! (DESIGN.md: the server puts into the client's registered segment and
//! replies) with a client registration cache (`dafne_client::regcache`), so
//! this measures both choices with dafne's own transport, end to end
//! through a real server process.
//!
//! # What runs
//! A server process runs the transport's reference service
//! (`dafne_transport::testsvc`); this process is the client. A "thread" is
//! one request stream with one buffer of its own, issuing its next read
//! when its last one ends (IOzone's threads; here tasks on the client's
//! loop thread, so the count is the reads in flight).
//! * **RW** (Read-Write): the client names its segment and packed key
//!   (`OP_PUT`); the server puts the record into it from its registered
//!   pool, flushes, replies. The segment's registration comes from a
//!   [`RegCache`], so after the first read each read is a cache hit.
//! * **RW no cache**: the same, but the client registers its buffer
//!   (`ucp_mem_map` + key pack) for every read and deregisters it after the
//!   reply, as an NFS/RDMA client without the cache does.
//! * **RR** (Read-Read): the client asks (`OP_RR_READ`); the server leases
//!   a buffer of its registered read pool and answers its address and key;
//!   the client RMA-gets the record (client-driven, `Client::get_on_loop`),
//!   then sends `OP_RR_DONE` so the server may reuse the buffer. The pool
//!   is bounded; a read waits while every buffer is leased. DONE is not
//!   waited for before the thread's next read (it travels beside it), as
//!   the one-way RDMA_DONE of NFS/RDMA. The client's destination buffer is
//!   registered once.
//! * **RR no cache**: the same, registering the destination for every read.
//!
//! Every cell (design × threads) is measured in `rounds` rounds that take
//! the designs in turn, so load from elsewhere on a shared machine falls on
//! all alike; the bandwidth is the median round's, CPU time per MiB is over
//! all rounds: this process's (`CLOCK_PROCESS_CPUTIME_ID`, all threads) and
//! the server process's (`/proc/<pid>/stat`, utime + stime).
//!
//! With `verify`, the server fills each record with
//! `testsvc::pattern(seed, i)` for a seed per read, the client poisons its
//! buffer before each read and checks every byte after: proof that each
//! design really moved the server's data (the test does this).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use dafne_client::regcache::{RegCache, RegCacheConfig};
use dafne_transport::testsvc::{self, RrLease, SegDesc, FLAG_VERIFY, OP_PUT, RR_BUFFER_SIZE};
use dafne_transport::{Access, Client, Local as LocalMem, Region};
use dafne_ucx::Registration;
use serde::Serialize;

use crate::seed::{Figure, Headline, Series};
use crate::transport::{self, ServerCommand, Transport};

/// A read design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Design {
    /// Read-Write, client registrations cached.
    ReadWrite,
    /// Read-Write, the client's buffer registered per read.
    ReadWriteNoCache,
    /// Read-Read, client destination registered once.
    ReadRead,
    /// Read-Read, the client's destination registered per read.
    ReadReadNoCache,
}

impl Design {
    pub const ALL: [Design; 4] =
        [Design::ReadRead, Design::ReadWrite, Design::ReadWriteNoCache, Design::ReadReadNoCache];

    pub fn name(self) -> &'static str {
        match self {
            Design::ReadWrite => "RW",
            Design::ReadWriteNoCache => "RW no cache",
            Design::ReadRead => "RR",
            Design::ReadReadNoCache => "RR no cache",
        }
    }

    /// Parses a name: `rw`, `rw-nocache`, `rr`, `rr-nocache`.
    pub fn parse(s: &str) -> Result<Design> {
        match s {
            "rw" => Ok(Design::ReadWrite),
            "rw-nocache" => Ok(Design::ReadWriteNoCache),
            "rr" => Ok(Design::ReadRead),
            "rr-nocache" => Ok(Design::ReadReadNoCache),
            _ => bail!("unknown design {s:?}: choose among rr, rw, rw-nocache, rr-nocache"),
        }
    }

    fn cached(self) -> bool {
        matches!(self, Design::ReadWrite | Design::ReadRead)
    }

    fn read_read(self) -> bool {
        matches!(self, Design::ReadRead | Design::ReadReadNoCache)
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// UCX transport sets (`shm` is the io servers' set, `tcp` the closest
    /// to a network here).
    pub transports: Vec<Transport>,
    /// Reads in flight ("threads").
    pub threads: Vec<usize>,
    /// Record size (bytes), at most `testsvc::RR_BUFFER_SIZE`.
    pub record: usize,
    pub designs: Vec<Design>,
    /// Time per cell per round.
    pub duration: Duration,
    pub rounds: usize,
    /// Busy-poll window of both ends (0: pure event loop, so CPU time is
    /// work, not spinning).
    pub spin_us: u64,
    /// Fill, poison and check every record (module docs).
    pub verify: bool,
    /// `UCX_*` settings (without the prefix) added to the transport's, in
    /// both processes, e.g. `("MM_FIFO_SIZE", "256")` (docs/BENCHMARKS.md:
    /// the shared-memory set's default FIFO overflows with four or more
    /// 128 KiB reads in flight to ordinary memory).
    pub extra_ucx: Vec<(String, String)>,
    pub server: ServerCommand,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            transports: vec![Transport::Shm, Transport::Tcp],
            threads: vec![1, 2, 4, 8],
            record: 128 << 10,
            designs: Design::ALL.to_vec(),
            duration: Duration::from_millis(600),
            rounds: 3,
            spin_us: 0,
            verify: false,
            extra_ucx: Vec::new(),
            server: ServerCommand {
                program: std::env::current_exe().unwrap_or_else(|_| "dafne".into()),
                prefix: vec!["transport-peer".into()],
            },
        }
    }
}

impl Options {
    /// About 15 s: one round of 0.3 s per cell.
    pub fn quick() -> Self {
        Options { duration: Duration::from_millis(300), rounds: 1, ..Default::default() }
    }

    fn check(&self) -> Result<()> {
        if self.record == 0 || self.record > RR_BUFFER_SIZE {
            bail!("record size {} must be 1..={RR_BUFFER_SIZE} bytes (a Read-Read pool buffer)", self.record);
        }
        if self.threads.is_empty() || self.threads.iter().any(|&t| t == 0 || t > MAX_THREADS) {
            bail!("threads: each count must be 1..={MAX_THREADS}");
        }
        if self.rounds == 0 || self.transports.is_empty() || self.designs.is_empty() {
            bail!("nothing to measure: give at least one round, transport and design");
        }
        Ok(())
    }
}

/// Most threads: each may have a read and a DONE in flight, within the
/// server's 64 credits, and the Read-Read pool has `RR_BUFFERS` buffers.
pub const MAX_THREADS: usize = testsvc::RR_BUFFERS;

/// One cell: a design at a thread count on a transport.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub transport: Transport,
    pub design: Design,
    pub threads: usize,
    pub record: usize,
    /// Reads completed over all rounds.
    pub reads: u64,
    /// Median round's bandwidth.
    pub mib_per_s: f64,
    pub rounds_mib_per_s: Vec<f64>,
    /// This process's CPU time per MiB read (µs).
    pub client_cpu_us_per_mib: f64,
    /// The server process's CPU time per MiB read (µs).
    pub server_cpu_us_per_mib: f64,
    /// Memory registrations the client made (`ucp_mem_map`, UCX context
    /// counters) over all rounds.
    pub client_registrations: u64,
    /// Mean time of one of those registrations (µs; 0 if none).
    pub registration_us: f64,
    /// Bytes checked against the server's pattern (0 without `verify`).
    pub verified_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: String,
    pub ucx_version: String,
    pub record: usize,
    pub duration_s: f64,
    pub rounds: usize,
    pub spin_us: u64,
    /// `UCX_*` settings added to each transport's (`Options::extra_ucx`).
    pub extra_ucx: Vec<(String, String)>,
    pub rows: Vec<Row>,
}

/// What one cell's round measured.
#[derive(Default)]
struct Cell {
    reads: u64,
    secs: f64,
    client_cpu_ns: u64,
    server_cpu_ns: u64,
    registrations: u64,
    registration_ns: u64,
    verified: u64,
}

/// Runs the experiment (module docs).
pub fn run(o: &Options, mut progress: impl FnMut(&str)) -> Result<Report> {
    o.check()?;
    let mut rows = Vec::new();
    for &t in &o.transports {
        let ucx: Vec<(String, String)> = t.ucx().into_iter().chain(o.extra_ucx.iter().cloned()).collect();
        let (srv, addr) = transport::start_server_with(&o.server, &ucx, o.spin_us)?;
        let rt = transport::runtime_with(t, ucx, o.spin_us)?;
        let client =
            Client::connect(&rt, addr).with_context(|| format!("connecting to the server over {}", t.name()))?;
        let cache = Arc::new(RegCache::new(client.context(), RegCacheConfig::default()));
        progress(&format!("{}: warm-up", t.name()));
        for &d in &o.designs {
            cell(&rt, &client, &cache, d, 1, o.record, o.verify, Duration::from_millis(50), srv.pid())?;
        }
        for &n in &o.threads {
            let mut cells: Vec<Vec<Cell>> = o.designs.iter().map(|_| Vec::new()).collect();
            for round in 0..o.rounds {
                progress(&format!("{}: {n} threads, round {}", t.name(), round + 1));
                for (i, &d) in o.designs.iter().enumerate() {
                    let c = cell(&rt, &client, &cache, d, n, o.record, o.verify, o.duration, srv.pid())
                        .with_context(|| format!("{} over {}, {n} threads", d.name(), t.name()))?;
                    cells[i].push(c);
                }
            }
            for (&d, cs) in o.designs.iter().zip(cells) {
                rows.push(row(t, d, n, o.record, &cs));
            }
        }
        drop(client);
        drop(rt);
        drop(srv);
    }
    Ok(Report {
        machine: transport::machine(),
        ucx_version: transport::ucx_version(),
        record: o.record,
        duration_s: o.duration.as_secs_f64(),
        rounds: o.rounds,
        spin_us: o.spin_us,
        extra_ucx: o.extra_ucx.clone(),
        rows,
    })
}

fn row(t: Transport, d: Design, threads: usize, record: usize, cs: &[Cell]) -> Row {
    let reads: u64 = cs.iter().map(|c| c.reads).sum();
    let mib = (reads as f64 * record as f64 / (1u64 << 20) as f64).max(1e-9);
    let mut bw: Vec<f64> =
        cs.iter().map(|c| c.reads as f64 * record as f64 / (1u64 << 20) as f64 / c.secs.max(1e-9)).collect();
    let rounds_mib_per_s = bw.clone();
    bw.sort_by(|a, b| a.total_cmp(b));
    let regs: u64 = cs.iter().map(|c| c.registrations).sum();
    let reg_ns: u64 = cs.iter().map(|c| c.registration_ns).sum();
    Row {
        transport: t,
        design: d,
        threads,
        record,
        reads,
        mib_per_s: bw.get(bw.len() / 2).copied().unwrap_or(0.0),
        rounds_mib_per_s,
        client_cpu_us_per_mib: cs.iter().map(|c| c.client_cpu_ns).sum::<u64>() as f64 / 1e3 / mib,
        server_cpu_us_per_mib: cs.iter().map(|c| c.server_cpu_ns).sum::<u64>() as f64 / 1e3 / mib,
        client_registrations: regs,
        registration_us: if regs == 0 { 0.0 } else { reg_ns as f64 / 1e3 / regs as f64 },
        verified_bytes: cs.iter().map(|c| c.verified).sum(),
    }
}

/// CPU time of this process so far (all threads), in ns.
fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time (user + system) of process `pid` so far, in ns, from
/// `/proc/<pid>/stat` (clock-tick resolution).
fn server_cpu_ns(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading the server's /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field
    // 3 (state); utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| anyhow!("malformed /proc/{pid}/stat"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        f.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| anyhow!("malformed /proc/{pid}/stat field {}", i + 3))
    };
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Ok((ticks(11)? + ticks(12)?) * 1_000_000_000 / hz)
}

/// Measures one design with `threads` read streams for `dur`.
#[allow(clippy::too_many_arguments)]
fn cell(
    rt: &dafne_transport::Runtime,
    client: &Client,
    cache: &Arc<RegCache>,
    d: Design,
    threads: usize,
    record: usize,
    verify: bool,
    dur: Duration,
    server_pid: u32,
) -> Result<Cell> {
    let stats0 = client.context().stats().snapshot();
    let (cpu0, scpu0) = (process_cpu_ns(), server_cpu_ns(server_pid)?);
    let (client2, cache2) = (client.clone(), cache.clone());
    let start = Instant::now();
    let results = rt.block_on_loop(move |l| async move {
        let until = Instant::now() + dur;
        let workers = (0..threads).map(|i| {
            let (l, client, cache) = (l.clone(), client2.clone(), cache2.clone());
            async move {
                let s = Stream { l, client, cache, record, verify, thread: i as u64, until };
                if d.read_read() {
                    s.read_read(d.cached()).await
                } else {
                    s.read_write(d.cached()).await
                }
            }
        });
        futures::future::join_all(workers).await
    })?;
    let secs = start.elapsed().as_secs_f64();
    let (cpu1, scpu1) = (process_cpu_ns(), server_cpu_ns(server_pid)?);
    let stats1 = client.context().stats().snapshot();
    let mut c = Cell {
        secs,
        client_cpu_ns: cpu1.saturating_sub(cpu0),
        server_cpu_ns: scpu1.saturating_sub(scpu0),
        registrations: stats1.registrations - stats0.registrations,
        registration_ns: stats1.registration_ns - stats0.registration_ns,
        ..Default::default()
    };
    for r in results {
        let (reads, verified) = r?;
        c.reads += reads;
        c.verified += verified;
    }
    Ok(c)
}

/// What a client buffer holds before a verified read (not a pattern byte
/// run: the pattern differs from it at every seed within a few bytes).
const POISON: u8 = 0xee;

/// One "thread": reads records one after the other until `until`.
struct Stream {
    l: std::rc::Rc<dafne_transport::LoopLocal>,
    client: Client,
    cache: Arc<RegCache>,
    record: usize,
    verify: bool,
    thread: u64,
    until: Instant,
}

/// Checks `buf` against the server's pattern for `seed`.
fn check(buf: &[u8], seed: u64, what: &str) -> Result<()> {
    match buf.iter().enumerate().find(|&(i, &b)| b != testsvc::pattern(seed, i as u64)) {
        Some((i, &b)) => bail!(
            "{what}: byte {i} of the record read is {b:#04x}, the server wrote {:#04x}",
            testsvc::pattern(seed, i as u64)
        ),
        None => Ok(()),
    }
}

impl Stream {
    fn flags(&self) -> u8 {
        if self.verify {
            FLAG_VERIFY
        } else {
            0
        }
    }

    fn seed(&self, n: u64) -> u64 {
        (self.thread << 40) | n
    }

    /// Read-Write: the server puts into our segment. Returns (reads,
    /// verified bytes).
    async fn read_write(&self, cached: bool) -> Result<(u64, u64)> {
        let mut buf = vec![0u8; self.record];
        let (mut n, mut verified) = (0u64, 0u64);
        while Instant::now() < self.until {
            let seed = self.seed(n);
            if self.verify {
                buf.fill(POISON);
            }
            // Held until the reply: the server may put while we hold it.
            let (key, held_cached, held_own) = if cached {
                let r = self.cache.get(&buf)?;
                (r.key().to_vec(), Some(r), None)
            } else {
                let r = Registration::covering(self.client.context(), &buf, Access::RemoteWrite)
                    .context("registering the read buffer")?;
                (r.pack_key().context("packing the read buffer's key")?, None, Some(r))
            };
            let seg = SegDesc { addr: buf.as_ptr() as u64, len: self.record as u64, key };
            let reply =
                self.client.call_on_loop(&self.l, testsvc::encode_rma(OP_PUT, self.flags(), seed, &[seg])).await;
            testsvc::parse_reply(&reply?).map_err(|e| anyhow!("server: {e}"))?;
            drop((held_cached, held_own));
            if self.verify {
                check(&buf, seed, "RW")?;
                verified += self.record as u64;
            }
            n += 1;
        }
        Ok((n, verified))
    }

    /// Read-Read: lease, get, done. Returns (reads, verified bytes).
    async fn read_read(&self, cached: bool) -> Result<(u64, u64)> {
        let ctx = self.client.context().clone();
        let mut kept: Option<Arc<Region>> =
            if cached { Some(Arc::new(Region::register(&ctx, vec![0u8; self.record], Access::Local)?)) } else { None };
        let mut spare: Option<Vec<u8>> = if cached { None } else { Some(vec![0u8; self.record]) };
        let mut done: Option<std::pin::Pin<Box<dyn std::future::Future<Output = _>>>> = None;
        let (mut n, mut verified) = (0u64, 0u64);
        while Instant::now() < self.until {
            let seed = self.seed(n);
            let read =
                self.client.call_on_loop(&self.l, testsvc::encode_rr_read(self.flags(), seed, self.record as u64));
            // The last read's DONE travels beside this read.
            let reply = match done.take() {
                Some(d) => {
                    let (r, dr) = futures::future::join(read, d).await;
                    done_ok(dr)?;
                    r
                }
                None => read.await,
            };
            let lease = RrLease::decode(testsvc::parse_reply(&reply?).map_err(|e| anyhow!("server: {e}"))?)
                .map_err(|e| anyhow!("server's lease: {e}"))?;
            if lease.len != self.record as u64 {
                bail!("server leased {} bytes for a {}-byte read", lease.len, self.record);
            }
            let mut dest = match kept.take() {
                Some(r) => r,
                None => {
                    let v = spare.take().ok_or_else(|| anyhow!("read buffer lost"))?;
                    Arc::new(Region::register(&ctx, v, Access::Local).context("registering the read buffer")?)
                }
            };
            if self.verify {
                Arc::get_mut(&mut dest).ok_or_else(|| anyhow!("read buffer still shared"))?.as_mut_slice().fill(POISON);
            }
            let local = LocalMem::Region { region: dest.clone(), offset: 0, len: self.record };
            let got = self.client.get_on_loop(&self.l, local, lease.addr, &lease.key).await;
            done = Some(Box::pin(self.client.call_on_loop(&self.l, testsvc::encode_rr_done(lease.id))));
            got.context("reading the server's buffer")?;
            if self.verify {
                check(&dest.as_slice()[..self.record], seed, "RR")?;
                verified += self.record as u64;
            }
            if cached {
                kept = Some(dest);
            } else {
                let region = Arc::try_unwrap(dest).map_err(|_| anyhow!("read buffer still shared"))?;
                spare = Some(region.into_vec().ok_or_else(|| anyhow!("read buffer not returned"))?);
            }
            n += 1;
        }
        if let Some(d) = done {
            done_ok(d.await)?;
        }
        Ok((n, verified))
    }
}

fn done_ok(r: Result<Vec<u8>, dafne_transport::TransportError>) -> Result<()> {
    testsvc::parse_reply(&r?).map(|_| ()).map_err(|e| anyhow!("server refused DONE: {e}"))
}

impl Report {
    fn find(&self, t: Transport, d: Design, threads: usize) -> Option<&Row> {
        self.rows.iter().find(|r| r.transport == t && r.design == d && r.threads == threads)
    }

    fn transports(&self) -> Vec<Transport> {
        let mut v: Vec<Transport> = Vec::new();
        for r in &self.rows {
            if !v.contains(&r.transport) {
                v.push(r.transport);
            }
        }
        v
    }

    fn designs(&self) -> Vec<Design> {
        Design::ALL.into_iter().filter(|&d| self.rows.iter().any(|r| r.design == d)).collect()
    }

    fn threads(&self, t: Transport) -> Vec<usize> {
        let mut v: Vec<usize> = self.rows.iter().filter(|r| r.transport == t).map(|r| r.threads).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// What to add to a headline's `why` when the Read-Write bandwidth at
    /// `n` threads collapsed below a quarter of its one-thread value on
    /// the shared-memory set without a larger FIFO: the known cause
    /// (docs/BENCHMARKS.md), not a property of the design.
    fn collapse_note(&self, t: Transport, n: usize) -> String {
        let first = self.threads(t).first().copied().unwrap_or(n);
        let bw = |k| self.find(t, Design::ReadWrite, k).map_or(0.0, |r| r.mib_per_s);
        let fifo_set = self.extra_ucx.iter().any(|(k, _)| k == "MM_FIFO_SIZE");
        if t == Transport::Shm && !fifo_set && bw(n) < bw(first) / 4.0 {
            format!(
                "; at {n} threads RW fell to {:.0} MiB/s from {:.0} at {first}: with 4 or more 128 KiB RMAs in flight \
                 to ordinary memory the posix/sysv FIFO (UCX_MM_FIFO_SIZE, default 64 × 8 KiB) overflows and CPU \
                 per MiB rises 30-60× on both sides; --ucx MM_FIFO_SIZE=256 removes it",
                bw(n),
                bw(first)
            )
        } else {
            String::new()
        }
    }

    /// The tables as Markdown (what `dafne bench designs` prints).
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "machine: {}\nUCX: {}\nrecord {}, {} round(s) of {:.1} s per cell, spin {} µs, extra UCX settings: {}\n",
            self.machine,
            self.ucx_version,
            transport::human(self.record),
            self.rounds,
            self.duration_s,
            self.spin_us,
            if self.extra_ucx.is_empty() {
                "none".to_string()
            } else {
                self.extra_ucx.iter().map(|(k, v)| format!("UCX_{k}={v}")).collect::<Vec<_>>().join(" ")
            }
        );
        let designs = self.designs();
        for t in self.transports() {
            s.push_str(&format!(
                "\nRead bandwidth (MiB/s, median round) over {} ({}), and CPU µs per MiB (client + server)\n\n",
                t.name(),
                t.ucx().first().map(|(_, v)| v.as_str()).unwrap_or("")
            ));
            s.push_str("| threads |");
            for d in &designs {
                s.push_str(&format!(" {} |", d.name()));
            }
            for d in &designs {
                s.push_str(&format!(" {} CPU |", d.name()));
            }
            s.push('\n');
            s.push_str(&"|---".repeat(1 + 2 * designs.len()));
            s.push_str("|\n");
            for n in self.threads(t) {
                s.push_str(&format!("| {n} |"));
                for &d in &designs {
                    match self.find(t, d, n) {
                        Some(r) => s.push_str(&format!(" {:.0} |", r.mib_per_s)),
                        None => s.push_str(" - |"),
                    }
                }
                for &d in &designs {
                    match self.find(t, d, n) {
                        Some(r) => {
                            s.push_str(&format!(" {:.0} + {:.0} |", r.client_cpu_us_per_mib, r.server_cpu_us_per_mib))
                        }
                        None => s.push_str(" - |"),
                    }
                }
                s.push('\n');
            }
            let regs: Vec<String> = designs
                .iter()
                .filter_map(|&d| {
                    let rs: Vec<&Row> = self.rows.iter().filter(|r| r.transport == t && r.design == d).collect();
                    let (regs, reads) =
                        rs.iter().fold((0u64, 0u64), |(a, b), r| (a + r.client_registrations, b + r.reads));
                    let us = rs.iter().map(|r| r.registration_us * r.client_registrations as f64).sum::<f64>()
                        / (regs.max(1) as f64);
                    (reads > 0).then(|| format!("{} {regs} for {reads} reads ({us:.1} µs each)", d.name()))
                })
                .collect();
            s.push_str(&format!("\nclient registrations: {}\n", regs.join("; ")));
        }
        s
    }

    /// Bandwidth vs threads per transport: RR, RW, RW without the cache
    /// (and RR without it when measured).
    pub fn figures(&self) -> Vec<Figure> {
        self.transports()
            .into_iter()
            .map(|t| Figure {
                id: format!("nfs-rdma-designs-{}", t.name()),
                title: format!(
                    "Read bandwidth, {} records, Read-Read vs Read-Write, with and without the registration cache ({})",
                    transport::human(self.record),
                    t.name()
                ),
                x_label: "threads (reads in flight)".into(),
                y_label: "MiB/s".into(),
                log_x: true,
                log_y: false,
                series: self
                    .designs()
                    .into_iter()
                    .map(|d| Series {
                        name: d.name().into(),
                        points: self
                            .rows
                            .iter()
                            .filter(|r| r.transport == t && r.design == d)
                            .map(|r| (r.threads as f64, r.mib_per_s))
                            .collect(),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Per transport (tcp first: the closest to a network here): RW / RR
    /// at the highest thread count, and RW with / without the cache there.
    pub fn headlines(&self) -> Vec<Headline> {
        let mut ts = self.transports();
        ts.sort_by_key(|&t| t != Transport::Tcp);
        let mut v = Vec::new();
        for t in ts {
            let Some(&n) = self.threads(t).last() else { continue };
            let rr = self.find(t, Design::ReadRead, n);
            let rw = self.find(t, Design::ReadWrite, n);
            let nc = self.find(t, Design::ReadWriteNoCache, n);
            if let (Some(rr), Some(rw)) = (rr, rw) {
                let ours = rw.mib_per_s / rr.mib_per_s.max(1e-9);
                v.push(Headline {
                    paper_text: Some("slightly better (no number given)".into()),
                    quantity: format!(
                        "RW / RR read bandwidth, {} records, {n} threads, {}",
                        transport::human(self.record),
                        t.name()
                    ),
                    ours,
                    paper: 1.0,
                    unit: "×".into(),
                    why: format!(
                        "the paper gives no number, only that both saturate near 350 MB/s with RW \"slightly better\" \
                         (1.0 stands for it); here, over {} on one host without an RDMA NIC, {}",
                        t.name(),
                        compare(("RW", rw), ("RR", rr), ours)
                    ) + &self.collapse_note(t, n),
                });
            }
            if let (Some(rw), Some(nc)) = (rw, nc) {
                let ours = rw.mib_per_s / nc.mib_per_s.max(1e-9);
                v.push(Headline {
                    paper_text: Some("350 → 700 MB/s".into()),
                    quantity: format!(
                        "RW read bandwidth with / without the client registration cache, {n} threads, {}",
                        t.name()
                    ),
                    ours,
                    paper: 2.0,
                    unit: "×".into(),
                    why: format!(
                        "paper ~700 / ~350 MB/s on InfiniBand, where registering pins pages in the HCA; here a \
                         registration (ucp_mem_map + key pack of {} on {}) costs {:.1} µs, {:.1}% of a read's \
                         time without the cache; {}",
                        transport::human(self.record),
                        t.name(),
                        nc.registration_us,
                        // A thread's read takes n records' time at the cell's bandwidth.
                        nc.registration_us / read_us(nc, self.record).max(1e-9) * 100.0,
                        compare(("with the cache", rw), ("without", nc), ours)
                    ) + &self.collapse_note(t, n),
                });
            }
        }
        v
    }
}

/// Mean time of one read of a thread in a cell (µs): `threads` reads of
/// `record` bytes are in flight at the cell's bandwidth.
fn read_us(r: &Row, record: usize) -> f64 {
    r.threads as f64 * record as f64 / (1u64 << 20) as f64 / r.mib_per_s.max(1e-9) * 1e6
}

/// Spread of a row's rounds relative to its median: (max − min) / median;
/// `None` with fewer than two rounds.
fn spread(r: &Row) -> Option<f64> {
    if r.rounds_mib_per_s.len() < 2 {
        return None;
    }
    let max = r.rounds_mib_per_s.iter().copied().fold(f64::MIN, f64::max);
    let min = r.rounds_mib_per_s.iter().copied().fold(f64::MAX, f64::min);
    Some((max - min) / r.mib_per_s.max(1e-9))
}

/// A headline's sentence on `a` / `b` (= `ratio`), from what was measured:
/// within noise when |ratio − 1| is within the wider spread of the two
/// rows' rounds; otherwise which way and by how much, and CPU per MiB
/// (client + server) named as the cause only where it moved the same way.
fn compare((an, a): (&str, &Row), (bn, b): (&str, &Row), ratio: f64) -> String {
    let cpu = |r: &Row| r.client_cpu_us_per_mib + r.server_cpu_us_per_mib;
    let bw = format!("{an} {:.0} vs {bn} {:.0} MiB/s", a.mib_per_s, b.mib_per_s);
    let cpus = format!("CPU {:.0} vs {:.0} µs/MiB (client + server)", cpu(a), cpu(b));
    let noise = match (spread(a), spread(b)) {
        (Some(x), Some(y)) => Some(x.max(y)),
        _ => None,
    };
    let diff = (ratio - 1.0).abs();
    if let Some(n) = noise.filter(|&n| diff <= n) {
        return format!(
            "{bw}: the {:.0}% difference is within this machine's noise (the rounds of a cell spread by up to \
             {:.0}%); {cpus}",
            diff * 100.0,
            n * 100.0
        );
    }
    let way = if ratio > 1.0 { "faster" } else { "slower" };
    let rounds = match noise {
        Some(n) => format!("beyond the rounds' spread of {:.0}%", n * 100.0),
        None => "one round per cell, so no spread to judge it by".into(),
    };
    // CPU per MiB explains a bandwidth difference only if the faster side
    // spent less of it (by more than the noise, or 5% without rounds).
    let margin = noise.unwrap_or(0.05);
    let (fast, slow) = if ratio > 1.0 { (a, b) } else { (b, a) };
    let cause = if cpu(fast) < cpu(slow) * (1.0 - margin) {
        format!(
            "; the faster one spent {:.0}% less CPU per MiB, and on this host the CPUs move every byte",
            (1.0 - cpu(fast) / cpu(slow).max(1e-9)) * 100.0
        )
    } else {
        "; CPU per MiB does not show why".into()
    };
    format!("{bw}: {an} is {:.0}% {way} ({rounds}); {cpus}{cause}", diff * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_accepts_the_pattern_only() {
        let seed = (3 << 40) | 17;
        let mut buf: Vec<u8> = (0..4096u64).map(|i| testsvc::pattern(seed, i)).collect();
        check(&buf, seed, "t").unwrap();
        assert!(check(&buf, seed + 1, "t").is_err(), "another read's bytes pass");
        buf[4095] ^= 1;
        assert!(check(&buf, seed, "t").unwrap_err().to_string().contains("byte 4095"));
        assert!(check(&[POISON; 64], seed, "t").is_err(), "an untouched buffer passes");
    }

    fn row(d: Design, threads: usize, rounds: &[f64], cpu: f64) -> Row {
        let mut sorted = rounds.to_vec();
        sorted.sort_by(|a, b| a.total_cmp(b));
        Row {
            transport: Transport::Tcp,
            design: d,
            threads,
            record: 128 << 10,
            reads: 1,
            mib_per_s: sorted[sorted.len() / 2],
            rounds_mib_per_s: rounds.to_vec(),
            client_cpu_us_per_mib: cpu / 2.0,
            server_cpu_us_per_mib: cpu / 2.0,
            client_registrations: 0,
            registration_us: 10.0,
            verified_bytes: 0,
        }
    }

    fn report(rows: Vec<Row>) -> Report {
        Report {
            machine: "m".into(),
            ucx_version: "u".into(),
            record: 128 << 10,
            duration_s: 1.0,
            rounds: 3,
            spin_us: 0,
            extra_ucx: vec![],
            rows,
        }
    }

    #[test]
    fn headlines_are_rw_over_rr_and_cached_over_not_at_the_most_threads() {
        use Design::*;
        let r = report(vec![
            row(ReadRead, 1, &[100.0, 100.0, 100.0], 100.0),
            row(ReadWrite, 1, &[900.0, 900.0, 900.0], 100.0),
            // At 4 threads (the most): RW 300 vs RR 200, tight rounds; RW
            // with the cache 300 vs 100 without.
            row(ReadRead, 4, &[195.0, 200.0, 205.0], 400.0),
            row(ReadWrite, 4, &[295.0, 300.0, 305.0], 200.0),
            row(ReadWriteNoCache, 4, &[99.0, 100.0, 101.0], 200.0),
        ]);
        let h = r.headlines();
        assert_eq!(h.len(), 2);
        assert!((h[0].ours - 1.5).abs() < 1e-9 && h[0].quantity.contains("4 threads"), "{:?}", h[0]);
        assert_eq!(h[0].paper_text.as_deref(), Some("slightly better (no number given)"));
        assert!(h[0].why.contains("RW is 50% faster") && h[0].why.contains("50% less CPU per MiB"), "{}", h[0].why);
        assert!((h[1].ours - 3.0).abs() < 1e-9, "{:?}", h[1]);
        assert_eq!(h[1].paper_text.as_deref(), Some("350 → 700 MB/s"));
        // Same CPU per MiB with and without the cache: no cause named.
        assert!(
            h[1].why.contains("with the cache is 200% faster") && h[1].why.contains("does not show why"),
            "{}",
            h[1].why
        );

        // RW slower than RR: the ratio is below 1 and says so.
        let r = report(vec![
            row(ReadRead, 2, &[300.0, 300.0, 300.0], 100.0),
            row(ReadWrite, 2, &[150.0, 150.0, 150.0], 100.0),
        ]);
        let h = &r.headlines()[0];
        assert!((h.ours - 0.5).abs() < 1e-9 && h.why.contains("RW is 50% slower"), "{h:?}");
    }

    #[test]
    fn a_difference_within_the_rounds_spread_is_noise() {
        use Design::*;
        // RW 1.03× RR, but RR's rounds spread by 10%.
        let r = report(vec![
            row(ReadRead, 2, &[95.0, 100.0, 105.0], 100.0),
            row(ReadWrite, 2, &[102.0, 103.0, 104.0], 100.0),
            row(ReadWriteNoCache, 2, &[99.0, 101.0, 103.0], 100.0),
        ]);
        let h = r.headlines();
        assert!(h[0].why.contains("within this machine's noise") && h[0].why.contains("up to 10%"), "{}", h[0].why);
        assert!(h[1].why.contains("within this machine's noise"), "{}", h[1].why);
        assert!(!h[0].why.contains("faster"), "{}", h[0].why);
    }

    #[test]
    fn options_are_checked() {
        let bad = [
            Options { record: 0, ..Options::quick() },
            Options { record: RR_BUFFER_SIZE + 1, ..Options::quick() },
            Options { threads: vec![0], ..Options::quick() },
            Options { threads: vec![MAX_THREADS + 1], ..Options::quick() },
            Options { rounds: 0, ..Options::quick() },
        ];
        for o in bad {
            assert!(run(&o, |_| {}).is_err());
        }
        assert!(Design::parse("rw-nocache").is_ok() && Design::parse("xx").is_err());
    }
}
