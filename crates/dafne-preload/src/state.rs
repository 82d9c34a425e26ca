//! The library's state, in safe Rust: discovery and the lazy connection,
//! the table of dafne descriptors, the operations on them, counters, and
//! what fork and exit do.
//!
//! # The table
//! A descriptor is dafne's when the real `open` returned a kernel
//! descriptor of a regular file on a dafne mount (see [`crate::mounts`])
//! and the library opened the same inode in the cluster. The table maps
//! that descriptor number to an [`Entry`]: the client library's open file
//! and what the descriptor allows. `dup` and friends map the new number to
//! the same entry (one open file description, one entry); the entry is
//! closed (size published, open released in meta) when its last number is
//! closed. A bitmap of the numbers in the table answers "not dafne's"
//! without a lock, so the calls of every other descriptor pay one atomic
//! load.
//!
//! # Offsets
//! The kernel descriptor's offset is the truth: `read` and `write` take it
//! (`lseek(fd, 0, SEEK_CUR)`), move the bytes at it through the library,
//! and set it after (`SEEK_SET`; neither reaches the FUSE daemon). So
//! `dup`ed descriptors, forked children and exec'd programs, which share
//! the open file description, see the offset a POSIX file system would
//! give them. A lock per entry makes the read-modify of the offset atomic
//! between threads, as the kernel's `f_pos` lock does.
//!
//! # Coherence with the kernel path
//! Bytes written through the library are on the io servers when the call
//! returns, as a FUSE write's are, so a later read through the mount (any
//! process, or this one's mmap) gets them from the servers. What the
//! kernel may hold stale is the size (its attribute cache) and pages
//! another process read through the mount before. So before the kernel
//! path is used on a descriptor this process has written through (close,
//! `fstat`, `mmap`, `fsync`, `ftruncate`, `fallocate`, `sendfile`, a
//! `SEEK_DATA`/`SEEK_HOLE` seek, `fork`, an exec or spawn, exit, another
//! open of the same inode) the library publishes the
//! size to meta (as the mount does at every close), makes the kernel fetch
//! the attributes again (`statx` with `AT_STATX_FORCE_SYNC`, which also
//! drops cached pages when the size changed) and drops clean cached pages
//! (`POSIX_FADV_DONTNEED`). Opens on the mount start without cached pages
//! (the mount does not keep them across opens). In the other direction,
//! a read through the library that reaches the size this handle knows
//! asks meta for the size again, so bytes another process published
//! (closed, fsynced) through the mount or the library are read.
//!
//! # Fork, exec, threads
//! UCX state is not usable in a forked child, so a child forgets the
//! parent's table and connection in the fork handler: the descriptors it
//! inherited are the kernel descriptors they always were (the FUSE path,
//! with the shared offset). A child of a process that never connected
//! opens its files through a connection of its own, made on its first
//! dafne open; a child of a process that had started UCX cannot start it
//! again (UCX's global state, its event thread among it, did not survive
//! the fork: a connection attempt there aborts in UCX), so its files stay
//! on the FUSE path, correct but through the kernel. fio's job processes
//! are such children when fio's parent laid out the file through the
//! library: run fio with `--thread` to have its jobs use the library.
//! Before the fork the parent publishes what it wrote, so the child sees
//! it. A `vfork` child (`posix_spawn`, Python's
//! subprocess) shares the parent's memory and runs no fork handler: it
//! changes nothing and intercepts nothing until it execs. An exec'd
//! program starts with an empty table (LD_PRELOAD loads the library
//! afresh) and its inherited descriptors on the FUSE path; the exec
//! functions publish first, since no exit handler runs. The table, the
//! connection and the counters are safe to use from any thread.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use dafne_client::cluster::{Cluster, OpenOptions};
use dafne_client::file::{File, Fs};
use dafne_client::readahead::{Changes, ReadAhead, ReadAheadConfig, Stream};
use dafne_client::Errno;
use dafne_proto::io::Stability;
use libc::c_int;

use crate::mounts::{self, Mounts};
use crate::real;

/// Descriptor numbers the table can hold; a dafne file opened at a
/// higher number stays on the FUSE path (64 Ki bits: 8 KiB).
pub const MAX_FDS: usize = 65536;

const WORDS: usize = MAX_FDS / 64;
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static OURS: [AtomicU64; WORDS] = [ZERO; WORDS];
static DISABLED: AtomicBool = AtomicBool::new(false);
/// Entries of this process with writes not yet published: a stat by path
/// looks at the table only while this is not zero (one atomic load for
/// every other stat).
static UNPUBLISHED: AtomicUsize = AtomicUsize::new(0);

/// What belongs to one process: its table and its connection. A forked
/// child gets a fresh one in the fork handler (the parent's is left
/// untouched and never used there: its runtime thread did not survive the
/// fork); a `vfork` child, which shares this memory and runs no fork
/// handlers, is another process and finds itself [`foreign`].
struct Proc {
    pid: u32,
    table: RwLock<HashMap<c_int, Arc<Entry>>>,
    client: OnceLock<Option<Client>>,
    /// Forked from a process that had started UCX: UCX cannot start again
    /// here (its global state, such as its event thread, did not survive
    /// the fork), so this process's files stay on the FUSE path.
    ucx_inherited: bool,
}

static PROC: AtomicPtr<Proc> = AtomicPtr::new(std::ptr::null_mut());

fn new_proc(ucx_inherited: bool) -> &'static Proc {
    let p: &'static Proc = Box::leak(Box::new(Proc {
        pid: std::process::id(),
        table: RwLock::new(HashMap::new()),
        client: OnceLock::new(),
        ucx_inherited,
    }));
    PROC.store(p as *const Proc as *mut Proc, Ordering::Release);
    p
}

/// This process's state; `None` before discovery found a mount, and in a
/// process that is not the one the state was made for (see [`Proc`]).
fn proc() -> Option<&'static Proc> {
    let p = PROC.load(Ordering::Acquire);
    // SAFETY: a non-null PROC points to a leaked `Proc` (never freed), set
    // only by `new_proc`.
    let p = unsafe { p.as_ref() }?;
    (p.pid == std::process::id()).then_some(p)
}

/// Whether this process may not change the table (a vforked child, or a
/// process before discovery).
pub fn foreign() -> bool {
    proc().is_none()
}

thread_local! {
    /// The library's own work on this thread (reading the cluster file,
    /// connecting, the counters' file): not intercepted.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread busy with the library's own work while alive.
#[derive(Debug)]
pub struct Busy(bool);

impl Busy {
    pub fn enter() -> Busy {
        Busy(BUSY.try_with(|b| b.replace(true)).unwrap_or(true))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = BUSY.try_with(|b| b.set(self.0));
    }
}

fn busy() -> bool {
    BUSY.try_with(|b| b.get()).unwrap_or(true)
}

fn bit(fd: c_int) -> Option<(usize, u64)> {
    let fd = usize::try_from(fd).ok().filter(|&f| f < MAX_FDS)?;
    Some((fd / 64, 1u64 << (fd % 64)))
}

pub fn marked(fd: c_int) -> bool {
    bit(fd).is_some_and(|(w, m)| OURS[w].load(Ordering::Acquire) & m != 0)
}

fn mark(fd: c_int, on: bool) {
    if let Some((w, m)) = bit(fd) {
        if on {
            OURS[w].fetch_or(m, Ordering::AcqRel);
        } else {
            OURS[w].fetch_and(!m, Ordering::AcqRel);
        }
    }
}

/// Counters of what went through the library and what was left to the
/// kernel; written as one JSON line per process at exit when
/// `DAFNE_PRELOAD_STATS` names a file.
#[derive(Debug, Default)]
pub struct Stats {
    pub opens: AtomicU64,
    /// Files on a dafne mount left to the FUSE path at open (O_APPEND, a
    /// refused open in meta, no connection, a descriptor past MAX_FDS, a
    /// mount that is not the connected cluster's).
    pub opens_fallback: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub fsyncs: AtomicU64,
    pub publishes: AtomicU64,
    /// Calls on a dafne descriptor passed to the kernel (mmap, fstat,
    /// sendfile, ...) after syncing its view.
    pub kernel_calls: AtomicU64,
    pub connect_failures: AtomicU64,
}

pub static STATS: Stats = Stats {
    opens: AtomicU64::new(0),
    opens_fallback: AtomicU64::new(0),
    reads: AtomicU64::new(0),
    read_bytes: AtomicU64::new(0),
    writes: AtomicU64::new(0),
    write_bytes: AtomicU64::new(0),
    fsyncs: AtomicU64::new(0),
    publishes: AtomicU64::new(0),
    kernel_calls: AtomicU64::new(0),
    connect_failures: AtomicU64::new(0),
};

impl Stats {
    fn reset(&self) {
        for c in [
            &self.opens,
            &self.opens_fallback,
            &self.reads,
            &self.read_bytes,
            &self.writes,
            &self.write_bytes,
            &self.fsyncs,
            &self.publishes,
            &self.kernel_calls,
            &self.connect_failures,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

fn count(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One open file description of a dafne file.
pub struct Entry {
    file: File,
    /// The inode (the kernel's number is the cluster's).
    ino: u64,
    readable: bool,
    writable: bool,
    /// Held while a call reads and moves the description's offset.
    pos: Mutex<()>,
    /// Bytes written through the library since the kernel's view (the
    /// size in meta and the kernel's attributes) was last brought up to
    /// date.
    written: AtomicBool,
    /// This process's changes of the file, which every read-ahead stream
    /// of it follows (`dafne_client::readahead`, "Consistency").
    changes: Arc<Changes>,
    /// Read-ahead of this description (readable ones, when configured).
    stream: Option<Stream>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("file", &self.file).field("writable", &self.writable).finish_non_exhaustive()
    }
}

fn debug(msg: std::fmt::Arguments<'_>) {
    if std::env::var_os("DAFNE_PRELOAD_DEBUG").is_some() {
        let _b = Busy::enter();
        eprintln!("dafne-preload[{}]: {msg}", std::process::id());
    }
}

/// Discovery, once per process.
fn mounts() -> Option<&'static Mounts> {
    static MOUNTS: OnceLock<Option<Mounts>> = OnceLock::new();
    MOUNTS
        .get_or_init(|| {
            let _b = Busy::enter();
            if std::env::var("DAFNE_PRELOAD").is_ok_and(|v| v == "off" || v == "0") {
                return None;
            }
            let m = mounts::discover(|k| std::env::var(k).ok());
            debug(format_args!("mounts: {m:?}"));
            if m.is_some() {
                new_proc(false);
                install_handlers();
            }
            m
        })
        .as_ref()
}

struct Client {
    fs: Fs,
    /// Read-ahead for sequential readers (`DAFNE_PRELOAD_READAHEAD_MIB`;
    /// None when 0 or when its memory could not be registered).
    readahead: Option<ReadAhead>,
    /// The changes of each open inode's bytes made through this process,
    /// shared by its descriptors' read-ahead streams.
    changes: Mutex<HashMap<u64, Weak<Changes>>>,
    // Holds the runtime the sessions run on.
    _cluster: Cluster,
}

impl Client {
    fn changes_of(&self, ino: u64) -> Arc<Changes> {
        let mut m = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = m.get(&ino).and_then(Weak::upgrade) {
            return c;
        }
        m.retain(|_, w| w.strong_count() > 0);
        let c = Arc::new(Changes::default());
        m.insert(ino, Arc::downgrade(&c));
        c
    }
}

/// Read-ahead memory of a process that reads dafne files (MiB,
/// `DAFNE_PRELOAD_READAHEAD_MIB`): two full windows of the default layout
/// (8 MiB each: two 1 MiB units on each of four servers), registered once
/// at the connection. The mount's default is 64 MiB for all its readers;
/// a program is usually one reader.
const READAHEAD_MIB: usize = 16;

/// The connection, made on the first dafne open; a failure is kept (the
/// FUSE path serves every file from then on).
fn client(p: &'static Proc, m: &Mounts) -> Option<&'static Client> {
    if p.ucx_inherited {
        return None;
    }
    p.client
        .get_or_init(|| {
            let _b = Busy::enter();
            let mut o = OpenOptions::new(&m.cluster, &format!("preload-{}", std::process::id()));
            o.credential = std::env::var_os("DAFNE_CREDENTIAL").map(Into::into);
            match Cluster::open(&o) {
                Ok(c) => {
                    let mib = std::env::var("DAFNE_PRELOAD_READAHEAD_MIB")
                        .ok()
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(READAHEAD_MIB);
                    let readahead = (mib > 0)
                        .then(|| {
                            let config = ReadAheadConfig { budget: mib << 20, ..Default::default() };
                            ReadAhead::new(&c.data, config).map_err(|e| debug(format_args!("no read-ahead: {e}"))).ok()
                        })
                        .flatten();
                    Some(Client {
                        fs: Fs::new(c.meta.clone(), c.data.clone()),
                        readahead,
                        changes: Mutex::new(HashMap::new()),
                        _cluster: c,
                    })
                }
                Err(e) => {
                    count(&STATS.connect_failures, 1);
                    debug(format_args!("cannot connect, files stay on the FUSE mount: {e}"));
                    None
                }
            }
        })
        .as_ref()
}

/// The entry of `fd` when the library serves it on this thread now.
pub fn entry(fd: c_int) -> Option<Arc<Entry>> {
    if !marked(fd) || busy() {
        return None;
    }
    proc()?.table.read().ok()?.get(&fd).cloned()
}

/// After a successful real open: takes the descriptor into the table when
/// it is a regular file on a dafne mount.
pub fn opened(fd: c_int, flags: c_int) {
    if fd < 0 || DISABLED.load(Ordering::Relaxed) || busy() {
        return;
    }
    // A number reused after a close the library did not see (a raw
    // syscall): the old entry is gone with it.
    if marked(fd) {
        let _ = forget(fd);
    }
    if flags & (libc::O_PATH | libc::O_DIRECTORY) != 0 {
        return;
    }
    let Some(m) = mounts() else { return };
    let Some(p) = proc() else { return };
    let Some((dev, ino, kind)) = real::identity(fd) else { return };
    if kind != libc::S_IFREG {
        return;
    }
    if m.is_foreign(dev) {
        // Another cluster's mount (or one the environment left out): this
        // connection would read and write its own inode of that number.
        count(&STATS.opens_fallback, 1);
        debug(format_args!("fd {fd} (inode {ino}) stays on the FUSE path: its mount is not the cluster's"));
        return;
    }
    if !m.contains(dev) {
        return;
    }
    let _b = Busy::enter();
    // This process's library writers of the inode publish first: the new
    // descriptor (an O_APPEND one the kernel serves, or a new entry that
    // learns the size from meta) starts from their size.
    publish_writers_of(p, ino);
    if flags & libc::O_TRUNC != 0 {
        truncated_by_open(p, ino, fd);
    }
    let fallback = |why: &str| {
        count(&STATS.opens_fallback, 1);
        debug(format_args!("fd {fd} (inode {ino}) stays on the FUSE path: {why}"));
    };
    if flags & libc::O_APPEND != 0 {
        return fallback("O_APPEND (the kernel keeps appends atomic)");
    }
    if bit(fd).is_none() {
        return fallback("descriptor number past the table");
    }
    let Some(c) = client(p, m) else {
        return fallback(if p.ucx_inherited {
            "forked from a process that used UCX (which cannot start again in its child)"
        } else {
            "no connection to the cluster"
        });
    };
    let acc = flags & libc::O_ACCMODE;
    let readable = acc == libc::O_RDONLY || acc == libc::O_RDWR;
    let writable = acc == libc::O_WRONLY || acc == libc::O_RDWR;
    let mut oflags = 0;
    if readable {
        oflags |= dafne_proto::OPEN_READ;
    }
    if writable {
        oflags |= dafne_proto::OPEN_WRITE;
    }
    // The kernel already applied O_CREAT, O_EXCL and O_TRUNC through the
    // mount; this open only gets the layout and the capability.
    // A writer also asks for read rights where the file allows them: the
    // size it publishes is then the servers' (every writer's bytes), not
    // only its own writes' end.
    let wide = if writable && !readable { c.fs.open(ino, oflags | dafne_proto::OPEN_READ).ok() } else { None };
    let file = match wide.map_or_else(|| c.fs.open(ino, oflags), Ok) {
        Ok(f) => f,
        Err(e) => return fallback(&format!("the metadata server refused the open: {e:?}")),
    };
    let changes = c.changes_of(ino);
    let stream = c.readahead.as_ref().filter(|_| readable).map(|r| r.stream(changes.clone()));
    let e = Arc::new(Entry {
        file,
        ino,
        readable,
        writable,
        pos: Mutex::new(()),
        written: AtomicBool::new(false),
        changes,
        stream,
    });
    if let Ok(mut t) = p.table.write() {
        t.insert(fd, e);
        mark(fd, true);
        count(&STATS.opens, 1);
    }
}

/// Publishes what this process's entries of `ino` wrote (and brings the
/// kernel's view up to date), before another open of the inode is used.
/// Returns whether there was any.
fn publish_writers_of(p: &Proc, ino: u64) -> bool {
    let writers: Vec<(c_int, Arc<Entry>)> = match p.table.read() {
        Ok(t) => t
            .iter()
            .filter(|(_, e)| e.ino == ino && e.written.load(Ordering::Relaxed))
            .map(|(k, v)| (*k, v.clone()))
            .collect(),
        Err(_) => return false,
    };
    let any = !writers.is_empty();
    let mut seen: Vec<*const Entry> = Vec::new();
    for (fd, e) in writers {
        if !seen.contains(&Arc::as_ptr(&e)) {
            seen.push(Arc::as_ptr(&e));
            e.sync_kernel(fd);
        }
    }
    any
}

/// Whether a stat by path must look at what it found: this process has
/// library writes not yet published (and the call is not the library's
/// own).
pub fn unpublished() -> bool {
    UNPUBLISHED.load(Ordering::Relaxed) != 0 && !busy()
}

/// After a stat by path found the regular file `(dev, ino)`: publishes
/// what this process's library descriptors of it wrote and brings the
/// kernel's attributes up to date, as before another open of the inode.
/// Returns true when something was published (the caller stats again);
/// the writer's `os.path.getsize`, `ls -l`, `stat(1)` and `du` then see
/// its writes, as through the mount, and so does every other process.
pub fn publish_for_path(dev: u64, ino: u64) -> bool {
    if !unpublished() {
        return false;
    }
    let (Some(m), Some(p)) = (mounts(), proc()) else { return false };
    if !m.contains(dev) || m.is_foreign(dev) {
        return false;
    }
    let _b = Busy::enter();
    publish_writers_of(p, ino)
}

/// The largest size this process's library descriptors of `e`'s inode
/// know (their own writes included): the size of a file unlinked while
/// open, which meta no longer has and so cannot be published to the
/// kernel (an `fstat` of it overlays this), and the end a descriptor reads
/// to while another one's writes are unpublished ([`Entry::read_at`]).
pub fn process_size(e: &Entry) -> u64 {
    let own = e.file.size();
    let Some(p) = proc() else { return own };
    match p.table.read() {
        Ok(t) => t.values().filter(|x| x.ino == e.ino).map(|x| x.file.size()).fold(own, u64::max),
        Err(_) => own,
    }
}

/// An open with `O_TRUNC` cut the file through the kernel (after this
/// process's writers of it published): its other entries learn the size
/// the kernel has now and their read-ahead drops what it holds, as an
/// `ftruncate` on one of them would. Without this, a reader kept reading
/// the old bytes from its read-ahead and `SEEK_END` gave the old size.
fn truncated_by_open(p: &Proc, ino: u64, fd: c_int) {
    let Some(size) = real::size(fd) else { return };
    let entries: Vec<Arc<Entry>> = match p.table.read() {
        Ok(t) => t.values().filter(|e| e.ino == ino).cloned().collect(),
        Err(_) => return,
    };
    for e in entries {
        e.resized(Some(size));
    }
}

/// Before `truncate(path)` of the regular file `(dev, ino)`: when this
/// process has library descriptors of it, what they wrote is published
/// first (a later publish would grow the file back past the cut), and the
/// answer is true: [`truncated_by_path`] must follow a successful cut.
pub fn before_path_truncate(dev: u64, ino: u64) -> bool {
    if busy() {
        return false;
    }
    let (Some(m), Some(p)) = (mounts(), proc()) else { return false };
    if !m.contains(dev) || m.is_foreign(dev) {
        return false;
    }
    let ours = matches!(p.table.read(), Ok(t) if t.values().any(|e| e.ino == ino));
    if ours {
        let _b = Busy::enter();
        publish_writers_of(p, ino);
    }
    ours
}

/// `truncate(path)` cut the file `ino` to `size`: every library descriptor
/// of it in this process learns the size and drops read-ahead past it, as
/// after an `ftruncate` through one of them (before, a descriptor read the
/// old bytes or zeros past the new end, and `SEEK_END` used the old size).
pub fn truncated_by_path(ino: u64, size: u64) {
    let Some(p) = proc() else { return };
    let entries: Vec<Arc<Entry>> = match p.table.read() {
        Ok(t) => t.values().filter(|e| e.ino == ino).cloned().collect(),
        Err(_) => return,
    };
    for e in entries {
        e.resized(Some(size));
    }
}

/// An `ftruncate` through one descriptor set the size of `e`'s inode:
/// every entry of it in this process learns it (the others kept their
/// larger size, and a read through them gave zeros past the new end).
pub fn truncated(e: &Entry, size: u64) {
    let entries: Vec<Arc<Entry>> = match proc().map(|p| p.table.read()) {
        Some(Ok(t)) => t.values().filter(|x| x.ino == e.ino).cloned().collect(),
        _ => Vec::new(),
    };
    e.resized(Some(size));
    for x in entries {
        if !std::ptr::eq(Arc::as_ptr(&x), e) {
            x.resized(Some(size));
        }
    }
}

/// Removes `fd` from the table; the entry closes when it was the last
/// number of its description. Returns the error of publishing the size.
pub fn forget(fd: c_int) -> Result<(), Errno> {
    if !marked(fd) {
        return Ok(());
    }
    let Some(p) = proc() else { return Ok(()) };
    let e = {
        let Ok(mut t) = p.table.write() else { return Ok(()) };
        mark(fd, false);
        t.remove(&fd)
    };
    match e.and_then(|e| Arc::try_unwrap(e).ok()) {
        Some(last) => last.close(fd),
        None => Ok(()),
    }
}

/// `newfd` now names `oldfd`'s description (dup, dup2, dup3, F_DUPFD).
pub fn duplicated(oldfd: c_int, newfd: c_int) {
    let Some(p) = proc().filter(|_| newfd >= 0) else { return };
    if marked(newfd) && newfd != oldfd {
        let _ = forget(newfd);
    }
    let Some(e) = entry(oldfd) else { return };
    if bit(newfd).is_none() {
        // Past the table: this number uses the FUSE path; the kernel must
        // see what was written.
        e.sync_kernel(oldfd);
        return;
    }
    if let Ok(mut t) = p.table.write() {
        t.insert(newfd, e);
        mark(newfd, true);
    }
}

/// The description of `fd` leaves the library for the FUSE path (every
/// number of it): e.g. `F_SETFL` with `O_APPEND`.
pub fn demote(fd: c_int) {
    let (Some(e), Some(p)) = (entry(fd), proc()) else { return };
    e.sync_kernel(fd);
    if let Ok(mut t) = p.table.write() {
        t.retain(|n, x| {
            let same = Arc::ptr_eq(x, &e);
            if same {
                mark(*n, false);
            }
            !same
        });
    }
}

fn install_handlers() {
    extern "C" fn prepare() {
        sync_all();
    }
    extern "C" fn child() {
        // The parent's connection is not usable here (its runtime thread
        // did not survive the fork) and its entries are not the child's to
        // close: the inherited descriptors are plain kernel descriptors
        // from now on (the FUSE path, with the shared offset), and new
        // opens connect afresh. The C library's allocator works in fork
        // handlers.
        for w in &OURS {
            w.store(0, Ordering::Relaxed);
        }
        UNPUBLISHED.store(0, Ordering::Relaxed);
        STATS.reset();
        // SAFETY: as in `proc`: PROC is null or points to a leaked Proc
        // (here the parent's, read and left as it is).
        let parent = unsafe { PROC.load(Ordering::Acquire).as_ref() };
        new_proc(parent.is_some_and(|p| p.ucx_inherited || p.client.get().is_some()));
    }
    extern "C" fn exit_work(_: *mut libc::c_void) -> *mut libc::c_void {
        let _ = std::panic::catch_unwind(|| {
            sync_all();
            if !foreign() {
                write_stats();
            }
        });
        std::ptr::null_mut()
    }
    extern "C" fn at_exit() {
        // The exiting thread's thread-locals are already destroyed when
        // exit handlers run (glibc runs the TLS destructors first), and
        // waiting for the servers uses some: the work runs on a thread of
        // its own, made with pthread_create (std's spawn reads the
        // caller's thread-locals too).
        let mut t: libc::pthread_t = 0;
        // SAFETY: `t` is written by pthread_create; `exit_work` has the
        // start routine's signature and ignores its argument (null).
        let made = unsafe { libc::pthread_create(&mut t, std::ptr::null(), exit_work, std::ptr::null_mut()) };
        if made == 0 {
            // SAFETY: `t` is the thread just made, joined once.
            unsafe { libc::pthread_join(t, std::ptr::null_mut()) };
        }
    }
    // SAFETY: the handlers are `extern "C"` functions without arguments
    // that live as long as the process; `child` takes no lock a fork could
    // leave held (atomics and the allocator, which glibc resets first).
    unsafe {
        libc::pthread_atfork(Some(prepare), None, Some(child));
        libc::atexit(at_exit);
    }
}

/// Before this process image is replaced (`execve` and friends): the
/// entries' writes are published, as at exit, since the new program
/// starts without this table and no exit handler runs. A `vfork` child
/// (foreign) has nothing of its own to publish.
pub fn before_exec() {
    if busy() {
        return;
    }
    sync_all();
}

/// Publishes what every entry wrote (before a fork, an exec, at exit).
fn sync_all() {
    let Some(p) = proc() else { return };
    let entries: Vec<(c_int, Arc<Entry>)> = match p.table.read() {
        Ok(t) => t.iter().map(|(k, v)| (*k, v.clone())).collect(),
        Err(_) => return,
    };
    for (fd, e) in entries {
        e.sync_kernel(fd);
    }
}

fn write_stats() {
    let Some(path) = std::env::var_os("DAFNE_PRELOAD_STATS") else { return };
    let _b = Busy::enter();
    let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
    // Only processes that met a dafne file (a shell script's many helpers
    // would drown the rest).
    if l(&STATS.opens) + l(&STATS.opens_fallback) + l(&STATS.connect_failures) == 0 {
        return;
    }
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
    let line = format!(
        "{{\"pid\":{},\"exe\":{:?},\"opens\":{},\"opens_fallback\":{},\"reads\":{},\"read_bytes\":{},\"writes\":{},\
         \"write_bytes\":{},\"fsyncs\":{},\"publishes\":{},\"kernel_calls\":{},\"connect_failures\":{}}}\n",
        std::process::id(),
        exe,
        l(&STATS.opens),
        l(&STATS.opens_fallback),
        l(&STATS.reads),
        l(&STATS.read_bytes),
        l(&STATS.writes),
        l(&STATS.write_bytes),
        l(&STATS.fsyncs),
        l(&STATS.publishes),
        l(&STATS.kernel_calls),
        l(&STATS.connect_failures),
    );
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}

impl Entry {
    pub fn readable(&self) -> bool {
        self.readable
    }

    /// Marks writes not yet published (counted in [`UNPUBLISHED`]).
    fn set_written(&self) {
        if !self.written.swap(true, Ordering::Relaxed) {
            UNPUBLISHED.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Clears the mark; returns whether it was set.
    fn take_written(&self) -> bool {
        let was = self.written.swap(false, Ordering::Relaxed);
        if was {
            UNPUBLISHED.fetch_sub(1, Ordering::Relaxed);
        }
        was
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Reads at `offset`; at the end this handle knows, asks meta whether
    /// the file grew (module docs).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let _b = Busy::enter();
        let end = offset.saturating_add(buf.len() as u64);
        let mut size = self.file.size();
        if end > size {
            size = self.with_siblings(self.file.refresh_size()?);
        }
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len().min((size - offset) as usize);
        let hit = self.stream.as_ref().and_then(|s| s.read(self.file.handle(), offset, len, size));
        let n = match hit {
            // One copy, from the read-ahead unit into the caller's buffer.
            Some(hit) => {
                let got = hit.copy_to(&mut buf[..len]);
                if got < len {
                    got + self.file.read_into(offset + got as u64, &mut buf[got..len])?
                } else {
                    got
                }
            }
            None => self.file.read_into(offset, &mut buf[..len])?,
        };
        count(&STATS.reads, 1);
        count(&STATS.read_bytes, n as u64);
        Ok(n)
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        let _b = Busy::enter();
        offset.checked_add(data.len() as u64).filter(|&e| e <= i64::MAX as u64).ok_or(Errno::EFBIG)?;
        self.set_written();
        let r = self.file.write_from(offset, data, Stability::Unstable);
        // Read-ahead of this file in this process drops what the write
        // may have changed (also after a failure: some servers may have
        // the bytes).
        self.changes.changed(offset, offset + data.len() as u64);
        let n = r?;
        count(&STATS.writes, 1);
        count(&STATS.write_bytes, n as u64);
        Ok(n)
    }

    /// `read`/`write` at the description's offset, which the kernel keeps.
    pub fn at_offset(&self, fd: c_int, op: impl FnOnce(u64) -> Result<usize, Errno>) -> Result<usize, Errno> {
        let _g = self.pos.lock().unwrap_or_else(|p| p.into_inner());
        let off = real::seek(fd, 0, libc::SEEK_CUR).map_err(Errno)?;
        let n = op(off)?;
        real::seek(fd, (off + n as u64) as i64, libc::SEEK_SET).map_err(Errno)?;
        Ok(n)
    }

    /// The size as the file's end for `SEEK_END`.
    pub fn size(&self) -> Result<u64, Errno> {
        let _b = Busy::enter();
        Ok(self.with_siblings(self.file.refresh_size()?))
    }

    /// `size`, or the larger end another library descriptor of the same
    /// file in this process knows while writes are unpublished: through
    /// the mount every descriptor sees the process's writes at once, but
    /// meta, which this handle asks, has only published sizes (before, a
    /// reader opened before a writer's growth read 100 of 200 bytes).
    fn with_siblings(&self, size: u64) -> u64 {
        if UNPUBLISHED.load(Ordering::Relaxed) == 0 {
            return size;
        }
        let size = size.max(process_size(self));
        self.file.grow_known_size(size);
        size
    }

    /// `fsync`/`fdatasync`: durable on the io servers, size exact in meta,
    /// and the kernel's view brought up to date.
    pub fn fsync(&self, fd: c_int) -> Result<(), Errno> {
        let _b = Busy::enter();
        self.file.fsync()?;
        count(&STATS.fsyncs, 1);
        self.take_written();
        real::refresh_kernel_attributes(fd);
        real::drop_cached_pages(fd);
        Ok(())
    }

    /// Brings the kernel's view of the file up to date before the kernel
    /// path is used on it (module docs): publish the size, refetch the
    /// attributes, drop cached pages.
    pub fn sync_kernel(&self, fd: c_int) {
        count(&STATS.kernel_calls, 1);
        if !self.take_written() {
            return;
        }
        let _b = Busy::enter();
        if let Err(e) = self.file.publish() {
            debug(format_args!("publishing the size of fd {fd}: {e:?}"));
            self.set_written();
        }
        count(&STATS.publishes, 1);
        real::refresh_kernel_attributes(fd);
        real::drop_cached_pages(fd);
    }

    /// The size changed through the kernel path (ftruncate, fallocate):
    /// the handle learns it from meta.
    pub fn resized(&self, truncated_to: Option<u64>) {
        let _b = Busy::enter();
        match truncated_to {
            Some(size) => {
                self.file.set_known_size(size);
                self.changes.changed(size, u64::MAX);
            }
            None => {
                let _ = self.file.refresh_size();
                self.changes.changed(0, u64::MAX);
            }
        }
    }

    /// The last number of the description closes (the kernel descriptor
    /// is still open: its close follows).
    fn close(self, fd: c_int) -> Result<(), Errno> {
        let _b = Busy::enter();
        if self.take_written() {
            count(&STATS.publishes, 1);
            let r = self.file.close();
            real::refresh_kernel_attributes(fd);
            real::drop_cached_pages(fd);
            r
        } else {
            drop(self.file);
            Ok(())
        }
    }
}
