//! The small-file and metadata path through a mount (issue 9, item 5):
//! what each FUSE operation costs in round trips to meta and to the io
//! servers (the mount's stats file, `op_*` lines: `dafne_fuse::core`,
//! "Round trips") and in meta's commits (its metrics page), and the edges
//! the cuts must keep: the size visible to another mount at close, an
//! `fsync` that commits durably.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use common::cluster::{meta_metrics_addr, p, Cluster};
use common::{pattern, wait_for};

/// The stats file as numbers by name (empty before the first close).
fn stats(path: &Path) -> HashMap<String, u64> {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    t.lines()
        .filter_map(|l| l.split_once(' ').and_then(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?))))
        .collect()
}

/// Calls, meta requests and io requests of operation `op` between `a` and `b`.
fn cost(a: &HashMap<String, u64>, b: &HashMap<String, u64>, op: &str) -> (u64, u64, u64) {
    let d = |k: &str| {
        let k = format!("op_{op}_{k}");
        b.get(&k).copied().unwrap_or(0) - a.get(&k).copied().unwrap_or(0)
    };
    (d("calls"), d("meta"), d("io"))
}

/// Meta's durable and lazy commits so far. Its page is rendered at most
/// once a second: read after that long.
fn commits(c: &Cluster) -> (u64, u64) {
    std::thread::sleep(Duration::from_millis(1100));
    let page = dafne_metrics::http::fetch(meta_metrics_addr(c.dir()), Duration::from_secs(5)).expect("meta's page");
    let families = dafne_metrics::parse::parse(&page).expect("a well-formed page");
    let get = |name: &str| {
        families.iter().find(|f| f.name == name).and_then(|f| f.samples.first()).map_or(0, |s| s.value as u64)
    };
    (get("dafne_meta_commits_total"), get("dafne_meta_lazy_commits_total"))
}

/// Waits until the mount has answered `n` releases (a release reaches the
/// daemon after `close(2)` returned) and returns the stats then.
fn after_releases(path: &Path, n: u64) -> HashMap<String, u64> {
    wait_for("the release to be counted", || stats(path).get("op_release_calls").copied().unwrap_or(0) >= n);
    stats(path)
}

const OPS: [&str; 9] = ["lookup", "getattr", "create", "open", "read", "write", "flush", "release", "unlink"];

fn table(what: &str, a: &HashMap<String, u64>, b: &HashMap<String, u64>, commits: (u64, u64)) {
    let mut line = format!("{what:<24}");
    for op in OPS {
        let (n, m, i) = cost(a, b, op);
        if n > 0 {
            line.push_str(&format!(" {op} {n}x: meta {m} io {i};"));
        }
    }
    eprintln!("{line} commits {} lazy {}", commits.0, commits.1);
}

/// The round trips of the small-file calls PostMark makes (docs/
/// BENCHMARKS.md, "PostMark"): a create and close costs one compound
/// (create + open) and the release's close in meta, nothing on the io
/// servers; a write-only open, write and close publishes its size with
/// one `Stat` of the io server it wrote to (not one per server of the
/// layout) and one lazy `SetAttr` (no read open in meta for the `Stat`, no
/// fsync in meta); a read-only open and
/// close costs no io round trip at close; an unlink one request.
#[test]
fn small_file_calls_cost_the_round_trips_counted() {
    let c = Cluster::start();
    let st = c.dir().join("small-stats.txt");
    let m = c.mount_with(&["--stats-file", p(&st)]);
    std::fs::create_dir(m.path("d")).unwrap();
    // One close first, so the stats file exists.
    drop(std::fs::File::create(m.path("d/warm")).unwrap());
    let mut releases = 1;
    let s0 = after_releases(&st, releases);
    let c0 = commits(&c);

    // create + close
    drop(std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(m.path("d/f")).unwrap());
    releases += 1;
    let s1 = after_releases(&st, releases);
    let c1 = commits(&c);
    table("create+close", &s0, &s1, (c1.0 - c0.0, c1.1 - c0.1));
    assert_eq!(cost(&s0, &s1, "create"), (1, 1, 0), "create and open in one compound");
    assert_eq!(cost(&s0, &s1, "flush"), (1, 0, 0), "nothing written: the close asks nobody");
    assert_eq!(cost(&s0, &s1, "release"), (1, 1, 0), "the open's close in meta, no io server");
    assert_eq!(c1.0 - c0.0, 1, "the create's commit");

    // open(O_WRONLY) + write 16 KiB + close
    let data = pattern(16 << 10, 1);
    let f = std::fs::OpenOptions::new().write(true).open(m.path("d/f")).unwrap();
    f.write_all_at(&data, 0).unwrap();
    drop(f);
    releases += 1;
    let s2 = after_releases(&st, releases);
    let c2 = commits(&c);
    table("open+write 16K+close", &s1, &s2, (c2.0 - c1.0, c2.1 - c1.1));
    assert_eq!(cost(&s1, &s2, "open"), (1, 1, 0));
    let (_, flush_meta, flush_io) = cost(&s1, &s2, "flush");
    assert_eq!(flush_meta, 1, "the size goes to meta in one SetAttr, without a read open (and its close) for the Stat");
    assert_eq!(flush_io, 1, "one Stat, of the one io server the 16 KiB went to (of the layout's 4)");
    assert_eq!(cost(&s1, &s2, "release"), (1, 1, 0));
    // The close's publish is one lazy commit; the store makes it durable
    // a second later (an empty durable commit: store docs, "Lazy
    // commits"), which may fall inside this measurement.
    assert_eq!(c2.1 - c1.1, 1, "the size published at close is committed lazily: no fsync in meta");
    assert!(c2.0 - c1.0 <= 1, "no durable commit but the settling one: {c1:?} -> {c2:?}");
    assert_eq!(std::fs::metadata(m.path("d/f")).unwrap().len(), data.len() as u64);

    // open(O_RDONLY) + read + close
    let f = std::fs::File::open(m.path("d/f")).unwrap();
    let mut back = vec![0; data.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == data);
    drop(f);
    releases += 1;
    let s3 = after_releases(&st, releases);
    let c3 = commits(&c);
    table("open+read+close", &s2, &s3, (c3.0 - c2.0, c3.1 - c2.1));
    assert_eq!(cost(&s2, &s3, "open"), (1, 1, 0));
    assert_eq!(cost(&s2, &s3, "flush"), (1, 0, 0), "a file this mount did not write: no io round trip at close");
    assert_eq!(cost(&s2, &s3, "release"), (1, 1, 0));
    assert_eq!(c3, c2, "reading commits nothing");

    // stat, then unlink
    std::fs::metadata(m.path("d/f")).unwrap();
    std::fs::remove_file(m.path("d/f")).unwrap();
    // The counts are written at the next close.
    drop(std::fs::File::create(m.path("d/warm")).unwrap());
    releases += 1;
    let s4 = after_releases(&st, releases);
    table("stat, unlink (+ a close)", &s3, &s4, (0, 0));
    assert_eq!(cost(&s3, &s4, "unlink"), (1, 1, 0));
}

/// Creates and unlinks back to back, as PostMark makes them: the kernel
/// asks for the directory's attributes again after each (it drops them at
/// every change in it), and the mount answers from the `GetAttr` that went
/// to meta in the same compound as the change (`dafne_fuse::core`,
/// "Directories just changed"), not with another round trip each.
#[test]
fn the_directory_getattr_after_each_create_and_unlink_costs_no_round_trip() {
    let c = Cluster::start();
    let st = c.dir().join("dir-stats.txt");
    let m = c.mount_with(&["--stats-file", p(&st)]);
    std::fs::create_dir(m.path("d")).unwrap();
    drop(std::fs::File::create(m.path("warm")).unwrap());
    let mut releases = 1;
    let s0 = after_releases(&st, releases);
    const N: u64 = 20;
    for i in 0..N {
        drop(std::fs::OpenOptions::new().write(true).create_new(true).open(m.path(&format!("d/f{i}"))).unwrap());
    }
    releases += N;
    let s1 = after_releases(&st, releases);
    for i in 0..N {
        std::fs::remove_file(m.path(&format!("d/f{i}"))).unwrap();
    }
    drop(std::fs::File::create(m.path("warm")).unwrap());
    releases += 1;
    let s2 = after_releases(&st, releases);
    table("20 creates", &s0, &s1, (0, 0));
    table("20 unlinks", &s1, &s2, (0, 0));
    let (calls, meta, _) = cost(&s0, &s1, "getattr");
    assert!(calls >= N - 1, "the kernel asks for the directory after each create: {calls} getattrs");
    assert!(meta <= 3, "{meta} of {calls} getattrs after {N} creates went to meta");
    let (calls, meta, _) = cost(&s1, &s2, "getattr");
    assert!(calls >= N - 1, "the kernel asks for the directory after each unlink: {calls} getattrs");
    assert!(meta <= 3, "{meta} of {calls} getattrs after {N} unlinks went to meta");
    assert_eq!(cost(&s0, &s1, "create"), (N, N, 0), "one compound per create, the directory's attributes in it");
    assert_eq!(cost(&s1, &s2, "unlink"), (N, N, 0));
    // The directory's attributes are right: its listing is empty, and
    // after a create and a rename in it (the rename brings no attributes:
    // what the create brought is old then) its mtime is what another
    // mount reads from meta.
    assert!(std::fs::read_dir(m.path("d")).unwrap().next().is_none());
    let other = c.mount_at("other", &[]);
    std::fs::write(m.path("d/x"), b"x").unwrap();
    std::fs::rename(m.path("d/x"), m.path("d/y")).unwrap();
    let here = std::fs::metadata(m.path("d")).unwrap().modified().unwrap();
    let there = std::fs::metadata(other.path("d")).unwrap().modified().unwrap();
    assert_eq!(here, there, "the directory's mtime after the rename");
    // A create in it, then an attribute set on the directory itself (no
    // path walk through it between, which would use what the create
    // brought): the directory's ctime is the attribute's, not the create's.
    std::fs::write(m.path("d/z"), b"z").unwrap();
    let d = m.path("d");
    let set = format!("import os; os.setxattr({:?}, 'user.k', b'v')", p(&d));
    let o = std::process::Command::new("python3").args(["-c", &set]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ctime = |path: &Path| {
        let md = std::fs::metadata(path).unwrap();
        (md.ctime(), md.ctime_nsec())
    };
    assert_eq!(ctime(&d), ctime(&other.path("d")), "the directory's ctime after the xattr change");
}

/// What the cuts must keep: a size published lazily at close is what
/// another mount sees right after the close (meta answers from the commit,
/// durable or not), and an `fsync` commits durably (a lazy commit alone
/// would be lost with meta at a power cut).
#[test]
fn a_size_published_at_close_shows_on_another_mount_and_fsync_commits_it_durably() {
    let c = Cluster::start();
    let a = c.mount_at("a", &[]);
    let b = c.mount_at("b", &[]);
    let data = pattern(70_000, 2);
    let f = std::fs::OpenOptions::new().write(true).create_new(true).open(a.path("f")).unwrap();
    f.write_all_at(&data, 0).unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(b.path("f")).unwrap().len(), 70_000, "the size at close, on another mount");
    assert!(std::fs::read(b.path("f")).unwrap() == data);
    // Grown again through a write-only handle: the other mount sees it
    // once its attributes are dropped (the watcher) or expire.
    let f = std::fs::OpenOptions::new().write(true).open(a.path("f")).unwrap();
    f.write_all_at(b"more", 70_000).unwrap();
    drop(f);
    wait_for("the new size on the other mount", || std::fs::metadata(b.path("f")).unwrap().len() == 70_004);

    let before = commits(&c);
    let f = std::fs::OpenOptions::new().write(true).open(a.path("f")).unwrap();
    f.write_all_at(b"tail", 80_000).unwrap();
    f.sync_all().unwrap();
    let after = commits(&c);
    assert!(after.0 > before.0, "fsync's size publish commits durably: {before:?} -> {after:?}");
    assert_eq!(after.1, before.1, "and not lazily");
    drop(f);
    assert_eq!(std::fs::metadata(a.path("f")).unwrap().len(), 80_004);
}

/// Negative entries (`dafne_fuse::fuse` module docs): a name that does not
/// exist is asked of meta once per entry timeout, not once per probe; and
/// when another mount makes it, this mount sees it at once (the watcher
/// drops the negative entry), not after the timeout, here a minute.
#[test]
fn a_missing_name_is_asked_once_and_shows_at_once_when_another_mount_makes_it() {
    let c = Cluster::start_with_config("[mount]\nentry_timeout_ms = 60000\n");
    let st = c.dir().join("neg-stats.txt");
    let a = c.mount_at("a", &["--stats-file", p(&st)]);
    let b = c.mount_at("b", &[]);
    drop(std::fs::File::create(a.path("warm")).unwrap());
    let s0 = after_releases(&st, 1);
    for _ in 0..5 {
        assert_eq!(std::fs::metadata(a.path("missing")).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }
    drop(std::fs::File::create(a.path("warm")).unwrap());
    let s1 = after_releases(&st, 2);
    let (lookups, ..) = cost(&s0, &s1, "lookup");
    assert!(lookups <= 2, "five stats of a missing name (and one open of a cached one) made {lookups} lookups");

    std::fs::write(b.path("missing"), b"now here").unwrap();
    std::fs::create_dir(b.path("missing-dir")).unwrap();
    wait_for("the name made on the other mount", || std::fs::read(a.path("missing")).is_ok_and(|d| d == b"now here"));
    // A name first looked up (negative) after this mount's watcher heard of
    // the change is simply found.
    assert!(std::fs::metadata(a.path("missing-dir")).unwrap().is_dir());
    // This mount's own create over its negative entry.
    assert!(std::fs::metadata(a.path("mine")).is_err());
    std::fs::write(a.path("mine"), b"x").unwrap();
    assert_eq!(std::fs::read(a.path("mine")).unwrap(), b"x");
    assert_eq!(std::fs::read(b.path("mine")).unwrap(), b"x");
}

/// Every way another mount makes a name drops this mount's negative entry
/// for it at once (the entry timeout is a minute: only the watcher can):
/// mkdir, symlink, a hard link, a rename into the name, and a rename that
/// replaces nothing in another directory.
#[test]
fn every_kind_of_new_name_elsewhere_drops_a_negative_entry() {
    let c = Cluster::start_with_config("[mount]\nentry_timeout_ms = 60000\n");
    let a = c.mount_at("a", &[]);
    let b = c.mount_at("b", &[]);
    std::fs::create_dir(b.path("sub")).unwrap();
    std::fs::write(b.path("src"), b"linked").unwrap();
    std::fs::write(b.path("sub/moved"), b"moved").unwrap();
    std::fs::write(b.path("sub/other"), b"other").unwrap();
    wait_for("b's files on a", || a.path("sub/other").exists() && a.path("src").exists());
    let names = ["n-dir", "n-sym", "n-link", "n-renamed", "sub/n-renamed-here"];
    for n in names {
        assert_eq!(std::fs::symlink_metadata(a.path(n)).unwrap_err().kind(), std::io::ErrorKind::NotFound, "{n}");
    }
    std::fs::create_dir(b.path("n-dir")).unwrap();
    std::os::unix::fs::symlink("src", b.path("n-sym")).unwrap();
    std::fs::hard_link(b.path("src"), b.path("n-link")).unwrap();
    std::fs::rename(b.path("sub/moved"), b.path("n-renamed")).unwrap();
    std::fs::rename(b.path("sub/other"), b.path("sub/n-renamed-here")).unwrap();
    wait_for("mkdir elsewhere", || a.path("n-dir").is_dir());
    wait_for("symlink elsewhere", || std::fs::read_link(a.path("n-sym")).is_ok());
    wait_for("link elsewhere", || std::fs::read(a.path("n-link")).is_ok_and(|d| d == b"linked"));
    wait_for("rename elsewhere", || std::fs::read(a.path("n-renamed")).is_ok_and(|d| d == b"moved"));
    wait_for("rename in a subdirectory", || std::fs::read(a.path("sub/n-renamed-here")).is_ok_and(|d| d == b"other"));
}
