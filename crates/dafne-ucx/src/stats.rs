//! Counters that prove what the data path did: bytes moved by RMA, messages,
//! registrations and what they cost. They are per [`crate::Context`] and cheap
//! (relaxed atomics), so they stay on in production.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters of one context.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) bytes_put: AtomicU64,
    pub(crate) bytes_got: AtomicU64,
    pub(crate) puts: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) am_sent: AtomicU64,
    pub(crate) am_bytes_sent: AtomicU64,
    pub(crate) am_received: AtomicU64,
    pub(crate) am_bytes_received: AtomicU64,
    pub(crate) am_rndv_received: AtomicU64,
    pub(crate) registrations: AtomicU64,
    pub(crate) registration_ns: AtomicU64,
    pub(crate) registered_bytes: AtomicU64,
    pub(crate) deregistrations: AtomicU64,
    pub(crate) deregistration_ns: AtomicU64,
    pub(crate) rkey_unpacks: AtomicU64,
    pub(crate) rkey_unpack_ns: AtomicU64,
    pub(crate) key_parts_unmapped: AtomicU64,
    pub(crate) rma_outside_window: AtomicU64,
}

/// A point-in-time copy of [`Stats`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub bytes_put: u64,
    pub bytes_got: u64,
    pub puts: u64,
    pub gets: u64,
    pub am_sent: u64,
    pub am_bytes_sent: u64,
    pub am_received: u64,
    pub am_bytes_received: u64,
    pub am_rndv_received: u64,
    pub registrations: u64,
    pub registration_ns: u64,
    pub registered_bytes: u64,
    pub deregistrations: u64,
    pub deregistration_ns: u64,
    pub rkey_unpacks: u64,
    pub rkey_unpack_ns: u64,
    /// Parts of peers' keys naming shared-memory segments, removed before
    /// unpacking (servers never map a peer's segment; see `KeyShape`).
    pub key_parts_unmapped: u64,
    /// Puts and gets refused because the remote range left the key's window.
    pub rma_outside_window: u64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            bytes_put: self.bytes_put.load(Relaxed),
            bytes_got: self.bytes_got.load(Relaxed),
            puts: self.puts.load(Relaxed),
            gets: self.gets.load(Relaxed),
            am_sent: self.am_sent.load(Relaxed),
            am_bytes_sent: self.am_bytes_sent.load(Relaxed),
            am_received: self.am_received.load(Relaxed),
            am_bytes_received: self.am_bytes_received.load(Relaxed),
            am_rndv_received: self.am_rndv_received.load(Relaxed),
            registrations: self.registrations.load(Relaxed),
            registration_ns: self.registration_ns.load(Relaxed),
            registered_bytes: self.registered_bytes.load(Relaxed),
            deregistrations: self.deregistrations.load(Relaxed),
            deregistration_ns: self.deregistration_ns.load(Relaxed),
            rkey_unpacks: self.rkey_unpacks.load(Relaxed),
            rkey_unpack_ns: self.rkey_unpack_ns.load(Relaxed),
            key_parts_unmapped: self.key_parts_unmapped.load(Relaxed),
            rma_outside_window: self.rma_outside_window.load(Relaxed),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, v: u64) {
        counter.fetch_add(v, Relaxed);
    }
}

impl StatsSnapshot {
    /// Counter-wise difference `self - earlier` (saturating).
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        macro_rules! d {
            ($($f:ident),*) => { StatsSnapshot { $($f: self.$f.saturating_sub(earlier.$f)),* } };
        }
        d!(
            bytes_put,
            bytes_got,
            puts,
            gets,
            am_sent,
            am_bytes_sent,
            am_received,
            am_bytes_received,
            am_rndv_received,
            registrations,
            registration_ns,
            registered_bytes,
            deregistrations,
            deregistration_ns,
            rkey_unpacks,
            rkey_unpack_ns,
            key_parts_unmapped,
            rma_outside_window
        )
    }
}
