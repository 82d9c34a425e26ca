//! FUSE over io_uring: one ring entry of the kernel's FUSE ring, safely.
//!
//! # What the kernel does (fs/fuse/dev_uring.c, Linux ≥ 6.14)
//! With the module parameter `fuse.enable_uring=Y` and `FUSE_OVER_IO_URING`
//! agreed in INIT, the daemon registers *ring entries* on the `/dev/fuse`
//! file: one `IORING_OP_URING_CMD` (128-byte SQE) per entry, command
//! `FUSE_IO_URING_CMD_REGISTER`, whose `addr`/`len` is an `iovec[2]`: a
//! header buffer (`struct fuse_uring_req_header`: `in_out[128]`,
//! `op_in[128]`, `fuse_uring_ent_in_out`) and a payload buffer of at least
//! the connection's max payload (`max(8 KiB, max_write, max_pages × page)`).
//! There is one queue per possible CPU (`qid`); a request goes to the queue
//! of the CPU it was issued on, and the ring serves nothing until every
//! queue has an entry. A request arrives as the completion of the entry's
//! command: `fuse_in_header` in `in_out`, the op's first argument (its
//! fixed struct, when not empty) in `op_in`, the other arguments in the
//! payload (`payload_sz` bytes). The reply goes back the same way:
//! `fuse_out_header` in `in_out`, the reply's arguments in the payload,
//! `payload_sz` set, then `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` with the
//! request's `commit_id`, which also waits for the next request. FORGET
//! and INTERRUPT still come through `read(/dev/fuse)`. At unmount the
//! kernel completes waiting entries with `-ENOTCONN`.
//!
//! # Shape
//! A [`FuseRing`] is one io_uring with exactly one FUSE ring entry; one
//! thread owns it (`&mut` calls). One entry per ring means a request waits
//! only for an idle thread: the kernel hands a request to an entry only
//! after that entry's thread has committed its previous one.
//! [`FuseRing::register`] and [`FuseRing::wait`] wait for a request;
//! [`FuseRing::request`] gives it as the contiguous bytes a
//! `read(/dev/fuse)` would have given (header, first argument, rest);
//! [`FuseRing::commit`] sends the reply and waits for the next request. The reply is given through a [`FuseReplier`] that any
//! thread may use, before or after the request's borrow ends.
//!
//! # Memory
//! One page-aligned allocation per entry: the header buffer at 0, the
//! payload at [`PAYLOAD_OFFSET`]. A large request (a write) is made
//! contiguous without copying its data: its `fuse_in_header` and first
//! argument are copied into the gap just before the payload. The kernel
//! may write into the allocation from registration until the entry is torn
//! down; the memory is therefore freed only after the kernel's final
//! completion of the entry (`-ENOTCONN` at unmount), and leaked if the ring
//! goes away without one.

use std::alloc::Layout;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// `FUSE_IO_URING_CMD_REGISTER` (include/uapi/linux/fuse.h).
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `sizeof(struct fuse_uring_req_header)`: `in_out[128]`, `op_in[128]`,
/// `struct fuse_uring_ent_in_out` (flags, commit_id, payload_sz, padding,
/// reserved: 32 bytes).
pub const HEADER_SIZE: usize = 288;
const OP_IN: usize = 128;
const OP_IN_SIZE: usize = 128;
const ENT_COMMIT_ID: usize = 256 + 8;
const ENT_PAYLOAD_SZ: usize = 256 + 16;
/// `sizeof(struct fuse_in_header)`.
pub const IN_HEADER_SIZE: usize = 40;
/// `sizeof(struct fuse_out_header)`.
pub const OUT_HEADER_SIZE: usize = 16;
/// Where the payload starts in an entry's allocation; the bytes before it
/// hold the header buffer (at 0) and the gap for a contiguous request.
pub const PAYLOAD_OFFSET: usize = 4096;
/// Requests whose payload is at most this are copied into a separate
/// buffer (cheap, and the reply may then go straight into the payload);
/// larger ones (writes) are made contiguous in place.
pub const COPY_LIMIT: usize = 64 * 1024;
/// `FUSE_MIN_READ_BUFFER`: the least max payload the kernel uses.
pub const MIN_PAYLOAD: usize = 8192;

const EIO: i32 = 5;

/// Why a FUSE ring could not be made or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FuseRingError {
    /// `io_uring_setup` with 128-byte SQEs failed (io_uring disabled by
    /// `kernel.io_uring_disabled`, a seccomp filter, an old kernel).
    #[error("io_uring_setup (SQE128): {0}")]
    Setup(#[source] io::Error),
    /// The payload size is 0 or absurd.
    #[error("a FUSE ring payload of {0} bytes is not usable")]
    PayloadSize(usize),
    /// `io_uring_enter` failed.
    #[error("io_uring_enter: {0}")]
    Enter(#[source] io::Error),
    /// The kernel refused a command: `EOPNOTSUPP` when `enable_uring` is
    /// off, `EINVAL` for a bad queue or buffer, `ENOTCONN`/`ECONNABORTED`
    /// once the file system is unmounted.
    #[error("FUSE io_uring {cmd} on queue {qid}: {source}")]
    Command {
        cmd: &'static str,
        qid: u16,
        #[source]
        source: io::Error,
    },
    /// The kernel's request does not fit its own description.
    #[error("malformed FUSE ring request: {0}")]
    Malformed(&'static str),
}

impl FuseRingError {
    /// True when the error means the connection is gone (unmounted).
    pub fn is_disconnected(&self) -> bool {
        // ENOTCONN, ECONNABORTED, ENODEV
        matches!(self, FuseRingError::Command { source, .. } if matches!(source.raw_os_error(), Some(107 | 103 | 19)))
    }
}

/// Where the reply of the current request is, between the replier and the
/// owning thread.
#[derive(Debug, Default)]
struct ReplyState {
    /// Counts requests; a replier answers only its own.
    generation: u64,
    /// The request's bytes live in the payload (in-place write): a reply
    /// given meanwhile waits in `pending`.
    request_in_payload: bool,
    /// The owning thread still borrows the request bytes.
    dispatching: bool,
    replied: bool,
    /// Reply body held back while the payload is borrowed.
    pending: Vec<u8>,
    pending_used: bool,
    /// Length of the reply body in the payload.
    body_len: usize,
    /// Live repliers of the current generation.
    repliers: usize,
    /// The kernel has finished with the memory for good.
    released: bool,
}

impl ReplyState {
    /// A new request arrived in the entry: nothing of the previous one's
    /// reply stays; its generation.
    fn next_request(&mut self, dispatching: bool, request_in_payload: bool) -> u64 {
        self.generation += 1;
        self.replied = false;
        self.pending_used = false;
        self.body_len = 0;
        self.repliers = 0;
        self.dispatching = dispatching;
        self.request_in_payload = request_in_payload;
        self.generation
    }
}

/// One entry's memory and the reply hand-off.
struct Entry {
    mem: NonNull<u8>,
    layout: Layout,
    payload_cap: usize,
    state: Mutex<ReplyState>,
    cv: Condvar,
}

// SAFETY: `mem` is a private heap allocation; every access to it goes
// through `state`'s mutex (repliers) or happens on the owning thread while
// the protocol (generation, `dispatching`, `request_in_payload`) keeps
// repliers off the bytes that thread reads.
unsafe impl Send for Entry {}
// SAFETY: as above; shared access is serialized by `state`.
unsafe impl Sync for Entry {}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("payload_cap", &self.payload_cap).finish_non_exhaustive()
    }
}

impl Entry {
    fn new(payload_cap: usize) -> Result<Entry, FuseRingError> {
        let size = PAYLOAD_OFFSET.checked_add(payload_cap).ok_or(FuseRingError::PayloadSize(payload_cap))?;
        if payload_cap == 0 || payload_cap > (1 << 30) {
            return Err(FuseRingError::PayloadSize(payload_cap));
        }
        let layout = Layout::from_size_align(size, 4096).map_err(|_| FuseRingError::PayloadSize(payload_cap))?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(mem) = NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        Ok(Entry { mem, layout, payload_cap, state: Mutex::new(ReplyState::default()), cv: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, ReplyState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn base(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// Copies `src` to `off` in the allocation.
    ///
    /// # Safety
    /// `off + src.len()` is within the allocation, and no reference to
    /// those bytes is alive (the caller holds the state lock, or is the
    /// owning thread while the kernel and repliers stay off them).
    unsafe fn write_at(&self, off: usize, src: &[u8]) {
        debug_assert!(off + src.len() <= self.layout.size());
        // SAFETY: in bounds and unaliased per the contract; `src` is a
        // different allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base().add(off), src.len()) };
    }

    /// Reads `N` bytes at `off`.
    ///
    /// # Safety
    /// As for [`Entry::write_at`]: in bounds, nobody writes meanwhile.
    unsafe fn read_at<const N: usize>(&self, off: usize) -> [u8; N] {
        let mut out = [0u8; N];
        debug_assert!(off + N <= self.layout.size());
        // SAFETY: per the contract.
        unsafe { std::ptr::copy_nonoverlapping(self.base().add(off), out.as_mut_ptr(), N) };
        out
    }

    /// Takes the request the kernel wrote into the entry: its commit id,
    /// and its bytes made contiguous (in `scratch`, or in place before the
    /// payload for large ones) with this request's reply generation. Called
    /// by the owning thread after the kernel completed the entry's command.
    fn assemble<'a>(&'a self, scratch: &'a mut Vec<u64>) -> (u64, Result<(&'a [u8], u64), FuseRingError>) {
        let entry = self;
        // SAFETY: the kernel completed the command, so the entry is with
        // user space; no replier exists for this generation yet.
        let in_header: [u8; IN_HEADER_SIZE] = unsafe { entry.read_at(0) };
        // SAFETY: as above.
        let commit_id = u64::from_ne_bytes(unsafe { entry.read_at(ENT_COMMIT_ID) });
        // SAFETY: as above.
        let payload_sz = u32::from_ne_bytes(unsafe { entry.read_at(ENT_PAYLOAD_SZ) }) as usize;
        let total = u32::from_ne_bytes(in_header[0..4].try_into().unwrap_or([0; 4])) as usize;
        let layout = match request_layout(total, payload_sz, entry.payload_cap) {
            Ok(l) => l,
            Err(e) => {
                // A new request nobody will answer: `finish_reply` must
                // answer it EIO, not commit the previous request's reply.
                entry.lock().next_request(false, false);
                return (commit_id, Err(e));
            }
        };
        let generation = entry.lock().next_request(true, layout.in_place);
        let start = PAYLOAD_OFFSET - IN_HEADER_SIZE - layout.arg0;
        let bytes: &[u8] = if layout.in_place {
            // SAFETY: the gap [start, PAYLOAD_OFFSET) is in the allocation
            // (arg0 ≤ 128) and disjoint from the header buffer; nobody else
            // touches gap or payload until this borrow ends (repliers hold
            // their body back while `request_in_payload && dispatching`).
            unsafe {
                entry.write_at(start, &in_header);
                let op_in: [u8; OP_IN_SIZE] = entry.read_at(OP_IN);
                entry.write_at(start + IN_HEADER_SIZE, &op_in[..layout.arg0]);
                std::slice::from_raw_parts(entry.base().add(start), total)
            }
        } else {
            scratch.clear();
            scratch.resize(total.div_ceil(8), 0);
            // SAFETY: u64 → u8 view of an owned Vec, within its length.
            let dst = unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr().cast::<u8>(), total) };
            dst[..IN_HEADER_SIZE].copy_from_slice(&in_header);
            // SAFETY: op_in and payload[..payload_sz] are in the allocation
            // and with user space; repliers write the payload only after
            // this copy (they take the lock we held above, and the copy is
            // done before the request is handed out).
            unsafe {
                let op_in: [u8; OP_IN_SIZE] = entry.read_at(OP_IN);
                dst[IN_HEADER_SIZE..IN_HEADER_SIZE + layout.arg0].copy_from_slice(&op_in[..layout.arg0]);
                std::ptr::copy_nonoverlapping(
                    entry.base().add(PAYLOAD_OFFSET),
                    dst[IN_HEADER_SIZE + layout.arg0..].as_mut_ptr(),
                    payload_sz,
                );
            }
            &dst[..]
        };
        (commit_id, Ok((bytes, generation)))
    }

    /// Waits until the current request is answered (or every replier is
    /// gone: then answers `EIO`), and lays the answer out for the kernel:
    /// out header in `in_out`, body at the payload's start, `payload_sz`.
    /// Called by the owning thread once the request's bytes are no longer
    /// borrowed.
    fn finish_reply(&self, commit_id: u64) {
        let entry = self;
        let mut st = entry.lock();
        st.dispatching = false;
        while !st.replied && st.repliers > 0 {
            st = entry.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if !st.replied {
            // Nobody will answer: EIO, so the caller does not hang.
            let mut h = [0u8; OUT_HEADER_SIZE];
            h[0..4].copy_from_slice(&(OUT_HEADER_SIZE as u32).to_ne_bytes());
            h[4..8].copy_from_slice(&(-EIO).to_ne_bytes());
            h[8..16].copy_from_slice(&commit_id.to_ne_bytes());
            // SAFETY: lock held; the entry is with user space.
            unsafe { entry.write_at(0, &h) };
            st.body_len = 0;
            st.replied = true;
        }
        if st.pending_used {
            let pending = std::mem::take(&mut st.pending);
            // SAFETY: the request borrow ended (the caller's contract); lock held; body_len ≤ payload_cap was checked.
            unsafe { entry.write_at(PAYLOAD_OFFSET, &pending[..st.body_len]) };
            st.pending = pending;
            st.pending_used = false;
        }
        let sz = u32::try_from(st.body_len).unwrap_or(u32::MAX);
        // SAFETY: lock held; the entry is with user space.
        unsafe { entry.write_at(ENT_PAYLOAD_SZ, &sz.to_ne_bytes()) };
        // Late repliers of this generation must not write any more.
        st.generation += 1;
        st.repliers = 0;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let released = self.state.get_mut().map(|s| s.released).unwrap_or(false);
        if released {
            // SAFETY: allocated in `Entry::new` with `self.layout`; the
            // kernel is done with it (`released`) and no replier is left
            // (this is the last `Arc`).
            unsafe { std::alloc::dealloc(self.mem.as_ptr(), self.layout) };
        }
        // Otherwise the kernel may still hold the addresses: leak.
    }
}

/// Lays out a reply (`fuse_out_header` first, then its arguments, as fuser
/// gives it) as the ring wants it: the first 16 bytes for `in_out`, the
/// rest for the payload. Returns the out header and the body length, and
/// calls `body` with each body piece in order.
pub fn split_reply(
    data: &[IoSlice<'_>],
    mut body: impl FnMut(usize, &[u8]),
) -> io::Result<([u8; OUT_HEADER_SIZE], usize)> {
    let mut header = [0u8; OUT_HEADER_SIZE];
    let mut pos = 0usize;
    for piece in data {
        let mut p: &[u8] = piece;
        if pos < OUT_HEADER_SIZE {
            let n = p.len().min(OUT_HEADER_SIZE - pos);
            header[pos..pos + n].copy_from_slice(&p[..n]);
            pos += n;
            p = &p[n..];
        }
        if !p.is_empty() {
            body(pos - OUT_HEADER_SIZE, p);
            pos += p.len();
        }
    }
    if pos < OUT_HEADER_SIZE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "FUSE reply shorter than its header"));
    }
    Ok((header, pos - OUT_HEADER_SIZE))
}

/// Sends the reply of one ring request; any thread, at most once.
#[derive(Debug)]
pub struct FuseReplier {
    entry: Arc<Entry>,
    generation: u64,
}

impl FuseReplier {
    /// Writes the reply (`fuse_out_header`, then its arguments) for the
    /// owning thread to commit.
    ///
    /// # Errors
    /// `InvalidInput` when the reply is shorter than its header or larger
    /// than the payload; `Other` when this request was answered already.
    pub fn reply(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let entry = &*self.entry;
        let mut st = entry.lock();
        if st.generation != self.generation || st.replied {
            return Err(io::Error::other("this FUSE ring request was answered already"));
        }
        let total: usize = data.iter().map(|s| s.len()).sum();
        if total.saturating_sub(OUT_HEADER_SIZE) > entry.payload_cap {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "FUSE reply larger than the ring payload"));
        }
        let hold_back = st.request_in_payload && st.dispatching;
        let mut pending = std::mem::take(&mut st.pending);
        pending.clear();
        let (header, body_len) = split_reply(data, |at, piece| {
            if hold_back {
                pending.extend_from_slice(piece);
            } else {
                // SAFETY: `at + piece.len()` ≤ the body length ≤
                // `payload_cap` (checked above); the lock is held, and the
                // owning thread does not borrow the payload now (the request
                // was copied out, or its dispatch has ended), nor does the
                // kernel (the entry is with user space until commit).
                unsafe { entry.write_at(PAYLOAD_OFFSET + at, piece) };
            }
        })?;
        // SAFETY: the header buffer is never borrowed by the owning thread
        // while a request is out; the lock is held.
        unsafe { entry.write_at(0, &header) };
        st.pending = pending;
        st.pending_used = hold_back;
        st.body_len = body_len;
        st.replied = true;
        entry.cv.notify_all();
        Ok(())
    }
}

impl Drop for FuseReplier {
    fn drop(&mut self) {
        let mut st = self.entry.lock();
        if st.generation == self.generation {
            st.repliers = st.repliers.saturating_sub(1);
            self.entry.cv.notify_all();
        }
    }
}

/// One request taken from the ring: its bytes as `read(/dev/fuse)` would
/// give them. While it lives, its [`FuseRing`] is borrowed.
#[derive(Debug)]
pub struct FuseRequest<'a> {
    bytes: &'a [u8],
    entry: &'a Arc<Entry>,
    generation: u64,
}

impl FuseRequest<'_> {
    /// `fuse_in_header` and the arguments, contiguous and 8-byte aligned.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// A replier for this request (give it to the file system).
    pub fn replier(&self) -> FuseReplier {
        let mut st = self.entry.lock();
        st.repliers += 1;
        FuseReplier { entry: self.entry.clone(), generation: self.generation }
    }
}

/// An io_uring with one FUSE ring entry on queue `qid`; one thread uses it.
pub struct FuseRing {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    dev: OwnedFd,
    qid: u16,
    entry: Arc<Entry>,
    /// The `iovec[2]` of the registration (the kernel reads it at submit).
    iov: Box<[libc_iovec; 2]>,
    /// 8-byte aligned scratch for requests copied out of the ring.
    scratch: Vec<u64>,
    /// `commit_id` of the request with user space, if any.
    commit_id: Option<u64>,
    /// The command in flight (the kernel owns the entry), if any.
    in_flight: Option<u32>,
    registered: bool,
}

impl std::fmt::Debug for FuseRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseRing").field("qid", &self.qid).field("entry", &self.entry).finish_non_exhaustive()
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct libc_iovec {
    base: u64,
    len: u64,
}

impl FuseRing {
    /// A ring for queue `qid` on `dev` (a `/dev/fuse` descriptor of the
    /// mount: a duplicate is fine) whose entry holds `payload` bytes (at
    /// least the connection's max payload, see the module docs).
    ///
    /// # Errors
    /// [`FuseRingError::Setup`] when io_uring with 128-byte SQEs is not
    /// available; [`FuseRingError::PayloadSize`].
    pub fn new(dev: OwnedFd, qid: u16, payload: usize) -> Result<FuseRing, FuseRingError> {
        let payload = payload.max(MIN_PAYLOAD);
        let entry = Arc::new(Entry::new(payload)?);
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2).map_err(FuseRingError::Setup)?;
        let base = entry.base() as u64;
        let iov = Box::new([
            libc_iovec { base, len: HEADER_SIZE as u64 },
            libc_iovec { base: base + PAYLOAD_OFFSET as u64, len: payload as u64 },
        ]);
        Ok(FuseRing {
            ring,
            dev,
            qid,
            entry,
            iov,
            scratch: Vec::new(),
            commit_id: None,
            in_flight: None,
            registered: false,
        })
    }

    /// Whether io_uring with 128-byte SQEs can be set up here at all (a
    /// mount must not ask the kernel for FUSE over io_uring otherwise: the
    /// kernel would hold every request until a ring registers).
    pub fn probe() -> Result<(), FuseRingError> {
        IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2).map(drop).map_err(FuseRingError::Setup)
    }

    /// Turns FUSE over io_uring off for the connection of `dev` after INIT
    /// agreed to it, when the daemon cannot register its ring after all:
    /// the kernel holds every request until the ring is ready, and sets the
    /// connection back to `/dev/fuse` on a refused registration. This sends
    /// one that is always refused (queue 65535: `EINVAL`).
    ///
    /// # Errors
    /// io_uring cannot be set up, or the kernel accepted the registration.
    pub fn refuse_registration(dev: OwnedFd) -> Result<(), FuseRingError> {
        let mut ring = FuseRing::new(dev, u16::MAX, MIN_PAYLOAD)?;
        match ring.register() {
            Err(FuseRingError::Command { .. }) => Ok(()),
            Err(e) => Err(e),
            Ok(()) => Err(FuseRingError::Malformed("the kernel accepted queue 65535")),
        }
    }

    /// The queue this ring serves.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    fn command(&self, cmd_op: u32, commit_id: u64) -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        let e = opcode::UringCmd80::new(types::Fd(self.dev.as_raw_fd()), cmd_op)
            .cmd(cmd)
            .addr(Some(if cmd_op == CMD_REGISTER { self.iov.as_ptr() as u64 } else { 0 }))
            .build()
            .user_data(u64::from(cmd_op));
        if cmd_op != CMD_REGISTER {
            return e;
        }
        // The crate's UringCmd80 has no `len`; REGISTER needs len = 2 (the
        // iovec count). io_uring_sqe.len is the u32 at byte 24.
        const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
        // SAFETY: Entry128 is #[repr(C)] (io_uring_sqe, [u8; 64]): 128
        // bytes of plain integers, so it round-trips through a byte array.
        let mut bytes: [u8; 128] = unsafe { std::mem::transmute(e) };
        bytes[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above; any byte pattern is a valid Entry128.
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
    }

    /// Submits one command (the entry goes to the kernel).
    fn submit(&mut self, cmd_op: u32, commit_id: u64) -> Result<(), FuseRingError> {
        let sqe = self.command(cmd_op, commit_id);
        // SAFETY: the SQE points at `self.iov` (REGISTER; read at submit)
        // and, through it, at the entry's allocation, which lives until the
        // kernel's final completion (freed only when `released`, else
        // leaked). Nothing else is in the queue.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| FuseRingError::Enter(io::Error::other("submission queue full")))?;
        self.in_flight = Some(cmd_op);
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(4) | Some(11) | Some(16)) => continue,
                Err(e) => return Err(FuseRingError::Enter(e)),
            }
        }
    }

    /// Takes the command's completion if there is one (`block`: waits).
    fn reap(&mut self, block: bool) -> Result<bool, FuseRingError> {
        let Some(cmd_op) = self.in_flight else {
            return Err(FuseRingError::Malformed("no command in flight"));
        };
        loop {
            if let Some(cqe) = self.ring.completion().next() {
                self.in_flight = None;
                let cmd = if cmd_op == CMD_REGISTER { "REGISTER" } else { "COMMIT_AND_FETCH" };
                if cqe.result() < 0 {
                    let source = io::Error::from_raw_os_error(-cqe.result());
                    // The kernel completes a command with an error only when
                    // it refused it or tore the entry down: either way it no
                    // longer writes into the buffers.
                    self.entry.lock().released = true;
                    return Err(FuseRingError::Command { cmd, qid: self.qid, source });
                }
                return Ok(true);
            }
            if !block {
                return Ok(false);
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(4) | Some(11) | Some(16)) => {}
                Err(e) => return Err(FuseRingError::Enter(e)),
            }
        }
    }

    /// Registers the entry. A refusal (`enable_uring` off, a bad queue or
    /// buffer) completes at once and is returned here; otherwise the
    /// completion is the first request ([`FuseRing::wait`]).
    ///
    /// # Errors
    /// The kernel's refusal ([`FuseRingError::Command`]) or an io_uring error.
    pub fn register(&mut self) -> Result<(), FuseRingError> {
        self.registered = true;
        self.submit(CMD_REGISTER, 0)?;
        self.reap(false).map(drop)
    }

    /// Waits for the next request (after [`FuseRing::register`]).
    ///
    /// # Errors
    /// [`FuseRingError::Command`] with `ENOTCONN` once unmounted.
    pub fn wait(&mut self) -> Result<(), FuseRingError> {
        if self.in_flight.is_none() {
            return Ok(()); // completed already (seen by `register`)
        }
        self.reap(true).map(drop)
    }

    /// The request the entry holds now (after [`FuseRing::register`] or
    /// [`FuseRing::commit`] returned `Ok`).
    ///
    /// # Errors
    /// [`FuseRingError::Malformed`] when the kernel's sizes do not add up.
    pub fn request(&mut self) -> Result<FuseRequest<'_>, FuseRingError> {
        // The commit id is taken first, so that a malformed request is
        // still answered (EIO).
        let (commit_id, assembled) = self.entry.assemble(&mut self.scratch);
        self.commit_id = Some(commit_id);
        let (bytes, generation) = assembled?;
        Ok(FuseRequest { bytes, entry: &self.entry, generation })
    }

    /// Whether the current request needs no more waiting: it has its
    /// reply, or nobody can answer it any more ([`FuseRing::commit`] then
    /// answers `EIO`). False after its dispatch returned means the reply
    /// comes later from another thread (a lock wait).
    pub fn answered(&self) -> bool {
        let st = self.entry.lock();
        st.replied || st.repliers == 0
    }

    /// Waits until the current request is answered or every replier is
    /// gone (what [`FuseRing::commit`] waits for before it commits).
    pub fn wait_answered(&self) {
        let mut st = self.entry.lock();
        while !st.replied && st.repliers > 0 {
            st = self.entry.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits until the current request is answered (or every replier is
    /// gone: then it answers `EIO` itself), commits the answer and waits for
    /// the next request.
    ///
    /// # Errors
    /// [`FuseRingError::Command`] (`ENOTCONN` at unmount) or an io_uring error.
    pub fn commit(&mut self) -> Result<(), FuseRingError> {
        let Some(commit_id) = self.commit_id.take() else {
            return Err(FuseRingError::Malformed("commit without a request"));
        };
        self.entry.finish_reply(commit_id);
        self.submit(CMD_COMMIT_AND_FETCH, commit_id)?;
        self.reap(true).map(drop)
    }
}

impl Drop for FuseRing {
    fn drop(&mut self) {
        if !self.registered {
            self.entry.lock().released = true;
        }
        // A registered entry without a final completion stays leaked (see
        // Entry's Drop): the kernel may still hold its addresses.
    }
}

/// How a ring request maps onto contiguous bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLayout {
    /// Size of the op's first argument (in `op_in`).
    pub arg0: usize,
    /// Built in place before the payload (large requests) or copied.
    pub in_place: bool,
}

/// The kernel sets `fuse_in_header.len` to the header plus all arguments,
/// and `payload_sz` to the arguments after the first; the first argument's
/// size (in `op_in`) is what remains.
///
/// # Errors
/// [`FuseRingError::Malformed`] when the sizes do not add up.
pub fn request_layout(total: usize, payload_sz: usize, payload_cap: usize) -> Result<RequestLayout, FuseRingError> {
    if payload_sz > payload_cap {
        return Err(FuseRingError::Malformed("payload_sz above the payload buffer"));
    }
    let arg0 = total
        .checked_sub(IN_HEADER_SIZE + payload_sz)
        .ok_or(FuseRingError::Malformed("fuse_in_header.len below header and payload"))?;
    if arg0 > OP_IN_SIZE {
        return Err(FuseRingError::Malformed("first argument larger than op_in"));
    }
    // In place needs the start 8-byte aligned (fuser reads the structs in place).
    let in_place = payload_sz > COPY_LIMIT && (IN_HEADER_SIZE + arg0).is_multiple_of(8);
    Ok(RequestLayout { arg0, in_place })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_of_a_write_is_in_place_and_of_a_lookup_copied() {
        // WRITE: header 40 + fuse_write_in 40 + 1 MiB data.
        let l = request_layout(40 + 40 + (1 << 20), 1 << 20, 1 << 20).unwrap();
        assert_eq!(l, RequestLayout { arg0: 40, in_place: true });
        // LOOKUP: empty first argument, the name in the payload.
        let l = request_layout(40 + 6, 6, 1 << 20).unwrap();
        assert_eq!(l, RequestLayout { arg0: 0, in_place: false });
        // GETATTR: fuse_getattr_in in op_in, nothing in the payload.
        assert_eq!(request_layout(56, 0, 8192).unwrap().arg0, 16);
    }

    /// An entry as the kernel leaves it after a request: `in_out` holds
    /// the in header (len, opcode, unique), `op_in` the first argument,
    /// the payload the rest.
    fn kernel_writes(e: &Entry, opcode: u32, unique: u64, arg0: &[u8], payload: &[u8]) {
        let mut h = [0u8; IN_HEADER_SIZE];
        let len = (IN_HEADER_SIZE + arg0.len() + payload.len()) as u32;
        h[0..4].copy_from_slice(&len.to_ne_bytes());
        h[4..8].copy_from_slice(&opcode.to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        // SAFETY: test: in bounds, nothing else uses the entry.
        unsafe {
            e.write_at(0, &h);
            e.write_at(OP_IN, arg0);
            e.write_at(PAYLOAD_OFFSET, payload);
            e.write_at(ENT_COMMIT_ID, &unique.to_ne_bytes());
            e.write_at(ENT_PAYLOAD_SZ, &(payload.len() as u32).to_ne_bytes());
        }
    }

    /// What the kernel reads at commit: out header, body.
    fn kernel_reads(e: &Entry) -> ([u8; OUT_HEADER_SIZE], Vec<u8>) {
        // SAFETY: test: in bounds, nothing else uses the entry.
        unsafe {
            let h: [u8; OUT_HEADER_SIZE] = e.read_at(0);
            let sz = u32::from_ne_bytes(e.read_at(ENT_PAYLOAD_SZ)) as usize;
            let body = std::slice::from_raw_parts(e.base().add(PAYLOAD_OFFSET), sz).to_vec();
            (h, body)
        }
    }

    fn out_header(unique: u64, error: i32, len: usize) -> [u8; OUT_HEADER_SIZE] {
        let mut h = [0u8; OUT_HEADER_SIZE];
        h[0..4].copy_from_slice(&((OUT_HEADER_SIZE + len) as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&error.to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        h
    }

    fn replier(e: &Arc<Entry>, generation: u64) -> FuseReplier {
        e.lock().repliers += 1;
        FuseReplier { entry: e.clone(), generation }
    }

    #[test]
    fn a_small_request_is_copied_out_and_its_reply_goes_straight_to_the_payload() {
        let e = Arc::new(Entry::new(MIN_PAYLOAD).unwrap());
        // LOOKUP (1): empty first argument, the name in the payload.
        kernel_writes(&e, 1, 77, &[], b"name\0");
        let mut scratch = Vec::new();
        let (id, r) = e.assemble(&mut scratch);
        let (bytes, generation) = r.unwrap();
        assert_eq!(id, 77);
        assert_eq!(bytes.len(), IN_HEADER_SIZE + 5);
        assert_eq!(&bytes[IN_HEADER_SIZE..], b"name\0");
        assert_eq!(bytes.as_ptr() as usize % 8, 0, "fuser reads the header in place");
        // The reply, from another thread, while the request is dispatched.
        let rep = replier(&e, generation);
        let body = [9u8; 144];
        let h = out_header(77, 0, body.len());
        std::thread::scope(|s| {
            s.spawn(|| rep.reply(&[IoSlice::new(&h[..5]), IoSlice::new(&h[5..]), IoSlice::new(&body)]).unwrap());
        });
        drop(rep);
        e.finish_reply(77);
        assert_eq!(kernel_reads(&e), (h, body.to_vec()));
        e.lock().released = true;
    }

    #[test]
    fn a_large_write_is_made_contiguous_in_place_and_its_reply_waits_for_the_borrow() {
        let e = Arc::new(Entry::new(1 << 20).unwrap());
        // WRITE (16): fuse_write_in (40 bytes) in op_in, the data in the payload.
        let arg0: Vec<u8> = (0..40).collect();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        kernel_writes(&e, 16, 5, &arg0, &data);
        let mut scratch = Vec::new();
        let (id, r) = e.assemble(&mut scratch);
        let (bytes, generation) = r.unwrap();
        assert_eq!(id, 5);
        assert_eq!(bytes.as_ptr() as usize, e.base() as usize + PAYLOAD_OFFSET - IN_HEADER_SIZE - 40);
        assert_eq!(&bytes[IN_HEADER_SIZE..IN_HEADER_SIZE + 40], &arg0[..]);
        assert!(bytes[IN_HEADER_SIZE + 40..] == data[..]);
        // fuse_write_out (8 bytes) while the data is still borrowed: held back.
        let rep = replier(&e, generation);
        let h = out_header(5, 0, 8);
        rep.reply(&[IoSlice::new(&h), IoSlice::new(&200_000u64.to_ne_bytes())]).unwrap();
        assert!(bytes[IN_HEADER_SIZE + 40..] == data[..], "the request's bytes are untouched");
        assert!(rep.reply(&[IoSlice::new(&h)]).is_err(), "a second reply is refused");
        drop(rep);
        e.finish_reply(5);
        assert_eq!(kernel_reads(&e), (h, 200_000u64.to_ne_bytes().to_vec()));
        e.lock().released = true;
    }

    #[test]
    fn a_request_nobody_answers_gets_eio_and_a_late_reply_is_refused() {
        let e = Arc::new(Entry::new(MIN_PAYLOAD).unwrap());
        kernel_writes(&e, 3, 9, &[0u8; 16], &[]);
        let mut scratch = Vec::new();
        let (_, r) = e.assemble(&mut scratch);
        let generation = r.unwrap().1;
        drop(replier(&e, generation));
        e.finish_reply(9);
        assert_eq!(kernel_reads(&e), (out_header(9, -EIO, 0), vec![]));
        let late = FuseReplier { entry: e.clone(), generation };
        assert!(late.reply(&[IoSlice::new(&out_header(9, 0, 0))]).is_err());
        // Sizes that do not add up still give the commit id (answered EIO).
        kernel_writes(&e, 3, 10, &[], &[]);
        // SAFETY: test: in bounds, nothing else uses the entry.
        unsafe { e.write_at(0, &10u32.to_ne_bytes()) };
        let (id, r) = e.assemble(&mut scratch);
        assert_eq!(id, 10);
        assert!(r.is_err());
        // ... and are answered EIO, not with the previous request's reply.
        e.finish_reply(10);
        assert_eq!(kernel_reads(&e), (out_header(10, -EIO, 0), vec![]));
        e.lock().released = true;
    }

    #[test]
    fn inconsistent_sizes_are_refused() {
        assert!(request_layout(30, 0, 8192).is_err());
        assert!(request_layout(40 + 200, 0, 8192).is_err());
        assert!(request_layout(40 + 9000, 9000, 8192).is_err());
    }

    #[test]
    fn reply_splits_header_from_body_across_slices() {
        let h = [1u8; 10];
        let rest = [2u8; 10];
        let data = [IoSlice::new(&h), IoSlice::new(&rest), IoSlice::new(&[3u8; 4])];
        let mut body = Vec::new();
        let (header, len) = split_reply(&data, |at, p| {
            assert_eq!(at, body.len());
            body.extend_from_slice(p)
        })
        .unwrap();
        assert_eq!(&header[..10], &[1u8; 10]);
        assert_eq!(&header[10..], &[2u8; 6]);
        assert_eq!(len, 8);
        assert_eq!(body, [2, 2, 2, 2, 3, 3, 3, 3]);
        assert!(split_reply(&[IoSlice::new(&[0u8; 8])], |_, _| {}).is_err());
    }
}
