//! The interception library (`libdafne_preload.so`), end to end: a real
//! cluster, a real mount, and unmodified programs (cat, cp, dd, tar,
//! sha256sum, python3, fio) run under `LD_PRELOAD` on files under the
//! mount. Every result is checked byte by byte against the same bytes
//! read through the mount without the library (the FUSE path), and the
//! library's own counters (`DAFNE_PRELOAD_STATS`: one JSON line per
//! process that met a dafne file) show the bytes went through it, not
//! through FUSE.
//!
//! The library is built by these tests (`cargo build -p dafne-preload`
//! into the target directory of this test binary; a no-op when it is up
//! to date), so `cargo test` alone runs them.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};

use common::cluster::{p, Cluster, Mount};
use common::{pattern, text};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `libdafne_preload.so`, built for the profile of this test binary.
fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_dafne"));
        let profile_dir = bin.parent().unwrap().to_path_buf();
        let target_dir = profile_dir.parent().unwrap();
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut c = Command::new(cargo);
        c.args(["build", "--quiet", "-p", "dafne-preload", "--manifest-path"]).arg(&manifest);
        c.arg("--target-dir").arg(target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            c.arg("--release");
        }
        let o = c.stdin(Stdio::null()).output().expect("running cargo to build dafne-preload");
        assert!(o.status.success(), "building dafne-preload failed:\n{}", text(&o));
        let lib = profile_dir.join("libdafne_preload.so");
        assert!(lib.is_file(), "{} missing after the build", lib.display());
        lib
    })
}

/// A cluster, its mount, and where the counters go.
struct Setup {
    c: Cluster,
    m: Mount,
    stats: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let lib = library();
        assert!(lib.is_file());
        let c = Cluster::start();
        let m = c.mount();
        let stats = c.dir().join("preload-stats.jsonl");
        Setup { c, m, stats }
    }

    /// A program under the library (and `timeout`, so a stuck mount fails
    /// the test instead of hanging it).
    fn preloaded(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("timeout");
        c.args(["-k", "10", "300", program]).args(args);
        c.env("LD_PRELOAD", library())
            .env("DAFNE_HOME", self.c.dir())
            .env("DAFNE_PRELOAD_STATS", &self.stats)
            .env_remove("DAFNE_CLUSTER")
            .env_remove("DAFNE_PRELOAD_MOUNT")
            .env_remove("DAFNE_PRELOAD")
            .current_dir(self.c.dir())
            .stdin(Stdio::null());
        c
    }

    /// Runs under the library; returns stdout; panics with all output on
    /// failure.
    fn run(&self, program: &str, args: &[&str]) -> String {
        let mut c = self.preloaded(program, args);
        let o = c.output().unwrap_or_else(|e| panic!("running {program}: {e}"));
        assert!(o.status.success(), "{program} {args:?} under the library failed ({}):\n{}", o.status, text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The counters every process wrote since the last call, summed by
    /// program name (the file is emptied).
    fn take_stats(&self) -> HashMap<String, HashMap<String, u64>> {
        let textual = std::fs::read_to_string(&self.stats).unwrap_or_default();
        let _ = std::fs::remove_file(&self.stats);
        let mut out: HashMap<String, HashMap<String, u64>> = HashMap::new();
        for line in textual.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            let exe = v["exe"].as_str().unwrap();
            let name = Path::new(exe).file_name().unwrap().to_string_lossy().into_owned();
            let name = if name.starts_with("python") { "python".to_string() } else { name };
            let sums = out.entry(name).or_default();
            for (k, n) in v.as_object().unwrap() {
                if let Some(n) = n.as_u64().filter(|_| k != "pid") {
                    *sums.entry(k.clone()).or_default() += n;
                }
            }
        }
        out
    }
}

fn get(stats: &HashMap<String, HashMap<String, u64>>, program: &str, counter: &str) -> u64 {
    stats.get(program).and_then(|s| s.get(counter)).copied().unwrap_or(0)
}

/// The bytes of a file as the FUSE path reads them (this test process
/// has no library).
fn through_fuse(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {} through the mount: {e}", path.display()))
}

#[test]
fn coreutils_and_tar_move_their_bytes_through_the_library() {
    let _g = serial();
    let s = Setup::new();
    let src = s.c.scratch("src");
    let data = pattern((3 << 20) + 12345, 1);
    let local = src.join("data");
    std::fs::write(&local, &data).unwrap();

    // cp onto the mount: written through the library, read back through FUSE.
    let a = s.m.path("a");
    s.run("cp", &[p(&local), p(&a)]);
    assert!(through_fuse(&a) == data, "cp's copy differs through the mount");
    let st = s.take_stats();
    assert_eq!(get(&st, "cp", "opens"), 1, "{st:?}");
    assert_eq!(get(&st, "cp", "write_bytes"), data.len() as u64, "{st:?}");

    // cat from the mount: read through the library.
    let out = src.join("cat-out");
    let o = s.preloaded("cat", &[p(&a)]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout == data, "cat read other bytes");
    std::fs::write(&out, &o.stdout).unwrap();
    let st = s.take_stats();
    assert_eq!(get(&st, "cat", "read_bytes"), data.len() as u64, "{st:?}");

    // dd: a whole copy in 64 KiB blocks, then 4 KiB edits in the middle
    // and past the end without truncating; the same edits on a local copy
    // give the same bytes.
    let d = s.m.path("d");
    s.run("dd", &["bs=64k", "status=none", &format!("if={}", p(&local)), &format!("of={}", p(&d))]);
    let patch = src.join("patch");
    std::fs::write(&patch, pattern(3 * 4096 + 100, 2)).unwrap();
    let mirror = src.join("mirror");
    std::fs::write(&mirror, &data).unwrap();
    for seek in ["seek=300", "seek=1400"] {
        for target in [&d, &mirror] {
            s.run(
                "dd",
                &[
                    "bs=4k",
                    seek,
                    "conv=notrunc",
                    "status=none",
                    &format!("if={}", p(&patch)),
                    &format!("of={}", p(target)),
                ],
            );
        }
    }
    let want = std::fs::read(&mirror).unwrap();
    assert_eq!(want.len(), 1400 * 4096 + 3 * 4096 + 100);
    assert!(through_fuse(&d) == want, "dd's edits differ through the mount");
    // dd reading from the mount with skip, through the library.
    let tail = src.join("tail");
    s.run("dd", &["bs=1M", "skip=2", "status=none", &format!("if={}", p(&d)), &format!("of={}", p(&tail))]);
    assert!(std::fs::read(&tail).unwrap() == want[2 << 20..], "dd skip=2 read other bytes");
    let st = s.take_stats();
    assert!(get(&st, "dd", "write_bytes") >= data.len() as u64 + 2 * patch_len(), "{st:?}");
    assert!(get(&st, "dd", "read_bytes") >= (want.len() - (2 << 20)) as u64, "{st:?}");

    // sha256sum reads through stdio (fopen/fread: the C library's internal
    // calls, which no preload library sees): the FUSE path, same digest.
    let sum = s.run("sha256sum", &[p(&d)]);
    let local_sum = String::from_utf8(Command::new("sha256sum").arg(&mirror).output().unwrap().stdout).unwrap();
    assert_eq!(sum.split_whitespace().next(), local_sum.split_whitespace().next());
    let st = s.take_stats();
    assert_eq!(get(&st, "sha256sum", "read_bytes"), 0, "stdio reads are not seen: {st:?}");

    // tar: create an archive on the mount from local files, extract it on
    // the mount, compare every file.
    let tree = src.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    for (i, size) in [0usize, 1, 4096, 100_000, (1 << 20) + 3].into_iter().enumerate() {
        std::fs::write(tree.join("sub").join(format!("f{i}")), pattern(size, 10 + i as u64)).unwrap();
    }
    let tarball = s.m.path("t.tar");
    s.run("tar", &["-cf", p(&tarball), "-C", p(&tree), "."]);
    let x = s.m.path("x");
    std::fs::create_dir(&x).unwrap();
    s.run("tar", &["-xf", p(&tarball), "-C", p(&x)]);
    for (i, size) in [0usize, 1, 4096, 100_000, (1 << 20) + 3].into_iter().enumerate() {
        let got = through_fuse(&x.join("sub").join(format!("f{i}")));
        assert!(got == pattern(size, 10 + i as u64), "file f{i} of the archive differs");
    }
    let st = s.take_stats();
    assert!(get(&st, "tar", "write_bytes") >= 2 * ((1 << 20) + 100_000), "{st:?}");
    assert!(get(&st, "tar", "read_bytes") >= (1 << 20) + 100_000, "{st:?}");
    assert_eq!(get(&st, "tar", "connect_failures"), 0, "{st:?}");
}

fn patch_len() -> u64 {
    3 * 4096 + 100
}

/// Python's file objects: buffered and raw I/O, seek and tell, SEEK_END
/// with unpublished writes, O_APPEND (left to the kernel), fstat, mmap
/// after writes, ftruncate, dup, a forked child sharing the offset,
/// read-ahead dropping what another descriptor wrote, and `sendfile`
/// (shutil) and `copy_file_range` into and out of the mount.
#[test]
fn python_sees_posix_semantics_through_the_library() {
    let _g = serial();
    let s = Setup::new();
    let script = r#"
import os, sys, mmap
d = sys.argv[1]
p = os.path.join(d, 'py')
with open(p, 'wb') as f:
    f.write(b'x' * 100000)
    f.seek(50); f.write(b'hello')
    f.flush()
    assert f.tell() == 55, f.tell()
    assert os.fstat(f.fileno()).st_size == 100000, os.fstat(f.fileno()).st_size
    assert os.lseek(f.fileno(), 0, os.SEEK_END) == 100000
with open(p, 'rb') as f:
    b = f.read()
    assert len(b) == 100000 and b[48:57] == b'xxhelloxx', (len(b), b[48:57])
with open(p, 'r+b') as f:
    f.seek(0, 2); f.write(b'END'); f.flush()
    assert f.tell() == 100003
    # mmap through the kernel sees the bytes and the size written through the library.
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    assert len(m) == 100003 and m[-3:] == b'END' and m[50:55] == b'hello', (len(m), m[-3:])
    m.close()
    os.ftruncate(f.fileno(), 10)
    f.seek(0)
    assert f.read() == b'xxxxxxxxxx'
    # dup shares the offset; os.read goes through the library.
    fd2 = os.dup(f.fileno())
    os.lseek(fd2, 2, 0)
    assert os.read(f.fileno(), 3) == b'xxx'
    assert os.lseek(fd2, 0, 1) == 5
    os.close(fd2)
    os.write(f.fileno(), b'AB')
    # A forked child reads through the kernel at the shared offset and moves it.
    pid = os.fork()
    if pid == 0:
        ok = os.read(f.fileno(), 3) == b'xxx'
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
    assert os.lseek(f.fileno(), 0, 1) == 10
# O_APPEND is the kernel's (atomic appends); the library reads it back.
with open(p, 'ab') as f:
    f.write(b'++')
with open(p, 'rb') as f:
    assert f.read() == b'xxxxxABxxx++'
# Read-ahead: a sequential reader's units ahead drop what another
# descriptor of this process writes, before that one is closed.
ra = os.path.join(d, 'ra')
with open(ra, 'wb') as f:
    f.write(b'a' * (8 << 20))
r = os.open(ra, os.O_RDONLY)
for _ in range(3):
    assert os.read(r, 128 << 10) == b'a' * (128 << 10)
w = os.open(ra, os.O_WRONLY)
os.pwrite(w, b'b' * 4096, 1 << 20)
assert os.read(r, 1 << 20) == b'a' * ((1 << 20) - (384 << 10)) + b'b' * 4096 + b'a' * ((384 << 10) - 4096)
os.close(w)
os.close(r)
# sendfile (shutil.copyfile) into and out of the mount, and copy_file_range.
import shutil
local, back = sys.argv[2], sys.argv[3]
sf = os.path.join(d, 'sf')
shutil.copyfile(local, sf)
shutil.copyfile(sf, back)
with open(sf, 'rb') as i, open(os.path.join(d, 'cfr'), 'wb') as o:
    while os.copy_file_range(i.fileno(), o.fileno(), 1 << 30) > 0:
        pass
print('ok')
"#;
    let scratch = s.c.scratch("py");
    let local = scratch.join("local");
    let local_data = pattern((2 << 20) + 77, 5);
    std::fs::write(&local, &local_data).unwrap();
    let back = scratch.join("back");
    let out = s.run("python3", &["-c", script, p(&s.m.mp), p(&local), p(&back)]);
    assert_eq!(out.trim(), "ok");
    assert!(through_fuse(&s.m.path("py")) == b"xxxxxABxxx++", "{:?}", through_fuse(&s.m.path("py")));
    assert!(through_fuse(&s.m.path("sf")) == local_data, "sendfile onto the mount");
    assert!(std::fs::read(&back).unwrap() == local_data, "sendfile from the mount");
    assert!(through_fuse(&s.m.path("cfr")) == local_data, "copy_file_range on the mount");
    let st = s.take_stats();
    assert!(get(&st, "python", "write_bytes") >= 100_000 + 2 * local_data.len() as u64, "{st:?}");
    assert!(get(&st, "python", "read_bytes") >= 100_000 + 2 * local_data.len() as u64, "{st:?}");
    assert!(get(&st, "python", "opens_fallback") >= 1, "the O_APPEND open stays on FUSE: {st:?}");
}

/// The FUSE path sees what the library wrote as soon as the writer closed,
/// with the kernel's caches warm from before (attributes and pages): the
/// script reads through a descriptor the library leaves to the kernel
/// (`O_APPEND`), right after each close, before the mount's watcher could
/// have told the kernel anything.
#[test]
fn the_kernel_path_sees_library_writes_at_close_despite_warm_caches() {
    let _g = serial();
    let s = Setup::new();
    let script = r#"
import os, sys
p = sys.argv[1]
old = bytes(range(256)) * 800
with open(p, 'wb') as f:
    f.write(old)
k = os.open(p, os.O_RDWR | os.O_APPEND)
assert os.pread(k, len(old), 0) == old
assert os.fstat(k).st_size == len(old)
# Grow it through the library: the kernel's cached size must follow.
new = bytes(reversed(range(256))) * 1200
w = os.open(p, os.O_WRONLY)
assert os.pwrite(w, new, 0) == len(new)
os.close(w)
assert os.fstat(k).st_size == len(new), os.fstat(k).st_size
assert os.pread(k, len(new), 0) == new
# Overwrite in place (same size): the kernel's cached pages must go.
w = os.open(p, os.O_WRONLY)
os.pwrite(w, b'Z' * 4096, 0)
os.close(w)
assert os.pread(k, 4096, 0) == b'Z' * 4096
print('ok')
"#;
    let f = s.m.path("warm");
    let out = s.run("python3", &["-c", script, p(&f)]);
    assert_eq!(out.trim(), "ok");
    // A program that exits with a written descriptor still open: the
    // library publishes at exit (the kernel's close alone would not).
    let open_at_exit = s.m.path("open-at-exit");
    let script = "import os, sys\nfd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\nos.write(fd, b'q' * 5000)\n";
    s.run("python3", &["-c", script, p(&open_at_exit)]);
    assert!(through_fuse(&open_at_exit) == vec![b'q'; 5000], "the size was not published at exit");
    let st = s.take_stats();
    assert!(get(&st, "python", "write_bytes") >= 256 * 1200 + 4096, "{st:?}");
    assert!(get(&st, "python", "opens_fallback") >= 1, "{st:?}");
}

/// fio's psync engine with crc32c verification: random 4 KiB writes read
/// back and verified, then a second process verifying the file again; jobs as threads (`--thread`: see the library's notes on fork).
#[test]
fn fio_psync_verifies_through_the_library() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("fio.dat");
    let common = ["--ioengine=psync", "--size=8M", "--verify=crc32c", "--thread", "--output-format=terse"];
    let mut w = vec!["--name=w", "--rw=randwrite", "--bs=4k", "--do_verify=1"];
    let file = format!("--filename={}", p(&f));
    w.push(&file);
    w.extend(common);
    s.run("fio", &w);
    let st = s.take_stats();
    assert!(get(&st, "fio", "write_bytes") >= 8 << 20, "{st:?}");
    assert!(get(&st, "fio", "read_bytes") >= 8 << 20, "the verify pass: {st:?}");
    // The same workload again, only verifying what the first run left.
    let mut r = vec!["--name=w", "--rw=randwrite", "--bs=4k", "--verify_only"];
    r.push(&file);
    r.extend(common);
    s.run("fio", &r);
    let st = s.take_stats();
    assert!(get(&st, "fio", "read_bytes") >= 8 << 20, "{st:?}");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 8 << 20);
}

/// When the library cannot reach the cluster (here: a cluster file that
/// does not exist, with the mount named explicitly), every file stays on
/// the FUSE path and the program works the same; the counters say why.
#[test]
fn without_a_connection_files_stay_on_the_mount() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("plain");
    let data = pattern(300_000, 6);
    std::fs::write(&f, &data).unwrap();
    let mut c = s.preloaded("cat", &[p(&f)]);
    c.env("DAFNE_CLUSTER", s.c.dir().join("no-such-cluster.json")).env("DAFNE_PRELOAD_MOUNT", &s.m.mp);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout == data, "cat read other bytes through the fallback");
    let st = s.take_stats();
    assert_eq!(get(&st, "cat", "connect_failures"), 1, "{st:?}");
    assert_eq!(get(&st, "cat", "opens_fallback"), 1, "{st:?}");
    assert_eq!(get(&st, "cat", "read_bytes"), 0, "{st:?}");
}

/// Forked children: one whose parent never connected opens its files
/// through a connection of its own; one whose parent had started UCX
/// leaves its files on the mount (UCX cannot start again there), and
/// reads the same bytes.
#[test]
fn forked_children_connect_only_when_their_parent_had_not() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("forked");
    let data = pattern(500_000, 7);
    std::fs::write(&f, &data).unwrap();
    let script = r#"
import os, sys, hashlib
p, connect_first = sys.argv[1], sys.argv[2] == '1'
if connect_first:
    with open(p, 'rb') as f:
        f.read(10)
pid = os.fork()
if pid == 0:
    with open(p, 'rb') as f:
        print(hashlib.sha256(f.read()).hexdigest(), flush=True)
    sys.exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(status >> 8)
"#;
    let want = String::from_utf8(Command::new("sha256sum").arg(s.c.dir().join("mnt/forked")).output().unwrap().stdout)
        .unwrap();
    let want = want.split_whitespace().next().unwrap().to_string();
    // A parent that never connected: the child reads through the library.
    let out = s.run("python3", &["-c", script, p(&f), "0"]);
    assert_eq!(out.trim(), want);
    let st = s.take_stats();
    assert_eq!(get(&st, "python", "read_bytes"), data.len() as u64, "{st:?}");
    // A parent that connected: the child's open stays on the mount.
    let out = s.run("python3", &["-c", script, p(&f), "1"]);
    assert_eq!(out.trim(), want);
    let st = s.take_stats();
    assert_eq!(get(&st, "python", "opens_fallback"), 1, "the child's open: {st:?}");
    assert_eq!(get(&st, "python", "opens"), 1, "the parent's open: {st:?}");
}

/// The library connects to one cluster and may serve only that cluster's
/// mounts: a file of another cluster's mount, named in
/// `DAFNE_PRELOAD_MOUNT` or recorded by a daemon that is gone, is read and
/// written through FUSE (its own cluster), never through this connection,
/// where the same inode number is another file.
#[test]
fn another_clusters_mount_stays_on_fuse_and_stale_records_are_ignored() {
    let _g = serial();
    let a = Setup::new();
    let b_cluster = Cluster::start();
    let b_mount = b_cluster.mount();
    // The first file of each fresh cluster: the same inode number.
    let (fa, fb) = (a.m.path("same"), b_mount.path("same"));
    let (da, db) = (pattern(200_000, 11), pattern(200_000, 12));
    std::fs::write(&fa, &da).unwrap();
    std::fs::write(&fb, &db).unwrap();
    assert_eq!(
        std::fs::metadata(&fa).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap(),
        std::fs::metadata(&fb).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap(),
        "the test needs the same inode number in both clusters"
    );

    // Connected to A, B's mount named: B's bytes, through FUSE.
    let mut c = a.preloaded("cat", &[p(&fb)]);
    c.env("DAFNE_PRELOAD_MOUNT", &b_mount.mp);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout == db, "cat printed other bytes than B's file (A's?)");
    let st = a.take_stats();
    assert_eq!(get(&st, "cat", "opens"), 0, "{st:?}");
    assert_eq!(get(&st, "cat", "opens_fallback"), 1, "{st:?}");
    assert_eq!(get(&st, "cat", "read_bytes"), 0, "{st:?}");

    // A write there lands in B's file, and A's file is untouched.
    let mut c = a.preloaded("dd", &["if=/dev/zero", &format!("of={}", p(&fb)), "bs=4096", "count=2", "conv=notrunc"]);
    c.env("DAFNE_PRELOAD_MOUNT", &b_mount.mp);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mut want_b = db.clone();
    want_b[..8192].fill(0);
    assert!(through_fuse(&fb) == want_b, "dd's zeros are not in B's file");
    assert!(through_fuse(&fa) == da, "dd wrote into A's file");
    let st = a.take_stats();
    assert_eq!(get(&st, "dd", "write_bytes"), 0, "{st:?}");
    assert_eq!(get(&st, "dd", "opens_fallback"), 1, "{st:?}");

    // A stale record in A's directory (its daemon is gone: no process has
    // this pid) naming B's mount is ignored; A's own mount still goes
    // through the library.
    let stale = a.c.dir().join("mounts/999999999");
    std::fs::write(&stale, format!("0\n{}", b_mount.mp.display())).unwrap();
    let out = a.run("sh", &["-c", &format!("cat {} {} | sha256sum", p(&fb), p(&fa))]);
    std::fs::remove_file(&stale).unwrap();
    let want: Vec<u8> = want_b.iter().chain(da.iter()).copied().collect();
    let want_sum = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().and_then(|mut ch| {
        use std::io::Write;
        ch.stdin.take().unwrap().write_all(&want)?;
        ch.wait_with_output()
    });
    let want_sum = String::from_utf8(want_sum.unwrap().stdout).unwrap();
    assert_eq!(out.split_whitespace().next(), want_sum.split_whitespace().next());
    let st = a.take_stats();
    assert_eq!(get(&st, "cat", "opens"), 1, "A's file through the library: {st:?}");
    assert_eq!(get(&st, "cat", "opens_fallback"), 1, "B's file through FUSE: {st:?}");
    assert_eq!(get(&st, "cat", "read_bytes"), da.len() as u64, "{st:?}");
    drop(b_mount);
}

/// A program that writes through the library and then execs: the new
/// image has no table and runs no exit handler of the old one, so the
/// library publishes before the exec; the file has the bytes and the size.
#[test]
fn bytes_written_before_an_exec_are_published() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("exec");
    let script = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, bytes(range(256)) * 1000)
os.execv('/bin/true', ['true'])
"#;
    s.run("python3", &["-c", script, p(&f)]);
    let want: Vec<u8> = (0..=255u8).cycle().take(256_000).collect();
    assert_eq!(std::fs::metadata(&f).unwrap().len(), want.len() as u64);
    assert!(through_fuse(&f) == want, "the bytes written before the exec are not in the file");
}

/// A second descriptor of a file this process writes through the library
/// starts from the writer's size: the writer publishes before the new
/// open is entered in the table or handed to the kernel, so the reader's
/// `SEEK_END` and reads reach the writer's end, and an `O_APPEND` write
/// (the kernel's) lands after the writer's bytes.
#[test]
fn a_second_open_of_a_written_file_sees_the_writers_size() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("second");
    let script = r#"
import os, sys
p = sys.argv[1]
w = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(w, b'a' * 5000)
r = os.open(p, os.O_RDONLY)
assert os.lseek(r, 0, os.SEEK_END) == 5000, os.lseek(r, 0, os.SEEK_END)
os.lseek(r, 0, os.SEEK_SET)
assert os.read(r, 10000) == b'a' * 5000
os.write(w, b'b' * 1000)
r2 = os.open(p, os.O_RDONLY)
assert os.fstat(r2).st_size == 6000, os.fstat(r2).st_size
assert os.pread(r2, 10000, 4990) == b'a' * 10 + b'b' * 1000
os.write(w, b'c' * 1000)
ap = os.open(p, os.O_WRONLY | os.O_APPEND)
os.write(ap, b'END')
os.close(ap); os.close(r2); os.close(r); os.close(w)
# The kernel's append takes its cached size: the refresh must not be lost
# (it was in 13 of 30 rounds of this loop before the fstat after the
# forced statx).
for i in range(30):
    q = p + '-%d' % i
    w = os.open(q, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(w, b'a' * 5000)
    r = os.open(q, os.O_RDONLY)
    os.write(w, b'b' * 1000)
    ap = os.open(q, os.O_WRONLY | os.O_APPEND)
    os.write(ap, b'END')
    assert os.lseek(ap, 0, os.SEEK_CUR) == 6003, (i, os.lseek(ap, 0, os.SEEK_CUR))
    os.close(ap); os.close(r); os.close(w)
"#;
    s.run("python3", &["-c", script, p(&f)]);
    let mut want = vec![b'a'; 5000];
    want.extend_from_slice(&[b'b'; 1000]);
    want.extend_from_slice(&[b'c'; 1000]);
    want.extend_from_slice(b"END");
    let got = through_fuse(&f);
    assert!(
        got == want,
        "the O_APPEND write did not land after the library writer's bytes: {} bytes, END at {:?}",
        got.len(),
        got.windows(3).position(|w| w == b"END")
    );
    let st = s.take_stats();
    assert_eq!(get(&st, "python", "opens"), 3 + 2 * 30, "{st:?}");
    assert_eq!(get(&st, "python", "opens_fallback"), 1 + 30, "the O_APPEND opens: {st:?}");
    assert_eq!(get(&st, "python", "read_bytes"), 6010, "{st:?}");
}

/// A file unlinked while open (what `tempfile.TemporaryFile` makes where
/// `O_TMPFILE` is not offered, as on FUSE) is still the process's: reads
/// through the library past the size it knows, and `SEEK_END`, use the
/// handle's size when meta no longer has the inode. Before the fix they
/// failed with `ENOENT`, which no read of the mount returns.
#[test]
fn a_file_unlinked_while_open_reads_back_through_the_library() {
    let _g = serial();
    let s = Setup::new();
    let dir = s.m.path("tmp");
    std::fs::create_dir(&dir).unwrap();
    let script = r#"
import os, sys, tempfile
f = tempfile.TemporaryFile(dir=sys.argv[1])
f.write(bytes(range(256)) * 400)
f.flush()
f.seek(0)
back = f.read()
assert back == bytes(range(256)) * 400, len(back)
fd = os.open(os.path.join(sys.argv[1], "u"), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
os.write(fd, b"before")
os.unlink(os.path.join(sys.argv[1], "u"))
os.write(fd, b"after")
assert os.pread(fd, 100, 0) == b"beforeafter", os.pread(fd, 100, 0)
assert os.lseek(fd, 0, os.SEEK_END) == 11
os.close(fd)
print("ok")
"#;
    assert_eq!(s.run("python3", &["-c", script, p(&dir)]).trim(), "ok");
    let stats = s.take_stats();
    assert!(get(&stats, "python", "read_bytes") >= 102_400, "the reads did not go through the library: {stats:?}");
}

/// An open with `O_TRUNC` in the same process cuts the file under its
/// other library descriptors: a reader whose read-ahead held the old bytes
/// reads the new end (nothing past it), and `SEEK_END` is the new size on
/// every descriptor, as through the mount. Before the fix the reader kept
/// reading 1 MiB of the old bytes and `SEEK_END` said 8 MiB.
#[test]
fn an_o_trunc_open_cuts_the_file_under_the_other_descriptors() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("cut");
    let script = r#"
import os, sys
p = sys.argv[1]
with open(p, "wb") as f:
    f.write(b"O" * (8 << 20))
r = os.open(p, os.O_RDONLY)
for i in range(4):
    assert len(os.read(r, 1 << 20)) == 1 << 20
w = os.open(p, os.O_WRONLY)
os.pwrite(w, b"W" * 100, 0)
with open(p, "wb") as f:
    f.write(b"new")
got = os.read(r, 1 << 20)
assert got == b"", (len(got), got[:3])
assert os.pread(r, 10, 0) == b"new", os.pread(r, 10, 0)
assert os.lseek(r, 0, os.SEEK_END) == 3, os.lseek(r, 0, os.SEEK_END)
assert os.lseek(w, 0, os.SEEK_END) == 3, os.lseek(w, 0, os.SEEK_END)
os.close(w)
os.close(r)
print("ok")
"#;
    assert_eq!(s.run("python3", &["-c", script, p(&f)]).trim(), "ok");
    assert_eq!(through_fuse(&f), b"new");
    let stats = s.take_stats();
    assert!(get(&stats, "python", "read_bytes") >= 4 << 20, "the reads did not go through the library: {stats:?}");
}

/// `truncate(path)` in the same process cuts the file under its library
/// descriptors, as `ftruncate` on one of them does: a writer's unpublished
/// bytes are published first (a later publish would grow the file back
/// past the cut), a reader whose read-ahead held the old bytes reads the
/// new end, and `SEEK_END` is the new size on every descriptor. Before
/// the fix the reader read 300 bytes where the mount has 50 (review of
/// issue 12).
#[test]
fn a_truncate_by_path_cuts_the_file_under_the_library_descriptors() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("cutpath");
    let script = r#"
import os, sys
p = sys.argv[1]
with open(p, "wb") as f:
    f.write(b"O" * (8 << 20))
r = os.open(p, os.O_RDONLY)
for i in range(4):
    assert len(os.read(r, 1 << 20)) == 1 << 20
w = os.open(p, os.O_WRONLY)
os.pwrite(w, b"W" * 300, 0)
os.truncate(p, 50)
got = os.read(r, 1 << 20)
assert got == b"", (len(got), got[:3])
got = os.pread(r, 1000, 0)
assert got == b"W" * 50, (len(got), got[:3])
assert os.lseek(r, 0, os.SEEK_END) == 50, os.lseek(r, 0, os.SEEK_END)
assert os.lseek(w, 0, os.SEEK_END) == 50, os.lseek(w, 0, os.SEEK_END)
os.close(w)
os.close(r)
print("ok")
"#;
    assert_eq!(s.run("python3", &["-c", script, p(&f)]).trim(), "ok");
    assert_eq!(through_fuse(&f), b"W".repeat(50));
    let stats = s.take_stats();
    assert!(get(&stats, "python", "read_bytes") >= 4 << 20, "the reads did not go through the library: {stats:?}");
}

/// A stat by path in the writing process sees its own writes, as through
/// the mount: `os.path.getsize` (stat), `os.lstat`, a `dir_fd` stat
/// (fstatat), `statx` (what `ls -l` and `stat(1)` call, asked for the size
/// alone) and the ABI before glibc 2.33 (`__xstat`, `__lxstat`), each after
/// fresh unpublished writes. The size is then in meta for every process:
/// a second run ends by `_exit` with the file still open (no exit handler
/// publishes), and this test reads the size through the mount. Before the
/// fix `getsize` gave 0.
#[test]
fn a_stat_by_path_in_the_writing_process_sees_its_writes() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("grown");
    let script = r#"
import ctypes, os, struct, sys
p = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
def statx_size(path):
    buf = ctypes.create_string_buffer(256)
    # AT_FDCWD, flags 0, STATX_SIZE only
    assert libc.statx(-100, path.encode(), 0, 0x200, buf) == 0, ctypes.get_errno()
    return struct.unpack_from("Q", buf.raw, 40)[0]
def old_abi(fn):
    def size(path):
        buf = ctypes.create_string_buffer(256)
        assert getattr(libc, fn)(1, path.encode(), buf) == 0, ctypes.get_errno()
        return struct.unpack_from("q", buf.raw, 48)[0]
    return size
d = os.open(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY)
ways = [
    ("getsize", os.path.getsize),
    ("lstat", lambda q: os.lstat(q).st_size),
    ("fstatat", lambda q: os.stat(os.path.basename(q), dir_fd=d).st_size),
    ("statx", statx_size),
    ("__xstat", old_abi("__xstat")),
    ("__lxstat", old_abi("__lxstat")),
]
f = open(p, "wb")
got = []
for i, (name, way) in enumerate(ways):
    f.write(b"x" * 100)
    f.flush()
    got.append((name, way(p), 100 * (i + 1)))
bad = [g for g in got if g[1] != g[2]]
print("ok" if not bad else bad, flush=True)
if sys.argv[2] == "_exit":
    os._exit(0)
"#;
    // A normal exit (the counters are written at exit) ...
    assert_eq!(s.run("python3", &["-c", script, p(&f), "exit"]).trim(), "ok");
    let stats = s.take_stats();
    assert!(get(&stats, "python", "write_bytes") >= 600, "the writes did not go through the library: {stats:?}");
    // ... and one that skips the exit handler, the file still open.
    let g = s.m.path("grown-exit");
    assert_eq!(s.run("python3", &["-c", script, p(&g), "_exit"]).trim(), "ok");
    let len = std::fs::metadata(&g).unwrap().len();
    assert_eq!(len, 600, "another process sees the size the writer's stat published");
}

/// `fstat` of a file unlinked while open after library writes gives the
/// bytes written, as through the mount (meta no longer has the inode, so
/// the size cannot be published to the kernel). Before the fix: 0.
#[test]
fn fstat_of_a_file_unlinked_while_open_shows_its_writes() {
    let _g = serial();
    let s = Setup::new();
    let dir = s.m.path("tmp");
    std::fs::create_dir(&dir).unwrap();
    let script = r#"
import ctypes, os, struct, sys, tempfile
d = sys.argv[1]
p = os.path.join(d, "u")
fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
os.write(fd, b"a" * 5000)
os.unlink(p)
got = [os.fstat(fd).st_size]
os.write(fd, b"b" * 3000)
got.append(os.fstat(fd).st_size)
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
# AT_EMPTY_PATH, STATX_BASIC_STATS
assert libc.statx(fd, b"", 0x1000, 0x7ff, buf) == 0, ctypes.get_errno()
got.append(struct.unpack_from("Q", buf.raw, 40)[0])
os.close(fd)
t = tempfile.TemporaryFile(dir=d)
t.write(b"c" * 7000)
t.flush()
got.append(os.fstat(t.fileno()).st_size)
print(got)
"#;
    assert_eq!(s.run("python3", &["-c", script, p(&dir)]).trim(), "[5000, 8000, 8000, 7000]");
    let stats = s.take_stats();
    assert!(get(&stats, "python", "write_bytes") >= 15_000, "the writes did not go through the library: {stats:?}");
}

/// The largest file the file system under `dir` allows, probed as the io
/// servers do at start (`ftruncate` of a sparse file; `None`: no limit
/// below the largest offset a client accepts).
fn file_size_limit(dir: &Path) -> Option<u64> {
    let path = dir.join("size-limit-probe");
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let max = i64::MAX as u64;
    if f.set_len(max).is_ok() {
        return None;
    }
    let (mut lo, mut hi) = (0u64, max);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if f.set_len(mid).is_ok() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

/// A write past what the io servers' chunk files can hold fails with
/// `EFBIG`, as on a local file system, and its byte never counts in the
/// size: through the library at the write itself; through the mount, whose
/// writes return before the servers answer, at the next write, fsync or
/// close, as `EFBIG` (never `EIO`). Before the fix the servers cached the
/// byte and answered success, the write-back failed, fsync and close gave
/// `EIO`, and meta kept the size past the limit. (On a file system without
/// a limit below 2^63 − 1, tmpfs or XFS, there is nothing to refuse.)
#[test]
fn a_write_past_what_the_storage_holds_fails_with_efbig() {
    let _g = serial();
    let s = Setup::new();
    let Some(limit) = file_size_limit(s.c.dir()) else {
        eprintln!("the file system under {} has no size limit to test", s.c.dir().display());
        return;
    };
    let script = r#"
import errno, os, sys
p, at = sys.argv[1], int(sys.argv[2])
def errno_of(f):
    try:
        f()
        return 0
    except OSError as e:
        return e.errno
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"hello")
got = [errno_of(lambda: os.pwrite(fd, b"x", at)), errno_of(lambda: os.fsync(fd))]
size = os.fstat(fd).st_size
got.append(errno_of(lambda: os.close(fd)))
print(got, size, os.stat(p).st_size)
"#;
    let at = limit.to_string();
    // Through the library: refused at the write.
    let lib = s.m.path("big-lib");
    let out = s.run("python3", &["-c", script, p(&lib), &at]);
    assert_eq!(
        out.trim(),
        "[27, 0, 0] 5 5",
        "pwrite at {limit} through the library: [pwrite, fsync, close] errnos, fstat after the fsync, stat after the close"
    );
    assert_eq!(std::fs::metadata(&lib).unwrap().len(), 5);
    let st = s.take_stats();
    assert_eq!(get(&st, "python", "opens"), 1, "the file was not the library's: {st:?}");
    // Through the mount: the first error reported is EFBIG.
    let mnt = s.m.path("big-mount");
    let o = Command::new("timeout")
        .args(["-k", "10", "300", "python3", "-c", script, p(&mnt), &at])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("through the mount, [pwrite, fsync, close] errnos, fstat and stat sizes: {}", out.trim());
    let (errnos, sizes) = out.trim().split_once("] ").unwrap();
    assert_eq!(
        sizes, "5 5",
        "the refused byte counted in the size (fstat after the fsync, stat after the close): {out}"
    );
    let first = errnos.trim_matches(['[', ']']).split(", ").map(|e| e.parse::<i32>().unwrap()).find(|&e| e != 0);
    assert_eq!(first, Some(27), "through the mount [pwrite, fsync, close]: {errnos}");
    assert_eq!(std::fs::metadata(&mnt).unwrap().len(), 5);
    assert_eq!(through_fuse(&mnt), b"hello");
}

/// A library descriptor opened before another one of the same process
/// grew the file reads the new bytes and sees the new end, as through the
/// mount (meta, which it asks past the end it knows, has only published
/// sizes); an `ftruncate` through one descriptor cuts the file under the
/// other. Before the fix the reader got 100 of 200 bytes.
#[test]
fn a_second_descriptor_reads_the_writers_unpublished_bytes() {
    let _g = serial();
    let s = Setup::new();
    let f = s.m.path("sibling");
    let script = r#"
import os, sys
p = sys.argv[1]
w = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(w, b"a" * 100)
r = os.open(p, os.O_RDONLY)
os.write(w, b"b" * 100)
got = [len(os.pread(r, 1000, 0)), os.lseek(r, 0, os.SEEK_END)]
os.ftruncate(w, 50)
got += [len(os.pread(r, 1000, 0)), os.lseek(r, 0, os.SEEK_END)]
os.close(r)
os.close(w)
print(got)
"#;
    assert_eq!(s.run("python3", &["-c", script, p(&f)]).trim(), "[200, 200, 50, 50]");
    assert_eq!(through_fuse(&f), vec![b'a'; 50]);
    let stats = s.take_stats();
    assert_eq!(get(&stats, "python", "opens"), 2, "{stats:?}");
    assert!(get(&stats, "python", "read_bytes") >= 250, "the reads did not go through the library: {stats:?}");
}
