//! Files through `dafne_client::file`: size after close with several
//! writers, readers racing a writer on one range, and a large file through
//! a cache much smaller than it.

mod common;

use std::net::SocketAddr;

use common::{spawn_io, start_meta, IoProc};

use dafne_client::data::DataClient;
use dafne_client::file::Fs;
use dafne_client::{MetaSession, ROOT_INO};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;
use dafne_transport::Runtime;

struct Cluster {
    _meta: dafne_meta::server::MetaServer,
    meta_addr: SocketAddr,
    ios: Vec<IoProc>,
    secret: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn cluster(cache_mib: usize) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let (meta, secret) = start_meta(dir.path(), 4, 64 << 10, 4);
    let ios = (0..4).map(|i| spawn_io(&dir.path().join(format!("io{i}")), &secret, cache_mib, "127.0.0.1:0")).collect();
    Cluster { meta_addr: meta.addr, _meta: meta, ios, secret, _dir: dir }
}

fn fs(c: &Cluster, rt: &Runtime) -> Fs {
    let secret = dafne_auth::Secret::load(&c.secret).unwrap();
    let meta = MetaSession::connect(rt, c.meta_addr, &secret, "files", 0, 0).unwrap();
    let addrs: Vec<SocketAddr> = c.ios.iter().map(|p| p.addr).collect();
    Fs::new(meta, DataClient::connect(rt, &addrs, &secret).unwrap())
}

fn runtime() -> Runtime {
    common::runtime("files")
}

#[test]
fn size_is_exact_after_close_with_several_writers_on_several_stripes() {
    let c = cluster(8);
    let rt = runtime();
    let a = fs(&c, &rt);
    let f = a.create(ROOT_INO, b"shared", 0o644, Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 4 })).unwrap();
    let ino = f.attr().ino;
    f.close().unwrap();
    // Three writers, each in its own runtime, on different stripes; the
    // farthest byte is written by the second.
    let ends = [(0u64, 100_000usize), (5 << 20, 70_000), (1 << 20, 300_000)];
    std::thread::scope(|s| {
        for (i, (off, len)) in ends.into_iter().enumerate() {
            let c = &c;
            s.spawn(move || {
                let rt = runtime();
                let w = fs(c, &rt).open(ino, dafne_proto::OPEN_WRITE | dafne_proto::OPEN_READ).unwrap();
                w.write_at(off, &vec![i as u8 + 1; len], Stability::Unstable).unwrap();
                w.close().unwrap();
            });
        }
    });
    let end = ends.iter().map(|(o, l)| o + *l as u64).max().unwrap();
    assert_eq!(a.meta.getattr(ino).unwrap().size, end);
    let r = a.open(ino, dafne_proto::OPEN_READ).unwrap();
    assert_eq!(r.size(), end);
    for (i, (off, len)) in ends.into_iter().enumerate() {
        let mut buf = vec![0u8; len];
        assert_eq!(r.read_at(off, &mut buf).unwrap(), len);
        assert!(buf.iter().all(|&b| b == i as u8 + 1), "writer {i}'s bytes");
    }
    let mut past = [0u8; 10];
    assert_eq!(r.read_at(end, &mut past).unwrap(), 0, "nothing past the end");
    // A read-only handle cannot truncate; a writable one shrinks everywhere.
    assert_eq!(r.truncate(1000), Err(dafne_client::Errno::EACCES));
    let w = a.open(ino, dafne_proto::OPEN_WRITE).unwrap();
    w.truncate(1000).unwrap();
    assert_eq!(a.meta.getattr(ino).unwrap().size, 1000);
    assert_eq!(futures::executor::block_on(a.data.stored_size(r.handle())).unwrap(), 1000);
    drop(w);
}

/// A handle opened only for writing (Python's `wb`) publishes its size at
/// close and fsync: the io servers tell the stored size to a writing
/// capability too (protocol 14), so it needs no reading open in meta
/// (none is left held); a file unlinked while open has no size to publish
/// (no error at close).
#[test]
fn a_write_only_handle_publishes_its_size_at_close_and_fsync() {
    let c = cluster(8);
    let rt = runtime();
    let a = fs(&c, &rt);
    let ino = a.create(ROOT_INO, b"write-only", 0o644, None).unwrap().attr().ino;
    let w = a.open(ino, dafne_proto::OPEN_WRITE | dafne_proto::OPEN_TRUNC).unwrap();
    w.write_at(0, &[7u8; 300_000], Stability::Unstable).unwrap();
    w.fsync().unwrap();
    assert_eq!(a.meta.getattr(ino).unwrap().size, 300_000);
    w.write_at(300_000, &[8u8; 1000], Stability::Unstable).unwrap();
    let before = dafne_client::calls::this_thread();
    w.close().unwrap();
    let cost = dafne_client::calls::this_thread().since(before);
    // The size read and set in meta and the open closed: no reading open
    // (and its close) for the Stat.
    assert_eq!(cost.meta, 3, "{cost:?}");
    assert_eq!(a.meta.getattr(ino).unwrap().size, 301_000);
    assert_eq!(a.meta.held_opens(), 0, "the reading open made for the size is closed again");
    // Unlinked while open for writing: nothing to publish, and no error.
    let w = a.open(ino, dafne_proto::OPEN_WRITE).unwrap();
    w.write_at(0, b"gone", Stability::Unstable).unwrap();
    a.meta.unlink(ROOT_INO, b"write-only").unwrap();
    w.fsync().unwrap();
    w.close().unwrap();
    assert_eq!(a.meta.held_opens(), 0);
}

/// `fallocate` through the client library against real io servers, with
/// 64 KiB stripe units over 4 servers and the io servers' Unifier in
/// front of their chunk files: a reserve grows the size in meta and on the
/// servers; a punch over bytes still dirty in the servers' caches, across
/// stripe boundaries and inside units, reads back as zeros before and
/// after a sync, with the size kept; a read-only handle may do neither.
#[test]
fn fallocate_reserves_and_punches_through_the_servers_caches() {
    use dafne_proto::io::AllocateMode;
    let c = cluster(8);
    let rt = runtime();
    let a = fs(&c, &rt);
    let f = a.create(ROOT_INO, b"falloc", 0o644, Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 4 })).unwrap();
    let ino = f.attr().ino;
    f.fallocate(0, 1 << 20, AllocateMode::Reserve).unwrap();
    assert_eq!((f.size(), a.meta.getattr(ino).unwrap().size), (1 << 20, 1 << 20));
    assert_eq!(futures::executor::block_on(a.data.stored_size(f.handle())).unwrap(), 1 << 20);
    f.fallocate(4 << 20, 1 << 20, AllocateMode::ReserveKeepSize).unwrap();
    assert_eq!(a.meta.getattr(ino).unwrap().size, 1 << 20, "KEEP_SIZE grew the file");
    // Dirty in the caches (unstable), then a hole from 100 KiB - 1 to
    // 300 KiB + 5: four stripe units, two of them in part.
    let data: Vec<u8> = (0..512 << 10).map(|i| (i % 253) as u8 + 1).collect();
    f.write_at(0, &data, Stability::Unstable).unwrap();
    let (off, len) = ((100 << 10) - 1, (200 << 10) + 6);
    f.fallocate(off as u64, len as u64, AllocateMode::PunchHole).unwrap();
    let mut want = data.clone();
    want[off..off + len].fill(0);
    let mut buf = vec![0xa5; 512 << 10];
    assert_eq!(f.read_at(0, &mut buf).unwrap(), buf.len());
    assert!(buf == want, "the punched range reads back as zeros, the rest intact");
    assert_eq!(a.meta.getattr(ino).unwrap().size, 1 << 20, "a punch changed the size");
    // Written back: nothing of the punched bytes comes back.
    f.fsync().unwrap();
    let mut buf = vec![0xa5; 512 << 10];
    assert_eq!(f.read_at(0, &mut buf).unwrap(), buf.len());
    assert!(buf == want, "write-back brought punched bytes back");
    f.close().unwrap();
    let r = a.open(ino, dafne_proto::OPEN_READ).unwrap();
    assert_eq!(r.fallocate(0, 1, AllocateMode::PunchHole), Err(dafne_client::Errno::EACCES));
    assert_eq!(r.fallocate(0, 8 << 20, AllocateMode::Reserve), Err(dafne_client::Errno::EACCES));
    assert_eq!(a.meta.getattr(ino).unwrap().size, 1 << 20);
}

/// A writer rewrites one 1 MiB range with a new version byte while readers
/// read it: every 64 KiB unit a reader sees is one version, never torn (the
/// server serves a unit to readers or to the writer, not both at once).
#[test]
fn readers_and_a_writer_on_one_range_never_see_a_torn_unit() {
    let c = cluster(16);
    let rt = runtime();
    let a = fs(&c, &rt);
    let f = a.create(ROOT_INO, b"race", 0o644, Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 4 })).unwrap();
    f.write_at(0, &vec![0u8; 1 << 20], Stability::Unstable).unwrap();
    f.close().unwrap();
    let ino = a.meta.lookup(ROOT_INO, b"race").unwrap().ino;
    std::thread::scope(|s| {
        let c = &c;
        s.spawn(move || {
            let rt = runtime();
            let w = fs(c, &rt).open(ino, dafne_proto::OPEN_WRITE | dafne_proto::OPEN_READ).unwrap();
            for v in 1..=40u8 {
                w.write_at(0, &vec![v; 1 << 20], Stability::Unstable).unwrap();
            }
        });
        for _ in 0..2 {
            s.spawn(move || {
                let rt = runtime();
                let r = fs(c, &rt).open(ino, dafne_proto::OPEN_READ).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                for _ in 0..40 {
                    assert_eq!(r.read_at(0, &mut buf).unwrap(), 1 << 20);
                    for (u, unit) in buf.chunks(64 << 10).enumerate() {
                        assert!(
                            unit.iter().all(|&b| b == unit[0]),
                            "unit {u} torn: {} and {}",
                            unit[0],
                            unit[unit.len() - 1]
                        );
                    }
                }
            });
        }
    });
}

#[test]
fn a_256_mib_file_through_caches_much_smaller_than_it() {
    // 4 io servers × 8 MiB of cache against 256 MiB: every unit is evicted
    // and written back on the way.
    let c = cluster(8);
    let rt = runtime();
    let a = fs(&c, &rt);
    let f = a.create(ROOT_INO, b"big", 0o644, Some(LayoutHint { stripe_unit: 1 << 20, stripe_count: 4 })).unwrap();
    let chunk = 4usize << 20;
    let total = 256usize << 20;
    let pattern = |off: usize, i: usize| ((off + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes()[3];
    let src = a.data.register(vec![0u8; chunk], dafne_transport::Access::RemoteRead).unwrap();
    let mut src = src;
    for off in (0..total).step_by(chunk) {
        for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
            *b = pattern(off, i);
        }
        futures::executor::block_on(a.data.write_region(f.handle(), off as u64, &src, 0, chunk, Stability::Unstable))
            .unwrap();
    }
    f.fsync().unwrap();
    assert_eq!(a.meta.getattr(f.attr().ino).unwrap().size, total as u64);
    let dst = a.data.register(vec![0u8; chunk], dafne_transport::Access::RemoteWrite).unwrap();
    for off in (0..total).step_by(chunk) {
        futures::executor::block_on(a.data.read_region(f.handle(), off as u64, &dst, 0, chunk)).unwrap();
        let bad = dst.as_slice().iter().enumerate().position(|(i, &b)| b != pattern(off, i));
        assert!(bad.is_none(), "byte {} differs", off + bad.unwrap_or(0));
    }
}

/// A handle without read rights cannot ask the io servers for the stored
/// size (they demand read rights for `Stat`): its close and publish set
/// the end of its own writes instead of failing, never shrink meta's size,
/// and the zero-copy calls and `refresh_size` the interception library
/// uses agree with the copying ones.
#[test]
fn a_write_only_handle_publishes_the_end_of_its_own_writes() {
    let c = cluster(8);
    let rt = runtime();
    let a = fs(&c, &rt);
    let f = a.create(ROOT_INO, b"wonly", 0o644, None).unwrap();
    let ino = f.attr().ino;
    f.close().unwrap();
    let w = a.open(ino, dafne_proto::OPEN_WRITE).unwrap();
    let data: Vec<u8> = (0..(600 << 10)).map(|i| (i % 251) as u8).collect();
    assert_eq!(w.write_from(1000, &data, Stability::Unstable).unwrap(), data.len());
    w.publish().unwrap();
    let end = 1000 + data.len() as u64;
    assert_eq!(a.meta.getattr(ino).unwrap().size, end);
    // A reader opened before a second writer grows the file learns the
    // new size from meta.
    let r = a.open(ino, dafne_proto::OPEN_READ).unwrap();
    assert_eq!(r.size(), end);
    w.write_at(end, b"tail", Stability::Unstable).unwrap();
    w.close().unwrap();
    assert_eq!(r.refresh_size().unwrap(), end + 4);
    let mut back = vec![0u8; data.len() + 4];
    assert_eq!(r.read_into(1000, &mut back).unwrap(), back.len());
    assert!(back[..data.len()] == data[..] && &back[data.len()..] == b"tail");
    // A write-only handle that wrote less does not shrink the file.
    let w = a.open(ino, dafne_proto::OPEN_WRITE).unwrap();
    w.write_at(0, b"x", Stability::Unstable).unwrap();
    w.close().unwrap();
    assert_eq!(a.meta.getattr(ino).unwrap().size, end + 4);
}
