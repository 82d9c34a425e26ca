//! The mount over FUSE-over-io_uring (`dafne mount --fuse-uring`), end to
//! end: a real cluster, a real mount in ring mode, ordinary file
//! operations with their bytes checked, and the mount's counters proving
//! the ring served them; `auto` falling back to `/dev/fuse` and `on`
//! refusing with the way to enable it when the kernel's parameter is off.
//!
//! The kernel's switch (`/sys/module/fuse/parameters/enable_uring`) is
//! global: each test sets what it needs (as root) and puts the previous
//! value back, also when a check fails. A kernel without the parameter
//! (before 6.14, or built without CONFIG_FUSE_IO_URING) skips the ring
//! tests with a printed reason; a kernel with it must serve the ring.

mod common;

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use common::cluster::{p, Cluster};
use common::{pattern, text};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Sets the kernel parameter; puts the old value back when dropped.
struct Param {
    old: String,
}

impl Param {
    /// `None` (after printing why) when the kernel has no FUSE ring.
    fn set(value: &str) -> Option<Param> {
        let Ok(old) = std::fs::read_to_string(PARAM) else {
            eprintln!(
                "SKIPPED: this kernel has no {PARAM} (FUSE over io_uring needs Linux 6.14+ with CONFIG_FUSE_IO_URING)"
            );
            return None;
        };
        std::fs::write(PARAM, value).unwrap_or_else(|e| panic!("setting {PARAM} to {value} (needs root): {e}"));
        Some(Param { old: old.trim().to_string() })
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(PARAM, &self.old) {
            eprintln!("could not restore {PARAM} to {}: {e}", self.old);
        }
    }
}

/// A counter the daemon wrote to its stats file at the last close.
fn stat(path: &Path, key: &str) -> u64 {
    let t = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    t.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {key} in {t}"))
}

/// create, write, read, rename, readdir, truncate, fsync, unlink through
/// the mount at `root`, every byte checked. Returns the number of files
/// it leaves behind.
fn exercise(root: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let dir = root.join("d");
    std::fs::create_dir(&dir).unwrap();
    // Sizes around the ring's copy limit (64 KiB) and its payload (1 MiB).
    let sizes = [0usize, 1, 4095, 65536, 65537, 1 << 20, (3 << 20) + 17];
    for (i, &n) in sizes.iter().enumerate() {
        let data = pattern(n, i as u64 + 1);
        let path = dir.join(format!("f{i}"));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert!(std::fs::read(&path).unwrap() == data, "f{i} ({n} bytes) reads back");
    }
    // Rewrite in the middle, then read back.
    let path = dir.join("f5");
    let mut want = pattern(1 << 20, 6);
    let patch = pattern(10_000, 99);
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(300_000)).unwrap();
    f.write_all(&patch).unwrap();
    f.sync_data().unwrap();
    drop(f);
    want[300_000..310_000].copy_from_slice(&patch);
    assert!(std::fs::read(&path).unwrap() == want, "a rewrite in the middle lands");
    // Truncate down and up.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(123_456).unwrap();
    f.set_len(200_000).unwrap();
    drop(f);
    let got = std::fs::read(&path).unwrap();
    assert_eq!(got.len(), 200_000);
    assert!(got[..123_456] == want[..123_456] && got[123_456..].iter().all(|&b| b == 0), "truncate keeps and zeroes");
    // Rename, readdir, unlink.
    std::fs::rename(dir.join("f1"), dir.join("renamed")).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["f0", "f2", "f3", "f4", "f5", "f6", "renamed"]);
    assert_eq!(std::fs::read(dir.join("renamed")).unwrap(), pattern(1, 2));
    for n in &names {
        std::fs::remove_file(dir.join(n)).unwrap();
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir(&dir).unwrap();
    // A last close, so that the stats file has the counts of all of it.
    std::fs::write(root.join("last"), b"last").unwrap();
}

#[test]
fn ring_mode_serves_the_file_operations_with_every_byte_right() {
    let _g = serial();
    let Some(_param) = Param::set("Y") else { return };
    let c = Cluster::start();
    let stats = c.dir().join("ring-stats.txt");
    // `on`: the mount fails rather than fall back, so a kernel that has the
    // parameter but cannot set the ring up fails this test.
    let m = c.mount_with(&["--fuse-uring=on", "--stats-file", p(&stats)]);
    exercise(&m.mp);
    let (ring, dev) = (stat(&stats, "fuse_requests_ring"), stat(&stats, "fuse_requests_dev"));
    eprintln!("requests: ring {ring}, /dev/fuse {dev}");
    // Tens of lookups, creates, writes, reads, fsyncs and closes above;
    // /dev/fuse sees only FORGETs and INTERRUPTs.
    assert!(ring >= 60, "the ring served {ring} requests");
    assert!(dev < ring / 4, "/dev/fuse served {dev} requests beside the ring's {ring}");
}

#[test]
fn auto_falls_back_to_dev_fuse_when_the_parameter_is_off() {
    let _g = serial();
    let Some(_param) = Param::set("N") else { return };
    let c = Cluster::start();
    let stats = c.dir().join("dev-stats.txt");
    // The daemon logs at info whatever DAFNE_LOG CI runs with (error): this
    // test reads its info line.
    let m = c.mount_at_env("mnt", &["--fuse-uring=auto", "--stats-file", p(&stats)], &[("DAFNE_LOG", "info")]);
    exercise(&m.mp);
    let (ring, dev) = (stat(&stats, "fuse_requests_ring"), stat(&stats, "fuse_requests_dev"));
    assert_eq!(ring, 0, "no ring without the parameter");
    assert!(dev >= 60, "/dev/fuse served {dev} requests");
    let log = std::fs::read_dir(c.dir().join("logs"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .collect::<String>();
    assert!(
        log.contains("serving the mount through /dev/fuse") && log.contains("enable_uring"),
        "the info line:\n{log}"
    );
}

#[test]
fn on_is_refused_with_how_to_enable_it_when_the_parameter_is_off() {
    let _g = serial();
    let Some(_param) = Param::set("N") else { return };
    let c = Cluster::start();
    let (mp, o) = c.try_mount_at("mnt", &["--fuse-uring=on"]);
    let t = text(&o);
    assert!(!o.status.success(), "mounted without the ring:\n{t}");
    assert!(t.contains("--fuse-uring=on") && t.contains(&format!("echo Y > {PARAM}")), "{t}");
    assert!(!common::cluster::mounted(&mp), "nothing is mounted");
    // A wrong value is a clear error too.
    let (_, o) = c.try_mount_at("mnt", &["--fuse-uring=maybe"]);
    assert!(!o.status.success() && text(&o).contains("auto, on or off"), "{}", text(&o));
}

/// A `python3 -c` process pinned to CPU 0 (so that its FUSE requests go
/// to ring queue 0), with its stdout lines read on a thread.
struct Pinned {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Pinned {
    fn start(code: &str, file: &Path) -> Pinned {
        use std::io::BufRead;
        let mut child = std::process::Command::new("taskset")
            .args(["-c", "0", "python3", "-c", code])
            .arg(file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("taskset and python3 (scripts/install-deps.sh installs them)");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { return };
                if tx.send(l.trim().to_string()).is_err() {
                    return;
                }
            }
        });
        Pinned { child, lines }
    }

    /// The next line within 30 s, if any.
    fn line(&self) -> Option<String> {
        self.lines.recv_timeout(std::time::Duration::from_secs(30)).ok()
    }
}

/// Kills and reaps the processes when dropped (also after a failed check).
struct Reaper(Vec<Pinned>);

impl Drop for Reaper {
    fn drop(&mut self) {
        // One whose FUSE request the daemon has taken cannot be killed
        // until it is answered: reap only those that go.
        for p in &mut self.0 {
            let c = &mut p.child;
            let _ = c.kill();
            for _ in 0..100 {
                if c.try_wait().is_ok_and(|s| s.is_some()) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

const HOLDER: &str = r#"
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
print("locked", flush=True)
sys.stdin.readline()
fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_UNLCK, 0, 0, 0, 0))
print("unlocked", flush=True)
"#;

const WAITER: &str = r#"
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLKW, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0))
print("got", flush=True)
"#;

/// A lock wait is answered later, from another thread: its ring entry
/// stays busy meanwhile. More waiters than the queue has entries, all on
/// CPU 0, and then the holder's unlock on CPU 0 too: the unlock must still
/// be served (it was not: every entry of queue 0 waited for a lock only
/// that unlock could free, while classic mode's workers read on).
#[test]
fn lock_waits_on_one_cpu_leave_its_ring_queue_able_to_serve_the_unlock() {
    let _g = serial();
    let Some(_param) = Param::set("Y") else { return };
    let c = Cluster::start();
    let stats = c.dir().join("lock-stats.txt");
    // Two ring threads per queue: three waiters are more than queue 0 has.
    let m = c.mount_with(&["--fuse-uring=on", "--threads", "2", "--stats-file", p(&stats)]);
    let file = m.mp.join("f");
    std::fs::write(&file, b"x").unwrap();
    let mut procs = Reaper(Vec::new());
    procs.0.push(Pinned::start(HOLDER, &file));
    assert_eq!(procs.0[0].line().as_deref(), Some("locked"));
    for _ in 0..3 {
        let w = Pinned::start(WAITER, &file);
        let pid = w.child.id();
        procs.0.push(w);
        let t = std::time::Instant::now();
        while std::fs::read_to_string(format!("/proc/{pid}/wchan")).map_or(true, |w| w != "request_wait_answer") {
            assert!(t.elapsed().as_secs() < 30, "waiter {pid} never waited in a FUSE request");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Its lock request, not its open: give the open's reply time.
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    use std::io::Write;
    let holder = &mut procs.0[0].child;
    writeln!(holder.stdin.as_mut().unwrap(), "u").unwrap();
    holder.stdin.as_mut().unwrap().flush().unwrap();
    let unlocked = procs.0[0].line();
    if unlocked.as_deref() != Some("unlocked") {
        // Stuck: kill the daemon, which frees the waiters and the unmount.
        for e in std::fs::read_dir(c.dir().join("mounts")).unwrap() {
            let pid = e.unwrap().file_name().to_string_lossy().into_owned();
            let _ = std::process::Command::new("kill").args(["-9", &pid]).status();
        }
        panic!("the unlock on CPU 0 was never served ({unlocked:?}): the waiters hold every ring entry of queue 0");
    }
    for w in &procs.0[1..] {
        assert_eq!(w.line().as_deref(), Some("got"), "a waiter was not granted its read lock");
    }
    drop(procs);
    std::fs::write(m.mp.join("last"), b"last").unwrap();
    assert!(stat(&stats, "fuse_requests_ring") > 0, "the ring served the requests");
}
