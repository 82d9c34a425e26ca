//! The cache's bookkeeping: slabs and unit slots, the index, the replacement
//! rings, the sharing rules and the dirty accounting. Everything here runs
//! under one `RefCell` borrow and never calls storage; the caller
//! ([`crate::unifier`]) releases the borrow around every storage call.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::task::Waker;
use std::time::Instant;

use dafne_ucx::{Access, Context, Region, Slab as Registered, SubRegion};

use crate::config::{class_of, FileAdvice, Policy, UnifierConfig, UNIT_SIZES};
use crate::error::{Error, Result};
use crate::ring::{Links, Ring, NIL};
use crate::stats::UnifierStats;

pub(crate) const NCLASSES: usize = UNIT_SIZES.len();

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlabKind {
    /// UCX-allocated memory, registered (one `ucp_mem_map`) at start.
    Ready,
    /// Ordinary memory (a heap buffer, allocated the first time the slab
    /// is carved), registered (one `ucp_mem_map`) when the cache needs it
    /// and, under a pinned bound, deregistered again ("parked") when it is
    /// clean and cold; the buffer and its data stay.
    Raw,
}

/// Page size assumed for alignment: units are read and written with
/// O_DIRECT, which needs 4 KiB-aligned memory.
const PAGE: usize = 4096;

#[derive(Debug)]
pub(crate) struct Slab {
    pub(crate) kind: SlabKind,
    /// The size class it is carved into (`None`: not carved yet).
    pub(crate) class: Option<usize>,
    pub(crate) slots: Vec<u32>,
    /// The slab's one registration, made at its first carve; re-carving
    /// only hands out other views of it. A ready slab keeps it for good; a
    /// raw slab loses it when parked.
    pub(crate) mem: Option<Registered>,
    /// Where the units start in the registered memory: 0 for a ready slab
    /// (UCX's allocation is page-aligned), the distance to the first page
    /// boundary for a raw slab's heap buffer.
    pub(crate) base: usize,
    /// A parked raw slab's buffer (deregistered, data kept).
    pub(crate) parked: Option<Vec<u8>>,
}

/// Where a slot's memory is.
#[derive(Debug)]
pub(crate) enum Mem {
    /// The unit's view of its slab's registered memory. This `Arc` is the
    /// cache's own reference; read guards, write-backs and RMA operations
    /// hold clones.
    Registered(Arc<SubRegion>),
    /// Lent to the one filler or writer that owns the unit exclusively;
    /// the guard gives it back on release.
    Lent,
    /// Given up: the slab was re-carved, or an abandoned RMA operation
    /// still holds the memory (which then lives as long as that operation).
    Gone,
    /// In its slab's parked (deregistered) buffer, at this offset of the
    /// registered range (`Slab::base` included): registered again, with
    /// its data, before anyone uses it.
    Parked { offset: usize },
}

#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) slab: u32,
    pub(crate) class: usize,
    pub(crate) mem: Mem,
    /// Changes whenever the slot takes or drops a unit, so that a waiter
    /// that remembers (slot, gen) can tell its unit is gone.
    pub(crate) gen: u64,
    pub(crate) unit: Option<Unit>,
}

#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) id: u64,
    pub(crate) exclusive: bool,
    pub(crate) waker: Option<Waker>,
}

/// A cached unit: bytes `[index * size, (index + 1) * size)` of `object`.
#[derive(Debug)]
pub(crate) struct Unit {
    pub(crate) object: u64,
    pub(crate) index: u64,
    pub(crate) policy: Policy,
    /// In the index and a ring. A detached unit (invalidated, truncated
    /// away, removed) lives on only until its holders release it.
    pub(crate) attached: bool,
    /// Being read from storage; nobody else may touch it.
    pub(crate) filling: bool,
    /// Shared holders (read guards).
    pub(crate) readers: u32,
    /// An exclusive holder (a write guard).
    pub(crate) writer: bool,
    /// Internal write-backs reading the unit without a guard.
    pub(crate) pins: u32,
    /// Acquisitions waiting their turn, first come first served.
    pub(crate) waiters: VecDeque<Waiter>,
    /// Dirty bytes within the unit, as one covering range `[lo, hi)`.
    pub(crate) dirty: Option<(usize, usize)>,
    /// When the unit became dirty (orders write-behind, oldest first).
    pub(crate) dirty_seq: u64,
    /// CLOCK's reference bit.
    pub(crate) ref_bit: bool,
    /// Filled by a prefetch and not acquired since: its first acquisition
    /// counts as the miss (the prefetch counted none).
    pub(crate) prefetched: bool,
    /// The cache-wide tick of the last acquisition (arbitrates between
    /// policies).
    pub(crate) last_use: u64,
    /// When its last write-back failed (cleared by one that succeeds). See
    /// [`RETRY_FAILED_AFTER`].
    pub(crate) failed_at: Option<std::time::Instant>,
}

/// A unit whose write-back failed (full disk, a file past the backing file
/// system's size limit, a failing device) stays dirty, but for this long
/// it is not handed to the background writer again, written back to make
/// room for another writer, or evicted for another unit: retried at once,
/// it failed again at once (millions of times in 10 s, a core burnt), and
/// every writer of any other file waited on it without a deadline (issue
/// 10, finding 6). Its own object's flush still writes it at every fsync.
pub(crate) const RETRY_FAILED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl Unit {
    /// May not be evicted or re-carved: someone holds it, fills it, writes
    /// it back, or waits for it.
    pub(crate) fn pinned(&self) -> bool {
        self.readers > 0 || self.writer || self.filling || self.pins > 0 || !self.waiters.is_empty()
    }

    /// Dirty, and its last write-back failed less than
    /// [`RETRY_FAILED_AFTER`] ago.
    pub(crate) fn failed_recently(&self) -> bool {
        self.dirty.is_some() && self.failed_at.is_some_and(|t| t.elapsed() < RETRY_FAILED_AFTER)
    }

    /// A shared holder may enter: no writer or filler, and no exclusive
    /// waiter ahead of `me` (a waiting writer holds back later readers, so
    /// readers cannot starve it).
    pub(crate) fn can_share(&self, me: Option<u64>) -> bool {
        if self.writer || self.filling {
            return false;
        }
        for w in &self.waiters {
            if Some(w.id) == me {
                return true;
            }
            if w.exclusive {
                return false;
            }
        }
        true
    }

    /// An exclusive holder may enter: nobody holds or fills the unit, and
    /// `me` is first in line (or, arriving, the line is empty).
    pub(crate) fn can_exclusive(&self, me: Option<u64>) -> bool {
        if self.writer || self.filling || self.readers > 0 || self.pins > 0 {
            return false;
        }
        match me {
            None => self.waiters.is_empty(),
            Some(id) => self.waiters.front().map(|w| w.id) == Some(id),
        }
    }

    /// Wakes the waiters that may now enter: an exclusive one at the front
    /// if the unit is free, else the shared ones before the first exclusive.
    pub(crate) fn wake_eligible(&self) {
        if self.writer || self.filling {
            return;
        }
        for (i, w) in self.waiters.iter().enumerate() {
            if w.exclusive {
                if i == 0 && self.readers == 0 && self.pins == 0 {
                    wake(w);
                }
                return;
            }
            wake(w);
        }
    }

    pub(crate) fn wake_all(&self) {
        self.waiters.iter().for_each(wake);
    }

    pub(crate) fn remove_waiter(&mut self, id: u64) {
        if let Some(i) = self.waiters.iter().position(|w| w.id == id) {
            self.waiters.remove(i);
        }
    }
}

fn wake(w: &Waiter) {
    if let Some(k) = &w.waker {
        k.wake_by_ref();
    }
}

/// What the cache knows of an object.
#[derive(Debug, Default)]
pub(crate) struct Obj {
    pub(crate) advice: FileAdvice,
    /// unit index -> slot.
    pub(crate) units: BTreeMap<u64, u32>,
}

/// The outcome of asking for a unit right away.
#[derive(Debug)]
pub(crate) enum Grant {
    /// Entered: the memory (a clone for a reader, the lent `Arc` for a writer).
    Held { slot: u32, gen: u64, arc: Arc<SubRegion> },
    /// The unit's memory is held by an abandoned operation: retire the slot.
    Leaked(u32),
}

#[derive(Debug)]
pub(crate) struct State {
    slab_size: usize,
    /// `UnifierConfig::max_pinned_bytes`.
    max_pinned: Option<u64>,
    /// Bytes of slabs registered now.
    pub(crate) pinned: u64,
    pub(crate) slabs: Vec<Slab>,
    pub(crate) slots: Vec<Slot>,
    /// Slot numbers of re-carved slabs, reused by the next carve.
    dead: Vec<u32>,
    pub(crate) free: [Vec<u32>; NCLASSES],
    links: Links,
    /// rings[class][policy]
    rings: [[Ring; 2]; NCLASSES],
    pub(crate) objects: HashMap<u64, Obj>,
    /// Objects with non-default advice (bounded by MAX_ADVISED_OBJECTS).
    pub(crate) advised: usize,
    /// dirty_seq -> slot, oldest first.
    pub(crate) dirty_order: BTreeMap<u64, u32>,
    pub(crate) dirty_bytes: u64,
    /// Objects written back since their last sync (flush_all syncs them).
    pub(crate) unsynced: HashSet<u64>,
    pub(crate) units_in_use: u64,
    tick: u64,
    next_dirty_seq: u64,
    next_waiter: u64,
    /// When a failed background write-back was last logged (at most one
    /// warning per `STORAGE_WARN_EVERY`: a full disk fails every unit,
    /// again at every retry; `c.storage_errors` counts them all).
    pub(crate) storage_warned: Option<std::time::Instant>,
    /// Monotonic counters (gauges are filled in by `snapshot`).
    pub(crate) c: UnifierStats,
}

impl State {
    pub(crate) fn new(cfg: &UnifierConfig) -> State {
        let mut slabs = Vec::with_capacity(cfg.ready_slabs + cfg.raw_slabs);
        for kind in std::iter::repeat_n(SlabKind::Ready, cfg.ready_slabs)
            .chain(std::iter::repeat_n(SlabKind::Raw, cfg.raw_slabs))
        {
            slabs.push(Slab { kind, class: None, slots: Vec::new(), mem: None, base: 0, parked: None });
        }
        State {
            slab_size: cfg.slab_size,
            max_pinned: cfg.max_pinned_bytes,
            pinned: 0,
            slabs,
            slots: Vec::new(),
            dead: Vec::new(),
            free: Default::default(),
            links: Links::default(),
            rings: Default::default(),
            objects: HashMap::new(),
            advised: 0,
            dirty_order: BTreeMap::new(),
            dirty_bytes: 0,
            unsynced: HashSet::new(),
            storage_warned: None,
            units_in_use: 0,
            tick: 0,
            next_dirty_seq: 0,
            next_waiter: 0,
            c: UnifierStats::default(),
        }
    }

    pub(crate) fn unit(&self, s: u32) -> &Unit {
        self.slots[s as usize].unit.as_ref().expect("slot holds a unit")
    }

    pub(crate) fn unit_mut(&mut self, s: u32) -> &mut Unit {
        self.slots[s as usize].unit.as_mut().expect("slot holds a unit")
    }

    /// The unit size, its class and the policy for `object`.
    pub(crate) fn advice_for(&self, object: u64, cfg: &UnifierConfig) -> (usize, usize, Policy) {
        let a = self.objects.get(&object).map(|o| o.advice).unwrap_or_default();
        let size = a.unit_size.unwrap_or(cfg.default_unit);
        let class = class_of(size).expect("advice and config hold size classes");
        (size, class, a.policy.unwrap_or(cfg.default_policy))
    }

    pub(crate) fn lookup(&self, object: u64, index: u64) -> Option<u32> {
        self.objects.get(&object)?.units.get(&index).copied()
    }

    // ---- memory: carving and registration ------------------------------

    fn new_slot(&mut self, slab: usize, class: usize, mem: Mem) -> u32 {
        let slot = Slot { slab: slab as u32, class, mem, gen: 0, unit: None };
        let s = match self.dead.pop() {
            Some(s) => {
                let gen = self.slots[s as usize].gen + 1;
                self.slots[s as usize] = Slot { gen, ..slot };
                s
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        // MAX_CACHE_BYTES / 4 KiB = 2^28 live slots, far below the nil link.
        assert!(s < NIL, "slot numbers exhausted");
        self.links.grow(self.slots.len());
        s
    }

    /// Carves `slab` into units of `class`. Every slot of the slab must be
    /// empty. The first carve registers the whole slab once (ready slabs at
    /// start, raw slabs on first use; both UCX-allocated, page-aligned for
    /// O_DIRECT); a
    /// re-carve registers nothing: the old units' views go back to the slab
    /// and new views of the new size are taken from it. A range that an
    /// abandoned operation still holds (a retired unit's view) is not free,
    /// so no new unit is made over it: by construction, no two live units
    /// share a byte (see `dafne_ucx::Slab`).
    pub(crate) fn carve(&mut self, ctx: &Context, slab: usize, class: usize, at_start: bool) -> Result<()> {
        let old = std::mem::take(&mut self.slabs[slab].slots);
        if let Some(oc) = self.slabs[slab].class {
            let slots = &self.slots;
            self.free[oc].retain(|&s| slots[s as usize].slab as usize != slab);
        }
        for s in old {
            let slot = &mut self.slots[s as usize];
            assert!(slot.unit.is_none(), "carving a slab with a live unit");
            slot.mem = Mem::Gone; // our view goes back to the slab (unless an operation holds it)
            slot.gen += 1;
            self.dead.push(s);
        }
        let mem = match &self.slabs[slab].mem {
            Some(m) => m.clone(),
            None => {
                if !self.make_room_to_pin(slab) {
                    // Its old units are gone; it is a slab never carved again.
                    self.slabs[slab].class = None;
                    self.c.no_space += 1;
                    return Err(Error::NoSpace { unit_size: UNIT_SIZES[class], pinned: self.pinned_units() });
                }
                let m = self.register(ctx, slab, at_start)?;
                self.slabs[slab].mem = Some(m.clone());
                m
            }
        };
        let base = self.slabs[slab].base;
        let size = UNIT_SIZES[class];
        self.slabs[slab].class = Some(class);
        if !at_start {
            self.c.carves += 1;
        }
        tracing::debug!(slab, unit_size = size, "carving slab");
        // slab_size is a multiple of 64 KiB, so of every class: no tail.
        for i in 0..self.slab_size / size {
            let view = match mem.view(base + i * size, size) {
                Ok(v) => v,
                // Part of the range is still held by an abandoned operation.
                Err(dafne_ucx::Error::ViewTaken { .. }) => continue,
                Err(source) => return Err(Error::Register { bytes: size, source }),
            };
            let s = self.new_slot(slab, class, Mem::Registered(Arc::new(view)));
            self.slabs[slab].slots.push(s);
            self.free[class].push(s);
        }
        Ok(())
    }

    /// Makes new units of `class` over ranges of its slabs that abandoned
    /// operations held at carve or retire time and have let go of since.
    /// Returns whether any unit was made. (Rare: only a dead peer abandons
    /// an operation; called before giving up with `NoSpace`.)
    pub(crate) fn reclaim(&mut self, class: usize) -> bool {
        let size = UNIT_SIZES[class];
        let mut made = false;
        for slab in 0..self.slabs.len() {
            let Some(mem) = self.slabs[slab].mem.clone() else { continue };
            if self.slabs[slab].class != Some(class) {
                continue;
            }
            // Retired slots are dead weight once their view is gone.
            let slots = std::mem::take(&mut self.slabs[slab].slots);
            for s in slots {
                if matches!(self.slots[s as usize].mem, Mem::Gone) {
                    self.slots[s as usize].gen += 1;
                    self.dead.push(s);
                } else {
                    self.slabs[slab].slots.push(s);
                }
            }
            if self.slabs[slab].slots.len() == self.slab_size / size {
                continue;
            }
            let base = self.slabs[slab].base;
            for i in 0..self.slab_size / size {
                // Ranges of live units (and of views still held) are taken.
                if let Ok(view) = mem.view(base + i * size, size) {
                    let s = self.new_slot(slab, class, Mem::Registered(Arc::new(view)));
                    self.slabs[slab].slots.push(s);
                    self.free[class].push(s);
                    made = true;
                }
            }
        }
        made
    }

    /// Registers one slab: a ready one at start, UCX's allocation
    /// (page-aligned, one mmap'ed or shared-memory segment); a raw one when
    /// the cache needs it, its heap buffer (allocated now the first time,
    /// else the parked one with its data). A heap buffer starts 16 bytes
    /// past a page boundary, and the io server reads and writes units with
    /// O_DIRECT, which needs 4 KiB-aligned memory: the buffer is a page
    /// longer and the units start at its first page boundary (`base`).
    fn register(&mut self, ctx: &Context, slab: usize, at_start: bool) -> Result<Registered> {
        let size = self.slab_size;
        let t = Instant::now();
        let r = match self.slabs[slab].kind {
            // Readable by peers with its key: an io server forwarding a
            // chain's write hands the key to the next replica, which gets
            // the bytes from the unit (`WriteGuard::export`). No key is
            // given to anyone else.
            SlabKind::Ready => Region::allocate(ctx, size, Access::RemoteRead),
            SlabKind::Raw => {
                let buf = self.slabs[slab].parked.take().unwrap_or_else(|| vec![0u8; size + PAGE]);
                let addr = buf.as_ptr() as usize;
                self.slabs[slab].base = addr.next_multiple_of(PAGE) - addr;
                Region::register(ctx, buf, Access::Local)
            }
        }
        .and_then(Registered::new)
        .map_err(|source| Error::Register { bytes: size, source })?;
        let ns = t.elapsed().as_nanos() as u64;
        self.pinned += size as u64;
        self.c.pinned_peak = self.c.pinned_peak.max(self.pinned);
        if at_start {
            self.c.startup_registrations += 1;
            self.c.startup_registration_ns += ns;
        } else {
            self.c.registrations += 1;
            self.c.registration_ns += ns;
            self.c.registered_bytes += size as u64;
        }
        Ok(r)
    }

    /// Whether registering slab `except` (not registered now) keeps the
    /// registered bytes within `max_pinned_bytes`, parking cold raw slabs
    /// first where it would not. False if not enough can be parked now
    /// (every other registered raw slab has a unit in use or dirty).
    pub(crate) fn make_room_to_pin(&mut self, except: usize) -> bool {
        let Some(max) = self.max_pinned else { return true };
        while self.pinned + self.slab_size as u64 > max {
            let Some(victim) = self.coldest_parkable(except) else { return false };
            if !self.park(victim) {
                return false;
            }
        }
        true
    }

    /// The registered raw slab (other than `except`) whose units are all
    /// clean, attached and unused, with the oldest most recent use.
    fn coldest_parkable(&self, except: usize) -> Option<usize> {
        self.coldest_raw(except, false)
    }

    /// A dirty unit whose write-back would let a registered raw slab (other
    /// than `except`) be parked: in the coldest slab whose units are all
    /// attached and unused, clean or dirty. For when nothing can be parked
    /// as it is.
    pub(crate) fn dirty_blocking_park(&self, except: usize) -> Option<u32> {
        let slab = self.coldest_raw(except, true)?;
        self.slabs[slab]
            .slots
            .iter()
            .copied()
            .find(|&s| self.slots[s as usize].unit.as_ref().is_some_and(|u| u.dirty.is_some()))
    }

    fn coldest_raw(&self, except: usize, dirty_ok: bool) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (i, sl) in self.slabs.iter().enumerate() {
            if i == except || sl.kind != SlabKind::Raw || sl.mem.is_none() {
                continue;
            }
            let mut newest = 0u64;
            let mut ok = true;
            for &s in &sl.slots {
                let slot = &self.slots[s as usize];
                let unique = matches!(&slot.mem, Mem::Registered(a) if Arc::strong_count(a) == 1);
                let idle = slot.unit.as_ref().is_none_or(|u| {
                    u.attached && !u.pinned() && (u.dirty.is_none() || dirty_ok && !u.failed_recently())
                });
                if !unique || !idle {
                    ok = false;
                    break;
                }
                if let Some(u) = &slot.unit {
                    newest = newest.max(u.last_use);
                }
            }
            let dirty =
                sl.slots.iter().any(|&s| self.slots[s as usize].unit.as_ref().is_some_and(|u| u.dirty.is_some()));
            if ok && (!dirty_ok || dirty) && best.is_none_or(|(b, _)| newest < b) {
                best = Some((newest, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Deregisters raw slab `slab` and keeps its buffer, data and units
    /// ([`Mem::Parked`]); see [`State::coldest_parkable`] for when it may.
    /// False (nothing changed) if the registration turns out to be held
    /// elsewhere.
    fn park(&mut self, slab: usize) -> bool {
        let t = Instant::now();
        for &s in &self.slabs[slab].slots {
            let slot = &mut self.slots[s as usize];
            if let Mem::Registered(arc) = &slot.mem {
                let offset = arc.slab_offset();
                slot.mem = Mem::Parked { offset }; // the view goes back to the slab
            }
        }
        let Some(reg) = self.slabs[slab].mem.take() else { return false };
        match reg.into_region() {
            Ok(region) => {
                self.slabs[slab].parked = region.into_vec();
                self.pinned -= self.slab_size as u64;
                self.c.deregistrations += 1;
                self.c.deregistration_ns += t.elapsed().as_nanos() as u64;
                tracing::debug!(slab, "parked a raw slab (deregistered, data kept)");
                true
            }
            Err(reg) => {
                self.views_again(slab, &reg);
                self.slabs[slab].mem = Some(reg);
                false
            }
        }
    }

    /// Gives the parked slots of `slab` their views of `reg` again.
    fn views_again(&mut self, slab: usize, reg: &Registered) {
        for &s in &self.slabs[slab].slots {
            let slot = &mut self.slots[s as usize];
            if let Mem::Parked { offset } = slot.mem {
                let view = reg.view(offset, UNIT_SIZES[slot.class]).expect("a parked slot's range is free");
                slot.mem = Mem::Registered(Arc::new(view));
            }
        }
    }

    /// Makes slot `s`'s memory registered: registers its slab again if it
    /// is parked (parking colder ones to stay within the bound). False if
    /// there is no room to now.
    pub(crate) fn ensure_registered(&mut self, ctx: &Context, s: u32) -> Result<bool> {
        let slab = self.slots[s as usize].slab as usize;
        if self.slabs[slab].mem.is_some() {
            return Ok(true);
        }
        if !self.make_room_to_pin(slab) {
            return Ok(false);
        }
        let reg = self.register(ctx, slab, false)?;
        self.views_again(slab, &reg);
        self.slabs[slab].mem = Some(reg);
        Ok(true)
    }

    /// A slab of another class with no unit in it (re-carving it evicts nothing).
    pub(crate) fn idle_slab(&self, class: usize) -> Option<usize> {
        let empty = |sl: &Slab| sl.slots.iter().all(|&s| self.slots[s as usize].unit.is_none());
        self.slabs.iter().position(|sl| sl.class.is_some_and(|c| c != class) && empty(sl))
    }

    /// A slab of another class whose units can all be evicted, the one used
    /// least recently (its most recent use is the oldest).
    pub(crate) fn coldest_evictable_slab(&self, class: usize) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (i, sl) in self.slabs.iter().enumerate() {
            if sl.class.is_none_or(|c| c == class) {
                continue;
            }
            let mut newest = 0u64;
            let mut ok = true;
            for &s in &sl.slots {
                if let Some(u) = &self.slots[s as usize].unit {
                    if u.pinned() || !u.attached || u.failed_recently() {
                        ok = false;
                        break;
                    }
                    newest = newest.max(u.last_use);
                }
            }
            if ok && best.is_none_or(|(b, _)| newest < b) {
                best = Some((newest, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// Units that cannot be evicted now (for `NoSpace`).
    pub(crate) fn pinned_units(&self) -> usize {
        self.slots.iter().filter(|s| s.unit.as_ref().is_some_and(|u| u.pinned() || !u.attached)).count()
    }

    // ---- units: attach, detach, free ------------------------------------

    /// Puts a new unit into free slot `s` and the index. The filler or
    /// writer that creates it holds it exclusively (`filling` or `writer`).
    pub(crate) fn attach(&mut self, s: u32, object: u64, index: u64, policy: Policy, filling: bool) {
        self.tick += 1;
        let class = self.slots[s as usize].class;
        let slot = &mut self.slots[s as usize];
        assert!(slot.unit.is_none(), "attaching to a busy slot");
        slot.gen += 1;
        slot.unit = Some(Unit {
            object,
            index,
            policy,
            attached: true,
            filling,
            readers: 0,
            writer: !filling,
            pins: 0,
            waiters: VecDeque::new(),
            dirty: None,
            dirty_seq: 0,
            ref_bit: true,
            prefetched: false,
            last_use: self.tick,
            failed_at: None,
        });
        self.units_in_use += 1;
        let prev = self.objects.entry(object).or_default().units.insert(index, s);
        assert!(prev.is_none(), "unit ({object}, {index}) cached twice");
        self.ring_insert(s, class, policy);
    }

    fn ring_insert(&mut self, s: u32, class: usize, policy: Policy) {
        let ring = &mut self.rings[class][policy.slot()];
        match policy {
            Policy::Lru => self.links.push_back(ring, s),
            Policy::Clock => self.links.insert_behind_hand(ring, s),
        }
    }

    fn ring_remove(&mut self, s: u32) {
        let class = self.slots[s as usize].class;
        let policy = self.unit(s).policy;
        self.links.remove(&mut self.rings[class][policy.slot()], s);
    }

    /// Moves a cached unit to another policy's ring.
    pub(crate) fn set_unit_policy(&mut self, s: u32, policy: Policy) {
        if self.unit(s).policy != policy {
            self.ring_remove(s);
            self.unit_mut(s).policy = policy;
            let class = self.slots[s as usize].class;
            self.ring_insert(s, class, policy);
        }
    }

    /// Records an acquisition: LRU moves the unit to the back, CLOCK sets
    /// its reference bit; both stamp the cache-wide tick.
    pub(crate) fn touch(&mut self, s: u32) {
        self.tick += 1;
        let tick = self.tick;
        let class = self.slots[s as usize].class;
        let u = self.unit_mut(s);
        u.last_use = tick;
        u.ref_bit = true;
        if u.policy == Policy::Lru {
            self.links.move_back(&mut self.rings[class][0], s);
        }
    }

    /// Takes the unit out of the index (waiters restart their lookup). With
    /// `discard`, its dirty bytes are dropped (the object was removed or
    /// truncated). It is freed now if nobody holds it, else at the last
    /// release.
    pub(crate) fn detach(&mut self, s: u32, discard: bool) {
        if self.unit(s).attached {
            self.ring_remove(s);
            let (object, index) = (self.unit(s).object, self.unit(s).index);
            if let Some(o) = self.objects.get_mut(&object) {
                o.units.remove(&index);
                if o.units.is_empty() && o.advice.is_default() {
                    self.objects.remove(&object);
                }
            }
            self.unit_mut(s).attached = false;
        }
        if discard {
            self.clear_dirty(s);
        }
        self.unit(s).wake_all();
        self.free_if_idle(s);
    }

    /// Frees a detached unit nobody holds any more.
    pub(crate) fn free_if_idle(&mut self, s: u32) {
        let u = self.unit(s);
        if !u.attached && u.readers == 0 && !u.writer && !u.filling && u.pins == 0 {
            debug_assert!(u.dirty.is_none() || !u.attached);
            self.clear_dirty(s);
            let slot = &mut self.slots[s as usize];
            slot.unit = None;
            slot.gen += 1;
            self.units_in_use -= 1;
            match &slot.mem {
                // Another reference now can only be an RMA operation that
                // was abandoned before it completed: UCX may still touch the
                // memory, so the slot is never reused. The operation keeps
                // the region alive (and registered) as long as it needs.
                Mem::Registered(arc) if Arc::strong_count(arc) > 1 => {
                    tracing::warn!(slot = s, "unit memory still held by an abandoned RMA operation; retiring it");
                    slot.mem = Mem::Gone;
                    self.c.retired_units += 1;
                }
                Mem::Registered(_) | Mem::Parked { .. } => self.free[slot.class].push(s),
                Mem::Gone => {}
                Mem::Lent => unreachable!("freeing a unit whose memory is lent"),
            }
        }
    }

    /// Evicts an unpinned, clean, attached unit.
    pub(crate) fn evict(&mut self, s: u32) {
        debug_assert!(!self.unit(s).pinned() && self.unit(s).dirty.is_none());
        self.c.evictions += 1;
        self.detach(s, false);
    }

    /// The victim for a unit of `class`: each policy nominates one of its
    /// own unpinned units (LRU its least recently used, CLOCK the first its
    /// hand finds with a clear bit), and the nominee used longer ago wins.
    pub(crate) fn victim(&mut self, class: usize) -> Option<u32> {
        let lru = {
            let ring = &self.rings[class][Policy::Lru.slot()];
            let mut s = ring.head;
            let mut found = None;
            for _ in 0..ring.len {
                if !self.unit(s).pinned() && !self.unit(s).failed_recently() {
                    found = Some(s);
                    break;
                }
                s = self.links.next(s);
            }
            found
        };
        let clock = {
            // Two laps: the first may only clear bits.
            let steps = 2 * self.rings[class][Policy::Clock.slot()].len;
            let mut found = None;
            for _ in 0..steps {
                let s = self.rings[class][Policy::Clock.slot()].hand;
                let next = self.links.next(s);
                let u = self.slots[s as usize].unit.as_mut().expect("ring holds units");
                if u.pinned() || u.failed_recently() {
                    self.rings[class][Policy::Clock.slot()].hand = next;
                } else if u.ref_bit {
                    u.ref_bit = false;
                    self.rings[class][Policy::Clock.slot()].hand = next;
                } else {
                    found = Some(s);
                    break;
                }
            }
            found
        };
        match (lru, clock) {
            (Some(a), Some(b)) => Some(if self.unit(a).last_use <= self.unit(b).last_use { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    // ---- sharing ---------------------------------------------------------

    pub(crate) fn enqueue(&mut self, s: u32, exclusive: bool) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.unit_mut(s).waiters.push_back(Waiter { id, exclusive, waker: None });
        id
    }

    pub(crate) fn grant_shared(&mut self, s: u32) -> Grant {
        let slot = &mut self.slots[s as usize];
        let Mem::Registered(arc) = &slot.mem else { unreachable!("a shareable unit's memory is registered") };
        let arc = arc.clone();
        slot.unit.as_mut().expect("unit").readers += 1;
        Grant::Held { slot: s, gen: slot.gen, arc }
    }

    /// Lends the unit's memory to an exclusive holder. Nobody else holds it,
    /// so the cache's `Arc` must be the only one; if it is not, an
    /// abandoned operation holds it and the slot must be retired.
    pub(crate) fn grant_exclusive(&mut self, s: u32) -> Grant {
        let slot = &mut self.slots[s as usize];
        let arc = match std::mem::replace(&mut slot.mem, Mem::Lent) {
            Mem::Registered(arc) => arc,
            other => unreachable!("an unheld unit's memory is registered, found {other:?}"),
        };
        if Arc::strong_count(&arc) != 1 {
            slot.mem = Mem::Registered(arc);
            return Grant::Leaked(s);
        }
        slot.unit.as_mut().expect("unit").writer = true;
        Grant::Held { slot: s, gen: slot.gen, arc }
    }

    // ---- dirty accounting ------------------------------------------------

    /// Adds `[lo, hi)` to the unit's dirty range (kept as one covering range).
    pub(crate) fn mark_dirty(&mut self, s: u32, lo: usize, hi: usize) {
        let u = self.slots[s as usize].unit.as_mut().expect("unit");
        if !u.attached || lo >= hi {
            return;
        }
        match u.dirty {
            Some((a, b)) => {
                let (na, nb) = (a.min(lo), b.max(hi));
                self.dirty_bytes += ((nb - na) - (b - a)) as u64;
                u.dirty = Some((na, nb));
            }
            None => {
                self.next_dirty_seq += 1;
                u.dirty = Some((lo, hi));
                u.dirty_seq = self.next_dirty_seq;
                self.dirty_bytes += (hi - lo) as u64;
                self.dirty_order.insert(self.next_dirty_seq, s);
            }
        }
    }

    pub(crate) fn clear_dirty(&mut self, s: u32) {
        let u = self.slots[s as usize].unit.as_mut().expect("unit");
        u.failed_at = None;
        if let Some((lo, hi)) = u.dirty.take() {
            self.dirty_bytes -= (hi - lo) as u64;
            self.dirty_order.remove(&u.dirty_seq);
        }
    }

    /// Keeps only the dirty bytes below `cut` (a truncate inside the unit).
    pub(crate) fn clip_dirty(&mut self, s: u32, cut: usize) {
        match self.unit(s).dirty {
            Some((lo, _)) if lo >= cut => self.clear_dirty(s),
            Some((lo, hi)) if hi > cut => {
                self.unit_mut(s).dirty = Some((lo, cut));
                self.dirty_bytes -= (hi - cut) as u64;
            }
            _ => {}
        }
    }

    /// Removes `[lo, hi)` (bytes just zeroed, whose storage is punched)
    /// from the unit's dirty range where that leaves one range: all of it,
    /// or its head or its tail. A range strictly inside stays dirty (its
    /// zeros are written back).
    pub(crate) fn trim_dirty(&mut self, s: u32, lo: usize, hi: usize) {
        match self.unit(s).dirty {
            Some((a, b)) if lo <= a && b <= hi => self.clear_dirty(s),
            Some((a, b)) if lo <= a && a < hi => {
                self.unit_mut(s).dirty = Some((hi, b));
                self.dirty_bytes -= (hi - a) as u64;
            }
            Some((a, b)) if lo < b && b <= hi => {
                self.unit_mut(s).dirty = Some((a, lo));
                self.dirty_bytes -= (b - lo) as u64;
            }
            _ => {}
        }
    }

    /// The oldest dirty unit a write-back can read now (not lent to a writer).
    pub(crate) fn oldest_writable_back(&self) -> Option<u32> {
        self.dirty_order
            .values()
            .copied()
            .find(|&s| matches!(self.slots[s as usize].mem, Mem::Registered(_)) && !self.unit(s).failed_recently())
    }

    pub(crate) fn snapshot(&self) -> UnifierStats {
        let mut c = self.c;
        c.units_in_use = self.units_in_use;
        c.units_referenced =
            self.slots.iter().filter(|s| s.unit.as_ref().is_some_and(|u| u.pinned() || !u.attached)).count() as u64;
        c.dirty_units = self.dirty_order.len() as u64;
        c.dirty_bytes = self.dirty_bytes;
        c.unit_slots = self
            .slabs
            .iter()
            .flat_map(|sl| &sl.slots)
            .filter(|&&s| !matches!(self.slots[s as usize].mem, Mem::Gone))
            .count() as u64;
        for slot in &self.slots {
            if let Some(u) = slot.unit.as_ref().filter(|u| u.attached) {
                c.units_by_class[slot.class] += 1;
                if u.policy == Policy::Clock {
                    c.clock_units += 1;
                }
            }
        }
        c.pinned_bytes = self.pinned;
        c.parked_units =
            self.slots.iter().filter(|s| s.unit.is_some() && matches!(s.mem, Mem::Parked { .. })).count() as u64;
        c
    }
}
