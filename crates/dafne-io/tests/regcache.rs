//! The client's registration cache against real io server processes: large
//! slice I/O is zero-copy on cached registrations of the application's own
//! buffers, a freed (unmapped) buffer's registration is never served again,
//! and the pinned-bytes bound holds. Data is checked byte for byte.
//!
//! The servers and clients here behave as on different hosts
//! (`common::as_if_across_hosts`): on one host io servers refuse keys to
//! registered memory (`EREMOTEIO`, see `hostile_rma.rs`) and the library
//! sends caller buffers through its bounce buffers instead.

mod common;

use std::net::SocketAddr;

use common::{cluster, Cluster};

use dafne_client::data::{DataClient, ZERO_COPY_MIN};
use dafne_client::regcache::RegCacheConfig;
use dafne_client::{MetaSession, OpenFile, ROOT_INO};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;
use dafne_transport::Runtime;
use futures::executor::block_on;

/// Four io servers that treat this process as on another host.
fn across_hosts(cache_mib: usize) -> Cluster {
    common::as_if_across_hosts();
    cluster(cache_mib)
}

fn clients(c: &Cluster, rt: &Runtime, cache: RegCacheConfig) -> (MetaSession, DataClient) {
    let secret = dafne_auth::Secret::load(&c.secret).unwrap();
    // The metadata server runs in this process, on this host's terms.
    let meta_rt: &'static Runtime = Box::leak(Box::new(common::runtime_on_this_host("regcache-meta")));
    let meta = MetaSession::connect(meta_rt, c.meta_addr, &secret, "regcache-test", 0, 0).unwrap();
    let addrs: Vec<SocketAddr> = c.ios.iter().map(|i| i.addr).collect();
    (meta, DataClient::connect_with(rt, &addrs, &secret, cache).unwrap())
}

fn open_new(m: &MetaSession, name: &str) -> OpenFile {
    let hint = LayoutHint { stripe_unit: 64 << 10, stripe_count: 4 };
    let a = m.create_with(ROOT_INO, name.as_bytes(), 0o644, true, Some(hint)).unwrap();
    m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 16) as u8)).collect()
}

#[test]
fn repeated_large_io_from_one_buffer_registers_it_once() {
    let c = across_hosts(16);
    let rt = common::runtime("regcache-test");
    let (m, d) = clients(&c, &rt, RegCacheConfig::default());
    assert!(d.regcache_is_caching(), "UCX's unmap hooks are expected to work here");
    let f = open_new(&m, "once");
    let src = pattern((2 << 20) + 4321, 1);
    let mut dst = vec![0u8; src.len()];
    block_on(d.write_from(&f, 100, &src, Stability::Unstable)).unwrap();
    block_on(d.read_into(&f, 100, &mut dst)).unwrap();
    assert!(dst == src, "first round trip");
    let (s0, regs0) = (d.regcache_stats(), rt.context().stats().snapshot().registrations);
    assert_eq!((s0.misses, s0.registrations), (2, 2), "one registration per buffer: {s0:?}");
    for round in 0..5u8 {
        dst.fill(round);
        block_on(d.write_from(&f, 100, &src, Stability::Unstable)).unwrap();
        block_on(d.read_into(&f, 100, &mut dst)).unwrap();
        assert!(dst == src, "round {round}");
    }
    let s = d.regcache_stats();
    assert_eq!((s.registrations, s.hits - s0.hits), (2, 10), "{s:?}");
    let regs = rt.context().stats().snapshot().registrations;
    assert_eq!(regs, regs0, "no registration (and no bounce buffer) per call");
    // Below the threshold, slices go through the bounce path: no lookup.
    let mut small = vec![0u8; ZERO_COPY_MIN - 1];
    block_on(d.read_into(&f, 100, &mut small)).unwrap();
    assert!(small[..] == src[..small.len()]);
    assert_eq!(d.regcache_stats().misses + d.regcache_stats().hits, s.misses + s.hits);
}

#[test]
fn a_freed_buffer_is_not_served_by_its_stale_registration() {
    let c = across_hosts(16);
    let rt = common::runtime("regcache-test");
    let (m, d) = clients(&c, &rt, RegCacheConfig::default());
    let f = open_new(&m, "freed");
    // 40 MiB allocations: above glibc's largest mmap threshold (32 MiB), so
    // each is its own mapping and freeing it unmaps it. I/O uses 4 MiB of it.
    let n = 4 << 20;
    let mut a = vec![0u8; 40 << 20];
    a[..n].copy_from_slice(&pattern(n, 3));
    block_on(d.write_from(&f, 0, &a[..n], Stability::Unstable)).unwrap();
    let old_addr = a.as_ptr() as usize;
    let before = d.regcache_stats();
    drop(a);
    let mut b = vec![0u8; 40 << 20];
    let reused = b.as_ptr() as usize == old_addr;
    b[..n].copy_from_slice(&pattern(n, 4));
    block_on(d.write_from(&f, 0, &b[..n], Stability::Unstable)).unwrap();
    let s = d.regcache_stats();
    assert!(s.invalidations > before.invalidations, "the unmap dropped the entry (address reused: {reused}): {s:?}");
    assert_eq!(s.registrations, before.registrations + 1, "the new buffer was registered anew: {s:?}");
    // What the servers hold is the new buffer's data; read it into a third
    // buffer and into the new one.
    let mut back = vec![0u8; n];
    block_on(d.read_into(&f, 0, &mut back)).unwrap();
    assert!(back == pattern(n, 4));
    b[..n].fill(0);
    block_on(d.read_into(&f, 0, &mut b[..n])).unwrap();
    assert!(b[..n] == pattern(n, 4));
}

#[test]
fn the_pinned_bound_holds_under_a_stream_of_buffers() {
    let c = across_hosts(16);
    let rt = common::runtime("regcache-test");
    let bound = 2 << 20;
    let (m, d) = clients(&c, &rt, RegCacheConfig { max_pinned: bound, ..Default::default() });
    let f = open_new(&m, "stream");
    let len = 1 << 20;
    let bufs: Vec<Vec<u8>> = (0..8u8).map(|i| pattern(len, i)).collect();
    for (i, b) in bufs.iter().enumerate() {
        block_on(d.write_from(&f, (i * len) as u64, b, Stability::Unstable)).unwrap();
        assert!(d.regcache_stats().pinned_bytes <= bound as u64, "{:?}", d.regcache_stats());
    }
    let mut back: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; len]).collect();
    for (i, b) in back.iter_mut().enumerate() {
        block_on(d.read_into(&f, (i * len) as u64, b)).unwrap();
        assert!(d.regcache_stats().pinned_bytes <= bound as u64, "{:?}", d.regcache_stats());
    }
    assert!(back == bufs, "data read back differs");
    let s = d.regcache_stats();
    assert_eq!(s.registrations, 16, "16 distinct buffers, each registered once: {s:?}");
    assert!(s.evictions >= 14, "at most two 1 MiB entries fit: {s:?}");
}
