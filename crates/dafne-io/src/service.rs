//! The io service: capability check (its MAC, expiry and rights, then its
//! generation against the object's revocation floor and tombstone, which
//! meta's signed `Revoke` batches and the reclaimer's `Remove` set:
//! `dafne_auth`'s module docs, "Revocation"), then reads and writes in the server's
//! serving mode ([`crate::server::ServingMode`]): through the Unifier with
//! server-driven RMA (`unifier`, below), or the comparison methods `normal`
//! and `mmap` ([`crate::modes`]).
//!
//! In the `unifier` mode a request names extents of one object (file
//! offsets, lengths, client segments). Each extent is cut into Unifier
//! units; units are taken in batches of at most [`UNITS_PER_BATCH`] (so one
//! request never needs more cache than that, whatever its size), the RMA of
//! a batch is issued as one vectored put or get with a single flush, and
//! the guards are released when it completed. A read puts straight from the
//! cache units; a write gets straight into them: no copy on either path.
//! Inline data (small I/O) is the exception, copied once between the
//! message and the unit and counted as such.
//!
//! # Keys that follow (FRRWP)
//! A Read or Write may come before its keys (`dafne_proto::io`, "Keys that
//! follow"): the client registers its memory while the request travels and
//! is prepared here, as the FRRWP paper (Ou, He and Han) proposes. The
//! request is parked under its (connection, tag) at once, before anything
//! else is awaited, so that a `Keys` sent after it on the same connection
//! always finds it; it then does what it can without the keys and without
//! holding anything: the capability, the cut into units, and in the
//! `unifier` mode its first batch's missing units read from storage into
//! the cache (`Unifier::prefetch_with_ahead`, which holds no unit when it
//! returns; a unit evicted meanwhile is filled again later). Then it waits
//! for the keys, checks them with [`crate::modes::remote_keys`] exactly as
//! keys carried in a request, checks the capability again (a `Revoke` may
//! have come meanwhile: `ESTALE`), and only then runs the path of a
//! request that carried its keys: units acquired, RMA, committed. So a
//! parked request holds nothing but its entry in the table: no unit, no
//! slab, no guard that an error could release as written, and another
//! client's request never waits for it.
//!
//! Hostile input: at most [`PARKED_PER_CONN`] requests wait per connection
//! and [`PARKED_MAX`] in all (beyond, `EBUSY`); a request of more than
//! [`FOLLOW_MAX_EXTENTS`] extents may not wait (`EINVAL`: its frame could be
//! overtaken by its keys). Each waits at most the keys deadline
//! ([`KEYS_DEADLINE`] unless set), counted from when it was parked
//! (`ETIMEDOUT`). A tag already waiting on the connection is `EBUSY`, a
//! `Keys` naming no waiting request `ENOENT`, one with the wrong number of
//! keys `EINVAL` (and the request it named too). A connection that goes
//! away takes its parked requests out of the table at once
//! (`Service::disconnected`), so reconnecting does not pile up entries. A
//! waiter leaving the table removes only its own entry (a serial per
//! entry), never a later request's that reused the tag.
//!
//! # Lease
//! A server that joined meta serves data only while its lease from meta
//! holds ([`crate::lease`], which says which requests are refused and
//! why): the check comes first, before the capability, the cache advice,
//! parking or anything else a request does, so a refused request had no
//! effect; a request parked for its keys checks it again once they came.
//!
//! A write's units are aborted on every early return after they were taken
//! (`AbortUnlessCommitted`): a unit not filled from storage is dropped
//! rather than saved as written, so an error never exposes the slot's
//! previous bytes.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use futures::channel::oneshot;

use dafne_auth::{CapFloors, Refusal, Secret};
use dafne_proto::io::{
    IoExtent, IoOp, IoRequest, IoResponse, KeysFollow, ScrubSlice, Stability, MAX_IO_EXTENTS, MAX_IO_KEYS,
    MAX_SCRUB_BAD, NO_KEY, SCRUB_SLICE_BYTES,
};
use dafne_proto::{Envelope, Errno, RIGHT_READ, RIGHT_WRITE};
use dafne_transport::{ConnHandle, Request as TRequest, RmaSeg, Service};
use dafne_unifier::{spans, Unifier};

use crate::chunk::ChunkStore;
use crate::modes::{Direct, ModeStats};
use crate::server::ServingMode;

/// How long a connection may go without logging in (io op `Login`,
/// proven with the cluster secret or a credential's key) before the
/// transport drops it: a peer without either cannot hold a connection, and
/// the buffers behind it, by pinging. A data client logs in right after
/// connecting, so 10 s is generous.
pub const LOGIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Units held by one request at a time: 64 × 64 KiB = 4 MiB of cache.
pub const UNITS_PER_BATCH: usize = 64;

/// How long a request whose keys follow waits for them by default: the
/// client sends them as soon as its memory is registered (µs to ms).
pub const KEYS_DEADLINE: Duration = Duration::from_secs(5);
/// Requests waiting for their keys, per connection.
pub const PARKED_PER_CONN: usize = 16;
/// Requests waiting for their keys, over all connections.
pub const PARKED_MAX: usize = 256;

/// Extents of a request whose keys follow, at most: the client's
/// `dafne_client::data::FOLLOW_MAX_EXTENTS`. A larger request frame may be
/// received by rendezvous and overtaken by its `Keys` (which would then
/// find no parked request), so it is refused (`EINVAL`) rather than
/// parked: such a request carries its keys.
pub const FOLLOW_MAX_EXTENTS: usize = 128;

/// A request waiting for its keys: where to deliver them, how many; and
/// its serial, so that a waiter leaving the table removes its own entry,
/// never a later request's that reused the tag.
struct Parked {
    tx: oneshot::Sender<Vec<Vec<u8>>>,
    count: u16,
    serial: u64,
}

/// What serves reads and writes: the Unifier, or a comparison mode.
#[derive(Debug)]
pub enum Backend {
    Unifier(Unifier),
    /// `normal` or `mmap`.
    Direct(Box<Direct>),
}

/// What the requests of one op came to: counted where they are answered
/// ([`IoService`]'s `handle`), so they are the real counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OpCount {
    /// Requests answered (successfully or not).
    pub requests: u64,
    /// Of those, the ones answered with an error.
    pub errors: u64,
    /// Bytes moved by the successful ones: the bytes a `Read` returned or
    /// a `Write` wrote (0 for the other ops).
    pub bytes: u64,
}

/// Requests by op, in the order of [`IoOp::ALL`], and the ones that could
/// not be decoded (no op to count them under).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpStats {
    pub by_op: [OpCount; IoOp::ALL.len()],
    pub undecodable: u64,
    /// Requests refused for their chain version, by reason
    /// ([`crate::chaincheck`]; counted as errors of their op too).
    pub chain_refusals: crate::chaincheck::ChainRefusals,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats { by_op: [OpCount::default(); IoOp::ALL.len()], undecodable: 0, chain_refusals: Default::default() }
    }
}

impl OpStats {
    /// The counts of `op`.
    pub fn of(&self, op: IoOp) -> OpCount {
        IoOp::ALL.iter().position(|&o| o == op).map(|i| self.by_op[i]).unwrap_or_default()
    }

    fn record(&mut self, op: IoOp, result: &Result<IoResponse, Errno>) {
        let Some(c) = IoOp::ALL.iter().position(|&o| o == op).map(|i| &mut self.by_op[i]) else { return };
        c.requests += 1;
        match result {
            Ok(IoResponse::Read { bytes, .. }) | Ok(IoResponse::Write { bytes }) => c.bytes += bytes,
            Ok(IoResponse::ChainRefused(r)) => {
                c.errors += 1;
                self.chain_refusals.count(r.reason);
            }
            Ok(_) => {}
            Err(_) => c.errors += 1,
        }
    }
}

/// How much the server holds: the data directory's file system and the cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// The file system of the data directory (statvfs): size and bytes
    /// available to the server; 0 when statvfs failed.
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub filesystem_id: u64,
    /// The cache: the Unifier's slabs, or the page cache the comparison
    /// modes count on.
    pub cache_bytes: u64,
}

/// The counters of a service.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServingStats {
    /// Requests, errors and bytes by op.
    pub ops: OpStats,
    /// The serving mode's own counters (zero in the `unifier` mode).
    pub mode: ModeStats,
    /// The Unifier's counters (zero in `normal` and `mmap`).
    pub unifier: dafne_unifier::UnifierStats,
    /// The chunk store's counters (storage path, ops and bytes per path).
    pub storage: crate::chunk::StorageStats,
    /// The lease's state and refusals.
    pub lease: LeaseStats,
}

/// The lease as the metrics page shows it ([`crate::lease`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeaseStats {
    /// Whether the server holds a lease at all (it joined meta).
    pub leased: bool,
    /// Whether data requests are served now: always without a lease,
    /// while it holds with one.
    pub serving: bool,
    /// Data requests refused because the lease had lapsed.
    pub refusals: u64,
    /// The versions of the server's chains in meta's last answer to its
    /// heartbeat ([`crate::lease::Lease::chains`]).
    pub chains: Vec<dafne_proto::ChainVersion>,
    /// Chain writes forwarded and received (`crate::forward`).
    pub forward: crate::forward::ForwardStats,
}

/// The io service of one server. Its counters are read on demand, on the
/// loop thread ([`IoService::stats`], reached by `IoServer::stats` through
/// the runtime): nothing is published per request.
pub struct IoService {
    secret: Secret,
    backend: Backend,
    store: Rc<ChunkStore>,
    /// Per object, the unit a sequential reader asks for next (read-ahead).
    next_unit: std::cell::RefCell<std::collections::HashMap<u64, u64>>,
    /// Set when the server is stopping: new requests are refused (EAGAIN)
    /// so that nothing is acknowledged after the final write-back.
    draining: std::cell::Cell<bool>,
    /// Revocation floors and tombstones (bounded: `dafne_auth::MAX_FLOORS`).
    floors: std::cell::RefCell<CapFloors>,
    /// When a refused login was last logged: at most one warning per
    /// [`LOGIN_WARN_EVERY`], so a peer cannot flood the log.
    login_warned: std::cell::Cell<Option<std::time::Instant>>,
    /// Requests by op (the metrics page).
    ops: std::cell::RefCell<OpStats>,
    /// Requests waiting for their keys, by (connection, tag).
    parked: RefCell<HashMap<(u32, u64), Parked>>,
    /// The serial of the next parked request.
    parked_serial: Cell<u64>,
    keys_deadline: Duration,
    /// Requests served with keys that followed them; refused or timed out.
    frrwp_served: Cell<u64>,
    frrwp_refused: Cell<u64>,
    /// Connections that logged in with the cluster secret (not a
    /// credential): the only ones allowed to `Scrub`.
    root_conns: RefCell<std::collections::HashSet<u32>>,
    /// The objects of the scrub under way (`scrub`).
    scrub_list: RefCell<Vec<u64>>,
    /// The lease from meta (module docs, "Lease"); none: always serving.
    lease: Option<std::sync::Arc<crate::lease::Lease>>,
    /// Data requests refused because the lease had lapsed.
    lease_refusals: Cell<u64>,
    /// Chain writes: forwarding to the next replica (`crate::forward`);
    /// set on a server that joined meta.
    forwarder: Option<crate::forward::Forwarder>,
}

/// Objects one scrub slice may visit at most (each costs an open, a stat
/// and a wait for its write-backs even if empty).
const SCRUB_SLICE_OBJECTS: usize = 64;
/// The time after which a scrub slice stops (at the next object or 1 MiB
/// piece), so that requests queued behind it wait little.
const SCRUB_SLICE_TIME: Duration = Duration::from_millis(10);

/// The least time between two warnings about refused logins.
const LOGIN_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Read-ahead: bytes filled beyond a sequential read that misses, in the
/// same storage submission (at most an eighth of the cache).
pub const READ_AHEAD_BYTES: usize = 1 << 20;
/// Objects whose read position is remembered (the map is cleared beyond).
const READ_AHEAD_OBJECTS: usize = 4096;

impl std::fmt::Debug for IoService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoService").finish_non_exhaustive()
    }
}

/// A full disk is the one storage failure a client can act on (free space,
/// then fsync again: the units stay dirty and are written then), so it
/// travels as `ENOSPC`; every other storage failure is `EIO`.
fn storage_errno(what: &'static str) -> impl Fn(dafne_unifier::Error) -> Errno {
    move |e| {
        let full = match &e {
            dafne_unifier::Error::Storage { source, .. } => source.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        };
        tracing::warn!("{what}: {e}");
        if full {
            Errno::ENOSPC
        } else {
            Errno::EIO
        }
    }
}

fn eio<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> Errno {
    move |e| {
        tracing::warn!("{what}: {e}");
        Errno::EIO
    }
}

/// One unit's part of an extent, before it is acquired.
struct Piece {
    range: std::ops::Range<usize>,
    /// Where the piece's bytes are on the client (RMA) or in the inline data.
    remote: Remote,
}

enum Remote {
    Rma { addr: u64, key: usize },
    Inline { at: usize },
}

impl IoService {
    pub fn new(secret: Secret, backend: Backend, store: Rc<ChunkStore>) -> IoService {
        IoService {
            secret,
            backend,
            store,
            next_unit: Default::default(),
            draining: Default::default(),
            floors: Default::default(),
            login_warned: Default::default(),
            ops: Default::default(),
            parked: Default::default(),
            parked_serial: Default::default(),
            keys_deadline: KEYS_DEADLINE,
            frrwp_served: Default::default(),
            frrwp_refused: Default::default(),
            root_conns: Default::default(),
            scrub_list: Default::default(),
            lease: None,
            lease_refusals: Default::default(),
            forwarder: None,
        }
    }

    /// Forwards the writes of the chains this server heads to their next
    /// replica (`crate::forward`), on the loop `local`.
    pub fn set_forwarder(&mut self, local: Rc<dafne_transport::LoopLocal>) {
        self.forwarder = Some(crate::forward::Forwarder::new(local, self.secret.clone()));
    }

    /// Where a data request of `op` for `chain` goes on from here (module
    /// docs of `crate::forward`), decided before anything of it is done:
    /// `Ok(None)` served here only, `Ok(Some(addr))` forwarded to the
    /// successor at `addr` once done here. Refused: a client's (not a
    /// forwarded) request that changes data on a replica that is not the
    /// chain's head (`NotHead`); a forwarded one from a connection not
    /// logged in with the cluster secret (`EACCES`); one whose successor's
    /// address meta does not know yet (`NOT_SERVING`: sent again); a
    /// request without a chain that changes data on a server that is a
    /// replica of a chain of several (`EINVAL`: it would reach one
    /// replica only).
    fn route(
        &self,
        conn: &ConnHandle,
        op: IoOp,
        chain: Option<dafne_proto::ChainVersion>,
        forwarded: bool,
    ) -> Result<Result<Option<std::net::SocketAddr>, dafne_proto::io::ChainRefusal>, Errno> {
        if forwarded && !self.root_conns.borrow().contains(&conn.id()) {
            tracing::debug!("connection {}: a forwarded {op} not from a peer: refused", conn.id());
            return Err(Errno::EACCES);
        }
        let Some(lease) = &self.lease else { return Ok(Ok(None)) };
        // A client's read (or stat) of a chain is served by its head only:
        // another replica may be `syncing` (back after being offline, it
        // missed writes: what it holds is stale), and its route looks like
        // a serving tail's (not head, no successor). A client sends to a
        // replica that does not serve only when none does (its table
        // names no serving one), and must then get a refusal, not old
        // bytes.
        if !op.is_forwarded() {
            if let (Some(c), false) = (chain, forwarded) {
                if lease.route(c.chain).is_some_and(|r| !r.head) {
                    return Ok(Err(dafne_proto::io::ChainRefusal {
                        reason: dafne_proto::io::ChainRefusalReason::NotHead,
                        chain: c.chain,
                        version: c.version,
                    }));
                }
            }
            return Ok(Ok(None));
        }
        let Some(c) = chain else {
            if op != IoOp::Sync && lease.replicated() {
                tracing::debug!("connection {}: a {op} without a chain on a replicated server: refused", conn.id());
                return Err(Errno::EINVAL);
            }
            return Ok(Ok(None));
        };
        let Some(route) = lease.route(c.chain) else { return Ok(Ok(None)) };
        if !route.head && !forwarded {
            return Ok(Err(dafne_proto::io::ChainRefusal {
                reason: dafne_proto::io::ChainRefusalReason::NotHead,
                chain: c.chain,
                version: c.version,
            }));
        }
        match route.successor {
            None => Ok(Ok(None)),
            Some(dafne_proto::Successor { addr: Some(a), .. }) if self.forwarder.is_some() => Ok(Ok(Some(a))),
            Some(s) => {
                tracing::debug!("chain {}: successor {} not reachable yet: {op} refused", c.chain, s.server);
                Err(crate::lease::NOT_SERVING)
            }
        }
    }

    /// Forwards `req` (done here) to `to` (see [`Self::route`]).
    async fn forward_done(
        &self,
        to: Option<std::net::SocketAddr>,
        chain: Option<dafne_proto::ChainVersion>,
        req: &IoRequest,
    ) -> Result<(), Errno> {
        match (to, &self.forwarder) {
            (Some(addr), Some(f)) => {
                let env = Envelope { chain, ..Envelope::new(0, 0, 0) };
                f.forward(addr, env, req, 0).await
            }
            _ => Ok(()),
        }
    }

    /// Serves data only while `lease` holds (module docs, "Lease").
    pub fn set_lease(&mut self, lease: std::sync::Arc<crate::lease::Lease>) {
        self.lease = Some(lease);
    }

    /// `Err(NOT_SERVING)`, counted, while the lease has lapsed.
    fn check_lease(&self) -> Result<(), Errno> {
        match &self.lease {
            Some(l) if !l.held() => {
                self.lease_refusals.set(self.lease_refusals.get() + 1);
                Err(crate::lease::NOT_SERVING)
            }
            _ => Ok(()),
        }
    }

    /// The chain check of a data request that carries `chain`
    /// ([`crate::chaincheck`]): only on a server that holds a lease (it
    /// joined meta, which gives it its chains' versions).
    fn check_chain(&self, chain: Option<dafne_proto::ChainVersion>) -> Result<(), dafne_proto::io::ChainRefusal> {
        match (&self.lease, chain) {
            (Some(l), Some(asked)) => crate::chaincheck::decide(l.chain_version(asked.chain), asked),
            _ => Ok(()),
        }
    }

    fn lease_stats(&self) -> LeaseStats {
        LeaseStats {
            leased: self.lease.is_some(),
            serving: self.lease.as_ref().is_none_or(|l| l.held()),
            refusals: self.lease_refusals.get(),
            chains: self.lease.as_ref().map(|l| l.chains()).unwrap_or_default(),
            forward: self.forwarder.as_ref().map(|f| f.stats()).unwrap_or_default(),
        }
    }

    /// How long a request whose keys follow waits for them (module docs).
    pub fn set_keys_deadline(&mut self, d: Duration) {
        self.keys_deadline = d;
    }

    /// Requests served with keys that followed them (FRRWP), and those
    /// refused or timed out (with refused `Keys`).
    pub fn frrwp_counts(&self) -> (u64, u64) {
        (self.frrwp_served.get(), self.frrwp_refused.get())
    }

    fn refuse_frrwp(&self, e: Errno) -> Errno {
        self.frrwp_refused.set(self.frrwp_refused.get() + 1);
        e
    }

    /// Parks a request whose keys follow (module docs): synchronously, so a
    /// `Keys` after it on the connection finds it.
    fn park(&self, conn: &ConnHandle, f: KeysFollow) -> Result<KeyWait<'_>, Errno> {
        let mut p = self.parked.borrow_mut();
        let id = (conn.id(), f.tag);
        if p.contains_key(&id)
            || p.len() >= PARKED_MAX
            || p.keys().filter(|(c, _)| *c == conn.id()).count() >= PARKED_PER_CONN
        {
            tracing::debug!("connection {}: request with keys to follow (tag {}) refused", conn.id(), f.tag);
            return Err(self.refuse_frrwp(Errno::EBUSY));
        }
        let (tx, rx) = oneshot::channel();
        let serial = self.parked_serial.get();
        self.parked_serial.set(serial + 1);
        p.insert(id, Parked { tx, count: f.count, serial });
        // The deadline runs from here: preparation counts against it.
        let deadline = std::time::Instant::now() + self.keys_deadline;
        Ok(KeyWait { svc: self, id, serial, deadline, rx: Some(rx) })
    }

    /// The connection is gone: its parked requests leave the table (their
    /// waiters, woken by the dropped senders, end without touching the
    /// cache), so a client that reconnects cannot
    /// pile up entries against [`PARKED_MAX`].
    fn forget_connection(&self, conn_id: u32) {
        self.root_conns.borrow_mut().remove(&conn_id);
        let mut p = self.parked.borrow_mut();
        let before = p.len();
        p.retain(|(c, _), _| *c != conn_id);
        if p.len() != before {
            tracing::debug!("connection {conn_id} gone: {} parked requests dropped", before - p.len());
        }
    }

    /// The capability check of [`Self::serve`]: its MAC, expiry and
    /// rights, then the revocation floors and tombstones. `Ok(true)` when
    /// the request is done already (a `Remove` of what is gone).
    fn check_cap(&self, conn: &ConnHandle, req: &IoRequest, cap: &dafne_proto::Capability) -> Result<bool, Errno> {
        let rights = match req {
            IoRequest::Read { .. } => RIGHT_READ,
            // A writer may know the size of what it writes (a FUSE mount
            // publishes it at close with the writer's own capability).
            IoRequest::Stat { .. } if cap.rights & RIGHT_WRITE != 0 => RIGHT_WRITE,
            IoRequest::Stat { .. } | IoRequest::ServerInfo { .. } => RIGHT_READ,
            _ => RIGHT_WRITE,
        };
        if !self.secret.verify_cap(cap, cap.object_id, rights, SystemTime::now()) {
            return Err(Errno::EACCES);
        }
        if !matches!(req, IoRequest::Revoke { .. } | IoRequest::ServerInfo { .. }) {
            if let Err(why) = self.floors.borrow().check(cap) {
                // Removing what is gone already is done (the reclaimer retries).
                if matches!((req, why), (IoRequest::Remove { .. }, Refusal::Removed { .. })) {
                    return Ok(true);
                }
                tracing::debug!("refused on connection {}: {why}", conn.id());
                return Err(Errno::ESTALE);
            }
        }
        Ok(false)
    }

    /// What a request whose keys follow does while it waits for them, in
    /// the `unifier` mode: its first batch's missing units read from
    /// storage into the cache ([`Unifier::prefetch_with_ahead`], which
    /// holds nothing when it returns), the units a write covers only in
    /// part included (a write fills them first). Best effort: what cannot
    /// be had now is filled by the acquisition after the keys came.
    fn prepare(&self, req: &IoRequest, object: u64) {
        let Backend::Unifier(u) = &self.backend else { return };
        let (extents, write) = match req {
            IoRequest::Read { extents, .. } => (extents, false),
            IoRequest::Write { extents, .. } => (extents, true),
            _ => return,
        };
        let Ok(work) = cut(u, object, extents) else { return };
        let unit = u.unit_size_for(object);
        let indices: Vec<u64> = work
            .iter()
            .take(Self::batch_units(u, object))
            .filter(|w| !write || w.span() != (0..unit) || !w.covers_span())
            .map(|w| w.unit_index)
            .filter(|&i| !u.is_cached(object, i))
            .collect();
        if !indices.is_empty() {
            u.prefetch_with_ahead(object, &indices, &[]);
        }
    }

    /// Io op `Keys`: delivers keys to the request parked under the tag.
    fn deliver_keys(&self, conn: &ConnHandle, tag: u64, keys: Vec<Vec<u8>>) -> Result<IoResponse, Errno> {
        let Some(p) = self.parked.borrow_mut().remove(&(conn.id(), tag)) else {
            tracing::debug!("connection {}: keys for tag {tag}, which no request waits for", conn.id());
            return Err(self.refuse_frrwp(Errno::ENOENT));
        };
        if keys.len() != usize::from(p.count) {
            // Dropping the sender fails the waiting request too.
            return Err(self.refuse_frrwp(Errno::EINVAL));
        }
        p.tx.send(keys).map_err(|_| self.refuse_frrwp(Errno::ENOENT))?;
        Ok(IoResponse::Done)
    }

    /// The Unifier, in the `unifier` mode.
    pub fn unifier(&self) -> Option<&Unifier> {
        match &self.backend {
            Backend::Unifier(u) => Some(u),
            Backend::Direct(_) => None,
        }
    }

    pub fn stats(&self) -> ServingStats {
        let storage = self.store.stats();
        let ops = *self.ops.borrow();
        let lease = self.lease_stats();
        match &self.backend {
            Backend::Unifier(u) => ServingStats { ops, mode: ModeStats::default(), unifier: u.stats(), storage, lease },
            Backend::Direct(d) => ServingStats { ops, mode: d.stats(), unifier: Default::default(), storage, lease },
        }
    }

    /// The serving mode, the data directory's file system and the cache size.
    pub fn capacity(&self) -> (ServingMode, Capacity) {
        // Asked on every metrics page and status: a failure is warned of
        // once, and again only after statvfs worked in between.
        static FAILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let (capacity_bytes, available_bytes, filesystem_id) = match self.store.capacity() {
            Ok(c) => {
                FAILING.store(false, std::sync::atomic::Ordering::Relaxed);
                c
            }
            Err(e) => {
                if !FAILING.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!("statvfs of the data directory failed: {e} (capacity shown as 0; warned once)");
                }
                (0, 0, 0)
            }
        };
        let (mode, cache_bytes) = match &self.backend {
            Backend::Unifier(un) => {
                let c = un.config();
                (ServingMode::Unifier, ((c.ready_slabs + c.raw_slabs) * c.slab_size) as u64)
            }
            Backend::Direct(d) => (d.mode(), d.cache_bytes()),
        };
        (mode, Capacity { capacity_bytes, available_bytes, filesystem_id, cache_bytes })
    }

    /// Refuses every request from now on (the server is stopping).
    pub fn drain(&self) {
        self.draining.set(true);
    }

    /// Dirty bytes in the cache (0 in the normal and mmap modes).
    pub fn dirty_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Unifier(u) => u.stats().dirty_bytes,
            Backend::Direct(_) => 0,
        }
    }

    /// Writes back every dirty unit and syncs every open object.
    pub async fn flush_all(&self) -> Result<(), String> {
        if let Backend::Unifier(u) = &self.backend {
            u.flush_all().await.map_err(|e| e.to_string())?;
        }
        self.store.sync_all().map_err(|e| e.to_string())
    }

    /// Capacity and counters, for `statfs` and `dafne status`.
    fn server_info(&self, conn: &ConnHandle) -> dafne_proto::ServerInfo {
        let ServingStats { mode: m, unifier: u, .. } = self.stats();
        let (mode, Capacity { capacity_bytes, available_bytes, filesystem_id, cache_bytes }) = self.capacity();
        let t = conn.transport_stats();
        dafne_proto::ServerInfo {
            capacity_bytes,
            available_bytes,
            mode: match mode {
                ServingMode::Normal => 0,
                ServingMode::Mmap => 1,
                ServingMode::Unifier => 2,
            },
            cache_bytes,
            dirty_bytes: u.dirty_bytes,
            hits: u.hits + m.hits,
            misses: u.misses + m.misses,
            evictions: u.evictions + m.evictions,
            writebacks: u.writebacks,
            bytes_copied: u.bytes_copied + m.bytes_copied,
            registrations: u.registrations + m.registrations,
            startup_registrations: u.startup_registrations + m.startup_registrations,
            requests_served: t.requests_served,
            requests_in_flight: t.requests_in_flight,
            connections_accepted: t.connections_accepted,
            filesystem_id,
            retired_units: u.retired_units,
            units_4k: u.units_by_class[0],
            units_8k: u.units_by_class[1],
            units_16k: u.units_by_class[2],
            units_32k: u.units_by_class[3],
            units_64k: u.units_by_class[4],
            clock_units: u.clock_units,
            pinned_bytes: u.pinned_bytes,
            deregistrations: u.deregistrations,
            pinned_peak: u.pinned_peak,
            parked_units: u.parked_units,
            frrwp_requests: self.frrwp_served.get(),
            frrwp_refused: self.frrwp_refused.get(),
            frrwp_parked: self.parked.borrow().len() as u64,
            checksum_errors: self.store.stats().checksum_errors,
            lease: match &self.lease {
                None => dafne_proto::LEASE_NONE,
                Some(l) => l.state(),
            },
            chains: self.lease.as_ref().map(|l| l.chains()).unwrap_or_default(),
        }
    }

    async fn handle(self: Rc<Self>, req: TRequest) -> Vec<u8> {
        let (env, request) = match dafne_proto::io::decode_io_request(&req.payload) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("undecodable io request from connection {}: {e}", req.conn.id());
                self.ops.borrow_mut().undecodable += 1;
                return dafne_proto::io::encode_io_reply(0, dafne_proto::io::IoOp::Stat, &Err(Errno::EPROTO));
            }
        };
        let op = request.op();
        let result = if self.draining.get() { Err(Errno::EAGAIN) } else { self.serve(&req.conn, request, env).await };
        self.ops.borrow_mut().record(op, &result);
        dafne_proto::io::encode_io_reply(env.tag, op, &result)
    }

    /// Io op `Login`: proven as meta's `SessionOpen`, with the cluster
    /// secret or the key it derives for the credential presented
    /// (`dafne_auth`'s crate docs, "Credentials"). It keys the connection's
    /// frames with the key it was verified with (so a token seen on the
    /// wire is worthless) and keeps the connection past the login deadline.
    /// Once per connection. Io servers keep no list of revoked credentials
    /// (meta does): a login only keeps the connection and allows
    /// `ServerInfo`; data needs capabilities, which meta issues.
    fn log_in(
        &self,
        conn: &ConnHandle,
        client_name: &str,
        nonce: &[u8; 16],
        mac: &[u8; 32],
        credential: Option<&dafne_proto::Credential>,
    ) -> Result<IoResponse, Errno> {
        let refused = |why: String| {
            let now = std::time::Instant::now();
            if self.login_warned.get().is_none_or(|t| now.duration_since(t) >= LOGIN_WARN_EVERY) {
                self.login_warned.set(Some(now));
                tracing::warn!(
                    "refused a login by {client_name:?} on connection {}: {why} (at most one such warning per {}s)",
                    conn.id(),
                    LOGIN_WARN_EVERY.as_secs()
                );
            }
            Err(Errno::EACCES)
        };
        if conn.has_frame_keys() {
            return refused("the connection has logged in already".into());
        }
        let key = self.secret.login_key(credential);
        if !key.verify_session(conn.token(), nonce, client_name, mac) {
            return refused(match credential {
                Some(c) => format!(
                    "the key of credential {:?} does not match its policy (edited, or issued by another cluster?)",
                    c.name
                ),
                None => "its MAC is not made with this server's secret; a client with another secret file?".into(),
            });
        }
        conn.set_frame_keys(key.frame_keys(conn.token(), nonce));
        conn.authenticated();
        if credential.is_none() {
            self.root_conns.borrow_mut().insert(conn.id());
        }
        Ok(IoResponse::Done)
    }

    /// One slice of a scrub (`dafne_proto::io` module docs, "Scrub"): reads
    /// at most [`dafne_proto::io::SCRUB_SLICE_BYTES`] of the stored objects
    /// from `(object, offset)` on, from the device, and verifies every
    /// block. An object's write-backs in flight are waited for first (the
    /// background writer's data and checksum are then both in the files).
    /// A slice is bounded by bytes, by [`SCRUB_SLICE_OBJECTS`] and by
    /// [`SCRUB_SLICE_TIME`] too, so that serving goes on between slices
    /// whatever the objects (thousands of tiny ones, huge sparse ones: holes
    /// are not read, `ChunkStore::scrub_part`). The object list is made at
    /// a scrub's first slice and kept for the next ones (objects created
    /// meanwhile are checked by the next scrub).
    async fn scrub(&self, object: u64, offset: u64) -> Result<ScrubSlice, Errno> {
        let mut out = ScrubSlice::default();
        let mut budget = SCRUB_SLICE_BYTES;
        let deadline = std::time::Instant::now() + SCRUB_SLICE_TIME;
        if (object, offset) == (0, 0) || self.scrub_list.borrow().is_empty() {
            *self.scrub_list.borrow_mut() = self.store.objects().map_err(eio("scrub: listing the objects"))?;
        }
        let list = self.scrub_list.borrow().clone();
        let from = list.partition_point(|&o| o < object);
        for (done, &o) in list[from..].iter().enumerate() {
            if budget == 0 || (done > 0 && (done >= SCRUB_SLICE_OBJECTS || std::time::Instant::now() >= deadline)) {
                out.next = Some((o, 0));
                break;
            }
            let start = if o == object { offset - offset % crate::sums::BLOCK } else { 0 };
            if let Backend::Unifier(u) = &self.backend {
                u.quiesce(o).await;
            }
            let Some(part) = self.store.scrub_part(o, start, budget, deadline).map_err(eio("scrub: reading"))? else {
                continue; // removed meanwhile
            };
            for b in part.bad {
                if out.bad.len() < MAX_SCRUB_BAD {
                    out.bad.push((b.object, b.offset));
                } else {
                    out.more_bad += 1;
                }
            }
            out.bytes += part.read;
            budget = budget.saturating_sub(part.read);
            if part.end < part.size {
                out.next = Some((o, part.end));
                break;
            }
            out.objects += 1;
            if !part.verified {
                out.unverified += 1;
            }
        }
        Ok(out)
    }

    async fn serve(&self, conn: &ConnHandle, mut req: IoRequest, env: Envelope) -> Result<IoResponse, Errno> {
        let chain = env.chain;
        let cap = match &mut req {
            IoRequest::Login { client_name, nonce, mac, credential } => {
                return self.log_in(conn, client_name, nonce, mac, credential.as_ref())
            }
            // Every other request needs a logged-in connection, whose
            // frames are authenticated (module docs of `dafne_proto::io`,
            // "Login").
            _ if !conn.has_frame_keys() => return Err(Errno::EACCES),
            // A logged-in connection asks about the server without a
            // capability (a client with a credential cannot sign one).
            IoRequest::ServerInfo { .. } => {
                injected_panic();
                return Ok(IoResponse::ServerInfo(Box::new(self.server_info(conn))));
            }
            IoRequest::Keys { tag, keys } => return self.deliver_keys(conn, *tag, std::mem::take(keys)),
            // Only a login with the cluster secret may scrub (it reads
            // every object); its capability is not checked.
            IoRequest::Scrub { object, offset, .. } => {
                if !self.root_conns.borrow().contains(&conn.id()) {
                    return Err(Errno::EACCES);
                }
                return self.scrub(*object, *offset).await.map(IoResponse::Scrubbed);
            }
            other => *other.cap().ok_or(Errno::EPROTO)?,
        };
        // The lease first (module docs, "Lease"): nothing of a refused
        // request is done. `Revoke` only makes the server refuse more.
        if !matches!(req, IoRequest::Revoke { .. }) {
            self.check_lease()?;
        }
        // Then the chain's version (`crate::chaincheck`; only the ops that
        // carry one have one: the decoder refuses it on others): refused
        // before anything of the request is done.
        if let Err(r) = self.check_chain(chain) {
            return Ok(IoResponse::ChainRefused(r));
        }
        // Then where the request goes on to (chain writes, `crate::forward`):
        // refused here too before anything is done.
        let next = match self.route(conn, req.op(), chain, env.forwarded)? {
            Ok(next) => next,
            Err(r) => return Ok(IoResponse::ChainRefused(r)),
        };
        if self.check_cap(conn, &req, &cap)? {
            return Ok(IoResponse::Done);
        }
        let object = cap.object_id;
        // Forwarded as they are once done here (not `Write`, whose forward
        // names this server's units: `Self::write`).
        let again = matches!(req, IoRequest::Truncate { .. } | IoRequest::Sync { .. } | IoRequest::Allocate { .. })
            .then(|| req.clone())
            .filter(|_| next.is_some());
        if let (
            Backend::Unifier(u),
            IoRequest::Read { .. } | IoRequest::Write { .. } | IoRequest::Truncate { .. } | IoRequest::Allocate { .. },
        ) = (&self.backend, &req)
        {
            apply_advice(u, object, cap.advice);
        }
        let store = &*self.store;
        // A damaged object's cached bytes are not what the device holds
        // (`chunk` module docs, "A sync that fails"): no read answers.
        if matches!(req, IoRequest::Read { .. }) && store.is_damaged(object) {
            return Err(Errno::EIO);
        }
        // Keys that follow (module docs): parked now, before anything is
        // awaited; prepared holding nothing; then, once the keys are here
        // and checked, the capability checked again (it may have been
        // revoked meanwhile) and the request served exactly as one that
        // carried its keys.
        let mut followed = None;
        if let IoRequest::Read { keys_follow, extents, .. } | IoRequest::Write { keys_follow, extents, .. } = &mut req {
            if let Some(f) = keys_follow.take() {
                if extents.len() > FOLLOW_MAX_EXTENTS {
                    return Err(self.refuse_frrwp(Errno::EINVAL));
                }
                let mut wait = self.park(conn, f)?;
                self.prepare(&req, object);
                let raw = wait.wait().await?;
                drop(wait);
                // The lease may have lapsed, or the chain changed, while
                // it waited: refused before any unit is taken.
                self.check_lease()?;
                if let Err(r) = self.check_chain(chain) {
                    return Ok(IoResponse::ChainRefused(r));
                }
                if self.check_cap(conn, &req, &cap)? {
                    return Ok(IoResponse::Done);
                }
                if let IoRequest::Read { keys, extents, .. } | IoRequest::Write { keys, extents, .. } = &mut req {
                    let checked = crate::modes::remote_keys(conn, &raw, extents).map_err(|e| self.refuse_frrwp(e))?;
                    self.frrwp_served.set(self.frrwp_served.get() + 1);
                    *keys = raw;
                    followed = Some(checked);
                }
            }
        }
        // The keys of a Read or Write, checked before anything is read or
        // written (those that followed, above).
        let mut rkeys = |keys: &[Vec<u8>], extents: &[dafne_proto::io::IoExtent]| match followed.take() {
            Some(k) => Ok(k),
            None => crate::modes::remote_keys(conn, keys, extents),
        };
        let result = match (req, &self.backend) {
            (IoRequest::Read { keys, extents, inline_reply, .. }, Backend::Unifier(u)) => {
                let rkeys = rkeys(&keys, &extents)?;
                let work = cut(u, object, &extents)?;
                self.read(conn, u, object, &rkeys, work, inline_reply).await
            }
            (IoRequest::Read { keys, extents, inline_reply, .. }, Backend::Direct(d)) => {
                d.read(conn, object, &keys, &extents, inline_reply).await
            }
            (IoRequest::Write { keys, extents, stability, inline, .. }, backend) => {
                // Past what a chunk file can hold: refused before anything
                // is cached (it would fail only at write-back).
                for e in &extents {
                    store.check_fits(e.offset, e.len.into())?;
                }
                let bytes = extents.iter().map(|e| e.len as u64).sum();
                let fwd = match (next, &self.forwarder) {
                    (Some(addr), Some(f)) => Some(Forward { f, addr, cap, chain }),
                    _ => None,
                };
                match backend {
                    Backend::Unifier(u) => {
                        let rkeys = rkeys(&keys, &extents)?;
                        let work = cut(u, object, &extents)?;
                        self.write(conn, u, object, &rkeys, work, &inline, stability, fwd.as_ref()).await?
                    }
                    // Chain writes need the cache's registered units.
                    Backend::Direct(_) if fwd.is_some() => {
                        tracing::warn!("a chain write to forward in a serving mode without the Unifier: refused");
                        return Err(Errno::EOPNOTSUPP);
                    }
                    Backend::Direct(d) => d.write(conn, object, &keys, &extents, &inline, stability).await?,
                }
                if env.forwarded {
                    if let Some(f) = &self.forwarder {
                        f.received(bytes);
                    }
                }
                Ok(IoResponse::Write { bytes })
            }
            (IoRequest::Sync { .. }, backend) => {
                match backend {
                    // The flush ends with the object's sync (one: a second
                    // found nothing more to make durable and made every
                    // client's fsync wait for two device syncs).
                    Backend::Unifier(u) => u.flush(object).await.map_err(storage_errno("flush"))?,
                    // Off the loop (`chunk` module docs, "Syncs off the loop").
                    Backend::Direct(_) => dafne_unifier::Storage::sync_later(store, object)
                        .await
                        .map_err(crate::modes::io_errno("sync"))?,
                }
                Ok(IoResponse::Done)
            }
            // Every chunk file of the object takes the file's size.
            (IoRequest::Truncate { size, .. }, _) if store.check_fits(size, 0).is_err() => Err(Errno::EFBIG),
            (IoRequest::Truncate { size, .. }, Backend::Unifier(u)) => {
                u.truncate(object, size).await.map_err(eio("truncate (cache)"))?;
                store.truncate(object, size).map_err(eio("truncate"))?;
                Ok(IoResponse::Done)
            }
            (IoRequest::Truncate { size, .. }, Backend::Direct(d)) => {
                d.truncate(object, size).await?;
                Ok(IoResponse::Done)
            }
            (IoRequest::Allocate { offset, len, mode, stripes, .. }, backend) => {
                // Zeroed bytes leave the cache first, and the file changes
                // on this same turn of the loop (`crate::allocate`). The
                // comparison modes cache in the page cache, which the punch
                // itself keeps coherent.
                if let (true, Backend::Unifier(u)) = (mode.zeroes(), backend) {
                    u.zero_range(object, offset, len).await.map_err(eio("fallocate (cache)"))?;
                }
                store.fallocate(object, offset, len, mode, &stripes).map_err(crate::allocate::errno("fallocate"))?;
                Ok(IoResponse::Done)
            }
            (IoRequest::Remove { .. }, backend) => {
                // The tombstone first: from here no capability reaches the
                // object, so nothing re-creates it once its data is gone.
                self.floors.borrow_mut().remove(object, cap.generation);
                match backend {
                    Backend::Unifier(u) => {
                        // A write-back still in flight would recreate the file.
                        u.quiesce(object).await;
                        u.remove(object)
                    }
                    Backend::Direct(d) => d.remove(object),
                }
                store.remove(object).map_err(eio("remove"))?;
                Ok(IoResponse::Done)
            }
            (IoRequest::Revoke { batch, .. }, _) => {
                if !self.secret.verify_revocations(&batch) {
                    tracing::warn!("revocations not signed by meta, from connection {}", conn.id());
                    return Err(Errno::EACCES);
                }
                let mut floors = self.floors.borrow_mut();
                if !floors.apply(&batch) {
                    tracing::debug!(
                        "revocations {}..{} of meta {} do not follow on",
                        batch.from_seq,
                        batch.to_seq,
                        batch.instance
                    );
                }
                let (instance, seq) = floors.applied();
                Ok(IoResponse::Revoked { instance, seq })
            }
            (IoRequest::Login { .. }, _) => Ok(IoResponse::Done),
            (IoRequest::Keys { .. } | IoRequest::Scrub { .. }, _) => Err(Errno::EPROTO), // answered above
            (IoRequest::ServerInfo { .. }, _) => {
                injected_panic();
                Ok(IoResponse::ServerInfo(Box::new(self.server_info(conn))))
            }
            (IoRequest::Stat { .. }, backend) => {
                // Cached writes count: write them back first.
                if let Backend::Unifier(u) = backend {
                    u.flush(object).await.map_err(eio("flush"))?;
                }
                Ok(IoResponse::Stat { size: store.size(object).map_err(eio("stat"))? })
            }
        };
        // Truncate, Sync and Allocate go on to the next replica once done
        // here (`crate::forward`).
        if let (Ok(_), Some(again)) = (&result, &again) {
            self.forward_done(next, chain, again).await?;
        }
        result
    }

    /// The units to read ahead of `work` when it continues the object's
    /// previous read (a sequential reader), up to [`READ_AHEAD_BYTES`] and
    /// an eighth of the cache, not past the object's end; none otherwise.
    fn read_ahead(&self, unifier: &Unifier, object: u64, work: &[UnitWork]) -> Vec<u64> {
        let (Some(first), Some(last)) = (work.first(), work.iter().map(|w| w.unit_index).max()) else {
            return Vec::new();
        };
        let mut next = self.next_unit.borrow_mut();
        if next.len() >= READ_AHEAD_OBJECTS {
            next.clear();
        }
        let sequential = next.insert(object, last + 1) == Some(first.unit_index);
        if !sequential {
            return Vec::new();
        }
        let unit = unifier.unit_size_for(object).max(1) as u64;
        let c = unifier.config();
        let cache_units = ((c.ready_slabs + c.raw_slabs) * c.slab_size) as u64 / unit;
        let k = (READ_AHEAD_BYTES as u64 / unit).min(cache_units / 8);
        let end = self.store.size(object).unwrap_or(0).div_ceil(unit);
        (last + 1..(last + 1 + k).min(end)).filter(|&i| !unifier.is_cached(object, i)).collect()
    }

    /// Units one request may hold at once: a quarter of the cache, at most
    /// [`UNITS_PER_BATCH`], so that concurrent requests can all progress.
    fn batch_units(unifier: &Unifier, object: u64) -> usize {
        let c = unifier.config();
        let units = c.ready_slabs.saturating_add(c.raw_slabs) * c.slab_size / unifier.unit_size_for(object).max(1);
        (units / 4).clamp(1, UNITS_PER_BATCH)
    }

    #[allow(clippy::too_many_arguments)]
    async fn read(
        &self,
        conn: &ConnHandle,
        unifier: &Unifier,
        object: u64,
        rkeys: &[Rc<dafne_transport::RemoteKey>],
        work: Vec<UnitWork>,
        inline_reply: bool,
    ) -> Result<IoResponse, Errno> {
        let mut data = Vec::new();
        let mut bytes = 0u64;
        let mut ahead = self.read_ahead(unifier, object, &work);
        for batch in work.chunks(Self::batch_units(unifier, object)) {
            // The batch's missing units in one storage submission, with the
            // read-ahead when the request is sequential and must go to
            // storage anyway (the latency is paid once for both).
            let indices: Vec<u64> = batch.iter().map(|w| w.unit_index).collect();
            if indices.iter().any(|&i| !unifier.is_cached(object, i)) {
                unifier.prefetch_with_ahead(object, &indices, &std::mem::take(&mut ahead));
            }
            let mut guards = Vec::with_capacity(batch.len());
            for w in batch {
                guards.push(retry_no_space(|| unifier.read(object, w.unit_index)).await?);
            }
            let mut segs = Vec::new();
            for (w, g) in batch.iter().zip(&guards) {
                for p in &w.pieces {
                    bytes += p.range.len() as u64;
                    match p.remote {
                        Remote::Rma { addr, key } if !inline_reply => segs.push(RmaSeg {
                            local: g.rma_local(p.range.start, p.range.len()),
                            remote_addr: addr,
                            rkey: rkeys[key].clone(),
                        }),
                        _ => {
                            data.extend_from_slice(&g[p.range.clone()]);
                            unifier.record_copy(p.range.len() as u64);
                        }
                    }
                }
            }
            if !segs.is_empty() {
                conn.put(segs).await.map_err(eio("put to client"))?;
            }
        }
        Ok(IoResponse::Read { bytes, data })
    }

    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        conn: &ConnHandle,
        unifier: &Unifier,
        object: u64,
        rkeys: &[Rc<dafne_transport::RemoteKey>],
        work: Vec<UnitWork>,
        inline: &[u8],
        stability: Stability,
        fwd: Option<&Forward<'_>>,
    ) -> Result<(), Errno> {
        let mut written_through = false;
        for batch in work.chunks(Self::batch_units(unifier, object)) {
            // Every early return below aborts the batch's units (a unit not
            // filled from storage is dropped, not saved as written).
            let mut guards = AbortUnlessCommitted(Vec::with_capacity(batch.len()));
            for w in batch {
                let span = w.span();
                // Pieces with holes between them: the unit is filled on a
                // miss, so a hole holds the file's bytes, not the slot's
                // previous unit's.
                let whole = w.covers_span();
                guards.0.push(retry_no_space(|| unifier.write_mode(object, w.unit_index, span.clone(), whole)).await?);
            }
            let mut segs = Vec::new();
            for (w, g) in batch.iter().zip(guards.0.iter_mut()) {
                let base = g.range().start;
                for p in &w.pieces {
                    match p.remote {
                        Remote::Rma { addr, key } => segs.push(RmaSeg {
                            local: g.rma_local(p.range.start, p.range.len()),
                            remote_addr: addr,
                            rkey: rkeys[key].clone(),
                        }),
                        Remote::Inline { at } => {
                            let dst = g.bytes_mut().map_err(eio("unit busy"))?;
                            dst[p.range.start - base..p.range.end - base]
                                .copy_from_slice(&inline[at..at + p.range.len()]);
                            unifier.record_copy(p.range.len() as u64);
                        }
                    }
                }
            }
            if !segs.is_empty() {
                if let Err(e) = conn.get(segs).await {
                    tracing::warn!("get from client failed: {e}");
                    return Err(Errno::EIO); // `guards` aborts
                }
            }
            // A chain's head (or a middle replica) forwards the batch to
            // the next replica, which gets the bytes from these units by
            // RMA, before committing them (`crate::forward`): a failure
            // aborts them here too.
            if let Some(fwd) = fwd {
                fwd.send(batch, &guards.0, stability).await?;
            }
            // Committed: what arrived is the units' content now. A stable
            // write writes each unit through and releases it; one sync of
            // the object, below, covers them all.
            for g in std::mem::take(&mut guards.0) {
                if stability == Stability::Unstable {
                    drop(g);
                } else {
                    g.commit_through().map_err(storage_errno("write-through"))?;
                    written_through = true;
                }
            }
        }
        if written_through {
            unifier.sync(object).await.map_err(storage_errno("write-through"))?;
        }
        Ok(())
    }
}

/// Acquires a unit, waiting out `NoSpace` (every unit held by requests in
/// flight) a bounded number of times: "no buffer, retry" on the server,
/// never a failure the client sees for a transient shortage.
/// Gives the Unifier the file's cache advice that the capability carries
/// (meta put it there from the file's `user.dafne.cache` attribute at
/// open), when it differs from what the Unifier holds for the object: so
/// every io server of the stripe follows the advice of the latest open it
/// sees requests of. A new unit size drops the object's cached units (dirty
/// ones written back first); while any of them is in use the change waits
/// for a later request (`Busy`), and the request is served with the advice
/// in force. Past `MAX_ADVISED_OBJECTS` the object keeps the defaults.
fn apply_advice(u: &Unifier, object: u64, advice: dafne_proto::CacheAdvice) {
    let want = dafne_unifier::FileAdvice {
        unit_size: advice.unit_bytes(),
        policy: match advice.policy {
            dafne_proto::CachePolicy::Default => None,
            dafne_proto::CachePolicy::Lru => Some(dafne_unifier::Policy::Lru),
            dafne_proto::CachePolicy::Clock => Some(dafne_unifier::Policy::Clock),
        },
    };
    if u.file_advice(object) == want {
        return;
    }
    if let Err(e) = u.set_file_advice(object, want) {
        tracing::debug!("advice {advice} for object {object} not applied now: {e}");
    }
}

async fn retry_no_space<T, F>(mut acquire: impl FnMut() -> F) -> Result<T, Errno>
where
    F: Future<Output = dafne_unifier::Result<T>>,
{
    for _ in 0..10_000 {
        match acquire().await {
            Ok(g) => return Ok(g),
            Err(dafne_unifier::Error::NoSpace { .. }) => {
                dafne_transport::sleep(std::time::Duration::from_micros(200)).await
            }
            Err(e) => return Err(storage_errno("cache")(e)),
        }
    }
    Err(Errno::EAGAIN)
}

/// Cuts extents into per-unit pieces, grouped by unit: one request takes
/// each unit once (a task waiting for a unit it already holds would wait
/// forever), whatever the order or overlap of its extents.
fn cut(unifier: &Unifier, object: u64, extents: &[dafne_proto::io::IoExtent]) -> Result<Vec<UnitWork>, Errno> {
    let unit = unifier.unit_size_for(object);
    let mut work: Vec<UnitWork> = Vec::new();
    let mut index: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut inline_at = 0usize;
    for e in extents {
        for s in spans(unit, e.offset, e.len as u64) {
            let remote = if e.key == NO_KEY {
                Remote::Inline { at: inline_at + s.buf_offset as usize }
            } else {
                Remote::Rma { addr: e.addr + s.buf_offset, key: e.key as usize }
            };
            let i = *index.entry(s.unit_index).or_insert_with(|| {
                work.push(UnitWork { unit_index: s.unit_index, pieces: Vec::new() });
                work.len() - 1
            });
            work[i].pieces.push(Piece { range: s.range, remote });
        }
        if e.key == NO_KEY {
            inline_at += e.len as usize;
        }
    }
    Ok(work)
}

/// Where a write goes on to (`crate::forward`): the forwarder, the
/// successor's address, and what the forwarded requests carry of the
/// client's (its capability, the chain and version it was checked with).
struct Forward<'a> {
    f: &'a crate::forward::Forwarder,
    addr: std::net::SocketAddr,
    cap: dafne_proto::Capability,
    chain: Option<dafne_proto::ChainVersion>,
}

impl Forward<'_> {
    /// Forwards one batch: each piece as an extent of the unit that holds
    /// its bytes now, keyed by its slab's key; in as many requests as the
    /// limits on keys and extents per request need, one after another.
    async fn send(
        &self,
        batch: &[UnitWork],
        guards: &[dafne_unifier::WriteGuard],
        stability: Stability,
    ) -> Result<(), Errno> {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let mut slabs: Vec<u64> = Vec::new();
        let mut extents: Vec<IoExtent> = Vec::new();
        for (w, g) in batch.iter().zip(guards) {
            for p in &w.pieces {
                let (addr, slab) = g.export(p.range.start);
                let key = match slabs.iter().position(|&a| a == slab.addr()) {
                    Some(k) => k,
                    None => {
                        if keys.len() == MAX_IO_KEYS {
                            self.flush(&mut keys, &mut slabs, &mut extents, stability).await?;
                        }
                        keys.push(self.f.key_of(&slab)?);
                        slabs.push(slab.addr());
                        keys.len() - 1
                    }
                };
                extents.push(IoExtent {
                    offset: g.object_offset() + p.range.start as u64,
                    len: p.range.len() as u32,
                    key: key as u16,
                    addr,
                });
                if extents.len() == MAX_IO_EXTENTS {
                    self.flush(&mut keys, &mut slabs, &mut extents, stability).await?;
                }
            }
        }
        self.flush(&mut keys, &mut slabs, &mut extents, stability).await
    }

    async fn flush(
        &self,
        keys: &mut Vec<Vec<u8>>,
        slabs: &mut Vec<u64>,
        extents: &mut Vec<IoExtent>,
        stability: Stability,
    ) -> Result<(), Errno> {
        if extents.is_empty() {
            keys.clear();
            slabs.clear();
            return Ok(());
        }
        let bytes = extents.iter().map(|e| u64::from(e.len)).sum();
        let req = IoRequest::Write {
            cap: self.cap,
            keys: std::mem::take(keys),
            extents: std::mem::take(extents),
            stability,
            inline: Vec::new(),
            keys_follow: None,
        };
        slabs.clear();
        let env = Envelope { chain: self.chain, ..Envelope::new(0, 0, 0) };
        self.f.forward(self.addr, env, &req, bytes).await
    }
}

/// A write's unit guards, aborted ([`dafne_unifier::WriteGuard::abort`])
/// unless taken out to commit: a guard dropped as is saves its range as
/// written, which for a unit not filled from storage would expose the
/// slot's previous bytes (another object's) if nothing arrived.
struct AbortUnlessCommitted(Vec<dafne_unifier::WriteGuard>);

impl Drop for AbortUnlessCommitted {
    fn drop(&mut self) {
        for g in self.0.drain(..) {
            g.abort();
        }
    }
}

/// A parked request's wait for its keys; leaves the parked table when
/// dropped (answered, failed or timed out).
struct KeyWait<'a> {
    svc: &'a IoService,
    id: (u32, u64),
    serial: u64,
    /// The keys deadline, from when the request was parked.
    deadline: std::time::Instant,
    rx: Option<oneshot::Receiver<Vec<Vec<u8>>>>,
}

impl KeyWait<'_> {
    async fn wait(&mut self) -> Result<Vec<Vec<u8>>, Errno> {
        let rx = self.rx.take().ok_or(Errno::EPROTO)?;
        let sleep = dafne_transport::sleep(self.deadline.saturating_duration_since(std::time::Instant::now()));
        match futures::future::select(rx, std::pin::pin!(sleep)).await {
            futures::future::Either::Left((Ok(keys), _)) => Ok(keys),
            // The `Keys` had the wrong count (counted there), or the
            // connection is gone (`forget_connection`: nobody reads the
            // answer).
            futures::future::Either::Left((Err(oneshot::Canceled), _)) => Err(Errno::EINVAL),
            futures::future::Either::Right(_) => {
                tracing::debug!("connection {}: keys for tag {} never came", self.id.0, self.id.1);
                Err(self.svc.refuse_frrwp(Errno::ETIMEDOUT))
            }
        }
    }
}

impl Drop for KeyWait<'_> {
    fn drop(&mut self) {
        // Only its own entry: the tag may have been delivered to and then
        // reused by a later request of the connection.
        let mut p = self.svc.parked.borrow_mut();
        if p.get(&self.id).is_some_and(|e| e.serial == self.serial) {
            p.remove(&self.id);
        }
    }
}

/// The pieces of one request that fall in one unit.
struct UnitWork {
    unit_index: u64,
    pieces: Vec<Piece>,
}

impl UnitWork {
    /// The unit range a writer must hold: from the first to the last byte
    /// any piece touches.
    fn span(&self) -> std::ops::Range<usize> {
        let start = self.pieces.iter().map(|p| p.range.start).min().unwrap_or(0);
        let end = self.pieces.iter().map(|p| p.range.end).max().unwrap_or(0);
        start..end
    }

    /// Whether the pieces together write every byte of [`Self::span`]
    /// (no hole between them).
    fn covers_span(&self) -> bool {
        let mut r: Vec<std::ops::Range<usize>> = self.pieces.iter().map(|p| p.range.clone()).collect();
        r.sort_by_key(|x| x.start);
        let mut end = match r.first() {
            Some(x) => x.start,
            None => return true,
        };
        for x in r {
            if x.start > end {
                return false;
            }
            end = end.max(x.end);
        }
        true
    }
}

/// `Service` for an `Rc<IoService>`.
#[derive(Debug, Clone)]
pub struct IoHandler(pub Rc<IoService>);

impl Service for IoHandler {
    fn call(&self, req: TRequest) -> Pin<Box<dyn Future<Output = Vec<u8>>>> {
        let svc = self.0.clone();
        Box::pin(async move { svc.handle(req).await })
    }

    fn disconnected(&self, conn_id: u32) {
        self.0.forget_connection(conn_id);
    }
}

/// Fault injection for the test that a panicking handler takes the whole
/// server down (so its supervisor restarts it) instead of leaving a live
/// process that answers nothing: a panic cannot be caused from outside
/// otherwise. If `DAFNE_FAULT_PANIC_ONCE` names a file that exists, the
/// next `ServerInfo` removes it and panics (once per file; nothing happens
/// without the variable).
fn injected_panic() {
    if let Some(flag) = std::env::var_os("DAFNE_FAULT_PANIC_ONCE") {
        if std::fs::remove_file(&flag).is_ok() {
            panic!("injected fault: {flag:?} asked this handler to panic");
        }
    }
}
