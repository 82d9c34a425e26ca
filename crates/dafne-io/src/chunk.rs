//! Chunk files: one sparse file per object.
//!
//! # Two storage paths
//! * **direct** (the goal): chunk files are opened a second time with
//!   `O_DIRECT`, and aligned reads and writes go through an io_uring
//!   ([`dafne_uring::Ring`]) straight between the device and the caller's
//!   buffer (a batch of one read is one `pread(2)` on the `O_DIRECT`
//!   descriptor instead: the ring's call would block as long, and on
//!   tmpfs the ring hands each read to a worker thread and back): the
//!   Unifier's units are then the only cached copy of the data (no
//!   page-cache copy doubling memory, no second memcpy).
//! * **buffered**: positioned `pread`/`pwrite` through the page cache.
//!
//! Which one a server uses is decided once per data directory at start
//! ([`decide`]): `--storage auto` (the default) probes the directory (open a
//! file with `O_DIRECT`, write and read back one aligned block through a new
//! ring) and takes the direct path if all of that works, else the buffered
//! one; `direct` refuses to start without it; `buffered` never probes. The
//! io server logs the outcome in one line.
//!
//! # Alignment on the direct path
//! O_DIRECT wants the file offset, the memory address and the length to be
//! multiples of the device's logical block (512 B or 4 KiB): this store
//! uses [`DIRECT_ALIGN`] = 4 KiB, which satisfies both. Unifier units are
//! page-aligned memory of 4–64 KiB caching unit-aligned file ranges, so a
//! fill is one aligned read. Other requests are split:
//!
//! * a read whose offset and address are aligned reads its whole aligned
//!   prefix directly; a short count (end of file, which need not be
//!   aligned) ends it; the unaligned remainder of the length goes buffered;
//! * a write whose offset and address agree modulo 4 KiB (always true for a
//!   range of a unit: a write-back of a partial dirty range) writes its
//!   aligned middle directly and its unaligned head and tail (each < 4 KiB)
//!   buffered. The Unifier cannot round a dirty range up to whole blocks by
//!   itself: bytes past the end of the object would extend the file;
//! * anything else goes buffered.
//!
//! The `normal` and `mmap` comparison modes always use the buffered path
//! (the page cache is the cache they stand for); `--storage direct` is
//! refused with them.
//!
//! Mixing the two on one file is coherent on Linux: a direct read first
//! writes back dirty page-cache pages in its range, and a direct write
//! invalidates them. `fdatasync` is per inode, so one sync covers both.
//! Holes read as zeros on both paths.
//!
//! # A sync that fails
//! When the device refuses a write-back, Linux reports it to one
//! `fdatasync` and marks the pages clean: a later `fdatasync` succeeds for
//! bytes that are on no device ("fsyncgate"). Writing the same bytes again
//! does not repair it either: tried on ext4 over a loop device whose image
//! could not grow (`tests/failing_device.rs`), the failed write-back leaves
//! the file's extents "unwritten", and after space returned a rewrite and a
//! successful `fdatasync` still left zeros on the device. So an object
//! whose sync failed is *damaged* for the life of the store: every later
//! sync and every read of it fails (`EIO`, the failed sync too, whatever
//! the device said: `ENOSPC` would promise a retry), also from the io server's
//! cache, rather than answering success or bytes the device may not hold.
//! Removing it, or truncating it to nothing, ends that (nothing of it is
//! left to trust). Damaged objects are remembered in memory only: a
//! restarted server reads what the device holds (ext4 itself marks the
//! file system as needing `fsck`), which the operator is told in the log.
//!
//! # Syncs off the loop
//! An `fdatasync` takes tens of milliseconds to seconds on a real device,
//! and the io server has one event-loop thread: a sync on it stopped every
//! other client of the server for as long. So every object sync of the
//! server ([`Storage::sync_later`]: a client's `Sync`, the Unifier's flush
//! and write-through, the comparison modes' data-sync writes) runs on a
//! thread of the store, and the request's future awaits it while the loop
//! serves. The threads (`SYNC_THREADS`, 4, at most) start when a sync finds
//! none free; a sync past them waits for one on the loop, before it
//! duplicates any descriptor (they waited in the threads' queue holding
//! their duplicates, so one client's syncs could fill the server's
//! descriptor table: `tests/sync_off_loop.rs`). The thread gets duplicates
//! of the object's descriptors (the open table may close its own), the
//! `unsynced` table and the directory flag, and does what [`Storage::sync`]
//! does, in the same order: the sidecar, then the data, then cleaning the
//! entries (under the `unsynced` lock, which also orders it with the
//! loop's truncates and writes), then the directory if a chunk file was
//! created since it was last synced. One sync of an object runs at a time
//! (a second, on another thread or the loop's `sync`/`sync_all`, waits for
//! it), and a failed one marks the object damaged (module docs, "A sync
//! that fails") on its thread, before the next may start, which then fails
//! without syncing: the descriptors are duplicates of one open file, and
//! Linux reports the loss to one `fdatasync` of it, so two syncs under way
//! together got one error between them and the other answered success for
//! the same lost bytes (`tests/failing_device.rs`). The loop checks for
//! damage before too (a damaged object's sync fails at once). Likewise
//! the directory is fsynced by one sync at a time: one that found the
//! flag cleared by a fsync under way answered before the new names were
//! durable; it waits for that fsync now. Meanwhile the loop may write the object again: as with the
//! background writer, what the sync covers is what reached the file before
//! its `fdatasync`, and an entry changed meanwhile is cleaned too (`sums`
//! module docs, "Syncs and cleaning"). A sync that fails after a remove or
//! truncate to zero under way marks the object damaged all the same (the
//! failure may concern bytes written after it). [`ChunkStore::sync_all`]
//! (a clean stop's final write-back) still syncs on the calling thread.
//!
//! # Drop-behind (buffered path)
//! Without O_DIRECT, *drop-behind* ([`ChunkStore::set_drop_behind`])
//! approximates it for the Unifier, so that its units are the only cached
//! copy of the data:
//!
//! * after a storage read, the aligned [`DROP_CHUNK`] before the one read
//!   is dropped from the page cache (`POSIX_FADV_DONTNEED`). Not the range
//!   just read: readahead fills the page cache with folios of up to 2 MiB,
//!   and `DONTNEED` drops only folios wholly inside its range, so dropping
//!   a 64 KiB unit's range would keep its pages, and dropping its whole
//!   chunk would throw away what readahead fetched for the next units. A
//!   sequential reader therefore keeps at most about a chunk (plus the
//!   readahead window) in the page cache; a random reader may keep more;
//! * after a storage write, the range written is advised `DONTNEED`, which
//!   starts its write-back; the pages go once clean (a later read's
//!   drop-behind, or the kernel).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dafne_proto::io::{AllocateMode, StripeSlots};
use dafne_unifier::{BackgroundStorage, BackgroundWrite, BatchRead, Storage};
use dafne_uring::{Op, Ring, RingError};

use crate::sums::{self, BadBlock, Unsynced};

/// Objects whose files are kept open (each costs two descriptors: the
/// file and its checksum sidecar; three on the direct path, 768 at most).
const OPEN_FILES: usize = 256;

/// The granularity of page-cache drops: the largest page-cache folio on
/// x86-64 (a PMD, 2 MiB). `POSIX_FADV_DONTNEED` drops only folios wholly
/// inside its range, and folios are aligned to their size, so an aligned
/// chunk of this size is dropped whole whatever folios hold it.
pub const DROP_CHUNK: u64 = 2 << 20;

/// Offset, address and length alignment of direct I/O: the page size, a
/// multiple of every logical block size Linux devices have (512 B, 4 KiB).
pub const DIRECT_ALIGN: usize = 4096;

/// Submission entries of the storage ring (the most operations in flight
/// per system call; a unit's I/O is one operation).
pub const RING_ENTRIES: u32 = 64;

/// The name of the file that probes a data directory for O_DIRECT.
const PROBE_FILE: &str = ".direct-probe";

/// `--storage`: which storage path the io server may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum StorageMode {
    /// O_DIRECT via io_uring if the data directory allows it, else buffered.
    #[default]
    Auto,
    /// O_DIRECT via io_uring, or refuse to start.
    Direct,
    /// pread/pwrite through the page cache.
    Buffered,
}

impl StorageMode {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StorageMode::Auto => "auto",
            StorageMode::Direct => "direct",
            StorageMode::Buffered => "buffered",
        }
    }
}

/// Why the direct path is not available.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirectRefused {
    /// `--storage buffered`.
    #[error("asked for with --storage buffered")]
    NotAsked,
    /// The `normal` and `mmap` serving modes: the page cache is their cache.
    #[error("the serving mode caches in the page cache")]
    PageCacheMode,
    /// The file system refused to open a file with O_DIRECT (tmpfs before
    /// Linux 6.6, some FUSE and network file systems: `EINVAL`).
    #[error("O_DIRECT refused by the file system ({source})")]
    FileSystem {
        #[source]
        source: io::Error,
    },
    /// io_uring could not be set up (old kernel, seccomp, sysctl).
    #[error("{source}")]
    Ring {
        #[source]
        source: RingError,
    },
    /// The file opened, but an aligned direct write or read of the probe
    /// block failed or came back different.
    #[error("O_DIRECT probe I/O failed ({source})")]
    Probe {
        #[source]
        source: io::Error,
    },
}

/// `--storage direct` on a directory that cannot do it.
#[derive(Debug, thiserror::Error)]
#[error("--storage direct: {dir} cannot do O_DIRECT via io_uring: {reason}")]
pub struct DirectUnavailable {
    pub dir: PathBuf,
    #[source]
    pub reason: DirectRefused,
}

/// The storage path chosen for a data directory, with the ring to use.
#[derive(Debug)]
pub enum StoragePath {
    Direct(Box<Ring>),
    Buffered(DirectRefused),
}

impl StoragePath {
    /// The one line the io server logs at start.
    pub fn describe(&self, dir: &Path) -> String {
        match self {
            StoragePath::Direct(_) => format!("storage: O_DIRECT via io_uring on {}", dir.display()),
            StoragePath::Buffered(why) => format!("storage: buffered pread/pwrite on {}: {why}", dir.display()),
        }
    }
}

/// Checks that files under `dir` can do O_DIRECT through a ring: opens a
/// probe file with O_DIRECT, writes one aligned block through a new ring,
/// reads it back and compares; returns the ring. The probe file is removed.
pub fn probe_direct(dir: &Path) -> Result<Ring, DirectRefused> {
    let path = dir.join(PROBE_FILE);
    let res = probe_at(&path);
    let _ = std::fs::remove_file(&path);
    res
}

fn probe_at(path: &Path) -> Result<Ring, DirectRefused> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
        .map_err(|source| DirectRefused::FileSystem { source })?;
    let mut ring = Ring::new(RING_ENTRIES).map_err(|source| DirectRefused::Ring { source })?;
    let mut block = AlignedBuf::new(DIRECT_ALIGN);
    block.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8 ^ 0x5a);
    let probe = |e: io::Error| DirectRefused::Probe { source: e };
    let n = ring.write_at(file.as_fd(), 0, block.as_slice()).map_err(probe)?;
    if n != DIRECT_ALIGN {
        return Err(probe(io::Error::other(format!("short direct write: {n} bytes"))));
    }
    let mut back = AlignedBuf::new(DIRECT_ALIGN);
    let n = ring.read_at(file.as_fd(), 0, back.as_mut_slice()).map_err(probe)?;
    if n != DIRECT_ALIGN || back.as_slice() != block.as_slice() {
        return Err(probe(io::Error::other("direct read returned other bytes than written")));
    }
    Ok(ring)
}

/// The decision of `--storage` given the outcome of the probe (a function
/// of its inputs, so that tests can hand it the failures a machine does not
/// have: a file system refusing O_DIRECT, io_uring missing).
pub fn decide(
    mode: StorageMode,
    dir: &Path,
    probe: impl FnOnce(&Path) -> Result<Ring, DirectRefused>,
) -> Result<StoragePath, DirectUnavailable> {
    match mode {
        StorageMode::Buffered => Ok(StoragePath::Buffered(DirectRefused::NotAsked)),
        StorageMode::Auto => Ok(match probe(dir) {
            Ok(ring) => StoragePath::Direct(Box::new(ring)),
            Err(why) => StoragePath::Buffered(why),
        }),
        StorageMode::Direct => match probe(dir) {
            Ok(ring) => Ok(StoragePath::Direct(Box::new(ring))),
            Err(reason) => Err(DirectUnavailable { dir: dir.to_path_buf(), reason }),
        },
    }
}

/// A heap buffer whose bytes start at a [`DIRECT_ALIGN`] boundary (for the
/// probe and tests; the Unifier's units are page-aligned already).
#[derive(Debug)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    skip: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes at an aligned address.
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let skip = raw.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { raw, skip, len }
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.skip..self.skip + self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.skip..self.skip + self.len]
    }
}

/// What the store has done, per path.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StorageStats {
    /// The direct path is in use (else buffered).
    pub direct: bool,
    /// Reads and writes on O_DIRECT files: through the ring, except a
    /// batch of one read (`read_batch`), one `pread` (so `ring_enters` may
    /// be fewer than these).
    pub direct_ops: u64,
    pub direct_bytes: u64,
    /// Reads and writes with pread/pwrite (all of them on the buffered path;
    /// unaligned parts on the direct path).
    pub buffered_ops: u64,
    pub buffered_bytes: u64,
    /// Background write-back batches (their writes count above).
    pub background_batches: u64,
    /// Syncs (fdatasync), on either path.
    pub syncs: u64,
    /// fsyncs of the objects directory: after a chunk file was created, the
    /// next sync makes its name durable too (a file fsynced whose directory
    /// entry is not can vanish at a power cut).
    pub dir_syncs: u64,
    /// `io_uring_enter` calls of the ring.
    pub ring_enters: u64,
    /// Blocks read from storage whose bytes did not match their checksum
    /// (`sums` module): each such read answered `EIO`.
    pub checksum_errors: u64,
}

/// Whether every chunk file in `dir` should have a checksum sidecar: the
/// marker [`CHECKSUMMED`] is there, or is written now because every chunk
/// file has one (a new directory, or one written only by servers with
/// checksums). A directory with files from before checksums never gets it.
fn all_checksummed(dir: &Path) -> io::Result<bool> {
    let marker = dir.join(CHECKSUMMED);
    if marker.exists() {
        return Ok(true);
    }
    let mut names = std::collections::HashSet::new();
    for e in std::fs::read_dir(dir)? {
        names.insert(e?.file_name());
    }
    let chunk =
        |n: &std::ffi::OsString| n.to_str().is_some_and(|n| n.len() == 16 && u64::from_str_radix(n, 16).is_ok());
    let every = names.iter().filter(|n| chunk(n)).all(|n| {
        let mut crc = n.clone();
        crc.push(".crc");
        names.contains(&crc)
    });
    if every {
        File::create(&marker)?.sync_all()?;
        File::open(dir)?.sync_all()?;
    }
    Ok(every)
}

/// The marker of a data directory whose chunk files all have sidecars.
const CHECKSUMMED: &str = "all-checksummed";

/// One object's open files.
#[derive(Debug)]
struct Files {
    buffered: File,
    /// The same file opened with O_DIRECT (direct path only).
    direct: Option<File>,
    /// The checksum sidecar (`sums` module); `None`: a chunk file written
    /// before checksums existed, served unverified.
    sums: Option<File>,
}

/// The objects of one io server.
#[derive(Debug)]
pub struct ChunkStore {
    dir: PathBuf,
    /// Every chunk file here should have a sidecar ([`all_checksummed`]):
    /// one without is reported by scrub (its sidecar was lost).
    all_checksummed: bool,
    open: RefCell<HashMap<u64, Files>>,
    /// The direct path's ring (`None`: buffered path).
    ring: Option<RefCell<Ring>>,
    stats: Cell<StorageStats>,
    /// What the background writer did (it runs on the Unifier's thread).
    bg_stats: Arc<Mutex<StorageStats>>,
    drop_behind: Cell<bool>,
    /// Per object, the chunk most recently dropped behind a read.
    dropped: RefCell<HashMap<u64, u64>>,
    /// A chunk file was created (here or by the background writer) and the
    /// directory has not been fsynced since.
    dir_unsynced: Arc<AtomicBool>,
    /// The damaged objects, the objects being synced and the directory's
    /// fsync, shared with the sync threads ([`SyncShared`]).
    shared: Arc<SyncShared>,
    /// Blocks written since their object's last sync (shared with the
    /// background writer; its lock serializes sidecar updates).
    unsynced: Arc<Unsynced>,
    /// Bad blocks already logged (bounded: [`LOGGED_BAD_BLOCKS`]) and when
    /// the set was last emptied (every [`LOGGED_WINDOW`], so that new bad
    /// blocks are logged again after a storm).
    logged: RefCell<(Logged, Option<std::time::Instant>)>,
    /// The largest chunk file the directory's file system allows
    /// ([`probe_max_size`]): a write, truncation or allocation past it is
    /// refused with `EFBIG` before anything is cached.
    max_size: u64,
    /// The threads that run object syncs off the loop (module docs,
    /// "Syncs off the loop").
    syncer: Syncer,
}

/// The largest size a file in `dir` may have, found with `ftruncate` on a
/// sparse probe file (unlinked at once; no block is allocated): the file
/// system's limit, which `pwrite` and `ftruncate` both enforce (ext4 with
/// 4 KiB blocks: 16 TiB − 4 KiB; tmpfs: no limit below
/// [`dafne_proto::io::MAX_FILE_SIZE`]). Without this, a write past it was
/// taken into the cache, answered as done, and failed at write-back (an
/// `EIO` at the next fsync and close) instead of `EFBIG` at the write, as
/// a local file system answers. About 63 `ftruncate` calls at start.
pub fn probe_max_size(dir: &Path) -> io::Result<u64> {
    let max = dafne_proto::io::MAX_FILE_SIZE;
    let path = dir.join(format!(".max-size-probe-{}", std::process::id()));
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
    std::fs::remove_file(&path)?;
    let fits = |size: u64| match f.set_len(size) {
        Ok(()) => Ok(true),
        Err(e)
            if e.raw_os_error() == Some(rustix::io::Errno::FBIG.raw_os_error())
                || e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    };
    if fits(max)? {
        return Ok(max);
    }
    // `lo` fits, `hi` does not.
    let (mut lo, mut hi) = (0u64, max);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// (object, block offset) pairs.
type Logged = std::collections::HashSet<(u64, u64)>;

/// How long a bad block logged once is not logged again.
const LOGGED_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// Bad blocks logged one by one; past that, only counted.
const LOGGED_BAD_BLOCKS: usize = 1024;

/// One `pread(2)` of `buf` at `offset` (retried when a signal interrupts
/// it before any byte moved): what a ring of one read does, on this thread.
fn pread_once(fd: std::os::fd::BorrowedFd<'_>, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match rustix::io::pread(fd, &mut *buf, offset) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

fn aligned(x: u64) -> bool {
    x.is_multiple_of(DIRECT_ALIGN as u64)
}

/// What a `fallocate` reserve must leave free on the io server's device
/// (`ChunkStore::fallocate`): 64 MiB, or the reserve gets `ENOSPC`.
pub const RESERVE_MARGIN: u64 = 64 << 20;

impl ChunkStore {
    /// A store on the buffered path.
    pub fn open(data_dir: &Path) -> io::Result<ChunkStore> {
        ChunkStore::open_with(data_dir, None)
    }

    /// The directory that holds the chunk files (the one to probe).
    pub fn objects_dir(data_dir: &Path) -> PathBuf {
        data_dir.join("objects")
    }

    /// A store on the direct path if given a ring (from [`decide`]).
    pub fn open_with(data_dir: &Path, ring: Option<Ring>) -> io::Result<ChunkStore> {
        let dir = ChunkStore::objects_dir(data_dir);
        std::fs::create_dir_all(&dir)?;
        let all_checksummed = all_checksummed(&dir)?;
        let max_size = probe_max_size(&dir)?;
        let stats = StorageStats { direct: ring.is_some(), ..Default::default() };
        Ok(ChunkStore {
            all_checksummed,
            dir,
            open: RefCell::new(HashMap::new()),
            ring: ring.map(RefCell::new),
            stats: Cell::new(stats),
            bg_stats: Arc::default(),
            drop_behind: Cell::new(false),
            dropped: RefCell::new(HashMap::new()),
            dir_unsynced: Arc::default(),
            shared: Arc::default(),
            unsynced: Arc::default(),
            logged: RefCell::default(),
            max_size,
            syncer: Syncer::new(),
        })
    }

    /// The largest chunk file this store can hold ([`probe_max_size`]).
    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    /// `EFBIG` unless every byte of `[offset, offset + len)` fits in a
    /// chunk file (checked before a write, truncation or allocation is
    /// cached or applied).
    pub fn check_fits(&self, offset: u64, len: u64) -> Result<(), dafne_proto::Errno> {
        match offset.checked_add(len) {
            Some(end) if end <= self.max_size => Ok(()),
            _ => Err(dafne_proto::Errno::EFBIG),
        }
    }

    /// fsyncs the objects directory if a chunk file was created since the
    /// last time: a file's data is durable only with its name.
    fn sync_dir_if_needed(&self) -> io::Result<()> {
        if sync_dir(&self.dir, &self.dir_unsynced, &self.shared.dir)? {
            self.count(|s| s.dir_syncs += 1);
        }
        Ok(())
    }

    /// fsyncs every object file this store holds open. Fails while any
    /// object is damaged (module docs, "A sync that fails"): every object
    /// whose fsync fails here is marked, and the next call must not answer
    /// success because Linux reported each loss only once.
    pub fn sync_all(&self) -> io::Result<()> {
        let failed: Vec<(u64, SyncFailure)> = self
            .open
            .borrow()
            .iter()
            .filter_map(|(&o, f)| {
                self.shared.sync_object(o, &f.buffered, f.sums.as_ref(), &self.unsynced).err().map(|e| (o, e))
            })
            .collect();
        let mut first = None;
        for (o, e) in failed {
            first.get_or_insert(e.into_error(o));
        }
        if let Some(e) = first {
            return Err(e);
        }
        self.sync_dir_if_needed()?;
        let damaged = self.shared.state().damaged.len();
        if damaged > 0 {
            return Err(io::Error::other(format!(
                "{damaged} objects are damaged (an earlier sync of each failed): their bytes on the device cannot \
                 be trusted"
            )));
        }
        Ok(())
    }

    /// Whether a sync of `object` failed (module docs, "A sync that fails").
    pub fn is_damaged(&self, object: u64) -> bool {
        self.shared.state().damaged.contains(&object)
    }

    fn mark_damaged(&self, object: u64, why: &io::Error) {
        self.shared.mark_damaged(object, why);
    }

    /// The error of the sync that damaged `object`: not its own kind (a
    /// full device's `StorageFull` would travel as `ENOSPC`, which tells a
    /// client to free space and fsync again; these bytes are lost).
    fn lost_error(object: u64, why: &io::Error) -> io::Error {
        io::Error::other(format!("object {object:x}: a sync failed ({why}); what it was to write may be lost"))
    }

    /// The error of any sync or read of a damaged object.
    fn damaged_error(object: u64) -> io::Error {
        io::Error::other(format!(
            "object {object:x} is damaged: an earlier sync failed, so its bytes on the device cannot be trusted"
        ))
    }

    /// Size of the file system holding the objects and the bytes available
    /// on it (`statvfs`), for `statfs` and `dafne status`.
    /// Also the file system's id, to tell servers sharing one apart.
    pub fn capacity(&self) -> io::Result<(u64, u64, u64)> {
        let v = rustix::fs::statvfs(&self.dir).map_err(io::Error::from)?;
        Ok((v.f_blocks.saturating_mul(v.f_frsize), v.f_bavail.saturating_mul(v.f_frsize), v.f_fsid))
    }

    /// Whether the direct path is in use.
    pub fn is_direct(&self) -> bool {
        self.ring.is_some()
    }

    pub fn stats(&self) -> StorageStats {
        let mut s = self.stats.get();
        if let Some(r) = &self.ring {
            s.ring_enters = r.borrow().stats().enters;
        }
        let b = self.background_stats();
        s.direct_ops += b.direct_ops;
        s.direct_bytes += b.direct_bytes;
        s.buffered_ops += b.buffered_ops;
        s.buffered_bytes += b.buffered_bytes;
        s.background_batches += b.background_batches;
        s.ring_enters += b.ring_enters;
        s
    }

    /// What the background writer alone did.
    pub fn background_stats(&self) -> StorageStats {
        *self.bg_stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut StorageStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Drop each range read or written buffered through [`Storage`] from
    /// the page cache afterwards (see the module docs).
    pub fn set_drop_behind(&self, on: bool) {
        self.drop_behind.set(on);
    }

    /// Asks the kernel to drop the object's `[offset, offset + len)` from the
    /// page cache (`POSIX_FADV_DONTNEED`): clean pages go at once, dirty ones
    /// are queued for write-back. Data is never lost. A missing object is
    /// not an error.
    pub fn drop_cache(&self, object: u64, offset: u64, len: u64) -> io::Result<()> {
        self.with_file(object, false, |f| {
            rustix::fs::fadvise(f, offset, std::num::NonZeroU64::new(len), rustix::fs::Advice::DontNeed)
                .map_err(io::Error::from)
        })
        .map(|_| ())
    }

    fn path(&self, object: u64) -> PathBuf {
        self.dir.join(format!("{object:016x}"))
    }

    /// Runs `f` on the object's (buffered) file, opening (and with
    /// `create`, creating) it. `Ok(None)`: the object does not exist and
    /// `create` is false.
    pub fn with_file<T>(
        &self,
        object: u64,
        create: bool,
        f: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<Option<T>> {
        self.with_files(object, create, |files| f(&files.buffered))
    }

    fn with_files<T>(
        &self,
        object: u64,
        create: bool,
        f: impl FnOnce(&Files) -> io::Result<T>,
    ) -> io::Result<Option<T>> {
        if let Some(files) = self.open.borrow().get(&object) {
            return f(files).map(Some);
        }
        let path = self.path(object);
        let files = match open_noting_creation(&path, create, self.ring.is_some(), &self.dir_unsynced, &self.unsynced) {
            Ok(files) => files,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
            Err(e) => return Err(e),
        };
        let r = f(&files);
        let mut open = self.open.borrow_mut();
        if open.len() >= OPEN_FILES {
            open.clear();
        }
        open.insert(object, files);
        r.map(Some)
    }

    /// Bytes stored (the file length: the largest byte written or truncated to).
    pub fn size(&self, object: u64) -> io::Result<u64> {
        Ok(self.with_file(object, false, |f| Ok(f.metadata()?.len()))?.unwrap_or(0))
    }

    /// Cuts or extends the object to `size`; its checksums follow: the
    /// blocks past the end become holes, and a last block cut part-way is
    /// checksummed again (its cut bytes now read as zeros). In the order
    /// that a crash at any point leaves no false alarm (module `sums`,
    /// "Crashes"): the entries first accept both contents, then the data
    /// changes, then the entries are settled.
    pub fn truncate(&self, object: u64, size: u64) -> io::Result<()> {
        self.with_files(object, true, |f| {
            let Some(s) = &f.sums else { return f.buffered.set_len(size) };
            let mut unsynced = self.unsynced.lock();
            let len = f.buffered.metadata()?.len();
            // Blocks wholly past the shorter of the two ends read as zeros
            // after (entries there past the old end are a crash's leftovers).
            let keep = size.min(len).div_ceil(sums::BLOCK);
            unsynced.accept_zeros(&f.buffered, s, keep, u64::MAX)?;
            let cut = (size < len && !size.is_multiple_of(sums::BLOCK)).then_some(size / sums::BLOCK);
            if let Some(b) = cut {
                let lo = size % sums::BLOCK;
                self.begin_zeroing(f, s, &mut unsynced, object, b, lo, sums::BLOCK)?;
            }
            f.buffered.set_len(size)?;
            injected_crash();
            if size == 0 {
                s.set_len(0)?;
                unsynced.forget(object);
                return Ok(());
            }
            s.set_len(s.metadata()?.len().min(keep * sums::ENTRY))?;
            if let Some(b) = cut {
                self.rechecksum(f, s, &mut unsynced, object, b)?;
            }
            Ok(())
        })?;
        if size == 0 {
            self.shared.state().damaged.remove(&object);
        }
        Ok(())
    }

    /// Before bytes `[lo, hi)` of block `block` become zeros (a truncate or
    /// a punch): its entry accepts the content before and after. Nothing
    /// for a hole.
    #[allow(clippy::too_many_arguments)]
    fn begin_zeroing(
        &self,
        f: &Files,
        s: &File,
        unsynced: &mut sums::UnsyncedInner,
        object: u64,
        block: u64,
        lo: u64,
        hi: u64,
    ) -> io::Result<()> {
        let Some((mut buf, n)) = Self::stored_block(f, s, block)? else { return Ok(()) };
        let before = sums::block_crc(&buf[..n]);
        buf[lo as usize..hi as usize].fill(0);
        let after = sums::block_crc(&buf[..n]);
        unsynced.begin(s, object, block, &[before], &[after])
    }

    /// Checksums block `block` again from the file (after a truncate or a
    /// punch changed part of it), unless it is a hole.
    fn rechecksum(
        &self,
        f: &Files,
        s: &File,
        unsynced: &mut sums::UnsyncedInner,
        object: u64,
        block: u64,
    ) -> io::Result<()> {
        let Some((buf, n)) = Self::stored_block(f, s, block)? else { return Ok(()) };
        unsynced.settle(s, object, block, &[sums::block_crc(&buf[..n])])
    }

    /// Block `block`'s bytes as the file holds them (and how many precede
    /// the end of the file), unless its sidecar entry says it is a hole.
    fn stored_block(f: &Files, s: &File, block: u64) -> io::Result<Option<([u8; sums::BLOCK as usize], usize)>> {
        if sums::read_entries(s, block, 1)?[0] == sums::Entry::Hole {
            return Ok(None);
        }
        let mut buf = [0u8; sums::BLOCK as usize];
        let n = sums::read_full(&f.buffered, block * sums::BLOCK, &mut buf)?;
        Ok(Some((buf, n)))
    }

    /// `fallocate(2)` on the object's file for an io `Allocate`
    /// ([`crate::allocate`]): where the mode zeroes, a punch over the whole
    /// range (other servers' units are holes here anyway); where it
    /// reserves, a reserve of this server's own stripe units of the range
    /// (growing the file unless the mode keeps sizes). A missing object is
    /// created by a reserve and left missing by a plain punch.
    pub fn fallocate(
        &self,
        object: u64,
        offset: u64,
        len: u64,
        mode: AllocateMode,
        stripes: &StripeSlots,
    ) -> io::Result<()> {
        use rustix::fs::{fallocate, FallocateFlags};
        if mode.zeroes() {
            self.with_files(object, false, |f| {
                let Some(s) = f.sums.as_ref().filter(|_| len > 0) else {
                    return fallocate(&f.buffered, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, offset, len)
                        .map_err(io::Error::from);
                };
                // Blocks wholly inside become holes; the blocks at the ends
                // are checksummed again from what the punch left. Entries
                // first accept both contents (module `sums`, "Crashes").
                let mut unsynced = self.unsynced.lock();
                let end = offset.saturating_add(len);
                let (first, last) = (offset / sums::BLOCK, (end - 1) / sums::BLOCK);
                let (inner, inner_end) = (offset.div_ceil(sums::BLOCK), end / sums::BLOCK);
                unsynced.accept_zeros(&f.buffered, s, inner, inner_end)?;
                let mut ends = Vec::new();
                if !offset.is_multiple_of(sums::BLOCK) {
                    ends.push(first);
                }
                if !end.is_multiple_of(sums::BLOCK) && (last != first || offset.is_multiple_of(sums::BLOCK)) {
                    ends.push(last);
                }
                for &b in &ends {
                    let bs = b * sums::BLOCK;
                    let (lo, hi) = (offset.max(bs) - bs, end.min(bs + sums::BLOCK) - bs);
                    self.begin_zeroing(f, s, &mut unsynced, object, b, lo, hi)?;
                }
                fallocate(&f.buffered, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, offset, len)
                    .map_err(io::Error::from)?;
                injected_crash();
                unsynced.punch(s, inner, inner_end)?;
                for &b in &ends {
                    self.rechecksum(f, s, &mut unsynced, object, b)?;
                }
                Ok(())
            })?;
        }
        if mode.reserves() {
            let ranges = crate::allocate::own_ranges(offset, len, stripes);
            // A reserve that would leave less than RESERVE_MARGIN free is
            // refused before anything is reserved (one that fails half-way
            // keeps what it got, and the device is shared by every object):
            // a request cannot fill the disk. Conservative: blocks already
            // allocated in the range count too.
            let want: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            let (_, free, _) = self.capacity()?;
            if want.saturating_add(RESERVE_MARGIN) > free {
                return Err(io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()));
            }
            if !ranges.is_empty() {
                let flags = if mode.keeps_size() { FallocateFlags::KEEP_SIZE } else { FallocateFlags::empty() };
                self.with_file(object, true, |f| {
                    ranges
                        .iter()
                        .try_for_each(|r| fallocate(f, flags, r.start, r.end - r.start))
                        .map_err(io::Error::from)
                })?;
            }
        }
        Ok(())
    }

    pub fn remove(&self, object: u64) -> io::Result<()> {
        self.shared.state().damaged.remove(&object);
        self.open.borrow_mut().remove(&object);
        self.dropped.borrow_mut().remove(&object);
        self.unsynced.lock().forget(object);
        let path = self.path(object);
        // The chunk file first: a sidecar without its file is harmless
        // (emptied when the object is created again).
        for p in [path.clone(), sums::sidecar_path(&path)] {
            match std::fs::remove_file(p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Reads whole aligned blocks directly into `buf` (offset and address
    /// aligned, length a multiple of [`DIRECT_ALIGN`]) until it is full or
    /// a short count (end of file) comes back. Returns the bytes read.
    fn read_direct(&self, file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut ring = self.ring.as_ref().expect("direct path").borrow_mut();
        let mut done = 0;
        while done < buf.len() {
            let n = match ring.read_at(file.as_fd(), offset + done as u64, &mut buf[done..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.count(|s| {
                s.direct_ops += 1;
                s.direct_bytes += n as u64;
            });
            done += n;
            if n == 0 || !aligned(n as u64) {
                break; // end of file
            }
        }
        Ok(done)
    }

    /// Writes all of `buf` directly (offset, address and length aligned).
    fn write_direct(&self, file: &File, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut ring = self.ring.as_ref().expect("direct path").borrow_mut();
        let mut done = 0;
        while done < buf.len() {
            match ring.write_at(file.as_fd(), offset + done as u64, &buf[done..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) if aligned(n as u64) => {
                    self.count(|s| {
                        s.direct_ops += 1;
                        s.direct_bytes += n as u64;
                    });
                    done += n;
                }
                // A partial block written directly (ENOSPC part-way):
                // the next attempt would be unaligned; report it as such.
                Ok(n) => return Err(io::Error::other(format!("direct write stopped after {} bytes", done + n))),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read_buffered(&self, file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let done = sums::read_full(file, offset, buf)?;
        self.count(|s| {
            s.buffered_ops += 1;
            s.buffered_bytes += done as u64;
        });
        Ok(done)
    }

    fn write_buffered(&self, file: &File, offset: u64, buf: &[u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        file.write_all_at(buf, offset)?;
        self.count(|s| {
            s.buffered_ops += 1;
            s.buffered_bytes += buf.len() as u64;
        });
        Ok(())
    }

    fn drop_behind_read(&self, file: &File, object: u64, offset: u64) {
        let chunk = offset / DROP_CHUNK;
        if self.drop_behind.get() && chunk > 0 {
            let behind = chunk - 1;
            let mut dropped = self.dropped.borrow_mut();
            if dropped.get(&object) != Some(&behind) {
                if dropped.len() >= OPEN_FILES {
                    dropped.clear();
                }
                dropped.insert(object, behind);
                let len = std::num::NonZeroU64::new(DROP_CHUNK);
                let _ = rustix::fs::fadvise(file, behind * DROP_CHUNK, len, rustix::fs::Advice::DontNeed);
            }
        }
    }
}

impl Storage for ChunkStore {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if self.is_damaged(object) {
            return Err(ChunkStore::damaged_error(object));
        }
        let n = self.with_files(object, false, |files| {
            let n = self.read_raw(files, object, offset, buf)?;
            self.verify(files, object, offset, &buf[..n], n < buf.len())?;
            Ok(n)
        })?;
        Ok(n.unwrap_or(0))
    }

    /// On the direct path, the aligned reads of the batch (unit fills) go
    /// to the ring in one submission, or, if there is only one, to one
    /// `pread` on the `O_DIRECT` descriptor; the rest, and the completion
    /// of any short read that is not at the end of the file, go through
    /// `read_at`. Every block read is verified against its checksum.
    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<usize>> {
        let mut results = self.read_batch_raw(reads);
        for (r, res) in reads.iter().zip(results.iter_mut()) {
            if let Ok(n) = res {
                let n = *n;
                let checked = self.with_files(r.object, false, |files| {
                    self.verify(files, r.object, r.offset, &r.buf[..n], n < r.buf.len())
                });
                if let Err(e) = checked {
                    *res = Err(e);
                }
            }
        }
        results
    }

    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.with_files(object, true, |files| {
            // The entries first, accepting the content before and after
            // (a crash in the write leaves either), then the data, then
            // the entries settled (module `sums`, "Crashes").
            if let Some(s) = &files.sums {
                let mut unsynced = self.unsynced.lock();
                let (first, befores, news) = sums::plan(&files.buffered, s, offset, buf)?;
                unsynced.begin(s, object, first, &befores, &news)?;
            }
            self.write_raw(files, offset, buf)?;
            injected_crash();
            if let Some(s) = &files.sums {
                let mut unsynced = self.unsynced.lock();
                let (first, crcs) = sums::written_crcs(&files.buffered, offset, buf)?;
                unsynced.settle(s, object, first, &crcs)?;
            }
            Ok(())
        })
        .map(|_| ())
    }

    fn sync(&self, object: u64) -> io::Result<()> {
        if self.is_damaged(object) {
            return Err(ChunkStore::damaged_error(object));
        }
        self.count(|s| s.syncs += 1);
        let r = self.with_files(object, false, |f| {
            Ok(self.shared.sync_object(object, &f.buffered, f.sums.as_ref(), &self.unsynced))
        });
        match r {
            Err(e) => {
                self.mark_damaged(object, &e);
                return Err(ChunkStore::lost_error(object, &e));
            }
            Ok(Some(Err(e))) => return Err(e.into_error(object)),
            Ok(_) => {}
        }
        self.sync_dir_if_needed()
    }

    /// The sync on one of the store's sync threads (module docs, "Syncs
    /// off the loop"): the loop serves while the device syncs. The thread
    /// syncs the object as the only sync of it under way, and marks it
    /// damaged if the sync fails, before the next sync of it may start.
    fn sync_later(&self, object: u64) -> dafne_unifier::SyncFuture<'_> {
        Box::pin(async move {
            if self.is_damaged(object) {
                return Err(ChunkStore::damaged_error(object));
            }
            self.count(|s| s.syncs += 1);
            self.syncer.admit().await;
            // The sync thread's own descriptors (the open table may close
            // these meanwhile); a missing object has only the directory to sync.
            let dup = self.with_files(object, false, |f| {
                Ok((f.buffered.try_clone()?, f.sums.as_ref().map(File::try_clone).transpose()?))
            });
            let files = match dup {
                Ok(files) => files,
                Err(e) => {
                    self.syncer.give_up();
                    self.mark_damaged(object, &e);
                    return Err(ChunkStore::lost_error(object, &e));
                }
            };
            let (unsynced, dir, dir_unsynced) = (self.unsynced.clone(), self.dir.clone(), self.dir_unsynced.clone());
            let shared = self.shared.clone();
            let done = self.syncer.run(move || {
                if let Some((data, sums)) = &files {
                    shared.sync_object(object, data, sums.as_ref(), &unsynced).map_err(Ok)?;
                }
                sync_dir(&dir, &dir_unsynced, &shared.dir).map_err(Err)
            });
            match done.await {
                Ok(dir_synced) => {
                    if dir_synced {
                        self.count(|s| s.dir_syncs += 1);
                    }
                    Ok(())
                }
                Err(Ok(failed)) => Err(failed.into_error(object)),
                Err(Err(dir_failed)) => Err(dir_failed),
            }
        })
    }

    /// A writer for the Unifier's background write-back; on the direct path
    /// with a ring of its own (if one cannot be made, its writes go buffered).
    fn background(&self) -> Option<Box<dyn BackgroundStorage>> {
        let ring = match self.ring {
            Some(_) => {
                Ring::new(RING_ENTRIES).map_err(|e| tracing::warn!("background write-back without io_uring: {e}")).ok()
            }
            None => None,
        };
        Some(Box::new(ChunkBackground {
            dir: self.dir.clone(),
            ring,
            stats: self.bg_stats.clone(),
            dir_unsynced: self.dir_unsynced.clone(),
            unsynced: self.unsynced.clone(),
        }))
    }
}

/// Syncs an object: its sidecar first (so that data that reaches the
/// device is accepted by a durable checksum: `sums` module, "Power cut"),
/// then its data; then its entries written since the last sync accept
/// only their current checksum.
/// The lock is not held across the fdatasyncs (the background writer would
/// wait for the device): an entry changed meanwhile is cleaned too, which
/// is right (a write under way keeps both its contents, module `sums`).
fn sync_files(object: u64, data: &File, sums: Option<&File>, unsynced: &Unsynced) -> io::Result<()> {
    held_sync();
    if let Some(s) = sums {
        s.sync_data()?;
    }
    data.sync_data()?;
    if let Some(s) = sums {
        unsynced.lock().clean(s, object)?;
    }
    Ok(())
}

/// fsyncs the objects directory `dir` if a chunk file was created since
/// the last time (`unsynced`): a file's data is durable only with its
/// name. Whether it synced. One at a time (`one`, held across the fsync):
/// a sync that found the flag cleared by a fsync under way on another
/// thread answered before that fsync did, while the names it was to make
/// durable were not yet; now it waits for it (and if that failed, the
/// flag is set again and this one tries).
fn sync_dir(dir: &Path, unsynced: &AtomicBool, one: &Mutex<()>) -> io::Result<bool> {
    let _one = one.lock().unwrap_or_else(|e| e.into_inner());
    if !unsynced.swap(false, Ordering::SeqCst) {
        return Ok(false);
    }
    let r = File::open(dir).and_then(|d| d.sync_all());
    if r.is_err() {
        unsynced.store(true, Ordering::SeqCst);
    }
    r.map(|()| true)
}

/// What the loop and the sync threads share about syncs (module docs,
/// "Syncs off the loop").
#[derive(Debug, Default)]
struct SyncShared {
    state: Mutex<SyncState>,
    /// Signalled when a sync of an object ends.
    ended: std::sync::Condvar,
    /// Held across the directory's fsync ([`sync_dir`]).
    dir: Mutex<()>,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Objects whose sync failed (module docs, "A sync that fails"). One
    /// entry per object that met a failing device, so bounded by the
    /// objects this server stores.
    damaged: std::collections::HashSet<u64>,
    /// Objects with a sync under way (at most one each).
    syncing: std::collections::HashSet<u64>,
}

/// Why a sync of an object failed.
enum SyncFailure {
    /// It was damaged (by an earlier sync, maybe one under way when this
    /// one was asked for): not synced.
    Damaged,
    /// Its sync failed now; it is marked damaged.
    Lost(io::Error),
}

impl SyncFailure {
    fn into_error(self, object: u64) -> io::Error {
        match self {
            SyncFailure::Damaged => ChunkStore::damaged_error(object),
            SyncFailure::Lost(e) => ChunkStore::lost_error(object, &e),
        }
    }
}

impl SyncShared {
    fn state(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark_damaged(&self, object: u64, why: &io::Error) {
        if self.state().damaged.insert(object) {
            tracing::error!(
                object = format_args!("{object:x}"),
                "a sync failed ({why}): the device may not hold bytes already written, and a later sync cannot \
                 tell; every sync and read of this object fails from now on until it is removed or truncated to \
                 zero. Check the device (dmesg) and restore the file from a copy"
            );
        }
    }

    /// [`sync_files`] as the only sync of `object` under way: waits for
    /// one under way (on another sync thread, or the loop's) to end, and
    /// fails without syncing if the object is damaged by then. A failure
    /// marks the object damaged before the next sync of it starts. Linux
    /// reports a lost write-back to one `fdatasync` of the file: two syncs
    /// of an object at once (the descriptors are duplicates, one open file)
    /// got one error between them, and the other answered success for the
    /// same lost bytes.
    fn sync_object(
        &self,
        object: u64,
        data: &File,
        sums: Option<&File>,
        unsynced: &Unsynced,
    ) -> Result<(), SyncFailure> {
        {
            let mut st = self.state();
            while st.syncing.contains(&object) {
                st = self.ended.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.damaged.contains(&object) {
                return Err(SyncFailure::Damaged);
            }
            st.syncing.insert(object);
        }
        /// Ends the turn however the sync ends (a panic included).
        struct Turn<'a>(&'a SyncShared, u64);
        impl Drop for Turn<'_> {
            fn drop(&mut self) {
                self.0.state().syncing.remove(&self.1);
                self.0.ended.notify_all();
            }
        }
        let _turn = Turn(self, object);
        sync_files(object, data, sums, unsynced).map_err(|e| {
            self.mark_damaged(object, &e);
            SyncFailure::Lost(e)
        })
    }
}

/// Threads a sync may wait on: a sync held by a slow device takes one,
/// so this many can be under way at once; more wait for one to finish.
const SYNC_THREADS: usize = 4;

type SyncJob = Box<dyn FnOnce() + Send>;

/// The store's sync threads (module docs, "Syncs off the loop"), started
/// when a sync finds none free, up to [`SYNC_THREADS`]; they end when the
/// store is dropped.
struct Syncer {
    jobs: std::sync::mpsc::Sender<SyncJob>,
    queue: Arc<Mutex<std::sync::mpsc::Receiver<SyncJob>>>,
    threads: Cell<usize>,
    /// Jobs handed over and not finished, at most [`SYNC_THREADS`] (a
    /// sync past them waits on the loop, [`Syncer::admit`], before it
    /// duplicates any descriptor).
    gate: Arc<Mutex<Gate>>,
}

/// The syncs admitted to the threads, and the loop's syncs waiting for one
/// of them to finish.
#[derive(Default)]
struct Gate {
    handed: usize,
    waiting: Vec<std::task::Waker>,
}

impl Gate {
    /// A job finished (or an admitted sync gave up before handing one
    /// over): every waiting sync tries again.
    fn release(gate: &Mutex<Gate>) {
        let waiting = {
            let mut g = gate.lock().unwrap_or_else(|e| e.into_inner());
            g.handed -= 1;
            std::mem::take(&mut g.waiting)
        };
        for w in waiting {
            w.wake();
        }
    }
}

/// Waits for a place among the jobs handed to the sync threads.
struct Admit(Arc<Mutex<Gate>>);

impl std::future::Future for Admit {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.handed < SYNC_THREADS {
            g.handed += 1;
            std::task::Poll::Ready(())
        } else {
            g.waiting.push(cx.waker().clone());
            std::task::Poll::Pending
        }
    }
}

impl std::fmt::Debug for Syncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Syncer").field("threads", &self.threads.get()).finish()
    }
}

impl Syncer {
    fn new() -> Syncer {
        let (jobs, queue) = std::sync::mpsc::channel();
        Syncer { jobs, queue: Arc::new(Mutex::new(queue)), threads: Cell::new(0), gate: Arc::default() }
    }

    /// A place among the jobs handed to the threads: each is followed by
    /// one [`Syncer::run`], or [`Syncer::give_up`]. Without it, every sync
    /// past the threads waited in their queue with its duplicated
    /// descriptors, so a client's syncs (each connection may have 64
    /// requests under way) could fill the server's descriptor table.
    fn admit(&self) -> Admit {
        Admit(self.gate.clone())
    }

    /// An admitted sync hands over no job.
    fn give_up(&self) {
        Gate::release(&self.gate);
    }

    /// Runs `work` on a sync thread, after [`Syncer::admit`]; the future
    /// completes with its result. Without a thread (none could be
    /// started) it runs here.
    fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> SyncDone<T> {
        let slot: Arc<Mutex<DoneSlot<T>>> = Arc::default();
        let theirs = slot.clone();
        let gate = self.gate.clone();
        let job: SyncJob = Box::new(move || {
            let r = work();
            let waker = {
                let mut s = theirs.lock().unwrap_or_else(|e| e.into_inner());
                s.result = Some(r);
                s.waker.take()
            };
            Gate::release(&gate);
            if let Some(w) = waker {
                w.wake();
            }
        });
        let handed = self.gate.lock().unwrap_or_else(|e| e.into_inner()).handed;
        if handed > self.threads.get() && self.threads.get() < SYNC_THREADS {
            self.start_thread();
        }
        if self.threads.get() == 0 {
            job();
        } else if let Err(e) = self.jobs.send(job) {
            (e.0)(); // cannot happen: the threads hold the receiver
        }
        SyncDone(slot)
    }

    fn start_thread(&self) {
        let queue = self.queue.clone();
        let n = self.threads.get();
        let started = std::thread::Builder::new().name(format!("dafne-sync-{n}")).spawn(move || loop {
            let job = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
            match job {
                Ok(job) => job(),
                Err(_) => return, // the store is gone
            }
        });
        match started {
            Ok(_) => self.threads.set(n + 1),
            Err(e) => tracing::warn!("no sync thread ({e}): syncs wait for the ones under way"),
        }
    }
}

/// A job's result and who waits for it.
struct DoneSlot<T> {
    result: Option<T>,
    waker: Option<std::task::Waker>,
}

impl<T> Default for DoneSlot<T> {
    fn default() -> Self {
        DoneSlot { result: None, waker: None }
    }
}

/// The completion of a job of the [`Syncer`].
struct SyncDone<T>(Arc<Mutex<DoneSlot<T>>>);

impl<T> std::future::Future for SyncDone<T> {
    type Output = T;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match s.result.take() {
            Some(r) => std::task::Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

impl ChunkStore {
    /// Reads without verifying (the old `read_at`).
    fn read_raw(&self, files: &Files, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        {
            let direct_len = buf.len() - buf.len() % DIRECT_ALIGN;
            let direct =
                files.direct.as_ref().filter(|_| aligned(offset) && aligned(buf.as_ptr() as u64) && direct_len > 0);
            let Some(dfile) = direct else {
                let n = self.read_buffered(&files.buffered, offset, buf)?;
                self.drop_behind_read(&files.buffered, object, offset);
                return Ok(n);
            };
            let n = self.read_direct(dfile, offset, &mut buf[..direct_len])?;
            if n < direct_len || n == buf.len() {
                return Ok(n); // end of file, or all read
            }
            let m = self.read_buffered(&files.buffered, offset + n as u64, &mut buf[n..])?;
            Ok(n + m)
        }
    }

    /// Verifies the blocks of `data` (just read at `offset`; `at_end`: the
    /// read was short, the rest of its last block is past the end of the
    /// file): a bad block is counted, logged once, and the read fails.
    fn verify(&self, files: &Files, object: u64, offset: u64, data: &[u8], at_end: bool) -> io::Result<()> {
        let Some(s) = &files.sums else { return Ok(()) };
        let bad = sums::verify(&files.buffered, s, object, offset, data, at_end)?;
        if bad.is_empty() {
            return Ok(());
        }
        self.report_bad(&bad);
        Err(checksum_error(bad[0]))
    }

    fn report_bad(&self, bad: &[BadBlock]) {
        self.count(|s| s.checksum_errors += bad.len() as u64);
        let mut guard = self.logged.borrow_mut();
        let (logged, since) = &mut *guard;
        let now = std::time::Instant::now();
        if since.is_none_or(|t| now.duration_since(t) >= LOGGED_WINDOW) {
            logged.clear();
            *since = Some(now);
        }
        for b in bad {
            if logged.len() < LOGGED_BAD_BLOCKS && logged.insert((b.object, b.offset)) {
                tracing::error!(
                    "checksum mismatch: a {} byte block of object {:x} at offset {} on this server's disk ({}) does \
                     not match its checksum; reads of it answer EIO (no replica to repair from)",
                    sums::BLOCK,
                    b.object,
                    b.offset,
                    self.dir.display()
                );
            }
        }
    }

    /// Reads `[offset, offset + len)` of the object in 1 MiB pieces and
    /// verifies every block (for `mmap` mode, which maps rather than reads,
    /// and for scrub). `Ok(bad blocks)`; counts and logs them too. With
    /// `from_device`, each piece's clean pages are dropped from the page
    /// cache first, so that the device's bytes are what is read.
    pub fn check_range(&self, object: u64, offset: u64, len: u64, from_device: bool) -> io::Result<Vec<BadBlock>> {
        let mut bad = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        let start = offset - offset % sums::BLOCK;
        let end = offset.saturating_add(len);
        self.with_files(object, false, |files| {
            let Some(s) = &files.sums else { return Ok(()) };
            let mut at = start;
            while at < end {
                let want = ((end - at).min(buf.len() as u64).div_ceil(sums::BLOCK) * sums::BLOCK) as usize;
                if from_device {
                    let n = std::num::NonZeroU64::new(want as u64);
                    let _ = rustix::fs::fadvise(&files.buffered, at, n, rustix::fs::Advice::DontNeed);
                }
                let n = sums::read_full(&files.buffered, at, &mut buf[..want])?;
                bad.extend(sums::verify(&files.buffered, s, object, at, &buf[..n], n < want)?);
                if n < want {
                    break;
                }
                at += n as u64;
            }
            Ok(())
        })?;
        if !bad.is_empty() {
            self.report_bad(&bad);
        }
        Ok(bad)
    }

    /// One object's part of a scrub slice: from `start` (block-aligned),
    /// reads at most `budget` bytes of its *data* from the device and
    /// verifies each block; its holes (`SEEK_DATA`/`SEEK_HOLE`) are not
    /// read, only their entries checked (a hole must read as zeros), so a
    /// sparse 16 TiB file costs what its data and sidecar extents cost.
    /// Stops at `deadline` once something was read. The object's files are
    /// used if open and otherwise opened for this call only (the open
    /// table of hot objects is left alone). An object without a sidecar
    /// is read all the same (a device error surfaces), unverified.
    /// `Ok(None)`: no such object.
    pub fn scrub_part(
        &self,
        object: u64,
        start: u64,
        budget: u64,
        deadline: std::time::Instant,
    ) -> io::Result<Option<ScrubPart>> {
        use rustix::fs::{seek, SeekFrom};
        let own = match self.open.borrow().contains_key(&object) {
            true => None,
            false => match open_files(&self.path(object), false, false) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let open = self.open.borrow();
        let files = own.as_ref().or_else(|| open.get(&object)).expect("opened above");
        let size = files.buffered.metadata()?.len();
        let mut part = ScrubPart { verified: files.sums.is_some(), size, end: start, read: 0, bad: Vec::new() };
        if files.sums.is_none() && self.all_checksummed && start == 0 {
            tracing::error!(
                "object {object:x} on this server's disk ({}) has no checksum sidecar though every object here should \
                 have one (lost): it is served unverified",
                self.dir.display()
            );
            part.bad.push(BadBlock { object, offset: sums::NO_SIDECAR });
        }
        let mut buf = vec![0u8; 1 << 20];
        let mut at = start - start % sums::BLOCK;
        while at < size && part.read < budget && (part.read == 0 || std::time::Instant::now() < deadline) {
            let data = match seek(&files.buffered, SeekFrom::Data(at)) {
                Ok(d) => d.min(size),
                Err(rustix::io::Errno::NXIO) => size,
                Err(e) => return Err(e.into()),
            };
            let data = data - data % sums::BLOCK;
            if data > at {
                if let Some(s) = &files.sums {
                    part.bad.extend(sums::check_hole(s, object, at / sums::BLOCK, data / sums::BLOCK)?);
                }
                at = data;
                continue;
            }
            let hole = match seek(&files.buffered, SeekFrom::Hole(at)) {
                Ok(h) => h.min(size),
                Err(rustix::io::Errno::NXIO) => size,
                Err(e) => return Err(e.into()),
            };
            let stop = hole.max(at + 1).min(at + (budget - part.read)).min(at + buf.len() as u64);
            let want = ((stop - at).div_ceil(sums::BLOCK) * sums::BLOCK) as usize;
            let n = std::num::NonZeroU64::new(want as u64);
            let _ = rustix::fs::fadvise(&files.buffered, at, n, rustix::fs::Advice::DontNeed);
            let n = sums::read_full(&files.buffered, at, &mut buf[..want])?;
            if let Some(s) = &files.sums {
                part.bad.extend(sums::verify(&files.buffered, s, object, at, &buf[..n], n < want)?);
            }
            part.read += n as u64;
            at += n as u64;
            if n < want {
                at = at.max(size);
                break;
            }
        }
        part.end = at.min(size);
        let blocks: Vec<BadBlock> = part.bad.iter().copied().filter(|b| b.offset != sums::NO_SIDECAR).collect();
        if !blocks.is_empty() {
            self.report_bad(&blocks);
        }
        Ok(Some(part))
    }

    /// Whether the object has a checksum sidecar (`None`: no such object).
    pub fn has_sums(&self, object: u64) -> io::Result<Option<bool>> {
        self.with_files(object, false, |f| Ok(f.sums.is_some()))
    }

    /// The objects stored here, in id order.
    pub fn objects(&self) -> io::Result<Vec<u64>> {
        let mut ids = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let name = e?.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.len() == 16 {
                if let Ok(id) = u64::from_str_radix(name, 16) {
                    ids.push(id);
                }
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    fn read_batch_raw(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<usize>> {
        let mut results: Vec<Option<io::Result<usize>>> =
            reads.iter().map(|r| self.is_damaged(r.object).then(|| Err(ChunkStore::damaged_error(r.object)))).collect();
        if let Some(ring) = &self.ring {
            // Open every object first (opening may evict others from the
            // table), then take the descriptors of those still open.
            // (A missing object, or an error, leaves the read to `read_at`.)
            for r in reads.iter() {
                let _ = self.with_files(r.object, false, |_| Ok(()));
            }
            let open = self.open.borrow();
            let mut idx = Vec::new();
            let mut ops: Vec<Op<'_>> = Vec::new();
            for (i, r) in reads.iter_mut().enumerate() {
                let aligned_read = aligned(r.offset)
                    && aligned(r.buf.as_ptr() as u64)
                    && aligned(r.buf.len() as u64)
                    && !r.buf.is_empty();
                match open.get(&r.object).and_then(|f| f.direct.as_ref()) {
                    Some(d) if aligned_read && results[i].is_none() => {
                        idx.push(i);
                        ops.push(Op::Read { fd: d.as_fd(), offset: r.offset, buf: &mut *r.buf });
                    }
                    _ => {}
                }
            }
            if !ops.is_empty() {
                // One read gains nothing from the ring (its call waits for
                // every completion anyway) and, where the file system cannot
                // read without blocking (tmpfs), costs the kernel's hand-off
                // to an io_uring worker thread and back: read it in place.
                let out = match ops.as_mut_slice() {
                    [Op::Read { fd, offset, buf }] => vec![pread_once(*fd, *offset, buf)],
                    _ => ring.borrow_mut().run(&mut ops),
                };
                drop(ops);
                for (&i, r) in idx.iter().zip(out) {
                    if let Ok(n) = &r {
                        self.count(|s| {
                            s.direct_ops += 1;
                            s.direct_bytes += *n as u64;
                        });
                    }
                    results[i] = Some(r);
                }
            }
        }
        reads
            .iter_mut()
            .zip(results)
            .map(|(r, res)| match res {
                // Full, or short at an unaligned count (the end of the file).
                Some(Ok(n)) if n == r.buf.len() || n == 0 || !aligned(n as u64) => Ok(n),
                Some(Ok(n)) => self.read_unverified(r.object, r.offset + n as u64, &mut r.buf[n..]).map(|m| n + m),
                Some(Err(e)) => Err(e),
                None => self.read_unverified(r.object, r.offset, r.buf),
            })
            .collect()
    }

    fn read_unverified(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.with_files(object, false, |files| self.read_raw(files, object, offset, buf))?.unwrap_or(0))
    }

    fn write_raw(&self, files: &Files, offset: u64, buf: &[u8]) -> io::Result<()> {
        {
            match files.direct.as_ref().zip(split(offset, buf)) {
                Some((dfile, (head, middle))) => {
                    self.write_buffered(&files.buffered, offset, &buf[..head])?;
                    self.write_direct(dfile, offset + head as u64, &buf[head..head + middle])?;
                    self.write_buffered(&files.buffered, offset + (head + middle) as u64, &buf[head + middle..])?;
                }
                None => {
                    self.write_buffered(&files.buffered, offset, buf)?;
                    if self.drop_behind.get() {
                        let _ = rustix::fs::fadvise(
                            &files.buffered,
                            offset,
                            std::num::NonZeroU64::new(buf.len() as u64),
                            rustix::fs::Advice::DontNeed,
                        );
                    }
                }
            }
            Ok(())
        }
    }
}

/// What [`ChunkStore::scrub_part`] did with one object.
#[derive(Debug)]
pub struct ScrubPart {
    /// It has a checksum sidecar (otherwise read, not verified).
    pub verified: bool,
    /// Its length.
    pub size: u64,
    /// Where this part stopped (`size`: the object is done).
    pub end: u64,
    /// Bytes read from the device (holes are not).
    pub read: u64,
    pub bad: Vec<BadBlock>,
}

/// The error of a read that met a bad block (answered `EIO`).
fn checksum_error(b: BadBlock) -> io::Error {
    io::Error::other(format!(
        "object {:x}: the block at offset {} does not match its checksum (no replica to repair from)",
        b.object, b.offset
    ))
}

/// [`open_files`], and if it had to create the file, a note that the
/// directory needs an fsync before the next sync counts as durable. The
/// loop and the background writer may both create the same new object:
/// the creation is done under the `unsynced` lock (which every sidecar
/// update takes), looking again under it, so a sidecar another writer
/// already created and filled is never emptied.
fn open_noting_creation(
    path: &Path,
    create: bool,
    direct: bool,
    dir_unsynced: &AtomicBool,
    unsynced: &Unsynced,
) -> io::Result<Files> {
    match open_files(path, false, direct) {
        Err(e) if create && e.kind() == io::ErrorKind::NotFound => create_files(path, direct, dir_unsynced, unsynced),
        r => r,
    }
}

/// The creating half of [`open_noting_creation`], after an open found no
/// chunk file: under the lock, looks again (another writer may have
/// created it since) and creates only if it still is not there.
fn create_files(path: &Path, direct: bool, dir_unsynced: &AtomicBool, unsynced: &Unsynced) -> io::Result<Files> {
    let _creating = unsynced.lock();
    match open_files(path, false, direct) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        r => return r,
    }
    // The sidecar first, emptied (a leftover of a removed object must not
    // describe the new one): a chunk file without one is taken for a file
    // from before checksums.
    OpenOptions::new().write(true).create(true).truncate(true).open(sums::sidecar_path(path))?;
    let f = open_files(path, true, direct)?;
    dir_unsynced.store(true, Ordering::SeqCst);
    Ok(f)
}

/// Opens an object's file (creating it with `create`), and with `direct`
/// a second descriptor with O_DIRECT.
fn open_files(path: &Path, create: bool, direct: bool) -> io::Result<Files> {
    let buffered = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path)?;
    let direct = match direct {
        true => Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                .open(path)?,
        ),
        false => None,
    };
    let sums = match OpenOptions::new().read(true).write(true).open(sums::sidecar_path(path)) {
        Ok(f) => Some(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    Ok(Files { buffered, direct, sums })
}

/// How a write of `buf` at `offset` splits for direct I/O: `(head, middle)`
/// byte counts (the head up to the first aligned offset and the tail after
/// the middle go buffered), or `None` if no whole aligned block can go
/// directly (memory and offset not congruent mod [`DIRECT_ALIGN`], or too short).
fn split(offset: u64, buf: &[u8]) -> Option<(usize, usize)> {
    let align = DIRECT_ALIGN as u64;
    let head = ((align - offset % align) % align).min(buf.len() as u64) as usize;
    let middle = (buf.len() - head) / DIRECT_ALIGN * DIRECT_ALIGN;
    let congruent = offset % align == buf.as_ptr() as u64 % align;
    (congruent && middle > 0).then_some((head, middle))
}

/// The chunk store's writer for the Unifier's background write-back
/// thread: it opens the files a batch needs itself (no descriptors shared
/// with the loop; the Unifier waits for an object's write-backs before it
/// is truncated or removed, so the path names the right file), and on the
/// direct path has its own ring, so the aligned middles of a whole batch go
/// to the device in one submission.
#[derive(Debug)]
pub struct ChunkBackground {
    dir: PathBuf,
    ring: Option<Ring>,
    stats: Arc<Mutex<StorageStats>>,
    dir_unsynced: Arc<AtomicBool>,
    unsynced: Arc<Unsynced>,
}

impl BackgroundStorage for ChunkBackground {
    fn write_batch(&mut self, writes: &[BackgroundWrite<'_>]) -> Vec<io::Result<()>> {
        let mut st = StorageStats { background_batches: 1, ..Default::default() };
        let mut files: HashMap<u64, io::Result<Files>> = HashMap::new();
        for w in writes {
            let path = self.dir.join(format!("{:016x}", w.object));
            files.entry(w.object).or_insert_with(|| {
                open_noting_creation(&path, true, self.ring.is_some(), &self.dir_unsynced, &self.unsynced)
            });
        }
        // The entries of every write first (module `sums`, "Crashes"): a
        // write whose entries could not be begun is not made, and fails.
        let mut begun: Vec<io::Result<()>> = {
            let mut unsynced = self.unsynced.lock();
            writes
                .iter()
                .map(|w| match &files[&w.object] {
                    Ok(Files { buffered, sums: Some(s), .. }) => sums::plan(buffered, s, w.offset, w.buf)
                        .and_then(|(first, befores, news)| unsynced.begin(s, w.object, first, &befores, &news)),
                    _ => Ok(()),
                })
                .collect()
        };
        let mut results: Vec<io::Result<()>> = Vec::with_capacity(writes.len());
        // Buffered parts first (heads, tails, whole unaligned writes), then
        // every direct middle of the batch in one submission.
        let mut direct: Vec<(usize, u64, &[u8])> = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let f = match &files[&w.object] {
                Ok(f) => f,
                Err(e) => {
                    results.push(Err(io::Error::new(e.kind(), e.to_string())));
                    continue;
                }
            };
            if let Err(e) = std::mem::replace(&mut begun[i], Ok(())) {
                results.push(Err(e));
                continue;
            }
            let res = match f.direct.as_ref().zip(split(w.offset, w.buf)) {
                Some((_, (head, middle))) => {
                    direct.push((i, w.offset + head as u64, &w.buf[head..head + middle]));
                    buffered(&f.buffered, w.offset, &w.buf[..head], &mut st).and_then(|()| {
                        buffered(&f.buffered, w.offset + (head + middle) as u64, &w.buf[head + middle..], &mut st)
                    })
                }
                None => buffered(&f.buffered, w.offset, w.buf, &mut st),
            };
            results.push(res);
        }
        if let (Some(ring), false) = (self.ring.as_mut(), direct.is_empty()) {
            let enters = ring.stats().enters;
            let mut ops: Vec<Op<'_>> = direct
                .iter()
                .map(|&(i, offset, buf)| {
                    let fd = files[&writes[i].object].as_ref().ok().and_then(|f| f.direct.as_ref()).expect("opened");
                    Op::Write { fd: fd.as_fd(), offset, buf }
                })
                .collect();
            let out = ring.run(&mut ops);
            drop(ops);
            st.ring_enters += ring.stats().enters - enters;
            for (&(i, offset, buf), r) in direct.iter().zip(out) {
                let f = files[&writes[i].object].as_ref().expect("opened");
                let res = match r {
                    Ok(n) => {
                        st.direct_ops += 1;
                        st.direct_bytes += n as u64;
                        // A short direct write: the rest through the page cache.
                        buffered(&f.buffered, offset + n as u64, &buf[n.min(buf.len())..], &mut st)
                    }
                    Err(e) => Err(e),
                };
                if results[i].is_ok() {
                    results[i] = res;
                }
            }
        }
        injected_crash();
        // The entries settled to what was written (module `sums`): a write
        // whose checksums could not be recorded fails, and is written again
        // (its entries still accept what it wrote).
        let mut unsynced = self.unsynced.lock();
        for (w, res) in writes.iter().zip(results.iter_mut()) {
            if let (Ok(()), Some(Ok(f))) = (&res, files.get(&w.object)) {
                if let Some(s) = &f.sums {
                    *res = sums::written_crcs(&f.buffered, w.offset, w.buf)
                        .and_then(|(first, crcs)| unsynced.settle(s, w.object, first, &crcs));
                }
            }
        }
        drop(unsynced);
        let mut total = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        total.direct_ops += st.direct_ops;
        total.direct_bytes += st.direct_bytes;
        total.buffered_ops += st.buffered_ops;
        total.buffered_bytes += st.buffered_bytes;
        total.background_batches += st.background_batches;
        total.ring_enters += st.ring_enters;
        results
    }
}

/// Fault injection for the crash tests (`tests/checksums.rs`): a process
/// killed between a write of data and the settling of its checksums
/// cannot be timed from outside. If `DAFNE_FAULT_CRASH_AFTER_DATA` names a
/// file that exists, the write that reaches this point removes it and the
/// process dies at once (`SIGKILL` to itself: no unwinding, no flush; what
/// it wrote is in the page cache, as after a `kill -9`). Nothing happens
/// without the variable.
fn injected_crash() {
    static FLAG: std::sync::OnceLock<Option<std::ffi::OsString>> = std::sync::OnceLock::new();
    if let Some(flag) = FLAG.get_or_init(|| std::env::var_os("DAFNE_FAULT_CRASH_AFTER_DATA")) {
        if std::fs::remove_file(flag).is_ok() {
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
            std::process::abort();
        }
    }
}

/// Fault injection for tests only (`tests/sync_off_loop.rs`): a device
/// whose fsync takes seconds cannot be made on tmpfs. If
/// `DAFNE_FAULT_HOLD_SYNC` names a file that exists, every object sync
/// that reaches this point creates `<file>.held` (so the test knows a sync
/// is held) and waits until the file is gone, then syncs as usual.
/// Nothing happens without the variable.
fn held_sync() {
    static FLAG: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    if let Some(flag) = FLAG.get_or_init(|| std::env::var_os("DAFNE_FAULT_HOLD_SYNC").map(PathBuf::from)) {
        if flag.exists() {
            let mut held = flag.clone().into_os_string();
            held.push(".held");
            let _ = File::create(held);
            while flag.exists() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}

/// `pwrite` all of `buf` (nothing if empty), counted in `st`.
fn buffered(file: &File, offset: u64, buf: &[u8], st: &mut StorageStats) -> io::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    file.write_all_at(buf, offset)?;
    st.buffered_ops += 1;
    st.buffered_bytes += buf.len() as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probed limit is the file system's: a chunk file can be cut to
    /// it and not one byte past (unless there is no limit below the
    /// largest offset), the probe file is gone, and `check_fits` refuses
    /// exactly the ranges that end past it.
    #[test]
    fn the_largest_chunk_file_is_probed_exactly() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        let max = s.max_size();
        let names: Vec<_> = std::fs::read_dir(ChunkStore::objects_dir(d.path())).unwrap().collect();
        assert!(names.iter().all(|n| !n.as_ref().unwrap().file_name().to_string_lossy().contains("probe")));
        let f = tempfile::tempfile_in(d.path()).unwrap();
        f.set_len(max).unwrap();
        if max < dafne_proto::io::MAX_FILE_SIZE {
            assert!(f.set_len(max + 1).is_err(), "{max} is not the limit");
            assert_eq!(s.check_fits(max, 1), Err(dafne_proto::Errno::EFBIG));
        }
        assert_eq!(s.check_fits(max - 1, 1), Ok(()));
        assert_eq!(s.check_fits(u64::MAX, 1), Err(dafne_proto::Errno::EFBIG));
    }

    #[test]
    fn sparse_objects_read_back_with_holes_as_zeros() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        let mut buf = [9u8; 8];
        assert_eq!(s.read_at(7, 0, &mut buf).unwrap(), 0, "missing object reads empty");
        s.write_at(7, 1 << 20, b"hello").unwrap();
        assert_eq!(s.size(7).unwrap(), (1 << 20) + 5);
        let mut hole = [1u8; 16];
        assert_eq!(s.read_at(7, 100, &mut hole).unwrap(), 16);
        assert_eq!(hole, [0u8; 16]);
        let mut tail = [0u8; 8];
        assert_eq!(s.read_at(7, 1 << 20, &mut tail).unwrap(), 5);
        assert_eq!(&tail[..5], b"hello");
        s.truncate(7, 3).unwrap();
        assert_eq!(s.size(7).unwrap(), 3);
        s.sync(7).unwrap();
        s.remove(7).unwrap();
        assert_eq!(s.size(7).unwrap(), 0);
        s.remove(7).unwrap();
    }

    /// Issue 10, finding 8: a chunk file created and fsynced could vanish
    /// at a power cut, because its directory entry was never fsynced. The
    /// first sync after a creation (by a write or by the background
    /// writer) fsyncs the directory once; later syncs do not.
    #[test]
    fn the_first_sync_after_a_creation_fsyncs_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        s.write_at(1, 0, b"one").unwrap();
        s.sync(1).unwrap();
        assert_eq!(s.stats().dir_syncs, 1, "the new file's name was not made durable");
        s.write_at(1, 3, b"more").unwrap();
        s.sync(1).unwrap();
        assert_eq!(s.stats().dir_syncs, 1, "no new name, no directory fsync");
        // A file the background writer creates counts as well.
        let mut bg = s.background().unwrap();
        let data = [7u8; 4096];
        let w = dafne_unifier::BackgroundWrite { object: 2, offset: 0, buf: &data };
        assert!(bg.write_batch(&[w]).iter().all(|r| r.is_ok()));
        s.sync(2).unwrap();
        assert_eq!(s.stats().dir_syncs, 2, "a background creation was not made durable");
        s.sync_all().unwrap();
        assert_eq!(s.stats().dir_syncs, 2);
    }

    /// Two syncs on two sync threads, both owing the directory a fsync (a
    /// chunk file was created): the first clears the flag and fsyncs; the
    /// second must not answer before that fsync does (the new name is not
    /// durable yet), and when it fails, must not answer success. The
    /// first's fsync is held where nothing else can hold it: its
    /// "directory" is a FIFO, whose open waits for a writer (and whose
    /// fsync then fails, EINVAL). Before, the second saw the flag cleared
    /// and answered at once that there was nothing to sync.
    #[test]
    fn a_sync_waits_for_the_directory_fsync_under_way_on_another_thread() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("dir");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let shared = Arc::new((AtomicBool::new(true), Mutex::new(())));
        let sync = |fifo: PathBuf, shared: Arc<(AtomicBool, Mutex<()>)>| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(sync_dir(&fifo, &shared.0, &shared.1).map_err(|e| e.kind())));
            rx
        };
        let first = sync(fifo.clone(), shared.clone());
        // The first has cleared the flag: it is in its fsync (the open).
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while shared.0.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < end, "the first sync never began");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let second = sync(fifo.clone(), shared.clone());
        // Held for a while (a second answering here answered early; one
        // slower than this would pass unseen, never fail wrongly).
        let early = second.recv_timeout(std::time::Duration::from_secs(2));
        // Lets each waiting open through (a writer for each reader).
        let release = |rx: &std::sync::mpsc::Receiver<_>| loop {
            if let Ok(r) = rx.try_recv() {
                return r;
            }
            assert!(std::time::Instant::now() < end + std::time::Duration::from_secs(30), "a sync never ended");
            let nonblock = rustix::fs::OFlags::NONBLOCK.bits() as i32;
            let _ = OpenOptions::new().write(true).custom_flags(nonblock).open(&fifo);
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(early, Err(std::sync::mpsc::RecvTimeoutError::Timeout), "answered during the first's fsync");
        assert_eq!(release(&first), Err(io::ErrorKind::InvalidInput), "a FIFO's fsync");
        assert!(release(&second).is_err(), "answered success after the first's fsync failed");
    }

    /// `sync_later` (module docs, "Syncs off the loop") does what `sync`
    /// does, on a sync thread: the new file's name is synced once, the
    /// entries written since are cleaned (their content is stable now),
    /// two syncs may be awaited together, and a damaged object's sync
    /// fails at once.
    #[test]
    fn a_sync_later_syncs_on_a_thread_as_sync_does() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        s.write_at(1, 0, &[1u8; 8192]).unwrap();
        s.write_at(2, 0, b"two").unwrap();
        let sidecar = sums::sidecar_path(&s.path(1));
        let stable = || match sums::read_entries(&File::open(&sidecar).unwrap(), 0, 1).unwrap()[0] {
            sums::Entry::Written { cur, stable, .. } => cur == stable,
            sums::Entry::Hole => panic!("a written block's entry is a hole"),
        };
        assert!(!stable(), "a block never synced accepts its content as stable");
        let both = futures::future::join(s.sync_later(1), s.sync_later(2));
        let (a, b) = futures::executor::block_on(both);
        a.unwrap();
        b.unwrap();
        assert!(stable(), "the entries were not cleaned");
        assert_eq!(s.stats().syncs, 2);
        assert_eq!(s.stats().dir_syncs, 1, "the new files' names were not made durable once");
        assert!(s.syncer.threads.get() >= 1, "the syncs did not run on a sync thread");
        futures::executor::block_on(s.sync_later(3)).unwrap(); // no such object: nothing to sync
        s.mark_damaged(1, &io::Error::other("a test"));
        assert!(futures::executor::block_on(s.sync_later(1)).is_err());
        assert_eq!(s.stats().syncs, 3, "a damaged object's sync went to the device");
    }

    /// Checksums (module `sums`) on both storage paths: a byte flipped on
    /// the device fails the read of its block (and only that block) and is
    /// counted; holes, an unaligned end, partial rewrites, truncates and
    /// punches are no false alarms.
    #[test]
    fn a_flipped_byte_fails_its_block_and_nothing_else_does() {
        for direct in [false, true] {
            let d = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(ChunkStore::objects_dir(d.path())).unwrap();
            let ring = if direct {
                match probe_direct(&ChunkStore::objects_dir(d.path())) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        eprintln!("no direct path here ({e}): buffered only");
                        continue;
                    }
                }
            } else {
                None
            };
            let s = ChunkStore::open_with(d.path(), ring).unwrap();
            let mut data = AlignedBuf::new(3 * 4096);
            data.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8 + 1);
            s.write_at(9, 0, &data.as_slice()[..10_000]).unwrap();
            s.write_at(9, 1 << 20, b"tail").unwrap();
            s.sync(9).unwrap();
            let read = |off: u64, len: usize| {
                let mut b = AlignedBuf::new(len.div_ceil(4096) * 4096);
                s.read_at(9, off, &mut b.as_mut_slice()[..len]).map(|n| b.as_slice()[..n].to_vec())
            };
            assert_eq!(read(0, 10_000).unwrap(), &data.as_slice()[..10_000]);
            assert_eq!(read(4096 * 8, 8192).unwrap(), vec![0u8; 8192], "a hole");
            assert_eq!(read(100, 50).unwrap(), &data.as_slice()[100..150], "an unaligned read");
            // A partial rewrite (unsynced, then synced), a truncate into a
            // block and a punch with unaligned ends.
            s.write_at(9, 5000, b"rewritten").unwrap();
            read((1 << 20) - 4096, 4100).unwrap();
            s.sync(9).unwrap();
            s.truncate(9, 6000).unwrap();
            assert_eq!(read(4096, 4096).unwrap().len(), 6000 - 4096);
            s.truncate(9, 20_000).unwrap();
            s.fallocate(9, 100, 4500, AllocateMode::PunchHole, &StripeSlots::all(1 << 20)).unwrap();
            let all = read(0, 20_000).unwrap();
            assert!(all[100..4600].iter().all(|&b| b == 0) && all[4600] != 0);
            s.sync(9).unwrap();
            assert_eq!(s.stats().checksum_errors, 0, "a false alarm");
            assert!(s.check_range(9, 0, u64::MAX, true).unwrap().is_empty());

            // One byte flipped on the device (the file, as a disk would).
            let path = ChunkStore::objects_dir(d.path()).join(format!("{:016x}", 9));
            let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
            let mut b = [0u8];
            f.read_exact_at(&mut b, 4700).unwrap();
            f.write_all_at(&[b[0] ^ 0x20], 4700).unwrap();
            f.sync_all().unwrap();
            let e = read(0, 8192).unwrap_err();
            assert!(e.to_string().contains("checksum"), "{e}");
            assert_eq!(s.stats().checksum_errors, 1);
            assert!(read(4096, 100).is_err(), "an unaligned read of the block");
            read(0, 4096).unwrap();
            read(8192, 4096).unwrap();
            let bad = s.check_range(9, 0, u64::MAX, true).unwrap();
            assert_eq!(bad, [BadBlock { object: 9, offset: 4096 }]);
            // A batch of one too (on the direct path, one `pread` on the
            // O_DIRECT descriptor, not the ring).
            let mut unit = AlignedBuf::new(8192);
            let res = s.read_batch(&mut [BatchRead { object: 9, offset: 0, buf: unit.as_mut_slice() }]);
            assert!(res[0].is_err());
            // Rewriting the block repairs it; removing takes the sidecar.
            s.write_at(9, 4096, &data.as_slice()[..4096]).unwrap();
            read(0, 8192).unwrap();
            s.remove(9).unwrap();
            assert!(!sums::sidecar_path(&path).exists());
        }
    }

    /// Review defect 4: the loop and the background writer both found a
    /// new object missing; the first created it and recorded checksums;
    /// the second's creation must not empty its sidecar.
    #[test]
    fn a_second_creation_of_an_object_keeps_the_first_ones_checksums() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("0000000000000007");
        let (dir_unsynced, unsynced) = (AtomicBool::new(false), Unsynced::default());
        let a = create_files(&path, false, &dir_unsynced, &unsynced).unwrap();
        let s = a.sums.as_ref().unwrap();
        unsynced.lock().settle(s, 7, 0, &[sums::block_crc(b"abc")]).unwrap();
        a.buffered.write_all_at(b"abc", 0).unwrap();
        // The second writer, whose open failed before the first created it.
        let b = create_files(&path, false, &dir_unsynced, &unsynced).unwrap();
        let entry = sums::read_entries(b.sums.as_ref().unwrap(), 0, 1).unwrap()[0];
        assert!(entry.accepts(sums::block_crc(b"abc")), "the sidecar was emptied: {entry:?}");
    }
}
