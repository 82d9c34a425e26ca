//! Which io servers are alive, as the metadata server sees them.
//!
//! Why here: the io servers of a cluster of several hosts are started by
//! each host's supervisor, and nothing on one host sees another host's
//! processes. The metadata server is the one place every io server
//! reaches, so each io server started with `--meta ADDR` sends it a
//! heartbeat ([`dafne_proto::Heartbeat`]) every
//! [`dafne_proto::HEARTBEAT_INTERVAL`] (1 s) over a session of the cluster
//! secret, and `Members` (any session; what `dafne status` shows) reads
//! the table kept from them.
//!
//! A server is `up` while its last heartbeat is at most
//! [`dafne_proto::MEMBER_LEASE`] (3 s, three intervals) old, `down` after,
//! `unknown` if never heard since this metadata server started (the table
//! lives in memory: a restarted meta hears every live server again once
//! its heartbeat session has reconnected, which it does by itself). A heartbeat with a new instance id (chosen at random
//! when the io server process starts) from a known server is a restart,
//! counted. Times are monotonic ([`Instant`]).
//!
//! Refused heartbeats: a server id outside the cluster's io servers
//! (`EINVAL`: no layout may name it, and the table stays bounded by
//! `--io-servers` ≤ [`dafne_proto::MAX_MEMBERS`]), and an address that
//! another id holds while that one is `up` (`EADDRINUSE`: two servers
//! configured alike). A `down` server's address may be taken over by another id.
//! An id that is `up` from another process (instance) at another address
//! (`EEXIST`: two servers configured with one `--server-id`; before, they
//! took turns, each counted a restart of the other). A server moved to
//! another address is accepted once its old instance is `down` (3 s). Each
//! refused (id, address) pair is logged at warn once until it is accepted.
//!
//! # Acting on a lapsed lease
//!
//! Once an io server's last heartbeat is older than [`MEMBER_LEASE`] +
//! [`OFFLINE_MARGIN`] ([`Membership::offline`]), meta marks its replica
//! `offline` in every chain that holds it (`crate::chains::mark_offline`,
//! written to the store; the service checks every second, on the tick
//! that logs lapses). By then the server has stopped serving data: its
//! own lease counts from when it *sent* the heartbeat, which is before
//! meta received it (`dafne_io::lease`). When it heartbeats again it is
//! marked `serving` again (`crate::chains::mark_back`) before meta
//! answers, and the answer carries the versions of its chains
//! ([`dafne_proto::Response::Heartbeat`]). A server never heard since
//! this meta started counts as lapsed only once [`MEMBER_LEASE`] +
//! [`OFFLINE_MARGIN`] passed since the start: a meta that restarts hears
//! every live server again before then, so its restart changes no chain.
//! (At a cluster's first start, an io server that heartbeats later than
//! that is marked `offline` and back: nothing tells a first start from a
//! restart here.)
//! A meta that did not run for a while (stopped, or its loop blocked: the
//! service's check sees its one-second tick come late by more than
//! [`OFFLINE_MARGIN`]) heard no heartbeat meanwhile, so it counts
//! [`MEMBER_LEASE`] + [`OFFLINE_MARGIN`] again from when it runs again
//! ([`Membership::deaf_until`]) before it marks anyone `offline`: the
//! io servers' leases lapsed because of meta, and none served data
//! meanwhile, so none missed anything.
//! Data requests carry their chain's version and io servers check it
//! (`dafne_io::chaincheck`; docs/REPLICATION.md).
//!
//! # A restart is a return
//!
//! A heartbeat from another instance than the one heard last
//! ([`Arrival::Restarted`]) comes from a new process, which lost what the
//! old one held in memory (its cache's unwritten units), however soon it
//! came: an io server killed and started again within L + margin was
//! never marked `offline`, so its chains kept their versions as if
//! nothing had happened. Meta treats it as a lapse and a return in one:
//! `crate::chains::mark_restarted` marks the replica `offline` and then
//! `serving` again (each a version bump, so + 2, as a restart that took
//! longer than L + margin gives), written in one store transaction
//! before meta answers the heartbeat. Where another replica of a chain
//! serves (R > 1) it comes back `syncing`, and stays so (resync is not
//! built); where none does (R = 1) it comes back `serving`
//! (`crate::chains::mark_back`). Meta's table is in memory: a
//! meta that restarted too does not know the old instance, so a restart
//! of both within L + margin of each other is not seen.
//!
//! # A return meta cannot write
//!
//! A heartbeat that changes chains (a return, or a restart) is recorded
//! ([`Membership::record`]) and answered only once the change is written
//! to the store; if the write fails meta answers `EIO`, so the io server
//! holds no lease (it keeps refusing data, as meta's table still has it
//! `offline`), and the table stays as it was, so the next heartbeat is
//! seen as the same return (or restart) and tried again.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dafne_proto::{Errno, Heartbeat, Member, MemberState, MAX_MEMBERS, MEMBER_LEASE};

/// What meta knows of one io server.
#[derive(Debug, Clone)]
struct Entry {
    last: Instant,
    addr: SocketAddr,
    host: String,
    instance: u64,
    restarts: u32,
    capacity_bytes: u64,
    used_bytes: u64,
    /// Whether its lapse was logged ([`Membership::log_lapsed`]).
    lapse_logged: bool,
}

/// How long past [`MEMBER_LEASE`] meta waits before it marks a server
/// whose heartbeats stopped `offline` in its chains (module docs, "Acting
/// on a lapsed lease"): the io server stopped serving at the latest L
/// after it sent its last answered heartbeat, which is at or before meta
/// received it; the margin covers the ticks of meta's check (1 s) and
/// clocks that do not tick alike on two hosts' monotonic clocks. It does
/// not cover a data request admitted just before the lapse that is still
/// running (`dafne_io::lease`): nothing acts on versions on data
/// requests yet, so nothing relies on it.
pub const OFFLINE_MARGIN: Duration = Duration::from_secs(1);

/// What an accepted heartbeat is ([`Membership::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The first heard from this id since meta started.
    Joined,
    /// From the instance heard last.
    Again,
    /// From another instance than the one heard last: the io server
    /// process was replaced (module docs, "A restart is a return").
    Restarted,
}

/// The membership table (module docs).
#[derive(Debug)]
pub struct Membership {
    /// The cluster's io servers: ids `0..servers`.
    servers: u32,
    /// Since when meta has listened for heartbeats without a gap: its
    /// start, or when it ran again after it did not
    /// ([`Membership::deaf_until`]). No server counts as lapsed before
    /// [`MEMBER_LEASE`] + [`OFFLINE_MARGIN`] past it.
    listening: Instant,
    entries: BTreeMap<u32, Entry>,
    /// (id, address) pairs whose refusal was logged (module docs); at
    /// most [`WARNED`] entries.
    warned: HashSet<(u32, SocketAddr)>,
}

/// The most refusals remembered as logged (beyond, refusals are not
/// logged: the log stays bounded whatever peers send).
const WARNED: usize = 4 * MAX_MEMBERS;

/// How many io servers are in each state ([`Membership::counts`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StateCounts {
    pub up: u64,
    pub down: u64,
    pub unknown: u64,
}

impl Membership {
    /// A table for io servers `0..servers` (at most [`MAX_MEMBERS`]).
    pub fn new(servers: u32) -> Membership {
        Membership::started_at(servers, Instant::now())
    }

    /// [`Membership::new`] as of `started`.
    pub fn started_at(servers: u32, started: Instant) -> Membership {
        Membership {
            servers: servers.min(MAX_MEMBERS as u32),
            listening: started,
            entries: BTreeMap::new(),
            warned: HashSet::new(),
        }
    }

    /// The io servers to mark `offline` at `now` (module docs, "Acting on a
    /// lapsed lease"): those whose last heartbeat is older than
    /// [`MEMBER_LEASE`] + [`OFFLINE_MARGIN`], and those never heard, once
    /// meta has listened that long (since the table was made, or since
    /// [`Membership::deaf_until`]). At most [`MAX_MEMBERS`], in id order.
    pub fn offline(&self, now: Instant) -> Vec<u32> {
        let limit = MEMBER_LEASE + OFFLINE_MARGIN;
        let long_ago = |t: Instant| now.saturating_duration_since(t.max(self.listening)) > limit;
        (0..self.servers)
            .filter(|id| match self.entries.get(id) {
                Some(e) => long_ago(e.last),
                None => long_ago(self.listening),
            })
            .collect()
    }

    /// Meta did not run until `now` (stopped, or its loop blocked): it
    /// heard no heartbeat meanwhile, so it listens
    /// [`MEMBER_LEASE`] + [`OFFLINE_MARGIN`] from `now` before it counts
    /// any server as lapsed (module docs, "Acting on a lapsed lease").
    pub fn deaf_until(&mut self, now: Instant) {
        self.listening = self.listening.max(now);
    }

    fn is_up(e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last) <= MEMBER_LEASE
    }

    /// Records a heartbeat received at `now` (module docs, "Refused
    /// heartbeats"): [`Membership::check`], then [`Membership::record`].
    pub fn heartbeat(&mut self, hb: &Heartbeat, now: Instant) -> Result<Arrival, Errno> {
        let arrival = self.check(hb, now)?;
        self.record(hb, now);
        Ok(arrival)
    }

    /// What a heartbeat received at `now` would be, or why it is refused
    /// (module docs, "Refused heartbeats"; a refusal is logged once per
    /// (id, address)); records nothing else. The service records it
    /// ([`Membership::record`]) only once what it must change in the chains
    /// is written (module docs, "A return meta cannot write").
    pub fn check(&mut self, hb: &Heartbeat, now: Instant) -> Result<Arrival, Errno> {
        if hb.server >= self.servers {
            if self.first_refusal(hb) {
                tracing::warn!(
                    "heartbeat from io server {} at {} refused: this cluster has io servers 0..{}",
                    hb.server,
                    hb.addr,
                    self.servers
                );
            }
            return Err(Errno::EINVAL);
        }
        let holder = self
            .entries
            .iter()
            .find(|(&id, e)| id != hb.server && e.addr == hb.addr && Self::is_up(e, now))
            .map(|(&id, _)| id);
        if let Some(other) = holder {
            if self.first_refusal(hb) {
                tracing::warn!(
                    "heartbeat from io server {} refused: its address {} is io server {}'s, which is up \
                     (two servers configured with one address?)",
                    hb.server,
                    hb.addr,
                    other
                );
            }
            return Err(Errno::EADDRINUSE);
        }
        let held = self
            .entries
            .get(&hb.server)
            .filter(|e| e.instance != hb.instance && e.addr != hb.addr && Self::is_up(e, now))
            .map(|e| (e.addr, e.host.clone()));
        if let Some((addr, host)) = held {
            if self.first_refusal(hb) {
                tracing::warn!(
                    "heartbeat from io server {} at {} (host {:?}) refused: io server {} is up at {} \
                     (host {:?}) as another process (two servers configured with one --server-id?)",
                    hb.server,
                    hb.addr,
                    hb.host,
                    hb.server,
                    addr,
                    host
                );
            }
            return Err(Errno::EEXIST);
        }
        Ok(match self.entries.get(&hb.server) {
            None => Arrival::Joined,
            Some(e) if e.instance != hb.instance => Arrival::Restarted,
            Some(_) => Arrival::Again,
        })
    }

    /// Records heartbeat `hb`, received at `now`, that [`Membership::check`]
    /// accepted: the server's last heartbeat, address, host, instance and
    /// use; a new instance counts a restart.
    pub fn record(&mut self, hb: &Heartbeat, now: Instant) {
        self.warned.remove(&(hb.server, hb.addr));
        let fresh = Entry {
            last: now,
            addr: hb.addr,
            host: hb.host.clone(),
            instance: hb.instance,
            restarts: 0,
            capacity_bytes: hb.capacity_bytes,
            used_bytes: hb.used_bytes,
            lapse_logged: false,
        };
        match self.entries.get_mut(&hb.server) {
            None => {
                tracing::info!("io server {} joined: {} on host {:?}", hb.server, hb.addr, hb.host);
                self.entries.insert(hb.server, fresh);
            }
            Some(e) => {
                let was_up = Self::is_up(e, now);
                let restarts = if e.instance != hb.instance {
                    tracing::info!("io server {} restarted: {} on host {:?}", hb.server, hb.addr, hb.host);
                    e.restarts.saturating_add(1)
                } else {
                    if !was_up {
                        tracing::info!("io server {} is up again: {} on host {:?}", hb.server, hb.addr, hb.host);
                    }
                    e.restarts
                };
                *e = Entry { restarts, ..fresh };
            }
        }
    }

    /// Whether `hb`'s (id, address) refusal is to be logged: the first
    /// time, while the set is not full.
    fn first_refusal(&mut self, hb: &Heartbeat) -> bool {
        self.warned.len() < WARNED && self.warned.insert((hb.server, hb.addr))
    }

    /// Logs each io server that went `down` since the last call (once per
    /// lapse; a heartbeat re-arms it) and returns their ids. The service
    /// calls it every second, so that meta's log says when a server was
    /// lost even if nobody asks.
    pub fn log_lapsed(&mut self, now: Instant) -> Vec<u32> {
        let mut lapsed = Vec::new();
        for (&id, e) in self.entries.iter_mut() {
            if !e.lapse_logged && !Self::is_up(e, now) {
                e.lapse_logged = true;
                lapsed.push(id);
                tracing::warn!(
                    "io server {id} ({} on host {:?}) is down: no heartbeat for {:.1} s",
                    e.addr,
                    e.host,
                    now.saturating_duration_since(e.last).as_secs_f64()
                );
            }
        }
        lapsed
    }

    /// Every io server of the cluster, in id order, as of `now`.
    pub fn members(&self, now: Instant) -> Vec<Member> {
        (0..self.servers)
            .map(|server| match self.entries.get(&server) {
                Some(e) => Member {
                    server,
                    state: if Self::is_up(e, now) { MemberState::Up } else { MemberState::Down },
                    addr: e.addr,
                    host: e.host.clone(),
                    since_ms: u64::try_from(now.saturating_duration_since(e.last).as_millis()).unwrap_or(u64::MAX),
                    restarts: e.restarts,
                    capacity_bytes: e.capacity_bytes,
                    used_bytes: e.used_bytes,
                },
                None => Member {
                    server,
                    state: MemberState::Unknown,
                    addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                    host: String::new(),
                    since_ms: 0,
                    restarts: 0,
                    capacity_bytes: 0,
                    used_bytes: 0,
                },
            })
            .collect()
    }

    /// How many io servers are up, down and unknown at `now`.
    pub fn counts(&self, now: Instant) -> StateCounts {
        let mut c = StateCounts::default();
        for m in self.members(now) {
            match m.state {
                MemberState::Up => c.up += 1,
                MemberState::Down => c.down += 1,
                MemberState::Unknown => c.unknown += 1,
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hb(server: u32, instance: u64, port: u16) -> Heartbeat {
        Heartbeat {
            server,
            instance,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            host: "h".into(),
            capacity_bytes: 100,
            used_bytes: 10,
        }
    }

    #[test]
    fn a_server_is_up_within_the_lease_and_down_after() {
        let t0 = Instant::now();
        let mut m = Membership::new(2);
        assert_eq!(m.counts(t0), StateCounts { up: 0, down: 0, unknown: 2 });
        m.heartbeat(&hb(1, 7, 9001), t0).unwrap();
        assert_eq!(m.members(t0 + MEMBER_LEASE)[1].state, MemberState::Up);
        let late = t0 + MEMBER_LEASE + Duration::from_millis(1);
        let ms = m.members(late);
        assert_eq!(ms[0].state, MemberState::Unknown);
        assert_eq!(ms[1].state, MemberState::Down);
        assert_eq!(ms[1].since_ms, MEMBER_LEASE.as_millis() as u64 + 1);
        assert_eq!(m.counts(late), StateCounts { up: 0, down: 1, unknown: 1 });
        assert_eq!(m.log_lapsed(t0), Vec::<u32>::new());
        assert_eq!(m.log_lapsed(late), vec![1]);
        assert_eq!(m.log_lapsed(late), Vec::<u32>::new(), "a lapse is logged once");
        // Back with the same instance: up, no restart.
        m.heartbeat(&hb(1, 7, 9001), late).unwrap();
        assert_eq!((m.members(late)[1].state, m.members(late)[1].restarts), (MemberState::Up, 0));
        assert_eq!(m.log_lapsed(late + MEMBER_LEASE * 2), vec![1], "a heartbeat re-arms it");
    }

    #[test]
    fn a_new_instance_is_a_restart() {
        let t0 = Instant::now();
        let mut m = Membership::new(1);
        assert_eq!(m.heartbeat(&hb(0, 1, 9001), t0), Ok(Arrival::Joined));
        assert_eq!(m.heartbeat(&hb(0, 1, 9001), t0), Ok(Arrival::Again));
        assert_eq!(m.heartbeat(&hb(0, 2, 9001), t0), Ok(Arrival::Restarted));
        // Checked, not recorded: still a restart when it comes again.
        assert_eq!(m.check(&hb(0, 3, 9001), t0), Ok(Arrival::Restarted));
        assert_eq!(m.members(t0)[0].restarts, 1);
        assert_eq!(m.heartbeat(&hb(0, 3, 9001), t0), Ok(Arrival::Restarted));
        assert_eq!(m.members(t0)[0].restarts, 2);
    }

    #[test]
    fn unknown_ids_and_taken_addresses_are_refused() {
        let t0 = Instant::now();
        let mut m = Membership::new(3);
        assert_eq!(m.heartbeat(&hb(3, 1, 9001), t0), Err(Errno::EINVAL));
        assert_eq!(m.heartbeat(&hb(u32::MAX, 1, 9001), t0), Err(Errno::EINVAL));
        m.heartbeat(&hb(0, 1, 9001), t0).unwrap();
        assert_eq!(m.heartbeat(&hb(1, 2, 9001), t0), Err(Errno::EADDRINUSE));
        assert_eq!(m.members(t0)[1].state, MemberState::Unknown);
        // Once the holder is down, another id may take the address.
        let late = t0 + MEMBER_LEASE * 2;
        m.heartbeat(&hb(1, 2, 9001), late).unwrap();
        assert_eq!(m.counts(late), StateCounts { up: 1, down: 1, unknown: 1 });
    }

    #[test]
    fn one_id_up_from_another_process_at_another_address_is_refused() {
        let t0 = Instant::now();
        let mut m = Membership::new(2);
        m.heartbeat(&hb(1, 7, 9001), t0).unwrap();
        // Another process claiming id 1 from elsewhere: refused, the table
        // keeps the first, no restart counted, however often it tries.
        for _ in 0..5 {
            assert_eq!(m.heartbeat(&hb(1, 8, 9002), t0), Err(Errno::EEXIST));
            m.heartbeat(&hb(1, 7, 9001), t0).unwrap();
        }
        let ms = m.members(t0);
        assert_eq!((ms[1].addr.port(), ms[1].restarts), (9001, 0));
        assert!(
            m.warned.contains(&(1, SocketAddr::from(([127, 0, 0, 1], 9002)))),
            "the refusal is remembered as logged"
        );
        // A restart on the same address is still a restart.
        m.heartbeat(&hb(1, 9, 9001), t0).unwrap();
        assert_eq!(m.members(t0)[1].restarts, 1);
        // Once the holder is down, the other address is taken (a move).
        let late = t0 + MEMBER_LEASE * 2;
        m.heartbeat(&hb(1, 8, 9002), late).unwrap();
        let ms = m.members(late);
        assert_eq!((ms[1].addr.port(), ms[1].restarts, ms[1].state), (9002, 2, MemberState::Up));
        assert!(m.warned.is_empty(), "accepted: logged again if refused later");
    }

    #[test]
    fn a_server_goes_offline_a_margin_after_its_lease_and_never_heard_ones_after_a_start() {
        let t0 = Instant::now();
        let mut m = Membership::started_at(3, t0);
        let limit = MEMBER_LEASE + OFFLINE_MARGIN;
        let just = Duration::from_millis(1);
        // A meta that just started waits L + margin before it counts a
        // server it never heard from as lapsed.
        assert_eq!(m.offline(t0 + limit), Vec::<u32>::new());
        m.heartbeat(&hb(1, 7, 9001), t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(m.offline(t0 + limit + just), vec![0, 2]);
        // Heard at t0 + 1 s: down after L, offline only after L + margin.
        let heard = t0 + Duration::from_secs(1);
        assert_eq!(m.members(heard + MEMBER_LEASE + just)[1].state, MemberState::Down);
        assert_eq!(m.offline(heard + limit), vec![0, 2]);
        assert_eq!(m.offline(heard + limit + just), vec![0, 1, 2]);
        // A heartbeat takes it out.
        m.heartbeat(&hb(1, 7, 9001), heard + limit + just).unwrap();
        assert_eq!(m.offline(heard + limit + just), vec![0, 2]);
    }

    #[test]
    fn a_meta_that_did_not_run_waits_again_before_it_marks_anyone_offline() {
        let t0 = Instant::now();
        let mut m = Membership::started_at(2, t0);
        let limit = MEMBER_LEASE + OFFLINE_MARGIN;
        let just = Duration::from_millis(1);
        m.heartbeat(&hb(1, 7, 9001), t0 + Duration::from_secs(1)).unwrap();
        // Meta stopped from t0 + 1 s to t0 + 10 s: everyone looks lapsed.
        let back = t0 + Duration::from_secs(10);
        assert_eq!(m.offline(back), vec![0, 1]);
        m.deaf_until(back);
        assert_eq!(m.offline(back + limit), Vec::<u32>::new(), "heard nothing while it did not run");
        assert_eq!(m.offline(back + limit + just), vec![0, 1], "still silent once it listened L + margin");
        m.heartbeat(&hb(1, 7, 9001), back + Duration::from_secs(1)).unwrap();
        assert_eq!(m.offline(back + limit + just), vec![0]);
        // An earlier instant never moves it back.
        m.deaf_until(t0);
        assert_eq!(m.offline(back + limit), Vec::<u32>::new());
    }

    #[test]
    fn the_table_is_bounded() {
        let m = Membership::new(u32::MAX);
        assert_eq!(m.members(Instant::now()).len(), MAX_MEMBERS);
    }
}
