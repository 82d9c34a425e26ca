//! Read-ahead: per open file, sequential reads are answered from whole
//! stripe units fetched before they were asked for.
//!
//! # Why
//! A sequential reader through a mount (`cat`, `cp`, fio's `psync` rows)
//! asks for one block at a time and waits for each: without read-ahead
//! every block costs a round trip to one io server while the other servers
//! of the stripe idle. Here each open file ([`Stream`]) watches its reads;
//! once two in a row are contiguous it keeps a window of whole units ahead
//! of the reader in flight, spread over every server of the stripe (a unit
//! is one stripe unit, or 1 MiB of it when units are larger), so later
//! reads find their bytes already in client memory or on their way.
//!
//! # Memory
//! All read-ahead buffers of a client are one registered [`Slab`] of
//! [`ReadAheadConfig::budget`] bytes, registered once when the read-ahead
//! is made (nothing is registered on the data path), carved into
//! [`UNIT_MAX`]-byte slots. A unit in flight or ready holds one slot as a
//! [`SubRegion`]; the operation in flight holds it too, so a slot returns
//! only when no put of the servers can still reach it. When every slot is
//! taken, a stream posts fewer units (counted: `posts_refused`): the bound
//! is structural, and the peak is counted (`peak_bytes`). A read that fails
//! keeps its slot out of use for [`DataClient::failed_request_hold`] (a
//! late put may still come).
//!
//! Arithmetic of the defaults: a window of [`DEFAULT_WINDOW`] (8 MiB) is
//! two full stripes of the default layout (4 servers × 1 MiB units), so
//! every server of the stripe has two units in flight; the budget of
//! [`DEFAULT_BUDGET`] (64 MiB) holds full windows (8 units, plus the unit
//! behind the reader) for 7 files read at once, enough for fio's 4-job
//! rows and a few more.
//!
//! # Answers without a copy
//! A read inside one unit is answered with a slice of that unit's slot
//! ([`Hit::single`]): a FUSE reply is written straight from it. A read that
//! spans two units is gathered into the caller's buffer, one copy, counted
//! (`bytes_copied`).
//!
//! # Consistency
//! Each stream follows the file's [`Changes`], shared by every stream of
//! the same file in one client (the FUSE core keeps one per open inode).
//! The file's own writes and truncates are recorded there (a new version
//! and the byte range changed: a write's range, or everything from a
//! truncation's new size) once they are done on the servers; a stream that
//! sees a new version drops the units overlapping the changed ranges (they
//! may hold bytes from before the change) before it answers anything, or
//! its whole window when more changes came than the log keeps
//! ([`CHANGE_LOG`]). A unit posted before the change was recorded is dropped
//! too, so an answer is never older than a write that completed before the
//! read was asked. Only the overlapping units go, so a file read and
//! written in the same pass (fio's `--rw=rw`) loses one unit per write, not
//! its window. A read of a unit dropped this way goes to the servers.
//! Other clients' writes are seen at the next open (close-to-open): a
//! stream lives as long as its open file.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dafne_proto::{Errno, Layout};
use dafne_transport::{Access, Region, Slab, SubRegion};

use crate::cq::CompletionQueue;
use crate::data::DataClient;
use crate::OpenFile;

/// Largest read-ahead unit: one slot of the slab.
pub const UNIT_MAX: usize = 1 << 20;
/// Default bytes kept ahead of one sequential reader.
pub const DEFAULT_WINDOW: usize = 8 << 20;
/// Default registered memory for all read-ahead of one client.
pub const DEFAULT_BUDGET: usize = 64 << 20;
/// Contiguous reads in a row that start read-ahead: a file read once from
/// the start in one request (a small file) never triggers it.
pub const TRIGGER: u32 = 2;
/// Units kept behind the reader's current one: reads a multi-threaded
/// mount delivers slightly out of order still find them.
pub const KEEP_BEHIND: u64 = 1;
/// Changes of a file remembered with their ranges; a stream further behind
/// drops its whole window.
pub const CHANGE_LOG: usize = 32;

/// The changes of one file's bytes made through this client (module docs,
/// "Consistency"): a version, and the ranges of the latest changes.
#[derive(Debug, Default)]
pub struct Changes {
    /// The version, readable without the lock (the common case: nothing
    /// changed since a stream last looked).
    version: AtomicU64,
    /// (version, start, end) of the latest changes, oldest first.
    log: Mutex<VecDeque<(u64, u64, u64)>>,
}

impl Changes {
    /// Bytes `[start, end)` changed (call once the servers have them).
    pub fn changed(&self, start: u64, end: u64) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let v = self.version.load(Ordering::Relaxed) + 1;
        if log.len() == CHANGE_LOG {
            log.pop_front();
        }
        log.push_back((v, start, end));
        self.version.store(v, Ordering::Release);
    }

    /// The version now.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The version now and the ranges changed since version `seen`
    /// (`None`: some of them are no longer in the log).
    fn since(&self, seen: u64) -> (u64, Option<Vec<(u64, u64)>>) {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.version.load(Ordering::Relaxed);
        if now == seen {
            return (now, Some(Vec::new()));
        }
        let complete = log.front().is_some_and(|&(v, _, _)| v <= seen + 1);
        let ranges = complete.then(|| log.iter().filter(|&&(v, _, _)| v > seen).map(|&(_, s, e)| (s, e)).collect());
        (now, ranges)
    }
}

/// Read-ahead settings of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAheadConfig {
    /// Registered bytes for all streams together (rounded down to whole
    /// [`UNIT_MAX`] slots; at least one).
    pub budget: usize,
    /// Bytes one stream keeps ahead of its reader (at least one unit per
    /// server of the file's stripe).
    pub window: usize,
}

impl Default for ReadAheadConfig {
    fn default() -> Self {
        ReadAheadConfig { budget: DEFAULT_BUDGET, window: DEFAULT_WINDOW }
    }
}

/// Why read-ahead could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadAheadError {
    #[error("read-ahead needs a connection to the io servers (none configured)")]
    NoServers,
    #[error("read-ahead budget of {budget} bytes is less than one {UNIT_MAX}-byte unit")]
    TooSmall { budget: usize },
    #[error("registering {bytes} bytes of read-ahead memory: {source}")]
    Register { bytes: usize, source: dafne_ucx::Error },
}

/// Read-ahead counters of a client.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadAheadStats {
    /// Reads answered from read-ahead units.
    pub hits: u64,
    /// Reads that found no unit and went to the servers themselves.
    pub misses: u64,
    /// Hits that waited for their unit to arrive.
    pub waits: u64,
    /// Bytes answered from units.
    pub bytes_hit: u64,
    /// Bytes fetched ahead.
    pub bytes_prefetched: u64,
    /// Bytes fetched ahead and dropped without being read (passed over,
    /// invalidated, or left when the file closed).
    pub bytes_wasted: u64,
    /// Bytes gathered from two units into a caller's buffer (the only copy
    /// read-ahead makes).
    pub bytes_copied: u64,
    /// Windows dropped because the file changed.
    pub invalidations: u64,
    /// Units not posted because every slot was taken.
    pub posts_refused: u64,
    /// Most slot bytes in use at once.
    pub peak_bytes: u64,
    /// The registered bytes (the bound on `peak_bytes`).
    pub budget_bytes: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    waits: AtomicU64,
    bytes_hit: AtomicU64,
    bytes_prefetched: AtomicU64,
    bytes_wasted: AtomicU64,
    bytes_copied: AtomicU64,
    invalidations: AtomicU64,
    posts_refused: AtomicU64,
    peak_bytes: AtomicU64,
}

/// The slab's slots.
struct Slots {
    /// Where the next search for a free slot starts.
    cursor: usize,
    /// Slots of failed reads, kept out of use until the time given.
    quarantine: VecDeque<(Instant, Arc<SubRegion>)>,
}

struct Inner {
    data: DataClient,
    slab: Slab,
    key: Vec<u8>,
    slots: usize,
    window: usize,
    cq: CompletionQueue,
    free: Mutex<Slots>,
    hold: Duration,
    c: Counters,
}

impl Inner {
    fn free(&self) -> MutexGuard<'_, Slots> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A free slot, or `None` when all are taken.
    fn take_slot(&self) -> Option<Arc<SubRegion>> {
        let mut s = self.free();
        let now = Instant::now();
        while s.quarantine.front().is_some_and(|(until, _)| *until <= now) {
            s.quarantine.pop_front();
        }
        for k in 0..self.slots {
            let i = (s.cursor + k) % self.slots;
            if let Ok(v) = self.slab.view(i * UNIT_MAX, UNIT_MAX) {
                s.cursor = (i + 1) % self.slots;
                let in_use = (self.slab.views() * UNIT_MAX) as u64;
                self.c.peak_bytes.fetch_max(in_use, Ordering::Relaxed);
                return Some(Arc::new(v));
            }
        }
        None
    }

    fn quarantine(&self, view: Arc<SubRegion>) {
        self.free().quarantine.push_back((Instant::now() + self.hold, view));
    }
}

/// Read-ahead for one client: the registered slots and the driver that
/// runs prefetches. Cheap to clone.
#[derive(Clone)]
pub struct ReadAhead {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead").field("slots", &self.inner.slots).field("window", &self.inner.window).finish()
    }
}

impl ReadAhead {
    /// Registers the budget now (one slab) and starts the prefetch driver
    /// (a completion queue of its own).
    pub fn new(data: &DataClient, config: ReadAheadConfig) -> Result<ReadAhead, ReadAheadError> {
        let slots = config.budget / UNIT_MAX;
        if slots == 0 {
            return Err(ReadAheadError::TooSmall { budget: config.budget });
        }
        let bytes = slots * UNIT_MAX;
        let ctx = data.context().ok_or(ReadAheadError::NoServers)?;
        let region = Region::allocate(ctx, bytes, Access::RemoteReadWrite)
            .map_err(|source| ReadAheadError::Register { bytes, source })?;
        let slab = Slab::new(region).map_err(|source| ReadAheadError::Register { bytes, source })?;
        let key = slab.pack_key().map_err(|source| ReadAheadError::Register { bytes, source })?;
        Ok(ReadAhead {
            inner: Arc::new(Inner {
                data: data.clone(),
                slab,
                key,
                slots,
                window: config.window,
                cq: CompletionQueue::new(),
                free: Mutex::new(Slots { cursor: 0, quarantine: VecDeque::new() }),
                hold: data.failed_request_hold(),
                c: Counters::default(),
            }),
        })
    }

    /// A stream for one open file; `changes` are the file's, shared with
    /// every other stream of the file (module docs).
    pub fn stream(&self, changes: Arc<Changes>) -> Stream {
        Stream { ra: self.inner.clone(), changes, state: Mutex::new(StreamState::default()) }
    }

    pub fn stats(&self) -> ReadAheadStats {
        let c = &self.inner.c;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReadAheadStats {
            hits: l(&c.hits),
            misses: l(&c.misses),
            waits: l(&c.waits),
            bytes_hit: l(&c.bytes_hit),
            bytes_prefetched: l(&c.bytes_prefetched),
            bytes_wasted: l(&c.bytes_wasted),
            bytes_copied: l(&c.bytes_copied),
            invalidations: l(&c.invalidations),
            posts_refused: l(&c.posts_refused),
            peak_bytes: l(&c.peak_bytes),
            budget_bytes: (self.inner.slots * UNIT_MAX) as u64,
        }
    }
}

/// The read-ahead unit and window depth (in units) for a layout: units are
/// whole stripe units (1 MiB pieces of larger ones, several small ones
/// together up to 1 MiB); the window is at least one unit per server of
/// the stripe.
pub fn geometry(layout: &Layout, window: usize) -> (u64, u64) {
    let su = (layout.stripe_unit as u64).max(1);
    let max = UNIT_MAX as u64;
    let unit = if su >= max { max } else { (max / su) * su };
    let stripe = su.saturating_mul(layout.stripe_count.max(1) as u64);
    let depth = (window as u64).max(stripe).div_ceil(unit).max(1);
    (unit, depth)
}

/// What [`Window::access`] decided for one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The read lies wholly in units of the window.
    pub hit: bool,
    /// Units to drop (behind the reader, or the whole window after a
    /// random read): `[from, to)`.
    pub drop: std::ops::Range<u64>,
    /// Units to post: `[from, to)` (the caller posts a prefix of it and
    /// reports how many with [`Window::posted`]).
    pub post: std::ops::Range<u64>,
}

/// The sequential detector and window of one stream, in unit indices: the
/// units `[lo, hi)` are in flight or ready. Pure logic (no memory, no
/// I/O), so that it is tested alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    pub lo: u64,
    pub hi: u64,
    /// The offset a sequential reader asks for next.
    next: Option<u64>,
    /// Sequential reads in a row.
    streak: u32,
}

impl Window {
    /// One read of `[offset, offset + len)` (`len > 0`) of a file of `size`
    /// bytes, with units of `unit` bytes and a window of `depth` units.
    pub fn access(&mut self, offset: u64, len: u64, size: u64, unit: u64, depth: u64) -> Step {
        let first = offset / unit;
        let last = (offset + len - 1) / unit;
        let empty = self.lo == self.hi;
        let hit = !empty && first >= self.lo && last < self.hi;
        // Sequential: contiguous with the last read, or inside (or just
        // past) the window, as reads of several threads may arrive a little
        // out of order.
        let near = !empty && first + 1 >= self.lo && first <= self.hi;
        let sequential = hit || near || self.next == Some(offset);
        if !sequential {
            let drop = self.lo..self.hi;
            // This read may start a run.
            *self = Window { next: Some(offset + len), streak: 1, ..Window::default() };
            return Step { hit: false, drop, post: 0..0 };
        }
        self.streak = self.streak.saturating_add(1);
        self.next = Some(self.next.map_or(offset + len, |n| n.max(offset + len)));
        // Units wholly behind the reader (but KEEP_BEHIND) go.
        let keep_from = first.saturating_sub(KEEP_BEHIND).max(self.lo);
        let drop = self.lo..keep_from.min(self.hi);
        self.lo = drop.end;
        if self.streak < TRIGGER {
            return Step { hit, drop, post: 0..0 };
        }
        let next = self.next.unwrap_or(offset + len);
        if self.lo == self.hi {
            // A new window starts at the unit of the next byte wanted.
            self.lo = next / unit;
            self.hi = self.lo;
        }
        let end_unit = size.div_ceil(unit);
        let target = (next / unit + depth).min(end_unit);
        let post = self.hi..target.max(self.hi);
        Step { hit, drop, post }
    }

    /// `n` units of the last [`Step::post`] were posted.
    pub fn posted(&mut self, n: u64) {
        self.hi += n;
    }

    /// Forgets the window (its units are dropped by the caller) and the
    /// reader's history.
    pub fn reset(&mut self) {
        *self = Window::default();
    }
}

/// The outcome of a unit's read, set by its operation.
#[derive(Default)]
struct Done {
    result: Mutex<Option<Result<(), Errno>>>,
    cv: Condvar,
}

impl Done {
    fn set(&self, r: Result<(), Errno>) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        self.cv.notify_all();
    }

    /// Waits up to `timeout`; whether it had to wait, and the outcome
    /// (`ETIMEDOUT` if none came).
    fn wait(&self, timeout: Duration) -> (bool, Result<(), Errno>) {
        let deadline = Instant::now() + timeout;
        let mut g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        let mut waited = false;
        loop {
            if let Some(r) = *g {
                return (waited, r);
            }
            let now = Instant::now();
            if now >= deadline {
                return (waited, Err(Errno::ETIMEDOUT));
            }
            waited = true;
            g = self.cv.wait_timeout(g, deadline - now).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// One unit of a window.
struct Unit {
    index: u64,
    /// Bytes fetched (the unit, or less at the end of the file).
    len: usize,
    view: Arc<SubRegion>,
    done: Arc<Done>,
    /// Bytes answered from it so far (what is not, is wasted).
    served: usize,
}

#[derive(Default)]
struct StreamState {
    window: Window,
    units: VecDeque<Unit>,
    /// The version of the file's [`Changes`] the units are up to date with.
    version: u64,
}

/// Read-ahead of one open file. Dropping it drops its units (a unit still
/// in flight keeps its slot until its read completes).
pub struct Stream {
    ra: Arc<Inner>,
    changes: Arc<Changes>,
    state: Mutex<StreamState>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").finish_non_exhaustive()
    }
}

/// A read answered from read-ahead units: their slots stay held until this
/// is dropped.
pub struct Hit {
    parts: Vec<(Arc<SubRegion>, usize, usize)>,
    ra: Arc<Inner>,
}

impl std::fmt::Debug for Hit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hit").field("parts", &self.parts.len()).field("len", &self.len()).finish()
    }
}

impl Hit {
    /// The answer as one slice of a unit, when it lies in one (no copy).
    pub fn single(&self) -> Option<&[u8]> {
        match self.parts.as_slice() {
            [(v, at, n)] => Some(&v.as_slice()[*at..*at + *n]),
            _ => None,
        }
    }

    /// Bytes of the answer.
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.2).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gathers the answer into `buf` (at least [`Hit::len`] bytes); counted
    /// as copied.
    pub fn copy_to(&self, buf: &mut [u8]) -> usize {
        let mut at = 0;
        for (v, from, n) in &self.parts {
            buf[at..at + n].copy_from_slice(&v.as_slice()[*from..*from + *n]);
            at += n;
        }
        self.ra.c.bytes_copied.fetch_add(at as u64, Ordering::Relaxed);
        at
    }
}

impl Stream {
    fn state(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops the units outside the window; what they held and nobody read
    /// counts as wasted.
    fn retain_window(&self, st: &mut StreamState) {
        let (lo, hi) = (st.window.lo, st.window.hi);
        let mut kept = VecDeque::with_capacity(st.units.len());
        for u in st.units.drain(..) {
            if (lo..hi).contains(&u.index) {
                kept.push_back(u);
            } else {
                self.wasted(&u);
            }
        }
        st.units = kept;
    }

    /// Drops the units that changes of the file since the stream last
    /// looked have made stale (module docs, "Consistency").
    fn catch_up(&self, st: &mut StreamState, unit: u64) {
        if self.changes.version() == st.version {
            return;
        }
        let (now, ranges) = self.changes.since(st.version);
        let before = st.units.len();
        match ranges {
            Some(ranges) => self.drop_overlapping(st, &ranges, unit),
            None => self.clear(st),
        }
        if st.units.len() != before {
            self.ra.c.invalidations.fetch_add(1, Ordering::Relaxed);
        }
        st.version = now;
    }

    /// Drops the units that overlap any of `ranges` (bytes changed since
    /// they were posted). The window keeps its range: a read of a dropped
    /// unit is a miss.
    fn drop_overlapping(&self, st: &mut StreamState, ranges: &[(u64, u64)], unit: u64) {
        let mut kept = VecDeque::with_capacity(st.units.len());
        for u in st.units.drain(..) {
            let (a, b) = (u.index * unit, u.index * unit + unit);
            if ranges.iter().any(|&(s, e)| s < b && a < e) {
                self.wasted(&u);
            } else {
                kept.push_back(u);
            }
        }
        st.units = kept;
    }

    fn wasted(&self, u: &Unit) {
        let w = u.len.saturating_sub(u.served) as u64;
        self.ra.c.bytes_wasted.fetch_add(w, Ordering::Relaxed);
    }

    fn clear(&self, st: &mut StreamState) {
        for u in st.units.drain(..) {
            self.wasted(&u);
        }
        st.window.reset();
    }

    /// A read of `len` bytes of `f` at `offset`, the file being `size`
    /// bytes long as the caller knows it (the caller clamps `len` to it):
    /// the answer if read-ahead holds it (after waiting for a unit on its
    /// way), else `None` (the caller reads from the servers). Either way
    /// the read feeds the detector and may post units ahead.
    pub fn read(&self, f: &OpenFile, offset: u64, len: usize, size: u64) -> Option<Hit> {
        let c = &self.ra.c;
        if len == 0 {
            return None;
        }
        let (unit, depth) = geometry(&f.layout, self.ra.window);
        let mut st = self.state();
        self.catch_up(&mut st, unit);
        let step = st.window.access(offset, len as u64, size, unit, depth);
        // Units outside the window go: those behind the reader, or all of
        // them after a random read.
        self.retain_window(&mut st);
        let mut posted = 0;
        for index in step.post.clone() {
            let Some(view) = self.ra.take_slot() else {
                c.posts_refused.fetch_add(step.post.end - index, Ordering::Relaxed);
                break;
            };
            let at = index * unit;
            let n = (unit.min(size.saturating_sub(at))) as usize;
            let done = Arc::new(Done::default());
            let (ra, file, v, d) = (self.ra.clone(), f.clone(), view.clone(), done.clone());
            let ok = self.ra.cq.post_detached(async move {
                let r = ra.data.read_view(&file, at, &v, n, &ra.key).await.map(|_| ());
                if r.is_err() {
                    // A server may still put into the slot.
                    ra.quarantine(v);
                }
                d.set(r);
            });
            if !ok {
                break;
            }
            c.bytes_prefetched.fetch_add(n as u64, Ordering::Relaxed);
            st.units.push_back(Unit { index, len: n, view, done, served: 0 });
            posted += 1;
        }
        st.window.posted(posted);
        let parts = if step.hit { self.parts(&mut st, offset, len, unit) } else { None };
        drop(st);
        let Some(parts) = parts else {
            c.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let mut waited = false;
        for (_, done, _, _) in &parts {
            let (w, r) = done.wait(self.ra.hold);
            waited |= w;
            if r.is_err() {
                // The unit failed: the window goes, the caller reads itself
                // (and reports the servers' error, if it persists).
                let mut st = self.state();
                self.clear(&mut st);
                c.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        c.hits.fetch_add(1, Ordering::Relaxed);
        c.bytes_hit.fetch_add(len as u64, Ordering::Relaxed);
        if waited {
            c.waits.fetch_add(1, Ordering::Relaxed);
        }
        Some(Hit { parts: parts.into_iter().map(|(v, _, at, n)| (v, at, n)).collect(), ra: self.ra.clone() })
    }

    /// The pieces of units that hold `[offset, offset + len)`, marked
    /// served; `None` if a unit is missing or shorter (the file grew past
    /// what was fetched).
    #[allow(clippy::type_complexity)]
    fn parts(
        &self,
        st: &mut StreamState,
        offset: u64,
        len: usize,
        unit: u64,
    ) -> Option<Vec<(Arc<SubRegion>, Arc<Done>, usize, usize)>> {
        let mut out = Vec::new();
        let (mut pos, end) = (offset, offset + len as u64);
        while pos < end {
            let index = pos / unit;
            let u = st.units.iter_mut().find(|u| u.index == index)?;
            let at = (pos - index * unit) as usize;
            let n = ((end - pos) as usize).min(unit as usize - at);
            if at + n > u.len {
                return None;
            }
            u.served += n;
            out.push((u.view.clone(), u.done.clone(), at, n));
            pos += n as u64;
        }
        Some(out)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut st = std::mem::take(&mut *self.state());
        self.clear(&mut st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: u64 = 1 << 20;
    const BLOCK: u64 = 128 << 10;

    fn layout(unit: u32, count: u32) -> Layout {
        Layout { object_id: 1, stripe_unit: unit, stripe_count: count, servers: (0..count).collect() }
    }

    #[test]
    fn units_are_whole_stripe_units_and_the_window_covers_every_server() {
        assert_eq!(geometry(&layout(1 << 20, 4), DEFAULT_WINDOW), (U, 8));
        // Larger stripe units are read in 1 MiB pieces; a window smaller
        // than a stripe still reaches every server.
        assert_eq!(geometry(&layout(4 << 20, 4), 1 << 20), (U, 16));
        // Small units are gathered, whole, up to 1 MiB.
        assert_eq!(geometry(&layout(192 << 10, 2), DEFAULT_WINDOW), (960 << 10, 9));
        assert_eq!(geometry(&layout(64 << 10, 1), 0), (U, 1));
    }

    #[test]
    fn a_sequential_reader_starts_the_window_on_its_second_read_and_keeps_it_full() {
        let mut w = Window::default();
        let size = 64 * U;
        let s = w.access(0, BLOCK, size, U, 8);
        assert_eq!(s, Step { hit: false, drop: 0..0, post: 0..0 }, "one read is no pattern yet");
        let s = w.access(BLOCK, BLOCK, size, U, 8);
        assert!(!s.hit);
        assert_eq!(s.post, 0..8, "the window starts at the unit of the next byte, 8 units deep");
        w.posted(8);
        // The rest of unit 0 and all of units 1.. hit; each new unit moves
        // the window by one.
        for k in 2..7 {
            let s = w.access(k * BLOCK, BLOCK, size, U, 8);
            assert!(s.hit && s.post.is_empty() && s.drop.is_empty(), "{k}: {s:?}");
        }
        // The read that ends unit 0 makes the next byte unit 1's: the
        // window reaches one unit further.
        let s = w.access(7 * BLOCK, BLOCK, size, U, 8);
        assert!(s.hit);
        assert_eq!(s.post, 8..9);
        w.posted(1);
        let s = w.access(U, BLOCK, size, U, 8);
        assert!(s.hit && s.post.is_empty() && s.drop.is_empty(), "{s:?}");
        let s = w.access(2 * U, BLOCK, size, U, 8);
        assert_eq!(s.drop, 0..1, "the unit two behind goes, the one behind stays");
        assert_eq!(s.post, 9..10);
        w.posted(1);
        assert_eq!((w.lo, w.hi), (1, 10));
    }

    #[test]
    fn the_window_stops_at_the_end_of_the_file() {
        let mut w = Window::default();
        let size = 3 * U + 5;
        w.access(0, U, size, U, 8);
        let s = w.access(U, U, size, U, 8);
        assert_eq!(s.post, 2..4, "units past the end are not fetched");
        w.posted(2);
        let s = w.access(2 * U, U, size, U, 8);
        assert!(s.hit && s.post.is_empty());
    }

    #[test]
    fn random_reads_fetch_nothing_and_drop_the_window() {
        let mut w = Window::default();
        let size = 1 << 30;
        for off in [5 * U, 77 * U + 4096, 3 * U, 900 * U] {
            let s = w.access(off, 4096, size, U, 8);
            assert!(!s.hit && s.post.is_empty(), "{off}: {s:?}");
        }
        // A sequential run builds a window; a jump far away drops it all.
        w.access(0, BLOCK, size, U, 8);
        let s = w.access(BLOCK, BLOCK, size, U, 8);
        w.posted(s.post.end - s.post.start);
        let s = w.access(500 * U, 4096, size, U, 8);
        assert_eq!(s, Step { hit: false, drop: 0..8, post: 0..0 });
        assert_eq!((w.lo, w.hi), (0, 0));
    }

    #[test]
    fn reads_a_little_out_of_order_stay_sequential() {
        let mut w = Window::default();
        let size = 64 * U;
        w.access(0, U, size, U, 4);
        let s = w.access(U, U, size, U, 4);
        assert_eq!(s.post, 2..6);
        w.posted(4);
        // Unit 3 is asked before unit 2 (two threads): both hit.
        let s = w.access(3 * U, U, size, U, 4);
        assert!(s.hit, "{s:?}");
        w.posted(s.post.end - s.post.start);
        let s = w.access(2 * U, U, size, U, 4);
        assert!(s.hit, "the unit behind the newest read was kept: {s:?}");
    }

    /// An open file of `size` bytes on one server with 1 MiB units.
    fn open_file(size: u64) -> OpenFile {
        let mut f = crate::fake_io::file_on(9, 1);
        f.attr.size = size;
        f
    }

    #[test]
    fn failed_prefetches_are_misses_and_their_slots_stay_out_of_use() {
        // The fake server fails every read: the stream must answer nothing
        // from units that never arrived, and keep their slots (a late put
        // could still land there) until the hold has passed.
        let (_server, addr, _) = crate::fake_io::start();
        let rt = crate::fake_io::runtime("readahead");
        let data = DataClient::connect(&rt, &[addr], crate::fake_io::secret()).unwrap();
        let ra = ReadAhead::new(&data, ReadAheadConfig { budget: 4 * UNIT_MAX, window: 4 * UNIT_MAX }).unwrap();
        assert_eq!(ra.stats().budget_bytes, 4 * UNIT_MAX as u64);
        let f = open_file(64 * U);
        let s = ra.stream(Arc::default());
        assert!(s.read(&f, 0, BLOCK as usize, 64 * U).is_none());
        assert!(s.read(&f, BLOCK, BLOCK as usize, 64 * U).is_none(), "the second read posts, and misses");
        assert_eq!(ra.stats().bytes_prefetched, 4 * U, "four units were posted");
        assert!(s.read(&f, 2 * BLOCK, BLOCK as usize, 64 * U).is_none(), "a failed unit answered a read");
        let st = ra.stats();
        assert_eq!((st.hits, st.misses), (0, 3));
        // All four slots are held back: the next window cannot start.
        for k in 3..6 {
            assert!(s.read(&f, k * BLOCK, BLOCK as usize, 64 * U).is_none());
        }
        assert!(ra.stats().posts_refused > 0, "a slot of a failed read was reused at once");
        assert_eq!(ra.stats().peak_bytes, 4 * U, "never more than the slab");
    }

    #[test]
    fn changes_drop_the_units_they_overlap_and_a_long_log_drops_all() {
        let (_server, addr, _) = crate::fake_io::start();
        let rt = crate::fake_io::runtime("readahead-changes");
        let data = DataClient::connect(&rt, &[addr], crate::fake_io::secret()).unwrap();
        let ra = ReadAhead::new(&data, ReadAheadConfig { budget: 8 * UNIT_MAX, window: 4 * UNIT_MAX }).unwrap();
        let f = open_file(64 * U);
        let changes = Arc::new(Changes::default());
        let s = ra.stream(changes.clone());
        let units = |s: &Stream| s.state().units.iter().map(|u| u.index).collect::<Vec<_>>();
        s.read(&f, 0, BLOCK as usize, 64 * U);
        s.read(&f, BLOCK, BLOCK as usize, 64 * U);
        assert_eq!(units(&s), vec![0, 1, 2, 3]);
        // What the next read does first (the units' reads fail on the fake
        // server, which a read would find out by waiting on one).
        let catch_up = |s: &Stream| {
            let mut st = s.state();
            s.catch_up(&mut st, U);
        };
        // A write into unit 2.
        changes.changed(2 * U + 4096, 2 * U + 8192);
        catch_up(&s);
        assert_eq!(units(&s), vec![0, 1, 3], "only the unit the write touched goes");
        assert_eq!(ra.stats().invalidations, 1);
        catch_up(&s);
        assert_eq!(units(&s), vec![0, 1, 3], "a change is applied once");
        // A truncation drops everything from the new size on.
        changes.changed(U + 5, u64::MAX);
        catch_up(&s);
        assert_eq!(units(&s), vec![0]);
        // More changes than the log keeps: the stream cannot know which
        // units they touched, so all go.
        for k in 0..=CHANGE_LOG as u64 {
            changes.changed(40 * U + k, 40 * U + k + 1);
        }
        catch_up(&s);
        assert!(units(&s).is_empty(), "a unit outlived changes the log no longer holds");
        assert_eq!(ra.stats().invalidations, 3);
    }

    #[test]
    fn the_change_log_reports_ranges_since_a_version() {
        let c = Changes::default();
        assert_eq!(c.since(0), (0, Some(vec![])));
        c.changed(0, 10);
        c.changed(20, 30);
        assert_eq!(c.since(0), (2, Some(vec![(0, 10), (20, 30)])));
        assert_eq!(c.since(1), (2, Some(vec![(20, 30)])));
        for k in 0..CHANGE_LOG as u64 {
            c.changed(k, k + 1);
        }
        assert_eq!(c.since(1), (2 + CHANGE_LOG as u64, None), "the log lost changes since version 1");
        assert!(c.since(2).1.is_some_and(|r| r.len() == CHANGE_LOG));
    }

    #[test]
    fn a_full_pool_posts_fewer_units_and_the_next_read_asks_again() {
        let mut w = Window::default();
        let size = 64 * U;
        w.access(0, BLOCK, size, U, 8);
        let s = w.access(BLOCK, BLOCK, size, U, 8);
        assert_eq!(s.post, 0..8);
        w.posted(3); // only three slots were free
        let s = w.access(2 * BLOCK, BLOCK, size, U, 8);
        assert!(s.hit);
        assert_eq!(s.post, 3..8, "the rest is asked for again");
    }
}
