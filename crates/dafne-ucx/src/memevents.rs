//! Unmap events: which address ranges left the process's address space.
//!
//! # Why
//! A registration cache keyed by address (the client's cache of
//! registrations of application memory) must never serve a registration
//! after its memory was unmapped: the next mapping at that address is other
//! memory (on RDMA hardware, other physical pages than the ones the
//! registration pinned). UCX ships `libucm`, which hooks `munmap`, `mremap`,
//! `shmdt`, `sbrk` shrinking and `madvise(DONTNEED)` (in 1.13 by patching
//! the functions themselves, "bistro" mode, so glibc's internal `munmap`
//! inside `free` is seen too: checked here with a C program before this
//! was written) and reports each as `UCM_EVENT_VM_UNMAPPED`.
//! [`watch_unmaps`] installs one handler for the process, and any number
//! of [`UnmapCursor`]s read what it recorded. Installing it patches those
//! libc functions for the life of the process, as UCX does for its own
//! registration cache on RDMA hardware; `UCX_MEM_EVENTS=no` or a failed
//! install makes [`watch_unmaps`] fail, and callers must then not cache.
//!
//! # What the handler may do
//! It runs inside `munmap`, possibly inside `free` with malloc's locks held,
//! on any thread. So it allocates nothing and takes no lock: it bumps a
//! global sequence number and writes the range into a fixed ring of
//! [`RING`] records (a per-record seqlock of atomics). A reader that falls
//! more than [`RING`] events behind, or finds a record that is being
//! written or was overwritten, gets [`Unmapped::Unknown`]: it must assume
//! anything may have been unmapped (a cache drops everything), which is
//! always correct and only costs re-registration.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use ucx_sys as sys;

use crate::error::Result;

/// Unmap records kept; a reader further behind gets [`Unmapped::Unknown`].
pub const RING: usize = 4096;

struct Rec {
    /// `seq + 1` of the event held; 0 while being written.
    stamp: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
}

static RECS: [Rec; RING] =
    [const { Rec { stamp: AtomicU64::new(0), start: AtomicUsize::new(0), len: AtomicUsize::new(0) } }; RING];
/// Events recorded so far (the next event's sequence number).
static HEAD: AtomicU64 = AtomicU64::new(0);
static INSTALLED: OnceLock<std::result::Result<(), crate::error::Status>> = OnceLock::new();

fn record(start: usize, len: usize) {
    let seq = HEAD.fetch_add(1, Ordering::AcqRel);
    let r = &RECS[(seq % RING as u64) as usize];
    r.stamp.store(0, Ordering::Relaxed);
    fence(Ordering::Release);
    r.start.store(start, Ordering::Relaxed);
    r.len.store(len, Ordering::Relaxed);
    r.stamp.store(seq + 1, Ordering::Release);
}

/// UCM's callback. Only atomics: see the module docs.
unsafe extern "C" fn on_unmap(
    _event_type: sys::ucm_event_type_t,
    event: *mut sys::ucm_event_t,
    _arg: *mut libc::c_void,
) {
    if event.is_null() {
        return;
    }
    // SAFETY: UCM calls this handler only for the events it was installed
    // for (UCM_EVENT_VM_UNMAPPED), with `event` pointing to a live event
    // whose `vm_unmapped` member is the one filled in; we copy two plain
    // values out of it and keep no reference.
    let (addr, size) = unsafe { ((*event).vm_unmapped.address as usize, (*event).vm_unmapped.size) };
    record(addr, size);
}

/// Installs the process-wide unmap handler (once; later calls return the
/// first outcome). Fails if UCM cannot hook the memory calls here (then no
/// cache may rely on unmap events).
pub fn watch_unmaps() -> Result<()> {
    let r = INSTALLED.get_or_init(|| {
        // SAFETY: `on_unmap` has the signature UCM expects, touches only
        // static atomics and stays valid for the life of the process (it
        // is never unset); the argument is unused (null).
        let st = unsafe {
            sys::ucm_set_event_handler(
                sys::UCM_EVENT_VM_UNMAPPED as libc::c_int,
                1000,
                Some(on_unmap),
                std::ptr::null_mut(),
            )
        };
        if st == sys::UCS_OK as sys::ucs_status_t {
            Ok(())
        } else {
            Err(crate::Status(st))
        }
    });
    r.map_err(|status| crate::Error::Ucx { op: "ucm_set_event_handler", status })
}

/// Unmap events recorded since the handler was installed (all threads).
pub fn unmap_events() -> u64 {
    HEAD.load(Ordering::Acquire)
}

/// What a cursor reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmapped {
    /// Bytes `[start, start + len)` were unmapped.
    Range { start: usize, len: usize },
    /// Events were missed (the ring was overrun, or a record was being
    /// written): anything may have been unmapped.
    Unknown,
}

/// A reader's position in the unmap events.
#[derive(Debug)]
pub struct UnmapCursor {
    next: u64,
}

impl Default for UnmapCursor {
    fn default() -> Self {
        UnmapCursor::new()
    }
}

impl UnmapCursor {
    /// A cursor that sees events from now on.
    pub fn new() -> UnmapCursor {
        UnmapCursor { next: HEAD.load(Ordering::Acquire) }
    }

    /// Reports every event since the last call to `f`; returns how many
    /// were reported (one [`Unmapped::Unknown`] stands for all missed ones).
    pub fn poll(&mut self, mut f: impl FnMut(Unmapped)) -> usize {
        let head = HEAD.load(Ordering::Acquire);
        if head - self.next > RING as u64 {
            self.next = head;
            f(Unmapped::Unknown);
            return 1;
        }
        let mut n = 0;
        let mut unknown = false;
        while self.next < head {
            let seq = self.next;
            let r = &RECS[(seq % RING as u64) as usize];
            let s1 = r.stamp.load(Ordering::Acquire);
            let (start, len) = (r.start.load(Ordering::Relaxed), r.len.load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            let s2 = r.stamp.load(Ordering::Relaxed);
            if s1 == seq + 1 && s2 == s1 {
                f(Unmapped::Range { start, len });
                n += 1;
            } else {
                unknown = true;
            }
            self.next += 1;
        }
        if unknown {
            f(Unmapped::Unknown);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test, not two: the second half floods the shared ring, which
    /// would make a concurrent first half see `Unknown` instead of its range.
    #[test]
    fn frees_are_seen_and_a_reader_that_falls_behind_gets_unknown() {
        watch_unmaps().unwrap();
        let mut c = UnmapCursor::new();
        // Above glibc's largest mmap threshold (32 MiB), so malloc maps it
        // and free unmaps it whatever earlier frees did to the threshold.
        let v = vec![1u8; 40 << 20];
        let (start, end) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
        drop(v);
        let mut seen = false;
        c.poll(|u| {
            if let Unmapped::Range { start: s, len } = u {
                seen |= s <= start && s + len >= end;
            }
        });
        assert!(seen, "the unmap of the freed buffer was not reported");

        let mut c = UnmapCursor::new();
        for _ in 0..RING + 1 {
            record(4096, 4096);
        }
        let mut got = Vec::new();
        c.poll(|u| got.push(u));
        assert_eq!(got, vec![Unmapped::Unknown]);
        let mut c = UnmapCursor::new();
        record(8192, 100);
        let mut got = Vec::new();
        c.poll(|u| got.push(u));
        assert!(got.contains(&Unmapped::Range { start: 8192, len: 100 }), "{got:?}");
    }
}
