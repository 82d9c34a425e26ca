//! `dafne bench posix`: unmodified programs (fio, PostMark) on a fresh dafne
//! mount, beside the FUSE ceiling (`bindfs --multithreaded` over tmpfs),
//! the same fio rows under the interception library (`LD_PRELOAD`
//! `libdafne_preload.so` on the mount: ORFA beside ORFS, seed 001/002) and,
//! where a row allows it, beside the client library without the kernel.
//!
//! # Why this shape
//! A figure through FUSE means little alone: FUSE's own round trips and
//! copies bound it. The same row on bindfs over tmpfs, whose storage costs
//! almost nothing, measures that bound on the same machine in the same
//! minute, so `dafne / ceiling` is the share of the FUSE path dafne uses.
//! The systems take turns within each row and run (their order rotates from
//! run to run), so a burst of load from the other users of a shared machine
//! falls on both sides rather than on one column. The CPU time of the
//! serving processes per GB moved says what each figure costs.
//!
//! Every system keeps its data on tmpfs: the cluster's directory (the io
//! servers' chunk files, the metadata store) and bindfs's source directory
//! are under `--scratch`, which must be a tmpfs. fio's files are laid out
//! once per system before any row (so reads never time fio's layout, and
//! writes overwrite the same files everywhere). The rows, the parsers and
//! the report live in `dafne_bench::posix`; this file starts and stops
//! things. Whatever ends the run (an error, Ctrl-C, SIGTERM), the guards
//! unmount bindfs, take the cluster down and remove the scratch directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dafne_bench::posix::{self, PostmarkSettings, Report, Row, RowResult, Sample, Tool};
use dafne_client::Errno;
use dafne_proto::io::Stability;
use dafne_transport::Access;

use crate::benchmount::ScratchCluster;
use crate::cluster::ClusterInfo;
use crate::copy::{errno, parent_of, Session};

/// tmpfs's `f_type` (linux/magic.h `TMPFS_MAGIC`).
const TMPFS_MAGIC: u64 = 0x0102_1994;
/// The native rows' request size: fio's block size for the sequential rows.
const NATIVE_BLOCK: usize = 128 << 10;
/// How long a stopping bindfs may take before it is killed.
const BINDFS_EXIT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct PosixBench {
    /// A short pass: 1 run, 256 MiB per fio job, 2,000 PostMark
    /// transactions, fio rows stop after 10 s (each setting below wins).
    #[arg(long)]
    pub quick: bool,
    /// Runs of every row on every system; the table shows medians (default 3, --quick 1).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Rows to run (comma-separated): seq-write-1, seq-write-4, seq-read-1,
    /// seq-read-4, randread-qd16, randread-4, postmark. Default: all.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
    /// Bytes per fio job, each job its own file (K/M/G; default 1G, --quick 256M).
    #[arg(long)]
    pub size: Option<String>,
    /// A fio row stops at --size or after this many seconds, whichever
    /// comes first (default 30, --quick 10).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// PostMark transactions (default 20000, --quick 2000).
    #[arg(long)]
    pub transactions: Option<u32>,
    /// A tmpfs directory for every system's data (a fresh directory inside).
    #[arg(long, default_value = "/dev/shm")]
    pub scratch: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/posix.json")]
    pub json: PathBuf,
    /// Extra arguments for the dafne mount, e.g. `--mount-args=--write-behind-mib=0`
    /// to measure without write-behind (repeat or separate with commas).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub mount_args: Vec<String>,
    /// The interception library for the preload column (default:
    /// libdafne_preload.so beside this dafne executable, where `cargo build`
    /// puts it).
    #[arg(long)]
    pub preload_lib: Option<PathBuf>,
    /// Leave out the preload column.
    #[arg(long)]
    pub no_preload: bool,
}

/// The systems a row runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Dafne,
    Ceiling,
    Native,
    Preload,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Dafne => "dafne",
            System::Ceiling => "bindfs",
            System::Native => "native",
            System::Preload => "preload",
        }
    }
}

/// Set by SIGINT, SIGTERM and SIGHUP: the run stops at the next check and
/// its guards clean up.
pub(crate) struct Stop(Arc<AtomicBool>);

impl Stop {
    pub(crate) fn install() -> Result<Stop> {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
            signal_hook::flag::register(sig, flag.clone()).context("installing signal handlers")?;
        }
        Ok(Stop(flag))
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.0.load(Ordering::Relaxed) {
            bail!("interrupted: cleaning up (unmounting, stopping the cluster, removing the scratch directory)");
        }
        Ok(())
    }
}

/// Runs a program to its end, its stdout and stderr into files under
/// `logs`; kills it when the run is interrupted. Returns its stdout and the
/// wall time from spawn to exit.
fn run_tool(stop: &Stop, logs: &Path, tag: &str, program: &str, args: &[String]) -> Result<(String, f64)> {
    run_tool_env(stop, logs, tag, program, args, &[])
}

/// [`run_tool`] with more environment.
fn run_tool_env(
    stop: &Stop,
    logs: &Path,
    tag: &str,
    program: &str,
    args: &[String],
    env: &[(&str, std::ffi::OsString)],
) -> Result<(String, f64)> {
    let out_path = logs.join(format!("{tag}.out"));
    let err_path = logs.join(format!("{tag}.err"));
    let out = std::fs::File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?;
    let err = std::fs::File::create(&err_path).with_context(|| format!("creating {}", err_path.display()))?;
    let t = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if stop.0.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            stop.check()?;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let seconds = t.elapsed().as_secs_f64();
    // A Ctrl-C at the terminal reaches the tool too: say so, not its exit.
    stop.check()?;
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        bail!("`{program} {}` failed ({status}):\n{stdout}{stderr}", args.join(" "));
    }
    Ok((stdout, seconds))
}

/// `bindfs --multithreaded` of a tmpfs directory, in the foreground as our
/// child (its own process group, so a Ctrl-C reaches us, not it, and the
/// guard unmounts it in order). Dropping it unmounts and reaps it.
struct Bindfs {
    child: Child,
    mnt: PathBuf,
}

impl Bindfs {
    fn start(src: &Path, mnt: &Path, log: &Path) -> Result<Bindfs> {
        use std::os::unix::process::CommandExt;
        std::fs::create_dir_all(src)?;
        std::fs::create_dir_all(mnt)?;
        let log = std::fs::File::create(log)?;
        // big_writes: bindfs links libfuse 2, which otherwise has the kernel
        // send buffered writes a page at a time (fuse 3, as dafne's fuser,
        // always allows large ones); without it the ceiling would be lower
        // than FUSE allows.
        let child = Command::new("bindfs")
            .args(["--multithreaded", "-o", "big_writes", "-f"])
            .arg(src)
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("starting bindfs")?;
        let mut b = Bindfs { child, mnt: mnt.to_path_buf() };
        let t = Instant::now();
        while !crate::cluster::is_mount_point(mnt) {
            if let Some(st) = b.child.try_wait()? {
                bail!("bindfs exited ({st}) before mounting {}", mnt.display());
            }
            if t.elapsed() > Duration::from_secs(10) {
                bail!("bindfs did not mount {} within 10 s", mnt.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(b)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Bindfs {
    fn drop(&mut self) {
        // libfuse 2's helper; as root plain umount would do as well.
        let _ = Command::new("fusermount").arg("-u").arg(&self.mnt).stderr(Stdio::null()).status();
        let t = Instant::now();
        while t.elapsed() < BINDFS_EXIT {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).stderr(Stdio::null()).status();
    }
}

/// Processes whose CPU time a column counts.
struct Counted(Vec<(String, u32)>);

impl Counted {
    fn cpu_seconds(&self) -> Result<f64> {
        let mut s = 0.0;
        for (name, pid) in &self.0 {
            s += posix::process_cpu_seconds(*pid).with_context(|| format!("CPU time of {name}"))?;
        }
        Ok(s)
    }

    fn describe(&self) -> String {
        self.0.iter().map(|(n, p)| format!("{n} (pid {p})")).collect::<Vec<_>>().join(" + ")
    }
}

/// Everything a row needs to run on any system.
struct Bench<'a> {
    stop: &'a Stop,
    logs: PathBuf,
    size: u64,
    runtime_s: u64,
    postmark: PostmarkSettings,
    /// Each system's directory for fio files and PostMark.
    dafne_dir: PathBuf,
    ceiling_dir: PathBuf,
    dafne_cpu: Counted,
    ceiling_cpu: Counted,
    native_cpu: Counted,
    native: Option<Session>,
    fio_version: String,
    /// The interception library and the cluster directory it finds the
    /// mount by (None: no preload column).
    preload: Option<(PathBuf, PathBuf)>,
    preload_cpu: Counted,
}

impl Bench<'_> {
    fn measure(&mut self, sys: System, row: Row, run: usize) -> Result<Sample> {
        self.stop.check()?;
        let tag = format!("run{run}-{}-{}", row.id(), sys.name());
        let (dir, counted) = match sys {
            System::Dafne => (&self.dafne_dir, &self.dafne_cpu),
            System::Ceiling => (&self.ceiling_dir, &self.ceiling_cpu),
            System::Native => (&self.dafne_dir, &self.native_cpu),
            System::Preload => (&self.dafne_dir, &self.preload_cpu),
        };
        let before = counted.cpu_seconds()?;
        let mut sample = if sys == System::Native {
            let s = self.native.as_ref().context("the native client is not connected")?;
            let t = Instant::now();
            let bytes = match row {
                Row::SeqWrite1 => native_write(s, self.stop, self.size)?,
                Row::SeqRead1 => native_read(s, self.stop, self.size)?,
                _ => bail!("row {} has no native form", row.id()),
            };
            let seconds = t.elapsed().as_secs_f64();
            let value = bytes as f64 / (1 << 20) as f64 / seconds;
            Sample { value, bytes, seconds, cpu_seconds: 0.0, fio: None, postmark: None }
        } else if let Some(mut args) = row.fio_args(dir, self.size, self.runtime_s) {
            let mut env = Vec::new();
            let stats = self.logs.join(format!("{tag}.preload-stats"));
            if sys == System::Preload {
                let (lib, cluster) = self.preload.as_ref().context("no interception library")?;
                env.push(("LD_PRELOAD", lib.clone().into_os_string()));
                env.push(("DAFNE_HOME", cluster.clone().into_os_string()));
                env.push(("DAFNE_PRELOAD_STATS", stats.clone().into_os_string()));
                // Jobs as threads: a forked job of a process that started
                // UCX cannot start it again (the library's notes on fork).
                args.push("--thread".into());
            }
            let (out, seconds) = run_tool_env(self.stop, &self.logs, &tag, "fio", &args, &env)?;
            if sys == System::Preload {
                check_preloaded(&stats, &tag)?;
            }
            let fio = posix::parse_fio(&out).with_context(|| format!("{tag}: fio's report"))?;
            self.fio_version.clone_from(&fio.version);
            let value = match row.unit() {
                posix::Unit::MibPerS => fio.bw_bytes / (1 << 20) as f64,
                _ => fio.iops,
            };
            Sample { value, bytes: fio.bytes(), seconds, cpu_seconds: 0.0, fio: Some(fio), postmark: None }
        } else {
            // PostMark, in a fresh directory each time (it removes its files).
            let location = dir.join(format!("postmark-{run}"));
            std::fs::create_dir_all(&location).with_context(|| format!("creating {}", location.display()))?;
            let cfg = self.logs.join(format!("{tag}.pmrc"));
            std::fs::write(&cfg, self.postmark.config(&location))?;
            let (out, seconds) = run_tool(self.stop, &self.logs, &tag, "postmark", &[cfg.display().to_string()])?;
            let pm = posix::parse_postmark(&out).with_context(|| format!("{tag}: PostMark's report"))?;
            let _ = std::fs::remove_dir_all(&location);
            let value = self.postmark.transactions as f64 / seconds;
            Sample { value, bytes: pm.bytes(), seconds, cpu_seconds: 0.0, fio: None, postmark: Some(pm) }
        };
        sample.cpu_seconds = counted.cpu_seconds()? - before;
        Ok(sample)
    }
}

/// Fails unless the interception library served the run: its counters
/// (one JSON line per process) show opens and bytes, no failed connection.
fn check_preloaded(stats: &Path, tag: &str) -> Result<()> {
    let text = std::fs::read_to_string(stats)
        .with_context(|| format!("{tag}: the interception library wrote no counters to {}", stats.display()))?;
    let (mut opens, mut bytes, mut failures) = (0, 0, 0);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("{tag}: {line:?}"))?;
        let n = |k: &str| v[k].as_u64().unwrap_or(0);
        opens += n("opens");
        bytes += n("read_bytes") + n("write_bytes");
        failures += n("connect_failures") + n("opens_fallback");
    }
    if opens == 0 || bytes == 0 || failures > 0 {
        bail!("{tag}: the interception library did not serve fio ({opens} opens, {bytes} bytes, {failures} fallbacks): {text}");
    }
    Ok(())
}

/// Writes `/native-seq` from one registered 128 KiB region, one request at
/// a time (fio's psync job through the library), then publishes the size
/// as the mount's `close` does. Returns the bytes written.
fn native_write(s: &Session, stop: &Stop, size: u64) -> Result<u64> {
    let path = "/native-seq";
    let (parent, name) = parent_of(&s.meta, path)?;
    let attr = match s.meta.create(parent, &name, 0o644, true) {
        Ok(a) => a,
        Err(Errno::EEXIST) => s.meta.lookup(parent, &name).map_err(|e| errno("looking up", path, e))?,
        Err(e) => return Err(errno("creating", path, e)),
    };
    let off = native_loop(s, stop, path, attr.ino, dafne_proto::OPEN_WRITE, 0x5a, size, |f, off, region, n| {
        futures::executor::block_on(s.data.write_region(f, off, region, 0, n, Stability::Unstable))
            .map(|_| ())
            .map_err(|e| errno("writing", path, e))
    })?;
    s.meta
        .setattr(attr.ino, dafne_proto::SetAttr { size: Some(off), ..Default::default() })
        .map_err(|e| errno("setting the size of", path, e))?;
    Ok(off)
}

/// Reads `/native-seq` into one registered 128 KiB region, one request at
/// a time. Returns the bytes read.
fn native_read(s: &Session, stop: &Stop, size: u64) -> Result<u64> {
    let path = "/native-seq";
    let attr = s.meta.resolve(path).map_err(|e| errno("resolving", path, e))?;
    if attr.size < size {
        bail!("dafne:{path} holds {} bytes, not {size}", attr.size);
    }
    native_loop(s, stop, path, attr.ino, dafne_proto::OPEN_READ, 0, size, |f, off, region, n| {
        futures::executor::block_on(s.data.read_region(f, off, region, 0, n))
            .map(|_| ())
            .map_err(|e| errno("reading", path, e))
    })
}

/// Opens `ino`, moves `size` bytes through one registered `NATIVE_BLOCK`
/// region with `io` one request at a time (checking for a stop every 64
/// MiB), and closes the open again. Returns the bytes moved.
#[allow(clippy::too_many_arguments)]
fn native_loop(
    s: &Session,
    stop: &Stop,
    path: &str,
    ino: dafne_proto::Ino,
    flags: u32,
    fill: u8,
    size: u64,
    mut io: impl FnMut(&dafne_client::OpenFile, u64, &dafne_transport::Region, usize) -> Result<()>,
) -> Result<u64> {
    let f = s.meta.open(ino, flags).map_err(|e| errno("opening", path, e))?;
    let moved = (|| {
        let region = s
            .data
            .register(vec![fill; NATIVE_BLOCK], Access::RemoteReadWrite)
            .map_err(|e| anyhow::anyhow!("registering the native buffer: {e}"))?;
        let mut off = 0u64;
        while off < size {
            if off.is_multiple_of(64 << 20) {
                stop.check()?;
            }
            let n = (size - off).min(NATIVE_BLOCK as u64) as usize;
            io(&f, off, &region, n)?;
            off += n as u64;
        }
        Ok(off)
    })();
    // The open holds the file's data in meta until it is released.
    let _ = futures::executor::block_on(s.meta.close_async(f.layout.object_id));
    moved
}

fn is_tmpfs(p: &Path) -> Result<bool> {
    let st = rustix::fs::statfs(p).with_context(|| format!("statfs {}", p.display()))?;
    #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between targets
    Ok(st.f_type as u64 == TMPFS_MAGIC)
}

pub fn run(a: PosixBench, parse_size: impl Fn(&str) -> Result<usize>) -> Result<()> {
    let rows: Vec<Row> = if a.rows.is_empty() {
        Row::ALL.to_vec()
    } else {
        a.rows
            .iter()
            .map(|r| {
                Row::parse(r.trim()).with_context(|| {
                    let all: Vec<_> = Row::ALL.iter().map(|r| r.id()).collect();
                    format!("unknown row {r:?}: choose among {}", all.join(", "))
                })
            })
            .collect::<Result<_>>()?
    };
    let runs = a.runs.unwrap_or(if a.quick { 1 } else { 3 });
    let size = parse_size(a.size.as_deref().unwrap_or(if a.quick { "256M" } else { "1G" }))? as u64;
    let runtime_s = a.runtime.unwrap_or(if a.quick { 10 } else { 30 });
    let transactions = a.transactions.unwrap_or(if a.quick { 2000 } else { 20_000 });
    if runs == 0 || runtime_s == 0 || transactions == 0 {
        bail!("--runs, --runtime and --transactions must be at least 1");
    }
    if size < NATIVE_BLOCK as u64 || !size.is_multiple_of(NATIVE_BLOCK as u64) {
        bail!("--size must be a multiple of 128 KiB (the sequential rows' block)");
    }
    // Every missing program at once, before anything starts.
    let mut tools = vec![Tool::Bindfs];
    if rows.iter().any(|r| *r != Row::Postmark) {
        tools.push(Tool::Fio);
    }
    if rows.contains(&Row::Postmark) {
        tools.push(Tool::Postmark);
    }
    let missing: Vec<String> = tools.iter().filter_map(|t| t.check().err()).map(|e| e.to_string()).collect();
    if !missing.is_empty() {
        bail!("{}", missing.join("\n"));
    }
    if !is_tmpfs(&a.scratch)? {
        bail!(
            "--scratch {} is not a tmpfs: every system keeps its data on tmpfs here (the default is /dev/shm)",
            a.scratch.display()
        );
    }
    let stop = Stop::install()?;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());

    // Declared in this order so that they are dropped in the reverse one:
    // the native client, bindfs, then the cluster (unmount, down) and the
    // scratch directory.
    let root = a.scratch.join(format!("dafne-bench-posix-{}", std::process::id()));
    step(&format!("starting a cluster (dafne up) in {} and mounting it", root.display()));
    let mut cluster = ScratchCluster::start(&root, &a.mount_args)?;
    let logs = root.join("logs");
    std::fs::create_dir_all(&logs)?;
    step("mounting bindfs --multithreaded over a tmpfs directory");
    let bindfs = Bindfs::start(&root.join("bindfs-src"), &root.join("bindfs-mnt"), &logs.join("bindfs.log"))?;
    stop.check()?;

    let daemon = ClusterInfo::live_mounts(&cluster.dir)
        .into_iter()
        .find(|(_, mp)| mp == &cluster.mnt)
        .map(|(pid, _)| pid)
        .context("the dafne mount's daemon is not recorded in the cluster directory")?;
    let servers: Vec<(String, u32)> = dafne_cluster::load_states(&cluster.dir)
        .into_iter()
        .filter(|s| s.state == "running" && s.pid != 0)
        .map(|s| (s.name, s.pid))
        .collect();
    if servers.len() != 1 + cluster.io_servers as usize {
        bail!("expected meta and {} io servers running, found {servers:?}", cluster.io_servers);
    }
    let mut dafne_cpu = vec![("FUSE daemon".to_string(), daemon)];
    dafne_cpu.extend(servers.iter().cloned());
    let mut native_cpu = vec![("this process (client library)".to_string(), std::process::id())];
    native_cpu.extend(servers.iter().cloned());
    let preload = if a.no_preload || !rows.iter().any(|r| r.has_preload()) {
        None
    } else {
        let lib = match &a.preload_lib {
            Some(l) => l.clone(),
            None => std::env::current_exe()?.with_file_name("libdafne_preload.so"),
        };
        if !lib.is_file() {
            bail!(
                "the interception library {} is missing: build it (`cargo build --release -p dafne-preload`), \
                 name it with --preload-lib, or leave the column out with --no-preload",
                lib.display()
            );
        }
        Some((lib, cluster.dir.clone()))
    };
    let native = if rows.iter().any(|r| r.has_native()) {
        Some(crate::copy::connect(&cluster.dir, "bench-posix", None)?)
    } else {
        None
    };
    let mut b = Bench {
        stop: &stop,
        logs: logs.clone(),
        size,
        runtime_s,
        postmark: PostmarkSettings::issue9(transactions),
        dafne_dir: cluster.mnt.join("bench"),
        ceiling_dir: bindfs.mnt.join("bench"),
        dafne_cpu: Counted(dafne_cpu),
        ceiling_cpu: Counted(vec![("bindfs".to_string(), bindfs.pid())]),
        native_cpu: Counted(native_cpu),
        native,
        fio_version: String::new(),
        preload,
        preload_cpu: Counted(servers.clone()),
    };
    step(&format!("counted for dafne: {}", b.dafne_cpu.describe()));
    step(&format!("counted for bindfs: {}", b.ceiling_cpu.describe()));

    // fio's files, once per system.
    let jobs = rows.iter().map(|r| r.jobs()).max().unwrap_or(0);
    for (sys, dir) in [(System::Dafne, b.dafne_dir.clone()), (System::Ceiling, b.ceiling_dir.clone())] {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if jobs > 0 {
            step(&format!("laying out {jobs} file(s) of {} MiB on {}", size >> 20, sys.name()));
            run_tool(&stop, &logs, &format!("layout-{}", sys.name()), "fio", &posix::layout_args(&dir, size, jobs))?;
        }
    }
    if let Some(s) = &b.native {
        step("laying out the native client's file");
        native_write(s, &stop, size)?;
    }

    let mut results: Vec<RowResult> = rows.iter().map(|&r| RowResult::new(r)).collect();
    for run in 0..runs {
        for res in results.iter_mut() {
            let row = res.row;
            let mut systems = vec![System::Dafne, System::Ceiling];
            if row.has_preload() && b.preload.is_some() {
                systems.push(System::Preload);
            }
            if row.has_native() {
                systems.push(System::Native);
            }
            // The order rotates from run to run.
            let k = run % systems.len();
            systems.rotate_left(k);
            for sys in systems {
                step(&format!("run {}/{runs}: {} on {}", run + 1, row.id(), sys.name()));
                let s = b.measure(sys, row, run)?;
                eprintln!(
                    "          {:.0} {} ({:.2} s, {:.0} MiB moved, {:.2} CPU s/GB)",
                    s.value,
                    row.unit().label(),
                    s.seconds,
                    s.bytes as f64 / (1 << 20) as f64,
                    s.cpu_s_per_gb()
                );
                match sys {
                    System::Dafne => res.dafne.push(s),
                    System::Ceiling => res.ceiling.push(s),
                    System::Native => res.native.get_or_insert_with(Default::default).push(s),
                    System::Preload => res.preload.get_or_insert_with(Default::default).push(s),
                }
            }
        }
    }

    let cpu_counted = vec![
        ("dafne".to_string(), b.dafne_cpu.describe()),
        ("bindfs ceiling".to_string(), b.ceiling_cpu.describe()),
        ("dafne native".to_string(), b.native_cpu.describe()),
        (
            "dafne preload".to_string(),
            format!("{} (the client library runs inside fio, not counted)", b.preload_cpu.describe()),
        ),
        (
            "not counted".to_string(),
            "the workload's own process (fio, PostMark: its system time includes the kernel's FUSE and \
             page-cache work done on its behalf) and kernel threads"
                .to_string(),
        ),
    ];
    let report = Report {
        machine: dafne_bench::transport::machine(),
        runs,
        quick: a.quick,
        size,
        fio_runtime_s: runtime_s,
        postmark: b.postmark,
        fio_version: b.fio_version.clone(),
        mount_args: a.mount_args.clone(),
        cpu_counted,
        rows: results,
    };
    drop(b);
    step("unmounting bindfs, taking the cluster down");
    drop(bindfs);
    cluster.down();
    drop(cluster);
    step("done");
    println!("{}", report.to_markdown());
    crate::write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}
