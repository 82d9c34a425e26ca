//! The C library's own functions, found with `dlsym(RTLD_NEXT, ...)`: what
//! every intercepted call ends in when the descriptor is not dafne's, and
//! what the library itself uses on the kernel descriptor it keeps beside
//! each dafne file.
//!
//! Each pointer is looked up once, on first use, and kept in an atomic; a
//! symbol the C library lacks aborts with its name (a program cannot run
//! half-intercepted).

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_char, c_int, c_uint, c_void, iovec, mode_t, off_t, size_t, ssize_t};

fn lookup(sym: &'static [u8]) -> usize {
    // SAFETY: `sym` is a NUL-terminated literal (every caller below writes
    // it with a trailing \0); dlsym may be called from any thread.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, sym.as_ptr().cast()) };
    if p.is_null() {
        let msg = b"dafne-preload: the C library lacks a function it intercepts\n";
        // SAFETY: writing a static buffer of its own length to stderr.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        std::process::abort();
    }
    p as usize
}

macro_rules! real_fn {
    ($name:ident, $sym:literal, $ty:ty) => {
        #[allow(non_upper_case_globals)]
        pub fn $name() -> $ty {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let mut p = SLOT.load(Ordering::Acquire);
            if p == 0 {
                p = lookup(concat!($sym, "\0").as_bytes());
                SLOT.store(p, Ordering::Release);
            }
            // SAFETY: `p` is the non-null address dlsym gave for this
            // symbol in the next object of the lookup order (the C
            // library), whose C prototype is `$ty`; code is never unmapped
            // while the process runs.
            unsafe { std::mem::transmute::<usize, $ty>(p) }
        }
    };
}

pub type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
pub type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
pub type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
pub type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
pub type CreatFn = unsafe extern "C" fn(*const c_char, mode_t) -> c_int;
pub type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
pub type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
pub type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t;
pub type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;
pub type ReadvFn = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
pub type PreadvFn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
pub type Preadv2Fn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t;
pub type LseekFn = unsafe extern "C" fn(c_int, off_t, c_int) -> off_t;
pub type FstatFn = unsafe extern "C" fn(c_int, *mut libc::stat) -> c_int;
pub type FxstatFn = unsafe extern "C" fn(c_int, c_int, *mut libc::stat) -> c_int;
pub type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
pub type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
pub type XstatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat) -> c_int;
pub type FxstatatFn = unsafe extern "C" fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
pub type StatxFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int;
pub type FdFn = unsafe extern "C" fn(c_int) -> c_int;
pub type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
pub type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
pub type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
pub type FtruncateFn = unsafe extern "C" fn(c_int, off_t) -> c_int;
pub type TruncateFn = unsafe extern "C" fn(*const c_char, off_t) -> c_int;
pub type FallocateFn = unsafe extern "C" fn(c_int, c_int, off_t, off_t) -> c_int;
pub type CloseRangeFn = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
pub type FcloseFn = unsafe extern "C" fn(*mut libc::FILE) -> c_int;
pub type MmapFn = unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;
pub type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;
pub type Argv = *const *const c_char;
pub type ExecveFn = unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int;
pub type ExecvFn = unsafe extern "C" fn(*const c_char, Argv) -> c_int;
pub type ExecveatFn = unsafe extern "C" fn(c_int, *const c_char, Argv, Argv, c_int) -> c_int;
pub type FexecveFn = unsafe extern "C" fn(c_int, Argv, Argv) -> c_int;
pub type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    Argv,
    Argv,
) -> c_int;
pub type CopyRangeFn = unsafe extern "C" fn(c_int, *mut off_t, c_int, *mut off_t, size_t, c_uint) -> ssize_t;

real_fn!(open, "open", OpenFn);
real_fn!(open64, "open64", OpenFn);
real_fn!(openat, "openat", OpenatFn);
real_fn!(openat64, "openat64", OpenatFn);
real_fn!(open_2, "__open_2", Open2Fn);
real_fn!(open64_2, "__open64_2", Open2Fn);
real_fn!(openat_2, "__openat_2", Openat2Fn);
real_fn!(openat64_2, "__openat64_2", Openat2Fn);
real_fn!(creat, "creat", CreatFn);
real_fn!(creat64, "creat64", CreatFn);
real_fn!(read, "read", ReadFn);
real_fn!(write, "write", WriteFn);
real_fn!(pread, "pread", PreadFn);
real_fn!(pread64, "pread64", PreadFn);
real_fn!(pwrite, "pwrite", PwriteFn);
real_fn!(pwrite64, "pwrite64", PwriteFn);
real_fn!(readv, "readv", ReadvFn);
real_fn!(writev, "writev", ReadvFn);
real_fn!(preadv, "preadv", PreadvFn);
real_fn!(preadv64, "preadv64", PreadvFn);
real_fn!(pwritev, "pwritev", PreadvFn);
real_fn!(pwritev64, "pwritev64", PreadvFn);
real_fn!(preadv2, "preadv2", Preadv2Fn);
real_fn!(preadv64v2, "preadv64v2", Preadv2Fn);
real_fn!(pwritev2, "pwritev2", Preadv2Fn);
real_fn!(pwritev64v2, "pwritev64v2", Preadv2Fn);
real_fn!(lseek, "lseek", LseekFn);
real_fn!(lseek64, "lseek64", LseekFn);
real_fn!(fstat, "fstat", FstatFn);
real_fn!(fstat64, "fstat64", FstatFn);
real_fn!(fxstat, "__fxstat", FxstatFn);
real_fn!(fxstat64, "__fxstat64", FxstatFn);
real_fn!(fstatat, "fstatat", FstatatFn);
real_fn!(fstatat64, "fstatat64", FstatatFn);
real_fn!(statx, "statx", StatxFn);
real_fn!(stat, "stat", StatFn);
real_fn!(stat64, "stat64", StatFn);
real_fn!(lstat, "lstat", StatFn);
real_fn!(lstat64, "lstat64", StatFn);
real_fn!(xstat, "__xstat", XstatFn);
real_fn!(xstat64, "__xstat64", XstatFn);
real_fn!(lxstat, "__lxstat", XstatFn);
real_fn!(lxstat64, "__lxstat64", XstatFn);
real_fn!(fxstatat, "__fxstatat", FxstatatFn);
real_fn!(fxstatat64, "__fxstatat64", FxstatatFn);
real_fn!(fsync, "fsync", FdFn);
real_fn!(fdatasync, "fdatasync", FdFn);
real_fn!(close, "close", FdFn);
real_fn!(dup, "dup", FdFn);
real_fn!(dup2, "dup2", Dup2Fn);
real_fn!(dup3, "dup3", Dup3Fn);
real_fn!(fcntl, "fcntl", FcntlFn);
real_fn!(fcntl64, "fcntl64", FcntlFn);
real_fn!(ftruncate, "ftruncate", FtruncateFn);
real_fn!(ftruncate64, "ftruncate64", FtruncateFn);
real_fn!(truncate, "truncate", TruncateFn);
real_fn!(truncate64, "truncate64", TruncateFn);
real_fn!(fallocate, "fallocate", FallocateFn);
real_fn!(fallocate64, "fallocate64", FallocateFn);
real_fn!(close_range, "close_range", CloseRangeFn);
real_fn!(fclose, "fclose", FcloseFn);
real_fn!(mmap, "mmap", MmapFn);
real_fn!(mmap64, "mmap64", MmapFn);
real_fn!(sendfile, "sendfile", SendfileFn);
real_fn!(sendfile64, "sendfile64", SendfileFn);
real_fn!(copy_file_range, "copy_file_range", CopyRangeFn);
real_fn!(execve, "execve", ExecveFn);
real_fn!(execv, "execv", ExecvFn);
real_fn!(execvp, "execvp", ExecvFn);
real_fn!(execvpe, "execvpe", ExecveFn);
real_fn!(execveat, "execveat", ExecveatFn);
real_fn!(fexecve, "fexecve", FexecveFn);
real_fn!(posix_spawn, "posix_spawn", SpawnFn);
real_fn!(posix_spawnp, "posix_spawnp", SpawnFn);

/// The last error of this thread.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot, valid for
    // the thread's life.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e };
}

/// `lseek` on a kernel descriptor, as a `Result` with the errno.
pub fn seek(fd: c_int, offset: i64, whence: c_int) -> Result<u64, c_int> {
    // SAFETY: lseek takes plain integers; no memory is passed.
    let r = unsafe { lseek()(fd, offset, whence) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

/// The kernel's `fstat` of a descriptor (the real one, not ours).
fn stat_of(fd: c_int) -> Option<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a writable stat buffer of the right size; fstat
    // fills it or fails without touching anything else.
    let r = unsafe { fstat()(fd, st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it initialised the buffer (zeroed before).
    Some(unsafe { st.assume_init() })
}

/// The kernel's `st_dev`, `st_ino` and file type of what `path` names
/// (following symlinks, as `truncate(2)` does), by the real `stat`.
///
/// # Safety
/// `path` is a NUL-terminated string (or null: the real `stat` fails).
pub unsafe fn path_identity(path: *const c_char) -> Option<(u64, u64, u32)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `path` per this function's contract; `st` is a writable stat
    // buffer of the right size, filled or left alone.
    let r = unsafe { stat()(path, st.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: stat succeeded, so it initialised the buffer (zeroed before).
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT))
}

/// The kernel's `st_dev`, `st_ino` and file type of a descriptor.
pub fn identity(fd: c_int) -> Option<(u64, u64, u32)> {
    let st = stat_of(fd)?;
    Some((st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT))
}

/// The size the kernel has for a descriptor's file.
pub fn size(fd: c_int) -> Option<u64> {
    stat_of(fd).map(|st| st.st_size.max(0) as u64)
}

/// Makes the kernel ask the mount for the attributes of `fd`'s file now
/// (`AT_STATX_FORCE_SYNC`: FUSE sends a getattr whatever its cache
/// holds). A changed size also drops the inode's cached pages in FUSE.
///
/// FUSE drops a getattr's reply when the inode's attributes changed while
/// it was in flight (its `attr_version` check), leaving them marked
/// stale, and a write through an `O_APPEND` descriptor takes the cached
/// size without checking it: seen as an append landing at the size before
/// the publish. A plain `fstat` after the forced one fetches again exactly
/// when the attributes are stale, and costs no request otherwise.
pub fn refresh_kernel_attributes(fd: c_int) {
    force_statx(fd);
    let _ = identity(fd);
}

fn force_statx(fd: c_int) {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the empty path is a NUL-terminated literal; `stx` is a
    // writable statx buffer; the result is not read.
    unsafe {
        statx()(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS,
            stx.as_mut_ptr(),
        )
    };
}

/// Drops the clean pages the kernel caches for `fd`'s file (what a
/// kernel-path reader cached before this process wrote through the
/// library).
pub fn drop_cached_pages(fd: c_int) {
    // SAFETY: posix_fadvise takes plain integers.
    unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
}
