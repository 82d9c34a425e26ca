//! Membership on the wire: what an io server tells the metadata server in
//! its heartbeat ([`Heartbeat`], op `ServerHeartbeat`) and what meta
//! answers it (the versions of its chains: [`ChainVersion`]), and how
//! meta answers `Members` ([`Member`], and meta's chain table: [`Chain`]).
//!
//! Addresses travel as text (`ip:port`, as Rust prints a `SocketAddr`) so
//! that a person reading a capture sees them; the decoder accepts only the
//! canonical text of an address (the one it prints back), so the encoding
//! stays one per value. Host names are printable ASCII without spaces or
//! `|` ([`check_host_name`]: `dafne status` prints them in a table and a
//! terminal, unescaped), at most [`MAX_HOST_NAME`] bytes; a member list holds at most [`MAX_MEMBERS`] entries, ids strictly
//! increasing.

use std::net::SocketAddr;

use crate::wire::{Reader, Wire, Writer};
use crate::{DecodeError, MAX_LAYOUT_SERVERS};

/// Longest host name on the wire (`HOST_NAME_MAX` is 64 on Linux; DNS
/// names reach 253).
pub const MAX_HOST_NAME: usize = 255;

/// Longest address text: `[` + 45 bytes of IPv6 (with an IPv4 tail) +
/// `%` + a 10-digit scope id + `]:` + 5 digits is 65.
pub const MAX_ADDR_WIRE: usize = 72;

/// Most entries of a `Members` answer: one per io server a layout may name.
pub const MAX_MEMBERS: usize = MAX_LAYOUT_SERVERS;

/// How often an io server sends its heartbeat.
pub const HEARTBEAT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// How long after its last heartbeat meta still counts an io server `up`:
/// three intervals, so one or two late or lost heartbeats (a busy loop, a
/// reconnect to a restarted meta) do not mark a live server down, and a
/// dead one shows `down` 3 to 4 s after its last heartbeat.
pub const MEMBER_LEASE: std::time::Duration = std::time::Duration::from_secs(3);

/// An io server's heartbeat ([`crate::Request::ServerHeartbeat`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Heartbeat {
    /// The server's index in the cluster's io servers (what layouts name).
    pub server: u32,
    /// Chosen at random when the server process starts: a new value from
    /// the same id is a restart.
    pub instance: u64,
    /// Where it serves.
    pub addr: SocketAddr,
    /// The host it runs on (the cluster file's name for it, else the
    /// system's host name); [`check_host_name`]'s rules.
    pub host: String,
    /// Its file system's size and bytes in use.
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// How meta sees an io server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MemberState {
    /// Heard from within the lease.
    Up = 1,
    /// Heard from once, not within the lease.
    Down = 2,
    /// Never heard from since this metadata server started (its fields
    /// other than `server` are zero or empty).
    Unknown = 3,
}

impl MemberState {
    /// As `dafne status` prints it.
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Up => "up",
            MemberState::Down => "down",
            MemberState::Unknown => "unknown",
        }
    }
}

/// One io server in a `Members` answer ([`crate::Response::Members`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Member {
    pub server: u32,
    pub state: MemberState,
    /// The address and host of its last heartbeat.
    pub addr: SocketAddr,
    pub host: String,
    /// Milliseconds since its last heartbeat (0 when never heard).
    pub since_ms: u64,
    /// Instance changes seen since meta started.
    pub restarts: u32,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// Smallest encoded member: server u32, state u8, addr length u32, host
/// length u32, since u64, restarts u32, capacity u64, used u64.
pub(crate) const MEMBER_MIN_SIZE: usize = 41;

fn put_addr(w: &mut Writer, a: &SocketAddr) {
    w.put_bytes(a.to_string().as_bytes());
}

fn get_addr(r: &mut Reader<'_>, what: &'static str) -> Result<SocketAddr, DecodeError> {
    let b = r.bytes(what, MAX_ADDR_WIRE)?;
    let s = std::str::from_utf8(&b).map_err(|_| DecodeError::NotUtf8(what))?;
    match s.parse::<SocketAddr>() {
        Ok(a) if a.to_string() == s => Ok(a),
        _ => Err(DecodeError::BadValue { what, value: b.len() as u64 }),
    }
}

/// Whether `b` may appear in a host name: printable ASCII, not a space or
/// `|` (a table's column separator).
pub fn host_name_byte(b: u8) -> bool {
    b.is_ascii_graphic() && b != b'|'
}

/// Checks a host name as the wire accepts it (module docs): at most
/// [`MAX_HOST_NAME`] bytes of [`host_name_byte`]s (empty: unknown).
pub fn check_host_name(h: &str) -> Result<(), String> {
    if h.len() > MAX_HOST_NAME {
        return Err(format!("{} bytes, above {MAX_HOST_NAME}", h.len()));
    }
    match h.bytes().find(|&b| !host_name_byte(b)) {
        Some(b) => Err(format!("byte {b:#04x} is not printable ASCII other than a space or '|'")),
        None => Ok(()),
    }
}

fn get_host(r: &mut Reader<'_>, what: &'static str) -> Result<String, DecodeError> {
    let b = r.bytes(what, MAX_HOST_NAME)?;
    if let Some(&bad) = b.iter().find(|&&x| !host_name_byte(x)) {
        return Err(DecodeError::BadValue { what, value: u64::from(bad) });
    }
    String::from_utf8(b).map_err(|_| DecodeError::NotUtf8(what))
}

impl Wire for Heartbeat {
    fn put(&self, w: &mut Writer) {
        w.put_u32(self.server);
        w.put_u64(self.instance);
        put_addr(w, &self.addr);
        w.put_bytes(self.host.as_bytes());
        w.put_u64(self.capacity_bytes);
        w.put_u64(self.used_bytes);
    }
    fn get(r: &mut Reader<'_>) -> Result<Heartbeat, DecodeError> {
        Ok(Heartbeat {
            server: r.u32("heartbeat server")?,
            instance: r.u64("heartbeat instance")?,
            addr: get_addr(r, "heartbeat addr")?,
            host: get_host(r, "heartbeat host")?,
            capacity_bytes: r.u64("heartbeat capacity")?,
            used_bytes: r.u64("heartbeat used")?,
        })
    }
}

impl Wire for Member {
    fn put(&self, w: &mut Writer) {
        w.put_u32(self.server);
        w.put_u8(self.state as u8);
        put_addr(w, &self.addr);
        w.put_bytes(self.host.as_bytes());
        w.put_u64(self.since_ms);
        w.put_u32(self.restarts);
        w.put_u64(self.capacity_bytes);
        w.put_u64(self.used_bytes);
    }
    fn get(r: &mut Reader<'_>) -> Result<Member, DecodeError> {
        let server = r.u32("member server")?;
        let state = match r.u8("member state")? {
            1 => MemberState::Up,
            2 => MemberState::Down,
            3 => MemberState::Unknown,
            v => return Err(DecodeError::BadValue { what: "member state", value: v.into() }),
        };
        let m = Member {
            server,
            state,
            addr: get_addr(r, "member addr")?,
            host: get_host(r, "member host")?,
            since_ms: r.u64("member since_ms")?,
            restarts: r.u32("member restarts")?,
            capacity_bytes: r.u64("member capacity")?,
            used_bytes: r.u64("member used")?,
        };
        // An unknown server's other fields are zero or empty (one encoding
        // per value, as MemberState::Unknown says).
        let blank = m.addr == SocketAddr::from(([0, 0, 0, 0], 0))
            && m.host.is_empty()
            && (m.since_ms, m.restarts, m.capacity_bytes, m.used_bytes) == (0, 0, 0, 0);
        if m.state == MemberState::Unknown && !blank {
            return Err(DecodeError::BadValue { what: "unknown member with fields set", value: server.into() });
        }
        Ok(m)
    }
}

/// A `Members` list: at most [`MAX_MEMBERS`], ids strictly increasing.
pub(crate) fn get_members(r: &mut Reader<'_>) -> Result<Vec<Member>, DecodeError> {
    let n = r.count("members", MAX_MEMBERS, MEMBER_MIN_SIZE)?;
    let mut members: Vec<Member> = Vec::with_capacity(n);
    for _ in 0..n {
        let m = Member::get(r)?;
        if members.last().is_some_and(|p| p.server >= m.server) {
            return Err(DecodeError::BadValue {
                what: "member server (must be strictly increasing)",
                value: m.server.into(),
            });
        }
        members.push(m);
    }
    Ok(members)
}

/// Most io servers in one chain (the replication factor's bound).
pub const MAX_CHAIN_REPLICAS: usize = 8;

/// Most chains in a `Members` answer: one per io server.
pub const MAX_CHAINS: usize = MAX_MEMBERS;

/// A replica's place in its chain, as meta's chain table records it
/// (docs/REPLICATION.md, "Chains"). Meta records `Offline` once the io
/// server's lease lapsed, and when it heartbeats again `Syncing` where
/// another replica of the chain serves (it stays so: resync is not
/// built), else `Serving`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplicaState {
    Serving = 1,
    Syncing = 2,
    Offline = 3,
}

impl ReplicaState {
    /// As `dafne status` prints it.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaState::Serving => "serving",
            ReplicaState::Syncing => "syncing",
            ReplicaState::Offline => "offline",
        }
    }

    pub fn from_u8(v: u8) -> Option<ReplicaState> {
        Some(match v {
            1 => ReplicaState::Serving,
            2 => ReplicaState::Syncing,
            3 => ReplicaState::Offline,
            _ => return None,
        })
    }
}

/// One io server of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Replica {
    pub server: u32,
    pub state: ReplicaState,
}

/// One row of meta's chain table: the io servers that hold the stripes
/// placed on chain `id`, head first (docs/REPLICATION.md, "Chains").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub id: u32,
    /// Bumped whenever the row changes.
    pub version: u64,
    /// 1..=[`MAX_CHAIN_REPLICAS`] replicas, servers distinct.
    pub replicas: Vec<Replica>,
}

/// Smallest encoded chain: id u32, version u64, replica count u32 and one
/// replica (server u32, state u8).
pub(crate) const CHAIN_MIN_SIZE: usize = 21;

impl Wire for Chain {
    fn put(&self, w: &mut Writer) {
        w.put_u32(self.id);
        w.put_u64(self.version);
        w.put_len(self.replicas.len());
        for r in &self.replicas {
            w.put_u32(r.server);
            w.put_u8(r.state as u8);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Chain, DecodeError> {
        let id = r.u32("chain id")?;
        let version = r.u64("chain version")?;
        let n = r.count("chain replicas", MAX_CHAIN_REPLICAS, 5)?;
        if n == 0 {
            return Err(DecodeError::BadValue { what: "chain without replicas", value: id.into() });
        }
        let mut replicas: Vec<Replica> = Vec::with_capacity(n);
        for _ in 0..n {
            let server = r.u32("chain replica server")?;
            let raw = r.u8("chain replica state")?;
            let state = ReplicaState::from_u8(raw)
                .ok_or(DecodeError::BadValue { what: "chain replica state", value: raw.into() })?;
            if replicas.iter().any(|x| x.server == server) {
                return Err(DecodeError::BadValue {
                    what: "chain replica server (twice in one chain)",
                    value: server.into(),
                });
            }
            replicas.push(Replica { server, state });
        }
        Ok(Chain { id, version, replicas })
    }
}

/// A chain list: at most [`MAX_CHAINS`], ids strictly increasing.
pub(crate) fn get_chains(r: &mut Reader<'_>) -> Result<Vec<Chain>, DecodeError> {
    let n = r.count("chains", MAX_CHAINS, CHAIN_MIN_SIZE)?;
    let mut chains: Vec<Chain> = Vec::with_capacity(n);
    for _ in 0..n {
        let c = Chain::get(r)?;
        if chains.last().is_some_and(|p| p.id >= c.id) {
            return Err(DecodeError::BadValue { what: "chain id (must be strictly increasing)", value: c.id.into() });
        }
        chains.push(c);
    }
    Ok(chains)
}

/// A chain's health as its replicas' states in meta's chain table make it
/// (meta marks a replica `offline` once its io server's lease lapsed:
/// `dafne_meta::members`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainHealth {
    /// Every replica is `serving`.
    Healthy,
    /// Some replica is not `serving` (`offline` or `syncing`), at least one
    /// is.
    Degraded,
    /// No replica is `serving`: the chain's stripes cannot be read or
    /// written.
    Unavailable,
}

impl ChainHealth {
    pub fn name(self) -> &'static str {
        match self {
            ChainHealth::Healthy => "healthy",
            ChainHealth::Degraded => "degraded",
            ChainHealth::Unavailable => "unavailable",
        }
    }
}

impl Chain {
    /// The chain's health from its replicas' states ([`ChainHealth`]).
    pub fn health(&self) -> ChainHealth {
        let serving = self.replicas.iter().filter(|r| r.state == ReplicaState::Serving).count();
        if serving == 0 {
            ChainHealth::Unavailable
        } else if serving == self.replicas.len() {
            ChainHealth::Healthy
        } else {
            ChainHealth::Degraded
        }
    }
}

/// One chain's version, as meta's answer to a heartbeat carries it for
/// each chain that holds the io server that sent it
/// ([`crate::Response::Heartbeat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainVersion {
    pub chain: u32,
    pub version: u64,
}

/// Encoded size of a [`ChainVersion`]: chain u32, version u64.
pub(crate) const CHAIN_VERSION_SIZE: usize = 12;

/// A heartbeat answer's chain versions.
pub(crate) fn put_chain_versions(w: &mut Writer, v: &[ChainVersion]) {
    w.put_len(v.len());
    for c in v {
        w.put_u32(c.chain);
        w.put_u64(c.version);
    }
}

/// A heartbeat answer's chain versions: at most [`MAX_CHAINS`] (an io
/// server can be in every chain: with hosts known, the only io server of
/// a host is in every chain whose head sits on another host, when R = 2),
/// chain ids strictly increasing.
pub(crate) fn get_chain_versions(r: &mut Reader<'_>) -> Result<Vec<ChainVersion>, DecodeError> {
    let n = r.count("chain versions", MAX_CHAINS, CHAIN_VERSION_SIZE)?;
    let mut out: Vec<ChainVersion> = Vec::with_capacity(n);
    for _ in 0..n {
        let c = ChainVersion { chain: r.u32("chain version id")?, version: r.u64("chain version")? };
        if out.last().is_some_and(|p| p.chain >= c.chain) {
            return Err(DecodeError::BadValue {
                what: "chain version id (must be strictly increasing)",
                value: c.chain.into(),
            });
        }
        out.push(c);
    }
    Ok(out)
}

/// Where an io server stands in one of its chains, as meta's answer to
/// its heartbeat carries it ([`crate::Response::Heartbeat`], protocol 19):
/// whether it is the chain's head (the first `serving` replica, where
/// clients send the chain's requests) and the next `serving` replica after
/// it, which it forwards each write of the chain to (docs/REPLICATION.md,
/// "Writes"). `successor.addr` is `None` while meta has not heard that
/// server since it started (the head then refuses the chain's writes
/// until it knows where to forward them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainRoute {
    pub chain: u32,
    pub head: bool,
    pub successor: Option<Successor>,
}

/// The replica a [`ChainRoute`]'s server forwards writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Successor {
    pub server: u32,
    pub addr: Option<SocketAddr>,
}

/// Smallest encoded route: chain u32, flags u8.
pub(crate) const CHAIN_ROUTE_MIN_SIZE: usize = 5;

const ROUTE_HEAD: u8 = 1;
const ROUTE_SUCCESSOR: u8 = 2;
const ROUTE_ADDR: u8 = 4;

/// A heartbeat answer's routes.
pub(crate) fn put_chain_routes(w: &mut Writer, v: &[ChainRoute]) {
    w.put_len(v.len());
    for c in v {
        w.put_u32(c.chain);
        let mut flags = if c.head { ROUTE_HEAD } else { 0 };
        if let Some(s) = &c.successor {
            flags |= ROUTE_SUCCESSOR | if s.addr.is_some() { ROUTE_ADDR } else { 0 };
        }
        w.put_u8(flags);
        if let Some(s) = &c.successor {
            w.put_u32(s.server);
            if let Some(a) = &s.addr {
                put_addr(w, a);
            }
        }
    }
}

/// A heartbeat answer's routes: at most [`MAX_CHAINS`], chain ids
/// strictly increasing, no unknown flag, an address only with a
/// successor.
pub(crate) fn get_chain_routes(r: &mut Reader<'_>) -> Result<Vec<ChainRoute>, DecodeError> {
    let n = r.count("chain routes", MAX_CHAINS, CHAIN_ROUTE_MIN_SIZE)?;
    let mut out: Vec<ChainRoute> = Vec::with_capacity(n);
    for _ in 0..n {
        let chain = r.u32("chain route id")?;
        if chain as usize >= MAX_CHAINS || out.last().is_some_and(|p| p.chain >= chain) {
            return Err(DecodeError::BadValue {
                what: "chain route id (below MAX_CHAINS, strictly increasing)",
                value: chain.into(),
            });
        }
        let flags = r.u8("chain route flags")?;
        if flags & !(ROUTE_HEAD | ROUTE_SUCCESSOR | ROUTE_ADDR) != 0
            || (flags & ROUTE_ADDR != 0 && flags & ROUTE_SUCCESSOR == 0)
        {
            return Err(DecodeError::BadValue { what: "chain route flags", value: flags.into() });
        }
        let successor = if flags & ROUTE_SUCCESSOR != 0 {
            let server = r.u32("chain route successor")?;
            let addr = if flags & ROUTE_ADDR != 0 { Some(get_addr(r, "chain route successor addr")?) } else { None };
            Some(Successor { server, addr })
        } else {
            None
        };
        out.push(ChainRoute { chain, head: flags & ROUTE_HEAD != 0, successor });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat() -> Heartbeat {
        Heartbeat {
            server: 3,
            instance: 7,
            addr: "10.0.0.2:7001".parse().unwrap(),
            host: "node-b".into(),
            capacity_bytes: 1 << 40,
            used_bytes: 1 << 30,
        }
    }

    #[test]
    fn a_heartbeat_round_trips_and_every_prefix_is_refused() {
        let mut w = Writer::with_prefix(0);
        beat().put(&mut w);
        let b = w.into_vec();
        let mut r = Reader::new(&b);
        assert_eq!(Heartbeat::get(&mut r), Ok(beat()));
        assert_eq!(r.left(), 0);
        for n in 0..b.len() {
            assert!(Heartbeat::get(&mut Reader::new(&b[..n])).is_err(), "prefix of {n} bytes accepted");
        }
    }

    fn with_addr(text: &[u8]) -> Vec<u8> {
        let mut w = Writer::with_prefix(0);
        w.put_u32(1);
        w.put_u64(2);
        w.put_bytes(text);
        w.put_bytes(b"h");
        w.put_u64(0);
        w.put_u64(0);
        w.into_vec()
    }

    #[test]
    fn addresses_must_be_canonical_and_bounded() {
        assert!(Heartbeat::get(&mut Reader::new(&with_addr(b"127.0.0.1:80"))).is_ok());
        assert!(Heartbeat::get(&mut Reader::new(&with_addr(b"[::1]:80"))).is_ok());
        for bad in [&b"127.0.0.1:080"[..], b"127.0.0.1", b"", b"host:80", b"\xff:1", b"[0:0::1]:80"] {
            assert!(Heartbeat::get(&mut Reader::new(&with_addr(bad))).is_err(), "{bad:?} accepted");
        }
        let long = vec![b'1'; MAX_ADDR_WIRE + 1];
        assert!(matches!(Heartbeat::get(&mut Reader::new(&with_addr(&long))), Err(DecodeError::TooLong { .. })));
    }

    #[test]
    fn host_names_are_bounded_printable_ascii() {
        let mut hb = beat();
        hb.host = "x".repeat(MAX_HOST_NAME + 1);
        let mut w = Writer::with_prefix(0);
        hb.put(&mut w);
        assert!(matches!(Heartbeat::get(&mut Reader::new(&w.into_vec())), Err(DecodeError::TooLong { .. })));
        let mut w = Writer::with_prefix(0);
        w.put_u32(1);
        w.put_u64(2);
        w.put_bytes(b"127.0.0.1:80");
        w.put_bytes(b"\xc3");
        w.put_u64(0);
        w.put_u64(0);
        assert!(Heartbeat::get(&mut Reader::new(&w.into_vec())).is_err());
        // Printable ASCII only, without spaces or '|' (status prints them).
        for bad in ["a|b", "a b", "esc\u{1b}[2J", "new\nline", "é", "del\u{7f}"] {
            hb.host = bad.into();
            let mut w = Writer::with_prefix(0);
            hb.put(&mut w);
            assert!(
                matches!(Heartbeat::get(&mut Reader::new(&w.into_vec())), Err(DecodeError::BadValue { .. })),
                "{bad:?} accepted"
            );
            assert!(check_host_name(bad).is_err());
        }
        hb.host = "node-1.example.org_(x)".into();
        let mut w = Writer::with_prefix(0);
        hb.put(&mut w);
        assert_eq!(Heartbeat::get(&mut Reader::new(&w.into_vec())).unwrap(), hb);
        assert_eq!(check_host_name(&hb.host), Ok(()));
        assert_eq!(check_host_name(""), Ok(()));
    }

    #[test]
    fn member_lists_are_bounded_and_ordered() {
        let m = |server| Member {
            server,
            state: MemberState::Up,
            addr: "127.0.0.1:1".parse().unwrap(),
            host: String::new(),
            since_ms: 1,
            restarts: 0,
            capacity_bytes: 0,
            used_bytes: 0,
        };
        let enc = |ms: &[Member]| {
            let mut w = Writer::with_prefix(0);
            w.put_len(ms.len());
            for x in ms {
                x.put(&mut w);
            }
            w.into_vec()
        };
        assert_eq!(get_members(&mut Reader::new(&enc(&[m(0), m(2)]))).unwrap().len(), 2);
        assert!(get_members(&mut Reader::new(&enc(&[m(2), m(0)]))).is_err());
        assert!(get_members(&mut Reader::new(&enc(&[m(1), m(1)]))).is_err());
        // A count above the bound is refused before anything is allocated.
        let mut w = Writer::with_prefix(0);
        w.put_u32(MAX_MEMBERS as u32 + 1);
        assert!(get_members(&mut Reader::new(&w.into_vec())).is_err());
        // An unknown server carries nothing but its id.
        let blank =
            Member { state: MemberState::Unknown, addr: SocketAddr::from(([0, 0, 0, 0], 0)), since_ms: 0, ..m(3) };
        assert_eq!(get_members(&mut Reader::new(&enc(std::slice::from_ref(&blank)))).unwrap(), vec![blank.clone()]);
        for odd in [
            Member { restarts: 1, ..blank.clone() },
            Member { host: "h".into(), ..blank.clone() },
            Member { addr: "127.0.0.1:1".parse().unwrap(), ..blank.clone() },
        ] {
            assert!(get_members(&mut Reader::new(&enc(std::slice::from_ref(&odd)))).is_err(), "{odd:?}");
        }
        let mut bad_state = enc(&[m(0)]);
        bad_state[8] = 9;
        assert!(get_members(&mut Reader::new(&bad_state)).is_err());
    }

    fn chain(id: u32, servers: &[u32]) -> Chain {
        Chain {
            id,
            version: 1,
            replicas: servers.iter().map(|&server| Replica { server, state: ReplicaState::Serving }).collect(),
        }
    }

    fn enc_chains(cs: &[Chain]) -> Vec<u8> {
        let mut w = Writer::with_prefix(0);
        w.put_len(cs.len());
        for c in cs {
            c.put(&mut w);
        }
        w.into_vec()
    }

    #[test]
    fn chain_lists_round_trip_and_damage_is_refused() {
        let cs = vec![chain(0, &[0, 1]), chain(1, &[1, 0])];
        let b = enc_chains(&cs);
        assert_eq!(get_chains(&mut Reader::new(&b)).unwrap(), cs);
        for n in 0..b.len() {
            assert!(get_chains(&mut Reader::new(&b[..n])).is_err(), "prefix of {n} bytes accepted");
        }
        assert!(get_chains(&mut Reader::new(&enc_chains(&[chain(1, &[0]), chain(0, &[1])]))).is_err());
        assert!(get_chains(&mut Reader::new(&enc_chains(&[chain(0, &[2, 2])]))).is_err(), "a server twice");
        assert!(get_chains(&mut Reader::new(&enc_chains(&[chain(0, &[])]))).is_err(), "no replica");
        let too_long: Vec<u32> = (0..MAX_CHAIN_REPLICAS as u32 + 1).collect();
        assert!(get_chains(&mut Reader::new(&enc_chains(&[chain(0, &too_long)]))).is_err());
        let mut bad_state = enc_chains(&[chain(0, &[0])]);
        let last = bad_state.len() - 1;
        bad_state[last] = 9;
        assert!(get_chains(&mut Reader::new(&bad_state)).is_err());
        let mut w = Writer::with_prefix(0);
        w.put_u32(MAX_CHAINS as u32 + 1);
        assert!(get_chains(&mut Reader::new(&w.into_vec())).is_err());
    }

    #[test]
    fn a_chains_health_follows_its_replicas_states() {
        let mut c = chain(0, &[0, 1]);
        assert_eq!(c.health(), ChainHealth::Healthy);
        c.replicas[1].state = ReplicaState::Offline;
        assert_eq!(c.health(), ChainHealth::Degraded);
        c.replicas[1].state = ReplicaState::Syncing;
        assert_eq!(c.health(), ChainHealth::Degraded, "a syncing replica serves nothing yet");
        c.replicas[0].state = ReplicaState::Offline;
        assert_eq!(c.health(), ChainHealth::Unavailable);
        let mut one = chain(1, &[1]);
        assert_eq!(one.health(), ChainHealth::Healthy);
        one.replicas[0].state = ReplicaState::Offline;
        assert_eq!(one.health(), ChainHealth::Unavailable);
    }

    #[test]
    fn chain_versions_round_trip_bounded_and_ordered() {
        let enc = |v: &[ChainVersion]| {
            let mut w = Writer::with_prefix(0);
            put_chain_versions(&mut w, v);
            w.into_vec()
        };
        let v = vec![ChainVersion { chain: 0, version: 3 }, ChainVersion { chain: 5, version: u64::MAX }];
        let b = enc(&v);
        assert_eq!(get_chain_versions(&mut Reader::new(&b)).unwrap(), v);
        for n in 0..b.len() {
            assert!(get_chain_versions(&mut Reader::new(&b[..n])).is_err(), "prefix of {n} bytes accepted");
        }
        assert_eq!(get_chain_versions(&mut Reader::new(&enc(&[]))).unwrap(), vec![]);
        let twice = [ChainVersion { chain: 2, version: 1 }, ChainVersion { chain: 2, version: 1 }];
        assert!(get_chain_versions(&mut Reader::new(&enc(&twice))).is_err(), "a chain twice");
        let mut w = Writer::with_prefix(0);
        w.put_u32(MAX_CHAINS as u32 + 1);
        assert!(get_chain_versions(&mut Reader::new(&w.into_vec())).is_err(), "above the bound");
    }

    #[test]
    fn chain_routes_round_trip_and_hostile_bytes_are_refused() {
        let enc = |v: &[ChainRoute]| {
            let mut w = Writer::with_prefix(0);
            put_chain_routes(&mut w, v);
            w.into_vec()
        };
        let v = vec![
            ChainRoute { chain: 0, head: true, successor: None },
            ChainRoute {
                chain: 1,
                head: true,
                successor: Some(Successor { server: 2, addr: Some("10.0.0.2:7001".parse().unwrap()) }),
            },
            ChainRoute { chain: 7, head: false, successor: Some(Successor { server: 3, addr: None }) },
        ];
        let b = enc(&v);
        assert_eq!(get_chain_routes(&mut Reader::new(&b)).unwrap(), v);
        for n in 0..b.len() {
            assert!(get_chain_routes(&mut Reader::new(&b[..n])).is_err(), "prefix of {n} bytes accepted");
        }
        let twice = [v[1], v[1]];
        assert!(get_chain_routes(&mut Reader::new(&enc(&twice))).is_err(), "a chain twice");
        let far = [ChainRoute { chain: MAX_CHAINS as u32, head: true, successor: None }];
        assert!(get_chain_routes(&mut Reader::new(&enc(&far))).is_err(), "a chain id past the bound");
        // Flags: unknown bits, or an address without a successor.
        for flags in [8u8, 0x80, ROUTE_ADDR, ROUTE_ADDR | ROUTE_HEAD] {
            let mut w = Writer::with_prefix(0);
            w.put_len(1);
            w.put_u32(0);
            w.put_u8(flags);
            assert!(get_chain_routes(&mut Reader::new(&w.into_vec())).is_err(), "flags {flags:#x} accepted");
        }
        let mut w = Writer::with_prefix(0);
        w.put_u32(MAX_CHAINS as u32 + 1);
        assert!(get_chain_routes(&mut Reader::new(&w.into_vec())).is_err(), "above the bound");
        // Every byte flipped: refused or decoded, never a panic.
        for i in 0..b.len() {
            let mut m = b.clone();
            m[i] ^= 0xff;
            let _ = get_chain_routes(&mut Reader::new(&m));
        }
    }
}
