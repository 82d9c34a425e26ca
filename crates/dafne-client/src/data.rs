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

use std::net::SocketAddr;

use dafne_proto::io::{decode_io_reply, encode_io_request, IoExtent, IoRequest, IoResponse, Stability, NO_KEY};
use dafne_proto::{Capability, Envelope, Errno, ServerInfo};
use dafne_transport::{Access, Client, Region, Runtime};

use crate::cq::{CompletionQueue, Ticket};
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
        Ok(DataClient { servers: std::sync::Arc::new(servers), anchor, bounce: Default::default(), regcache })
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

    async fn call(&self, server: usize, req: &IoRequest) -> Result<IoResponse, Errno> {
        let link = self.servers.get(server).ok_or(Errno::EIO)?;
        // A lost server is reconnected here, at the next call after the loss.
        let c = link.get().ok_or(Errno::EIO)?;
        let bytes = c.call_async(encode_io_request(Envelope { tag: 0, uid: 0, gid: 0 }, req)).await.map_err(|e| {
            link.failed(&e);
            io_err(e)
        })?;
        decode_io_reply(&bytes).map_err(|_| Errno::EPROTO)?.2
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
        let n = self
            .rma_at(f, &[(offset, buf.len())], reg.key(), base, |keys, extents| IoRequest::Read {
                cap: f.cap,
                keys,
                extents,
                inline_reply: false,
            })
            .await?;
        drop(reg);
        Ok(n)
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
        let n = self
            .rma_at(f, &[(offset, buf.len())], reg.key(), buf.as_ptr() as u64, |keys, extents| IoRequest::Write {
                cap: f.cap,
                keys,
                extents,
                stability,
                inline: Vec::new(),
            })
            .await?;
        drop(reg);
        Ok(n)
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
        for r in bufs {
            self.give_bounce(r);
        }
        for r in results {
            r?;
        }
        Ok(data.len())
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
        for (piece, r) in buf.chunks_mut(BOUNCE_SIZE).zip(&bufs) {
            piece.copy_from_slice(&r.as_slice()[..piece.len()]);
        }
        for r in bufs {
            self.give_bounce(r);
        }
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
