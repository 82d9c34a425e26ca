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
//! | `counters` | `"next_ino"`, `"next_object"`, `"chain_version"` (the highest version any chain row has had) | `u64` |
//! | `orphans_v2` | object id `u64` | encoded orphan: objects whose file is gone, for the reclaimer |
//! | `orphans` | object id `u64` | ino `u64` — the first orphan table, emptied into `orphans_v2` on open |
//! | `revoked_credentials` | credential name | when it was revoked, unix seconds `u64` (`RevokeCredential`) |
//! | `xattrs` | (ino `u64`, name bytes with prefix) | value bytes (extended attributes) |
//! | `replies` | (client `u64`, seq `u64`) | format u8 (1), stored_at_unix_ms u64, the job's results encoded as a Compound reply (exactly-once replay cache) |
//! | `replies_by_time` | (stored_at_unix_ms `u64`, client `u64`, seq `u64`) | `()`: the same entries in age order, for purging |
//! | `chains` | chain id `u32` | the chain table's row (`crate::chains::encode`): version, io servers and their states |
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
//! # Chains
//! The `chains` table is the chain table (`crate::chains`,
//! docs/REPLICATION.md). Each open builds the table the layout policy's io
//! servers, hosts and replication factor make and reconciles the stored
//! one with it (`crate::chains::reconcile`: an unchanged row keeps its
//! version, a changed one gets a higher version, extra rows go, and a row
//! new to the table starts above the highest version any row has had,
//! which `counters` keeps as `chain_version`, so a chain whose io server
//! left and came back never reuses a version). A store
//! made before the table opens unchanged: its table is created. Layouts
//! are not stored by chain: an inode's layout names the io servers (the
//! heads of the chains [`LayoutPolicy`] chose), in the same format as
//! before, so nothing is migrated.
//!
//! # Extended attributes
//! One `xattrs` row per attribute, keyed by inode and full name
//! (`user.x`), so an inode's attributes are one key range: listing and
//! freeing walk it, and a freed inode (last link gone) takes its
//! attributes with it in the same transaction. The rules are Linux's
//! (`posix::xattr_namespace`, `posix::xattr_access`): namespaces `user.`,
//! `trusted.` (root only; hidden from others' listings) and `security.`
//! (root writes); names up to 255 bytes (`ERANGE`), values up to 64 KiB
//! (`E2BIG`); `XATTR_CREATE` / `XATTR_REPLACE` give `EEXIST` / `ENODATA`;
//! setting or removing one changes the inode's ctime.
//!
//! Budget: a hostile client must not grow the store without bound through
//! one inode, so each inode holds at most [`XATTR_INODE_BUDGET`] bytes,
//! each attribute counted as name + value + [`XATTR_ENTRY_OVERHEAD`]
//! (about what a redb row costs beyond its bytes); past it a set answers
//! `ENOSPC`, as a full ext4 attribute block does. The budget is twice
//! the largest value, so one maximal attribute always fits; it bounds an
//! inode to 128 KiB / (16 + 6) < 6000 attributes of the shortest name
//! (`user.x`), under the wire's `MAX_XATTR_NAMES` (checked at compile
//! time). `security.capability` is refused (`EOPNOTSUPP`), as NFS does:
//! file capabilities are not supported, which lets a mount answer the
//! kernel's check for it before every write without a round trip
//! (`dafne_fuse::core`).
//!
//! # Lazy commits
//! A batch whose only changes are `SetAttr`s marked `lazy` (a mount's size
//! publish at `close`: `dafne_fuse::core`, "Publishing the size") commits
//! without an fsync (redb's `Durability::None`): its answer, and every
//! later read, sees the change at once, and the next durable commit (any
//! other change, by any client) makes it durable with its own. A power
//! loss before that loses the new size and mtime, never more: the create that
//! made the file was durable, and `close(2)` promises no durability (the
//! io servers do not fsync the bytes at a close either; `fsync(2)`
//! publishes without `lazy`, durably, and so makes every lazy commit
//! before it durable too). Its replay-cache entry and the purges it makes
//! are as lazy: a retry after such a crash runs the `SetAttr` again, which
//! is harmless (a grow-only size, mtime now). A batch that revoked
//! (below) commits durably whatever it holds. Lazy commits stay so for at
//! most [`LAZY_DURABLE_WITHIN`]: a batch after that commits durably, and
//! an idle store thread makes them durable then (`MetaStore::settle`), so
//! a power loss loses at most about the last second's size publishes.
//!
//! A process crash (`kill -9`, an abort) loses none: redb holds a
//! `Durability::None` commit only in the process's memory, so each lazy
//! commit also appends what it changed to the lazy log (`meta.lazy` next
//! to the store: each inode's stored bytes before and after, written with
//! `write(2)`, no fsync, before the answer leaves), which the kernel keeps
//! when the process dies. Opening the store replays it: an inode still
//! exactly as it was before a logged change gets the change (the commit was
//! lost); one that differs (the commit became durable, or a durable change
//! came after it) is left alone, so a replay never undoes a later truncate
//! or chmod. Each durable commit empties the log (after the commit: a
//! crash between the two replays nothing, every inode having moved on).
//!
//! # Exactly-once replay cache
//! A job that carries its client's session sequence ([`Job::replay`]: a
//! non-idempotent request, `Request::is_exactly_once`) is looked up in
//! `replies` first, inside the batch's write transaction: found, its
//! stored results are its answer and nothing runs; not found, it runs and
//! its results are stored in the same transaction. So an answer is in the
//! cache exactly when the operation was committed, `kill -9` or not, and a
//! retry can never run an operation twice: the store thread is the single
//! place jobs run, in queue order, and a retry queued behind its original
//! (even in the same batch, which reads its own writes) finds its entry.
//! The service therefore needs no in-memory "in progress" table.
//!
//! Each client also has a *floor* (the entry at seq `u64::MAX`): the
//! highest `acked_below` it ever sent. Every seq below it was answered, so
//! a request below the floor (a late copy of a retried request, still in
//! flight on a connection the client gave up on) is answered `ESTALE`
//! without running, even after its entry went; and the floor never moves
//! down, so a client cannot keep old entries by sending a lower
//! `acked_below`.
//!
//! Bounds (entries are small: a header and typically one `Entry` answer,
//! ~150 bytes; an answer longer than [`MAX_CACHED_REPLY`] (64 KiB: a
//! Compound that also listed directories) is kept as `EIO` instead, so its
//! retry gets an error, not a second run):
//! * per client: the wire keeps `seq - acked_below < SEQ_WINDOW` (4096),
//!   each job first deletes its client's entries below `acked_below`
//!   (the client received those answers), and seqs below the floor are
//!   refused, so a client holds at most 4096 entries and its floor;
//! * in age: entries older than [`REPLY_TTL`] (10 min, twenty times the
//!   client's 30 s retry deadline) are deleted by every committing batch
//!   (at most [`PURGE_PER_BATCH`] of them, so no batch stalls) and all of
//!   them when the store opens;
//! * in all: past [`MAX_REPLIES`] entries (2¹⁸: ~40 MiB at 150 B, 16 GiB
//!   at most if every entry were a 64 KiB answer), the oldest are deleted
//!   first; a client whose entry went that way loses exactly-once for
//!   that request (its retry runs again), never correctness otherwise.
//!   Clients that vanish leave their entries to the age purge.
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
const XATTRS: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("xattrs");
const REPLIES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("replies");
const REPLIES_BY_TIME: TableDefinition<(u64, u64, u64), ()> = TableDefinition::new("replies_by_time");
const CHAINS: TableDefinition<u32, &[u8]> = TableDefinition::new("chains");
/// The `counters` key of the highest version any chain row has had
/// (module docs, "Chains").
const CHAIN_VERSION_KEY: &str = "chain_version";

/// How long a cached answer is kept (module docs, "Exactly-once replay cache").
pub const REPLY_TTL: std::time::Duration = std::time::Duration::from_secs(600);
/// Most cached answers kept in all (module docs).
pub const MAX_REPLIES: u64 = 1 << 18;
/// Most expired or surplus entries one batch deletes.
pub const PURGE_PER_BATCH: usize = 256;
/// Format byte of a `replies` value.
const REPLY_FORMAT: u8 = 1;

/// Most bytes of extended attributes one inode holds (module docs,
/// "Extended attributes").
pub const XATTR_INODE_BUDGET: usize = 2 * dafne_proto::XATTR_SIZE_MAX;
/// What each attribute costs against the budget beyond its name and value.
pub const XATTR_ENTRY_OVERHEAD: usize = 16;
/// The attribute a mount answers for locally (module docs).
const XATTR_FILE_CAPS: &[u8] = b"security.capability";

// A listing of the most attributes the budget allows (shortest name
// `user.x`) fits one ListXattr reply.
const _: () = assert!(XATTR_INODE_BUDGET / (XATTR_ENTRY_OVERHEAD + 6) <= dafne_proto::MAX_XATTR_NAMES);

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
    #[error("corrupt cached reply of client {client:#x} seq {seq}: {why}")]
    CorruptReply { client: u64, seq: u64, why: String },
    #[error("corrupt chain table row {id}")]
    CorruptChain { id: u32 },
    #[error("the chain table: {0}")]
    Chains(#[from] crate::chains::ChainError),
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
    /// Io servers per chain (`crate::chains`); 1: no replication.
    pub replicas: u32,
    /// Each io server's host, in the order of `servers`; empty when the
    /// cluster does not know them (one host).
    pub hosts: Vec<String>,
}

impl Default for LayoutPolicy {
    fn default() -> Self {
        LayoutPolicy {
            servers: Vec::new(),
            default_stripe_unit: 1 << 20,
            default_stripe_count: 4,
            replicas: 1,
            hosts: Vec::new(),
        }
    }
}

impl LayoutPolicy {
    /// The chain table these io servers, hosts and replicas make
    /// (`crate::chains::build`).
    pub fn chains(&self) -> Result<Vec<dafne_proto::Chain>, crate::chains::ChainError> {
        crate::chains::build(&self.servers, &self.hosts, self.replicas)
    }

    /// The layout of a new file: the client's advice if sane, else the
    /// cluster default. Stripe slot `s` goes on chain `(first + s) %
    /// chains` with `first` the object id modulo the chains (one chain per
    /// io server), and the layout names that chain's head, io server
    /// `(first + s) % servers` (`crate::chains`: chain `c` is headed by
    /// server `c`): with one replica, the only server of the chain.
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
    /// The request's exactly-once identity: its first results are kept and
    /// a retry gets them without running (module docs, "Exactly-once
    /// replay cache"). `None`: runs every time.
    pub replay: Option<dafne_proto::SessionSeq>,
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

    /// Meta's chain table (`crate::chains`), if the engine keeps one.
    fn chains(&self) -> Vec<dafne_proto::Chain> {
        Vec::new()
    }

    /// Writes the rows of the chain table in `changed` (meta marked an io
    /// server offline or back: `crate::chains::mark_offline`), durably, in
    /// one transaction, before the service uses them. An engine that keeps
    /// no table keeps nothing.
    fn update_chains(&self, changed: &[dafne_proto::Chain]) -> Result<(), StoreError> {
        let _ = changed;
        Ok(())
    }

    /// Transactions committed durably since the store was opened (each
    /// one fsync), if the engine counts them.
    fn commits(&self) -> Option<u64> {
        None
    }

    /// Transactions committed without an fsync (module docs, "Lazy
    /// commits"), if the engine counts them.
    fn lazy_commits(&self) -> Option<u64> {
        None
    }

    /// When the lazy commits not yet durable must become so (module docs,
    /// "Lazy commits"); `None` when there are none.
    fn lazy_deadline(&self) -> Option<std::time::Instant> {
        None
    }

    /// Makes every lazy commit durable (an empty durable commit).
    fn settle(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Runs `job` at once on the caller's thread from a read snapshot, if
    /// it only reads names and attributes (`GetAttr`, `Lookup`, chained or
    /// not, with no exactly-once identity): answers exactly as
    /// [`MetaStore::execute`] would. `None` for any other job (it goes to
    /// the store thread), and for engines without snapshots.
    fn read_now(&self, _job: &Job) -> Option<Result<JobResult, StoreError>> {
        None
    }
}

/// Whether [`MetaStore::read_now`] may answer `job`: lookups and attribute
/// reads only. They need no commit, touch no open-file table, issue no
/// capability and log no change, so a snapshot answers them as the store
/// thread would (the snapshot holds every commit acknowledged so far).
pub fn answerable_now(job: &Job) -> bool {
    job.replay.is_none()
        && job.protected.is_none()
        && !job.ops.is_empty()
        && job.ops.iter().all(|o| matches!(o.req, Request::GetAttr { .. } | Request::Lookup { .. }))
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

/// The object id of a revocation of every object ([`Tables::revoke_all`]);
/// never an entry of the log (it restarts the log instead), so never sent.
/// Data object ids are allocated upwards from 1 and do not reach it.
const EVERY_OBJECT: u64 = u64::MAX;

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

    /// Revokes every capability issued so far, of every object: a new
    /// instance, so every reader's next batch is a reset to the generation
    /// then (which the caller raised first).
    fn restart(&mut self) {
        self.instance = self.instance.wrapping_add(1).max(1);
        self.head = 0;
        self.entries.clear();
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
    /// The chain table as this open made it and
    /// [`MetaStore::update_chains`] changed it (module docs, "Chains").
    chains: std::sync::Mutex<Vec<dafne_proto::Chain>>,
    /// Write transactions committed (the metrics page).
    commits: std::sync::atomic::AtomicU64,
    /// Unit tests' fault: [`MetaStore::update_chains`] fails (a store
    /// write that fails cannot be caused otherwise on an open database).
    #[cfg(test)]
    pub(crate) fail_chain_writes: std::sync::atomic::AtomicBool,
    /// Write transactions committed without an fsync (module docs, "Lazy
    /// commits").
    lazy_commits: std::sync::atomic::AtomicU64,
    /// When the oldest lazy commit not yet durable was made.
    lazy_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// The lazy log (module docs, "Lazy commits"), and whether it holds
    /// records.
    lazy_log: std::sync::Mutex<(std::fs::File, bool)>,
}

/// The lazy log of the store at `path` (module docs, "Lazy commits").
fn lazy_log_path(path: &Path) -> std::path::PathBuf {
    path.with_extension("lazy")
}

/// One lazy log record: an inode's stored bytes before and after.
fn lazy_record(out: &mut Vec<u8>, ino: Ino, before: &[u8], after: &[u8]) {
    out.extend_from_slice(&ino.to_le_bytes());
    for b in [before, after] {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }
}

/// The records of a lazy log; a torn last record (a crash mid-write) ends
/// it.
fn lazy_records(mut b: &[u8]) -> Vec<(Ino, Vec<u8>, Vec<u8>)> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (h, t) = (b.get(..n)?, b.get(n..)?);
        *b = t;
        Some(h)
    }
    fn bytes(b: &mut &[u8]) -> Option<Vec<u8>> {
        let n = u32::from_le_bytes(take(b, 4)?.try_into().ok()?) as usize;
        Some(take(b, n)?.to_vec())
    }
    let mut out = Vec::new();
    while let Some(r) = (|| {
        let ino = u64::from_le_bytes(take(&mut b, 8)?.try_into().ok()?);
        Some((ino, bytes(&mut b)?, bytes(&mut b)?))
    })() {
        out.push(r);
    }
    out
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
        let built = policy.chains()?;
        let db = Database::create(path)?;
        let txn = db.begin_write()?;
        let chains;
        {
            // The chain table (module docs, "Chains").
            let mut table = txn.open_table(CHAINS)?;
            let mut stored = Vec::new();
            for e in table.iter()? {
                let (k, v) = e?;
                let id = k.value();
                stored.push(crate::chains::decode(id, v.value()).ok_or(StoreError::CorruptChain { id })?);
            }
            // The highest version any row has had, gone rows' included:
            // a row that comes back starts above it.
            let mut counters = txn.open_table(COUNTERS)?;
            let highest = counters.get(CHAIN_VERSION_KEY)?.map_or(0, |v| v.value());
            chains = crate::chains::reconcile(&stored, built, highest);
            for c in &chains {
                if !stored.contains(c) {
                    table.insert(c.id, crate::chains::encode(c).as_slice())?;
                }
            }
            for s in stored.iter().filter(|s| !chains.iter().any(|c| c.id == s.id)) {
                table.remove(s.id)?;
            }
            let now = stored.iter().chain(&chains).map(|c| c.version).fold(highest, u64::max);
            if now != highest {
                counters.insert(CHAIN_VERSION_KEY, now)?;
            }
        }
        {
            let mut inodes = txn.open_table(INODES)?;
            txn.open_table(DIRENTS)?;
            txn.open_table(DIRSEQ)?;
            txn.open_table(REVOKED_CREDENTIALS)?;
            txn.open_table(XATTRS)?;
            let mut replies = txn.open_table(REPLIES)?;
            let mut by_time = txn.open_table(REPLIES_BY_TIME)?;
            let purged = purge_replies(&mut replies, &mut by_time, unix_ms(), usize::MAX)?;
            if purged > 0 {
                tracing::info!("{purged} cached replies older than {REPLY_TTL:?} dropped at open");
            }
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
            // Lazy commits a crash lost (module docs, "Lazy commits").
            let logged = std::fs::read(lazy_log_path(path)).unwrap_or_default();
            let mut replayed = 0;
            for (ino, before, after) in lazy_records(&logged) {
                if inodes.get(ino)?.is_some_and(|v| v.value() == before.as_slice()) {
                    inodes.insert(ino, after.as_slice())?;
                    replayed += 1;
                }
            }
            if replayed > 0 {
                tracing::info!("{replayed} size publishes lost in a crash replayed from the lazy log");
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
        let io = |e: std::io::Error| StoreError::Redb(format!("the lazy log {}: {e}", lazy_log_path(path).display()));
        let lazy_log = std::fs::OpenOptions::new().create(true).append(true).open(lazy_log_path(path)).map_err(io)?;
        lazy_log.set_len(0).map_err(io)?;
        Ok(RedbStore {
            db,
            policy,
            log: std::sync::Mutex::new(RevocationLog::new()),
            chains: std::sync::Mutex::new(chains),
            commits: Default::default(),
            #[cfg(test)]
            fail_chain_writes: Default::default(),
            lazy_commits: Default::default(),
            lazy_since: Default::default(),
            lazy_log: std::sync::Mutex::new((lazy_log, false)),
        })
    }

    /// Empties the lazy log after a durable commit (module docs, "Lazy
    /// commits"): what it holds is durable now. A failure only leaves
    /// records a replay skips.
    fn empty_lazy_log(&self) {
        let mut l = self.lazy_log.lock().unwrap_or_else(|p| p.into_inner());
        if l.1 {
            match l.0.set_len(0) {
                Ok(()) => l.1 = false,
                Err(e) => tracing::warn!("emptying the lazy log: {e}"),
            }
        }
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

    /// [`MetaStore::read_now`]: the job's lookups and attribute reads from
    /// one read transaction, chained as `Tables::run_job` chains them.
    fn read_snapshot(&self, job: &Job) -> Result<JobResult, StoreError> {
        let r = self.db.begin_read()?;
        let inodes = r.open_table(INODES)?;
        let dirents = r.open_table(DIRENTS)?;
        let inode = |ino: Ino| -> R<Inode> {
            match inodes.get(ino)? {
                Some(v) => Ok(Inode::decode(ino, v.value())?),
                None => Err(Errno::ENOENT.into()),
            }
        };
        let run = |req: &Request| -> R<Response> {
            match req {
                Request::GetAttr { ino } => Ok(Response::Attr { attr: inode(*ino)?.attr }),
                Request::Lookup { parent, name } => {
                    posix::valid_lookup_name(name)?;
                    let d = inode(*parent)?;
                    if d.attr.kind != FileType::Directory {
                        return Err(Errno::ENOTDIR.into());
                    }
                    posix::check(&job.cred, &d.attr, MAY_EXEC)?;
                    let ino = match name.as_slice() {
                        b"." => d.attr.ino,
                        b".." => d.parent,
                        _ => dirents.get((*parent, name.as_slice()))?.map(|v| v.value()).ok_or(Errno::ENOENT)?.0,
                    };
                    Ok(Response::Entry { attr: inode(ino)?.attr })
                }
                _ => Err(Errno::EINVAL.into()),
            }
        };
        run_ops(&job.ops, run)
    }

    /// Number of inodes (for statfs and tests).
    pub fn inode_count(&self) -> Result<u64, StoreError> {
        let r = self.db.begin_read()?;
        Ok(r.open_table(INODES)?.len()?)
    }
}

/// Whether an operation never changes the namespace (its batch then needs
/// no commit and no fsync): [`Request::changes_nothing`], the
/// classification the client's repeats after a lost connection use too.
pub fn is_read_only(req: &Request) -> bool {
    req.changes_nothing()
}

/// The longest a lazy commit stays not durable (module docs, "Lazy
/// commits").
pub const LAZY_DURABLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether an operation's change need not be durable before its answer
/// (module docs, "Lazy commits"): a `SetAttr` marked `lazy` that only
/// grows the size and sets times, the shape of a size publish. The bit on
/// anything else (a truncate's size, a mode, an owner: a client's own
/// choice, but not what the bit is for) is ignored: such a change is
/// durable before its answer, as it was before the bit.
pub fn is_lazy(req: &Request) -> bool {
    matches!(req, Request::SetAttr { set, .. }
        if set.lazy && set.size.is_none() && set.mode.is_none() && set.uid.is_none() && set.gid.is_none())
}

/// Now, in unix milliseconds (the replay cache's clock).
fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// When a `replies` value was stored.
fn reply_time(client: u64, seq: u64, v: &[u8]) -> Result<u64, StoreError> {
    let bad = |why: &str| StoreError::CorruptReply { client, seq, why: why.to_string() };
    if v.first() != Some(&REPLY_FORMAT) {
        return Err(bad("unknown format"));
    }
    let at = v.get(1..9).ok_or_else(|| bad("truncated"))?;
    Ok(u64::from_le_bytes(at.try_into().map_err(|_| bad("truncated"))?))
}

/// The `replies` key that holds a client's floor (module docs).
const FLOOR_SEQ: u64 = u64::MAX;

/// The largest answer kept whole (module docs).
pub const MAX_CACHED_REPLY: usize = 64 << 10;

/// A client's floor entry: (floor, stored_at_unix_ms).
fn stored_floor(client: u64, v: &[u8]) -> Result<(u64, u64), StoreError> {
    let at = reply_time(client, FLOOR_SEQ, v)?;
    let f = v.get(9..17).ok_or_else(|| StoreError::CorruptReply {
        client,
        seq: FLOOR_SEQ,
        why: "truncated floor".to_string(),
    })?;
    Ok((u64::from_le_bytes(f.try_into().unwrap_or_default()), at))
}

/// The results a `replies` value keeps.
fn decode_stored_reply(client: u64, seq: u64, v: &[u8]) -> Result<JobResult, StoreError> {
    reply_time(client, seq, v)?;
    let bad = |why: String| StoreError::CorruptReply { client, seq, why };
    match dafne_proto::decode_reply(&v[9..]) {
        Ok((_, _, Ok(Response::Compound { results }))) => Ok(results),
        Ok(other) => Err(bad(format!("not a Compound answer: {other:?}"))),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// Deletes cached answers older than [`REPLY_TTL`] and, past
/// [`MAX_REPLIES`], the oldest: at most `limit`. The number deleted.
fn purge_replies(
    replies: &mut redb::Table<'_, (u64, u64), &'static [u8]>,
    by_time: &mut redb::Table<'_, (u64, u64, u64), ()>,
    now_ms: u64,
    limit: usize,
) -> Result<usize, StoreError> {
    let cutoff = now_ms.saturating_sub(REPLY_TTL.as_millis() as u64);
    let surplus = replies.len()?.saturating_sub(MAX_REPLIES);
    let mut doomed = Vec::new();
    for e in by_time.iter()? {
        let (at, client, seq) = e?.0.value();
        if doomed.len() >= limit || (at >= cutoff && doomed.len() as u64 >= surplus) {
            break;
        }
        doomed.push((at, client, seq));
    }
    for &(at, client, seq) in &doomed {
        by_time.remove((at, client, seq))?;
        replies.remove((client, seq))?;
    }
    Ok(doomed.len())
}

impl MetaStore for RedbStore {
    fn read_now(&self, job: &Job) -> Option<Result<JobResult, StoreError>> {
        answerable_now(job).then(|| self.read_snapshot(job))
    }

    fn execute(&self, jobs: &[Job]) -> Result<Vec<JobResult>, StoreError> {
        let read_only = jobs.iter().all(|j| j.replay.is_none() && j.ops.iter().all(|o| is_read_only(&o.req)));
        let lazy = jobs.iter().all(|j| j.ops.iter().all(|o| is_read_only(&o.req) || is_lazy(&o.req)));
        let mut txn = self.db.begin_write()?;
        let mut out = Vec::with_capacity(jobs.len());
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        // The inodes a lazy batch may change (module docs, "Lazy commits").
        let mut lazy_inos: Vec<Ino> = Vec::new();
        if lazy {
            for o in jobs.iter().flat_map(|j| &j.ops) {
                if let Request::SetAttr { ino, .. } = o.req {
                    if is_lazy(&o.req) && !lazy_inos.contains(&ino) {
                        lazy_inos.push(ino);
                    }
                }
            }
        }
        let (revoked, lazy_changes) = {
            let mut t = Tables {
                inodes: txn.open_table(INODES)?,
                dirents: txn.open_table(DIRENTS)?,
                dirseq: txn.open_table(DIRSEQ)?,
                counters: txn.open_table(COUNTERS)?,
                orphans: txn.open_table(ORPHANS_V2)?,
                revoked_credentials: txn.open_table(REVOKED_CREDENTIALS)?,
                xattrs: txn.open_table(XATTRS)?,
                replies: txn.open_table(REPLIES)?,
                replies_by_time: txn.open_table(REPLIES_BY_TIME)?,
                policy: &self.policy,
                now: now(),
                protected: None,
                log: &log,
                revoked: Vec::new(),
            };
            let now_ms = unix_ms();
            let stored = |t: &Tables, ino: Ino| -> Result<Option<Vec<u8>>, StoreError> {
                Ok(t.inodes.get(ino)?.map(|v| v.value().to_vec()))
            };
            let mut before = Vec::with_capacity(lazy_inos.len());
            for &ino in &lazy_inos {
                before.push(stored(&t, ino)?);
            }
            for job in jobs {
                out.push(match job.replay {
                    Some(key) => t.run_once(job, key, now_ms)?,
                    None => t.run_job(job)?,
                });
            }
            if !read_only {
                purge_replies(&mut t.replies, &mut t.replies_by_time, now_ms, PURGE_PER_BATCH)?;
            }
            let mut changes = Vec::new();
            for (&ino, b) in lazy_inos.iter().zip(before) {
                if let (Some(b), Some(a)) = (b, stored(&t, ino)?) {
                    if a != b {
                        lazy_record(&mut changes, ino, &b, &a);
                    }
                }
            }
            (t.revoked, changes)
        };
        // A listing that revoked (module docs of `dafne_auth`) commits
        // although it is otherwise read-only: the generation it took must
        // not be handed out again after a restart.
        if read_only && revoked.is_empty() {
            txn.abort()?;
        } else if lazy
            && revoked.is_empty()
            && self.lazy_deadline().is_none_or(|d| std::time::Instant::now() < d)
            && txn.set_durability(redb::Durability::None).is_ok()
        {
            // (Refused only where the engine cannot: then durably, below.)
            txn.commit()?;
            self.lazy_commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.lazy_since.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(std::time::Instant::now);
            if !lazy_changes.is_empty() {
                let mut l = self.lazy_log.lock().unwrap_or_else(|p| p.into_inner());
                l.1 = true;
                // Before the answer leaves: a crash after it finds the record.
                if let Err(e) = std::io::Write::write_all(&mut l.0, &lazy_changes) {
                    drop(l);
                    // Without the record a crash could lose the answered
                    // change: make it durable instead.
                    tracing::warn!("writing the lazy log: {e}; committing durably");
                    self.settle()?;
                }
            }
        } else {
            txn.commit()?;
            self.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *self.lazy_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
            self.empty_lazy_log();
        }
        // In the log once committed, in commit order (one store thread).
        for r in revoked {
            if r.object_id == EVERY_OBJECT {
                log.restart();
            } else {
                log.push(r);
            }
        }
        Ok(out)
    }

    fn commits(&self) -> Option<u64> {
        Some(self.commits.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn lazy_commits(&self) -> Option<u64> {
        Some(self.lazy_commits.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn lazy_deadline(&self) -> Option<std::time::Instant> {
        self.lazy_since.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t + LAZY_DURABLE_WITHIN)
    }

    fn settle(&self) -> Result<(), StoreError> {
        if self.lazy_deadline().is_none() {
            return Ok(());
        }
        self.db.begin_write()?.commit()?;
        self.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.lazy_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.empty_lazy_log();
        Ok(())
    }

    fn chains(&self) -> Vec<dafne_proto::Chain> {
        self.chains.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update_chains(&self, changed: &[dafne_proto::Chain]) -> Result<(), StoreError> {
        if changed.is_empty() {
            return Ok(());
        }
        #[cfg(test)]
        if self.fail_chain_writes.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(StoreError::Redb("a chain write failed on purpose (unit test)".into()));
        }
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(CHAINS)?;
            for c in changed {
                table.insert(c.id, crate::chains::encode(c).as_slice())?;
            }
            // The highest version any row has had (a row that comes back
            // at an open starts above it).
            let mut counters = txn.open_table(COUNTERS)?;
            let highest = counters.get(CHAIN_VERSION_KEY)?.map_or(0, |v| v.value());
            let now = changed.iter().map(|c| c.version).fold(highest, u64::max);
            if now != highest {
                counters.insert(CHAIN_VERSION_KEY, now)?;
            }
        }
        txn.commit()?;
        self.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        crate::chains::replace(&mut self.chains.lock().unwrap_or_else(|p| p.into_inner()), changed);
        Ok(())
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

/// Runs a job's ops in order with `run`: a chained op takes the inode the
/// previous answer named; the first error ends the job (it is the last
/// result); a store failure fails the whole job. Shared by the store
/// thread (`Tables::run_job`) and reads on the loop (`read_snapshot`).
fn run_ops(ops: &[CompoundOp], mut run: impl FnMut(&Request) -> R<Response>) -> Result<JobResult, StoreError> {
    let mut results: JobResult = Vec::with_capacity(ops.len());
    let mut prev: Option<Ino> = None;
    for op in ops {
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
        match run(&op.req) {
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

struct Tables<'t> {
    inodes: redb::Table<'t, u64, &'static [u8]>,
    dirents: redb::Table<'t, (u64, &'static [u8]), (u64, u64)>,
    dirseq: redb::Table<'t, (u64, u64), &'static [u8]>,
    counters: redb::Table<'t, &'static str, u64>,
    orphans: redb::Table<'t, u64, &'static [u8]>,
    revoked_credentials: redb::Table<'t, &'static str, u64>,
    xattrs: redb::Table<'t, (u64, &'static [u8]), &'static [u8]>,
    replies: redb::Table<'t, (u64, u64), &'static [u8]>,
    replies_by_time: redb::Table<'t, (u64, u64, u64), ()>,
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
    /// A job with an exactly-once identity (module docs, "Exactly-once
    /// replay cache"): the client's acknowledged answers go, then the
    /// cached answer if there is one, else the job runs and its answer is
    /// kept.
    fn run_once(&mut self, job: &Job, key: dafne_proto::SessionSeq, now_ms: u64) -> Result<JobResult, StoreError> {
        let dafne_proto::SessionSeq { client, seq, acked_below } = key;
        if seq == FLOOR_SEQ {
            return Ok(vec![Err(Errno::EINVAL)]);
        }
        // The client's floor: every seq below it was answered and its
        // entry may be gone, so a late copy of one must not run again.
        let floor = match self.replies.get((client, FLOOR_SEQ))? {
            Some(v) => stored_floor(client, v.value())?,
            None => (0, 0),
        };
        if seq < floor.0 {
            tracing::debug!("client {client:#x} seq {seq} is below its floor {}: a late duplicate", floor.0);
            return Ok(vec![Err(Errno::ESTALE)]);
        }
        let acked_below = acked_below.max(floor.0);
        if acked_below > floor.0 {
            if floor.0 > 0 {
                self.replies_by_time.remove((floor.1, client, FLOOR_SEQ))?;
            }
            let mut v = Vec::with_capacity(17);
            v.push(REPLY_FORMAT);
            v.extend_from_slice(&now_ms.to_le_bytes());
            v.extend_from_slice(&acked_below.to_le_bytes());
            self.replies.insert((client, FLOOR_SEQ), v.as_slice())?;
            self.replies_by_time.insert((now_ms, client, FLOOR_SEQ), ())?;
        }
        let acked: Vec<(u64, u64)> = {
            let mut v = Vec::new();
            for e in self.replies.range((client, 0)..(client, acked_below))? {
                let (k, val) = e?;
                v.push((k.value().1, reply_time(client, k.value().1, val.value())?));
            }
            v
        };
        for (s, at) in acked {
            self.replies.remove((client, s))?;
            self.replies_by_time.remove((at, client, s))?;
        }
        if let Some(v) = self.replies.get((client, seq))? {
            tracing::debug!("replaying the answer to client {client:#x} seq {seq}");
            return decode_stored_reply(client, seq, v.value());
        }
        let results = self.run_job(job)?;
        let answer = Response::Compound { results };
        if !answer.answers(dafne_proto::Op::Compound) {
            // Cannot happen for the ops that carry a sequence; not worth
            // failing the operation over.
            tracing::warn!("the answer to client {client:#x} seq {seq} cannot be cached: {answer:?}");
            let Response::Compound { results } = answer else { unreachable!() };
            return Ok(results);
        }
        let mut value = Vec::with_capacity(64);
        value.push(REPLY_FORMAT);
        value.extend_from_slice(&now_ms.to_le_bytes());
        let encoded = dafne_proto::encode_reply(0, dafne_proto::Op::Compound, &Ok(answer.clone()));
        if encoded.len() <= MAX_CACHED_REPLY {
            value.extend_from_slice(&encoded);
        } else {
            // A Compound that also listed directories: its op ran once;
            // a retry gets EIO rather than a second run.
            let stand_in = Response::Compound { results: vec![Err(Errno::EIO)] };
            value.extend_from_slice(&dafne_proto::encode_reply(0, dafne_proto::Op::Compound, &Ok(stand_in)));
        }
        self.replies.insert((client, seq), value.as_slice())?;
        self.replies_by_time.insert((now_ms, client, seq), ())?;
        let Response::Compound { results } = answer else { unreachable!() };
        Ok(results)
    }

    fn run_job(&mut self, job: &Job) -> Result<JobResult, StoreError> {
        self.protected = job.protected.clone();
        run_ops(&job.ops, |req| self.run(&job.cred, req))
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

    /// The two directories of a rename or an exchange, each of which the
    /// caller must be allowed to write and search.
    fn rename_dirs(&self, cred: &Cred, sp: Ino, dp: Ino) -> R<(Inode, Inode)> {
        let sdir = self.dir(sp)?;
        let ddir = self.dir(dp)?;
        posix::check(cred, &sdir.attr, MAY_WRITE | MAY_EXEC)?;
        posix::check(cred, &ddir.attr, MAY_WRITE | MAY_EXEC)?;
        Ok((sdir, ddir))
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

    /// Revokes every capability of every object issued so far (a revoked
    /// credential's: their holders are not known per object): the
    /// generation goes up, and once committed the revocation log restarts,
    /// so the io servers' next relay is a reset to it. Holders with an
    /// open get theirs re-issued (`Recap`), as after any revocation.
    fn revoke_all(&mut self) -> R<u64> {
        self.revoke(EVERY_OBJECT)
    }

    /// A capability for `f`'s data object with `rights` at the current
    /// generation, unsigned (the service signs it).
    /// It carries the file's cache advice (`advice`).
    fn capability(&self, ino: Ino, object_id: u64, rights: u8) -> R<dafne_proto::Capability> {
        Ok(dafne_proto::Capability {
            object_id,
            ino,
            rights,
            generation: self.generation()?,
            expiry_unix_ns: 0,
            advice: self.advice(ino)?,
            mac: [0; 32],
        })
    }

    /// `ino`'s cache advice: its [`dafne_proto::CACHE_ADVICE_XATTR`]
    /// attribute (checked when set, so a value that does not read as
    /// advice cannot be there; it would count as none), else none.
    fn advice(&self, ino: Ino) -> R<dafne_proto::CacheAdvice> {
        Ok(match self.xattrs.get((ino, dafne_proto::CACHE_ADVICE_XATTR))? {
            Some(v) => dafne_proto::CacheAdvice::parse(v.value()).unwrap_or_default(),
            None => dafne_proto::CacheAdvice::NONE,
        })
    }

    /// A new file or directory in `parent` takes a copy of the parent's
    /// cache advice attribute (so advice on a directory reaches every file
    /// created below it, in subdirectories made after it too).
    fn inherit_advice(&mut self, parent: Ino, child: Ino) -> R<()> {
        let value = self.xattrs.get((parent, dafne_proto::CACHE_ADVICE_XATTR))?.map(|v| v.value().to_vec());
        if let Some(v) = value {
            self.xattrs.insert((child, dafne_proto::CACHE_ADVICE_XATTR), v.as_slice())?;
        }
        Ok(())
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
            for name in self.xattr_names(victim.attr.ino)? {
                self.xattrs.remove((victim.attr.ino, name.as_slice()))?;
            }
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

    /// A new inode's attributes; its number is taken last, so that a
    /// refusal here uses up nothing (the batch commits whatever its ops
    /// answered). Callers take a data object id only after this.
    fn new_inode(&mut self, cred: &Cred, parent: &Inode, kind: FileType, mode: u32) -> R<Inode> {
        // BSD group semantics under a setgid directory; new subdirectories
        // inherit the setgid bit.
        let (gid, mut mode) = if parent.attr.mode & S_ISGID != 0 { (parent.attr.gid, mode) } else { (cred.gid, mode) };
        if kind == FileType::Directory {
            mode &= 0o1777;
            if parent.attr.mode & S_ISGID != 0 {
                mode |= S_ISGID;
            }
        } else if mode & S_ISGID != 0 && cred.uid != 0 && !cred.in_group(gid) {
            if cred.groups.is_omitted() {
                // Membership decides the bit: ask again with the groups.
                return Err(Errno::EPERM.into());
            }
            // As Linux: a setgid file may only be made by a member of its group.
            mode &= !S_ISGID;
        }
        let ino = self.next("next_ino")?;
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
                let mut f = self.new_inode(cred, &d, FileType::Regular, *mode)?;
                self.next("next_object")?;
                f.layout = Some(layout);
                self.put(&f)?;
                self.inherit_advice(*parent, f.attr.ino)?;
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
                self.inherit_advice(*parent, sub.attr.ino)?;
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
            Request::Rename { src_parent, src_name, dst_parent, dst_name, flags } => {
                self.rename(cred, *src_parent, src_name, *dst_parent, dst_name, *flags)
            }
            Request::SetXattr { ino, name, value, flags } => self.setxattr(cred, *ino, name, value, *flags),
            Request::GetXattr { ino, name } => {
                let ns = posix::xattr_namespace(name)?;
                let i = self.inode(*ino)?;
                posix::xattr_access(cred, &i.attr, ns, false)?;
                match self.xattrs.get((*ino, name.as_slice()))? {
                    Some(v) => Ok(Response::Xattr { value: v.value().to_vec() }),
                    None => Err(Errno::ENODATA.into()),
                }
            }
            Request::ListXattr { ino } => {
                // Linux asks no permission on the inode to list.
                self.inode(*ino)?;
                let names = self.xattr_names(*ino)?.into_iter().filter(|n| posix::xattr_listed(cred, n)).collect();
                Ok(Response::XattrNames { names })
            }
            Request::RemoveXattr { ino, name } => {
                let ns = posix::xattr_namespace(name)?;
                let mut i = self.inode(*ino)?;
                posix::xattr_access(cred, &i.attr, ns, true)?;
                if self.xattrs.remove((*ino, name.as_slice()))?.is_none() {
                    return Err(Errno::ENODATA.into());
                }
                i.attr.ctime = self.now;
                self.put(&i)?;
                Ok(Response::Done)
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
                // The capabilities its sessions were issued die with it (once:
                // a repeated revocation changes nothing, and must not make
                // every client re-obtain its capabilities again).
                if self.revoked_credentials.get(name.as_str())?.is_none() {
                    self.revoked_credentials.insert(name.as_str(), self.now.sec.max(0) as u64)?;
                    self.revoke_all()?;
                }
                Ok(Response::Done)
            }
            // Handled by the service (sessions, the open table), never here.
            Request::SessionOpen { .. }
            | Request::Compound { .. }
            | Request::Close { .. }
            | Request::Reopen { .. }
            | Request::Lock { .. }
            | Request::TestLock { .. }
            | Request::Watch { .. }
            | Request::ServerHeartbeat(_)
            | Request::Members => Err(Errno::EINVAL.into()),
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
        if set.size.is_some() || set.grow_to.is_some() {
            // Past it the io servers refuse every offset, and the kernel
            // would read the size as negative (review finding).
            if set.size.max(set.grow_to).is_some_and(|s| s > dafne_proto::io::MAX_FILE_SIZE) {
                return Err(Errno::EFBIG.into());
            }
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
        // Membership in the file's group decides whether setgid stays (a
        // mode given, an owner or group changed: applied below): a caller
        // whose groups were omitted asks again with them.
        let chown = set.uid.is_some_and(|u| u != i.attr.uid) || set.gid.is_some_and(|g| g != i.attr.gid);
        if cred.groups.is_omitted()
            && cred.uid != 0
            && i.attr.kind != FileType::Directory
            && !cred.in_group(i.attr.gid)
            && (set.mode.is_some_and(|m| m & S_ISGID != 0) || chown)
        {
            return Err(Errno::EPERM.into());
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
        // A writer's published end: only ever larger (no revocation, no
        // mtime of its own: the writer says what mtime becomes).
        if let Some(end) = set.grow_to.filter(|&e| e > i.attr.size) {
            i.attr.size = end;
            i.attr.blocks = end.div_ceil(512);
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

    /// `setxattr(2)`, checking in Linux's order: name (`ERANGE`), size
    /// (`E2BIG`), flags (`EINVAL`), namespace (`EOPNOTSUPP`), permission,
    /// then existence (`EEXIST`, `ENODATA`) and the inode's budget
    /// (`ENOSPC`).
    fn setxattr(&mut self, cred: &Cred, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> R<Response> {
        if name.is_empty() || name.len() > dafne_proto::XATTR_NAME_MAX {
            return Err(Errno::ERANGE.into());
        }
        if value.len() > dafne_proto::XATTR_SIZE_MAX {
            return Err(Errno::E2BIG.into());
        }
        if flags & !(dafne_proto::XATTR_CREATE | dafne_proto::XATTR_REPLACE) != 0 {
            return Err(Errno::EINVAL.into());
        }
        let ns = posix::xattr_namespace(name)?;
        if name == XATTR_FILE_CAPS {
            return Err(Errno::EOPNOTSUPP.into());
        }
        if name == dafne_proto::CACHE_ADVICE_XATTR && dafne_proto::CacheAdvice::parse(value).is_err() {
            return Err(Errno::EINVAL.into());
        }
        let mut i = self.inode(ino)?;
        posix::xattr_access(cred, &i.attr, ns, true)?;
        let mut used = 0;
        let mut exists = false;
        for e in self.xattrs.range((ino, &[][..])..(ino.saturating_add(1), &[][..]))? {
            let (k, v) = e?;
            if k.value().1 == name {
                exists = true;
            } else {
                used += k.value().1.len() + v.value().len() + XATTR_ENTRY_OVERHEAD;
            }
        }
        if exists && flags & dafne_proto::XATTR_CREATE != 0 {
            return Err(Errno::EEXIST.into());
        }
        if !exists && flags & dafne_proto::XATTR_REPLACE != 0 {
            return Err(Errno::ENODATA.into());
        }
        if used + name.len() + value.len() + XATTR_ENTRY_OVERHEAD > XATTR_INODE_BUDGET {
            return Err(Errno::ENOSPC.into());
        }
        self.xattrs.insert((ino, name), value)?;
        i.attr.ctime = self.now;
        self.put(&i)?;
        Ok(Response::Done)
    }

    /// The names of `ino`'s extended attributes, in order.
    fn xattr_names(&self, ino: Ino) -> R<Vec<Vec<u8>>> {
        let mut names = Vec::new();
        for e in self.xattrs.range((ino, &[][..])..(ino.saturating_add(1), &[][..]))? {
            names.push(e?.0.value().1.to_vec());
        }
        Ok(names)
    }

    /// `renameat2(2)`: `flags` 0 replaces the destination,
    /// [`dafne_proto::RENAME_NOREPLACE`] refuses an existing one (`EEXIST`),
    /// [`dafne_proto::RENAME_EXCHANGE`] swaps the two ([`Tables::exchange`]);
    /// both is `EINVAL`. All inside this transaction, so no other client's
    /// operation comes between the check and the change.
    fn rename(&mut self, cred: &Cred, sp: Ino, sn: &[u8], dp: Ino, dn: &[u8], flags: u32) -> R<Response> {
        let noreplace = match flags {
            0 => false,
            dafne_proto::RENAME_NOREPLACE => true,
            dafne_proto::RENAME_EXCHANGE => return self.exchange(cred, sp, sn, dp, dn),
            _ => return Err(Errno::EINVAL.into()),
        };
        posix::valid_lookup_name(sn)?;
        posix::valid_new_name(dn).map_err(|e| if e == Errno::EEXIST { Errno::EBUSY } else { e })?;
        if sn == b"." || sn == b".." {
            return Err(Errno::EBUSY.into());
        }
        let (sdir, ddir) = self.rename_dirs(cred, sp, dp)?;
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
        if noreplace && existing.is_some() {
            return Err(Errno::EEXIST.into());
        }
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

    /// `RENAME_EXCHANGE`: the names `sn` in `sp` and `dn` in `dp` swap
    /// their inodes. Both must exist (`ENOENT`); the same permission and
    /// sticky checks as a rename apply to both sides, each as the one
    /// that leaves its directory. Directories that change parent get the
    /// new parent (their `..`), need write permission on themselves, may
    /// not end up inside themselves (`EINVAL`, as Linux says for either
    /// side of an exchange), and move one link count between the parents
    /// when only one side is a directory.
    fn exchange(&mut self, cred: &Cred, sp: Ino, sn: &[u8], dp: Ino, dn: &[u8]) -> R<Response> {
        posix::valid_lookup_name(sn)?;
        posix::valid_lookup_name(dn)?;
        for n in [sn, dn] {
            if n == b"." || n == b".." {
                return Err(Errno::EBUSY.into());
            }
        }
        let (sdir, ddir) = self.rename_dirs(cred, sp, dp)?;
        let (sino, sseq) = self.entry(sp, sn)?.ok_or(Errno::ENOENT)?;
        let (dino, dseq) = self.entry(dp, dn)?.ok_or(Errno::ENOENT)?;
        let mut src = self.inode(sino)?;
        let mut dst = self.inode(dino)?;
        if !posix::sticky_allows(cred, &sdir.attr, &src.attr) || !posix::sticky_allows(cred, &ddir.attr, &dst.attr) {
            return Err(Errno::EPERM.into());
        }
        if sino == dino {
            return Ok(Response::Done); // two names of one file: nothing to do
        }
        let (s_dir, d_dir) = (src.attr.kind == FileType::Directory, dst.attr.kind == FileType::Directory);
        if sp != dp {
            // Each directory that moves changes its "..".
            for (moves, i) in [(s_dir, &src), (d_dir, &dst)] {
                if moves && cred.uid != 0 {
                    posix::check(cred, &i.attr, MAY_WRITE)?;
                }
            }
            // Neither may land inside itself.
            for (moves, ino, into) in [(s_dir, sino, dp), (d_dir, dino, sp)] {
                if moves && self.is_within(into, ino)? {
                    return Err(Errno::EINVAL.into());
                }
            }
            if s_dir && !d_dir && ddir.attr.nlink >= LINK_MAX || d_dir && !s_dir && sdir.attr.nlink >= LINK_MAX {
                return Err(Errno::EMLINK.into());
            }
        }
        // All checks passed: apply. Each name keeps its readdir position.
        self.dirents.insert((sp, sn), (dino, sseq))?;
        self.dirents.insert((dp, dn), (sino, dseq))?;
        if s_dir {
            src.parent = dp;
        }
        if d_dir {
            dst.parent = sp;
        }
        src.attr.ctime = self.now;
        dst.attr.ctime = self.now;
        self.put(&src)?;
        self.put(&dst)?;
        let mut s = self.inode(sp)?;
        if sp != dp && s_dir != d_dir {
            // The subdirectory's ".." link moves from one parent to the other.
            if s_dir {
                s.attr.nlink = s.attr.nlink.saturating_sub(1);
            } else {
                s.attr.nlink += 1;
            }
        }
        self.touch_dir(&mut s);
        self.put(&s)?;
        if sp != dp {
            let mut d = self.inode(dp)?;
            if s_dir != d_dir {
                if s_dir {
                    d.attr.nlink += 1;
                } else {
                    d.attr.nlink = d.attr.nlink.saturating_sub(1);
                }
            }
            self.touch_dir(&mut d);
            self.put(&d)?;
        }
        Ok(Response::Done)
    }

    /// Whether directory `ino` is `ancestor` or below it.
    fn is_within(&self, mut ino: Ino, ancestor: Ino) -> R<bool> {
        loop {
            if ino == ancestor {
                return Ok(true);
            }
            if ino == ROOT_INO {
                return Ok(false);
            }
            ino = self.inode(ino)?.parent;
        }
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
        // A revocation of everything: every reader, however current, is
        // reset to the generation, and then follows the new instance.
        let head = log.head;
        log.restart();
        let b = log.after(me, head, 21);
        assert_ne!(b.instance, me);
        assert_eq!((b.from_seq, b.to_seq, b.reset_floor), (0, 0, 21), "a current reader is reset");
        log.push(dafne_proto::Revocation { object_id: 7, floor: 22 });
        let b = log.after(b.instance, 0, 22);
        assert_eq!((b.reset_floor, b.entries.len()), (0, 1), "then continues");
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

    fn fresh_store() -> (tempfile::TempDir, RedbStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbStore::open(&dir.path().join("meta.redb"), LayoutPolicy::default()).unwrap();
        (dir, store)
    }

    /// One request alone, as `cred`.
    fn ask(store: &RedbStore, cred: &Cred, req: Request) -> Result<Response, Errno> {
        let job =
            Job { cred: cred.clone(), ops: vec![CompoundOp { chain: false, req }], protected: None, replay: None };
        store.execute(&[job]).unwrap().remove(0).pop().unwrap()
    }

    #[test]
    fn reads_answered_now_match_the_store_threads_answers() {
        let (_dir, store) = fresh_store();
        let root = Cred::root();
        let user = Cred::new(1000, 1000);
        let d = mk(&store, &root, ROOT_INO, "d", true, 0o755);
        let f = mk(&store, &root, d.ino, "f", false, 0o644);
        let closed = mk(&store, &root, ROOT_INO, "closed", true, 0o700);
        mk(&store, &root, closed.ino, "secret", false, 0o600);
        let lookup = |parent: Ino, name: &str| Request::Lookup { parent, name: name.as_bytes().to_vec() };
        let op = |req: Request| CompoundOp { chain: false, req };
        let chained = |req: Request| CompoundOp { chain: true, req };
        let jobs: Vec<(Cred, Vec<CompoundOp>)> = vec![
            (root.clone(), vec![op(Request::GetAttr { ino: f.ino })]),
            (root.clone(), vec![op(Request::GetAttr { ino: 999_999 })]),
            (root.clone(), vec![op(lookup(d.ino, "f"))]),
            (root.clone(), vec![op(lookup(d.ino, "."))]),
            (root.clone(), vec![op(lookup(d.ino, ".."))]),
            (root.clone(), vec![op(lookup(d.ino, "missing"))]),
            (root.clone(), vec![op(lookup(f.ino, "x"))]),
            (root.clone(), vec![op(lookup(d.ino, "a/b"))]),
            (user.clone(), vec![op(lookup(closed.ino, "secret"))]),
            (
                root.clone(),
                vec![op(lookup(ROOT_INO, "d")), chained(lookup(0, "f")), chained(Request::GetAttr { ino: 0 })],
            ),
            (root.clone(), vec![op(lookup(ROOT_INO, "nope")), chained(lookup(0, "f"))]),
            (
                root.clone(),
                vec![
                    op(Request::GetAttr { ino: d.ino }),
                    op(lookup(d.ino, "missing")),
                    op(Request::GetAttr { ino: f.ino }),
                ],
            ),
            (root.clone(), vec![chained(Request::GetAttr { ino: 0 })]),
        ];
        for (cred, ops) in jobs {
            let job = Job { cred, ops, protected: None, replay: None };
            assert!(answerable_now(&job));
            let now = store.read_now(&job).expect("answerable").unwrap();
            let queued = store.execute(std::slice::from_ref(&job)).unwrap().remove(0);
            assert_eq!(now, queued, "{:?}", job.ops);
        }
        // Anything else goes to the store thread.
        let other = |req: Request, replay: Option<dafne_proto::SessionSeq>| Job {
            cred: root.clone(),
            ops: vec![op(lookup(ROOT_INO, "d")), op(req)],
            protected: None,
            replay,
        };
        assert!(store.read_now(&other(Request::Readdir { ino: d.ino, cookie: 0, max_entries: 10 }, None)).is_none());
        assert!(store.read_now(&other(Request::Unlink { parent: d.ino, name: b"f".to_vec() }, None)).is_none());
        let seq = dafne_proto::SessionSeq { client: 1, seq: 1, acked_below: 0 };
        assert!(store.read_now(&other(Request::GetAttr { ino: f.ino }, Some(seq))).is_none());
    }

    fn mk(store: &RedbStore, cred: &Cred, parent: Ino, name: &str, dir: bool, mode: u32) -> Attr {
        let name = name.as_bytes().to_vec();
        let req = if dir {
            Request::Mkdir { parent, name, mode }
        } else {
            Request::Create { parent, name, mode, exclusive: true, hint: None }
        };
        match ask(store, cred, req).unwrap() {
            Response::Entry { attr } => attr,
            r => panic!("{r:?}"),
        }
    }

    fn set(store: &RedbStore, cred: &Cred, ino: Ino, name: &str, value: &[u8], flags: u32) -> Result<(), Errno> {
        let req = Request::SetXattr { ino, name: name.as_bytes().to_vec(), value: value.to_vec(), flags };
        ask(store, cred, req).map(|_| ())
    }

    fn get(store: &RedbStore, cred: &Cred, ino: Ino, name: &str) -> Result<Vec<u8>, Errno> {
        match ask(store, cred, Request::GetXattr { ino, name: name.as_bytes().to_vec() })? {
            Response::Xattr { value } => Ok(value),
            r => panic!("{r:?}"),
        }
    }

    fn list(store: &RedbStore, cred: &Cred, ino: Ino) -> Vec<String> {
        match ask(store, cred, Request::ListXattr { ino }).unwrap() {
            Response::XattrNames { names } => names.into_iter().map(|n| String::from_utf8(n).unwrap()).collect(),
            r => panic!("{r:?}"),
        }
    }

    fn getattr(store: &RedbStore, ino: Ino) -> Result<Attr, Errno> {
        match ask(store, &Cred::root(), Request::GetAttr { ino })? {
            Response::Attr { attr } => Ok(attr),
            r => panic!("{r:?}"),
        }
    }

    fn xattr_rows(store: &RedbStore) -> u64 {
        store.db.begin_read().unwrap().open_table(XATTRS).unwrap().len().unwrap()
    }

    #[test]
    fn xattrs_set_get_list_remove_with_linux_errors() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let alice = Cred::new(1000, 1000);
        let home = mk(&s, &root, ROOT_INO, "home", true, 0o777);
        let f = mk(&s, &alice, home.ino, "f", false, 0o644);
        set(&s, &alice, f.ino, "user.k", b"v1", 0).unwrap();
        assert_eq!(get(&s, &alice, f.ino, "user.k").unwrap(), b"v1");
        // Flags.
        assert_eq!(set(&s, &alice, f.ino, "user.k", b"v2", dafne_proto::XATTR_CREATE), Err(Errno::EEXIST));
        assert_eq!(set(&s, &alice, f.ino, "user.new", b"v", dafne_proto::XATTR_REPLACE), Err(Errno::ENODATA));
        set(&s, &alice, f.ino, "user.k", b"v2", dafne_proto::XATTR_REPLACE).unwrap();
        set(&s, &alice, f.ino, "user.empty", b"", dafne_proto::XATTR_CREATE).unwrap();
        assert_eq!(get(&s, &alice, f.ino, "user.k").unwrap(), b"v2");
        assert_eq!(get(&s, &alice, f.ino, "user.empty").unwrap(), b"");
        assert_eq!(get(&s, &alice, f.ino, "user.missing"), Err(Errno::ENODATA));
        assert_eq!(list(&s, &alice, f.ino), ["user.empty", "user.k"]);
        // Names: namespaces and length.
        assert_eq!(set(&s, &alice, f.ino, "system.posix_acl_access", b"x", 0), Err(Errno::EOPNOTSUPP));
        assert_eq!(set(&s, &alice, f.ino, "plain", b"x", 0), Err(Errno::EOPNOTSUPP));
        assert_eq!(get(&s, &alice, f.ino, "os2.x"), Err(Errno::EOPNOTSUPP));
        assert_eq!(set(&s, &alice, f.ino, "user.", b"x", 0), Err(Errno::EINVAL));
        assert_eq!(set(&s, &alice, f.ino, "", b"x", 0), Err(Errno::ERANGE));
        let long = format!("user.{}", "n".repeat(dafne_proto::XATTR_NAME_MAX - 5));
        set(&s, &alice, f.ino, &long, b"x", 0).unwrap();
        assert_eq!(set(&s, &alice, f.ino, &format!("{long}n"), b"x", 0), Err(Errno::ERANGE));
        assert_eq!(get(&s, &alice, f.ino, &format!("{long}n")), Err(Errno::ERANGE));
        // Values: up to 64 KiB.
        let big = vec![7u8; dafne_proto::XATTR_SIZE_MAX];
        set(&s, &alice, f.ino, "user.big", &big, 0).unwrap();
        assert_eq!(get(&s, &alice, f.ino, "user.big").unwrap(), big);
        assert_eq!(set(&s, &alice, f.ino, "user.big", &[&big[..], b"x"].concat(), 0), Err(Errno::E2BIG));
        // Remove.
        let rm = |c: &Cred, name: &str| ask(&s, c, Request::RemoveXattr { ino: f.ino, name: name.as_bytes().to_vec() });
        rm(&alice, "user.big").unwrap();
        assert_eq!(rm(&alice, "user.big"), Err(Errno::ENODATA));
        assert_eq!(get(&s, &alice, f.ino, "user.big"), Err(Errno::ENODATA));
        assert_eq!(rm(&alice, "system.x"), Err(Errno::EOPNOTSUPP));
        // Missing inode.
        assert_eq!(get(&s, &alice, 999_999, "user.k"), Err(Errno::ENOENT));
        assert_eq!(set(&s, &alice, 999_999, "user.k", b"", 0), Err(Errno::ENOENT));
        assert_eq!(ask(&s, &alice, Request::ListXattr { ino: 999_999 }), Err(Errno::ENOENT));
    }

    #[test]
    fn cache_advice_comes_from_the_attribute_and_is_inherited() {
        let (_d, s) = fresh_store();
        let alice = Cred::new(1000, 1000);
        let root = Cred::root();
        let home = mk(&s, &root, ROOT_INO, "home", true, 0o777);
        let open_advice = |ino: Ino| match ask(&s, &alice, Request::Open { ino, flags: dafne_proto::OPEN_READ }) {
            Ok(Response::Opened { cap, .. }) => cap.advice,
            other => panic!("open: {other:?}"),
        };
        let name = std::str::from_utf8(dafne_proto::CACHE_ADVICE_XATTR).unwrap();
        let before = mk(&s, &alice, home.ino, "before", false, 0o644);
        assert_eq!(open_advice(before.ino), dafne_proto::CacheAdvice::NONE);
        // A value that is not advice is refused; advice on a directory is
        // copied to what is created in it afterwards, subdirectories too.
        assert_eq!(set(&s, &root, home.ino, name, b"unit=12k", 0), Err(Errno::EINVAL));
        assert_eq!(set(&s, &root, home.ino, name, b"speed=fast", 0), Err(Errno::EINVAL));
        set(&s, &root, home.ino, name, b"unit=16k,policy=clock", 0).unwrap();
        let want = dafne_proto::CacheAdvice { unit_kib: 16, policy: dafne_proto::CachePolicy::Clock };
        let f = mk(&s, &alice, home.ino, "f", false, 0o644);
        assert_eq!(open_advice(f.ino), want);
        let sub = mk(&s, &alice, home.ino, "sub", true, 0o755);
        let g = mk(&s, &alice, sub.ino, "g", false, 0o644);
        assert_eq!(open_advice(g.ino), want);
        assert_eq!(open_advice(before.ino), dafne_proto::CacheAdvice::NONE, "only new files inherit");
        // The file's own attribute wins, and its owner may change it.
        set(&s, &alice, f.ino, name, b"unit=4k", 0).unwrap();
        assert_eq!(open_advice(f.ino), dafne_proto::CacheAdvice { unit_kib: 4, policy: Default::default() });
    }

    #[test]
    fn xattr_permissions_are_the_servers() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let (alice, bob) = (Cred::new(1000, 1000), Cred::new(1001, 1001));
        let home = mk(&s, &root, ROOT_INO, "home", true, 0o1777);
        let f = mk(&s, &alice, home.ino, "f", false, 0o644);
        set(&s, &alice, f.ino, "user.k", b"v", 0).unwrap();
        // user.*: read with r, write with w.
        assert_eq!(get(&s, &bob, f.ino, "user.k").unwrap(), b"v");
        assert_eq!(set(&s, &bob, f.ino, "user.k", b"w", 0), Err(Errno::EACCES));
        assert_eq!(ask(&s, &bob, Request::RemoveXattr { ino: f.ino, name: b"user.k".to_vec() }), Err(Errno::EACCES));
        let secret = mk(&s, &alice, home.ino, "secret", false, 0o600);
        set(&s, &alice, secret.ino, "user.k", b"v", 0).unwrap();
        assert_eq!(get(&s, &bob, secret.ino, "user.k"), Err(Errno::EACCES));
        // A sticky directory: bob may not write user.* on it, even with w.
        assert_eq!(set(&s, &bob, home.ino, "user.k", b"v", 0), Err(Errno::EPERM));
        set(&s, &root, home.ino, "user.k", b"v", 0).unwrap();
        // user.* only on regular files and directories.
        let link =
            match ask(&s, &alice, Request::Symlink { parent: home.ino, name: b"l".to_vec(), target: b"f".to_vec() })
                .unwrap()
            {
                Response::Entry { attr } => attr,
                r => panic!("{r:?}"),
            };
        assert_eq!(set(&s, &alice, link.ino, "user.k", b"v", 0), Err(Errno::EPERM));
        assert_eq!(get(&s, &alice, link.ino, "user.k"), Err(Errno::ENODATA));
        // trusted.*: root only, and unseen by others.
        assert_eq!(set(&s, &alice, f.ino, "trusted.t", b"v", 0), Err(Errno::EPERM));
        set(&s, &root, f.ino, "trusted.t", b"root's", 0).unwrap();
        assert_eq!(get(&s, &alice, f.ino, "trusted.t"), Err(Errno::ENODATA));
        assert_eq!(get(&s, &root, f.ino, "trusted.t").unwrap(), b"root's");
        assert_eq!(list(&s, &alice, f.ino), ["user.k"]);
        assert_eq!(list(&s, &root, f.ino), ["trusted.t", "user.k"]);
        set(&s, &root, link.ino, "trusted.t", b"v", 0).unwrap();
        // security.*: root writes, anyone reads; file capabilities refused.
        assert_eq!(set(&s, &alice, f.ino, "security.label", b"v", 0), Err(Errno::EPERM));
        set(&s, &root, f.ino, "security.label", b"v", 0).unwrap();
        assert_eq!(get(&s, &bob, f.ino, "security.label").unwrap(), b"v");
        assert_eq!(set(&s, &root, f.ino, "security.capability", b"\x01", 0), Err(Errno::EOPNOTSUPP));
        assert_eq!(get(&s, &root, f.ino, "security.capability"), Err(Errno::ENODATA));
    }

    #[test]
    fn xattrs_change_ctime_and_go_with_the_inode() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let f = mk(&s, &root, ROOT_INO, "f", false, 0o644);
        let before = getattr(&s, f.ino).unwrap().ctime;
        std::thread::sleep(std::time::Duration::from_millis(5));
        set(&s, &root, f.ino, "user.a", b"1", 0).unwrap();
        let after_set = getattr(&s, f.ino).unwrap().ctime;
        assert!(after_set > before, "{after_set:?} > {before:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
        ask(&s, &root, Request::RemoveXattr { ino: f.ino, name: b"user.a".to_vec() }).unwrap();
        assert!(getattr(&s, f.ino).unwrap().ctime > after_set);
        // A get changes nothing.
        let t = getattr(&s, f.ino).unwrap().ctime;
        let _ = get(&s, &root, f.ino, "user.a");
        assert_eq!(getattr(&s, f.ino).unwrap().ctime, t);
        // Freed with the last link: a second link keeps them, the last takes them.
        set(&s, &root, f.ino, "user.a", b"1", 0).unwrap();
        set(&s, &root, f.ino, "trusted.b", b"2", 0).unwrap();
        let other = mk(&s, &root, ROOT_INO, "other", false, 0o644);
        set(&s, &root, other.ino, "user.a", b"kept", 0).unwrap();
        ask(&s, &root, Request::Link { ino: f.ino, new_parent: ROOT_INO, new_name: b"g".to_vec() }).unwrap();
        ask(&s, &root, Request::Unlink { parent: ROOT_INO, name: b"f".to_vec() }).unwrap();
        assert_eq!(xattr_rows(&s), 3);
        ask(&s, &root, Request::Unlink { parent: ROOT_INO, name: b"g".to_vec() }).unwrap();
        assert_eq!(xattr_rows(&s), 1, "the freed inode's attributes went");
        assert_eq!(get(&s, &root, other.ino, "user.a").unwrap(), b"kept");
        // A directory's go with rmdir, a replaced file's with the rename.
        let d = mk(&s, &root, ROOT_INO, "d", true, 0o755);
        set(&s, &root, d.ino, "user.d", b"", 0).unwrap();
        ask(&s, &root, Request::Rmdir { parent: ROOT_INO, name: b"d".to_vec() }).unwrap();
        let r = |src: &str, dst: &str| Request::Rename {
            src_parent: ROOT_INO,
            src_name: src.as_bytes().to_vec(),
            dst_parent: ROOT_INO,
            dst_name: dst.as_bytes().to_vec(),
            flags: 0,
        };
        mk(&s, &root, ROOT_INO, "new", false, 0o644);
        ask(&s, &root, r("new", "other")).unwrap();
        assert_eq!(xattr_rows(&s), 0);
    }

    #[test]
    fn an_inode_holds_a_bounded_amount_of_xattrs() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let f = mk(&s, &root, ROOT_INO, "f", false, 0o644);
        let big = vec![1u8; dafne_proto::XATTR_SIZE_MAX];
        // One maximal value fits, twice does not.
        set(&s, &root, f.ino, "user.a", &big, 0).unwrap();
        assert_eq!(set(&s, &root, f.ino, "user.b", &big, 0), Err(Errno::ENOSPC));
        // Replacing counts the new value, not old + new.
        set(&s, &root, f.ino, "user.a", &big, 0).unwrap();
        // Small ones up to the budget, then ENOSPC; removing frees room.
        let mut n = 0;
        let err = loop {
            match set(&s, &root, f.ino, &format!("user.{n:05}"), &[0; 100], 0) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(err, Errno::ENOSPC);
        let used = 6 + big.len() + 16 + n * (10 + 100 + 16);
        assert!(used <= XATTR_INODE_BUDGET && used + 126 > XATTR_INODE_BUDGET, "{n} {used}");
        ask(&s, &root, Request::RemoveXattr { ino: f.ino, name: b"user.a".to_vec() }).unwrap();
        set(&s, &root, f.ino, &format!("user.{n:05}"), &[0; 100], 0).unwrap();
        // Another inode has its own budget.
        let g = mk(&s, &root, ROOT_INO, "g", false, 0o644);
        set(&s, &root, g.ino, "user.a", &big, 0).unwrap();
    }

    fn ren(s: &RedbStore, c: &Cred, sp: Ino, sn: &str, dp: Ino, dn: &str, flags: u32) -> Result<Response, Errno> {
        let req = Request::Rename {
            src_parent: sp,
            src_name: sn.as_bytes().to_vec(),
            dst_parent: dp,
            dst_name: dn.as_bytes().to_vec(),
            flags,
        };
        ask(s, c, req)
    }

    fn lookup(s: &RedbStore, parent: Ino, name: &str) -> Result<Attr, Errno> {
        match ask(s, &Cred::root(), Request::Lookup { parent, name: name.as_bytes().to_vec() })? {
            Response::Entry { attr } => Ok(attr),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn rename_noreplace_refuses_an_existing_name_in_the_transaction() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let a = mk(&s, &root, ROOT_INO, "a", false, 0o644);
        let b = mk(&s, &root, ROOT_INO, "b", false, 0o644);
        let nr = dafne_proto::RENAME_NOREPLACE;
        assert_eq!(ren(&s, &root, ROOT_INO, "a", ROOT_INO, "b", nr), Err(Errno::EEXIST));
        assert_eq!(lookup(&s, ROOT_INO, "b").unwrap().ino, b.ino, "nothing replaced");
        // Also a second name of the same file exists.
        ask(&s, &root, Request::Link { ino: a.ino, new_parent: ROOT_INO, new_name: b"a2".to_vec() }).unwrap();
        assert_eq!(ren(&s, &root, ROOT_INO, "a", ROOT_INO, "a2", nr), Err(Errno::EEXIST));
        ren(&s, &root, ROOT_INO, "a", ROOT_INO, "c", nr).unwrap();
        assert_eq!(lookup(&s, ROOT_INO, "c").unwrap().ino, a.ino);
        assert_eq!(ren(&s, &root, ROOT_INO, "missing", ROOT_INO, "x", nr), Err(Errno::ENOENT));
        // Both flags, or an unknown one: EINVAL.
        let both = nr | dafne_proto::RENAME_EXCHANGE;
        assert_eq!(ren(&s, &root, ROOT_INO, "c", ROOT_INO, "b", both), Err(Errno::EINVAL));
        assert_eq!(ren(&s, &root, ROOT_INO, "c", ROOT_INO, "b", 4), Err(Errno::EINVAL));
    }

    #[test]
    fn rename_exchange_swaps_names_parents_and_links() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let ex = dafne_proto::RENAME_EXCHANGE;
        let p1 = mk(&s, &root, ROOT_INO, "p1", true, 0o755);
        let p2 = mk(&s, &root, ROOT_INO, "p2", true, 0o755);
        let f = mk(&s, &root, p1.ino, "f", false, 0o644);
        let g = mk(&s, &root, p2.ino, "g", false, 0o644);
        // Two files in one directory and across two.
        let h = mk(&s, &root, p1.ino, "h", false, 0o644);
        ren(&s, &root, p1.ino, "f", p1.ino, "h", ex).unwrap();
        assert_eq!((lookup(&s, p1.ino, "f").unwrap().ino, lookup(&s, p1.ino, "h").unwrap().ino), (h.ino, f.ino));
        ren(&s, &root, p1.ino, "h", p2.ino, "g", ex).unwrap();
        assert_eq!((lookup(&s, p1.ino, "h").unwrap().ino, lookup(&s, p2.ino, "g").unwrap().ino), (g.ino, f.ino));
        // Both must exist.
        assert_eq!(ren(&s, &root, p1.ino, "h", p2.ino, "none", ex), Err(Errno::ENOENT));
        assert_eq!(ren(&s, &root, p1.ino, "none", p2.ino, "g", ex), Err(Errno::ENOENT));
        // A directory with a file across parents: "..", and one link moves.
        let sub = mk(&s, &root, p1.ino, "sub", true, 0o755);
        mk(&s, &root, sub.ino, "inside", false, 0o644);
        let n1 = getattr(&s, p1.ino).unwrap().nlink;
        let n2 = getattr(&s, p2.ino).unwrap().nlink;
        ren(&s, &root, p1.ino, "sub", p2.ino, "g", ex).unwrap();
        assert_eq!(lookup(&s, p2.ino, "g").unwrap().ino, sub.ino);
        assert_eq!(lookup(&s, p1.ino, "sub").unwrap().ino, f.ino);
        assert_eq!(lookup(&s, sub.ino, "..").unwrap().ino, p2.ino, "the directory's parent follows it");
        assert_eq!(getattr(&s, p1.ino).unwrap().nlink, n1 - 1);
        assert_eq!(getattr(&s, p2.ino).unwrap().nlink, n2 + 1);
        assert!(lookup(&s, sub.ino, "inside").is_ok(), "its contents stay");
        // Two directories across parents: both parents change, counts stay.
        let d1 = mk(&s, &root, p1.ino, "d1", true, 0o755);
        let (n1, n2) = (getattr(&s, p1.ino).unwrap().nlink, getattr(&s, p2.ino).unwrap().nlink);
        ren(&s, &root, p1.ino, "d1", p2.ino, "g", ex).unwrap();
        assert_eq!(lookup(&s, d1.ino, "..").unwrap().ino, p2.ino);
        assert_eq!(lookup(&s, sub.ino, "..").unwrap().ino, p1.ino);
        assert_eq!((getattr(&s, p1.ino).unwrap().nlink, getattr(&s, p2.ino).unwrap().nlink), (n1, n2));
        // A directory may not be swapped into itself, on either side.
        let inner = mk(&s, &root, d1.ino, "inner", false, 0o644);
        assert_eq!(ren(&s, &root, p2.ino, "g", d1.ino, "inner", ex), Err(Errno::EINVAL));
        assert_eq!(ren(&s, &root, d1.ino, "inner", p2.ino, "g", ex), Err(Errno::EINVAL));
        assert_eq!(lookup(&s, d1.ino, "inner").unwrap().ino, inner.ino);
        // Two names of one file: nothing happens.
        ask(&s, &root, Request::Link { ino: inner.ino, new_parent: d1.ino, new_name: b"again".to_vec() }).unwrap();
        ren(&s, &root, d1.ino, "inner", d1.ino, "again", ex).unwrap();
        assert_eq!(lookup(&s, d1.ino, "again").unwrap().ino, inner.ino);
        // Readdir still lists every name once.
        match ask(&s, &root, Request::Readdir { ino: p1.ino, cookie: 0, max_entries: 100 }).unwrap() {
            Response::Dir { entries, eof } => {
                assert!(eof);
                let mut names: Vec<_> = entries.iter().map(|e| String::from_utf8(e.name.clone()).unwrap()).collect();
                names.sort();
                assert_eq!(names, ["d1", "f", "h", "sub"]);
                let sub_entry = entries.iter().find(|e| e.name == b"sub").unwrap();
                assert_eq!(sub_entry.ino, f.ino);
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn grow_to_only_grows_and_sizes_past_the_largest_file_are_refused() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let f = mk(&s, &root, ROOT_INO, "f", false, 0o644);
        let size_of = |r: Result<Response, Errno>| match r.unwrap() {
            Response::Attr { attr } => attr.size,
            r => panic!("{r:?}"),
        };
        let grow = |n| Request::SetAttr { ino: f.ino, set: SetAttr { grow_to: Some(n), ..Default::default() } };
        assert_eq!(size_of(ask(&s, &root, grow(100))), 100);
        assert_eq!(size_of(ask(&s, &root, grow(50))), 100, "grow_to never shrinks");
        for set in [
            SetAttr { grow_to: Some(u64::MAX), ..Default::default() },
            SetAttr { size: Some(dafne_proto::io::MAX_FILE_SIZE + 1), ..Default::default() },
        ] {
            assert_eq!(ask(&s, &root, Request::SetAttr { ino: f.ino, set }).map(|_| ()), Err(Errno::EFBIG));
        }
        assert_eq!(size_of(ask(&s, &root, grow(dafne_proto::io::MAX_FILE_SIZE))), dafne_proto::io::MAX_FILE_SIZE);
    }

    /// Lazy commits (module docs): a batch of lazy size publishes commits
    /// without an fsync, is seen at once, and is made durable by the next
    /// durable commit; a batch that also changes anything else, or a
    /// publish without the flag (fsync's), commits durably.
    #[test]
    fn lazy_size_publishes_commit_without_an_fsync_until_the_next_durable_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let root = Cred::root();
        let ino = {
            let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
            let f = mk(&s, &root, ROOT_INO, "f", false, 0o644);
            let publish = |n, lazy| Request::SetAttr {
                ino: f.ino,
                set: SetAttr { grow_to: Some(n), mtime: Some(TimeSet::Now), lazy, ..Default::default() },
            };
            let (durable, lazy) = (s.commits().unwrap(), s.lazy_commits().unwrap());
            ask(&s, &root, publish(100, true)).unwrap();
            assert_eq!((s.commits().unwrap(), s.lazy_commits().unwrap()), (durable, lazy + 1));
            let seen = |s: &RedbStore| match ask(s, &root, Request::GetAttr { ino: f.ino }).unwrap() {
                Response::Attr { attr } | Response::Entry { attr } => attr.size,
                r => panic!("{r:?}"),
            };
            assert_eq!(seen(&s), 100, "a lazy commit is seen at once");
            // With another change in the same batch: durable.
            let job = |req| Job {
                cred: root.clone(),
                ops: vec![CompoundOp { chain: false, req }],
                protected: None,
                replay: None,
            };
            let mixed = [
                job(publish(200, true)),
                job(Request::Create {
                    parent: ROOT_INO,
                    name: b"g".to_vec(),
                    mode: 0o644,
                    exclusive: true,
                    hint: None,
                }),
            ];
            s.execute(&mixed).unwrap();
            assert_eq!((s.commits().unwrap(), s.lazy_commits().unwrap()), (durable + 1, lazy + 1));
            // fsync's publish: durable.
            ask(&s, &root, publish(300, false)).unwrap();
            assert_eq!((s.commits().unwrap(), s.lazy_commits().unwrap()), (durable + 2, lazy + 1));
            // A lazy one last, then a durable change of something else.
            ask(&s, &root, publish(400, true)).unwrap();
            mk(&s, &root, ROOT_INO, "h", false, 0o644);
            assert_eq!(seen(&s), 400);
            drop(s);
            let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
            assert_eq!(seen(&s), 400, "the lazy commit became durable with the next durable one");
            // Lazy again, then settled: one durable commit, nothing lazy left.
            ask(&s, &root, publish(500, true)).unwrap();
            assert!(s.lazy_deadline().is_some());
            let durable = s.commits().unwrap();
            s.settle().unwrap();
            assert_eq!(s.commits().unwrap(), durable + 1);
            assert!(s.lazy_deadline().is_none());
            s.settle().unwrap();
            assert_eq!(s.commits().unwrap(), durable + 1, "nothing to settle: no commit");
            // Past the deadline a lazy publish commits durably.
            ask(&s, &root, publish(600, true)).unwrap();
            std::thread::sleep(LAZY_DURABLE_WITHIN + std::time::Duration::from_millis(50));
            let (durable, lazy) = (s.commits().unwrap(), s.lazy_commits().unwrap());
            ask(&s, &root, publish(700, true)).unwrap();
            assert_eq!((s.commits().unwrap(), s.lazy_commits().unwrap()), (durable + 1, lazy));
            // The bit on anything but a publish (a size, a mode) is
            // ignored: durable.
            let (durable, lazy) = (s.commits().unwrap(), s.lazy_commits().unwrap());
            let set = SetAttr { size: Some(800), lazy: true, ..Default::default() };
            ask(&s, &root, Request::SetAttr { ino: f.ino, set }).unwrap();
            let set = SetAttr { mode: Some(0o600), lazy: true, ..Default::default() };
            ask(&s, &root, Request::SetAttr { ino: f.ino, set }).unwrap();
            assert_eq!((s.commits().unwrap(), s.lazy_commits().unwrap()), (durable + 2, lazy));
            f.ino
        };
        let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
        match ask(&s, &root, Request::GetAttr { ino }).unwrap() {
            Response::Attr { attr } | Response::Entry { attr } => {
                assert_eq!(attr.size, 800, "every lazy commit became durable with a later durable one")
            }
            r => panic!("{r:?}"),
        }
    }

    /// The lazy log (module docs, "Lazy commits"): opening the store
    /// replays a logged change onto an inode still as it was before it (a
    /// lazy commit a crash lost), and onto no other (one a durable change
    /// came after, whose commit a crash kept but whose log was not yet
    /// emptied).
    #[test]
    fn the_lazy_log_replays_lost_changes_and_never_undoes_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let (log, saved) = (lazy_log_path(&path), dir.path().join("saved.redb"));
        let root = Cred::root();
        let publish = |ino, n| Request::SetAttr {
            ino,
            set: SetAttr { grow_to: Some(n), mtime: Some(TimeSet::Now), lazy: true, ..Default::default() },
        };
        let size = |s: &RedbStore, ino| match ask(s, &root, Request::GetAttr { ino }).unwrap() {
            Response::Attr { attr } | Response::Entry { attr } => attr.size,
            r => panic!("{r:?}"),
        };
        let ino = {
            let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
            mk(&s, &root, ROOT_INO, "f", false, 0o644).ino
        };
        // The store before the lazy commit, as a crash would leave it.
        std::fs::copy(&path, &saved).unwrap();
        let logged = {
            let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
            ask(&s, &root, publish(ino, 100)).unwrap();
            std::fs::read(&log).unwrap()
        };
        assert!(!logged.is_empty(), "a lazy commit wrote no record");
        std::fs::copy(&saved, &path).unwrap();
        std::fs::write(&log, &logged).unwrap();
        {
            let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
            assert_eq!(size(&s, ino), 100, "the lost lazy commit was not replayed");
            assert!(std::fs::read(&log).unwrap().is_empty(), "the replayed log was kept");
            // A lazy grow, then a durable truncate; the crash comes before
            // the log is emptied.
            ask(&s, &root, publish(ino, 200)).unwrap();
            let logged = std::fs::read(&log).unwrap();
            let set = SetAttr { size: Some(5), ..Default::default() };
            ask(&s, &root, Request::SetAttr { ino, set }).unwrap();
            assert!(std::fs::read(&log).unwrap().is_empty(), "a durable commit left the log");
            drop(s);
            std::fs::write(&log, &logged).unwrap();
        }
        let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
        assert_eq!(size(&s, ino), 5, "the replay undid a durable truncate");
        // A torn record is ignored.
        drop(s);
        std::fs::write(&log, &logged[..logged.len() - 1]).unwrap();
        std::fs::copy(&saved, &path).unwrap();
        let s = RedbStore::open(&path, LayoutPolicy::default()).unwrap();
        assert_eq!(size(&s, ino), 0);
    }

    #[test]
    fn rename_exchange_checks_permissions_and_sticky_bits() {
        let (_d, s) = fresh_store();
        let root = Cred::root();
        let ex = dafne_proto::RENAME_EXCHANGE;
        let (alice, bob) = (Cred::new(1000, 1000), Cred::new(1001, 1001));
        let tmp = mk(&s, &root, ROOT_INO, "tmp", true, 0o1777);
        mk(&s, &alice, tmp.ino, "a", false, 0o644);
        mk(&s, &bob, tmp.ino, "b", false, 0o644);
        // Sticky: bob may not move alice's file out of its name.
        assert_eq!(ren(&s, &bob, tmp.ino, "b", tmp.ino, "a", ex), Err(Errno::EPERM));
        assert_eq!(ren(&s, &bob, tmp.ino, "a", tmp.ino, "b", ex), Err(Errno::EPERM));
        ren(&s, &root, tmp.ino, "a", tmp.ino, "b", ex).unwrap();
        // Write permission on both directories.
        let work = mk(&s, &root, ROOT_INO, "work", true, 0o777);
        let ro = mk(&s, &alice, work.ino, "ro", true, 0o755);
        let rw = mk(&s, &alice, work.ino, "rw", true, 0o755);
        mk(&s, &alice, ro.ino, "x", false, 0o644);
        mk(&s, &alice, rw.ino, "y", false, 0o644);
        let chmod = SetAttr { mode: Some(0o555), ..SetAttr::default() };
        ask(&s, &alice, Request::SetAttr { ino: ro.ino, set: chmod }).unwrap();
        assert_eq!(ren(&s, &alice, rw.ino, "y", ro.ino, "x", ex), Err(Errno::EACCES));
        // A directory changing parent needs write permission on itself.
        let theirs = mk(&s, &root, rw.ino, "theirs", true, 0o755);
        let other = mk(&s, &alice, work.ino, "other", true, 0o777);
        mk(&s, &alice, other.ino, "z", false, 0o644);
        assert_eq!(ren(&s, &alice, rw.ino, "theirs", other.ino, "z", ex), Err(Errno::EACCES));
        assert_eq!(lookup(&s, rw.ino, "theirs").unwrap().ino, theirs.ino);
    }

    /// A store from before `orphans_v2`: its orphans move over on open, on
    /// every server of the policy, and the old table is left empty.
    fn once(cred: &Cred, req: Request, client: u64, seq: u64, acked_below: u64) -> Job {
        Job {
            cred: cred.clone(),
            ops: vec![CompoundOp { chain: false, req }],
            protected: None,
            replay: Some(dafne_proto::SessionSeq { client, seq, acked_below }),
        }
    }

    fn create(name: &str) -> Request {
        Request::Create { parent: ROOT_INO, name: name.as_bytes().to_vec(), mode: 0o644, exclusive: true, hint: None }
    }

    fn reply_rows(store: &RedbStore) -> (u64, u64) {
        let r = store.db.begin_read().unwrap();
        (r.open_table(REPLIES).unwrap().len().unwrap(), r.open_table(REPLIES_BY_TIME).unwrap().len().unwrap())
    }

    #[test]
    fn a_retried_job_gets_its_first_answer_and_runs_once() {
        let (dir, store) = fresh_store();
        let root = Cred::root();
        let first = store.execute(&[once(&root, create("a"), 7, 1, 1)]).unwrap();
        let ino = match &first[0][..] {
            [Ok(Response::Entry { attr })] => attr.ino,
            other => panic!("{other:?}"),
        };
        // Retried alone, and twice more inside one batch (the second reads
        // the first's uncommitted entry): the first answer each time.
        assert_eq!(store.execute(&[once(&root, create("a"), 7, 1, 1)]).unwrap(), first);
        let both = store.execute(&[once(&root, create("b"), 7, 2, 1), once(&root, create("b"), 7, 2, 1)]).unwrap();
        assert_eq!(both[0], both[1]);
        assert!(both[0][0].is_ok());
        // The same name under another seq or client, or with no sequence,
        // is a new request: EEXIST.
        assert_eq!(store.execute(&[once(&root, create("a"), 7, 3, 1)]).unwrap()[0], vec![Err(Errno::EEXIST)]);
        assert_eq!(store.execute(&[once(&root, create("a"), 8, 1, 1)]).unwrap()[0], vec![Err(Errno::EEXIST)]);
        assert_eq!(ask(&store, &root, create("a")), Err(Errno::EEXIST));
        // An unlink retried after it ran: Ok again, not ENOENT.
        let unlink = Request::Unlink { parent: ROOT_INO, name: b"a".to_vec() };
        assert_eq!(store.execute(&[once(&root, unlink.clone(), 7, 4, 1)]).unwrap()[0], vec![Ok(Response::Done)]);
        assert_eq!(store.execute(&[once(&root, unlink.clone(), 7, 4, 1)]).unwrap()[0], vec![Ok(Response::Done)]);
        assert_eq!(lookup(&store, ROOT_INO, "a"), Err(Errno::ENOENT));
        // Cached answers survive a reopen (they were committed with the op).
        drop(store);
        let store = RedbStore::open(&dir.path().join("meta.redb"), LayoutPolicy::default()).unwrap();
        assert_eq!(store.execute(&[once(&root, create("a"), 7, 1, 1)]).unwrap(), first);
        assert_ne!(ino, 0);
        // acked_below 4 drops client 7's seqs 1..=3 (its errors included)
        // and keeps seq 4 (answered from the cache, nothing added).
        let before = reply_rows(&store);
        store.execute(&[once(&root, unlink.clone(), 7, 4, 4)]).unwrap();
        let after = reply_rows(&store);
        assert_eq!(before.0 - after.0, 3, "acked answers were kept: {before:?} -> {after:?}");
        assert_eq!(after.0, after.1, "the age index and the cache disagree");
        // A new seq runs: "a" is gone, so this is a new file.
        let again = store.execute(&[once(&root, create("a"), 7, 5, 4)]).unwrap();
        assert!(matches!(&again[0][..], [Ok(Response::Entry { attr })] if attr.ino != ino));
    }

    #[test]
    fn a_late_copy_below_the_floor_is_refused_and_the_floor_never_moves_down() {
        let (_dir, store) = fresh_store();
        let root = Cred::root();
        // Seq 1 ran and was answered; the client has since acknowledged it
        // (acked_below 2), so its entry is gone.
        assert!(store.execute(&[once(&root, create("a"), 7, 1, 1)]).unwrap()[0][0].is_ok());
        let unlink = Request::Unlink { parent: ROOT_INO, name: b"a".to_vec() };
        assert_eq!(store.execute(&[once(&root, unlink, 7, 2, 2)]).unwrap()[0], vec![Ok(Response::Done)]);
        // A late copy of seq 1 (sent on a connection the client gave up
        // on) must not create "a" again.
        assert_eq!(store.execute(&[once(&root, create("a"), 7, 1, 1)]).unwrap()[0], vec![Err(Errno::ESTALE)]);
        assert_eq!(lookup(&store, ROOT_INO, "a"), Err(Errno::ENOENT));
        // A lower acked_below does not bring the floor down.
        assert_eq!(store.execute(&[once(&root, create("b"), 7, 3, 0)]).unwrap()[0].len(), 1);
        assert_eq!(store.execute(&[once(&root, create("c"), 7, 1, 0)]).unwrap()[0], vec![Err(Errno::ESTALE)]);
    }

    #[test]
    fn an_answer_too_large_to_keep_is_kept_as_an_error_not_run_twice() {
        let (_dir, store) = fresh_store();
        let root = Cred::root();
        for i in 0..300 {
            ask(&store, &root, create(&format!("{i:0>200}"))).unwrap();
        }
        // A mkdir with 15 full listings: an answer over 64 KiB.
        let mut ops = vec![CompoundOp {
            chain: false,
            req: Request::Mkdir { parent: ROOT_INO, name: b"d".to_vec(), mode: 0o755 },
        }];
        for _ in 0..15 {
            ops.push(CompoundOp {
                chain: false,
                req: Request::Readdir { ino: ROOT_INO, cookie: 0, max_entries: 4096 },
            });
        }
        let job = |ops: Vec<CompoundOp>| Job {
            cred: root.clone(),
            ops,
            protected: None,
            replay: Some(dafne_proto::SessionSeq { client: 5, seq: 1, acked_below: 1 }),
        };
        let first = store.execute(&[job(ops.clone())]).unwrap();
        assert_eq!(first[0].len(), 16);
        assert_eq!(
            store.execute(&[job(ops)]).unwrap()[0],
            vec![Err(Errno::EIO)],
            "the retry neither re-ran nor got 1 MiB"
        );
    }

    #[test]
    fn old_answers_are_purged() {
        let (_dir, store) = fresh_store();
        let root = Cred::root();
        for seq in 1..=3 {
            store.execute(&[once(&root, create(&format!("f{seq}")), 9, seq, 1)]).unwrap();
        }
        assert_eq!(reply_rows(&store), (4, 4), "three answers and the client's floor");
        let later = unix_ms() + REPLY_TTL.as_millis() as u64 + 1;
        let txn = store.db.begin_write().unwrap();
        {
            let mut replies = txn.open_table(REPLIES).unwrap();
            let mut by_time = txn.open_table(REPLIES_BY_TIME).unwrap();
            // Not yet expired: nothing goes (the cap is far).
            assert_eq!(purge_replies(&mut replies, &mut by_time, unix_ms(), usize::MAX).unwrap(), 0);
            // Expired, at most `limit` per call, oldest first.
            assert_eq!(purge_replies(&mut replies, &mut by_time, later, 2).unwrap(), 2);
            assert_eq!(purge_replies(&mut replies, &mut by_time, later, 2).unwrap(), 2);
            assert_eq!(replies.len().unwrap(), 0);
        }
        txn.commit().unwrap();
        assert_eq!(reply_rows(&store), (0, 0));
    }

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

    fn open_layout(s: &RedbStore, ino: Ino) -> Layout {
        match ask(s, &Cred::root(), Request::Open { ino, flags: dafne_proto::OPEN_READ }) {
            Ok(Response::Opened { layout, .. }) => layout,
            other => panic!("open: {other:?}"),
        }
    }

    #[test]
    fn layouts_place_slots_on_the_heads_of_consecutive_chains() {
        let dir = tempfile::tempdir().unwrap();
        let policy = LayoutPolicy { servers: vec![0, 1, 2], default_stripe_count: 2, ..LayoutPolicy::default() };
        let s = RedbStore::open(&dir.path().join("meta.redb"), policy.clone()).unwrap();
        let chains = s.chains();
        assert_eq!(chains, policy.chains().unwrap());
        for name in ["a", "b", "c", "d"] {
            let l = open_layout(&s, mk(&s, &Cred::root(), ROOT_INO, name, false, 0o644).ino);
            let first = (l.object_id % chains.len() as u64) as usize;
            let heads: Vec<u32> = (0..2).map(|i| chains[(first + i) % chains.len()].replicas[0].server).collect();
            assert_eq!(l.servers, heads, "{l:?}");
        }
    }

    #[test]
    fn a_store_from_before_chains_opens_with_its_layouts_and_gets_a_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let policy = LayoutPolicy { servers: vec![0, 1, 2], ..LayoutPolicy::default() };
        let (ino, before) = {
            let s = RedbStore::open(&path, policy.clone()).unwrap();
            let ino = mk(&s, &Cred::root(), ROOT_INO, "f", false, 0o644).ino;
            (ino, open_layout(&s, ino))
        };
        // What a store made before the chain table looks like.
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            assert!(txn.delete_table(CHAINS).unwrap());
            assert!(txn.open_table(COUNTERS).unwrap().remove(CHAIN_VERSION_KEY).unwrap().is_some());
            txn.commit().unwrap();
        }
        let s = RedbStore::open(&path, policy.clone()).unwrap();
        assert_eq!(open_layout(&s, ino), before);
        assert_eq!(s.chains(), policy.chains().unwrap());
        let r = s.db.begin_read().unwrap();
        assert_eq!(r.open_table(CHAINS).unwrap().len().unwrap(), 3);
    }

    #[test]
    fn chain_rows_meta_changed_are_durable_and_raise_the_highest_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let two = LayoutPolicy { servers: vec![0, 1], ..LayoutPolicy::default() };
        let s = RedbStore::open(&path, two.clone()).unwrap();
        let off = crate::chains::mark_offline(&s.chains(), &[1]);
        s.update_chains(&off).unwrap();
        assert_eq!(s.chains()[1], off[0]);
        drop(s);
        let s = RedbStore::open(&path, two).unwrap();
        assert_eq!(s.chains()[1].version, 2, "read back as written");
        assert_eq!(s.chains()[1].replicas[0].state, dafne_proto::ReplicaState::Offline);
        drop(s);
        // A row that goes and comes back starts above the bumped version.
        drop(RedbStore::open(&path, LayoutPolicy { servers: vec![0], ..LayoutPolicy::default() }).unwrap());
        let s = RedbStore::open(&path, LayoutPolicy { servers: vec![0, 1], ..LayoutPolicy::default() }).unwrap();
        assert_eq!(s.chains()[1].version, 3);
    }

    #[test]
    fn an_offline_replica_moved_to_the_end_stays_offline_across_an_open() {
        // mark_offline moves the replica to the end of its chain: the row
        // names the same servers in another order, which is not a change
        // of configuration. Failed before reconcile compared the servers
        // as a set: the open rebuilt the row (io-0 serving at the head
        // again) and bumped its version.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let two = LayoutPolicy { servers: vec![0, 1], replicas: 2, ..LayoutPolicy::default() };
        let s = RedbStore::open(&path, two.clone()).unwrap();
        let off = crate::chains::mark_offline(&s.chains(), &[0]);
        s.update_chains(&off).unwrap();
        let written = s.chains();
        drop(s);
        let s = RedbStore::open(&path, two).unwrap();
        assert_eq!(s.chains(), written, "the stored rows, as meta changed them");
    }

    #[test]
    fn the_chain_table_is_kept_and_reconciled_across_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let three = LayoutPolicy { servers: vec![0, 1, 2], ..LayoutPolicy::default() };
        drop(RedbStore::open(&path, three.clone()).unwrap());
        // A row changed in the store (as a later membership step would)
        // survives an open that builds the same servers.
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(CHAINS).unwrap();
                let mut c = crate::chains::decode(1, t.get(1).unwrap().unwrap().value()).unwrap();
                c.version = 5;
                t.insert(1, crate::chains::encode(&c).as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        let versions = |s: &RedbStore| s.chains().iter().map(|c| c.version).collect::<Vec<_>>();
        let s = RedbStore::open(&path, three).unwrap();
        assert_eq!(versions(&s), vec![1, 5, 1]);
        drop(s);
        // Two io servers in two-server chains: rows change, one goes.
        let two = LayoutPolicy { servers: vec![0, 1], replicas: 2, ..LayoutPolicy::default() };
        let s = RedbStore::open(&path, two.clone()).unwrap();
        assert_eq!(versions(&s), vec![2, 6]);
        assert_eq!(s.chains().iter().map(|c| c.replicas.len()).collect::<Vec<_>>(), vec![2, 2]);
        drop(s);
        let s = RedbStore::open(&path, two).unwrap();
        assert_eq!(versions(&s), vec![2, 6], "read back as written");
        drop(s);
        // A damaged row is refused, and an impossible table too.
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(CHAINS).unwrap().insert(0, &[9u8][..]).unwrap();
            txn.commit().unwrap();
        }
        let e = RedbStore::open(&path, LayoutPolicy { servers: vec![0, 1], ..LayoutPolicy::default() }).unwrap_err();
        assert!(matches!(e, StoreError::CorruptChain { id: 0 }), "{e}");
        let e = RedbStore::open(&path, LayoutPolicy { servers: vec![0], replicas: 2, ..LayoutPolicy::default() })
            .unwrap_err();
        assert!(e.to_string().contains("replicas = 2 but the cluster has 1 io servers"), "{e}");
    }

    #[test]
    fn a_chains_version_never_goes_back_when_its_io_server_leaves_and_comes_back() {
        // Io server 2 leaves (io_servers 3 -> 2) and comes back: its chain's
        // row goes and returns. A version must name one row of a chain for
        // good (docs/REPLICATION.md: requests carry the chain's version),
        // so the returning row's version is above any the chain had.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let policy =
            |n: u32, replicas: u32| LayoutPolicy { servers: (0..n).collect(), replicas, ..LayoutPolicy::default() };
        let mut seen: std::collections::HashMap<(u32, u64), Vec<u32>> = Default::default();
        let mut last: std::collections::HashMap<u32, u64> = Default::default();
        for (n, r) in [(3, 1), (3, 2), (2, 1), (3, 2), (2, 2), (3, 1)] {
            let s = RedbStore::open(&path, policy(n, r)).unwrap();
            for c in s.chains() {
                let servers: Vec<u32> = c.replicas.iter().map(|x| x.server).collect();
                let named = seen.entry((c.id, c.version)).or_insert_with(|| servers.clone());
                assert_eq!(
                    *named, servers,
                    "chain {} version {} names two rows (open of {n} servers, R {r})",
                    c.id, c.version
                );
                let prev = last.insert(c.id, c.version).unwrap_or(0);
                assert!(
                    c.version >= prev,
                    "chain {} went from version {prev} to {} (open of {n} servers, R {r})",
                    c.id,
                    c.version
                );
            }
        }
    }
}
