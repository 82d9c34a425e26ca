//! The namespace by path and files by descriptor.
//!
//! Paths are absolute in the cluster's file system (a relative one is
//! taken from the root); symlinks are followed in every component except
//! where the function says otherwise (`dafne_lstat`, and the last component
//! of `unlink`, `rmdir`, `rename`, `mkdir`). A descriptor is a small integer
//! in the client's own table (the lowest free, as POSIX hands them out),
//! naming a [`File`] of the client library's file layer, which holds the
//! size rule: the size in meta is exact after `dafne_fsync` or
//! `dafne_close` (each publishes the largest byte any io server holds),
//! and a reader on the same descriptor sees its own writes at once.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};

use ::dafne_client::file::File;
use ::dafne_client::{Attr, DirEntry, Errno, FileType, Ino};
use dafne_proto::io::Stability;

use crate::{client, dafne_client, guard, guard_int, put, string, Client};

/// `open(2)` flags this library takes (Linux values, as `<fcntl.h>` has
/// them on every Linux architecture dafne builds for).
const O_ACCMODE: c_int = 0o3;
const O_WRONLY: c_int = 0o1;
const O_RDWR: c_int = 0o2;
const O_CREAT: c_int = 0o100;
const O_EXCL: c_int = 0o200;
const O_NOCTTY: c_int = 0o400;
const O_TRUNC: c_int = 0o1000;
const O_APPEND: c_int = 0o2000;
const O_LARGEFILE: c_int = 0o100000;
const O_NOFOLLOW: c_int = 0o400000;
const O_CLOEXEC: c_int = 0o2000000;
/// Flags accepted and without effect here (no terminals, no exec, 64-bit
/// offsets always).
const O_IGNORED: c_int = O_NOCTTY | O_LARGEFILE | O_CLOEXEC;

/// Most descriptors one client holds at once.
pub const DAFNE_MAX_FILES: usize = 1 << 16;

/// Longest name of a directory entry, without its NUL.
pub const DAFNE_NAME_MAX: usize = 255;
/// Bytes of `dafne_dirent::name`: the longest name and its NUL.
pub const DAFNE_NAME_SIZE: usize = 256;
const _: () = assert!(DAFNE_NAME_MAX == dafne_proto::NAME_MAX && DAFNE_NAME_SIZE == DAFNE_NAME_MAX + 1);

/// One open file of the table.
pub(crate) struct Open {
    pub(crate) file: File,
    pub(crate) read: bool,
    pub(crate) write: bool,
    /// Its posted operations not yet finished: `dafne_close` waits for
    /// them, so that the size it publishes includes their writes.
    pub(crate) posted: Arc<Posted>,
}

/// A count of operations in flight, and a wait for it to reach zero.
#[derive(Default)]
pub(crate) struct Posted {
    n: Mutex<usize>,
    idle: Condvar,
}

/// One posted operation in flight; dropped (finished, failed or
/// cancelled) it is counted out.
pub(crate) struct InFlight(Arc<Posted>);

impl Posted {
    /// Counts one operation in until the returned guard drops.
    pub(crate) fn start(self: &Arc<Self>) -> InFlight {
        *self.n.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        InFlight(self.clone())
    }

    /// Returns once no operation is in flight.
    fn wait_idle(&self) {
        let mut n = self.n.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            n = self.idle.wait(n).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut n = self.0.n.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// A client's descriptors: slot `fd` holds the file open as `fd`.
#[derive(Default)]
pub(crate) struct Files {
    slots: Vec<Option<Arc<Open>>>,
}

impl Files {
    fn insert(&mut self, o: Open) -> Result<i64, Errno> {
        let o = Some(Arc::new(o));
        if let Some(i) = self.slots.iter().position(Option::is_none) {
            self.slots[i] = o;
            return Ok(i as i64);
        }
        if self.slots.len() >= DAFNE_MAX_FILES {
            return Err(Errno::EMFILE);
        }
        self.slots.push(o);
        Ok(self.slots.len() as i64 - 1)
    }

    fn get(&self, fd: c_int) -> Result<Arc<Open>, Errno> {
        usize::try_from(fd).ok().and_then(|i| self.slots.get(i)).and_then(|s| s.clone()).ok_or(Errno::EBADF)
    }

    fn remove(&mut self, fd: c_int) -> Result<Arc<Open>, Errno> {
        let slot = usize::try_from(fd).ok().and_then(|i| self.slots.get_mut(i)).ok_or(Errno::EBADF)?;
        let o = slot.take().ok_or(Errno::EBADF)?;
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        Ok(o)
    }
}

impl Client {
    /// The open file `fd`, shared with any call using it at the same time.
    pub(crate) fn file(&self, fd: c_int) -> Result<Arc<Open>, Errno> {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).get(fd)
    }

    /// An open file that may be read (`EBADF` if opened write-only).
    pub(crate) fn readable(&self, fd: c_int) -> Result<Arc<Open>, Errno> {
        Some(self.file(fd)?).filter(|o| o.read).ok_or(Errno::EBADF)
    }

    /// An open file that may be written (`EBADF` if opened read-only).
    pub(crate) fn writable(&self, fd: c_int) -> Result<Arc<Open>, Errno> {
        Some(self.file(fd)?).filter(|o| o.write).ok_or(Errno::EBADF)
    }

    /// The directory and the last name of `path`; the directory's symlinks
    /// are followed.
    fn parent_of<'p>(&self, path: &'p str) -> Result<(Ino, &'p [u8]), Errno> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
        if name.is_empty() {
            // The root itself.
            return Err(Errno::EBUSY);
        }
        let parent = self.fs.meta.resolve_follow(if dir.is_empty() { "/" } else { dir })?;
        if parent.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        Ok((parent.ino, name.as_bytes()))
    }

    fn open_path(&self, path: &str, flags: c_int, mode: u32) -> Result<i64, Errno> {
        let known = O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC | O_NOFOLLOW | O_IGNORED;
        // O_APPEND needs an atomic append the io protocol does not have;
        // O_SYNC, O_DIRECT, O_PATH and the rest are not offered.
        if flags & O_APPEND != 0 || flags & !known != 0 {
            return Err(Errno::EINVAL);
        }
        // As open(2): an empty path names nothing (not the root).
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        let (read, write) = match flags & O_ACCMODE {
            0 => (true, false),
            O_WRONLY => (false, true),
            O_RDWR => (true, true),
            _ => return Err(Errno::EINVAL),
        };
        if flags & O_TRUNC != 0 && !write {
            return Err(Errno::EINVAL);
        }
        let attr = if flags & O_CREAT != 0 {
            let (parent, name) = self.parent_of(path)?;
            if path.ends_with('/') {
                return Err(Errno::EISDIR);
            }
            self.fs.meta.create(parent, name, mode & 0o7777, flags & O_EXCL != 0)?
        } else if flags & O_NOFOLLOW != 0 {
            self.fs.meta.resolve(path)?
        } else {
            self.fs.meta.resolve_follow(path)?
        };
        match attr.kind {
            FileType::Regular => {}
            FileType::Directory => return Err(Errno::EISDIR),
            FileType::Symlink => return Err(Errno::ELOOP),
            _ => return Err(Errno::ENXIO),
        }
        let mut open_flags = 0;
        if read {
            open_flags |= dafne_proto::OPEN_READ;
        }
        if write {
            open_flags |= dafne_proto::OPEN_WRITE;
        }
        if flags & O_TRUNC != 0 {
            open_flags |= dafne_proto::OPEN_TRUNC;
        }
        let file = self.fs.open(attr.ino, open_flags)?;
        self.files.lock().unwrap_or_else(|p| p.into_inner()).insert(Open { file, read, write, posted: Arc::default() })
    }
}

/// Opens (and with `O_CREAT` creates, `mode` its permission bits, no umask
/// applied) the regular file at `path`. `flags`: `O_RDONLY`, `O_WRONLY` or
/// `O_RDWR`, with `O_CREAT`, `O_EXCL`, `O_TRUNC` (needs write access),
/// `O_NOFOLLOW`; `O_CLOEXEC`, `O_NOCTTY` and `O_LARGEFILE` are ignored.
/// Returns the descriptor (`>= 0`).
///
/// Errors: as `open(2)`; also `-EINVAL` for `O_APPEND` (no atomic append)
/// and other flags, `-EISDIR` for a directory (list those with
/// `dafne_readdir`), `-ELOOP` for a symlink with `O_NOFOLLOW`, `-ENXIO` for
/// a device, FIFO or socket, `-EMFILE` past `DAFNE_MAX_FILES`.
///
/// # Safety
/// `c` is a client handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dafne_open(c: *const dafne_client, path: *const c_char, flags: c_int, mode: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, path) = unsafe { (client(c)?, string(path)?) };
        c.open_path(path, flags, mode)
    }) as c_int
}

/// Closes `fd`: publishes the file's size to meta (as `dafne_fsync`
/// does, without forcing the data to disk) and releases the open. The
/// descriptor is closed even when the size could not be published (that
/// error is returned). Operations posted on `fd` (`dafne_post_read`,
/// `dafne_post_write`) that are still running are waited for first, so
/// the size published includes their writes; their completions stay on
/// their queue to be taken as usual. A blocking call on `fd` still running
/// in another thread finishes on its own reference.
///
/// # Safety
/// `c` is a client handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_close(c: *const dafne_client, fd: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { client(c)? };
        let o = c.files.lock().unwrap_or_else(|p| p.into_inner()).remove(fd)?;
        // Out of the table, nothing more can be posted on it.
        o.posted.wait_idle();
        // The open in meta is released when the last reference goes.
        if o.write {
            o.file.publish_size()?;
        }
        Ok(())
    })
}

/// A slice of `len` bytes at `buf` (empty for `len == 0`, whatever `buf`).
///
/// # Safety
/// `buf` is NULL or valid for reads of `len` bytes for `'a`, which no one
/// writes meanwhile.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], Errno> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() || len > isize::MAX as usize {
        return Err(Errno::EINVAL);
    }
    // SAFETY: non-NULL, `len` bytes readable and unchanged for `'a` by the
    // caller's contract; `len` fits an isize.
    Ok(unsafe { std::slice::from_raw_parts(buf as *const u8, len) })
}

/// A mutable slice of `len` bytes at `buf`.
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes for `'a`, which no one
/// else reads or writes meanwhile.
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], Errno> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() || len > isize::MAX as usize {
        return Err(Errno::EINVAL);
    }
    // SAFETY: non-NULL, `len` bytes writable and not otherwise used for
    // `'a` by the caller's contract; `len` fits an isize.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) })
}

/// Reads up to `len` bytes at `offset` of `fd` into `buf`: the number read
/// (short, or 0, at the end of the file as this descriptor knows it).
/// From 256 KiB up the io servers put the bytes straight into `buf` where
/// they can reach it (a registration cached per buffer); otherwise, and
/// always on one host, they go through a registered bounce buffer (one
/// copy, counted in `dafne_stats`). For zero-copy I/O on one host use
/// `dafne_mem_alloc` memory.
///
/// # Safety
/// `c` is a client handle; `buf` is writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn dafne_pread(
    c: *const dafne_client,
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, buf) = unsafe { (client(c)?, bytes_mut(buf, len)?) };
        let o = c.readable(fd)?;
        Ok(o.file.read_into(offset, buf)? as i64)
    })
}

/// Writes `len` bytes of `buf` at `offset` of `fd`: the number written
/// (all of them). Acknowledged once the io servers hold the data in their
/// caches; `dafne_fsync` makes it durable. Copies as `dafne_pread` says.
///
/// # Safety
/// `c` is a client handle; `buf` is readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn dafne_pwrite(
    c: *const dafne_client,
    fd: c_int,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> i64 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, buf) = unsafe { (client(c)?, bytes(buf, len)?) };
        let o = c.writable(fd)?;
        Ok(o.file.write_from(offset, buf, Stability::Unstable)? as i64)
    })
}

/// Makes the data written through any descriptor of this file durable on
/// every io server, and the size in meta exact.
///
/// # Safety
/// `c` is a client handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_fsync(c: *const dafne_client, fd: c_int) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { client(c)? };
        let o = c.file(fd)?;
        o.file.fsync()
    })
}

/// Sets the size of the file open as `fd` (which must be writable: else
/// `-EBADF`), on the io servers and in meta.
///
/// # Safety
/// `c` is a client handle.
#[no_mangle]
pub unsafe extern "C" fn dafne_ftruncate(c: *const dafne_client, fd: c_int, size: u64) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { client(c)? };
        c.writable(fd)?.file.truncate(size)
    })
}

/// A file's attributes, as `struct stat` has them.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct dafne_attr {
    pub ino: u64,
    /// The type (`S_IFREG`, `S_IFDIR`, … of `<sys/stat.h>`) and the
    /// permission bits, as `st_mode`.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// The device a character or block device names (`makedev` encoding).
    pub rdev: u64,
    /// Bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime_sec: i64,
    pub atime_nsec: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub ctime_sec: i64,
    pub ctime_nsec: u32,
}

/// `DT_*` of a file type (`<dirent.h>`).
fn dirent_type(k: FileType) -> u8 {
    match k {
        FileType::Fifo => 1,
        FileType::CharDevice => 2,
        FileType::Directory => 4,
        FileType::BlockDevice => 6,
        FileType::Regular => 8,
        FileType::Symlink => 10,
        FileType::Socket => 12,
    }
}

impl From<&Attr> for dafne_attr {
    fn from(a: &Attr) -> dafne_attr {
        dafne_attr {
            ino: a.ino,
            mode: a.kind.mode_bits() | a.mode,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            size: a.size,
            blocks: a.blocks,
            atime_sec: a.atime.sec,
            atime_nsec: a.atime.nsec,
            mtime_sec: a.mtime.sec,
            mtime_nsec: a.mtime.nsec,
            ctime_sec: a.ctime.sec,
            ctime_nsec: a.ctime.nsec,
        }
    }
}

/// The attributes of `path`, following a symlink in its last component.
///
/// # Safety
/// `c` is a client handle; `path` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_stat(c: *const dafne_client, path: *const c_char, out: *mut dafne_attr) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let (c, path) = unsafe { (client(c)?, string(path)?) };
        let a = c.fs.meta.resolve_follow(path)?;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, dafne_attr::from(&a)) }
    })
}

/// The attributes of `path` itself (a symlink's own).
///
/// # Safety
/// As `dafne_stat`.
#[no_mangle]
pub unsafe extern "C" fn dafne_lstat(c: *const dafne_client, path: *const c_char, out: *mut dafne_attr) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let (c, path) = unsafe { (client(c)?, string(path)?) };
        let a = c.fs.meta.resolve(path)?;
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, dafne_attr::from(&a)) }
    })
}

/// The attributes of the file open as `fd`; the size includes this
/// descriptor's writes not yet published.
///
/// # Safety
/// `c` is a client handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn dafne_fstat(c: *const dafne_client, fd: c_int, out: *mut dafne_attr) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { client(c)? };
        let o = c.file(fd)?;
        let mut a = c.fs.meta.getattr(o.file.attr().ino)?;
        a.size = a.size.max(o.file.size());
        // SAFETY: `out` is writable by the caller's contract.
        unsafe { put(out, dafne_attr::from(&a)) }
    })
}

/// One directory entry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dafne_dirent {
    pub ino: u64,
    /// Pass back in `*cookie` to continue after this entry.
    pub cookie: u64,
    /// `DT_REG`, `DT_DIR`, `DT_LNK`, … of `<dirent.h>`.
    pub kind: u8,
    /// The name, NUL-terminated.
    pub name: [c_char; DAFNE_NAME_SIZE],
}

impl From<&DirEntry> for dafne_dirent {
    fn from(e: &DirEntry) -> dafne_dirent {
        let mut name = [0 as c_char; DAFNE_NAME_SIZE];
        // The server refuses longer names; a longer one is cut, not overrun.
        for (d, s) in name.iter_mut().zip(e.name.iter().take(DAFNE_NAME_MAX)) {
            *d = *s as c_char;
        }
        dafne_dirent { ino: e.ino, cookie: e.cookie, kind: dirent_type(e.kind), name }
    }
}

/// Lists the directory `path` (symlinks followed) a page at a time: fills
/// up to `max` entries of `out` with those after `*cookie` (0 = from the
/// start), sets `*cookie` to continue after them, and returns how many it
/// filled; 0 at the end. "." and ".." are not listed.
///
/// # Safety
/// `c` is a client handle; `path` a NUL-terminated string; `cookie`
/// readable and writable; `out` writable for `max` entries.
#[no_mangle]
pub unsafe extern "C" fn dafne_readdir(
    c: *const dafne_client,
    path: *const c_char,
    cookie: *mut u64,
    out: *mut dafne_dirent,
    max: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, path) = unsafe { (client(c)?, string(path)?) };
        if cookie.is_null() || out.is_null() || max == 0 {
            return Err(Errno::EINVAL);
        }
        let dir = c.fs.meta.resolve_follow(path)?;
        if dir.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        // SAFETY: `cookie` is readable by the caller's contract.
        let from = unsafe { cookie.read() };
        let want = max.min(512) as u32;
        let (entries, _eof) = c.fs.meta.readdir_page(dir.ino, from, want)?;
        let entries = &entries[..entries.len().min(want as usize)];
        for (i, e) in entries.iter().enumerate() {
            // SAFETY: `i < max`, and `out` is writable for `max` entries.
            unsafe { out.add(i).write(dafne_dirent::from(e)) };
        }
        if let Some(last) = entries.last() {
            // SAFETY: `cookie` is writable by the caller's contract.
            unsafe { cookie.write(last.cookie) };
        }
        Ok(entries.len() as i64)
    }) as c_int
}

/// Makes the directory `path` with permission bits `mode` (no umask).
///
/// # Safety
/// `c` is a client handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dafne_mkdir(c: *const dafne_client, path: *const c_char, mode: u32) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let (c, path) = unsafe { (client(c)?, string(path)?) };
        let (parent, name) = c.parent_of(path)?;
        c.fs.meta.mkdir(parent, name, mode & 0o7777).map(|_| ())
    })
}

/// Removes the empty directory `path`.
///
/// # Safety
/// `c` is a client handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dafne_rmdir(c: *const dafne_client, path: *const c_char) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let (c, path) = unsafe { (client(c)?, string(path)?) };
        let (parent, name) = c.parent_of(path)?;
        c.fs.meta.rmdir(parent, name)
    })
}

/// Removes the name `path` (not a directory). A file still open keeps its
/// data until its last close.
///
/// # Safety
/// `c` is a client handle; `path` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dafne_unlink(c: *const dafne_client, path: *const c_char) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let (c, path) = unsafe { (client(c)?, string(path)?) };
        let (parent, name) = c.parent_of(path)?;
        c.fs.meta.unlink(parent, name)
    })
}

/// Renames `from` to `to` atomically, replacing `to` as `rename(2)` does.
///
/// # Safety
/// `c` is a client handle; `from` and `to` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dafne_rename(c: *const dafne_client, from: *const c_char, to: *const c_char) -> c_int {
    guard_int(|| {
        // SAFETY: the caller's contract.
        let (c, from, to) = unsafe { (client(c)?, string(from)?, string(to)?) };
        let (sp, sn) = c.parent_of(from)?;
        let (dp, dn) = c.parent_of(to)?;
        c.fs.meta.rename(sp, sn, dp, dn)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_the_lowest_free_and_closed_ones_are_ebadf() {
        let mut t = Files { slots: Vec::new() };
        // Slots are filled without files by hand: only the numbering is
        // tested here (files need a cluster: the C test program).
        t.slots = vec![None, None, None];
        assert_eq!(t.get(0).err(), Some(Errno::EBADF));
        assert_eq!(t.get(-1).err(), Some(Errno::EBADF));
        assert_eq!(t.get(7).err(), Some(Errno::EBADF));
        assert_eq!(t.remove(1).err(), Some(Errno::EBADF));
        assert_eq!(t.remove(-3).err(), Some(Errno::EBADF));
    }

    #[test]
    fn file_types_map_to_the_c_constants() {
        assert_eq!(FileType::Regular.mode_bits(), 0o100000);
        assert_eq!(FileType::Directory.mode_bits(), 0o040000);
        assert_eq!(dirent_type(FileType::Regular), 8);
        assert_eq!(dirent_type(FileType::Directory), 4);
        assert_eq!(dirent_type(FileType::Symlink), 10);
    }

    #[test]
    fn a_long_name_is_cut_and_stays_terminated() {
        let e = DirEntry { name: vec![b'x'; 400], ino: 3, kind: FileType::Regular, cookie: 9 };
        let d = dafne_dirent::from(&e);
        assert_eq!(d.name[DAFNE_NAME_MAX], 0);
        assert_eq!(d.name[DAFNE_NAME_MAX - 1], b'x' as c_char);
        assert_eq!((d.ino, d.cookie, d.kind), (3, 9, 8));
    }
}
