//! Completion queues and asynchronous I/O (DAFS's completion groups).
//!
//! `dafne_post_read` / `dafne_post_write` start a transfer between a file
//! and memory of a `dafne_mem` handle and return at once with a ticket; the
//! transfer runs on the queue's driver thread (the io servers move the
//! bytes by RMA) and its outcome, bytes or `-errno`, is queued. The
//! application takes outcomes with `dafne_cq_poll` (no waiting),
//! `dafne_cq_wait` (one ticket; others stay queued) or `dafne_cq_wait_any`.
//! A queue may hold operations of several files and clients; an
//! application may have any number of queues (one per thread, or per
//! group of requests).

use std::ffi::c_int;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use ::dafne_client::cq::{Completion, CompletionQueue, Ticket, Waited};
use ::dafne_client::Errno;
use dafne_proto::io::Stability;

use crate::mem::{dafne_mem, mem};
use crate::{client, dafne_client, guard, guard_int, handle, put, release};

const CQ_TAG: u64 = 0xDAF0_C0C0_0000_0001;

/// A completion queue. Opaque to C.
///
/// `#[repr(C)]` for the tag's place only: cbindgen is told to skip it
/// (`cbindgen.toml` declares it opaque), so C sees no field.
/// cbindgen:ignore
#[repr(C)]
#[derive(Debug)]
pub struct dafne_cq {
    tag: AtomicU64,
    cq: CompletionQueue,
}
// The tag is the first word, so a check reads the first 8 bytes of
// whatever it is given, however the other fields change.
const _: () = assert!(std::mem::offset_of!(dafne_cq, tag) == 0);

/// The outcome of a posted operation.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct dafne_completion {
    /// What `dafne_post_read` / `dafne_post_write` returned.
    pub ticket: u64,
    /// Bytes moved (`>= 0`), or `-errno`.
    pub result: i64,
}

impl From<Completion> for dafne_completion {
    fn from((t, r): Completion) -> dafne_completion {
        dafne_completion { ticket: t.0, result: r.map_or_else(|e| -i64::from(e.0), |n| n as i64) }
    }
}

/// The queue behind `q`.
///
/// # Safety
/// As [`handle`].
unsafe fn queue<'a>(q: *const dafne_cq) -> Result<&'a dafne_cq, Errno> {
    // SAFETY: the caller's contract is `handle`'s.
    unsafe { handle(q, &|q: &dafne_cq| &q.tag, CQ_TAG) }
}

/// A wait of `ms` milliseconds; negative: as long as it takes.
fn timeout(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// Waits in steps no longer than an hour (so that a deadline never
/// overflows), for ever when `total` is `None`.
fn wait_steps<T>(total: Option<Duration>, mut step: impl FnMut(Duration) -> Option<T>) -> Option<T> {
    const STEP: Duration = Duration::from_secs(3600);
    let mut left = total;
    loop {
        let this = left.map_or(STEP, |l| l.min(STEP));
        if let Some(v) = step(this) {
            return Some(v);
        }
        match left.as_mut() {
            Some(l) if *l <= this => return None,
            Some(l) => *l -= this,
            None => {}
        }
    }
}

/// Makes a completion queue (with its driver thread).
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_cq_create(out: *mut *mut dafne_cq) -> c_int {
    guard_int(|| {
        let q = Box::new(dafne_cq { tag: AtomicU64::new(CQ_TAG), cq: CompletionQueue::new() });
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, Box::into_raw(q)) }
    })
}

/// Releases a queue. `-EBUSY` (and the queue stays) while operations are
/// outstanding: wait for them first. Completions not taken are dropped.
///
/// # Safety
/// `q` is NULL or a queue not yet released.
#[no_mangle]
pub unsafe extern "C" fn dafne_cq_destroy(q: *mut dafne_cq) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        if unsafe { queue(q)? }.cq.outstanding() > 0 {
            return Err(Errno::EBUSY);
        }
        // SAFETY: the caller's contract is `release`'s.
        unsafe { release(q, |q: &dafne_cq| &q.tag, CQ_TAG) }
    })
}

/// Operations posted on `q` and not yet completed.
///
/// # Safety
/// `q` is a queue handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_cq_outstanding(q: *const dafne_cq) -> i64 {
    // SAFETY: the caller's contract.
    guard(|| Ok(unsafe { queue(q)? }.cq.outstanding() as i64))
}

/// Takes the oldest completion without waiting: 0 and `*out` filled, or
/// `-EAGAIN` if none is there.
///
/// # Safety
/// `q` is a queue handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_cq_poll(q: *const dafne_cq, out: *mut dafne_completion) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { queue(q)? };
        if out.is_null() {
            return Err(Errno::EINVAL);
        }
        let c = q.cq.poll().ok_or(Errno::EAGAIN)?;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, c.into()) }
    })
}

/// Waits up to `timeout_ms` (negative: without limit) for the operation
/// `ticket` and takes its completion: 0 and `*out` filled, or
/// `-ETIMEDOUT`. Other completions stay queued. A ticket that is neither
/// outstanding nor queued (taken already, or never posted on `q`) is
/// `-ENOENT` at once, `*out` untouched. An operation that itself failed
/// (with any errno, `ETIMEDOUT` included) is a completion: 0, and its
/// `-errno` in `out->result`.
///
/// # Safety
/// `q` is a queue handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_cq_wait(
    q: *const dafne_cq,
    ticket: u64,
    timeout_ms: i64,
    out: *mut dafne_completion,
) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { queue(q)? };
        if out.is_null() {
            return Err(Errno::EINVAL);
        }
        let t = Ticket(ticket);
        let r = wait_steps(timeout(timeout_ms), |d| match q.cq.wait_ticket(t, d) {
            Waited::TimedOut => None,
            Waited::Unknown => Some(Err(Errno::ENOENT)),
            Waited::Done(r) => Some(Ok(r)),
        })
        .ok_or(Errno::ETIMEDOUT)??;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, (t, r).into()) }
    })
}

/// Waits up to `timeout_ms` (negative: without limit) for any completion
/// and takes it: 0 and `*out` filled; `-ETIMEDOUT` if none came, `-ENOENT`
/// if nothing is outstanding or queued (nothing would come).
///
/// # Safety
/// `q` is a queue handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_cq_wait_any(q: *const dafne_cq, timeout_ms: i64, out: *mut dafne_completion) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { queue(q)? };
        if out.is_null() {
            return Err(Errno::EINVAL);
        }
        let mut idle = false;
        let c = wait_steps(timeout(timeout_ms), |d| {
            let c = q.cq.wait_any(d);
            idle = c.is_none() && q.cq.outstanding() == 0;
            // Nothing outstanding: stop waiting.
            if idle {
                Some(None)
            } else {
                c.map(Some)
            }
        });
        let c = match c {
            Some(Some(c)) => c,
            Some(None) => return Err(Errno::ENOENT),
            None => return Err(Errno::ETIMEDOUT),
        };
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, c.into()) }
    })
}

/// Posts a read of up to `len` bytes at file `offset` of `fd` into the
/// memory `m` at `mem_offset` on `q`: the ticket (`> 0`). The read is
/// clamped now to the file's size as this descriptor knows it (past it,
/// the completion reports 0 bytes). Until its completion is taken, the
/// memory belongs to the operation: do not touch, free or unmap it.
///
/// # Safety
/// `c`, `q` and `m` are handles of this library.
#[no_mangle]
pub unsafe extern "C" fn dafne_post_read(
    c: *const dafne_client,
    fd: c_int,
    q: *const dafne_cq,
    m: *const dafne_mem,
    mem_offset: usize,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, q, m) = unsafe { (client(c)?, queue(q)?, mem(m)?) };
        m.range(mem_offset, len)?;
        let o = c.readable(fd)?;
        // Counted in flight until it finishes, for `dafne_close` to wait.
        let busy = o.posted.start();
        let t = match m.slice(mem_offset, len) {
            Some(s) => o.file.post_read_with(&q.cq, offset, len, move |data, open, n| async move {
                let _busy = busy;
                data.read_region(&open, offset, &s.region, s.offset, n).await
            }),
            None => {
                let addr = user_addr(m, mem_offset);
                o.file.post_read_with(&q.cq, offset, len, move |data, open, n| async move {
                    let _busy = busy;
                    // SAFETY: registered memory stays valid until it is
                    // freed, and belongs to this operation until its
                    // completion is taken (the header's contract for
                    // posted operations); `n <= len` fits in it (checked
                    // against its length at posting).
                    let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n) };
                    data.read_into(&open, offset, buf).await
                })
            }
        };
        Ok(t.0 as i64)
    })
}

/// Posts a write of `len` bytes of the memory `m` at `mem_offset` to file
/// `offset` of `fd` on `q`: the ticket (`> 0`). The memory belongs to the
/// operation until its completion is taken.
///
/// # Safety
/// `c`, `q` and `m` are handles of this library.
#[no_mangle]
pub unsafe extern "C" fn dafne_post_write(
    c: *const dafne_client,
    fd: c_int,
    q: *const dafne_cq,
    m: *const dafne_mem,
    mem_offset: usize,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, q, m) = unsafe { (client(c)?, queue(q)?, mem(m)?) };
        m.range(mem_offset, len)?;
        let o = c.writable(fd)?;
        let busy = o.posted.start();
        let t = match m.slice(mem_offset, len) {
            Some(s) => o.file.post_write_with(&q.cq, offset, move |data, open| async move {
                let _busy = busy;
                data.write_region(&open, offset, &s.region, s.offset, s.len, Stability::Unstable).await
            }),
            None => {
                let addr = user_addr(m, mem_offset);
                o.file.post_write_with(&q.cq, offset, move |data, open| async move {
                    let _busy = busy;
                    // SAFETY: as in `dafne_post_read`, for reads of `len`
                    // bytes.
                    let buf = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                    data.write_from(&open, offset, buf, Stability::Unstable).await
                })
            }
        };
        Ok(t.0 as i64)
    })
}

/// The address of byte `offset` of application memory.
fn user_addr(m: &dafne_mem, offset: usize) -> usize {
    match m.kind {
        crate::mem::Kind::User { addr, .. } => addr + offset,
        crate::mem::Kind::Region(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_queue_polls_eagain_and_waits_enoent_and_destroys() {
        let mut q = std::ptr::null_mut();
        let mut c = dafne_completion::default();
        // SAFETY: a queue this test made, used until it is destroyed.
        unsafe {
            assert_eq!(dafne_cq_create(&mut q), 0);
            assert_eq!(dafne_cq_outstanding(q), 0);
            assert_eq!(dafne_cq_poll(q, &mut c), -11);
            assert_eq!(dafne_cq_wait_any(q, 10, &mut c), -2);
            assert_eq!(dafne_cq_wait_any(q, -1, &mut c), -2, "no wait for ever on an idle queue");
            assert_eq!(dafne_cq_wait(q, 1, -1, &mut c), -2, "no wait for ever on a ticket never posted");
            assert_eq!(dafne_cq_poll(q, std::ptr::null_mut()), -22);
            assert_eq!(dafne_cq_destroy(q), 0);
            assert_eq!(dafne_cq_destroy(std::ptr::null_mut()), -22);
        }
    }

    #[test]
    fn a_queue_with_work_outstanding_is_not_destroyed() {
        let mut q = std::ptr::null_mut();
        let mut c = dafne_completion::default();
        // SAFETY: a queue this test made, used until it is destroyed.
        unsafe {
            assert_eq!(dafne_cq_create(&mut q), 0);
            let (tx, rx) = futures::channel::oneshot::channel::<usize>();
            let t = (*q).cq.post(async move { rx.await.map_err(|_| Errno::EIO) });
            assert_eq!(dafne_cq_destroy(q), -16);
            assert_eq!(dafne_cq_wait(q, t.0, 10, &mut c), -110);
            tx.send(5).unwrap();
            assert_eq!(dafne_cq_wait_any(q, -1, &mut c), 0);
            assert_eq!((c.ticket, c.result), (t.0, 5));
            let failing = (*q).cq.post(async { Err(Errno::ENOSPC) });
            assert_eq!(dafne_cq_wait(q, failing.0, -1, &mut c), 0);
            assert_eq!(c.result, -28);
            // An operation that failed with ETIMEDOUT (an io server's
            // deadline) is its completion, not a timeout of the wait: it
            // was taken from the queue and then lost.
            let late = (*q).cq.post(async { Err(Errno::ETIMEDOUT) });
            c = dafne_completion::default();
            assert_eq!(dafne_cq_wait(q, late.0, 5000, &mut c), 0);
            assert_eq!((c.ticket, c.result), (late.0, -110));
            assert_eq!(dafne_cq_wait(q, late.0, -1, &mut c), -2, "taken already: no wait for ever");
            assert_eq!(dafne_cq_destroy(q), 0);
        }
    }

    #[test]
    fn waits_in_steps_end_at_the_total() {
        let mut calls = 0;
        let r: Option<()> = wait_steps(Some(Duration::from_secs(7200 + 5)), |_| {
            calls += 1;
            None
        });
        assert!(r.is_none());
        assert_eq!(calls, 3);
    }
}
