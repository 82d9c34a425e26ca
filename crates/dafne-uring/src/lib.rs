//! A safe io_uring for dafne's storage I/O.
//!
//! # Why
//! The io server stores unit-sized blocks of its cache in chunk files. With
//! O_DIRECT the bytes move once, between the device and the registered cache
//! unit, with no second copy in the page cache; io_uring lets several units
//! of a fill or a write-back go to the kernel in one system call
//! (`io_uring_enter`) instead of one `pread`/`pwrite` each. This crate is
//! the only place that talks to the ring, so that the rest of dafne stays
//! free of `unsafe` (like `dafne-ucx` for UCX).
//!
//! # The one invariant
//! The kernel writes into (or reads from) a buffer from the moment an
//! operation is submitted until its completion is reaped, without any borrow
//! the compiler can see. The API therefore never returns while an operation
//! it submitted is in flight: [`Ring::run`] takes the buffers of a batch of
//! [`Op`]s by `&mut`/`&` for the duration of the call, submits them, and
//! waits for every completion before returning. Nothing is left in the
//! submission queue either, so no later call can submit an entry whose
//! buffer is gone. If the ring itself breaks while operations are in flight
//! (an `io_uring_enter` error other than the transient `EINTR`, `EAGAIN`
//! and `EBUSY`), the process aborts: returning would let the caller free
//! memory the kernel may still write, which is worse than a crash.
//!
//! # Limits
//! At most `entries` (given to [`Ring::new`], ≤ 4096) operations are in
//! flight at once; a longer batch is fed to the ring as completions free
//! room. The completion queue has twice as many entries as the submission
//! queue (the kernel's default), so it cannot overflow. One operation moves
//! at most `u32::MAX` bytes (io_uring's length field); a longer buffer is
//! served partly, and the returned count says so, as for `pread`.
//!
//! # Threading
//! A [`Ring`] is `Send` but not `Sync`: one thread owns it at a time (each
//! call needs `&mut`). The io server keeps one ring on its event loop.

pub mod fuse;

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, squeue, types, IoUring};

/// The most submission entries a ring may have (bounds kernel memory per ring).
pub const MAX_ENTRIES: u32 = 4096;

/// Why a ring could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// `entries` is 0 or above [`MAX_ENTRIES`].
    #[error("a ring needs 1..={max} entries, not {entries}", max = MAX_ENTRIES)]
    Entries { entries: u32 },
    /// `io_uring_setup` failed: an old kernel (`ENOSYS`), io_uring disabled
    /// by `kernel.io_uring_disabled` or a seccomp filter (`EPERM`), or no
    /// locked memory left (`ENOMEM`).
    #[error("io_uring_setup with {entries} entries: {source}")]
    Setup {
        entries: u32,
        #[source]
        source: io::Error,
    },
}

/// One storage operation of a batch: its file, position and buffer. The
/// batch borrows every buffer until [`Ring::run`] returns, which is after
/// the kernel has finished with it.
#[derive(Debug)]
pub enum Op<'a> {
    /// Read up to `buf.len()` bytes at `offset` (`pread`): fewer at end of file.
    Read { fd: BorrowedFd<'a>, offset: u64, buf: &'a mut [u8] },
    /// Write up to `buf.len()` bytes at `offset` (`pwrite`).
    Write { fd: BorrowedFd<'a>, offset: u64, buf: &'a [u8] },
    /// `fdatasync` (`data_only`) or `fsync`. It starts only after every
    /// operation before it in the batch has completed (`IOSQE_IO_DRAIN`),
    /// so "writes, then sync" can be one batch.
    Sync { fd: BorrowedFd<'a>, data_only: bool },
}

/// What a ring has done.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RingStats {
    /// `io_uring_enter` calls (submissions and waits).
    pub enters: u64,
    /// Operations completed (successfully or not).
    pub ops: u64,
    /// Bytes read and written by the operations that succeeded.
    pub bytes: u64,
}

/// An io_uring instance owned by one thread at a time.
pub struct Ring {
    ring: IoUring,
    entries: u32,
    stats: RingStats,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("entries", &self.entries).field("stats", &self.stats).finish()
    }
}

impl Ring {
    /// A ring with `entries` submission entries (rounded up to a power of
    /// two by the kernel). Fails where io_uring is unavailable; callers fall
    /// back to `pread`/`pwrite`.
    pub fn new(entries: u32) -> Result<Ring, RingError> {
        if entries == 0 || entries > MAX_ENTRIES {
            return Err(RingError::Entries { entries });
        }
        let ring = IoUring::new(entries).map_err(|source| RingError::Setup { entries, source })?;
        let entries = ring.params().sq_entries();
        Ok(Ring { ring, entries, stats: RingStats::default() })
    }

    /// Submission entries (the most operations in flight at once).
    pub fn entries(&self) -> u32 {
        self.entries
    }

    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Runs every operation of `ops` and returns, in the same order, each
    /// one's result: bytes transferred for reads and writes (a short count
    /// as from `pread`/`pwrite`), 0 for syncs, or the error the kernel gave.
    /// Up to [`Ring::entries`] operations go to the kernel per system call,
    /// which returns when they have all completed (so a batch of `k`
    /// operations takes `ceil(k / entries)` calls, plus any interrupted by a
    /// signal); they run concurrently (no order among reads and writes; see
    /// [`Op::Sync`]). Returns only once every operation has completed.
    pub fn run(&mut self, ops: &mut [Op<'_>]) -> Vec<io::Result<usize>> {
        let mut results: Vec<Option<io::Result<usize>>> = (0..ops.len()).map(|_| None).collect();
        let mut next = 0usize; // first op not yet pushed
        let mut in_flight = 0usize; // pushed, not reaped
        let mut done = 0usize;
        while done < ops.len() {
            {
                let mut sq = self.ring.submission();
                while next < ops.len() && in_flight < self.entries as usize {
                    let entry = sqe(&mut ops[next]).user_data(next as u64);
                    // SAFETY: the entry points into a buffer (or names a
                    // file) that `ops` borrows for this whole call, and this
                    // call returns only after reaping the entry's completion
                    // (the loop runs until `done == ops.len()`; a broken ring
                    // aborts the process instead of returning). So the
                    // memory outlives the kernel's use of it.
                    if unsafe { sq.push(&entry) }.is_err() {
                        break; // full: `in_flight` < entries keeps this from happening
                    }
                    next += 1;
                    in_flight += 1;
                }
            }
            // Wait for the whole submission: one system call per `entries`
            // operations, and a batch that fits the ring is one call.
            self.enter(in_flight);
            for cqe in self.ring.completion() {
                let i = cqe.user_data() as usize;
                let r = cqe.result();
                let res = if r < 0 { Err(io::Error::from_raw_os_error(-r)) } else { Ok(r as usize) };
                self.stats.ops += 1;
                if let (Ok(n), Op::Read { .. } | Op::Write { .. }) = (&res, &ops[i]) {
                    self.stats.bytes += *n as u64;
                }
                debug_assert!(results[i].is_none(), "one completion per operation");
                results[i] = Some(res);
                in_flight -= 1;
                done += 1;
            }
        }
        results.into_iter().map(|r| r.expect("every operation completed")).collect()
    }

    /// One read (`pread`) through the ring.
    pub fn read_at(&mut self, fd: BorrowedFd<'_>, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.run(&mut [Op::Read { fd, offset, buf }]).pop().expect("one result")
    }

    /// One write (`pwrite`) through the ring.
    pub fn write_at(&mut self, fd: BorrowedFd<'_>, offset: u64, buf: &[u8]) -> io::Result<usize> {
        self.run(&mut [Op::Write { fd, offset, buf }]).pop().expect("one result")
    }

    /// `fdatasync` (`data_only`) or `fsync` through the ring.
    pub fn sync(&mut self, fd: BorrowedFd<'_>, data_only: bool) -> io::Result<()> {
        self.run(&mut [Op::Sync { fd, data_only }]).pop().expect("one result").map(|_| ())
    }

    /// Submits what the submission queue holds and waits for at least
    /// `want` completions, retrying transient errors. Any other error means
    /// the ring is broken while the kernel may hold our buffers: abort.
    fn enter(&mut self, want: usize) {
        loop {
            self.stats.enters += 1;
            match self.ring.submit_and_wait(want) {
                Ok(_) => return,
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc_errno::EINTR | libc_errno::EAGAIN | libc_errno::EBUSY)) =>
                {
                    // EAGAIN/EBUSY: the kernel is short of resources or the
                    // completion queue is full; completions already posted
                    // are reaped by the caller, so a wait for one is enough.
                    if self.ring.completion().len() >= want {
                        return;
                    }
                }
                Err(e) => {
                    eprintln!("dafne-uring: io_uring_enter failed with operations in flight ({e}); aborting");
                    std::process::abort();
                }
            }
        }
    }
}

/// The errno values `enter` retries (Linux numbers, the same on every
/// architecture dafne builds for).
mod libc_errno {
    pub const EINTR: i32 = 4;
    pub const EAGAIN: i32 = 11;
    pub const EBUSY: i32 = 16;
}

/// The submission entry of one operation (without user data).
fn sqe(op: &mut Op<'_>) -> squeue::Entry {
    match op {
        Op::Read { fd, offset, buf } => {
            let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
            opcode::Read::new(types::Fd(fd.as_raw_fd()), buf.as_mut_ptr(), len).offset(*offset).build()
        }
        Op::Write { fd, offset, buf } => {
            let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
            opcode::Write::new(types::Fd(fd.as_raw_fd()), buf.as_ptr(), len).offset(*offset).build()
        }
        Op::Sync { fd, data_only } => {
            let flags = if *data_only { types::FsyncFlags::DATASYNC } else { types::FsyncFlags::empty() };
            opcode::Fsync::new(types::Fd(fd.as_raw_fd())).flags(flags).build().flags(squeue::Flags::IO_DRAIN)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_bounded() {
        assert!(matches!(Ring::new(0), Err(RingError::Entries { entries: 0 })));
        assert!(matches!(Ring::new(MAX_ENTRIES + 1), Err(RingError::Entries { .. })));
    }
}
