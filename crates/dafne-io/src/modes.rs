//! The `normal` and `mmap` serving modes: the two methods the Unifier paper
//! measures itself against (its sections 3.1 and 6.2), kept as
//! configurations of the io server so that the comparison can be re-run
//! (`dafne bench io`). The `unifier` mode is in [`crate::service`].
//!
//! In both modes the operating system's page cache is the cache, and the
//! server keeps no cache of its own:
//!
//! * **normal** — a read `pread`s the bytes into a private buffer (copy 1:
//!   page cache → server buffer), copies them into a registered send buffer
//!   taken from a small pool registered once at start (copy 2), and puts
//!   from it. A write gets into a pool buffer, copies into a private buffer
//!   (copy 1) and `pwrite`s it (copy 2: server buffer → page cache). Both
//!   copies are counted in [`ModeStats::bytes_copied`], as the paper counts
//!   "at least two data copies" for this method.
//! * **mmap** — a read maps the file range it needs (read-only, `MAP_SHARED`:
//!   the page-cache pages themselves), registers the mapping, puts from it,
//!   then deregisters and unmaps it ([`dafne_ucx::Region::map_file`]): no
//!   copy, one registration per request (counted with its time in
//!   [`ModeStats::registrations`] / [`ModeStats::registration_ns`]). Writes
//!   are served as in `normal`: PVFS used mmap only for reads (the paper:
//!   "constraints, complicated memory management, and error-prone pitfalls,
//!   especially for write"), so does this mode. Its pool is registered on
//!   the first write, not at start, so a read-only workload holds no pool.
//!
//! # The page cache as the cache of `--cache-mib`
//! To compare modes at equal memory (the paper's re-read test), the server
//! models its page cache as a cache of `--cache-mib` minus the registered
//! pool it holds (the paper: a pool of pre-registered buffers "reduces the
//! effective size and hit rate of the server's file cache"): an LRU of the
//! 64 KiB blocks it read or wrote. [`ModeStats::hits`], `misses` and
//! `evictions` count per block touched. With `--strict-cache` evicted
//! blocks are also dropped from the kernel's page cache
//! (`POSIX_FADV_DONTNEED`), a [`DROP_CHUNK`] at a time once none of its
//! blocks is left in the model (readahead caches folios of up to 2 MiB,
//! which a drop of one 64 KiB block would not release). The page cache then
//! holds the model's blocks, their chunks' neighbours, and what readahead
//! fetched ahead; without `--strict-cache` it keeps everything it likes,
//! and the counters say what a cache of that size would have hit.
//!
//! # Mappings and truncation
//! A mapped page past the end of file faults (`SIGBUS`). The server is the
//! only one that changes its chunk files' sizes, and it shrinks an object
//! only when none of its ranges is mapped (a truncate waits for the mapped
//! reads in flight; new reads see the new size). The range mapped is
//! clamped to the size at the time; bytes past it read as zeros.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use dafne_proto::io::{IoExtent, IoResponse, Stability};
use dafne_proto::Errno;
use dafne_transport::{Access, ConnHandle, Context, Local, Region, RmaSeg};
use dafne_unifier::Storage;

use crate::chunk::{ChunkStore, DROP_CHUNK};
use crate::server::ServingMode;

/// Registered send/receive buffers of the pool (`normal`, and `mmap` writes).
pub const POOL_BUFFERS: usize = 16;
/// Bytes per pool buffer.
pub const POOL_BUFFER_SIZE: usize = 256 << 10;
/// Pool buffers one request holds at once (so 1 MiB moves in one RMA batch
/// and four requests always progress).
pub const BUFFERS_PER_REQUEST: usize = 4;
/// The most bytes an `mmap` read maps at once.
pub const MAP_MAX: usize = 4 << 20;
/// Granularity of the page-cache model (the Unifier's default unit).
pub const BLOCK: u64 = 64 << 10;

/// Counters of a serving mode, beside the Unifier's own
/// ([`dafne_unifier::UnifierStats`]), which stay zero in `normal` and
/// `mmap` (there is no Unifier then).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ModeStats {
    /// Bytes copied between buffers while serving: for `normal`, twice the
    /// bytes moved (page cache ↔ private buffer ↔ registered buffer); inline
    /// data once.
    pub bytes_copied: u64,
    /// Registrations made while serving (`mmap` mappings; pool buffers
    /// registered after start), their time (for mappings: `mmap` +
    /// `ucp_mem_map`) and bytes.
    pub registrations: u64,
    pub registration_ns: u64,
    pub registered_bytes: u64,
    /// Deregistrations while serving and their time (`ucp_mem_unmap` +
    /// `munmap` for mappings).
    pub deregistrations: u64,
    pub deregistration_ns: u64,
    /// Pool buffers registered at start.
    pub startup_registrations: u64,
    /// Pool buffers that exist, and acquisitions that had to wait for one.
    pub pool_buffers: u64,
    pub pool_waits: u64,
    /// The page-cache model: blocks found, blocks missing, blocks evicted.
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// A FIFO pool of registered buffers, grown on demand up to its capacity.
struct Pool {
    ctx: Context,
    capacity: usize,
    free: RefCell<Vec<Arc<Region>>>,
    created: Cell<usize>,
    queue: RefCell<VecDeque<Rc<Waiter>>>,
}

struct Waiter {
    waker: RefCell<Option<Waker>>,
}

impl Pool {
    fn available(&self) -> usize {
        self.free.borrow().len() + self.capacity.saturating_sub(self.created.get())
    }

    /// Pops `n` free buffers, registering new ones while below capacity.
    fn grab(&self, n: usize, stats: &RefCell<ModeStats>, startup: bool) -> Result<Vec<Arc<Region>>, Errno> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if let Some(b) = self.free.borrow_mut().pop() {
                out.push(b);
                continue;
            }
            let t = Instant::now();
            let r = Region::allocate(&self.ctx, POOL_BUFFER_SIZE, Access::Local).map_err(|e| {
                tracing::warn!("registering a pool buffer: {e}");
                Errno::ENOMEM
            });
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    self.release(out, stats);
                    return Err(e);
                }
            };
            self.created.set(self.created.get() + 1);
            let mut s = stats.borrow_mut();
            s.pool_buffers = self.created.get() as u64;
            if startup {
                s.startup_registrations += 1;
            } else {
                s.registrations += 1;
                s.registration_ns += t.elapsed().as_nanos() as u64;
                s.registered_bytes += POOL_BUFFER_SIZE as u64;
            }
            out.push(Arc::new(r));
        }
        Ok(out)
    }

    /// Waits (FIFO) until `n` buffers can be had, then takes them.
    fn take<'a>(&'a self, n: usize, stats: &'a RefCell<ModeStats>) -> Take<'a> {
        Take { pool: self, n: n.clamp(1, self.capacity), stats, waiter: None }
    }

    /// Returns buffers. One still referenced by an operation that never
    /// completed (its connection died) is not reused: it is left to that
    /// operation, and a new one will be registered in its place.
    fn release(&self, bufs: Vec<Arc<Region>>, stats: &RefCell<ModeStats>) {
        for b in bufs {
            if Arc::strong_count(&b) == 1 {
                self.free.borrow_mut().push(b);
            } else {
                self.created.set(self.created.get() - 1);
                stats.borrow_mut().pool_buffers = self.created.get() as u64;
            }
        }
        self.wake_front();
    }

    fn wake_front(&self) {
        if let Some(w) = self.queue.borrow().front() {
            if let Some(k) = w.waker.borrow_mut().take() {
                k.wake();
            }
        }
    }

    fn bytes(&self) -> u64 {
        (self.created.get() * POOL_BUFFER_SIZE) as u64
    }
}

/// Acquisition of pool buffers: see [`Pool::take`].
struct Take<'a> {
    pool: &'a Pool,
    n: usize,
    stats: &'a RefCell<ModeStats>,
    waiter: Option<Rc<Waiter>>,
}

impl Future for Take<'_> {
    type Output = Result<Vec<Arc<Region>>, Errno>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let pool = self.pool;
        let first = match (pool.queue.borrow().front(), &self.waiter) {
            (None, _) => true,
            (Some(f), Some(me)) => Rc::ptr_eq(f, me),
            (Some(_), None) => false,
        };
        if first && pool.available() >= self.n {
            if self.waiter.take().is_some() {
                pool.queue.borrow_mut().pop_front();
            }
            let got = pool.grab(self.n, self.stats, false);
            // Whoever is next may fit in what is left.
            pool.wake_front();
            return Poll::Ready(got);
        }
        match &self.waiter {
            Some(w) => *w.waker.borrow_mut() = Some(cx.waker().clone()),
            None => {
                let w = Rc::new(Waiter { waker: RefCell::new(Some(cx.waker().clone())) });
                pool.queue.borrow_mut().push_back(w.clone());
                self.waiter = Some(w);
                self.stats.borrow_mut().pool_waits += 1;
            }
        }
        Poll::Pending
    }
}

impl Drop for Take<'_> {
    fn drop(&mut self) {
        if let Some(me) = self.waiter.take() {
            self.pool.queue.borrow_mut().retain(|w| !Rc::ptr_eq(w, &me));
            self.pool.wake_front();
        }
    }
}

/// An LRU of the 64 KiB blocks the server touched: the page cache as a
/// cache of a given size (see the module docs).
#[derive(Debug, Default)]
struct PageCacheModel {
    tick: u64,
    blocks: HashMap<(u64, u64), u64>,
    lru: BTreeMap<u64, (u64, u64)>,
    /// Blocks in the model per (object, drop chunk).
    chunks: HashMap<(u64, u64), u32>,
}

const BLOCKS_PER_CHUNK: u64 = DROP_CHUNK / BLOCK;

impl PageCacheModel {
    /// Touches the blocks of `[offset, offset + len)`; returns (hits,
    /// misses, evictions) made to stay within `capacity` blocks, and pushes
    /// the chunks that evictions left without a block.
    fn touch(
        &mut self,
        object: u64,
        offset: u64,
        len: u64,
        capacity: usize,
        emptied: &mut Vec<(u64, u64)>,
    ) -> (u64, u64, u64) {
        if len == 0 {
            return (0, 0, 0);
        }
        let (first, last) = (offset / BLOCK, (offset.saturating_add(len) - 1) / BLOCK);
        let (mut hits, mut misses, mut evictions) = (0, 0, 0);
        for b in first..=last {
            self.tick += 1;
            match self.blocks.insert((object, b), self.tick) {
                Some(old) => {
                    self.lru.remove(&old);
                    hits += 1;
                }
                None => {
                    misses += 1;
                    *self.chunks.entry((object, b / BLOCKS_PER_CHUNK)).or_insert(0) += 1;
                }
            }
            self.lru.insert(self.tick, (object, b));
            while self.blocks.len() > capacity.max(1) {
                let Some((_, (o, v))) = self.lru.pop_first() else { break };
                self.blocks.remove(&(o, v));
                evictions += 1;
                if self.release_chunk(o, v / BLOCKS_PER_CHUNK) {
                    emptied.push((o, v / BLOCKS_PER_CHUNK));
                }
            }
        }
        (hits, misses, evictions)
    }

    /// One block of the chunk left the model; true if it was the last.
    fn release_chunk(&mut self, object: u64, chunk: u64) -> bool {
        match self.chunks.get_mut(&(object, chunk)) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.chunks.remove(&(object, chunk));
                true
            }
        }
    }

    /// Forgets the object's blocks from `first_block` on (truncate, remove).
    fn forget(&mut self, object: u64, first_block: u64) {
        let mut gone = Vec::new();
        let lru = &mut self.lru;
        self.blocks.retain(|&(o, b), tick| {
            let keep = o != object || b < first_block;
            if !keep {
                lru.remove(tick);
                gone.push(b);
            }
            keep
        });
        for b in gone {
            self.release_chunk(object, b / BLOCKS_PER_CHUNK);
        }
    }
}

/// One RMA piece of a request: file range and client segment.
#[derive(Debug, Clone, Copy)]
struct Piece {
    offset: u64,
    len: usize,
    addr: u64,
    key: usize,
}

/// Cuts the keyed extents into pieces of at most `max` bytes.
fn pieces(extents: &[IoExtent], max: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    for e in extents.iter().filter(|e| !e.is_inline()) {
        let mut done = 0usize;
        while done < e.len as usize {
            let len = (e.len as usize - done).min(max);
            out.push(Piece { offset: e.offset + done as u64, len, addr: e.addr + done as u64, key: e.key as usize });
            done += len;
        }
    }
    out
}

fn eio<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> Errno {
    move |e| {
        tracing::warn!("{what}: {e}");
        Errno::EIO
    }
}

/// A storage failure as the client hears it: a full disk is `ENOSPC`
/// (the one it can act on: free space, then write or fsync again), every
/// other failure `EIO`. On every path that writes to or syncs the disk.
pub(crate) fn io_errno(what: &'static str) -> impl Fn(std::io::Error) -> Errno {
    move |e| {
        tracing::warn!("{what}: {e}");
        if e.kind() == std::io::ErrorKind::StorageFull {
            Errno::ENOSPC
        } else {
            Errno::EIO
        }
    }
}

/// The `normal` and `mmap` modes of one io server (see the module docs).
pub struct Direct {
    mode: ServingMode,
    ctx: Context,
    store: Rc<ChunkStore>,
    pool: Pool,
    cache_bytes: u64,
    strict: bool,
    model: RefCell<PageCacheModel>,
    stats: RefCell<ModeStats>,
    /// Mappings alive per object (truncation waits for them).
    mapped: RefCell<HashMap<u64, usize>>,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").field("mode", &self.mode).field("stats", &*self.stats.borrow()).finish()
    }
}

impl Direct {
    /// A server in `mode` (`Normal` or `Mmap`) whose page cache counts as a
    /// cache of `cache_bytes`, enforced when `strict`. `normal` registers
    /// its pool now.
    pub fn new(
        mode: ServingMode,
        ctx: &Context,
        store: Rc<ChunkStore>,
        cache_bytes: u64,
        strict: bool,
    ) -> Result<Direct, Errno> {
        assert!(mode != ServingMode::Unifier, "the unifier mode is served by the Unifier");
        let d = Direct {
            mode,
            ctx: ctx.clone(),
            store,
            pool: Pool {
                ctx: ctx.clone(),
                capacity: POOL_BUFFERS,
                free: RefCell::new(Vec::new()),
                created: Cell::new(0),
                queue: RefCell::new(VecDeque::new()),
            },
            cache_bytes,
            strict,
            model: RefCell::new(PageCacheModel::default()),
            stats: RefCell::new(ModeStats::default()),
            mapped: RefCell::new(HashMap::new()),
        };
        if mode == ServingMode::Normal {
            let all = d.pool.grab(POOL_BUFFERS, &d.stats, true)?;
            d.pool.release(all, &d.stats);
        }
        Ok(d)
    }

    pub fn stats(&self) -> ModeStats {
        *self.stats.borrow()
    }

    pub fn mode(&self) -> ServingMode {
        self.mode
    }

    /// The cache this mode counts on (the page cache's share), bytes.
    pub fn cache_bytes(&self) -> u64 {
        self.cache_bytes
    }

    fn copied(&self, bytes: usize) {
        self.stats.borrow_mut().bytes_copied += bytes as u64;
    }

    /// Blocks the page cache may hold: the cache less the registered pool.
    fn capacity_blocks(&self) -> usize {
        (self.cache_bytes.saturating_sub(self.pool.bytes()) / BLOCK).max(1) as usize
    }

    /// Records an access in the page-cache model; drops evicted blocks
    /// from the kernel's page cache when strict.
    fn account(&self, object: u64, extents: &[IoExtent]) {
        let cap = self.capacity_blocks();
        let mut emptied = Vec::new();
        {
            let mut m = self.model.borrow_mut();
            let mut s = self.stats.borrow_mut();
            for e in extents {
                let (h, x, v) = m.touch(object, e.offset, e.len as u64, cap, &mut emptied);
                s.hits += h;
                s.misses += x;
                s.evictions += v;
            }
        }
        if self.strict {
            for (o, c) in emptied {
                if let Err(e) = self.store.drop_cache(o, c * DROP_CHUNK, DROP_CHUNK) {
                    tracing::debug!("dropping a chunk from the page cache: {e}");
                }
            }
        }
    }

    /// Reads `len` bytes at `offset` into `buf` (holes and bytes past the
    /// end of the object read as zeros). Counts the copy out of the page
    /// cache.
    fn pread(&self, object: u64, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let n = self.store.read_at(object, offset, buf).map_err(eio("read"))?;
        buf[n..].fill(0);
        self.copied(buf.len());
        Ok(())
    }

    pub async fn read(
        &self,
        conn: &ConnHandle,
        object: u64,
        keys: &[Vec<u8>],
        extents: &[IoExtent],
        inline_reply: bool,
    ) -> Result<IoResponse, Errno> {
        self.account(object, extents);
        let bytes: u64 = extents.iter().map(|e| e.len as u64).sum();
        if inline_reply {
            let mut data = vec![0u8; bytes as usize];
            let mut at = 0usize;
            for e in extents {
                self.pread(object, e.offset, &mut data[at..at + e.len as usize])?;
                at += e.len as usize;
            }
            return Ok(IoResponse::Read { bytes, data });
        }
        let rkeys = remote_keys(conn, keys, extents)?;
        match self.mode {
            ServingMode::Mmap => self.read_mapped(conn, object, &rkeys, extents).await?,
            _ => self.read_copied(conn, object, &rkeys, extents).await?,
        }
        Ok(IoResponse::Read { bytes, data: Vec::new() })
    }

    /// `normal`: pread into a private buffer, copy into pool buffers, put.
    async fn read_copied(
        &self,
        conn: &ConnHandle,
        object: u64,
        rkeys: &[Rc<dafne_transport::RemoteKey>],
        extents: &[IoExtent],
    ) -> Result<(), Errno> {
        let work = pieces(extents, POOL_BUFFER_SIZE);
        let mut private = vec![0u8; POOL_BUFFER_SIZE];
        for batch in work.chunks(BUFFERS_PER_REQUEST) {
            let mut bufs = self.pool.take(batch.len(), &self.stats).await?;
            let mut segs = Vec::with_capacity(batch.len());
            let mut filled = Ok(());
            for (p, b) in batch.iter().zip(bufs.iter_mut()) {
                if let Err(e) = self.pread(object, p.offset, &mut private[..p.len]) {
                    filled = Err(e);
                    break;
                }
                let dst = Arc::get_mut(b).expect("a free pool buffer is not shared").as_mut_slice();
                dst[..p.len].copy_from_slice(&private[..p.len]);
                self.copied(p.len);
            }
            if filled.is_ok() {
                for (p, b) in batch.iter().zip(&bufs) {
                    segs.push(RmaSeg {
                        local: Local::Region { region: b.clone(), offset: 0, len: p.len },
                        remote_addr: p.addr,
                        rkey: rkeys[p.key].clone(),
                    });
                }
            }
            let sent = match filled {
                Ok(()) => conn.put(segs).await.map_err(eio("put to client")),
                Err(e) => Err(e),
            };
            self.pool.release(bufs, &self.stats);
            sent?;
        }
        Ok(())
    }

    /// `mmap`: map each run of the file, register it, put from it,
    /// deregister and unmap.
    async fn read_mapped(
        &self,
        conn: &ConnHandle,
        object: u64,
        rkeys: &[Rc<dafne_transport::RemoteKey>],
        extents: &[IoExtent],
    ) -> Result<(), Errno> {
        // Runs of pieces contiguous in the file, each at most MAP_MAX.
        let mut runs: Vec<(u64, u64, Vec<Piece>)> = Vec::new();
        for p in pieces(extents, MAP_MAX) {
            match runs.last_mut() {
                Some((start, end, ps)) if *end == p.offset && (*end - *start) as usize + p.len <= MAP_MAX => {
                    *end += p.len as u64;
                    ps.push(p);
                }
                _ => runs.push((p.offset, p.offset + p.len as u64, vec![p])),
            }
        }
        for (start, end, ps) in runs {
            let size = self.store.size(object).map_err(eio("stat"))?;
            let in_file = end.min(size).saturating_sub(start) as usize;
            let region = if in_file > 0 { self.map(object, start, in_file)? } else { None };
            let mut segs = Vec::with_capacity(ps.len());
            for p in &ps {
                let at = (p.offset - start) as usize;
                let mapped = if region.is_some() { in_file.saturating_sub(at).min(p.len) } else { 0 };
                if let (Some(r), true) = (&region, mapped > 0) {
                    segs.push(RmaSeg {
                        local: Local::Region { region: r.clone(), offset: at, len: mapped },
                        remote_addr: p.addr,
                        rkey: rkeys[p.key].clone(),
                    });
                }
                if mapped < p.len {
                    // Past the end of the object: zeros.
                    segs.push(RmaSeg {
                        local: Local::Bytes(vec![0u8; p.len - mapped]),
                        remote_addr: p.addr + mapped as u64,
                        rkey: rkeys[p.key].clone(),
                    });
                }
            }
            let sent = conn.put(segs).await.map_err(eio("put to client"));
            if let Some(r) = region {
                self.unmap(object, r);
            }
            sent?;
        }
        Ok(())
    }

    /// Maps and registers `[offset, offset + len)` of the object (inside
    /// its size). `None` if the object does not exist.
    fn map(&self, object: u64, offset: u64, len: usize) -> Result<Option<Arc<Region>>, Errno> {
        // Verify what is mapped first (the put reads the page cache, not
        // through this store): one read of the range's blocks.
        let bad = self.store.check_range(object, offset, len as u64, false).map_err(eio("verifying a file range"))?;
        if !bad.is_empty() {
            return Err(Errno::EIO);
        }
        let t = Instant::now();
        let r = self
            .store
            .with_file(object, false, |f| {
                Region::map_file(&self.ctx, f, offset, len, Access::Local).map_err(std::io::Error::other)
            })
            .map_err(eio("mapping a file range"))?;
        let Some(r) = r else { return Ok(None) };
        let mut s = self.stats.borrow_mut();
        s.registrations += 1;
        s.registration_ns += t.elapsed().as_nanos() as u64;
        s.registered_bytes += len as u64;
        *self.mapped.borrow_mut().entry(object).or_insert(0) += 1;
        Ok(Some(Arc::new(r)))
    }

    fn unmap(&self, object: u64, r: Arc<Region>) {
        let t = Instant::now();
        // The put completed (or its connection was torn down): normally this
        // is the last reference, and dropping it deregisters and unmaps.
        // If an abandoned operation still holds it, UCX releases it later.
        drop(r);
        let mut s = self.stats.borrow_mut();
        s.deregistrations += 1;
        s.deregistration_ns += t.elapsed().as_nanos() as u64;
        let mut m = self.mapped.borrow_mut();
        if let Some(n) = m.get_mut(&object) {
            *n -= 1;
            if *n == 0 {
                m.remove(&object);
            }
        }
    }

    /// Writes: inline bytes straight to the file; RMA pieces got into pool
    /// buffers, copied to a private buffer, written (both modes).
    pub async fn write(
        &self,
        conn: &ConnHandle,
        object: u64,
        keys: &[Vec<u8>],
        extents: &[IoExtent],
        inline: &[u8],
        stability: Stability,
    ) -> Result<(), Errno> {
        self.account(object, extents);
        let work = pieces(extents, POOL_BUFFER_SIZE);
        // Keys are checked before anything is written, inline bytes too.
        let rkeys = if work.is_empty() { Vec::new() } else { remote_keys(conn, keys, extents)? };
        let mut at = 0usize;
        for e in extents.iter().filter(|e| e.is_inline()) {
            let src = inline.get(at..at + e.len as usize).ok_or(Errno::EINVAL)?;
            self.store.write_at(object, e.offset, src).map_err(io_errno("write"))?;
            self.copied(src.len());
            at += e.len as usize;
        }
        if !work.is_empty() {
            let mut private = vec![0u8; POOL_BUFFER_SIZE];
            for batch in work.chunks(BUFFERS_PER_REQUEST) {
                let bufs = self.pool.take(batch.len(), &self.stats).await?;
                let segs = batch
                    .iter()
                    .zip(&bufs)
                    .map(|(p, b)| RmaSeg {
                        local: Local::Region { region: b.clone(), offset: 0, len: p.len },
                        remote_addr: p.addr,
                        rkey: rkeys[p.key].clone(),
                    })
                    .collect();
                if let Err(e) = conn.get(segs).await {
                    self.pool.release(bufs, &self.stats);
                    return Err(eio("get from client")(e));
                }
                let mut written = Ok(());
                for (p, b) in batch.iter().zip(&bufs) {
                    private[..p.len].copy_from_slice(&b.as_slice()[..p.len]);
                    self.copied(p.len);
                    written = self.store.write_at(object, p.offset, &private[..p.len]).map_err(io_errno("write"));
                    if written.is_err() {
                        break;
                    }
                    self.copied(p.len);
                }
                self.pool.release(bufs, &self.stats);
                written?;
            }
        }
        if stability != Stability::Unstable {
            self.store.sync_later(object).await.map_err(io_errno("sync"))?;
        }
        Ok(())
    }

    /// Truncates the object, after the mapped reads of it have finished
    /// (a mapped page past the new end would fault).
    pub async fn truncate(&self, object: u64, size: u64) -> Result<(), Errno> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.mapped.borrow().get(&object).is_some_and(|&n| n > 0) {
            if Instant::now() > deadline {
                return Err(Errno::EAGAIN);
            }
            dafne_transport::sleep(Duration::from_micros(100)).await;
        }
        self.store.truncate(object, size).map_err(eio("truncate"))?;
        self.model.borrow_mut().forget(object, size.div_ceil(BLOCK));
        Ok(())
    }

    /// Forgets a removed object (its mappings, if any, keep the unlinked
    /// file alive until they go).
    pub fn remove(&self, object: u64) {
        self.model.borrow_mut().forget(object, 0);
    }
}

/// The client's packed keys, unpacked on its connection (cached); a bad
/// key is `EINVAL`.
/// Unpacks a request's keys (cached per connection) and checks, before
/// anything is read or written, that every extent lies inside the window
/// its key was registered for: a client can make this server reach only
/// memory it registered, in its own process (`dafne_ucx::RemoteKey`; the
/// endpoint checks each put and get again). A bad key is `EINVAL`, an
/// extent outside its key's window `EFAULT`.
///
/// On one host (as the kernel shows it) a key must also reach the
/// client's memory without the client's help
/// (`ConnHandle::requires_direct_keys`, `ConnHandle::reaches_directly`: a
/// System V segment the client allocated through UCX, on a shared-memory
/// data endpoint), else `EREMOTEIO`. UCX 1.13 emulates RMA to other memory
/// over messages the client's worker answers; when such a client stopped
/// and was then killed, nothing on one host fails those operations, and
/// the cache units they were given stayed held for good (three rounds of a
/// stopped, then killed `dafne cp` retired every unit of two 8 MiB caches).
/// The client library's own buffers are UCX memory (`DataClient::register`
/// copies into it); only the registration cache sends a key to a caller's
/// buffer, once, and falls back to bounce buffers when it is refused.
pub(crate) fn remote_keys(
    conn: &ConnHandle,
    keys: &[Vec<u8>],
    extents: &[IoExtent],
) -> Result<Vec<Rc<dafne_transport::RemoteKey>>, Errno> {
    let rkeys = keys.iter().map(|k| conn.remote_key(k)).collect::<Result<Vec<_>, _>>().map_err(|e| {
        tracing::debug!("bad key: {e}");
        Errno::EINVAL
    })?;
    if !rkeys.is_empty() && conn.requires_direct_keys() && !rkeys.iter().all(|k| conn.reaches_directly(k)) {
        tracing::debug!(
            "connection {}: a key this server would reach only through the client's own UCX (memory the \
             client registered rather than allocated through UCX, a segment it did not prove, or a data \
             endpoint without shared memory): refused",
            conn.id()
        );
        return Err(Errno::EREMOTEIO);
    }
    for e in extents.iter().filter(|e| !e.is_inline()) {
        let key = rkeys.get(e.key as usize).ok_or(Errno::EINVAL)?;
        if !key.covers(e.addr, e.len as u64) {
            let (base, len) = key.window();
            tracing::debug!("extent {:#x}+{} outside its key's window {base:#x}+{len}", e.addr, e.len);
            return Err(Errno::EFAULT);
        }
    }
    Ok(rkeys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_cache_model_is_an_lru_of_blocks() {
        let mut m = PageCacheModel::default();
        let mut ch = Vec::new();
        // 4 blocks into a cache of 4: all misses, then all hits.
        assert_eq!(m.touch(1, 0, 4 * BLOCK, 4, &mut ch), (0, 4, 0));
        assert_eq!(m.touch(1, 10, 4 * BLOCK - 20, 4, &mut ch), (4, 0, 0));
        // A fifth block evicts the least recently used (block 0).
        assert_eq!(m.touch(1, 4 * BLOCK, 1, 4, &mut ch), (0, 1, 1));
        assert!(!m.blocks.contains_key(&(1, 0)));
        // A sequential re-read of 5 blocks through 4: LRU never hits.
        assert_eq!(m.touch(1, 0, 5 * BLOCK, 4, &mut ch), (0, 5, 5));
        m.forget(1, 2);
        assert_eq!(m.touch(1, 0, 4 * BLOCK, 4, &mut ch), (1, 3, 0));
        assert_eq!(m.touch(2, 0, 0, 4, &mut ch), (0, 0, 0));
        assert!(ch.is_empty(), "chunk 0 of object 1 always kept a block");
    }

    #[test]
    fn chunks_are_dropped_when_their_last_block_leaves() {
        let mut m = PageCacheModel::default();
        let mut ch = Vec::new();
        let cap = 2 * BLOCKS_PER_CHUNK as usize;
        // Three chunks read sequentially through two chunks' worth of
        // blocks: the first chunk empties exactly when its last block goes.
        m.touch(7, 0, 2 * DROP_CHUNK, cap, &mut ch);
        assert!(ch.is_empty());
        m.touch(7, 2 * DROP_CHUNK, DROP_CHUNK - BLOCK, cap, &mut ch);
        assert!(ch.is_empty(), "{ch:?}");
        m.touch(7, 3 * DROP_CHUNK - BLOCK, BLOCK, cap, &mut ch);
        assert_eq!(ch, vec![(7, 0)]);
        // Forgetting blocks releases their chunks without dropping.
        m.forget(7, 0);
        assert!(m.chunks.is_empty() && m.blocks.is_empty() && m.lru.is_empty());
    }

    #[test]
    fn extents_are_cut_into_pieces() {
        let e = [
            IoExtent { offset: 100, len: 10, key: 0, addr: 1000 },
            IoExtent::inline(0, 5),
            IoExtent { offset: 1 << 20, len: 600 << 10, key: 1, addr: 5000 },
        ];
        let p = pieces(&e, 256 << 10);
        let got: Vec<(u64, usize, u64, usize)> = p.iter().map(|p| (p.offset, p.len, p.addr, p.key)).collect();
        assert_eq!(
            got,
            vec![
                (100, 10, 1000, 0),
                (1 << 20, 256 << 10, 5000, 1),
                ((1 << 20) + (256 << 10), 256 << 10, 5000 + (256 << 10), 1),
                ((1 << 20) + (512 << 10), 88 << 10, 5000 + (512 << 10), 1),
            ]
        );
    }
}
