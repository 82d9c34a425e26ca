//! Endpoints: active-message sends, one-sided put/get, flush, remote keys.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use ucx_sys as sys;

use crate::error::{Error, Result, Status};
use crate::memory::{Region, RemoteKey};
use crate::request::{send_param, Op};
use crate::slab::SubRegion;
use crate::stats::Stats;
use crate::worker::{PendingClose, Worker, WorkerInner};

/// Whether UCX detects peer failure on an endpoint.
///
/// In UCX 1.13 on one host, `Peer` on an address-based endpoint restricts it
/// to TCP; `None` allows shared memory and cma but gives no failure
/// detection, so dafne pairs such endpoints with a `Peer` control endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrMode {
    None,
    Peer,
}

impl ErrMode {
    pub(crate) fn raw(self) -> sys::ucp_err_handling_mode_t {
        match self {
            ErrMode::None => sys::UCP_ERR_HANDLING_MODE_NONE,
            ErrMode::Peer => sys::UCP_ERR_HANDLING_MODE_PEER,
        }
    }
}

type ErrorHook = Box<dyn FnMut(Status)>;

/// Shared between an endpoint and UCX's error callback.
pub(crate) struct EpErr {
    failed: Cell<Option<Status>>,
    hook: RefCell<Option<ErrorHook>>,
}

impl EpErr {
    /// A new error cell and the raw argument for UCX's error callback
    /// (one strong reference, owned by the endpoint's lifetime; see `create`).
    pub(crate) fn new() -> (Rc<EpErr>, *mut std::ffi::c_void) {
        let e = Rc::new(EpErr { failed: Cell::new(None), hook: RefCell::new(None) });
        let arg = Rc::as_ptr(&e) as *mut std::ffi::c_void;
        (e, arg)
    }
}

pub(crate) unsafe extern "C" fn err_cb(arg: *mut std::ffi::c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: arg points into an Rc<EpErr> that the endpoint (and after its
    // drop, the worker's close list) keeps alive while UCX may call us.
    let e = unsafe { &*(arg as *const EpErr) };
    let st = Status(status);
    e.failed.set(Some(st));
    let hook = e.hook.try_borrow_mut().ok().and_then(|mut h| h.take());
    if let Some(mut f) = hook {
        f(st);
        if let Ok(mut h) = e.hook.try_borrow_mut() {
            h.get_or_insert(f);
        }
    }
}

pub(crate) struct EpInner {
    h: sys::ucp_ep_h,
    pub(crate) worker: Rc<WorkerInner>,
    err: Rc<EpErr>,
    mode: ErrMode,
    /// Processes on this host proven to be the peer (see
    /// [`Endpoint::set_peer_processes`]); empty if none is known.
    pub(crate) peer_processes: RefCell<Vec<u32>>,
    /// The owner knows the peer is gone ([`Endpoint::mark_peer_dead`]).
    peer_dead: Cell<bool>,
}

impl EpInner {
    /// The raw handle, or an error if the peer failed.
    pub(crate) fn handle(&self) -> Result<sys::ucp_ep_h> {
        match self.err.failed.get() {
            Some(st) => Err(Error::EndpointFailed(st)),
            None => Ok(self.h),
        }
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        // Closing needs progress, which may not happen here (we could be
        // inside a callback): hand the endpoint to the worker.
        // A graceful close waits for the peer (a flush, then the
        // disconnect handshake): to a peer that is gone it never finishes,
        // and the worker could then never be destroyed (see its Drop). A
        // forced close completes locally; UCX accepts it in PEER mode only.
        let known_dead = self.err.failed.get().is_some() || self.peer_dead.get();
        let force = self.mode == ErrMode::Peer && known_dead;
        self.worker.defer_close(PendingClose { h: self.h, force, err: self.err.clone() });
    }
}

pub(crate) fn create(
    worker: &Worker,
    params: &sys::ucp_ep_params_t,
    err: Rc<EpErr>,
    _err_arg: *mut std::ffi::c_void,
    mode: ErrMode,
    op: &'static str,
) -> Result<Endpoint> {
    let mut h: sys::ucp_ep_h = std::ptr::null_mut();
    // A sockaddr endpoint opens a socket and registers its handler here.
    let _registering = crate::handler_ids::registering();
    // SAFETY: params is initialised for its field_mask and everything it
    // points to (sockaddr, address, conn_request) is valid for the call; the
    // error-callback argument lives in `err`, kept until the close completes.
    let st = unsafe { sys::ucp_ep_create(worker.inner.h, params, &mut h) };
    if let Err(e) = crate::error::check(op, st) {
        // UCX may have registered the error-callback argument on an
        // endpoint it tears down later: never free it under UCX.
        std::mem::forget(err);
        return Err(e);
    }
    Ok(Endpoint {
        inner: Rc::new(EpInner {
            h,
            worker: worker.inner.clone(),
            err,
            mode,
            peer_processes: RefCell::new(Vec::new()),
            peer_dead: Cell::new(false),
        }),
    })
}

/// A connection to one peer worker.
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) inner: Rc<EpInner>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("h", &self.inner.h).field("mode", &self.inner.mode).finish()
    }
}

/// Local memory for RMA: a registered region slice or a slice of a slab's
/// view (both zero-copy, with the registration's memory handle), or plain
/// bytes that UCX handles internally (copied or registered on the fly).
#[derive(Debug)]
pub enum Local {
    Region {
        region: Arc<Region>,
        offset: usize,
        len: usize,
    },
    /// Bytes `[offset, offset + len)` of a view (offsets within the view).
    View {
        view: Arc<SubRegion>,
        offset: usize,
        len: usize,
    },
    Bytes(Vec<u8>),
}

impl Endpoint {
    pub fn mode(&self) -> ErrMode {
        self.inner.mode
    }

    /// Whether RMA on this endpoint with `key` (unpacked on it) needs no
    /// help from the peer: error handling off (on one host, so UCX may use
    /// shared memory) and the key kept a shared-memory part
    /// ([`crate::RemoteKey::is_mapped`]).
    pub fn reaches_directly(&self, key: &crate::RemoteKey) -> bool {
        self.inner.mode == ErrMode::None && key.is_mapped()
    }

    /// Whether this endpoint's context can keep a peer's System V segment
    /// in its keys (System V shared memory is among its transports).
    pub fn maps_peer_segments(&self) -> bool {
        self.inner.worker.ctx.key_shape().maps_sysv()
    }

    /// An identity for matching against [`crate::AmRecv::reply_ep`].
    pub fn id(&self) -> usize {
        self.inner.h as usize
    }

    /// The status the peer-failure callback reported, if it fired.
    pub fn failed(&self) -> Option<Status> {
        self.inner.err.failed.get()
    }

    /// Records that the peer is gone although UCX did not say so (no answer
    /// to a connect within its deadline, keepalives unanswered): the
    /// endpoint's close, when the last handle is dropped, is then forced
    /// (`UCP_EP_CLOSE_FLAG_FORCE`, which completes locally, outstanding
    /// requests cancelled) instead of waiting for a peer that will not
    /// answer. Only for [`ErrMode::Peer`] endpoints (UCX refuses a forced
    /// close otherwise); a no-op on the others.
    pub fn mark_peer_dead(&self) {
        self.inner.peer_dead.set(true);
    }

    /// Called (inside progress) when UCX reports the peer failed. The hook
    /// must not progress the worker.
    pub fn on_error(&self, f: impl FnMut(Status) + 'static) {
        *self.inner.err.hook.borrow_mut() = Some(Box::new(f));
    }

    /// Sends active message `id` with a header and a payload. Both are kept
    /// alive until the send completes.
    /// With `reply`, the receiver learns which endpoint the message came in
    /// on ([`crate::AmRecv::reply_ep`]).
    pub fn am_send(&self, id: u16, header: Vec<u8>, payload: Vec<u8>, reply: bool) -> Result<Op> {
        let h = self.inner.handle()?;
        let (hp, hl, pp, pl) = (header.as_ptr(), header.len(), payload.as_ptr(), payload.len());
        let s = &self.inner.worker.ctx.inner.stats;
        Stats::add(&s.am_sent, 1);
        Stats::add(&s.am_bytes_sent, (hl + pl) as u64);
        let op = Op::new("ucp_am_send_nbx", vec![Box::new(header), Box::new(payload)]);
        let ud = op.user_data();
        let mut param = send_param(ud, None);
        if reply {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = sys::UCP_AM_SEND_FLAG_REPLY;
        }
        // SAFETY: live endpoint; header and payload buffers are owned by the
        // op (moving a Vec does not move its heap data) until completion.
        let ret = unsafe { sys::ucp_am_send_nbx(h, id as u32, hp.cast(), hl, pp.cast(), pl, &param) };
        op.started(ret, ud)
    }

    /// Writes `local` into the peer's memory at `remote_addr` (described by
    /// `rkey`). Completion is local: [`Endpoint::flush`] before telling the
    /// peer the data is there.
    pub fn put(&self, local: Local, remote_addr: u64, rkey: &Rc<RemoteKey>) -> Result<Op> {
        self.rma(true, local, remote_addr, rkey)
    }

    /// Reads the peer's memory at `remote_addr` into `local`. For
    /// `Local::Bytes`, `take_kept()` on the completed op returns the `Vec`.
    pub fn get(&self, local: Local, remote_addr: u64, rkey: &Rc<RemoteKey>) -> Result<Op> {
        self.rma(false, local, remote_addr, rkey)
    }

    fn rma(&self, put: bool, local: Local, remote_addr: u64, rkey: &Rc<RemoteKey>) -> Result<Op> {
        let h = self.inner.handle()?;
        if !Rc::ptr_eq(&rkey.ep, &self.inner) {
            return Err(Error::Invalid { op: "rma", reason: "remote key was unpacked on another endpoint".into() });
        }
        let len_of = |l: &Local| match l {
            Local::Region { len, .. } | Local::View { len, .. } => *len,
            Local::Bytes(v) => v.len(),
        };
        let want = len_of(&local) as u64;
        if !rkey.covers(remote_addr, want) {
            Stats::add(&self.inner.worker.ctx.inner.stats.rma_outside_window, 1);
            let (base, wlen) = rkey.window();
            return Err(Error::Invalid {
                op: "rma",
                reason: format!("remote range {remote_addr:#x}+{want} is outside the key's window {base:#x}+{wlen}"),
            });
        }
        let (ptr, len, memh, keep): (*mut u8, usize, Option<sys::ucp_mem_h>, Box<dyn Any>) = match local {
            Local::Region { region, offset, len } => {
                if !region.belongs_to(&self.inner.worker.ctx) {
                    return Err(Error::Invalid {
                        op: "rma",
                        reason: "the local region was registered with another UCX context".into(),
                    });
                }
                if !put && region.is_read_only() {
                    return Err(Error::Invalid {
                        op: "rma",
                        reason: "cannot get into a read-only file mapping".into(),
                    });
                }
                if offset.checked_add(len).is_none_or(|end| end > region.len()) {
                    return Err(Error::Invalid {
                        op: "rma",
                        reason: format!("range {offset}+{len} outside a region of {} bytes", region.len()),
                    });
                }
                // SAFETY: offset+len is within the region (checked above).
                let p = unsafe { region.ptr().add(offset) };
                (p, len, Some(region.memh()), Box::new(region))
            }
            Local::View { view, offset, len } => {
                if !view.region().belongs_to(&self.inner.worker.ctx) {
                    return Err(Error::Invalid {
                        op: "rma",
                        reason: "the local view's slab was registered with another UCX context".into(),
                    });
                }
                if offset.checked_add(len).is_none_or(|end| end > view.len()) {
                    return Err(Error::Invalid {
                        op: "rma",
                        reason: format!("range {offset}+{len} outside a view of {} bytes", view.len()),
                    });
                }
                // SAFETY: offset+len is within the view (checked above), and
                // the view within its slab's region.
                let p = unsafe { view.ptr().add(offset) };
                // The op keeps the view (so its range stays out of other
                // views' reach, and the slab registered) until completion.
                (p, len, Some(view.region().memh()), Box::new(view))
            }
            Local::Bytes(mut v) => {
                let (p, l) = (v.as_mut_ptr(), v.len());
                (p, l, None, Box::new(v))
            }
        };
        let s = &self.inner.worker.ctx.inner.stats;
        if put {
            Stats::add(&s.puts, 1);
            Stats::add(&s.bytes_put, len as u64);
        } else {
            Stats::add(&s.gets, 1);
            Stats::add(&s.bytes_got, len as u64);
        }
        let name = if put { "ucp_put_nbx" } else { "ucp_get_nbx" };
        let op = Op::new(name, vec![keep, Box::new(rkey.clone())]);
        let ud = op.user_data();
        let param = send_param(ud, memh);
        // SAFETY: live endpoint; `ptr..ptr+len` is owned by the op's
        // keep-alive (an Arc<Region>, an Arc<SubRegion> or the Vec) until completion; the rkey
        // belongs to this endpoint (checked) and is also kept alive.
        let ret = unsafe {
            if put {
                sys::ucp_put_nbx(h, ptr.cast(), len, remote_addr, rkey.h, &param)
            } else {
                sys::ucp_get_nbx(h, ptr.cast(), len, remote_addr, rkey.h, &param)
            }
        };
        op.started(ret, ud)
    }

    /// Completes every RMA issued on this endpoint at the peer.
    pub fn flush(&self) -> Result<Op> {
        let h = self.inner.handle()?;
        let op = Op::new("ucp_ep_flush_nbx", Vec::new());
        let ud = op.user_data();
        let param = send_param(ud, None);
        // SAFETY: live endpoint; param valid for the call.
        let ret = unsafe { sys::ucp_ep_flush_nbx(h, &param) };
        op.started(ret, ud)
    }

    /// Records the processes of this host that are the peer, as proven by
    /// the caller (dafne's transport: the processes holding the client's end
    /// of its TCP control connection). A peer's key may keep a System V
    /// shared-memory part only if one of them created that segment (see
    /// `KeyShape`); with none recorded, every such part is removed.
    pub fn set_peer_processes(&self, pids: Vec<u32>) {
        *self.inner.peer_processes.borrow_mut() = pids;
    }

    /// Unpacks a peer's packed key for use on this endpoint. The bytes are
    /// treated as hostile (bounded and padded before UCX parses them).
    pub fn unpack_key(&self, packed: &[u8]) -> Result<RemoteKey> {
        RemoteKey::unpack(self.inner.clone(), packed)
    }

    /// UCX's description of the lanes this endpoint uses (which transport
    /// carries messages and RMA).
    pub fn print_info(&self) -> String {
        match self.inner.handle() {
            // SAFETY: live endpoint; the stream is valid for the call.
            Ok(h) => capture_file(|f| unsafe { sys::ucp_ep_print_info(h, f) }),
            Err(e) => format!("endpoint unavailable: {e}"),
        }
    }
}

/// Runs `f` with a memory-backed `FILE*` and returns what it wrote.
pub(crate) fn capture_file(f: impl FnOnce(*mut sys::FILE)) -> String {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut size: libc::size_t = 0;
    // SAFETY: out-pointers for open_memstream.
    let stream = unsafe { libc::open_memstream(&mut buf, &mut size) };
    if stream.is_null() {
        return String::from("(open_memstream failed)");
    }
    f(stream as *mut sys::FILE);
    // SAFETY: stream is the live stream from open_memstream; closing it
    // finalises buf/size.
    unsafe { libc::fclose(stream) };
    if buf.is_null() {
        return String::new();
    }
    // SAFETY: buf holds `size` bytes written by the stream.
    let s = String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(buf as *const u8, size) }).into_owned();
    // SAFETY: buf was malloc'ed by open_memstream and is freed once.
    unsafe { libc::free(buf.cast()) };
    s
}
