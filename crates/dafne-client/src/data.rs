//! The client's data half: files striped over io servers, moved by the
//! servers' RMA against memory this client registers for each request.
//!
//! A file range is cut at stripe-unit boundaries; the piece at file offset
//! `o` lives on `layout.servers[(o / stripe_unit) % stripe_count]`, stored
//! there at the same file offset. Each server gets one request listing its
//! extents; all servers are asked at once. Small I/O (≤ [`INLINE_MAX`] per
//! server request) travels inline in the request or reply instead.
//!
//! Memory: [`DataClient::read_region`] / [`DataClient::write_region`] (and
//! the list forms) are zero-copy on memory the application registered
//! (`register`). [`DataClient::read_into`] / [`DataClient::write_from`] take
//! plain slices: from [`ZERO_COPY_MIN`] up they are zero-copy too, on
//! registrations from the client's registration cache
//! ([`crate::regcache`]: registered once per buffer, dropped when the
//! memory is unmapped); smaller ones, and the slice APIs `read_at` /
//! `write_at`, copy once through pre-registered 1 MiB bounce buffers, so
//! nothing is registered on their hot path either.
//!
//! # Write verifier
//! Io servers acknowledge [`Stability::Unstable`] writes once the data is
//! in their cache; a server process that crashes loses it, and the
//! supervisor's restart brings up a server with nothing dirty, so a later
//! `Sync` would succeed and the loss go unseen. As NFS's write verifier
//! does, the client notices instead: per (object, server) it records the
//! [`Generation`] of the connection that carried the first unstable write
//! since the object's last successful `Sync` or `Stat` on that server (a
//! reconnection is the only way a restarted server is reached). When a
//! `Sync` or `Stat` is answered on a connection of another generation, the
//! data acknowledged by the earlier one may be gone: that sync or stat
//! fails with `EIO` (once), as `fsync` does after a failed write-back.
//! Writes sent `DataSync` / `FileSync` are stable when acknowledged and are
//! not recorded. The record is bounded ([`VERIFIER_MAX`]): past it, an
//! unstable write to a pair not yet recorded is sent `DataSync`, so
//! nothing acknowledged goes unchecked.
//!
//! # Buffers of failed requests
//! A request that fails (a timeout, a lost connection, any error) may still
//! have the server's RMA under way on its memory. Bounce buffers of a
//! failed request are not returned to the pool but deregistered and freed,
//! and a cached registration of the caller's buffer is evicted, so that
//! later I/O never shares memory with a late put or get. (Deregistering
//! invalidates the key on RDMA transports; with shared-memory transports
//! such as CMA a late put could still reach the caller's buffer, which the
//! client cannot prevent.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};

use dafne_proto::io::{decode_io_reply, encode_io_request, IoExtent, IoRequest, IoResponse, Stability, NO_KEY};
use dafne_proto::{Capability, Envelope, Errno, ServerInfo};
use dafne_transport::{Access, Client, Region, Runtime};

use crate::cq::{CompletionQueue, Ticket};
use crate::link::Generation;
use crate::regcache::{RegCache, RegCacheConfig, RegCacheStats};
use crate::{ConnectError, OpenFile};

/// Largest inline payload per server request (the protocol's limit).
pub const INLINE_MAX: usize = dafne_proto::io::MAX_INLINE;

/// Part of a registered region, owned (for operations posted to a
/// completion queue, which outlive the caller's borrows).
#[derive(Debug, Clone)]
pub struct RegionSlice {
    pub region: std::sync::Arc<Region>,
    pub offset: usize,
    pub len: usize,
}

/// Size of one pre-registered bounce buffer for slice I/O above the
/// inline limit.
pub const BOUNCE_SIZE: usize = 1 << 20;
/// Bounce buffers kept between calls (8 × 1 MiB registered once); a larger
/// I/O allocates more for its duration.
pub const BOUNCE_KEEP: usize = 8;
/// Slice I/O from this size up ([`DataClient::read_into`],
/// [`DataClient::write_from`]) is zero-copy on a cached registration of the
/// caller's buffer; below it a copy through a bounce buffer is cheaper than
/// a first registration (and small buffers are rarely reused as such).
pub const ZERO_COPY_MIN: usize = 256 << 10;

/// Most (object, server) pairs with unstable writes the write verifier
/// records: 65536 × ~40 bytes of map entry ≈ 2.5 MiB at most. A client
/// with more objects written and not synced sends further unstable writes
/// to new pairs as `DataSync` (see the module docs).
pub const VERIFIER_MAX: usize = 65536;

/// An unstable write not yet covered by a `Sync` or `Stat`.
#[derive(Debug, Clone, Copy)]
struct Unstable {
    /// The connection that carried the first of them.
    generation: Generation,
    /// [`Verifier::seq`] of the latest of them.
    seq: u64,
}

/// The write verifier's record (see the module docs).
struct Verifier {
    /// (object id, server index) → unstable writes not yet made stable.
    pending: HashMap<(u64, usize), Unstable>,
    /// Unstable writes recorded so far.
    seq: u64,
    max: usize,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("pending", &self.pending.len()).field("seq", &self.seq).finish()
    }
}

impl Verifier {
    fn new(max: usize) -> Verifier {
        Verifier { pending: HashMap::new(), seq: 0, max }
    }

    /// Records an unstable write of `object` about to be sent to `server`
    /// on connection `generation`. `false` when the record is full: send
    /// the write stable instead.
    fn note_write(&mut self, object: u64, server: usize, generation: Generation) -> bool {
        if self.pending.len() >= self.max && !self.pending.contains_key(&(object, server)) {
            return false;
        }
        self.seq += 1;
        let seq = self.seq;
        self.pending.entry((object, server)).and_modify(|u| u.seq = seq).or_insert(Unstable { generation, seq });
        true
    }

    /// What a `Sync` or `Stat` about to be sent covers: the writes
    /// recorded so far.
    fn epoch(&self) -> u64 {
        self.seq
    }

    /// A `Sync` or `Stat` of `object`, sent at `epoch`, succeeded on
    /// `server`'s connection `generation`: `EIO` if an unstable write went
    /// to an earlier server instance. The record is cleared unless writes
    /// were sent while the sync was in flight (it may not cover them); if
    /// kept after a loss was reported, it takes the answering generation
    /// (a write that raced on an older connection could not have been
    /// acknowledged: that connection was lost before this one was made).
    fn settle(&mut self, object: u64, server: usize, generation: Generation, epoch: u64) -> Result<(), Errno> {
        let Some(u) = self.pending.get_mut(&(object, server)) else { return Ok(()) };
        let lost = u.generation != generation;
        if u.seq <= epoch {
            self.pending.remove(&(object, server));
        } else {
            u.generation = generation;
        }
        if lost {
            tracing::warn!(
                "object {object:#x}: io server {server} restarted after acknowledging unstable writes; they may be lost"
            );
            return Err(Errno::EIO);
        }
        Ok(())
    }

    /// The object is removed from `server`: nothing of it is left to check.
    fn forget(&mut self, object: u64, server: usize) {
        self.pending.remove(&(object, server));
    }
}

/// Connections to every io server of a cluster, by server id.
#[derive(Debug, Clone)]
pub struct DataClient {
    /// One healing connection per server (`link`): a restarted io server
    /// is reconnected at the next call.
    servers: std::sync::Arc<Vec<crate::link::Link>>,
    /// A connection kept for its UCX context (the runtime's, the same for
    /// every connection and reconnection).
    anchor: Option<Client>,
    bounce: std::sync::Arc<std::sync::Mutex<Vec<Region>>>,
    /// `None` only without servers (no UCX context to register with).
    regcache: Option<std::sync::Arc<RegCache>>,
    verifier: std::sync::Arc<Mutex<Verifier>>,
}

/// The part of an I/O that one server handles.
struct Part {
    server: usize,
    extents: Vec<IoExtent>,
    bytes: usize,
}

fn io_err(e: dafne_transport::TransportError) -> Errno {
    match e {
        dafne_transport::TransportError::TimedOut { .. } => Errno::EAGAIN,
        _ => Errno::EIO,
    }
}

impl DataClient {
    /// Connects to the io servers; `addrs[i]` is server id `i`.
    pub fn connect(rt: &Runtime, addrs: &[SocketAddr]) -> Result<DataClient, ConnectError> {
        Self::connect_with(rt, addrs, RegCacheConfig::default())
    }

    /// [`DataClient::connect`] with registration cache settings.
    pub fn connect_with(rt: &Runtime, addrs: &[SocketAddr], cache: RegCacheConfig) -> Result<DataClient, ConnectError> {
        let servers: Vec<Client> = addrs.iter().map(|a| Client::connect(rt, *a)).collect::<Result<_, _>>()?;
        let regcache = servers.first().map(|c| std::sync::Arc::new(RegCache::new(c.context(), cache)));
        let anchor = servers.first().cloned();
        // Io servers need no hello: capabilities are checked per request.
        let servers = servers.into_iter().map(|c| crate::link::Link::new(c, Box::new(|_: &Client| Ok(())))).collect();
        Ok(DataClient {
            servers: std::sync::Arc::new(servers),
            anchor,
            bounce: Default::default(),
            regcache,
            verifier: std::sync::Arc::new(Mutex::new(Verifier::new(VERIFIER_MAX))),
        })
    }

    /// The registration cache's counters (zeros without servers).
    pub fn regcache_stats(&self) -> RegCacheStats {
        self.regcache.as_ref().map(|c| c.stats()).unwrap_or_default()
    }

    /// Whether the registration cache keeps registrations (UCX's unmap
    /// hooks work here); if not, large slice I/O registers per call.
    pub fn regcache_is_caching(&self) -> bool {
        self.regcache.as_ref().is_some_and(|c| c.is_caching())
    }

    pub fn context(&self) -> Option<&dafne_transport::Context> {
        self.anchor.as_ref().map(|c| c.context())
    }

    /// A registered bounce buffer: from the pool, or registered now.
    fn take_bounce(&self) -> Result<Region, Errno> {
        if let Some(r) = self.bounce.lock().ok().and_then(|mut p| p.pop()) {
            return Ok(r);
        }
        let ctx = self.context().ok_or(Errno::EIO)?;
        Region::allocate(ctx, BOUNCE_SIZE, Access::RemoteReadWrite).map_err(|_| Errno::ENOMEM)
    }

    /// Registers bounce buffers now until the pool holds `n` of them (at
    /// most [`BOUNCE_KEEP`]): a client that will run `n` slice I/Os at once
    /// (the FUSE daemon, one per worker thread) then registers nothing on
    /// its data path, not even during its first requests.
    pub fn prefill_bounce(&self, n: usize) -> Result<(), Errno> {
        let ctx = self.context().ok_or(Errno::EIO)?;
        let mut pool = self.bounce.lock().map_err(|_| Errno::EIO)?;
        while pool.len() < n.min(BOUNCE_KEEP) {
            pool.push(Region::allocate(ctx, BOUNCE_SIZE, Access::RemoteReadWrite).map_err(|_| Errno::ENOMEM)?);
        }
        Ok(())
    }

    /// Bounce buffers in the pool now.
    #[cfg(test)]
    fn bounce_pooled(&self) -> usize {
        self.bounce.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Returns the bounce buffers of a request to the pool if it
    /// succeeded; drops them if it failed (the server may still put or get
    /// on them, see the module docs).
    fn settle_bounce(&self, bufs: Vec<Region>, ok: bool) {
        if ok {
            bufs.into_iter().for_each(|r| self.give_bounce(r));
        }
    }

    fn give_bounce(&self, r: Region) {
        if let Ok(mut p) = self.bounce.lock() {
            if p.len() < BOUNCE_KEEP {
                p.push(r);
            }
        }
    }

    /// Registers memory for zero-copy I/O.
    pub fn register(&self, buf: Vec<u8>, access: Access) -> Result<Region, Errno> {
        let ctx = self.context().ok_or(Errno::EIO)?;
        Region::register(ctx, buf, access).map_err(|_| Errno::ENOMEM)
    }

    /// Splits `[offset, offset+len)` by stripe; `addr` is the client address
    /// of the range's first byte (or the inline position when `None`).
    fn parts(f: &OpenFile, offset: u64, len: usize, addr: Option<u64>) -> Result<Vec<Part>, Errno> {
        let mut parts = Vec::new();
        Self::add_parts(&mut parts, f, offset, len, addr)?;
        Ok(parts)
    }

    /// [`Self::parts`] into an existing list (one request per server for a
    /// whole list of ranges).
    fn add_parts(parts: &mut Vec<Part>, f: &OpenFile, offset: u64, len: usize, addr: Option<u64>) -> Result<(), Errno> {
        let l = &f.layout;
        if l.stripe_count == 0 || l.servers.is_empty() || l.stripe_unit == 0 {
            return Err(Errno::EIO);
        }
        let unit = l.stripe_unit as u64;
        let mut pos = offset;
        let end = offset.checked_add(len as u64).ok_or(Errno::EFBIG)?;
        while pos < end {
            let stripe = pos / unit;
            let n = ((stripe + 1) * unit).min(end) - pos;
            let server = l.servers[(stripe % l.stripe_count as u64) as usize] as usize;
            let ext = IoExtent {
                offset: pos,
                len: n as u32,
                key: if addr.is_some() { 0 } else { NO_KEY },
                addr: addr.map(|a| a + (pos - offset)).unwrap_or(0),
            };
            match parts.iter_mut().find(|p| p.server == server) {
                Some(p) => {
                    p.extents.push(ext);
                    p.bytes += n as usize;
                }
                None => parts.push(Part { server, extents: vec![ext], bytes: n as usize }),
            }
            pos += n;
        }
        Ok(())
    }

    fn verifier(&self) -> MutexGuard<'_, Verifier> {
        // Every update leaves the record consistent: a poisoned lock is
        // still usable.
        self.verifier.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn call(&self, server: usize, req: &IoRequest) -> Result<IoResponse, Errno> {
        let link = self.servers.get(server).ok_or(Errno::EIO)?;
        // A lost server is reconnected here, at the next call after the loss.
        let (c, generation) = link.get().ok_or(Errno::EIO)?;
        // The write verifier: unstable writes are recorded before they are
        // sent, syncs note what they cover (module docs).
        let mut epoch = 0;
        let stable_instead = match req {
            IoRequest::Write { cap, stability: Stability::Unstable, .. } => {
                let recorded = self.verifier().note_write(cap.object_id, server, generation);
                (!recorded).then(|| {
                    let mut r = req.clone();
                    if let IoRequest::Write { stability, .. } = &mut r {
                        *stability = Stability::DataSync;
                    }
                    r
                })
            }
            IoRequest::Sync { .. } | IoRequest::Stat { .. } => {
                epoch = self.verifier().epoch();
                None
            }
            _ => None,
        };
        let req = stable_instead.as_ref().unwrap_or(req);
        let bytes = c.call_async(encode_io_request(Envelope { tag: 0, uid: 0, gid: 0 }, req)).await.map_err(|e| {
            link.failed(generation, &e);
            io_err(e)
        })?;
        let reply = decode_io_reply(&bytes).map_err(|_| Errno::EPROTO)?.2?;
        match req {
            IoRequest::Sync { cap } | IoRequest::Stat { cap } => {
                self.verifier().settle(cap.object_id, server, generation, epoch)?
            }
            IoRequest::Remove { cap } => self.verifier().forget(cap.object_id, server),
            _ => {}
        }
        Ok(reply)
    }

    /// Connections opened again after io servers were lost, over all servers.
    pub fn reconnects(&self) -> u64 {
        self.servers.iter().map(|l| l.reconnects()).sum()
    }

    /// Sends each server its extents of the file `ranges`, mapped one after
    /// the other onto `region` from `region_offset`, as the request `make`
    /// builds from the region's key and the extents; all servers at once.
    async fn rma_list(
        &self,
        f: &OpenFile,
        ranges: &[(u64, usize)],
        region: &Region,
        region_offset: usize,
        make: impl Fn(Vec<Vec<u8>>, Vec<IoExtent>) -> IoRequest,
    ) -> Result<usize, Errno> {
        let total = ranges.iter().try_fold(0usize, |a, (_, l)| a.checked_add(*l)).ok_or(Errno::EINVAL)?;
        if region_offset.checked_add(total).is_none_or(|e| e > region.len()) {
            return Err(Errno::EINVAL);
        }
        let key = region.pack_key().map_err(|_| Errno::EIO)?;
        self.rma_at(f, ranges, &key, region.addr() + region_offset as u64, make).await
    }

    /// [`Self::rma_list`] on registered memory named by its packed `key`,
    /// the ranges one after the other from client address `base`. The
    /// caller checked that the memory is registered and borrowed for the
    /// whole call.
    async fn rma_at(
        &self,
        f: &OpenFile,
        ranges: &[(u64, usize)],
        key: &[u8],
        base: u64,
        make: impl Fn(Vec<Vec<u8>>, Vec<IoExtent>) -> IoRequest,
    ) -> Result<usize, Errno> {
        let total = ranges.iter().try_fold(0usize, |a, (_, l)| a.checked_add(*l)).ok_or(Errno::EINVAL)?;
        let mut parts = Vec::new();
        let mut at = base;
        for &(offset, len) in ranges {
            Self::add_parts(&mut parts, f, offset, len, Some(at))?;
            at += len as u64;
        }
        let mut calls = Vec::new();
        for p in parts {
            // A request carries at most MAX_IO_EXTENTS extents.
            for chunk in p.extents.chunks(dafne_proto::io::MAX_IO_EXTENTS) {
                let req = make(vec![key.to_vec()], chunk.to_vec());
                calls.push(async move { self.call(p.server, &req).await });
            }
        }
        for r in futures::future::join_all(calls).await {
            r?;
        }
        Ok(total)
    }

    /// List I/O: writes the file ranges `ranges` from `region`, whose bytes
    /// from `region_offset` hold them one after the other; one request per
    /// io server for the whole list.
    pub async fn write_list(
        &self,
        f: &OpenFile,
        ranges: &[(u64, usize)],
        region: &Region,
        region_offset: usize,
        stability: Stability,
    ) -> Result<usize, Errno> {
        self.rma_list(f, ranges, region, region_offset, |keys, extents| IoRequest::Write {
            cap: f.cap,
            keys,
            extents,
            stability,
            inline: Vec::new(),
        })
        .await
    }

    /// List I/O: reads the file ranges `ranges` into `region` one after the
    /// other from `region_offset`.
    pub async fn read_list(
        &self,
        f: &OpenFile,
        ranges: &[(u64, usize)],
        region: &Region,
        region_offset: usize,
    ) -> Result<usize, Errno> {
        self.rma_list(f, ranges, region, region_offset, |keys, extents| IoRequest::Read {
            cap: f.cap,
            keys,
            extents,
            inline_reply: false,
        })
        .await
    }

    /// Writes `len` bytes of `region` at `region_offset` to the file at
    /// `offset`: the servers get them straight from the region.
    pub async fn write_region(
        &self,
        f: &OpenFile,
        offset: u64,
        region: &Region,
        region_offset: usize,
        len: usize,
        stability: Stability,
    ) -> Result<usize, Errno> {
        self.write_list(f, &[(offset, len)], region, region_offset, stability).await
    }

    /// Reads into `region` at `region_offset` from the file at `offset`:
    /// the servers put straight into the region. Bytes never written read
    /// as zeros (the caller clamps to the file size).
    pub async fn read_region(
        &self,
        f: &OpenFile,
        offset: u64,
        region: &Region,
        region_offset: usize,
        len: usize,
    ) -> Result<usize, Errno> {
        self.read_list(f, &[(offset, len)], region, region_offset).await
    }

    /// Reads into a caller's buffer: zero-copy from [`ZERO_COPY_MIN`] bytes
    /// up (the servers put straight into `buf`, registered through the
    /// registration cache: once per buffer while it stays mapped), else (or
    /// if `buf` cannot be registered) as [`Self::read_at`]. Bytes never
    /// written read as zeros.
    pub async fn read_into(&self, f: &OpenFile, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let Some(cache) = self.regcache.as_ref().filter(|_| buf.len() >= ZERO_COPY_MIN) else {
            return self.read_at(f, offset, buf).await;
        };
        // Memory UCX cannot register (e.g. read-only pages on RDMA
        // hardware) still works, through the bounce buffers.
        let Ok(reg) = cache.get(buf) else { return self.read_at(f, offset, buf).await };
        // `buf` stays mutably borrowed until the servers have answered, so
        // nothing else touches it while they put into it; `reg` keeps the
        // registration until then even if the cache evicts it.
        let base = buf.as_mut_ptr() as u64;
        let r = self
            .rma_at(f, &[(offset, buf.len())], reg.key(), base, |keys, extents| IoRequest::Read {
                cap: f.cap,
                keys,
                extents,
                inline_reply: false,
            })
            .await;
        if r.is_err() {
            // A server may still put into `buf` (module docs).
            cache.evict(&reg);
        }
        drop(reg);
        r
    }

    /// Writes a caller's buffer: zero-copy from [`ZERO_COPY_MIN`] bytes up
    /// (the servers get straight from `buf`, registered through the
    /// registration cache), else (or if `buf` cannot be registered) as
    /// [`Self::write_at`].
    pub async fn write_from(
        &self,
        f: &OpenFile,
        offset: u64,
        buf: &[u8],
        stability: Stability,
    ) -> Result<usize, Errno> {
        let Some(cache) = self.regcache.as_ref().filter(|_| buf.len() >= ZERO_COPY_MIN) else {
            return self.write_at(f, offset, buf, stability).await;
        };
        let Ok(reg) = cache.get(buf) else { return self.write_at(f, offset, buf, stability).await };
        let r = self
            .rma_at(f, &[(offset, buf.len())], reg.key(), buf.as_ptr() as u64, |keys, extents| IoRequest::Write {
                cap: f.cap,
                keys,
                extents,
                stability,
                inline: Vec::new(),
            })
            .await;
        if r.is_err() {
            // A server may still get from `buf` (module docs).
            cache.evict(&reg);
        }
        drop(reg);
        r
    }

    /// Writes a slice: inline when small, else through a registered copy.
    pub async fn write_at(&self, f: &OpenFile, offset: u64, data: &[u8], stability: Stability) -> Result<usize, Errno> {
        let parts = Self::parts(f, offset, data.len(), None)?;
        if parts.iter().all(|p| p.bytes <= INLINE_MAX) {
            let calls = parts.into_iter().map(|p| {
                let mut inline = Vec::with_capacity(p.bytes);
                for e in &p.extents {
                    let at = (e.offset - offset) as usize;
                    inline.extend_from_slice(&data[at..at + e.len as usize]);
                }
                let req = IoRequest::Write { cap: f.cap, keys: Vec::new(), extents: p.extents, stability, inline };
                async move { self.call(p.server, &req).await }
            });
            for r in futures::future::join_all(calls).await {
                r?;
            }
            return Ok(data.len());
        }
        // Larger slices go through pre-registered bounce buffers (one copy,
        // no registration on the hot path), 1 MiB pieces in parallel.
        let mut bufs = Vec::new();
        for piece in data.chunks(BOUNCE_SIZE) {
            let mut r = self.take_bounce()?;
            r.as_mut_slice()[..piece.len()].copy_from_slice(piece);
            bufs.push(r);
        }
        let calls = bufs.iter().zip(data.chunks(BOUNCE_SIZE)).enumerate().map(|(i, (r, piece))| {
            self.write_region(f, offset + (i * BOUNCE_SIZE) as u64, r, 0, piece.len(), stability)
        });
        let results = futures::future::join_all(calls).await;
        let ok = results.into_iter().collect::<Result<Vec<_>, _>>();
        self.settle_bounce(bufs, ok.is_ok());
        ok.map(|_| data.len())
    }

    /// Reads into a slice: inline replies when small, else through a
    /// registered buffer.
    pub async fn read_at(&self, f: &OpenFile, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let parts = Self::parts(f, offset, buf.len(), None)?;
        if parts.iter().all(|p| p.bytes <= INLINE_MAX) {
            let calls = parts.into_iter().map(|p| {
                let req =
                    IoRequest::Read { cap: f.cap, keys: Vec::new(), extents: p.extents.clone(), inline_reply: true };
                async move { (p.extents, self.call(p.server, &req).await) }
            });
            for (extents, r) in futures::future::join_all(calls).await {
                let data = match r? {
                    IoResponse::Read { data, .. } => data,
                    _ => return Err(Errno::EPROTO),
                };
                let mut at = 0usize;
                for e in extents {
                    let dst = (e.offset - offset) as usize;
                    let n = e.len as usize;
                    let src = data.get(at..at + n).ok_or(Errno::EPROTO)?;
                    buf[dst..dst + n].copy_from_slice(src);
                    at += n;
                }
            }
            return Ok(buf.len());
        }
        let n = buf.len();
        let bufs = (0..n.div_ceil(BOUNCE_SIZE)).map(|_| self.take_bounce()).collect::<Result<Vec<_>, _>>()?;
        let calls = bufs.iter().enumerate().map(|(i, r)| {
            let len = BOUNCE_SIZE.min(n - i * BOUNCE_SIZE);
            self.read_region(f, offset + (i * BOUNCE_SIZE) as u64, r, 0, len)
        });
        let results = futures::future::join_all(calls).await;
        let ok = results.into_iter().collect::<Result<Vec<_>, _>>();
        if ok.is_ok() {
            for (piece, r) in buf.chunks_mut(BOUNCE_SIZE).zip(&bufs) {
                piece.copy_from_slice(&r.as_slice()[..piece.len()]);
            }
        }
        self.settle_bounce(bufs, ok.is_ok());
        ok.map(|_| n)
    }

    async fn every_server<T>(
        &self,
        f: &OpenFile,
        req: IoRequest,
        mut each: impl FnMut(IoResponse) -> T,
    ) -> Result<Vec<T>, Errno> {
        let mut ids: Vec<usize> = f.layout.servers.iter().map(|s| *s as usize).collect();
        ids.sort_unstable();
        ids.dedup();
        let calls = ids.into_iter().map(|id| {
            let req = req.clone();
            async move { self.call(id, &req).await }
        });
        let mut out = Vec::new();
        for r in futures::future::join_all(calls).await {
            out.push(each(r?));
        }
        Ok(out)
    }

    /// Posts a zero-copy read from the file at `offset` into `into` on `cq`.
    pub fn post_read(&self, cq: &CompletionQueue, f: &OpenFile, offset: u64, into: RegionSlice) -> Ticket {
        let (me, f) = (self.clone(), f.clone());
        cq.post(async move { me.read_region(&f, offset, &into.region, into.offset, into.len).await })
    }

    /// Posts a zero-copy write of `from` to the file at `offset` on `cq`.
    pub fn post_write(
        &self,
        cq: &CompletionQueue,
        f: &OpenFile,
        offset: u64,
        from: RegionSlice,
        stability: Stability,
    ) -> Ticket {
        let (me, f) = (self.clone(), f.clone());
        cq.post(async move { me.write_region(&f, offset, &from.region, from.offset, from.len, stability).await })
    }

    /// Makes everything written durable on every server of the file.
    pub async fn sync(&self, f: &OpenFile) -> Result<(), Errno> {
        self.every_server(f, IoRequest::Sync { cap: f.cap }, |_| ()).await.map(|_| ())
    }

    /// The file's size as the servers hold it: the largest byte stored + 1.
    pub async fn stored_size(&self, f: &OpenFile) -> Result<u64, Errno> {
        let sizes = self
            .every_server(f, IoRequest::Stat { cap: f.cap }, |r| match r {
                IoResponse::Stat { size } => size,
                _ => 0,
            })
            .await?;
        Ok(sizes.into_iter().max().unwrap_or(0))
    }

    pub async fn truncate(&self, f: &OpenFile, size: u64) -> Result<(), Errno> {
        self.every_server(f, IoRequest::Truncate { cap: f.cap, size }, |_| ()).await.map(|_| ())
    }

    pub async fn remove(&self, f: &OpenFile) -> Result<(), Errno> {
        self.every_server(f, IoRequest::Remove { cap: f.cap }, |_| ()).await.map(|_| ())
    }

    /// Number of io servers this client is connected to.
    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// One server's capacity and counters. `cap` is any valid capability
    /// with read rights ([`info_capability`] makes one from the secret).
    pub async fn server_info(&self, server: usize, cap: Capability) -> Result<ServerInfo, Errno> {
        match self.call(server, &IoRequest::ServerInfo { cap }).await? {
            IoResponse::ServerInfo(i) => Ok(i),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Every server's [`ServerInfo`], asked in parallel, in server order.
    pub async fn all_server_info(&self, cap: Capability) -> Vec<Result<ServerInfo, Errno>> {
        futures::future::join_all((0..self.servers.len()).map(|i| self.server_info(i, cap))).await
    }

    /// The cluster's storage: (capacity, available) bytes summed over the
    /// file systems of the io servers that answer; servers sharing one file
    /// system (a local cluster) count it once.
    pub async fn capacity(&self, cap: Capability) -> Result<(u64, u64), Errno> {
        let infos = self.all_server_info(cap).await;
        let mut seen = std::collections::HashSet::new();
        let (mut total, mut avail, mut answered) = (0u64, 0u64, false);
        for i in infos.into_iter().flatten() {
            answered = true;
            if !seen.insert(i.filesystem_id) {
                continue;
            }
            total += i.capacity_bytes;
            avail += i.available_bytes;
        }
        if answered {
            Ok((total, avail))
        } else {
            Err(Errno::EIO)
        }
    }
}

/// A short-lived capability (object 0, read rights) for requests about the
/// servers rather than a file, signed with the cluster secret.
pub fn info_capability(secret: &dafne_auth::Secret) -> Capability {
    let mut cap = Capability { object_id: 0, rights: dafne_proto::RIGHT_READ, expiry_unix_ns: 0, mac: [0; 32] };
    secret.sign(&mut cap, std::time::SystemTime::now());
    cap
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_io;
    use dafne_proto::{Attr, FileType, Layout, Timespec};
    use dafne_transport::TransportError;
    use futures::executor::block_on;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_sync_answered_by_a_later_connection_than_the_write_fails_once() {
        let mut v = Verifier::new(VERIFIER_MAX);
        // Same connection: the sync covers the write.
        assert!(v.note_write(7, 0, 0));
        let e = v.epoch();
        assert_eq!(v.settle(7, 0, 0, e), Ok(()));
        assert!(v.pending.is_empty());
        // The server was replaced between the write and the sync.
        assert!(v.note_write(7, 0, 0));
        assert!(v.note_write(7, 0, 1), "a later write on the new connection");
        let e = v.epoch();
        assert_eq!(v.settle(7, 0, 1, e), Err(Errno::EIO));
        assert_eq!(v.settle(7, 0, 1, v.epoch()), Ok(()), "the loss is reported once");
        // Other objects and servers are not concerned.
        assert!(v.note_write(7, 1, 0));
        assert_eq!(v.settle(8, 1, 1, v.epoch()), Ok(()));
        assert_eq!(v.settle(7, 0, 1, v.epoch()), Ok(()));
        assert_eq!(v.settle(7, 1, 1, v.epoch()), Err(Errno::EIO));
    }

    #[test]
    fn a_write_sent_during_a_sync_stays_recorded() {
        let mut v = Verifier::new(VERIFIER_MAX);
        assert!(v.note_write(7, 0, 0));
        let e = v.epoch();
        assert!(v.note_write(7, 0, 0), "sent while the sync is in flight");
        assert_eq!(v.settle(7, 0, 0, e), Ok(()));
        assert!(v.pending.contains_key(&(7, 0)), "the sync may not cover the later write");
        // The server restarts; the sync still finds the write.
        assert_eq!(v.settle(7, 0, 1, v.epoch()), Err(Errno::EIO));
        assert!(v.pending.is_empty());
    }

    #[test]
    fn a_full_record_asks_for_stable_writes_and_forgets_nothing() {
        let mut v = Verifier::new(2);
        assert!(v.note_write(1, 0, 0));
        assert!(v.note_write(2, 0, 0));
        assert!(!v.note_write(3, 0, 0), "a third pair does not fit: it must be written stable");
        assert!(v.note_write(1, 0, 0), "recorded pairs still take writes");
        assert_eq!(v.settle(1, 0, 1, v.epoch()), Err(Errno::EIO), "a full record keeps what it holds");
        v.forget(2, 0);
        assert!(v.pending.is_empty());
        assert!(v.note_write(3, 0, 0), "settled and removed pairs make room");
    }

    fn file(object_id: u64) -> OpenFile {
        let t = Timespec::default();
        let attr = Attr {
            ino: 2,
            kind: FileType::Regular,
            mode: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
        };
        let layout = Layout { object_id, stripe_unit: 1 << 20, stripe_count: 1, servers: vec![0] };
        OpenFile { attr, layout, cap: Capability { object_id, rights: 3, expiry_unix_ns: 0, mac: [0; 32] } }
    }

    fn loss() -> TransportError {
        TransportError::PeerFailed { peer: "test".into(), reason: "lost".into() }
    }

    #[test]
    fn sync_reports_unstable_writes_acknowledged_before_a_reconnection() {
        let (_server, addr, _) = fake_io::start();
        let rt = fake_io::runtime("verifier");
        let d = DataClient::connect(&rt, &[addr]).unwrap();
        let (f, g) = (file(10), file(11));
        // Control: no reconnection between write and sync.
        block_on(d.write_at(&f, 0, b"kept", Stability::Unstable)).unwrap();
        assert_eq!(block_on(d.sync(&f)), Ok(()));
        // The connection is lost after unstable writes (f) and a stable one
        // (g); the next call reaches the server on a new connection.
        block_on(d.write_at(&f, 0, b"lost?", Stability::Unstable)).unwrap();
        block_on(d.write_at(&g, 0, b"stable", Stability::DataSync)).unwrap();
        d.servers[0].failed(0, &loss());
        assert_eq!(block_on(d.sync(&f)), Err(Errno::EIO), "sync hid writes a replaced server acknowledged");
        assert_eq!(d.reconnects(), 1);
        assert_eq!(block_on(d.sync(&f)), Ok(()), "the loss is reported once");
        assert_eq!(block_on(d.sync(&g)), Ok(()), "stable writes need no check");
        // Stat checks as Sync does; Remove forgets the object.
        block_on(d.write_at(&f, 0, b"again", Stability::Unstable)).unwrap();
        block_on(d.write_at(&g, 0, b"again", Stability::Unstable)).unwrap();
        d.servers[0].failed(1, &loss());
        std::thread::sleep(crate::link::RETRY_EVERY); // the link tries again only after this
        assert_eq!(block_on(d.stored_size(&f)), Err(Errno::EIO));
        block_on(d.remove(&g)).unwrap();
        assert_eq!(block_on(d.sync(&g)), Ok(()));
    }

    #[test]
    fn past_the_bound_unstable_writes_are_sent_stable_and_need_no_check() {
        let (_server, addr, stable_writes) = fake_io::start();
        let rt = fake_io::runtime("verifier-full");
        let mut d = DataClient::connect(&rt, &[addr]).unwrap();
        d.verifier = std::sync::Arc::new(Mutex::new(Verifier::new(1)));
        let (f, g) = (file(20), file(21));
        block_on(d.write_at(&f, 0, b"recorded", Stability::Unstable)).unwrap();
        assert_eq!(stable_writes.load(Ordering::Relaxed), 0);
        block_on(d.write_at(&g, 0, b"no room", Stability::Unstable)).unwrap();
        assert_eq!(stable_writes.load(Ordering::Relaxed), 1, "a write the record cannot hold was sent unstable");
        d.servers[0].failed(0, &loss());
        assert_eq!(block_on(d.sync(&g)), Ok(()), "the stable write needs no check");
        assert_eq!(block_on(d.sync(&f)), Err(Errno::EIO), "the recorded one is still checked");
    }

    #[test]
    fn failed_requests_keep_their_bounce_buffers_out_of_the_pool() {
        let (_server, addr, _) = fake_io::start();
        let rt = fake_io::runtime("bounce");
        let d = DataClient::connect(&rt, &[addr]).unwrap();
        let f = file(12);
        d.prefill_bounce(2).unwrap();
        assert_eq!(d.bounce_pooled(), 2);
        // A 2 MiB write takes both buffers and returns them.
        let data = vec![5u8; 2 * BOUNCE_SIZE];
        block_on(d.write_at(&f, 0, &data, Stability::Unstable)).unwrap();
        assert_eq!(d.bounce_pooled(), 2);
        // The fake server fails reads: their buffers are not reused.
        let mut back = vec![0u8; 2 * BOUNCE_SIZE];
        assert_eq!(block_on(d.read_at(&f, 0, &mut back)), Err(Errno::EIO));
        assert_eq!(d.bounce_pooled(), 0, "buffers of a failed request went back to the pool");
        assert!(back.iter().all(|&b| b == 0), "a failed read copied out of its bounce buffers");
    }
}
