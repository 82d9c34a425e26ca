//! The client's registration cache for application memory (MRRC-style).
//!
//! # Why
//! Zero-copy I/O on memory the application did not register needs a
//! registration per call, and on RDMA hardware that costs tens of µs per
//! MiB (pinning pages); a bounce buffer instead costs a copy of every byte.
//! Applications reuse their buffers, so, as the Memory Registration Region
//! Cache (MRRC) does, dafne keeps registrations and serves later I/O on the
//! same memory from them.
//!
//! # How
//! * **Region-based**: an entry registers the whole pages covering the
//!   buffer it was made for, and serves any later buffer inside those
//!   pages. Entries may overlap (two buffers that share a boundary page
//!   each keep their own entry; replacing one by the other made two
//!   alternating buffers miss every time); entries are not merged, so a
//!   registration never covers memory nobody asked for. A lookup scans the
//!   entries that start at or below the buffer, so their number is bounded
//!   too (`max_entries`, default 1024).
//! * **Bounded in pinned bytes**: the registered bytes of the entries stay
//!   ≤ `max_pinned` (default 256 MiB). To make room, the least recently
//!   used entries go first (MRRC's policy: recency decides the victim, size
//!   decides how many). A buffer larger than the bound is registered for
//!   its call only. An entry that an I/O still uses when it is evicted
//!   stays registered until that I/O ends (it holds an `Arc`), so the
//!   pinned bytes can pass the bound by the buffers of I/O in flight.
//! * **Invalidated on unmap**: freed memory may be unmapped and something
//!   else mapped at the same address; a registration of the old pages must
//!   not serve it. UCX 1.13's `libucm` reports every unmap
//!   (`UCM_EVENT_VM_UNMAPPED`: `munmap`, `mremap`, `shmdt`, heap trimming,
//!   `madvise(DONTNEED)`), including glibc's own inside `free`;
//!   [`dafne_ucx::memevents`] records them in a lock-free ring, and the
//!   cache drops every entry overlapping an unmapped range before each
//!   lookup (all entries if events were missed). Memory that is freed but
//!   not unmapped (small allocations returned to malloc's heap) keeps its
//!   pages, so its registration stays valid for whatever reuses it.
//!   If the hooks cannot be installed, the cache does not cache: each call
//!   registers and deregisters (counted), which is slow but never stale.
//!
//! Rights: an entry is registered for remote read and write, so one
//! registration serves reads and writes. A peer holding a key could reach
//! the whole entry, not just the buffer of the request; io servers are
//! trusted for where they write (see ARCHITECTURE.md, "Trust"), and keys
//! are sent only while the caller's borrow of the buffer lasts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dafne_transport::{Access, Context};
use dafne_ucx::memevents::{self, UnmapCursor, Unmapped};
use dafne_ucx::Registration;

/// The default bound on registered bytes held by the cache.
pub const DEFAULT_MAX_PINNED: usize = 256 << 20;
/// The default bound on entries (a lookup may scan them all).
pub const DEFAULT_MAX_ENTRIES: usize = 1024;

/// Settings of a [`RegCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegCacheConfig {
    /// Registered bytes the cache may keep (whole pages).
    pub max_pinned: usize,
    /// Entries the cache may keep.
    pub max_entries: usize,
}

impl Default for RegCacheConfig {
    fn default() -> Self {
        RegCacheConfig { max_pinned: DEFAULT_MAX_PINNED, max_entries: DEFAULT_MAX_ENTRIES }
    }
}

/// Why a registration could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegCacheError {
    #[error("registering {len} bytes at {addr:#x} for zero-copy I/O: {source}")]
    Register { addr: usize, len: usize, source: dafne_ucx::Error },
    #[error("packing the key of a {len}-byte registration: {source}")]
    PackKey { len: usize, source: dafne_ucx::Error },
}

/// A registration and its packed key, as lent to one I/O.
#[derive(Debug)]
pub struct CachedReg {
    reg: Registration,
    key: Vec<u8>,
}

impl CachedReg {
    /// The packed key (sent in requests).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn registration(&self) -> &Registration {
        &self.reg
    }
}

/// Counters of a [`RegCache`] (monotonic, except `pinned_bytes` and
/// `entries`, which are gauges).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RegCacheStats {
    /// Lookups served by an entry.
    pub hits: u64,
    /// Lookups that registered.
    pub misses: u64,
    /// Registrations made (misses, including those not kept).
    pub registrations: u64,
    /// Entries dropped to respect `max_pinned` or `max_entries`, or
    /// because an I/O on them failed ([`RegCache::evict`]).
    pub evictions: u64,
    /// Entries dropped because their memory was unmapped.
    pub invalidations: u64,
    /// Registered bytes of the entries kept.
    pub pinned_bytes: u64,
    pub entries: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    registrations: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
}

struct Entry {
    reg: Arc<CachedReg>,
    last_use: u64,
}

/// A registered range: (start, end).
type Span = (usize, usize);

struct Inner {
    /// Registered ranges → entries (ranges may overlap, never repeat).
    entries: BTreeMap<Span, Entry>,
    /// last_use → range, oldest first.
    lru: BTreeMap<u64, Span>,
    tick: u64,
    pinned: usize,
    /// `None` when unmap events are unavailable: nothing is kept.
    cursor: Option<UnmapCursor>,
}

/// A registration cache for application buffers. `Send + Sync`.
pub struct RegCache {
    ctx: Context,
    cfg: RegCacheConfig,
    inner: Mutex<Inner>,
    c: Counters,
}

impl std::fmt::Debug for RegCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegCache").field("config", &self.cfg).field("stats", &self.stats()).finish()
    }
}

impl RegCache {
    /// A cache registering with `ctx`. Installs UCX's unmap hooks (once per
    /// process); without them the cache keeps nothing (see the module docs).
    pub fn new(ctx: &Context, cfg: RegCacheConfig) -> RegCache {
        // Without the hooks nothing is kept (`is_caching` tells).
        let cursor = memevents::watch_unmaps().ok().map(|()| UnmapCursor::new());
        RegCache {
            ctx: ctx.clone(),
            cfg,
            inner: Mutex::new(Inner { entries: BTreeMap::new(), lru: BTreeMap::new(), tick: 0, pinned: 0, cursor }),
            c: Counters::default(),
        }
    }

    pub fn config(&self) -> RegCacheConfig {
        self.cfg
    }

    /// Whether entries are kept (unmap events are available).
    pub fn is_caching(&self) -> bool {
        self.lock().cursor.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update below leaves `Inner` consistent between statements
        // that can panic, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An entry's registration covering `buf`, if the cache holds one
    /// (counted as a hit); `None` otherwise, counting nothing (a
    /// [`RegCache::get`] that follows counts the miss).
    pub fn cached(&self, buf: &[u8]) -> Option<Arc<CachedReg>> {
        let (addr, len) = (buf.as_ptr() as usize, buf.len());
        let mut g = self.lock();
        let inner = &mut *g;
        self.invalidate(inner);
        let reg = Self::lookup(inner, addr, len)?;
        self.c.hits.fetch_add(1, Ordering::Relaxed);
        Some(reg)
    }

    /// A registration covering `buf`: an entry's, or a new one. Hold the
    /// returned `Arc` for as long as a peer may use its key.
    ///
    /// The registration is made without the lock (it takes µs to ms), so
    /// two threads may miss the same range at once: the entry is inserted
    /// only after looking again under the lock, and a thread that finds an
    /// entry by then uses it and drops its own registration (counted in
    /// `registrations`, not kept).
    pub fn get(&self, buf: &[u8]) -> Result<Arc<CachedReg>, RegCacheError> {
        if let Some(reg) = self.cached(buf) {
            return Ok(reg);
        }
        let (addr, len) = (buf.as_ptr() as usize, buf.len());
        self.c.misses.fetch_add(1, Ordering::Relaxed);
        let reg = Registration::covering(&self.ctx, buf, Access::RemoteReadWrite)
            .map_err(|source| RegCacheError::Register { addr, len, source })?;
        self.c.registrations.fetch_add(1, Ordering::Relaxed);
        let key = reg.pack_key().map_err(|source| RegCacheError::PackKey { len: reg.len(), source })?;
        let (start, size) = (reg.addr() as usize, reg.len());
        let cached = Arc::new(CachedReg { reg, key });
        let mut g = self.lock();
        let inner = &mut *g;
        if inner.cursor.is_none() || size > self.cfg.max_pinned {
            return Ok(cached); // used for this call only
        }
        // Another thread may have inserted a covering entry meanwhile.
        self.invalidate(inner);
        if let Some(existing) = Self::lookup(inner, addr, len) {
            return Ok(existing);
        }
        let k = (start, start + size);
        // A same-range entry that does not cover `buf` cannot exist (the
        // range is `buf`'s pages), but never leave one behind unaccounted.
        self.remove(inner, k);
        // Least recently used first, until the new entry fits both bounds.
        // Each turn removes one LRU record, so the loop ends even if a
        // record were stale (its entry gone or re-used).
        while inner.pinned + size > self.cfg.max_pinned || inner.entries.len() >= self.cfg.max_entries.max(1) {
            let Some((tick, victim)) = inner.lru.pop_first() else { break };
            if inner.entries.get(&victim).is_some_and(|e| e.last_use == tick) {
                if let Some(_e) = inner.entries.remove(&victim) {
                    inner.pinned -= victim.1 - victim.0;
                }
                self.c.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.entries.insert(k, Entry { reg: cached.clone(), last_use: tick });
        inner.lru.insert(tick, k);
        inner.pinned += size;
        Ok(cached)
    }

    /// The entry covering `[addr, addr + len)`, its use recorded (a hit).
    fn lookup(inner: &mut Inner, addr: usize, len: usize) -> Option<Arc<CachedReg>> {
        let end = addr.saturating_add(len);
        let k = inner.entries.range(..=(addr, usize::MAX)).rev().find(|(&(_, e), _)| e >= end).map(|(&k, _)| k)?;
        inner.tick += 1;
        let tick = inner.tick;
        let e = inner.entries.get_mut(&k).expect("found above");
        let old = std::mem::replace(&mut e.last_use, tick);
        let reg = e.reg.clone();
        inner.lru.remove(&old);
        inner.lru.insert(tick, k);
        Some(reg)
    }

    /// Drops the entry of `reg` if the cache still holds it: an I/O on it
    /// failed, and the server may still put into or get from its memory
    /// (a timed-out request), so no later I/O may be served by it. The
    /// registration ends when its last user drops it. Counted as an
    /// eviction.
    pub fn evict(&self, reg: &Arc<CachedReg>) {
        let k = (reg.reg.addr() as usize, reg.reg.addr() as usize + reg.reg.len());
        let mut g = self.lock();
        if g.entries.get(&k).is_some_and(|e| Arc::ptr_eq(&e.reg, reg)) {
            self.remove(&mut g, k);
            self.c.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn remove(&self, inner: &mut Inner, k: Span) {
        if let Some(e) = inner.entries.remove(&k) {
            inner.lru.remove(&e.last_use);
            inner.pinned -= k.1 - k.0;
        }
    }

    /// Drops the entries that overlap memory unmapped since the last call.
    fn invalidate(&self, inner: &mut Inner) {
        let Some(cursor) = inner.cursor.as_mut() else { return };
        let mut gone: Vec<Unmapped> = Vec::new();
        cursor.poll(|u| gone.push(u));
        for u in gone {
            let victims: Vec<Span> = match u {
                Unmapped::Unknown => inner.entries.keys().copied().collect(),
                Unmapped::Range { start, len } => {
                    let end = start.saturating_add(len);
                    inner.entries.range(..(end, 0)).filter(|(&(_, e), _)| e > start).map(|(&k, _)| k).collect()
                }
            };
            for s in victims {
                self.remove(inner, s);
                self.c.invalidations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn stats(&self) -> RegCacheStats {
        let (pinned, entries) = {
            let g = self.lock();
            (g.pinned as u64, g.entries.len() as u64)
        };
        RegCacheStats {
            hits: self.c.hits.load(Ordering::Relaxed),
            misses: self.c.misses.load(Ordering::Relaxed),
            registrations: self.c.registrations.load(Ordering::Relaxed),
            evictions: self.c.evictions.load(Ordering::Relaxed),
            invalidations: self.c.invalidations.load(Ordering::Relaxed),
            pinned_bytes: pinned,
            entries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dafne_ucx::ContextOptions;

    fn ctx() -> Context {
        Context::new(&ContextOptions::default()).unwrap()
    }

    /// Two threads missing the same buffer at once (security review): the
    /// second must not insert a duplicate (pinned bytes counted twice, a
    /// stale LRU record on which the eviction loop spun forever holding
    /// the lock). After the races, a stream of registrations must all
    /// return (a watchdog, not a sleep, decides) and the accounting add up.
    #[test]
    fn concurrent_misses_of_one_buffer_keep_the_accounting_exact() {
        let c = Arc::new(RegCache::new(&ctx(), RegCacheConfig { max_pinned: 8 << 20, ..Default::default() }));
        let buf = Arc::new(vec![0u8; 1 << 20]);
        let rounds = 100_000;
        let bar = Arc::new(std::sync::Barrier::new(2));
        let other = {
            let (c, buf, bar) = (c.clone(), buf.clone(), bar.clone());
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    bar.wait();
                    drop(c.get(&buf).unwrap());
                    bar.wait();
                }
            })
        };
        for _ in 0..rounds {
            let before = c.stats();
            bar.wait();
            let r = c.get(&buf).unwrap();
            bar.wait();
            // Both threads are done with this round: one entry at most.
            let st = c.stats();
            assert!(st.entries <= 1 && st.pinned_bytes <= st.entries * ((1 << 20) + 8192), "{st:?}");
            c.evict(&r);
            let after = c.stats();
            if after.entries != 0 {
                // Not `r`'s entry: an unmap event the cache could not place
                // (`Unmapped::Unknown`: the ring overrun or a record being
                // written, as other tests of this process munmap at the
                // same time) dropped every entry after `r` was returned,
                // and the other thread registered the pages again. `evict`
                // must leave that one (it is not the failed registration).
                assert!(after.invalidations > before.invalidations, "an entry stayed with no invalidation: {after:?}");
                // (`None`: yet another such event dropped it meanwhile.)
                if let Some(e) = c.cached(&buf) {
                    assert!(!Arc::ptr_eq(&e, &r), "evict left the entry of the registration it was given: {after:?}");
                    c.evict(&e);
                }
            }
            let st = c.stats();
            assert_eq!((st.entries, st.pinned_bytes), (0, 0), "the evicted entry left pinned bytes: {st:?}");
        }
        other.join().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stream = {
            let c = c.clone();
            std::thread::spawn(move || {
                let bufs: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 1 << 20]).collect();
                for b in &bufs {
                    drop(c.get(b).unwrap());
                    tx.send(()).unwrap();
                }
            })
        };
        for i in 0..16 {
            rx.recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("registration {i} of the stream did not return ({e}): a spinning eviction"));
        }
        stream.join().unwrap();
        let st = c.stats();
        assert!(st.pinned_bytes <= 8 << 20 && st.entries >= 1, "{st:?}");
        assert!(st.pinned_bytes <= st.entries * ((1 << 20) + 8192), "pinned bytes beyond the entries': {st:?}");
    }

    #[test]
    fn repeated_use_of_a_buffer_registers_once_and_serves_slices_inside_it() {
        let c = RegCache::new(&ctx(), RegCacheConfig::default());
        assert!(c.is_caching(), "UCX's unmap hooks are expected to work here");
        let buf = vec![0u8; 1 << 20];
        let a = c.get(&buf).unwrap();
        for _ in 0..10 {
            let b = c.get(&buf).unwrap();
            assert!(Arc::ptr_eq(&a, &b));
        }
        // Any buffer inside the registered pages is served by the entry.
        let inner = c.get(&buf[4096..300_000]).unwrap();
        assert!(Arc::ptr_eq(&a, &inner));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.registrations, s.entries), (11, 1, 1, 1), "{s:?}");
        assert!(s.pinned_bytes >= 1 << 20 && s.pinned_bytes <= (1 << 20) + 8192);
    }

    #[test]
    fn the_pinned_bound_holds_under_a_stream_of_buffers() {
        let c = RegCache::new(&ctx(), RegCacheConfig { max_pinned: 4 << 20, ..Default::default() });
        let bufs: Vec<Vec<u8>> = (0..20).map(|_| vec![0u8; 1 << 20]).collect();
        for b in &bufs {
            drop(c.get(b).unwrap());
            assert!(c.stats().pinned_bytes <= 4 << 20, "{:?}", c.stats());
        }
        let s = c.stats();
        assert_eq!(s.registrations, 20);
        assert!(s.evictions >= 16, "{s:?}");
        // Each entry is 1 MiB, plus a page when the buffer is not aligned.
        assert!(s.entries >= 3, "{s:?}");
        // The most recent buffers are still cached; the oldest are not.
        let r = c.stats().registrations;
        c.get(&bufs[19]).unwrap();
        assert_eq!(c.stats().registrations, r);
        c.get(&bufs[0]).unwrap();
        assert_eq!(c.stats().registrations, r + 1);
        // A buffer larger than the bound is registered for its call only.
        let big = vec![0u8; 5 << 20];
        c.get(&big).unwrap();
        assert!(c.stats().pinned_bytes <= 4 << 20);
    }

    #[test]
    fn neighbours_sharing_a_page_keep_their_own_entries() {
        let c = RegCache::new(&ctx(), RegCacheConfig::default());
        let buf = vec![0u8; 3 << 20];
        let (a, b) = buf.split_at(1_500_000); // share the page at the split
        c.get(a).unwrap();
        c.get(b).unwrap();
        for _ in 0..4 {
            c.get(a).unwrap();
            c.get(b).unwrap();
        }
        let s = c.stats();
        assert_eq!((s.registrations, s.hits, s.entries), (2, 8, 2), "{s:?}");
        // The entry bound holds too.
        let c = RegCache::new(&ctx(), RegCacheConfig { max_entries: 2, ..Default::default() });
        for i in 0..8 {
            c.get(&buf[i * 300_000..][..1000]).unwrap();
            assert!(c.stats().entries <= 2);
        }
        assert_eq!(c.stats().evictions, 6);
    }

    #[test]
    fn freeing_a_buffer_invalidates_its_registration() {
        let c = RegCache::new(&ctx(), RegCacheConfig::default());
        // Above glibc's largest mmap threshold (32 MiB), so malloc maps it
        // and free unmaps it, whatever earlier frees did to the threshold.
        let buf = vec![7u8; 40 << 20];
        c.get(&buf).unwrap();
        let before = c.stats();
        drop(buf);
        let again = vec![9u8; 40 << 20]; // possibly at the same address
        c.get(&again).unwrap();
        let s = c.stats();
        assert!(s.invalidations > before.invalidations, "the unmap dropped the entry: {s:?}");
        assert_eq!(s.registrations, before.registrations + 1, "the new buffer was registered anew: {s:?}");
        assert_eq!(s.entries, 1);
    }

    #[test]
    fn an_evicted_registration_serves_no_later_io() {
        let c = RegCache::new(&ctx(), RegCacheConfig::default());
        let buf = vec![0u8; 1 << 20];
        let a = c.get(&buf).unwrap();
        c.evict(&a);
        assert_eq!(c.stats().entries, 0);
        let b = c.get(&buf).unwrap();
        assert!(!Arc::ptr_eq(&a, &b), "the evicted registration served the buffer again");
        // Evicting a registration the cache no longer holds leaves the
        // entry that replaced it.
        c.evict(&a);
        assert!(Arc::ptr_eq(&b, &c.get(&buf).unwrap()));
        let s = c.stats();
        assert_eq!((s.registrations, s.evictions, s.entries), (2, 1, 1), "{s:?}");
    }
}
