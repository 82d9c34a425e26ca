//! The DAFS experiments (seed `dafs-user-level-file-system`, figures 3, 4
//! and 6): a user-level client against the kernel path, with everything
//! that needs no cluster: the PostMark-like workload behind a small trait,
//! the cells of the bandwidth sweep, the report, its table, figures and
//! headlines. Starting the cluster and the mount, and the two paths'
//! implementations, are the `dafne` binary's job
//! (`crates/dafne/src/benchdafs.rs`).
//!
//! # Why this shape
//! The paper compares a DAFS client library in the application's process
//! (requests straight to the NIC, data by RDMA into registered buffers)
//! with NFS in the kernel. In dafne the first is the client library
//! (`dafne-client`), the second the FUSE mount, whose client is the kernel
//! plus the `dafne mount` daemon. Both reach the same servers over the same
//! transport, so what differs is only the path: a request through the
//! kernel and the daemon, or a call in-process. The client host's CPU is
//! counted as the paper counts it: everything on the client's side (this
//! process, and the FUSE daemon for the kernel path), never the servers.
//!
//! The PostMark workload is written once, over [`PostmarkFs`], and run on
//! both paths with the same seed, so the two runs make exactly the same
//! operations on the same names with the same sizes; [`PostmarkCounts`]
//! (including a digest of every byte read) must come out identical, which
//! checks both paths' data as well as their speed.

use serde::Serialize;

use crate::seed::{Figure, Headline, Series};

/// Which client a measurement went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientPath {
    /// The client library in this process, registered buffers: the io
    /// servers move the bytes by RMA straight from and into them.
    UserLevel,
    /// The client library in this process, plain buffers: small requests'
    /// bytes inline in the messages, larger ones through the library's
    /// bounce buffers (one copy). Only in the bandwidth sweep.
    UserInline,
    /// The FUSE mount (`pread`/`pwrite` on `O_DIRECT`, or `std::fs`).
    Kernel,
}

impl ClientPath {
    pub const ALL: [ClientPath; 3] = [ClientPath::UserLevel, ClientPath::UserInline, ClientPath::Kernel];

    pub fn label(self) -> &'static str {
        match self {
            ClientPath::UserLevel => "user level (client library)",
            ClientPath::UserInline => "user level, inline/copy (client library)",
            ClientPath::Kernel => "kernel path (FUSE mount)",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            ClientPath::UserLevel => "user level",
            ClientPath::UserInline => "user inline",
            ClientPath::Kernel => "kernel path",
        }
    }
}

/// Direction of a bandwidth cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Read,
    Write,
}

impl Op {
    pub fn label(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// One cell of the sweep: sequential requests of `block` bytes, one at a
/// time, for about the cell's time.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub path: ClientPath,
    pub op: Op,
    pub block: usize,
    pub requests: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// CPU seconds of this process during the cell (all its threads: the
    /// application's and the client library's).
    pub process_cpu_s: f64,
    /// CPU seconds of the FUSE daemon during the cell (near 0 for the user
    /// level, which does not go through it).
    pub daemon_cpu_s: f64,
    /// MB/s of every round of this cell; the fields above are the round
    /// with the median MB/s (the machine is shared: rounds interleave the
    /// paths, and the median drops a round that met a burst of load).
    pub rounds_mb_per_s: Vec<f64>,
}

impl Cell {
    /// The round with the median MB/s (the lower middle of an even
    /// count), with every round's MB/s recorded in it; `None` if empty.
    pub fn median_of(rounds: Vec<Cell>) -> Option<Cell> {
        let all: Vec<f64> = rounds.iter().map(Cell::mb_per_s).collect();
        let mut sorted = rounds;
        sorted.sort_by(|a, b| a.mb_per_s().total_cmp(&b.mb_per_s()));
        let mid = sorted.len().checked_sub(1)? / 2;
        let mut c = sorted.swap_remove(mid);
        c.rounds_mb_per_s = all;
        Some(c)
    }

    /// Megabytes (10⁶ bytes) per second, as the paper's figures.
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }

    /// The client host's CPU: this process and the FUSE daemon.
    pub fn host_cpu_s(&self) -> f64 {
        self.process_cpu_s + self.daemon_cpu_s
    }

    /// Client host CPU microseconds per MiB moved.
    pub fn cpu_us_per_mib(&self) -> f64 {
        self.host_cpu_s() * 1e6 / (self.bytes as f64 / (1 << 20) as f64).max(1e-12)
    }

    /// Client host CPU as a share of one core, percent (the paper's
    /// figure 4 plots utilisation).
    pub fn cpu_percent(&self) -> f64 {
        self.host_cpu_s() * 100.0 / self.seconds.max(1e-9)
    }
}

/// The PostMark-like workload's parameters (PostMark's own names).
#[derive(Debug, Clone, Serialize)]
pub struct PostmarkConfig {
    /// Files created before the transactions.
    pub files: u32,
    /// Sizes of created files and of appends, bytes, uniform in the range.
    pub min_size: u32,
    pub max_size: u32,
    pub transactions: u32,
    pub subdirectories: u32,
    /// Percent of the read-or-append halves that read (PostMark's
    /// `read_bias`, 50 by default).
    pub read_bias: u32,
    /// Percent of the create-or-delete halves that create (`create_bias`).
    pub create_bias: u32,
    pub seed: u64,
}

impl PostmarkConfig {
    /// The paper's small-file point (figure 6's left end): about 150 files
    /// averaging 4 KB, a create or delete paired with a read or append.
    pub fn paper_small_files(transactions: u32) -> PostmarkConfig {
        PostmarkConfig {
            files: 150,
            min_size: 2048,
            max_size: 6144,
            transactions,
            subdirectories: 10,
            read_bias: 50,
            create_bias: 50,
            seed: 0x00da_f5da_f5da_f500,
        }
    }

    pub fn check(&self) -> Result<(), String> {
        if self.files == 0 || self.subdirectories == 0 || self.transactions == 0 {
            return Err("PostMark needs at least one file, one subdirectory and one transaction".into());
        }
        if self.min_size == 0 || self.min_size > self.max_size {
            return Err(format!(
                "PostMark's sizes {}..{} are not a range of at least 1 byte",
                self.min_size, self.max_size
            ));
        }
        if self.read_bias > 100 || self.create_bias > 100 {
            return Err("PostMark's biases are percentages (0 to 100)".into());
        }
        Ok(())
    }
}

/// The file system operations the workload makes. Names are relative to
/// the workload's own directory: `dir` is a subdirectory's name, `name` a
/// file's name in it.
pub trait PostmarkFs {
    fn mkdir(&mut self, dir: &str) -> anyhow::Result<()>;
    fn rmdir(&mut self, dir: &str) -> anyhow::Result<()>;
    /// Creates `dir/name` (it must not exist), writes `data`, closes it.
    fn create(&mut self, dir: &str, name: &str, data: &[u8]) -> anyhow::Result<()>;
    /// Opens `dir/name`, appends `data` at its end, closes it.
    fn append(&mut self, dir: &str, name: &str, data: &[u8]) -> anyhow::Result<()>;
    /// Opens `dir/name`, reads it whole into `buf` (cleared first), closes it.
    fn read(&mut self, dir: &str, name: &str, buf: &mut Vec<u8>) -> anyhow::Result<()>;
    fn delete(&mut self, dir: &str, name: &str) -> anyhow::Result<()>;
    /// Entries left in the workload's directory.
    fn entries(&mut self) -> anyhow::Result<usize>;
}

/// What one run of the workload did: identical for the same seed on any
/// correct file system.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PostmarkCounts {
    pub creates: u64,
    pub deletes: u64,
    pub reads: u64,
    pub appends: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// FNV-1a of every byte read, in order.
    pub read_digest: u64,
    /// Entries in the workload's directory after its delete phase.
    pub entries_left: usize,
}

/// A run's counts and times.
#[derive(Debug, Clone, Serialize)]
pub struct PostmarkRun {
    pub path: ClientPath,
    /// Which round (the paths alternate, rounds from 0).
    pub round: usize,
    pub counts: PostmarkCounts,
    /// Creating the initial files.
    pub create_phase_s: f64,
    /// The transactions.
    pub transaction_phase_s: f64,
    /// Deleting what is left.
    pub delete_phase_s: f64,
    /// CPU seconds on the client host during the whole run (this process
    /// and the FUSE daemon).
    pub host_cpu_s: f64,
}

impl PostmarkRun {
    /// Transactions per second of the transaction phase (PostMark's figure).
    pub fn transactions_per_s(&self, cfg: &PostmarkConfig) -> f64 {
        cfg.transactions as f64 / self.transaction_phase_s.max(1e-9)
    }
}

/// A small deterministic generator (splitmix64): the same seed gives the
/// same workload on both paths and in every run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn percent(&mut self, p: u32) -> bool {
        self.next_u64() % 100 < p as u64
    }
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// Bytes of "random text" for creates and appends: printable, differing
/// from offset to offset, and cheap (slices of one buffer).
fn text(len: usize) -> Vec<u8> {
    let mut r = Rng::new(0x7e57);
    (0..len).map(|_| b'a' + (r.next_u64() % 26) as u8).collect()
}

/// Where each phase's time went: the workload calls this around them.
pub trait PhaseClock {
    fn now(&self) -> f64;
}

/// Wall clock from a start.
#[derive(Debug)]
pub struct WallClock(pub std::time::Instant);

impl PhaseClock for WallClock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// Runs the workload on `fs`: creates `files` files of random sizes across
/// the subdirectories, makes `transactions` transactions (each a read or
/// append of a random file paired with a create or a delete of a random
/// file), then deletes every file and subdirectory. Returns what it did
/// and the three phases' times (from `clock`). A read that does not return
/// the size the workload wrote is an error.
pub fn run_postmark(
    fs: &mut dyn PostmarkFs,
    cfg: &PostmarkConfig,
    clock: &dyn PhaseClock,
) -> anyhow::Result<(PostmarkCounts, [f64; 3])> {
    cfg.check().map_err(anyhow::Error::msg)?;
    let mut rng = Rng::new(cfg.seed);
    let source = text(2 * cfg.max_size as usize);
    let mut counts = PostmarkCounts { read_digest: 0xcbf2_9ce4_8422_2325, ..Default::default() };
    // The live files: (subdirectory, name, size). Names never repeat.
    let mut live: Vec<(u32, u64, u64)> = Vec::new();
    let mut next_name = 0u64;
    let dir_name = |d: u32| format!("s{d}");
    let file_name = |n: u64| format!("pm{n}");
    let mut buf = Vec::with_capacity(2 * cfg.max_size as usize);

    let mut create = |fs: &mut dyn PostmarkFs,
                      rng: &mut Rng,
                      live: &mut Vec<(u32, u64, u64)>,
                      counts: &mut PostmarkCounts|
     -> anyhow::Result<()> {
        let d = rng.range(0, cfg.subdirectories as u64 - 1) as u32;
        let size = rng.range(cfg.min_size as u64, cfg.max_size as u64);
        let at = rng.range(0, cfg.max_size as u64) as usize;
        let n = next_name;
        next_name += 1;
        fs.create(&dir_name(d), &file_name(n), &source[at..at + size as usize])?;
        live.push((d, n, size));
        counts.creates += 1;
        counts.bytes_written += size;
        Ok(())
    };
    let delete = |fs: &mut dyn PostmarkFs, i: usize, live: &mut Vec<(u32, u64, u64)>, counts: &mut PostmarkCounts| {
        let (d, n, _) = live.swap_remove(i);
        counts.deletes += 1;
        fs.delete(&dir_name(d), &file_name(n))
    };

    let t0 = clock.now();
    for d in 0..cfg.subdirectories {
        fs.mkdir(&dir_name(d))?;
    }
    for _ in 0..cfg.files {
        create(fs, &mut rng, &mut live, &mut counts)?;
    }
    let t1 = clock.now();
    for _ in 0..cfg.transactions {
        // Read or append a random live file.
        if !live.is_empty() {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            let (d, n, size) = live[i];
            if rng.percent(cfg.read_bias) {
                fs.read(&dir_name(d), &file_name(n), &mut buf)?;
                if buf.len() as u64 != size {
                    anyhow::bail!(
                        "{}/{} read back {} bytes, not the {size} written",
                        dir_name(d),
                        file_name(n),
                        buf.len()
                    );
                }
                counts.reads += 1;
                counts.bytes_read += size;
                counts.read_digest = fnv(counts.read_digest, &buf);
            } else {
                let len = rng.range(cfg.min_size as u64, cfg.max_size as u64);
                let at = rng.range(0, cfg.max_size as u64) as usize;
                fs.append(&dir_name(d), &file_name(n), &source[at..at + len as usize])?;
                live[i].2 += len;
                counts.appends += 1;
                counts.bytes_written += len;
            }
        }
        // Create a file or delete a random one.
        if live.is_empty() || rng.percent(cfg.create_bias) {
            create(fs, &mut rng, &mut live, &mut counts)?;
        } else {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            delete(fs, i, &mut live, &mut counts)?;
        }
    }
    let t2 = clock.now();
    while !live.is_empty() {
        delete(fs, live.len() - 1, &mut live, &mut counts)?;
    }
    for d in 0..cfg.subdirectories {
        fs.rmdir(&dir_name(d))?;
    }
    let t3 = clock.now();
    counts.entries_left = fs.entries()?;
    Ok((counts, [t1 - t0, t2 - t1, t3 - t2]))
}

/// One check that the two paths agree on bytes: a file one path wrote,
/// read back through the other.
#[derive(Debug, Clone, Serialize)]
pub struct CrossCheck {
    pub written_by: ClientPath,
    pub read_by: ClientPath,
    pub bytes: u64,
    /// The bytes read equal the bytes written.
    pub equal: bool,
}

/// Everything `dafne bench dafs` measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: String,
    pub quick: bool,
    pub io_servers: u32,
    /// `dafne mount`'s arguments (read-ahead and write-behind off: the
    /// paper's no-read-ahead configuration, every request to the servers).
    pub mount_args: Vec<String>,
    /// Bytes of each path's file in the sweep.
    pub file_size: u64,
    /// Seconds each round of a cell runs for (at least one request).
    pub cell_seconds: f64,
    /// Rounds of every cell and of PostMark on each path.
    pub rounds: usize,
    /// What "client host CPU" counts.
    pub cpu_counted: String,
    pub cells: Vec<Cell>,
    pub cross_checks: Vec<CrossCheck>,
    pub postmark: PostmarkConfig,
    pub postmark_runs: Vec<PostmarkRun>,
}

impl Report {
    pub fn cell(&self, path: ClientPath, op: Op, block: usize) -> Option<&Cell> {
        self.cells.iter().find(|c| c.path == path && c.op == op && c.block == block)
    }

    fn blocks(&self) -> Vec<usize> {
        let mut b: Vec<usize> = self.cells.iter().map(|c| c.block).collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    /// The median over rounds of PostMark's transactions/s on `path`.
    pub fn postmark_rate(&self, path: ClientPath) -> Option<f64> {
        let v: Vec<f64> = self
            .postmark_runs
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.transactions_per_s(&self.postmark))
            .collect();
        (!v.is_empty()).then(|| crate::posix::median(&v))
    }

    /// `user / kernel` of `f` on the cells at `block`.
    fn ratio(&self, op: Op, block: usize, f: impl Fn(&Cell) -> f64, kernel_over_user: bool) -> Option<f64> {
        let u = f(self.cell(ClientPath::UserLevel, op, block)?);
        let k = f(self.cell(ClientPath::Kernel, op, block)?);
        Some(if kernel_over_user { k / u } else { u / k })
    }

    /// Mean microseconds per request of a cell.
    pub fn latency_us(&self, path: ClientPath, op: Op, block: usize) -> Option<f64> {
        let c = self.cell(path, op, block)?;
        Some(c.seconds * 1e6 / c.requests.max(1) as f64)
    }

    /// User level / kernel path bandwidth of `op` at `block`.
    pub fn bandwidth_ratio(&self, op: Op, block: usize) -> Option<f64> {
        self.ratio(op, block, Cell::mb_per_s, false)
    }

    /// Kernel path / user level CPU per MiB of `op` at `block`.
    pub fn cpu_ratio(&self, op: Op, block: usize) -> Option<f64> {
        self.ratio(op, block, Cell::cpu_us_per_mib, true)
    }

    /// User level / kernel path PostMark transactions per second.
    pub fn postmark_ratio(&self) -> Option<f64> {
        Some(self.postmark_rate(ClientPath::UserLevel)? / self.postmark_rate(ClientPath::Kernel)?)
    }

    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        s += &format!(
            "machine: {}\ncluster: `dafne up` defaults ({} io servers, 64 MiB caches, data on tmpfs); \
             mount: `dafne mount {}`\n\n",
            self.machine,
            self.io_servers,
            self.mount_args.join(" ")
        );
        s += &format!(
            "Bandwidth and client CPU vs block size (figures 3-4, no read-ahead): one {} MiB file per path, \
             sequential requests one at a time, {} rounds of {:.2} s per cell, the paths interleaved; \
             each cell is its median round. User level: the client library with one \
             registered buffer (RMA); user inline: the library with a plain buffer (bytes inline in the \
             messages up to its inline limit, one copy through bounce buffers above); kernel path: \
             pread/pwrite on an O_DIRECT descriptor on the mount. \
             CPU counted: {}.\n\n",
            self.file_size >> 20,
            self.rounds,
            self.cell_seconds,
            self.cpu_counted
        );
        s += "| op | block | path | MB/s | vs kernel | CPU µs/MiB | kernel/this CPU | CPU % of a core | requests | µs/request |\n";
        s += "|---|---|---|---|---|---|---|---|---|---|\n";
        for op in [Op::Read, Op::Write] {
            for b in self.blocks() {
                let k = self.cell(ClientPath::Kernel, op, b);
                for path in ClientPath::ALL {
                    let Some(c) = self.cell(path, op, b) else { continue };
                    let (vs, cpu) = match k {
                        Some(k) => (
                            format!("{:.2}×", c.mb_per_s() / k.mb_per_s()),
                            format!("{:.2}×", k.cpu_us_per_mib() / c.cpu_us_per_mib()),
                        ),
                        None => ("-".into(), "-".into()),
                    };
                    s += &format!(
                        "| {} | {} | {} | {:.1} | {vs} | {:.0} | {cpu} | {:.0} | {} | {:.0} |\n",
                        op.label(),
                        block_label(b),
                        path.short(),
                        c.mb_per_s(),
                        c.cpu_us_per_mib(),
                        c.cpu_percent(),
                        c.requests,
                        c.seconds * 1e6 / c.requests.max(1) as f64
                    );
                }
            }
        }
        s += "\nCross-checks (each path's file read back through the other path):\n\n";
        for c in &self.cross_checks {
            s += &format!(
                "- written by the {}, read by the {}: {} bytes, {}\n",
                c.written_by.short(),
                c.read_by.short(),
                c.bytes,
                if c.equal { "equal" } else { "DIFFERENT" }
            );
        }
        let p = &self.postmark;
        s += &format!(
            "\nPostMark-like workload (figure 6, small files): {} files of {}..{} bytes in {} subdirectories, \
             {} transactions, seed {:#x}\n\n",
            p.files, p.min_size, p.max_size, p.subdirectories, p.transactions, p.seed
        );
        s += "| path | round | transactions/s | create phase s | transactions s | delete phase s | host CPU s | creates | deletes | reads | appends | entries left |\n";
        s += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
        for r in &self.postmark_runs {
            let c = &r.counts;
            s += &format!(
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |\n",
                r.path.short(),
                r.round,
                r.transactions_per_s(p),
                r.create_phase_s,
                r.transaction_phase_s,
                r.delete_phase_s,
                r.host_cpu_s,
                c.creates,
                c.deletes,
                c.reads,
                c.appends,
                c.entries_left
            );
        }
        if let Some(r) = self.postmark_ratio() {
            s += &format!("\nPostMark user level / kernel path (medians over rounds): {r:.2}×\n");
        }
        s
    }

    /// MB/s vs block size, and client CPU per MiB vs block size, both paths.
    pub fn figures(&self) -> Vec<Figure> {
        let series = |f: &dyn Fn(&Cell) -> f64| -> Vec<Series> {
            let mut out = Vec::new();
            for op in [Op::Read, Op::Write] {
                for path in ClientPath::ALL {
                    let points: Vec<(f64, f64)> = self
                        .blocks()
                        .into_iter()
                        .filter_map(|b| self.cell(path, op, b).map(|c| ((b >> 10) as f64, f(c))))
                        .collect();
                    if !points.is_empty() {
                        out.push(Series { name: format!("{} {}", path.short(), op.label()), points });
                    }
                }
            }
            out
        };
        vec![
            Figure {
                id: "dafs-bandwidth".into(),
                title: "Sequential bandwidth, one request at a time: user-level client vs kernel path".into(),
                x_label: "block size (KiB)".into(),
                y_label: "MB/s".into(),
                log_x: true,
                log_y: false,
                series: series(&Cell::mb_per_s),
            },
            Figure {
                id: "dafs-cpu".into(),
                title: "Client host CPU per MiB moved: user-level client vs kernel path".into(),
                x_label: "block size (KiB)".into(),
                y_label: "CPU µs per MiB".into(),
                log_x: true,
                // From ~100 µs/MiB at 1 MiB to tens of thousands at 4 KiB.
                log_y: true,
                series: series(&Cell::cpu_us_per_mib),
            },
        ]
    }

    /// The paper's three claims beside ours (4 KiB is the smallest block;
    /// a report without it names the smallest it has).
    pub fn headlines(&self) -> Vec<Headline> {
        let mut out = Vec::new();
        let Some(&small) = self.blocks().first() else { return out };
        let b = block_label(small);
        if let Some(r) = self.bandwidth_ratio(Op::Read, small) {
            let cells =
                (self.cell(ClientPath::UserLevel, Op::Read, small), self.cell(ClientPath::Kernel, Op::Read, small));
            let noise = match cells {
                (Some(u), Some(k)) => {
                    spread(&u.rounds_mb_per_s, u.mb_per_s()).zip(spread(&k.rounds_mb_per_s, k.mb_per_s()))
                }
                _ => None,
            }
            .map(|(a, b)| a.max(b));
            let (u_us, k_us) = (
                self.latency_us(ClientPath::UserLevel, Op::Read, small).unwrap_or(f64::NAN),
                self.latency_us(ClientPath::Kernel, Op::Read, small).unwrap_or(f64::NAN),
            );
            let times = format!("{u_us:.0} µs per {b} read at user level, {k_us:.0} µs through the mount");
            let here = match verdict(r, noise) {
                Verdict::Noise(n) => format!(
                    "the two paths are within this machine's noise ({times}; the rounds spread by up to {:.0}%)",
                    n * 100.0
                ),
                Verdict::Higher => format!(
                    "the user level is faster by {:.0}%: what it saves is the kernel's FUSE round trip and the \
                     daemon ({times})",
                    (r - 1.0) * 100.0
                ),
                Verdict::Lower => format!(
                    "the user level is slower by {:.0}% ({times}): the FUSE round trip the kernel path adds does \
                     not show, and these figures do not say what the library's path spends the time on",
                    (1.0 - r) * 100.0
                ),
            };
            out.push(Headline {
                paper_text: Some("2–3×".into()),
                quantity: format!(
                    "user level / kernel path, sequential read bandwidth at {b} (the paper's figure 3 is random)"
                ),
                ours: r,
                paper: 2.5,
                unit: "×".into(),
                why: format!(
                    "the paper gives 2–3× (DAFS over cLAN VI vs NFS over UDP/IP, 30 vs 132 µs round trips); here \
                     both paths use the same UCX transport to the same local servers, and {here}{}",
                    rounds_note(noise)
                ),
            });
        }
        if let Some(r) = self.cpu_ratio(Op::Read, small) {
            out.push(Headline {
                paper_text: None,
                quantity: format!("kernel path / user level, client CPU per MiB of sequential reads at {b}"),
                ours: r,
                paper: f64::NAN,
                unit: "×".into(),
                why: format!(
                    "the paper plots utilisation but gives no number (figure 4; the text says NFS saturates the \
                     client CPU at its peak and DAFS stays low); here the kernel path spent {:.1}× the user \
                     level's CPU per MiB, counting this process plus the FUSE daemon, servers excluded",
                    r
                ),
            });
        }
        if let Some(r) = self.postmark_ratio() {
            let rates = |p: ClientPath| -> Vec<f64> {
                self.postmark_runs
                    .iter()
                    .filter(|x| x.path == p)
                    .map(|x| x.transactions_per_s(&self.postmark))
                    .collect()
            };
            let noise = self
                .postmark_rate(ClientPath::UserLevel)
                .zip(self.postmark_rate(ClientPath::Kernel))
                .and_then(|(u, k)| spread(&rates(ClientPath::UserLevel), u).zip(spread(&rates(ClientPath::Kernel), k)))
                .map(|(a, b)| a.max(b));
            let here = match verdict(r, noise) {
                Verdict::Noise(n) => format!(
                    "here the two paths are within this machine's noise (PostMark's rounds spread by up to {:.0}%)",
                    n * 100.0
                ),
                Verdict::Higher => format!(
                    "here the user level is {:.0}% faster over the same transport and servers; the mount's calls also \
                     cross the kernel and the FUSE daemon (round trips per operation were not counted)",
                    (r - 1.0) * 100.0
                ),
                Verdict::Lower => format!(
                    "here the user level is {:.0}% slower, though the mount's calls also cross the kernel and the \
                     FUSE daemon; these figures do not say where the library's time goes",
                    (1.0 - r) * 100.0
                ),
            };
            out.push(Headline {
                paper_text: Some("more than 2×".into()),
                quantity: "user level / kernel path, PostMark transactions/s, small files".into(),
                ours: r,
                paper: 2.0,
                unit: "×".into(),
                why: format!(
                    "the paper says DAFS beats NFS-nocopy by more than 2× for small files, \"due largely to the lower \
                     latency of metadata operations\" on its network; {here}{}",
                    rounds_note(noise)
                ),
            });
        }
        out
    }
}

/// How a ratio (user level over kernel path, higher is the user level
/// ahead) compares with 1, given the rounds' relative spread.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    /// |ratio − 1| is within the spread (given).
    Noise(f64),
    Higher,
    Lower,
}

fn verdict(ratio: f64, noise: Option<f64>) -> Verdict {
    match noise {
        Some(n) if (ratio - 1.0).abs() <= n => Verdict::Noise(n),
        _ if ratio >= 1.0 => Verdict::Higher,
        _ => Verdict::Lower,
    }
}

/// (max − min) / `median` of a cell's rounds; `None` under two rounds.
fn spread(rounds: &[f64], median: f64) -> Option<f64> {
    if rounds.len() < 2 {
        return None;
    }
    let max = rounds.iter().copied().fold(f64::MIN, f64::max);
    let min = rounds.iter().copied().fold(f64::MAX, f64::min);
    Some((max - min) / median.max(1e-12))
}

/// Said when the rounds could not judge noise.
fn rounds_note(noise: Option<f64>) -> &'static str {
    match noise {
        None => " (one round: no spread to judge noise by)",
        Some(_) => "",
    }
}

pub fn block_label(b: usize) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// An in-memory file system that refuses what a real one refuses.
    #[derive(Default)]
    struct Mem {
        dirs: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    }

    impl PostmarkFs for Mem {
        fn mkdir(&mut self, dir: &str) -> anyhow::Result<()> {
            anyhow::ensure!(self.dirs.insert(dir.into(), BTreeMap::new()).is_none(), "{dir} exists");
            Ok(())
        }
        fn rmdir(&mut self, dir: &str) -> anyhow::Result<()> {
            let d = self.dirs.remove(dir).ok_or_else(|| anyhow::anyhow!("no {dir}"))?;
            anyhow::ensure!(d.is_empty(), "{dir} not empty");
            Ok(())
        }
        fn create(&mut self, dir: &str, name: &str, data: &[u8]) -> anyhow::Result<()> {
            let d = self.dirs.get_mut(dir).ok_or_else(|| anyhow::anyhow!("no {dir}"))?;
            anyhow::ensure!(d.insert(name.into(), data.to_vec()).is_none(), "{name} exists");
            Ok(())
        }
        fn append(&mut self, dir: &str, name: &str, data: &[u8]) -> anyhow::Result<()> {
            let f = self.dirs.get_mut(dir).and_then(|d| d.get_mut(name)).ok_or_else(|| anyhow::anyhow!("no {name}"))?;
            f.extend_from_slice(data);
            Ok(())
        }
        fn read(&mut self, dir: &str, name: &str, buf: &mut Vec<u8>) -> anyhow::Result<()> {
            let f = self.dirs.get(dir).and_then(|d| d.get(name)).ok_or_else(|| anyhow::anyhow!("no {name}"))?;
            buf.clear();
            buf.extend_from_slice(f);
            Ok(())
        }
        fn delete(&mut self, dir: &str, name: &str) -> anyhow::Result<()> {
            self.dirs.get_mut(dir).and_then(|d| d.remove(name)).ok_or_else(|| anyhow::anyhow!("no {name}"))?;
            Ok(())
        }
        fn entries(&mut self) -> anyhow::Result<usize> {
            Ok(self.dirs.len())
        }
    }

    struct NoClock;
    impl PhaseClock for NoClock {
        fn now(&self) -> f64 {
            0.0
        }
    }

    #[test]
    fn the_workload_is_the_same_for_a_seed_and_cleans_up() {
        let cfg = PostmarkConfig { files: 20, transactions: 300, ..PostmarkConfig::paper_small_files(0) };
        let (a, _) = run_postmark(&mut Mem::default(), &cfg, &NoClock).unwrap();
        let (b, _) = run_postmark(&mut Mem::default(), &cfg, &NoClock).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.entries_left, 0);
        assert_eq!(a.creates, a.deletes);
        assert_eq!(a.reads + a.appends, 300);
        assert!(a.reads > 100 && a.appends > 100, "{a:?}");
        assert!(a.creates > 20 && a.bytes_read > 0);
        let other = PostmarkConfig { seed: 1, ..cfg };
        let (c, _) = run_postmark(&mut Mem::default(), &other, &NoClock).unwrap();
        assert_ne!(a, c);
    }

    /// A file system that loses appends is caught by the size check.
    #[test]
    fn a_short_read_is_an_error() {
        struct Lossy(Mem);
        impl PostmarkFs for Lossy {
            fn mkdir(&mut self, d: &str) -> anyhow::Result<()> {
                self.0.mkdir(d)
            }
            fn rmdir(&mut self, d: &str) -> anyhow::Result<()> {
                self.0.rmdir(d)
            }
            fn create(&mut self, d: &str, n: &str, data: &[u8]) -> anyhow::Result<()> {
                self.0.create(d, n, data)
            }
            fn append(&mut self, _: &str, _: &str, _: &[u8]) -> anyhow::Result<()> {
                Ok(())
            }
            fn read(&mut self, d: &str, n: &str, buf: &mut Vec<u8>) -> anyhow::Result<()> {
                self.0.read(d, n, buf)
            }
            fn delete(&mut self, d: &str, n: &str) -> anyhow::Result<()> {
                self.0.delete(d, n)
            }
            fn entries(&mut self) -> anyhow::Result<usize> {
                self.0.entries()
            }
        }
        let cfg = PostmarkConfig { files: 5, transactions: 200, ..PostmarkConfig::paper_small_files(0) };
        let e = run_postmark(&mut Lossy(Mem::default()), &cfg, &NoClock).unwrap_err();
        assert!(e.to_string().contains("read back"), "{e}");
        assert!(cfg.check().is_ok());
        assert!(PostmarkConfig { min_size: 10, max_size: 5, ..cfg.clone() }.check().is_err());
    }

    fn cell(path: ClientPath, op: Op, block: usize, mb: f64, cpu_s: f64) -> Cell {
        Cell {
            path,
            op,
            block,
            requests: 1,
            bytes: (mb * 1e6) as u64,
            seconds: 1.0,
            process_cpu_s: cpu_s,
            daemon_cpu_s: 0.0,
            rounds_mb_per_s: vec![],
        }
    }

    #[test]
    fn ratios_figures_and_headlines_come_from_the_cells() {
        use ClientPath::*;
        let cfg = PostmarkConfig::paper_small_files(100);
        let pm = |path, s| PostmarkRun {
            path,
            round: 0,
            counts: PostmarkCounts::default(),
            create_phase_s: 0.0,
            transaction_phase_s: s,
            delete_phase_s: 0.0,
            host_cpu_s: 0.0,
        };
        let r = Report {
            machine: "m".into(),
            quick: true,
            io_servers: 4,
            mount_args: vec![],
            file_size: 1 << 20,
            cell_seconds: 1.0,
            rounds: 1,
            cpu_counted: "x".into(),
            cells: vec![
                cell(UserLevel, Op::Read, 4096, 30.0, 0.5),
                cell(Kernel, Op::Read, 4096, 10.0, 0.5),
                cell(UserLevel, Op::Read, 1 << 20, 300.0, 0.1),
                cell(Kernel, Op::Read, 1 << 20, 200.0, 0.4),
            ],
            cross_checks: vec![],
            postmark: cfg,
            postmark_runs: vec![pm(UserLevel, 1.0), pm(Kernel, 4.0)],
        };
        assert!((r.bandwidth_ratio(Op::Read, 4096).unwrap() - 3.0).abs() < 1e-9);
        assert!((r.cpu_ratio(Op::Read, 4096).unwrap() - 3.0).abs() < 1e-6);
        assert!((r.postmark_ratio().unwrap() - 4.0).abs() < 1e-9);
        let h = r.headlines();
        assert_eq!(h.len(), 3);
        assert_eq!(h[0].paper, 2.5);
        assert!(h[1].paper.is_nan());
        assert_eq!(h[2].paper, 2.0);
        let f = r.figures();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].series.len(), 2, "no write cells, so two read curves");
        assert_eq!(f[0].series[0].points, vec![(4.0, 30.0), (1024.0, 300.0)]);
        let md = r.to_markdown();
        assert!(md.contains("| read | 4 KiB | user level | 30.0 | 3.00× | "), "{md}");
        assert!(md.contains("user level / kernel path (medians over rounds): 4.00×"), "{md}");
        let m = Cell::median_of(vec![
            cell(UserLevel, Op::Read, 4096, 5.0, 0.1),
            cell(UserLevel, Op::Read, 4096, 1.0, 0.2),
            cell(UserLevel, Op::Read, 4096, 9.0, 0.3),
        ])
        .unwrap();
        assert_eq!(m.process_cpu_s, 0.1);
        assert_eq!(m.rounds_mb_per_s.len(), 3);
        assert!(Cell::median_of(vec![]).is_none());
        assert_eq!(block_label(4096), "4 KiB");
        assert_eq!(block_label(1 << 20), "1 MiB");
        assert!(f[1].log_y && !f[0].log_y, "CPU per MiB spans orders of magnitude");
    }

    fn report(cells: Vec<Cell>, postmark_runs: Vec<PostmarkRun>) -> Report {
        Report {
            machine: "m".into(),
            quick: true,
            io_servers: 1,
            mount_args: vec![],
            file_size: 1 << 20,
            cell_seconds: 1.0,
            rounds: 3,
            cpu_counted: "x".into(),
            cells,
            cross_checks: vec![],
            postmark: PostmarkConfig::paper_small_files(100),
            postmark_runs,
        }
    }

    fn pm(path: ClientPath, round: usize, s: f64) -> PostmarkRun {
        PostmarkRun {
            path,
            round,
            counts: PostmarkCounts::default(),
            create_phase_s: 0.0,
            transaction_phase_s: s,
            delete_phase_s: 0.0,
            host_cpu_s: 0.0,
        }
    }

    fn with_rounds(mut c: Cell, rounds: &[f64]) -> Cell {
        c.rounds_mb_per_s = rounds.to_vec();
        c
    }

    #[test]
    fn headline_ratios_point_the_right_way_and_the_why_follows_the_sign() {
        use ClientPath::*;
        // The user level slower (10 vs 20 MB/s, tight rounds), its CPU per
        // MiB lower (kernel 4× it), PostMark slower (2 s vs 1 s).
        let r = report(
            vec![
                with_rounds(cell(UserLevel, Op::Read, 4096, 10.0, 0.1), &[9.9, 10.0, 10.1]),
                with_rounds(cell(Kernel, Op::Read, 4096, 20.0, 0.8), &[19.9, 20.0, 20.1]),
            ],
            vec![pm(UserLevel, 0, 2.0), pm(UserLevel, 1, 2.0), pm(Kernel, 0, 1.0), pm(Kernel, 1, 1.0)],
        );
        let h = r.headlines();
        assert!((h[0].ours - 0.5).abs() < 1e-9, "{:?}", h[0]);
        assert!(h[0].quantity.contains("sequential") && h[0].why.contains("user level is slower by 50%"), "{:?}", h[0]);
        assert!(!h[0].why.contains("faster"), "{}", h[0].why);
        assert_eq!(h[0].paper_text.as_deref(), Some("2–3×"));
        // CPU: kernel over user, (0.8 / 20) over (0.1 / 10) = 4.
        assert!((h[1].ours - 4.0).abs() < 1e-6, "{:?}", h[1]);
        assert!(h[1].paper.is_nan() && h[1].why.contains("gives no number") && !h[1].why.contains("NaN"));
        assert!((h[2].ours - 0.5).abs() < 1e-9 && h[2].why.contains("50% slower"), "{:?}", h[2]);
        assert_eq!(h[2].paper_text.as_deref(), Some("more than 2×"));

        // The user level faster: the sentences turn round.
        let r = report(
            vec![
                with_rounds(cell(UserLevel, Op::Read, 4096, 30.0, 0.1), &[29.0, 30.0, 31.0]),
                with_rounds(cell(Kernel, Op::Read, 4096, 10.0, 0.1), &[9.0, 10.0, 11.0]),
            ],
            vec![pm(UserLevel, 0, 1.0), pm(Kernel, 0, 3.0)],
        );
        let h = r.headlines();
        assert!((h[0].ours - 3.0).abs() < 1e-9 && h[0].why.contains("user level is faster by 200%"), "{:?}", h[0]);
        assert!((h[2].ours - 3.0).abs() < 1e-9 && h[2].why.contains("200% faster"), "{:?}", h[2]);
        assert!(h[2].why.contains("one round"), "one PostMark round per path: {}", h[2].why);

        // Within the rounds' spread: noise, whichever way.
        let r = report(
            vec![
                with_rounds(cell(UserLevel, Op::Read, 4096, 19.0, 0.1), &[15.0, 19.0, 23.0]),
                with_rounds(cell(Kernel, Op::Read, 4096, 20.0, 0.1), &[19.0, 20.0, 21.0]),
            ],
            vec![],
        );
        let h = r.headlines();
        assert!(h[0].why.contains("within this machine's noise") && !h[0].why.contains("slower"), "{}", h[0].why);
    }
}
