//! Lazy size publishes (`dafne_meta::store` docs, "Lazy commits") against
//! a real metadata server process: what survives a `kill -9` and a clean
//! stop (SIGTERM, as `dafne down` sends), and how lazy commits interleave
//! with durable ones. A process crash loses no answered lazy commit (the
//! lazy log), nor a durable commit after one, and a clean stop loses
//! nothing that was answered.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dafne_client::{Ino, MetaSession, SetAttr, ROOT_INO};
use dafne_transport::Runtime;

mod common;

use common::{spawn_meta, Meta};

fn start(dir: &Path, listen: &str) -> Meta {
    spawn_meta(dir, listen, 1, 5, "")
}

fn session(rt: &Runtime, m: &Meta) -> MetaSession {
    common::session_at(rt, &m.dir, m.addr, "lazy-test", 0, 0)
}

/// The size publish a mount sends at close.
fn publish(s: &MetaSession, ino: Ino, size: u64) {
    s.setattr(ino, SetAttr { grow_to: Some(size), lazy: true, ..Default::default() }).unwrap();
}

fn size(s: &MetaSession, ino: Ino) -> u64 {
    s.getattr(ino).unwrap().size
}

fn signal(m: &mut Meta, sig: &str) {
    Command::new("kill").args([sig, &m.child.id().to_string()]).status().unwrap();
    let began = Instant::now();
    while m.child.try_wait().unwrap().is_none() {
        assert!(began.elapsed() < Duration::from_secs(30), "the server did not stop on {sig}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGTERM right after a lazy publish: the clean stop makes it durable
/// (the store is closed before the process exits).
#[test]
fn a_clean_stop_right_after_a_lazy_publish_keeps_it() {
    for round in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let mut m = start(dir.path(), "127.0.0.1:0");
        let rt = common::runtime("lazy-term");
        let ino = {
            let s = session(&rt, &m);
            let ino = s.create(ROOT_INO, b"f", 0o644, true).unwrap().ino;
            publish(&s, ino, 4096);
            ino
        };
        signal(&mut m, "-TERM");
        assert!(m.child.try_wait().unwrap().unwrap().success(), "round {round}: the stop was not clean");
        let m = start(dir.path(), "127.0.0.1:0");
        let s = session(&rt, &m);
        assert_eq!(size(&s, ino), 4096, "round {round}: a clean stop lost an answered size publish");
    }
}

/// `kill -9` after lazy and durable commits in turn: every one survives
/// (the last lazy one through the lazy log), and a replay of the log
/// never undoes a durable change made after a lazy one.
#[test]
fn a_crash_keeps_every_durable_commit_and_the_lazy_ones_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = start(dir.path(), "127.0.0.1:0");
    let rt = common::runtime("lazy-kill");
    let (f, g) = {
        let s = session(&rt, &m);
        let f = s.create(ROOT_INO, b"f", 0o644, true).unwrap().ino;
        publish(&s, f, 100); // lazy
        let g = s.create(ROOT_INO, b"g", 0o644, true).unwrap().ino; // durable: carries f's 100
        publish(&s, g, 50); // lazy after durable
        publish(&s, f, 200); // lazy
        s.mkdir(ROOT_INO, b"d", 0o755).unwrap(); // durable again
        publish(&s, f, 300); // lazy, last: may be lost
        (f, g)
    };
    signal(&mut m, "-9");
    let m = start(dir.path(), "127.0.0.1:0");
    let s = session(&rt, &m);
    assert!(s.lookup(ROOT_INO, b"d").is_ok(), "the durable mkdir after lazy commits was lost");
    assert_eq!(size(&s, g), 50, "a lazy commit before a durable one was lost");
    assert_eq!(size(&s, f), 300, "a crash lost the last answered lazy commit");
    // And the store goes on: a durable change after the recovery sticks.
    publish(&s, f, 400);
    s.create(ROOT_INO, b"h", 0o644, true).unwrap();
    drop(s);
    drop(m); // kill -9 (Meta's drop)
    let m = start(dir.path(), "127.0.0.1:0");
    let s = session(&rt, &m);
    assert!(s.lookup(ROOT_INO, b"h").is_ok());
    assert_eq!(size(&s, f), 400);
    // A lazy grow, then a durable truncate: the replay must not grow it back.
    publish(&s, f, 500);
    s.setattr(f, SetAttr { size: Some(10), ..Default::default() }).unwrap();
    publish(&s, g, 60);
    drop(s);
    drop(m);
    let m = start(dir.path(), "127.0.0.1:0");
    let s = session(&rt, &m);
    assert_eq!(size(&s, f), 10, "a replay undid a durable truncate");
    assert_eq!(size(&s, g), 60);
}

/// A lazy publish with nothing after it is made durable by the idle store
/// thread (within a second): once the server counts that commit, a crash
/// keeps it.
#[test]
fn an_idle_server_makes_a_lazy_publish_durable_before_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let m = start(dir.path(), "127.0.0.1:0");
    let rt = common::runtime("lazy-idle");
    let s = session(&rt, &m);
    let f = s.create(ROOT_INO, b"f", 0o644, true).unwrap().ino;
    // The page is rendered at most once a second: one rendered after the
    // create, before the publish.
    std::thread::sleep(Duration::from_millis(1200));
    let durable = commits(&m);
    publish(&s, f, 777);
    m.wait_gauge("dafne_meta_lazy_commits_total", 1.0);
    let began = Instant::now();
    while commits(&m) == durable {
        assert!(began.elapsed() < Duration::from_secs(20), "the lazy commit was never made durable");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(s);
    drop(m); // kill -9
    let m = start(dir.path(), "127.0.0.1:0");
    let s = session(&rt, &m);
    assert_eq!(size(&s, f), 777, "the settled lazy commit was lost in a crash");
}

fn commits(m: &Meta) -> f64 {
    let page = dafne_metrics::http::fetch(m.metrics, Duration::from_secs(5)).expect("metrics page");
    let families = dafne_metrics::parse::parse(&page).expect("a well-formed page");
    families
        .iter()
        .find(|f| f.name == "dafne_meta_commits_total")
        .and_then(|f| f.samples.first())
        .map(|s| s.value)
        .expect("dafne_meta_commits_total")
}
