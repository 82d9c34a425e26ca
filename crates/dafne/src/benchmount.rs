//! `dafne bench mount`: what an application sees through the FUSE mount,
//! beside the client library without the kernel (`dafne cp`).
//!
//! It starts its own local cluster (`dafne up` in a scratch directory, on
//! free ports), mounts it, and measures: sequential write (1 MiB `write`s
//! then `fsync`) and read (the file's kernel cache dropped first, so bytes
//! come from the io servers), 4 KiB random reads and writes, metadata
//! operations (create, stat, list, unlink of many empty files), and the
//! same large copy through `dafne cp` in both directions. Then it takes the
//! cluster down. Timings are wall clock; nothing here is asserted.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub struct MountBench {
    /// Bytes of the sequential file and of the `dafne cp` copies (K/M/G).
    #[arg(long, default_value = "1G")]
    pub size: String,
    /// Empty files created, stat'ed, listed and unlinked.
    #[arg(long, default_value_t = 2000)]
    pub files: usize,
    /// 4 KiB random operations of each kind, on a 64 MiB file.
    #[arg(long, default_value_t = 4000)]
    pub random_ops: usize,
    /// Scratch directory (the cluster, the mount point and local copies go
    /// in a fresh directory inside).
    #[arg(long, default_value = "/tmp")]
    pub scratch: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/mount.json")]
    pub json: PathBuf,
}

#[derive(Debug, Serialize)]
struct Row {
    what: String,
    amount: String,
    seconds: f64,
    rate: f64,
    unit: &'static str,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    io_servers: u32,
    rows: Vec<Row>,
}

/// Runs `dafne ARGS`, failing with its output.
pub(crate) fn dafne(args: &[&str]) -> Result<String> {
    dafne_env(args, &[])
}

/// [`dafne`] with `env` added to the command's environment (and so to the
/// servers or the mount daemon it starts).
pub(crate) fn dafne_env(args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let exe = std::env::current_exe().context("locating the dafne executable")?;
    let o = Command::new(exe).args(args).envs(env.iter().copied()).output().context("running dafne")?;
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    if !o.status.success() {
        bail!("`dafne {}` failed:\n{text}", args.join(" "));
    }
    Ok(text)
}

fn free_port_base(n: u16) -> Result<(u16, u16)> {
    for _ in 0..100 {
        let meta = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let base = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if base.checked_add(n).is_none() || (base..base + n).contains(&meta) {
            continue;
        }
        if (base..base + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return Ok((meta, base));
        }
    }
    bail!("no {n} consecutive free ports on 127.0.0.1")
}

/// Takes the cluster down however the benchmark ends.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = dafne(&["down", "--dir", &self.0.display().to_string()]);
    }
}

pub(crate) struct RemoveTreeOnDrop(pub PathBuf);

impl Drop for RemoveTreeOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn drop_cache(path: &Path) -> Result<()> {
    let f = std::fs::File::open(path)?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

/// A fresh local cluster (`dafne up` with the embedded defaults on free
/// ports) in `root/cluster`, mounted at `root/mnt`. Dropping it unmounts,
/// takes the cluster down and removes `root`, however the benchmark ends.
pub(crate) struct ScratchCluster {
    pub dir: PathBuf,
    pub mnt: PathBuf,
    pub io_servers: u32,
    // Dropped in this order: the cluster down first, then the directory.
    down: Option<Down>,
    _scratch: RemoveTreeOnDrop,
}

impl ScratchCluster {
    /// Creates `root` (which must not hold anything of value: it is removed
    /// when this is dropped), starts the cluster and mounts it (with
    /// `mount_args` added to `dafne mount`).
    pub(crate) fn start(root: &Path, mount_args: &[String]) -> Result<ScratchCluster> {
        ScratchCluster::start_with_env(root, mount_args, &[])
    }

    /// [`ScratchCluster::start`] with `env` in the environment of every
    /// server and of the mount daemon.
    pub(crate) fn start_with_env(root: &Path, mount_args: &[String], env: &[(&str, &str)]) -> Result<ScratchCluster> {
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let scratch = RemoveTreeOnDrop(root.to_path_buf());
        let dir = root.join("cluster");
        let mnt = root.join("mnt");
        std::fs::create_dir_all(&mnt)?;
        let d = dir.display().to_string();
        let io_servers = 4u32;
        let (meta, base) = free_port_base(io_servers as u16)?;
        // 64 MiB caches, as when the figures in docs/BENCHMARKS.md were
        // taken (without a size `up` takes a share of free memory).
        let (m, b) = (meta.to_string(), base.to_string());
        dafne_env(&["up", "--dir", &d, "--cache-mib", "64", "--meta-port", &m, "--io-base-port", &b], env)?;
        let down = Down(dir.clone());
        let mnt_arg = mnt.display().to_string();
        let mut args = vec!["mount", &mnt_arg, "--dir", &d];
        args.extend(mount_args.iter().map(String::as_str));
        dafne_env(&args, env)?;
        Ok(ScratchCluster { dir, mnt, io_servers, down: Some(down), _scratch: scratch })
    }

    /// Unmounts and stops the cluster now (the directory stays until drop).
    pub(crate) fn down(&mut self) {
        self.down.take();
    }
}

pub fn run(a: MountBench, parse_size: impl Fn(&str) -> Result<usize>) -> Result<()> {
    let size = parse_size(&a.size)?;
    if a.files == 0 || a.random_ops == 0 {
        bail!("--files and --random-ops must be at least 1");
    }
    let root = a.scratch.join(format!("dafne-bench-mount-{}", std::process::id()));
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    step("starting a cluster (dafne up) and mounting it");
    let mut cluster = ScratchCluster::start(&root, &[])?;
    let (dir, mnt, io_servers) = (cluster.dir.clone(), cluster.mnt.clone(), cluster.io_servers);
    let d = dir.display().to_string();
    let mut rows = Vec::new();
    let mib = size as f64 / (1 << 20) as f64;
    let mut row = |what: &str, amount: String, seconds: f64, rate: f64, unit: &'static str| {
        rows.push(Row { what: what.into(), amount, seconds, rate, unit });
    };

    // Sequential write, then read with the kernel's cache dropped.
    step("sequential write");
    let seq = mnt.join("seq");
    let chunk: Vec<u8> = (0..1usize << 20).map(|i| (i * 31 + i / 4096) as u8).collect();
    let t = Instant::now();
    let mut f = OpenOptions::new().create(true).write(true).truncate(true).open(&seq)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len());
        f.write_all(&chunk[..n])?;
        left -= n;
    }
    f.sync_all()?;
    drop(f);
    let s = t.elapsed().as_secs_f64();
    row("sequential write, 1 MiB writes + fsync", format!("{mib:.0} MiB"), s, mib / s, "MiB/s");
    step("sequential read");
    drop_cache(&seq)?;
    let t = Instant::now();
    let mut f = std::fs::File::open(&seq)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    drop(f);
    let s = t.elapsed().as_secs_f64();
    if got != size {
        bail!("read back {got} bytes of {size}");
    }
    row("sequential read, kernel cache dropped", format!("{mib:.0} MiB"), s, mib / s, "MiB/s");

    // 4 KiB random I/O on a 64 MiB file.
    step("4 KiB random writes and reads");
    let rnd = mnt.join("random");
    let span = 64u64 << 20;
    {
        let f = OpenOptions::new().create(true).write(true).truncate(true).open(&rnd)?;
        f.set_len(span)?;
    }
    let f = OpenOptions::new().read(true).write(true).open(&rnd)?;
    let mut x = 0x9E3779B97F4A7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % (span / 4096)) * 4096
    };
    let block = [7u8; 4096];
    let t = Instant::now();
    for _ in 0..a.random_ops {
        f.write_all_at(&block, next())?;
    }
    f.sync_all()?;
    let s = t.elapsed().as_secs_f64();
    row("random 4 KiB writes (+ one fsync)", format!("{} ops", a.random_ops), s, a.random_ops as f64 / s, "ops/s");
    drop_cache(&rnd)?;
    let mut b4 = [0u8; 4096];
    let t = Instant::now();
    for _ in 0..a.random_ops {
        f.read_exact_at(&mut b4, next())?;
    }
    let s = t.elapsed().as_secs_f64();
    row(
        "random 4 KiB reads, kernel cache dropped",
        format!("{} ops", a.random_ops),
        s,
        a.random_ops as f64 / s,
        "ops/s",
    );
    drop(f);

    // Metadata.
    step("creates, stats, listing, unlinks");
    let md = mnt.join("md");
    std::fs::create_dir(&md)?;
    let names: Vec<PathBuf> = (0..a.files).map(|i| md.join(format!("f{i:06}"))).collect();
    let n = a.files as f64;
    let t = Instant::now();
    for p in &names {
        std::fs::File::create(p)?;
    }
    let s = t.elapsed().as_secs_f64();
    row("create (open O_CREAT + close)", format!("{} files", a.files), s, n / s, "ops/s");
    let t = Instant::now();
    for p in &names {
        std::fs::metadata(p)?;
    }
    let s = t.elapsed().as_secs_f64();
    row("stat (attributes may be cached by the kernel)", format!("{} files", a.files), s, n / s, "ops/s");
    let t = Instant::now();
    let listed = std::fs::read_dir(&md)?.filter_map(|e| e.ok()).filter_map(|e| e.metadata().ok()).count();
    let s = t.elapsed().as_secs_f64();
    if listed != a.files {
        bail!("listed {listed} of {} files", a.files);
    }
    row("list with attributes (ls -l)", format!("{} entries", a.files), s, n / s, "entries/s");
    let t = Instant::now();
    for p in &names {
        std::fs::remove_file(p)?;
    }
    let s = t.elapsed().as_secs_f64();
    row("unlink", format!("{} files", a.files), s, n / s, "ops/s");

    // The client library without the kernel.
    step("dafne cp in and out (client library, no mount)");
    // The local file in memory (/dev/shm) when there is one, so that the
    // copy measures dafne rather than this machine's disk.
    let shm = Path::new("/dev/shm");
    let local =
        if shm.is_dir() { shm.join(format!("dafne-bench-{}.bin", std::process::id())) } else { root.join("local.bin") };
    {
        let mut f = std::fs::File::create(&local)?;
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n])?;
            left -= n;
        }
    }
    let _rm = RemoveOnDrop(local.clone());
    let t = Instant::now();
    dafne(&["cp", "-f", "--dir", &d, &local.display().to_string(), "dafne:/cp.bin"])?;
    let s = t.elapsed().as_secs_f64();
    row("dafne cp local -> dafne (whole command)", format!("{mib:.0} MiB"), s, mib / s, "MiB/s");
    // To /dev/null: a local destination would measure this machine (a new
    // file in /dev/shm costs 1 GiB of page allocation, ~2 s here; the disk
    // is slower still). `dafne cp` says how many bytes it copied.
    let t = Instant::now();
    let out = dafne(&["cp", "-f", "--dir", &d, "dafne:/cp.bin", "/dev/null"])?;
    let s = t.elapsed().as_secs_f64();
    row("dafne cp dafne -> /dev/null (whole command)", format!("{mib:.0} MiB"), s, mib / s, "MiB/s");
    if !out.contains(&format!("({size} bytes)")) {
        bail!("dafne cp did not copy back {size} bytes: {out}");
    }
    step("taking the cluster down");
    cluster.down();
    step("done");
    let report = Report { machine: dafne_bench::transport::machine(), io_servers, rows };
    println!("machine: {}\ncluster: `dafne up` defaults ({} io servers), FUSE mount\n", report.machine, io_servers);
    println!("| operation | amount | seconds | rate |");
    println!("|---|---|---|---|");
    for r in &report.rows {
        println!("| {} | {} | {:.2} | {:.0} {} |", r.what, r.amount, r.seconds, r.rate, r.unit);
    }
    crate::write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}
