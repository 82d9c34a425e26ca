//! The chain check of a data request (docs/REPLICATION.md, step 3;
//! `dafne_proto::io` module docs, "Chains").
//!
//! A client sends each data request (`Read`, `Write`, `Truncate`, `Sync`,
//! `Stat`, `Allocate`) with the chain it is for and the version of that
//! chain's row in the chain table it fetched from meta. The io server
//! compares it with the version meta's last answer to its heartbeat
//! carried for that chain ([`crate::lease::Lease::chain_version`]),
//! after the lease check and before anything else of the request
//! (`crate::service`, `IoService::serve`; a request whose keys follow is
//! checked again once they came, as the lease is), so a refused request
//! had no effect:
//!
//! | server's version | request's version | answer |
//! |---|---|---|
//! | none (no replica of the chain here) | any | `NotReplica` |
//! | `v` | `v` | served |
//! | `v` | below `v` | `Stale`, with `v`: the client fetches the table again |
//! | `v` | above `v` | `Ahead`, with `v`: the client sends again after a pause |
//!
//! `Ahead` means meta changed the row and this server has not heard it
//! yet: its next heartbeat (every second) brings it. The server does not
//! ask meta itself: the heartbeat is its one channel to meta, and the
//! client's pause (`dafne_client`'s `RETRY_EVERY`, 250 ms) is shorter than
//! a round trip through a second connection would save. A server that
//! holds no lease (started without meta) checks nothing: it has no chain
//! versions; nor does any server check a request that carries no chain
//! (a client without a meta session).
//!
//! Each refusal is counted by reason (`dafne_io_chain_refusals_total` on
//! the metrics page).

use dafne_proto::io::{ChainRefusal, ChainRefusalReason};
use dafne_proto::ChainVersion;

/// The decision for a request that asked for `asked`, on a server whose
/// version of that chain is `held` (`None`: it holds no replica of it).
pub fn decide(held: Option<u64>, asked: ChainVersion) -> Result<(), ChainRefusal> {
    let refuse = |reason, version| Err(ChainRefusal { reason, chain: asked.chain, version });
    match held {
        None => refuse(ChainRefusalReason::NotReplica, 0),
        Some(v) if asked.version < v => refuse(ChainRefusalReason::Stale, v),
        Some(v) if asked.version > v => refuse(ChainRefusalReason::Ahead, v),
        Some(_) => Ok(()),
    }
}

/// Refusals by reason ([`ChainRefusalReason`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChainRefusals {
    pub stale: u64,
    pub ahead: u64,
    pub not_replica: u64,
    pub not_head: u64,
}

impl ChainRefusals {
    /// Counts one refusal.
    pub fn count(&mut self, reason: ChainRefusalReason) {
        match reason {
            ChainRefusalReason::Stale => self.stale += 1,
            ChainRefusalReason::Ahead => self.ahead += 1,
            ChainRefusalReason::NotReplica => self.not_replica += 1,
            ChainRefusalReason::NotHead => self.not_head += 1,
        }
    }

    /// `(reason name, count)` for the metrics page.
    pub fn by_reason(&self) -> [(&'static str, u64); 4] {
        [
            (ChainRefusalReason::Stale.name(), self.stale),
            (ChainRefusalReason::Ahead.name(), self.ahead),
            (ChainRefusalReason::NotReplica.name(), self.not_replica),
            (ChainRefusalReason::NotHead.name(), self.not_head),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(version: u64) -> ChainVersion {
        ChainVersion { chain: 4, version }
    }

    #[test]
    fn the_decision_table() {
        assert_eq!(decide(Some(5), asked(5)), Ok(()));
        assert_eq!(
            decide(Some(5), asked(4)),
            Err(ChainRefusal { reason: ChainRefusalReason::Stale, chain: 4, version: 5 }),
            "older: stale, with the server's version"
        );
        assert_eq!(
            decide(Some(5), asked(0)),
            Err(ChainRefusal { reason: ChainRefusalReason::Stale, chain: 4, version: 5 })
        );
        assert_eq!(
            decide(Some(5), asked(6)),
            Err(ChainRefusal { reason: ChainRefusalReason::Ahead, chain: 4, version: 5 }),
            "newer: the server has not heard it yet"
        );
        assert_eq!(
            decide(Some(5), asked(u64::MAX)),
            Err(ChainRefusal { reason: ChainRefusalReason::Ahead, chain: 4, version: 5 })
        );
        assert_eq!(
            decide(None, asked(5)),
            Err(ChainRefusal { reason: ChainRefusalReason::NotReplica, chain: 4, version: 0 }),
            "no replica of the chain here, whatever the version"
        );
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let mut c = ChainRefusals::default();
        c.count(ChainRefusalReason::Stale);
        c.count(ChainRefusalReason::Stale);
        c.count(ChainRefusalReason::NotReplica);
        assert_eq!(c.by_reason(), [("stale", 2), ("ahead", 0), ("not_replica", 1), ("not_head", 0)]);
    }
}
