//! The Unifier handle, acquisition futures, guards, fills and write-backs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::ops::{Deref, Range};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use dafne_ucx::{Context, Local, SubRegion};

use crate::background::{Background, Job, BATCH_UNITS, MAX_IN_FLIGHT};
use crate::config::{class_of, FileAdvice, Policy, UnifierConfig, MAX_ADVISED_OBJECTS, UNIT_SIZES};
use crate::error::{Error, Result};
use crate::state::{Grant, Mem, State};
use crate::stats::UnifierStats;
use crate::storage::{BatchRead, Storage};

/// The least time between two warnings about failed background
/// write-backs.
const STORAGE_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The io server's cache, which is also its pool of registered
/// communication buffers. A cheap handle (`Rc`): clones share one cache.
/// Single-threaded (`!Send`): it lives on the io server's event loop.
#[derive(Clone)]
pub struct Unifier {
    inner: Rc<Inner>,
}

impl std::fmt::Debug for Unifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unifier").field("config", &self.inner.cfg).field("stats", &self.stats()).finish()
    }
}

struct Inner {
    /// First, so that it drops first: its thread is joined before any
    /// unit memory is freed.
    bg: Option<Background>,
    bgst: RefCell<BgState>,
    ctx: Context,
    cfg: UnifierConfig,
    storage: Box<dyn Storage>,
    st: RefCell<State>,
}

/// The loop's view of background write-backs in flight.
#[derive(Debug, Default)]
struct BgState {
    in_flight: usize,
    in_flight_bytes: u64,
    /// Units in flight per object (absent: none).
    per_object: HashMap<u64, u32>,
    /// Completions processed so far (waiters watch it move).
    completed: u64,
    /// The first failure not yet reported to a writer.
    error: Option<Error>,
}

/// What an acquisition wants.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// Shared; fill on a miss.
    Read,
    /// Exclusive, to write `range`; fill on a miss unless `range` covers
    /// the unit and the writer overwrites every byte of it (`whole`).
    Write(Range<usize>, bool),
}

/// A unit entered: its slot, generation and memory.
#[derive(Debug)]
struct Held {
    slot: u32,
    gen: u64,
    arc: Arc<SubRegion>,
    /// Created without a fill (a full-unit write): its bytes are garbage
    /// until the writer has written them.
    fresh: bool,
}

/// The outcome of one synchronous attempt to acquire.
#[derive(Debug)]
enum Step {
    Held(Held),
    /// A miss this acquisition owns: fill the unit from storage.
    Claimed(Held),
    /// Queued behind a conflicting holder, filler or earlier waiter.
    Wait {
        slot: u32,
        gen: u64,
        id: u64,
        exclusive: bool,
    },
    /// The index changed while room was made: look up again.
    Retry,
    /// The unit's memory is held by an abandoned operation.
    Leaked(u32),
}

/// Why a unit is written back (for the counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Evict,
    WriteBehind,
    Flush,
    Stable,
    Retire,
    Advice,
}

/// What a released exclusive holder leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// The written range becomes dirty.
    Commit(Range<usize>),
    /// The unit is dropped (its bytes are not to be trusted).
    Discard,
    /// Nothing changes (maintenance that managed dirty state itself).
    Keep,
}

fn unit_base(index: u64, size: usize) -> Result<u64> {
    // The unit's last byte must be addressable: (index + 1) * size <= 2^64.
    index
        .checked_add(1)
        .and_then(|n| n.checked_mul(size as u64))
        .map(|_| index * size as u64)
        .ok_or(Error::OffsetOverflow { unit_index: index, unit_size: size })
}

impl Unifier {
    /// Builds the cache: validates `config`, registers the ready slabs
    /// (carved into `default_unit` units) now, and keeps raw slabs for later.
    pub fn new(ctx: &Context, config: UnifierConfig, storage: impl Storage + 'static) -> Result<Unifier> {
        config.validate()?;
        let mut st = State::new(&config);
        let class = class_of(config.default_unit).expect("validated");
        for slab in 0..config.ready_slabs {
            st.carve(ctx, slab, class, true)?;
        }
        tracing::debug!(
            ready_bytes = config.ready_slabs * config.slab_size,
            raw_bytes = config.raw_slabs * config.slab_size,
            registrations = st.c.startup_registrations,
            "Unifier ready"
        );
        let bg = storage.background().and_then(|w| match Background::start(w) {
            Ok(bg) => Some(bg),
            Err(e) => {
                tracing::warn!("no background write-back thread ({e}); write-behind stays synchronous");
                None
            }
        });
        Ok(Unifier {
            inner: Rc::new(Inner {
                bg,
                bgst: RefCell::default(),
                ctx: ctx.clone(),
                cfg: config,
                storage: Box::new(storage),
                st: RefCell::new(st),
            }),
        })
    }

    pub fn config(&self) -> &UnifierConfig {
        &self.inner.cfg
    }

    /// A snapshot of the counters (background write-backs that completed
    /// are processed first).
    pub fn stats(&self) -> UnifierStats {
        self.inner.reap();
        self.inner.st.borrow().snapshot()
    }

    /// Whether dirty units are written back by a background thread.
    pub fn has_background_writeback(&self) -> bool {
        self.inner.bg.is_some()
    }

    /// Waits until no background write-back of `object` is in flight. The
    /// io server calls it before removing an object's file (a late write
    /// would recreate it); flush and truncate do it themselves.
    pub fn quiesce(&self, object: u64) -> impl Future<Output = ()> + 'static {
        BgWait { inner: self.inner.clone(), until: Until::Quiet(object) }
    }

    /// Records bytes a serving mode copied between buffers (the `normal`
    /// comparison mode); the Unifier's own paths never copy.
    pub fn record_copy(&self, bytes: u64) {
        self.inner.st.borrow_mut().c.bytes_copied += bytes;
    }

    /// The advice in force for `object` (default: no advice).
    pub fn file_advice(&self, object: u64) -> FileAdvice {
        self.inner.st.borrow().objects.get(&object).map(|o| o.advice).unwrap_or_default()
    }

    /// The unit size of `object`: its advice, else `default_unit`.
    pub fn unit_size_for(&self, object: u64) -> usize {
        self.inner.st.borrow().advice_for(object, &self.inner.cfg).0
    }

    /// The replacement policy of `object`: its advice, else `default_policy`.
    pub fn policy_for(&self, object: u64) -> Policy {
        self.inner.st.borrow().advice_for(object, &self.inner.cfg).2
    }

    /// Whether unit `unit_index` of `object` is cached (a cache-information
    /// query; it does not count as a use).
    pub fn is_cached(&self, object: u64, unit_index: u64) -> bool {
        self.inner.st.borrow().lookup(object, unit_index).is_some()
    }

    /// Sets (or with `FileAdvice::default()`, clears) the advice for
    /// `object`, normally at open. A new policy moves the object's cached
    /// units to that policy at once. A new unit size changes what a unit
    /// index means, so the object's cached units are written back and
    /// dropped first; if any is in use, nothing changes and `Busy` is
    /// returned.
    pub fn set_file_advice(&self, object: u64, advice: FileAdvice) -> Result<()> {
        if let Some(size) = advice.unit_size {
            if class_of(size).is_none() {
                return Err(Error::UnitSize { unit_size: size });
            }
        }
        let inner = &self.inner;
        let (old_size, _, _) = inner.st.borrow().advice_for(object, &inner.cfg);
        let new_size = advice.unit_size.unwrap_or(inner.cfg.default_unit);
        if old_size != new_size {
            // Write back, then drop, every cached unit of the object.
            loop {
                let dirty = {
                    let st = inner.st.borrow();
                    let Some(o) = st.objects.get(&object) else { break };
                    if o.units.values().any(|&s| st.unit(s).pinned() || !st.unit(s).attached) {
                        return Err(Error::Busy { object });
                    }
                    o.units.values().copied().find(|&s| st.unit(s).dirty.is_some())
                };
                match dirty {
                    Some(s) => inner.write_back(s, None, Cause::Advice)?,
                    None => break,
                }
            }
            let mut st = inner.st.borrow_mut();
            let units: Vec<u32> =
                st.objects.get(&object).map(|o| o.units.values().copied().collect()).unwrap_or_default();
            for s in units {
                st.detach(s, false);
            }
        }
        let mut st = inner.st.borrow_mut();
        let was_default = st.objects.get(&object).is_none_or(|o| o.advice.is_default());
        if was_default && !advice.is_default() && st.advised >= MAX_ADVISED_OBJECTS {
            return Err(Error::TooManyAdvised { limit: MAX_ADVISED_OBJECTS });
        }
        let policy = advice.policy.unwrap_or(inner.cfg.default_policy);
        let units: Vec<u32> = st.objects.get(&object).map(|o| o.units.values().copied().collect()).unwrap_or_default();
        for s in units {
            st.set_unit_policy(s, policy);
        }
        match (was_default, advice.is_default()) {
            (true, false) => st.advised += 1,
            (false, true) => st.advised -= 1,
            _ => {}
        }
        let o = st.objects.entry(object).or_default();
        o.advice = advice;
        if o.units.is_empty() && advice.is_default() {
            st.objects.remove(&object);
        }
        Ok(())
    }

    /// Shares unit `unit_index` of `object` for reading: bytes
    /// `[unit_index * unit_size, +unit_size)`. On a miss the unit is filled
    /// from storage (bytes past the end of the object read as zeros);
    /// acquisitions of a unit being filled wait for that one fill. Waits
    /// while a writer holds the unit or is queued before this reader.
    pub fn read(&self, object: u64, unit_index: u64) -> impl Future<Output = Result<ReadGuard>> + 'static {
        let inner = self.inner.clone();
        async move {
            let h = Inner::acquire(&inner, object, unit_index, Mode::Read).await?;
            Ok(ReadGuard { inner, slot: h.slot, gen: h.gen, object, index: unit_index, arc: Some(h.arc) })
        }
    }

    /// Fills, in one storage batch, those of `object`'s units `indices`
    /// that are not cached (a request's units, before it reads them one by
    /// one): storage that can submit several reads at once (io_uring) then
    /// reads them in one system call instead of one call per unit. Best
    /// effort: a unit that cannot be had now (no room) or whose read fails
    /// is left to the acquisition that follows, which fills it (and reports
    /// the error) as usual. Returns the units filled. Synchronous, like a
    /// fill; holds nothing when it returns.
    pub fn prefetch(&self, object: u64, indices: &[u64]) -> usize {
        self.inner.prefetch(object, indices, &[])
    }

    /// [`Self::prefetch`] of a request's units `own` and, in the same
    /// storage batch, units read ahead of it (`ahead`, for a sequential
    /// reader). A unit read ahead is a hit when it is used (it is what
    /// read-ahead is for); it is counted in `read_ahead`.
    pub fn prefetch_with_ahead(&self, object: u64, own: &[u64], ahead: &[u64]) -> usize {
        self.inner.prefetch(object, own, ahead)
    }

    /// Takes unit `unit_index` of `object` exclusively to write `range`
    /// (offsets within the unit). Waits for the unit's readers and earlier
    /// writers to release it: the unit is modified in place, never copied
    /// to dodge a conflict. On a miss the unit is filled first, unless
    /// `range` covers all of it. If dirty bytes would exceed
    /// `max_dirty_bytes`, the oldest dirty units are written back first.
    /// Releasing the guard marks `range` dirty.
    pub fn write(
        &self,
        object: u64,
        unit_index: u64,
        range: Range<usize>,
    ) -> impl Future<Output = Result<WriteGuard>> + 'static {
        self.write_mode(object, unit_index, range, true)
    }

    /// [`Self::write`] for a writer that says whether it overwrites every
    /// byte of `range` (`whole`). One that leaves holes inside it (several
    /// pieces of a list I/O in one unit) passes `false`: on a miss the unit
    /// is then always filled from storage first, so the bytes between the
    /// pieces are the file's, never a reused slot's previous contents.
    pub fn write_mode(
        &self,
        object: u64,
        unit_index: u64,
        range: Range<usize>,
        whole: bool,
    ) -> impl Future<Output = Result<WriteGuard>> + 'static {
        let inner = self.inner.clone();
        async move {
            Inner::make_room(&inner, object, unit_index, &range).await?;
            let h = Inner::acquire(&inner, object, unit_index, Mode::Write(range.clone(), whole)).await?;
            Ok(WriteGuard {
                inner,
                slot: h.slot,
                gen: h.gen,
                object,
                index: unit_index,
                range,
                arc: Some(h.arc),
                fresh: h.fresh,
            })
        }
    }

    /// Writes back `object`'s dirty units and syncs the object (an fsync or
    /// a COMMIT). A unit a writer holds is waited for: its earlier
    /// (completed) writes must be in storage when this returns.
    pub fn flush(&self, object: u64) -> impl Future<Output = Result<()>> + 'static {
        let inner = self.inner.clone();
        async move { Inner::flush(&inner, object).await }
    }

    /// Syncs `object` in storage ([`crate::Storage::sync_later`]) without writing
    /// back its dirty units: after [`WriteGuard::commit_through`] of each
    /// unit a stable write wrote.
    pub fn sync(&self, object: u64) -> impl Future<Output = Result<()>> + 'static {
        let inner = self.inner.clone();
        async move { Inner::sync(&inner, object).await }
    }

    /// Flushes every object with dirty units or with write-backs not yet
    /// synced; returns the first error after trying them all.
    pub fn flush_all(&self) -> impl Future<Output = Result<()>> + 'static {
        let inner = self.inner.clone();
        async move {
            let objects: Vec<u64> = {
                let mut st = inner.st.borrow_mut();
                let mut v: Vec<u64> = st.unsynced.drain().collect();
                for &s in st.dirty_order.values() {
                    v.push(st.unit(s).object);
                }
                v.sort_unstable();
                v.dedup();
                v
            };
            // Every object is tried even when one fails (its storage may be
            // the only broken one); a failed object stays owed a sync.
            let mut first_err = None;
            for object in objects {
                if let Err(e) = Inner::flush(&inner, object).await {
                    inner.st.borrow_mut().unsynced.insert(object);
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        }
    }

    /// Drops `object`'s cached units (its storage changed underneath):
    /// each is taken exclusively in turn, written back if dirty, and dropped.
    pub fn invalidate(&self, object: u64) -> impl Future<Output = Result<()>> + 'static {
        let inner = self.inner.clone();
        async move {
            for (s, gen) in inner.units_of(object, |_| true) {
                let Some(h) = Inner::acquire_existing(&inner, s, gen, true).await? else { continue };
                let res = inner.write_back(s, Some(&h.arc), Cause::Flush);
                let outcome = if res.is_ok() { Outcome::Discard } else { Outcome::Keep };
                inner.release_exclusive(s, h.gen, h.arc, outcome);
                res?;
            }
            Ok(())
        }
    }

    /// Cuts `object` to `new_len` in the cache: units wholly past the end
    /// are dropped with their dirty bytes; the unit holding the new end is
    /// taken exclusively, zeroed past it, and its dirty range clipped. The
    /// caller truncates storage after this completes, without yielding to
    /// other tasks in between (so that no later write-back re-extends the
    /// file: background write-backs of the object are waited for). A write that holds a unit past the
    /// end while this completes is ordered before the truncate.
    pub fn truncate(&self, object: u64, new_len: u64) -> impl Future<Output = Result<()>> + 'static {
        let inner = self.inner.clone();
        async move {
            // A write-back landing after the storage truncate would extend
            // the file again.
            BgWait { inner: inner.clone(), until: Until::Quiet(object) }.await;
            let size = inner.st.borrow().advice_for(object, &inner.cfg).0;
            let cut_index = new_len / size as u64;
            let cut = (new_len % size as u64) as usize;
            if cut > 0 {
                let found =
                    inner.st.borrow().lookup(object, cut_index).map(|s| (s, inner.st.borrow().slots[s as usize].gen));
                if let Some((s, gen)) = found {
                    if let Some(mut h) = Inner::acquire_existing(&inner, s, gen, true).await? {
                        let region = Arc::get_mut(&mut h.arc).expect("an exclusive holder's memory is unique");
                        region.as_mut_slice()[cut..].fill(0);
                        inner.st.borrow_mut().clip_dirty(s, cut);
                        inner.release_exclusive(s, h.gen, h.arc, Outcome::Keep);
                    }
                }
            }
            let first_gone = cut_index + u64::from(cut > 0);
            {
                let mut st = inner.st.borrow_mut();
                let gone: Vec<u32> = st
                    .objects
                    .get(&object)
                    .map(|o| o.units.range(first_gone..).map(|(_, &s)| s).collect())
                    .unwrap_or_default();
                for s in gone {
                    st.detach(s, true);
                }
            }
            // Write-backs started while this waited for the cut unit may
            // include units just dropped: they must land before the caller
            // truncates storage. No new one can start for those units now
            // (detached, clean), and the caller truncates without yielding.
            BgWait { inner: inner.clone(), until: Until::Quiet(object) }.await;
            Ok(())
        }
    }

    /// Makes `object`'s bytes `[offset, offset + len)` read as zeros in the
    /// cache, before the caller punches a hole in (or zeroes) that range of
    /// storage (`fallocate`): units wholly inside the range are dropped with
    /// their dirty bytes; a unit the range covers in part is taken
    /// exclusively, zeroed over the range, and its dirty range trimmed where
    /// the range covers one end of it (zeros in the middle of a dirty range
    /// are written back as the zeros they now are). As for
    /// [`Unifier::truncate`], background write-backs of the object are
    /// waited for before and after, and the caller changes storage after
    /// this completes without yielding to other tasks in between: no
    /// write-back of the range's older bytes lands after the storage change.
    /// A write that holds a unit of the range while this runs is ordered
    /// before it.
    pub fn zero_range(&self, object: u64, offset: u64, len: u64) -> impl Future<Output = Result<()>> + 'static {
        let inner = self.inner.clone();
        async move {
            BgWait { inner: inner.clone(), until: Until::Quiet(object) }.await;
            let end = offset.saturating_add(len);
            if end <= offset {
                return Ok(());
            }
            let size = inner.st.borrow().advice_for(object, &inner.cfg).0 as u64;
            let (first, last) = (offset / size, (end - 1) / size);
            let first_partial = offset > first * size || end < (first + 1) * size;
            let last_partial = end < (last + 1) * size;
            let mut partial = Vec::new();
            if first_partial {
                partial.push(first);
            }
            if last_partial && last != first {
                partial.push(last);
            }
            for index in partial {
                let base = index * size;
                let lo = (offset.max(base) - base) as usize;
                let hi = (end.min(base + size) - base) as usize;
                let found =
                    inner.st.borrow().lookup(object, index).map(|s| (s, inner.st.borrow().slots[s as usize].gen));
                if let Some((s, gen)) = found {
                    if let Some(mut h) = Inner::acquire_existing(&inner, s, gen, true).await? {
                        let region = Arc::get_mut(&mut h.arc).expect("an exclusive holder's memory is unique");
                        region.as_mut_slice()[lo..hi].fill(0);
                        inner.st.borrow_mut().trim_dirty(s, lo, hi);
                        inner.release_exclusive(s, h.gen, h.arc, Outcome::Keep);
                    }
                }
            }
            let whole = (first + u64::from(first_partial))..(last + 1 - u64::from(last_partial));
            if whole.start < whole.end {
                let mut st = inner.st.borrow_mut();
                let gone: Vec<u32> = st
                    .objects
                    .get(&object)
                    .map(|o| o.units.range(whole).map(|(_, &s)| s).collect())
                    .unwrap_or_default();
                for s in gone {
                    st.detach(s, true);
                }
            }
            // As in `truncate`: write-backs started while this waited for a
            // unit must land before the caller changes storage.
            BgWait { inner: inner.clone(), until: Until::Quiet(object) }.await;
            Ok(())
        }
    }

    /// Forgets `object` (it was deleted): its units and their dirty bytes
    /// are dropped at once, and its advice. Units still held are freed when
    /// released; a writer's bytes are discarded then. Await
    /// [`Unifier::quiesce`] first if storage is to be removed right after:
    /// a background write-back already in flight still lands.
    pub fn remove(&self, object: u64) {
        let mut st = self.inner.st.borrow_mut();
        let units: Vec<u32> = st.objects.get(&object).map(|o| o.units.values().copied().collect()).unwrap_or_default();
        for s in units {
            st.detach(s, true);
        }
        if let Some(o) = st.objects.remove(&object) {
            if !o.advice.is_default() {
                st.advised -= 1;
            }
        }
        st.unsynced.remove(&object);
    }
}

impl Inner {
    /// Acquires a unit by (object, index): hit, miss-and-fill, or wait.
    async fn acquire(inner: &Rc<Inner>, object: u64, index: u64, mode: Mode) -> Result<Held> {
        loop {
            let step = match inner.try_acquire(object, index, &mode) {
                // Units pinned by background write-backs are free again
                // once those complete: wait for one rather than fail.
                Err(Error::NoSpace { .. }) if inner.bgst.borrow().in_flight > 0 => {
                    let seen = inner.bgst.borrow().completed;
                    BgWait { inner: inner.clone(), until: Until::Completed(seen) }.await;
                    continue;
                }
                r => r?,
            };
            match step {
                Step::Held(h) => return Ok(h),
                Step::Claimed(h) => return inner.fill(h, object, index, &mode),
                Step::Retry => {}
                Step::Leaked(s) => inner.retire(s)?,
                Step::Wait { slot, gen, id, exclusive } => {
                    match (WaitTurn { inner: inner.clone(), slot, gen, id, exclusive, done: false }).await {
                        Turn::Held(h) => return Ok(h),
                        Turn::Gone => {}
                        Turn::Leaked(s) => inner.retire(s)?,
                    }
                }
            }
        }
    }

    /// Acquires a unit known by (slot, gen), without filling: `None` if it
    /// is gone (or was retired).
    async fn acquire_existing(inner: &Rc<Inner>, s: u32, gen: u64, exclusive: bool) -> Result<Option<Held>> {
        // A parked unit (clean, unused) is registered again first.
        loop {
            let mut st = inner.st.borrow_mut();
            let slot = &st.slots[s as usize];
            let parked = matches!(slot.mem, Mem::Parked { .. });
            match slot.unit.as_ref() {
                Some(u) if slot.gen == gen && u.attached && parked => {}
                _ => break,
            }
            if st.ensure_registered(&inner.ctx, s)? {
                break;
            }
            match st.dirty_blocking_park(st.slots[s as usize].slab as usize) {
                Some(d) => {
                    drop(st);
                    inner.write_back(d, None, Cause::Evict)?;
                }
                None => {
                    st.c.no_space += 1;
                    let unit_size = UNIT_SIZES[st.slots[s as usize].class];
                    return Err(Error::NoSpace { unit_size, pinned: st.pinned_units() });
                }
            }
        }
        let step = {
            let mut st = inner.st.borrow_mut();
            let slot = &st.slots[s as usize];
            match slot.unit.as_ref() {
                Some(u) if slot.gen == gen && u.attached => {
                    if exclusive && u.can_exclusive(None) {
                        Some(st.grant_exclusive(s))
                    } else if !exclusive && u.can_share(None) {
                        Some(st.grant_shared(s))
                    } else {
                        None
                    }
                }
                _ => return Ok(None),
            }
        };
        let grant = match step {
            Some(g) => g,
            None => {
                let id = inner.st.borrow_mut().enqueue(s, exclusive);
                match (WaitTurn { inner: inner.clone(), slot: s, gen, id, exclusive, done: false }).await {
                    Turn::Held(h) => return Ok(Some(h)),
                    Turn::Gone => return Ok(None),
                    Turn::Leaked(s) => Grant::Leaked(s),
                }
            }
        };
        match grant {
            Grant::Held { slot, gen, arc } => Ok(Some(Held { slot, gen, arc, fresh: false })),
            Grant::Leaked(s) => inner.retire(s).map(|()| None),
        }
    }

    /// One synchronous attempt: a hit is granted or queued; a miss makes
    /// room, takes a slot and claims the unit for this acquisition.
    fn try_acquire(&self, object: u64, index: u64, mode: &Mode) -> Result<Step> {
        self.reap();
        let mut st = self.st.borrow_mut();
        let (size, class, policy) = st.advice_for(object, &self.cfg);
        unit_base(index, size)?;
        if let Mode::Write(r, _) = mode {
            if r.start >= r.end || r.end > size {
                return Err(Error::BadRange { start: r.start, end: r.end, unit_size: size });
            }
        }
        let exclusive = matches!(mode, Mode::Write(..));
        if let Some(s) = st.lookup(object, index) {
            if !st.unit(s).pinned() && !st.ensure_registered(&self.ctx, s)? {
                // Parked, and no registered raw slab can be parked to make
                // room within the bound: write back a dirty unit that keeps
                // one registered and try again, else no room now.
                let slab = st.slots[s as usize].slab as usize;
                if let Some(d) = st.dirty_blocking_park(slab) {
                    drop(st);
                    self.write_back(d, None, Cause::Evict)?;
                    return Ok(Step::Retry);
                }
                st.c.no_space += 1;
                return Err(Error::NoSpace { unit_size: size, pinned: st.pinned_units() });
            }
            if std::mem::take(&mut st.unit_mut(s).prefetched) {
                st.c.misses += 1;
            } else {
                st.c.hits += 1;
            }
            st.touch(s);
            let u = st.unit(s);
            let grant = if exclusive {
                u.can_exclusive(None).then(|| st.grant_exclusive(s))
            } else {
                u.can_share(None).then(|| st.grant_shared(s))
            };
            return Ok(match grant {
                Some(Grant::Held { slot, gen, arc }) => Step::Held(Held { slot, gen, arc, fresh: false }),
                Some(Grant::Leaked(s)) => Step::Leaked(s),
                None => {
                    if st.unit(s).filling {
                        st.c.fill_waits += 1;
                    } else {
                        st.c.conflict_waits += 1;
                    }
                    let gen = st.slots[s as usize].gen;
                    let id = st.enqueue(s, exclusive);
                    Step::Wait { slot: s, gen, id, exclusive }
                }
            });
        }
        st.c.misses += 1;
        drop(st);
        let s = self.alloc(class)?;
        let mut st = self.st.borrow_mut();
        if st.lookup(object, index).is_some() || st.advice_for(object, &self.cfg).1 != class {
            // Making room ran storage calls; something cached the unit or
            // changed the advice meanwhile. Give the slot back, start over.
            st.free[class].push(s);
            return Ok(Step::Retry);
        }
        let fill = match mode {
            Mode::Read => true,
            Mode::Write(r, whole) => !(*whole && r.start == 0 && r.end == size),
        };
        st.attach(s, object, index, policy, fill);
        let slot = &mut st.slots[s as usize];
        let arc = match std::mem::replace(&mut slot.mem, Mem::Lent) {
            Mem::Registered(arc) => arc,
            other => unreachable!("a free slot's memory is registered, found {other:?}"),
        };
        let h = Held { slot: s, gen: slot.gen, arc, fresh: !fill };
        Ok(if fill { Step::Claimed(h) } else { Step::Held(h) })
    }

    /// Fills a claimed unit from storage, straight into its memory, then
    /// hands it to the claimer as reader or writer and lets waiters in.
    fn fill(&self, mut h: Held, object: u64, index: u64, mode: &Mode) -> Result<Held> {
        let size = h.arc.len();
        let offset = index * size as u64; // checked by unit_base
        let res = {
            // Free slots' memory is unique: `free_if_idle` retires a slot
            // whose memory an abandoned operation still holds.
            let buf = Arc::get_mut(&mut h.arc).expect("a claimed unit's memory is unique").as_mut_slice();
            self.storage.read_at(object, offset, buf)
        };
        self.finish_fill(h, object, index, mode, res)
    }

    /// Completes a claimed unit's fill with the storage read's outcome:
    /// zeroes past what was read and hands the unit to the claimer, or
    /// drops it on error.
    fn finish_fill(
        &self,
        mut h: Held,
        object: u64,
        index: u64,
        mode: &Mode,
        res: std::io::Result<usize>,
    ) -> Result<Held> {
        let size = h.arc.len();
        let offset = index * size as u64; // checked by unit_base
        let res = res.map(|n| {
            let n = n.min(size);
            Arc::get_mut(&mut h.arc).expect("a claimed unit's memory is unique").as_mut_slice()[n..].fill(0);
            n
        });
        let mut st = self.st.borrow_mut();
        st.unit_mut(h.slot).filling = false;
        match res {
            Err(source) => {
                st.c.storage_errors += 1;
                st.slots[h.slot as usize].mem = Mem::Registered(h.arc);
                st.detach(h.slot, true);
                Err(Error::Storage { op: "read_at", object, offset, source })
            }
            Ok(n) => {
                st.c.fills += 1;
                st.c.fill_bytes += n as u64;
                match mode {
                    Mode::Read => {
                        st.slots[h.slot as usize].mem = Mem::Registered(h.arc.clone());
                        st.unit_mut(h.slot).readers += 1;
                        st.unit(h.slot).wake_eligible();
                    }
                    Mode::Write(..) => st.unit_mut(h.slot).writer = true,
                }
                Ok(h)
            }
        }
    }

    fn prefetch(&self, object: u64, own: &[u64], ahead: &[u64]) -> usize {
        let mut claimed: Vec<(Held, u64)> = Vec::new();
        for &index in own.iter().chain(ahead) {
            if self.st.borrow().lookup(object, index).is_some() || claimed.iter().any(|(_, i)| *i == index) {
                continue;
            }
            let misses = self.st.borrow().c.misses;
            match self.try_acquire(object, index, &Mode::Read) {
                Ok(Step::Claimed(h)) => {
                    // The acquisition that uses the unit counts the miss.
                    self.st.borrow_mut().c.misses = misses;
                    claimed.push((h, index));
                }
                // A miss is claimed or retried; nothing else can come of
                // it, but give back whatever did.
                Ok(Step::Held(h)) => {
                    drop(h.arc);
                    self.release_shared(h.slot, h.gen);
                }
                Ok(Step::Wait { slot, gen, id, .. }) => {
                    let mut st = self.st.borrow_mut();
                    if st.slots[slot as usize].gen == gen {
                        if let Some(u) = st.slots[slot as usize].unit.as_mut() {
                            u.remove_waiter(id);
                            u.wake_eligible();
                        }
                    }
                }
                Ok(Step::Retry | Step::Leaked(_)) => {}
                // No room (or another failure): fill what was claimed.
                Err(_) => break,
            }
        }
        if claimed.is_empty() {
            return 0;
        }
        let results = {
            let mut reads: Vec<BatchRead<'_>> = claimed
                .iter_mut()
                .map(|(h, index)| {
                    let offset = *index * h.arc.len() as u64; // checked by unit_base
                    let buf = Arc::get_mut(&mut h.arc).expect("a claimed unit's memory is unique").as_mut_slice();
                    BatchRead { object, offset, buf }
                })
                .collect();
            self.storage.read_batch(&mut reads)
        };
        debug_assert_eq!(results.len(), claimed.len());
        let (mut filled, mut read_ahead) = (0, 0);
        for ((h, index), res) in claimed.into_iter().zip(results) {
            // A failed fill drops the unit (`finish_fill`); the acquisition
            // that follows fills it again and reports the error.
            if let Ok(h) = self.finish_fill(h, object, index, &Mode::Read, res) {
                filled += 1;
                // A request's own unit: its first use is the request's miss.
                if own.contains(&index) {
                    self.st.borrow_mut().unit_mut(h.slot).prefetched = true;
                } else {
                    read_ahead += 1;
                }
                drop(h.arc);
                self.release_shared(h.slot, h.gen);
            }
        }
        let mut st = self.st.borrow_mut();
        st.c.prefetched += filled as u64;
        st.c.read_ahead += read_ahead;
        st.c.prefetch_batches += 1;
        filled
    }

    /// Finds a free slot of `class`, in this order: a free unit; a slab
    /// never carved (raw memory: allocated and registered now, once per
    /// slab, and it evicts nothing); the replacement policies' victim in
    /// `class` (written back first if dirty); an empty slab of another
    /// class, re-carved; the coldest slab of another class whose units can
    /// all be evicted, re-carved; ranges of this class's slabs that
    /// abandoned operations have let go of since. Re-carving registers
    /// nothing (the slab stays registered; only its views change), but
    /// evicting a whole slab of another class's data is costly, so a class
    /// takes memory from another only when it has nothing of its own to
    /// evict. Otherwise every candidate is in use: `NoSpace`.
    fn alloc(&self, class: usize) -> Result<u32> {
        loop {
            let mut st = self.st.borrow_mut();
            // A free unit, registered if there is one (under a pinned bound
            // some may be parked: using one registers its slab again).
            let registered = |st: &State, s: u32| matches!(st.slots[s as usize].mem, Mem::Registered(_));
            let pick = match self.cfg.max_pinned_bytes {
                None => st.free[class].len().checked_sub(1),
                Some(_) => st.free[class]
                    .iter()
                    .rposition(|&s| registered(&st, s))
                    .or_else(|| st.free[class].len().checked_sub(1)),
            };
            if let Some(i) = pick {
                let s = st.free[class][i];
                if !st.ensure_registered(&self.ctx, s)? {
                    if let Some(d) = st.dirty_blocking_park(st.slots[s as usize].slab as usize) {
                        drop(st);
                        self.write_back(d, None, Cause::Evict)?;
                        continue;
                    }
                    st.c.no_space += 1;
                    return Err(Error::NoSpace { unit_size: UNIT_SIZES[class], pinned: st.pinned_units() });
                }
                st.free[class].swap_remove(i);
                return Ok(s);
            }
            if let Some(slab) = st.slabs.iter().position(|sl| sl.class.is_none()) {
                // Raw memory never used: registered now, within the bound
                // (parking cold raw slabs), else take a victim instead.
                if st.make_room_to_pin(slab) {
                    st.carve(&self.ctx, slab, class, false)?;
                    continue;
                }
                if let Some(d) = st.dirty_blocking_park(slab) {
                    drop(st);
                    self.write_back(d, None, Cause::Evict)?;
                    continue;
                }
            }
            if let Some(v) = st.victim(class) {
                if st.unit(v).dirty.is_some() {
                    drop(st);
                    self.write_back(v, None, Cause::Evict)?;
                } else {
                    st.evict(v);
                }
                continue;
            }
            if let Some(slab) = st.idle_slab(class) {
                st.carve(&self.ctx, slab, class, false)?;
                continue;
            }
            if let Some(slab) = st.coldest_evictable_slab(class) {
                let units: Vec<u32> =
                    st.slabs[slab].slots.iter().copied().filter(|&s| st.slots[s as usize].unit.is_some()).collect();
                if let Some(&d) = units.iter().find(|&&s| st.unit(s).dirty.is_some()) {
                    drop(st);
                    self.write_back(d, None, Cause::Evict)?;
                    continue;
                }
                for s in units {
                    st.evict(s);
                }
                st.carve(&self.ctx, slab, class, false)?;
                continue;
            }
            if st.reclaim(class) {
                continue;
            }
            st.c.no_space += 1;
            return Err(Error::NoSpace { unit_size: UNIT_SIZES[class], pinned: st.pinned_units() });
        }
    }

    /// Writes the unit's dirty range to storage, straight from its memory.
    /// With `held`, the caller holds the unit (as reader or writer) and
    /// passes its memory; without, the unit is pinned for the call (if a
    /// writer holds it, nothing is done: its release decides).
    fn write_back(&self, s: u32, held: Option<&Arc<SubRegion>>, cause: Cause) -> Result<()> {
        let (object, offset, lo, hi, pinned) = {
            let mut st = self.st.borrow_mut();
            let slot = &st.slots[s as usize];
            let Some(u) = slot.unit.as_ref() else { return Ok(()) };
            let Some((lo, hi)) = u.dirty else { return Ok(()) };
            // Cannot overflow: unit_base checked (index + 1) * size.
            let offset = u.index * UNIT_SIZES[slot.class] as u64 + lo as u64;
            let object = u.object;
            let pinned = match (held, &slot.mem) {
                (Some(_), _) => None,
                (None, Mem::Registered(arc)) => Some(arc.clone()),
                (None, _) => return Ok(()),
            };
            if pinned.is_some() {
                st.unit_mut(s).pins += 1;
            }
            (object, offset, lo, hi, pinned)
        };
        let region: &SubRegion = held.map(|a| &**a).or(pinned.as_deref()).expect("memory to write from");
        let res = self.storage.write_at(object, offset, &region.as_slice()[lo..hi]);
        let was_pinned = pinned.is_some();
        drop(pinned);
        let mut st = self.st.borrow_mut();
        if was_pinned {
            st.unit_mut(s).pins -= 1;
        }
        match &res {
            Ok(()) => {
                st.unit_mut(s).failed_at = None;
                // Holders and pins exclude writers, so the range is unchanged.
                if st.unit(s).dirty == Some((lo, hi)) {
                    st.clear_dirty(s);
                }
                st.c.writebacks += 1;
                st.c.writeback_bytes += (hi - lo) as u64;
                if cause == Cause::WriteBehind {
                    st.c.write_behind += 1;
                }
                st.unsynced.insert(object);
            }
            Err(_) => {
                st.c.storage_errors += 1;
                st.unit_mut(s).failed_at = Some(std::time::Instant::now());
            }
        }
        if was_pinned {
            st.unit(s).wake_eligible();
            st.free_if_idle(s);
        }
        drop(st);
        res.map_err(|source| Error::Storage { op: "write_at", object, offset, source })
    }

    /// Bounded write-behind: before a write of `range` of a unit, make sure
    /// the bytes the write will add (the growth of the unit's covering dirty
    /// range) fit under `max_dirty_bytes`.
    ///
    /// With a background writer, the oldest dirty units are handed to it as
    /// soon as dirty bytes not already being written pass half the bound
    /// ([`Inner::kick`]); a writer that would pass the bound itself waits
    /// for a background completion (the loop serves others meanwhile). A
    /// background failure is reported to the next writer that waits.
    /// Without one, the oldest dirty units are written back here,
    /// synchronously (`write_behind`).
    ///
    /// Units a writer holds cannot be written back now, so the bound can be
    /// passed by at most the writers in flight:
    /// dirty bytes <= max_dirty_bytes + (writers in flight - 1) * 64 KiB.
    async fn make_room(inner: &Rc<Inner>, object: u64, index: u64, range: &Range<usize>) -> Result<()> {
        loop {
            inner.reap();
            inner.kick();
            let s = {
                let st = inner.st.borrow();
                let growth = match st.lookup(object, index).and_then(|s| st.unit(s).dirty) {
                    Some((lo, hi)) => (hi.max(range.end) - lo.min(range.start)) - (hi - lo),
                    None => range.len(),
                };
                if st.dirty_bytes + growth as u64 <= inner.cfg.max_dirty_bytes as u64 {
                    return Ok(());
                }
                if inner.bgst.borrow().in_flight > 0 {
                    None
                } else {
                    match st.oldest_writable_back() {
                        Some(s) => Some(s),
                        // Only units whose write-back just failed are over
                        // the bound (`RETRY_FAILED_AFTER`): they do not hold
                        // this writer up, unless they are its own object's.
                        None => {
                            drop(st);
                            let mut b = inner.bgst.borrow_mut();
                            if matches!(&b.error, Some(Error::Storage { object: o, .. }) if *o == object) {
                                return Err(b.error.take().expect("matched"));
                            }
                            return Ok(());
                        }
                    }
                }
            };
            match s {
                Some(s) => inner.write_back(s, None, Cause::WriteBehind)?,
                None => {
                    // A failed background write is reported to a writer of
                    // the same object (another object's writer is not
                    // concerned; the failed unit stays dirty and the next
                    // flush of its object retries it).
                    let mine =
                        matches!(&inner.bgst.borrow().error, Some(Error::Storage { object: o, .. }) if *o == object);
                    if mine {
                        if let Some(e) = inner.bgst.borrow_mut().error.take() {
                            return Err(e);
                        }
                    }
                    inner.st.borrow_mut().c.background_waits += 1;
                    let seen = inner.bgst.borrow().completed;
                    BgWait { inner: inner.clone(), until: Until::Completed(seen) }.await;
                }
            }
        }
    }

    /// Hands the oldest dirty units to the background writer, in batches of
    /// up to [`BATCH_UNITS`], while the dirty bytes not already in flight
    /// exceed half of `max_dirty_bytes` and fewer than [`MAX_IN_FLIGHT`]
    /// units are in flight. Each unit is pinned until its completion is
    /// reaped (see `background.rs`).
    fn kick(&self) {
        let Some(bg) = &self.bg else { return };
        let low = self.cfg.max_dirty_bytes as u64 / 2;
        loop {
            let mut b = self.bgst.borrow_mut();
            let mut st = self.st.borrow_mut();
            if st.dirty_bytes.saturating_sub(b.in_flight_bytes) <= low || b.in_flight >= MAX_IN_FLIGHT {
                return;
            }
            let room = BATCH_UNITS.min(MAX_IN_FLIGHT - b.in_flight);
            let picked: Vec<u32> = st
                .dirty_order
                .values()
                .copied()
                .filter(|&s| {
                    let u = st.unit(s);
                    u.pins == 0
                        && u.attached
                        && !u.failed_recently()
                        && matches!(st.slots[s as usize].mem, Mem::Registered(_))
                })
                .take(room)
                .collect();
            if picked.is_empty() {
                return;
            }
            let mut batch = Vec::with_capacity(picked.len());
            for s in picked {
                let slot = &st.slots[s as usize];
                let u = slot.unit.as_ref().expect("dirty units exist");
                let (lo, hi) = u.dirty.expect("in the dirty order");
                let Mem::Registered(arc) = &slot.mem else { unreachable!("filtered above") };
                let job = Job {
                    slot: s,
                    gen: slot.gen,
                    object: u.object,
                    // Cannot overflow: unit_base checked (index + 1) * size.
                    offset: u.index * UNIT_SIZES[slot.class] as u64 + lo as u64,
                    lo,
                    hi,
                    mem: arc.clone(),
                };
                st.unit_mut(s).pins += 1;
                b.in_flight += 1;
                b.in_flight_bytes += (hi - lo) as u64;
                *b.per_object.entry(job.object).or_insert(0) += 1;
                batch.push(job);
            }
            st.c.background_batches += 1;
            drop((b, st));
            bg.submit(batch);
        }
    }

    /// Processes the background write-backs that completed: clears the
    /// dirty range written (unchanged: the pin kept writers out), unpins the
    /// unit and lets waiters in; a failure leaves the unit dirty.
    fn reap(&self) {
        let Some(bg) = &self.bg else { return };
        let done = bg.completions();
        if done.is_empty() {
            return;
        }
        let mut b = self.bgst.borrow_mut();
        let mut st = self.st.borrow_mut();
        for d in done {
            let s = d.slot;
            debug_assert_eq!(st.slots[s as usize].gen, d.gen, "a pinned unit keeps its slot");
            b.in_flight -= 1;
            b.in_flight_bytes -= (d.hi - d.lo) as u64;
            b.completed += 1;
            match b.per_object.get_mut(&d.object) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    b.per_object.remove(&d.object);
                }
            }
            match d.result {
                Ok(()) => {
                    st.unit_mut(s).failed_at = None;
                    if st.unit(s).dirty == Some((d.lo, d.hi)) {
                        st.clear_dirty(s);
                    }
                    st.c.writebacks += 1;
                    st.c.writeback_bytes += (d.hi - d.lo) as u64;
                    st.c.background_writebacks += 1;
                    st.unsynced.insert(d.object);
                }
                Err(source) => {
                    st.c.storage_errors += 1;
                    let now = std::time::Instant::now();
                    st.unit_mut(s).failed_at = Some(now);
                    if st.storage_warned.is_none_or(|t| now.duration_since(t) >= STORAGE_WARN_EVERY) {
                        st.storage_warned = Some(now);
                        tracing::warn!(
                            object = d.object,
                            offset = d.offset,
                            "background write-back failed: {source} ({} storage errors so far; the unit stays dirty \
                             and is retried; at most one such warning per {}s)",
                            st.c.storage_errors,
                            STORAGE_WARN_EVERY.as_secs()
                        );
                    }
                    if b.error.is_none() {
                        b.error = Some(Error::Storage {
                            op: "write_at (background)",
                            object: d.object,
                            offset: d.offset,
                            source,
                        });
                    }
                }
            }
            st.unit_mut(s).pins -= 1;
            st.unit(s).wake_eligible();
            st.free_if_idle(s);
        }
    }

    /// Gives up a slot whose memory an abandoned RMA operation holds: its
    /// dirty bytes go to storage first, then the unit is dropped; the slot
    /// is retired when the last holder lets go (`free_if_idle`).
    fn retire(&self, s: u32) -> Result<()> {
        self.write_back(s, None, Cause::Retire)?;
        let mut st = self.st.borrow_mut();
        if st.slots[s as usize].unit.is_some() {
            st.detach(s, true);
        }
        Ok(())
    }

    /// The (slot, gen) of `object`'s units that satisfy `keep`.
    fn units_of(&self, object: u64, keep: impl Fn(&crate::state::Unit) -> bool) -> Vec<(u32, u64)> {
        let st = self.st.borrow();
        st.objects
            .get(&object)
            .map(|o| o.units.values().filter(|&&s| keep(st.unit(s))).map(|&s| (s, st.slots[s as usize].gen)).collect())
            .unwrap_or_default()
    }

    async fn flush(inner: &Rc<Inner>, object: u64) -> Result<()> {
        // The sync below must follow the object's background write-backs.
        BgWait { inner: inner.clone(), until: Until::Quiet(object) }.await;
        for (s, gen) in inner.units_of(object, |u| u.dirty.is_some() || u.writer) {
            // Shared access: waits for a writer, not for readers.
            let Some(h) = Inner::acquire_existing(inner, s, gen, false).await? else { continue };
            let res = inner.write_back(s, Some(&h.arc), Cause::Flush);
            drop(h.arc);
            inner.release_shared(s, h.gen);
            res?;
        }
        Inner::sync(inner, object).await?;
        // A background failure on this object is superseded: its units were
        // written again above and synced.
        let mut b = inner.bgst.borrow_mut();
        if matches!(&b.error, Some(Error::Storage { object: o, .. }) if *o == object) {
            b.error = None;
        }
        Ok(())
    }

    /// Syncs `object` through [`Storage::sync_later`] (the loop serves
    /// while the storage syncs). It is taken off the objects to sync at
    /// once: a write-back that completes while the sync is under way marks
    /// it again; a failed sync puts it back.
    async fn sync(inner: &Rc<Inner>, object: u64) -> Result<()> {
        let was = inner.st.borrow_mut().unsynced.remove(&object);
        match inner.storage.sync_later(object).await {
            Ok(()) => Ok(()),
            Err(source) => {
                let mut st = inner.st.borrow_mut();
                if was {
                    st.unsynced.insert(object);
                }
                st.c.storage_errors += 1;
                Err(Error::Storage { op: "sync", object, offset: 0, source })
            }
        }
    }

    fn release_shared(&self, s: u32, gen: u64) {
        let mut st = self.st.borrow_mut();
        debug_assert_eq!(st.slots[s as usize].gen, gen, "a held unit keeps its slot");
        let u = st.unit_mut(s);
        u.readers -= 1;
        u.wake_eligible();
        st.free_if_idle(s);
    }

    fn release_exclusive(&self, s: u32, gen: u64, arc: Arc<SubRegion>, outcome: Outcome) {
        let mut st = self.st.borrow_mut();
        debug_assert_eq!(st.slots[s as usize].gen, gen, "a held unit keeps its slot");
        st.slots[s as usize].mem = Mem::Registered(arc);
        st.unit_mut(s).writer = false;
        match outcome {
            Outcome::Commit(r) => st.mark_dirty(s, r.start, r.end),
            Outcome::Discard => st.detach(s, true),
            Outcome::Keep => {}
        }
        if st.slots[s as usize].unit.is_some() && st.slots[s as usize].gen == gen {
            st.unit(s).wake_eligible();
            st.free_if_idle(s);
        }
    }
}

/// Waits for this acquisition's turn in a unit's queue.
struct WaitTurn {
    inner: Rc<Inner>,
    slot: u32,
    gen: u64,
    id: u64,
    exclusive: bool,
    done: bool,
}

enum Turn {
    Held(Held),
    /// The unit was dropped or replaced: look it up again.
    Gone,
    Leaked(u32),
}

impl Future for WaitTurn {
    type Output = Turn;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Turn> {
        let this = &mut *self;
        // The unit may be pinned by a background write-back: its completion
        // must be reaped (and this waiter woken) even if nothing else runs.
        if let Some(bg) = &this.inner.bg {
            if this.inner.bgst.borrow().in_flight > 0 {
                bg.notify(cx.waker());
            }
            this.inner.reap();
        }
        let mut st = this.inner.st.borrow_mut();
        let s = this.slot;
        let slot = &mut st.slots[s as usize];
        let live = slot.gen == this.gen && slot.unit.as_ref().is_some_and(|u| u.attached);
        if !live {
            if slot.gen == this.gen {
                if let Some(u) = slot.unit.as_mut() {
                    u.remove_waiter(this.id);
                }
            }
            this.done = true;
            return Poll::Ready(Turn::Gone);
        }
        let u = slot.unit.as_mut().expect("live");
        let ok = if this.exclusive { u.can_exclusive(Some(this.id)) } else { u.can_share(Some(this.id)) };
        if !ok {
            if let Some(w) = u.waiters.iter_mut().find(|w| w.id == this.id) {
                if !w.waker.as_ref().is_some_and(|k| k.will_wake(cx.waker())) {
                    w.waker = Some(cx.waker().clone());
                }
            }
            return Poll::Pending;
        }
        u.remove_waiter(this.id);
        this.done = true;
        let grant = if this.exclusive { st.grant_exclusive(s) } else { st.grant_shared(s) };
        st.unit(s).wake_eligible();
        Poll::Ready(match grant {
            Grant::Held { slot, gen, arc } => Turn::Held(Held { slot, gen, arc, fresh: false }),
            Grant::Leaked(s) => Turn::Leaked(s),
        })
    }
}

impl Drop for WaitTurn {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Cancelled: leave the queue and let the next in line try.
        if let Ok(mut st) = self.inner.st.try_borrow_mut() {
            let slot = &mut st.slots[self.slot as usize];
            if slot.gen == self.gen {
                if let Some(u) = slot.unit.as_mut() {
                    u.remove_waiter(self.id);
                    u.wake_eligible();
                }
            }
        }
    }
}

/// What a [`BgWait`] waits for.
enum Until {
    /// More completions than this count.
    Completed(u64),
    /// No write-back of this object in flight.
    Quiet(u64),
}

/// Waits for background write-backs, reaping their completions itself (so
/// it needs no other task to make progress).
struct BgWait {
    inner: Rc<Inner>,
    until: Until,
}

impl Future for BgWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let inner = &self.inner;
        let Some(bg) = &inner.bg else { return Poll::Ready(()) };
        // Register before looking, so that a completion in between wakes us.
        bg.notify(cx.waker());
        inner.reap();
        let b = inner.bgst.borrow();
        let done = match self.until {
            Until::Completed(seen) => b.completed > seen || b.in_flight == 0,
            Until::Quiet(object) => !b.per_object.contains_key(&object),
        };
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Shared access to a cached unit. Derefs to the unit's bytes; hands out
/// the unit's registered memory for an RMA put. Dropping it releases the
/// unit (and may let a waiting writer in).
///
/// An RMA operation started with [`ReadGuard::rma_local`] must complete,
/// and its `Op` be dropped, before the guard is: the operation holds the
/// memory, and memory still held when the unit is freed is retired
/// (counted in `retired_units`) rather than reused.
pub struct ReadGuard {
    inner: Rc<Inner>,
    slot: u32,
    gen: u64,
    object: u64,
    index: u64,
    /// `None` only inside `drop`.
    arc: Option<Arc<SubRegion>>,
}

impl std::fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadGuard").field("object", &self.object).field("unit_index", &self.index).finish()
    }
}

impl ReadGuard {
    fn region(&self) -> &Arc<SubRegion> {
        self.arc.as_ref().expect("guard holds memory until dropped")
    }

    pub fn object(&self) -> u64 {
        self.object
    }

    pub fn unit_index(&self) -> u64 {
        self.index
    }

    /// The object offset of the unit's first byte.
    pub fn object_offset(&self) -> u64 {
        self.index * self.region().len() as u64
    }

    /// The unit's registered memory, bytes `[offset, offset + len)` of the
    /// unit, as the transport's local side of a put. Panics if the range is
    /// not inside the unit (a caller bug: ranges come from `spans`).
    pub fn rma_local(&self, offset: usize, len: usize) -> Local {
        let size = self.region().len();
        assert!(offset.checked_add(len).is_some_and(|e| e <= size), "range {offset}+{len} outside a {size}-byte unit");
        Local::View { view: self.region().clone(), offset, len }
    }
}

impl Deref for ReadGuard {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.region().as_slice()
    }
}

impl Drop for ReadGuard {
    fn drop(&mut self) {
        // Our reference goes first, so the release sees only others'.
        drop(self.arc.take());
        self.inner.release_shared(self.slot, self.gen);
    }
}

/// Exclusive access to a cached unit for writing one range of it.
///
/// The range is written in place: through [`WriteGuard::bytes_mut`] (an
/// inline write) or by an RMA get into [`WriteGuard::rma_local`]. Dropping
/// the guard commits: the range becomes dirty and waiters may enter.
/// [`WriteGuard::commit_stable`] writes the unit through to storage first;
/// [`WriteGuard::abort`] handles a write that failed part-way.
pub struct WriteGuard {
    inner: Rc<Inner>,
    slot: u32,
    gen: u64,
    object: u64,
    index: u64,
    range: Range<usize>,
    /// `None` once released.
    arc: Option<Arc<SubRegion>>,
    fresh: bool,
}

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGuard")
            .field("object", &self.object)
            .field("unit_index", &self.index)
            .field("range", &self.range)
            .finish()
    }
}

impl WriteGuard {
    fn region(&self) -> &Arc<SubRegion> {
        self.arc.as_ref().expect("guard holds memory until released")
    }

    pub fn object(&self) -> u64 {
        self.object
    }

    pub fn unit_index(&self) -> u64 {
        self.index
    }

    /// The object offset of the unit's first byte.
    pub fn object_offset(&self) -> u64 {
        self.index * self.region().len() as u64
    }

    /// The range of the unit this guard writes.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The whole unit's bytes (outside the range: the cached data; inside:
    /// whatever has been written so far).
    pub fn unit_bytes(&self) -> &[u8] {
        self.region().as_slice()
    }

    /// The guard's range of the unit, writable in place (index 0 is unit
    /// offset `range().start`). Fails while an operation started with
    /// [`WriteGuard::rma_local`] still holds the memory.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        let range = self.range.clone();
        let arc = self.arc.as_mut().expect("guard holds memory until released");
        Arc::get_mut(arc).map(|r| &mut r.as_mut_slice()[range]).ok_or(Error::MemoryInFlight)
    }

    /// Bytes `[offset, offset + len)` of the unit as the local side of an
    /// RMA get. Panics if they are not inside the guard's range (bytes
    /// outside it would be written without being marked dirty).
    pub fn rma_local(&self, offset: usize, len: usize) -> Local {
        assert!(
            offset >= self.range.start && offset.checked_add(len).is_some_and(|e| e <= self.range.end),
            "range {offset}+{len} outside the guard's range {:?}",
            self.range
        );
        Local::View { view: self.region().clone(), offset, len }
    }

    /// Where the unit's byte `offset` is for a peer's RMA, and the slab
    /// whose key names it (`Slab::pack_key`): for an io server that
    /// forwards a chain's write, whose successor gets the bytes from this
    /// unit (`dafne_io::forward`). Panics if `offset` is outside the
    /// guard's range, as [`WriteGuard::rma_local`].
    pub fn export(&self, offset: usize) -> (u64, dafne_ucx::Slab) {
        assert!(self.range.contains(&offset), "offset {offset} outside the guard's range {:?}", self.range);
        let view = self.region();
        (view.addr() + offset as u64, view.slab())
    }

    /// Commits and writes the unit through to storage, releases it, and
    /// returns the sync of its object: for a request that asks for
    /// stability. The write-back and the release happen in this call (a
    /// future dropped unpolled leaves the unit written back, not held);
    /// data and a sync are in storage when the future completes with `Ok`.
    /// If the write-back fails the unit stays dirty. The unit is released
    /// before the sync: what the write-back wrote is in the file then, and
    /// the loop serves the unit's readers while the device syncs.
    pub fn commit_stable(self) -> impl Future<Output = Result<()>> + 'static {
        let (inner, object) = (self.inner.clone(), self.object);
        let written = self.commit_through();
        async move {
            written?;
            Inner::sync(&inner, object).await
        }
    }

    /// [`Self::commit_stable`] without the sync: commits, writes the unit
    /// through to storage and releases it. For a request that writes
    /// several units stably: each is written through, then one
    /// [`Unifier::sync`] of the object makes them all durable (a sync per
    /// unit would make the request wait for as many device syncs). If the
    /// write-back fails the unit stays dirty.
    pub fn commit_through(mut self) -> Result<()> {
        let arc = self.arc.take().expect("guard holds memory until released");
        let inner = self.inner.clone();
        inner.st.borrow_mut().mark_dirty(self.slot, self.range.start, self.range.end);
        let written = inner.write_back(self.slot, Some(&arc), Cause::Stable);
        inner.release_exclusive(self.slot, self.gen, arc, Outcome::Keep);
        written
    }

    /// Releases after a write that failed part-way (e.g. the RMA get
    /// failed). A unit that was not filled from storage holds garbage
    /// outside what arrived, so it is dropped; a filled unit keeps what
    /// arrived (each byte old or new, as a partial POSIX write) and the
    /// range is marked dirty.
    pub fn abort(mut self) {
        let arc = self.arc.take().expect("guard holds memory until released");
        let outcome = if self.fresh { Outcome::Discard } else { Outcome::Commit(self.range.clone()) };
        self.inner.release_exclusive(self.slot, self.gen, arc, outcome);
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if let Some(arc) = self.arc.take() {
            self.inner.release_exclusive(self.slot, self.gen, arc, Outcome::Commit(self.range.clone()));
        }
    }
}

/// One unit's share of a byte range: see [`spans`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub unit_index: u64,
    /// Bytes of the unit.
    pub range: Range<usize>,
    /// Offset of `range.start` from the start of the byte range.
    pub buf_offset: u64,
}

/// Splits `len` bytes at object offset `offset` into per-unit spans for
/// units of `unit_size` bytes (for list I/O: call once per (offset, length)
/// pair). Empty if `len` is 0 or the range passes 2^64.
pub fn spans(unit_size: usize, offset: u64, len: u64) -> impl Iterator<Item = Span> {
    let size = unit_size.max(1) as u64;
    let end = if offset.checked_add(len).is_some() { offset + len } else { offset };
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let unit_index = pos / size;
        let start = (pos % size) as usize;
        let n = (size - start as u64).min(end - pos);
        let span = Span { unit_index, range: start..start + n as usize, buf_offset: pos - offset };
        pos += n;
        Some(span)
    })
}
