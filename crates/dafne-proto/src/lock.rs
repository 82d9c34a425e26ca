//! Byte-range locks: the kinds on the wire, and the range arithmetic that
//! the metadata server's lock table and the client's record of its own
//! locks (what it reclaims after a server restart) both use, so that the
//! two agree on what a sequence of lock and unlock requests leaves held.
//!
//! POSIX's rules, as Linux applies them to one owner's locks on one file:
//! a new lock replaces whatever the owner held in its range (a read lock
//! over part of a write lock splits it in up to three), an unlock removes
//! the range from whatever it covers, and adjacent or overlapping ranges of
//! the same kind merge into one. Ranges are inclusive: `end` is the last
//! byte, and `u64::MAX` stands for "to the end of the file, however long
//! it grows" (the kernel's `OFFSET_MAX` is clamped to it by the client).

use crate::wire::{Reader, Writer};
use crate::DecodeError;

/// What a lock request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum LockKind {
    /// Shared (`F_RDLCK`, `LOCK_SH`).
    Read = 1,
    /// Exclusive (`F_WRLCK`, `LOCK_EX`).
    Write = 2,
    /// Release (`F_UNLCK`, `LOCK_UN`).
    Unlock = 3,
}

impl LockKind {
    pub(crate) fn put(self, w: &mut Writer) {
        w.put_u8(self as u8);
    }

    pub(crate) fn get(r: &mut Reader<'_>, what: &'static str) -> Result<LockKind, DecodeError> {
        let v = r.u8(what)?;
        match v {
            1 => Ok(LockKind::Read),
            2 => Ok(LockKind::Write),
            3 => Ok(LockKind::Unlock),
            _ => Err(DecodeError::BadValue { what, value: v.into() }),
        }
    }

    /// Whether a lock of this kind and one of `other`, held by different
    /// owners over a common byte, exclude each other.
    pub fn conflicts(self, other: LockKind) -> bool {
        matches!((self, other), (LockKind::Write, LockKind::Read | LockKind::Write) | (LockKind::Read, LockKind::Write))
    }
}

/// Lock request flag: wait until the lock can be granted (`F_SETLKW`,
/// `flock` without `LOCK_NB`) instead of failing with `EAGAIN`.
pub const LOCK_WAIT: u8 = 1;
/// Lock request flag: a lock this client held before it lost its
/// connection (or before the server restarted), claimed back.
pub const LOCK_RECLAIM: u8 = 2;
/// Lock request flag: without [`LOCK_WAIT`], refuse (`EAGAIN`) also when
/// an earlier waiting request stands in the way, as a waiting request is
/// judged: the first, non-waiting try of a client that will wait if it
/// must (a mount's `F_SETLKW`), so it does not jump the queue.
pub const LOCK_FAIR: u8 = 4;
/// Every lock flag.
pub const LOCK_FLAGS: u8 = LOCK_WAIT | LOCK_RECLAIM | LOCK_FAIR;

/// One held range of one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockRange {
    pub start: u64,
    /// Inclusive; `u64::MAX`: to the end of the file.
    pub end: u64,
    /// `Read` or `Write`, never `Unlock`.
    pub kind: LockKind,
}

impl LockRange {
    /// Whether this range shares a byte with `start..=end`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }
}

/// One owner's locks on one file: sorted by start, disjoint, and no two
/// adjacent ranges of the same kind (they are merged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerLocks {
    ranges: Vec<LockRange>,
}

impl OwnerLocks {
    /// The ranges, sorted by start.
    pub fn ranges(&self) -> &[LockRange] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether any held range shares a byte with `start..=end`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        !self.overlapping(start, end).is_empty()
    }

    /// The held ranges that share a byte with `start..=end` (found by
    /// binary search).
    pub fn overlapping(&self, start: u64, end: u64) -> &[LockRange] {
        let lo = self.ranges.partition_point(|r| r.end < start);
        let hi = self.ranges.partition_point(|r| r.start <= end);
        &self.ranges[lo..hi.max(lo)]
    }

    /// The number of ranges held once `kind` over `start..=end` is applied
    /// (what a bound on ranges must allow before [`Self::apply`]).
    pub fn len_after(&self, start: u64, end: u64, kind: LockKind) -> usize {
        let (lo, hi) = self.window(start, end);
        self.ranges.len() - (hi - lo) + Self::rework(&self.ranges[lo..hi], start, end, kind).len()
    }

    /// Applies a lock (`Read`, `Write`) or an unlock over `start..=end`
    /// (`start <= end`), by POSIX's rules (module docs). Only the ranges
    /// that overlap or touch the request are rebuilt: a client splitting
    /// its locks into many pieces costs a search and a move per request.
    pub fn apply(&mut self, start: u64, end: u64, kind: LockKind) {
        debug_assert!(start <= end);
        let (lo, hi) = self.window(start, end);
        let new = Self::rework(&self.ranges[lo..hi], start, end, kind);
        self.ranges.splice(lo..hi, new);
    }

    /// The indices of the ranges that overlap or touch `start..=end` (the
    /// ranges are disjoint and sorted, so their ends are sorted too).
    fn window(&self, start: u64, end: u64) -> (usize, usize) {
        let lo = self.ranges.partition_point(|r| r.end < start.saturating_sub(1));
        let hi = self.ranges.partition_point(|r| r.start <= end.saturating_add(1));
        (lo, hi.max(lo))
    }

    /// What `window` (sorted, disjoint, merged) becomes once `kind` is
    /// applied over `start..=end`.
    fn rework(window: &[LockRange], start: u64, end: u64, kind: LockKind) -> Vec<LockRange> {
        let mut out = Vec::with_capacity(window.len() + 2);
        for r in window {
            if !r.overlaps(start, end) {
                out.push(*r);
                continue;
            }
            // The parts of `r` outside the new range stay as they were.
            if r.start < start {
                out.push(LockRange { start: r.start, end: start - 1, kind: r.kind });
            }
            if r.end > end {
                out.push(LockRange { start: end + 1, end: r.end, kind: r.kind });
            }
        }
        if kind != LockKind::Unlock {
            out.push(LockRange { start, end, kind });
        }
        out.sort_by_key(|r| r.start);
        let mut merged: Vec<LockRange> = Vec::with_capacity(out.len());
        for r in out {
            match merged.last_mut() {
                Some(last) if last.kind == r.kind && last.end != u64::MAX && last.end + 1 >= r.start => {
                    last.end = last.end.max(r.end);
                }
                _ => merged.push(r),
            }
        }
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockKind::{Read, Unlock, Write};

    fn r(start: u64, end: u64, kind: LockKind) -> LockRange {
        LockRange { start, end, kind }
    }

    #[test]
    fn a_read_lock_inside_a_write_lock_splits_it_in_three() {
        let mut l = OwnerLocks::default();
        l.apply(0, 99, Write);
        l.apply(10, 19, Read);
        assert_eq!(l.ranges(), &[r(0, 9, Write), r(10, 19, Read), r(20, 99, Write)]);
        // Writing over it again merges the three back into one.
        l.apply(5, 25, Write);
        assert_eq!(l.ranges(), &[r(0, 99, Write)]);
    }

    #[test]
    fn adjacent_ranges_of_one_kind_merge_and_unlocks_punch_holes() {
        let mut l = OwnerLocks::default();
        l.apply(0, 9, Read);
        l.apply(10, 19, Read);
        assert_eq!(l.ranges(), &[r(0, 19, Read)]);
        l.apply(5, 14, Unlock);
        assert_eq!(l.ranges(), &[r(0, 4, Read), r(15, 19, Read)]);
        l.apply(0, u64::MAX, Unlock);
        assert!(l.is_empty());
    }

    #[test]
    fn ranges_to_the_end_of_the_file_and_from_byte_zero_do_not_overflow() {
        let mut l = OwnerLocks::default();
        l.apply(100, u64::MAX, Write);
        l.apply(0, 99, Write);
        assert_eq!(l.ranges(), &[r(0, u64::MAX, Write)]);
        l.apply(u64::MAX, u64::MAX, Read);
        assert_eq!(l.ranges(), &[r(0, u64::MAX - 1, Write), r(u64::MAX, u64::MAX, Read)]);
        l.apply(0, 0, Unlock);
        assert_eq!(l.ranges(), &[r(1, u64::MAX - 1, Write), r(u64::MAX, u64::MAX, Read)]);
        assert_eq!(l.len_after(0, u64::MAX, Unlock), 0);
    }

    #[test]
    fn only_write_locks_conflict() {
        assert!(!Read.conflicts(Read));
        assert!(Read.conflicts(Write) && Write.conflicts(Read) && Write.conflicts(Write));
        assert!(!Unlock.conflicts(Write));
    }

    proptest::proptest! {
        /// Against a byte map: after any sequence of requests over a small
        /// file, the ranges say exactly what each byte holds, and stay
        /// sorted, disjoint and merged.
        #[test]
        fn ranges_match_a_byte_by_byte_model(ops in proptest::collection::vec((0u64..64, 0u64..64, 1u8..=3), 0..40)) {
            let mut l = OwnerLocks::default();
            let mut model = [None::<LockKind>; 64];
            for (a, b, k) in ops {
                let (start, end) = (a.min(b), a.max(b));
                let kind = match k { 1 => Read, 2 => Write, _ => Unlock };
                let predicted = l.len_after(start, end, kind);
                let naive: Vec<LockRange> = l.ranges().iter().filter(|r| r.overlaps(start, end)).copied().collect();
                proptest::prop_assert_eq!(l.overlapping(start, end), &naive[..]);
                l.apply(start, end, kind);
                proptest::prop_assert_eq!(predicted, l.ranges().len());
                for m in &mut model[start as usize..=end as usize] {
                    *m = (kind != Unlock).then_some(kind);
                }
            }
            let mut seen = [None::<LockKind>; 64];
            for w in l.ranges().windows(2) {
                proptest::prop_assert!(w[0].end < w[1].start);
                proptest::prop_assert!(!(w[0].kind == w[1].kind && w[0].end + 1 == w[1].start));
            }
            for rg in l.ranges() {
                for s in &mut seen[rg.start as usize..=rg.end as usize] {
                    *s = Some(rg.kind);
                }
            }
            proptest::prop_assert_eq!(seen, model);
        }
    }
}
