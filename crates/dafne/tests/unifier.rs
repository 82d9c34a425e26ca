//! The Unifier wired end to end (issue 14, item 1), on a real cluster
//! (`dafne up`): cache advice given with `dafne advise` (the file's or its
//! directory's `user.dafne.cache` attribute) travels in the capabilities
//! meta issues to every io server of the stripe, and the servers' counters
//! (`dafne status --json`: cached units per unit size, units under CLOCK)
//! show the file's units are of the advised size; raw cache memory is
//! registered when first used, so the pinned bytes grow with the cache.
//!
//! Tests run one at a time (a lock): each cluster holds registered memory.

mod common;

use std::path::Path;
use std::process::Output;
use std::sync::{Mutex, MutexGuard};

use common::cluster::{p, Cluster};
use common::{dafne, pattern, text};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(c: &Cluster, args: &[&str]) -> Output {
    dafne().args(args).args(["--dir", p(c.dir())]).output().unwrap()
}

fn ok(c: &Cluster, args: &[&str]) -> String {
    let o = run(c, args);
    assert!(o.status.success(), "dafne {args:?} failed:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The io servers' counters from `dafne status --json`, summed over the
/// servers.
fn io_sum(c: &Cluster, field: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&ok(c, &["status", "--json"])).unwrap();
    v["io"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["info"][field].as_u64().unwrap_or_else(|| panic!("no {field} in {}", s["info"])))
        .sum()
}

fn put(c: &Cluster, name: &str, data: &[u8]) {
    let local = c.scratch("files").join(name.replace('/', "_"));
    std::fs::write(&local, data).unwrap();
    ok(c, &["cp", p(&local), &format!("dafne:{name}")]);
}

fn get(c: &Cluster, name: &str) -> Vec<u8> {
    let local = c.scratch("back").join(name.replace('/', "_"));
    let _ = std::fs::remove_file(&local);
    ok(c, &["cp", &format!("dafne:{name}"), p(&local)]);
    std::fs::read(&local).unwrap()
}

fn mkdir(dir: &Path, name: &str) {
    let cl = dafne_client::cluster::Cluster::open(&dafne_client::cluster::OpenOptions::new(dir, "test")).unwrap();
    cl.meta.mkdir(dafne_proto::ROOT_INO, name.as_bytes(), 0o777).unwrap();
}

#[test]
fn advice_reaches_every_io_server_and_sets_the_files_unit_size_and_policy() {
    let _s = serial();
    let c = Cluster::start_sized(2, "");
    mkdir(c.dir(), "small");
    // Advice on a directory: files created in it afterwards take it.
    let out = ok(&c, &["advise", "dafne:/small", "--unit", "16k", "--policy", "clock"]);
    assert!(out.contains("unit=16k,policy=clock"), "{out}");
    assert!(ok(&c, &["advise", "dafne:/small"]).contains("unit=16k,policy=clock"));
    // A flag given alone keeps the rest of the advice.
    mkdir(c.dir(), "merged");
    ok(&c, &["advise", "dafne:/merged", "--unit", "16k", "--policy", "clock"]);
    assert!(ok(&c, &["advise", "dafne:/merged", "--unit", "4k"]).contains("unit=4k,policy=clock"));
    assert_eq!(io_sum(&c, "units_16k"), 0);

    // 2 MiB striped over both servers (1 MiB stripe unit): the upload's
    // units are 16 KiB on each, all under CLOCK.
    let data = pattern(2 << 20, 1);
    put(&c, "/small/f", &data);
    assert_eq!(io_sum(&c, "units_16k"), (2 << 20) / (16 << 10), "every byte cached in 16 KiB units");
    assert_eq!(io_sum(&c, "units_64k"), 0);
    assert_eq!(io_sum(&c, "clock_units"), io_sum(&c, "units_16k"));
    assert_eq!(get(&c, "/small/f"), data);

    // A file without advice gets the servers' default (64 KiB, LRU).
    let other = pattern(1 << 20, 2);
    put(&c, "/g", &other);
    assert_eq!(io_sum(&c, "units_64k"), (1 << 20) / (64 << 10));
    // Advice given to the file itself takes effect at its next open: its
    // cached units are written back and dropped, and its reads fill 4 KiB
    // units. The bytes stay the same.
    assert!(ok(&c, &["advise", "dafne:/g", "--unit", "4k"]).contains("unit=4k"));
    assert_eq!(get(&c, "/g"), other);
    assert_eq!(io_sum(&c, "units_64k"), 0, "the 64 KiB units of /g were dropped");
    assert_eq!(io_sum(&c, "units_4k"), (1 << 20) / (4 << 10));
    assert_eq!(io_sum(&c, "clock_units"), io_sum(&c, "units_16k"), "/g stays LRU");

    // Clearing it brings the default back at the next open.
    ok(&c, &["advise", "dafne:/g", "--clear"]);
    assert!(ok(&c, &["advise", "dafne:/g"]).contains("no advice"));
    assert_eq!(get(&c, "/g"), other);
    assert_eq!(io_sum(&c, "units_4k"), 0);
    assert_eq!(io_sum(&c, "units_64k"), (1 << 20) / (64 << 10));

    // Mistakes say what is wrong and how to write it.
    let o = run(&c, &["advise", "dafne:/g", "--unit", "12k"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("unit `12k` is not 4k, 8k, 16k, 32k or 64k"), "{}", text(&o));
    let o = run(&c, &["advise", "/g", "--unit", "4k"]);
    assert!(!o.status.success() && text(&o).contains("dafne:/path"), "{}", text(&o));
    let o = run(&c, &["advise", "dafne:/missing", "--unit", "4k"]);
    assert!(!o.status.success() && text(&o).contains("dafne:/missing"), "{}", text(&o));
}

#[test]
fn raw_memory_is_parked_so_pinned_bytes_stay_under_the_bound_while_the_cache_holds_more() {
    let _s = serial();
    // One io server, an 8 MiB cache of 1 MiB slabs: 2 ready, 6 raw, at
    // most 4 MiB registered at once.
    let c = Cluster::start_sized(1, "[io]\nraw_percent = 75\nmax_pinned_mib = 4\n");
    const BOUND: u64 = 4 << 20;
    assert_eq!(io_sum(&c, "pinned_bytes"), 2 << 20, "the ready part, registered at start");
    // 6 MiB: more than the bound, less than the cache.
    let data = pattern(6 << 20, 3);
    put(&c, "/big", &data);
    assert_eq!(get(&c, "/big"), data);
    let misses = io_sum(&c, "misses");
    assert_eq!(get(&c, "/big"), data);
    assert_eq!(io_sum(&c, "misses"), misses, "the second read is served from the cache, all 6 MiB of it");
    assert!(io_sum(&c, "parked_units") > 0, "some of it in raw memory not registered now");
    assert!(io_sum(&c, "deregistrations") > 0);
    let peak = io_sum(&c, "pinned_peak");
    assert!(peak <= BOUND && io_sum(&c, "pinned_bytes") <= BOUND, "peak {peak} above the bound {BOUND}");
    assert!(peak > 2 << 20, "raw memory was registered when used");
}

/// From one metrics page of `io-0`: its `Sync` and `Write` requests
/// answered and its device syncs (`dafne_io_storage_syncs_total`).
fn io_sync_counts(c: &Cluster) -> (f64, f64, f64) {
    let page = common::cluster::server_page(c.dir(), "io-0");
    let requests = |op: &str| {
        page.iter()
            .find(|f| f.name == "dafne_io_requests_total")
            .and_then(|f| f.samples.iter().find(|s| s.labels.iter().any(|(k, v)| k == "op" && v == op)))
            .map(|s| s.value)
            .expect("io-0 counts its requests by op")
    };
    let syncs = page.iter().find(|f| f.name == "dafne_io_storage_syncs_total").expect("io-0 counts its syncs");
    (requests("sync"), requests("write"), syncs.samples[0].value)
}

/// The counts once the page shows one more `Sync` (`sync`) or `Write`
/// request than `before` (the page is rendered at most once a second).
fn io_sync_counts_after(c: &Cluster, before: (f64, f64, f64), sync: bool) -> (f64, f64, f64) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = io_sync_counts(c);
        let shown = if sync { now.0 > before.0 } else { now.1 > before.1 };
        if shown {
            return now;
        }
        assert!(std::time::Instant::now() < end, "io-0's metrics page never showed the request");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// An fsync costs the io server one device sync of the object, and so does
/// a data-sync write however many cache units it covers. (An fsync synced
/// twice, once at the end of the Unifier's flush and once more after it;
/// a stable write of N units synced N times, one after the other, each
/// held by the device while the request waited.)
#[test]
fn an_fsync_and_a_stable_write_each_sync_the_object_once() {
    use dafne_proto::io::Stability;
    let _s = serial();
    let c = Cluster::start_sized(1, "");
    let cl = dafne_client::cluster::Cluster::open(&dafne_client::cluster::OpenOptions::new(c.dir(), "test")).unwrap();
    let fs = dafne_client::file::Fs::new(cl.meta.clone(), cl.data.clone());
    // One stripe of 1 MiB: every byte below goes to one object on io-0.
    let hint = Some(dafne_proto::LayoutHint { stripe_unit: 1 << 20, stripe_count: 1 });
    let f = fs.create(dafne_proto::ROOT_INO, b"once", 0o644, hint).unwrap();
    let data = pattern(256 << 10, 7);
    f.write_at(0, &data, Stability::Unstable).unwrap();

    let before = io_sync_counts_after(&c, (0.0, 0.0, 0.0), false);
    // The `Sync` alone (`File::fsync` also publishes the size, with a
    // `Stat`, whose flush syncs as well).
    futures::executor::block_on(cl.data.sync(f.handle())).unwrap();
    let after = io_sync_counts_after(&c, before, true);
    assert_eq!((after.0 - before.0, after.2 - before.2), (1.0, 1.0), "(Sync requests, device syncs) for one fsync");

    // 256 KiB: four units of the default 64 KiB, in one request.
    let more = pattern(256 << 10, 8);
    assert_eq!(f.write_at(0, &more, Stability::FileSync), Ok(more.len()));
    let last = io_sync_counts_after(&c, after, false);
    assert_eq!(
        (last.1 - after.1, last.2 - after.2),
        (1.0, 1.0),
        "(Write requests, device syncs) for one data-sync write of four units"
    );

    let mut got = vec![0u8; more.len()];
    assert_eq!(f.read_at(0, &mut got), Ok(more.len()));
    assert!(got == more, "the stable write reads back");
    f.close().unwrap();
}
