//! `libdafne_preload.so`: an `LD_PRELOAD` interception library. Unmodified
//! programs read and write files under a dafne mount through the client
//! library, by RMA between their own buffers and the io servers, with no
//! kernel and no FUSE on the data path; everything else goes to the real C
//! library, and the FUSE mount underneath serves what the library does
//! not handle. This is the ORFA side of the ORFA/ORFS pair of seed 002
//! (user-level access beside the kernel client), and the user-level file
//! system of seed 001 (DAFS) for programs that were not written for it.
//!
//! # The shadow descriptor
//! Every file the library serves is also opened by the real C library on
//! the FUSE mount, and the program gets that kernel descriptor: the open's
//! checks, its errno, `O_CREAT`/`O_EXCL`/`O_TRUNC`, are the mount's, and
//! anything the library does not serve (mmap, fchmod, locks, `ioctl`,
//! `fstatfs`, a forked child, an exec'd program) works on it through FUSE,
//! so a program cannot see a difference. The library keeps a table from
//! descriptor to the dafne file ([`state`]) and serves `read`, `write`,
//! `pread`, `pwrite`, `readv`, `writev`, `preadv`, `pwritev` (and `64`
//! variants), `lseek` to the end, `fsync`, `fdatasync`, `sendfile` and
//! `copy_file_range` on it directly; `dup`, `dup2`, `dup3`, `fcntl`
//! (`F_DUPFD*`, `F_SETFL`), `close`, `close_range` and `fclose` keep the
//! table right; `fstat` (all its names), `statx`, `mmap`, `ftruncate`,
//! `fallocate` and lock calls first bring the kernel's view up to date
//! and then go to the kernel ([`state`]'s coherence rules); `fstat` of a
//! file unlinked while open overlays the size this process knows (meta no
//! longer has the inode to publish to). A stat by path (`stat`, `lstat`,
//! `fstatat`, `statx` and the `__xstat` family of programs built before
//! glibc 2.33) of a file this process wrote through the library and has
//! not published publishes it first, so `os.path.getsize`, `ls -l`,
//! `stat(1)` and `du` in the writing process see its writes, as through
//! the mount (one atomic load per stat while nothing is unpublished). `execve`,
//! `execv`, `execvp`, `execvpe`, `execveat`, `fexecve`, `posix_spawn` and
//! `posix_spawnp` publish every entry's writes before the real call.
//!
//! # Calling convention
//! `open`, `openat` and `fcntl` are variadic in C. They are defined here
//! with their widest fixed signature: on x86_64 and aarch64 Linux a
//! variadic integer or pointer argument travels in the same register as a
//! fixed one, so reading a third argument the caller did not pass yields
//! an unused value, never a fault; the library forwards it and the C
//! library reads it only when the flags say it was passed.
//!
//! # Safety
//! `unsafe` lives in this file (the exported C functions, which take the
//! caller's raw pointers under the contract of the call they replace) and
//! in [`real`] (the looked-up C functions). [`state`] and [`mounts`] are
//! safe Rust.

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
compile_error!("dafne-preload relies on the Linux x86_64/aarch64 calling convention for variadic C functions");

pub mod mounts;
pub mod real;
pub mod state;

use libc::{c_char, c_int, c_uint, c_ulong, c_void, iovec, mode_t, off_t, size_t, ssize_t};

use dafne_proto::Errno;
use state::Entry;

/// Linux's limit on a vector's length (UIO_MAXIOV).
const IOV_MAX: c_int = 1024;

fn ssize(r: Result<usize, Errno>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            real::set_errno(e.0);
            -1
        }
    }
}

/// The caller's buffer of `n` bytes, or `None` for a null pointer or an
/// impossible length (the kernel then answers, with its errno).
///
/// # Safety
/// Unless null, `p` points to `n` bytes the caller lends for the call
/// (the contract of `read(2)` and its family), not otherwise used during it.
unsafe fn buf_mut<'a>(p: *mut c_void, n: usize) -> Option<&'a mut [u8]> {
    if p.is_null() || n > isize::MAX as usize {
        return None;
    }
    // SAFETY: the function's contract.
    Some(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) })
}

/// As [`buf_mut`], read-only (`write(2)` and its family).
///
/// # Safety
/// As [`buf_mut`], for `n` readable bytes.
unsafe fn buf<'a>(p: *const c_void, n: usize) -> Option<&'a [u8]> {
    if p.is_null() || n > isize::MAX as usize {
        return None;
    }
    // SAFETY: the function's contract.
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// The caller's vector, or `None` when the kernel must judge it.
///
/// # Safety
/// Unless null, `iov` points to `n` iovecs (the contract of `readv(2)`).
unsafe fn iovecs<'a>(iov: *const iovec, n: c_int) -> Option<&'a [iovec]> {
    if iov.is_null() || !(0..=IOV_MAX).contains(&n) {
        return None;
    }
    // SAFETY: the function's contract.
    Some(unsafe { std::slice::from_raw_parts(iov, n as usize) })
}

/// Reads into each buffer of a vector in turn from `off`, as `readv`
/// does: a short piece ends it; an error after some bytes returns them.
///
/// # Safety
/// Each iovec describes writable memory the caller lends for the call.
unsafe fn readv_at(e: &Entry, off: u64, iov: &[iovec]) -> Result<usize, Errno> {
    let mut done = 0usize;
    for v in iov {
        if v.iov_len == 0 {
            continue;
        }
        // SAFETY: the function's contract.
        let b = unsafe { buf_mut(v.iov_base, v.iov_len) }.ok_or(Errno::EFAULT)?;
        match e.read_at(off + done as u64, b) {
            Ok(n) => {
                done += n;
                if n < b.len() {
                    break;
                }
            }
            Err(_) if done > 0 => break,
            Err(err) => return Err(err),
        }
    }
    Ok(done)
}

/// As [`readv_at`], writing.
///
/// # Safety
/// Each iovec describes readable memory the caller lends for the call.
unsafe fn writev_at(e: &Entry, off: u64, iov: &[iovec]) -> Result<usize, Errno> {
    let mut done = 0usize;
    for v in iov {
        if v.iov_len == 0 {
            continue;
        }
        // SAFETY: the function's contract.
        let b = unsafe { buf(v.iov_base, v.iov_len) }.ok_or(Errno::EFAULT)?;
        match e.write_at(off + done as u64, b) {
            Ok(n) => done += n,
            Err(_) if done > 0 => break,
            Err(err) => return Err(err),
        }
    }
    Ok(done)
}

// ---- open -----------------------------------------------------------------

macro_rules! open_like {
    ($name:ident, $real:ident) => {
        /// Interposed: the real open, then the table ([`state::opened`]).
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
            // SAFETY: open(2)'s arguments forwarded unchanged; the C
            // library reads the mode only when the flags say it was passed.
            let fd = unsafe { real::$real()(path, flags, mode) };
            state::opened(fd, flags);
            fd
        }
    };
}
open_like!(open, open);
open_like!(open64, open64);

macro_rules! openat_like {
    ($name:ident, $real:ident) => {
        /// Interposed: the real openat, then the table.
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
            // SAFETY: openat(2)'s arguments forwarded unchanged, as above.
            let fd = unsafe { real::$real()(dirfd, path, flags, mode) };
            state::opened(fd, flags);
            fd
        }
    };
}
openat_like!(openat, openat);
openat_like!(openat64, openat64);

macro_rules! open_2_like {
    ($name:ident, $real:ident) => {
        /// Interposed (the fortified `open` without a mode).
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int) -> c_int {
            // SAFETY: arguments forwarded unchanged.
            let fd = unsafe { real::$real()(path, flags) };
            state::opened(fd, flags);
            fd
        }
    };
}
open_2_like!(__open_2, open_2);
open_2_like!(__open64_2, open64_2);

macro_rules! openat_2_like {
    ($name:ident, $real:ident) => {
        /// Interposed (the fortified `openat` without a mode).
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
            // SAFETY: arguments forwarded unchanged.
            let fd = unsafe { real::$real()(dirfd, path, flags) };
            state::opened(fd, flags);
            fd
        }
    };
}
openat_2_like!(__openat_2, openat_2);
openat_2_like!(__openat64_2, openat64_2);

macro_rules! creat_like {
    ($name:ident, $real:ident) => {
        /// Interposed: `creat` is `open(O_CREAT | O_WRONLY | O_TRUNC)`.
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: mode_t) -> c_int {
            // SAFETY: arguments forwarded unchanged.
            let fd = unsafe { real::$real()(path, mode) };
            state::opened(fd, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC);
            fd
        }
    };
}
creat_like!(creat, creat);
creat_like!(creat64, creat64);

// ---- read and write ---------------------------------------------------------

/// Interposed: a dafne descriptor reads at its offset through the library.
///
/// # Safety
/// read(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, p: *mut c_void, count: size_t) -> ssize_t {
    if let Some(e) = state::entry(fd).filter(|e| e.readable()) {
        // SAFETY: read(2)'s contract: `p` holds `count` writable bytes.
        if let Some(b) = unsafe { buf_mut(p, count) } {
            return ssize(e.at_offset(fd, |off| e.read_at(off, b)));
        }
    }
    // SAFETY: forwarded unchanged.
    unsafe { real::read()(fd, p, count) }
}

/// Interposed: a dafne descriptor writes at its offset through the library.
///
/// # Safety
/// write(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, p: *const c_void, count: size_t) -> ssize_t {
    if let Some(e) = state::entry(fd).filter(|e| e.writable()) {
        // SAFETY: write(2)'s contract: `p` holds `count` readable bytes.
        if let Some(b) = unsafe { buf(p, count) } {
            return ssize(e.at_offset(fd, |off| e.write_at(off, b)));
        }
    }
    // SAFETY: forwarded unchanged.
    unsafe { real::write()(fd, p, count) }
}

macro_rules! pread_like {
    ($name:ident, $real:ident) => {
        /// Interposed: a dafne descriptor reads at `off` through the library.
        ///
        /// # Safety
        /// pread(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, p: *mut c_void, count: size_t, off: off_t) -> ssize_t {
            if off >= 0 {
                if let Some(e) = state::entry(fd).filter(|e| e.readable()) {
                    // SAFETY: pread(2)'s contract: `p` holds `count` writable bytes.
                    if let Some(b) = unsafe { buf_mut(p, count) } {
                        return ssize(e.read_at(off as u64, b));
                    }
                }
            }
            // SAFETY: forwarded unchanged.
            unsafe { real::$real()(fd, p, count, off) }
        }
    };
}
pread_like!(pread, pread);
pread_like!(pread64, pread64);

macro_rules! pwrite_like {
    ($name:ident, $real:ident) => {
        /// Interposed: a dafne descriptor writes at `off` through the library.
        ///
        /// # Safety
        /// pwrite(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, p: *const c_void, count: size_t, off: off_t) -> ssize_t {
            if off >= 0 {
                if let Some(e) = state::entry(fd).filter(|e| e.writable()) {
                    // SAFETY: pwrite(2)'s contract: `p` holds `count` readable bytes.
                    if let Some(b) = unsafe { buf(p, count) } {
                        return ssize(e.write_at(off as u64, b));
                    }
                }
            }
            // SAFETY: forwarded unchanged.
            unsafe { real::$real()(fd, p, count, off) }
        }
    };
}
pwrite_like!(pwrite, pwrite);
pwrite_like!(pwrite64, pwrite64);

/// Interposed: vectored read at the offset.
///
/// # Safety
/// readv(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    if let Some(e) = state::entry(fd).filter(|e| e.readable()) {
        // SAFETY: readv(2)'s contract: `iov` holds `n` iovecs.
        if let Some(v) = unsafe { iovecs(iov, n) } {
            // SAFETY: each iovec is writable memory lent for the call.
            return ssize(e.at_offset(fd, |off| unsafe { readv_at(&e, off, v) }));
        }
    }
    // SAFETY: forwarded unchanged.
    unsafe { real::readv()(fd, iov, n) }
}

/// Interposed: vectored write at the offset.
///
/// # Safety
/// writev(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    if let Some(e) = state::entry(fd).filter(|e| e.writable()) {
        // SAFETY: writev(2)'s contract: `iov` holds `n` iovecs.
        if let Some(v) = unsafe { iovecs(iov, n) } {
            // SAFETY: each iovec is readable memory lent for the call.
            return ssize(e.at_offset(fd, |off| unsafe { writev_at(&e, off, v) }));
        }
    }
    // SAFETY: forwarded unchanged.
    unsafe { real::writev()(fd, iov, n) }
}

macro_rules! preadv_like {
    ($name:ident, $real:ident, $write:expr) => {
        /// Interposed: vectored read or write at `off`.
        ///
        /// # Safety
        /// preadv(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, n: c_int, off: off_t) -> ssize_t {
            if off >= 0 {
                if let Some(e) = state::entry(fd).filter(|e| if $write { e.writable() } else { e.readable() }) {
                    // SAFETY: preadv(2)'s contract: `iov` holds `n` iovecs.
                    if let Some(v) = unsafe { iovecs(iov, n) } {
                        // SAFETY: each iovec is memory lent for the call,
                        // writable for a read.
                        let r = unsafe {
                            if $write {
                                writev_at(&e, off as u64, v)
                            } else {
                                readv_at(&e, off as u64, v)
                            }
                        };
                        return ssize(r);
                    }
                }
            }
            // SAFETY: forwarded unchanged.
            unsafe { real::$real()(fd, iov, n, off) }
        }
    };
}
preadv_like!(preadv, preadv, false);
preadv_like!(preadv64, preadv64, false);
preadv_like!(pwritev, pwritev, true);
preadv_like!(pwritev64, pwritev64, true);

macro_rules! preadv2_like {
    ($name:ident, $real:ident) => {
        /// Interposed: with flags (RWF_*), the kernel serves the call after
        /// the library brought its view up to date.
        ///
        /// # Safety
        /// preadv2(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, n: c_int, off: off_t, flags: c_int) -> ssize_t {
            let e = state::entry(fd);
            if let Some(e) = &e {
                e.sync_kernel(fd);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(fd, iov, n, off, flags) };
            if let (true, Some(e)) = (r > 0, e) {
                // A write through the kernel: the size and this process's
                // read-ahead follow (harmless after a read).
                e.resized(None);
            }
            r
        }
    };
}
preadv2_like!(preadv2, preadv2);
preadv2_like!(preadv64v2, preadv64v2);
preadv2_like!(pwritev2, pwritev2);
preadv2_like!(pwritev64v2, pwritev64v2);

macro_rules! lseek_like {
    ($name:ident, $real:ident) => {
        /// Interposed: `SEEK_END` on a dafne descriptor uses the size the
        /// library knows (writes not yet published count);
        /// `SEEK_DATA`/`SEEK_HOLE` go to the kernel after a sync; the rest
        /// is the kernel's.
        ///
        /// # Safety
        /// lseek(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, off: off_t, whence: c_int) -> off_t {
            if let Some(e) = state::entry(fd) {
                if whence == libc::SEEK_END {
                    let r = e.size().and_then(|size| {
                        let to = (size as i64).checked_add(off).filter(|&t| t >= 0).ok_or(Errno::EINVAL)?;
                        real::seek(fd, to, libc::SEEK_SET).map_err(Errno)
                    });
                    return match r {
                        Ok(p) => p as off_t,
                        Err(err) => {
                            real::set_errno(err.0);
                            -1
                        }
                    };
                }
                if whence == libc::SEEK_DATA || whence == libc::SEEK_HOLE {
                    e.sync_kernel(fd);
                }
            }
            // SAFETY: forwarded unchanged.
            unsafe { real::$real()(fd, off, whence) }
        }
    };
}
lseek_like!(lseek, lseek);
lseek_like!(lseek64, lseek64);

// ---- attributes, sync, size -------------------------------------------------

/// After a successful `fstat` of a dafne descriptor: a file unlinked while
/// open has no inode in meta to publish its size to, so the kernel keeps
/// the size of the last publish; the size this process's descriptors know
/// is overlaid (nobody else can reach the file by a name). The mount has
/// no links left for such a file (`st_nlink` 0).
///
/// # Safety
/// `st` points to the stat buffer the successful call filled.
unsafe fn overlay_unlinked(e: &Entry, st: *mut libc::stat) {
    // SAFETY: the function's contract.
    let st = unsafe { &mut *st };
    if st.st_nlink == 0 {
        let size = state::process_size(e);
        if size > st.st_size.max(0) as u64 {
            st.st_size = size as libc::off_t;
            st.st_blocks = st.st_blocks.max(size.div_ceil(512) as libc::blkcnt_t);
        }
    }
}

/// As [`overlay_unlinked`], for `statx`.
///
/// # Safety
/// `stx` points to the statx buffer the successful call filled.
unsafe fn overlay_unlinked_x(e: &Entry, stx: *mut libc::statx) {
    // SAFETY: the function's contract.
    let stx = unsafe { &mut *stx };
    if stx.stx_mask & libc::STATX_NLINK != 0 && stx.stx_nlink == 0 && stx.stx_mask & libc::STATX_SIZE != 0 {
        let size = state::process_size(e);
        if size > stx.stx_size {
            stx.stx_size = size;
            stx.stx_blocks = stx.stx_blocks.max(size.div_ceil(512));
        }
    }
}

/// After a successful stat by path: whether the file found is one this
/// process wrote through the library without publishing yet; if so, it
/// was published now and the caller stats again ([`state::publish_for_path`]).
/// One atomic load when nothing is unpublished.
///
/// # Safety
/// `st` points to the stat buffer the successful call filled.
unsafe fn published_for(st: *const libc::stat) -> bool {
    if !state::unpublished() {
        return false;
    }
    // SAFETY: the function's contract.
    let st = unsafe { &*st };
    st.st_mode & libc::S_IFMT == libc::S_IFREG && state::publish_for_path(st.st_dev, st.st_ino)
}

/// As [`published_for`], for `statx` (which may not have been asked for
/// the inode number).
///
/// # Safety
/// `stx` points to the statx buffer the successful call filled.
unsafe fn published_for_x(stx: *const libc::statx) -> bool {
    if !state::unpublished() {
        return false;
    }
    // SAFETY: the function's contract.
    let stx = unsafe { &*stx };
    let regular = stx.stx_mask & libc::STATX_TYPE != 0 && u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFREG;
    regular
        && stx.stx_mask & libc::STATX_INO != 0
        && state::publish_for_path(libc::makedev(stx.stx_dev_major, stx.stx_dev_minor), stx.stx_ino)
}

macro_rules! fstat_like {
    ($name:ident, $real:ident) => {
        /// Interposed: the kernel answers, after the library published what
        /// it wrote and had the kernel fetch the attributes again.
        ///
        /// # Safety
        /// fstat(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, st: *mut libc::stat) -> c_int {
            let e = state::entry(fd);
            if let Some(e) = &e {
                e.sync_kernel(fd);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(fd, st) };
            if let (0, Some(e)) = (r, e) {
                // SAFETY: the call succeeded, so `st` is its filled buffer.
                unsafe { overlay_unlinked(&e, st) };
            }
            r
        }
    };
}
fstat_like!(fstat, fstat);
fstat_like!(fstat64, fstat64);

macro_rules! fxstat_like {
    ($name:ident, $real:ident) => {
        /// Interposed (the stat ABI of programs built before glibc 2.33).
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int {
            let e = state::entry(fd);
            if let Some(e) = &e {
                e.sync_kernel(fd);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(ver, fd, st) };
            if let (0, Some(e)) = (r, e) {
                // SAFETY: the call succeeded, so `st` is its filled buffer.
                unsafe { overlay_unlinked(&e, st) };
            }
            r
        }
    };
}
fxstat_like!(__fxstat, fxstat);
fxstat_like!(__fxstat64, fxstat64);

macro_rules! stat_like {
    ($name:ident, $real:ident) => {
        /// Interposed: a stat by path of a file this process wrote through
        /// the library sees those writes, as through the mount (the writes
        /// are published first; [`published_for`]).
        ///
        /// # Safety
        /// stat(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, st: *mut libc::stat) -> c_int {
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(path, st) };
            // SAFETY: on success `st` is the buffer the call filled.
            if r == 0 && unsafe { published_for(st) } {
                // SAFETY: forwarded unchanged, again.
                return unsafe { real::$real()(path, st) };
            }
            r
        }
    };
}
stat_like!(stat, stat);
stat_like!(stat64, stat64);
stat_like!(lstat, lstat);
stat_like!(lstat64, lstat64);

macro_rules! xstat_like {
    ($name:ident, $real:ident) => {
        /// Interposed: as `stat`, in the ABI of programs built before
        /// glibc 2.33.
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int {
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(ver, path, st) };
            // SAFETY: on success `st` is the buffer the call filled.
            if r == 0 && unsafe { published_for(st) } {
                // SAFETY: forwarded unchanged, again.
                return unsafe { real::$real()(ver, path, st) };
            }
            r
        }
    };
}
xstat_like!(__xstat, xstat);
xstat_like!(__xstat64, xstat64);
xstat_like!(__lxstat, lxstat);
xstat_like!(__lxstat64, lxstat64);

/// Whether a `*at` call names `dirfd` itself (`AT_EMPTY_PATH` and "").
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn names_fd(path: *const c_char, flags: c_int) -> bool {
    // SAFETY: the function's contract; only the first byte is read.
    flags & libc::AT_EMPTY_PATH != 0 && (path.is_null() || unsafe { *path } == 0)
}

macro_rules! fstatat_like {
    ($name:ident, $real:ident) => {
        /// Interposed: as `fstat` when the call names a descriptor, as
        /// `stat` when it names a path.
        ///
        /// # Safety
        /// fstatat(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) -> c_int {
            // SAFETY: `path` is the caller's NUL-terminated string.
            let e = if unsafe { names_fd(path, flags) } { state::entry(dirfd) } else { None };
            if let Some(e) = &e {
                e.sync_kernel(dirfd);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(dirfd, path, st, flags) };
            if r != 0 {
                return r;
            }
            match e {
                // SAFETY: the call succeeded, so `st` is its filled buffer.
                Some(e) => unsafe { overlay_unlinked(&e, st) },
                // SAFETY: as above.
                None if unsafe { published_for(st) } => {
                    // SAFETY: forwarded unchanged, again.
                    return unsafe { real::$real()(dirfd, path, st, flags) };
                }
                None => {}
            }
            r
        }
    };
}
fstatat_like!(fstatat, fstatat);
fstatat_like!(fstatat64, fstatat64);

macro_rules! fxstatat_like {
    ($name:ident, $real:ident) => {
        /// Interposed: `fstatat` in the ABI of programs built before glibc
        /// 2.33.
        ///
        /// # Safety
        /// The C function's contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(
            ver: c_int,
            dirfd: c_int,
            path: *const c_char,
            st: *mut libc::stat,
            flags: c_int,
        ) -> c_int {
            // SAFETY: `path` is the caller's NUL-terminated string.
            let e = if unsafe { names_fd(path, flags) } { state::entry(dirfd) } else { None };
            if let Some(e) = &e {
                e.sync_kernel(dirfd);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(ver, dirfd, path, st, flags) };
            if r != 0 {
                return r;
            }
            match e {
                // SAFETY: the call succeeded, so `st` is its filled buffer.
                Some(e) => unsafe { overlay_unlinked(&e, st) },
                // SAFETY: as above.
                None if unsafe { published_for(st) } => {
                    // SAFETY: forwarded unchanged, again.
                    return unsafe { real::$real()(ver, dirfd, path, st, flags) };
                }
                None => {}
            }
            r
        }
    };
}
fxstatat_like!(__fxstatat, fxstatat);
fxstatat_like!(__fxstatat64, fxstatat64);

/// Interposed: as `fstat` when the call names a descriptor, as `stat`
/// when it names a path.
///
/// # Safety
/// statx(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    stx: *mut libc::statx,
) -> c_int {
    // SAFETY: `path` is the caller's NUL-terminated string.
    let e = if unsafe { names_fd(path, flags) } { state::entry(dirfd) } else { None };
    if let Some(e) = &e {
        e.sync_kernel(dirfd);
    }
    // The inode number and type too, to know the file found by a path.
    let asked = if e.is_none() && state::unpublished() { mask | libc::STATX_INO | libc::STATX_TYPE } else { mask };
    // SAFETY: forwarded with a mask that asks for as much or more (the
    // kernel fills what it was asked for into the same buffer).
    let r = unsafe { real::statx()(dirfd, path, flags, asked, stx) };
    if r != 0 {
        return r;
    }
    match e {
        // SAFETY: the call succeeded, so `stx` is its filled buffer.
        Some(e) => unsafe { overlay_unlinked_x(&e, stx) },
        // SAFETY: as above.
        None if unsafe { published_for_x(stx) } => {
            // SAFETY: forwarded unchanged, again.
            return unsafe { real::statx()(dirfd, path, flags, mask, stx) };
        }
        None => {}
    }
    r
}

macro_rules! fsync_like {
    ($name:ident, $real:ident) => {
        /// Interposed: durable on the io servers and the size exact in meta
        /// (the library's `fsync`), with the kernel's view refreshed.
        ///
        /// # Safety
        /// fsync(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int) -> c_int {
            if let Some(e) = state::entry(fd) {
                return match e.fsync(fd) {
                    Ok(()) => 0,
                    Err(err) => {
                        real::set_errno(err.0);
                        -1
                    }
                };
            }
            // SAFETY: forwarded unchanged.
            unsafe { real::$real()(fd) }
        }
    };
}
fsync_like!(fsync, fsync);
fsync_like!(fdatasync, fdatasync);

macro_rules! ftruncate_like {
    ($name:ident, $real:ident) => {
        /// Interposed: the mount truncates (servers and meta); the library
        /// learns the new size.
        ///
        /// # Safety
        /// ftruncate(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, len: off_t) -> c_int {
            let e = state::entry(fd);
            if let Some(e) = &e {
                e.sync_kernel(fd);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(fd, len) };
            if let (0, Some(e)) = (r, e) {
                state::truncated(&e, len as u64);
            }
            r
        }
    };
}
ftruncate_like!(ftruncate, ftruncate);
ftruncate_like!(ftruncate64, ftruncate64);

macro_rules! truncate_like {
    ($name:ident, $real:ident) => {
        /// Interposed: the mount truncates; this process's library
        /// descriptors of the file publish their writes before (a later
        /// publish would grow it back past the cut) and learn the new size
        /// after ([`state::truncated_by_path`]).
        ///
        /// # Safety
        /// truncate(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, len: off_t) -> c_int {
            let found = if state::foreign() {
                None
            } else {
                // SAFETY: `path` is the caller's NUL-terminated path
                // (truncate(2)'s contract).
                unsafe { real::path_identity(path) }
                    .filter(|&(dev, ino, kind)| kind == libc::S_IFREG && state::before_path_truncate(dev, ino))
            };
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(path, len) };
            if let (0, Some((_, ino, _))) = (r, found) {
                state::truncated_by_path(ino, len.max(0) as u64);
            }
            r
        }
    };
}
truncate_like!(truncate, truncate);
truncate_like!(truncate64, truncate64);

macro_rules! fallocate_like {
    ($name:ident, $real:ident) => {
        /// Interposed: the mount allocates; the library learns the size.
        ///
        /// # Safety
        /// fallocate(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
            let e = state::entry(fd);
            if let Some(e) = &e {
                e.sync_kernel(fd);
            }
            // SAFETY: forwarded unchanged.
            let r = unsafe { real::$real()(fd, mode, off, len) };
            if let (0, Some(e)) = (r, e) {
                e.resized(None);
            }
            r
        }
    };
}
fallocate_like!(fallocate, fallocate);
fallocate_like!(fallocate64, fallocate64);

macro_rules! mmap_like {
    ($name:ident, $real:ident) => {
        /// Interposed: a mapping of a dafne descriptor is the kernel's
        /// (through FUSE), made after the kernel's view was updated.
        ///
        /// # Safety
        /// mmap(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(
            addr: *mut c_void,
            len: size_t,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: off_t,
        ) -> *mut c_void {
            if flags & libc::MAP_ANONYMOUS == 0 {
                if let Some(e) = state::entry(fd) {
                    e.sync_kernel(fd);
                }
            }
            // SAFETY: forwarded unchanged.
            unsafe { real::$real()(addr, len, prot, flags, fd, off) }
        }
    };
}
mmap_like!(mmap, mmap);
mmap_like!(mmap64, mmap64);

// ---- descriptors --------------------------------------------------------------

/// Interposed: the last number of a dafne description publishes what was
/// written and closes the file in the cluster, then the kernel closes.
///
/// # Safety
/// close(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let published = state::forget(fd);
    // SAFETY: forwarded unchanged.
    let r = unsafe { real::close()(fd) };
    match published {
        Err(e) if r == 0 => {
            real::set_errno(e.0);
            -1
        }
        _ => r,
    }
}

/// Interposed: a stream over a dafne descriptor leaves the table first.
///
/// # Safety
/// fclose(3)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fclose(f: *mut libc::FILE) -> c_int {
    if !f.is_null() {
        // SAFETY: `f` is the caller's open stream.
        let fd = unsafe { libc::fileno(f) };
        let _ = state::forget(fd);
    }
    // SAFETY: forwarded unchanged.
    unsafe { real::fclose()(f) }
}

/// Interposed: the numbers closed leave the table first.
///
/// # Safety
/// close_range(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) == 0 && !state::foreign() {
        let top = last.min(state::MAX_FDS as c_uint - 1);
        for fd in first..=top {
            if state::marked(fd as c_int) {
                let _ = state::forget(fd as c_int);
            }
        }
    }
    // SAFETY: forwarded unchanged.
    unsafe { real::close_range()(first, last, flags) }
}

/// Interposed: the new number shares the dafne description.
///
/// # Safety
/// dup(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: forwarded unchanged.
    let r = unsafe { real::dup()(fd) };
    state::duplicated(fd, r);
    r
}

/// Interposed: `newfd`'s old description (if dafne's) closes first.
///
/// # Safety
/// dup2(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    if oldfd != newfd {
        let _ = state::forget(newfd);
    }
    // SAFETY: forwarded unchanged.
    let r = unsafe { real::dup2()(oldfd, newfd) };
    if oldfd != newfd {
        state::duplicated(oldfd, r);
    }
    r
}

/// Interposed: as `dup2`.
///
/// # Safety
/// dup3(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    if oldfd != newfd {
        let _ = state::forget(newfd);
    }
    // SAFETY: forwarded unchanged.
    let r = unsafe { real::dup3()(oldfd, newfd, flags) };
    state::duplicated(oldfd, r);
    r
}

/// The table's side of `fcntl`: duplicates, `O_APPEND` (the description
/// goes to the FUSE path), and locks (the size is published before a lock
/// changes hands, as the mount does).
fn fcntl_before(fd: c_int, cmd: c_int, arg: c_ulong) {
    let Some(e) = state::entry(fd) else { return };
    match cmd {
        libc::F_SETFL if arg as c_int & libc::O_APPEND != 0 => state::demote(fd),
        libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => e.sync_kernel(fd),
        _ => {}
    }
}

macro_rules! fcntl_like {
    ($name:ident, $real:ident) => {
        /// Interposed (see [`fcntl_before`]).
        ///
        /// # Safety
        /// fcntl(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
            fcntl_before(fd, cmd, arg);
            // SAFETY: forwarded unchanged (the third argument is an integer
            // or a pointer, passed on in the same register).
            let r = unsafe { real::$real()(fd, cmd, arg) };
            if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
                state::duplicated(fd, r);
            }
            r
        }
    };
}
fcntl_like!(fcntl, fcntl);
fcntl_like!(fcntl64, fcntl64);

// ---- copies between descriptors -------------------------------------------------

/// Reads for a copy: the library for a dafne descriptor, else the kernel.
fn copy_read(fd: c_int, b: &mut [u8], off: Option<u64>) -> Result<usize, Errno> {
    if let Some(e) = state::entry(fd).filter(|e| e.readable()) {
        return match off {
            Some(o) => e.read_at(o, b),
            None => e.at_offset(fd, |o| e.read_at(o, b)),
        };
    }
    // SAFETY: `b` is a writable buffer of its length, ours for the call.
    let r = unsafe {
        match off {
            Some(o) => real::pread()(fd, b.as_mut_ptr().cast(), b.len(), o as off_t),
            None => real::read()(fd, b.as_mut_ptr().cast(), b.len()),
        }
    };
    if r < 0 {
        Err(Errno(real::errno()))
    } else {
        Ok(r as usize)
    }
}

/// Writes all of `b` for a copy; a failure after some bytes returns them.
fn copy_write(fd: c_int, b: &[u8], off: Option<u64>) -> Result<usize, Errno> {
    let mut done = 0;
    while done < b.len() {
        let rest = &b[done..];
        let at = off.map(|o| o + done as u64);
        let r = if let Some(e) = state::entry(fd).filter(|e| e.writable()) {
            match at {
                Some(o) => e.write_at(o, rest),
                None => e.at_offset(fd, |o| e.write_at(o, rest)),
            }
        } else {
            // SAFETY: `rest` is a readable buffer of its length.
            let r = unsafe {
                match at {
                    Some(o) => real::pwrite()(fd, rest.as_ptr().cast(), rest.len(), o as off_t),
                    None => real::write()(fd, rest.as_ptr().cast(), rest.len()),
                }
            };
            if r < 0 {
                Err(Errno(real::errno()))
            } else {
                Ok(r as usize)
            }
        };
        match r {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// One piece of a copy between descriptors of which one is dafne's, as
/// `sendfile` and `copy_file_range` do (they may copy less than asked).
fn copy(out: c_int, out_off: Option<&mut i64>, inp: c_int, in_off: Option<&mut i64>, count: usize) -> ssize_t {
    const PIECE: usize = 1 << 20;
    if in_off.as_ref().is_some_and(|o| **o < 0) || out_off.as_ref().is_some_and(|o| **o < 0) {
        real::set_errno(libc::EINVAL);
        return -1;
    }
    let mut b = vec![0u8; count.min(PIECE)];
    let n = match copy_read(inp, &mut b, in_off.as_ref().map(|o| **o as u64)) {
        Ok(n) => n,
        Err(e) => return ssize(Err(e)),
    };
    let w = copy_write(out, &b[..n], out_off.as_ref().map(|o| **o as u64));
    if let Ok(w) = w {
        if let Some(o) = in_off {
            *o += w as i64;
        }
        if let Some(o) = out_off {
            *o += w as i64;
        }
    }
    ssize(w)
}

macro_rules! sendfile_like {
    ($name:ident, $real:ident) => {
        /// Interposed: with a dafne descriptor on either side the bytes go
        /// through the library.
        ///
        /// # Safety
        /// sendfile(2)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(out: c_int, inp: c_int, off: *mut off_t, count: size_t) -> ssize_t {
            if state::entry(out).is_some() || state::entry(inp).is_some() {
                // SAFETY: sendfile(2)'s contract: `off` is null or points to
                // the caller's offset, which it lends for the call.
                let off = unsafe { off.as_mut() };
                return copy(out, None, inp, off, count);
            }
            // SAFETY: forwarded unchanged.
            unsafe { real::$real()(out, inp, off, count) }
        }
    };
}
sendfile_like!(sendfile, sendfile);
sendfile_like!(sendfile64, sendfile64);

/// Interposed: as `sendfile`, with both offsets.
///
/// # Safety
/// copy_file_range(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn copy_file_range(
    inp: c_int,
    in_off: *mut off_t,
    out: c_int,
    out_off: *mut off_t,
    count: size_t,
    flags: c_uint,
) -> ssize_t {
    if flags == 0 && (state::entry(out).is_some() || state::entry(inp).is_some()) {
        // SAFETY: copy_file_range(2)'s contract: each offset is null or
        // points to the caller's offset, lent for the call.
        let (i, o) = unsafe { (in_off.as_mut(), out_off.as_mut()) };
        return copy(out, o, inp, i, count);
    }
    // SAFETY: forwarded unchanged.
    unsafe { real::copy_file_range()(inp, in_off, out, out_off, count, flags) }
}

// Exec: the new program starts without this process's table, and no exit
// handler runs, so what the library wrote is published first (as at exit).
// The `execl*` family is variadic and not interposed (docs/PRELOAD.md,
// "Limits").

macro_rules! exec_path {
    ($(#[$doc:meta])* $name:ident, envp) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The contract of the exec function of the same name.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, argv: real::Argv, envp: real::Argv) -> c_int {
            state::before_exec();
            // SAFETY: forwarded unchanged.
            unsafe { real::$name()(path, argv, envp) }
        }
    };
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The contract of the exec function of the same name.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char, argv: real::Argv) -> c_int {
            state::before_exec();
            // SAFETY: forwarded unchanged.
            unsafe { real::$name()(path, argv) }
        }
    };
}

exec_path!(
    /// Interposed: publishes every entry's writes, then execs.
    execve,
    envp
);
exec_path!(
    /// Interposed: publishes every entry's writes, then execs.
    execvpe,
    envp
);
exec_path!(
    /// Interposed: publishes every entry's writes, then execs.
    execv
);
exec_path!(
    /// Interposed: publishes every entry's writes, then execs.
    execvp
);

/// Interposed: publishes every entry's writes, then execs.
///
/// # Safety
/// execveat(2)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: real::Argv,
    envp: real::Argv,
    flags: c_int,
) -> c_int {
    state::before_exec();
    // SAFETY: forwarded unchanged.
    unsafe { real::execveat()(dirfd, path, argv, envp, flags) }
}

/// Interposed: publishes every entry's writes, then execs.
///
/// # Safety
/// fexecve(3)'s contract.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: real::Argv, envp: real::Argv) -> c_int {
    state::before_exec();
    // SAFETY: forwarded unchanged.
    unsafe { real::fexecve()(fd, argv, envp) }
}

macro_rules! spawn {
    ($name:ident) => {
        /// Interposed: the spawned program reads through the kernel, so it
        /// must see what this process wrote: publishes first.
        ///
        /// # Safety
        /// posix_spawn(3)'s contract.
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(
            pid: *mut libc::pid_t,
            path: *const c_char,
            actions: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: real::Argv,
            envp: real::Argv,
        ) -> c_int {
            state::before_exec();
            // SAFETY: forwarded unchanged.
            unsafe { real::$name()(pid, path, actions, attr, argv, envp) }
        }
    };
}

spawn!(posix_spawn);
spawn!(posix_spawnp);
