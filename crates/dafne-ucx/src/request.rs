//! Completion of non-blocking UCX operations.
//!
//! Every `*_nbx` call gets a heap [`OpState`] whose pointer rides in the
//! request's `user_data`. UCX owns one strong reference until its callback
//! runs; the caller owns another through [`Op`]. The state also holds the
//! keep-alive objects (buffers, regions, keys) the operation touches, so
//! that memory outlives the operation even if the caller gives up on it.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context as TaskContext, Poll, Waker};

use ucx_sys as sys;

use crate::error::{Error, Result, Status};

pub(crate) struct OpState {
    op: &'static str,
    status: Cell<Option<Status>>,
    /// Bytes received (for AM data receives).
    length: Cell<usize>,
    waker: Cell<Option<Waker>>,
    keep: RefCell<Vec<Box<dyn Any>>>,
}

/// A started UCX operation. Poll it as a future, or check [`Op::poll_done`]
/// after progressing the worker. Dropping it does not cancel the operation.
pub struct Op {
    state: Rc<OpState>,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Op").field("op", &self.state.op).field("status", &self.state.status.get()).finish()
    }
}

impl Op {
    pub(crate) fn new(op: &'static str, keep: Vec<Box<dyn Any>>) -> Op {
        Op {
            state: Rc::new(OpState {
                op,
                status: Cell::new(None),
                length: Cell::new(0),
                waker: Cell::new(None),
                keep: RefCell::new(keep),
            }),
        }
    }

    /// An operation that failed before it could start.
    pub fn failed(op: &'static str, status: Status) -> Op {
        let o = Op::new(op, Vec::new());
        o.state.status.set(Some(status));
        o
    }

    /// Fills `param` so that UCX reports completion into this op, and
    /// returns the raw reference UCX will own.
    pub(crate) fn user_data(&self) -> *mut std::ffi::c_void {
        Rc::into_raw(self.state.clone()) as *mut std::ffi::c_void
    }

    /// Interprets what an `*_nbx` call returned, given that `user_data()`
    /// was passed in its parameters.
    pub(crate) fn started(self, ret: sys::ucs_status_ptr_t, user_data: *mut std::ffi::c_void) -> Result<Op> {
        if sys::UCS_PTR_IS_PTR(ret) {
            // UCX owns the reference until the callback runs.
            return Ok(self);
        }
        // Completed (NULL) or failed at once: the callback will not run, so
        // take back the reference UCX would have owned.
        // SAFETY: user_data came from Rc::into_raw in user_data() and the
        // callback will not consume it.
        drop(unsafe { Rc::from_raw(user_data as *const OpState) });
        if ret.is_null() {
            self.complete(Status::OK);
            Ok(self)
        } else {
            let status = Status(sys::UCS_PTR_STATUS(ret) as i8);
            self.complete(status);
            Err(Error::Ucx { op: self.state.op, status })
        }
    }

    fn complete(&self, status: Status) {
        complete_state(&self.state, status);
    }

    /// `None` while in flight, then the outcome.
    pub fn poll_done(&self) -> Option<Result<()>> {
        self.state.status.get().map(|s| self.to_result(s))
    }

    /// Bytes delivered (AM data receives).
    pub fn length(&self) -> usize {
        self.state.length.get()
    }

    /// Takes back the keep-alive objects once the operation is done.
    pub fn take_kept(&self) -> Vec<Box<dyn Any>> {
        if self.state.status.get().is_some() {
            std::mem::take(&mut *self.state.keep.borrow_mut())
        } else {
            Vec::new()
        }
    }

    fn to_result(&self, s: Status) -> Result<()> {
        if s.is_ok() {
            Ok(())
        } else {
            Err(Error::Ucx { op: self.state.op, status: s })
        }
    }
}

impl Future for Op {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match self.state.status.get() {
            Some(s) => Poll::Ready(self.to_result(s)),
            None => {
                self.state.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

fn complete_state(state: &OpState, status: Status) {
    if state.status.get().is_none() {
        state.status.set(Some(status));
    }
    if let Some(w) = state.waker.take() {
        w.wake();
    }
}

/// `ucp_send_nbx_callback_t` for every send-like operation (AM send, put,
/// get, flush, close).
pub(crate) unsafe extern "C" fn send_cb(
    request: *mut std::ffi::c_void,
    status: sys::ucs_status_t,
    user_data: *mut std::ffi::c_void,
) {
    // SAFETY: user_data is the Rc reference handed to UCX in user_data();
    // UCX calls this callback exactly once per request.
    let state = unsafe { Rc::from_raw(user_data as *const OpState) };
    complete_state(&state, Status(status));
    // SAFETY: the request came from an *_nbx call and is freed once, here.
    unsafe { sys::ucp_request_free(request) };
}

/// `ucp_am_recv_data_nbx_callback_t`.
pub(crate) unsafe extern "C" fn recv_am_cb(
    request: *mut std::ffi::c_void,
    status: sys::ucs_status_t,
    length: usize,
    user_data: *mut std::ffi::c_void,
) {
    // SAFETY: as in send_cb.
    let state = unsafe { Rc::from_raw(user_data as *const OpState) };
    state.length.set(length);
    complete_state(&state, Status(status));
    // SAFETY: as in send_cb.
    unsafe { sys::ucp_request_free(request) };
}

/// Parameters for an operation reporting into `user_data` via `send_cb`.
pub(crate) fn send_param(user_data: *mut std::ffi::c_void, memh: Option<sys::ucp_mem_h>) -> sys::ucp_request_param_t {
    let mut p = sys::ucp_request_param_t {
        op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
        user_data,
        ..Default::default()
    };
    p.cb.send = Some(send_cb);
    if let Some(m) = memh {
        p.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
        p.memh = m;
    }
    p
}

impl Op {
    /// Another handle to the same operation (to register a waker from a
    /// second place, e.g. a combinator that also watches a deadline).
    pub fn clone_handle(op: &Op) -> Op {
        Op { state: op.state.clone() }
    }
}
