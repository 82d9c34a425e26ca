//! The file system in dafne's terms, without the kernel: namespace
//! operations as the caller, open files, the size rule.
//!
//! # Open files
//! A handle (`fh`) is an opened dafne file: its layout and the capability
//! the io servers check, shared (`Arc`) by the requests that use it. Per
//! inode the table keeps what this mount knows beyond meta: the end of its
//! own writes since the last truncation (`written_end`), meta's size as last
//! seen, and whether bytes were written since the size was last published.
//! Attributes of an inode this mount has open report
//! `max(meta size, written_end)`; reads are clamped to that size (the io
//! servers read holes as zeros, so an unclamped read would invent bytes).
//!
//! # Read-ahead
//! With a [`ReadAhead`] (`with_readahead`), each handle has a read-ahead
//! [`Stream`]: sequential reads through it are answered from units fetched
//! ahead, straight from their registered slot into the reply. Each open
//! inode has a change log shared by its handles' streams; this mount's
//! writes and truncations of the inode are recorded there (with the bytes
//! they changed) once the servers have them, which drops the units of
//! every window of the file that they overlap (`dafne_client::readahead`).
//! A new open starts with nothing (close-to-open).
//!
//! # Write-behind
//! With a [`WriteBehind`] (`with_write_behind`), a write returns once its
//! bytes are copied into the daemon's registered memory; the io servers get
//! them from there while the application goes on (`dafne_client::
//! writebehind`: bounded memory, overlapping writes in order, the first
//! error kept for the file). Everything that must see the bytes waits for
//! the file's writes in flight first: a read, a truncate, `fallocate`, an
//! `O_TRUNC` open; and everything that reports to the application drains
//! them and returns their error: `flush` (each `close(2)`), `fsync`, the
//! release of a lock (so the next holder, on any mount, reads them), and
//! the next write. The change a write makes is recorded for read-ahead when
//! it is posted and again when it has landed, so a unit another thread's
//! read fetched ahead while the write was on its way is dropped too (review
//! finding: recorded only at posting, such a unit was kept and served
//! later); reads of the file also wait for its writes before they fetch.
//! `O_SYNC` needs nothing here: the kernel follows each such write with an
//! `fsync`.
//!
//! # Publishing the size
//! The io servers hold the bytes; meta holds the size. After writes, the
//! size and mtime go to meta on `flush` (each `close(2)`, so the size is exact
//! when `close` returns), `fsync`, `release` and a lock's release: the size
//! becomes the largest byte any io server stores (a `Stat` of the servers
//! of the layout this mount wrote the file on since the last check, which
//! also writes the file's cached units back and runs the write verifier), sent as a grow-only size (`SetAttr::grow_to`, one
//! round trip to meta, `lazy`: no fsync in meta, as `close(2)` promises
//! no durability; `fsync` publishes durably), as in
//! `dafne_client::file::File`. This runs as the
//! daemon's own (root) session: the writer was allowed to write when it
//! opened; publishing what it wrote must not fail on a later chmod.
//!
//! # Open in meta
//! Every handle is one open in meta, released at `release`; so are the
//! short opens made for a capability the handle lacks (below), released
//! once used. Meta keeps the data of a file whose last name is gone while
//! any open of it is held, so an open file removed on this mount reads its
//! own bytes until its last `close`, however long that takes.
//!
//! # Whose rights
//! Every namespace operation runs as the caller (`MetaSession::as_caller`, with the caller's groups when an answer may depend on them: `crate::fuse`'s `Lazy`), so
//! the metadata server applies POSIX rules to the right user and its errno
//! is the answer. Exceptions, each for a reason: the publishing above; a
//! `Stat` for a write-only handle, where an io server older than protocol
//! 14 demands read rights for it, uses a read capability the daemon asks
//! for (newer ones take the writer's own), and an `fsync`
//! through a read-only handle a write capability (they demand write rights
//! for `Sync`; POSIX lets any descriptor flush the file); and a file just
//! created exclusively by the caller is opened as root if its own mode
//! forbids the access asked for (POSIX: `open(O_CREAT)` of a new file grants
//! the requested access whatever the mode).
//!
//! # Coherence
//! The kernel caches attributes and names for the cluster's timeouts. So
//! that another mount's changes show before they expire, the adapter keeps
//! a `Watch` open on the metadata server (`dafne_meta::changes`; a thread
//! of its own, `FuseFs::start_watcher`): for each inode another session
//! changed it has the kernel drop the inode's attributes and cached pages
//! (`FUSE_NOTIFY_INVAL_INODE`; for an inode this mount has open, read-ahead
//! is dropped and the size asked of meta again: [`Core::changed_elsewhere`]),
//! and for each name removed or replaced the kernel's entry
//! (`FUSE_NOTIFY_INVAL_ENTRY`). Word comes once the change is committed,
//! typically within a round trip; bytes written on another mount are
//! visible once that mount published them (at its close, fsync or unlock:
//! close-to-open, and the lock rule below). A credential session is told
//! inodes but not names (its entries expire by the timeout).
//!
//! # Locks
//! `fcntl` locks, OFD locks and `flock` are the cluster's: the kernel sends
//! them here (the mount asks for `FUSE_POSIX_LOCKS` and `FUSE_FLOCK_LOCKS`)
//! and they go to the metadata server under the kernel's lock owner
//! (through [`Core::lock_session`]; rules in `dafne_meta::locks`), so a
//! lock taken on one mount excludes processes on every other. A process's
//! `fcntl` locks on a file end at any close of it (the `flush` that every
//! `close(2)` sends names the owner), an open file's `flock` and OFD locks
//! at its last close (`release`). The kernel names the owner at release
//! only for `flock`; for OFD locks it tells a FUSE file system nothing at
//! all (its close path leaves POSIX-style unlocks to `flush`, whose owner
//! is the process's), so each handle remembers the owners that locked
//! through it and its release ends their locks on the file. Any close
//! asks the server only when this mount holds a lock of that owner.
//! Data under a lock is coherent across mounts as with NFS: before a lock
//! is released the size of this mount's writes is published (the bytes
//! are on the io servers already: writes are not cached here), and when a
//! lock is granted this mount drops its read-ahead of the file, asks meta
//! for the size, and has the kernel drop the file's cached pages and
//! attributes, so the holder reads what the previous holder wrote,
//! whichever mount it wrote through. A request that must wait waits on a
//! thread of its own, so the FUSE workers go on (the holder's unlock
//! among them). Known limits: the kernel does not tell `flock` from a
//! whole-file `fcntl` lock (fuser drops the flag), so the two kinds
//! conflict with each other here as on NFS; an open file's `flock` ends
//! when the kernel's `release` of it arrives, which FUSE sends without
//! waiting after the last close (so for a moment after a process exits,
//! another process may still find its `flock` held); and a waiting lock cannot be
//! interrupted (fuser does not handle FUSE_INTERRUPT): a signal, Ctrl-C,
//! `alarm` + `F_SETLKW` or `flock -w` do not end the wait, which ends
//! when the lock is granted (a killed process then exits and releases
//! it).
//!
//! # Directories just changed
//! The kernel (with `default_permissions`) drops a directory's attributes
//! after each create, unlink, mkdir or rmdir in it, and asks for them again
//! (`GETATTR`) before the next path walk through it: one more round trip to
//! meta per created or removed file. So those changes go to meta in one
//! compound with a `GetAttr` of the directory, whose answer (the directory
//! as the change left it) is kept for the kernel's next `GETATTR` of it:
//! used once, within [`FRESH_DIR_FOR`], and dropped when the watcher says
//! another session changed the directory ([`Core::changed_elsewhere`]) or
//! this mount changes it otherwise (a rename, link, symlink or mknod in
//! it, a setattr or xattr change of it). The kernel's next path walk
//! through the directory asks for it, so it is normally used at once.
//! A change another mount makes between the compound and that `GETATTR`,
//! not yet heard of, is missed as the kernel's own attribute cache would
//! miss it (for up to the attribute timeout): the next `GETATTR` asks.
//! This mount's own changes are ordered by [`FreshDirs`]: a copy is kept
//! only if its change overlapped no other change of this mount (none in
//! flight when it began, none begun before it ended), and every other
//! change drops the copies of the inodes it touches both before it is sent
//! and after it is answered, so a copy older than a change this mount made
//! is never served.
//!
//! # Round trips
//! Each operation counts the requests it waited for, to meta and to io
//! servers (`dafne_client::calls`: per thread, so other threads' requests
//! meanwhile do not count), by operation ([`Core::op_counts`]; the stats
//! file's `op_*` lines). Writes that write-behind sends later count on its
//! thread, not on the `write` that queued them. The small-file path's
//! costs, measured with them, are in docs/BENCHMARKS.md ("PostMark").
//! Every FUSE operation that reaches `Core` is counted under its own name,
//! except: `opendir` (a `getattr`, counted as one), the `..` lookup of a
//! listing ([`Core::parent`], inside the `readdir` it serves), `fsyncdir`
//! (answered without a request: meta commits every change before it
//! answers), and the wait of a blocking `setlk` whose first try found the
//! range held: `getlk` and `setlk` go to the lock session directly (module
//! docs, "Locks") and count their answer and their first try
//! ([`Core::count`]; an unlock's count includes the publish of the
//! file's dirty data that precedes it); the waiting thread's requests would measure the
//! other holders, so they do not count. The stats file is rewritten whole after
//! each `flush` and `release`, every [`STATS_EVERY`] while its counters
//! change ([`Core::start_stats_writer`]), and at unmount.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dafne_client::data::DataClient;
use dafne_client::readahead::{Changes, ReadAhead, ReadAheadStats, Stream};
use dafne_client::writebehind::{WriteBehind, WriteBehindStats};
use dafne_client::{
    Attr, CompoundOp, DirEntry, Errno, FileType, Groups, Ino, LockKind, MetaSession, OpenFile, Response, SetAttr,
    StatFs, TimeSet,
};
use dafne_proto::io::{AllocateMode, Stability};
use dafne_proto::{Request, OPEN_READ, OPEN_TRUNC, OPEN_WRITE, RIGHT_READ, RIGHT_WRITE};

/// Who asks: uid and gid from the FUSE request header, supplementary
/// groups from the calling process ([`crate::groups`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Groups,
}

impl Caller {
    pub const ROOT: Caller = Caller::new(0, 0);

    /// A caller without supplementary groups.
    pub const fn new(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, groups: Groups::NONE }
    }

    /// Whether `gid` is the caller's group or a supplementary one.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(gid)
    }
}

/// How a file is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    pub trunc: bool,
}

impl OpenMode {
    /// From `open(2)` flags.
    pub fn from_flags(flags: i32) -> OpenMode {
        let acc = flags & libc::O_ACCMODE;
        OpenMode {
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            trunc: flags & libc::O_TRUNC != 0,
        }
    }

    /// Meta's open flags; truncating needs a capability with write rights
    /// (the io servers truncate), so `O_RDONLY | O_TRUNC` asks for both.
    fn meta_flags(self) -> u32 {
        (if self.read { OPEN_READ } else { 0 })
            | (if self.write || self.trunc { OPEN_WRITE } else { 0 })
            | (if self.trunc { OPEN_TRUNC } else { 0 })
    }
}

/// The file capabilities attribute, which meta does not store (its store
/// docs, "Extended attributes"): answered here.
const XATTR_FILE_CAPS: &[u8] = b"security.capability";

/// Attribute names as `listxattr(2)` returns them: each followed by a NUL.
pub fn xattr_list(names: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
    for n in names {
        out.extend_from_slice(n);
        out.push(0);
    }
    out
}

/// What a `getxattr` or `listxattr` of `size` bytes answers for `data`:
/// its length when `size` is 0 (the caller asks how much room it needs),
/// `ERANGE` when it does not fit, else the bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply<'a> {
    Size(u32),
    Data(&'a [u8]),
}

pub fn xattr_reply(data: &[u8], size: u32) -> Result<XattrReply<'_>, Errno> {
    let len = u32::try_from(data.len()).map_err(|_| Errno::E2BIG)?;
    if size == 0 {
        Ok(XattrReply::Size(len))
    } else if len > size {
        Err(Errno::ERANGE)
    } else {
        Ok(XattrReply::Data(data))
    }
}

/// Access bits of `access(2)`.
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

/// Whether `c` may access a file with attributes `a` for every bit of
/// `want` (`MAY_*`), by the rules the metadata server applies: root may
/// read and write anything and execute what has an execute bit (or is a
/// directory); others get the owner, group or other class.
pub fn may_access(c: Caller, a: &Attr, want: u32) -> bool {
    if c.uid == 0 {
        return want & MAY_EXEC == 0 || a.kind == FileType::Directory || a.mode & 0o111 != 0;
    }
    let bits = if c.uid == a.uid {
        (a.mode >> 6) & 7
    } else if c.in_group(a.gid) {
        (a.mode >> 3) & 7
    } else if c.groups.is_omitted() {
        // As meta: the group class may apply; grant what both grant.
        (a.mode >> 3) & a.mode & 7
    } else {
        a.mode & 7
    };
    bits & want == want
}

/// The file type `mknod` makes for the type bits of `mode` (none: a
/// regular file, as `mknod(2)` says); `None` for directories, symlinks and
/// bits that name no type.
pub fn node_kind(mode: u32) -> Option<FileType> {
    Some(match mode & libc::S_IFMT {
        0 | libc::S_IFREG => FileType::Regular,
        libc::S_IFIFO => FileType::Fifo,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => return None,
    })
}

/// The io servers' [`AllocateMode`] for the mode bits of `fallocate(2)`:
/// the combinations Linux allows that dafne serves; `EOPNOTSUPP` for the
/// rest (collapse, insert, unshare; a punch without `KEEP_SIZE`, which the
/// kernel refuses before asking).
pub fn fallocate_mode(mode: i32) -> Result<AllocateMode, Errno> {
    const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
    Ok(match mode {
        0 => AllocateMode::Reserve,
        KEEP => AllocateMode::ReserveKeepSize,
        m if m == PUNCH | KEEP => AllocateMode::PunchHole,
        ZERO => AllocateMode::ZeroRange,
        m if m == ZERO | KEEP => AllocateMode::ZeroRangeKeepSize,
        _ => return Err(Errno::EOPNOTSUPP),
    })
}

/// The size to report: meta's, or the end of this mount's own writes.
pub fn local_size(meta_size: u64, written_end: u64) -> u64 {
    meta_size.max(written_end)
}

struct Handle {
    ino: Ino,
    file: Arc<OpenFile>,
    /// Read-ahead of this handle (with read-ahead on).
    stream: Option<Arc<Stream>>,
    /// The lock owners that locked through this handle (module docs,
    /// "Locks"): released when the handle is.
    lock_owners: Vec<u64>,
    /// The last write-behind error of the file this handle was told of
    /// (`WriteBehind::error_mark`): each handle hears of each error once.
    wb_cursor: u64,
}

/// What this mount knows of an inode it has open.
#[derive(Debug, Default, Clone, Copy)]
struct InodeState {
    handles: usize,
    /// Attributes as last seen (answers `fstat` after the name is gone).
    attr: Option<Attr>,
    /// Meta's size as last seen.
    meta_size: u64,
    /// End of this mount's writes since the last truncation.
    written_end: u64,
    /// Written since the size was last published.
    dirty: bool,
    /// mtime was set explicitly (`futimens`, `cp -p`) after the last
    /// write: publishing must not replace it with "now".
    mtime_set: bool,
}

impl InodeState {
    fn size(&self) -> u64 {
        local_size(self.meta_size, self.written_end)
    }
}

#[derive(Default)]
struct Table {
    handles: HashMap<u64, Handle>,
    inodes: HashMap<Ino, InodeState>,
    /// Changes of each open inode's bytes (module docs, "Read-ahead");
    /// lives as long as its `inodes` entry.
    changes: HashMap<Ino, Arc<Changes>>,
}

impl Table {
    /// Bytes `[start, end)` of the inode changed through this mount: the
    /// read-ahead units over them go.
    fn changed(&self, ino: Ino, start: u64, end: u64) {
        if let Some(c) = self.changes.get(&ino) {
            c.changed(start, end);
        }
    }
}

/// One page of [`Core::readdir_plus`].
#[derive(Debug, Clone)]
pub struct PlusPage {
    /// Entries that still exist, with their attributes.
    pub entries: Vec<(DirEntry, Attr)>,
    /// The listing is complete.
    pub eof: bool,
    /// The cookie to continue after this page.
    pub next: u64,
}

/// The client's registration counters (UCX memory registrations made by
/// this process), to show that the data path registers nothing per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistrationCounters {
    pub registrations: u64,
    pub deregistrations: u64,
    pub registered_bytes: u64,
}

/// The operations whose round trips are counted (module docs, "Round
/// trips").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Setattr,
    Create,
    Open,
    Read,
    Write,
    Flush,
    Fsync,
    Release,
    Unlink,
    Mkdir,
    Rename,
    Readlink,
    Mknod,
    Rmdir,
    Symlink,
    Link,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Readdir,
    ReaddirPlus,
    Statfs,
    Access,
    Fallocate,
    Getlk,
    Setlk,
}

impl Op {
    pub const ALL: [Op; 29] = [
        Op::Lookup,
        Op::Getattr,
        Op::Setattr,
        Op::Create,
        Op::Open,
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Fsync,
        Op::Release,
        Op::Unlink,
        Op::Mkdir,
        Op::Rename,
        Op::Readlink,
        Op::Mknod,
        Op::Rmdir,
        Op::Symlink,
        Op::Link,
        Op::Setxattr,
        Op::Getxattr,
        Op::Listxattr,
        Op::Removexattr,
        Op::Readdir,
        Op::ReaddirPlus,
        Op::Statfs,
        Op::Access,
        Op::Fallocate,
        Op::Getlk,
        Op::Setlk,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Setattr => "setattr",
            Op::Create => "create",
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Fsync => "fsync",
            Op::Release => "release",
            Op::Unlink => "unlink",
            Op::Mkdir => "mkdir",
            Op::Rename => "rename",
            Op::Readlink => "readlink",
            Op::Mknod => "mknod",
            Op::Rmdir => "rmdir",
            Op::Symlink => "symlink",
            Op::Link => "link",
            Op::Setxattr => "setxattr",
            Op::Getxattr => "getxattr",
            Op::Listxattr => "listxattr",
            Op::Removexattr => "removexattr",
            Op::Readdir => "readdir",
            Op::ReaddirPlus => "readdirplus",
            Op::Statfs => "statfs",
            Op::Access => "access",
            Op::Fallocate => "fallocate",
            Op::Getlk => "getlk",
            Op::Setlk => "setlk",
        }
    }
}

/// What the operations of one kind cost so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCount {
    /// Operations answered.
    pub calls: u64,
    /// Requests they sent to meta and waited for.
    pub meta: u64,
    /// Requests they sent to io servers and waited for.
    pub io: u64,
}

/// How often the stats file is written while its counters change
/// ([`Core::start_stats_writer`]).
pub const STATS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a directory's attributes fetched with a change in it answer
/// the kernel's next `GETATTR` of it (module docs, "Directories just
/// changed"); the kernel asks right after the change returns.
pub const FRESH_DIR_FOR: std::time::Duration = std::time::Duration::from_millis(500);

/// Most directories whose fresh attributes are kept.
const FRESH_DIRS_MAX: usize = 1024;

/// Most lock owners a handle remembers (module docs, "Locks"); an open
/// file shared by more processes that all lock through it leaves the
/// locks of the later ones to their own closes (`flush`) or leases.
const MAX_LOCK_OWNERS_PER_HANDLE: usize = 256;

/// What the stats file last got.
#[derive(Debug, Default)]
struct StatsWritten {
    /// The text last written.
    text: String,
    /// The last write failed (warned once until one succeeds).
    failing: bool,
}

/// The file system over one metadata session and one data client.
pub struct Core {
    meta: MetaSession,
    data: DataClient,
    table: Mutex<Table>,
    next_fh: AtomicU64,
    stats_file: Option<PathBuf>,
    /// The text last written to the stats file; held while writing it, so
    /// that writers from several threads do not share its temporary file.
    stats_written: Mutex<StatsWritten>,
    /// Requests served through the FUSE ring and through /dev/fuse (set
    /// by the mount once its session exists).
    request_counters: std::sync::OnceLock<crate::ring::RequestCounters>,
    readahead: Option<ReadAhead>,
    writebehind: Option<WriteBehind>,
    /// By [`Op`], in [`Op::ALL`]'s order.
    ops: Mutex<[OpCount; Op::ALL.len()]>,
    /// Directories just changed through this mount, with their attributes
    /// after the change (module docs, "Directories just changed").
    fresh_dirs: Mutex<FreshDirs>,
}

/// The directory attributes kept after this mount's changes, and the
/// order of those changes (module docs, "Directories just changed").
#[derive(Debug, Default)]
struct FreshDirs {
    dirs: HashMap<Ino, (Attr, std::time::Instant)>,
    /// Changes begun (or heard of from elsewhere) so far.
    epoch: u64,
    /// Changes sent and not yet answered.
    in_flight: u32,
}

/// One change of this mount on its way: [`FreshDirs::begin`] to
/// [`FreshDirs::end`].
#[derive(Debug)]
struct ChangeTicket {
    epoch: u64,
    /// No other change was in flight when this one began.
    alone: bool,
}

impl FreshDirs {
    /// A change of `inos` is about to be sent: what was kept of them is old.
    fn begin(&mut self, inos: &[Ino]) -> ChangeTicket {
        self.epoch += 1;
        let alone = self.in_flight == 0;
        self.in_flight += 1;
        for ino in inos {
            self.dirs.remove(ino);
        }
        ChangeTicket { epoch: self.epoch, alone }
    }

    /// The change of `t` was answered (or failed); `kept`, the directory
    /// as it left it, is kept only if no other change overlapped it.
    fn end(&mut self, t: ChangeTicket, inos: &[Ino], kept: Option<Attr>, now: std::time::Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        for ino in inos {
            self.dirs.remove(ino);
        }
        if let Some(a) = kept {
            if t.alone && t.epoch == self.epoch {
                if self.dirs.len() >= FRESH_DIRS_MAX {
                    self.dirs.clear();
                }
                self.dirs.insert(a.ino, (a, now));
            }
        }
    }

    /// Another session changed `ino`.
    fn changed_elsewhere(&mut self, ino: Ino) {
        self.epoch += 1;
        self.dirs.remove(&ino);
    }

    /// The kept attributes of `ino`, once, if kept within [`FRESH_DIR_FOR`].
    fn take(&mut self, ino: Ino, now: std::time::Instant) -> Option<Attr> {
        let (a, at) = self.dirs.remove(&ino)?;
        (now.saturating_duration_since(at) < FRESH_DIR_FOR).then_some(a)
    }
}

/// A change of this mount between [`FreshDirs::begin`] and
/// [`FreshDirs::end`] (which its drop calls, on every path out).
struct Changing<'a> {
    core: &'a Core,
    ticket: Option<ChangeTicket>,
    inos: Vec<Ino>,
    kept: Option<Attr>,
}

impl Changing<'_> {
    /// Keeps the directory attributes a compound brought with the change.
    fn keep(&mut self, r: Option<&Result<Response, Errno>>) {
        if let Some(Ok(Response::Attr { attr } | Response::Entry { attr })) = r {
            self.kept = Some(*attr);
        }
    }
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.core.fresh_dirs().end(t, &self.inos, self.kept.take(), std::time::Instant::now());
        }
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").field("meta", &self.meta).finish_non_exhaustive()
    }
}

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    futures::executor::block_on(f)
}

impl Core {
    /// `meta` is the daemon's own session (it acts as each caller through
    /// `as_caller`).
    /// `data` is attached to it: revoked capabilities of the daemon's opens
    /// are re-issued by meta (`dafne_client::data`, "Revoked capabilities").
    pub fn new(meta: MetaSession, data: DataClient) -> Core {
        data.attach_meta(meta.clone());
        Core {
            meta,
            data,
            table: Mutex::new(Table::default()),
            next_fh: AtomicU64::new(1),
            stats_file: None,
            stats_written: Mutex::new(StatsWritten::default()),
            request_counters: std::sync::OnceLock::new(),
            readahead: None,
            writebehind: None,
            ops: Mutex::new([OpCount::default(); Op::ALL.len()]),
            fresh_dirs: Mutex::new(FreshDirs::default()),
        }
    }

    fn fresh_dirs(&self) -> MutexGuard<'_, FreshDirs> {
        self.fresh_dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change through this mount to these inodes is about to be sent:
    /// what was kept of them is old now, and again when the returned guard
    /// drops (after the answer); a compound's directory attributes given
    /// to [`Changing::keep`] are kept then if no other change overlapped.
    fn changing(&self, inos: &[Ino]) -> Changing<'_> {
        let ticket = self.fresh_dirs().begin(inos);
        Changing { core: self, ticket: Some(ticket), inos: inos.to_vec(), kept: None }
    }

    /// The attributes of directory `ino` as this mount's change in it just
    /// left them, once, if that was within [`FRESH_DIR_FOR`].
    fn take_fresh_dir(&self, ino: Ino) -> Option<Attr> {
        self.fresh_dirs().take(ino, std::time::Instant::now())
    }

    /// Runs `req`, a change in directory `parent`, in one compound with a
    /// `GetAttr` of `parent`, whose answer is kept (module docs,
    /// "Directories just changed"); the change's own answer.
    fn change_in_dir(&self, s: &MetaSession, parent: Ino, req: Request) -> Result<Response, Errno> {
        let ops =
            vec![CompoundOp { chain: false, req }, CompoundOp { chain: false, req: Request::GetAttr { ino: parent } }];
        let mut changing = self.changing(&[parent]);
        let results = s.compound(ops)?;
        changing.keep(results.get(1));
        drop(changing);
        results.into_iter().next().ok_or(Errno::EPROTO)?
    }

    /// Runs operation `op`, counting its round trips (module docs, "Round
    /// trips").
    fn counted<T>(&self, op: Op, f: impl FnOnce() -> T) -> T {
        let before = dafne_client::calls::this_thread();
        let r = f();
        let d = dafne_client::calls::this_thread().since(before);
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let c = &mut ops[op as usize];
        c.calls += 1;
        c.meta += d.meta;
        c.io += d.io;
        r
    }

    /// Runs operation `op` for the adapter, counting its round trips
    /// (module docs, "Round trips"): for the lock calls, which do not pass
    /// through `Core`'s own methods.
    pub fn count<T>(&self, op: Op, f: impl FnOnce() -> T) -> T {
        self.counted(op, f)
    }

    /// The round trips of each operation so far.
    pub fn op_counts(&self) -> Vec<(Op, OpCount)> {
        let ops = *self.ops.lock().unwrap_or_else(|p| p.into_inner());
        Op::ALL.iter().map(|&op| (op, ops[op as usize])).collect()
    }

    /// Sequential reads through this mount's handles are answered from
    /// read-ahead (module docs).
    pub fn with_readahead(mut self, ra: ReadAhead) -> Core {
        self.readahead = Some(ra);
        self
    }

    /// The read-ahead counters (`None` without read-ahead).
    pub fn readahead_stats(&self) -> Option<ReadAheadStats> {
        self.readahead.as_ref().map(|r| r.stats())
    }

    /// Writes return once their bytes are in the daemon's registered
    /// memory (module docs, "Write-behind").
    pub fn with_write_behind(mut self, wb: WriteBehind) -> Core {
        self.writebehind = Some(wb);
        self
    }

    pub fn write_behind_stats(&self) -> Option<WriteBehindStats> {
        self.writebehind.as_ref().map(|w| w.stats())
    }

    /// Waits for this mount's writes of `file` in flight (write-behind);
    /// their error stays for the next fsync, close or write.
    fn settle(&self, file: &OpenFile) {
        if let Some(wb) = &self.writebehind {
            wb.settle(file.layout.object_id);
        }
    }

    /// Waits for the writes in flight of handle `fh`'s file and returns an
    /// error of theirs this handle was not told of yet (module docs,
    /// "Write-behind").
    fn drain(&self, fh: u64, file: &OpenFile) -> Result<(), Errno> {
        let Some(wb) = &self.writebehind else { return Ok(()) };
        let mut cursor = self.table().handles.get(&fh).map_or(0, |h| h.wb_cursor);
        let r = wb.drain(file.layout.object_id, &mut cursor);
        if let Some(h) = self.table().handles.get_mut(&fh) {
            h.wb_cursor = h.wb_cursor.max(cursor);
        }
        r
    }

    /// Where the mount counts its requests (ring and /dev/fuse).
    pub fn set_request_counters(&self, c: crate::ring::RequestCounters) {
        let _ = self.request_counters.set(c);
    }

    /// Writes [`RegistrationCounters`], read-ahead, write-behind, the
    /// operations' round trips ([`Core::op_counts`]) and the requests
    /// served through the ring and /dev/fuse to `path` after each `flush`
    /// and `release`, every [`STATS_EVERY`] when they changed (once
    /// [`Core::start_stats_writer`] runs) and at unmount.
    pub fn with_stats_file(mut self, path: PathBuf) -> Core {
        self.stats_file = Some(path);
        self
    }

    /// The dafne inode of the file system's root.
    pub fn root(&self) -> Ino {
        self.meta.root()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock leaves plain data behind; go on.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn session(&self, c: Caller) -> MetaSession {
        self.meta.as_caller(c.uid, c.gid, c.groups)
    }

    /// Attributes as this mount reports them (see the module docs).
    fn local(&self, mut a: Attr) -> Attr {
        let mut t = self.table();
        if let Some(st) = t.inodes.get_mut(&a.ino) {
            st.meta_size = a.size;
            st.attr = Some(a);
            a.size = st.size();
            a.blocks = a.blocks.max(a.size.div_ceil(512));
        }
        a
    }

    /// The attributes of an inode this mount has open whose last name was
    /// removed (meta forgot it; the open file lives on, with no links).
    fn unlinked(&self, ino: Ino) -> Option<Attr> {
        let t = self.table();
        let st = t.inodes.get(&ino)?;
        let mut a = st.attr?;
        a.nlink = 0;
        a.size = st.size();
        Some(a)
    }

    pub fn lookup(&self, c: Caller, parent: Ino, name: &[u8]) -> Result<Attr, Errno> {
        self.counted(Op::Lookup, || self.session(c).lookup(parent, name).map(|a| self.local(a)))
    }

    pub fn getattr(&self, c: Caller, ino: Ino) -> Result<Attr, Errno> {
        if let Some(a) = self.take_fresh_dir(ino) {
            return self.counted(Op::Getattr, || Ok(a));
        }
        self.counted(Op::Getattr, || match self.session(c).getattr(ino) {
            Ok(a) => Ok(self.local(a)),
            Err(Errno::ENOENT) => self.unlinked(ino).ok_or(Errno::ENOENT),
            Err(e) => Err(e),
        })
    }

    /// `setattr`; a size truncates or extends the data on the io servers
    /// first. Through a handle opened for writing (`ftruncate`), the size
    /// changes whatever the file's mode says now: the right to write was
    /// checked at open (POSIX; a file created with mode 0 may be truncated
    /// through the descriptor that created it). Otherwise the caller must
    /// be allowed to open the file for writing.
    pub fn setattr(&self, c: Caller, ino: Ino, fh: Option<u64>, set: SetAttr) -> Result<Attr, Errno> {
        self.counted(Op::Setattr, || self.setattr_counted(c, ino, fh, set))
    }

    fn setattr_counted(&self, c: Caller, ino: Ino, fh: Option<u64>, set: SetAttr) -> Result<Attr, Errno> {
        let _changing = self.changing(&[ino]);
        let mut last = None;
        if let Some(size) = set.size {
            let by_fd = fh.and_then(|fh| self.handle_file(fh)).filter(|f| f.cap.rights & RIGHT_WRITE != 0);
            let (file, s, temporary) = match by_fd {
                Some(f) => (f, self.meta.clone(), false),
                None => (Arc::new(self.session(c).open(ino, OPEN_WRITE)?), self.session(c), true),
            };
            self.settle(&file);
            let r = block(self.data.truncate(&file, size))
                .and_then(|()| s.setattr(ino, SetAttr { size: Some(size), ..Default::default() }));
            if temporary {
                self.close_in_meta(&file);
            }
            last = Some(r?);
            self.truncated(ino, size);
        }
        let rest = SetAttr { size: None, ..set };
        let a = match last {
            Some(a) if rest.is_empty() => a,
            _ => self.session(c).setattr(ino, rest)?,
        };
        if set.mtime.is_some() {
            if let Some(st) = self.table().inodes.get_mut(&ino) {
                st.mtime_set = true;
            }
        }
        Ok(self.local(a))
    }

    fn truncated(&self, ino: Ino, size: u64) {
        let mut t = self.table();
        if let Some(st) = t.inodes.get_mut(&ino) {
            st.written_end = 0;
            st.meta_size = size;
        }
        // Everything from the new size: cut, or zeros now.
        t.changed(ino, size, u64::MAX);
    }

    pub fn readlink(&self, c: Caller, ino: Ino) -> Result<Vec<u8>, Errno> {
        self.counted(Op::Readlink, || self.session(c).readlink(ino))
    }

    /// `mknod`: a FIFO, socket, character or block device, or a regular
    /// file (created, not opened), by the type bits of `mode`; `rdev` is
    /// the device as `dev_t` encodes it (the kernel's 32-bit encoding is
    /// the low half of user space's 64-bit one, so it passes unchanged).
    /// The metadata server applies `mknod(2)`'s rules (devices only for
    /// root). Type bits of a directory or symlink, or none that exist, are
    /// `EINVAL` here (the kernel refuses those before asking).
    pub fn mknod(&self, c: Caller, parent: Ino, name: &[u8], mode: u32, rdev: u64) -> Result<Attr, Errno> {
        self.counted(Op::Mknod, || {
            let _changing = self.changing(&[parent]);
            let kind = node_kind(mode).ok_or(Errno::EINVAL)?;
            self.session(c).mknod(parent, name, kind, mode & 0o7777, rdev)
        })
    }

    pub fn mkdir(&self, c: Caller, parent: Ino, name: &[u8], mode: u32) -> Result<Attr, Errno> {
        self.counted(Op::Mkdir, || {
            let req = Request::Mkdir { parent, name: name.to_vec(), mode: mode & 0o7777 };
            match self.change_in_dir(&self.session(c), parent, req)? {
                Response::Entry { attr } | Response::Attr { attr } => Ok(attr),
                _ => Err(Errno::EPROTO),
            }
        })
    }

    pub fn unlink(&self, c: Caller, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        self.counted(Op::Unlink, || {
            let req = Request::Unlink { parent, name: name.to_vec() };
            match self.change_in_dir(&self.session(c), parent, req)? {
                Response::Done => Ok(()),
                _ => Err(Errno::EPROTO),
            }
        })
    }

    pub fn rmdir(&self, c: Caller, parent: Ino, name: &[u8]) -> Result<(), Errno> {
        self.counted(Op::Rmdir, || {
            let req = Request::Rmdir { parent, name: name.to_vec() };
            match self.change_in_dir(&self.session(c), parent, req)? {
                Response::Done => Ok(()),
                _ => Err(Errno::EPROTO),
            }
        })
    }

    pub fn symlink(&self, c: Caller, parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr, Errno> {
        self.counted(Op::Symlink, || {
            let _changing = self.changing(&[parent]);
            self.session(c).symlink(parent, name, target)
        })
    }

    pub fn link(&self, c: Caller, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr, Errno> {
        self.counted(Op::Link, || {
            let _changing = self.changing(&[ino, new_parent]);
            self.session(c).link(ino, new_parent, new_name).map(|a| self.local(a))
        })
    }

    /// `renameat2`: `flags` 0 replaces the destination,
    /// [`dafne_client::RENAME_NOREPLACE`] refuses an existing one and
    /// [`dafne_client::RENAME_EXCHANGE`] swaps the two, each decided by meta
    /// in one transaction (atomic against every client).
    pub fn rename(
        &self,
        c: Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), Errno> {
        let _changing = self.changing(&[parent, new_parent]);
        self.counted(Op::Rename, || self.session(c).rename_flags(parent, name, new_parent, new_name, flags))
    }

    /// `setxattr` (`flags`: `XATTR_CREATE`, `XATTR_REPLACE`); meta applies
    /// the rules. `security.capability` is refused here as meta refuses it
    /// (see [`Core::getxattr`]).
    pub fn setxattr(&self, c: Caller, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<(), Errno> {
        self.counted(Op::Setxattr, || {
            let _changing = self.changing(&[ino]);
            if name == XATTR_FILE_CAPS {
                return Err(Errno::EOPNOTSUPP);
            }
            self.session(c).setxattr(ino, name, value, flags)
        })
    }

    /// `getxattr`: the whole value. The kernel asks for
    /// `security.capability` before every write to a file (to drop file
    /// capabilities, `file_remove_privs`); meta never stores it (its store
    /// docs, "Extended attributes"), so that answer is `ENODATA` from here,
    /// without a round trip on the data path.
    pub fn getxattr(&self, c: Caller, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.counted(Op::Getxattr, || {
            if name == XATTR_FILE_CAPS {
                return Err(Errno::ENODATA);
            }
            self.session(c).getxattr(ino, name)
        })
    }

    /// `listxattr`: the names the caller may see, each followed by a NUL
    /// (the kernel's format).
    pub fn listxattr(&self, c: Caller, ino: Ino) -> Result<Vec<u8>, Errno> {
        self.counted(Op::Listxattr, || {
            let names = self.session(c).listxattr(ino)?;
            Ok(xattr_list(&names))
        })
    }

    pub fn removexattr(&self, c: Caller, ino: Ino, name: &[u8]) -> Result<(), Errno> {
        self.counted(Op::Removexattr, || {
            let _changing = self.changing(&[ino]);
            self.session(c).removexattr(ino, name)
        })
    }

    /// One page of a directory after `cookie` (0 = from the start).
    pub fn readdir(&self, c: Caller, ino: Ino, cookie: u64, max: u32) -> Result<(Vec<DirEntry>, bool), Errno> {
        self.counted(Op::Readdir, || self.session(c).readdir_page(ino, cookie, max))
    }

    /// A page of a listing with every entry's attributes (`readdirplus`):
    /// the attributes come in compounds of up to `MAX_COMPOUND` `GetAttr`,
    /// one round trip per 16 entries instead of a lookup per entry. An entry
    /// removed meanwhile is left out. Also returns whether the listing is
    /// complete and the cookie to continue after this page (which differs
    /// from the last entry's when that one was left out).
    pub fn readdir_plus(&self, c: Caller, ino: Ino, cookie: u64, max: u32) -> Result<PlusPage, Errno> {
        self.counted(Op::ReaddirPlus, || {
            let s = self.session(c);
            let (entries, eof) = s.readdir_page(ino, cookie, max)?;
            let next = entries.last().map_or(cookie, |e| e.cookie);
            let mut out = Vec::with_capacity(entries.len());
            for chunk in entries.chunks(dafne_proto::MAX_COMPOUND) {
                let ops =
                    chunk.iter().map(|e| CompoundOp { chain: false, req: Request::GetAttr { ino: e.ino } }).collect();
                let results = s.compound(ops)?;
                for (i, e) in chunk.iter().enumerate() {
                    let attr = match results.get(i) {
                        Some(Ok(Response::Attr { attr } | Response::Entry { attr })) => Ok(*attr),
                        Some(Ok(_)) => Err(Errno::EPROTO),
                        Some(Err(err)) => Err(*err),
                        // A compound stops at its first error: ask the rest one
                        // by one.
                        None => s.getattr(e.ino),
                    };
                    match attr {
                        Ok(a) => out.push((e.clone(), self.local(a))),
                        Err(Errno::ENOENT) => {}
                        Err(err) => return Err(err),
                    }
                }
            }
            Ok(PlusPage { entries: out, eof, next })
        })
    }

    /// The parent directory of directory `ino` (for `..` in listings).
    pub fn parent(&self, c: Caller, ino: Ino) -> Result<Ino, Errno> {
        self.session(c).lookup(ino, b"..").map(|a| a.ino)
    }

    /// Inodes from meta; blocks from the io servers' file systems.
    pub fn statfs(&self, c: Caller) -> Result<StatFs, Errno> {
        self.counted(Op::Statfs, || {
            let mut s = self.session(c).statfs()?;
            // The data client's connections are logged in, which is what lets
            // it ask (no capability needed: `dafne_proto::io`, "Login").
            if let Ok((total, avail)) = block(self.data.capacity(dafne_client::data::LOGGED_IN)) {
                let bsize = if s.bsize == 0 { 4096 } else { s.bsize as u64 };
                s.blocks = total / bsize;
                s.bfree = avail / bsize;
                s.bavail = avail / bsize;
            }
            Ok(s)
        })
    }

    /// `access(2)` from fresh attributes ([`may_access`]).
    pub fn access(&self, c: Caller, ino: Ino, want: u32) -> Result<(), Errno> {
        self.counted(Op::Access, || {
            let a = self.session(c).getattr(ino)?;
            if may_access(c, &a, want) {
                Ok(())
            } else {
                Err(Errno::EACCES)
            }
        })
    }

    fn add_handle(&self, file: OpenFile) -> (u64, Attr) {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let ino = file.attr.ino;
        let mut t = self.table();
        let st = t.inodes.entry(ino).or_default();
        st.handles += 1;
        st.meta_size = file.attr.size;
        st.attr = Some(file.attr);
        let mut attr = file.attr;
        attr.size = st.size();
        let changes = t.changes.entry(ino).or_default().clone();
        let stream = self.readahead.as_ref().map(|r| Arc::new(r.stream(changes)));
        let wb_cursor = self.writebehind.as_ref().map_or(0, |wb| wb.error_mark(file.layout.object_id));
        t.handles.insert(fh, Handle { ino, file: Arc::new(file), stream, lock_owners: Vec::new(), wb_cursor });
        (fh, attr)
    }

    fn handle_file(&self, fh: u64) -> Option<Arc<OpenFile>> {
        self.table().handles.get(&fh).map(|h| h.file.clone())
    }

    /// Opens a regular file; `O_TRUNC` empties it on the io servers too.
    pub fn open(&self, c: Caller, ino: Ino, mode: OpenMode) -> Result<(u64, Attr), Errno> {
        self.counted(Op::Open, || {
            let file = self.session(c).open(ino, mode.meta_flags())?;
            self.opened(file, mode.trunc)
        })
    }

    fn opened(&self, file: OpenFile, trunc: bool) -> Result<(u64, Attr), Errno> {
        if trunc {
            self.settle(&file);
            if let Err(e) = block(self.data.truncate(&file, 0)) {
                self.close_in_meta(&file);
                return Err(e);
            }
        }
        let ino = file.attr.ino;
        let (fh, attr) = self.add_handle(file);
        if trunc {
            self.truncated(ino, 0);
        }
        Ok((fh, attr))
    }

    /// Creates and opens `name` in one round trip (create + open chained,
    /// with the directory's attributes: module docs, "Directories just
    /// changed").
    /// Without `exclusive`, an existing file is opened instead.
    pub fn create(
        &self,
        c: Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        open: OpenMode,
        exclusive: bool,
    ) -> Result<(u64, Attr), Errno> {
        self.counted(Op::Create, || self.create_counted(c, parent, name, mode, open, exclusive))
    }

    fn create_counted(
        &self,
        c: Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        open: OpenMode,
        exclusive: bool,
    ) -> Result<(u64, Attr), Errno> {
        let s = self.session(c);
        let ops = vec![
            CompoundOp {
                chain: false,
                req: Request::Create { parent, name: name.to_vec(), mode: mode & 0o7777, exclusive: true, hint: None },
            },
            CompoundOp { chain: true, req: Request::Open { ino: 0, flags: open.meta_flags() & !OPEN_TRUNC } },
            // The directory as the create left it (module docs, "Directories
            // just changed").
            CompoundOp { chain: false, req: Request::GetAttr { ino: parent } },
        ];
        let mut changing = self.changing(&[parent]);
        let results = s.compound(ops)?;
        changing.keep(results.get(2));
        drop(changing);
        let mut results = results.into_iter();
        match (results.next(), results.next()) {
            (Some(Ok(_)), Some(Ok(Response::Opened { attr, layout, cap }))) => {
                self.opened(OpenFile { attr, layout, cap }, false)
            }
            // Created by this call, but its mode forbids what was asked.
            (Some(Ok(Response::Entry { attr } | Response::Attr { attr })), Some(Err(Errno::EACCES))) => {
                self.opened(self.meta.open(attr.ino, open.meta_flags() & !OPEN_TRUNC)?, false)
            }
            (Some(Err(Errno::EEXIST)), None) if !exclusive => {
                self.opened(s.open_at(parent, name, open.meta_flags())?, open.trunc)
            }
            (Some(Err(e)), None) | (Some(Ok(_)), Some(Err(e))) => Err(e),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Reads up to `size` bytes at `offset`, never past the size this mount
    /// knows.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.read_with(fh, offset, size, |r| r.map(<[u8]>::to_vec))
    }

    /// [`Core::read`] into a buffer the calling thread keeps between
    /// requests, handed to `f`: no allocation (and no page faults on fresh
    /// memory) per request on the hot path.
    pub fn read_with<R>(&self, fh: u64, offset: u64, size: u32, f: impl FnOnce(Result<&[u8], Errno>) -> R) -> R {
        self.counted(Op::Read, || self.read_counted(fh, offset, size, f))
    }

    fn read_counted<R>(&self, fh: u64, offset: u64, size: u32, f: impl FnOnce(Result<&[u8], Errno>) -> R) -> R {
        thread_local! {
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let (file, known, stream) = {
            let t = self.table();
            let Some(h) = t.handles.get(&fh) else { return f(Err(Errno::EBADF)) };
            (h.file.clone(), t.inodes.get(&h.ino).map(|s| s.size()).unwrap_or(0), h.stream.clone())
        };
        if offset >= known {
            return f(Ok(&[]));
        }
        self.settle(&file);
        let n = (size as u64).min(known - offset) as usize;
        if let Some(hit) = stream.and_then(|s| s.read(&file, offset, n, known)) {
            // Straight from the read-ahead slot into the reply.
            if let Some(bytes) = hit.single() {
                return f(Ok(bytes));
            }
            return BUF.with(|b| {
                let mut buf = b.borrow_mut();
                if buf.len() < n {
                    buf.resize(n, 0);
                }
                let got = hit.copy_to(&mut buf[..n]);
                f(Ok(&buf[..got]))
            });
        }
        BUF.with(|b| {
            let mut buf = b.borrow_mut();
            if buf.len() < n {
                buf.resize(n, 0);
            }
            match block(self.data.read_at(&file, offset, &mut buf[..n])) {
                Ok(_) => f(Ok(&buf[..n])),
                Err(e) => f(Err(e)),
            }
        })
    }

    /// Writes `data` at `offset` (unstable: the io servers may cache it
    /// until `fsync`).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        self.counted(Op::Write, || self.write_counted(fh, offset, data))
    }

    fn write_counted(&self, fh: u64, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        let (file, ino, mut cursor, changes) = {
            let t = self.table();
            let h = t.handles.get(&fh).ok_or(Errno::EBADF)?;
            (h.file.clone(), h.ino, h.wb_cursor, t.changes.get(&h.ino).cloned())
        };
        let r = match &self.writebehind {
            Some(wb) => wb.write(&file, offset, data, Stability::Unstable, &mut cursor, changes),
            None => block(self.data.write_at(&file, offset, data, Stability::Unstable)),
        };
        let mut t = self.table();
        if let Some(h) = t.handles.get_mut(&fh) {
            h.wb_cursor = h.wb_cursor.max(cursor);
        }
        // Also after a failed write: some servers may have taken their part.
        t.changed(ino, offset, offset.saturating_add(data.len() as u64));
        drop(t);
        if r == Err(Errno::EFBIG) {
            // An earlier write of the file was refused (or this one, past
            // the largest offset): its end must not count in the size.
            self.settle(&file);
            self.forget_refused_end(fh);
            if let Err(e) = self.publish_dirty(fh) {
                tracing::debug!("publishing inode {ino} after a refused write: {e}");
            }
        }
        let mut t = self.table();
        let n = r?;
        if let Some(st) = t.inodes.get_mut(&ino) {
            st.written_end = st.written_end.max(offset + n as u64);
            st.dirty = true;
            st.mtime_set = false;
        }
        Ok(n)
    }

    /// `fallocate(2)` through a handle: reserve (mode 0, `KEEP_SIZE`),
    /// punch a hole (`PUNCH_HOLE | KEEP_SIZE`) or zero (`ZERO_RANGE`, with
    /// or without `KEEP_SIZE`) on the io servers ([`fallocate_mode`]; any
    /// other mode is `EOPNOTSUPP`, so `posix_fallocate` falls back to
    /// writing). A mode that does not keep the size makes `offset + len`
    /// the size where it is larger, set in meta at once as the daemon (the
    /// right to write was checked at open, as for `ftruncate`); one that
    /// changes bytes sets mtime (and so ctime) to now, as Linux does. The
    /// read-ahead over the range goes.
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<(), Errno> {
        self.counted(Op::Fallocate, || {
            let mode = fallocate_mode(mode)?;
            let (file, ino) = {
                let t = self.table();
                let h = t.handles.get(&fh).ok_or(Errno::EBADF)?;
                (h.file.clone(), h.ino)
            };
            if file.cap.rights & RIGHT_WRITE == 0 {
                return Err(Errno::EBADF);
            }
            let end = offset.checked_add(len).ok_or(Errno::EFBIG)?;
            self.settle(&file);
            let r = block(self.data.fallocate(&file, offset, len, mode));
            // Also after a failure: some servers may have done their part.
            self.table().changed(ino, offset, end);
            r?;
            let known = self.table().inodes.get(&ino).map(|st| st.size()).unwrap_or(0);
            let grows = !mode.keeps_size() && end > known;
            if !grows && !mode.zeroes() {
                return Ok(());
            }
            let set = SetAttr {
                size: grows.then_some(end),
                mtime: mode.zeroes().then_some(TimeSet::Now),
                ..Default::default()
            };
            let Some(a) = self.set_size_attrs(ino, set)? else { return Ok(()) };
            if let Some(st) = self.table().inodes.get_mut(&ino) {
                st.meta_size = a.size;
                st.attr = Some(a);
                if mode.zeroes() {
                    st.mtime_set = false;
                }
            }
            Ok(())
        })
    }

    /// Publishes the size if this mount wrote since the last publish.
    pub fn flush(&self, fh: u64) -> Result<(), Errno> {
        let r = self.counted(Op::Flush, || self.publish_if_dirty(fh));
        self.write_stats();
        r
    }

    /// The daemon's session, through which the adapter takes, tests and
    /// releases locks (`MetaSession::lock` and its siblings; module docs,
    /// "Locks"), also from the threads where waiting requests wait.
    pub fn lock_session(&self) -> MetaSession {
        self.meta.clone()
    }

    /// A lock was granted on `ino` (module docs, "Locks"): what this mount
    /// knows of its bytes and size may be older than the last holder's
    /// writes, so read-ahead drops the file's units and the size is asked
    /// of meta again. (The adapter also has the kernel drop its pages and
    /// attributes.)
    pub fn lock_granted(&self, ino: Ino) {
        self.table().changed(ino, 0, u64::MAX);
        if let Ok(a) = self.meta.getattr(ino) {
            self.local(a);
        }
    }

    /// Another session changed `ino` (module docs, "Coherence"): if this
    /// mount has it open, what it knows of its bytes and size is refreshed
    /// as after a lock grant.
    pub fn changed_elsewhere(&self, ino: Ino) {
        self.fresh_dirs().changed_elsewhere(ino);
        if self.table().inodes.contains_key(&ino) {
            self.lock_granted(ino);
        }
    }

    /// A lock on the file of handle `fh` is about to be released: this
    /// mount's writes' size is published first, so the next holder, on any
    /// mount, sees it (module docs, "Locks").
    pub fn before_unlock(&self, fh: u64) -> Result<(), Errno> {
        match self.publish_if_dirty(fh) {
            Err(e) if e == Errno::EBADF => Ok(()),
            r => r,
        }
    }

    /// Remembers that `owner` locks through handle `fh`, whose release
    /// then ends that owner's locks on the file (module docs, "Locks").
    pub fn locking_through(&self, fh: u64, owner: u64) {
        if let Some(h) = self.table().handles.get_mut(&fh) {
            if !h.lock_owners.contains(&owner) && h.lock_owners.len() < MAX_LOCK_OWNERS_PER_HANDLE {
                h.lock_owners.push(owner);
            }
        }
    }

    /// Releases every lock `owner` holds on `ino` (POSIX: a process's
    /// `fcntl` locks on a file go at any close of it; an open file's
    /// `flock` at its last close). No round trip when it holds none.
    pub fn unlock_owner(&self, ino: Ino, owner: u64) -> Result<(), Errno> {
        // Its locks on the file end here: no handle's release may end the
        // locks it takes later (a process that closed, reopened and locked
        // again must keep that lock when another process closes its copy
        // of the first open file).
        for h in self.table().handles.values_mut().filter(|h| h.ino == ino) {
            h.lock_owners.retain(|o| *o != owner);
        }
        if !self.meta.holds_lock(ino, owner) {
            return Ok(());
        }
        self.meta.lock(ino, owner, 0, 0, u64::MAX, LockKind::Unlock, false)
    }

    /// Makes the written data durable on the io servers and the size exact.
    pub fn fsync(&self, fh: u64) -> Result<(), Errno> {
        self.counted(Op::Fsync, || self.fsync_counted(fh))
    }

    fn fsync_counted(&self, fh: u64) -> Result<(), Errno> {
        let (file, ino) = {
            let t = self.table();
            let h = t.handles.get(&fh).ok_or(Errno::EBADF)?;
            (h.file.clone(), h.ino)
        };
        let drained = self.drain(fh, &file);
        // fsync(2) flushes the file, whoever wrote it, also through a
        // read-only descriptor; the io servers want write rights for Sync,
        // which the daemon asks for in that case (syncing changes no byte).
        let r = if file.cap.rights & RIGHT_WRITE != 0 {
            block(self.data.sync(&file))
        } else {
            let sync_file = self.meta.open(ino, OPEN_WRITE)?;
            let r = block(self.data.sync(&sync_file));
            self.close_in_meta(&sync_file);
            r
        };
        if drained == Err(Errno::EFBIG) {
            self.forget_refused_end(fh);
            if let Err(e) = self.publish_dirty(fh) {
                tracing::debug!("publishing inode {ino} after a refused write: {e}");
            }
        }
        drained?;
        r?;
        if let Some(st) = self.table().inodes.get_mut(&ino) {
            st.dirty = false;
        }
        self.publish(ino, &file, false)
    }

    /// Forgets a handle, publishing the size first if needed, and closes
    /// it in meta (the last close of an unlinked file lets its data go).
    pub fn release(&self, fh: u64) -> Result<(), Errno> {
        let r = self.counted(Op::Release, || self.release_counted(fh));
        // After each release too: a test reads a close's whole cost.
        self.write_stats();
        r
    }

    fn release_counted(&self, fh: u64) -> Result<(), Errno> {
        let r = self.publish_if_dirty(fh);
        let (file, unlocked) = {
            let mut t = self.table();
            let h = t.handles.remove(&fh);
            if let Some(h) = &h {
                if let Some(st) = t.inodes.get_mut(&h.ino) {
                    st.handles -= 1;
                    if st.handles == 0 {
                        t.inodes.remove(&h.ino);
                        t.changes.remove(&h.ino);
                        if let Some(wb) = &self.writebehind {
                            wb.forget(h.file.layout.object_id);
                        }
                    }
                }
            }
            match h {
                Some(h) => (Some(h.file), h.lock_owners.iter().map(|o| (h.ino, *o)).collect()),
                None => (None, Vec::new()),
            }
        };
        // Whoever locked through this open file and still holds: its OFD
        // and `flock` locks end with it (module docs, "Locks").
        let unlocked = unlocked.into_iter().map(|(ino, o)| self.unlock_owner(ino, o)).fold(Ok(()), Result::and);
        if let Some(file) = file {
            self.close_in_meta(&file);
        }
        r.and(unlocked)
    }

    /// Releases one open in meta. A failure (a lost connection) only keeps
    /// an unlinked file's data until meta drops the connection's opens.
    fn close_in_meta(&self, file: &OpenFile) {
        if let Err(e) = self.meta.close(file.layout.object_id) {
            tracing::debug!("closing object {} in meta: {e}", file.layout.object_id);
        }
    }

    /// Opens this mount holds in meta (handles and opens in progress).
    pub fn held_opens(&self) -> usize {
        self.meta.held_opens()
    }

    fn publish_if_dirty(&self, fh: u64) -> Result<(), Errno> {
        // Writes in flight first: the size is the servers' once they have
        // them, and a write that failed after it returned is reported here
        // (close, fsync, a lock's release).
        let drained = match self.handle_file(fh) {
            Some(file) => self.drain(fh, &file),
            None => return Err(Errno::EBADF),
        };
        if drained == Err(Errno::EFBIG) {
            self.forget_refused_end(fh);
        }
        self.publish_dirty(fh).and(drained)
    }

    /// An io server refused a write of this handle's file with `EFBIG`
    /// (past what its storage holds) after the write had returned
    /// (write-behind), which counted its end in `written_end`: the end is
    /// forgotten and the file marked for a publish, which takes the size
    /// from the bytes the servers hold. Without this, `fstat` and `stat`
    /// showed the refused byte's end (16 TiB on ext4) until the inode left
    /// the table. Called with the writes settled.
    fn forget_refused_end(&self, fh: u64) {
        let mut t = self.table();
        let Some(ino) = t.handles.get(&fh).map(|h| h.ino) else { return };
        if let Some(st) = t.inodes.get_mut(&ino) {
            st.written_end = 0;
            st.dirty = true;
        }
    }

    fn publish_dirty(&self, fh: u64) -> Result<(), Errno> {
        let (file, ino) = {
            let mut t = self.table();
            let Some(h) = t.handles.get(&fh) else { return Err(Errno::EBADF) };
            let (file, ino) = (h.file.clone(), h.ino);
            match t.inodes.get_mut(&ino) {
                // Cleared before publishing: a write racing the publish
                // marks it again.
                Some(st) if st.dirty => st.dirty = false,
                _ => return Ok(()),
            }
            (file, ino)
        };
        self.publish(ino, &file, true)
    }

    /// Sets the size or times this mount's writes made, as the daemon;
    /// `None` for a file unlinked while open (no name whose attributes
    /// could change).
    fn set_size_attrs(&self, ino: Ino, set: SetAttr) -> Result<Option<Attr>, Errno> {
        match self.meta.setattr(ino, set) {
            Ok(a) => Ok(Some(a)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Meta's size becomes the largest byte any io server holds, if that
    /// is larger (`SetAttr::grow_to`: sizes only grow here, truncation
    /// shrinks; no read of meta's size first), and mtime becomes now unless
    /// it was set explicitly since the last write. Asking the io servers
    /// (`Stat`) also writes the file's cached units back on each and runs
    /// the write verifier (`dafne_client::data`), so a close reports a
    /// write an io server lost, and a size never counts bytes that did not
    /// arrive or that another mount's truncate removed.
    ///
    /// The `Stat` goes to the servers this mount wrote the file on since
    /// the last check (`DataClient::stored_size_of_writes`: one for a
    /// small file, whatever the layout's width), or to all of them when
    /// that is none (after an `fsync`'s `Sync`), with the handle's own capability, read or write (io
    /// servers from protocol 14 on answer a `Stat` for either: a writer
    /// may know the size it writes to); only an io server that still
    /// wants read rights (`EACCES`) costs the daemon a read open in meta
    /// and its close, two round trips more. `lazy` (at close and before an
    /// unlock, not at fsync): meta need not make the size durable before
    /// it answers (`SetAttr::lazy`; `dafne_meta` store docs, "Lazy
    /// commits"): `close(2)` promises visibility, not durability, and
    /// saves meta's fsync.
    fn publish(&self, ino: Ino, file: &Arc<OpenFile>, lazy: bool) -> Result<(), Errno> {
        let stored = match block(self.data.stored_size_of_writes(file)) {
            Err(Errno::EACCES) if file.cap.rights & RIGHT_READ == 0 => {
                let stat_file = self.meta.open(ino, OPEN_READ)?;
                let r = block(self.data.stored_size(&stat_file));
                self.close_in_meta(&stat_file);
                r
            }
            r => r,
        }?;
        let mtime_set = self.table().inodes.get(&ino).is_some_and(|st| st.mtime_set);
        let set =
            SetAttr { grow_to: Some(stored), mtime: (!mtime_set).then_some(TimeSet::Now), lazy, ..Default::default() };
        let Some(a) = self.set_size_attrs(ino, set)? else { return Ok(()) };
        if let Some(st) = self.table().inodes.get_mut(&ino) {
            st.meta_size = a.size;
        }
        Ok(())
    }

    /// The data client's registration counters.
    pub fn registration_counters(&self) -> Option<RegistrationCounters> {
        self.data.context().map(|ctx| {
            let s = ctx.stats().snapshot();
            RegistrationCounters {
                registrations: s.registrations,
                deregistrations: s.deregistrations,
                registered_bytes: s.registered_bytes,
            }
        })
    }

    /// Writes the stats file every [`STATS_EVERY`] while its counters
    /// change, so that a file held open (whose close would write it) shows
    /// its operations meanwhile; the thread ends with the last reference
    /// to `core` (the mount's end). Nothing without a stats file.
    pub fn start_stats_writer(core: &Arc<Core>) {
        if core.stats_file.is_none() {
            return;
        }
        let weak = Arc::downgrade(core);
        let spawned = std::thread::Builder::new().name("stats-file".into()).spawn(move || loop {
            std::thread::sleep(STATS_EVERY);
            let Some(core) = weak.upgrade() else { return };
            core.write_stats_if_changed();
        });
        if let Err(e) = spawned {
            tracing::warn!("no periodic stats file (it is still written at closes): {e}");
        }
    }

    /// Writes the counters to the stats file, if any, atomically (a reader
    /// never sees half a file).
    pub fn write_stats(&self) {
        self.write_stats_when(|_| true)
    }

    fn write_stats_if_changed(&self) {
        self.write_stats_when(|changed| changed)
    }

    /// Writes the stats file if `write(changed)` says so, `changed` being
    /// whether the counters differ from the last text written.
    fn write_stats_when(&self, write: impl FnOnce(bool) -> bool) {
        let Some(path) = &self.stats_file else { return };
        // The text is read under the lock: a snapshot taken before another
        // writer's newer one must not be written after it (at unmount
        // nothing would repair it).
        let mut last = self.stats_written.lock().unwrap_or_else(|p| p.into_inner());
        let Some(text) = self.stats_text() else { return };
        if !write(last.text != text) {
            return;
        }
        let tmp = path.with_extension("tmp");
        match std::fs::write(&tmp, &text).and_then(|_| std::fs::rename(&tmp, path)) {
            Ok(()) => {
                if std::mem::take(&mut last.failing) {
                    tracing::warn!("the stats file {} is written again", path.display());
                }
                last.text = text;
            }
            // Once per streak of failures, not every second.
            Err(e) if !last.failing => {
                last.failing = true;
                tracing::warn!("could not write the stats file {}: {e} (tried again every second)", path.display());
            }
            Err(_) => {}
        }
    }

    /// The stats file's text (`None` before the data client can say its
    /// registrations).
    fn stats_text(&self) -> Option<String> {
        let c = self.registration_counters()?;
        let mut text = format!(
            "registrations {}\nderegistrations {}\nregistered_bytes {}\n",
            c.registrations, c.deregistrations, c.registered_bytes
        );
        if let Some(r) = self.readahead_stats() {
            text.push_str(&format!(
                "readahead_hits {}\nreadahead_misses {}\nreadahead_waits {}\nreadahead_bytes_hit {}\n\
                 readahead_bytes_prefetched {}\nreadahead_bytes_wasted {}\nreadahead_bytes_copied {}\n\
                 readahead_invalidations {}\nreadahead_posts_refused {}\nreadahead_peak_bytes {}\n\
                 readahead_budget_bytes {}\n",
                r.hits,
                r.misses,
                r.waits,
                r.bytes_hit,
                r.bytes_prefetched,
                r.bytes_wasted,
                r.bytes_copied,
                r.invalidations,
                r.posts_refused,
                r.peak_bytes,
                r.budget_bytes
            ));
        }
        if let Some(c) = self.request_counters.get() {
            text.push_str(&format!(
                "fuse_requests_ring {}\nfuse_requests_dev {}\n",
                c.ring.load(std::sync::atomic::Ordering::Relaxed),
                c.dev.load(std::sync::atomic::Ordering::Relaxed)
            ));
        }
        if let Some(w) = self.write_behind_stats() {
            text.push_str(&format!(
                "writebehind_writes {}\nwritebehind_bytes {}\nwritebehind_waits_for_memory {}\n\
                 writebehind_waits_for_overlap {}\nwritebehind_errors {}\nwritebehind_peak_bytes {}\n\
                 writebehind_budget_bytes {}\n",
                w.writes, w.bytes, w.waits_for_memory, w.waits_for_overlap, w.errors, w.peak_bytes, w.budget_bytes
            ));
        }
        text.push_str(&format!("groups_reads {}\n", crate::groups::reads()));
        for (op, n) in self.op_counts() {
            let op = op.name();
            text.push_str(&format!("op_{op}_calls {}\nop_{op}_meta {}\nop_{op}_io {}\n", n.calls, n.meta, n.io));
        }
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dafne_proto::Timespec;

    fn attr(kind: FileType, mode: u32, uid: u32, gid: u32) -> Attr {
        let t = Timespec::default();
        Attr { ino: 5, kind, mode, nlink: 1, uid, gid, rdev: 0, size: 0, blocks: 0, atime: t, mtime: t, ctime: t }
    }

    fn dir(ino: Ino, nlink: u32) -> Attr {
        Attr { ino, nlink, ..attr(FileType::Directory, 0o755, 0, 0) }
    }

    #[test]
    fn a_directory_copy_is_kept_only_when_its_change_overlapped_no_other() {
        let now = std::time::Instant::now();
        let d = 7;
        // Alone: kept, used once.
        let mut f = FreshDirs::default();
        let t = f.begin(&[d]);
        f.end(t, &[d], Some(dir(d, 3)), now);
        assert_eq!(f.take(d, now).map(|a| a.nlink), Some(3));
        assert_eq!(f.take(d, now), None, "used once");

        // A rename in the directory begins while a create's compound is on
        // its way and ends after it: the create's copy may predate the
        // rename at meta, so it is not kept (review of the small-file path).
        let mut f = FreshDirs::default();
        let create = f.begin(&[d]);
        let rename = f.begin(&[d]);
        f.end(create, &[d], Some(dir(d, 3)), now);
        assert_eq!(f.take(d, now), None, "a copy older than an overlapping change");
        f.end(rename, &[d], None, now);
        assert_eq!(f.take(d, now), None);

        // Another change begins and ends while the create is on its way.
        let mut f = FreshDirs::default();
        let create = f.begin(&[d]);
        let mkdir = f.begin(&[d]);
        f.end(mkdir, &[d], Some(dir(d, 4)), now);
        f.end(create, &[d], Some(dir(d, 3)), now);
        assert_eq!(f.take(d, now), None, "two overlapping creates keep neither copy");

        // A change that begins after the copy was kept drops it at once.
        let mut f = FreshDirs::default();
        let t = f.begin(&[d]);
        f.end(t, &[d], Some(dir(d, 3)), now);
        let _link = f.begin(&[d]);
        assert_eq!(f.take(d, now), None);

        // Another session's change heard of while a create is on its way.
        let mut f = FreshDirs::default();
        let t = f.begin(&[d]);
        f.changed_elsewhere(d);
        f.end(t, &[d], Some(dir(d, 3)), now);
        assert_eq!(f.take(d, now), None);

        // Too old to use.
        let mut f = FreshDirs::default();
        let t = f.begin(&[d]);
        f.end(t, &[d], Some(dir(d, 3)), now);
        assert_eq!(f.take(d, now + FRESH_DIR_FOR), None);
    }

    #[test]
    fn access_follows_the_owner_group_other_classes() {
        let a = attr(FileType::Regular, 0o640, 10, 20);
        let owner = Caller::new(10, 99);
        let group = Caller::new(11, 20);
        let other = Caller::new(12, 21);
        assert!(may_access(owner, &a, MAY_READ | MAY_WRITE));
        assert!(!may_access(owner, &a, MAY_EXEC));
        assert!(may_access(group, &a, MAY_READ));
        assert!(!may_access(group, &a, MAY_WRITE));
        assert!(!may_access(other, &a, MAY_READ));
        assert!(may_access(other, &a, 0), "F_OK needs no bits");
        // The owner class applies even when it grants less than the others.
        let b = attr(FileType::Regular, 0o077, 10, 20);
        assert!(!may_access(owner, &b, MAY_READ));
        assert!(may_access(other, &b, MAY_READ));
        // Groups not read: the group class may apply, so only what both it
        // and the other class grant is granted (a refusal is asked again).
        let omitted = Caller { groups: Groups::OMITTED, ..other };
        let c = attr(FileType::Regular, 0o604, 10, 20);
        assert!(may_access(other, &c, MAY_READ) && !may_access(omitted, &c, MAY_READ));
        assert!(may_access(omitted, &a, 0) && may_access(omitted, &attr(FileType::Regular, 0o644, 10, 20), MAY_READ));
    }

    #[test]
    fn root_reads_and_writes_anything_but_executes_only_with_an_x_bit() {
        let f = attr(FileType::Regular, 0o000, 10, 20);
        assert!(may_access(Caller::ROOT, &f, MAY_READ | MAY_WRITE));
        assert!(!may_access(Caller::ROOT, &f, MAY_EXEC));
        assert!(may_access(Caller::ROOT, &attr(FileType::Regular, 0o001, 10, 20), MAY_EXEC));
        assert!(may_access(Caller::ROOT, &attr(FileType::Directory, 0o000, 10, 20), MAY_EXEC));
    }

    #[test]
    fn mknod_types_come_from_the_mode() {
        assert_eq!(node_kind(0o644), Some(FileType::Regular));
        assert_eq!(node_kind(libc::S_IFREG | 0o644), Some(FileType::Regular));
        assert_eq!(node_kind(libc::S_IFIFO | 0o600), Some(FileType::Fifo));
        assert_eq!(node_kind(libc::S_IFSOCK), Some(FileType::Socket));
        assert_eq!(node_kind(libc::S_IFCHR), Some(FileType::CharDevice));
        assert_eq!(node_kind(libc::S_IFBLK), Some(FileType::BlockDevice));
        assert_eq!(node_kind(libc::S_IFDIR | 0o755), None);
        assert_eq!(node_kind(libc::S_IFLNK), None);
        assert_eq!(node_kind(0o030000), None, "no such type");
    }

    #[test]
    fn open_modes_from_flags() {
        assert_eq!(OpenMode::from_flags(libc::O_RDONLY), OpenMode { read: true, write: false, trunc: false });
        assert_eq!(
            OpenMode::from_flags(libc::O_WRONLY | libc::O_TRUNC),
            OpenMode { read: false, write: true, trunc: true }
        );
        assert_eq!(
            OpenMode::from_flags(libc::O_RDWR | libc::O_APPEND),
            OpenMode { read: true, write: true, trunc: false }
        );
        assert_eq!(OpenMode { read: true, write: true, trunc: true }.meta_flags(), OPEN_READ | OPEN_WRITE | OPEN_TRUNC);
        // Truncating needs write rights on the io servers.
        assert_eq!(
            OpenMode { read: true, write: false, trunc: true }.meta_flags(),
            OPEN_READ | OPEN_WRITE | OPEN_TRUNC
        );
    }

    #[test]
    fn xattr_replies_follow_the_size_asked() {
        assert_eq!(xattr_list(&[b"user.a".to_vec(), b"trusted.b".to_vec()]), b"user.a\0trusted.b\0");
        assert_eq!(xattr_list(&[]), b"");
        assert_eq!(xattr_reply(b"abc", 0), Ok(XattrReply::Size(3)));
        assert_eq!(xattr_reply(b"abc", 2), Err(Errno::ERANGE));
        assert_eq!(xattr_reply(b"abc", 3), Ok(XattrReply::Data(b"abc")));
        assert_eq!(xattr_reply(b"", 0), Ok(XattrReply::Size(0)));
    }

    #[test]
    fn fallocate_modes_are_the_ones_linux_allows_that_dafne_serves() {
        use libc::{
            FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_KEEP_SIZE as KEEP,
            FALLOC_FL_PUNCH_HOLE as PUNCH, FALLOC_FL_UNSHARE_RANGE, FALLOC_FL_ZERO_RANGE as ZERO,
        };
        assert_eq!(fallocate_mode(0), Ok(AllocateMode::Reserve));
        assert_eq!(fallocate_mode(KEEP), Ok(AllocateMode::ReserveKeepSize));
        assert_eq!(fallocate_mode(PUNCH | KEEP), Ok(AllocateMode::PunchHole));
        assert_eq!(fallocate_mode(ZERO), Ok(AllocateMode::ZeroRange));
        assert_eq!(fallocate_mode(ZERO | KEEP), Ok(AllocateMode::ZeroRangeKeepSize));
        for m in [PUNCH, FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE, FALLOC_FL_UNSHARE_RANGE, PUNCH | ZERO | KEEP]
        {
            assert_eq!(fallocate_mode(m), Err(Errno::EOPNOTSUPP), "mode {m:#x}");
        }
    }

    #[test]
    fn the_reported_size_is_the_larger_of_meta_and_own_writes() {
        assert_eq!(local_size(100, 0), 100);
        assert_eq!(local_size(100, 4096), 4096);
        let st = InodeState { handles: 1, attr: None, meta_size: 7, written_end: 3, dirty: true, mtime_set: false };
        assert_eq!(st.size(), 7);
    }
}
