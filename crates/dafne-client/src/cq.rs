//! Completion queues (DAFS, ORFA): post operations, then poll, wait for one
//! ticket, or wait for any completion.
//!
//! A queue owns one driver thread that runs every posted operation to
//! completion concurrently (the operations are futures whose bulk work the
//! io servers do by RMA; the driver only moves requests and replies). An
//! application may have any number of queues, e.g. one per thread, or
//! completion groups.
//!
//! A library layer that tracks its own operations (read-ahead, which keeps
//! each prefetch's outcome with the buffer it fills) posts them
//! *detached*: they run on the same driver, but no completion is queued,
//! so an outcome nobody asks for (a prefetch dropped by an invalidation)
//! does not pile up in the queue.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use dafne_proto::Errno;
use futures::channel::mpsc;
use futures::stream::{FuturesUnordered, Stream, StreamExt};

/// Identifies one posted operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// What an operation reports: bytes moved, or an errno.
pub type Completion = (Ticket, Result<usize, Errno>);

type Op = Pin<Box<dyn Future<Output = Result<usize, Errno>> + Send>>;
/// An operation on the driver, with its ticket (`None`: detached).
type Running = Pin<Box<dyn Future<Output = (Option<Ticket>, Result<usize, Errno>)> + Send>>;

#[derive(Default)]
struct State {
    done: VecDeque<Completion>,
    outstanding: usize,
    /// The tickets posted and not yet completed (`wait` on any other
    /// ticket that is not in `done` would wait for nothing).
    running: HashSet<Ticket>,
    next: u64,
}

/// A completion queue. `Send + Sync`; clones share the queue.
#[derive(Clone)]
pub struct CompletionQueue {
    shared: Arc<(Mutex<State>, Condvar)>,
    tx: mpsc::UnboundedSender<(Option<Ticket>, Op)>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue").field("outstanding", &self.outstanding()).finish()
    }
}

impl Default for CompletionQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl CompletionQueue {
    pub fn new() -> CompletionQueue {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let (tx, mut rx) = mpsc::unbounded::<(Option<Ticket>, Op)>();
        let sh = shared.clone();
        std::thread::Builder::new()
            .name("dafne-cq".into())
            .spawn(move || {
                let mut running: FuturesUnordered<Running> = FuturesUnordered::new();
                let mut closed = false;
                futures::executor::block_on(std::future::poll_fn(|cx| {
                    while !closed {
                        match Pin::new(&mut rx).poll_next(cx) {
                            Poll::Ready(Some((t, op))) => running.push(Box::pin(async move { (t, op.await) })),
                            Poll::Ready(None) => closed = true,
                            Poll::Pending => break,
                        }
                    }
                    while let Poll::Ready(Some((t, r))) = running.poll_next_unpin(cx) {
                        // Detached operations report nothing.
                        let Some(t) = t else { continue };
                        let (lock, cv) = &*sh;
                        let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                        st.outstanding -= 1;
                        st.running.remove(&t);
                        st.done.push_back((t, r));
                        cv.notify_all();
                    }
                    if closed && running.is_empty() {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                }));
            })
            .expect("spawning a completion queue thread");
        CompletionQueue { shared, tx }
    }

    /// Posts an operation; it starts at once. Returns its ticket.
    pub fn post(&self, op: impl Future<Output = Result<usize, Errno>> + Send + 'static) -> Ticket {
        let t = {
            let mut st = self.lock();
            st.next += 1;
            st.outstanding += 1;
            let t = Ticket(st.next);
            st.running.insert(t);
            t
        };
        if self.tx.unbounded_send((Some(t), Box::pin(op))).is_err() {
            let mut st = self.lock();
            st.outstanding -= 1;
            st.running.remove(&t);
            st.done.push_back((t, Err(Errno::EIO)));
        }
        t
    }

    /// Runs an operation on the queue's driver without a ticket: its
    /// outcome is not queued (the operation reports it itself), and it does
    /// not count as outstanding. `false` if the driver is gone (the
    /// operation was dropped without running).
    pub fn post_detached(&self, op: impl Future<Output = ()> + Send + 'static) -> bool {
        self.tx
            .unbounded_send((
                None,
                Box::pin(async move {
                    op.await;
                    Ok(0)
                }),
            ))
            .is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Operations posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.lock().outstanding
    }

    /// The oldest completion not yet taken, without waiting.
    pub fn poll(&self) -> Option<Completion> {
        self.lock().done.pop_front()
    }

    /// Waits up to `timeout` for any completion (`None`: nothing completed,
    /// or nothing is outstanding).
    pub fn wait_any(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let (_, cv) = &*self.shared;
        let mut st = self.lock();
        loop {
            if let Some(c) = st.done.pop_front() {
                return Some(c);
            }
            let now = Instant::now();
            if st.outstanding == 0 || now >= deadline {
                return None;
            }
            st = cv.wait_timeout(st, deadline - now).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Waits for one ticket; other completions stay queued for `poll` /
    /// `wait_any`. `Err(ETIMEDOUT)` if it did not complete in `timeout`,
    /// `Err(ENOENT)` for a ticket that is neither running nor queued. An
    /// operation may itself end with those errnos: [`Self::wait_ticket`]
    /// tells them apart.
    pub fn wait(&self, ticket: Ticket, timeout: Duration) -> Result<usize, Errno> {
        match self.wait_ticket(ticket, timeout) {
            Waited::Done(r) => r,
            Waited::TimedOut => Err(Errno::ETIMEDOUT),
            Waited::Unknown => Err(Errno::ENOENT),
        }
    }

    /// Waits for one ticket and says why it stopped: the operation's
    /// outcome (taken from the queue), the timeout, or at once a ticket
    /// that is neither running nor queued (taken already, or never posted
    /// here), which nothing would ever complete.
    pub fn wait_ticket(&self, ticket: Ticket, timeout: Duration) -> Waited {
        let deadline = Instant::now() + timeout;
        let (_, cv) = &*self.shared;
        let mut st = self.lock();
        loop {
            if let Some(i) = st.done.iter().position(|(t, _)| *t == ticket) {
                return Waited::Done(st.done.remove(i).map(|(_, r)| r).unwrap_or(Err(Errno::EIO)));
            }
            if !st.running.contains(&ticket) {
                return Waited::Unknown;
            }
            let now = Instant::now();
            if now >= deadline {
                return Waited::TimedOut;
            }
            st = cv.wait_timeout(st, deadline - now).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// What [`CompletionQueue::wait_ticket`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// The operation completed with this outcome (now taken).
    Done(Result<usize, Errno>),
    /// Still running at the timeout.
    TimedOut,
    /// Neither running nor queued: taken already, or never posted here.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_for_an_unknown_or_taken_ticket_ends_at_once_and_an_errno_outcome_is_delivered() {
        let cq = CompletionQueue::new();
        let start = Instant::now();
        assert_eq!(cq.wait_ticket(Ticket(42), Duration::from_secs(30)), Waited::Unknown, "never posted");
        let t = cq.post(async { Err(Errno::ETIMEDOUT) });
        assert_eq!(cq.wait_ticket(t, Duration::from_secs(30)), Waited::Done(Err(Errno::ETIMEDOUT)));
        assert_eq!(cq.wait_ticket(t, Duration::from_secs(30)), Waited::Unknown, "taken already");
        assert_eq!(cq.wait(t, Duration::from_secs(30)), Err(Errno::ENOENT));
        assert!(start.elapsed() < Duration::from_secs(30), "a wait for nothing waited out its timeout");
    }

    #[test]
    fn post_poll_wait_one_and_wait_any() {
        let cq = CompletionQueue::new();
        assert!(cq.poll().is_none());
        assert!(cq.wait_any(Duration::from_millis(10)).is_none(), "nothing outstanding");
        let (tx, rx) = futures::channel::oneshot::channel::<usize>();
        let slow = cq.post(async move { rx.await.map_err(|_| Errno::EIO) });
        let fast: Vec<Ticket> = (0..5).map(|i| cq.post(async move { Ok(i) })).collect();
        let failing = cq.post(async { Err(Errno::ENOSPC) });
        // wait-one for a specific ticket leaves the others queued.
        assert_eq!(cq.wait(fast[3], Duration::from_secs(5)), Ok(3));
        assert_eq!(cq.wait(failing, Duration::from_secs(5)), Err(Errno::ENOSPC));
        let mut got = Vec::new();
        while let Some((t, r)) = cq.wait_any(Duration::from_millis(200)) {
            got.push((t, r));
        }
        got.sort();
        assert_eq!(got, vec![(fast[0], Ok(0)), (fast[1], Ok(1)), (fast[2], Ok(2)), (fast[4], Ok(4))]);
        assert_eq!(cq.outstanding(), 1);
        assert_eq!(cq.wait(slow, Duration::from_millis(20)), Err(Errno::ETIMEDOUT));
        tx.send(42).unwrap();
        assert_eq!(cq.wait(slow, Duration::from_secs(5)), Ok(42));
        assert_eq!(cq.outstanding(), 0);
    }

    #[test]
    fn detached_operations_run_and_queue_no_completion() {
        let cq = CompletionQueue::new();
        let (tx, rx) = std::sync::mpsc::channel();
        assert!(cq.post_detached(async move { tx.send(7).unwrap() }));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(7), "the detached operation ran");
        let t = cq.post(async { Ok(1) });
        assert_eq!(cq.wait_any(Duration::from_secs(5)), Some((t, Ok(1))), "only the ticketed completion is queued");
        assert!(cq.poll().is_none());
        assert_eq!(cq.outstanding(), 0);
    }
}
