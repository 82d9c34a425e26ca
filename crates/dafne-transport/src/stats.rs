//! Transport counters, beside the UCX-level ones in [`dafne_ucx::Stats`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $f:ident),* $(,)?) => {
        /// Live transport counters of one runtime.
        #[derive(Debug, Default)]
        pub struct TransportStats { $($(#[doc = $doc])* pub(crate) $f: AtomicU64,)* }
        /// A copy of [`TransportStats`].
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub struct TransportStatsSnapshot { $($(#[doc = $doc])* pub $f: u64,)* }
        impl TransportStats {
            pub fn snapshot(&self) -> TransportStatsSnapshot {
                TransportStatsSnapshot { $($f: self.$f.load(Relaxed),)* }
            }
        }
        impl TransportStatsSnapshot {
            /// `(name, value)` pairs, for printing.
            pub fn fields(&self) -> Vec<(&'static str, u64)> { vec![$((stringify!($f), self.$f),)*] }
            /// `(name, meaning, value)` triples: the meaning is the
            /// field's doc comment on one line (for metrics' help).
            pub fn described(&self) -> Vec<(&'static str, String, u64)> {
                vec![$((
                    stringify!($f),
                    concat!($($doc, " "),*).split_whitespace().collect::<Vec<_>>().join(" "),
                    self.$f,
                ),)*]
            }
        }
    };
}

counters! {
    /// Requests sent by clients of this runtime.
    requests_sent,
    /// Replies received by clients.
    replies_received,
    /// Requests handled by a server on this runtime.
    requests_served,
    /// Requests a server on this runtime is handling now: the credits in
    /// use over all its clients (a gauge, not a count).
    requests_in_flight,
    /// Frames that failed validation (bad header, unknown connection, ...).
    malformed_frames,
    /// Requests refused because the client had no credit.
    credit_refusals,
    /// Calls that had to wait for a credit before being sent.
    credit_waits,
    /// Calls that timed out.
    call_timeouts,
    /// RMA batches that failed or timed out.
    rma_failures,
    /// Peers declared dead (control endpoint error or keepalive silence).
    peer_failures,
    /// Connections accepted by a server.
    connections_accepted,
    /// Rendezvous payloads received.
    rndv_payloads,
    /// Remote keys unpacked (cache misses).
    rkey_cache_misses,
    /// Remote keys found in the per-connection cache.
    rkey_cache_hits,
    /// Sockets on the listener port that UCX's connection manager never
    /// answered (garbage, an incomplete or stalled handshake, past the
    /// handshake bound) and the guard reset (`sockguard`).
    hostile_sockets_reset,
    /// Whether UCX's accepting on this server's listener is paused now
    /// because descriptors ran short (1) or not (0): a gauge
    /// (`sockguard`, `dafne_ucx::acceptgate`).
    listener_paused,
    /// Times the listener was paused because descriptors ran short.
    listener_pauses,
    /// Accepts on the listener refused at the descriptor limit (each
    /// pauses the listener; many mean the pause did not hold).
    accepts_refused,
    /// Accepts on UCX's data listener that met the limit and were served
    /// from the descriptor reserve (without it UCX closes that listener).
    accepts_from_reserve,
    /// Connections dropped because they did not authenticate in time
    /// (the service never marked them; see `ConnHandle::authenticated`).
    unauthenticated_drops,
    /// Frames refused before their payload was received (unknown
    /// connection, wrong token, a kind that carries no payload this big).
    refused_before_receive,
    /// Frames refused by their connection's frame keys: untagged on a
    /// connection with keys, tagged on one without, or a tag that does not
    /// verify (a token or frame copied off the wire, a changed frame).
    unauthenticated_frames,
    /// Genuine frames refused because their sequence number was seen
    /// already or is older than the replay window (a copied frame sent
    /// again).
    replayed_frames,
    /// Connections on this host moved to shared memory after their login
    /// was verified (before it, their data endpoints avoid shared memory:
    /// `server` module docs).
    upgrades,
    /// Clients on this host kept on TCP after their login because their
    /// hello stated other UCX shared-memory FIFO settings than this
    /// server's (`UCX_MM_FIFO_SIZE` and the like: see `server` module docs).
    upgrades_refused,
}

impl TransportStats {
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    /// Every counter has its doc comment as its meaning, on one line.
    #[test]
    fn every_counter_is_described() {
        let d = super::TransportStatsSnapshot::default().described();
        assert_eq!(d.len(), super::TransportStatsSnapshot::default().fields().len());
        let (name, meaning, _) = &d[0];
        assert_eq!((*name, meaning.as_str()), ("requests_sent", "Requests sent by clients of this runtime."));
        assert!(d.iter().all(|(_, m, _)| !m.is_empty() && !m.contains('\n') && !m.contains("  ")), "{d:?}");
    }
}
