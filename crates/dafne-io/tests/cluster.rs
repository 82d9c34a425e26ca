//! A cluster: one metadata server and four io server processes; a client
//! writes, reads and truncates striped files and is checked byte for byte
//! against a reference model.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;

use common::{cluster, cluster_with, spawn_io_storage, start_meta, Cluster, Rng};

use dafne_client::data::{DataClient, RegionSlice};
use dafne_client::{Errno, MetaSession, OpenFile, ROOT_INO};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;
use dafne_transport::Runtime;

fn runtime() -> Runtime {
    common::runtime("io-test")
}

/// One metadata server striping over one io server, and what an in-process
/// io server needs (data on the build's disk: /tmp may be a tmpfs); a test
/// starts (and restarts) the io server itself from `args`.
struct Single {
    args: dafne_io::server::IoArgs,
    m: MetaSession,
    rt: Runtime,
    _meta: dafne_meta::server::MetaServer,
    _root: tempfile::TempDir,
}

fn single(name: &str, cache_mib: usize, storage: dafne_io::chunk::StorageMode) -> Single {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret_path) = start_meta(root.path(), 1, 1 << 20, 1);
    let args = dafne_io::server::IoArgs {
        data_dir: root.path().join("io0"),
        listen: "127.0.0.1:0".parse().unwrap(),
        secret: secret_path.clone(),
        cache_mib,
        ucx: common::ucx_args(),
        storage,
    };
    let rt = runtime();
    let secret = dafne_auth::Secret::load(&secret_path).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &secret, name, 0, 0).unwrap();
    Single { args, m, rt, _meta: meta, _root: root }
}

fn clients(c: &Cluster, rt: &Runtime) -> (MetaSession, DataClient) {
    let secret = dafne_auth::Secret::load(&c.secret).unwrap();
    let meta = MetaSession::connect(rt, c.meta_addr, &secret, "io-test", 0, 0).unwrap();
    let addrs: Vec<SocketAddr> = c.ios.iter().map(|i| i.addr).collect();
    (meta, DataClient::connect(rt, &addrs, &secret).unwrap())
}

fn open_new(m: &MetaSession, name: &str, unit: u32) -> OpenFile {
    let a = m
        .create_with(ROOT_INO, name.as_bytes(), 0o644, true, Some(LayoutHint { stripe_unit: unit, stripe_count: 4 }))
        .unwrap();
    m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap()
}

#[test]
fn striped_random_io_matches_a_reference_model_buffered() {
    striped_random_io_matches_a_reference_model("buffered");
}

#[test]
fn striped_random_io_matches_a_reference_model_direct() {
    striped_random_io_matches_a_reference_model("direct");
}

fn striped_random_io_matches_a_reference_model(storage: &str) {
    // 2 MiB of cache per io server against files of up to 24 MiB (6 MiB per
    // server): units are evicted, dirty ones written back.
    let c = cluster_with(2, storage);
    let rt = runtime();
    let (m, d) = clients(&c, &rt);
    for (fi, unit) in [4u32 << 10, 64 << 10, 1 << 20].into_iter().enumerate() {
        let f = open_new(&m, &format!("model{fi}"), unit);
        assert_eq!(f.layout.stripe_unit, unit);
        assert_eq!(f.layout.servers.len(), 4);
        let mut model: Vec<u8> = Vec::new();
        let mut rng = Rng(0x9E37_79B9 + fi as u64);
        for step in 0..60 {
            match rng.below(10) {
                0..=4 => {
                    let off = rng.below(20 << 20);
                    let max = if rng.below(2) == 0 { 40_000 } else { 3 << 20 };
                    let len = 1 + rng.below(max) as usize;
                    let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ off ^ step).wrapping_mul(131) as u8).collect();
                    let stab = if rng.below(4) == 0 { Stability::FileSync } else { Stability::Unstable };
                    futures::executor::block_on(d.write_at(&f, off, &data, stab)).unwrap();
                    let end = off as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                }
                5..=7 if !model.is_empty() => {
                    let off = rng.below(model.len() as u64) as usize;
                    let len = 1 + rng.below((model.len() - off) as u64) as usize;
                    let mut buf = vec![0xEEu8; len];
                    futures::executor::block_on(d.read_at(&f, off as u64, &mut buf)).unwrap();
                    assert!(buf == model[off..off + len], "unit {unit}, step {step}: read {off}+{len} differs");
                }
                8 => {
                    let size = rng.below(24 << 20) as usize;
                    futures::executor::block_on(d.truncate(&f, size as u64)).unwrap();
                    model.resize(size, 0);
                }
                _ => {
                    futures::executor::block_on(d.sync(&f)).unwrap();
                    let stored = futures::executor::block_on(d.stored_size(&f)).unwrap();
                    assert_eq!(stored, model.len() as u64, "unit {unit}, step {step}: size after fsync");
                }
            }
        }
        // The whole file, through the RMA path.
        let mut all = vec![0u8; model.len()];
        futures::executor::block_on(d.read_at(&f, 0, &mut all)).unwrap();
        assert!(all == model, "unit {unit}: final contents differ");
    }
}

#[test]
fn file_sync_writes_survive_kill_9_of_an_io_server_buffered() {
    file_sync_writes_survive_kill_9_of_an_io_server("buffered");
}

#[test]
fn file_sync_writes_survive_kill_9_of_an_io_server_direct() {
    file_sync_writes_survive_kill_9_of_an_io_server("direct");
}

fn file_sync_writes_survive_kill_9_of_an_io_server(storage: &str) {
    let mut c = cluster_with(8, storage);
    let rt = runtime();
    let (m, d) = clients(&c, &rt);
    let f = open_new(&m, "durable", 64 << 10);
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    futures::executor::block_on(d.write_at(&f, 0, &data, Stability::FileSync)).unwrap();
    // Kill the server holding the second stripe and restart it on its data.
    let victim = f.layout.servers[1] as usize;
    let dir = c.ios[victim].dir.clone();
    c.ios[victim].child.kill().unwrap();
    c.ios[victim].child.wait().unwrap();
    c.ios[victim] = spawn_io_storage(&dir, &c.secret, 8, "127.0.0.1:0", storage);
    let rt2 = runtime();
    let (_, d2) = clients(&c, &rt2);
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(d2.read_at(&f, 0, &mut back)).unwrap();
    assert!(back == data, "data lost across kill -9 of io server {victim}");
}

#[test]
fn capabilities_are_checked_by_io_servers() {
    let c = cluster(4);
    let rt = runtime();
    let (m, d) = clients(&c, &rt);
    let f = open_new(&m, "guarded", 64 << 10);
    futures::executor::block_on(d.write_at(&f, 0, b"hello", Stability::Unstable)).unwrap();
    // A read-only open cannot write.
    let ro = m.open(f.attr.ino, dafne_proto::OPEN_READ).unwrap();
    assert_eq!(futures::executor::block_on(d.write_at(&ro, 0, b"HELLO", Stability::Unstable)), Err(Errno::EACCES));
    let mut buf = [0u8; 5];
    futures::executor::block_on(d.read_at(&ro, 0, &mut buf)).unwrap();
    assert_eq!(&buf, b"hello");
    // A capability for another file does not open this one: changing the
    // object id breaks the MAC.
    let other = open_new(&m, "other", 64 << 10);
    let mut forged = other.clone();
    forged.cap.object_id = f.cap.object_id;
    assert_eq!(futures::executor::block_on(d.read_at(&forged, 0, &mut buf)), Err(Errno::EACCES));
}

/// The unifier serving mode copies nothing on the cached read and write
/// paths: the server puts from and gets into cache units, and the client's
/// registered regions are the other end. Inline (small) I/O is the one
/// copy, and it is counted.
#[test]
fn cached_reads_and_writes_copy_nothing() {
    let Single { args, m, rt, .. } = &single("zc", 16, common::storage_mode());
    let io = dafne_io::server::start(args).unwrap();
    let d = DataClient::connect(rt, &[io.addr], dafne_auth::Secret::load(&args.secret).unwrap()).unwrap();
    let a = m.create(ROOT_INO, b"zc", 0o644, true).unwrap();
    let f = m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    let src =
        d.register((0..(4u32 << 20)).map(|i| (i * 7) as u8).collect(), dafne_transport::Access::RemoteRead).unwrap();
    let dst = d.register(vec![0u8; 4 << 20], dafne_transport::Access::RemoteWrite).unwrap();
    let server_regs = io.ucx_stats().registrations;
    let before = io.unifier_stats();
    futures::executor::block_on(d.write_region(&f, 0, &src, 0, src.len(), Stability::Unstable)).unwrap();
    for _ in 0..3 {
        futures::executor::block_on(d.read_region(&f, 0, &dst, 0, dst.len())).unwrap();
    }
    assert!(dst.as_slice() == src.as_slice());
    let after = io.unifier_stats();
    assert_eq!(after.bytes_copied - before.bytes_copied, 0, "the cached path copied: {after:?}");
    assert!(after.hits - before.hits >= 3 * 64, "re-reads were not cache hits: {after:?}");
    assert_eq!(io.ucx_stats().registrations, server_regs, "the server registered memory on the hot path");
    assert!(io.ucx_stats().bytes_put >= 3 * (4 << 20) as u64 && io.ucx_stats().bytes_got >= (4 << 20) as u64);
    // Inline I/O is the exception, and it is counted.
    futures::executor::block_on(d.write_at(&f, 100, b"tiny", Stability::Unstable)).unwrap();
    assert_eq!(io.unifier_stats().bytes_copied - after.bytes_copied, 4);
}

#[test]
fn completion_queues_run_many_reads_and_writes_at_once() {
    let c = cluster(8);
    let rt = runtime();
    let (m, d) = clients(&c, &rt);
    let f = open_new(&m, "cq", 64 << 10);
    let cq = dafne_client::cq::CompletionQueue::new();
    let chunk = 256 << 10;
    let srcs: Vec<std::sync::Arc<dafne_transport::Region>> = (0..8)
        .map(|i| {
            std::sync::Arc::new(d.register(vec![i as u8 + 1; chunk], dafne_transport::Access::RemoteRead).unwrap())
        })
        .collect();
    let writes: Vec<_> = srcs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let from = RegionSlice { region: r.clone(), offset: 0, len: chunk };
            d.post_write(&cq, &f, (i * chunk) as u64, from, Stability::Unstable)
        })
        .collect();
    for t in &writes {
        assert_eq!(cq.wait(*t, std::time::Duration::from_secs(30)), Ok(chunk));
    }
    let dst = std::sync::Arc::new(d.register(vec![0u8; 8 * chunk], dafne_transport::Access::RemoteWrite).unwrap());
    for i in 0..8 {
        d.post_read(&cq, &f, (i * chunk) as u64, RegionSlice { region: dst.clone(), offset: i * chunk, len: chunk });
    }
    let mut n = 0;
    while let Some((_, r)) = cq.wait_any(std::time::Duration::from_secs(30)) {
        assert_eq!(r, Ok(chunk));
        n += 1;
    }
    assert_eq!(n, 8);
    for i in 0..8 {
        assert!(dst.as_slice()[i * chunk..(i + 1) * chunk].iter().all(|&b| b == i as u8 + 1), "chunk {i}");
    }
}

/// List I/O: scattered file ranges from one registered buffer in one request
/// per io server, read back with a different list shape.
#[test]
fn list_io_scatters_and_gathers() {
    let c = cluster(8);
    let rt = runtime();
    let (m, d) = clients(&c, &rt);
    let f = open_new(&m, "list", 16 << 10);
    let ranges: Vec<(u64, usize)> =
        (0..40u64).map(|i| (i * 100_003 + (i % 7) * 13, 1000 + (i as usize * 997) % 30_000)).collect();
    let total: usize = ranges.iter().map(|r| r.1).sum();
    let mut src = d.register(vec![0u8; total], dafne_transport::Access::RemoteRead).unwrap();
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    assert_eq!(futures::executor::block_on(d.write_list(&f, &ranges, &src, 0, Stability::Unstable)), Ok(total));
    // Read each range back on its own and compare.
    let mut at = 0;
    for &(off, len) in &ranges {
        let mut buf = vec![0u8; len];
        futures::executor::block_on(d.read_at(&f, off, &mut buf)).unwrap();
        assert!(buf == src.as_slice()[at..at + len], "range at {off}");
        at += len;
    }
    // And all at once, in reverse order, into another buffer.
    let rev: Vec<(u64, usize)> = ranges.iter().rev().copied().collect();
    let dst = d.register(vec![0u8; total], dafne_transport::Access::RemoteWrite).unwrap();
    assert_eq!(futures::executor::block_on(d.read_list(&f, &rev, &dst, 0)), Ok(total));
    let mut at = 0;
    let mut src_at: Vec<usize> = Vec::new();
    let mut acc = 0;
    for r in &ranges {
        src_at.push(acc);
        acc += r.1;
    }
    for (i, &(_, len)) in ranges.iter().enumerate().rev() {
        assert!(dst.as_slice()[at..at + len] == src.as_slice()[src_at[i]..src_at[i] + len], "reverse range {i}");
        at += len;
    }
}

/// Slice I/O above the inline limit goes through pre-registered bounce
/// buffers: after the first call, no client registration per request.
#[test]
fn slice_io_registers_nothing_per_call() {
    let c = cluster(8);
    let rt = runtime();
    let (m, d) = clients(&c, &rt);
    let f = open_new(&m, "bounce", 64 << 10);
    let data: Vec<u8> = (0..(3usize << 20) + 12345).map(|i| (i % 241) as u8).collect();
    futures::executor::block_on(d.write_at(&f, 7, &data, Stability::Unstable)).unwrap();
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(d.read_at(&f, 7, &mut back)).unwrap();
    assert!(back == data);
    let regs = rt.context().stats().snapshot().registrations;
    for _ in 0..5 {
        futures::executor::block_on(d.write_at(&f, 7, &data, Stability::Unstable)).unwrap();
        futures::executor::block_on(d.read_at(&f, 7, &mut back)).unwrap();
    }
    assert!(back == data);
    assert_eq!(rt.context().stats().snapshot().registrations, regs, "slice I/O registered memory per call");
}

/// `--storage direct`: every unit of a cold read is filled with O_DIRECT
/// through the ring, and whole dirty units are written back the same way
/// (no byte through the page cache); the counters say which path served.
#[test]
fn direct_storage_fills_and_writes_back_whole_units_without_the_page_cache() {
    let Single { args, m, rt, .. } = &single("direct", 4, dafne_io::chunk::StorageMode::Direct);
    let io = dafne_io::server::start(args).unwrap();
    let d = DataClient::connect(rt, &[io.addr], dafne_auth::Secret::load(&args.secret).unwrap()).unwrap();
    let f = open_new_on(m, "direct", 1 << 20, 1);
    // 16 MiB through a 4 MiB cache: write-behind and eviction write whole
    // 64 KiB units back; reading it all again misses and fills every unit.
    let len = 16usize << 20;
    let src =
        d.register((0..len as u32).map(|i| (i % 253) as u8).collect(), dafne_transport::Access::RemoteRead).unwrap();
    let dst = d.register(vec![0u8; len], dafne_transport::Access::RemoteWrite).unwrap();
    futures::executor::block_on(d.write_region(&f, 0, &src, 0, len, Stability::Unstable)).unwrap();
    futures::executor::block_on(d.sync(&f)).unwrap();
    futures::executor::block_on(d.read_region(&f, 0, &dst, 0, len)).unwrap();
    assert!(dst.as_slice() == src.as_slice());
    let s = io.stats();
    assert!(s.storage.direct, "{:?}", s.storage);
    assert_eq!(s.storage.buffered_ops, 0, "whole units only: {:?}", s.storage);
    assert!(s.unifier.fills > 0 && s.unifier.writebacks > 0, "{:?}", s.unifier);
    assert!(s.storage.direct_bytes >= 2 * len as u64 - (4 << 20), "{:?}", s.storage);
    assert_eq!(s.counters().storage_direct, 1);
    // A partial unit (5000 bytes at 3): its unaligned head and tail go buffered.
    futures::executor::block_on(d.write_at(&f, 3, &[7u8; 5000], Stability::FileSync)).unwrap();
    let s2 = io.stats();
    assert!(s2.storage.buffered_ops > 0, "{:?}", s2.storage);
    let mut back = vec![0u8; 5010];
    futures::executor::block_on(d.read_at(&f, 0, &mut back)).unwrap();
    assert!(back[3..5003].iter().all(|&b| b == 7) && back[..3] == src.as_slice()[..3]);
    assert!(back[5003..] == src.as_slice()[5003..5010]);
}

fn open_new_on(m: &MetaSession, name: &str, unit: u32, count: u32) -> OpenFile {
    let a = m
        .create_with(
            ROOT_INO,
            name.as_bytes(),
            0o644,
            true,
            Some(LayoutHint { stripe_unit: unit, stripe_count: count }),
        )
        .unwrap();
    m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap()
}

/// Several writers on one io server: dirty units are written back by the
/// Unifier's background thread, never synchronously on the event loop
/// (`write_behind` stays 0), and every byte reads back.
#[test]
fn concurrent_writers_are_written_back_in_the_background() {
    // 8 MiB of cache: write-behind bound 2 MiB, background from 1 MiB.
    let Single { args, m, rt, .. } = &single("bg", 8, common::storage_mode());
    let io = dafne_io::server::start(args).unwrap();
    let d = DataClient::connect(rt, &[io.addr], dafne_auth::Secret::load(&args.secret).unwrap()).unwrap();
    let files: Vec<OpenFile> = (0..3).map(|i| open_new_on(m, &format!("bg{i}"), 1 << 20, 1)).collect();
    let len = 6usize << 20;
    let data: Vec<Vec<u8>> = (0..3).map(|i| (0..len).map(|b| (b % 241) as u8 ^ (i as u8 * 85)).collect()).collect();
    let writers = files.iter().zip(&data).map(|(f, bytes)| {
        let d = &d;
        async move {
            for off in (0..len).step_by(1 << 20) {
                d.write_at(f, off as u64, &bytes[off..off + (1 << 20)], Stability::Unstable).await.unwrap();
            }
        }
    });
    futures::executor::block_on(futures::future::join_all(writers));
    let s = io.stats().unifier;
    assert!(s.background_writebacks > 0 && s.background_batches > 0, "{s:?}");
    assert_eq!(s.write_behind, 0, "a write-back ran on the event loop: {s:?}");
    for (f, want) in files.iter().zip(&data) {
        futures::executor::block_on(d.sync(f)).unwrap();
        let mut back = vec![0u8; len];
        futures::executor::block_on(d.read_at(f, 0, &mut back)).unwrap();
        assert!(back == *want, "file {} differs", f.cap.object_id);
    }
}

#[test]
fn server_info_reports_capacity_and_counters_to_holders_of_a_capability() {
    let c = cluster(4);
    let rt = runtime();
    let (m, d) = clients(&c, &rt);
    let secret = dafne_auth::Secret::load(&c.secret).unwrap();
    let cap = dafne_client::data::info_capability(&secret);
    let before = futures::executor::block_on(d.all_server_info(cap));
    let f = open_new(&m, "info", 64 << 10);
    let data = vec![7u8; 4 << 20];
    futures::executor::block_on(d.write_at(&f, 0, &data, Stability::Unstable)).unwrap();
    let mut back = vec![0u8; 4 << 20];
    futures::executor::block_on(d.read_at(&f, 0, &mut back)).unwrap();
    let after = futures::executor::block_on(d.all_server_info(cap));
    let statvfs = rustix::fs::statvfs(c.ios[0].dir.as_path()).unwrap();
    for (b, a) in before.into_iter().zip(after) {
        let (b, a) = (b.unwrap(), a.unwrap());
        assert_eq!(a.capacity_bytes, statvfs.f_blocks * statvfs.f_frsize);
        assert!(a.available_bytes > 0 && a.available_bytes <= a.capacity_bytes);
        assert_eq!(a.mode, 2);
        assert_eq!(a.cache_bytes, 4 << 20);
        // 1 MiB per server written (16 units of 64 KiB), then read back from the cache.
        assert_eq!(a.hits - b.hits, 16, "{a:?}");
        assert_eq!(a.bytes_copied, 0);
        // Unstable writes stay in the cache, except what the background
        // writer has written back already (it starts at half the bound).
        assert_eq!(a.dirty_bytes + (a.writebacks - b.writebacks) * (64 << 10), 1 << 20, "{a:?}");
        // Slice I/O goes through 1 MiB bounce buffers, each spanning every
        // server: at least 4 writes and 4 reads per server, and this
        // request, the only one in flight.
        assert!(a.requests_served - b.requests_served >= 9, "{a:?}");
        assert_eq!(a.requests_in_flight, 1);
        assert_eq!(a.filesystem_id, statvfs.f_fsid);
    }
    // Four servers on one file system count once.
    let (total, avail) = futures::executor::block_on(d.capacity(cap)).unwrap();
    assert_eq!(total, statvfs.f_blocks * statvfs.f_frsize);
    assert!(avail > 0);
    // On a connection that did not log in nothing is served: not with a
    // forged capability, nor none, nor a genuine one (only `Login` keys a
    // connection's frames).
    let mut forged = cap;
    forged.mac[0] ^= 1;
    let raw = dafne_transport::Client::connect(&rt, c.ios[0].addr).unwrap();
    let ask = |cap| {
        let req = dafne_proto::io::IoRequest::ServerInfo { cap };
        let b = raw.call(dafne_proto::io::encode_io_request(dafne_proto::Envelope::new(1, 0, 0), &req)).unwrap();
        dafne_proto::io::decode_io_reply(&b).unwrap().2.map(|_| ())
    };
    assert_eq!(ask(forged), Err(Errno::EACCES));
    assert_eq!(ask(dafne_client::data::LOGGED_IN), Err(Errno::EACCES));
    assert_eq!(ask(cap), Err(Errno::EACCES));
    // A logged-in data client needs none.
    assert!(futures::executor::block_on(d.server_info(0, dafne_client::data::LOGGED_IN)).is_ok());
}

/// Io servers verify a credential's login as meta does, without the
/// client holding the cluster secret: the genuine credential logs in and
/// reads and writes with the capabilities meta issues it; a policy edited
/// after issue, or a login made with a credential's key posing as the
/// cluster secret, is refused.
#[test]
fn a_credential_logs_in_to_io_servers_and_an_edited_one_is_refused() {
    let c = cluster(4);
    let rt = runtime();
    let secret = dafne_auth::Secret::load(&c.secret).unwrap();
    let policy = dafne_proto::Credential {
        name: "alice".into(),
        uids: vec![dafne_proto::IdRange { first: 1000, last: 1000 }],
        gids: vec![dafne_proto::IdRange { first: 1000, last: 1000 }],
        root: false,
    };
    let file = dafne_auth::CredentialFile::issue(&secret, policy).unwrap();
    let addrs: Vec<SocketAddr> = c.ios.iter().map(|i| i.addr).collect();
    let admin = MetaSession::connect(&rt, c.meta_addr, &secret, "admin", 0, 0).unwrap();
    let home = admin.mkdir(ROOT_INO, b"home", 0o777).unwrap().ino;
    let key = dafne_auth::LoginKey::from(file.clone());
    let m = MetaSession::connect(&rt, c.meta_addr, &key, "alice", 1000, 1000).unwrap();
    let d = DataClient::connect(&rt, &addrs, &key).unwrap();
    let a = m.create(home, b"f", 0o644, true).unwrap();
    assert_eq!(a.uid, 1000);
    let f = m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    let data = vec![5u8; 300_000];
    futures::executor::block_on(d.write_at(&f, 0, &data, Stability::FileSync)).unwrap();
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(d.read_at(&f, 0, &mut back)).unwrap();
    assert!(back == data);
    assert!(futures::executor::block_on(d.capacity(dafne_client::data::LOGGED_IN)).is_ok());

    let mut edited = file.clone();
    edited.credential.root = true;
    match DataClient::connect(&rt, &addrs, dafne_auth::LoginKey::from(edited)) {
        Err(dafne_client::ConnectError::IoLogin { why, .. }) => assert!(why.contains("Permission denied"), "{why}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("an edited credential logged in to the io servers"),
    }
    match DataClient::connect(&rt, &addrs, &file.key) {
        Err(dafne_client::ConnectError::IoLogin { .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a credential's key passed for the cluster secret"),
    }
}

/// A sequential reader that misses gets the next units read ahead in the
/// same storage submission: the following requests hit; a random reader
/// gets no read-ahead.
#[test]
fn sequential_reads_that_miss_read_ahead() {
    let Single { args, m, rt, .. } = &single("ra", 16, common::storage_mode());
    let f = open_new_on(m, "ra", 1 << 20, 1);
    let len = 8usize << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    {
        let io = dafne_io::server::start(args).unwrap();
        let d = DataClient::connect(rt, &[io.addr], dafne_auth::Secret::load(&args.secret).unwrap()).unwrap();
        futures::executor::block_on(d.write_at(&f, 0, &data, Stability::FileSync)).unwrap();
    }
    // A new server on the same data: nothing cached.
    let io = dafne_io::server::start(args).unwrap();
    let d = DataClient::connect(rt, &[io.addr], dafne_auth::Secret::load(&args.secret).unwrap()).unwrap();
    let buf = d.register(vec![0u8; 128 << 10], dafne_transport::Access::RemoteWrite).unwrap();
    let read = |off: usize| {
        futures::executor::block_on(d.read_region(&f, off as u64, &buf, 0, 128 << 10)).unwrap();
        assert!(buf.as_slice() == &data[off..off + (128 << 10)]);
    };
    // Random: no read-ahead.
    read(5 << 20);
    read(3 << 20);
    let s0 = io.stats().unifier;
    assert_eq!(s0.prefetched, 4, "only the requests' own units: {s0:?}");
    // Sequential from 0: the second request misses and reads 1 MiB ahead.
    read(0);
    read(128 << 10);
    let s1 = io.stats().unifier;
    assert_eq!(s1.prefetched - s0.prefetched, 4 + 16, "{s1:?}");
    assert_eq!((s0.read_ahead, s1.read_ahead), (0, 16), "{s1:?}");
    let misses = s1.misses;
    for k in 2..10 {
        read(k * (128 << 10));
    }
    assert_eq!(io.stats().unifier.misses, misses, "the read-ahead units were hits");
}

/// A clean stop refuses new requests before its final write-back, so that
/// nothing is acknowledged that the write-back misses; a new server on the
/// same data then has every byte acknowledged before.
#[test]
fn a_clean_stop_refuses_writes_and_writes_back_what_it_acknowledged() {
    let Single { args, m, rt, .. } = &single("drain", 16, common::storage_mode());
    let f = open_new_on(m, "drain", 1 << 20, 1);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
    {
        let io = dafne_io::server::start(args).unwrap();
        let d = DataClient::connect(rt, &[io.addr], dafne_auth::Secret::load(&args.secret).unwrap()).unwrap();
        futures::executor::block_on(d.write_at(&f, 0, &data, Stability::Unstable)).unwrap();
        assert!(io.stats().unifier.dirty_bytes > 0);
        io.drain_and_flush().unwrap();
        assert_eq!(io.stats().unifier.dirty_bytes, 0);
        let late = futures::executor::block_on(d.write_at(&f, 0, b"late", Stability::Unstable));
        assert_eq!(late, Err(Errno::EAGAIN), "a write after the final write-back is refused");
    }
    let io = dafne_io::server::start(args).unwrap();
    let d = DataClient::connect(rt, &[io.addr], dafne_auth::Secret::load(&args.secret).unwrap()).unwrap();
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(d.read_at(&f, 0, &mut back)).unwrap();
    assert!(back == data);
}
