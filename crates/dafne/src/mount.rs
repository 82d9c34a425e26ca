//! `dafne mount` and `dafne umount`: the FUSE mount of a running cluster.
//!
//! # Why a separate daemon process, spawned rather than forked
//! `dafne mount DIR` must return to the shell once the mount is live, while
//! something keeps serving the kernel's requests. UCX does not survive
//! `fork` (its worker threads, shared-memory segments and registered memory
//! belong to the parent), so the command does not fork after connecting:
//! it checks what it can (the mount point, the cluster), then starts
//! `dafne mount DIR --foreground` as a fresh, detached process (its own
//! process group, output to `DIR/logs/mount-<pid>.log`) and waits until the
//! mount point is mounted or the daemon exits, in which case the daemon's
//! error is the command's error. The daemon connects, mounts, records
//! itself (`DIR/mounts/<pid>`, so `dafne down` can unmount it) and serves
//! until the file system is unmounted (`dafne umount`, `fusermount3 -u`,
//! `dafne down`) or it gets SIGTERM/SIGINT/SIGHUP, which unmount first.
//!
//! Mistakes are refused before anything starts, each with what to do: a
//! mount point that does not exist, is not a directory, or is already a
//! mount point; no running cluster; a secret or `--credential` file that
//! others may read or that is damaged; a secret that does not match the
//! cluster, or a credential edited, issued elsewhere or revoked (the
//! metadata server refuses the session: the daemon's error says which).
//! With `--credential` the cluster secret is not read at all.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cluster::{self, ClusterInfo};

/// How long `dafne mount` waits for the daemon's mount to appear.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `dafne umount` waits for the daemon to exit after unmounting.
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Where to mount: an existing directory that is not a mount point.
    pub mountpoint: PathBuf,
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Serve in this process until unmounted, instead of returning once the
    /// mount is live.
    #[arg(long)]
    pub foreground: bool,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Registered memory for read-ahead of sequential reads, MiB, shared by
    /// all open files (0 turns read-ahead off). Each sequentially read file
    /// keeps up to 8 MiB (two stripes of the default layout) ahead of its
    /// reader, so the default serves 7 such files at once.
    #[arg(long, default_value_t = (dafne_client::readahead::DEFAULT_BUDGET >> 20) as u64)]
    pub readahead_mib: u64,
    /// Registered memory for write-behind, MiB, shared by all open files
    /// (0: every write waits for the io servers). A write returns once its
    /// bytes are in this memory; a failure after that is reported by the
    /// next write, fsync or close of the file.
    #[arg(long, default_value_t = (dafne_client::writebehind::DEFAULT_BUDGET >> 20) as u64)]
    pub write_behind_mib: u64,
    /// Write the client's counters (registrations, read-ahead,
    /// write-behind, and each FUSE operation's round trips to meta and the
    /// io servers: `op_<op>_calls/meta/io`) to this file, replaced whole:
    /// after every close of a file, once a second while they change, and
    /// at unmount (for diagnosis and tests).
    #[arg(long, value_name = "FILE")]
    pub stats_file: Option<PathBuf>,
    /// Honour setuid/setgid bits of programs on the mount (default:
    /// `nosuid`, since whoever may chmod on any mount of the cluster would
    /// otherwise choose a uid on this host).
    #[arg(long)]
    pub suid: bool,
    /// Honour device nodes on the mount (default: `nodev`, since whoever
    /// may mknod on the cluster would otherwise open this host's devices).
    #[arg(long)]
    pub dev: bool,
    /// Log in with this per-client credential (`dafne credential issue`)
    /// instead of the cluster secret, which is then not read: the mount's
    /// users act only as the uids and gids it allows, root as nobody
    /// unless it grants root.
    #[arg(long, value_name = "FILE")]
    pub credential: Option<PathBuf>,
    /// FUSE over io_uring: `auto` uses it where the kernel offers it
    /// (`/sys/module/fuse/parameters/enable_uring` is Y), else classic
    /// `/dev/fuse`; `on` refuses to mount without it; `off` never uses it.
    #[arg(long, value_name = "auto|on|off", default_value = "auto")]
    pub fuse_uring: dafne_fuse::ring::Uring,
}

#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    /// The mount point to unmount.
    pub mountpoint: PathBuf,
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne), to find the
    /// mount's daemon and wait for it.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// One line of /proc/self/mountinfo that matters here.
struct MountEntry {
    fstype: String,
    source: String,
}

impl MountEntry {
    /// A dafne FUSE mount (the kernel shows `fuse.dafne`, or `fuse` with
    /// source `dafne` when the subtype was not passed through).
    fn is_dafne(&self) -> bool {
        (self.fstype == "fuse.dafne" || self.fstype == "fuse") && self.source == "dafne"
    }
}

/// The mount at exactly `path` (an absolute path, not resolved further, so
/// that a dead FUSE mount, on which `stat` fails, is still found).
fn mount_at(path: &Path) -> Option<MountEntry> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().to_string_lossy();
    // The last matching line is the mount on top.
    info.lines().rev().find_map(|l| {
        let mut fields = l.split(' ');
        let mp = fields.nth(4)?;
        if dafne_fuse::unescape_mountinfo(mp) != want {
            return None;
        }
        let mut rest = l.split_once(" - ")?.1.split(' ');
        let fstype = rest.next().unwrap_or("").to_string();
        let source = dafne_fuse::unescape_mountinfo(rest.next().unwrap_or(""));
        Some(MountEntry { fstype, source })
    })
}

/// An absolute form of `path` that resolves the parent but not the last
/// component (which may be a dead mount).
fn absolute(path: &Path) -> Result<PathBuf> {
    let abs = std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent.canonicalize().map(|p| p.join(name)).unwrap_or(abs)),
        _ => Ok(abs),
    }
}

/// ENOTCONN, what `stat` of a FUSE mount whose daemon is gone fails with.
fn libc_enotconn() -> i32 {
    rustix::io::Errno::NOTCONN.raw_os_error()
}

/// Checks that `path` can be mounted on; returns its absolute form.
fn check_mountpoint(path: &Path) -> Result<PathBuf> {
    let abs = absolute(path)?;
    // mountinfo by the path as given (finds dead mounts, where stat fails)
    // and by the resolved path (finds a mount behind a symbolic link).
    if mount_at(&abs).is_some_and(|m| m.is_dafne())
        && std::fs::metadata(&abs).is_err_and(|e| e.raw_os_error() == Some(libc_enotconn()))
    {
        bail!(
            "{} is a dead dafne mount (its daemon exited; the kernel says \"transport endpoint is not connected\"): \
             `dafne umount {}` first",
            abs.display(),
            abs.display()
        );
    }
    if mount_at(&abs).is_some() || cluster::is_mount_point(&abs) {
        bail!(
            "{} is already a mount point (dafne or another file system): `dafne umount {}` first",
            abs.display(),
            abs.display()
        );
    }
    match std::fs::metadata(&abs) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("mount point {} is not a directory", abs.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("mount point {} does not exist: create it with `mkdir -p {}`", abs.display(), abs.display())
        }
        Err(e) => return Err(e).with_context(|| format!("mount point {}", abs.display())),
    }
    abs.canonicalize().with_context(|| format!("resolving {}", abs.display()))
}

pub fn mount(a: MountArgs) -> Result<()> {
    let mp = check_mountpoint(&a.mountpoint)?;
    let dir = cluster::resolve_dir(a.dir.as_deref())?;
    let info = ClusterInfo::load(&dir)?;
    // Each worker thread holds at most one bounce buffer at a time; the
    // data client keeps BOUNCE_KEEP of them registered, so up to that many
    // threads never register memory on the data path.
    let max_threads = dafne_client::data::BOUNCE_KEEP;
    if a.threads == 0 || a.threads > max_threads {
        bail!("--threads {}: choose between 1 and {max_threads} (one pre-registered 1 MiB buffer each)", a.threads);
    }
    // `--fuse-uring=on` where the kernel does not offer the ring is refused
    // here, not in the daemon's log.
    if a.fuse_uring == dafne_fuse::ring::Uring::On {
        if let dafne_fuse::ring::Offer::No(why) = dafne_fuse::ring::offer() {
            bail!("--fuse-uring=on: {why} (or mount with --fuse-uring=auto or off)");
        }
    }
    // A credential or secret this process cannot use is refused here, not
    // in the daemon's log.
    cluster::ClientLogin::load(&info, a.credential.as_deref())?;
    if a.foreground {
        serve(&info, &mp, &a)
    } else {
        spawn_daemon(&info, &mp, &a)
    }
}

/// Starts the daemon and waits until its mount is live.
fn spawn_daemon(info: &ClusterInfo, mp: &Path, a: &MountArgs) -> Result<()> {
    let logs = info.dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    // Named after the daemon's pid once it has one.
    let tmp_log = logs.join(format!("mount-starting-{}.log", std::process::id()));
    let log = std::fs::File::create(&tmp_log).with_context(|| format!("creating {}", tmp_log.display()))?;
    let exe = std::env::current_exe().context("locating the dafne executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg(mp).arg("--foreground").arg("--dir").arg(&info.dir);
    cmd.args(["--threads", &a.threads.to_string()]);
    cmd.args(["--readahead-mib", &a.readahead_mib.to_string()]);
    cmd.args(["--write-behind-mib", &a.write_behind_mib.to_string()]);
    if let Some(f) = &a.stats_file {
        check_stats_file(f)?;
        cmd.arg("--stats-file").arg(std::path::absolute(f)?);
    }
    if a.suid {
        cmd.arg("--suid");
    }
    cmd.arg(format!("--fuse-uring={}", a.fuse_uring));
    if a.dev {
        cmd.arg("--dev");
    }
    if let Some(f) = &a.credential {
        cmd.arg("--credential").arg(std::path::absolute(f)?);
    }
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the mount daemon")?;
    let log_path = logs.join(format!("mount-{}.log", child.id()));
    std::fs::rename(&tmp_log, &log_path).with_context(|| format!("naming {}", log_path.display()))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("{}", daemon_failure(&log_path, &format!("the mount daemon exited ({status})")));
        }
        // Both the mount and the daemon's record: `dafne down` finds mounts
        // by their record, so a mount reported before its record exists
        // could outlive a `down` run right after this command returns.
        if mount_at(mp).is_some_and(|m| m.is_dafne())
            && ClusterInfo::live_mounts(&info.dir).iter().any(|(pid, _)| *pid == child.id())
        {
            println!("mounted dafne at {} (daemon pid {}, log {})", mp.display(), child.id(), log_path.display());
            println!("`dafne umount {}` unmounts it.", mp.display());
            return Ok(());
        }
        if started.elapsed() > MOUNT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            if mount_at(mp).is_some() {
                let _ = Command::new("fusermount3").arg("-u").arg(mp).stderr(Stdio::null()).status();
            }
            bail!(
                "{}",
                daemon_failure(&log_path, &format!("the mount did not appear within {}s", MOUNT_TIMEOUT.as_secs()))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The daemon's own error lines first, then the tail of its log.
fn daemon_failure(log: &Path, what: &str) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let errors: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("error: ")).collect();
    let tail: Vec<&str> = text.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
    let mut msg = match errors.last() {
        Some(e) => format!("{e}\n({what}; its log, {}:)", log.display()),
        None => format!("{what}; its log, {}:", log.display()),
    };
    for l in tail {
        msg.push_str("\n  | ");
        msg.push_str(l);
    }
    msg
}

/// The daemon: connect, mount, serve until unmounted.
fn serve(info: &ClusterInfo, mp: &Path, a: &MountArgs) -> Result<()> {
    use dafne_client::data::DataClient;
    use dafne_client::MetaSession;

    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "fuse".into(),
        ucx_config: info.ucx.clone(),
        ..Default::default()
    })
    .context("starting the UCX runtime")?;
    let login = cluster::ClientLogin::load(info, a.credential.as_deref())?;
    let host = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let meta = MetaSession::connect(&rt, info.meta, &login.key, &format!("fuse@{host}"), 0, 0)
        .map_err(|e| crate::cluster::explain_connect(info, &login, e))
        .with_context(|| format!("connecting to the metadata server at {}", info.meta))?;
    let data = DataClient::connect(&rt, &info.io, &login.key)
        .map_err(|e| crate::cluster::explain_connect(info, &login, e))
        .context("connecting to the io servers")?;
    // Registered now, one per worker thread: FUSE data then leaves through
    // buffers registered before the first request.
    // With FUSE over io_uring, `threads` ring threads per CPU queue.
    let handlers = match a.fuse_uring {
        dafne_fuse::ring::Uring::Off => a.threads,
        _ if dafne_fuse::ring::offer() != dafne_fuse::ring::Offer::Yes => a.threads,
        _ => {
            let q = dafne_fuse::ring::queues();
            dafne_fuse::ring::threads_per_queue(a.threads, q) * q
        }
    };
    data.prefill_bounce(handlers).map_err(|e| anyhow::anyhow!("registering the I/O buffers: {e}"))?;
    let readahead = match a.readahead_mib {
        0 => None,
        mib => {
            let budget = mib_bytes(mib, "--readahead-mib")?;
            let config = dafne_client::readahead::ReadAheadConfig { budget, ..Default::default() };
            Some(
                dafne_client::readahead::ReadAhead::new(&data, config)
                    .with_context(|| format!("setting up {mib} MiB of read-ahead (--readahead-mib)"))?,
            )
        }
    };
    let write_behind = match a.write_behind_mib {
        0 => None,
        mib => {
            let budget = mib_bytes(mib, "--write-behind-mib")?;
            Some(
                dafne_client::writebehind::WriteBehind::new(&data, budget)
                    .map_err(|e| anyhow::anyhow!("registering {mib} MiB for write-behind (--write-behind-mib): {e}"))?,
            )
        }
    };
    let mut core = dafne_fuse::core::Core::new(meta, data);
    if let Some(ra) = readahead {
        core = core.with_readahead(ra);
    }
    if let Some(wb) = write_behind {
        core = core.with_write_behind(wb);
    }
    if let Some(f) = &a.stats_file {
        check_stats_file(f)?;
        core = core.with_stats_file(f.clone());
    }
    let opts = dafne_fuse::MountOptions {
        attr_ttl: Duration::from_millis(info.attr_timeout_ms),
        entry_ttl: Duration::from_millis(info.entry_timeout_ms),
        threads: a.threads,
        suid: a.suid,
        dev: a.dev,
        fuse_uring: a.fuse_uring,
    };
    let mut mounted = dafne_fuse::mount(core, mp, &opts)?;
    let pid = std::process::id();
    ClusterInfo::record_mount(&info.dir, pid, mp)?;
    // Signals unmount, which ends `serve` below.
    let mut unmounter = mounted.unmounter();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .context("installing signal handlers")?;
    let signal_handle = signals.handle();
    let mp_owned = mp.to_path_buf();
    let signal_thread = std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            eprintln!("signal {sig}: unmounting {}", mp_owned.display());
            if let Err(e) = unmounter.unmount() {
                eprintln!("error: unmounting {}: {e}", mp_owned.display());
            }
        }
    });
    eprintln!("mounted dafne at {} (pid {pid}; cluster {})", mp.display(), info.dir.display());
    let served = mounted.serve();
    signal_handle.close();
    let _ = signal_thread.join();
    ClusterInfo::forget_mount(&info.dir, pid);
    served?;
    eprintln!("unmounted {}", mp.display());
    Ok(())
}

pub fn umount(a: UmountArgs) -> Result<()> {
    let mp = absolute(&a.mountpoint)?;
    let Some(entry) = mount_at(&mp) else {
        if !mp.exists() {
            bail!("{} does not exist, so nothing is mounted there", mp.display());
        }
        bail!("{} is not mounted (`findmnt` lists what is)", mp.display());
    };
    if !entry.is_dafne() {
        bail!("{} is not a dafne mount (it is {}): use umount(8) for it", mp.display(), entry.fstype);
    }
    // The daemon, if the cluster directory knows it.
    let daemon = cluster::resolve_dir(a.dir.as_deref())
        .ok()
        .and_then(|dir| ClusterInfo::live_mounts(&dir).into_iter().find(|(_, p)| *p == mp).map(|(pid, _)| (dir, pid)));
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg(&mp)
        .stdin(Stdio::null())
        .output()
        .context("running fusermount3 (Debian package fuse3)")?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if why.contains("busy") {
            bail!(
                "{} is busy: a process has a file or its working directory there (`fuser -vm {}` shows which); \
                 close them and retry",
                mp.display(),
                mp.display()
            );
        }
        bail!("unmounting {} failed: {why}", mp.display());
    }
    if let Some((dir, pid)) = daemon {
        let started = Instant::now();
        while cluster::pid_alive(pid) {
            if started.elapsed() > DAEMON_EXIT_TIMEOUT {
                bail!(
                    "{} is unmounted, but its daemon (pid {pid}) did not exit within {}s",
                    mp.display(),
                    DAEMON_EXIT_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        ClusterInfo::forget_mount(&dir, pid);
    }
    println!("unmounted {}", mp.display());
    Ok(())
}

/// `mib` MiB in bytes, or an error naming the option when this machine
/// cannot address that much.
fn mib_bytes(mib: u64, option: &str) -> Result<usize> {
    usize::try_from(mib)
        .ok()
        .and_then(|m| m.checked_mul(1 << 20))
        .with_context(|| format!("{option} {mib} is more memory than this machine can address"))
}

/// Refuses a `--stats-file` the daemon could not write (a missing
/// directory, no permission) before mounting: the daemon writes it every
/// second while counters change, and would otherwise only log that it
/// cannot. The daemon writes `PATH.tmp` beside it and renames it over, so
/// the directory must be writable too. Creates the file if missing; an
/// existing one keeps its content until the daemon's first write.
fn check_stats_file(path: &Path) -> Result<()> {
    let hint = "choose a path in a writable directory";
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("--stats-file {}: cannot write it; {hint}", path.display()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, b"").and_then(|_| std::fs::remove_file(&tmp)).with_context(|| {
        format!("--stats-file {}: cannot write {} beside it; {hint}", path.display(), tmp.display())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_found_as_a_mount_and_a_fresh_directory_is_not() {
        assert!(mount_at(Path::new("/")).is_some());
        let d = std::env::temp_dir().join(format!("dafne-mount-unit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(mount_at(&d.canonicalize().unwrap()).is_none());
        assert!(check_mountpoint(&d).is_ok());
        let e = check_mountpoint(&d.join("missing")).unwrap_err().to_string();
        assert!(e.contains("does not exist") && e.contains("mkdir -p"), "{e}");
        std::fs::remove_dir(&d).unwrap();
    }
}
