//! Locks across mounts (issue 11, item 1): `fcntl`, OFD and `flock` locks
//! taken through one FUSE mount of a cluster exclude processes on another,
//! waiters are woken when the range frees, a deadlock between mounts is
//! reported, a dead mount's locks pass on after its lease, and locks held
//! across a metadata server restart are claimed back before anyone else
//! can take them. Every test runs real servers, two real mounts and real
//! processes (python3's `fcntl` module, util-linux's `flock`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::cluster::{p, Cluster, Mount};
use common::wait_for;

/// The mount tests share the FUSE device and the machine's two cores.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A process that takes and drops locks on one file when told to, one
/// command per line on stdin, one answer per line on stdout:
/// `open` (a new descriptor, the old one closed), `posix KIND START LEN
/// WAIT`, `ofd KIND START LEN WAIT`, `flock KIND WAIT` (KIND is r, w or u),
/// `getlk KIND START LEN` (answers `none` or `KIND START LEN PID`), `close`.
/// Answers `ok` or `err NAME`.
const LOCKER: &str = r#"
import errno, fcntl, os, struct, sys
path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
KINDS = {"r": fcntl.F_RDLCK, "w": fcntl.F_WRLCK, "u": fcntl.F_UNLCK}
NAMES = {v: k for k, v in KINDS.items()}
def flock_struct(kind, start, length):
    return struct.pack("hhqqi", KINDS[kind], 0, int(start), int(length), 0)
for line in sys.stdin:
    a = line.split()
    try:
        if a[0] == "open":
            os.close(fd)
            fd = os.open(path, os.O_RDWR)
        elif a[0] == "close":
            os.close(fd)
            fd = -1
        elif a[0] == "posix":
            cmd = fcntl.F_SETLKW if a[4] == "wait" else fcntl.F_SETLK
            fcntl.fcntl(fd, cmd, flock_struct(a[1], a[2], a[3]))
        elif a[0] == "ofd":
            cmd = fcntl.F_OFD_SETLKW if a[4] == "wait" else fcntl.F_OFD_SETLK
            fcntl.fcntl(fd, cmd, flock_struct(a[1], a[2], a[3]))
        elif a[0] == "flock":
            op = {"r": fcntl.LOCK_SH, "w": fcntl.LOCK_EX, "u": fcntl.LOCK_UN}[a[1]]
            fcntl.flock(fd, op if a[2] == "wait" else op | fcntl.LOCK_NB)
        elif a[0] == "getlk":
            got = fcntl.fcntl(fd, fcntl.F_GETLK, flock_struct(a[1], a[2], a[3]))
            kind, _, start, length, pid = struct.unpack("hhqqi", got)
            if kind == fcntl.F_UNLCK:
                print("none", flush=True)
                continue
            print(NAMES[kind], start, length, pid, flush=True)
            continue
        print("ok", flush=True)
    except OSError as e:
        name = "EDEADLK" if e.errno == errno.EDEADLK else errno.errorcode.get(e.errno, str(e.errno))
        print("err", name, flush=True)
"#;

/// A counter in a 20-byte field, incremented `n` times under a lock.
/// `posix`: one descriptor for the whole run, `lockf` around each step
/// (nothing but the lock makes the other mounts' writes visible); `ofd`
/// and `flock`: a fresh descriptor per step, locked, closed (the close
/// releases the lock).
const COUNTER: &str = r#"
import fcntl, os, struct, sys
path, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def step(fd):
    v = int(os.pread(fd, 20, 0).decode().strip() or "0")
    os.pwrite(fd, ("%-19d\n" % (v + 1)).encode(), 0)
if mode == "posix":
    fd = os.open(path, os.O_RDWR)
    for _ in range(n):
        fcntl.lockf(fd, fcntl.LOCK_EX)
        step(fd)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    os.close(fd)
else:
    for _ in range(n):
        fd = os.open(path, os.O_RDWR)
        if mode == "ofd":
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        elif mode == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX)
        step(fd)
        os.close(fd)
"#;

struct Locker {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<String>,
}

/// The longest a test waits for a lock that should come.
const PATIENCE: Duration = Duration::from_secs(60);

impl Locker {
    fn start(script: &Path, file: &Path) -> Locker {
        let mut child = Command::new("python3")
            .arg(script)
            .arg(file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 (scripts/install-deps.sh installs it)");
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, answers) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line.trim().to_string()).is_err() {
                    return;
                }
            }
        });
        Locker { child, stdin, answers }
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self) -> String {
        self.answers.recv_timeout(PATIENCE).expect("no answer from the locker")
    }

    /// Waits until the process is blocked in a FUSE request (its lock
    /// request, once it has sent one that waits).
    fn blocked(&self) {
        blocked_in_fuse(self.child.id());
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.answer()
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

/// Kills a child and reaps it if it goes within 2 s. One killed while it
/// waits for a lock stays until the lock is granted (the mount does not
/// handle FUSE interrupts) or the mount goes: the test's cleanup must not
/// wait for it (after a failed assertion, its lock may never come).
fn reap(child: &mut Child) {
    let _ = child.kill();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if child.try_wait().is_ok_and(|s| s.is_some()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until process `pid` sleeps in a FUSE request (the kernel's
/// `request_wait_answer`): a lock request that waits, once sent.
fn blocked_in_fuse(pid: u32) {
    wait_for("the process to wait in a FUSE request", || {
        std::fs::read_to_string(format!("/proc/{pid}/wchan")).is_ok_and(|w| w == "request_wait_answer")
    });
}

fn script(c: &Cluster, name: &str, text: &str) -> std::path::PathBuf {
    let path = c.scratch("scripts").join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn two_mounts(c: &Cluster) -> (Mount, Mount) {
    (c.mount_at("a", &[]), c.mount_at("b", &[]))
}

/// What most tests here start from: a cluster, two mounts of it (`a`,
/// `b`), the locker script, and a file `f`. Bind it as `let Setup { _g,
/// c, locker, a, b } = setup();` (`c: _c` where unused, never `c: _`):
/// locals drop in reverse, so the mounts go before the cluster and the
/// serial guard last.
struct Setup {
    a: Mount,
    b: Mount,
    locker: std::path::PathBuf,
    c: Cluster,
    _g: MutexGuard<'static, ()>,
}

fn setup() -> Setup {
    let _g = serial();
    let c = Cluster::start();
    let (a, b) = two_mounts(&c);
    let locker = script(&c, "locker.py", LOCKER);
    std::fs::write(a.path("f"), b"x").unwrap();
    Setup { a, b, locker, c, _g }
}

#[test]
fn a_counter_incremented_under_locks_on_two_mounts_ends_exact() {
    let _g = serial();
    let c = Cluster::start();
    let (a, b) = two_mounts(&c);
    let counter = script(&c, "counter.py", COUNTER);
    for mode in ["posix", "ofd", "flock"] {
        std::fs::write(a.path("counter"), format!("{:<19}\n", 0)).unwrap();
        let mut procs: Vec<Child> = [&a, &b, &a, &b]
            .iter()
            .map(|m| Command::new("python3").arg(&counter).arg(m.path("counter")).args(["100", mode]).spawn().unwrap())
            .collect();
        for p in &mut procs {
            assert!(p.wait().unwrap().success(), "{mode}: a counter process failed");
        }
        let v = std::fs::read_to_string(b.path("counter")).unwrap();
        assert_eq!(v.trim(), "400", "{mode}: increments were lost or repeated");
    }
}

#[test]
fn flock_and_fcntl_locks_exclude_across_mounts_and_waiters_wake_when_they_free() {
    let Setup { _g, c: _c, locker, a, b } = setup();
    // flock, by util-linux's flock(1) on the other mount.
    let mut holder = Locker::start(&locker, &a.path("f"));
    assert_eq!(holder.ask("flock w nowait"), "ok");
    let busy = Command::new("flock").args(["-n", p(&b.path("f")), "true"]).status().unwrap();
    assert_eq!(busy.code(), Some(1), "flock -n on the other mount must find the lock taken");
    let waiter = Command::new("flock").args(["-w", "60", p(&b.path("f")), "true"]).spawn().unwrap();
    let mut waiter = scopeguard(waiter);
    blocked_in_fuse(waiter.0.id());
    assert!(waiter.0.try_wait().unwrap().is_none(), "the waiter got a lock that is held");
    assert_eq!(holder.ask("flock u nowait"), "ok");
    assert!(waiter.0.wait().unwrap().success(), "the waiter was not woken when the lock freed");

    // fcntl byte ranges: writers exclude, readers share, F_GETLK reports.
    // The waiter's flock (a whole-file lock here, which excludes fcntl
    // ranges as on NFS) ends with the kernel's RELEASE of its open file,
    // which FUSE sends asynchronously after the process has exited: wait
    // for it to arrive rather than race it (CI saw EAGAIN here once).
    let mut other = Locker::start(&locker, &b.path("f"));
    wait_for("the exited waiter's flock to end with its release", || holder.ask("posix w 0 100 nowait") == "ok");
    assert_eq!(other.ask("posix w 50 10 nowait"), "err EAGAIN");
    assert_eq!(other.ask("posix r 100 10 nowait"), "ok", "bytes past the holder's range are free");
    // Another client's lock: its range and kind, and pid 0 (not a process
    // of this host).
    assert_eq!(other.ask("getlk w 0 0"), "w 0 100 0");
    assert_eq!(holder.ask("getlk w 100 1"), "r 100 10 0", "the whole conflicting range");
    // A waiting writer is woken when the holder's range frees.
    other.send("posix w 50 10 wait");
    other.blocked();
    assert_eq!(holder.ask("posix u 0 100 nowait"), "ok");
    assert_eq!(other.answer(), "ok");
    // A close by the holder process releases its fcntl locks (POSIX).
    assert_eq!(holder.ask("posix w 200 10 nowait"), "ok");
    assert_eq!(other.ask("posix w 200 10 nowait"), "err EAGAIN");
    assert_eq!(holder.ask("open"), "ok");
    assert_eq!(other.ask("posix w 200 10 nowait"), "ok");
    // OFD locks end with the last close of their open file.
    assert_eq!(holder.ask("ofd w 300 10 nowait"), "ok");
    assert_eq!(other.ask("ofd w 300 10 nowait"), "err EAGAIN");
    assert_eq!(holder.ask("close"), "ok");
    wait_for("the OFD lock to go with its file", || other.ask("ofd w 300 10 nowait") == "ok");
}

/// A process takes a POSIX lock through one open file, forks, closes that
/// open (its lock goes, POSIX), opens the file again and locks again; then
/// its child closes its copy of the first open file (the kernel's release
/// of it). Prints `ready` and holds until stdin closes.
const FORK_AND_RELOCK: &str = r#"
import fcntl, os, sys
path = sys.argv[1]
fd1 = os.open(path, os.O_RDWR)
fcntl.lockf(fd1, fcntl.LOCK_EX)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w)
    os.read(r, 1)
    os.close(fd1)
    os._exit(0)
os.close(fd1)
fd2 = os.open(path, os.O_RDWR)
fcntl.lockf(fd2, fcntl.LOCK_EX)
os.write(w, b"x")
os.waitpid(pid, 0)
print("ready", flush=True)
sys.stdin.readline()
"#;

#[test]
fn another_processs_close_of_an_open_file_leaves_a_newer_lock_alone() {
    let _g = serial();
    let c = Cluster::start();
    let (a, b) = two_mounts(&c);
    let locker = script(&c, "locker.py", LOCKER);
    let relock = script(&c, "relock.py", FORK_AND_RELOCK);
    std::fs::write(a.path("f"), b"x").unwrap();
    let mut p = Command::new("python3")
        .arg(&relock)
        .arg(a.path("f"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(p.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // The child's release reaches the mount after its close returned:
    // the lock must hold throughout.
    let mut other = Locker::start(&locker, &b.path("f"));
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert_eq!(other.ask("posix w 0 0 nowait"), "err EAGAIN", "the parent's second lock was released");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(p.stdin.take());
    let _ = p.wait();
    wait_for("the lock to go with its holder", || other.ask("posix w 0 0 nowait") == "ok");
}

/// Kills a child when dropped (a failed assertion leaves no waiter behind).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        reap(&mut self.0);
    }
}

fn scopeguard(c: Child) -> Guard {
    Guard(c)
}

#[test]
fn a_waiting_writer_is_not_starved_by_readers_on_another_mount() {
    let Setup { _g, c, locker, a, b } = setup();
    let mut reader0 = Locker::start(&locker, &a.path("f"));
    assert_eq!(reader0.ask("posix r 0 0 nowait"), "ok");
    let mut writer = Locker::start(&locker, &b.path("f"));
    writer.send("posix w 0 0 wait");
    writer.blocked();
    // The writer's waiting request has reached the metadata server (it is
    // sent from the mount's waiting thread after a first try).
    c.wait_meta_gauge("dafne_meta_lock_waiters", 1.0);
    // A reader that will wait queues behind the writer, though no held
    // lock stands in its way (an F_SETLK would be granted: POSIX).
    let mut reader1 = Locker::start(&locker, &a.path("f"));
    reader1.send("posix r 0 0 wait");
    reader1.blocked();
    assert!(reader1.answers.recv_timeout(Duration::from_millis(500)).is_err(), "a reader jumped the waiting writer");
    assert_eq!(reader0.ask("posix u 0 0 nowait"), "ok");
    assert_eq!(writer.answer(), "ok", "the writer must come first");
    assert!(reader1.answers.try_recv().is_err());
    assert_eq!(writer.ask("posix u 0 0 nowait"), "ok");
    assert_eq!(reader1.answer(), "ok");
}

#[test]
fn a_deadlock_between_two_mounts_is_reported() {
    let Setup { _g, c: _c, locker, a, b } = setup();
    let mut one = Locker::start(&locker, &a.path("f"));
    let mut two = Locker::start(&locker, &b.path("f"));
    assert_eq!(one.ask("posix w 0 1 nowait"), "ok");
    assert_eq!(two.ask("posix w 1 1 nowait"), "ok");
    // Each now waits for the other's byte: whichever request reaches the
    // metadata server second closes the cycle and gets EDEADLK.
    one.send("posix w 1 1 wait");
    two.send("posix w 0 1 wait");
    let mut lockers = [one, two];
    let holds = ["posix u 0 1 nowait", "posix u 1 1 nowait"];
    let start = Instant::now();
    let (loser, answer) = 'first: loop {
        for (i, l) in lockers.iter().enumerate() {
            if let Ok(a) = l.answers.try_recv() {
                break 'first (i, a);
            }
        }
        assert!(start.elapsed() < PATIENCE, "neither waiter was told of the deadlock");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(answer, "err EDEADLK");
    // The loser gives way; the other gets the byte it waits for.
    assert_eq!(lockers[loser].ask(holds[loser]), "ok");
    assert_eq!(lockers[1 - loser].answer(), "ok", "the waiter that did not close the cycle must get its lock");
}

/// The pid of the mount daemon serving `mp`, from the cluster's records.
fn daemon_of(c: &Cluster, mp: &Path) -> u32 {
    for e in std::fs::read_dir(c.dir().join("mounts")).unwrap() {
        let e = e.unwrap();
        if std::fs::read_to_string(e.path()).unwrap().contains(p(mp)) {
            return e.file_name().into_string().unwrap().parse().unwrap();
        }
    }
    panic!("no mount record for {}", mp.display());
}

#[test]
fn a_killed_mounts_locks_pass_to_a_waiter_when_its_lease_ends() {
    let Setup { _g, c, locker, a, b } = setup();
    let mut holder = Locker::start(&locker, &a.path("f"));
    assert_eq!(holder.ask("posix w 0 0 nowait"), "ok");
    let mut waiter = Locker::start(&locker, &b.path("f"));
    waiter.send("posix w 0 0 wait");
    let killed = Instant::now();
    Command::new("kill").args(["-9", &daemon_of(&c, &a.mp).to_string()]).status().unwrap();
    // The metadata server sees the connection die at once (a closed
    // socket) and keeps the locks for the lease (10 s by default).
    assert_eq!(waiter.answer(), "ok");
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_secs(5), "the lock passed on after {waited:?}, before the lease could end");
    drop(holder);
    let _ = Command::new("fusermount3").arg("-uz").arg(&a.mp).status();
}

#[test]
fn locks_held_across_a_metadata_server_restart_are_claimed_back_first() {
    let Setup { _g, c, locker, a, b } = setup();
    let mut holder = Locker::start(&locker, &a.path("f"));
    assert_eq!(holder.ask("posix w 0 0 nowait"), "ok");
    let servers = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(c.dir().join("servers.json")).unwrap()).unwrap()
    };
    let meta = servers()[0]["pid"].as_u64().unwrap();
    Command::new("kill").args(["-9", &meta.to_string()]).status().unwrap();
    wait_for("the supervisor's restart of meta", || {
        let s = servers();
        s[0]["restarts"] == 1 && s[0]["state"] == "running"
    });
    // The other mount's first calls after the restart may fail (EIO: they
    // meet the lost connection); it reconnects by itself.
    wait_for("the other mount to answer again", || std::fs::File::open(b.path("f")).is_ok());
    // It asks during the grace: its request waits for the grace to end, by
    // which time the holder's mount has reconnected and claimed its lock
    // back.
    let mut other = Locker::start(&locker, &b.path("f"));
    assert_eq!(other.ask("posix w 0 0 nowait"), "err EAGAIN", "the lock held before the restart was lost");
    other.send("posix w 0 0 wait");
    other.blocked();
    assert_eq!(holder.ask("posix u 0 0 nowait"), "ok");
    assert_eq!(other.answer(), "ok");
}
