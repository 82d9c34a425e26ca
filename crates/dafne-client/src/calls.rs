//! Round trips counted by the thread that waits for them.
//!
//! A FUSE daemon wants to know what each kernel operation costs in round
//! trips (issue 9: the small-file path is bounded by the latency of each
//! call, so every round trip removed matters). The library cannot tell
//! which operation a request belongs to, but the thread that sends it can:
//! a blocking call (`MetaSession`'s methods, the data client's futures
//! under `block_on`) runs on the calling thread, so counters kept per
//! thread, read before and after an operation, give exactly that
//! operation's round trips whatever other threads do meanwhile.
//! Requests sent from other threads (write-behind's completion thread, the
//! read-ahead and keepalive threads) count on those threads, not on the
//! operation that queued them: they are not waited for by it.
//!
//! What counts: each request sent to the metadata server (a resend after a
//! lost connection counts again; a `Watch`, which waits for changes rather
//! than answering a call, does not) and each request sent to an io server.

use std::cell::Cell;

thread_local! {
    static META: Cell<u64> = const { Cell::new(0) };
    static IO: Cell<u64> = const { Cell::new(0) };
}

/// Requests this thread sent so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    /// To the metadata server.
    pub meta: u64,
    /// To io servers (each server of a striped request counts).
    pub io: u64,
}

impl Calls {
    /// What was sent between `earlier` and `self` (both of one thread).
    pub fn since(self, earlier: Calls) -> Calls {
        Calls { meta: self.meta.wrapping_sub(earlier.meta), io: self.io.wrapping_sub(earlier.io) }
    }
}

/// This thread's counts.
pub fn this_thread() -> Calls {
    Calls { meta: META.with(Cell::get), io: IO.with(Cell::get) }
}

pub(crate) fn meta_sent() {
    META.with(|c| c.set(c.get().wrapping_add(1)));
}

pub(crate) fn io_sent() {
    IO.with(|c| c.set(c.get().wrapping_add(1)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_per_thread() {
        let before = this_thread();
        meta_sent();
        io_sent();
        io_sent();
        std::thread::spawn(|| {
            meta_sent();
            assert_eq!(this_thread(), Calls { meta: 1, io: 0 });
        })
        .join()
        .unwrap();
        assert_eq!(this_thread().since(before), Calls { meta: 1, io: 2 });
    }
}
