//! An io server's fsyncs run off its event loop (issue 9 item 6): while
//! one client's sync waits for the device, the server goes on serving its
//! other clients. A device slow to sync cannot be made on tmpfs, so the
//! server holds its syncs with a test-only fault hook
//! (`DAFNE_FAULT_HOLD_SYNC`, `dafne_io::chunk`): while the named file
//! exists, every object sync waits (and says so with `<file>.held`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{pattern, spawn_io_env, start_meta};

use dafne_client::data::DataClient;
use dafne_client::file::Fs;
use dafne_client::{MetaSession, ROOT_INO};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;

/// How long a state is waited for before the test gives up (CI is loaded).
const DEADLINE: Duration = Duration::from_secs(30);

/// Waits until `done()` or the deadline; whether it came.
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

/// Removes the hold when dropped, so a failing test never leaves the
/// server (and the thread of client A) waiting.
struct Release<'a>(&'a Path);
impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// Client A's fsync, and then A's data-sync write (write-through), are
/// held on the server; meanwhile client B (its own connection) reads its
/// cached file and writes to it, and both are served. Released, A's
/// operations complete and its bytes read back.
/// Before the syncs moved off the loop, B's read never came back while
/// A's sync was held (the loop thread was inside `fdatasync`).
#[test]
fn a_held_sync_does_not_stop_another_clients_read_or_write() {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 64 << 10, 1);
    let flag = root.path().join("hold-sync");
    let held = root.path().join("hold-sync.held");
    let env = [("DAFNE_FAULT_HOLD_SYNC", flag.as_os_str())];
    let io = spawn_io_env(&root.path().join("io0"), &secret, 16, "127.0.0.1:0", &common::storage(), &env);
    let rt = common::runtime("sync-off-loop");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "sync-off-loop", 0, 0).unwrap();
    let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 1 });
    let fs_a = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
    let fs_b = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());

    // B's file: written and synced before any hold, so it is cached.
    let b_data = pattern(200_000, 1);
    let fb = fs_b.create(ROOT_INO, b"b", 0o644, hint).unwrap();
    fb.write_at(0, &b_data, Stability::Unstable).unwrap();
    fb.fsync().unwrap();
    // A's file: dirty in the server's cache.
    let a_data = pattern(300_000, 2);
    let fa = fs_a.create(ROOT_INO, b"a", 0o644, hint).unwrap();
    fa.write_at(0, &a_data, Stability::Unstable).unwrap();

    // A's fsync, then A's data-sync write (a write-through: its sync is
    // the Unifier's), each held while B is served.
    let fa = held_while_b_is_served(&flag, &held, fa, &fb, &b_data, |fa| fa.fsync());
    let more = pattern(70_000, 3);
    let fa = held_while_b_is_served(&flag, &held, fa, &fb, &b_data, {
        let more = more.clone();
        move |fa| fa.write_at(100_000, &more, Stability::FileSync).map(|_| ())
    });
    let mut want = a_data;
    want[100_000..170_000].copy_from_slice(&more);
    let mut got = vec![0u8; want.len()];
    assert_eq!(fa.read_at(0, &mut got), Ok(want.len()));
    assert!(got == want, "A's file reads back as written");
    drop(io);
}

/// Holds the server's syncs, runs `a_op` (which syncs) on a thread of its
/// own, and once its sync is held, has B read its file (`fb`, holding
/// `b_data`) and write to it; both must be served while A's sync is still
/// held. Then releases the hold: A's operation must succeed. Returns A's file.
fn held_while_b_is_served(
    flag: &Path,
    held: &Path,
    fa: dafne_client::file::File,
    fb: &dafne_client::file::File,
    b_data: &[u8],
    a_op: impl FnOnce(&dafne_client::file::File) -> Result<(), dafne_proto::Errno> + Send + 'static,
) -> dafne_client::file::File {
    let _ = std::fs::remove_file(held);
    std::fs::write(flag, b"").unwrap();
    let release = Release(flag);
    let (a_tx, a_rx) = mpsc::channel();
    let a = std::thread::spawn(move || {
        let _ = a_tx.send(a_op(&fa));
        fa
    });
    assert!(wait_for(|| held.exists()), "A's sync never reached the server's hold");
    assert!(a_rx.try_recv().is_err(), "A's sync completed while held");

    // B, on its own connection, while A's sync is held.
    std::thread::scope(|scope| {
        let (b_tx, b_rx) = mpsc::channel();
        scope.spawn(move || {
            let mut got = vec![0u8; b_data.len()];
            let read = fb.read_at(0, &mut got).map(|n| (n, got == b_data));
            let _ = b_tx.send(("read", read));
            let written = fb.write_at(4096, &b_data[4096..4096 + 17], Stability::Unstable);
            let _ = b_tx.send(("write", written.map(|n| (n, true))));
        });
        let read = b_rx.recv_timeout(DEADLINE);
        let write = read.is_ok().then(|| b_rx.recv_timeout(DEADLINE));
        if read.is_err() || write.as_ref().is_some_and(|w| w.is_err()) {
            // Released first, so that B's thread ends and the scope with it.
            std::fs::remove_file(flag).unwrap();
        }
        assert!(read.is_ok(), "B's read was not served while A's sync was held");
        assert_eq!(read.unwrap(), ("read", Ok((b_data.len(), true))), "B's read while A's sync was held");
        let write = write.unwrap();
        assert!(write.is_ok(), "B's write was not served while A's sync was held");
        assert_eq!(write.unwrap(), ("write", Ok((17, true))), "B's write while A's sync was held");
    });
    // A's sync is still held: the server did not answer it early.
    assert!(a_rx.try_recv().is_err(), "A's sync completed while held");

    drop(release);
    let synced = a_rx.recv_timeout(DEADLINE).expect("A's sync did not complete once released");
    assert_eq!(synced, Ok(()), "A's operation once its sync was released");
    a.join().unwrap()
}

/// The io server's descriptors of chunk files and sidecars (its data
/// directory's `objects/`).
fn object_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("/objects/"))
        .count()
}

/// Syncs past the server's sync threads (4) wait without descriptors:
/// with every sync held, 24 fsyncs of 24 files under way add at most the
/// threads' duplicates (data and sidecar, 2 × 4) to the server's
/// descriptors. Before, each waited in the threads' queue holding its
/// own two, so one client's syncs (64 per connection) could fill the
/// descriptor table, and a duplicate that failed for want of one marked
/// its object damaged.
#[test]
fn syncs_past_the_sync_threads_hold_no_descriptors() {
    const FILES: usize = 24;
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 64 << 10, 1);
    let flag = root.path().join("hold-sync");
    let held = root.path().join("hold-sync.held");
    let env = [("DAFNE_FAULT_HOLD_SYNC", flag.as_os_str())];
    let io = spawn_io_env(&root.path().join("io0"), &secret, 16, "127.0.0.1:0", &common::storage(), &env);
    let rt = common::runtime("sync-off-loop-fds");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "sync-off-loop-fds", 0, 0).unwrap();
    let data = DataClient::connect(&rt, &[io.addr], &s).unwrap();
    let fs = Fs::new(m.clone(), data.clone());
    let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 1 });
    // Every file exists on the server and is open there (synced once).
    let files: Vec<_> = (0..FILES)
        .map(|i| {
            let f = fs.create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, hint).unwrap();
            f.write_at(0, &pattern(5000, i as u64), Stability::Unstable).unwrap();
            f.fsync().unwrap();
            f
        })
        .collect();
    let cap = files[0].handle().cap;
    let pid = io.child.id();
    let before = object_fds(pid);

    let _ = std::fs::remove_file(&held);
    std::fs::write(&flag, b"").unwrap();
    let release = Release(&flag);
    let syncing: Vec<_> = files.into_iter().map(|f| std::thread::spawn(move || (f.fsync(), f))).collect();
    assert!(wait_for(|| held.exists()), "no sync reached the server's hold");
    // Every fsync is being served (the ServerInfo asking counts itself).
    let in_flight = || futures::executor::block_on(data.server_info(0, cap)).map(|i| i.requests_in_flight).unwrap_or(0);
    assert!(wait_for(|| in_flight() > FILES as u64), "the fsyncs never all reached the server");
    let during = object_fds(pid);
    drop(release);
    for t in syncing {
        let (synced, _f) = t.join().unwrap();
        assert_eq!(synced, Ok(()), "an fsync once released");
    }
    assert!(
        during <= before + 2 * 4,
        "{FILES} syncs held: the server's descriptors of objects went from {before} to {during}"
    );
    drop(io);
}
