//! Memory for zero-copy I/O (DAFS's memory registration).
//!
//! Two kinds, one handle type:
//! - `dafne_mem_alloc`: memory UCX allocates and registers. The io servers
//!   put and get straight into it (on one host a shared-memory segment they
//!   map, across hosts memory registered with the NIC): zero copies, no
//!   registration per request. The kind to use for bulk I/O.
//! - `dafne_mem_register`: the application's own memory, described once.
//!   Its I/O goes through the client's registration cache (registered once
//!   per buffer, from 256 KiB up) where the io servers can reach it, which
//!   on one host they cannot (UCX 1.13 would reach ordinary memory only by
//!   RMA emulated over messages this process must answer): there, and for
//!   small transfers, it takes one copy through a bounce buffer. The
//!   counters of `dafne_get_stats` show which path a transfer took.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use ::dafne_client::data::RegionSlice;
use ::dafne_client::Errno;
use dafne_proto::io::Stability;
use dafne_transport::{Access, Region};

use crate::{client, dafne_client, guard, guard_int, handle, put, release};

const MEM_TAG: u64 = 0xDAF0_3E30_0000_0001;

/// Memory for I/O: allocated by this library, or the application's own.
/// Opaque to C.
///
/// `#[repr(C)]` for the tag's place only: cbindgen is told to skip it
/// (`cbindgen.toml` declares it opaque), so C sees no field.
/// cbindgen:ignore
#[repr(C)]
#[derive(Debug)]
pub struct dafne_mem {
    tag: AtomicU64,
    pub(crate) kind: Kind,
}
// The tag is the first word, so a check reads the first 8 bytes of
// whatever it is given, however the other fields change.
const _: () = assert!(std::mem::offset_of!(dafne_mem, tag) == 0);

#[derive(Debug)]
pub(crate) enum Kind {
    /// Allocated and registered by UCX.
    Region(Arc<Region>),
    /// The application's memory: address and length.
    User { addr: usize, len: usize },
}

impl dafne_mem {
    fn len(&self) -> usize {
        match &self.kind {
            Kind::Region(r) => r.len(),
            Kind::User { len, .. } => *len,
        }
    }

    fn addr(&self) -> usize {
        match &self.kind {
            Kind::Region(r) => r.addr() as usize,
            Kind::User { addr, .. } => *addr,
        }
    }

    /// `[offset, offset + len)` of this memory, or `EINVAL` past its end.
    pub(crate) fn range(&self, offset: usize, len: usize) -> Result<(), Errno> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// The allocated region's slice `[offset, offset + len)`.
    pub(crate) fn slice(&self, offset: usize, len: usize) -> Option<RegionSlice> {
        match &self.kind {
            Kind::Region(r) => Some(RegionSlice { region: r.clone(), offset, len }),
            Kind::User { .. } => None,
        }
    }
}

/// The memory handle behind `m`.
///
/// # Safety
/// As [`handle`].
pub(crate) unsafe fn mem<'a>(m: *const dafne_mem) -> Result<&'a dafne_mem, Errno> {
    // SAFETY: the caller's contract is `handle`'s.
    unsafe { handle(m, &|m: &dafne_mem| &m.tag, MEM_TAG) }
}

fn boxed(kind: Kind) -> *mut dafne_mem {
    Box::into_raw(Box::new(dafne_mem { tag: AtomicU64::new(MEM_TAG), kind }))
}

/// Allocates `len` bytes the io servers read and write directly
/// (zero-copy). `dafne_mem_addr` gives the address; release with
/// `dafne_mem_free`. The memory may outlive the client.
///
/// Errors: `-EINVAL` for `len == 0`; `-ENOMEM` for more than half of the
/// machine's available memory (MemAvailable of `/proc/meminfo`; where that
/// cannot be read, more than `isize::MAX`), refused before anything is
/// allocated, or if UCX cannot allocate or register it. The bound is there
/// because on one host UCX allocates in `/dev/shm`, where a huge request
/// fills the machine's memory and wakes the OOM killer before failing.
///
/// # Safety
/// `c` is a client handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_mem_alloc(c: *const dafne_client, len: usize, out: *mut *mut dafne_mem) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { client(c)? };
        if out.is_null() || len == 0 {
            return Err(Errno::EINVAL);
        }
        if len > alloc_bound(::dafne_client::machine::available_bytes()) {
            return Err(Errno::ENOMEM);
        }
        let r = c.fs.data.allocate(len, Access::RemoteReadWrite)?;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, boxed(Kind::Region(Arc::new(r)))) }
    })
}

/// The kernel's MemAvailable in bytes (free memory plus what the page
/// cache would give back), `None` where `/proc/meminfo` cannot be read.
/// The largest `dafne_mem_alloc`: half of `available`, or `isize::MAX`
/// (what no allocation can exceed anyway) where it is unknown.
fn alloc_bound(available: Option<u64>) -> usize {
    match available {
        Some(a) => usize::try_from(a / 2).unwrap_or(usize::MAX).min(isize::MAX as usize),
        None => isize::MAX as usize,
    }
}

/// Describes `len` bytes of the application's memory at `addr` for I/O
/// (see the module docs for when it is zero-copy). The memory must stay
/// mapped until `dafne_mem_free`, and must not be touched by the
/// application while an operation posted on it is outstanding.
///
/// # Safety
/// `c` is a client handle; `addr` is valid for reads and writes of `len`
/// bytes until the handle is freed; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_mem_register(
    c: *const dafne_client,
    addr: *mut c_void,
    len: usize,
    out: *mut *mut dafne_mem,
) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        unsafe { client(c)? };
        if addr.is_null() || out.is_null() || len == 0 || len > isize::MAX as usize {
            return Err(Errno::EINVAL);
        }
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, boxed(Kind::User { addr: addr as usize, len })) }
    })
}

/// The first byte of the memory (NULL for a bad handle).
///
/// # Safety
/// `m` is a memory handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_mem_addr(m: *const dafne_mem) -> *mut c_void {
    // SAFETY: the caller's contract.
    match std::panic::catch_unwind(|| unsafe { mem(m) }.map(|m| m.addr())) {
        Ok(Ok(a)) => a as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

/// The memory's length in bytes (0 for a bad handle).
///
/// # Safety
/// `m` is a memory handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_mem_len(m: *const dafne_mem) -> usize {
    // SAFETY: the caller's contract.
    match std::panic::catch_unwind(|| unsafe { mem(m) }.map(|m| m.len())) {
        Ok(Ok(n)) => n,
        _ => 0,
    }
}

/// Releases a memory handle (allocated memory is freed once no posted
/// operation uses it any more; the application's own memory is left as
/// it is).
///
/// # Safety
/// `m` is NULL or a memory handle not yet released.
#[no_mangle]
pub unsafe extern "C" fn dafne_mem_free(m: *mut dafne_mem) -> c_int {
    // SAFETY: the caller's contract is `release`'s.
    guard_int(|| unsafe { release(m, |m: &dafne_mem| &m.tag, MEM_TAG) })
}

/// Reads up to `len` bytes at file `offset` of `fd` into the memory `m` at
/// `mem_offset`: the number read (short at the end of the file). Zero-copy
/// on `dafne_mem_alloc` memory.
///
/// # Safety
/// `c` is a client handle, `m` a memory handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_pread_mem(
    c: *const dafne_client,
    fd: c_int,
    m: *const dafne_mem,
    mem_offset: usize,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, m) = unsafe { (client(c)?, mem(m)?) };
        m.range(mem_offset, len)?;
        let o = c.readable(fd)?;
        if let Some(s) = m.slice(mem_offset, len) {
            return Ok(o.file.read_region(offset, &s)? as i64);
        }
        // SAFETY: registered memory is valid for `len` bytes from
        // `mem_offset` (checked against its length) until it is freed,
        // which the caller's contract puts after this call.
        let buf = unsafe { std::slice::from_raw_parts_mut((m.addr() + mem_offset) as *mut u8, len) };
        Ok(o.file.read_into(offset, buf)? as i64)
    })
}

/// Writes `len` bytes of the memory `m` at `mem_offset` to file `offset`
/// of `fd`: the number written. Zero-copy from `dafne_mem_alloc` memory.
///
/// # Safety
/// `c` is a client handle, `m` a memory handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_pwrite_mem(
    c: *const dafne_client,
    fd: c_int,
    m: *const dafne_mem,
    mem_offset: usize,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, m) = unsafe { (client(c)?, mem(m)?) };
        m.range(mem_offset, len)?;
        let o = c.writable(fd)?;
        if let Some(s) = m.slice(mem_offset, len) {
            return Ok(o.file.write_region(offset, &s, Stability::Unstable)? as i64);
        }
        // SAFETY: as in `dafne_pread_mem`, for reads.
        let buf = unsafe { std::slice::from_raw_parts((m.addr() + mem_offset) as *const u8, len) };
        Ok(o.file.write_from(offset, buf, Stability::Unstable)? as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_foreign_memory_handles_are_refused() {
        // SAFETY: NULL and a foreign object are what is tested.
        unsafe {
            assert!(dafne_mem_addr(std::ptr::null()).is_null());
            assert_eq!(dafne_mem_len(std::ptr::null()), 0);
            assert_eq!(dafne_mem_free(std::ptr::null_mut()), -22);
            let fake = [0u64; 8];
            assert!(std::mem::size_of::<dafne_mem>() <= std::mem::size_of_val(&fake));
            let p = fake.as_ptr() as *mut dafne_mem;
            assert!(dafne_mem_addr(p).is_null());
            assert_eq!(dafne_mem_free(p), -9);
            let mut m = std::ptr::null_mut();
            let mut buf = [0u8; 8];
            assert_eq!(dafne_mem_register(std::ptr::null(), buf.as_mut_ptr().cast(), 8, &mut m), -22);
        }
    }

    #[test]
    fn the_allocation_bound_is_half_of_mem_available() {
        let meminfo = "MemTotal:       24684136 kB\nMemFree:  748000 kB\nMemAvailable:   22720512 kB\n";
        assert_eq!(::dafne_client::machine::parse_available_bytes(meminfo), Some(22720512 * 1024));
        assert_eq!(alloc_bound(Some(8 << 30)), 4 << 30);
        assert_eq!(alloc_bound(None), isize::MAX as usize);
        assert_eq!(alloc_bound(Some(u64::MAX)), isize::MAX as usize);
    }

    #[test]
    fn a_range_past_the_memory_is_einval() {
        let m = dafne_mem { tag: AtomicU64::new(MEM_TAG), kind: Kind::User { addr: 4096, len: 100 } };
        assert_eq!(m.range(0, 100), Ok(()));
        assert_eq!(m.range(50, 51), Err(Errno::EINVAL));
        assert_eq!(m.range(usize::MAX, 2), Err(Errno::EINVAL));
    }
}
