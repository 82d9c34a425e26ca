//! `libdafne`: the client library's C ABI, in the shape of the DAFS API
//! (`../shared/seeds/`): a client handle opened from a cluster file, files
//! as integer descriptors, memory registered for zero-copy I/O, and
//! asynchronous reads and writes posted to completion queues that the
//! application polls or waits on (one ticket, or any).
//!
//! # Why a C ABI
//! An application that links `libdafne` moves data between its own memory
//! and the io servers with no kernel and no mount in between: the io
//! servers put and get the bytes by RMA straight from memory the
//! application allocated with [`dafne_mem_alloc`]. Every language with a C
//! FFI reaches the file system that way.
//!
//! # Conventions (the header repeats them)
//! - Every function returns `0`, a byte count or a ticket (`>= 0`) on
//!   success and `-errno` on failure (`-ENOENT`, `-EBADF`, …); `errno`
//!   itself is never set.
//! - A NULL handle or pointer argument is `-EINVAL`; a pointer to a freed or
//!   foreign object is caught by a tag in each handle where the memory is
//!   still readable (`-EBADF`), but, as with `free(3)`, using a handle after
//!   it was released is undefined.
//! - A panic never crosses the boundary: it is caught and reported as
//!   `-EIO`.
//! - Every handle may be used from several threads at once.
//!
//! # Layout
//! `lib.rs` holds the handle checks, the client and the counters;
//! [`fs`](crate::fs) the namespace and file descriptors; [`mem`] the
//! memory for zero-copy I/O; [`cq`] completion queues and posted I/O.
//! The header `include/dafne.h` is generated from these files by cbindgen
//! (the `header` test fails when it drifts, and says how to refresh it).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ::dafne_client::cluster::{Cluster, OpenOptions};
use ::dafne_client::file::Fs;
use ::dafne_client::Errno;

pub mod cq;
pub mod fs;
pub mod mem;

/// The ABI's version: bumped when a function or a struct of the header
/// changes incompatibly.
pub const DAFNE_ABI_VERSION: u32 = 1;

/// Tags that mark live handles (and, once released, dead ones).
const CLIENT_TAG: u64 = 0xDAF0_C11E_0000_0001;
const DEAD_TAG: u64 = 0xDAF0_DEAD_DEAD_DEAD;

/// A client of one cluster: a metadata session and the io servers, and the
/// table of its open files. Opaque to C.
///
/// `#[repr(C)]` for the tag's place only: cbindgen is told to skip it
/// (`cbindgen.toml` declares it opaque), so C sees no field.
/// cbindgen:ignore
#[repr(C)]
#[derive(Debug)]
pub struct dafne_client {
    tag: AtomicU64,
    // Boxed, so that every handle is a small object whose tag a check can
    // read whatever kind of handle it was given.
    inner: Box<Client>,
}
// The tag is the first word, so a check reads the first 8 bytes of
// whatever it is given, however the other fields change.
const _: () = assert!(std::mem::offset_of!(dafne_client, tag) == 0);

/// What a client handle holds.
pub struct Client {
    // Fields drop in this order: open files close in meta first, and the
    // runtime the sessions run on (inside `cluster`) goes last.
    pub(crate) files: Mutex<fs::Files>,
    pub(crate) fs: Fs,
    /// Held for the runtime the sessions run on.
    cluster: Cluster,
}

impl std::ops::Deref for dafne_client {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.inner
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("cluster", &self.cluster).finish_non_exhaustive()
    }
}

// The header promises that every handle may be used from several threads
// at once: what the handles hold must be shareable.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Fs>();
    shared::<Mutex<fs::Files>>();
    shared::<mem::dafne_mem>();
    shared::<cq::dafne_cq>();
};

/// Counters of the data path (see `dafne_get_stats`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct dafne_stats {
    /// Bytes this client copied between application memory and requests,
    /// replies or its bounce buffers (I/O from plain buffers below the
    /// zero-copy threshold, or where the io servers cannot reach them).
    /// I/O from `dafne_mem_alloc` memory adds nothing.
    pub client_bytes_copied: u64,
    /// Registrations this client's registration cache made for
    /// application buffers.
    pub client_registrations: u64,
    /// Bytes the io servers copied on their data path, summed.
    pub server_bytes_copied: u64,
    /// Memory registrations the io servers made after start-up, summed.
    pub server_registrations: u64,
    /// Io servers of the cluster.
    pub io_servers: u32,
    /// Io servers that answered (the server counters cover only these).
    pub io_servers_answering: u32,
}

/// Runs an FFI body: its `Err(errno)` becomes `-errno`, a panic `-EIO`.
pub(crate) fn guard(f: impl FnOnce() -> Result<i64, Errno>) -> i64 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => -i64::from(e.0),
        Err(_) => -i64::from(Errno::EIO.0),
    }
}

/// [`guard`] for the functions that return `int` (0 or `-errno`).
pub(crate) fn guard_int(f: impl FnOnce() -> Result<(), Errno>) -> c_int {
    // A result of `f` is 0 or a negated errno, which fits an int.
    guard(|| f().map(|()| 0)) as c_int
}

/// A live handle behind `p`, or `EINVAL` (NULL) / `EBADF` (misaligned, or
/// not tagged `tag`).
///
/// # Safety
/// `p` is NULL or points to readable memory of at least a `T` (the
/// header's contract: a handle this library gave and did not release).
pub(crate) unsafe fn handle<'a, T>(p: *const T, tag: &impl Fn(&T) -> &AtomicU64, want: u64) -> Result<&'a T, Errno> {
    if p.is_null() {
        return Err(Errno::EINVAL);
    }
    if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Errno::EBADF);
    }
    // SAFETY: non-NULL and aligned; the caller guarantees the memory holds
    // a `T` this library made (the tag check below catches a released one
    // whose memory was not yet reused, and a handle of another kind).
    let h = unsafe { &*p };
    if tag(h).load(Ordering::Acquire) != want {
        return Err(Errno::EBADF);
    }
    Ok(h)
}

/// Releases a boxed handle: its tag is swapped to dead first, so two
/// releases racing (or a second one before the memory is reused) are
/// `EBADF` rather than a double free.
///
/// # Safety
/// As [`handle`]; `p` came from `Box::into_raw`.
pub(crate) unsafe fn release<T>(p: *mut T, tag: impl Fn(&T) -> &AtomicU64, want: u64) -> Result<(), Errno> {
    // SAFETY: the caller's contract is `handle`'s.
    let h = unsafe { handle(p as *const T, &tag, want)? };
    tag(h).compare_exchange(want, DEAD_TAG, Ordering::AcqRel, Ordering::Acquire).map_err(|_| Errno::EBADF)?;
    // SAFETY: `p` came from `Box::into_raw` (the tag says it is one of
    // ours) and this call won the tag, so no other release frees it.
    drop(unsafe { Box::from_raw(p) });
    Ok(())
}

/// The client behind `c`.
///
/// # Safety
/// As [`handle`].
pub(crate) unsafe fn client<'a>(c: *const dafne_client) -> Result<&'a dafne_client, Errno> {
    // SAFETY: the caller's contract is `handle`'s.
    unsafe { handle(c, &|c: &dafne_client| &c.tag, CLIENT_TAG) }
}

/// A C string argument as UTF-8 (`EINVAL` for NULL or other bytes).
///
/// # Safety
/// `s` is NULL or a NUL-terminated string readable for the call.
pub(crate) unsafe fn string<'a>(s: *const c_char) -> Result<&'a str, Errno> {
    if s.is_null() {
        return Err(Errno::EINVAL);
    }
    // SAFETY: non-NULL, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }.to_str().map_err(|_| Errno::EINVAL)
}

/// Stores `v` through the out pointer `out` (`EINVAL` for NULL).
///
/// # Safety
/// `out` is NULL or valid for a write of a `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> Result<(), Errno> {
    if out.is_null() {
        return Err(Errno::EINVAL);
    }
    // SAFETY: non-NULL, and writable by the caller's contract; `write`
    // drops nothing that was there (plain C data or an uninitialised slot).
    unsafe { out.write(v) };
    Ok(())
}

/// Opens a client on a running cluster: `cluster` is a cluster directory
/// (as `dafne up --dir` takes) or its `cluster.json`; `credential` is a
/// per-client credential file (`dafne credential issue`), or NULL to log in
/// with the cluster secret the cluster file names. The session acts as
/// this process's user and group. On success `*out` is the client; release
/// it with `dafne_close_client`.
///
/// Errors: `-ENOENT` no cluster file there (is the cluster up?),
/// `-EACCES` the secret or credential is unreadable or refused, `-EINVAL`
/// a damaged cluster file or a NULL argument, `-EIO` a server unreachable.
///
/// # Safety
/// `cluster` and `credential` (unless NULL) are NUL-terminated strings;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_open_client(
    cluster: *const c_char,
    credential: *const c_char,
    out: *mut *mut dafne_client,
) -> c_int {
    guard_int(|| {
        if out.is_null() {
            return Err(Errno::EINVAL);
        }
        // SAFETY: the caller's contract for `cluster`.
        let dir = unsafe { string(cluster)? };
        let mut o = OpenOptions::new(dir, &format!("libdafne-{}", std::process::id()));
        if !credential.is_null() {
            // SAFETY: non-NULL: the caller's contract for `credential`.
            o.credential = Some(PathBuf::from(unsafe { string(credential)? }));
        }
        let cluster = Cluster::open(&o).map_err(|e| e.errno())?;
        let fs = Fs { meta: cluster.meta.clone(), data: cluster.data.clone() };
        let inner = Box::new(Client { files: Mutex::new(fs::Files::default()), fs, cluster });
        let c = Box::new(dafne_client { tag: AtomicU64::new(CLIENT_TAG), inner });
        // SAFETY: `out` is writable by the caller's contract (checked
        // non-NULL above).
        unsafe { put(out, Box::into_raw(c)) }
    })
}

/// Releases a client: its files still open are closed (in meta too, but
/// without publishing sizes: close them with `dafne_close` first), and its
/// connections end. Completion queues with operations of this client still
/// outstanding must be drained first.
///
/// # Safety
/// `c` is NULL or a client this library gave and not yet released.
#[no_mangle]
pub unsafe extern "C" fn dafne_close_client(c: *mut dafne_client) -> c_int {
    // SAFETY: the caller's contract is `release`'s.
    guard_int(|| unsafe { release(c, |c: &dafne_client| &c.tag, CLIENT_TAG) })
}

/// Fills `*out` with the data path's counters: this client's copies and
/// registrations, and the io servers' (asked now, one request each).
///
/// # Safety
/// `c` is a client handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_get_stats(c: *const dafne_client, out: *mut dafne_stats) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { client(c)? };
        if out.is_null() {
            return Err(Errno::EINVAL);
        }
        let data = &c.fs.data;
        let mut s = dafne_stats {
            client_bytes_copied: data.bytes_copied(),
            client_registrations: data.regcache_stats().registrations,
            io_servers: data.server_count() as u32,
            ..Default::default()
        };
        let infos = futures::executor::block_on(data.all_server_info(::dafne_client::data::LOGGED_IN));
        for i in infos.into_iter().flatten() {
            s.io_servers_answering += 1;
            s.server_bytes_copied += i.bytes_copied;
            s.server_registrations += i.registrations;
        }
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, s) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(e: Errno) -> c_int {
        -e.0
    }

    #[test]
    fn a_panic_becomes_eio_and_an_errno_its_negation() {
        assert_eq!(guard(|| panic!("boom")), -5);
        assert_eq!(guard(|| Err(Errno::ENOENT)), -2);
        assert_eq!(guard(|| Ok(7)), 7);
    }

    #[test]
    fn opening_without_a_cluster_says_enoent_and_null_arguments_einval() {
        let dir = std::env::temp_dir().join(format!("dafne-c-noclu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let mut c: *mut dafne_client = std::ptr::null_mut();
        // SAFETY: valid strings and out pointer.
        assert_eq!(unsafe { dafne_open_client(path.as_ptr(), std::ptr::null(), &mut c) }, errno(Errno::ENOENT));
        assert!(c.is_null());
        // SAFETY: NULL arguments are what is tested.
        assert_eq!(unsafe { dafne_open_client(std::ptr::null(), std::ptr::null(), &mut c) }, errno(Errno::EINVAL));
        // SAFETY: as above.
        assert_eq!(unsafe { dafne_open_client(path.as_ptr(), std::ptr::null(), std::ptr::null_mut()) }, -22);
        std::fs::write(dir.join("cluster.json"), "{").unwrap();
        // SAFETY: valid strings and out pointer.
        assert_eq!(unsafe { dafne_open_client(path.as_ptr(), std::ptr::null(), &mut c) }, errno(Errno::EINVAL));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn null_and_foreign_client_handles_are_refused() {
        // SAFETY: NULL is what is tested.
        assert_eq!(unsafe { dafne_close_client(std::ptr::null_mut()) }, errno(Errno::EINVAL));
        // A readable, aligned object that is no client: its tag does not
        // match.
        let mut fake = [0u64; 8];
        assert!(std::mem::size_of::<dafne_client>() <= std::mem::size_of_val(&fake));
        let p = fake.as_mut_ptr() as *mut dafne_client;
        let mut s = dafne_stats::default();
        // SAFETY: `p` points to readable memory the size of a client.
        assert_eq!(unsafe { dafne_get_stats(p, &mut s) }, errno(Errno::EBADF));
        // SAFETY: as above (the tag check refuses before anything is freed).
        assert_eq!(unsafe { dafne_close_client(p) }, errno(Errno::EBADF));
        // Misaligned.
        let odd = (fake.as_ptr() as usize + 1) as *mut dafne_client;
        // SAFETY: refused on alignment before any read.
        assert_eq!(unsafe { dafne_close_client(odd) }, errno(Errno::EBADF));
    }
}
