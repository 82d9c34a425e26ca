//! Timers of the event loop (thread-local: each runtime thread has its own).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    wakers: std::collections::HashMap<u64, Waker>,
    next: u64,
}

thread_local! {
    static TIMERS: RefCell<Timers> = RefCell::new(Timers::default());
}

/// Wakes every timer that is due; returns the next deadline.
pub(crate) fn fire(now: Instant) -> Option<Instant> {
    let due: Vec<Waker> = TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let mut out = Vec::new();
        while let Some(Reverse((when, id))) = t.heap.peek().copied() {
            if when > now {
                break;
            }
            t.heap.pop();
            if let Some(w) = t.wakers.remove(&id) {
                out.push(w);
            }
        }
        out
    });
    for w in due {
        w.wake();
    }
    TIMERS.with(|t| t.borrow().heap.peek().map(|r| r.0 .0))
}

/// A future that completes at `deadline` (must be polled on a runtime thread).
#[derive(Debug)]
pub struct Sleep {
    deadline: Instant,
    id: Option<u64>,
}

/// Sleeps for `d` on the runtime's event loop.
pub fn sleep(d: Duration) -> Sleep {
    Sleep { deadline: Instant::now() + d, id: None }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        let id = TIMERS.with(|t| {
            let mut t = t.borrow_mut();
            let id = match self.id {
                Some(id) => id,
                None => {
                    t.next += 1;
                    let id = t.next;
                    t.heap.push(Reverse((deadline, id)));
                    id
                }
            };
            t.wakers.insert(id, cx.waker().clone());
            id
        });
        self.id = Some(id);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let _ = TIMERS.try_with(|t| t.borrow_mut().wakers.remove(&id));
        }
    }
}
