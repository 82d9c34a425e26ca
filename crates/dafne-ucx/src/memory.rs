//! Registered memory and remote keys.
//!
//! A [`Region`] is memory registered with the context's memory domains
//! (`ucp_mem_map`) with explicit access rights. Either UCX allocates it
//! ([`Region::allocate`], which on one host gives shared-memory segments that
//! peers map directly) or the caller hands over a buffer ([`Region::register`],
//! which pins the caller's memory). Either way the region owns its memory, so
//! the memory cannot be freed while it is registered.
//!
//! A packed key ([`Region::pack_key`]) is plain bytes that travel inside a
//! message; the peer turns them into a [`RemoteKey`] bound to its endpoint.

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
        let local = sys::UCP_MEM_MAP_PROT_LOCAL_READ | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE;
        local
            | match self {
                Access::Local => 0,
                Access::RemoteRead => sys::UCP_MEM_MAP_PROT_REMOTE_READ,
                Access::RemoteWrite => sys::UCP_MEM_MAP_PROT_REMOTE_WRITE,
                Access::RemoteReadWrite => {
                    sys::UCP_MEM_MAP_PROT_REMOTE_READ | sys::UCP_MEM_MAP_PROT_REMOTE_WRITE
                }
            }
    }
}

enum Backing {
    /// UCX allocated the memory (`UCP_MEM_MAP_ALLOCATE`); unmap frees it.
    Ucx,
    /// The caller's buffer, pinned while registered and returned on `into_vec`.
    Owned(Vec<u8>),
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

// SAFETY: a Region owns its memory and its memh; UCX's context lock (the
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
            return Err(Error::Invalid {
                op: "ucp_mem_map",
                reason: "cannot register an empty region".into(),
            });
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
        let mut region = Region {
            ctx: ctx.clone(),
            memh,
            addr,
            len,
            access,
            backing: Backing::Ucx,
        };
        region.as_mut_slice().fill(0);
        Ok(region)
    }

    /// Registers a caller's buffer in place (no copy); the buffer comes back
    /// from [`Region::into_vec`] after deregistration.
    pub fn register(ctx: &Context, mut buf: Vec<u8>, access: Access) -> Result<Region> {
        if buf.is_empty() {
            return Err(Error::Invalid {
                op: "ucp_mem_map",
                reason: "cannot register an empty buffer".into(),
            });
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
        Ok(Region {
            ctx: ctx.clone(),
            memh,
            addr,
            len,
            access,
            backing: Backing::Owned(buf),
        })
    }

    /// Deregisters and gives back the caller's buffer (`None` for UCX memory).
    pub fn into_vec(mut self) -> Option<Vec<u8>> {
        self.unmap();
        match std::mem::replace(&mut self.backing, Backing::Ucx) {
            Backing::Owned(v) => {
                // Already unmapped: make Drop a no-op.
                self.memh = ptr::null_mut();
                Some(v)
            }
            Backing::Ucx => None,
        }
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
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self gives exclusive access on
        // the Rust side.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }

    /// Packs a remote key that lets a peer reach this region with the
    /// region's access rights. The bytes can be sent in any message.
    pub fn pack_key(&self) -> Result<Vec<u8>> {
        let mut buf: *mut std::ffi::c_void = ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: context and memh are live; buf/size are out-pointers.
        check("ucp_rkey_pack", unsafe {
            sys::ucp_rkey_pack(self.ctx.inner.h, self.memh, &mut buf, &mut size)
        })?;
        // SAFETY: UCX returned a buffer of `size` bytes that we copy then release.
        let out = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: buf came from ucp_rkey_pack and is released once.
        unsafe { sys::ucp_rkey_buffer_release(buf) };
        Ok(out)
    }

    fn unmap(&mut self) {
        if self.memh.is_null() {
            return;
        }
        let t = Instant::now();
        // SAFETY: memh is a live mapping of this context; after this call the
        // handle is nulled so it is never used again.
        let st = unsafe { sys::ucp_mem_unmap(self.ctx.inner.h, self.memh) };
        debug_assert_eq!(st, sys::UCS_OK as sys::ucs_status_t, "ucp_mem_unmap");
        self.memh = ptr::null_mut();
        let s = &self.ctx.inner.stats;
        Stats::add(&s.deregistrations, 1);
        Stats::add(&s.deregistration_ns, t.elapsed().as_nanos() as u64);
    }
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
    check("ucp_mem_map", unsafe {
        sys::ucp_mem_map(ctx.inner.h, params, &mut memh)
    })?;
    let mut attr = sys::ucp_mem_attr_t {
        field_mask: (sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH) as u64,
        ..Default::default()
    };
    // SAFETY: memh was just created; attr is an out-struct.
    let q = check("ucp_mem_query", unsafe {
        sys::ucp_mem_query(memh, &mut attr)
    });
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

/// Largest packed key accepted from a peer (UCX 1.13 packs ~20-200 bytes).
pub const MAX_PACKED_KEY: usize = 4096;
const UNPACK_SLACK: usize = 8 + 1 + 64 * 256;

/// A peer's packed key unpacked on one endpoint. Holds the endpoint, so the
/// key is always destroyed before the endpoint is closed.
pub struct RemoteKey {
    pub(crate) h: sys::ucp_rkey_h,
    pub(crate) ep: Rc<EpInner>,
}

impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteKey").field("h", &self.h).finish()
    }
}

impl RemoteKey {
    pub(crate) fn unpack(ep: Rc<EpInner>, packed: &[u8]) -> Result<RemoteKey> {
        if packed.is_empty() {
            return Err(Error::Invalid {
                op: "ucp_ep_rkey_unpack",
                reason: "empty packed key".into(),
            });
        }
        if packed.len() > MAX_PACKED_KEY {
            return Err(Error::Invalid {
                op: "ucp_ep_rkey_unpack",
                reason: format!(
                    "packed key of {} bytes exceeds the {MAX_PACKED_KEY}-byte limit",
                    packed.len()
                ),
            });
        }
        // ucp_ep_rkey_unpack takes no length: it walks the buffer by the sizes
        // written inside it. A hostile or truncated key could send it past the
        // end of `packed`, so the bytes are copied into a zeroed buffer large
        // enough for the largest layout UCX can describe (a 64-bit md map,
        // a memory type, then per md a 1-byte size and up to 255 bytes).
        let mut padded = vec![0u8; packed.len() + UNPACK_SLACK];
        padded[..packed.len()].copy_from_slice(packed);
        let t = Instant::now();
        let mut h: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: the endpoint is live (we hold it); `padded` is readable for
        // every offset UCX's parser can reach (see above). A hostile buffer
        // may make UCX return an error status, which we propagate.
        check("ucp_ep_rkey_unpack", unsafe {
            sys::ucp_ep_rkey_unpack(ep.handle()?, padded.as_ptr().cast(), &mut h)
        })?;
        let s = &ep.worker.ctx.inner.stats;
        Stats::add(&s.rkey_unpacks, 1);
        Stats::add(&s.rkey_unpack_ns, t.elapsed().as_nanos() as u64);
        Ok(RemoteKey { h, ep })
    }
}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        // SAFETY: the key was unpacked on `ep`, which this struct keeps alive,
        // and is destroyed exactly once.
        unsafe { sys::ucp_rkey_destroy(self.h) };
    }
}
