//! The `fuser::Filesystem` adapter: kernel requests in, [`Core`] calls, replies
//! out. Nothing here decides file-system semantics; it converts.
//!
//! * Inode numbers: FUSE names the root 1; dafne's root has its own number.
//!   The two are swapped ([`swap_root`]), every other number is the same on
//!   both sides (dafne never reuses an inode number, so the generation is 0).
//! * Errors: [`errno`] is the one place an error becomes the kernel's errno,
//!   and it is the metadata or io server's value unchanged.
//! * Directory offsets: 1 is `.`, 2 is `..`, and an entry whose dafne cookie
//!   is `k` gets offset `k + 2`; a listing resumes from any offset by
//!   cookie, so it survives concurrent inserts and removals the way meta's
//!   paging does ([`resume_cookie`]). `readdirplus` (the kernel's AUTO
//!   mode: used when a listing's attributes are wanted, as by `ls -l`)
//!   uses the same offsets and brings the attributes in compounds of 16.
//! * Negative entries: a lookup of a name that does not exist is answered
//!   as an entry with inode 0 and the entry timeout, which the kernel keeps
//!   as "no such name" (a negative dentry) for that long, so a program
//!   probing for missing files (include paths, `$PATH`, imports) asks once
//!   per timeout, not once per probe. Another client creating the name
//!   drops it within a round trip: meta logs every new name with its name
//!   (`dafne_meta::changes`) and the watcher has the kernel drop that
//!   entry (`FUSE_NOTIFY_INVAL_ENTRY`, `core` module docs, "Coherence").
//!   Where the watcher hears no names (a credential session) or lost
//!   changes, a name made elsewhere shows once the timeout (default 1 s,
//!   `[mount] entry_timeout_ms`) expires, as other cached entries do. This
//!   mount's own creates replace the entry in the kernel; `O_EXCL` creates
//!   always ask (the kernel revalidates for them).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dafne_client::{Attr, FileType, Ino, SetAttr, TimeSet};
use dafne_proto::Timespec;
use fuser::{
    AccessFlags, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::core::{xattr_reply, Caller, Core, OpenMode, XattrReply};
use crate::{MountOptions, MAX_IO};

/// The errno the kernel gets for a dafne error: the same number. Errors
/// that mean a server failed or answered nonsense (rather than a POSIX
/// refusal) are also logged, so the daemon's log explains an `EIO`.
pub fn errno(e: dafne_client::Errno) -> fuser::Errno {
    if matches!(e, dafne_client::Errno::EIO | dafne_client::Errno::EPROTO | dafne_client::Errno::EAGAIN) {
        // Throttled (one per errno every few seconds, with a count), so a
        // server that stays down does not flood the log.
        if let Some(n) = dafne_client::throttle().allow(&format!("fuse answer {}", e.0)) {
            tracing::warn!(
                "answering {e}: a metadata or io server failed, timed out or answered unexpectedly{}",
                dafne_client::suppressed_note(n)
            );
        }
    }
    fuser::Errno::from_i32(e.0)
}

/// Swaps dafne's root inode with FUSE's root (1); an involution, so the
/// same function maps both ways.
pub fn swap_root(ino: u64, root: u64) -> u64 {
    if ino == root {
        1
    } else if ino == 1 {
        root
    } else {
        ino
    }
}

/// The entry of a name that does not exist: inode 0 (module docs,
/// "Negative entries"; the kernel reads nothing else of it).
const NO_SUCH_NAME: fuser::FileAttr = fuser::FileAttr {
    ino: INodeNo(0),
    size: 0,
    blocks: 0,
    atime: UNIX_EPOCH,
    mtime: UNIX_EPOCH,
    ctime: UNIX_EPOCH,
    crtime: UNIX_EPOCH,
    kind: fuser::FileType::RegularFile,
    perm: 0,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    blksize: 0,
    flags: 0,
};

/// Offset of `.` and `..` in a listing; entries follow at cookie + 2.
const DOT: u64 = 1;
const DOTDOT: u64 = 2;

/// The dafne cookie to continue a listing after kernel offset `offset`
/// (offsets 0 and 1 still owe `.`/`..` and then start from the beginning).
pub fn resume_cookie(offset: u64) -> u64 {
    offset.saturating_sub(DOTDOT)
}

/// A dafne time as the kernel's.
pub fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

/// The kernel's time as dafne's (nanoseconds always in `0..10⁹`).
pub fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timespec { sec, nsec }
        }
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(timespec(t)),
    }
}

fn kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
    }
}

/// A device number as the kernel's 32-bit `dev_t` encoding, which is the
/// low half of dafne's (user space's 64-bit one). A number beyond it
/// (major above 4095, minor above 2²⁰ - 1) cannot exist in the kernel; it
/// is reported as 0.
pub fn kernel_rdev(rdev: u64) -> u32 {
    u32::try_from(rdev).unwrap_or(0)
}

/// A request's caller, whose supplementary groups are read (from
/// `/proc`, [`crate::groups`]) only when an answer may depend on them.
///
/// Why: the read costs about 15% of the daemon's CPU per lookup
/// (docs/BENCHMARKS.md, "The hand-off to the daemon's loop, measured"),
/// and almost no answer needs it. The rules of meta's (and [`Core`]'s
/// local checks) that read the groups either *refuse* (a permission
/// class, a chown to a group the caller is not in: `EACCES`, `EPERM`) or
/// *change what a successful call does* (setgid cleared by a chmod or a
/// chown of a caller outside the file's group, a setgid file created by
/// one). So a request goes first with its groups marked omitted
/// ([`dafne_proto::Groups::OMITTED`]): meta (and [`Core`]'s local check)
/// then refuses wherever a group could have changed the outcome, the
/// group class denying what the other class grants included, and only a
/// refusal is asked again with them ([`Lazy::run`]; a refusal changed
/// nothing, and the second call is a new request, not a replay of the
/// first). The requests that meta would refuse anyway whenever the groups
/// matter (a setgid file made, a mode, owner or group set) read them first
/// ([`Lazy::upfront`]), saving that round trip. Root's groups are never read: they change no
/// answer (root passes its permission checks, the setgid rules are for
/// other callers, and a credential that squashes root drops its groups).
/// A user whose refusal without groups was just granted with them (one
/// working in a directory of a supplementary group) has its groups read
/// first for a while ([`GroupHints`]): one round trip and the read, as
/// before the lazy read, not two round trips.
struct Lazy<'a> {
    c: Caller,
    pid: u32,
    read: bool,
    hints: &'a GroupHints,
}

impl<'a> Lazy<'a> {
    fn new(uid: u32, gid: u32, pid: u32, hints: &'a GroupHints) -> Lazy<'a> {
        let groups = if uid == 0 { dafne_proto::Groups::NONE } else { dafne_proto::Groups::OMITTED };
        let mut l = Lazy { c: Caller { uid, gid, groups }, pid, read: uid == 0, hints };
        if !l.read && hints.wants(uid) {
            l.upfront();
        }
        l
    }

    /// The caller with its groups, read now if they were not yet.
    fn upfront(&mut self) -> Caller {
        if !self.read {
            self.c.groups = caller_groups(self.pid, self.c.uid, self.c.gid);
            self.read = true;
        }
        self.c
    }

    /// `f` as the caller; a refusal while the groups were not read is
    /// asked again with them (even none: the first was refused wherever a
    /// group could have changed the outcome).
    fn run<T>(
        &mut self,
        mut f: impl FnMut(Caller) -> Result<T, dafne_client::Errno>,
    ) -> Result<T, dafne_client::Errno> {
        match f(self.c) {
            Err(dafne_client::Errno::EACCES | dafne_client::Errno::EPERM) if !self.read => {
                let again = f(self.upfront());
                if again.is_ok() {
                    self.hints.note(self.c.uid);
                }
                again
            }
            r => r,
        }
    }
}

/// How long a user's groups are read first after they turned a refusal
/// into an answer ([`Lazy`]).
const GROUP_HINT_FOR: Duration = Duration::from_secs(10);

/// Most users remembered by [`GroupHints`] (beyond it, the expired go,
/// then all: a forgotten user only pays the second round trip again).
const GROUP_HINTS_MAX: usize = 4096;

/// The users whose groups were needed lately, and when (by uid).
#[derive(Debug, Default)]
struct GroupHints(std::sync::Mutex<std::collections::HashMap<u32, std::time::Instant>>);

impl GroupHints {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, std::time::Instant>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `uid`'s groups were needed within [`GROUP_HINT_FOR`].
    fn wants(&self, uid: u32) -> bool {
        self.map().get(&uid).is_some_and(|t| t.elapsed() < GROUP_HINT_FOR)
    }

    /// `uid`'s groups turned a refusal into an answer just now.
    fn note(&self, uid: u32) {
        let mut m = self.map();
        if m.len() >= GROUP_HINTS_MAX && !m.contains_key(&uid) {
            m.retain(|_, t| t.elapsed() < GROUP_HINT_FOR);
            if m.len() >= GROUP_HINTS_MAX {
                m.clear();
            }
        }
        m.insert(uid, std::time::Instant::now());
    }
}

/// Whether creating a node of `mode` reads the groups first: a setgid
/// file keeps its bit only when its maker is in its group.
fn create_needs_groups(mode: u32) -> bool {
    mode & libc::S_ISGID != 0
}

/// [`Lazy`]'s groups of thread `pid` acting as `uid`/`gid`: none for root.
fn caller_groups(pid: u32, uid: u32, gid: u32) -> dafne_proto::Groups {
    if uid == 0 {
        dafne_proto::Groups::NONE
    } else {
        crate::groups::of_process(pid, uid, gid)
    }
}

/// The mount's `fuser::Filesystem`.
#[derive(Debug)]
pub struct FuseFs {
    core: Arc<Core>,
    root: Ino,
    attr_ttl: Duration,
    entry_ttl: Duration,
    /// Threads waiting for a lock (`setlk` with `sleep`), at most
    /// [`MAX_LOCK_WAITERS`].
    lock_waiters: Arc<AtomicUsize>,
    /// Tells the kernel to drop cached pages and attributes (set once the
    /// session exists: [`FuseFs::notifier_slot`]).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Ask the kernel for FUSE over io_uring in INIT (`crate::ring`).
    want_uring: bool,
    /// INIT agreed to FUSE over io_uring.
    uring_agreed: Arc<std::sync::atomic::AtomicBool>,
    /// Users whose groups are read first for now ([`Lazy`]).
    group_hints: Arc<GroupHints>,
}

/// Most lock requests of this mount waiting at once, each on a thread of
/// its own so that the FUSE workers stay free; past it `ENOLCK`.
pub const MAX_LOCK_WAITERS: usize = 1024;

/// The kernel's lock type (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`) as dafne's.
fn lock_kind(typ: i32) -> Option<dafne_client::LockKind> {
    match typ {
        libc::F_RDLCK => Some(dafne_client::LockKind::Read),
        libc::F_WRLCK => Some(dafne_client::LockKind::Write),
        libc::F_UNLCK => Some(dafne_client::LockKind::Unlock),
        _ => None,
    }
}

/// The kernel's last byte of a lock (`OFFSET_MAX` for "to the end of the
/// file") as dafne's (`u64::MAX`), and back.
fn lock_end_in(end: u64) -> u64 {
    if end >= i64::MAX as u64 {
        u64::MAX
    } else {
        end
    }
}

fn lock_end_out(end: u64) -> u64 {
    end.min(i64::MAX as u64)
}

impl FuseFs {
    pub fn new(core: Core, opts: &MountOptions) -> FuseFs {
        let root = core.root();
        FuseFs {
            core: Arc::new(core),
            notifier: Arc::new(OnceLock::new()),
            root,
            attr_ttl: opts.attr_ttl,
            entry_ttl: opts.entry_ttl,
            lock_waiters: Arc::new(AtomicUsize::new(0)),
            want_uring: false,
            uring_agreed: Arc::default(),
            group_hints: Arc::default(),
        }
    }

    /// The caller of `req`, its groups read when needed ([`Lazy`]).
    fn caller(&self, req: &Request) -> Lazy<'_> {
        Lazy::new(req.uid(), req.gid(), req.pid(), &self.group_hints)
    }

    /// Asks the kernel for FUSE over io_uring in INIT; the returned flag
    /// says, after INIT, whether it agreed.
    pub fn ask_uring(&mut self) -> Arc<std::sync::atomic::AtomicBool> {
        self.want_uring = true;
        self.uring_agreed.clone()
    }

    /// The core, for the mount's counters.
    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Where the session's notifier goes once the session is made (the
    /// session owns this file system, so it cannot be passed to `new`).
    pub fn notifier_slot(&self) -> Arc<OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Starts the thread that keeps a `Watch` open on the metadata server
    /// and has the kernel drop what other clients changed (module docs of
    /// `core`, "Coherence"). It waits for the session's notifier, and ends
    /// with the file system.
    pub fn start_watcher(&self) {
        let core = Arc::downgrade(&self.core);
        let session = self.core.lock_session();
        let (notifier, root) = (self.notifier.clone(), self.root);
        let spawned = std::thread::Builder::new().name("dafne-watch".into()).spawn(move || {
            let mut since = 0;
            loop {
                let (next, lost, changes) = match session.watch(since) {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::debug!("watching the namespace: {e}; again in a moment");
                        std::thread::sleep(Duration::from_millis(250));
                        if core.strong_count() == 0 {
                            return;
                        }
                        continue;
                    }
                };
                let Some(core) = core.upgrade() else { return };
                let Some(n) = notifier.get() else {
                    // The session is being made: a moment, then ask again.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                if lost {
                    tracing::debug!("some namespace changes were lost: the kernel's caches expire by their timeouts");
                }
                for c in changes {
                    if c.ino != 0 {
                        core.changed_elsewhere(c.ino);
                        let _ = n.inval_inode(INodeNo(swap_root(c.ino, root)), 0, 0);
                    }
                    if c.parent != 0 {
                        let _ = n.inval_entry(INodeNo(swap_root(c.parent, root)), OsStr::from_bytes(&c.name));
                    }
                }
                since = next;
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("no thread to watch the namespace ({e}): other clients' changes show after the timeouts");
        }
    }

    fn ino(&self, ino: INodeNo) -> Ino {
        swap_root(ino.0, self.root)
    }

    fn kernel_ino(&self, ino: Ino) -> INodeNo {
        INodeNo(swap_root(ino, self.root))
    }

    fn attr(&self, a: &Attr) -> fuser::FileAttr {
        fuser::FileAttr {
            ino: self.kernel_ino(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: system_time(a.atime),
            mtime: system_time(a.mtime),
            ctime: system_time(a.ctime),
            crtime: system_time(a.ctime),
            kind: kind(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: kernel_rdev(a.rdev),
            blksize: MAX_IO,
            flags: 0,
        }
    }

    fn entry(&self, r: Result<Attr, dafne_client::Errno>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry_with_ttls(&self.attr_ttl, &self.entry_ttl, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// A `getxattr` or `listxattr` answer for a caller with room for `size`
/// bytes (0: it asks for the length).
fn xattr(r: Result<Vec<u8>, dafne_client::Errno>, size: u32, reply: ReplyXattr) {
    let data = match r {
        Ok(data) => data,
        Err(e) => return reply.error(errno(e)),
    };
    match xattr_reply(&data, size) {
        Ok(XattrReply::Size(n)) => reply.size(n),
        Ok(XattrReply::Data(d)) => reply.data(d),
        Err(e) => reply.error(errno(e)),
    }
}

fn empty(r: Result<(), dafne_client::Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

impl fuser::Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The largest requests the kernel grants, up to one bounce buffer.
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        // Lookups and listings in one directory may run in parallel. Not
        // FUSE_ATOMIC_O_TRUNC: with it the kernel sends O_TRUNC with the
        // open before it checks for ETXTBSY, so `open(O_RDONLY | O_TRUNC)`
        // of a running program would empty it and then fail; without it
        // the truncation is a later setattr the kernel only sends once the
        // checks passed.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // Listings with attributes (one round trip per 16 entries instead
        // of a lookup per entry), when the kernel sees they are used
        // (`ls -l`), plain listings otherwise.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Direct I/O submitted asynchronously (libaio, io_uring) reaches us
        // as it was submitted. Without this flag the kernel completes each
        // O_DIRECT request before it returns from the submission, so a
        // queue depth of 16 arrives here one request at a time (measured
        // with the fuse_request_send/end tracepoints: at most 1 in flight
        // for `fio --ioengine=libaio --iodepth=16`); a synchronous direct
        // request larger than max_read is also sent in parallel pieces.
        // The worker threads serve them concurrently, as they already do
        // for several processes' requests.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        // Locks are the cluster's, not this kernel's: `fcntl` and OFD locks
        // (FUSE_POSIX_LOCKS) and `flock` (FUSE_FLOCK_LOCKS) come here and go
        // to the metadata server, so they exclude processes on every mount.
        // Without these flags the kernel would keep them to itself.
        let _ = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS);
        // FUSE over io_uring (`crate::ring`), only when the mount decided
        // to register a ring: once agreed, the kernel holds every request
        // until the ring is ready.
        if self.want_uring && config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok() {
            self.uring_agreed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.caller(req).run(|c| self.core.lookup(c, self.ino(parent), name.as_bytes())) {
            // A negative entry (module docs).
            Err(dafne_client::Errno::ENOENT) if !self.entry_ttl.is_zero() => {
                reply.entry_with_ttls(&Duration::ZERO, &self.entry_ttl, &NO_SUCH_NAME, Generation(0))
            }
            r => self.entry(r, reply),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.caller(req).run(|c| self.core.getattr(c, self.ino(ino))) {
            Ok(a) => reply.attr(&self.attr_ttl, &self.attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            grow_to: None,
            lazy: false,
        };
        // A new mode, owner or group may clear setgid by the groups.
        let mut c = self.caller(req);
        if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
            c.upfront();
        }
        match c.run(|c| self.core.setattr(c, self.ino(ino), fh.map(|f| f.0), set)) {
            Ok(a) => reply.attr(&self.attr_ttl, &self.attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.caller(req).run(|c| self.core.readlink(c, self.ino(ino))) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mut c = self.caller(req);
        if create_needs_groups(mode) {
            c.upfront();
        }
        self.entry(c.run(|c| self.core.mknod(c, self.ino(parent), name.as_bytes(), mode, u64::from(rdev))), reply)
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        self.entry(self.caller(req).run(|c| self.core.mkdir(c, self.ino(parent), name.as_bytes(), mode)), reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.caller(req).run(|c| self.core.unlink(c, self.ino(parent), name.as_bytes())), reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.caller(req).run(|c| self.core.rmdir(c, self.ino(parent), name.as_bytes())), reply)
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let target = target.as_os_str().as_bytes();
        self.entry(
            self.caller(req).run(|c| self.core.symlink(c, self.ino(parent), link_name.as_bytes(), target)),
            reply,
        )
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        // RENAME_WHITEOUT is for overlay file systems: EINVAL, as rename(2)
        // documents for flags a file system does not support. NOREPLACE and
        // EXCHANGE are meta's, done in one transaction.
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(fuser::Errno::EINVAL);
        }
        let mut f = 0;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            f |= dafne_client::RENAME_NOREPLACE;
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            f |= dafne_client::RENAME_EXCHANGE;
        }
        empty(
            self.caller(req).run(|c| {
                self.core.rename(c, self.ino(parent), name.as_bytes(), self.ino(newparent), newname.as_bytes(), f)
            }),
            reply,
        )
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        // `position` is macOS's (resource forks); Linux always sends 0.
        let known = libc::XATTR_CREATE | libc::XATTR_REPLACE;
        if position != 0 || flags & !known != 0 {
            return reply.error(fuser::Errno::EINVAL);
        }
        empty(
            self.caller(req).run(|c| self.core.setxattr(c, self.ino(ino), name.as_bytes(), value, flags as u32)),
            reply,
        )
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let value = self.caller(req).run(|c| self.core.getxattr(c, self.ino(ino), name.as_bytes()));
        xattr(value, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(self.caller(req).run(|c| self.core.listxattr(c, self.ino(ino))), size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.caller(req).run(|c| self.core.removexattr(c, self.ino(ino), name.as_bytes())), reply)
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.entry(
            self.caller(req).run(|c| self.core.link(c, self.ino(ino), self.ino(newparent), newname.as_bytes())),
            reply,
        )
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.caller(req).run(|c| self.core.open(c, self.ino(ino), OpenMode::from_flags(flags.0))) {
            Ok((fh, _)) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.core.read_with(fh.0, offset, size, |r| match r {
            Ok(data) => reply.data(data),
            Err(e) => reply.error(errno(e)),
        })
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.core.write(fh.0, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(self.core.fallocate(fh.0, offset, length, mode), reply)
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        // Every close(2) ends the closing process's `fcntl` locks on the
        // file (POSIX); the kernel leaves that to us (FUSE_POSIX_LOCKS).
        // After the size is published: the next holder must see it.
        let flushed = self.core.flush(fh.0);
        let unlocked = self.core.unlock_owner(self.ino(ino), lock_owner.0);
        empty(flushed.and(unlocked), reply)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The last close of an open file ends its `flock` and OFD locks
        // (the kernel names their owner here).
        let released = self.core.release(fh.0);
        let unlocked = lock_owner.map_or(Ok(()), |o| self.core.unlock_owner(self.ino(ino), o.0));
        empty(released.and(unlocked), reply)
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let kind = match lock_kind(typ) {
            Some(k) if k != dafne_client::LockKind::Unlock => k,
            _ => return reply.error(fuser::Errno::EINVAL),
        };
        let held = self.core.count(crate::core::Op::Getlk, || {
            self.core.lock_session().test_lock(self.ino(ino), lock_owner.0, start, lock_end_in(end), kind)
        });
        match held {
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Ok(Some(h)) => {
                let typ = if h.kind == dafne_client::LockKind::Write { libc::F_WRLCK } else { libc::F_RDLCK };
                reply.locked(h.start, lock_end_out(h.end), typ, h.pid)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(kind) = lock_kind(typ) else { return reply.error(fuser::Errno::EINVAL) };
        let (kernel_ino, ino, owner, end) = (ino, self.ino(ino), lock_owner.0, lock_end_in(end));
        if kind == dafne_client::LockKind::Unlock {
            let r = self.core.count(crate::core::Op::Setlk, || {
                self.core
                    .before_unlock(fh.0)
                    .and(self.core.lock_session().lock(ino, owner, pid, start, end, kind, false))
            });
            return empty(r, reply);
        }
        self.core.locking_through(fh.0, owner);
        let granted = {
            let (core, notifier) = (self.core.clone(), self.notifier.clone());
            move || {
                core.lock_granted(ino);
                if let Some(n) = notifier.get() {
                    if let Err(e) = n.inval_inode(kernel_ino, 0, 0) {
                        tracing::debug!("invalidating inode {ino} after a lock: {e}");
                    }
                }
            }
        };
        // First without waiting: most locks are free, and this keeps the
        // common case on this worker. An F_SETLKW's try is judged as a
        // waiting request (it must not jump the queue of waiters).
        let first = self.core.count(crate::core::Op::Setlk, || {
            if sleep {
                self.core.lock_session().try_lock_fairly(ino, owner, pid, start, end, kind)
            } else {
                self.core.lock_session().lock(ino, owner, pid, start, end, kind, false)
            }
        });
        match first {
            Err(e) if e == dafne_client::Errno::EAGAIN && sleep => {}
            Ok(()) => {
                granted();
                return reply.ok();
            }
            r => return empty(r, reply),
        }
        // F_SETLKW: wait on a thread of its own, so the workers go on
        // serving (the lock holder's own unlock among them).
        if self.lock_waiters.fetch_add(1, Ordering::AcqRel) >= MAX_LOCK_WAITERS {
            self.lock_waiters.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("{MAX_LOCK_WAITERS} lock requests wait already on this mount: ENOLCK");
            return reply.error(fuser::Errno::from_i32(libc::ENOLCK));
        }
        let session = self.core.lock_session();
        let waiters = self.lock_waiters.clone();
        let spawned = std::thread::Builder::new().name("dafne-lock-wait".into()).spawn(move || {
            let r = session.lock(ino, owner, pid, start, end, kind, true);
            waiters.fetch_sub(1, Ordering::AcqRel);
            if r.is_ok() {
                granted();
            }
            empty(r, reply)
        });
        if let Err(e) = spawned {
            self.lock_waiters.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("no thread for a waiting lock ({e}): ENOLCK");
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        empty(self.core.fsync(fh.0), reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let r = self.caller(req).run(|c| {
            self.core.getattr(c, self.ino(ino)).and_then(|a| match a.kind {
                FileType::Directory if crate::core::may_access(c, &a, crate::core::MAY_READ) => Ok(()),
                FileType::Directory => Err(dafne_client::Errno::EACCES),
                _ => Err(dafne_client::Errno::ENOTDIR),
            })
        });
        match r {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let mut c = self.caller(req);
        let dir = self.ino(ino);
        if offset < DOT && reply.add(ino, DOT, fuser::FileType::Directory, ".") {
            return reply.ok();
        }
        if offset < DOTDOT {
            let parent = c.run(|c| self.core.parent(c, dir)).unwrap_or(dir);
            if reply.add(self.kernel_ino(parent), DOTDOT, fuser::FileType::Directory, "..") {
                return reply.ok();
            }
        }
        let mut cookie = resume_cookie(offset);
        loop {
            // A kernel listing request holds about 100 plain entries (4 KiB).
            let (entries, eof) = match c.run(|c| self.core.readdir(c, dir, cookie, 128)) {
                Ok(page) => page,
                Err(e) => return reply.error(errno(e)),
            };
            for e in &entries {
                let full =
                    reply.add(self.kernel_ino(e.ino), e.cookie + DOTDOT, kind(e.kind), OsStr::from_bytes(&e.name));
                if full {
                    return reply.ok();
                }
                cookie = e.cookie;
            }
            if eof || entries.is_empty() {
                return reply.ok();
            }
        }
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let mut c = self.caller(req);
        let dir = self.ino(ino);
        let ttl = self.attr_ttl.min(self.entry_ttl);
        if offset < DOTDOT {
            // The kernel does not link `.` and `..` from a listing; their
            // attributes only have to be valid.
            let a = match c.run(|c| self.core.getattr(c, dir)) {
                Ok(a) => self.attr(&a),
                Err(e) => return reply.error(errno(e)),
            };
            if offset < DOT && reply.add(ino, DOT, ".", &ttl, &a, Generation(0)) {
                return reply.ok();
            }
            let parent = self.kernel_ino(c.run(|c| self.core.parent(c, dir)).unwrap_or(dir));
            if reply.add(parent, DOTDOT, "..", &ttl, &fuser::FileAttr { ino: parent, ..a }, Generation(0)) {
                return reply.ok();
            }
        }
        let mut cookie = resume_cookie(offset);
        loop {
            // A kernel listing request holds about 25 entries with
            // attributes (4 KiB): 32 per page is one page and two compounds.
            let page = match c.run(|c| self.core.readdir_plus(c, dir, cookie, 32)) {
                Ok(page) => page,
                Err(e) => return reply.error(errno(e)),
            };
            for (e, a) in &page.entries {
                let full = reply.add(
                    self.kernel_ino(e.ino),
                    e.cookie + DOTDOT,
                    OsStr::from_bytes(&e.name),
                    &ttl,
                    &self.attr(a),
                    Generation(0),
                );
                if full {
                    return reply.ok();
                }
            }
            if page.eof || page.next == cookie {
                return reply.ok();
            }
            cookie = page.next;
        }
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Meta commits every namespace operation durably before it answers.
        reply.ok()
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.caller(req).run(|c| self.core.statfs(c)) {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let want = (mask & (AccessFlags::R_OK | AccessFlags::W_OK | AccessFlags::X_OK)).bits() as u32;
        empty(self.caller(req).run(|c| self.core.access(c, self.ino(ino), want)), reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let exclusive = flags & libc::O_EXCL != 0;
        let mut c = self.caller(req);
        if create_needs_groups(mode) {
            c.upfront();
        }
        let r = c.run(|c| {
            self.core.create(c, self.ino(parent), name.as_bytes(), mode, OpenMode::from_flags(flags), exclusive)
        });
        match r {
            Ok((fh, a)) => {
                reply.created(&self.entry_ttl, &self.attr(&a), Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user whose groups turned a refusal into an answer has them read
    /// first for its next requests (one call, not two); another user, and
    /// one whose groups changed nothing, stay lazy. (A closure stands in
    /// for meta's rule here; `tests/mount.rs` runs the real one.)
    #[test]
    fn a_user_whose_groups_were_needed_has_them_read_first() {
        use dafne_client::Errno;
        let hints = GroupHints::default();
        let me = std::process::id();
        let tries = |uid: u32, refuse_all: bool| {
            let mut seen = Vec::new();
            let r = Lazy::new(uid, uid, me, &hints).run(|c| {
                seen.push(c.groups.is_omitted());
                if refuse_all || c.groups.is_omitted() {
                    Err(Errno::EACCES)
                } else {
                    Ok(())
                }
            });
            (r, seen)
        };
        assert_eq!(tries(4242, false), (Ok(()), vec![true, false]), "lazy, then asked again");
        assert_eq!(tries(4242, false), (Ok(()), vec![false]), "read first");
        assert_eq!(tries(4243, false), (Ok(()), vec![true, false]), "another user");
        assert_eq!(tries(4244, true), (Err(Errno::EACCES), vec![true, false]));
        assert_eq!(tries(4244, true), (Err(Errno::EACCES), vec![true, false]), "groups that changed nothing");
        assert_eq!(tries(0, true), (Err(Errno::EACCES), vec![false]), "root: never omitted");
    }

    /// A process acting as `uid`/`gid` with supplementary groups 5 and 6
    /// (`setpriv`, which needs root, as the mount tests do), once its
    /// `/proc` status shows them.
    fn with_groups(uid: u32, gid: u32) -> std::process::Child {
        let (u, g) = (uid.to_string(), gid.to_string());
        let child = std::process::Command::new("setpriv")
            .args(["--reuid", &u, "--regid", &g, "--groups", "5,6", "sleep", "60"])
            .spawn()
            .expect("setpriv (util-linux) runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while crate::groups::of_process(child.id(), uid, gid).as_slice() != [5, 6] {
            assert!(
                std::time::Instant::now() < deadline,
                "setpriv never ran as {uid}/{gid} with groups 5,6 (this test needs root)"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child
    }

    #[test]
    fn a_root_caller_gets_no_groups_read_and_others_their_threads() {
        // A root thread that has supplementary groups: none are sent. (A
        // root without groups, as root in a container often is, would
        // pass whatever caller_groups did.)
        let mut root = with_groups(0, 0);
        let groups = caller_groups(root.id(), 0, 0);
        // Another uid: its thread's groups, read from /proc.
        let mut other = with_groups(4242, 4242);
        let others = caller_groups(other.id(), 4242, 4242);
        for c in [&mut root, &mut other] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(groups.is_empty(), "root's groups were read: {groups:?}");
        assert_eq!(others.as_slice(), [5, 6]);
    }

    #[test]
    fn the_root_swap_is_its_own_inverse() {
        for root in [1u64, 2, 77] {
            for ino in [1u64, 2, 3, 77, 1000] {
                assert_eq!(swap_root(swap_root(ino, root), root), ino);
            }
            assert_eq!(swap_root(root, root), 1);
        }
        assert_eq!(swap_root(5, 1), 5);
    }

    #[test]
    fn times_round_trip_also_before_the_epoch() {
        for t in [
            Timespec { sec: 0, nsec: 0 },
            Timespec { sec: 1_700_000_000, nsec: 123_456_789 },
            Timespec { sec: -1, nsec: 500_000_000 },
            Timespec { sec: -86_400, nsec: 0 },
            Timespec { sec: -5, nsec: 1 },
        ] {
            assert_eq!(timespec(system_time(t)), t, "{t:?}");
        }
    }

    #[test]
    fn listing_offsets_resume_after_the_right_entry() {
        assert_eq!(resume_cookie(0), 0);
        assert_eq!(resume_cookie(DOT), 0);
        assert_eq!(resume_cookie(DOTDOT), 0);
        // An entry with cookie k was given offset k + 2.
        assert_eq!(resume_cookie(17 + DOTDOT), 17);
    }

    #[test]
    fn device_numbers_pass_to_the_kernel_when_it_can_hold_them() {
        // makedev(8, 1) and makedev(4095, 0xfffff): the same in both encodings.
        assert_eq!(kernel_rdev(0x0801), 0x0801);
        assert_eq!(kernel_rdev(0xffff_ffff), 0xffff_ffff);
        // makedev(4096, 0) has major bits the kernel does not have.
        assert_eq!(kernel_rdev(1 << 44), 0);
        for k in FileType::ALL {
            let _ = kind(*k); // every type has a kernel type
        }
        assert_eq!(kind(FileType::Fifo), fuser::FileType::NamedPipe);
    }

    #[test]
    fn errnos_pass_unchanged() {
        for e in [dafne_client::Errno::ENOENT, dafne_client::Errno::EACCES, dafne_client::Errno(4000)] {
            assert_eq!(errno(e).code(), e.0);
        }
    }
}
