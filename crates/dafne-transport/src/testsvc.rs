//! The transport's reference service: echo, server-driven put/get against
//! client keys with data checks, sleep, stats. It is what the multi-process
//! tests and the transport benchmark run against (through the
//! `dafne-transport-peer` binary), so that both exercise the real
//! request → RMA → flush → reply path of a dafne server.
//!
//! Request encoding (little-endian): `op: u8` then the op's body.
//! * `ECHO`  body = bytes echoed back.
//! * `PUT` / `GET` body = `flags: u8, seed: u64, nseg: u32, nseg ×
//!   (addr: u64, len: u64, key_len: u32, key)`. PUT writes
//!   [`pattern`]`(seed, i)` (i = byte index over the concatenated segments,
//!   when `FLAG_VERIFY`) into the client's segments; GET reads them and
//!   answers their [`fnv1a`] hash. `FLAG_PLAIN` makes the server use plain
//!   unregistered memory instead of its registered pool.
//! * `SLEEP` body = `ms: u32`.
//! * `STATS` → JSON of the server's transport and UCX counters.
//! * `LOGIN` body = `nonce: [u8; 16]`: installs the connection's frame keys
//!   made from [`TEST_SECRET`] (no MAC is checked: this service has no
//!   users). The client sends it with `Client::login` and
//!   [`test_frame_keys`]; from then on the connection's frames are tagged,
//!   which is how tests and the benchmark measure frame authentication.
//!
//! * `RR_READ` body = `flags: u8, seed: u64, len: u64` (`len` ≤
//!   [`RR_BUFFER_SIZE`]): the Read-Read design of an NFS/RDMA server, for
//!   `dafne_bench::designs` only (dafne's io protocol never exposes server
//!   memory). The server takes a buffer of its read pool ([`RR_BUFFERS`]
//!   buffers, registered for remote read; a request waits while none is
//!   free), fills `len` bytes of it with [`pattern`]`(seed, i)` when
//!   `FLAG_VERIFY`, and answers a lease ([`RrLease`]: id, address, length,
//!   packed key). The client RMA-gets the bytes, then sends
//!   * `RR_DONE` body = `lease: u64`: the buffer goes back to the pool.
//!     Only the connection that holds a lease may return it; a
//!     connection's leases return when it goes away.
//!
//! Reply: `ok: u8` (1 = success) then, on success, op-specific bytes
//! (`GET`: `hash: u64, len: u64`), on failure a UTF-8 message.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

use dafne_ucx::{Access, Context, Local as LocalMem, Region};

use crate::runtime::{Local, Runtime};
use crate::server::{ConnHandle, Request, RmaSeg, Service};

pub const OP_ECHO: u8 = 1;
pub const OP_PUT: u8 = 2;
pub const OP_GET: u8 = 3;
pub const OP_SLEEP: u8 = 4;
pub const OP_STATS: u8 = 5;
/// Blocks the loop thread itself for the given milliseconds (a handler
/// gone wrong): what the watchdog must catch.
pub const OP_BLOCK: u8 = 6;
/// Keys the connection's frames (module docs).
pub const OP_LOGIN: u8 = 7;

/// The secret the reference service keys frames with: fixed and public,
/// for tests and benchmarks of the transport only (servers of a cluster
/// derive keys from a login they verified with their own secret).
pub const TEST_SECRET: [u8; 32] = [0x7e; 32];

/// The frame keys of a `LOGIN` with `nonce` on a connection with `token`.
pub fn test_frame_keys(token: u64, nonce: &[u8; 16]) -> dafne_auth::FrameKeys {
    dafne_auth::Secret::from_bytes(TEST_SECRET).frame_keys(token, nonce)
}

/// A `LOGIN` request with `nonce`.
pub fn encode_login(nonce: &[u8; 16]) -> Vec<u8> {
    let mut v = vec![OP_LOGIN];
    v.extend_from_slice(nonce);
    v
}

/// Read-Read design: lease a server buffer to read (module docs).
pub const OP_RR_READ: u8 = 8;
/// Read-Read design: give a leased buffer back.
pub const OP_RR_DONE: u8 = 9;
/// Size of one buffer of the Read-Read pool: the largest `RR_READ`.
pub const RR_BUFFER_SIZE: usize = 1 << 20;
/// Buffers in the Read-Read pool (allocated on first use), so at most this
/// many leases are out at once, as an NFS server's pool of reply buffers.
pub const RR_BUFFERS: usize = 16;
/// Largest lease reply body: id, address, length, key length, key.
const MAX_LEASE: usize = 8 + 8 + 8 + 4 + dafne_ucx::MAX_PACKED_KEY;

pub const FLAG_VERIFY: u8 = 1;
pub const FLAG_PLAIN: u8 = 2;

/// The largest transfer one request may ask for (size of a large slot).
pub const SLOT_SIZE: usize = 16 << 20;
/// Small slots: requests up to this size take one of `SMALL_SLOTS` slots.
pub const SMALL_SLOT_SIZE: usize = 4 << 20;
/// One small slot per credit a client may use in the benchmark (window 16):
/// 16 × 4 MiB = 64 MiB registered once at start.
pub const SMALL_SLOTS: usize = 16;
/// Large slots (16 MiB each), allocated on first use: 2 × 16 MiB.
pub const LARGE_SLOTS: usize = 2;
/// Largest number of segments in one request.
pub const MAX_SEGS: usize = 1024;

/// The byte at index `i` of a PUT with `seed`.
pub fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) ^ (i >> 16)) as u8
}

/// FNV-1a over several slices, as if concatenated.
pub fn fnv1a<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// One client segment as named in a request.
#[derive(Debug, Clone)]
pub struct SegDesc {
    pub addr: u64,
    pub len: u64,
    pub key: Vec<u8>,
}

pub fn encode_rma(op: u8, flags: u8, seed: u64, segs: &[SegDesc]) -> Vec<u8> {
    let mut v = vec![op, flags];
    v.extend_from_slice(&seed.to_le_bytes());
    v.extend_from_slice(&(segs.len() as u32).to_le_bytes());
    for s in segs {
        v.extend_from_slice(&s.addr.to_le_bytes());
        v.extend_from_slice(&s.len.to_le_bytes());
        v.extend_from_slice(&(s.key.len() as u32).to_le_bytes());
        v.extend_from_slice(&s.key);
    }
    v
}

struct Reader<'a>(&'a [u8]);
impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err(format!("request truncated: wanted {n} more bytes, {} left", self.0.len()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap_or_default()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap_or_default()))
    }
}

/// Decodes a PUT/GET body (after the op byte). Hostile input gets an error.
pub fn decode_rma(body: &[u8]) -> Result<(u8, u64, Vec<SegDesc>), String> {
    let mut r = Reader(body);
    let flags = r.u8()?;
    let seed = r.u64()?;
    let n = r.u32()? as usize;
    if n == 0 || n > MAX_SEGS {
        return Err(format!("{n} segments: must be 1..={MAX_SEGS}"));
    }
    let mut segs = Vec::with_capacity(n);
    let mut total: u64 = 0;
    for _ in 0..n {
        let addr = r.u64()?;
        let len = r.u64()?;
        let klen = r.u32()? as usize;
        if klen > dafne_ucx::MAX_PACKED_KEY {
            return Err(format!("key of {klen} bytes"));
        }
        let key = r.take(klen)?.to_vec();
        total = total.saturating_add(len);
        segs.push(SegDesc { addr, len, key });
    }
    if total as usize > SLOT_SIZE {
        return Err(format!("{total} bytes requested, at most {SLOT_SIZE} per request"));
    }
    if !r.0.is_empty() {
        return Err(format!("{} trailing bytes", r.0.len()));
    }
    Ok((flags, seed, segs))
}

/// An `RR_READ` request.
pub fn encode_rr_read(flags: u8, seed: u64, len: u64) -> Vec<u8> {
    let mut v = vec![OP_RR_READ, flags];
    v.extend_from_slice(&seed.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v
}

/// Decodes an `RR_READ` body (after the op byte) into `(flags, seed, len)`.
/// Hostile input gets an error.
pub fn decode_rr_read(body: &[u8]) -> Result<(u8, u64, usize), String> {
    let mut r = Reader(body);
    let flags = r.u8()?;
    let seed = r.u64()?;
    let len = r.u64()?;
    if len == 0 || len > RR_BUFFER_SIZE as u64 {
        return Err(format!("read of {len} bytes: must be 1..={RR_BUFFER_SIZE}"));
    }
    if !r.0.is_empty() {
        return Err(format!("{} trailing bytes", r.0.len()));
    }
    Ok((flags, seed, len as usize))
}

/// A server buffer lent to one client for one read (`RR_READ`'s answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RrLease {
    /// What `RR_DONE` names.
    pub id: u64,
    /// Where the bytes are in the server's memory.
    pub addr: u64,
    pub len: u64,
    /// The server buffer's packed key.
    pub key: Vec<u8>,
}

impl RrLease {
    /// The reply body (after the ok byte).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(28 + self.key.len());
        v.extend_from_slice(&self.id.to_le_bytes());
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.key);
        v
    }

    /// Decodes a reply body; the server is a peer too, so its bytes are
    /// checked (bounded key, length within a pool buffer, nothing trailing).
    pub fn decode(body: &[u8]) -> Result<RrLease, String> {
        if body.len() > MAX_LEASE {
            return Err(format!("lease of {} bytes, at most {MAX_LEASE}", body.len()));
        }
        let mut r = Reader(body);
        let id = r.u64()?;
        let addr = r.u64()?;
        let len = r.u64()?;
        if len == 0 || len > RR_BUFFER_SIZE as u64 {
            return Err(format!("lease of {len} bytes: must be 1..={RR_BUFFER_SIZE}"));
        }
        let klen = r.u32()? as usize;
        if klen > dafne_ucx::MAX_PACKED_KEY {
            return Err(format!("key of {klen} bytes"));
        }
        let key = r.take(klen)?.to_vec();
        if !r.0.is_empty() {
            return Err(format!("{} trailing bytes", r.0.len()));
        }
        Ok(RrLease { id, addr, len, key })
    }
}

/// An `RR_DONE` request for lease `id`.
pub fn encode_rr_done(id: u64) -> Vec<u8> {
    let mut v = vec![OP_RR_DONE];
    v.extend_from_slice(&id.to_le_bytes());
    v
}

/// Decodes an `RR_DONE` body (after the op byte) into the lease id.
pub fn decode_rr_done(body: &[u8]) -> Result<u64, String> {
    <[u8; 8]>::try_from(body).map(u64::from_le_bytes).map_err(|_| format!("done wants 8 bytes, got {}", body.len()))
}

/// The Read-Read pool: buffers registered for remote read, their packed
/// keys (packed once per buffer), and the leases out.
struct RrPool {
    class: SlotClass,
    keys: RefCell<HashMap<u64, Vec<u8>>>,
    /// Lease id → (connection holding it, buffer).
    leases: RefCell<HashMap<u64, (u32, Arc<Region>)>>,
    next: Cell<u64>,
}

/// A size class of registered slots with an async wait queue.
struct SlotClass {
    size: usize,
    max: usize,
    access: Access,
    made: Cell<usize>,
    free: RefCell<Vec<Arc<Region>>>,
    waiters: RefCell<VecDeque<Waker>>,
}

impl SlotClass {
    fn new(ctx: &Context, size: usize, max: usize, eager: bool, access: Access) -> SlotClass {
        let free: Vec<Arc<Region>> = if eager {
            (0..max).filter_map(|_| Region::allocate(ctx, size, access).ok().map(Arc::new)).collect()
        } else {
            Vec::new()
        };
        SlotClass {
            size,
            max,
            access,
            made: Cell::new(free.len()),
            free: RefCell::new(free),
            waiters: RefCell::new(VecDeque::new()),
        }
    }

    /// Takes a slot, allocating up to `max`, else waits for one to come back.
    async fn take(&self, ctx: &Context) -> Result<Arc<Region>, String> {
        std::future::poll_fn(|cx| {
            if let Some(s) = self.free.borrow_mut().pop() {
                return Poll::Ready(Ok(s));
            }
            if self.made.get() < self.max {
                self.made.set(self.made.get() + 1);
                return Poll::Ready(
                    Region::allocate(ctx, self.size, self.access).map(Arc::new).map_err(|e| e.to_string()),
                );
            }
            self.waiters.borrow_mut().push_back(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Returns a slot. One an abandoned operation still holds (its memory
    /// must stay alive) is replaced by counting it as never made.
    fn give_back(&self, slot: Arc<Region>) {
        if Arc::strong_count(&slot) == 1 {
            self.free.borrow_mut().push(slot);
        } else {
            self.made.set(self.made.get() - 1);
        }
        if let Some(w) = self.waiters.borrow_mut().pop_front() {
            w.wake();
        }
    }
}

/// The reference service.
pub struct TestService {
    ctx: Context,
    rt_stats: Rc<dyn Fn() -> String>,
    small: SlotClass,
    large: SlotClass,
    /// The slot non-verifying puts read from: concurrent readers share one
    /// registered buffer, as cached reads of one Unifier unit will.
    shared_source: Arc<Region>,
    rr: RrPool,
}

impl TestService {
    /// Builds the service with its registered pool (small slots allocated
    /// once here, large ones on first use).
    pub fn new(l: &Rc<Local>) -> TestService {
        let ctx = l.context().clone();
        let sh = l.shared.clone();
        let shared_source = Arc::new(
            Region::allocate(&ctx, SLOT_SIZE, Access::Local)
                .expect("registering the reference service's source buffer"),
        );
        TestService {
            small: SlotClass::new(&ctx, SMALL_SLOT_SIZE, SMALL_SLOTS, true, Access::Local),
            large: SlotClass::new(&ctx, SLOT_SIZE, LARGE_SLOTS, false, Access::Local),
            rr: RrPool {
                class: SlotClass::new(&ctx, RR_BUFFER_SIZE, RR_BUFFERS, false, Access::RemoteRead),
                keys: RefCell::new(HashMap::new()),
                leases: RefCell::new(HashMap::new()),
                next: Cell::new(1),
            },
            shared_source,
            ctx,
            rt_stats: Rc::new(move || {
                serde_json::json!({
                    "transport": sh.stats.snapshot(),
                    "ucx": format!("{:?}", sh.ctx.stats().snapshot()),
                })
                .to_string()
            }),
        }
    }

    fn class(&self, total: usize) -> &SlotClass {
        if total <= SMALL_SLOT_SIZE {
            &self.small
        } else {
            &self.large
        }
    }

    async fn rma(self: Rc<Self>, conn: ConnHandle, put: bool, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let (flags, seed, segs) = decode_rma(&body)?;
        let total: usize = segs.iter().map(|s| s.len as usize).sum();
        let keys =
            segs.iter().map(|s| conn.remote_key(&s.key).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
        if flags & FLAG_PLAIN != 0 {
            // Unpooled user memory: UCX registers or copies it internally.
            let mut off = 0u64;
            let mut rsegs = Vec::new();
            for (s, k) in segs.iter().zip(&keys) {
                let mut v = vec![0u8; s.len as usize];
                if put && flags & FLAG_VERIFY != 0 {
                    for (i, b) in v.iter_mut().enumerate() {
                        *b = pattern(seed, off + i as u64);
                    }
                }
                off += s.len;
                rsegs.push(RmaSeg { local: LocalMem::Bytes(v), remote_addr: s.addr, rkey: k.clone() });
            }
            if put {
                conn.put(rsegs).await.map_err(|e| e.to_string())?;
                return Ok(Vec::new());
            }
            let got = conn.get(rsegs).await.map_err(|e| e.to_string())?;
            let parts: Vec<Vec<u8>> = got.into_iter().flatten().collect();
            return Ok(hash_reply(&parts.iter().map(|v| v.as_slice()).collect::<Vec<_>>(), total));
        }
        let shared_read = put && flags & FLAG_VERIFY == 0;
        let mut slot = if shared_read { self.shared_source.clone() } else { self.class(total).take(&self.ctx).await? };
        if put && flags & FLAG_VERIFY != 0 {
            match Arc::get_mut(&mut slot) {
                Some(r) => {
                    for (i, b) in r.as_mut_slice()[..total].iter_mut().enumerate() {
                        *b = pattern(seed, i as u64);
                    }
                }
                None => {
                    self.class(total).give_back(slot);
                    return Err("pool slot still referenced".into());
                }
            }
        }
        let mut off = 0usize;
        let mut rsegs = Vec::new();
        for (s, k) in segs.iter().zip(&keys) {
            rsegs.push(RmaSeg {
                local: LocalMem::Region { region: slot.clone(), offset: off, len: s.len as usize },
                remote_addr: s.addr,
                rkey: k.clone(),
            });
            off += s.len as usize;
        }
        let res = if put { conn.put(rsegs).await } else { conn.get(rsegs).await.map(|_| ()) };
        let out = match res {
            Ok(_) if !put && flags & FLAG_VERIFY != 0 => Ok(hash_reply(&[&slot.as_slice()[..total]], total)),
            Ok(_) => Ok(Vec::new()),
            Err(e) => Err(e.to_string()),
        };
        if !shared_read {
            self.class(total).give_back(slot);
        }
        out
    }
}

impl TestService {
    /// `RR_READ`: lease a pool buffer holding the bytes (module docs).
    async fn rr_read(&self, conn: &ConnHandle, body: &[u8]) -> Result<Vec<u8>, String> {
        let (flags, seed, len) = decode_rr_read(body)?;
        let mut buf = self.rr.class.take(&self.ctx).await?;
        if flags & FLAG_VERIFY != 0 {
            match Arc::get_mut(&mut buf) {
                Some(r) => {
                    for (i, b) in r.as_mut_slice()[..len].iter_mut().enumerate() {
                        *b = pattern(seed, i as u64);
                    }
                }
                None => {
                    self.rr.class.give_back(buf);
                    return Err("pool buffer still referenced".into());
                }
            }
        }
        let addr = buf.addr();
        let cached = self.rr.keys.borrow().get(&addr).cloned();
        let key = match cached {
            Some(k) => k,
            None => match buf.pack_key() {
                Ok(k) => {
                    self.rr.keys.borrow_mut().insert(addr, k.clone());
                    k
                }
                Err(e) => {
                    self.rr.class.give_back(buf);
                    return Err(e.to_string());
                }
            },
        };
        let id = self.rr.next.get();
        self.rr.next.set(id + 1);
        self.rr.leases.borrow_mut().insert(id, (conn.id(), buf));
        Ok(RrLease { id, addr, len: len as u64, key }.encode())
    }

    /// `RR_DONE`: the client read its lease; the buffer goes back.
    fn rr_done(&self, conn: &ConnHandle, body: &[u8]) -> Result<Vec<u8>, String> {
        let id = decode_rr_done(body)?;
        let mut leases = self.rr.leases.borrow_mut();
        match leases.get(&id) {
            Some(&(holder, _)) if holder == conn.id() => {
                let (_, buf) = leases.remove(&id).ok_or("lease vanished")?;
                drop(leases);
                self.rr.class.give_back(buf);
                Ok(Vec::new())
            }
            _ => Err(format!("no lease {id} on this connection")),
        }
    }

    /// Returns the leases of a connection that went away.
    fn rr_forget(&self, conn_id: u32) {
        let ids: Vec<u64> =
            self.rr.leases.borrow().iter().filter(|(_, (c, _))| *c == conn_id).map(|(&id, _)| id).collect();
        for id in ids {
            let lease = self.rr.leases.borrow_mut().remove(&id);
            if let Some((_, buf)) = lease {
                self.rr.class.give_back(buf);
            }
        }
    }
}

impl std::fmt::Debug for TestService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestService")
            .field("free_small_slots", &self.small.free.borrow().len())
            .field("free_large_slots", &self.large.free.borrow().len())
            .finish()
    }
}

fn hash_reply(parts: &[&[u8]], total: usize) -> Vec<u8> {
    let mut v = fnv1a(parts.iter().copied()).to_le_bytes().to_vec();
    v.extend_from_slice(&(total as u64).to_le_bytes());
    v
}

/// `Service` for an `Rc<TestService>`.
#[derive(Debug)]
pub struct TestServiceHandle(pub Rc<TestService>);

impl Service for TestServiceHandle {
    fn call(&self, req: Request) -> Pin<Box<dyn Future<Output = Vec<u8>>>> {
        let svc = self.0.clone();
        Box::pin(async move {
            let Request { conn, payload } = req;
            let Some((&op, body)) = payload.split_first() else {
                return err_reply("empty request");
            };
            let r = match op {
                OP_ECHO => Ok(body.to_vec()),
                OP_PUT => svc.rma(conn, true, body.to_vec()).await,
                OP_GET => svc.rma(conn, false, body.to_vec()).await,
                OP_RR_READ => svc.rr_read(&conn, body).await,
                OP_RR_DONE => svc.rr_done(&conn, body),
                OP_SLEEP => match <[u8; 4]>::try_from(body) {
                    Ok(ms) => {
                        crate::timer::sleep(std::time::Duration::from_millis(u32::from_le_bytes(ms) as u64)).await;
                        Ok(Vec::new())
                    }
                    Err(_) => Err("sleep wants 4 bytes".into()),
                },
                OP_BLOCK => match <[u8; 4]>::try_from(body) {
                    Ok(ms) => {
                        std::thread::sleep(std::time::Duration::from_millis(u32::from_le_bytes(ms) as u64));
                        Ok(Vec::new())
                    }
                    Err(_) => Err("block wants 4 bytes".into()),
                },
                OP_STATS => Ok((svc.rt_stats)().into_bytes()),
                OP_LOGIN => match <[u8; 16]>::try_from(body) {
                    Ok(nonce) if conn.set_frame_keys(test_frame_keys(conn.token(), &nonce)) => Ok(Vec::new()),
                    Ok(_) => Err("logged in already".into()),
                    Err(_) => Err("login wants a 16-byte nonce".into()),
                },
                other => Err(format!("unknown op {other}")),
            };
            match r {
                Ok(mut v) => {
                    v.insert(0, 1);
                    v
                }
                Err(e) => err_reply(&e),
            }
        })
    }

    fn disconnected(&self, conn_id: u32) {
        self.0.rr_forget(conn_id);
    }
}

fn err_reply(msg: &str) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(msg.as_bytes());
    v
}

/// Starts the reference service on `rt`.
pub fn serve(rt: &Runtime, addr: std::net::SocketAddr) -> crate::error::Result<std::net::SocketAddr> {
    rt.serve(addr, |l| TestServiceHandle(Rc::new(TestService::new(l))))
}

/// Splits a reply into `Ok(body)` or `Err(message)`.
pub fn parse_reply(r: &[u8]) -> Result<&[u8], String> {
    match r.split_first() {
        Some((1, rest)) => Ok(rest),
        Some((_, msg)) => Err(String::from_utf8_lossy(msg).into_owned()),
        None => Err("empty reply".into()),
    }
}

/// Runs the reference service until the process is killed or its stdin
/// closes: prints `listening on ADDR` once ready (what tests and the
/// benchmark wait for).
pub fn serve_forever(opts: crate::RuntimeOptions, listen: std::net::SocketAddr) -> crate::error::Result<()> {
    let rt = Runtime::new(opts)?;
    let addr = serve(&rt, listen)?;
    println!("listening on {addr}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
        sink.clear();
    }
    // stdin closed (or was never open): keep serving until killed.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rr_read_round_trips_and_refuses_bad_bodies() {
        let v = encode_rr_read(FLAG_VERIFY, 42, 128 << 10);
        assert_eq!(v[0], OP_RR_READ);
        assert_eq!(decode_rr_read(&v[1..]), Ok((FLAG_VERIFY, 42, 128 << 10)));
        // Every truncation is an error, never a panic.
        for n in 0..v.len() - 1 {
            assert!(decode_rr_read(&v[1..1 + n]).is_err(), "{n} bytes accepted");
        }
        let mut long = v[1..].to_vec();
        long.push(0);
        assert!(decode_rr_read(&long).unwrap_err().contains("trailing"));
        for len in [0u64, RR_BUFFER_SIZE as u64 + 1, u64::MAX] {
            let e = decode_rr_read(&encode_rr_read(0, 1, len)[1..]).unwrap_err();
            assert!(e.contains("must be 1..="), "{len}: {e}");
        }
        assert!(decode_rr_read(&encode_rr_read(0, 1, RR_BUFFER_SIZE as u64)[1..]).is_ok());
    }

    #[test]
    fn lease_round_trips_and_refuses_bad_bodies() {
        let l = RrLease { id: 7, addr: 0x7f00_0000_1000, len: 4096, key: vec![0xda, 1, 2, 3] };
        let b = l.encode();
        assert_eq!(RrLease::decode(&b), Ok(l.clone()));
        for n in 0..b.len() {
            assert!(RrLease::decode(&b[..n]).is_err(), "{n} bytes accepted");
        }
        let mut long = b.clone();
        long.push(9);
        assert!(RrLease::decode(&long).unwrap_err().contains("trailing"));
        // A key length beyond the bound, and one beyond the bytes sent.
        let mut huge = b[..24].to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(RrLease::decode(&huge).unwrap_err().contains("key of"));
        let mut short = b[..24].to_vec();
        short.extend_from_slice(&100u32.to_le_bytes());
        short.extend_from_slice(&[1, 2, 3]);
        assert!(RrLease::decode(&short).unwrap_err().contains("truncated"));
        for len in [0u64, RR_BUFFER_SIZE as u64 + 1] {
            let bad = RrLease { len, ..l.clone() }.encode();
            assert!(RrLease::decode(&bad).is_err(), "{len}");
        }
        assert!(RrLease::decode(&vec![0u8; MAX_LEASE + 1]).unwrap_err().contains("at most"));
    }

    #[test]
    fn done_decodes_exactly_eight_bytes() {
        let v = encode_rr_done(u64::MAX - 3);
        assert_eq!(v[0], OP_RR_DONE);
        assert_eq!(decode_rr_done(&v[1..]), Ok(u64::MAX - 3));
        for bad in [&[][..], &[1, 2, 3][..], &[0u8; 9][..]] {
            assert!(decode_rr_done(bad).is_err());
        }
    }
}
