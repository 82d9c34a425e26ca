//! The metadata server on dafne's transport.
//!
//! Requests are decoded on the loop thread (hostile bytes get `EPROTO`),
//! checked against the connection's session, and handed to one store
//! thread that executes whatever has queued up as a single batch: one
//! commit, one fsync, for all concurrent clients (group commit). Read-only
//! batches are executed without a commit.
//!
//! The store thread also keeps the table of open files ([`crate::opens`])
//! in step with the store: it reserves room for a job's opens before the
//! batch runs and records the opens made before it runs the next batch, and
//! it runs `ListOrphans` after the other jobs of its batch with the set of
//! objects held open then. So an open acknowledged to a client is in the
//! table before any later `ListOrphans` runs. `Close` and `Reopen` change
//! only the table and are answered on the loop thread; so is the end of a
//! session, which the transport reports (`Service::disconnected`).
//!
//! # Who a request acts as
//! A session is opened with the cluster secret (a fully trusted client:
//! every request acts as the uid, gid and groups it states) or with a
//! per-client credential (`dafne_auth`'s crate docs, "Credentials"), whose
//! policy the session keeps. Each request of a credential session acts as
//! [`dafne_auth::enforce`] says: uid 0 squashed to nobody/nogroup (65534,
//! no supplementary groups) unless the credential grants root; any other
//! uid outside the credential's uid ranges, or a primary gid outside its
//! gid ranges, refused with `EPERM`; supplementary groups outside the gid
//! ranges dropped. The cluster's own ops (ListOrphans, ForgetOrphans,
//! Revocations, RevokeCredential, ServerHeartbeat) are refused with `EPERM`
//! to credential sessions, root ones included: they are the servers' and
//! the admin's.
//!
//! # Membership
//! `ServerHeartbeat` (a session of the cluster secret, uid 0 only: `EPERM`
//! otherwise) and `Members` (any session) are answered on the loop thread
//! from the table of [`crate::members`], in memory; a task of the loop
//! logs every second the servers whose heartbeats stopped and marks those
//! whose lease lapsed `offline` in their chains; a heartbeat from an
//! `offline` one marks it `serving` again before it is answered with the
//! versions of its chains (`crate::members`, "Acting on a lapsed lease").
//! Either change is written to the store (one transaction, on the loop
//! thread) before meta shows or answers it.
//!
//! # Reads on the loop
//! A job of only `Lookup` and `GetAttr` ops (a stat, a path walk in one
//! compound) is answered on the loop thread from a redb read transaction
//! (`MetaStore::read_now`) instead of the store thread: it needs no commit,
//! touches no open-file table and issues no capability, and a snapshot
//! holds every commit acknowledged so far, so a client that saw its write
//! answered reads it back. It saves the two thread hops (loop → store →
//! loop) that dominated a stat through the mount. The snapshot is read
//! from redb's cache or the page cache; a read that must go to the disk
//! blocks the loop for that read.
//!
//! # Locks
//! Byte-range locks (`Lock`, `TestLock`) never reach the store thread: the
//! table ([`crate::locks`]) lives on the loop thread, in memory. A request
//! that waits is an open call whose answer the loop sends when the lock is
//! granted; while it waits, its task also ends leases that ran out (at
//! least every second), so a dead client's locks pass to a waiter within a
//! second of its lease ending. Leases are also ended at every lock request.
//! The grace after a restart applies only when the previous instance
//! granted locks and did not stop with none held: the first lock an
//! instance grants writes the marker file `locks.held` beside the store
//! (fsynced, once per instance), and an instance that stops with no lock
//! held removes it. So a fresh cluster grants its first lock at once.
//!
//! # Exactly-once
//! A non-idempotent request (`Request::is_exactly_once`) that carries its
//! client's session sequence (`REQUEST_FLAG_SESSION`) is handed to the
//! store with it ([`Job::replay`]); the store answers a retry from its
//! replay cache in the same transaction that would have run it (store
//! docs, "Exactly-once replay cache"). A retry that arrives while its
//! original still runs is queued behind it on the one store thread and so
//! gets the cached answer: no second execution, no in-memory table. Other
//! requests ignore the sequence. A replayed answer passes through the same
//! path as a first one (capabilities signed afresh, opens counted for the
//! connection that asked, changes logged again, which only repeats an
//! invalidation).
//!
//! # Fault injection (tests only)
//! `DAFNE_FAULT_DROP_REPLY=<op>:<n>[:kill],...` (read when the service
//! starts; op names as `Op` prints them, any case) makes the server lose
//! the reply to the `n`-th successful execution of `<op>` after the store
//! committed it: the connection is closed instead of answered, or, with
//! `:kill`, the process aborts on the spot (as `kill -9` right after the
//! commit). Off unless set; it exists for the exactly-once tests
//! (`tests/exactly_once.rs`).
//!
//! Revoked credential names live in the store and, for logins, in memory
//! (loaded at start, added to by `RevokeCredential` once committed): a
//! login under a revoked name is refused with `EKEYREVOKED`, and a
//! revocation ends the name's live sessions (their requests get `EACCES`)
//! and, in the store's transaction, revokes every capability issued so far
//! (the store's `revoke_all`: the credential's holders are not tracked per
//! object, so all are revoked; other clients with opens get theirs
//! re-issued).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, Sender};
use dafne_auth::Secret;
use dafne_proto::{
    decode_request, encode_reply, CompoundOp, Credential, Envelope, Errno, Op, Request, RequestHeader, Response,
    ROOT_INO,
};
use dafne_transport::{Request as TRequest, Service};
use futures::channel::oneshot;

use crate::changes::ChangeLog;
use crate::locks::{LockRequest, LockTable, Outcome, Owner};
use crate::members::Membership;
use crate::opens::OpenTable;
use crate::store::{Cred, Job, JobResult, MetaStore, StoreError};

/// Largest number of client requests executed in one commit.
pub const MAX_BATCH: usize = 256;

/// One client request for the store thread.
struct Work {
    job: Job,
    /// The connection (session) that sent it: whose opens it makes.
    conn: u32,
    reply: oneshot::Sender<Result<JobResult, String>>,
}

type Opens = Arc<Mutex<OpenTable>>;

fn lock(opens: &Opens) -> MutexGuard<'_, OpenTable> {
    // The table is plain counts; a panic elsewhere leaves it usable.
    opens.lock().unwrap_or_else(|p| p.into_inner())
}

/// Executes `jobs` as one batch; if the batch fails, each job alone, so
/// that one bad job does not fail its neighbours (only it gets EIO).
fn execute(store: &dyn MetaStore, jobs: &[Job]) -> Vec<Result<JobResult, String>> {
    match store.execute(jobs) {
        Ok(results) => results.into_iter().map(Ok).collect(),
        Err(e) if jobs.len() > 1 => {
            tracing::warn!("metadata batch of {} failed ({e}): retrying one by one", jobs.len());
            jobs.iter()
                .map(|job| {
                    let r = store.execute(std::slice::from_ref(job)).map_err(|e| e.to_string());
                    r.map(|mut v| v.pop().unwrap_or_default())
                })
                .collect()
        }
        Err(e) => {
            tracing::error!("metadata store failure: {e}");
            jobs.iter().map(|_| Err(e.to_string())).collect()
        }
    }
}

/// Opens a job may make: one per `Open` op.
fn opens_in(job: &Job) -> usize {
    job.ops.iter().filter(|o| matches!(o.req, Request::Open { .. })).count()
}

/// The data objects a job's results opened, with the rights granted.
fn opened_objects(result: &Result<JobResult, String>) -> Vec<(u64, u8)> {
    let Ok(results) = result else { return Vec::new() };
    results
        .iter()
        .filter_map(|r| match r {
            Ok(Response::Opened { layout, cap, .. }) => Some((layout.object_id, cap.rights)),
            _ => None,
        })
        .collect()
}

/// Whether a job is a `ListOrphans` (which never travels in a Compound).
fn is_list_orphans(job: &Job) -> bool {
    matches!(job.ops.as_slice(), [CompoundOp { req: Request::ListOrphans { .. }, .. }])
}

/// One batch: the other jobs first (reserving and recording their opens),
/// then each `ListOrphans` with the objects held open at that point.
fn run_batch(store: &dyn MetaStore, opens: &Opens, batch: Vec<Work>) {
    let (lists, rest): (Vec<Work>, Vec<Work>) = batch.into_iter().partition(|w| is_list_orphans(&w.job));
    let mut runnable = Vec::with_capacity(rest.len());
    {
        let mut table = lock(opens);
        let now = Instant::now();
        for w in rest {
            let n = opens_in(&w.job);
            if n > 0 {
                if let Err(e) = table.reserve(w.conn, n, now) {
                    tracing::debug!("open refused: {e}");
                    let _ = w.reply.send(Ok(vec![Err(e.errno())]));
                    continue;
                }
            }
            runnable.push((w, n));
        }
    }
    if !runnable.is_empty() {
        let jobs: Vec<Job> = runnable.iter().map(|(w, _)| w.job.clone()).collect();
        let results = execute(store, &jobs);
        let mut table = lock(opens);
        for ((w, n), r) in runnable.into_iter().zip(results) {
            if n > 0 {
                table.settle(w.conn, n, &opened_objects(&r));
            }
            let _ = w.reply.send(r);
        }
    }
    for mut w in lists {
        let now = Instant::now();
        let protected = {
            let mut table = lock(opens);
            // Root's question only: anyone else gets the store's EPERM.
            if w.job.cred.uid == 0 && table.in_startup_grace(now) {
                let _ = w.reply.send(Ok(vec![Ok(Response::Orphans { orphans: Vec::new(), generation: 0 })]));
                continue;
            }
            table.protected(now)
        };
        w.job.protected = Some(Arc::new(protected));
        let r = execute(store, std::slice::from_ref(&w.job)).pop().unwrap_or_else(|| Err("no result".into()));
        let _ = w.reply.send(r);
    }
}

/// What the store thread did (the metrics page): read from the loop
/// thread while the store thread counts.
#[derive(Debug, Default)]
struct StoreCounts {
    /// Batches executed (each one transaction: a commit, or none when read-only).
    batches: std::sync::atomic::AtomicU64,
    /// Client jobs in them.
    jobs: std::sync::atomic::AtomicU64,
}

/// Starts the store thread; returns the queue feeding it.
fn start_store_thread(store: Arc<dyn MetaStore>, opens: Opens, counts: Arc<StoreCounts>) -> Sender<Work> {
    let (tx, rx): (Sender<Work>, Receiver<Work>) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("meta-store".into())
        .spawn(move || {
            loop {
                // Lazy commits become durable within their deadline also
                // when no further batch comes (store docs, "Lazy commits").
                let first = match store.lazy_deadline() {
                    None => rx.recv().map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
                    Some(d) => rx.recv_deadline(d),
                };
                let first = match first {
                    Ok(w) => w,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if let Err(e) = store.settle() {
                            tracing::error!("making lazy commits durable: {e}");
                        }
                        continue;
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                };
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(w) => batch.push(w),
                        Err(_) => break,
                    }
                }
                counts.batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                counts.jobs.fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
                run_batch(store.as_ref(), &opens, batch);
            }
        })
        .expect("spawning the metadata store thread");
    tx
}

/// One logged-in connection.
#[derive(Debug)]
struct Session {
    /// The credential it logged in with; `None`: the cluster secret.
    credential: Option<Credential>,
}

/// The metadata service (one per meta server runtime).
pub struct MetaService {
    secret: Secret,
    work: Sender<Work>,
    sessions: RefCell<HashMap<u32, Session>>,
    next_session: Cell<u64>,
    opens: Opens,
    /// Names of revoked credentials (module docs, "Who a request acts as").
    revoked: RefCell<HashSet<String>>,
    /// When a refused session was last logged, and the refusals since: at
    /// most one warning per [`REFUSED_WARN_EVERY`], so a peer without the
    /// secret cannot flood the log.
    refused: Cell<(Option<Instant>, u64)>,
    /// Byte-range locks (module docs, "Locks").
    locks: RefCell<LockTable>,
    /// What other sessions changed, for `Watch` ([`crate::changes`]).
    changes: RefCell<ChangeLog>,
    /// The marker file that says this store's server granted locks (module
    /// docs, "Locks"), and whether this instance has written it.
    lock_marker: Option<(std::path::PathBuf, Cell<bool>)>,
    /// Replies to lose (module docs, "Fault injection").
    faults: Vec<DropReply>,
    /// Requests answered and errors, by op in the order of [`Op::ALL`],
    /// and undecodable requests (the metrics page).
    ops: RefCell<Vec<(u64, u64)>>,
    undecodable: Cell<u64>,
    store: Arc<dyn MetaStore>,
    store_counts: Arc<StoreCounts>,
    /// Which io servers are alive (module docs, "Membership").
    members: RefCell<Membership>,
    /// The chain table (`crate::chains`): as the store's open made it,
    /// then as meta marked io servers offline and back
    /// ([`MetaService::update_chains`]).
    chains: RefCell<Vec<dafne_proto::Chain>>,
}

/// The metadata server's counters, read on its loop thread
/// ([`MetaService::stats`]) for the metrics page.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MetaStats {
    /// `(op, requests answered, of them errors)`, every op of [`Op::ALL`].
    pub ops: Vec<(Op, u64, u64)>,
    pub undecodable: u64,
    /// Sessions logged in now, and opened since start.
    pub sessions: u64,
    pub sessions_opened: u64,
    /// Opens held over all sessions, with those of ended sessions still
    /// protected (`crate::opens`'s units).
    pub open_files: u64,
    /// Byte ranges locked, and lock requests waiting.
    pub locked_ranges: u64,
    pub lock_waiters: u64,
    /// Store batches (one transaction each) and the client jobs in them.
    pub store_batches: u64,
    pub store_jobs: u64,
    /// Transactions committed durably, and without an fsync, if the store
    /// counts them.
    pub commits: Option<u64>,
    pub lazy_commits: Option<u64>,
    /// The io servers as the membership table sees them now.
    pub members: Vec<dafne_proto::Member>,
    /// The chain table (`crate::chains`).
    pub chains: Vec<dafne_proto::Chain>,
}

/// The environment variable of the reply-dropping test hook.
pub const FAULT_DROP_REPLY: &str = "DAFNE_FAULT_DROP_REPLY";

/// One `<op>:<n>[:kill]` of [`FAULT_DROP_REPLY`].
#[derive(Debug)]
struct DropReply {
    op: Op,
    nth: u64,
    kill: bool,
    /// Successful executions of `op` so far.
    seen: Cell<u64>,
}

/// Why [`FAULT_DROP_REPLY`] could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{FAULT_DROP_REPLY}={spec:?}: {why} (expected <op>:<n>[:kill],...)")]
pub struct FaultSpecError {
    spec: String,
    why: String,
}

/// Parses [`FAULT_DROP_REPLY`]'s value.
fn parse_faults(spec: &str) -> Result<Vec<DropReply>, FaultSpecError> {
    let err = |why: String| FaultSpecError { spec: spec.to_string(), why };
    let mut out = Vec::new();
    for item in spec.split(',').filter(|i| !i.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        let (name, n, kill) = match parts.as_slice() {
            [name, n] => (*name, *n, false),
            [name, n, "kill"] => (*name, *n, true),
            _ => return Err(err(format!("{item:?} is not <op>:<n>[:kill]"))),
        };
        let op = Op::ALL
            .iter()
            .copied()
            .find(|op| op.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| err(format!("no op named {name:?}")))?;
        let nth = n.parse::<u64>().ok().filter(|&n| n >= 1).ok_or_else(|| err(format!("{n:?} is not a count ≥ 1")))?;
        out.push(DropReply { op, nth, kill, seen: Cell::new(0) });
    }
    Ok(out)
}

/// Name of the marker file beside the store (module docs, "Locks").
pub const LOCK_MARKER: &str = "locks.held";

/// The longest a waiting lock request sleeps before it ends leases that ran
/// out (a lease may start after the request began waiting).
const LEASE_CHECK: Duration = Duration::from_secs(1);

/// The least time between two warnings about refused sessions.
const REFUSED_WARN_EVERY: Duration = Duration::from_secs(10);

impl std::fmt::Debug for MetaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaService").field("sessions", &self.sessions.borrow().len()).finish()
    }
}

impl MetaService {
    /// `grace`: how long after its start the server lists no orphans, and
    /// how long an ended session's open files stay protected
    /// ([`crate::opens`]).
    /// `revoked`: the names of revoked credentials, from the store
    /// ([`MetaStore::revoked_credentials`]).
    /// `lock_marker`: the directory of the lock marker file (module docs,
    /// "Locks"); `None`: no marker, and no lock grace after a start.
    pub fn new(
        store: Arc<dyn MetaStore>,
        secret: Secret,
        grace: Duration,
        revoked: Vec<String>,
        lock_marker: Option<&std::path::Path>,
    ) -> MetaService {
        let opens = Arc::new(Mutex::new(OpenTable::new(grace, Instant::now())));
        let lock_marker = lock_marker.map(|dir| (dir.join(LOCK_MARKER), Cell::new(false)));
        let lock_grace = match &lock_marker {
            Some((path, _)) if path.exists() => {
                tracing::info!(
                    "the previous instance granted locks ({} exists): only reclaims for the first {grace:?}",
                    path.display()
                );
                grace
            }
            _ => Duration::ZERO,
        };
        let mut locks = LockTable::new(lock_grace, Instant::now());
        locks.set_lease(grace);
        let faults = match std::env::var(FAULT_DROP_REPLY) {
            Ok(spec) => match parse_faults(&spec) {
                Ok(f) => {
                    tracing::warn!("test hook {FAULT_DROP_REPLY}={spec:?} is on: replies will be lost on purpose");
                    f
                }
                Err(e) => {
                    tracing::error!("{e}: the hook stays off");
                    Vec::new()
                }
            },
            Err(_) => Vec::new(),
        };
        let store_counts = Arc::new(StoreCounts::default());
        MetaService {
            ops: RefCell::new(vec![(0, 0); Op::ALL.len()]),
            undecodable: Cell::new(0),
            // At most what a `Members` answer carries, as the membership
            // table (servers beyond it cannot send heartbeats either).
            chains: RefCell::new(store.chains().into_iter().take(dafne_proto::MAX_CHAINS).collect()),
            store: store.clone(),
            store_counts: store_counts.clone(),
            faults,
            locks: RefCell::new(locks),
            changes: RefCell::new(ChangeLog::default()),
            lock_marker,
            secret,
            work: start_store_thread(store, opens.clone(), store_counts),
            sessions: RefCell::new(HashMap::new()),
            next_session: Cell::new(1),
            opens,
            revoked: RefCell::new(revoked.into_iter().collect()),
            refused: Cell::new((None, 0)),
            members: RefCell::new(Membership::new(0)),
        }
    }

    /// The cluster has io servers `0..n` (what the layout policy names):
    /// heartbeats from those only ([`crate::members`]).
    pub fn with_io_servers(self, n: u32) -> MetaService {
        self.members.replace(Membership::new(n));
        self
    }

    /// Every second, while the service lives (spawn it on the service's
    /// loop): logs the io servers whose heartbeats stopped, and marks those
    /// whose lease lapsed a margin ago `offline` in their chains
    /// (`crate::members`, "Acting on a lapsed lease"). Cheap when nothing
    /// changes: one pass over the membership table and one over the chain
    /// table (each at most `MAX_MEMBERS` rows); the store is written only
    /// when a row changes.
    ///
    /// A tick later than [`crate::members::OFFLINE_MARGIN`] past its
    /// second means meta did not run meanwhile (stopped, or its loop
    /// blocked) and heard no heartbeat: it listens a full lease and margin
    /// again before it marks anyone offline
    /// ([`crate::members::Membership::deaf_until`]).
    pub async fn watch_members(service: std::rc::Weak<MetaService>) {
        const TICK: Duration = Duration::from_secs(1);
        let mut last = Instant::now();
        loop {
            dafne_transport::sleep(TICK).await;
            let Some(s) = service.upgrade() else { return };
            let now = Instant::now();
            let gap = now.saturating_duration_since(last);
            last = now;
            let down = {
                let mut members = s.members.borrow_mut();
                if gap > TICK + crate::members::OFFLINE_MARGIN {
                    tracing::warn!(
                        "meta did not run for {:.1} s (stopped, or its loop blocked) and heard no heartbeat \
                         meanwhile: it marks no io server offline before it has listened {} s again",
                        gap.as_secs_f64(),
                        (dafne_proto::MEMBER_LEASE + crate::members::OFFLINE_MARGIN).as_secs()
                    );
                    members.deaf_until(now);
                }
                members.log_lapsed(now);
                members.offline(now)
            };
            let changed = crate::chains::mark_offline(&s.chains.borrow(), &down);
            // A failed write is logged; the next tick tries again.
            let _ = s.update_chains(changed, "its lease from meta lapsed");
        }
    }

    /// Heartbeat `hb` received at `now` from io server `hb.server`
    /// (`crate::members`): refused as the membership table says, else what
    /// it changes in the chains (a return: `serving` again; a new instance:
    /// offline and back in one change, "A restart is a return") is written
    /// first, and only then is the heartbeat recorded and answered with
    /// the versions of the server's chains, which grants its lease. A
    /// write that fails answers `EIO` and records nothing ("A return meta
    /// cannot write"): the io server holds no lease while meta's table
    /// says it does not serve, and its next heartbeat tries again.
    pub fn server_heartbeat(&self, hb: &dafne_proto::Heartbeat, now: Instant) -> Result<Response, Errno> {
        let arrival = self.members.borrow_mut().check(hb, now)?;
        let (changed, why) = match arrival {
            crate::members::Arrival::Restarted => (
                crate::chains::mark_restarted(&self.chains.borrow(), hb.server),
                "it restarted: a new process, offline and back",
            ),
            _ => (crate::chains::mark_back(&self.chains.borrow(), hb.server), "it heartbeats again"),
        };
        if self.update_chains(changed, why).is_err() {
            return Err(Errno::EIO);
        }
        self.members.borrow_mut().record(hb, now);
        Ok(Response::Heartbeat { chains: self.chain_versions(hb.server), routes: self.chain_routes(hb.server, now) })
    }

    /// Writes `changed` rows of the chain table to the store and, once
    /// written, uses them; logs each at info. A failed write is logged at
    /// warn and changes nothing: the caller says what happens then (the
    /// next tick tries again; a heartbeat is answered `EIO`). The write
    /// runs on the loop thread (an fsync), only when a server's state in
    /// its chains changes.
    fn update_chains(&self, changed: Vec<dafne_proto::Chain>, why: &str) -> Result<(), StoreError> {
        if changed.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.store.update_chains(&changed) {
            tracing::warn!("writing a chain change ({why}) to the store: {e} (tried again)");
            return Err(e);
        }
        for c in &changed {
            let servers: Vec<String> =
                c.replicas.iter().map(|r| format!("io-{} {}", r.server, r.state.name())).collect();
            tracing::info!(
                "chain {} is version {} ({}): {} ({why})",
                c.id,
                c.version,
                c.health().name(),
                servers.join(", ")
            );
        }
        crate::chains::replace(&mut self.chains.borrow_mut(), &changed);
        Ok(())
    }

    /// The version of each chain that holds io server `server` (the
    /// answer to its heartbeat).
    fn chain_versions(&self, server: u32) -> Vec<dafne_proto::ChainVersion> {
        self.chains
            .borrow()
            .iter()
            .filter(|c| c.replicas.iter().any(|r| r.server == server))
            .map(|c| dafne_proto::ChainVersion { chain: c.id, version: c.version })
            .collect()
    }

    /// Io server `server`'s place in each chain that holds it, for its
    /// heartbeat's answer (protocol 19, [`dafne_proto::ChainRoute`]):
    /// head when it is the chain's first `serving` replica, and the next
    /// `serving` replica after it as the one it forwards the chain's
    /// writes to (docs/REPLICATION.md, "Writes"), with that server's
    /// address when meta heard it since it started. A replica that is not
    /// `serving` heads nothing and forwards to nobody.
    fn chain_routes(&self, server: u32, now: Instant) -> Vec<dafne_proto::ChainRoute> {
        let members = self.members.borrow().members(now);
        let addr = |s: u32| {
            members.iter().find(|m| m.server == s && m.state != dafne_proto::MemberState::Unknown).map(|m| m.addr)
        };
        self.chains
            .borrow()
            .iter()
            .filter(|c| c.replicas.iter().any(|r| r.server == server))
            .map(|c| route_of(c, server, addr))
            .collect()
    }
}

/// `server`'s route in chain `c` ([`MetaService::chain_routes`]).
fn route_of(
    c: &dafne_proto::Chain,
    server: u32,
    addr: impl Fn(u32) -> Option<std::net::SocketAddr>,
) -> dafne_proto::ChainRoute {
    use dafne_proto::ReplicaState::Serving;
    let serving: Vec<u32> = c.replicas.iter().filter(|r| r.state == Serving).map(|r| r.server).collect();
    let at = serving.iter().position(|&s| s == server);
    let successor = at.and_then(|i| serving.get(i + 1)).map(|&s| dafne_proto::Successor { server: s, addr: addr(s) });
    dafne_proto::ChainRoute { chain: c.id, head: at == Some(0), successor }
}

/// `Service` for an `Rc<MetaService>`.
#[derive(Debug, Clone)]
pub struct MetaHandler(pub Rc<MetaService>);

impl Service for MetaHandler {
    fn call(&self, req: TRequest) -> Pin<Box<dyn Future<Output = Vec<u8>>>> {
        let svc = self.0.clone();
        Box::pin(async move { svc.handle(req).await })
    }

    fn disconnected(&self, conn_id: u32) {
        self.0.sessions.borrow_mut().remove(&conn_id);
        let now = Instant::now();
        lock(&self.0.opens).end_session(conn_id, now);
        self.0.locks.borrow_mut().disconnected(conn_id, now);
        self.0.changes.borrow_mut().disconnected(conn_id);
    }
}

impl Drop for MetaService {
    fn drop(&mut self) {
        // Stopping with no lock held: the next instance needs no grace.
        if let Some((path, _)) = &self.lock_marker {
            let locks = self.locks.get_mut();
            // Not during the grace: clients may not have reclaimed yet.
            if locks.ranges() == 0 && locks.grace_until(Instant::now()).is_none() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl MetaService {
    /// The counters, for the metrics page.
    pub fn stats(&self) -> MetaStats {
        let ops = self.ops.borrow();
        let locks = self.locks.borrow();
        let sc = &self.store_counts;
        MetaStats {
            ops: Op::ALL.iter().zip(ops.iter()).map(|(&op, &(n, e))| (op, n, e)).collect(),
            undecodable: self.undecodable.get(),
            sessions: self.sessions.borrow().len() as u64,
            sessions_opened: self.next_session.get() - 1,
            open_files: lock(&self.opens).units() as u64,
            locked_ranges: locks.ranges() as u64,
            lock_waiters: locks.waiting() as u64,
            store_batches: sc.batches.load(std::sync::atomic::Ordering::Relaxed),
            store_jobs: sc.jobs.load(std::sync::atomic::Ordering::Relaxed),
            commits: self.store.commits(),
            lazy_commits: self.store.lazy_commits(),
            members: self.members.borrow().members(Instant::now()),
            chains: self.chains.borrow().clone(),
        }
    }

    fn count(&self, op: Op, ok: bool) {
        if let Some(i) = Op::ALL.iter().position(|&o| o == op) {
            let c = &mut self.ops.borrow_mut()[i];
            c.0 += 1;
            c.1 += u64::from(!ok);
        }
    }

    async fn handle(self: Rc<Self>, req: TRequest) -> Vec<u8> {
        let (env, request) = match decode_request(&req.payload) {
            Ok(x) => x,
            Err(e) => {
                self.undecodable.set(self.undecodable.get() + 1);
                tracing::warn!("undecodable metadata request from connection {}: {e}", req.conn.id());
                // Echo the tag and op when at least the header made sense.
                let (tag, op) = match RequestHeader::decode(&req.payload) {
                    Ok(h) => (h.tag, h.op),
                    Err(_) => (0, Op::Statfs),
                };
                return encode_reply(tag, op, &Err(Errno::EPROTO));
            }
        };
        let op = request.op();
        let conn = req.conn.id();
        if let Request::SessionOpen { client_name, nonce, mac, credential } = request {
            let result = self.open_session(&req.conn, &client_name, &nonce, &mac, credential);
            self.count(op, result.is_ok());
            return encode_reply(env.tag, op, &result);
        }
        let cred = match self.identity(conn, &env, &request) {
            Ok(c) => c,
            Err(e) => {
                self.count(op, false);
                return encode_reply(env.tag, op, &Err(e));
            }
        };
        let replay = env.session.filter(|_| request.is_exactly_once());
        let result = match request {
            Request::SessionOpen { .. } => Err(Errno::EPROTO), // answered above
            Request::Close { object_id } => {
                lock(&self.opens).close(conn, object_id).map(|()| Response::Done).map_err(|e| e.errno())
            }
            Request::Recap { cap } => self.recap(conn, cred, cap).await,
            Request::Reopen { held } => match lock(&self.opens).reopen(conn, &held, Instant::now()) {
                Ok(()) => Ok(Response::Done),
                Err(e) => {
                    tracing::warn!("reopen refused: {e}");
                    Err(e.errno())
                }
            },
            Request::Compound { ops } => {
                let logged = ops.clone();
                let r = self.run(conn, Job { cred, ops, protected: None, replay }).await;
                if let Ok(results) = &r {
                    self.changes.borrow_mut().record(conn, crate::changes::of_compound(&logged, results));
                }
                r.map(|results| Response::Compound { results })
            }
            Request::Watch { since } => self.watch(conn, since).await,
            Request::ServerHeartbeat(hb) => {
                if env.uid != 0 {
                    Err(Errno::EPERM)
                } else {
                    self.server_heartbeat(&hb, Instant::now())
                }
            }
            Request::Members => Ok(Response::Members {
                members: self.members.borrow().members(Instant::now()),
                chains: self.chains.borrow().clone(),
            }),
            Request::Lock { ino, client, owner, pid, start, end, kind, flags } => {
                let wait = flags & dafne_proto::LOCK_WAIT != 0;
                let reclaim = flags & dafne_proto::LOCK_RECLAIM != 0;
                let fair = flags & dafne_proto::LOCK_FAIR != 0;
                let owner = Owner { client, owner };
                self.lock(&req.conn, LockRequest { ino, owner, pid, start, end, kind, wait, reclaim, fair }).await
            }
            Request::TestLock { ino, client, owner, start, end, kind } => {
                self.lock_grace().await;
                let mut locks = self.locks.borrow_mut();
                locks.expire(Instant::now());
                let conflict = locks.test(ino, Owner { client, owner }, start, end, kind);
                Ok(Response::LockTest { conflict })
            }
            Request::RevokeCredential { name } => {
                let job = Job {
                    cred,
                    ops: vec![CompoundOp { chain: false, req: Request::RevokeCredential { name: name.clone() } }],
                    protected: None,
                    replay: None,
                };
                let result = match self.run(conn, job).await {
                    Ok(mut results) => results.pop().unwrap_or(Err(Errno::EIO)),
                    Err(e) => Err(e),
                };
                if result.is_ok() {
                    self.revoked_now(&name);
                }
                result
            }
            single => {
                let changed = crate::changes::of_request(&single);
                let job = Job { cred, ops: vec![CompoundOp { chain: false, req: single }], protected: None, replay };
                let r = match self.run(conn, job).await {
                    Ok(mut results) => results.pop().unwrap_or(Err(Errno::EIO)),
                    Err(e) => Err(e),
                };
                if r.is_ok() {
                    self.changes.borrow_mut().record(conn, changed);
                }
                r
            }
        };
        self.count(op, result.is_ok());
        if result.is_ok() {
            self.maybe_drop_reply(&req.conn, op);
        }
        encode_reply(env.tag, op, &result)
    }

    /// The test hook (module docs, "Fault injection"): after the `n`-th
    /// success of a listed op, close the connection (its reply is then
    /// never sent) or die.
    fn maybe_drop_reply(&self, conn: &dafne_transport::ConnHandle, op: Op) {
        for f in self.faults.iter().filter(|f| f.op == op) {
            f.seen.set(f.seen.get() + 1);
            if f.seen.get() == f.nth {
                if f.kill {
                    tracing::warn!("fault hook: aborting after committed {op} #{}", f.nth);
                    std::process::abort();
                }
                tracing::warn!("fault hook: dropping the reply to {op} #{} (closing connection {})", f.nth, conn.id());
                conn.close();
            }
        }
    }

    /// `Watch` ([`crate::changes`]): the changes after `since` that other
    /// sessions made, once there are some.
    /// A credential session (not fully trusted) is told which inodes
    /// changed but not the names: a name in a directory it may not read is
    /// not its business.
    async fn watch(&self, conn: u32, mut since: u64) -> Result<Response, Errno> {
        let trusted = self.sessions.borrow().get(&conn).is_some_and(|s| s.credential.is_none());
        loop {
            let polled = self.changes.borrow_mut().poll(conn, since)?;
            match polled {
                crate::changes::Poll::Ready { next, lost, mut changes } => {
                    if !trusted {
                        changes.retain_mut(|c| {
                            c.parent = 0;
                            c.name.clear();
                            c.ino != 0
                        });
                    }
                    return Ok(Response::Changes { next, lost, changes });
                }
                crate::changes::Poll::Wait { since: s, rx } => {
                    since = s;
                    // Dropped: the connection ended.
                    rx.await.map_err(|_| Errno::EINTR)?;
                }
            }
        }
    }

    /// Waits out the lock grace after a start (module docs, "Locks").
    async fn lock_grace(&self) {
        let until = self.locks.borrow().grace_until(Instant::now());
        if let Some(until) = until {
            dafne_transport::sleep(until.saturating_duration_since(Instant::now())).await;
        }
    }

    /// `Lock` (module docs, "Locks").
    async fn lock(&self, conn: &dafne_transport::ConnHandle, req: LockRequest) -> Result<Response, Errno> {
        // Releasing takes nothing from anyone: no grace for unlocks (a
        // reconnecting client sends the unlocks it owes before its reclaims).
        if !req.reclaim && req.kind != dafne_proto::LockKind::Unlock {
            self.lock_grace().await;
            if !conn.is_alive() {
                return Err(Errno::EIO);
            }
        }
        let outcome = {
            let mut locks = self.locks.borrow_mut();
            locks.expire(Instant::now());
            locks.lock(conn.id(), req)
        };
        tracing::debug!("lock {req:?} on connection {}: {outcome:?}", conn.id());
        let mut rx = match outcome {
            Outcome::Done => {
                self.mark_locks_granted(&req);
                return Ok(Response::Done);
            }
            Outcome::Refused(e) => return Err(e),
            Outcome::Wait(rx) => rx,
        };
        loop {
            let now = Instant::now();
            let next = self.locks.borrow().next_expiry().map_or(now + LEASE_CHECK, |t| t.min(now + LEASE_CHECK));
            let tick = dafne_transport::sleep(next.saturating_duration_since(now));
            futures::pin_mut!(tick);
            match futures::future::select(&mut rx, tick).await {
                futures::future::Either::Left((answer, _)) => {
                    return match answer {
                        Ok(Ok(())) => {
                            self.mark_locks_granted(&req);
                            Ok(Response::Done)
                        }
                        Ok(Err(e)) => Err(e),
                        // Dropped: its connection ended.
                        Err(_) => Err(Errno::EINTR),
                    };
                }
                futures::future::Either::Right(_) => self.locks.borrow_mut().expire(Instant::now()),
            }
        }
    }

    /// Writes the lock marker once per instance (module docs, "Locks").
    fn mark_locks_granted(&self, req: &LockRequest) {
        let Some((path, written)) = &self.lock_marker else { return };
        if written.get() || req.kind == dafne_proto::LockKind::Unlock {
            return;
        }
        written.set(true);
        let r = std::fs::File::create(path).and_then(|f| f.sync_all());
        if let Err(e) = r {
            tracing::warn!(
                "cannot write the lock marker {} ({e}): after a crash, clients' locks may be taken by others before \
                 their holders reclaim them",
                path.display()
            );
        }
    }

    /// `SessionOpen`: the MAC must be made with the cluster secret, or,
    /// with a credential, with the key the secret derives for it
    /// ([`Secret::login_key`]); a revoked credential is refused.
    fn open_session(
        &self,
        conn: &dafne_transport::ConnHandle,
        client_name: &str,
        nonce: &[u8; 16],
        mac: &[u8; 32],
        credential: Option<Credential>,
    ) -> Result<Response, Errno> {
        if conn.has_frame_keys() {
            // One login per connection: its frame keys are those of the
            // first (`ConnHandle::set_frame_keys`).
            tracing::warn!("a second session open on connection {}: refused", conn.id());
            return Err(Errno::EACCES);
        }
        let key = self.secret.login_key(credential.as_ref());
        let who = match &credential {
            Some(c) => format!("{client_name:?} with credential {:?}", c.name),
            None => format!("{client_name:?} with the cluster secret"),
        };
        if !key.verify_session(conn.token(), nonce, client_name, mac) {
            let why = if credential.is_some() {
                "the key does not match the policy (edited, or issued by another cluster)"
            } else {
                "wrong cluster secret"
            };
            self.warn_refused(&who, why);
            return Err(Errno::EACCES);
        }
        if credential.as_ref().is_some_and(|c| self.revoked.borrow().contains(&c.name)) {
            self.warn_refused(&who, "the credential is revoked");
            return Err(Errno::EKEYREVOKED);
        }
        let id = conn.id();
        // The frame keys come from the key the login was verified with
        // (the cluster secret or the credential's): from the answer on,
        // every frame of this connection is tagged and numbered.
        conn.set_frame_keys(key.frame_keys(conn.token(), nonce));
        conn.authenticated();
        self.sessions.borrow_mut().insert(id, Session { credential });
        lock(&self.opens).add_session(id);
        let session_id = self.next_session.get();
        self.next_session.set(session_id + 1);
        tracing::info!("session {session_id} opened by {who} on connection {id}");
        Ok(Response::Session { session_id, root: ROOT_INO })
    }

    /// Logs a refused session, at most once per [`REFUSED_WARN_EVERY`] with
    /// the count of those not logged: anyone who reaches the port may try.
    fn warn_refused(&self, who: &str, why: &str) {
        let (last, n) = self.refused.get();
        let now = Instant::now();
        if last.is_none_or(|t| now.duration_since(t) >= REFUSED_WARN_EVERY) {
            self.refused.set((Some(now), 0));
            tracing::warn!(
                "session refused for {who}: {why} ({n} more refused since the last such warning; at most one per {}s)",
                REFUSED_WARN_EVERY.as_secs()
            );
        } else {
            self.refused.set((last, n + 1));
        }
    }

    /// Who `req` on connection `conn` acts as (module docs, "Who a request
    /// acts as"): `EACCES` without a session, `EPERM` when its credential
    /// does not allow the identity stated or the op.
    fn identity(&self, conn: u32, env: &Envelope, req: &Request) -> Result<Cred, Errno> {
        let sessions = self.sessions.borrow();
        let session = sessions.get(&conn).ok_or(Errno::EACCES)?;
        let Some(policy) = &session.credential else {
            return Ok(Cred::with_groups(env.uid, env.gid, env.groups));
        };
        if matches!(
            req,
            Request::ListOrphans { .. }
                | Request::ForgetOrphans { .. }
                | Request::Revocations { .. }
                | Request::RevokeCredential { .. }
                | Request::ServerHeartbeat(_)
        ) {
            tracing::debug!("{} refused to credential {:?}: the cluster's own op", req.op(), policy.name);
            return Err(Errno::EPERM);
        }
        match dafne_auth::enforce(policy, env.uid, env.gid, &env.groups) {
            Ok((uid, gid, groups)) => Ok(Cred::with_groups(uid, gid, groups)),
            Err(why) => {
                tracing::debug!("{} refused on connection {conn} ({:?}): {why}", req.op(), policy.name);
                Err(Errno::EPERM)
            }
        }
    }

    /// The credential `name` was revoked (committed): no more logins, and
    /// its live sessions end.
    fn revoked_now(&self, name: &str) {
        self.revoked.borrow_mut().insert(name.to_string());
        let ended: Vec<u32> = self
            .sessions
            .borrow()
            .iter()
            .filter(|(_, s)| s.credential.as_ref().is_some_and(|c| c.name == name))
            .map(|(id, _)| *id)
            .collect();
        let now = Instant::now();
        for id in &ended {
            self.sessions.borrow_mut().remove(id);
            lock(&self.opens).end_session(*id, now);
        }
        tracing::warn!("credential {name:?} revoked: {} live session(s) ended", ended.len());
    }

    async fn run(&self, conn: u32, job: Job) -> Result<JobResult, Errno> {
        // Lookups and attribute reads are answered here, on the loop
        // thread, from a read snapshot (module docs, "Reads on the loop"):
        // no hop to the store thread and back.
        if let Some(r) = self.store.read_now(&job) {
            return r.map_err(|e| {
                tracing::error!("metadata store failure: {e}");
                Errno::EIO
            });
        }
        let (tx, rx) = oneshot::channel();
        if self.work.send(Work { job, conn, reply: tx }).is_err() {
            return Err(Errno::EIO);
        }
        let mut results = match rx.await {
            Ok(Ok(r)) => r,
            _ => return Err(Errno::EIO),
        };
        let now = SystemTime::now();
        for r in results.iter_mut() {
            match r {
                Ok(Response::Opened { cap, .. }) | Ok(Response::Cap { cap }) => self.secret.sign(cap, now),
                Ok(Response::Revocations(batch)) => self.secret.sign_revocations(batch),
                _ => {}
            }
        }
        Ok(results)
    }

    /// A fresh capability in place of `cap` (`dafne_auth`'s module docs,
    /// "Revocation"): only for a genuine capability of an object this
    /// session holds open with proof; the store checks the object is still
    /// the file's or an unreclaimed orphan's.
    async fn recap(&self, conn: u32, cred: Cred, cap: dafne_proto::Capability) -> Result<Response, Errno> {
        if !self.secret.genuine(&cap) {
            tracing::warn!("recap refused on connection {conn}: not a capability of this cluster");
            return Err(Errno::EACCES);
        }
        if !lock(&self.opens).proven(conn, cap.object_id, cap.rights) {
            tracing::debug!("recap refused on connection {conn}: no open of object {}", cap.object_id);
            return Err(Errno::EACCES);
        }
        let job = Job {
            cred,
            ops: vec![CompoundOp { chain: false, req: Request::Recap { cap } }],
            protected: None,
            replay: None,
        };
        match self.run(conn, job).await {
            Ok(mut results) => results.pop().unwrap_or(Err(Errno::EIO)),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LayoutPolicy, RedbStore};
    use dafne_proto::{Heartbeat, ReplicaState};
    use std::sync::atomic::Ordering;

    fn hb(server: u32, instance: u64) -> Heartbeat {
        Heartbeat {
            server,
            instance,
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9000 + server as u16)),
            host: "h".into(),
            capacity_bytes: 100,
            used_bytes: 10,
        }
    }

    /// A service over a real store of io servers 0 and 1 (R = 1), with
    /// io-1 marked `offline` in its chain (as a lapse leaves it) if
    /// `io1_offline`.
    fn service(dir: &std::path::Path, io1_offline: bool) -> (Arc<RedbStore>, MetaService) {
        let policy = LayoutPolicy { servers: vec![0, 1], ..LayoutPolicy::default() };
        let store = Arc::new(RedbStore::open(&dir.join("meta.redb"), policy).unwrap());
        if io1_offline {
            store.update_chains(&crate::chains::mark_offline(&store.chains(), &[1])).unwrap();
        }
        let secret = dafne_auth::Secret::from_bytes([7; dafne_auth::SECRET_LEN]);
        let svc = MetaService::new(store.clone(), secret, Duration::from_secs(1), Vec::new(), None).with_io_servers(2);
        (store, svc)
    }

    fn io1(svc: &MetaService) -> (u64, ReplicaState) {
        let c = svc.chains.borrow()[1].clone();
        (c.version, c.replicas[0].state)
    }

    fn versions(r: Result<Response, Errno>) -> Result<Vec<(u32, u64)>, Errno> {
        match r? {
            Response::Heartbeat { chains, .. } => Ok(chains.iter().map(|c| (c.chain, c.version)).collect()),
            other => panic!("{other:?}"),
        }
    }

    /// Issue 13 step 2 review: a return meta could not write to its store
    /// was still answered, granting the io server a lease while meta's
    /// table kept it `offline`. Now the heartbeat is answered `EIO` and the
    /// next one, once the store writes, is the return. Failed before:
    /// `Ok` with the old version.
    #[test]
    fn a_route_names_the_head_and_the_next_serving_replica() {
        use dafne_proto::{Chain, Replica, Successor};
        let addr = |s: u32| (s != 9).then(|| std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + s as u16)));
        let r = |server, state| Replica { server, state };
        let c = Chain {
            id: 4,
            version: 7,
            replicas: vec![
                r(1, ReplicaState::Serving),
                r(2, ReplicaState::Syncing),
                r(3, ReplicaState::Serving),
                r(9, ReplicaState::Serving),
                r(5, ReplicaState::Offline),
            ],
        };
        let to = |s: u32| Some(Successor { server: s, addr: addr(s) });
        assert_eq!(super::route_of(&c, 1, addr), dafne_proto::ChainRoute { chain: 4, head: true, successor: to(3) });
        assert_eq!(super::route_of(&c, 3, addr), dafne_proto::ChainRoute { chain: 4, head: false, successor: to(9) });
        // Meta has not heard 9 since it started: no address.
        assert_eq!(to(9).unwrap().addr, None);
        assert_eq!(super::route_of(&c, 9, addr), dafne_proto::ChainRoute { chain: 4, head: false, successor: None });
        // Not serving: heads nothing, forwards to nobody.
        for s in [2, 5] {
            assert_eq!(
                super::route_of(&c, s, addr),
                dafne_proto::ChainRoute { chain: 4, head: false, successor: None }
            );
        }
    }

    #[test]
    fn a_return_the_store_cannot_write_is_answered_with_an_error_and_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let (store, svc) = service(dir.path(), true);
        let now = Instant::now();
        assert_eq!(io1(&svc), (2, ReplicaState::Offline));
        store.fail_chain_writes.store(true, Ordering::Relaxed);
        assert_eq!(versions(svc.server_heartbeat(&hb(1, 5), now)), Err(Errno::EIO));
        assert_eq!(io1(&svc), (2, ReplicaState::Offline), "nothing changed");
        assert_eq!(svc.members.borrow().members(now)[1].state, dafne_proto::MemberState::Unknown, "not recorded");
        // A server whose chains need no write is answered as before.
        assert_eq!(versions(svc.server_heartbeat(&hb(0, 3), now)), Ok(vec![(0, 1)]));
        store.fail_chain_writes.store(false, Ordering::Relaxed);
        assert_eq!(versions(svc.server_heartbeat(&hb(1, 5), now)), Ok(vec![(1, 3)]));
        assert_eq!(io1(&svc), (3, ReplicaState::Serving));
        assert_eq!(store.chains()[1], svc.chains.borrow()[1], "written before it was used");
    }

    /// Issue 13 step 2 review: an io server killed and started again
    /// within L + margin was never marked offline (its new process lost
    /// the old one's unwritten cache). A heartbeat from a new instance is
    /// a return: offline and back in one change (version + 2), written
    /// before it is answered; and a restart meta cannot write is answered
    /// `EIO` and seen as a restart again at the next heartbeat. Failed
    /// before: the new instance was answered with the old version.
    #[test]
    fn a_new_instance_of_a_serving_server_is_a_return() {
        let dir = tempfile::tempdir().unwrap();
        let (store, svc) = service(dir.path(), false);
        let now = Instant::now();
        assert_eq!(versions(svc.server_heartbeat(&hb(1, 5), now)), Ok(vec![(1, 1)]));
        assert_eq!(versions(svc.server_heartbeat(&hb(1, 5), now)), Ok(vec![(1, 1)]), "the same process");
        store.fail_chain_writes.store(true, Ordering::Relaxed);
        assert_eq!(versions(svc.server_heartbeat(&hb(1, 6), now)), Err(Errno::EIO));
        assert_eq!(svc.members.borrow().members(now)[1].restarts, 0, "not recorded");
        store.fail_chain_writes.store(false, Ordering::Relaxed);
        assert_eq!(versions(svc.server_heartbeat(&hb(1, 6), now)), Ok(vec![(1, 3)]));
        assert_eq!(io1(&svc), (3, ReplicaState::Serving));
        assert_eq!(store.chains()[1].version, 3);
        assert_eq!(svc.members.borrow().members(now)[1].restarts, 1);
        assert_eq!(versions(svc.server_heartbeat(&hb(1, 6), now)), Ok(vec![(1, 3)]), "once");
    }
}
