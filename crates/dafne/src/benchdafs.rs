//! `dafne bench dafs`: the DAFS paper's experiments (seed
//! `dafs-user-level-file-system`, figures 3, 4 and 6): the user-level
//! client (the client library in this process) against the kernel path
//! (the FUSE mount), on one fresh local cluster.
//!
//! # What is measured
//! 1. Bandwidth and client CPU vs block size: sequential reads and writes
//!    of one file per path, one request at a time, for a fixed time per
//!    cell (rather than a fixed size: a 4 KiB cell and a 1 MiB cell then
//!    cost the same time), in rounds that interleave the paths, the median
//!    round kept (the machine is shared). The user level moves bytes by
//!    RMA straight from and into one registered buffer; a second
//!    user-level variant uses plain buffers (inline bytes, or one copy
//!    through the library's bounce buffers), to show what the registered
//!    buffer itself is worth; the kernel path uses `pread`/`pwrite` on an
//!    `O_DIRECT` descriptor, so the page cache is not in the way (the
//!    paper's NFS had no useful client cache either), and the mount runs
//!    with read-ahead and write-behind off, the paper's no-read-ahead
//!    configuration: every request goes to the servers on both paths. CPU
//!    is the client host's: this process's (all threads, from
//!    `CLOCK_PROCESS_CPUTIME_ID`) plus the FUSE daemon's (`/proc/PID/stat`),
//!    the servers' never. No event loop spins while it waits
//!    (`DAFNE_SPIN_US=0` for every process of the run, unless the caller
//!    set it): the default 50 µs spin on 4 cores or more would be counted.
//! 2. A PostMark-like workload (`dafne_bench::dafs::run_postmark`, one
//!    implementation behind a trait), over the library (one metadata round
//!    trip per create, open, unlink: a compound create + open, a compound
//!    lookup + open) and over the mount with `std::fs`. Same seed, so the
//!    same operations; the counts and the digest of all bytes read must
//!    match.
//!
//! After the sweep each path's file is read back through the other path
//! and compared with what was written, so the figures are of correct
//! transfers. The cluster, the mount and the scratch directory go away
//! however the run ends (`benchmount::ScratchCluster`).

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dafne_bench::dafs::{
    self, Cell, ClientPath, CrossCheck, Op, PostmarkConfig, PostmarkFs, PostmarkRun, Report, WallClock,
};
use dafne_client::{CompoundOp, Errno, Ino, OpenFile, Response};
use dafne_proto::io::Stability;
use dafne_proto::Request;
use dafne_transport::{Access, Region};

use crate::benchmount::ScratchCluster;
use crate::benchposix::Stop;
use crate::cluster::ClusterInfo;
use crate::copy::{errno, Session};

/// The mount of the kernel path: every request to the servers (the
/// paper's configuration without read-ahead; write-behind would let the
/// kernel path's writes return before the servers have the bytes).
const MOUNT_ARGS: [&str; 4] = ["--readahead-mib", "0", "--write-behind-mib", "0"];
/// Unit of layout writes and of the cross-checks' reads.
const CHUNK: usize = 1 << 20;
/// `O_DIRECT` buffers and offsets are aligned to this.
const ALIGN: usize = 4096;

#[derive(Debug, clap::Args)]
pub struct DafsBench {
    /// A short pass (~40 s with the cluster's start): blocks 4K, 64K, 1M,
    /// a 16 MiB file, 3 rounds of 0.25 s per cell, 2 rounds of 300
    /// PostMark transactions (each setting below wins).
    #[arg(long)]
    pub quick: bool,
    /// Block sizes (K/M), multiples of 4 KiB, comma-separated (default 4K
    /// to 1M in powers of two).
    #[arg(long, value_delimiter = ',')]
    pub blocks: Vec<String>,
    /// Bytes of each path's file (K/M/G), a multiple of the largest block
    /// (default 128M, --quick 16M).
    #[arg(long)]
    pub file_size: Option<String>,
    /// Seconds each round of a cell runs (default 0.4, --quick 0.25).
    #[arg(long)]
    pub cell_seconds: Option<f64>,
    /// Rounds of every cell, the paths interleaved; the table shows the
    /// median round (default 3).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Rounds of PostMark on each path, the paths alternating (default 3,
    /// --quick 2).
    #[arg(long)]
    pub postmark_rounds: Option<usize>,
    /// PostMark: files created before the transactions (default 150).
    #[arg(long)]
    pub files: Option<u32>,
    /// PostMark: transactions (default 3000, --quick 300).
    #[arg(long)]
    pub transactions: Option<u32>,
    /// Scratch directory: the cluster (its data) and the mount point go in
    /// a fresh directory inside, removed at the end. A tmpfs keeps the
    /// servers' disks out of the figures.
    #[arg(long, default_value = "/dev/shm")]
    pub scratch: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/dafs.json")]
    pub json: PathBuf,
}

/// What `run` measures; `dafne bench seeds` takes [`Options::quick`].
#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    pub blocks: Vec<usize>,
    pub file_size: u64,
    pub cell_seconds: f64,
    pub rounds: usize,
    pub postmark: PostmarkConfig,
    pub postmark_rounds: usize,
    pub scratch: PathBuf,
}

impl Options {
    /// Blocks 4 KiB to 1 MiB in powers of two, a 128 MiB file, 3 rounds
    /// of 0.4 s per cell, 3 rounds of 3000 PostMark transactions over 150
    /// files of about 4 KB.
    pub fn full() -> Options {
        Options {
            quick: false,
            blocks: (12..=20).map(|s| 1usize << s).collect(),
            file_size: 128 << 20,
            cell_seconds: 0.4,
            rounds: 3,
            postmark: PostmarkConfig::paper_small_files(3000),
            postmark_rounds: 3,
            scratch: PathBuf::from("/dev/shm"),
        }
    }

    /// Blocks 4K, 64K, 1M, a 16 MiB file, 3 rounds of 0.25 s per cell, 2
    /// rounds of 300 PostMark transactions.
    pub fn quick() -> Options {
        Options {
            quick: true,
            blocks: vec![4 << 10, 64 << 10, 1 << 20],
            file_size: 16 << 20,
            cell_seconds: 0.25,
            rounds: 3,
            postmark: PostmarkConfig::paper_small_files(300),
            postmark_rounds: 2,
            ..Options::full()
        }
    }

    fn check(&self) -> Result<()> {
        if self.blocks.is_empty() {
            bail!("name at least one block size");
        }
        if let Some(b) = self.blocks.iter().find(|&&b| b == 0 || !b.is_multiple_of(ALIGN)) {
            bail!("block size {b} is not a positive multiple of 4 KiB (O_DIRECT on the kernel path needs that)");
        }
        let max = *self.blocks.iter().max().unwrap_or(&ALIGN) as u64;
        if self.file_size < max || !self.file_size.is_multiple_of(max) {
            bail!("the file size {} is not a multiple of the largest block ({max})", self.file_size);
        }
        if self.rounds == 0 || self.postmark_rounds == 0 {
            bail!("--rounds and --postmark-rounds must be at least 1");
        }
        if !(self.cell_seconds > 0.0 && self.cell_seconds <= 600.0) {
            bail!("--cell-seconds must be more than 0 and at most 600");
        }
        self.postmark.check().map_err(anyhow::Error::msg)
    }
}

/// The command: options from the flags, the run, the table, the JSON.
pub fn cli(a: DafsBench, parse_size: impl Fn(&str) -> Result<usize>) -> Result<()> {
    let mut o = if a.quick { Options::quick() } else { Options::full() };
    if !a.blocks.is_empty() {
        o.blocks = a.blocks.iter().map(|b| parse_size(b.trim())).collect::<Result<_>>()?;
        o.blocks.sort_unstable();
        o.blocks.dedup();
    }
    if let Some(s) = &a.file_size {
        o.file_size = parse_size(s)? as u64;
    }
    if let Some(s) = a.cell_seconds {
        o.cell_seconds = s;
    }
    if let Some(n) = a.rounds {
        o.rounds = n;
    }
    if let Some(n) = a.postmark_rounds {
        o.postmark_rounds = n;
    }
    if let Some(n) = a.files {
        o.postmark.files = n;
    }
    if let Some(n) = a.transactions {
        o.postmark.transactions = n;
    }
    o.scratch = a.scratch;
    let started = Instant::now();
    let report = run(&o, &|what| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64()))?;
    println!("{}", report.to_markdown());
    println!("Headlines (ours beside the paper's):\n");
    for h in report.headlines() {
        println!("- {}: {:.2}{} (paper: {:.1}{}); {}", h.quantity, h.ours, h.unit, h.paper, h.unit, h.why);
    }
    crate::write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}

/// CPU seconds of this whole process (every thread), to the nanosecond.
fn process_cpu_s() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The client host's CPU: this process and the FUSE daemon.
struct HostCpu {
    daemon: u32,
}

impl HostCpu {
    fn now(&self) -> Result<(f64, f64)> {
        let d = dafne_bench::posix::process_cpu_seconds(self.daemon).context("CPU time of the FUSE daemon")?;
        Ok((process_cpu_s(), d))
    }
}

/// Bytes that differ from offset to offset (a shifted or torn transfer
/// shows), the same in every run.
fn pattern(len: usize) -> Vec<u8> {
    let mut r = dafs::Rng::new(0xda75);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A buffer aligned for `O_DIRECT`.
struct Aligned {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn zeroed(len: usize) -> Aligned {
        let buf = vec![0u8; len + ALIGN];
        let start = buf.as_ptr().align_offset(ALIGN);
        Aligned { buf, start, len }
    }

    fn slice(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// The user level's file: open in meta for the whole sweep.
struct UserFile<'a> {
    s: &'a Session,
    open: OpenFile,
    path: &'static str,
}

impl Drop for UserFile<'_> {
    fn drop(&mut self) {
        let _ = self.s.meta.close(self.open.layout.object_id);
    }
}

fn lib<T>(what: &str, path: &str, r: Result<T, Errno>) -> Result<T> {
    r.map_err(|e| errno(what, path, e))
}

/// The sweep's state: both paths' files and buffers.
struct Sweep<'a> {
    s: &'a Session,
    stop: &'a Stop,
    cpu: &'a HostCpu,
    file_size: u64,
    cell: Duration,
    user: UserFile<'a>,
    /// The pattern, registered: user-level writes go out of it at the
    /// file offset, zero-copy.
    user_src: Region,
    user_dst: Region,
    /// The inline variant's read buffer (not registered).
    plain_dst: Vec<u8>,
    kernel: std::fs::File,
    kernel_src: Aligned,
    kernel_dst: Aligned,
}

impl Sweep<'_> {
    fn one(&mut self, path: ClientPath, op: Op, off: u64, block: usize) -> Result<()> {
        let name = self.user.path;
        match (path, op) {
            (ClientPath::UserLevel, Op::Write) => {
                let f = &self.user.open;
                let r = self.s.data.write_region(f, off, &self.user_src, off as usize, block, Stability::Unstable);
                let n = lib("writing", name, futures::executor::block_on(r))?;
                if n != block {
                    bail!("dafne:{name}: wrote {n} of {block} bytes at {off}");
                }
            }
            (ClientPath::UserLevel, Op::Read) => {
                let r = self.s.data.read_region(&self.user.open, off, &self.user_dst, 0, block);
                let n = lib("reading", name, futures::executor::block_on(r))?;
                if n != block {
                    bail!("dafne:{name}: read {n} of {block} bytes at {off}");
                }
            }
            (ClientPath::UserInline, Op::Write) => {
                let o = off as usize;
                let src = &self.user_src.as_slice()[o..o + block];
                let r = self.s.data.write_at(&self.user.open, off, src, Stability::Unstable);
                let n = lib("writing", name, futures::executor::block_on(r))?;
                if n != block {
                    bail!("dafne:{name}: wrote {n} of {block} bytes at {off}");
                }
            }
            (ClientPath::UserInline, Op::Read) => {
                let dst = &mut self.plain_dst[..block];
                let n =
                    lib("reading", name, futures::executor::block_on(self.s.data.read_at(&self.user.open, off, dst)))?;
                if n != block {
                    bail!("dafne:{name}: read {n} of {block} bytes at {off}");
                }
            }
            (ClientPath::Kernel, Op::Write) => {
                let o = off as usize;
                self.kernel.write_all_at(&self.kernel_src.slice()[o..o + block], off).context("pwrite (O_DIRECT)")?;
            }
            (ClientPath::Kernel, Op::Read) => {
                self.kernel
                    .read_exact_at(&mut self.kernel_dst.slice_mut()[..block], off)
                    .context("pread (O_DIRECT)")?;
            }
        }
        Ok(())
    }

    /// Sequential requests of `block` bytes from offset 0 (wrapping at the
    /// file's end) for the cell's time, at least one.
    fn cell(&mut self, path: ClientPath, op: Op, block: usize) -> Result<Cell> {
        self.stop.check()?;
        let (p0, d0) = self.cpu.now()?;
        let t = Instant::now();
        let (mut off, mut requests) = (0u64, 0u64);
        loop {
            self.one(path, op, off, block)?;
            requests += 1;
            off += block as u64;
            if off + block as u64 > self.file_size {
                off = 0;
            }
            if t.elapsed() >= self.cell {
                break;
            }
        }
        let seconds = t.elapsed().as_secs_f64();
        let (p1, d1) = self.cpu.now()?;
        Ok(Cell {
            path,
            op,
            block,
            requests,
            bytes: requests * block as u64,
            seconds,
            process_cpu_s: p1 - p0,
            daemon_cpu_s: d1 - d0,
            rounds_mb_per_s: Vec::new(),
        })
    }
}

/// Creates `path` through the library, writes the pattern in 1 MiB
/// pieces and sets its size; keeps it open for reading and writing.
fn user_layout<'a>(s: &'a Session, path: &'static str, src: &Region, size: u64) -> Result<UserFile<'a>> {
    let (parent, name) = crate::copy::parent_of(&s.meta, path)?;
    let attr = lib("creating", path, s.meta.create(parent, &name, 0o644, true))?;
    let open = lib("opening", path, s.meta.open(attr.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE))?;
    let f = UserFile { s, open, path };
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(CHUNK as u64) as usize;
        let r = s.data.write_region(&f.open, off, src, off as usize, n, Stability::Unstable);
        lib("writing", path, futures::executor::block_on(r))?;
        off += n as u64;
    }
    lib(
        "setting the size of",
        path,
        s.meta.setattr(attr.ino, dafne_proto::SetAttr { size: Some(size), ..Default::default() }),
    )?;
    Ok(f)
}

/// Opens `path` on the mount with `O_DIRECT` (loudly refused if the mount
/// refuses it), writes the pattern in 1 MiB pieces and syncs it.
fn kernel_layout(path: &Path, src: &Aligned) -> Result<std::fs::File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
        .map_err(|e| {
            anyhow::anyhow!(
                "THE MOUNT REFUSED O_DIRECT on {} ({e}): the kernel path cannot be measured without the page \
                 cache, so this benchmark stops rather than measure something else",
                path.display()
            )
        })?;
    for (i, piece) in src.slice().chunks(CHUNK).enumerate() {
        f.write_all_at(piece, (i * CHUNK) as u64).with_context(|| format!("writing {} (O_DIRECT)", path.display()))?;
    }
    f.sync_all().with_context(|| format!("fsync of {}", path.display()))?;
    Ok(f)
}

/// Reads `path` (which the user level wrote) through the mount and
/// compares it with `want`.
fn check_through_mount(path: &Path, want: &[u8]) -> Result<CrossCheck> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut got = Vec::with_capacity(want.len());
    f.read_to_end(&mut got).with_context(|| format!("reading {}", path.display()))?;
    Ok(CrossCheck {
        written_by: ClientPath::UserLevel,
        read_by: ClientPath::Kernel,
        bytes: got.len() as u64,
        equal: got == want,
    })
}

/// Reads `path` (which the kernel path wrote) through the library and
/// compares it with `want`.
fn check_through_library(s: &Session, path: &str, want: &[u8], buf: &Region) -> Result<CrossCheck> {
    let attr = lib("resolving", path, s.meta.resolve(path))?;
    let f = UserFile { s, open: lib("opening", path, s.meta.open(attr.ino, dafne_proto::OPEN_READ))?, path: "" };
    let mut equal = attr.size == want.len() as u64;
    let mut off = 0u64;
    while equal && off < attr.size {
        let n = (attr.size - off).min(buf.as_slice().len() as u64) as usize;
        let r = s.data.read_region(&f.open, off, buf, 0, n);
        let got = lib("reading", path, futures::executor::block_on(r))?;
        let o = off as usize;
        equal = got == n && buf.as_slice()[..n] == want[o..o + n];
        off += n as u64;
    }
    Ok(CrossCheck { written_by: ClientPath::Kernel, read_by: ClientPath::UserLevel, bytes: attr.size, equal })
}

/// PostMark over the client library: one metadata round trip per create
/// (a compound create + open), open (a compound lookup + open), size
/// update, close and unlink; data inline with the io servers' requests.
struct LibraryFs<'a> {
    s: &'a Session,
    base: Ino,
    base_path: String,
    dirs: HashMap<String, Ino>,
}

impl LibraryFs<'_> {
    fn parent(&self, dir: &str) -> Result<Ino> {
        self.dirs.get(dir).copied().with_context(|| format!("no directory {dir} made by this run"))
    }

    fn path(&self, dir: &str, name: &str) -> String {
        format!("{}/{dir}/{name}", self.base_path)
    }

    /// Exclusive create and open in one round trip.
    fn create_open(&self, parent: Ino, name: &str) -> Result<OpenFile, Errno> {
        let flags = dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE;
        let ops = vec![
            CompoundOp {
                chain: false,
                req: Request::Create {
                    parent,
                    name: name.as_bytes().to_vec(),
                    mode: 0o644,
                    exclusive: true,
                    hint: None,
                },
            },
            CompoundOp { chain: true, req: Request::Open { ino: 0, flags } },
        ];
        let mut results = self.s.meta.compound(ops)?;
        match results.pop() {
            Some(Ok(Response::Opened { attr, layout, cap })) => Ok(OpenFile { attr, layout, cap }),
            Some(Err(e)) => Err(e),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Writes `data` at `off`, sets the size to the end of it, closes.
    fn write_close(&self, f: OpenFile, off: u64, data: &[u8], path: &str) -> Result<()> {
        let r = (|| {
            let n = futures::executor::block_on(self.s.data.write_at(&f, off, data, Stability::Unstable))?;
            if n != data.len() {
                return Err(Errno::EIO);
            }
            let size = dafne_proto::SetAttr { size: Some(off + n as u64), ..Default::default() };
            self.s.meta.setattr(f.attr.ino, size).map(|_| ())
        })();
        let c = self.s.meta.close(f.layout.object_id);
        lib("writing", path, r)?;
        lib("closing", path, c)
    }
}

impl PostmarkFs for LibraryFs<'_> {
    fn mkdir(&mut self, dir: &str) -> Result<()> {
        let a = lib("making", dir, self.s.meta.mkdir(self.base, dir.as_bytes(), 0o755))?;
        self.dirs.insert(dir.to_string(), a.ino);
        Ok(())
    }

    fn rmdir(&mut self, dir: &str) -> Result<()> {
        lib("removing", dir, self.s.meta.rmdir(self.base, dir.as_bytes()))?;
        self.dirs.remove(dir);
        Ok(())
    }

    fn create(&mut self, dir: &str, name: &str, data: &[u8]) -> Result<()> {
        let path = self.path(dir, name);
        let f = lib("creating", &path, self.create_open(self.parent(dir)?, name))?;
        self.write_close(f, 0, data, &path)
    }

    fn append(&mut self, dir: &str, name: &str, data: &[u8]) -> Result<()> {
        let path = self.path(dir, name);
        let flags = dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE;
        let f = lib("opening", &path, self.s.meta.open_at(self.parent(dir)?, name.as_bytes(), flags))?;
        let end = f.attr.size;
        self.write_close(f, end, data, &path)
    }

    fn read(&mut self, dir: &str, name: &str, buf: &mut Vec<u8>) -> Result<()> {
        let path = self.path(dir, name);
        let f = lib("opening", &path, self.s.meta.open_at(self.parent(dir)?, name.as_bytes(), dafne_proto::OPEN_READ))?;
        buf.clear();
        buf.resize(f.attr.size as usize, 0);
        let r = futures::executor::block_on(self.s.data.read_at(&f, 0, buf));
        let c = self.s.meta.close(f.layout.object_id);
        let n = lib("reading", &path, r)?;
        buf.truncate(n);
        lib("closing", &path, c)
    }

    fn delete(&mut self, dir: &str, name: &str) -> Result<()> {
        let path = self.path(dir, name);
        lib("unlinking", &path, self.s.meta.unlink(self.parent(dir)?, name.as_bytes()))
    }

    fn entries(&mut self) -> Result<usize> {
        let e = lib("listing", &self.base_path, self.s.meta.readdir(self.base))?;
        Ok(e.iter().filter(|e| e.name != b"." && e.name != b"..").count())
    }
}

/// PostMark through the mount with `std::fs`.
struct MountFs {
    base: PathBuf,
}

impl PostmarkFs for MountFs {
    fn mkdir(&mut self, dir: &str) -> Result<()> {
        let p = self.base.join(dir);
        std::fs::create_dir(&p).with_context(|| format!("mkdir {}", p.display()))
    }

    fn rmdir(&mut self, dir: &str) -> Result<()> {
        let p = self.base.join(dir);
        std::fs::remove_dir(&p).with_context(|| format!("rmdir {}", p.display()))
    }

    fn create(&mut self, dir: &str, name: &str, data: &[u8]) -> Result<()> {
        let p = self.base.join(dir).join(name);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .with_context(|| format!("creating {}", p.display()))?;
        f.write_all(data).with_context(|| format!("writing {}", p.display()))
    }

    fn append(&mut self, dir: &str, name: &str, data: &[u8]) -> Result<()> {
        let p = self.base.join(dir).join(name);
        let mut f = OpenOptions::new().append(true).open(&p).with_context(|| format!("opening {}", p.display()))?;
        f.write_all(data).with_context(|| format!("appending to {}", p.display()))
    }

    fn read(&mut self, dir: &str, name: &str, buf: &mut Vec<u8>) -> Result<()> {
        let p = self.base.join(dir).join(name);
        buf.clear();
        let mut f = std::fs::File::open(&p).with_context(|| format!("opening {}", p.display()))?;
        f.read_to_end(buf).with_context(|| format!("reading {}", p.display()))?;
        Ok(())
    }

    fn delete(&mut self, dir: &str, name: &str) -> Result<()> {
        let p = self.base.join(dir).join(name);
        std::fs::remove_file(&p).with_context(|| format!("unlinking {}", p.display()))
    }

    fn entries(&mut self) -> Result<usize> {
        let rd = std::fs::read_dir(&self.base).with_context(|| format!("listing {}", self.base.display()))?;
        Ok(rd.count())
    }
}

/// A [`PostmarkFs`] that fails at the next operation once the run is
/// interrupted (the guards then clean up).
struct Stoppable<'a> {
    stop: &'a Stop,
    fs: &'a mut dyn PostmarkFs,
}

impl PostmarkFs for Stoppable<'_> {
    fn mkdir(&mut self, dir: &str) -> Result<()> {
        self.stop.check()?;
        self.fs.mkdir(dir)
    }

    fn rmdir(&mut self, dir: &str) -> Result<()> {
        self.stop.check()?;
        self.fs.rmdir(dir)
    }

    fn create(&mut self, dir: &str, name: &str, data: &[u8]) -> Result<()> {
        self.stop.check()?;
        self.fs.create(dir, name, data)
    }

    fn append(&mut self, dir: &str, name: &str, data: &[u8]) -> Result<()> {
        self.stop.check()?;
        self.fs.append(dir, name, data)
    }

    fn read(&mut self, dir: &str, name: &str, buf: &mut Vec<u8>) -> Result<()> {
        self.stop.check()?;
        self.fs.read(dir, name, buf)
    }

    fn delete(&mut self, dir: &str, name: &str) -> Result<()> {
        self.stop.check()?;
        self.fs.delete(dir, name)
    }

    fn entries(&mut self) -> Result<usize> {
        self.fs.entries()
    }
}

fn postmark(
    path: ClientPath,
    fs: &mut dyn PostmarkFs,
    cfg: &PostmarkConfig,
    cpu: &HostCpu,
    stop: &Stop,
) -> Result<PostmarkRun> {
    let (p0, d0) = cpu.now()?;
    let mut fs = Stoppable { stop, fs };
    let (counts, [c, t, d]) = dafs::run_postmark(&mut fs, cfg, &WallClock(Instant::now()))
        .with_context(|| format!("PostMark on the {}", path.short()))?;
    let (p1, d1) = cpu.now()?;
    Ok(PostmarkRun {
        path,
        round: 0,
        counts,
        create_phase_s: c,
        transaction_phase_s: t,
        delete_phase_s: d,
        host_cpu_s: (p1 - p0) + (d1 - d0),
    })
}

fn register(s: &Session, buf: Vec<u8>) -> Result<Region> {
    s.data.register(buf, Access::RemoteReadWrite).map_err(|e| anyhow::anyhow!("registering a buffer: {e}"))
}

/// Starts a scratch cluster and its mount, measures, takes them down.
pub fn run(o: &Options, progress: &dyn Fn(&str)) -> Result<Report> {
    o.check()?;
    // CPU is measured: no event loop may spin while it waits (the default
    // on 4 cores or more is a 50 µs spin, and the CPU figures would count
    // it). The servers and the mount's daemon get `DAFNE_SPIN_US=0` in
    // their environment, this process's client a runtime that does not
    // spin; this process's own environment is left alone (changing it
    // while threads run races with their `getenv`, UCX's included). A
    // value the user set is kept, and said in the report.
    let (spin, child_env, client_spin) = match std::env::var("DAFNE_SPIN_US") {
        Ok(v) => (format!("DAFNE_SPIN_US={v} as set by the caller"), vec![], None),
        Err(_) => (
            "no event loop spinning (DAFNE_SPIN_US=0)".to_string(),
            vec![("DAFNE_SPIN_US", "0")],
            Some(std::time::Duration::ZERO),
        ),
    };
    // Ctrl-C, SIGTERM, SIGHUP: the run stops at its next request and the
    // guards unmount, take the cluster down and remove the scratch tree.
    let stop = Stop::install()?;
    let root = o.scratch.join(format!("dafne-bench-dafs-{}", std::process::id()));
    progress(&format!(
        "starting a cluster (dafne up) in {} and mounting it ({})",
        root.display(),
        MOUNT_ARGS.join(" ")
    ));
    let mount_args: Vec<String> = MOUNT_ARGS.iter().map(|s| s.to_string()).collect();
    let mut cluster = ScratchCluster::start_with_env(&root, &mount_args, &child_env)?;
    let daemon = ClusterInfo::live_mounts(&cluster.dir)
        .into_iter()
        .find(|(_, mp)| mp == &cluster.mnt)
        .map(|(pid, _)| pid)
        .context("the dafne mount's daemon is not recorded in the cluster directory")?;
    let cpu = HostCpu { daemon };
    let io_servers = cluster.io_servers;
    // The client's connections end before the servers do.
    let s = crate::copy::connect_with(&cluster.dir, "bench-dafs", None, client_spin)?;
    let (cells, cross_checks, postmark_runs) = measure(o, &s, &cluster, &cpu, &stop, progress)?;
    drop(s);
    progress("unmounting, taking the cluster down");
    cluster.down();
    drop(cluster);
    Ok(Report {
        machine: dafne_bench::transport::machine(),
        quick: o.quick,
        io_servers,
        mount_args,
        file_size: o.file_size,
        cell_seconds: o.cell_seconds,
        rounds: o.rounds,
        cpu_counted: format!(
            "this process (all threads, CLOCK_PROCESS_CPUTIME_ID) + the FUSE daemon (pid {daemon}, \
             /proc/PID/stat); the metadata and io servers are the server host and are not counted; {spin}"
        ),
        cells,
        cross_checks,
        postmark: o.postmark.clone(),
        postmark_runs,
    })
}

/// The sweep, the cross-checks and PostMark on both paths.
fn measure(
    o: &Options,
    s: &Session,
    cluster: &ScratchCluster,
    cpu: &HostCpu,
    stop: &Stop,
    progress: &dyn Fn(&str),
) -> Result<(Vec<Cell>, Vec<CrossCheck>, Vec<PostmarkRun>)> {
    let size = o.file_size;
    let max_block = *o.blocks.iter().max().unwrap_or(&CHUNK);

    progress(&format!("laying out a {} MiB file through each path", size >> 20));
    let want = pattern(size as usize);
    let user_src = register(s, want.clone())?;
    let user_dst = register(s, vec![0; max_block.max(CHUNK)])?;
    let user = user_layout(s, "/dafs-user", &user_src, size)?;
    let mut kernel_src = Aligned::zeroed(size as usize);
    kernel_src.slice_mut().copy_from_slice(&want);
    let kernel_path = cluster.mnt.join("dafs-kernel");
    let kernel = kernel_layout(&kernel_path, &kernel_src)?;
    let mut sweep = Sweep {
        s,
        stop,
        cpu,
        file_size: size,
        cell: Duration::from_secs_f64(o.cell_seconds),
        user,
        user_src,
        user_dst,
        plain_dst: vec![0; max_block],
        kernel,
        kernel_src,
        kernel_dst: Aligned::zeroed(max_block),
    };

    let mut cells = Vec::new();
    for (i, &block) in o.blocks.iter().enumerate() {
        for op in [Op::Write, Op::Read] {
            let mut rounds: Vec<Vec<Cell>> = vec![Vec::new(); ClientPath::ALL.len()];
            for round in 0..o.rounds {
                // The paths take turns first, so that a burst of load from
                // the machine's other users does not always fall on one.
                let mut order: Vec<usize> = (0..ClientPath::ALL.len()).collect();
                order.rotate_left((i + round) % ClientPath::ALL.len());
                for k in order {
                    rounds[k].push(sweep.cell(ClientPath::ALL[k], op, block)?);
                }
            }
            for r in rounds {
                let Some(c) = Cell::median_of(r) else { continue };
                progress(&format!(
                    "{} {} {}: {:.1} MB/s, {:.0} CPU µs/MiB (median of {:?} MB/s)",
                    c.path.short(),
                    op.label(),
                    dafs::block_label(block),
                    c.mb_per_s(),
                    c.cpu_us_per_mib(),
                    c.rounds_mb_per_s.iter().map(|x| (x * 10.0).round() / 10.0).collect::<Vec<_>>()
                ));
                cells.push(c);
            }
        }
    }

    progress("cross-checks: each path's file read back through the other");
    let Sweep { user, user_dst, kernel, user_src, kernel_src, kernel_dst, plain_dst, .. } = sweep;
    drop((user, kernel, user_src, kernel_src, kernel_dst, plain_dst));
    let mut cross_checks = vec![check_through_mount(&cluster.mnt.join("dafs-user"), &want)?];
    cross_checks.push(check_through_library(s, "/dafs-kernel", &want, &user_dst)?);
    for c in &cross_checks {
        if !c.equal {
            progress(&format!(
                "MISMATCH: the file the {} wrote reads back different through the {} ({} bytes)",
                c.written_by.short(),
                c.read_by.short(),
                c.bytes
            ));
        }
    }

    let cfg = &o.postmark;
    let mut runs = Vec::new();
    for round in 0..o.postmark_rounds {
        let mut order = [ClientPath::UserLevel, ClientPath::Kernel];
        order.rotate_left(round % 2);
        for path in order {
            progress(&format!(
                "PostMark round {}/{} on the {} ({} files, {} transactions)",
                round + 1,
                o.postmark_rounds,
                path.short(),
                cfg.files,
                cfg.transactions
            ));
            let name = format!("postmark-{}-{round}", if path == ClientPath::Kernel { "kernel" } else { "user" });
            let mut run = if path == ClientPath::Kernel {
                let base = cluster.mnt.join(&name);
                std::fs::create_dir(&base).with_context(|| format!("mkdir {}", base.display()))?;
                postmark(path, &mut MountFs { base }, cfg, cpu, stop)?
            } else {
                let base_path = format!("/{name}");
                let base = lib("making", &base_path, s.meta.mkdir(s.meta.root(), name.as_bytes(), 0o755))?;
                let mut lfs = LibraryFs { s, base: base.ino, base_path, dirs: HashMap::new() };
                postmark(path, &mut lfs, cfg, cpu, stop)?
            };
            run.round = round;
            progress(&format!("  {:.0} transactions/s", run.transactions_per_s(cfg)));
            runs.push(run);
        }
    }
    Ok((cells, cross_checks, runs))
}
