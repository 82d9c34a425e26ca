//! The namespace store.
//!
//! [`MetaStore`] is the seam where a distributed engine can replace the
//! embedded one: it executes *batches* of namespace operations. Each batch
//! is atomic and durable as a whole (one commit, fsynced before any result
//! is returned), which gives group commit for free: the service collects the
//! writes of concurrent clients into one batch. Within a batch every job
//! (one client request: a single operation or a compound chain) gets its
//! own results; an operation that fails changes nothing, because every
//! operation checks all its preconditions before its first write.
//!
//! # Schema (redb tables)
//! | table | key | value |
//! |---|---|---|
//! | `inodes` | ino `u64` | encoded [`Inode`] (attributes, dir parent and entry sequence, file layout, symlink target, device number) |
//! | `dirents` | (parent `u64`, name bytes) | (ino `u64`, seq `u64`) |
//! | `dirseq` | (parent `u64`, seq `u64`) | name bytes |
//! | `counters` | `"next_ino"`, `"next_object"` | `u64` |
//! | `orphans_v2` | object id `u64` | encoded orphan: objects whose file is gone, for the reclaimer |
//! | `orphans` | object id `u64` | ino `u64` — the first orphan table, emptied into `orphans_v2` on open |
//! | `revoked_credentials` | credential name | when it was revoked, unix seconds `u64` (`RevokeCredential`) |
//!
//! `dirseq` gives every entry a per-directory sequence number at insertion;
//! readdir walks it in order and its cookie is the last sequence returned,
//! so paging survives concurrent inserts and removals: no entry present for
//! the whole listing is skipped or returned twice.
//!
//! # Inode records
//! An `inodes` value starts with a format byte. Format 2 (written now):
//! kind u8, mode, nlink, uid, gid u32; size, blocks, parent, next_seq u64;
//! atime, mtime, ctime (sec i64, nsec u32); layout presence u8 and layout;
//! target (u32 length + bytes); rdev u64. Format 1 (before special files)
//! is the same without rdev, and kinds 1–3 only; it is still read (rdev 0),
//! so a store made before format 2 opens unchanged and its records are
//! rewritten in format 2 as they change.
//!
//! # Orphans
//! When a file's last link goes, its data object becomes an orphan: an
//! `orphans_v2` record says when (so the reclaimer can wait out a grace
//! period, see `ListOrphans`) and on which io servers the object lives.
//! The record is format byte 1, orphaned_at_unix_s u64, n u32, n × server
//! id u32. The first table, `orphans`, held only the inode; a store made
//! with it opens unchanged and its entries move to `orphans_v2` with
//! orphaned_at = the time of the move and every io server of the layout
//! policy (a server without the object answers a remove with success).
//! Only root may list or forget orphans: the reclaimer runs as root.
//! `ListOrphans` skips the objects its job names as protected: files still
//! open, which the service knows (`crate::opens`); the store keeps no
//! record of opens.
//!
//! # Special files
//! FIFOs, sockets and device nodes are inodes without data: no layout, no
//! object on the io servers, size 0. `Open` refuses them with `ENXIO` ("no
//! such device or address": there is nothing behind the name on this
//! server); a FUSE mount never asks, because the kernel serves FIFO and
//! device opens itself.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use dafne_proto::{
    Attr, CompoundOp, DirEntry, Errno, FileType, Ino, Layout, LayoutHint, Orphan, Request, Response, SetAttr, StatFs,
    TimeSet, Timespec, MAX_LAYOUT_SERVERS, MAX_ORPHANS, MAX_READDIR_ENTRIES, NAME_MAX, ROOT_INO,
};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::posix::{self, MAY_EXEC, MAY_READ, MAY_WRITE, S_ISGID, S_ISUID};

const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
const DIRENTS: TableDefinition<(u64, &[u8]), (u64, u64)> = TableDefinition::new("dirents");
const DIRSEQ: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("dirseq");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const ORPHANS: TableDefinition<u64, u64> = TableDefinition::new("orphans");
const ORPHANS_V2: TableDefinition<u64, &[u8]> = TableDefinition::new("orphans_v2");
const REVOKED_CREDENTIALS: TableDefinition<&str, u64> = TableDefinition::new("revoked_credentials");

/// The orphan record format written (see the module docs).
const ORPHAN_FORMAT: u8 = 1;

/// An `orphans_v2` value: when the object was orphaned, and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OrphanRecord {
    orphaned_at_unix_s: u64,
    servers: Vec<u32>,
}

impl OrphanRecord {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(13 + 4 * self.servers.len());
        v.push(ORPHAN_FORMAT);
        v.extend_from_slice(&self.orphaned_at_unix_s.to_le_bytes());
        v.extend_from_slice(&(self.servers.len() as u32).to_le_bytes());
        for s in &self.servers {
            v.extend_from_slice(&s.to_le_bytes());
        }
        v
    }

    fn decode(object: u64, b: &[u8]) -> Result<OrphanRecord, StoreError> {
        let bad = |why| StoreError::CorruptOrphan { object, why };
        let (&format, rest) = b.split_first().ok_or(bad("empty"))?;
        if format != ORPHAN_FORMAT {
            return Err(bad("unknown format"));
        }
        let (at, rest) = rest.split_first_chunk::<8>().ok_or(bad("truncated time"))?;
        let (n, rest) = rest.split_first_chunk::<4>().ok_or(bad("truncated server count"))?;
        let n = u32::from_le_bytes(*n) as usize;
        if n > MAX_LAYOUT_SERVERS || rest.len() != n * 4 {
            return Err(bad("wrong server count"));
        }
        let servers = rest.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(OrphanRecord { orphaned_at_unix_s: u64::from_le_bytes(*at), servers })
    }
}

/// Most hard links to one inode.
pub const LINK_MAX: u32 = 65_000;

/// Who asks (AUTH_SYS style: trusted once the session is authenticated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (at most [`dafne_proto::MAX_GROUPS`]).
    pub groups: dafne_proto::Groups,
}

impl Cred {
    /// A caller without supplementary groups.
    pub fn new(uid: u32, gid: u32) -> Cred {
        Cred { uid, gid, groups: dafne_proto::Groups::NONE }
    }
    pub fn with_groups(uid: u32, gid: u32, groups: dafne_proto::Groups) -> Cred {
        Cred { uid, gid, groups }
    }
    pub fn root() -> Cred {
        Cred::new(0, 0)
    }
    /// Whether `gid` is the caller's group or one of its supplementary
    /// groups (as the kernel's `in_group_p`).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(gid)
    }
}

/// A storage failure (not a POSIX outcome): the service answers EIO.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("metadata store: {0}")]
    Redb(String),
    #[error("corrupt inode record {ino}: {why}")]
    Corrupt { ino: u64, why: &'static str },
    #[error("corrupt orphan record of object {object}: {why}")]
    CorruptOrphan { object: u64, why: &'static str },
}

macro_rules! from_redb {
    ($($t:ty),*) => { $(impl From<$t> for StoreError { fn from(e: $t) -> Self { StoreError::Redb(e.to_string()) } })* };
}
from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

enum Fail {
    Errno(Errno),
    Store(StoreError),
}
impl From<Errno> for Fail {
    fn from(e: Errno) -> Self {
        Fail::Errno(e)
    }
}
impl<E: Into<StoreError>> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail::Store(e.into())
    }
}
type R<T> = Result<T, Fail>;

/// How files are laid out across io servers.
#[derive(Debug, Clone)]
pub struct LayoutPolicy {
    /// Io server ids in the cluster.
    pub servers: Vec<u32>,
    pub default_stripe_unit: u32,
    pub default_stripe_count: u32,
}

impl Default for LayoutPolicy {
    fn default() -> Self {
        LayoutPolicy { servers: Vec::new(), default_stripe_unit: 1 << 20, default_stripe_count: 4 }
    }
}

impl LayoutPolicy {
    /// The layout of a new file: the client's advice if sane, else the
    /// cluster default; servers chosen round-robin from the object id.
    fn choose(&self, object_id: u64, hint: Option<LayoutHint>) -> Result<Layout, Errno> {
        let (mut unit, mut count) = (self.default_stripe_unit, self.default_stripe_count);
        if let Some(h) = hint {
            if h.stripe_unit != 0 {
                if h.stripe_unit % 4096 != 0 || h.stripe_unit > (64 << 20) {
                    return Err(Errno::EINVAL);
                }
                unit = h.stripe_unit;
            }
            if h.stripe_count != 0 {
                count = h.stripe_count;
            }
        }
        let n = self.servers.len();
        let count = (count as usize).min(n);
        let start = if n == 0 { 0 } else { (object_id % n as u64) as usize };
        let servers = (0..count).map(|i| self.servers[(start + i) % n]).collect();
        Ok(Layout { object_id, stripe_unit: unit, stripe_count: count as u32, servers })
    }
}

/// One client request for [`MetaStore::execute`]: its credentials and its
/// operations (one, or a compound chain).
#[derive(Debug, Clone)]
pub struct Job {
    pub cred: Cred,
    pub ops: Vec<CompoundOp>,
    /// Data objects `ListOrphans` must not name: files still open
    /// (`crate::opens`). `None`: no such restriction.
    pub protected: Option<Arc<HashSet<u64>>>,
}

/// Per-job results: one per operation executed (a chain stops at its first
/// error, which is the last result).
pub type JobResult = Vec<Result<Response, Errno>>;

/// The namespace, behind a trait so another engine can take redb's place.
pub trait MetaStore: Send + Sync + 'static {
    /// Executes a batch atomically and durably; results in job order.
    fn execute(&self, jobs: &[Job]) -> Result<Vec<JobResult>, StoreError>;

    /// The names of the credentials revoked so far (`RevokeCredential`),
    /// which the service refuses at login.
    fn revoked_credentials(&self) -> Result<Vec<String>, StoreError>;
}

/// An inode as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Inode {
    pub attr: Attr,
    /// Directories: the parent directory (root: itself).
    pub parent: Ino,
    /// Directories: the next entry sequence number.
    pub next_seq: u64,
    /// Regular files: where the data lives.
    pub layout: Option<Layout>,
    /// Symlinks: the target.
    pub target: Vec<u8>,
}

/// The inode record format written (see the module docs).
const INODE_FORMAT: u8 = 2;
/// The format before special files: no rdev at the end.
const INODE_FORMAT_1: u8 = 1;

impl Inode {
    fn encode(&self) -> Vec<u8> {
        let a = &self.attr;
        let mut v = Vec::with_capacity(128 + self.target.len());
        v.push(INODE_FORMAT);
        v.push(a.kind as u8);
        for x in [a.mode, a.nlink, a.uid, a.gid] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [a.size, a.blocks, self.parent, self.next_seq] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for t in [a.atime, a.mtime, a.ctime] {
            v.extend_from_slice(&t.sec.to_le_bytes());
            v.extend_from_slice(&t.nsec.to_le_bytes());
        }
        match &self.layout {
            Some(l) => {
                v.push(1);
                v.extend_from_slice(&l.object_id.to_le_bytes());
                v.extend_from_slice(&l.stripe_unit.to_le_bytes());
                v.extend_from_slice(&l.stripe_count.to_le_bytes());
                v.extend_from_slice(&(l.servers.len() as u32).to_le_bytes());
                for s in &l.servers {
                    v.extend_from_slice(&s.to_le_bytes());
                }
            }
            None => v.push(0),
        }
        v.extend_from_slice(&(self.target.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.target);
        v.extend_from_slice(&a.rdev.to_le_bytes());
        v
    }

    fn decode(ino: Ino, b: &[u8]) -> Result<Inode, StoreError> {
        let bad = |why| StoreError::Corrupt { ino, why };
        let mut p = 0usize;
        let mut take = |n: usize| -> Result<&[u8], StoreError> {
            let s = b.get(p..p + n).ok_or(bad("truncated"))?;
            p += n;
            Ok(s)
        };
        let format = take(1)?[0];
        if format != INODE_FORMAT && format != INODE_FORMAT_1 {
            return Err(bad("unknown format"));
        }
        let kind = FileType::from_u8(take(1)?[0]).ok_or(bad("unknown kind"))?;
        if format == INODE_FORMAT_1 && kind.is_special() {
            return Err(bad("special file in a format-1 record"));
        }
        let mut u32s = [0u32; 4];
        for x in &mut u32s {
            *x = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("u32"))?);
        }
        let mut u64s = [0u64; 4];
        for x in &mut u64s {
            *x = u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("u64"))?);
        }
        let mut ts = [Timespec { sec: 0, nsec: 0 }; 3];
        for t in &mut ts {
            let sec = i64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("time"))?);
            let nsec = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("time"))?);
            *t = Timespec { sec, nsec };
        }
        let layout = if take(1)?[0] == 1 {
            let object_id = u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("layout"))?);
            let stripe_unit = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("layout"))?);
            let stripe_count = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("layout"))?);
            let n = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("layout"))?) as usize;
            if n > 4096 {
                return Err(bad("layout server count"));
            }
            let mut servers = Vec::with_capacity(n);
            for _ in 0..n {
                servers.push(u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("layout"))?));
            }
            Some(Layout { object_id, stripe_unit, stripe_count, servers })
        } else {
            None
        };
        let tlen = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("target"))?) as usize;
        let target = take(tlen)?.to_vec();
        let rdev =
            if format == INODE_FORMAT { u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("rdev"))?) } else { 0 };
        if p != b.len() {
            return Err(bad("trailing bytes"));
        }
        let [mode, nlink, uid, gid] = u32s;
        let [size, blocks, parent, next_seq] = u64s;
        let [atime, mtime, ctime] = ts;
        Ok(Inode {
            attr: Attr { ino, kind, mode, nlink, uid, gid, rdev, size, blocks, atime, mtime, ctime },
            parent,
            next_seq,
            layout,
            target,
        })
    }
}

fn now() -> Timespec {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

/// The `counters` key of the capability generation (`dafne_auth`'s module
/// docs, "Revocation"): absent is 1, so that every capability meta issues
/// passes a reset to the generation it was issued at (0 there would mean
/// "no reset").
const CAP_GENERATION: &str = "cap_generation";

/// Entries of the revocation log kept in memory (16 B each: 1 MiB). An io
/// server further behind gets a reset instead.
pub const REVOCATION_LOG: usize = 1 << 16;

/// Meta's revocation log (`dafne_auth`'s module docs, "Revocation"): the
/// revocations committed since this store was opened, numbered from 1, the
/// last [`REVOCATION_LOG`] of them kept. `instance` tells one opening from
/// another: sequence numbers restart with it.
#[derive(Debug)]
struct RevocationLog {
    instance: u64,
    /// Sequence number of the newest entry (0: none yet).
    head: u64,
    entries: std::collections::VecDeque<dafne_proto::Revocation>,
}

impl RevocationLog {
    fn new() -> RevocationLog {
        // Distinct per opening: the time, and this process (two openings
        // in one nanosecond by one process do not happen; 0 is "none").
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        let instance = (t ^ (u64::from(std::process::id()) << 48)).max(1);
        RevocationLog { instance, head: 0, entries: std::collections::VecDeque::new() }
    }

    fn push(&mut self, r: dafne_proto::Revocation) {
        if self.entries.len() >= REVOCATION_LOG {
            self.entries.pop_front();
        }
        self.entries.push_back(r);
        self.head += 1;
    }

    /// The batch that follows entry `since` of `instance`: at most
    /// [`dafne_proto::MAX_REVOCATIONS`] entries, or a reset to `generation`
    /// when that entry is not this log's or no longer kept. Unsigned.
    fn after(&self, instance: u64, since: u64, generation: u64) -> dafne_proto::Revocations {
        let oldest = self.head - self.entries.len() as u64;
        if instance == self.instance && (oldest..=self.head).contains(&since) {
            let skip = (since - oldest) as usize;
            let entries: Vec<_> = self.entries.iter().skip(skip).take(dafne_proto::MAX_REVOCATIONS).copied().collect();
            let to_seq = since + entries.len() as u64;
            return dafne_proto::Revocations {
                instance,
                from_seq: since,
                to_seq,
                reset_floor: 0,
                entries,
                mac: [0; 32],
            };
        }
        dafne_proto::Revocations {
            instance: self.instance,
            from_seq: self.head,
            to_seq: self.head,
            // Every floor in the log is at most the generation now (≥ 1).
            reset_floor: generation,
            entries: Vec::new(),
            mac: [0; 32],
        }
    }
}

/// The embedded implementation: one redb file.
pub struct RedbStore {
    db: Database,
    policy: LayoutPolicy,
    log: std::sync::Mutex<RevocationLog>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore").field("policy", &self.policy).finish()
    }
}

impl RedbStore {
    /// Opens (or creates, with an empty root directory owned by root, mode
    /// 0755) the store at `path`.
    pub fn open(path: &Path, policy: LayoutPolicy) -> Result<RedbStore, StoreError> {
        let db = Database::create(path)?;
        let txn = db.begin_write()?;
        {
            let mut inodes = txn.open_table(INODES)?;
            txn.open_table(DIRENTS)?;
            txn.open_table(DIRSEQ)?;
            txn.open_table(REVOKED_CREDENTIALS)?;
            let mut old = txn.open_table(ORPHANS)?;
            let mut orphans = txn.open_table(ORPHANS_V2)?;
            // A store from before `orphans_v2`: its orphans move over (module
            // docs, "Orphans").
            let moved = RedbStore::drain_old_orphans(&mut old)?;
            let at = now().sec.max(0) as u64;
            for object in moved {
                let rec = OrphanRecord { orphaned_at_unix_s: at, servers: policy.servers.clone() };
                orphans.insert(object, rec.encode().as_slice())?;
            }
            let mut counters = txn.open_table(COUNTERS)?;
            if inodes.get(ROOT_INO)?.is_none() {
                let t = now();
                let root = Inode {
                    attr: Attr {
                        ino: ROOT_INO,
                        kind: FileType::Directory,
                        mode: 0o755,
                        nlink: 2,
                        uid: 0,
                        gid: 0,
                        rdev: 0,
                        size: 0,
                        blocks: 0,
                        atime: t,
                        mtime: t,
                        ctime: t,
                    },
                    parent: ROOT_INO,
                    next_seq: 1,
                    layout: None,
                    target: Vec::new(),
                };
                inodes.insert(ROOT_INO, root.encode().as_slice())?;
                counters.insert("next_ino", ROOT_INO + 1)?;
                counters.insert("next_object", 1)?;
            }
        }
        txn.commit()?;
        Ok(RedbStore { db, policy, log: std::sync::Mutex::new(RevocationLog::new()) })
    }

    /// Removes every entry of the first orphan table; returns their objects.
    fn drain_old_orphans(old: &mut redb::Table<'_, u64, u64>) -> Result<Vec<u64>, StoreError> {
        let mut objects = Vec::new();
        for e in old.iter()? {
            objects.push(e?.0.value());
        }
        for o in &objects {
            old.remove(*o)?;
        }
        Ok(objects)
    }

    /// Number of inodes (for statfs and tests).
    pub fn inode_count(&self) -> Result<u64, StoreError> {
        let r = self.db.begin_read()?;
        Ok(r.open_table(INODES)?.len()?)
    }
}

/// Whether an operation never changes the namespace (its batch then needs
/// no commit and no fsync).
pub fn is_read_only(req: &Request) -> bool {
    match req {
        Request::Lookup { .. }
        | Request::GetAttr { .. }
        | Request::Readdir { .. }
        | Request::Readlink { .. }
        | Request::Statfs
        | Request::ListOrphans { .. }
        | Request::Recap { .. }
        | Request::Revocations { .. } => true,
        Request::Open { flags, .. } => flags & dafne_proto::OPEN_TRUNC == 0,
        _ => false,
    }
}

impl MetaStore for RedbStore {
    fn execute(&self, jobs: &[Job]) -> Result<Vec<JobResult>, StoreError> {
        let read_only = jobs.iter().all(|j| j.ops.iter().all(|o| is_read_only(&o.req)));
        let txn = self.db.begin_write()?;
        let mut out = Vec::with_capacity(jobs.len());
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let revoked = {
            let mut t = Tables {
                inodes: txn.open_table(INODES)?,
                dirents: txn.open_table(DIRENTS)?,
                dirseq: txn.open_table(DIRSEQ)?,
                counters: txn.open_table(COUNTERS)?,
                orphans: txn.open_table(ORPHANS_V2)?,
                revoked_credentials: txn.open_table(REVOKED_CREDENTIALS)?,
                policy: &self.policy,
                now: now(),
                protected: None,
                log: &log,
                revoked: Vec::new(),
            };
            for job in jobs {
                out.push(t.run_job(job)?);
            }
            t.revoked
        };
        // A listing that revoked (module docs of `dafne_auth`) commits
        // although it is otherwise read-only: the generation it took must
        // not be handed out again after a restart.
        if read_only && revoked.is_empty() {
            txn.abort()?;
        } else {
            txn.commit()?;
        }
        // In the log once committed, in commit order (one store thread).
        for r in revoked {
            log.push(r);
        }
        Ok(out)
    }

    fn revoked_credentials(&self) -> Result<Vec<String>, StoreError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(REVOKED_CREDENTIALS)?;
        let mut names = Vec::new();
        for e in t.iter()? {
            names.push(e?.0.value().to_string());
        }
        Ok(names)
    }
}

struct Tables<'t> {
    inodes: redb::Table<'t, u64, &'static [u8]>,
    dirents: redb::Table<'t, (u64, &'static [u8]), (u64, u64)>,
    dirseq: redb::Table<'t, (u64, u64), &'static [u8]>,
    counters: redb::Table<'t, &'static str, u64>,
    orphans: redb::Table<'t, u64, &'static [u8]>,
    revoked_credentials: redb::Table<'t, &'static str, u64>,
    policy: &'t LayoutPolicy,
    now: Timespec,
    /// The running job's [`Job::protected`].
    protected: Option<Arc<HashSet<u64>>>,
    /// The revocation log, for `Revocations`.
    log: &'t RevocationLog,
    /// Revocations made by this batch, for the log once it commits.
    revoked: Vec<dafne_proto::Revocation>,
}

impl Tables<'_> {
    fn run_job(&mut self, job: &Job) -> Result<JobResult, StoreError> {
        let mut results: JobResult = Vec::with_capacity(job.ops.len());
        let mut prev: Option<Ino> = None;
        self.protected = job.protected.clone();
        for op in &job.ops {
            let mut op = op.clone();
            if op.chain {
                match (prev, op.primary_ino_mut()) {
                    (Some(p), Some(slot)) => *slot = p,
                    _ => {
                        results.push(Err(Errno::EINVAL));
                        break;
                    }
                }
            }
            match self.run(&job.cred, &op.req) {
                Ok(resp) => {
                    prev = resp.ino();
                    results.push(Ok(resp));
                }
                Err(Fail::Errno(e)) => {
                    results.push(Err(e));
                    break;
                }
                Err(Fail::Store(e)) => return Err(e),
            }
        }
        Ok(results)
    }

    fn inode(&self, ino: Ino) -> R<Inode> {
        match self.inodes.get(ino)? {
            Some(v) => Ok(Inode::decode(ino, v.value())?),
            None => Err(Errno::ENOENT.into()),
        }
    }

    fn put(&mut self, i: &Inode) -> R<()> {
        self.inodes.insert(i.attr.ino, i.encode().as_slice())?;
        Ok(())
    }

    fn dir(&self, ino: Ino) -> R<Inode> {
        let d = self.inode(ino)?;
        if d.attr.kind != FileType::Directory {
            return Err(Errno::ENOTDIR.into());
        }
        Ok(d)
    }

    /// Whether `cred` may add `name` to directory `d` (inode `parent`), in
    /// Linux's order: search permission, then EEXIST, then write
    /// permission.
    fn may_add_name(&self, cred: &Cred, d: &Inode, parent: Ino, name: &[u8]) -> R<()> {
        posix::check(cred, &d.attr, MAY_EXEC)?;
        if self.entry(parent, name)?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        posix::check(cred, &d.attr, MAY_WRITE)?;
        Ok(())
    }

    fn entry(&self, parent: Ino, name: &[u8]) -> R<Option<(Ino, u64)>> {
        Ok(self.dirents.get((parent, name))?.map(|v| v.value()))
    }

    fn next(&mut self, counter: &'static str) -> R<u64> {
        let v = self.counters.get(counter)?.map(|v| v.value()).unwrap_or(1);
        self.counters.insert(counter, v + 1)?;
        Ok(v)
    }

    /// The capability generation now (what a capability issued now carries).
    fn generation(&self) -> R<u64> {
        Ok(self.counters.get(CAP_GENERATION)?.map(|v| v.value()).unwrap_or(1))
    }

    /// Revokes every capability of `object` issued so far: the generation
    /// goes up by one and becomes the object's floor (`dafne_auth`'s module
    /// docs, "Revocation"). Returns the new generation.
    fn revoke(&mut self, object_id: u64) -> R<u64> {
        let g = self.generation()?.checked_add(1).ok_or(StoreError::Corrupt { ino: 0, why: "generation overflow" })?;
        self.counters.insert(CAP_GENERATION, g)?;
        self.revoked.push(dafne_proto::Revocation { object_id, floor: g });
        Ok(g)
    }

    /// A capability for `f`'s data object with `rights` at the current
    /// generation, unsigned (the service signs it).
    fn capability(&self, ino: Ino, object_id: u64, rights: u8) -> R<dafne_proto::Capability> {
        Ok(dafne_proto::Capability {
            object_id,
            ino,
            rights,
            generation: self.generation()?,
            expiry_unix_ns: 0,
            mac: [0; 32],
        })
    }

    fn add_entry(&mut self, dir: &mut Inode, name: &[u8], ino: Ino) -> R<()> {
        let seq = dir.next_seq;
        dir.next_seq += 1;
        self.dirents.insert((dir.attr.ino, name), (ino, seq))?;
        self.dirseq.insert((dir.attr.ino, seq), name)?;
        Ok(())
    }

    fn remove_entry(&mut self, dir: Ino, name: &[u8], seq: u64) -> R<()> {
        self.dirents.remove((dir, name))?;
        self.dirseq.remove((dir, seq))?;
        Ok(())
    }

    fn is_empty_dir(&self, ino: Ino) -> R<bool> {
        Ok(self.dirseq.range((ino, 0)..=(ino, u64::MAX))?.next().is_none())
    }

    fn touch_dir(&self, d: &mut Inode) {
        d.attr.mtime = self.now;
        d.attr.ctime = self.now;
    }

    /// Drops one link of `ino`; deletes it (recording its data object as an
    /// orphan for the io servers) when none remain.
    fn unlink_inode(&mut self, mut victim: Inode) -> R<()> {
        let dirs = victim.attr.kind == FileType::Directory;
        victim.attr.nlink = if dirs { 0 } else { victim.attr.nlink.saturating_sub(1) };
        victim.attr.ctime = self.now;
        if victim.attr.nlink == 0 {
            self.inodes.remove(victim.attr.ino)?;
            if let Some(l) = &victim.layout {
                let rec = OrphanRecord { orphaned_at_unix_s: self.now.sec.max(0) as u64, servers: l.servers.clone() };
                self.orphans.insert(l.object_id, rec.encode().as_slice())?;
                // Only sessions holding an open may still use it (Recap).
                self.revoke(l.object_id)?;
            }
        } else {
            self.put(&victim)?;
        }
        Ok(())
    }

    fn new_inode(&mut self, cred: &Cred, parent: &Inode, kind: FileType, mode: u32) -> R<Inode> {
        let ino = self.next("next_ino")?;
        // BSD group semantics under a setgid directory; new subdirectories
        // inherit the setgid bit.
        let (gid, mut mode) = if parent.attr.mode & S_ISGID != 0 { (parent.attr.gid, mode) } else { (cred.gid, mode) };
        if kind == FileType::Directory {
            mode &= 0o1777;
            if parent.attr.mode & S_ISGID != 0 {
                mode |= S_ISGID;
            }
        } else if mode & S_ISGID != 0 && cred.uid != 0 && !cred.in_group(gid) {
            // As Linux: a setgid file may only be made by a member of its group.
            mode &= !S_ISGID;
        }
        let t = self.now;
        Ok(Inode {
            attr: Attr {
                ino,
                kind,
                mode: mode & 0o7777,
                nlink: if kind == FileType::Directory { 2 } else { 1 },
                uid: cred.uid,
                gid,
                rdev: 0,
                size: 0,
                blocks: 0,
                atime: t,
                mtime: t,
                ctime: t,
            },
            parent: parent.attr.ino,
            next_seq: 1,
            layout: None,
            target: Vec::new(),
        })
    }

    fn run(&mut self, cred: &Cred, req: &Request) -> R<Response> {
        match req {
            Request::Lookup { parent, name } => {
                posix::valid_lookup_name(name)?;
                let d = self.dir(*parent)?;
                posix::check(cred, &d.attr, MAY_EXEC)?;
                let ino = match name.as_slice() {
                    b"." => d.attr.ino,
                    b".." => d.parent,
                    _ => self.entry(*parent, name)?.ok_or(Errno::ENOENT)?.0,
                };
                Ok(Response::Entry { attr: self.inode(ino)?.attr })
            }
            Request::GetAttr { ino } => Ok(Response::Attr { attr: self.inode(*ino)?.attr }),
            Request::SetAttr { ino, set } => self.setattr(cred, *ino, set),
            Request::Create { parent, name, mode, exclusive, hint } => {
                posix::valid_new_name(name)?;
                let mut d = self.dir(*parent)?;
                // Search permission to find the name; write permission only
                // if it must be created (Linux opens an existing file in a
                // read-only directory, and says EEXIST before EACCES).
                posix::check(cred, &d.attr, MAY_EXEC)?;
                if let Some((ino, _)) = self.entry(*parent, name)? {
                    if *exclusive {
                        return Err(Errno::EEXIST.into());
                    }
                    let existing = self.inode(ino)?;
                    if existing.attr.kind == FileType::Directory {
                        return Err(Errno::EISDIR.into());
                    }
                    return Ok(Response::Entry { attr: existing.attr });
                }
                posix::check(cred, &d.attr, MAY_WRITE)?;
                let object_id = self.counters.get("next_object")?.map(|v| v.value()).unwrap_or(1);
                let layout = self.policy.choose(object_id, *hint)?;
                self.next("next_object")?;
                let mut f = self.new_inode(cred, &d, FileType::Regular, *mode)?;
                f.layout = Some(layout);
                self.put(&f)?;
                self.add_entry(&mut d, name, f.attr.ino)?;
                self.touch_dir(&mut d);
                self.put(&d)?;
                Ok(Response::Entry { attr: f.attr })
            }
            Request::Mkdir { parent, name, mode } => {
                posix::valid_new_name(name)?;
                let mut d = self.dir(*parent)?;
                self.may_add_name(cred, &d, *parent, name)?;
                if d.attr.nlink >= LINK_MAX {
                    return Err(Errno::EMLINK.into());
                }
                let sub = self.new_inode(cred, &d, FileType::Directory, *mode)?;
                self.put(&sub)?;
                self.add_entry(&mut d, name, sub.attr.ino)?;
                d.attr.nlink += 1;
                self.touch_dir(&mut d);
                self.put(&d)?;
                Ok(Response::Entry { attr: sub.attr })
            }
            Request::Mknod { parent, name, kind, mode, rdev } => self.mknod(cred, *parent, name, *kind, *mode, *rdev),
            Request::Readdir { ino, cookie, max_entries } => {
                let d = self.dir(*ino)?;
                posix::check(cred, &d.attr, MAY_READ)?;
                let max = (*max_entries as usize).clamp(1, MAX_READDIR_ENTRIES);
                let mut entries = Vec::new();
                let mut eof = true;
                let start = cookie.saturating_add(1);
                for item in self.dirseq.range((*ino, start)..=(*ino, u64::MAX))? {
                    let (k, v) = item?;
                    if entries.len() == max {
                        eof = false;
                        break;
                    }
                    let seq = k.value().1;
                    let name = v.value().to_vec();
                    let child = self
                        .entry(*ino, &name)?
                        .map(|e| e.0)
                        .ok_or(StoreError::Corrupt { ino: *ino, why: "dirseq entry without dirent" })?;
                    let kind = self.inode(child)?.attr.kind;
                    entries.push(DirEntry { name, ino: child, kind, cookie: seq });
                }
                Ok(Response::Dir { entries, eof })
            }
            Request::Unlink { parent, name } => {
                posix::valid_lookup_name(name)?;
                if name.as_slice() == b"." || name.as_slice() == b".." {
                    return Err(Errno::EISDIR.into());
                }
                let mut d = self.dir(*parent)?;
                posix::check(cred, &d.attr, MAY_WRITE | MAY_EXEC)?;
                let (ino, seq) = self.entry(*parent, name)?.ok_or(Errno::ENOENT)?;
                let victim = self.inode(ino)?;
                if victim.attr.kind == FileType::Directory {
                    return Err(Errno::EISDIR.into());
                }
                if !posix::sticky_allows(cred, &d.attr, &victim.attr) {
                    return Err(Errno::EPERM.into());
                }
                self.remove_entry(*parent, name, seq)?;
                self.unlink_inode(victim)?;
                self.touch_dir(&mut d);
                self.put(&d)?;
                Ok(Response::Done)
            }
            Request::Rmdir { parent, name } => {
                posix::valid_lookup_name(name)?;
                if name.as_slice() == b"." {
                    return Err(Errno::EINVAL.into());
                }
                if name.as_slice() == b".." {
                    return Err(Errno::ENOTEMPTY.into());
                }
                let mut d = self.dir(*parent)?;
                posix::check(cred, &d.attr, MAY_WRITE | MAY_EXEC)?;
                let (ino, seq) = self.entry(*parent, name)?.ok_or(Errno::ENOENT)?;
                let victim = self.inode(ino)?;
                if victim.attr.kind != FileType::Directory {
                    return Err(Errno::ENOTDIR.into());
                }
                if !self.is_empty_dir(ino)? {
                    return Err(Errno::ENOTEMPTY.into());
                }
                if !posix::sticky_allows(cred, &d.attr, &victim.attr) {
                    return Err(Errno::EPERM.into());
                }
                self.remove_entry(*parent, name, seq)?;
                self.unlink_inode(victim)?;
                d.attr.nlink = d.attr.nlink.saturating_sub(1);
                self.touch_dir(&mut d);
                self.put(&d)?;
                Ok(Response::Done)
            }
            Request::Rename { src_parent, src_name, dst_parent, dst_name } => {
                self.rename(cred, *src_parent, src_name, *dst_parent, dst_name)
            }
            Request::Symlink { parent, name, target } => {
                posix::valid_new_name(name)?;
                if target.is_empty() {
                    return Err(Errno::ENOENT.into());
                }
                if target.len() >= dafne_proto::MAX_SYMLINK {
                    return Err(Errno::ENAMETOOLONG.into());
                }
                let mut d = self.dir(*parent)?;
                self.may_add_name(cred, &d, *parent, name)?;
                let mut l = self.new_inode(cred, &d, FileType::Symlink, 0o777)?;
                l.attr.mode = 0o777;
                l.attr.size = target.len() as u64;
                l.target = target.clone();
                self.put(&l)?;
                self.add_entry(&mut d, name, l.attr.ino)?;
                self.touch_dir(&mut d);
                self.put(&d)?;
                Ok(Response::Entry { attr: l.attr })
            }
            Request::Readlink { ino } => {
                let l = self.inode(*ino)?;
                if l.attr.kind != FileType::Symlink {
                    return Err(Errno::EINVAL.into());
                }
                Ok(Response::Link { target: l.target })
            }
            Request::Link { ino, new_parent, new_name } => {
                posix::valid_new_name(new_name)?;
                let mut src = self.inode(*ino)?;
                if src.attr.kind == FileType::Directory {
                    return Err(Errno::EPERM.into());
                }
                let mut d = self.dir(*new_parent)?;
                self.may_add_name(cred, &d, *new_parent, new_name)?;
                if src.attr.nlink >= LINK_MAX {
                    return Err(Errno::EMLINK.into());
                }
                src.attr.nlink += 1;
                src.attr.ctime = self.now;
                self.put(&src)?;
                self.add_entry(&mut d, new_name, *ino)?;
                self.touch_dir(&mut d);
                self.put(&d)?;
                Ok(Response::Entry { attr: src.attr })
            }
            Request::Statfs => {
                let files = self.inodes.len()?;
                Ok(Response::StatFs(StatFs {
                    blocks: 0,
                    bfree: 0,
                    bavail: 0,
                    files,
                    ffree: u64::MAX / 2 - files,
                    bsize: 4096,
                    namelen: NAME_MAX as u32,
                }))
            }
            Request::Open { ino, flags } => {
                let mut f = self.inode(*ino)?;
                let (rd, wr, tr) = (
                    flags & dafne_proto::OPEN_READ != 0,
                    flags & dafne_proto::OPEN_WRITE != 0,
                    flags & dafne_proto::OPEN_TRUNC != 0,
                );
                match f.attr.kind {
                    FileType::Directory => return Err(Errno::EISDIR.into()),
                    FileType::Symlink => return Err(Errno::ELOOP.into()),
                    // No data here (module docs, "Special files").
                    FileType::Fifo | FileType::Socket | FileType::CharDevice | FileType::BlockDevice => {
                        return Err(Errno::ENXIO.into())
                    }
                    FileType::Regular => {}
                }
                let mut want = 0;
                if rd {
                    want |= MAY_READ;
                }
                if wr || tr {
                    want |= MAY_WRITE;
                }
                posix::check(cred, &f.attr, want)?;
                if tr {
                    if f.attr.size > 0 {
                        if let Some(l) = &f.layout {
                            self.revoke(l.object_id)?;
                        }
                    }
                    // POSIX marks mtime and ctime on every truncating open.
                    f.attr.size = 0;
                    f.attr.blocks = 0;
                    f.attr.mtime = self.now;
                    f.attr.ctime = self.now;
                    self.put(&f)?;
                }
                let layout = f.layout.clone().ok_or(StoreError::Corrupt { ino: *ino, why: "file without layout" })?;
                let rights =
                    (if rd { dafne_proto::RIGHT_READ } else { 0 }) | (if wr { dafne_proto::RIGHT_WRITE } else { 0 });
                let cap = self.capability(f.attr.ino, layout.object_id, rights)?;
                Ok(Response::Opened { attr: f.attr, layout, cap })
            }
            Request::ListOrphans { older_than_s, max } => {
                if cred.uid != 0 {
                    return Err(Errno::EPERM.into());
                }
                let limit = (*max as usize).min(MAX_ORPHANS);
                let newest = (self.now.sec.max(0) as u64).saturating_sub(u64::from(*older_than_s));
                let mut orphans = Vec::new();
                for e in self.orphans.iter()? {
                    if orphans.len() >= limit {
                        break;
                    }
                    let (k, v) = e?;
                    let object_id = k.value();
                    if self.protected.as_ref().is_some_and(|p| p.contains(&object_id)) {
                        continue; // still open somewhere
                    }
                    let rec = OrphanRecord::decode(object_id, v.value())?;
                    if rec.orphaned_at_unix_s <= newest {
                        orphans.push(Orphan { object_id, servers: rec.servers });
                    }
                }
                // Capabilities of listed objects are all older than the
                // generation the listing takes, which the reclaimer's
                // removal records as their tombstones' floor.
                let generation = match orphans.first() {
                    Some(o) => self.revoke(o.object_id)?,
                    None => self.generation()?,
                };
                Ok(Response::Orphans { orphans, generation })
            }
            Request::ForgetOrphans { objects } => {
                if cred.uid != 0 {
                    return Err(Errno::EPERM.into());
                }
                for o in objects {
                    self.orphans.remove(*o)?;
                }
                Ok(Response::Done)
            }
            Request::Recap { cap } => {
                // The service checked the MAC and the session's open. Here:
                // the object is still the file's, or an unlinked file's not
                // yet reclaimed.
                let live = match self.inodes.get(cap.ino)? {
                    Some(v) => Inode::decode(cap.ino, v.value())?.layout.is_some_and(|l| l.object_id == cap.object_id),
                    None => false,
                };
                if !live && self.orphans.get(cap.object_id)?.is_none() {
                    return Err(Errno::ESTALE.into());
                }
                Ok(Response::Cap { cap: self.capability(cap.ino, cap.object_id, cap.rights)? })
            }
            Request::Revocations { instance, since } => {
                if cred.uid != 0 {
                    return Err(Errno::EPERM.into());
                }
                Ok(Response::Revocations(self.log.after(*instance, *since, self.generation()?)))
            }
            Request::RevokeCredential { name } => {
                // The service lets only sessions of the cluster secret ask.
                if cred.uid != 0 {
                    return Err(Errno::EPERM.into());
                }
                if self.revoked_credentials.get(name.as_str())?.is_none() {
                    self.revoked_credentials.insert(name.as_str(), self.now.sec.max(0) as u64)?;
                }
                Ok(Response::Done)
            }
            // Handled by the service (sessions, the open table), never here.
            Request::SessionOpen { .. }
            | Request::Compound { .. }
            | Request::Close { .. }
            | Request::Reopen { .. }
            | Request::Lock { .. }
            | Request::TestLock { .. } => Err(Errno::EINVAL.into()),
        }
    }

    /// `mknod(2)` as Linux does it: the name is checked (`EEXIST`) before
    /// the right to write the directory (`EACCES`), and that before the
    /// right to make a device (`EPERM` unless root, as Linux without
    /// `CAP_MKNOD`). A regular file is a `Create` that opens nothing;
    /// directories and symlinks have their own ops (`EPERM` and `EINVAL`,
    /// as `mknod(2)` answers for them). `rdev` is kept for devices only.
    fn mknod(&mut self, cred: &Cred, parent: Ino, name: &[u8], kind: FileType, mode: u32, rdev: u64) -> R<Response> {
        match kind {
            FileType::Directory => return Err(Errno::EPERM.into()),
            FileType::Symlink => return Err(Errno::EINVAL.into()),
            _ => {}
        }
        posix::valid_new_name(name)?;
        let mut d = self.dir(parent)?;
        self.may_add_name(cred, &d, parent, name)?;
        if kind.is_device() && cred.uid != 0 {
            return Err(Errno::EPERM.into());
        }
        let mut n = self.new_inode(cred, &d, kind, mode)?;
        if kind == FileType::Regular {
            let object_id = self.counters.get("next_object")?.map(|v| v.value()).unwrap_or(1);
            n.layout = Some(self.policy.choose(object_id, None)?);
            self.next("next_object")?;
        }
        if kind.is_device() {
            n.attr.rdev = rdev;
        }
        self.put(&n)?;
        self.add_entry(&mut d, name, n.attr.ino)?;
        self.touch_dir(&mut d);
        self.put(&d)?;
        Ok(Response::Entry { attr: n.attr })
    }

    fn setattr(&mut self, cred: &Cred, ino: Ino, set: &SetAttr) -> R<Response> {
        let mut i = self.inode(ino)?;
        let owner = cred.uid == 0 || cred.uid == i.attr.uid;
        // A mode change that only clears setuid and/or setgid is what a
        // write or truncate by another user does on Linux: through a mount
        // the kernel sends it as the writer, right before the write
        // (`file_remove_privs`, with the mode just fetched from here).
        // Whoever may write the file may make it; it changes no access.
        let kill_only = set.mode.is_some_and(|m| {
            let (old, new) = (i.attr.mode, m & 0o7777);
            new != old && new & !old == 0 && (old ^ new) & !(S_ISUID | S_ISGID) == 0
        });
        // Check everything first.
        if set.mode.is_some() && !owner && !(kill_only && posix::may(cred, &i.attr, MAY_WRITE)) {
            return Err(Errno::EPERM.into());
        }
        if *set == SetAttr::default() {
            return Ok(Response::Attr { attr: i.attr });
        }
        if let Some(uid) = set.uid {
            // Only root gives a file away; the owner may "chown" to itself.
            if cred.uid != 0 && (uid != i.attr.uid || !owner) {
                return Err(Errno::EPERM.into());
            }
        }
        if let Some(gid) = set.gid {
            if cred.uid != 0 && (!owner || (gid != i.attr.gid && !cred.in_group(gid))) {
                return Err(Errno::EPERM.into());
            }
        }
        if set.size.is_some() {
            match i.attr.kind {
                FileType::Directory => return Err(Errno::EISDIR.into()),
                // truncate(2) of anything but a regular file or directory.
                FileType::Symlink
                | FileType::Fifo
                | FileType::Socket
                | FileType::CharDevice
                | FileType::BlockDevice => return Err(Errno::EINVAL.into()),
                FileType::Regular => posix::check(cred, &i.attr, MAY_WRITE)?,
            }
        }
        for t in [&set.atime, &set.mtime].into_iter().flatten() {
            match t {
                TimeSet::At(_) if !owner => return Err(Errno::EPERM.into()),
                TimeSet::Now if !owner && !posix::may(cred, &i.attr, MAY_WRITE) => return Err(Errno::EACCES.into()),
                _ => {}
            }
        }
        // Then apply. A change of owner, group or mode, or a smaller size,
        // revokes the capabilities issued so far (`dafne_auth`, "Revocation").
        let shrinks = set.size.is_some_and(|s| s < i.attr.size);
        let rights_change = set.mode.is_some_and(|m| m & 0o7777 != i.attr.mode && !kill_only)
            || set.uid.is_some_and(|u| u != i.attr.uid)
            || set.gid.is_some_and(|g| g != i.attr.gid);
        if shrinks || rights_change {
            if let Some(l) = &i.layout {
                self.revoke(l.object_id)?;
            }
        }
        let now = self.now;
        if let Some(mut mode) = set.mode {
            if cred.uid != 0 && !cred.in_group(i.attr.gid) && i.attr.kind != FileType::Directory {
                mode &= !S_ISGID;
            }
            i.attr.mode = mode & 0o7777;
        }
        let chown = set.uid.is_some_and(|u| u != i.attr.uid) || set.gid.is_some_and(|g| g != i.attr.gid);
        // As Linux for a caller without CAP_FSETID: setuid goes, and setgid
        // when group-execute is set (a privilege) or the caller is not in
        // the file's group (setgid without group-execute is a locking
        // mark). Root's chown keeps them here; through a mount the kernel
        // clears them for root too, in the same request.
        let kill = if i.attr.mode & 0o010 != 0 || !cred.in_group(i.attr.gid) { S_ISUID | S_ISGID } else { S_ISUID };
        if let Some(uid) = set.uid {
            i.attr.uid = uid;
        }
        if let Some(gid) = set.gid {
            i.attr.gid = gid;
        }
        if chown && cred.uid != 0 && i.attr.kind != FileType::Directory {
            i.attr.mode &= !kill;
        }
        if let Some(size) = set.size {
            if size != i.attr.size {
                i.attr.mtime = now;
            }
            i.attr.size = size;
            i.attr.blocks = size.div_ceil(512);
            i.attr.mtime = now;
        }
        if let Some(t) = &set.atime {
            i.attr.atime = match t {
                TimeSet::Now => now,
                TimeSet::At(ts) => *ts,
            };
        }
        if let Some(t) = &set.mtime {
            i.attr.mtime = match t {
                TimeSet::Now => now,
                TimeSet::At(ts) => *ts,
            };
        }
        i.attr.ctime = now;
        self.put(&i)?;
        Ok(Response::Attr { attr: i.attr })
    }

    fn rename(&mut self, cred: &Cred, sp: Ino, sn: &[u8], dp: Ino, dn: &[u8]) -> R<Response> {
        posix::valid_lookup_name(sn)?;
        posix::valid_new_name(dn).map_err(|e| if e == Errno::EEXIST { Errno::EBUSY } else { e })?;
        if sn == b"." || sn == b".." {
            return Err(Errno::EBUSY.into());
        }
        let sdir = self.dir(sp)?;
        let ddir = self.dir(dp)?;
        posix::check(cred, &sdir.attr, MAY_WRITE | MAY_EXEC)?;
        posix::check(cred, &ddir.attr, MAY_WRITE | MAY_EXEC)?;
        let (sino, sseq) = self.entry(sp, sn)?.ok_or(Errno::ENOENT)?;
        let mut src = self.inode(sino)?;
        if !posix::sticky_allows(cred, &sdir.attr, &src.attr) {
            return Err(Errno::EPERM.into());
        }
        let is_dir = src.attr.kind == FileType::Directory;
        if is_dir && sp != dp && cred.uid != 0 {
            // Its ".." entry changes: Linux asks for write permission on it.
            posix::check(cred, &src.attr, MAY_WRITE)?;
        }
        let existing = self.entry(dp, dn)?;
        if let Some((dino, _)) = existing {
            if dino == sino {
                return Ok(Response::Done); // same file: POSIX says do nothing
            }
        }
        // A directory may not move into its own subtree.
        if is_dir && sp != dp {
            let mut cur = dp;
            loop {
                if cur == sino {
                    return Err(Errno::EINVAL.into());
                }
                if cur == ROOT_INO {
                    break;
                }
                cur = self.inode(cur)?.parent;
            }
        }
        let victim = match existing {
            Some((dino, dseq)) => {
                let v = self.inode(dino)?;
                let vdir = v.attr.kind == FileType::Directory;
                if is_dir && !vdir {
                    return Err(Errno::ENOTDIR.into());
                }
                if !is_dir && vdir {
                    return Err(Errno::EISDIR.into());
                }
                if vdir && !self.is_empty_dir(dino)? {
                    return Err(Errno::ENOTEMPTY.into());
                }
                if !posix::sticky_allows(cred, &ddir.attr, &v.attr) {
                    return Err(Errno::EPERM.into());
                }
                Some((v, dseq))
            }
            None => None,
        };
        if is_dir && sp != dp && victim.is_none() && ddir.attr.nlink >= LINK_MAX {
            return Err(Errno::EMLINK.into());
        }
        // All checks passed: apply.
        if let Some((v, dseq)) = victim {
            let vdir = v.attr.kind == FileType::Directory;
            self.remove_entry(dp, dn, dseq)?;
            self.unlink_inode(v)?;
            if vdir {
                let mut d = self.inode(dp)?;
                d.attr.nlink = d.attr.nlink.saturating_sub(1);
                self.put(&d)?;
            }
        }
        self.remove_entry(sp, sn, sseq)?;
        let mut d = self.inode(dp)?;
        self.add_entry(&mut d, dn, sino)?;
        if is_dir && sp != dp {
            d.attr.nlink += 1;
        }
        self.touch_dir(&mut d);
        self.put(&d)?;
        if sp != dp {
            let mut s = self.inode(sp)?;
            if is_dir {
                s.attr.nlink = s.attr.nlink.saturating_sub(1);
            }
            self.touch_dir(&mut s);
            self.put(&s)?;
        }
        if is_dir {
            src.parent = dp;
        }
        src.attr.ctime = self.now;
        self.put(&src)?;
        Ok(Response::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revocation_log_continues_a_reader_or_resets_it() {
        let mut log = RevocationLog::new();
        let me = log.instance;
        // Nothing yet: a reader at 0 of this instance gets an empty batch.
        let b = log.after(me, 0, 5);
        assert_eq!((b.from_seq, b.to_seq, b.reset_floor, b.entries.len()), (0, 0, 0, 0));
        for o in 1..=3u64 {
            log.push(dafne_proto::Revocation { object_id: o, floor: 10 + o });
        }
        let b = log.after(me, 1, 13);
        assert_eq!((b.from_seq, b.to_seq, b.reset_floor), (1, 3, 0));
        assert_eq!(b.entries.iter().map(|e| e.object_id).collect::<Vec<_>>(), vec![2, 3]);
        // Another instance (an io server fresh or from a restarted meta)
        // and a position past the head both get a reset to the generation.
        for (instance, since) in [(0, 0), (me ^ 1, 2), (me, 4)] {
            let b = log.after(instance, since, 13);
            assert_eq!((b.instance, b.from_seq, b.to_seq, b.reset_floor), (me, 3, 3, 13), "{instance} {since}");
            assert!(b.entries.is_empty());
        }
        // Bounded: the oldest entries go, and a reader behind them is reset.
        for o in 0..REVOCATION_LOG as u64 {
            log.push(dafne_proto::Revocation { object_id: o, floor: 20 });
        }
        assert_eq!(log.entries.len(), REVOCATION_LOG);
        assert_eq!(log.after(me, 1, 20).reset_floor, 20, "behind what is kept");
        let b = log.after(me, 3, 20);
        assert_eq!((b.reset_floor, b.entries.len()), (0, dafne_proto::MAX_REVOCATIONS), "a batch at most");
    }

    fn inode(kind: FileType, rdev: u64) -> Inode {
        let t = Timespec { sec: 1_700_000_000, nsec: 5 };
        Inode {
            attr: Attr {
                ino: 9,
                kind,
                mode: 0o2640,
                nlink: 1,
                uid: 7,
                gid: 8,
                rdev,
                size: 0,
                blocks: 0,
                atime: t,
                mtime: t,
                ctime: t,
            },
            parent: 1,
            next_seq: 1,
            layout: (kind == FileType::Regular).then(|| Layout {
                object_id: 3,
                stripe_unit: 1 << 20,
                stripe_count: 2,
                servers: vec![0, 1],
            }),
            target: Vec::new(),
        }
    }

    #[test]
    fn every_kind_and_its_device_number_round_trip() {
        for kind in FileType::ALL {
            let rdev = if kind.is_device() { 0x0000_0103_0000_0801 } else { 0 };
            let i = inode(*kind, rdev);
            let b = i.encode();
            assert_eq!(b[0], INODE_FORMAT);
            assert_eq!(Inode::decode(9, &b).unwrap(), i, "{kind:?}");
        }
    }

    /// A record written before special files (format 1: no rdev) still
    /// reads, so an existing store opens.
    #[test]
    fn format_1_records_still_read() {
        let i = inode(FileType::Regular, 0);
        let mut old = i.encode();
        old.truncate(old.len() - 8);
        old[0] = INODE_FORMAT_1;
        assert_eq!(Inode::decode(9, &old).unwrap(), i);
        // Format 1 had no special files.
        let mut fifo = inode(FileType::Fifo, 0).encode();
        fifo.truncate(fifo.len() - 8);
        fifo[0] = INODE_FORMAT_1;
        assert!(matches!(Inode::decode(9, &fifo), Err(StoreError::Corrupt { ino: 9, .. })));
    }

    #[test]
    fn damaged_records_are_refused() {
        let b = inode(FileType::CharDevice, 5).encode();
        for bad in [&b[..b.len() - 1], &[&b[..], &[0]].concat()[..]] {
            assert!(matches!(Inode::decode(9, bad), Err(StoreError::Corrupt { .. })));
        }
        let mut b2 = b.clone();
        b2[0] = 3;
        assert!(matches!(Inode::decode(9, &b2), Err(StoreError::Corrupt { why: "unknown format", .. })));
        let mut b3 = b;
        b3[1] = 8;
        assert!(matches!(Inode::decode(9, &b3), Err(StoreError::Corrupt { why: "unknown kind", .. })));
    }

    #[test]
    fn orphan_records_round_trip_and_damage_is_refused() {
        let rec = OrphanRecord { orphaned_at_unix_s: 1_700_000_000, servers: vec![0, 3, 7] };
        let b = rec.encode();
        assert_eq!(OrphanRecord::decode(5, &b).unwrap(), rec);
        for bad in [&b[..b.len() - 1], &[&b[..], &[0]].concat()[..], &[][..], &b[..5]] {
            assert!(matches!(OrphanRecord::decode(5, bad), Err(StoreError::CorruptOrphan { object: 5, .. })));
        }
        let mut huge = b.clone();
        huge[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(OrphanRecord::decode(5, &huge).is_err());
    }

    /// A store from before `orphans_v2`: its orphans move over on open, on
    /// every server of the policy, and the old table is left empty.
    #[test]
    fn old_orphans_move_to_the_new_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let policy = LayoutPolicy { servers: vec![0, 1], ..LayoutPolicy::default() };
        drop(RedbStore::open(&path, policy.clone()).unwrap());
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(ORPHANS).unwrap().insert(42, 17).unwrap();
            txn.commit().unwrap();
        }
        let store = RedbStore::open(&path, policy).unwrap();
        let r = store.db.begin_read().unwrap();
        assert_eq!(r.open_table(ORPHANS).unwrap().len().unwrap(), 0);
        let v2 = r.open_table(ORPHANS_V2).unwrap();
        let rec = OrphanRecord::decode(42, v2.get(42).unwrap().unwrap().value()).unwrap();
        assert_eq!(rec.servers, vec![0, 1]);
        assert!(rec.orphaned_at_unix_s > 0);
    }
}
