//! Write-behind: a write returns once its bytes are in registered memory of
//! the client; the io servers get them from there while the writer goes on.
//!
//! Why: a writer that waits for every write's round trip through the io
//! servers moves one request at a time (the FUSE mount's sequential write
//! row was 35–44% of a passthrough FUSE file system, issue 9). NFS answers
//! the same way with unstable writes: the data is the client's to hold
//! until a commit, and errors reach the application at the next write, at
//! `fsync` or at close.
//!
//! # The rules
//! * **Memory is bounded**: writes are copied (once, as the synchronous
//!   path copies into a bounce buffer) into slots of [`SLOT`] bytes of
//!   registered memory, `budget / SLOT` of them, registered when the
//!   write-behind is made and reused; a writer waits while every slot is
//!   in flight.
//! * **Order**: a write that overlaps a write of the same file still in
//!   flight waits for it first, so the later bytes always land last. Writes
//!   that do not overlap go out together, to every server of the stripe.
//! * **Errors** of a write are kept for its file, numbered, and reported
//!   once to *each* caller's cursor (as Linux's `errseq`): every open file
//!   (a handle of the mount, say) samples the file's error number when it
//!   opens ([`WriteBehind::error_mark`]) and its next [`WriteBehind::write`]
//!   or [`WriteBehind::drain`] reports an error newer than its cursor; so
//!   a reader's close cannot take the error away from the writer's (review
//!   finding). `drain` is what fsync, close and a lock release call, so an
//!   error is never lost silently (NFS's model: a write that returned may
//!   still fail, and fsync/close say so). The file's entry goes with
//!   [`WriteBehind::forget`], when its last open closes.
//! * **Reads** of a file wait for its writes in flight
//!   ([`WriteBehind::settle`]; the error stays for the next drain), so a
//!   read sees every write that returned before it.
//! * **Durability** is unchanged: writes are sent as they would have been
//!   (the caller's stability); fsync drains and then syncs.
//!
//! A slot whose write failed is not reused: the server may still get from
//! it, so it goes to the data client's quarantine (`data` module docs,
//! "Buffers of failed requests") and a fresh slot is allocated later.
//!
//! Counters ([`WriteBehindStats`]) say what happened: writes and bytes
//! posted, waits for memory and for an overlapping write, errors deferred,
//! the peak of bytes in flight against the budget.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use dafne_proto::io::Stability;
use dafne_proto::Errno;
use dafne_transport::{Access, Region};

use crate::cq::CompletionQueue;
use crate::data::DataClient;
use crate::OpenFile;

/// Bytes per slot: a write larger than this goes out as several.
pub const SLOT: usize = 1 << 20;
/// Default memory for writes in flight (the mount's `--write-behind-mib`).
pub const DEFAULT_BUDGET: usize = 32 << 20;

/// What write-behind did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBehindStats {
    /// Pieces posted (a write of more than [`SLOT`] bytes is several).
    pub writes: u64,
    pub bytes: u64,
    /// Times a writer waited for a free slot (the budget was in flight).
    pub waits_for_memory: u64,
    /// Times a writer waited for an overlapping write of the same file.
    pub waits_for_overlap: u64,
    /// Writes that failed after they had returned (reported later).
    pub errors: u64,
    /// Most bytes of slots in use at once, and the budget.
    pub peak_bytes: u64,
    pub budget_bytes: u64,
}

/// Writes of one file in flight, and its latest error with its number.
#[derive(Debug, Default)]
struct Pending {
    /// (id, start, end) of every piece in flight.
    ranges: Vec<(u64, u64, u64)>,
    error: Option<(u64, Errno)>,
}

#[derive(Debug, Default)]
struct State {
    free: Vec<Region>,
    /// Slots allocated and not given up (free + in flight).
    slots: usize,
    files: HashMap<u64, Pending>,
    next_id: u64,
    /// Numbers errors (module docs, "Errors"); 0 is "none".
    errors_seen: u64,
    stats: WriteBehindStats,
}

struct Inner {
    data: DataClient,
    /// Drives the posted writes (its own thread).
    cq: CompletionQueue,
    max_slots: usize,
    state: Mutex<State>,
    changed: Condvar,
}

/// Write-behind for one client (module docs). Cheap to clone.
#[derive(Clone)]
pub struct WriteBehind {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBehind").field("max_slots", &self.inner.max_slots).finish_non_exhaustive()
    }
}

impl WriteBehind {
    /// Write-behind with `budget` bytes of slots (at least one slot), all
    /// registered now: the hot path registers nothing (a slot is allocated
    /// again only to replace one a failed write left in quarantine).
    pub fn new(data: &DataClient, budget: usize) -> Result<WriteBehind, Errno> {
        let max_slots = (budget / SLOT).max(1);
        let ctx = data.context().ok_or(Errno::EIO)?;
        let free = (0..max_slots)
            .map(|_| Region::allocate(ctx, SLOT, Access::RemoteReadWrite).map_err(|_| Errno::ENOMEM))
            .collect::<Result<Vec<_>, _>>()?;
        let state = State {
            free,
            slots: max_slots,
            stats: WriteBehindStats { budget_bytes: (max_slots * SLOT) as u64, ..Default::default() },
            ..Default::default()
        };
        Ok(WriteBehind {
            inner: Arc::new(Inner {
                data: data.clone(),
                cq: CompletionQueue::new(),
                max_slots,
                state: Mutex::new(state),
                changed: Condvar::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.inner.changed.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    /// The number of `object`'s latest error (0: none): the cursor of an
    /// open file starts here, so it is told only of errors after it opened.
    pub fn error_mark(&self, object: u64) -> u64 {
        self.lock().files.get(&object).and_then(|p| p.error).map_or(0, |(n, _)| n)
    }

    /// Copies `data` into slots and sends it to the io servers without
    /// waiting; `Ok(data.len())` once every piece is on its way, or an
    /// error of the file newer than `cursor`, which then moves past it
    /// (module docs, "Errors"). Each piece's range is recorded in
    /// `changes` (the file's read-ahead change log) when it has landed,
    /// so a unit read ahead while it was on its way is dropped (the caller
    /// records it when posting too).
    pub fn write(
        &self,
        f: &OpenFile,
        offset: u64,
        data: &[u8],
        stability: Stability,
        cursor: &mut u64,
        changes: Option<Arc<crate::readahead::Changes>>,
    ) -> Result<usize, Errno> {
        offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        let object = f.layout.object_id;
        for (i, piece) in data.chunks(SLOT).enumerate() {
            let at = offset + (i * SLOT) as u64;
            let (id, mut slot) = self.acquire(object, at, at + piece.len() as u64, cursor)?;
            slot.as_mut_slice()[..piece.len()].copy_from_slice(piece);
            let (me, f, len, changes) = (self.clone(), f.clone(), piece.len(), changes.clone());
            let posted = self.inner.cq.post_detached(async move {
                let r = me.inner.data.write_region(&f, at, &slot, 0, len, stability).await;
                // Also after a failure: some servers may have taken their part.
                if let Some(c) = &changes {
                    c.changed(at, at + len as u64);
                }
                me.complete(object, id, slot, r.map(|_| ()));
            });
            if !posted {
                // The driver is gone (the client is shutting down): the
                // slot went with the dropped future.
                let mut st = self.lock();
                st.slots -= 1;
                Self::finish(&mut st, object, id, Err(Errno::EIO));
                self.inner.changed.notify_all();
                return Err(Errno::EIO);
            }
        }
        Ok(data.len())
    }

    /// A free slot for a piece of `object` at `start..end`, once no write of
    /// the object in flight overlaps it; registers the piece as in flight.
    fn acquire(&self, object: u64, start: u64, end: u64, cursor: &mut u64) -> Result<(u64, Region), Errno> {
        let mut st = self.lock();
        let (mut counted_overlap, mut counted_memory) = (false, false);
        loop {
            if let Some((n, e)) = st.files.get(&object).and_then(|p| p.error).filter(|&(n, _)| n > *cursor) {
                *cursor = n;
                return Err(e);
            }
            let overlaps =
                st.files.get(&object).is_some_and(|p| p.ranges.iter().any(|&(_, s, e)| s < end && start < e));
            if overlaps {
                if !counted_overlap {
                    st.stats.waits_for_overlap += 1;
                    counted_overlap = true;
                }
                st = self.wait(st);
                continue;
            }
            let slot = match st.free.pop() {
                Some(r) => r,
                None if st.slots < self.inner.max_slots => {
                    let ctx = self.inner.data.context().ok_or(Errno::EIO)?;
                    let r = Region::allocate(ctx, SLOT, Access::RemoteReadWrite).map_err(|_| Errno::ENOMEM)?;
                    st.slots += 1;
                    r
                }
                None => {
                    if !counted_memory {
                        st.stats.waits_for_memory += 1;
                        counted_memory = true;
                    }
                    st = self.wait(st);
                    continue;
                }
            };
            st.next_id += 1;
            let id = st.next_id;
            st.files.entry(object).or_default().ranges.push((id, start, end));
            st.stats.writes += 1;
            st.stats.bytes += end - start;
            let in_use = ((st.slots - st.free.len()) * SLOT) as u64;
            st.stats.peak_bytes = st.stats.peak_bytes.max(in_use);
            return Ok((id, slot));
        }
    }

    /// A piece's write ended: its slot returns to the pool (or, after a
    /// failure, to the quarantine) and its error is kept for the file.
    fn complete(&self, object: u64, id: u64, slot: Region, r: Result<(), Errno>) {
        let mut st = self.lock();
        if r.is_ok() {
            st.free.push(slot);
        } else {
            st.slots -= 1;
            self.inner.data.quarantine_region(slot);
        }
        Self::finish(&mut st, object, id, r);
        drop(st);
        self.inner.changed.notify_all();
    }

    fn finish(st: &mut State, object: u64, id: u64, r: Result<(), Errno>) {
        if let Err(e) = r {
            st.stats.errors += 1;
            st.errors_seen += 1;
            let n = st.errors_seen;
            st.files.entry(object).or_default().error = Some((n, e));
        }
        if let Some(p) = st.files.get_mut(&object) {
            p.ranges.retain(|&(i, _, _)| i != id);
        }
        Self::forget_if_idle(st, object);
    }

    fn forget_if_idle(st: &mut State, object: u64) {
        if st.files.get(&object).is_some_and(|p| p.ranges.is_empty() && p.error.is_none()) {
            st.files.remove(&object);
        }
    }

    /// Waits until no write of `object` is in flight; its error, if one
    /// failed, stays for the next write or drain.
    pub fn settle(&self, object: u64) {
        let mut st = self.lock();
        while st.files.get(&object).is_some_and(|p| !p.ranges.is_empty()) {
            st = self.wait(st);
        }
    }

    /// Waits until no write of `object` is in flight and returns its error
    /// newer than `cursor` (once per cursor: the cursor moves past it).
    pub fn drain(&self, object: u64, cursor: &mut u64) -> Result<(), Errno> {
        self.settle(object);
        let st = self.lock();
        match st.files.get(&object).and_then(|p| p.error).filter(|&(n, _)| n > *cursor) {
            Some((n, e)) => {
                *cursor = n;
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// The last open of `object` closed: its error is no one's to report
    /// any more (entries of files with writes in flight stay until they
    /// end).
    pub fn forget(&self, object: u64) {
        let mut st = self.lock();
        if let Some(p) = st.files.get_mut(&object) {
            p.error = None;
        }
        Self::forget_if_idle(&mut st, object);
    }

    /// Writes of any file in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().files.values().map(|p| p.ranges.len()).sum()
    }

    pub fn stats(&self) -> WriteBehindStats {
        self.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_io;
    use std::sync::atomic::Ordering;

    /// Writes that do not overlap are in flight together (the writer does
    /// not wait for the servers); a write that overlaps one in flight is
    /// sent only once that one was answered, so the later bytes land last.
    #[test]
    fn disjoint_writes_overlap_in_flight_and_overlapping_ones_wait() {
        let (_server, addr, faults) = fake_io::start();
        let rt = fake_io::runtime("write-behind");
        let d = DataClient::connect(&rt, &[addr], fake_io::secret()).unwrap();
        let wb = WriteBehind::new(&d, 8 * SLOT).unwrap();
        let mut c = 0;
        let f = fake_io::file_on(50, 1);
        let bytes = vec![7u8; 256 << 10];
        faults.write_delay_ms.store(100, Ordering::Relaxed);
        for i in 0..4u64 {
            assert_eq!(wb.write(&f, i << 20, &bytes, Stability::Unstable, &mut c, None), Ok(bytes.len()));
        }
        wb.drain(50, &mut c).unwrap();
        assert_eq!(faults.max_writes_in_flight.load(Ordering::SeqCst), 4, "disjoint writes went one at a time");
        faults.max_writes_in_flight.store(0, Ordering::SeqCst);
        for _ in 0..4 {
            wb.write(&f, 4096, &bytes, Stability::Unstable, &mut c, None).unwrap();
        }
        wb.drain(50, &mut c).unwrap();
        assert_eq!(faults.max_writes_in_flight.load(Ordering::SeqCst), 1, "an overlapping write was sent early");
        let s = wb.stats();
        assert_eq!((s.writes, s.waits_for_overlap, s.errors), (8, 3, 0), "{s:?}");
    }

    /// A write's range goes to the file's read-ahead change log when it
    /// has landed, not only when posted (review finding: a unit read ahead
    /// while the write was on its way was kept).
    #[test]
    fn a_landed_write_is_recorded_in_the_read_ahead_change_log() {
        let (_server, addr, faults) = fake_io::start();
        let rt = fake_io::runtime("write-behind-changes");
        let d = DataClient::connect(&rt, &[addr], fake_io::secret()).unwrap();
        let wb = WriteBehind::new(&d, 2 * SLOT).unwrap();
        let mut c = 0;
        let f = fake_io::file_on(53, 1);
        let changes = Arc::new(crate::readahead::Changes::default());
        faults.write_delay_ms.store(100, Ordering::Relaxed);
        wb.write(&f, 0, &[3u8; 8192], Stability::Unstable, &mut c, Some(changes.clone())).unwrap();
        assert_eq!(changes.version(), 0, "recorded before it landed");
        wb.drain(53, &mut c).unwrap();
        assert_eq!(changes.version(), 1, "not recorded when it landed");
    }

    /// The budget bounds the slots in flight: a writer waits for one.
    #[test]
    fn a_writer_waits_when_the_budget_is_in_flight() {
        let (_server, addr, faults) = fake_io::start();
        let rt = fake_io::runtime("write-behind-budget");
        let d = DataClient::connect(&rt, &[addr], fake_io::secret()).unwrap();
        let wb = WriteBehind::new(&d, 2 * SLOT).unwrap();
        let mut c = 0;
        let f = fake_io::file_on(51, 1);
        faults.write_delay_ms.store(50, Ordering::Relaxed);
        let bytes = vec![1u8; SLOT];
        for i in 0..6u64 {
            wb.write(&f, i * SLOT as u64, &bytes, Stability::Unstable, &mut c, None).unwrap();
        }
        wb.drain(51, &mut c).unwrap();
        let s = wb.stats();
        assert_eq!(faults.max_writes_in_flight.load(Ordering::SeqCst), 2);
        assert_eq!(s.peak_bytes, 2 * SLOT as u64, "{s:?}");
        assert!(s.waits_for_memory >= 2, "{s:?}");
    }

    /// A write the server fails after it returned: the next write of the
    /// file reports it, once, and its slot is not reused (quarantined).
    #[test]
    fn a_failure_after_return_reaches_the_next_write_and_the_slot_is_replaced() {
        let (_server, addr, faults) = fake_io::start();
        let rt = fake_io::runtime("write-behind-failure");
        let d = DataClient::connect(&rt, &[addr], fake_io::secret()).unwrap();
        let wb = WriteBehind::new(&d, SLOT).unwrap();
        let mut c = 0;
        let f = fake_io::file_on(52, 1);
        let bytes = vec![2u8; 200 << 10];
        faults.fail_writes.store(true, Ordering::Relaxed);
        assert_eq!(wb.write(&f, 0, &bytes, Stability::Unstable, &mut c, None), Ok(bytes.len()));
        wb.settle(52);
        faults.fail_writes.store(false, Ordering::Relaxed);
        // Another open of the file (a reader, say) hears of it too, and
        // does not take it from the writer (errseq; review finding).
        let mut reader = 0;
        assert_eq!(wb.drain(52, &mut reader), Err(Errno::EIO));
        assert_eq!(wb.drain(52, &mut reader), Ok(()), "reported once to each");
        assert_eq!(wb.write(&f, 0, &bytes, Stability::Unstable, &mut c, None), Err(Errno::EIO));
        assert_eq!(wb.write(&f, 0, &bytes, Stability::Unstable, &mut c, None), Ok(bytes.len()), "reported once");
        assert_eq!(wb.drain(52, &mut c), Ok(()));
        // An open made after the error is not told of it.
        assert_eq!(wb.drain(52, &mut wb.error_mark(52)), Ok(()));
        assert_eq!(d.bounce_quarantined(), 1, "the failed write's slot was quarantined");
        assert_eq!(wb.stats().errors, 1);
    }
}
