//! Behaviour tests of the Unifier on real registered memory (UCX runs here
//! without RDMA hardware), and a randomized reference-model test.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::OnceLock;
use std::task::{Context as TaskContext, Poll};

use dafne_ucx::{Context, ContextOptions, Local};
use futures::executor::block_on;

use crate::*;

const K: usize = 1024;

fn ctx() -> Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| Context::new(&ContextOptions::default()).expect("UCX context")).clone()
}

/// One 64 KiB slab per `slabs`, carved into `unit`-byte units at start.
fn cfg(slabs: usize, unit: usize, policy: Policy) -> UnifierConfig {
    UnifierConfig {
        slab_size: 64 * K,
        ready_slabs: slabs,
        raw_slabs: 0,
        max_dirty_bytes: 64 * K,
        default_unit: unit,
        default_policy: policy,
        max_pinned_bytes: None,
    }
}

fn pattern(object: u64, off: usize) -> u8 {
    (off as u64).wrapping_mul(31).wrapping_add(object.wrapping_mul(7)).wrapping_add((off >> 12) as u64) as u8
}

fn patterned(object: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(object, i)).collect()
}

fn setup(config: UnifierConfig) -> (Unifier, Rc<MemStorage>) {
    let storage = Rc::new(MemStorage::new());
    let u = Unifier::new(&ctx(), config, storage.clone()).expect("unifier");
    (u, storage)
}

fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    let mut cx = TaskContext::from_waker(futures::task::noop_waker_ref());
    Pin::new(f).poll(&mut cx)
}

fn read_unit(u: &Unifier, object: u64, index: u64) -> Vec<u8> {
    block_on(u.read(object, index)).expect("read").to_vec()
}

fn write_unit(u: &Unifier, object: u64, index: u64, range: std::ops::Range<usize>, byte: u8) {
    let mut g = block_on(u.write(object, index, range)).expect("write");
    g.bytes_mut().expect("bytes").fill(byte);
}

#[test]
fn lru_hits_misses_and_evicts_least_recent() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru)); // 16 units of 4 KiB
    s.set(1, patterned(1, 32 * 4 * K));
    for i in 0..16 {
        assert_eq!(read_unit(&u, 1, i), &patterned(1, 32 * 4 * K)[i as usize * 4 * K..][..4 * K]);
    }
    let st = u.stats();
    assert_eq!((st.misses, st.hits, st.fills, st.evictions), (16, 0, 16, 0));
    read_unit(&u, 1, 0); // hit: unit 0 becomes most recent
    read_unit(&u, 1, 16); // miss: evicts unit 1, the least recent
    let st = u.stats();
    assert_eq!((st.misses, st.hits, st.evictions), (17, 1, 1));
    assert!(u.is_cached(1, 0) && !u.is_cached(1, 1) && u.is_cached(1, 16));
    read_unit(&u, 1, 17);
    assert!(!u.is_cached(1, 2));
    assert_eq!(u.stats().units_in_use, 16);
    assert_eq!(s.stats().reads, 18);
}

#[test]
fn clock_gives_a_second_chance() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Clock));
    s.set(1, patterned(1, 32 * 4 * K));
    for i in 0..16 {
        read_unit(&u, 1, i);
    }
    // Every unit's bit is set: the hand clears them all in one lap and
    // takes the first (unit 0) on the second.
    read_unit(&u, 1, 16);
    assert!(!u.is_cached(1, 0));
    // The hand now rests on unit 1. Use it: it gets a second chance, and
    // unit 2 (bit cleared in the first lap) goes instead.
    read_unit(&u, 1, 1);
    read_unit(&u, 1, 17);
    assert!(u.is_cached(1, 1) && !u.is_cached(1, 2) && u.is_cached(1, 16));
    assert_eq!(u.stats().evictions, 2);
    assert_eq!(read_unit(&u, 1, 17), &patterned(1, 32 * 4 * K)[17 * 4 * K..][..4 * K]);
}

#[test]
fn mixed_policies_give_up_the_older_nominee() {
    let (u, _s) = setup(cfg(1, 4 * K, Policy::Lru));
    u.set_file_advice(2, FileAdvice { unit_size: None, policy: Some(Policy::Clock) }).unwrap();
    for i in 0..8 {
        read_unit(&u, 1, i); // LRU file, older
    }
    for i in 0..8 {
        read_unit(&u, 2, i); // CLOCK file, newer
    }
    read_unit(&u, 3, 0); // LRU nominates (1,0), CLOCK (2,0): (1,0) is older
    assert!(!u.is_cached(1, 0) && u.is_cached(2, 0));
    for i in 1..8 {
        read_unit(&u, 1, i); // the LRU file is used again: now the CLOCK file is older
    }
    read_unit(&u, 3, 1); // LRU nominates (3,0), CLOCK (2,0): (2,0) is older
    assert!(!u.is_cached(2, 0) && u.is_cached(3, 0));
    assert_eq!(u.policy_for(2), Policy::Clock);
    assert_eq!(u.policy_for(1), Policy::Lru);
}

#[test]
fn readers_share_and_a_writer_waits_for_their_release() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    s.set(1, patterned(1, 4 * K));
    let r1 = block_on(u.read(1, 0)).unwrap();
    let r2 = block_on(u.read(1, 0)).unwrap();
    // One copy: both readers see the same memory.
    assert_eq!(r1.as_ptr(), r2.as_ptr());
    let mut w = Box::pin(u.write(1, 0, 0..100));
    assert!(poll_once(&mut w).is_pending(), "a writer must wait while readers hold the unit");
    // A reader that comes after the waiting writer queues behind it.
    let mut r3 = Box::pin(u.read(1, 0));
    assert!(poll_once(&mut r3).is_pending(), "a later reader must not overtake a waiting writer");
    drop(r1);
    assert!(poll_once(&mut w).is_pending(), "one reader still holds the unit");
    drop(r2);
    let mut g = match poll_once(&mut w) {
        Poll::Ready(g) => g.unwrap(),
        Poll::Pending => panic!("the writer must enter once the readers released"),
    };
    // Modified in place: the writer has the very memory the readers had.
    assert!(poll_once(&mut r3).is_pending());
    g.bytes_mut().unwrap().fill(0xAB);
    drop(g);
    let r3 = match poll_once(&mut r3) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("the reader must enter after the writer"),
    };
    assert!(r3[..100].iter().all(|&b| b == 0xAB));
    assert_eq!(&r3[100..], &patterned(1, 4 * K)[100..]);
    let st = u.stats();
    assert_eq!(st.conflict_waits, 2);
    assert_eq!(st.bytes_copied, 0);
    assert_eq!(s.stats().reads, 1);
}

#[test]
fn a_cancelled_waiter_leaves_the_queue() {
    let (u, _s) = setup(cfg(1, 4 * K, Policy::Lru));
    let r1 = block_on(u.read(1, 0)).unwrap();
    let mut w = Box::pin(u.write(1, 0, 0..10));
    assert!(poll_once(&mut w).is_pending());
    let mut r2 = Box::pin(u.read(1, 0));
    assert!(poll_once(&mut r2).is_pending());
    drop(w); // the writer gives up
    assert!(poll_once(&mut r2).is_ready(), "with the writer gone the reader shares with r1");
    drop(r1);
}

#[test]
fn concurrent_readers_of_a_missing_unit_fill_it_once() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    s.set(1, patterned(1, 8 * K));
    let guards: Vec<ReadGuard> =
        block_on(futures::future::join_all((0..8).map(|_| u.read(1, 1)))).into_iter().map(Result::unwrap).collect();
    for g in &guards {
        assert_eq!(&g[..], &patterned(1, 8 * K)[4 * K..]);
    }
    assert_eq!(s.stats().reads, 1);
    let st = u.stats();
    assert_eq!((st.misses, st.hits, st.fills), (1, 7, 1));
}

/// Storage whose reads run a hook first: lets a test act while a fill is
/// in progress.
struct HookStorage {
    mem: MemStorage,
    hook: RefCell<Option<Box<dyn FnMut()>>>,
}

impl Storage for HookStorage {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let hook = self.hook.borrow_mut().take();
        if let Some(mut h) = hook {
            h();
        }
        self.mem.read_at(object, offset, buf)
    }
    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.mem.write_at(object, offset, buf)
    }
    fn sync(&self, object: u64) -> io::Result<()> {
        self.mem.sync(object)
    }
}

#[test]
fn a_unit_being_filled_is_not_readable_until_filled() {
    let hs = Rc::new(HookStorage { mem: MemStorage::new(), hook: RefCell::new(None) });
    hs.mem.set(5, patterned(5, 4 * K));
    let u = Unifier::new(&ctx(), cfg(1, 4 * K, Policy::Lru), hs.clone()).unwrap();
    type Pending = Pin<Box<dyn Future<Output = Result<ReadGuard>>>>;
    let second: Rc<RefCell<Option<Pending>>> = Rc::default();
    let (u2, second2) = (u.clone(), second.clone());
    *hs.hook.borrow_mut() = Some(Box::new(move || {
        // Mid-fill, a second reader of the same unit arrives: it must wait.
        let mut f: Pending = Box::pin(u2.read(5, 0));
        assert!(poll_once(&mut f).is_pending(), "a unit being filled must not be readable");
        *second2.borrow_mut() = Some(f);
    }));
    let g1 = block_on(u.read(5, 0)).unwrap();
    let mut f = second.borrow_mut().take().expect("the hook ran");
    let g2 = match poll_once(&mut f) {
        Poll::Ready(g) => g.unwrap(),
        Poll::Pending => panic!("the waiting reader must enter after the fill"),
    };
    assert_eq!(&g2[..], &patterned(5, 4 * K)[..]);
    assert_eq!(g1.as_ptr(), g2.as_ptr());
    assert_eq!(hs.mem.stats().reads, 1, "no double fill");
    assert_eq!(u.stats().fill_waits, 1);
}

#[test]
fn dirty_units_are_written_back_when_evicted() {
    // 16 units of 4 KiB; the file is 64 units.
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    let data = patterned(9, 64 * 4 * K);
    for i in 0..64u64 {
        let mut g = block_on(u.write(9, i, 0..4 * K)).unwrap(); // full unit: no fill
        g.bytes_mut().unwrap().copy_from_slice(&data[i as usize * 4 * K..][..4 * K]);
    }
    let st = u.stats();
    assert!(st.evictions >= 48, "{st:?}");
    assert_eq!(s.stats().reads, 0, "full-unit writes need no fill");
    // Evicted units reached storage before they were dropped.
    assert_eq!(&s.contents(9)[..48 * 4 * K], &data[..48 * 4 * K]);
    // Read everything back through the (smaller) cache.
    for i in 0..64u64 {
        assert_eq!(read_unit(&u, 9, i), &data[i as usize * 4 * K..][..4 * K], "unit {i}");
    }
    block_on(u.flush_all()).unwrap();
    assert_eq!(s.contents(9), data);
    assert_eq!(u.stats().dirty_bytes, 0);
    assert_eq!(u.stats().bytes_copied, 0);
}

#[test]
fn write_behind_keeps_dirty_bytes_bounded() {
    // 4 slabs of 64 KiB in 4 KiB units (64 units); at most 64 KiB dirty.
    let (u, s) = setup(cfg(4, 4 * K, Policy::Lru));
    for i in 0..40u64 {
        write_unit(&u, 3, i, 0..4 * K, i as u8);
        let st = u.stats();
        assert!(st.dirty_bytes <= 64 * K as u64, "after write {i}: {st:?}");
    }
    let st = u.stats();
    assert!(st.write_behind >= 24, "{st:?}");
    assert_eq!(st.evictions, 0, "room came from write-behind, not eviction");
    // The oldest went first.
    assert_eq!(s.contents(3)[0], 0);
    assert_eq!(s.contents(3)[23 * 4 * K], 23);
    block_on(u.flush(3)).unwrap();
    let c = s.contents(3);
    for i in 0..40usize {
        assert!(c[i * 4 * K..][..4 * K].iter().all(|&b| b == i as u8));
    }
    assert!(s.stats().syncs >= 1);
}

fn setup_background(config: UnifierConfig) -> (Unifier, Rc<MemStorage>) {
    let storage = Rc::new(MemStorage::new());
    storage.set_background(true);
    let u = Unifier::new(&ctx(), config, storage.clone()).expect("unifier");
    assert!(u.has_background_writeback());
    (u, storage)
}

#[test]
fn background_write_back_drains_dirty_units_off_the_loop() {
    // As `write_behind_keeps_dirty_bytes_bounded`, with a background writer:
    // no write-back runs on the caller's thread, and the bound holds.
    let (u, s) = setup_background(cfg(4, 4 * K, Policy::Lru));
    for i in 0..40u64 {
        write_unit(&u, 3, i, 0..4 * K, i as u8);
        let st = u.stats();
        assert!(st.dirty_bytes <= 64 * K as u64, "after write {i}: {st:?}");
    }
    block_on(u.flush(3)).unwrap();
    let st = u.stats();
    assert_eq!(st.write_behind, 0, "{st:?}");
    assert!(st.background_writebacks >= 24 && st.background_batches >= 1, "{st:?}");
    assert_eq!(st.units_referenced, 0, "every pin was released: {st:?}");
    assert!(s.stats().background_batches >= 1);
    let c = s.contents(3);
    for i in 0..40usize {
        assert!(c[i * 4 * K..][..4 * K].iter().all(|&b| b == i as u8), "unit {i}");
    }
}

#[test]
fn a_writer_waits_for_a_unit_being_written_back_and_readers_share_it() {
    // 64 KiB dirty bound: background write-back starts past 32 KiB.
    let (u, s) = setup_background(cfg(4, 4 * K, Policy::Lru));
    s.hold_background(true);
    // The 10th write finds 36 KiB dirty and hands the 9 older units over.
    for i in 0..10u64 {
        write_unit(&u, 5, i, 0..4 * K, 1);
    }
    // Unit 0, the oldest, is in a held batch: pinned, still dirty.
    let st = u.stats();
    assert!(st.background_batches >= 1 && st.background_writebacks == 0, "{st:?}");
    assert!(st.units_referenced >= 1, "{st:?}");
    // A reader shares it at once; a writer must wait for the write-back.
    let r = block_on(u.read(5, 0)).unwrap();
    assert!(r.iter().all(|&b| b == 1));
    drop(r);
    let mut w = Box::pin(u.write(5, 0, 0..4 * K));
    assert!(poll_once(&mut w).is_pending(), "a writer modified a unit being written back");
    s.hold_background(false);
    let mut g = block_on(w).unwrap();
    g.bytes_mut().unwrap().fill(2);
    drop(g);
    block_on(u.flush(5)).unwrap();
    let c = s.contents(5);
    assert!(c[..4 * K].iter().all(|&b| b == 2), "the later write wins");
    assert!(c[4 * K..10 * 4 * K].iter().all(|&b| b == 1));
    let st = u.stats();
    assert!(st.background_writebacks >= 1 && st.write_behind == 0, "{st:?}");
}

#[test]
fn a_failed_background_write_back_keeps_the_unit_dirty_and_flush_retries() {
    let (u, s) = setup_background(cfg(4, 4 * K, Policy::Lru));
    s.fail_next_writes(1);
    for i in 0..12u64 {
        write_unit(&u, 6, i, 0..4 * K, i as u8 + 1);
    }
    block_on(u.quiesce(6));
    assert!(u.stats().storage_errors >= 1);
    block_on(u.flush(6)).unwrap();
    let c = s.contents(6);
    for i in 0..12usize {
        assert!(c[i * 4 * K..][..4 * K].iter().all(|&b| b == i as u8 + 1), "unit {i} lost");
    }
    assert_eq!(u.stats().dirty_bytes, 0);
}

/// Counts `read_batch` calls, to see that a prefetch is one batch.
#[derive(Default)]
struct Batches {
    mem: MemStorage,
    batches: std::cell::Cell<u32>,
}

impl Storage for Batches {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.mem.read_at(object, offset, buf)
    }
    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.mem.write_at(object, offset, buf)
    }
    fn sync(&self, object: u64) -> io::Result<()> {
        self.mem.sync(object)
    }
    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<usize>> {
        self.batches.set(self.batches.get() + 1);
        reads.iter_mut().map(|r| self.mem.read_at(r.object, r.offset, r.buf)).collect()
    }
}

#[test]
fn prefetch_fills_missing_units_in_one_batch_and_counts_each_miss_once() {
    let s = Rc::new(Batches::default());
    let u = Unifier::new(&ctx(), cfg(4, 16 * K, Policy::Lru), s.clone()).unwrap();
    s.mem.set(1, patterned(1, 100 * K));
    read_unit(&u, 1, 1);
    // Units 0..8: 1 is cached, 7 and 8 lie past the end (zeros).
    assert_eq!(u.prefetch(1, &[0, 1, 2, 3, 4, 5, 6, 7, 8]), 8);
    assert_eq!(s.batches.get(), 1);
    let st = u.stats();
    assert_eq!((st.prefetched, st.prefetch_batches, st.misses, st.hits), (8, 1, 1, 0), "{st:?}");
    let all: Vec<u8> = (0..9).flat_map(|i| read_unit(&u, 1, i)).collect();
    let mut want = patterned(1, 100 * K);
    want.resize(9 * 16 * K, 0);
    assert!(all == want);
    let st = u.stats();
    assert_eq!((st.misses, st.hits), (9, 1), "a prefetched unit's first use is its miss: {st:?}");
    assert_eq!(s.mem.stats().reads, 9, "each unit read once");
    assert_eq!(u.prefetch(1, &[0, 1, 2]), 0, "all cached");
    // A failed batch read leaves the units to the acquisitions, which report it.
    s.mem.fail_next_reads(1);
    assert_eq!(u.prefetch(1, &[20, 21]), 1);
    assert_eq!(u.stats().units_referenced, 0);
}

#[test]
fn partial_writes_fill_first_and_track_the_dirty_range() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    s.set(1, patterned(1, 4 * K));
    write_unit(&u, 1, 0, 100..200, 7);
    assert_eq!(s.stats().reads, 1, "a partial write fills the unit first");
    write_unit(&u, 1, 0, 1000..1010, 8);
    assert_eq!(u.stats().dirty_bytes, 910, "one covering range 100..1010");
    block_on(u.flush(1)).unwrap();
    let st = s.stats();
    assert_eq!((st.writes, st.bytes_written), (1, 910));
    let mut want = patterned(1, 4 * K);
    want[100..200].fill(7);
    want[1000..1010].fill(8);
    assert_eq!(s.contents(1), want);
}

#[test]
fn commit_stable_writes_through() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    let mut g = block_on(u.write(4, 2, 0..4 * K)).unwrap();
    g.bytes_mut().unwrap().fill(0x5A);
    block_on(g.commit_stable()).unwrap();
    assert_eq!(u.stats().dirty_bytes, 0);
    assert_eq!(s.stats().syncs, 1);
    assert!(s.contents(4)[8 * K..].iter().all(|&b| b == 0x5A));
    assert!(s.contents(4)[..8 * K].iter().all(|&b| b == 0));
}

#[test]
fn per_file_advice_sets_unit_size_and_policy() {
    let mut c = cfg(2, 64 * K, Policy::Lru); // 2 slabs, 1 unit of 64 KiB each
    c.max_dirty_bytes = 128 * K;
    let (u, s) = setup(c);
    assert_eq!(u.unit_size_for(7), 64 * K);
    assert!(matches!(
        u.set_file_advice(7, FileAdvice { unit_size: Some(12 * K), policy: None }),
        Err(Error::UnitSize { .. })
    ));
    u.set_file_advice(7, FileAdvice { unit_size: Some(16 * K), policy: Some(Policy::Clock) }).unwrap();
    assert_eq!((u.unit_size_for(7), u.policy_for(7)), (16 * K, Policy::Clock));
    s.set(7, patterned(7, 64 * K));
    // Unit 1 of a 16 KiB-unit file is bytes 16..32 KiB.
    assert_eq!(read_unit(&u, 7, 1), &patterned(7, 64 * K)[16 * K..32 * K]);
    let st = u.stats();
    assert_eq!(st.carves, 1, "an idle slab was re-carved into 16 KiB units");
    assert_eq!(st.registrations, 0, "re-carving takes new views of the registered slab");
    assert_eq!(st.unit_slots, 1 + 4);
    // The default-size file still has its slab.
    read_unit(&u, 8, 0);
    // Changing the unit size drops cached units (after writing them back)...
    write_unit(&u, 7, 0, 0..10, 1);
    u.set_file_advice(7, FileAdvice { unit_size: Some(4 * K), policy: None }).unwrap();
    assert!(!u.is_cached(7, 0) && !u.is_cached(7, 1));
    assert_eq!(&s.contents(7)[..10], &[1; 10]);
    assert_eq!(u.policy_for(7), Policy::Lru);
    // ...and is refused while one is in use.
    let g = block_on(u.read(7, 0)).unwrap();
    assert_eq!(g.len(), 4 * K);
    assert!(matches!(u.set_file_advice(7, FileAdvice::default()), Err(Error::Busy { object: 7 })));
    drop(g);
    u.set_file_advice(7, FileAdvice::default()).unwrap();
    assert_eq!(u.unit_size_for(7), 64 * K);
}

#[test]
fn a_class_with_nothing_to_evict_recarves_the_coldest_slab() {
    let mut c = cfg(3, 4 * K, Policy::Lru); // 3 slabs of 16 units of 4 KiB
    c.max_dirty_bytes = 192 * K;
    let (u, s) = setup(c);
    write_unit(&u, 1, 3, 0..4 * K, 0x77); // dirty
    for i in (0..48).filter(|&i| i != 3) {
        read_unit(&u, 1, i); // slabs fill one after another: units 0..16 share one
    }
    let pinned = block_on(u.read(1, 47)).unwrap(); // pins the newest slab
    u.set_file_advice(2, FileAdvice { unit_size: Some(64 * K), policy: None }).unwrap();
    // No 64 KiB unit anywhere: a whole slab must go. The coldest slab is the
    // one whose most recent use is oldest (units 0..16); the newest is pinned.
    read_unit(&u, 2, 0);
    let st = u.stats();
    assert_eq!((st.carves, st.evictions), (1, 16), "{st:?}");
    assert!((0..16).all(|i| !u.is_cached(1, i)), "the coldest slab was re-carved");
    assert!((16..48).all(|i| u.is_cached(1, i)));
    assert!(s.contents(1)[3 * 4 * K..4 * 4 * K].iter().all(|&b| b == 0x77), "written back before eviction");
    assert_eq!(st.unit_slots, 32 + 1);
    drop(pinned);
}

#[test]
fn a_policy_change_moves_cached_units() {
    let (u, _s) = setup(cfg(1, 4 * K, Policy::Lru));
    for i in 0..4 {
        read_unit(&u, 1, i);
    }
    u.set_file_advice(1, FileAdvice { unit_size: None, policy: Some(Policy::Clock) }).unwrap();
    for i in 0..16 {
        read_unit(&u, 2, i); // forces evictions from the CLOCK ring too
    }
    assert!((0..4).all(|i| !u.is_cached(1, i)));
}

#[test]
fn truncate_drops_and_zeroes_and_remove_forgets() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    for i in 0..3 {
        write_unit(&u, 1, i, 0..4 * K, 0xEE);
    }
    block_on(u.truncate(1, 4 * K as u64 + 100)).unwrap();
    s.truncate(1, 4 * K + 100);
    assert!(u.is_cached(1, 0) && u.is_cached(1, 1) && !u.is_cached(1, 2));
    let g = block_on(u.read(1, 1)).unwrap();
    assert!(g[..100].iter().all(|&b| b == 0xEE) && g[100..].iter().all(|&b| b == 0));
    drop(g);
    assert_eq!(u.stats().dirty_bytes, 4 * K as u64 + 100);
    block_on(u.flush(1)).unwrap();
    assert_eq!(s.contents(1).len(), 4 * K + 100);
    // Growing again reads zeros past the old end.
    write_unit(&u, 1, 3, 0..1, 1);
    assert!(read_unit(&u, 1, 2).iter().all(|&b| b == 0));

    // A truncate waits for the writer of the unit holding the new end.
    let w = block_on(u.write(1, 0, 0..4 * K)).unwrap();
    let mut t = Box::pin(u.truncate(1, 10));
    assert!(poll_once(&mut t).is_pending());
    drop(w);
    assert!(poll_once(&mut t).is_ready());
    assert!(read_unit(&u, 1, 0)[10..].iter().all(|&b| b == 0));

    // remove: everything goes, dirty bytes are not written.
    let writes = s.stats().writes;
    write_unit(&u, 1, 0, 0..4 * K, 3);
    u.set_file_advice(1, FileAdvice { unit_size: None, policy: Some(Policy::Clock) }).unwrap();
    u.remove(1);
    assert!(!u.is_cached(1, 0));
    assert_eq!(u.file_advice(1), FileAdvice::default());
    assert_eq!(u.stats().dirty_bytes, 0);
    block_on(u.flush_all()).unwrap();
    assert_eq!(s.stats().writes, writes);
    assert_eq!(u.stats().units_in_use, 0);
}

#[test]
fn zero_range_drops_whole_units_zeroes_partial_ones_and_no_write_back_resurrects_them() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    for i in 0..4 {
        write_unit(&u, 1, i, 0..4 * K, 0xEE);
    }
    block_on(u.flush(1)).unwrap();
    // Dirty again: all of unit 1, and bytes 100..200 of unit 3.
    write_unit(&u, 1, 1, 0..4 * K, 0xAA);
    write_unit(&u, 1, 3, 100..200, 0xBB);
    assert_eq!(u.stats().dirty_bytes, 4 * K as u64 + 100);
    // From 100 bytes before the end of unit 0 to 150 bytes into unit 3.
    let (from, to) = (4 * K - 100, 3 * 4 * K + 150);
    block_on(u.zero_range(1, from as u64, (to - from) as u64)).unwrap();
    // What the io server does next: the punch in storage.
    let mut c = s.contents(1);
    c[from..to].fill(0);
    s.set(1, c);
    assert!(u.is_cached(1, 0) && !u.is_cached(1, 1) && !u.is_cached(1, 2) && u.is_cached(1, 3));
    // Unit 1's dirty bytes are gone; unit 3 keeps 150..200 (the head of
    // its dirty range was zeroed).
    assert_eq!(u.stats().dirty_bytes, 50);
    let g0 = read_unit(&u, 1, 0);
    assert!(g0[..4 * K - 100].iter().all(|&b| b == 0xEE) && g0[4 * K - 100..].iter().all(|&b| b == 0));
    assert!(read_unit(&u, 1, 1).iter().all(|&b| b == 0), "a dropped unit refills from the punched storage");
    let g3 = read_unit(&u, 1, 3);
    assert!(g3[..150].iter().all(|&b| b == 0) && g3[150..200].iter().all(|&b| b == 0xBB));
    assert!(g3[200..].iter().all(|&b| b == 0xEE));
    // Write-back brings none of the zeroed bytes back.
    block_on(u.flush(1)).unwrap();
    let c = s.contents(1);
    assert!(c[..from].iter().all(|&b| b == 0xEE));
    assert!(c[from..to].iter().all(|&b| b == 0), "write-back resurrected punched bytes");
    assert!(c[to..3 * 4 * K + 200].iter().all(|&b| b == 0xBB) && c[3 * 4 * K + 200..].iter().all(|&b| b == 0xEE));

    // One unit, in the middle of its dirty range: the zeros stay dirty and
    // are written back as zeros.
    write_unit(&u, 2, 0, 0..4 * K, 7);
    block_on(u.zero_range(2, 10, 20)).unwrap();
    assert_eq!(u.stats().dirty_bytes, 4 * K as u64);
    block_on(u.flush(2)).unwrap();
    let c = s.contents(2);
    assert!(c[..10].iter().all(|&b| b == 7) && c[10..30].iter().all(|&b| b == 0) && c[30..].iter().all(|&b| b == 7));

    // A range that waits for the writer of a unit it covers in part.
    let w = block_on(u.write(2, 0, 0..4 * K)).unwrap();
    let mut z = Box::pin(u.zero_range(2, 1, 2));
    assert!(poll_once(&mut z).is_pending());
    drop(w);
    assert!(poll_once(&mut z).is_ready());
}

#[test]
fn invalidate_writes_back_then_drops() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    write_unit(&u, 1, 0, 0..4, 9);
    read_unit(&u, 1, 1);
    block_on(u.invalidate(1)).unwrap();
    assert!(!u.is_cached(1, 0) && !u.is_cached(1, 1));
    assert_eq!(&s.contents(1)[..4], &[9; 4]);
    s.set(1, vec![2; 8 * K]); // storage changed underneath
    assert!(read_unit(&u, 1, 1).iter().all(|&b| b == 2));
}

#[test]
fn storage_failures_leave_the_cache_consistent() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    s.set(1, patterned(1, 4 * K));
    s.fail_next_reads(1);
    assert!(matches!(block_on(u.read(1, 0)), Err(Error::Storage { op: "read_at", .. })));
    assert!(!u.is_cached(1, 0));
    assert_eq!(read_unit(&u, 1, 0), patterned(1, 4 * K));
    write_unit(&u, 1, 0, 0..1, 0);
    s.fail_next_writes(1);
    assert!(block_on(u.flush(1)).is_err());
    assert_eq!(u.stats().dirty_bytes, 1, "a failed write-back leaves the unit dirty");
    s.fail_next_syncs(1);
    assert!(matches!(block_on(u.flush(1)), Err(Error::Storage { op: "sync", .. })));
    block_on(u.flush(1)).unwrap();
    assert_eq!(s.contents(1)[0], 0);
    assert_eq!(u.stats().storage_errors, 3);
}

#[test]
fn no_space_when_every_unit_is_held() {
    let (u, _s) = setup(cfg(1, 16 * K, Policy::Lru)); // 4 units
    let held: Vec<ReadGuard> = (0..4).map(|i| block_on(u.read(1, i)).unwrap()).collect();
    assert!(matches!(block_on(u.read(1, 4)), Err(Error::NoSpace { unit_size: 16384, pinned: 4 })));
    assert_eq!(u.stats().units_referenced, 4);
    drop(held);
    read_unit(&u, 1, 4);
    assert_eq!(u.stats().no_space, 1);
}

#[test]
fn raw_units_are_registered_on_first_use_only() {
    let c = UnifierConfig { ready_slabs: 0, raw_slabs: 1, ..cfg(0, 4 * K, Policy::Lru) };
    let (u, _s) = setup(c);
    assert_eq!((u.stats().startup_registrations, u.stats().registrations), (0, 0));
    read_unit(&u, 1, 0);
    read_unit(&u, 1, 1);
    read_unit(&u, 1, 0);
    let st = u.stats();
    assert_eq!((st.registrations, st.registered_bytes, st.carves), (1, 64 * K as u64, 1), "the slab, once");
    for i in 0..40 {
        read_unit(&u, 1, i);
    }
    assert_eq!(u.stats().registrations, 1, "one registration for the slab's 16 units");
}

#[test]
fn raw_slabs_are_parked_under_the_pinned_bound_and_keep_their_data() {
    // 1 ready + 5 raw slabs of 64 KiB (16 units of 4 KiB each), at most 3
    // slabs registered: the cache holds 96 units, 48 of them registered.
    let c = UnifierConfig {
        ready_slabs: 1,
        raw_slabs: 5,
        max_pinned_bytes: Some(3 * 64 * K as u64),
        ..cfg(1, 4 * K, Policy::Lru)
    };
    let (u, s) = setup(c);
    let data = patterned(1, 96 * 4 * K);
    s.set(1, data.clone());
    let unit = |i: u64| &data[i as usize * 4 * K..][..4 * K];
    for i in 0..96 {
        assert_eq!(read_unit(&u, 1, i), unit(i));
        assert!(u.stats().pinned_bytes <= 3 * 64 * K as u64);
    }
    let st = u.stats();
    assert_eq!((st.units_in_use, st.evictions, st.fills), (96, 0, 96), "every unit cached, none evicted");
    assert_eq!(st.pinned_bytes, 3 * 64 * K as u64);
    assert_eq!(st.parked_units, 48, "3 slabs' units parked");
    assert_eq!(st.deregistrations, 3);
    // Every unit again: all hits, read from parked memory registered again
    // (its data intact), still within the bound.
    for i in 0..96 {
        assert_eq!(read_unit(&u, 1, i), unit(i));
    }
    let st = u.stats();
    assert_eq!((st.hits, st.misses, st.fills), (96, 96, 96));
    assert!(st.deregistrations > 3 && st.registrations > 5, "{st:?}");
    assert_eq!(st.pinned_peak, 3 * 64 * K as u64, "never above the bound");
    // Dirty units keep their slab registered until written back; a parked
    // unit written to is registered first, and the bytes land.
    write_unit(&u, 1, 0, 0..100, 0xee);
    block_on(u.flush(1)).unwrap();
    assert_eq!(&s.contents(1)[..100], &[0xee; 100][..]);
    assert_eq!(u.stats().pinned_peak, 3 * 64 * K as u64);
    // Held units cannot be parked: holding units until every registered
    // raw slab has one held, a parked unit cannot be registered, and the
    // acquisition says so (the io server retries); released, it can.
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..96 {
        match block_on(u.read(1, i)) {
            Ok(g) => held.push(g),
            Err(Error::NoSpace { .. }) => {
                refused = Some(i);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let refused = refused.expect("a parked unit is refused while every registered raw slab is held");
    assert!(u.stats().pinned_bytes <= 3 * 64 * K as u64);
    drop(held);
    assert_eq!(read_unit(&u, 1, refused), unit(refused));
}

#[test]
fn every_unit_is_page_aligned_for_o_direct() {
    // Ready and raw slabs, every size class: storage reads and writes units
    // with O_DIRECT, which needs 4 KiB-aligned memory.
    for unit in UNIT_SIZES {
        let c = UnifierConfig { ready_slabs: 1, raw_slabs: 1, ..cfg(1, unit, Policy::Lru) };
        let (u, _s) = setup(c);
        let units = (2 * 64 * K / unit) as u64;
        let held: Vec<ReadGuard> = (0..units).map(|i| block_on(u.read(1, i)).expect("read")).collect();
        for g in &held {
            assert_eq!(g.as_ptr() as usize % 4096, 0, "unit {} of {unit} bytes at {:p}", g.unit_index(), g.as_ptr());
        }
        assert!(u.stats().registrations > 0, "raw units were used too");
    }
}

#[test]
fn the_cached_path_copies_nothing_and_registers_nothing() {
    // Its own UCX context: the shared one counts other tests' registrations.
    let ctx = Context::new(&ContextOptions::default()).unwrap();
    let s = Rc::new(MemStorage::new());
    let u = Unifier::new(&ctx, cfg(4, 16 * K, Policy::Clock), s.clone()).unwrap();
    s.set(1, patterned(1, 256 * K));
    let before = ctx.stats().snapshot();
    let regs = u.stats().startup_registrations;
    assert_eq!(regs, 4, "one registration per slab, not per unit");
    for round in 0..3 {
        for i in 0..16u64 {
            let g = block_on(u.read(1, i)).unwrap();
            match g.rma_local(100, 1000) {
                Local::View { view, offset, len } => {
                    assert_eq!((view.len(), offset, len), (16 * K, 100, 1000));
                    assert_eq!(view.as_slice().as_ptr(), g.as_ptr(), "RMA reads the unit itself");
                }
                other => panic!("the unit's own memory must be lent, got {other:?}"),
            }
            drop(g);
            let mut w = block_on(u.write(1, i, 0..512)).unwrap();
            w.bytes_mut().unwrap().fill(round);
            let l = w.rma_local(0, 512);
            drop(l);
        }
    }
    block_on(u.flush_all()).unwrap();
    let st = u.stats();
    assert_eq!(st.bytes_copied, 0);
    assert_eq!(st.registrations, 0);
    let d = ctx.stats().snapshot().since(&before);
    assert_eq!(d.registrations, 0, "nothing registered while serving: {d:?}");
}

#[test]
fn memory_held_by_an_abandoned_operation_is_retired() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru));
    s.set(1, patterned(1, 4 * K));
    let g = block_on(u.read(1, 0)).unwrap();
    let abandoned = g.rma_local(0, 4 * K); // an operation that never completes
    drop(g);
    write_unit(&u, 1, 0, 0..10, 1); // needs the unit exclusively
    let st = u.stats();
    assert_eq!((st.retired_units, st.unit_slots), (1, 15));
    let mut want = patterned(1, 4 * K);
    want[..10].fill(1);
    assert_eq!(read_unit(&u, 1, 0), want, "the write went to a fresh unit, refilled from storage");
    let Local::View { view, .. } = &abandoned else { panic!("a unit lends its view") };
    assert_eq!(view.as_slice(), &patterned(1, 4 * K)[..], "the held memory was never reused");
    drop(abandoned);
    // A write guard's in-flight operation blocks direct access.
    let mut w = block_on(u.write(1, 0, 0..10)).unwrap();
    let op = w.rma_local(0, 10);
    assert!(matches!(w.bytes_mut(), Err(Error::MemoryInFlight)));
    drop(op);
    assert!(w.bytes_mut().is_ok());
}

#[test]
fn bad_requests_are_refused() {
    let (u, _s) = setup(cfg(1, 4 * K, Policy::Lru));
    assert!(matches!(block_on(u.write(1, 0, 10..10)), Err(Error::BadRange { .. })));
    assert!(matches!(block_on(u.write(1, 0, 0..4 * K + 1)), Err(Error::BadRange { .. })));
    assert!(matches!(block_on(u.read(1, u64::MAX / 4096)), Err(Error::OffsetOverflow { .. })));
    assert!(block_on(u.read(1, u64::MAX / 4096 - 1)).is_ok());
    let mut c = cfg(1, 4 * K, Policy::Lru);
    c.slab_size = 100;
    assert!(matches!(Unifier::new(&ctx(), c, MemStorage::new()), Err(Error::Config(ConfigError::SlabSize { .. }))));
}

#[test]
fn spans_cover_ranges_exactly() {
    let v: Vec<Span> = spans(4096, 4000, 5000).collect();
    assert_eq!(
        v,
        [
            Span { unit_index: 0, range: 4000..4096, buf_offset: 0 },
            Span { unit_index: 1, range: 0..4096, buf_offset: 96 },
            Span { unit_index: 2, range: 0..808, buf_offset: 4192 },
        ]
    );
    assert_eq!(spans(4096, 0, 0).count(), 0);
    assert_eq!(spans(4096, u64::MAX - 1, 10).count(), 0);
}

/// xorshift64*: deterministic, no extra crates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Reads, writes, truncates, flushes and invalidates over several objects
/// with different unit sizes and policies, through a cache about a quarter
/// of the data, checked against plain `Vec`s.
#[test]
fn reference_model() {
    reference_model_with(false);
}

#[test]
fn reference_model_with_background_write_back() {
    reference_model_with(true);
}

/// The same, with 3 of the 6 slabs raw and at most 4 registered at once:
/// raw slabs are parked and registered again throughout.
#[test]
fn reference_model_under_a_pinned_bound() {
    reference_model_pinned(false, Some(4 * 64 * K as u64));
}

fn reference_model_with(background: bool) {
    reference_model_pinned(background, None);
}

fn reference_model_pinned(background: bool, max_pinned_bytes: Option<u64>) {
    const OBJECTS: u64 = 3;
    const MAX_LEN: u64 = 512 * K as u64;
    for seed in 1..=6u64 {
        let config = UnifierConfig {
            slab_size: 64 * K,
            ready_slabs: if max_pinned_bytes.is_some() { 2 } else { 4 },
            raw_slabs: if max_pinned_bytes.is_some() { 4 } else { 2 },
            max_dirty_bytes: 128 * K,
            default_unit: 64 * K,
            default_policy: Policy::Lru,
            max_pinned_bytes,
        };
        let s = Rc::new(MemStorage::new());
        s.set_background(background);
        let u = Unifier::new(&ctx(), config, s.clone()).expect("unifier");
        assert_eq!(u.has_background_writeback(), background);
        u.set_file_advice(0, FileAdvice { unit_size: Some(4 * K), policy: Some(Policy::Lru) }).unwrap();
        u.set_file_advice(1, FileAdvice { unit_size: Some(16 * K), policy: Some(Policy::Clock) }).unwrap();
        let mut model: Vec<Vec<u8>> = vec![Vec::new(); OBJECTS as usize];
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        for step in 0..1500 {
            let o = rng.below(OBJECTS);
            let m = &mut model[o as usize];
            let size = u.unit_size_for(o);
            match rng.below(100) {
                0..=39 => {
                    let off = rng.below(MAX_LEN - 1);
                    let len = 1 + rng.below((MAX_LEN - off).min(40_000));
                    let byte = rng.next() as u8;
                    let end = (off + len) as usize;
                    if m.len() < end {
                        m.resize(end, 0);
                    }
                    for sp in spans(size, off, len) {
                        let mut g = block_on(u.write(o, sp.unit_index, sp.range.clone())).unwrap();
                        let b = g.bytes_mut().unwrap();
                        for (i, x) in b.iter_mut().enumerate() {
                            *x = byte ^ (i as u8);
                        }
                        let at = (off + sp.buf_offset) as usize;
                        for i in 0..sp.range.len() {
                            m[at + i] = byte ^ (i as u8);
                        }
                        if rng.below(20) == 0 {
                            block_on(g.commit_stable()).unwrap();
                        }
                    }
                }
                40..=79 => {
                    let off = rng.below(MAX_LEN);
                    let len = 1 + rng.below((MAX_LEN - off).min(60_000));
                    for sp in spans(size, off, len) {
                        let g = block_on(u.read(o, sp.unit_index)).unwrap();
                        let at = (off + sp.buf_offset) as usize;
                        for (i, &got) in g[sp.range.clone()].iter().enumerate() {
                            let want = m.get(at + i).copied().unwrap_or(0);
                            assert_eq!(got, want, "seed {seed} step {step}: object {o} byte {}", at + i);
                        }
                    }
                }
                80..=89 => {
                    let new_len = rng.below(MAX_LEN);
                    block_on(u.truncate(o, new_len)).unwrap();
                    s.truncate(o, new_len as usize);
                    m.resize(new_len as usize, 0);
                }
                90..=95 => {
                    block_on(u.flush(o)).unwrap();
                    let c = s.contents(o);
                    assert!(c.len() <= m.len(), "seed {seed} step {step}: storage longer than the object");
                    assert!(c[..] == m[..c.len()], "seed {seed} step {step}: object {o} differs after flush");
                    assert!(m[c.len()..].iter().all(|&b| b == 0));
                }
                96..=97 => block_on(u.invalidate(o)).unwrap(),
                _ => block_on(u.flush_all()).unwrap(),
            }
            let st = u.stats();
            assert!(st.dirty_bytes <= 128 * K as u64, "seed {seed} step {step}: {st:?}");
            assert!(st.units_in_use <= st.unit_slots);
            assert!(max_pinned_bytes.is_none_or(|m| st.pinned_bytes <= m), "seed {seed} step {step}: {st:?}");
            if background {
                // Units being written back are pinned until reaped.
                assert!(st.units_referenced <= 64, "seed {seed} step {step}: {st:?}");
                assert_eq!(st.write_behind, 0, "no synchronous write-behind: {st:?}");
            } else {
                assert_eq!(st.units_referenced, 0);
            }
            assert_eq!(st.bytes_copied, 0);
        }
        block_on(u.flush_all()).unwrap();
        for o in 0..OBJECTS {
            let c = s.contents(o);
            let m = &model[o as usize];
            assert!(c[..] == m[..c.len()] && m[c.len()..].iter().all(|&b| b == 0), "seed {seed}: object {o}");
        }
        let st = u.stats();
        assert!(st.evictions > 100 && st.hits > 100, "seed {seed}: {st:?}");
        if background {
            assert!(st.background_writebacks > 0 && st.write_behind == 0, "seed {seed}: {st:?}");
        } else if let Some(max) = max_pinned_bytes {
            // Write-backs that let a slab be parked may leave nothing for
            // write-behind to do.
            assert!(st.deregistrations > 10 && st.pinned_peak <= max, "seed {seed}: {st:?}");
        } else {
            assert!(st.write_behind > 0, "seed {seed}: {st:?}");
        }
        assert_eq!(st.dirty_bytes, 0);
    }
}

#[test]
fn a_512_mib_cache_registers_once_per_slab() {
    // Its own context, to count UCX registrations exactly. 512 MiB of 64 KiB
    // units is 8192 units: with a UCX allocation per unit that was 8192
    // SysV segments, past the kernel's usual limit of 4096 (`ipcs -l`).
    let ctx = Context::new(&ContextOptions::default()).unwrap();
    let before = ctx.stats().snapshot();
    let slab_size = 16 << 20;
    let config = UnifierConfig {
        slab_size,
        ready_slabs: (512 << 20) / slab_size,
        raw_slabs: 0,
        max_dirty_bytes: 1 << 20,
        default_unit: 64 * K,
        default_policy: Policy::Lru,
        max_pinned_bytes: None,
    };
    let s = Rc::new(MemStorage::new());
    let u = Unifier::new(&ctx, config, s.clone()).unwrap();
    let st = u.stats();
    assert_eq!(st.startup_registrations, 32, "512 MiB / 16 MiB slabs");
    assert_eq!(st.unit_slots, 8192);
    let d = ctx.stats().snapshot().since(&before);
    assert_eq!((d.registrations, d.registered_bytes), (32, 512 << 20), "UCX saw one ucp_mem_map per slab: {d:?}");
    // Units of different slabs and of the same slab work independently.
    s.set(1, patterned(1, 8 << 20));
    let first = block_on(u.read(1, 0)).unwrap();
    let mut w = block_on(u.write(1, 100, 0..64 * K)).unwrap();
    w.bytes_mut().unwrap().fill(0xAB);
    drop(w);
    assert_eq!(&first[..], &patterned(1, 64 * K)[..]);
    assert!(read_unit(&u, 1, 100).iter().all(|&b| b == 0xAB));
    drop(first);
    for i in 0..128 {
        assert_eq!(read_unit(&u, 1, i).len(), 64 * K);
    }
    assert_eq!(ctx.stats().snapshot().since(&before).registrations, 32, "nothing registered while serving");
}

#[test]
fn recarving_registers_nothing() {
    let ctx = Context::new(&ContextOptions::default()).unwrap();
    let s = Rc::new(MemStorage::new());
    let u = Unifier::new(&ctx, cfg(2, 4 * K, Policy::Lru), s.clone()).unwrap();
    let before = ctx.stats().snapshot();
    s.set(1, patterned(1, 64 * K));
    s.set(2, patterned(2, 64 * K));
    s.set(3, patterned(3, 64 * K));
    for i in 0..16 {
        assert_eq!(read_unit(&u, 1, i), &patterned(1, 64 * K)[i as usize * 4 * K..][..4 * K]);
    }
    // A 64 KiB unit: the other (idle) slab is re-carved.
    u.set_file_advice(2, FileAdvice { unit_size: Some(64 * K), policy: None }).unwrap();
    assert_eq!(read_unit(&u, 2, 0), patterned(2, 64 * K));
    // 16 KiB units: nothing idle, so the colder slab (object 1's) is evicted and re-carved.
    u.set_file_advice(3, FileAdvice { unit_size: Some(16 * K), policy: None }).unwrap();
    for i in 0..4 {
        assert_eq!(read_unit(&u, 3, i), &patterned(3, 64 * K)[i as usize * 16 * K..][..16 * K]);
    }
    let st = u.stats();
    assert_eq!(st.carves, 2, "{st:?}");
    assert_eq!((st.registrations, st.registered_bytes), (0, 0), "{st:?}");
    let d = ctx.stats().snapshot().since(&before);
    assert_eq!((d.registrations, d.deregistrations), (0, 0), "re-carving touched UCX: {d:?}");
    // And back: 4 KiB units over the slab that held 64 KiB ones.
    for i in 0..16 {
        assert_eq!(read_unit(&u, 1, i), &patterned(1, 64 * K)[i as usize * 4 * K..][..4 * K]);
    }
    assert_eq!(u.stats().carves, 3);
    assert_eq!(ctx.stats().snapshot().since(&before).registrations, 0);
}

#[test]
fn a_range_an_abandoned_operation_holds_is_not_recarved() {
    let (u, s) = setup(cfg(1, 4 * K, Policy::Lru)); // one slab of 16 units
    s.set(1, patterned(1, 4 * K));
    s.set(2, patterned(2, 64 * K));
    let g = block_on(u.read(1, 0)).unwrap();
    let abandoned = g.rma_local(0, 4 * K); // an operation that never completes
    drop(g);
    // A 64 KiB unit needs the whole slab, but 4 KiB of it are still held:
    // the slab is re-carved, yet no unit may cover the held range.
    u.set_file_advice(2, FileAdvice { unit_size: Some(64 * K), policy: None }).unwrap();
    assert!(matches!(block_on(u.read(2, 0)), Err(Error::NoSpace { unit_size: 65536, .. })));
    let st = u.stats();
    assert_eq!((st.retired_units, st.unit_slots, st.carves), (1, 0, 1), "{st:?}");
    let Local::View { view, .. } = &abandoned else { panic!("a unit lends its view") };
    assert_eq!(view.as_slice(), &patterned(1, 4 * K)[..], "the held memory was not reused");
    // Once the operation lets go, the range is reclaimed without a registration.
    drop(abandoned);
    assert_eq!(read_unit(&u, 2, 0), patterned(2, 64 * K));
    let st = u.stats();
    assert_eq!((st.unit_slots, st.registrations), (1, 0), "{st:?}");
}
