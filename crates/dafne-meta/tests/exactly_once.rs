//! Exactly-once sessions (issue 11, item 2) through the client library
//! against a real metadata server process: the server's test hook
//! (`DAFNE_FAULT_DROP_REPLY`, `dafne_meta::service` docs, "Fault
//! injection") loses the reply to a create, a rename and an unlink after
//! committing them; the client sends each again on a new connection and
//! must get the first answer (`Ok`), not what a second execution would
//! say (`EEXIST`, `ENOENT`). The second test has the server die right
//! after the commit and starts a new one on the same store and address:
//! the answer comes from the persistent replay cache.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use dafne_client::{Errno, MetaSession, ROOT_INO};
use dafne_transport::Runtime;

mod common;

use common::{spawn_meta, Meta};

/// A metadata server on `listen` with the reply-dropping hook set to
/// `faults` (empty: off).
fn start_meta(dir: &Path, listen: &str, faults: &str) -> Meta {
    spawn_meta(dir, listen, 1, 5, faults)
}

fn runtime() -> Runtime {
    common::runtime("eos-test")
}

fn session(rt: &Runtime, dir: &Path, addr: SocketAddr) -> MetaSession {
    common::session_at(rt, dir, addr, "eos-test", 0, 0)
}

fn names(s: &MetaSession) -> Vec<String> {
    let mut v: Vec<String> =
        s.readdir(ROOT_INO).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    v.sort();
    v
}

#[test]
fn a_create_a_rename_and_an_unlink_whose_replies_are_lost_give_their_first_results() {
    let dir = tempfile::tempdir().unwrap();
    let m = start_meta(dir.path(), "127.0.0.1:0", "create:1,rename:1,unlink:1");
    let rt = runtime();
    let s = session(&rt, dir.path(), m.addr);

    // Exclusive create: executed, reply lost, sent again. A second
    // execution would say EEXIST.
    let created = s.create(ROOT_INO, b"a", 0o644, true).expect("the retried exclusive create got its first answer");
    assert_eq!(s.reconnects(), 1, "the reply was not lost: the hook did not fire");
    assert_eq!(s.lookup(ROOT_INO, b"a").unwrap().ino, created.ino, "the answer is not the first execution's");
    assert_eq!(names(&s), ["a"]);

    // Rename: a second execution would say ENOENT (a is gone).
    s.rename(ROOT_INO, b"a", ROOT_INO, b"b").expect("the retried rename got its first answer");
    assert_eq!(s.reconnects(), 2);
    assert_eq!(names(&s), ["b"]);
    assert_eq!(s.lookup(ROOT_INO, b"b").unwrap().ino, created.ino);

    // Unlink: a second execution would say ENOENT.
    s.unlink(ROOT_INO, b"b").expect("the retried unlink got its first answer");
    assert_eq!(s.reconnects(), 3);
    assert_eq!(names(&s), Vec::<String>::new());
    assert_eq!(s.lookup(ROOT_INO, b"b"), Err(Errno::ENOENT));

    // Later calls are ordinary ones: an exclusive create of an existing
    // name still fails (the cache answers retries, not new requests).
    s.create(ROOT_INO, b"c", 0o644, true).unwrap();
    assert_eq!(s.create(ROOT_INO, b"c", 0o644, true).map(|_| ()), Err(Errno::EEXIST));
    assert_eq!(s.reconnects(), 3);
}

#[test]
fn the_answer_of_a_committed_create_survives_a_server_crash() {
    let dir = tempfile::tempdir().unwrap();
    // The server aborts right after committing the first create, before
    // answering (as `kill -9` there would).
    let mut m = start_meta(dir.path(), "127.0.0.1:0", "create:1:kill");
    let addr = m.addr;
    let rt = runtime();
    let s = session(&rt, dir.path(), addr);
    let created = std::thread::scope(|scope| {
        let call = scope.spawn(|| s.create(ROOT_INO, b"survivor", 0o600, true));
        let began = Instant::now();
        let status = loop {
            if let Some(st) = m.child.try_wait().unwrap() {
                break st;
            }
            assert!(began.elapsed() < Duration::from_secs(20), "the hook did not stop the server");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!status.success(), "the server stopped cleanly instead of dying: {status:?}");
        // A new server on the same store and address, without the hook.
        let restarted = start_meta(dir.path(), &addr.to_string(), "");
        (call.join().unwrap(), restarted)
    });
    let (created, _m2) = created;
    let created = created.expect("the create retried on the restarted server got its first answer");
    assert!(s.reconnects() >= 1);
    assert_eq!(s.lookup(ROOT_INO, b"survivor").unwrap().ino, created.ino);
    assert_eq!(names(&s), ["survivor"]);
}
