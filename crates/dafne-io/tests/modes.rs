//! The serving modes `normal`, `mmap` and `unifier`: each writes and reads
//! back through `DataClient` byte for byte, and its counters show how it
//! served: `normal` copies, `mmap` registers per read, `unifier` does
//! neither on the cached path.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use dafne_client::data::DataClient;
use dafne_client::{MetaSession, OpenFile, ROOT_INO};
use dafne_io::server::{Counters, IoArgs, IoServer, ModeArgs, ServingMode};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;
use dafne_transport::{Access, Region, Runtime, RuntimeOptions};
use futures::executor::block_on;

mod common;

use common::ucx;

struct Setup {
    _meta: dafne_meta::server::MetaServer,
    meta_addr: SocketAddr,
    secret: PathBuf,
    root: tempfile::TempDir,
}

fn meta() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let (meta, secret) = common::start_meta(root.path(), 1, 1 << 20, 1);
    Setup { meta_addr: meta.addr, _meta: meta, secret, root }
}

fn io_args(s: &Setup, name: &str, cache_mib: usize) -> IoArgs {
    IoArgs {
        data_dir: s.root.path().join(name),
        listen: "127.0.0.1:0".parse().unwrap(),
        secret: s.secret.clone(),
        cache_mib,
        ucx: common::ucx_args(),
        storage: common::storage_mode(),
    }
}

fn io(s: &Setup, mode: ServingMode, cache_mib: usize, strict_cache: bool) -> IoServer {
    let mut a = io_args(s, mode.name(), cache_mib);
    if mode != ServingMode::Unifier && a.storage == dafne_io::chunk::StorageMode::Direct {
        // The comparison modes cache in the page cache: never direct.
        a.storage = dafne_io::chunk::StorageMode::Auto;
    }
    dafne_io::server::start_with(&a, ModeArgs { mode, strict_cache, ..Default::default() }).unwrap()
}

fn runtime() -> Runtime {
    Runtime::new(RuntimeOptions { name: "modes-test".into(), ucx_config: ucx(), ..Default::default() }).unwrap()
}

fn clients(s: &Setup, rt: &Runtime, io: SocketAddr) -> (MetaSession, DataClient) {
    let secret = dafne_auth::Secret::load(&s.secret).unwrap();
    let m = MetaSession::connect(rt, s.meta_addr, &secret, "modes", 0, 0).unwrap();
    (m, DataClient::connect(rt, &[io], &secret).unwrap())
}

fn open_new(m: &MetaSession, name: &str) -> OpenFile {
    let hint = LayoutHint { stripe_unit: 1 << 20, stripe_count: 1 };
    let a = m.create_with(ROOT_INO, name.as_bytes(), 0o644, true, Some(hint)).unwrap();
    m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13).wrapping_add(seed) as u8).collect()
}

/// Writes a file by RMA and inline, reads it back every way (registered
/// regions, several in flight, slices, inline, past the end of file) and
/// checks each byte. Returns the file.
fn round_trip(d: &DataClient, f: &OpenFile) -> Vec<u8> {
    let len = 3 << 20;
    let mut model = pattern(len, 7);
    let src = d.register(model.clone(), Access::RemoteRead).unwrap();
    block_on(d.write_region(f, 0, &src, 0, len, Stability::Unstable)).unwrap();
    // Unaligned RMA write over a stripe and pool-buffer boundary, and a small inline one.
    let patch = pattern(700_001, 99);
    block_on(d.write_at(f, 900_000, &patch, Stability::DataSync)).unwrap();
    model[900_000..1_600_001].copy_from_slice(&patch);
    block_on(d.write_at(f, 12_345, b"inline bytes", Stability::Unstable)).unwrap();
    model[12_345..12_357].copy_from_slice(b"inline bytes");

    // Whole file into a registered region.
    let dst = d.register(vec![0u8; len], Access::RemoteWrite).unwrap();
    block_on(d.read_region(f, 0, &dst, 0, len)).unwrap();
    assert!(dst.as_slice() == &model[..], "whole-file read differs");
    // Eight reads of 128 KiB in flight at once, into one region.
    let ctx = d.context().unwrap().clone();
    let many = Region::allocate(&ctx, 8 << 17, Access::RemoteWrite).unwrap();
    let reads = (0..8).map(|i| d.read_region(f, 5 + (i as u64) * 300_000, &many, i << 17, 1 << 17));
    for r in block_on(futures::future::join_all(reads)) {
        r.unwrap();
    }
    for i in 0..8usize {
        let at = 5 + i * 300_000;
        assert!(many.as_slice()[i << 17..(i + 1) << 17] == model[at..at + (1 << 17)], "read {i} in flight differs");
    }
    // Slices: inline (small) and through a registered copy (large, unaligned).
    let mut small = vec![0u8; 1000];
    block_on(d.read_at(f, 12_000, &mut small)).unwrap();
    assert!(small == model[12_000..13_000]);
    let mut large = vec![0u8; 1_234_567];
    block_on(d.read_at(f, 777, &mut large)).unwrap();
    assert!(large == model[777..777 + 1_234_567]);
    // Across the end of file: the rest reads as zeros.
    let tail = d.register(vec![0xEEu8; 200_000], Access::RemoteWrite).unwrap();
    block_on(d.read_region(f, len as u64 - 100_000, &tail, 0, 200_000)).unwrap();
    assert!(tail.as_slice()[..100_000] == model[len - 100_000..]);
    assert!(tail.as_slice()[100_000..].iter().all(|&b| b == 0), "bytes past the end are not zeros");
    assert_eq!(block_on(d.stored_size(f)).unwrap(), len as u64);
    model
}

#[test]
fn normal_mode_serves_correctly_and_counts_its_copies() {
    let s = meta();
    let io = io(&s, ServingMode::Normal, 32, false);
    assert_eq!(io.mode(), ServingMode::Normal);
    let rt = runtime();
    let (m, d) = clients(&s, &rt, io.addr);
    let f = open_new(&m, "normal");
    let before = io.stats();
    assert_eq!(before.serving.startup_registrations as usize, dafne_io::modes::POOL_BUFFERS);
    round_trip(&d, &f);
    // A cached re-read: two copies per byte (page cache → private buffer →
    // registered buffer), and no registration on the server.
    let dst = d.register(vec![0u8; 1 << 20], Access::RemoteWrite).unwrap();
    let (regs, a) = (io.ucx_stats().registrations, io.stats());
    block_on(d.read_region(&f, 0, &dst, 0, 1 << 20)).unwrap();
    let b = io.stats();
    assert_eq!(b.serving.bytes_copied - a.serving.bytes_copied, 2 << 20, "{b:?}");
    assert_eq!(io.ucx_stats().registrations, regs, "normal registered memory while serving");
    assert!(b.serving.hits > a.serving.hits, "the re-read did not hit the page-cache model");
    let merged = io.unifier_stats();
    assert_eq!(merged.bytes_copied, b.serving.bytes_copied, "unifier_stats() merges the mode's counters");
    assert_eq!(b.unifier.hits, 0, "no Unifier in the normal mode");
}

#[test]
fn mmap_mode_serves_correctly_and_registers_per_read() {
    let s = meta();
    let io = io(&s, ServingMode::Mmap, 32, false);
    let rt = runtime();
    let (m, d) = clients(&s, &rt, io.addr);
    let f = open_new(&m, "mmap");
    assert_eq!(io.stats().serving.startup_registrations, 0, "mmap registers its write pool lazily");
    round_trip(&d, &f);
    // Reads map and register the file range each time, and copy nothing.
    let dst = d.register(vec![0u8; 1 << 20], Access::RemoteWrite).unwrap();
    let (ucx, a) = (io.ucx_stats(), io.stats());
    for i in 0..4u64 {
        block_on(d.read_region(&f, i * 100_000, &dst, 0, 1 << 20)).unwrap();
    }
    let (ucx2, b) = (io.ucx_stats().since(&ucx), io.stats());
    assert_eq!(b.serving.registrations - a.serving.registrations, 4, "{b:?}");
    assert!(b.serving.registration_ns > a.serving.registration_ns);
    assert_eq!(b.serving.deregistrations - a.serving.deregistrations, 4, "mappings are released after the put");
    assert_eq!((ucx2.registrations, ucx2.deregistrations), (4, 4));
    assert_eq!(b.serving.bytes_copied, a.serving.bytes_copied, "mmap reads copied");
    assert!(io.unifier_stats().registrations >= 4);
    // Writes go through the pool, as in normal (two copies).
    let w = d.register(pattern(1 << 20, 3), Access::RemoteRead).unwrap();
    block_on(d.write_region(&f, 0, &w, 0, 1 << 20, Stability::Unstable)).unwrap();
    assert_eq!(io.stats().serving.bytes_copied - b.serving.bytes_copied, 2 << 20);
    // Truncate below ranges read before, then read across the new end.
    block_on(d.truncate(&f, 1000)).unwrap();
    block_on(d.read_region(&f, 0, &dst, 0, 4096)).unwrap();
    assert!(dst.as_slice()[..1000] == pattern(1 << 20, 3)[..1000]);
    assert!(dst.as_slice()[1000..4096].iter().all(|&b| b == 0));
}

#[test]
fn unifier_mode_copies_and_registers_nothing_on_the_cached_path() {
    let s = meta();
    let io = io(&s, ServingMode::Unifier, 32, false);
    let rt = runtime();
    let (m, d) = clients(&s, &rt, io.addr);
    let f = open_new(&m, "unifier");
    let model = round_trip(&d, &f);
    let dst = d.register(vec![0u8; 2 << 20], Access::RemoteWrite).unwrap();
    let src = d.register(pattern(2 << 20, 5), Access::RemoteRead).unwrap();
    let (regs, a) = (io.ucx_stats().registrations, io.stats());
    block_on(d.read_region(&f, 0, &dst, 0, 2 << 20)).unwrap();
    assert!(dst.as_slice() == &model[..2 << 20]);
    block_on(d.write_region(&f, 0, &src, 0, 2 << 20, Stability::Unstable)).unwrap();
    block_on(d.read_region(&f, 0, &dst, 0, 2 << 20)).unwrap();
    assert!(dst.as_slice() == src.as_slice());
    let b = io.stats();
    assert_eq!(b.unifier.bytes_copied, a.unifier.bytes_copied, "the cached path copied");
    assert_eq!(b.unifier.misses, a.unifier.misses, "the cached path missed");
    assert!(b.unifier.hits - a.unifier.hits >= 3 * 32);
    assert_eq!(b.unifier.registrations, a.unifier.registrations);
    assert_eq!(io.ucx_stats().registrations, regs, "the server registered memory on the hot path");
    assert_eq!(b.serving, Default::default(), "no comparison-mode counters in the unifier mode");
    assert_eq!(io.unifier_stats(), b.unifier);
}

/// With `--strict-cache` every mode holds `--cache-mib` of data, and the
/// normal mode's pool takes its share: a file that fits the Unifier (and
/// the pool-less mmap reader) does not fit normal's page cache.
#[test]
fn strict_caches_hit_by_size() {
    let s = meta();
    let rt = runtime();
    let size = 6 << 20;
    let mut hit_rates = Vec::new();
    for mode in ServingMode::ALL {
        let io = io(&s, mode, 8, true);
        let (m, d) = clients(&s, &rt, io.addr);
        let f = open_new(&m, &format!("strict-{mode}"));
        let data = pattern(size, 11);
        // Written inline-free in 256 KiB pieces one at a time (the mmap
        // pool grows to one request's worth only).
        let src = d.register(data.clone(), Access::RemoteRead).unwrap();
        for off in (0..size).step_by(256 << 10) {
            block_on(d.write_region(&f, off as u64, &src, off, 256 << 10, Stability::Unstable)).unwrap();
        }
        block_on(d.sync(&f)).unwrap();
        let dst = d.register(vec![0u8; size], Access::RemoteWrite).unwrap();
        let pass = || {
            for off in (0..size).step_by(128 << 10) {
                block_on(d.read_region(&f, off as u64, &dst, off, 128 << 10)).unwrap();
            }
        };
        pass();
        let a = io.unifier_stats();
        pass();
        let b = io.unifier_stats();
        assert!(dst.as_slice() == &data[..], "{mode}: data differs");
        let (h, x) = (b.hits - a.hits, b.misses - a.misses);
        hit_rates.push((mode, h as f64 / (h + x).max(1) as f64));
    }
    let rate = |m: ServingMode| hit_rates.iter().find(|(x, _)| *x == m).unwrap().1;
    assert_eq!(rate(ServingMode::Unifier), 1.0, "{hit_rates:?}");
    assert_eq!(rate(ServingMode::Mmap), 1.0, "{hit_rates:?}");
    assert_eq!(rate(ServingMode::Normal), 0.0, "a sequential re-read through a too-small LRU: {hit_rates:?}");
}

/// The process form: `dafne-io --mode mmap --stats-on-stdin` answers
/// `stats` with a counters line.
#[test]
fn a_server_process_reports_its_counters_on_stdin() {
    let s = meta();
    let a = io_args(&s, "proc", 16);
    let mut child = Command::new(env!("CARGO_BIN_EXE_dafne-io"))
        .args(["--data-dir", path(&a.data_dir), "--secret", path(&a.secret), "--listen", "127.0.0.1:0"])
        .args(["--cache-mib", "16", "--mode", "mmap", "--stats-on-stdin"])
        .args(a.ucx.iter().flat_map(|kv| ["--ucx".to_string(), kv.clone()]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr: SocketAddr = line.trim().strip_prefix("listening on ").unwrap().parse().unwrap();
    let mut ask = || {
        writeln!(stdin, "stats").unwrap();
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        Counters::parse_line(&l).unwrap_or_else(|| panic!("not a counters line: {l:?}"))
    };
    let c0 = ask();
    assert_eq!(c0.mode, ServingMode::Mmap);
    let rt = runtime();
    let (m, d) = clients(&s, &rt, addr);
    let f = open_new(&m, "proc");
    block_on(d.write_at(&f, 0, &pattern(1 << 20, 1), Stability::Unstable)).unwrap();
    let mut back = vec![0u8; 1 << 20];
    block_on(d.read_at(&f, 0, &mut back)).unwrap();
    assert!(back == pattern(1 << 20, 1));
    let c = ask().since(&c0);
    assert_eq!(c.registrations, 1 + 4, "one mapping, four pool buffers registered on the first write: {c:?}");
    assert!(c.cpu_ns > 0 && c.bytes_copied >= 2 << 20 && c.ucx_bytes_put >= 1 << 20, "{c:?}");
    drop(stdin);
    assert!(child.wait().unwrap().success(), "the server did not exit when stdin closed");
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_comparison_modes_keep_the_page_cache() {
    // `normal` and `mmap` are compared with the Unifier as page-cache
    // servers: auto gives them buffered storage, direct is refused.
    let s = meta();
    for mode in [ServingMode::Normal, ServingMode::Mmap] {
        let mut a = io_args(&s, &format!("pc-{mode}"), 8);
        a.storage = dafne_io::chunk::StorageMode::Auto;
        let srv = dafne_io::server::start_with(&a, ModeArgs { mode, ..Default::default() }).unwrap();
        assert!(!srv.stats().storage.direct, "{mode}");
        a.storage = dafne_io::chunk::StorageMode::Direct;
        let e = dafne_io::server::start_with(&a, ModeArgs { mode, ..Default::default() }).unwrap_err();
        assert!(e.to_string().contains("--storage direct needs --mode unifier"), "{e}");
    }
}
