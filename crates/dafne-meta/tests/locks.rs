//! Byte-range locks through the client library against a real metadata
//! server process (`dafne-meta`): exclusion between sessions, waiters woken
//! without polling, leases after a session's end, and reclaim after a
//! restart (issue 11, item 1). The FUSE side is `dafne`'s `tests/locks.rs`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dafne_client::{Errno, LockKind, MetaSession, ROOT_INO};
use dafne_transport::Runtime;

mod common;

use common::{spawn_meta, Meta};

/// A metadata server whose open grace (and so the locks' lease and the
/// grace after a restart) is `grace_s`.
fn start_meta(dir: &Path, listen: &str, grace_s: u32) -> Meta {
    spawn_meta(dir, listen, 1, grace_s, "")
}

fn runtime() -> Runtime {
    common::runtime("lock-test")
}

fn session(rt: &Runtime, dir: &Path, addr: SocketAddr) -> MetaSession {
    common::session_at(rt, dir, addr, "lock-test", 0, 0)
}

const W: LockKind = LockKind::Write;
const R: LockKind = LockKind::Read;
const U: LockKind = LockKind::Unlock;

#[test]
fn locks_exclude_between_sessions_and_a_waiter_is_woken_when_the_range_frees() {
    let dir = tempfile::tempdir().unwrap();
    let m = start_meta(dir.path(), "127.0.0.1:0", 10);
    let (rt1, rt2) = (runtime(), runtime());
    let (one, two) = (session(&rt1, dir.path(), m.addr), session(&rt2, dir.path(), m.addr));
    let f = one.create(ROOT_INO, b"f", 0o644, true).unwrap().ino;
    assert_ne!(one.lock_client(), two.lock_client());
    one.lock(f, 1, 111, 0, 99, W, false).unwrap();
    assert_eq!(two.lock(f, 2, 222, 50, 50, R, false), Err(Errno::EAGAIN));
    two.lock(f, 2, 222, 100, u64::MAX, R, false).unwrap();
    // Another session's lock: its range and kind, no pid; this session's
    // other owner: its pid.
    let h = two.test_lock(f, 3, 0, 0, W).unwrap().unwrap();
    assert_eq!((h.start, h.end, h.kind, h.pid), (0, 99, W, 0));
    assert_eq!(two.test_lock(f, 3, 200, 200, W).unwrap().map(|h| h.pid), Some(222));
    assert_eq!(one.test_lock(f, 1, 0, 99, W).unwrap(), None, "an owner never conflicts with itself");
    let waiter = {
        let two = two.clone();
        std::thread::spawn(move || two.lock(f, 2, 222, 0, 9, W, true))
    };
    // Not granted while held: the waiter is parked on the server.
    m.wait_gauge("dafne_meta_lock_waiters", 1.0);
    assert!(!waiter.is_finished(), "a waiter got a lock that is held");
    one.lock(f, 1, 111, 0, 99, U, false).unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(()));
    assert_eq!(two.held_locks(), 2, "0..=9 written, 100.. read");
    assert_eq!(one.held_locks(), 0);
}

#[test]
fn a_sessions_locks_pass_to_a_waiter_when_its_lease_ends() {
    let dir = tempfile::tempdir().unwrap();
    let m = start_meta(dir.path(), "127.0.0.1:0", 2);
    let rt2 = runtime();
    let two = session(&rt2, dir.path(), m.addr);
    let f = two.create(ROOT_INO, b"f", 0o644, true).unwrap().ino;
    let rt1 = runtime();
    let one = session(&rt1, dir.path(), m.addr);
    one.lock(f, 1, 1, 0, u64::MAX, W, false).unwrap();
    let waiter = {
        let two = two.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            two.lock(f, 2, 2, 0, 0, W, true).map(|()| t.elapsed())
        })
    };
    // The holder's process ends its session (its connection closes).
    let ended = Instant::now();
    drop(one);
    drop(rt1);
    let waited = waiter.join().unwrap().expect("the lock passes on");
    assert!(ended.elapsed() >= Duration::from_secs(2), "granted after {waited:?}, before the 2 s lease ended");
}

#[test]
fn locks_are_claimed_back_after_a_restart_and_released_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let m = start_meta(dir.path(), "127.0.0.1:0", 5);
    let addr = m.addr.to_string();
    let rt1 = runtime();
    let one = session(&rt1, dir.path(), m.addr);
    let f = one.create(ROOT_INO, b"f", 0o644, true).unwrap().ino;
    one.lock(f, 1, 1, 0, 9, W, false).unwrap();
    one.lock(f, 1, 1, 100, 109, W, false).unwrap();
    assert!(dir.path().join("locks.held").exists(), "the first lock marks the store");
    drop(m);
    // Released while the server is down: the unlock cannot reach it, yet
    // returns, and the range must not come back with the reclaim.
    one.lock(f, 1, 1, 100, 109, U, false).unwrap();
    let _m = start_meta(dir.path(), &addr, 5);
    // A new client during the grace waits for it to end; by then the
    // holder's keepalive has reconnected and claimed 0..=9 back.
    let rt2 = runtime();
    let two = session(&rt2, dir.path(), addr.parse().unwrap());
    assert_eq!(two.lock(f, 2, 2, 5, 5, W, false), Err(Errno::EAGAIN), "the lock held before the restart was lost");
    two.lock(f, 2, 2, 100, 109, W, false).expect("a range released while the server was down was claimed back");
    assert!(one.reconnects() >= 1);
}

#[test]
fn a_fresh_server_and_one_stopped_with_no_lock_held_have_no_lock_grace() {
    let dir = tempfile::tempdir().unwrap();
    let m = start_meta(dir.path(), "127.0.0.1:0", 3);
    let rt = runtime();
    let s = session(&rt, dir.path(), m.addr);
    let f = s.create(ROOT_INO, b"f", 0o644, true).unwrap().ino;
    s.lock(f, 1, 1, 0, 0, W, false).unwrap();
    s.lock(f, 1, 1, 0, 0, U, false).unwrap();
    assert!(dir.path().join("locks.held").exists());
    drop(s);
    drop(rt);
    // A clean stop (SIGTERM) with no lock held removes the marker.
    Command::new("kill").arg(m.child.id().to_string()).status().unwrap();
    let mut m = m;
    let _ = m.child.wait();
    assert!(!dir.path().join("locks.held").exists(), "a clean stop with no lock held leaves the marker behind");
}

#[test]
fn past_sixteen_waiting_locks_a_session_still_gets_a_free_lock() {
    let dir = tempfile::tempdir().unwrap();
    let m = start_meta(dir.path(), "127.0.0.1:0", 10);
    let (rt1, rt2) = (runtime(), runtime());
    let (one, two) = (session(&rt1, dir.path(), m.addr), session(&rt2, dir.path(), m.addr));
    let x = two.create(ROOT_INO, b"x", 0o644, true).unwrap().ino;
    let z = two.create(ROOT_INO, b"z", 0o644, true).unwrap().ino;
    two.lock(x, 1, 1, 0, 0, W, false).unwrap();
    two.lock(z, 1, 1, 0, 0, W, false).unwrap();
    // Every turn of `one` to wait on the server is taken by a wait for x.
    let waiters: Vec<_> = (0..dafne_client::locks::MAX_WAITING as u64)
        .map(|i| {
            let one = one.clone();
            std::thread::spawn(move || {
                one.lock(x, 100 + i, 1, 0, 0, W, true)?;
                one.lock(x, 100 + i, 1, 0, 0, U, false)
            })
        })
        .collect();
    m.wait_gauge("dafne_meta_lock_waiters", dafne_client::locks::MAX_WAITING as f64);
    // One more, for z, which is released while x stays held.
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let one = one.clone();
        std::thread::spawn(move || tx.send(one.lock(z, 7, 1, 0, 0, W, true)));
    }
    two.lock(z, 1, 1, 0, 0, U, false).unwrap();
    let got = rx.recv_timeout(Duration::from_secs(20));
    // Let the waiters for x go either way, then judge.
    two.lock(x, 1, 1, 0, 0, U, false).unwrap();
    for w in waiters {
        assert_eq!(w.join().unwrap(), Ok(()), "each takes x in turn and lets the next have it");
    }
    assert_eq!(got, Ok(Ok(())), "the lock on z waited for the unrelated lock on x");
}
