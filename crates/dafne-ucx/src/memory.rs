//! Registered memory and remote keys.
//!
//! A [`Region`] is memory registered with the context's memory domains
//! (`ucp_mem_map`) with explicit access rights. Either UCX allocates it
//! ([`Region::allocate`], which on one host gives shared-memory segments that
//! peers map directly, once proven to be ours), the caller hands over a buffer ([`Region::register`],
//! which pins the caller's memory), or a range of a file is mapped
//! ([`Region::map_file`]: the file's page-cache pages themselves, registered
//! on the fly, as an io server's `mmap` serving mode does). In every case the
//! region owns its memory, so the memory cannot be freed (or unmapped) while
//! it is registered.
//!
//! A packed key ([`Region::pack_key`]) is plain bytes that travel inside a
//! message; the peer turns them into a [`RemoteKey`] bound to its endpoint.
//! Keys are hostile input to the peer that unpacks them: each carries the
//! window it was packed for, every put and get is checked against it, and
//! shared-memory parts are kept only when the kernel vouches for them
//! (`KeyShape`), because UCX itself bounds neither.

use std::ptr;
use std::rc::Rc;
use std::time::Instant;

use ucx_sys as sys;

use crate::context::Context;
use crate::endpoint::EpInner;
use crate::error::{check, Error, Result};
use crate::stats::Stats;

/// What a peer may do with a region. Local read/write is always granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No remote access: memory used only as a local source/destination.
    Local,
    /// Peers may `get` from it (a client's write source).
    RemoteRead,
    /// Peers may `put` into it (a client's read destination).
    RemoteWrite,
    /// Both.
    RemoteReadWrite,
}

impl Access {
    fn prot(self) -> u32 {
        self.prot_with_local(sys::UCP_MEM_MAP_PROT_LOCAL_READ | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE)
    }

    fn prot_with_local(self, local: u32) -> u32 {
        local
            | match self {
                Access::Local => 0,
                Access::RemoteRead => sys::UCP_MEM_MAP_PROT_REMOTE_READ,
                Access::RemoteWrite => sys::UCP_MEM_MAP_PROT_REMOTE_WRITE,
                Access::RemoteReadWrite => sys::UCP_MEM_MAP_PROT_REMOTE_READ | sys::UCP_MEM_MAP_PROT_REMOTE_WRITE,
            }
    }
}

enum Backing {
    /// UCX allocated the memory (`UCP_MEM_MAP_ALLOCATE`); unmap frees it.
    Ucx,
    /// The caller's buffer, pinned while registered and returned on `into_vec`.
    Owned(Vec<u8>),
    /// A file range mapped by [`Region::map_file`]; unmapped (`munmap`) when
    /// the backing is dropped, which is after `ucp_mem_unmap` (see `Drop`).
    Mapped(Mapping),
}

/// An `mmap` of a file range, released with `munmap` on drop.
struct Mapping {
    base: *mut libc::c_void,
    len: usize,
    writable: bool,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what a successful mmap returned and
        // are unmapped once, here. Every user of the memory is gone: the
        // region that owned this mapping deregistered it from UCX first
        // (`Region::drop` runs `unmap` before its fields drop, `into_vec`
        // calls `unmap` before replacing the backing), and operations keep
        // their `Arc<Region>` until UCX reports completion.
        let r = unsafe { libc::munmap(self.base, self.len) };
        debug_assert_eq!(r, 0, "munmap: {}", std::io::Error::last_os_error());
    }
}

/// The system page size (mmap offsets must be multiples of it).
fn page_size() -> usize {
    // SAFETY: sysconf with a valid name has no preconditions and touches no memory.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Registered memory. `Send + Sync`: registration is a context-level call.
pub struct Region {
    ctx: Context,
    memh: sys::ucp_mem_h,
    addr: *mut u8,
    len: usize,
    access: Access,
    backing: Backing,
}

// SAFETY: a Region owns its memory (UCX-allocated, a Vec, or a file mapping
// unmapped only in its own Drop) and its memh; UCX's context lock (the
// context is mt_workers_shared) serialises mem_unmap/rkey_pack. Shared access
// from several threads only reads the memory through &self accessors.
unsafe impl Send for Region {}
// SAFETY: see Send.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("access", &self.access)
            .finish()
    }
}

impl Region {
    /// Lets UCX allocate and register `len` bytes (zero-filled is not
    /// promised). This is the fast path for pools: registered once, reused.
    pub fn allocate(ctx: &Context, len: usize, access: Access) -> Result<Region> {
        if len == 0 {
            return Err(Error::Invalid { op: "ucp_mem_map", reason: "cannot register an empty region".into() });
        }
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT) as u64,
            length: len,
            flags: sys::UCP_MEM_MAP_ALLOCATE,
            prot: access.prot(),
            ..Default::default()
        };
        let (memh, addr) = map(ctx, &params)?;
        let mut region = Region { ctx: ctx.clone(), memh, addr, len, access, backing: Backing::Ucx };
        region.as_mut_slice().fill(0);
        Ok(region)
    }

    /// Registers a caller's buffer in place (no copy); the buffer comes back
    /// from [`Region::into_vec`] after deregistration.
    pub fn register(ctx: &Context, mut buf: Vec<u8>, access: Access) -> Result<Region> {
        if buf.is_empty() {
            return Err(Error::Invalid { op: "ucp_mem_map", reason: "cannot register an empty buffer".into() });
        }
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT) as u64,
            address: buf.as_mut_ptr().cast(),
            length: buf.len(),
            prot: access.prot(),
            ..Default::default()
        };
        let (memh, _) = map(ctx, &params)?;
        let (addr, len) = (buf.as_mut_ptr(), buf.len());
        Ok(Region { ctx: ctx.clone(), memh, addr, len, access, backing: Backing::Owned(buf) })
    }

    /// Maps `len` bytes of `file` at `offset` (`mmap`, `MAP_SHARED`) and
    /// registers the mapping in place: the region's bytes *are* the file's
    /// page-cache pages, so an RMA put from it moves file data without a
    /// copy. This is the registration-on-the-fly of the Unifier paper's
    /// `Mmap` method: each call pays an `mmap` and a registration, and
    /// dropping the region deregisters it and then `munmap`s it.
    ///
    /// `access` decides the mapping's protection: [`Access::Local`] and
    /// [`Access::RemoteRead`] map it read-only (`PROT_READ`; the file may be
    /// open read-only), which makes the region a source only: an RMA get
    /// into it is refused and [`Region::as_mut_slice`] panics.
    /// [`Access::RemoteWrite`] and [`Access::RemoteReadWrite`] map it
    /// writable (the file must be open for writing), and bytes written to
    /// the region go to the file.
    ///
    /// The range must lie inside the file (`offset + len` ≤ its length),
    /// checked here. While the region lives, the file must not be shrunk
    /// below the range by anyone: the kernel answers an access to a mapped
    /// page past the end of file with `SIGBUS`, which kills the process
    /// (no memory is corrupted, but it is a crash). Whoever maps must own
    /// the file's size, as an io server owns its chunk files. Other writers
    /// of the file change the region's bytes, as a peer with a remote-write
    /// key may change any region's (see [`Region::as_slice`]).
    pub fn map_file(ctx: &Context, file: &std::fs::File, offset: u64, len: usize, access: Access) -> Result<Region> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(Error::Invalid { op: "mmap", reason: "cannot map an empty range".into() });
        }
        let size = file.metadata().map_err(|source| Error::Os { op: "fstat", source })?.len();
        if offset.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(Error::Invalid {
                op: "mmap",
                reason: format!(
                    "range {offset}+{len} is not inside the file ({size} bytes): mapped pages past its end fault"
                ),
            });
        }
        let page = page_size() as u64;
        let start = offset - offset % page;
        let delta = (offset - start) as usize;
        let map_len = delta + len; // ≤ size + page: no overflow, offset + len fits a u64
        let file_offset = libc::off_t::try_from(start)
            .map_err(|_| Error::Invalid { op: "mmap", reason: format!("offset {offset} exceeds off_t") })?;
        let writable = matches!(access, Access::RemoteWrite | Access::RemoteReadWrite);
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a new mapping at an address the kernel chooses (null hint,
        // no MAP_FIXED), so no existing memory is replaced; the descriptor is
        // live for the call (borrowed from `file`); the result is checked
        // against MAP_FAILED before use.
        let base =
            unsafe { libc::mmap(ptr::null_mut(), map_len, prot, libc::MAP_SHARED, file.as_raw_fd(), file_offset) };
        if base == libc::MAP_FAILED {
            return Err(Error::Os { op: "mmap", source: std::io::Error::last_os_error() });
        }
        // From here the mapping is released by `Mapping::drop`, also when
        // registration fails below.
        let mapping = Mapping { base, len: map_len, writable };
        // SAFETY: delta < page ≤ map_len, so the pointer stays inside the mapping.
        let addr = unsafe { base.cast::<u8>().add(delta) };
        let local = if writable {
            sys::UCP_MEM_MAP_PROT_LOCAL_READ | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE
        } else {
            sys::UCP_MEM_MAP_PROT_LOCAL_READ
        };
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT) as u64,
            address: addr.cast(),
            length: len,
            prot: access.prot_with_local(local),
            ..Default::default()
        };
        let (memh, _) = map(ctx, &params)?;
        Ok(Region { ctx: ctx.clone(), memh, addr, len, access, backing: Backing::Mapped(mapping) })
    }

    /// Deregisters and gives back the caller's buffer (`None` for UCX memory
    /// and file mappings, which are released).
    pub fn into_vec(mut self) -> Option<Vec<u8>> {
        self.unmap();
        // Deregistered above, so a mapping may be unmapped as it drops here.
        match std::mem::replace(&mut self.backing, Backing::Ucx) {
            Backing::Owned(v) => {
                // Already unmapped: make Drop a no-op.
                self.memh = ptr::null_mut();
                Some(v)
            }
            Backing::Ucx | Backing::Mapped(_) => None,
        }
    }

    /// Whether the region's memory cannot be written (a read-only file
    /// mapping): it may only be the source of an RMA put.
    pub fn is_read_only(&self) -> bool {
        matches!(&self.backing, Backing::Mapped(m) if !m.writable)
    }

    /// Address of the first byte, as peers name it in RMA.
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn access(&self) -> Access {
        self.access
    }

    pub(crate) fn memh(&self) -> sys::ucp_mem_h {
        self.memh
    }

    /// Whether this region was registered with `ctx` (a memory handle is
    /// only meaningful to the context that made it).
    pub(crate) fn belongs_to(&self, ctx: &Context) -> bool {
        std::sync::Arc::ptr_eq(&self.ctx.inner, &ctx.inner)
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.addr
    }

    /// The region's bytes. A peer with a remote-write key may change them
    /// while a request that granted the key is in flight: protocols read a
    /// region only after the request that exposed it has completed.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: addr..addr+len is memory this region owns (UCX-allocated or
        // the owned Vec) and stays valid until Drop.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    /// Mutable bytes; `&mut self` proves no in-flight local operation holds
    /// the region (operations keep an `Arc<Region>` alive).
    ///
    /// # Panics
    /// On a read-only file mapping ([`Region::is_read_only`]): its pages
    /// cannot be written.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        assert!(!self.is_read_only(), "a read-only file mapping cannot be written");
        // SAFETY: as in as_slice, and &mut self gives exclusive access on
        // the Rust side; the memory is writable (checked above).
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }

    /// Packs a remote key that lets a peer reach this region with the
    /// region's access rights. The bytes can be sent in any message.
    pub fn pack_key(&self) -> Result<Vec<u8>> {
        Ok(frame_key(self.addr(), self.len as u64, pack(&self.ctx, self.memh)?))
    }

    fn unmap(&mut self) {
        if self.memh.is_null() {
            return;
        }
        unmap(&self.ctx, self.memh);
        // Never used again (Drop and into_vec check for null).
        self.memh = ptr::null_mut();
    }
}

/// Packs a key for a live memory handle of `ctx`.
fn pack(ctx: &Context, memh: sys::ucp_mem_h) -> Result<Vec<u8>> {
    let mut buf: *mut std::ffi::c_void = ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: context and memh are live (callers own both); buf/size are out-pointers.
    check("ucp_rkey_pack", unsafe { sys::ucp_rkey_pack(ctx.inner.h, memh, &mut buf, &mut size) })?;
    // SAFETY: UCX returned a buffer of `size` bytes that we copy then release.
    let out = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
    // SAFETY: buf came from ucp_rkey_pack and is released once.
    unsafe { sys::ucp_rkey_buffer_release(buf) };
    Ok(out)
}

/// Deregisters a live memory handle of `ctx`; the caller never uses it again.
fn unmap(ctx: &Context, memh: sys::ucp_mem_h) {
    let t = Instant::now();
    // SAFETY: memh is a live mapping of this context, unmapped once: every
    // caller drops or nulls its handle right after.
    let st = unsafe { sys::ucp_mem_unmap(ctx.inner.h, memh) };
    debug_assert_eq!(st, sys::UCS_OK as sys::ucs_status_t, "ucp_mem_unmap");
    let s = &ctx.inner.stats;
    Stats::add(&s.deregistrations, 1);
    Stats::add(&s.deregistration_ns, t.elapsed().as_nanos() as u64);
}

impl Drop for Region {
    fn drop(&mut self) {
        self.unmap();
    }
}

fn map(ctx: &Context, params: &sys::ucp_mem_map_params_t) -> Result<(sys::ucp_mem_h, *mut u8)> {
    let t = Instant::now();
    let mut memh: sys::ucp_mem_h = ptr::null_mut();
    // SAFETY: params is fully initialised for the fields in field_mask; when
    // an address is given it points to `length` bytes owned by the caller,
    // which the returned Region keeps alive.
    check("ucp_mem_map", unsafe { sys::ucp_mem_map(ctx.inner.h, params, &mut memh) })?;
    let mut attr = sys::ucp_mem_attr_t {
        field_mask: (sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH) as u64,
        ..Default::default()
    };
    // SAFETY: memh was just created; attr is an out-struct.
    let q = check("ucp_mem_query", unsafe { sys::ucp_mem_query(memh, &mut attr) });
    if let Err(e) = q {
        // SAFETY: undo the mapping we just made; memh is not used afterwards.
        unsafe { sys::ucp_mem_unmap(ctx.inner.h, memh) };
        return Err(e);
    }
    let s = &ctx.inner.stats;
    Stats::add(&s.registrations, 1);
    Stats::add(&s.registration_ns, t.elapsed().as_nanos() as u64);
    Stats::add(&s.registered_bytes, params.length as u64);
    Ok((memh, attr.address as *mut u8))
}

/// A registration of memory the caller keeps (application buffers): the
/// whole pages covering a slice, registered in place. It owns nothing but
/// the registration and gives no access to the bytes (no slice), so it
/// cannot outlive the memory unsafely on the Rust side: Rust code reads and
/// writes the memory through the caller's own slice. Its key
/// ([`Registration::pack_key`]) lets a peer reach the pages, which is the
/// caller's to bound: send it only while the caller holds the slice, as a
/// request does, and drop the registration once the memory is unmapped
/// (see [`crate::memevents`]). Deregistering memory that was unmapped
/// meanwhile is allowed (UCX releases its handle; nothing is touched).
pub struct Registration {
    ctx: Context,
    memh: sys::ucp_mem_h,
    addr: usize,
    len: usize,
}

// SAFETY: a Registration owns only its memh (no memory); UCX's context lock
// (the context is mt_workers_shared) serialises mem_unmap/rkey_pack.
unsafe impl Send for Registration {}
// SAFETY: see Send; &self methods only read plain fields or pack a key.
unsafe impl Sync for Registration {}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("addr", &self.addr).field("len", &self.len).finish()
    }
}

impl Registration {
    /// Registers the pages covering `mem` (start rounded down, end up to the
    /// page size) with `access`. Every byte of those pages is mapped now:
    /// mappings are whole pages and `mem`'s bytes lie in them.
    pub fn covering(ctx: &Context, mem: &[u8], access: Access) -> Result<Registration> {
        if mem.is_empty() {
            return Err(Error::Invalid { op: "ucp_mem_map", reason: "cannot register an empty buffer".into() });
        }
        let page = page_size();
        let start = mem.as_ptr() as usize & !(page - 1);
        let end = (mem.as_ptr() as usize + mem.len()).next_multiple_of(page);
        let params = sys::ucp_mem_map_params_t {
            field_mask: (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                | sys::UCP_MEM_MAP_PARAM_FIELD_PROT) as u64,
            address: start as *mut std::ffi::c_void,
            length: end - start,
            prot: access.prot(),
            ..Default::default()
        };
        let (memh, _) = map(ctx, &params)?;
        Ok(Registration { ctx: ctx.clone(), memh, addr: start, len: end - start })
    }

    /// First byte of the registered pages.
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    /// Bytes registered (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[addr, addr + len)` lies inside the registered pages.
    pub fn covers(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|e| e <= self.addr + self.len)
    }

    /// A key that lets a peer reach the registered pages.
    pub fn pack_key(&self) -> Result<Vec<u8>> {
        Ok(frame_key(self.addr as u64, self.len as u64, pack(&self.ctx, self.memh)?))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        unmap(&self.ctx, self.memh);
    }
}

/// Largest packed key accepted from a peer (UCX 1.13 packs ~20-200 bytes).
pub const MAX_PACKED_KEY: usize = 4096;
const UNPACK_SLACK: usize = 8 + 1 + 64 * 256;

/// The tag that opens every key dafne packs (a version of the framing).
const KEY_TAG: [u8; 2] = [0xDA, 0x01];
/// Tag, window start, window length.
const KEY_HEADER: usize = 2 + 8 + 8;

/// Frames UCX's packed bytes with the window they were packed for: the
/// registered range `[base, base + len)`. A peer that unpacks the key
/// refuses any RMA outside that window ([`RemoteKey::covers`]), so an
/// address in a request can reach only what its sender registered.
fn frame_key(base: u64, len: u64, ucx: Vec<u8>) -> Vec<u8> {
    let mut k = Vec::with_capacity(KEY_HEADER + ucx.len());
    k.extend_from_slice(&KEY_TAG);
    k.extend_from_slice(&base.to_le_bytes());
    k.extend_from_slice(&len.to_le_bytes());
    k.extend_from_slice(&ucx);
    k
}

/// Splits a framed key into its window and UCX's bytes, refusing windows
/// that are empty or wrap around the address space.
fn unframe_key(packed: &[u8]) -> Result<(u64, u64, &[u8])> {
    let bad = |reason: String| Err(Error::Invalid { op: "ucp_ep_rkey_unpack", reason });
    if packed.len() < KEY_HEADER || packed[..2] != KEY_TAG {
        return bad("not a dafne key (missing its tag and window; does the peer run this version?)".into());
    }
    let base = u64::from_le_bytes(packed[2..10].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(packed[10..18].try_into().expect("8 bytes"));
    if len == 0 || base.checked_add(len).is_none() {
        return bad(format!("key window {base:#x}+{len} is empty or wraps around"));
    }
    Ok((base, len, &packed[KEY_HEADER..]))
}

/// A peer's packed key unpacked on one endpoint. Holds the endpoint, so the
/// key is always destroyed before the endpoint is closed.
pub struct RemoteKey {
    pub(crate) h: sys::ucp_rkey_h,
    pub(crate) ep: Rc<EpInner>,
    base: u64,
    len: u64,
    /// The key kept a shared-memory part (see `KeyShape`).
    mapped: bool,
}

impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteKey").field("h", &self.h).field("base", &self.base).field("len", &self.len).finish()
    }
}

impl RemoteKey {
    pub(crate) fn unpack(ep: Rc<EpInner>, packed: &[u8]) -> Result<RemoteKey> {
        if packed.is_empty() {
            return Err(Error::Invalid { op: "ucp_ep_rkey_unpack", reason: "empty packed key".into() });
        }
        if packed.len() > MAX_PACKED_KEY {
            return Err(Error::Invalid {
                op: "ucp_ep_rkey_unpack",
                reason: format!("packed key of {} bytes exceeds the {MAX_PACKED_KEY}-byte limit", packed.len()),
            });
        }
        let (base, len, ucx) = unframe_key(packed)?;
        let shape = ep.worker.ctx.key_shape();
        let peers = ep.peer_processes.borrow().clone();
        let (ucx, unmapped) = shape.without_mapped_parts(ucx, (base, len), &peers)?;
        shape.check(&ucx)?;
        let mapped = key_map(&ucx) & shape.mapped != 0;
        // ucp_ep_rkey_unpack takes no length: it walks the buffer by the sizes
        // written inside it. A hostile or truncated key could send it past the
        // end of `packed`, so the bytes are copied into a zeroed buffer large
        // enough for the largest layout UCX can describe (a 64-bit md map,
        // a memory type, then per md a 1-byte size and up to 255 bytes).
        let mut padded = vec![0u8; ucx.len() + UNPACK_SLACK];
        padded[..ucx.len()].copy_from_slice(&ucx);
        let t = Instant::now();
        let mut h: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: the endpoint is live (we hold it); `padded` is readable for
        // every offset UCX's parser can reach (see above). A hostile buffer
        // may make UCX return an error status, which we propagate.
        check("ucp_ep_rkey_unpack", unsafe { sys::ucp_ep_rkey_unpack(ep.handle()?, padded.as_ptr().cast(), &mut h) })?;
        let s = &ep.worker.ctx.inner.stats;
        Stats::add(&s.rkey_unpacks, 1);
        Stats::add(&s.rkey_unpack_ns, t.elapsed().as_nanos() as u64);
        Stats::add(&s.key_parts_unmapped, unmapped);
        Ok(RemoteKey { h, ep, base, len, mapped })
    }

    /// Whether this key reaches the peer's memory through a shared-memory
    /// segment the peer proved it created (a System V part kept by
    /// `KeyShape`). On one host (an endpoint without peer error handling)
    /// that is the only way UCX 1.13 puts into and gets from another
    /// process's memory *by itself*: for any other key (ordinary memory
    /// registered by the peer, reached by cma or over TCP) `ucp_put_nbx`
    /// and `ucp_get_nbx` are emulated over active messages that the peer's
    /// own worker must answer, so an operation to a stopped peer waits, and
    /// one to a peer that died without UCX noticing never completes and
    /// keeps the local memory it was given for good.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// The window the key was packed for: `(first address, bytes)`.
    pub fn window(&self) -> (u64, u64) {
        (self.base, self.len)
    }

    /// Whether `[addr, addr + len)` lies inside the key's window (and does
    /// not wrap around the address space).
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && addr.checked_add(len).is_some_and(|end| end <= self.base + self.len)
    }
}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        // SAFETY: the key was unpacked on `ep`, which this struct keeps alive,
        // and is destroyed exactly once.
        unsafe { sys::ucp_rkey_destroy(self.h) };
    }
}

/// The layout of the keys this process packs, learned once per context.
///
/// UCX 1.13's `ucp_ep_rkey_unpack` is not safe on hostile input: a key that
/// names memory domains the endpoint does not know makes its error path
/// release uninitialised state and crash (seen in this repository's tests).
/// So a peer's key is checked structurally before UCX sees it. The 1.13
/// layout is `md_map: u64`, `mem_type: u8`, then for each bit of `md_map`
/// in increasing order `size: u8` and `size` bytes. Every dafne process of a
/// cluster runs the same UCX configuration, so a peer's key must name a
/// subset of the memory domains of our own keys, with the same sizes.
///
/// It also learns which memory domains *map* the peer's memory into this
/// process: those that appear in keys of memory UCX allocated (shared-memory
/// segments: `sysv`, `posix`) but never in keys of registered memory. Their
/// key parts name a segment by an id the peer chooses (a System V shmid, a
/// `/proc/<pid>/fd/<fd>` pair), and UCX writes to `mapped base + address`
/// with no bound: a hostile key names any segment on the host (this
/// server's own cache slabs among them) and a stray address lands in this
/// process's heap. So those parts are removed before UCX sees the key
/// ([`KeyShape::without_mapped_parts`]) unless they are proven safe.
///
/// One kind is checked instead of dropped: a System V part (its layout,
/// `shmid: i32` then the owner's address `u64`, is confirmed on a key of
/// our own at start). The kernel says who created the segment and its size
/// (`shmctl(IPC_STAT)`), and a System V segment never shrinks; so the part
/// stays when the segment's creator is one of the processes proven to be
/// the peer ([`crate::Endpoint::set_peer_processes`]) and the key's window
/// lies inside the segment. Then the server writes only into that
/// client's segment, inside its window, at shared-memory speed. Any other
/// mapped part goes, and UCX 1.13 reaches the memory by RMA emulated over
/// active messages: the peer's own UCX writes its own memory (slower, but
/// nothing of this process is exposed). RDMA NICs check keys in hardware.
#[derive(Debug, Clone)]
pub(crate) struct KeyShape {
    sizes: [Option<u8>; 64],
    /// Bit `md` set: memory domain `md` maps peer segments (see above).
    pub(crate) mapped: u64,
    /// The memory domain whose key parts are System V `(shmid, address)`.
    sysv: Option<usize>,
}

/// Creator and size of a System V segment, from the kernel.
fn sysv_segment(shmid: i32) -> Option<(u32, u64)> {
    // SAFETY: shmid_ds is plain data; zeroed is a valid value to overwrite.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT only writes `ds`, which is ours and of the right type;
    // any shmid is allowed (the kernel answers EINVAL/EACCES for bad ones).
    let r = unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) };
    (r == 0 && ds.shm_cpid > 0).then_some((ds.shm_cpid as u32, ds.shm_segsz as u64))
}

impl KeyShape {
    /// Whether peers' System V segments can be kept in keys (the only
    /// memory a server reaches on one host without the peer's help).
    pub(crate) fn maps_sysv(&self) -> bool {
        self.sysv.is_some()
    }

    pub(crate) fn learn(ctx: &Context) -> KeyShape {
        let mut sizes = [None; 64];
        let mut mds = |r: &Result<Region>| -> u64 {
            let Ok(r) = r else { return 0 };
            let Ok(framed) = r.pack_key() else { return 0 };
            let Ok((_, _, k)) = unframe_key(&framed) else { return 0 };
            let Ok((_, parts)) = parse_key(k) else { return 0 };
            let mut map = 0u64;
            for (md, size) in parts {
                sizes[md] = Some(size);
                map |= 1 << md;
            }
            map
        };
        let sample = Region::allocate(ctx, 4096, Access::RemoteReadWrite);
        let sysv_sample =
            sample.as_ref().ok().and_then(|r| Some((r.addr(), unframe_key(&r.pack_key().ok()?).ok()?.2.to_vec())));
        let allocated = mds(&sample);
        let registered = mds(&Region::register(ctx, vec![0u8; 4096], Access::RemoteReadWrite));
        let mapped = allocated & !registered;
        // Which mapped domain packs `(shmid, address)` of a segment this
        // process created: confirmed, not assumed.
        let sysv = sysv_sample.and_then(|(addr, k)| {
            let (_, parts) = parse_key(&k).ok()?;
            let mut p = 9usize;
            let mut found = None;
            for (md, size) in parts {
                let part = &k[p + 1..p + 1 + size as usize];
                p += 1 + size as usize;
                if mapped & (1 << md) == 0 || size != 12 || part[4..12] != addr.to_le_bytes() {
                    continue;
                }
                let shmid = i32::from_le_bytes(part[..4].try_into().ok()?);
                if sysv_segment(shmid).is_some_and(|(cpid, size)| cpid == std::process::id() && size >= 4096) {
                    found = Some(md);
                }
            }
            found
        });
        // The sample segment lives until here: its creator was checked.
        drop(sample);
        KeyShape { sizes, mapped, sysv }
    }

    /// The key without the parts of memory domains that map peer segments
    /// into this process, but for System V parts proven safe for `window`
    /// and the peer's processes `peers` (see the type's docs), and how many
    /// parts went. A key left with no part at all is refused.
    pub(crate) fn without_mapped_parts(
        &self,
        packed: &[u8],
        window: (u64, u64),
        peers: &[u32],
    ) -> Result<(Vec<u8>, u64)> {
        let bad = |reason: String| Err(Error::Invalid { op: "ucp_ep_rkey_unpack", reason });
        let (mem_type, parts) = match parse_key(packed) {
            Ok(p) => p,
            Err(e) => return bad(e),
        };
        let mut out = vec![0u8; 9];
        out[8] = mem_type;
        let (mut map, mut dropped, mut p) = (0u64, 0u64, 9usize);
        for (md, size) in parts {
            let part = &packed[p..p + 1 + size as usize];
            p += part.len();
            if self.mapped & (1 << md) != 0 && !self.sysv_part_is_safe(md, &part[1..], window, peers) {
                dropped += 1;
                continue;
            }
            map |= 1 << md;
            out.extend_from_slice(part);
        }
        if map == 0 {
            return bad("key names only shared-memory segments, which servers do not map (register the memory \
                 so that cma or the NIC can reach it)"
                .into());
        }
        out[..8].copy_from_slice(&map.to_le_bytes());
        Ok((out, dropped))
    }

    /// A System V part `(shmid, address)` whose segment a peer process
    /// created and which holds the whole window `[base, base + len)`.
    fn sysv_part_is_safe(&self, md: usize, part: &[u8], (base, len): (u64, u64), peers: &[u32]) -> bool {
        if self.sysv != Some(md) || part.len() != 12 || peers.is_empty() {
            return false;
        }
        let shmid = i32::from_le_bytes(part[..4].try_into().expect("4 bytes"));
        let address = u64::from_le_bytes(part[4..12].try_into().expect("8 bytes"));
        let Some((cpid, size)) = sysv_segment(shmid) else { return false };
        peers.contains(&cpid)
            && base >= address
            && address.checked_add(size).is_some_and(|end| base.checked_add(len).is_some_and(|e| e <= end))
    }

    pub(crate) fn check(&self, packed: &[u8]) -> Result<()> {
        let bad = |reason: String| Err(Error::Invalid { op: "ucp_ep_rkey_unpack", reason });
        let (mem_type, parts) = match parse_key(packed) {
            Ok(p) => p,
            Err(e) => return bad(e),
        };
        if mem_type != sys::UCS_MEMORY_TYPE_HOST as u8 {
            return bad(format!("key for memory type {mem_type}, only host memory is supported"));
        }
        for (md, size) in parts {
            match self.sizes[md] {
                Some(s) if s == size => {}
                Some(s) => return bad(format!("key part for memory domain {md} has {size} bytes, expected {s}")),
                None => {
                    return bad(format!(
                        "key names memory domain {md}, which this process does not have \
                         (do both ends run the same UCX_TLS?)"
                    ))
                }
            }
        }
        Ok(())
    }
}

/// Splits a packed key into its memory type and `(md index, size)` parts,
/// checking that the sizes account for every byte.
/// The memory-domain map of a key that passed [`parse_key`] (its first
/// eight bytes).
fn key_map(k: &[u8]) -> u64 {
    k.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).unwrap_or(0)
}

fn parse_key(k: &[u8]) -> Result<(u8, Vec<(usize, u8)>), String> {
    if k.len() < 9 {
        return Err(format!("key of {} bytes is shorter than its 9-byte header", k.len()));
    }
    let md_map = u64::from_le_bytes(k[..8].try_into().map_err(|_| "short key")?);
    if md_map == 0 {
        return Err("key names no memory domain".into());
    }
    let mem_type = k[8];
    let mut p = 9usize;
    let mut parts = Vec::new();
    for md in 0..64 {
        if md_map & (1u64 << md) == 0 {
            continue;
        }
        let Some(&size) = k.get(p) else {
            return Err(format!("key ends before the part for memory domain {md}"));
        };
        p += 1 + size as usize;
        if p > k.len() {
            return Err(format!("key part for memory domain {md} runs past the end"));
        }
        parts.push((md, size));
    }
    if p != k.len() {
        return Err(format!("{} unexpected bytes after the key", k.len() - p));
    }
    Ok((mem_type, parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flushes `ep` and progresses `w` until `put` and the flush are done;
    /// the put must have succeeded.
    fn put_and_flush(w: &crate::Worker, ep: &crate::Endpoint, put: &crate::Op) {
        let flush = ep.flush().unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while put.poll_done().is_none() || flush.poll_done().is_none() {
            assert!(Instant::now() < deadline, "put did not complete");
            w.progress();
        }
        put.poll_done().unwrap().unwrap();
    }

    #[test]
    fn key_parser_rejects_lies() {
        let mut k = vec![0b101, 0, 0, 0, 0, 0, 0, 0, 0];
        k.extend([2, 0xaa, 0xbb]);
        k.extend([1, 0xcc]);
        assert_eq!(parse_key(&k), Ok((0, vec![(0, 2), (2, 1)])));
        assert!(parse_key(&k[..k.len() - 1]).is_err());
        let mut long = k.clone();
        long.push(0);
        assert!(parse_key(&long).is_err());
        assert!(parse_key(&[0xEE; 40]).is_err());
        assert!(parse_key(&[]).is_err());
    }

    /// A scratch file removed on drop (this crate has no tempfile dependency).
    struct TempFile(std::path::PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn file_ranges_map_register_put_and_release() {
        use std::io::Write as _;
        let ctx = Context::new(&crate::ContextOptions::default()).unwrap();
        let path = std::env::temp_dir().join(format!("dafne-ucx-map-{}", std::process::id()));
        let _cleanup = TempFile(path.clone());
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let ro = std::fs::File::open(&path).unwrap();

        // An unaligned range of a file opened read-only: the region's bytes
        // are the file's, and it is registered (and later deregistered).
        let before = ctx.stats().snapshot();
        let r = Region::map_file(&ctx, &ro, 5000, 70_000, Access::RemoteRead).unwrap();
        assert_eq!(r.len(), 70_000);
        assert!(r.is_read_only());
        assert_eq!(r.as_slice(), &data[5000..75_000]);
        let mid = ctx.stats().snapshot().since(&before);
        assert_eq!((mid.registrations, mid.registered_bytes), (1, 70_000));
        ctx.key_shape().check(unframe_key(&r.pack_key().unwrap()).unwrap().2).unwrap();

        // It is a valid source for a put (loopback endpoint on one worker).
        let w = crate::Worker::new(&ctx).unwrap();
        let ep = w.connect_address(&w.address().unwrap(), crate::ErrMode::None).unwrap();
        let mut dst = Region::allocate(&ctx, 70_000, Access::RemoteWrite).unwrap();
        dst.as_mut_slice().fill(0);
        let rkey = Rc::new(ep.unpack_key(&dst.pack_key().unwrap()).unwrap());
        let src = std::sync::Arc::new(r);
        let put =
            ep.put(crate::Local::Region { region: src.clone(), offset: 0, len: 70_000 }, dst.addr(), &rkey).unwrap();
        put_and_flush(&w, &ep, &put);
        assert_eq!(dst.as_slice(), &data[5000..75_000]);
        // ... but never a destination.
        let get = ep.get(crate::Local::Region { region: src.clone(), offset: 0, len: 8 }, dst.addr(), &rkey);
        assert!(get.is_err(), "a get into a read-only mapping was accepted");
        drop((put, rkey, ep));
        let src = std::sync::Arc::try_unwrap(src).unwrap();
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut src = src;
            src.as_mut_slice()[0] = 1;
        }))
        .is_err());
        let after = ctx.stats().snapshot().since(&before);
        assert_eq!(after.deregistrations, 1, "dropping the region deregisters it");

        // Writable mappings write the file.
        let rw = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut m = Region::map_file(&ctx, &rw, 4096, 10, Access::RemoteReadWrite).unwrap();
        m.as_mut_slice().copy_from_slice(b"0123456789");
        drop(m);
        assert_eq!(&std::fs::read(&path).unwrap()[4096..4106], b"0123456789");

        // Ranges outside the file, empty ranges, and a writable mapping of
        // a read-only descriptor are refused.
        assert!(Region::map_file(&ctx, &ro, 99_000, 2000, Access::Local).is_err());
        assert!(Region::map_file(&ctx, &ro, u64::MAX, 1, Access::Local).is_err());
        assert!(Region::map_file(&ctx, &ro, 0, 0, Access::Local).is_err());
        assert!(matches!(Region::map_file(&ctx, &ro, 0, 10, Access::RemoteWrite), Err(Error::Os { .. })));
    }

    #[test]
    fn own_keys_pass_and_foreign_shapes_fail() {
        let ctx = Context::new(&crate::ContextOptions::default()).unwrap();
        let shape = KeyShape::learn(&ctx);
        let r = Region::allocate(&ctx, 8192, Access::RemoteWrite).unwrap();
        let framed = r.pack_key().unwrap();
        let (base, len, k) = unframe_key(&framed).unwrap();
        assert_eq!((base, len), (r.addr(), 8192));
        shape.check(k).unwrap();
        let mut wrong_type = k.to_vec();
        wrong_type[8] = 3;
        assert!(shape.check(&wrong_type).is_err());
        let mut foreign = k.to_vec();
        foreign[7] |= 0x80; // memory domain 63
        assert!(shape.check(&foreign).is_err());
    }

    #[test]
    fn frames_refuse_missing_tags_and_empty_or_wrapping_windows() {
        let k = frame_key(0x1000, 4096, vec![1, 2, 3]);
        assert_eq!(unframe_key(&k).unwrap(), (0x1000, 4096, &[1u8, 2, 3][..]));
        assert!(unframe_key(&k[..KEY_HEADER - 1]).is_err());
        assert!(unframe_key(&[0u8; 40]).is_err(), "an untagged (bare UCX) key");
        assert!(unframe_key(&frame_key(0x1000, 0, vec![1])).is_err(), "an empty window");
        assert!(unframe_key(&frame_key(u64::MAX - 10, 11, vec![1])).is_err(), "a window past the address space");
        assert!(unframe_key(&frame_key(u64::MAX - 10, 10, vec![1])).is_ok());
    }

    /// Keys of memory UCX allocated name a shared-memory segment (a System V
    /// shmid here) that a peer would map and write with no bound; the part
    /// is removed before unpacking, and the memory is still reached (by
    /// cma), inside the window only.
    #[test]
    fn mapped_parts_are_removed_and_rma_stays_inside_the_window() {
        let ctx = Context::new(&crate::ContextOptions::default()).unwrap();
        let shape = ctx.key_shape().clone();
        let dst = Region::allocate(&ctx, 64 << 10, Access::RemoteReadWrite).unwrap();
        let framed = dst.pack_key().unwrap();
        let (_, _, ucx) = unframe_key(&framed).unwrap();
        let named = parse_key(ucx).unwrap().1.iter().filter(|(md, _)| shape.mapped & (1 << md) != 0).count() as u64;
        assert!(named > 0, "this UCX allocates shared memory that its keys name (learned mask {:#x})", shape.mapped);
        let (stripped, dropped) = shape.without_mapped_parts(ucx, (dst.addr(), 64 << 10), &[]).unwrap();
        assert_eq!(dropped, named);
        assert!(parse_key(&stripped).unwrap().1.iter().all(|(md, _)| shape.mapped & (1 << md) == 0));
        shape.check(&stripped).unwrap();
        // A key naming nothing but a mapped domain is refused outright.
        let only: Vec<u8> = {
            let (mt, parts) = parse_key(ucx).unwrap();
            let (md, size) = *parts.iter().find(|(md, _)| shape.mapped & (1 << md) != 0).unwrap();
            let mut p = 9usize;
            for (m, s) in &parts {
                if *m == md {
                    break;
                }
                p += 1 + *s as usize;
            }
            let mut v = (1u64 << md).to_le_bytes().to_vec();
            v.push(mt);
            v.extend_from_slice(&ucx[p..p + 1 + size as usize]);
            v
        };
        assert!(shape.without_mapped_parts(&only, (dst.addr(), 64 << 10), &[]).is_err());
        // The creator of the segment may keep its System V part, for a
        // window inside the segment only.
        assert!(shape.sysv.is_some(), "the System V key layout was confirmed on this host");
        let me = [std::process::id()];
        assert_eq!(shape.without_mapped_parts(ucx, (dst.addr(), 64 << 10), &me).unwrap().1, named - 1);
        assert_eq!(shape.without_mapped_parts(ucx, (dst.addr(), 64 << 20), &me).unwrap().1, named);
        assert_eq!(shape.without_mapped_parts(ucx, (dst.addr() - 4096, 4096), &me).unwrap().1, named);
        assert_eq!(shape.without_mapped_parts(ucx, (dst.addr(), 64 << 10), &[1]).unwrap().1, named);

        let w = crate::Worker::new(&ctx).unwrap();
        let ep = w.connect_address(&w.address().unwrap(), crate::ErrMode::None).unwrap();
        let before = ctx.stats().snapshot();
        let rkey = Rc::new(ep.unpack_key(&framed).unwrap());
        assert_eq!(ctx.stats().snapshot().since(&before).key_parts_unmapped, named);
        assert_eq!(rkey.window(), (dst.addr(), 64 << 10));
        let src = std::sync::Arc::new(Region::register(&ctx, vec![7u8; 4096], Access::Local).unwrap());
        let local = || crate::Local::Region { region: src.clone(), offset: 0, len: 4096 };
        // Inside the window: done, through the remaining domains.
        let put = ep.put(local(), dst.addr() + 60 * 1024, &rkey).unwrap();
        put_and_flush(&w, &ep, &put);
        assert!(dst.as_slice()[60 * 1024..].iter().all(|&b| b == 7));
        // One byte past the end, before the start, or wrapping: refused
        // before UCX is asked, and counted.
        for addr in [dst.addr() + 60 * 1024 + 1, dst.addr() - 1, u64::MAX - 100] {
            assert!(ep.put(local(), addr, &rkey).is_err(), "put at {addr:#x} outside the window was accepted");
            assert!(ep.get(crate::Local::Bytes(vec![0; 4096]), addr, &rkey).is_err());
        }
        assert_eq!(ctx.stats().snapshot().since(&before).rma_outside_window, 6);
        drop((put, rkey, ep));
    }
}
