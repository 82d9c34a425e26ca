//! Meta's chain table (docs/REPLICATION.md, "Chains"): chain id → version
//! and the ordered io servers (head first) that hold the stripes placed
//! on that chain, each `serving`, `syncing` or `offline`.
//!
//! Built from the configured io servers and the replication factor R
//! ([`build`]): one chain per io server, chain `c` headed by io server `c`
//! and followed by the next servers in id order (wrapping) that are not
//! already in it and, when the cluster knows the io servers' hosts, sit on
//! hosts not already in it. With R = 1 chain `c` is io server `c` alone,
//! so a layout that places stripe slot `s` on chain `(first + s) % chains`
//! places it on io server `(first + s) % servers`, as before chains
//! existed.
//!
//! What is built: the table, kept in the store (`crate::store`, table
//! `chains`) and shown by `Members` (`dafne status`), and the two changes
//! meta makes to a row as io servers' leases lapse and come back
//! (`crate::members`, "Acting on a lapsed lease"): [`mark_offline`] (the
//! server's replica becomes `offline` and moves to the end of every chain
//! that holds it) and [`mark_back`] (`offline` → `serving`), each bumping
//! the row's version by one, and both at once when an io server's process
//! was replaced ([`mark_restarted`]); the service writes the changed rows in one
//! store transaction ([`crate::store::MetaStore::update_chains`]) before
//! it uses them. A returning replica goes to `syncing` where another
//! replica of the row serves (it missed that one's writes; resync is not
//! built, so it stays `syncing`: it gets no writes, serves no reads), and
//! back to `serving` where none does (R = 1: it holds the only copy).
//! Nothing else changes a row while meta runs. Layouts name
//! chains (`crate::store::LayoutPolicy` makes the same ids as before):
//! clients send a chain's requests to its head with the row's version,
//! which the io servers check (`dafne_io::chaincheck`). The head forwards
//! each write to the next serving replica (chain writes, protocol 19:
//! `dafne_io::forward`; meta gives each io server its routes in the
//! answer to its heartbeat), so R > 1 is served.

use dafne_proto::{Chain, Replica, ReplicaState, MAX_CHAIN_REPLICAS};

/// Why a chain table cannot be built for a configuration; each says how
/// to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("replicas = 0: every chain needs at least one io server; use replicas = 1 (no replication) or more")]
    NoReplicas,
    #[error("replicas = {replicas}: at most {max} io servers make a chain; lower replicas")]
    TooManyReplicas { replicas: u32, max: usize },
    #[error(
        "replicas = {replicas} but the cluster has {servers} io servers: the replicas of a chain must be distinct \
         servers; lower replicas to at most {servers}, or run more io servers"
    )]
    TooFewServers { replicas: u32, servers: usize },
    #[error(
        "replicas = {replicas} but the io servers sit on {hosts} distinct hosts ({names}): the replicas of a chain \
         must be on distinct hosts; lower replicas to at most {hosts}, or add hosts with io servers ([[hosts]] in \
         the configuration, --io-hosts on meta's command line)"
    )]
    TooFewHosts { replicas: u32, hosts: usize, names: String },
    #[error("{hosts} host names given for {servers} io servers: give one host per io server, or none")]
    HostCount { hosts: usize, servers: usize },
}

/// The chain table of io servers `servers` (ids in order; chain `c` is
/// headed by `servers[c]`) with `replicas` servers per chain (module
/// docs). `hosts`: each server's host, in the same order, or empty when
/// the cluster does not know them (one host: only distinct servers are
/// required). No io server: no chain.
pub fn build(servers: &[u32], hosts: &[String], replicas: u32) -> Result<Vec<Chain>, ChainError> {
    if replicas == 0 {
        return Err(ChainError::NoReplicas);
    }
    if replicas as usize > MAX_CHAIN_REPLICAS {
        return Err(ChainError::TooManyReplicas { replicas, max: MAX_CHAIN_REPLICAS });
    }
    if !hosts.is_empty() && hosts.len() != servers.len() {
        return Err(ChainError::HostCount { hosts: hosts.len(), servers: servers.len() });
    }
    let n = servers.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let r = replicas as usize;
    if r > n {
        return Err(ChainError::TooFewServers { replicas, servers: n });
    }
    if !hosts.is_empty() {
        let mut distinct: Vec<&str> = hosts.iter().map(String::as_str).collect();
        distinct.sort_unstable();
        distinct.dedup();
        if r > distinct.len() {
            return Err(ChainError::TooFewHosts { replicas, hosts: distinct.len(), names: distinct.join(", ") });
        }
    }
    let mut chains = Vec::with_capacity(n);
    for c in 0..n {
        let mut members: Vec<usize> = vec![c];
        // With at least R distinct hosts, walking every server from c
        // always finds R servers on distinct hosts (each host not yet
        // used has a server somewhere in the walk).
        for step in 1..n {
            if members.len() == r {
                break;
            }
            let i = (c + step) % n;
            if hosts.is_empty() || members.iter().all(|&m| hosts[m] != hosts[i]) {
                members.push(i);
            }
        }
        debug_assert_eq!(members.len(), r);
        chains.push(Chain {
            id: c as u32,
            version: 1,
            replicas: members
                .into_iter()
                .map(|i| Replica { server: servers[i], state: ReplicaState::Serving })
                .collect(),
        });
    }
    Ok(chains)
}

/// The chain table to keep, given the one stored, the one the
/// configuration builds and `highest`, the highest version any row of
/// the table has ever had (rows that went included): a stored row with
/// the same servers as the built one, in any order (meta moves an offline
/// replica to the end), is kept as it is (its version, order and
/// states); a row that differs takes the built servers with its version
/// bumped past the stored one; a row not stored (new, or back after its
/// io server left the configuration) gets `highest + 1`, so that a
/// chain's version never goes back and never names two rows; rows
/// beyond the built ones go.
pub fn reconcile(stored: &[Chain], built: Vec<Chain>, highest: u64) -> Vec<Chain> {
    let highest = stored.iter().map(|s| s.version).fold(highest, u64::max);
    built
        .into_iter()
        .map(|b| match stored.iter().find(|s| s.id == b.id) {
            Some(s) if server_set(s) == server_set(&b) => s.clone(),
            Some(s) => Chain { version: s.version + 1, ..b },
            None => Chain { version: highest + 1, ..b },
        })
        .collect()
}

/// The rows of `chains` that change when io servers `down` (in id order,
/// as [`crate::members::Membership::offline`] gives them) lost their
/// lease: in each chain that holds one of them not already `offline`, it
/// becomes `offline` and moves to the end (the others keep their order,
/// so the first serving replica heads the chain; a `syncing` one going
/// down goes before the replicas down already, as its copy is stale:
/// the last of a row is the last to go down of those that served), and
/// the row's version goes up by one. Rows that do not change are not returned.
pub fn mark_offline(chains: &[Chain], down: &[u32]) -> Vec<Chain> {
    let goes = |r: &Replica| r.state != ReplicaState::Offline && down.binary_search(&r.server).is_ok();
    chains
        .iter()
        .filter(|c| c.replicas.iter().any(goes))
        .map(|c| {
            let (gone, stay): (Vec<Replica>, Vec<Replica>) = c.replicas.iter().partition(|r| goes(r));
            let off = |r: Replica| Replica { state: ReplicaState::Offline, ..r };
            // A `syncing` replica that goes down is stale: it goes before
            // the replicas that were down already, so that the last of an
            // all-`offline` row is one that was `serving` when the last
            // serving replica went down ([`mark_back`]).
            let (stale, fresh): (Vec<Replica>, Vec<Replica>) =
                gone.into_iter().partition(|r| r.state == ReplicaState::Syncing);
            let (up, down): (Vec<Replica>, Vec<Replica>) =
                stay.into_iter().partition(|r| r.state != ReplicaState::Offline);
            let mut replicas = up;
            replicas.extend(stale.into_iter().map(off));
            replicas.extend(down);
            replicas.extend(fresh.into_iter().map(off));
            Chain { id: c.id, version: c.version + 1, replicas }
        })
        .collect()
}

/// The rows of `chains` that change when io server `server`, `offline`,
/// heartbeats again: its replica stays where it is (the end) and the
/// row's version goes up by one. It becomes `syncing` where another
/// replica of the row is `serving` (that one holds the writes it missed:
/// chain writes reach serving replicas only, and resync is not built, so
/// it stays `syncing`: it gets no writes and serves no reads), and
/// `serving` where none is if it is the last of the row, the last one to
/// go down (R = 1; or every replica was down and it holds every write
/// acknowledged); a replica that went down before another (so missed
/// what that one served alone) comes back `syncing` there, and the chain
/// serves nothing until the last one is back.
pub fn mark_back(chains: &[Chain], server: u32) -> Vec<Chain> {
    let back = |r: &Replica| r.server == server && r.state == ReplicaState::Offline;
    chains
        .iter()
        .filter(|c| c.replicas.iter().any(back))
        .map(|c| {
            let others_serve = c.replicas.iter().any(|r| r.server != server && r.state == ReplicaState::Serving);
            // Where none serves, only the last replica of the row went
            // down holding every acknowledged write ([`mark_offline`]
            // keeps the last one down at the end); one that went down
            // before it missed what it served alone, so it comes back
            // `syncing` (no reads of a stale copy) and the chain waits for
            // the last one.
            let last = c.replicas.last().is_some_and(|r| r.server == server);
            let state = if others_serve || !last { ReplicaState::Syncing } else { ReplicaState::Serving };
            Chain {
                id: c.id,
                version: c.version + 1,
                replicas: c.replicas.iter().map(|r| if back(r) { Replica { state, ..*r } } else { *r }).collect(),
            }
        })
        .collect()
}

/// The rows of `chains` that change when io server `server` heartbeats
/// from a new process (`crate::members`, "A restart is a return"): the
/// old process's lapse and the new one's return in one, [`mark_offline`]
/// then [`mark_back`] (its replica ends `serving` at the end of each of
/// its chains, version + 2; + 1 where it was `offline` already). The
/// service writes them in one transaction, so nobody sees the `offline`
/// between. Where another replica serves, the return is `syncing`
/// ([`mark_back`]).
pub fn mark_restarted(chains: &[Chain], server: u32) -> Vec<Chain> {
    let off = mark_offline(chains, &[server]);
    let mut after = chains.to_vec();
    replace(&mut after, &off);
    // Every row `off` changed, `mark_back` changes again (the server is
    // offline in it now); rows it did not, only where already offline.
    mark_back(&after, server)
}

/// `chains` with the rows of `changed` in place of theirs.
pub fn replace(chains: &mut [Chain], changed: &[Chain]) {
    for c in chains.iter_mut() {
        if let Some(n) = changed.iter().find(|n| n.id == c.id) {
            *c = n.clone();
        }
    }
}

fn servers(c: &Chain) -> Vec<u32> {
    c.replicas.iter().map(|r| r.server).collect()
}

/// The servers of a row as a set (sorted): meta reorders a row when it
/// marks a replica offline ([`mark_offline`]), which is no change of the
/// configuration ([`reconcile`]).
fn server_set(c: &Chain) -> Vec<u32> {
    let mut s = servers(c);
    s.sort_unstable();
    s
}

/// A stored chain row (the table's key is the id): format byte 1,
/// version u64, replica count u8, then per replica server u32 and state
/// u8, little-endian.
const CHAIN_FORMAT: u8 = 1;

/// The stored bytes of a chain row.
pub fn encode(c: &Chain) -> Vec<u8> {
    let mut v = vec![CHAIN_FORMAT];
    v.extend_from_slice(&c.version.to_le_bytes());
    v.push(c.replicas.len() as u8);
    for r in &c.replicas {
        v.extend_from_slice(&r.server.to_le_bytes());
        v.push(r.state as u8);
    }
    v
}

/// Chain `id`'s stored row back; `None` if damaged or of an unknown
/// format.
pub fn decode(id: u32, b: &[u8]) -> Option<Chain> {
    let (&format, rest) = b.split_first()?;
    if format != CHAIN_FORMAT || rest.len() < 9 {
        return None;
    }
    let version = u64::from_le_bytes(rest[..8].try_into().ok()?);
    let n = rest[8] as usize;
    let body = &rest[9..];
    if n == 0 || n > MAX_CHAIN_REPLICAS || body.len() != 5 * n {
        return None;
    }
    let mut replicas: Vec<Replica> = Vec::with_capacity(n);
    for r in body.chunks_exact(5) {
        let server = u32::from_le_bytes(r[..4].try_into().ok()?);
        let state = ReplicaState::from_u8(r[4])?;
        if replicas.iter().any(|x| x.server == server) {
            return None;
        }
        replicas.push(Replica { server, state });
    }
    Some(Chain { id, version, replicas })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(chains: &[Chain]) -> Vec<Vec<u32>> {
        chains.iter().map(servers).collect()
    }

    #[test]
    fn one_replica_is_one_chain_per_io_server() {
        let c = build(&[0, 1, 2], &[], 1).unwrap();
        assert_eq!(ids(&c), vec![vec![0], vec![1], vec![2]]);
        assert!(c.iter().enumerate().all(|(i, c)| c.id == i as u32 && c.version == 1));
        assert!(c.iter().flat_map(|c| &c.replicas).all(|r| r.state == ReplicaState::Serving));
        // Known hosts change nothing with one replica, even all on one host.
        let one_host = vec!["a".to_string(); 3];
        assert_eq!(build(&[0, 1, 2], &one_host, 1).unwrap(), c);
        assert_eq!(build(&[], &[], 1).unwrap(), vec![]);
    }

    #[test]
    fn two_replicas_sit_on_distinct_hosts() {
        // Two hosts of two io servers each: a, a, b, b.
        let hosts: Vec<String> = ["a", "a", "b", "b"].iter().map(|s| s.to_string()).collect();
        let c = build(&[0, 1, 2, 3], &hosts, 2).unwrap();
        assert_eq!(ids(&c), vec![vec![0, 2], vec![1, 2], vec![2, 0], vec![3, 0]]);
        for chain in &c {
            assert_ne!(hosts[chain.replicas[0].server as usize], hosts[chain.replicas[1].server as usize]);
        }
        // Each server heads its own chain: a layout's slot on chain c has
        // its head on io server c.
        assert!(c.iter().all(|chain| chain.replicas[0].server == chain.id));
        // Hosts unknown: distinct servers, the next ones in order.
        assert_eq!(ids(&build(&[0, 1, 2], &[], 2).unwrap()), vec![vec![0, 1], vec![1, 2], vec![2, 0]]);
        let three: Vec<String> = ["x", "y", "z"].iter().map(|s| s.to_string()).collect();
        assert_eq!(ids(&build(&[0, 1, 2], &three, 3).unwrap()), vec![vec![0, 1, 2], vec![1, 2, 0], vec![2, 0, 1]]);
    }

    #[test]
    fn impossible_tables_are_refused_with_the_fix() {
        assert_eq!(build(&[0, 1], &[], 0), Err(ChainError::NoReplicas));
        let e = build(&[0, 1], &[], 3).unwrap_err();
        assert_eq!(e, ChainError::TooFewServers { replicas: 3, servers: 2 });
        assert!(e.to_string().contains("lower replicas to at most 2"), "{e}");
        let hosts: Vec<String> = ["a", "a", "b"].iter().map(|s| s.to_string()).collect();
        let e = build(&[0, 1, 2], &hosts, 3).unwrap_err();
        assert_eq!(e, ChainError::TooFewHosts { replicas: 3, hosts: 2, names: "a, b".into() });
        assert!(e.to_string().contains("add hosts"), "{e}");
        assert!(matches!(build(&[0, 1], &["a".to_string()], 1), Err(ChainError::HostCount { .. })));
        let many: Vec<u32> = (0..20).collect();
        assert!(matches!(build(&many, &[], 9), Err(ChainError::TooManyReplicas { .. })));
    }

    #[test]
    fn a_changed_row_gets_a_new_version_and_an_equal_one_keeps_its_own() {
        let mut stored = build(&[0, 1, 2], &[], 1).unwrap();
        stored[1].version = 7;
        stored[1].replicas[0].state = ReplicaState::Syncing;
        stored[2].version = 4;
        // Two io servers now, with two replicas each.
        let kept = reconcile(&stored, build(&[0, 1, 2], &[], 1).unwrap(), 0);
        assert_eq!(kept, stored);
        let changed = reconcile(&stored, build(&[0, 1], &[], 2).unwrap(), 0);
        assert_eq!(ids(&changed), vec![vec![0, 1], vec![1, 0]]);
        assert_eq!(changed.iter().map(|c| c.version).collect::<Vec<_>>(), vec![2, 8]);
        // A fresh table starts at version 1; a row new to the table (its
        // io server back) starts above every version the table has had,
        // stored rows' and gone rows' (`highest`).
        assert!(reconcile(&[], build(&[0, 1], &[], 1).unwrap(), 0).iter().all(|c| c.version == 1));
        let back = reconcile(&changed, build(&[0, 1, 2], &[], 1).unwrap(), 0);
        assert_eq!(back.iter().map(|c| c.version).collect::<Vec<_>>(), vec![3, 9, 9]);
        let back = reconcile(&changed, build(&[0, 1, 2], &[], 1).unwrap(), 20);
        assert_eq!(back[2].version, 21);
    }

    fn states(c: &Chain) -> Vec<(u32, ReplicaState)> {
        c.replicas.iter().map(|r| (r.server, r.state)).collect()
    }

    #[test]
    fn a_lapsed_server_goes_offline_at_the_end_of_each_of_its_chains() {
        use ReplicaState::{Offline, Serving};
        let mut chains = build(&[0, 1, 2], &[], 2).unwrap();
        chains[2].version = 7;
        // Server 1 is in chains 0 (second) and 1 (head).
        let changed = mark_offline(&chains, &[1]);
        assert_eq!(changed.iter().map(|c| (c.id, c.version)).collect::<Vec<_>>(), vec![(0, 2), (1, 2)]);
        assert_eq!(states(&changed[0]), vec![(0, Serving), (1, Offline)]);
        assert_eq!(states(&changed[1]), vec![(2, Serving), (1, Offline)], "the next serving replica heads it");
        replace(&mut chains, &changed);
        assert_eq!(chains[2].version, 7, "a chain without it is untouched");
        // Already offline: nothing changes, no version is bumped.
        assert_eq!(mark_offline(&chains, &[1]), vec![]);
        // With R = 1 the chain has no serving replica left.
        let one = build(&[0, 1], &[], 1).unwrap();
        let changed = mark_offline(&one, &[0, 1]);
        assert_eq!(changed.len(), 2);
        assert!(changed.iter().all(|c| c.version == 2 && c.health() == dafne_proto::ChainHealth::Unavailable));
        assert_eq!(mark_offline(&one, &[]), vec![]);
    }

    #[test]
    fn a_server_back_syncs_where_another_serves_and_serves_where_none_does() {
        use ReplicaState::{Offline, Serving, Syncing};
        let mut chains = build(&[0, 1, 2], &[], 2).unwrap();
        assert_eq!(mark_back(&chains, 1), vec![], "serving already: no change");
        let off = mark_offline(&chains, &[1]);
        replace(&mut chains, &off);
        let back = mark_back(&chains, 1);
        assert_eq!(back.iter().map(|c| (c.id, c.version)).collect::<Vec<_>>(), vec![(0, 3), (1, 3)]);
        assert_eq!(states(&back[1]), vec![(2, Serving), (1, Syncing)], "it stays at the end, syncing");
        replace(&mut chains, &back);
        assert!(chains[..2].iter().all(|c| c.health() == dafne_proto::ChainHealth::Degraded));
        assert_eq!(mark_back(&chains, 1), vec![], "syncing is not offline: no change");
        // Every replica was down: the first back serves (none is better).
        let mut two = build(&[0, 1], &[], 2).unwrap();
        let off = mark_offline(&two, &[0, 1]);
        replace(&mut two, &off);
        let back = mark_back(&two, 1);
        assert_eq!(states(&back[0]), vec![(0, Offline), (1, Serving)]);
        let one = build(&[0], &[], 1).unwrap();
        let off = mark_offline(&one, &[0]);
        assert_eq!(states(&off[0]), vec![(0, Offline)]);
        assert_eq!(states(&mark_back(&off, 0)[0]), vec![(0, Serving)]);
    }

    #[test]
    fn a_restarted_server_goes_offline_and_back_in_one_change() {
        use ReplicaState::{Offline, Serving};
        let mut chains = build(&[0, 1, 2], &[], 2).unwrap();
        // Serving in chains 0 (second) and 1 (head): both + 2, it at the end.
        let restarted = mark_restarted(&chains, 1);
        assert_eq!(restarted.iter().map(|c| (c.id, c.version)).collect::<Vec<_>>(), vec![(0, 3), (1, 3)]);
        assert_eq!(states(&restarted[1]), vec![(2, Serving), (1, ReplicaState::Syncing)]);
        // Offline already in a chain (marked before it came back): + 1 there.
        let off = mark_offline(&chains, &[1]);
        replace(&mut chains, &off[..1]);
        let restarted = mark_restarted(&chains, 1);
        assert_eq!(restarted.iter().map(|c| (c.id, c.version)).collect::<Vec<_>>(), vec![(0, 3), (1, 3)]);
        assert!(restarted.iter().all(|c| !c.replicas.iter().any(|r| r.state == Offline)));
        let one = build(&[0, 1], &[], 1).unwrap();
        let restarted = mark_restarted(&one, 0);
        assert_eq!((restarted.len(), restarted[0].version), (1, 3));
        assert_eq!(states(&restarted[0]), vec![(0, Serving)]);
    }

    /// Two replicas that go down one after the other: the first missed
    /// what the second alone served (acknowledged writes), so when every
    /// replica is down the first one back must not serve (its copy is
    /// stale: reads would miss acknowledged writes, and the fresh one,
    /// back later, would be `syncing` behind it for good); the last one
    /// down serves when it comes back. A `syncing` replica that goes down
    /// is stale too, whatever the order. Failed before: the first back
    /// served (`mark_back` made it `serving` as no other replica served).
    #[test]
    fn when_every_replica_is_down_only_the_last_one_down_serves_again() {
        use ReplicaState::{Offline, Serving, Syncing};
        let apply = |chains: &mut Vec<Chain>, changed: Vec<Chain>| replace(chains, &changed);
        // 1 goes down, 0 serves alone (writes only 0 holds), then 0 too.
        let mut chains = build(&[0, 1], &[], 2).unwrap();
        let c = mark_offline(&chains, &[1]);
        apply(&mut chains, c);
        let c = mark_offline(&chains, &[0]);
        apply(&mut chains, c);
        assert_eq!(states(&chains[0]), vec![(1, Offline), (0, Offline)]);
        let back = mark_back(&chains, 1);
        assert_eq!(states(&back[0]), vec![(1, Syncing), (0, Offline)], "the stale replica back first does not serve");
        apply(&mut chains, back);
        let back = mark_back(&chains, 0);
        assert_eq!(states(&back[0]), vec![(1, Syncing), (0, Serving)], "the last one down serves");
        // 1 back as `syncing` behind 0, then 0 down, then 1 down: 1 is
        // still the stale one, though it went down last.
        let mut chains = build(&[0, 1], &[], 2).unwrap();
        for (server, down) in [(1, true), (1, false), (0, true), (1, true)] {
            let c = if down { mark_offline(&chains, &[server]) } else { mark_back(&chains, server) };
            apply(&mut chains, c);
        }
        assert!(chains[0].replicas.iter().all(|r| r.state == Offline));
        let back = mark_back(&chains, 1);
        assert!(back[0].replicas.iter().all(|r| r.state != Serving), "stale 1 back first: {:?}", states(&back[0]));
        let back = mark_back(&chains, 0);
        assert!(back[0].replicas.iter().any(|r| r.server == 0 && r.state == Serving), "{:?}", states(&back[0]));
        // Down together: the last of the row serves when back first.
        let mut two = build(&[0, 1], &[], 2).unwrap();
        let off = mark_offline(&two, &[0, 1]);
        apply(&mut two, off);
        let last = two[0].replicas[1].server;
        let back = mark_back(&two, last);
        assert!(back[0].replicas.iter().any(|r| r.server == last && r.state == Serving));
    }

    #[test]
    fn stored_rows_round_trip_and_damage_reads_as_none() {
        let c = build(&[4, 5], &[], 2).unwrap();
        for chain in &c {
            assert_eq!(decode(chain.id, &encode(chain)).as_ref(), Some(chain));
        }
        let b = encode(&c[0]);
        for n in 0..b.len() {
            assert_eq!(decode(0, &b[..n]), None, "prefix of {n} bytes");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(decode(0, &longer), None, "trailing bytes");
        let mut other = b.clone();
        other[0] = 2;
        assert_eq!(decode(0, &other), None, "unknown format");
        let mut twice = b.clone();
        twice.copy_within(10..14, 15);
        assert_eq!(decode(0, &twice), None, "a server twice");
        let mut bad_state = b;
        bad_state[14] = 9;
        assert_eq!(decode(0, &bad_state), None, "unknown state");
    }
}
