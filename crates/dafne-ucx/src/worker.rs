//! The UCP worker: progress, wakeup, listeners, and active-message handlers.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucx_sys as sys;

use crate::context::Context;
use crate::endpoint::{self, Endpoint, EpErr, ErrMode};
use crate::error::{check, Error, Result, Status};
use crate::request::{recv_am_cb, Op};
use crate::stats::Stats;

/// An endpoint handed back for closing; closed on the next safe progress.
pub(crate) struct PendingClose {
    pub(crate) h: sys::ucp_ep_h,
    pub(crate) force: bool,
    /// Keeps the error-callback argument alive until the close completes.
    pub(crate) err: Rc<EpErr>,
}

pub(crate) struct WorkerInner {
    pub(crate) h: sys::ucp_worker_h,
    pub(crate) ctx: Context,
    pending_close: RefCell<Vec<PendingClose>>,
    /// Connection requests to reject and listeners to destroy, deferred to
    /// the next progress like endpoint closes (`handler_ids`: handlers are
    /// removed only inside a window that ends with a drain).
    pending_reject: RefCell<Vec<(sys::ucp_listener_h, sys::ucp_conn_request_h)>>,
    pending_listener: RefCell<Vec<(sys::ucp_listener_h, Box<ConnHandlerBox>)>>,
    closing: RefCell<Vec<(Op, Rc<EpErr>, Instant)>>,
    /// A close was given up on ([`CLOSE_PATIENCE`]): its request is still
    /// UCX's, so the worker is not destroyed (see Drop).
    abandoned: Cell<bool>,
    // Boxed on purpose: UCX holds a pointer to each handler, which must not
    // move when the Vec grows.
    #[allow(clippy::vec_box)]
    handlers: RefCell<Vec<Box<AmHandlerBox>>>,
    efd: RawFd,
    /// Set while a UCX callback of this worker runs: progress from inside
    /// one is forbidden by UCX and refused here.
    in_callback: Rc<Cell<bool>>,
}

impl WorkerInner {
    pub(crate) fn defer_close(&self, c: PendingClose) {
        self.pending_close.borrow_mut().push(c);
    }

    /// Whether deferred work waits for [`WorkerInner::start_closes`].
    fn has_pending(&self) -> bool {
        !self.pending_close.borrow().is_empty()
            || !self.closing.borrow().is_empty()
            || !self.pending_reject.borrow().is_empty()
            || !self.pending_listener.borrow().is_empty()
    }

    /// Rejects deferred connection requests, then destroys deferred
    /// listeners (a listener's requests hold it, so its rejections are
    /// queued before it). Call inside a `handler_ids::window`.
    fn finish_listeners(&self) {
        let rejects = std::mem::take(&mut *self.pending_reject.borrow_mut());
        for (l, r) in rejects {
            // SAFETY: the request came from listener `l`, which is live (a
            // listener is destroyed only after the rejections queued before
            // it, below), and was neither accepted nor rejected before
            // (ConnRequest's Drop queued it once).
            unsafe { sys::ucp_listener_reject(l, r) };
        }
        let listeners = std::mem::take(&mut *self.pending_listener.borrow_mut());
        for (h, handler) in listeners {
            // SAFETY: live listener whose Rust handle is gone, destroyed
            // once, after its rejections (above); its handler box is freed
            // after the call.
            unsafe { sys::ucp_listener_destroy(h) };
            drop(handler);
        }
    }

    fn start_closes(&self) {
        self.finish_listeners();
        let pending = std::mem::take(&mut *self.pending_close.borrow_mut());
        for c in pending {
            let op = Op::new("ucp_ep_close_nbx", Vec::new());
            let ud = op.user_data();
            let mut param = crate::request::send_param(ud, None);
            if c.force {
                param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
                param.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
            }
            // SAFETY: c.h is a live endpoint of this worker that no Rust
            // handle refers to any more (its EpInner was dropped); param is
            // valid for the call.
            let ret = unsafe { sys::ucp_ep_close_nbx(c.h, &param) };
            if let Ok(op) = op.started(ret, ud) {
                if op.poll_done().is_none() {
                    self.closing.borrow_mut().push((op, c.err, Instant::now()));
                }
            }
        }
        // Closes that never finish (a graceful close to a peer that is gone:
        // an endpoint without error handling, or one whose owner did not
        // know, see `Endpoint::mark_peer_dead`, which forces the close)
        // are abandoned after a while: the endpoint's resources are left to
        // the process's end (the worker is then not destroyed).
        self.closing.borrow_mut().retain(|(op, err, t)| {
            if op.poll_done().is_some() {
                return false;
            }
            if t.elapsed() < CLOSE_PATIENCE {
                return true;
            }
            // UCX may still call the error callback of an endpoint whose
            // close never finished: leak its argument rather than free it.
            std::mem::forget(err.clone());
            // And the worker must not be destroyed (see its Drop).
            self.abandoned.set(true);
            false
        });
    }
}

const CLOSE_PATIENCE: Duration = Duration::from_secs(10);

impl Drop for WorkerInner {
    fn drop(&mut self) {
        // A window (`handler_ids`) per progress, not one across the wait:
        // a registration waiting for the lock would otherwise stop every
        // other worker of the process for up to the wait's 500 ms, the
        // peer of these closes among them when it lives in this process
        // (so the closes could not finish and the worker would be left).
        // The closes started here are drained by the progress in the same
        // window.
        let mut first = true;
        let deadline = Instant::now() + Duration::from_millis(500);
        while first || (!self.closing.borrow().is_empty() && Instant::now() < deadline) {
            let _window = crate::handler_ids::window();
            if first {
                self.start_closes();
                first = false;
            }
            // SAFETY: not inside a callback (Drop of the last handle runs in
            // user code, never in UCX callbacks: callbacks hold no Worker).
            unsafe { sys::ucp_worker_progress(self.h) };
            self.closing.borrow_mut().retain(|(op, _, _)| op.poll_done().is_none());
        }
        if self.abandoned.get() || !self.closing.borrow().is_empty() {
            // UCX 1.13 asserts (`ucp_ep.c:382`, `req->flags &
            // UCP_REQUEST_FLAG_RELEASED`) and aborts the process when the
            // worker is destroyed with the request of a close that never
            // finished: seen at the exit of a client whose connection to a
            // host died while the host's link was down for 10 s
            // (`dafne/tests/multihost.rs`). Such a worker is left as it is,
            // and with it everything UCX may still point at (the context,
            // the handlers, the endpoints' error arguments): the process
            // is ending, or gave up on this worker, and a leak is better
            // than an abort.
            std::mem::forget(self.ctx.clone());
            std::mem::forget(std::mem::take(&mut *self.handlers.borrow_mut()));
            std::mem::forget(std::mem::take(&mut *self.closing.borrow_mut()));
            return;
        }
        let _window = crate::handler_ids::window();
        // SAFETY: endpoints, listeners and keys hold Rc<WorkerInner>, so none
        // remain; the handler boxes (fields) are freed after this call.
        unsafe { sys::ucp_worker_destroy(self.h) };
    }
}

/// A UCP worker driven by one thread. `!Send` by construction (`Rc`).
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Rc<WorkerInner>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("h", &self.inner.h).finish()
    }
}

impl Worker {
    pub fn new(ctx: &Context) -> Result<Worker> {
        let params = sys::ucp_worker_params_t {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
            thread_mode: sys::UCS_THREAD_MODE_SINGLE,
            ..Default::default()
        };
        let mut h: sys::ucp_worker_h = ptr::null_mut();
        let registering = crate::handler_ids::registering();
        // SAFETY: the context is live (held by the returned worker); h is an out-pointer.
        check("ucp_worker_create", unsafe { sys::ucp_worker_create(ctx.inner.h, &params, &mut h) })?;
        drop(registering);
        let mut efd: std::ffi::c_int = -1;
        // SAFETY: h was just created; efd is an out-pointer.
        if let Err(e) = check("ucp_worker_get_efd", unsafe { sys::ucp_worker_get_efd(h, &mut efd) }) {
            // SAFETY: destroy the worker we just created; it is not used again.
            unsafe { sys::ucp_worker_destroy(h) };
            return Err(e);
        }
        Ok(Worker {
            inner: Rc::new(WorkerInner {
                h,
                ctx: ctx.clone(),
                pending_close: RefCell::new(Vec::new()),
                pending_reject: RefCell::new(Vec::new()),
                pending_listener: RefCell::new(Vec::new()),
                closing: RefCell::new(Vec::new()),
                abandoned: Cell::new(false),
                handlers: RefCell::new(Vec::new()),
                efd,
                in_callback: Rc::new(Cell::new(false)),
            }),
        })
    }

    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Progresses communication once; returns the number of events handled.
    /// Also starts closes of endpoints dropped since the last call.
    /// Must not be called from a UCX callback (nothing here hands a Worker
    /// to a callback, so it cannot be).
    pub fn progress(&self) -> u32 {
        if self.inner.in_callback.get() {
            debug_assert!(false, "Worker::progress called from inside a UCX callback");
            return 0;
        }
        // Handlers removed here (closes, rejections, listeners, and what
        // UCX tears down inside progress) are drained at the end of
        // ucp_worker_progress, before the window closes (`handler_ids`).
        let _window = crate::handler_ids::window();
        if self.inner.has_pending() {
            self.inner.start_closes();
        }
        // SAFETY: the worker is live; we are on its only thread and outside
        // any callback.
        unsafe { sys::ucp_worker_progress(self.inner.h) }
    }

    /// The worker's event file descriptor: readable when [`Worker::arm`]
    /// returned `true` and new events arrived.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd belongs to the worker and stays open while it lives,
        // which outlives the borrow of &self.
        unsafe { BorrowedFd::borrow_raw(self.inner.efd) }
    }

    /// Arms the event fd. `Ok(false)` means events are pending (UCS_ERR_BUSY):
    /// progress again instead of sleeping.
    pub fn arm(&self) -> Result<bool> {
        // SAFETY: live worker, owning thread.
        let st = unsafe { sys::ucp_worker_arm(self.inner.h) };
        if st == sys::UCS_ERR_BUSY as sys::ucs_status_t {
            return Ok(false);
        }
        check("ucp_worker_arm", st).map(|_| true)
    }

    /// This worker's address, to be sent to peers that will connect to it
    /// with [`Worker::connect_address`].
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: live worker; out-pointers.
        check("ucp_worker_get_address", unsafe { sys::ucp_worker_get_address(self.inner.h, &mut addr, &mut len) })?;
        // SAFETY: UCX returned `len` readable bytes at addr.
        let v = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker.
        unsafe { sys::ucp_worker_release_address(self.inner.h, addr) };
        Ok(v)
    }

    /// This worker's address with its network transports only
    /// (`UCP_WORKER_ADDRESS_FLAG_NET_ONLY`): no shared memory, cma or self.
    /// A peer that connects to it reaches this worker over the network
    /// (TCP on loopback on one host), so it never maps this worker's
    /// shared-memory receive FIFO through UCX. Fails when the worker has no
    /// network transport (`UCX_TLS` without `tcp` or RDMA).
    pub fn network_address(&self) -> Result<Vec<u8>> {
        let mut attr = sys::ucp_worker_attr_t {
            field_mask: (sys::UCP_WORKER_ATTR_FIELD_ADDRESS | sys::UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS) as u64,
            address_flags: sys::UCP_WORKER_ADDRESS_FLAG_NET_ONLY,
            ..Default::default()
        };
        // SAFETY: live worker; `attr` is a valid, initialised attribute struct.
        check("ucp_worker_query(address)", unsafe { sys::ucp_worker_query(self.inner.h, &mut attr) })?;
        if attr.address.is_null() {
            return Err(Error::Invalid { op: "ucp_worker_query(address)", reason: "no address returned".into() });
        }
        // SAFETY: UCX returned `address_length` readable bytes at `address`.
        let v = unsafe { std::slice::from_raw_parts(attr.address as *const u8, attr.address_length) }.to_vec();
        // SAFETY: the address came from ucp_worker_query on this worker.
        unsafe { sys::ucp_worker_release_address(self.inner.h, attr.address) };
        Ok(v)
    }

    /// Connects to a listener by socket address. Such endpoints only get TCP
    /// lanes in UCX 1.13 (see UCX-NOTES): dafne uses them as control
    /// connections, always with peer error handling.
    pub fn connect_sockaddr(&self, addr: SocketAddr) -> Result<Endpoint> {
        let sa = SockAddr::from(addr);
        let (err, err_arg) = EpErr::new();
        let params = sys::ucp_ep_params_t {
            field_mask: (sys::UCP_EP_PARAM_FIELD_FLAGS
                | sys::UCP_EP_PARAM_FIELD_SOCK_ADDR
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64,
            flags: sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
            sockaddr: sa.as_ucs(),
            err_mode: sys::UCP_ERR_HANDLING_MODE_PEER,
            err_handler: sys::ucp_err_handler { cb: Some(endpoint::err_cb), arg: err_arg },
            ..Default::default()
        };
        endpoint::create(self, &params, err, err_arg, ErrMode::Peer, "ucp_ep_create(sockaddr)")
    }

    /// Creates an endpoint to a peer worker from its address blob. With
    /// [`ErrMode::None`] UCX may choose shared memory and cma on one host;
    /// with [`ErrMode::Peer`] it detects peer failure but (in 1.13, on one
    /// host) only over TCP.
    pub fn connect_address(&self, address: &[u8], mode: ErrMode) -> Result<Endpoint> {
        if address.is_empty() || address.len() > MAX_WORKER_ADDRESS {
            return Err(Error::Invalid {
                op: "ucp_ep_create(address)",
                reason: format!("worker address of {} bytes (expected 1..={MAX_WORKER_ADDRESS})", address.len()),
            });
        }
        // The address is parsed by UCX without a length: copy it into a
        // zero-padded buffer so a truncated or hostile blob cannot make the
        // parser read outside our memory.
        let mut padded = vec![0u8; address.len() + ADDRESS_SLACK];
        padded[..address.len()].copy_from_slice(address);
        let (err, err_arg) = EpErr::new();
        let mut mask = sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        if mode == ErrMode::Peer {
            mask |= sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
        }
        let params = sys::ucp_ep_params_t {
            field_mask: mask as u64,
            address: padded.as_ptr().cast(),
            err_mode: mode.raw(),
            err_handler: sys::ucp_err_handler { cb: Some(endpoint::err_cb), arg: err_arg },
            ..Default::default()
        };
        endpoint::create(self, &params, err, err_arg, mode, "ucp_ep_create(address)")
    }

    /// Accepts a connection request from a [`Listener`] (peer error handling on).
    pub fn accept(&self, mut req: ConnRequest) -> Result<Endpoint> {
        if !req.listener.as_ref().is_some_and(|l| Rc::ptr_eq(&l.worker, &self.inner)) {
            return Err(Error::Invalid {
                op: "ucp_ep_create(conn_request)",
                reason: "request of another worker's listener".into(),
            });
        }
        let (err, err_arg) = EpErr::new();
        let params = sys::ucp_ep_params_t {
            field_mask: (sys::UCP_EP_PARAM_FIELD_CONN_REQUEST
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64,
            conn_request: req.h,
            err_mode: sys::UCP_ERR_HANDLING_MODE_PEER,
            err_handler: sys::ucp_err_handler { cb: Some(endpoint::err_cb), arg: err_arg },
            ..Default::default()
        };
        req.consumed = true;
        endpoint::create(self, &params, err, err_arg, ErrMode::Peer, "ucp_ep_create(conn_request)")
    }

    /// Listens on `addr` (port 0 picks a free port: see [`Listener::local_addr`]).
    /// Raises UCS's process-wide event limit first ([`ASYNC_MAX_EVENTS`]).
    /// `on_request` runs inside progress for every incoming connection; it
    /// must not progress the worker, only queue the request.
    pub fn listen(&self, addr: SocketAddr, on_request: impl FnMut(ConnRequest) + 'static) -> Result<Listener> {
        raise_async_max_events()?;
        let sa = SockAddr::from(addr);
        let boxed: Box<ConnHandlerBox> = Box::new(ConnHandlerBox {
            f: RefCell::new(Box::new(on_request)),
            core: RefCell::new(std::rc::Weak::new()),
            listener: Cell::new(ptr::null_mut()),
            in_callback: self.inner.in_callback.clone(),
        });
        let arg = &*boxed as *const ConnHandlerBox as *mut std::ffi::c_void;
        let params = sys::ucp_listener_params_t {
            field_mask: (sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER) as u64,
            sockaddr: sa.as_ucs(),
            conn_handler: sys::ucp_listener_conn_handler { cb: Some(conn_cb), arg },
            ..Default::default()
        };
        let mut h: sys::ucp_listener_h = ptr::null_mut();
        let _registering = crate::handler_ids::registering();
        // SAFETY: params (and the sockaddr it points to) are valid for the
        // call; `boxed` outlives the listener because Listener owns both and
        // the worker destroys the listener before freeing the box.
        check("ucp_listener_create", unsafe { sys::ucp_listener_create(self.inner.h, &params, &mut h) }).map_err(
            |e| match e.status() {
                Some(s) if s == Status::BUSY => Error::Invalid {
                    op: "ucp_listener_create",
                    reason: format!("{addr} is already in use: pick another port or stop the process holding it"),
                },
                _ => e,
            },
        )?;
        let core = Rc::new(ListenerCore { h, handler: RefCell::new(Some(boxed)), worker: self.inner.clone() });
        if let Some(b) = core.handler.borrow().as_ref() {
            *b.core.borrow_mut() = Rc::downgrade(&core);
            b.listener.set(h);
        }
        Ok(Listener { core })
    }

    /// Installs the handler for active-message `id`. The handler runs inside
    /// progress; it must not progress the worker.
    pub fn set_am_handler(&self, id: u16, f: impl FnMut(AmRecv<'_>) -> AmVerdict + 'static) -> Result<()> {
        if id > crate::MAX_AM_ID {
            return Err(Error::Invalid {
                op: "ucp_worker_set_am_recv_handler",
                reason: format!("AM id {id} too large"),
            });
        }
        let boxed = Box::new(AmHandlerBox {
            f: RefCell::new(Box::new(f)),
            worker: self.inner.h,
            ctx: self.inner.ctx.clone(),
            in_callback: self.inner.in_callback.clone(),
        });
        let param = sys::ucp_am_handler_param_t {
            field_mask: (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG) as u64,
            id: id as u32,
            cb: Some(am_cb),
            arg: &*boxed as *const AmHandlerBox as *mut std::ffi::c_void,
            ..Default::default()
        };
        // SAFETY: live worker; the box is kept in `handlers` until the worker
        // is destroyed, so `arg` stays valid as long as UCX may call am_cb.
        check("ucp_worker_set_am_recv_handler", unsafe { sys::ucp_worker_set_am_recv_handler(self.inner.h, &param) })?;
        self.inner.handlers.borrow_mut().push(boxed);
        Ok(())
    }

    /// UCX's description of the worker (transports, devices).
    pub fn print_info(&self) -> String {
        // SAFETY: live worker; the stream is valid for the call.
        endpoint::capture_file(|f| unsafe { sys::ucp_worker_print_info(self.inner.h, f) })
    }
}

/// Largest worker address accepted from a peer (UCX 1.13 gives ~100-600 B).
pub const MAX_WORKER_ADDRESS: usize = 4096;
/// Alias exported at the crate root.
pub use MAX_WORKER_ADDRESS as MAX_WORKER_ADDRESS_BYTES;
const ADDRESS_SLACK: usize = 64 * 1024;

/// A listening socket address; dropping it (and every pending
/// [`ConnRequest`], which keeps the listener alive to reject or accept
/// against it) stops listening at the worker's next
/// [`Worker::progress`] or its destruction, not at once (`handler_ids`):
/// the port stays bound until then, so a caller that listens again on the
/// same port must progress the worker in between.
pub struct Listener {
    core: Rc<ListenerCore>,
}

struct ListenerCore {
    h: sys::ucp_listener_h,
    /// Handed to the worker with the listener's destruction (Drop).
    handler: RefCell<Option<Box<ConnHandlerBox>>>,
    worker: Rc<WorkerInner>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("addr", &self.local_addr().ok()).finish()
    }
}

impl Listener {
    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        let mut attr =
            sys::ucp_listener_attr_t { field_mask: sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR as u64, ..Default::default() };
        // SAFETY: live listener; attr is an out-struct.
        check("ucp_listener_query", unsafe { sys::ucp_listener_query(self.core.h, &mut attr) })?;
        let storage: &libc::sockaddr_storage =
            // SAFETY: bindgen's sockaddr_storage and libc's have the same C layout.
            unsafe { &*(&attr.sockaddr as *const sys::sockaddr_storage as *const libc::sockaddr_storage) };
        sockaddr_to_std(storage)
            .ok_or(Error::Invalid { op: "ucp_listener_query", reason: "unknown address family".into() })
    }
}

impl Drop for ListenerCore {
    fn drop(&mut self) {
        // Destroyed by the worker's next progress (or its Drop), inside a
        // window (`handler_ids`), after the rejections deferred for it:
        // every ConnRequest (they hold this core) is gone by now.
        if let Some(handler) = self.handler.borrow_mut().take() {
            self.worker.pending_listener.borrow_mut().push((self.h, handler));
        }
    }
}

type ConnHandlerFn = Box<dyn FnMut(ConnRequest)>;

struct ConnHandlerBox {
    f: RefCell<ConnHandlerFn>,
    core: RefCell<std::rc::Weak<ListenerCore>>,
    /// The listener's handle, for requests that arrive after its Rust
    /// handle is gone and before the worker destroyed it (deferred).
    listener: Cell<sys::ucp_listener_h>,
    in_callback: Rc<Cell<bool>>,
}

unsafe extern "C" fn conn_cb(conn_request: sys::ucp_conn_request_h, arg: *mut std::ffi::c_void) {
    // SAFETY: arg is the ConnHandlerBox owned by the Listener, alive while
    // the listener exists (UCX calls this only then).
    let hb = unsafe { &*(arg as *const ConnHandlerBox) };
    let Some(core) = hb.core.borrow().upgrade() else {
        // The Listener was dropped; its destruction waits for the next
        // progress. Refuse the request now: this runs inside progress,
        // whose window drains what the rejection removes (`handler_ids`).
        // SAFETY: the listener is live until the worker destroys it (not
        // yet: it does so outside progress), and the request is its own,
        // handed to nobody else.
        unsafe { sys::ucp_listener_reject(hb.listener.get(), conn_request) };
        return;
    };
    let req = ConnRequest { h: conn_request, listener: Some(core), consumed: false };
    hb.in_callback.set(true);
    if let Ok(mut f) = hb.f.try_borrow_mut() {
        f(req);
    }
    hb.in_callback.set(false);
}

/// An incoming connection; accept it with [`Worker::accept`]. Dropping it
/// rejects the connection.
pub struct ConnRequest {
    h: sys::ucp_conn_request_h,
    listener: Option<Rc<ListenerCore>>,
    consumed: bool,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest").field("h", &self.h).finish()
    }
}

impl ConnRequest {
    /// The client's address as the listener saw it (its end of the TCP
    /// connection), if UCX reports one.
    pub fn client_addr(&self) -> Option<SocketAddr> {
        let mut attr = sys::ucp_conn_request_attr_t {
            field_mask: sys::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR as u64,
            ..Default::default()
        };
        // SAFETY: the request is live (neither accepted nor rejected: this
        // struct owns it); attr is an out-struct of the right type.
        check("ucp_conn_request_query", unsafe { sys::ucp_conn_request_query(self.h, &mut attr) }).ok()?;
        // SAFETY: bindgen's sockaddr_storage is the C struct libc also
        // describes (same size, alignment and layout); UCX filled it.
        let storage = unsafe { &*(&attr.client_address as *const _ as *const libc::sockaddr_storage) };
        sockaddr_to_std(storage)
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if let (false, Some(l)) = (self.consumed, &self.listener) {
            // Rejected by the worker's next progress, inside a window
            // (`handler_ids`), before the listener is destroyed (its
            // destruction is deferred to the same place, after rejections).
            l.worker.pending_reject.borrow_mut().push((l.h, self.h));
        }
    }
}

type AmHandlerFn = Box<dyn FnMut(AmRecv<'_>) -> AmVerdict>;

struct AmHandlerBox {
    f: RefCell<AmHandlerFn>,
    worker: sys::ucp_worker_h,
    ctx: Context,
    in_callback: Rc<Cell<bool>>,
}

/// One received active message, valid only inside the handler.
#[derive(Debug)]
pub struct AmRecv<'a> {
    pub header: &'a [u8],
    /// Identity of the endpoint the message came in on, when the sender
    /// asked for a reply endpoint ([`Endpoint::am_send`] with `reply`). Only
    /// for matching against [`Endpoint::id`]: never used for RMA (UCX 1.13
    /// asserts on RMA over the AM reply endpoint).
    pub reply_ep: Option<usize>,
    pub payload: AmPayload<'a>,
}

/// The payload of an active message.
#[derive(Debug)]
pub enum AmPayload<'a> {
    /// Delivered eagerly; valid only during the handler (copy what you keep).
    Inline(&'a [u8]),
    /// Too large for eager delivery: receive it with [`RndvDesc::receive`]
    /// or leave it, and the sender's send fails with the handler's verdict.
    Rendezvous(RndvDesc<'a>),
}

/// A rendezvous descriptor of `len` bytes.
pub struct RndvDesc<'a> {
    worker: sys::ucp_worker_h,
    desc: *mut std::ffi::c_void,
    len: usize,
    used: &'a Cell<bool>,
}

impl std::fmt::Debug for RndvDesc<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RndvDesc").field("len", &self.len).finish()
    }
}

impl RndvDesc<'_> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Starts receiving the payload into `buf` (resized to `len`). When the
    /// op completes, `take_kept()` gives back the `Vec<u8>`.
    pub fn receive(self, mut buf: Vec<u8>) -> Result<Op> {
        buf.resize(self.len, 0);
        let ptr_ = buf.as_mut_ptr();
        let op = Op::new("ucp_am_recv_data_nbx", vec![Box::new(buf)]);
        let ud = op.user_data();
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
            user_data: ud,
            ..Default::default()
        };
        param.cb.recv_am = Some(recv_am_cb);
        self.used.set(true);
        // SAFETY: desc is the rendezvous descriptor of the message being
        // handled (UCX takes ownership of it in this call even on failure);
        // the buffer is `len` bytes and is kept alive by the op until the
        // receive completes.
        let ret = unsafe { sys::ucp_am_recv_data_nbx(self.worker, self.desc, ptr_.cast(), self.len, &param) };
        op.started(ret, ud)
    }
}

/// What the handler decided about a rendezvous payload it did not receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmVerdict {
    /// Message handled.
    Done,
    /// Refuse a rendezvous payload: the sender's operation completes with
    /// this status. Ignored for inline payloads.
    Reject(Status),
}

unsafe extern "C" fn am_cb(
    arg: *mut std::ffi::c_void,
    header: *const std::ffi::c_void,
    header_length: usize,
    data: *mut std::ffi::c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmHandlerBox kept in WorkerInner::handlers for the
    // worker's whole life.
    let hb = unsafe { &*(arg as *const AmHandlerBox) };
    let header: &[u8] = if header_length == 0 || header.is_null() {
        &[]
    } else {
        // SAFETY: UCX gives header_length readable bytes valid during the callback.
        unsafe { std::slice::from_raw_parts(header as *const u8, header_length) }
    };
    // SAFETY: param is valid during the callback.
    let attr = unsafe { (*param).recv_attr };
    let reply_ep = if attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP as u64 != 0 {
        // SAFETY: the field is valid when its bit is set in recv_attr.
        Some(unsafe { (*param).reply_ep } as usize)
    } else {
        None
    };
    let rndv = attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV as u64 != 0;
    let used = Cell::new(false);
    let payload = if rndv {
        AmPayload::Rendezvous(RndvDesc { worker: hb.worker, desc: data, len: length, used: &used })
    } else if length == 0 || data.is_null() {
        AmPayload::Inline(&[])
    } else {
        // SAFETY: eager data: `length` bytes valid during the callback.
        AmPayload::Inline(unsafe { std::slice::from_raw_parts(data as *const u8, length) })
    };
    let s = hb.ctx.stats();
    Stats::add(&s.am_received, 1);
    Stats::add(&s.am_bytes_received, (header_length + length) as u64);
    if rndv {
        Stats::add(&s.am_rndv_received, 1);
    }
    hb.in_callback.set(true);
    let verdict = match hb.f.try_borrow_mut() {
        Ok(mut f) => f(AmRecv { header, reply_ep, payload }),
        Err(_) => AmVerdict::Reject(Status::BUSY),
    };
    hb.in_callback.set(false);
    if rndv && used.get() {
        sys::UCS_INPROGRESS as sys::ucs_status_t
    } else if rndv {
        match verdict {
            AmVerdict::Reject(st) if !st.is_ok() => st.0 as sys::ucs_status_t,
            _ => sys::UCS_ERR_REJECTED as sys::ucs_status_t,
        }
    } else {
        sys::UCS_OK as sys::ucs_status_t
    }
}

/// A socket address in the C layout UCX wants.
pub(crate) struct SockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl From<SocketAddr> for SockAddr {
    fn from(a: SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match a {
            SocketAddr::V4(v4) => {
                // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
                let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
                let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
                sin6.sin6_flowinfo = v6.flowinfo();
                sin6.sin6_scope_id = v6.scope_id();
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        SockAddr { storage, len: len as libc::socklen_t }
    }
}

impl SockAddr {
    pub(crate) fn as_ucs(&self) -> sys::ucs_sock_addr_t {
        sys::ucs_sock_addr_t { addr: &self.storage as *const _ as *const sys::sockaddr, addrlen: self.len }
    }
}

fn sockaddr_to_std(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match s.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin = unsafe { &*(s as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(s as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// UCS's process-wide limit on async event handlers (`UCX_ASYNC_MAX_EVENTS`,
/// default 1024) that a listening process runs with. Every connection a
/// listener accepts holds one handler until UCX is done with its socket.
/// At the default, a flood of ~1,500 connections made UCX 1.13 fail to
/// register the 1,024th and take an error path that closes the socket
/// twice and leaves a freed endpoint in the connection manager's list:
/// other descriptors were closed under their owners ("failed to close fd")
/// and the server died of SIGSEGV at its next `ucp_worker_destroy`
/// (tested: `dafne/tests/hostile.rs`). With the limit far above what the
/// process's descriptors allow, the descriptor limit is met first, and the
/// listener's guard (`dafne-transport`'s `sockguard`) resets the flood
/// (it needs no free descriptor: [`crate::sockets`]). At the descriptor
/// limit UCX's `accept` fails with EMFILE in a busy loop, logging a line
/// each time (1.7 to 4.9 MB in the first 0.7 s of a flood past a hard
/// limit of 1,024, measured in `hostile.rs`): [`crate::acceptgate`] pauses
/// the listener from inside UCX's `accept` at a soft limit that keeps a
/// reserve, so UCX never meets EMFILE there.
pub const ASYNC_MAX_EVENTS: u32 = 1 << 20;

/// Sets UCS's `ASYNC_MAX_EVENTS` to [`ASYNC_MAX_EVENTS`] unless the user
/// chose a value (`UCX_ASYNC_MAX_EVENTS` in the environment), once per
/// process.
fn raise_async_max_events() -> Result<()> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        if std::env::var_os("UCX_ASYNC_MAX_EVENTS").is_some() {
            return Ok(());
        }
        let name = c"ASYNC_MAX_EVENTS";
        let value = std::ffi::CString::new(ASYNC_MAX_EVENTS.to_string()).expect("digits have no NUL");
        // SAFETY: both arguments are NUL-terminated strings that live for
        // the call; UCS copies the parsed value into its global options
        // (read when a handler is added, under its own lock).
        let status = unsafe { sys::ucs_global_opts_set_value(name.as_ptr(), value.as_ptr()) };
        if status == sys::UCS_OK as sys::ucs_status_t {
            Ok(())
        } else {
            Err(format!("UCS refused ASYNC_MAX_EVENTS={ASYNC_MAX_EVENTS} (status {status})"))
        }
    })
    .clone()
    .map_err(|reason| Error::Invalid { op: "ucs_global_opts_set_value", reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_in_c_layout() {
        for a in ["127.0.0.1:5000", "[::1]:6000", "[fe80::1%2]:7", "10.1.2.3:65535"] {
            let std_addr: SocketAddr = a.parse().unwrap();
            let c = SockAddr::from(std_addr);
            assert_eq!(sockaddr_to_std(&c.storage), Some(std_addr), "{a}");
            let ucs = c.as_ucs();
            let expected = if std_addr.is_ipv4() { 16 } else { 28 };
            assert_eq!(ucs.addrlen as usize, expected);
        }
    }

    #[test]
    fn listener_binds_ipv4_and_ipv6() {
        let ctx = Context::new(&crate::ContextOptions::default()).unwrap();
        let w = Worker::new(&ctx).unwrap();
        for a in ["127.0.0.1:0", "[::1]:0"] {
            let l = w.listen(a.parse().unwrap(), |_| {}).unwrap();
            let bound = l.local_addr().unwrap();
            assert_eq!(bound.ip(), a.parse::<SocketAddr>().unwrap().ip());
            assert_ne!(bound.port(), 0);
        }
    }
}
