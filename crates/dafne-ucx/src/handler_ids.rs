//! Descriptor numbers across workers: orders UCX calls that register async
//! handlers against windows in which a worker may still hold a stale
//! "missed" event.
//!
//! # Why
//!
//! UCS keeps one process-wide table of async handlers keyed by descriptor
//! number (or timer id). When UCX's async thread sees an event on a
//! worker's descriptor while that worker's thread holds its async context
//! (inside most UCP calls), it queues the *number* on the worker's "missed"
//! queue; the worker drains that queue at the end of `ucp_worker_progress`
//! (`ucs_async_check_miss`). Removing a handler does not take its number
//! off that queue (UCX 1.13.1; fixed upstream by openucx/ucx#9942). So when
//! a worker removes a handler and closes its socket (an endpoint or
//! listener torn down, a connection request rejected), and *another*
//! worker's thread opens a descriptor that gets the same number and
//! registers it before the first worker's next drain, that drain finds the
//! other worker's handler: `async.c:643 Assertion handler->async == async`
//! aborts the process (seen once in CI in `dafne-transport`'s
//! `tests/transport.rs`; reproduced by `tests/async_reuse.rs`).
//!
//! # How
//!
//! One process-wide read-write lock:
//! * shared ([`window`]) while a worker may remove handlers and until it
//!   has drained its queue: [`crate::Worker::progress`] (deferred endpoint
//!   closes, conn-request rejections, listener destructions, then
//!   `ucp_worker_progress`, which drains at its end) and the worker's
//!   destruction. Those removals are therefore done only there (endpoints
//!   already were; rejections and listener destructions are deferred to
//!   the next progress like them);
//! * exclusive ([`registering`]) around the calls that open descriptors
//!   and register handlers for them on the caller's thread:
//!   `ucp_init`, `ucp_worker_create`, `ucp_ep_create`, `ucp_listener_create`.
//!
//! A number freed inside a window can then be taken only by a
//! registration that starts after every worker then in a window has
//! drained. Progress calls of different workers still run side by side
//! (shared); a registration waits for the progress calls in flight.
//!
//! Not covered: handlers UCX registers on its own async thread. A
//! listener's incoming connections are accepted and registered there
//! (`tcp_sockcm`), so a process that listens *and* runs a second worker (an
//! io server's heartbeat runtime) keeps the hazard for numbers the listener
//! accepts; a process of client workers only (the transport tests) does
//! not.
//!
//! A thread already inside a window (a registration from a UCX callback,
//! which UCX runs inside progress) neither waits for the lock again nor for
//! the exclusive side (it would wait for itself): such a call goes
//! unordered. dafne's callbacks only queue work, so none does this.

use std::cell::Cell;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static NUMBERS: RwLock<()> = RwLock::new(());

thread_local! {
    /// Windows and registrations this thread is inside (nested calls take
    /// no second guard).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

enum Held {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
    Nested,
}

/// A held side of the lock; released when dropped.
pub(crate) struct Guard(#[allow(dead_code)] Held);

impl Drop for Guard {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

fn enter(take: impl FnOnce() -> Held) -> Guard {
    let nested = DEPTH.with(|d| {
        let n = d.get();
        d.set(n + 1);
        n > 0
    });
    Guard(if nested { Held::Nested } else { take() })
}

/// Shared: this worker may remove handlers until its next drain.
pub(crate) fn window() -> Guard {
    enter(|| Held::Shared(NUMBERS.read().unwrap_or_else(|p| p.into_inner())))
}

/// Exclusive: this call may open descriptors and register handlers.
pub(crate) fn registering() -> Guard {
    enter(|| Held::Exclusive(NUMBERS.write().unwrap_or_else(|p| p.into_inner())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_waits_for_a_window_and_nested_calls_do_not_block() {
        let w = window();
        // Nested on this thread: neither blocks.
        drop(window());
        drop(registering());
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _r = registering();
            tx.send(()).unwrap();
        });
        // The other thread's registration cannot start while the window is
        // open (checked again after it closes: it then does).
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err());
        drop(w);
        rx.recv_timeout(std::time::Duration::from_secs(30)).expect("the registration never ran");
        t.join().unwrap();
    }
}
