//! Chunk files: one sparse file per object.
//!
//! Storage I/O here is plain positioned `pread`/`pwrite` through the page
//! cache. O_DIRECT through io_uring (issue 4) is not implemented yet: the
//! Unifier's `Storage` trait is where it will go. Until then, *drop-behind*
//! ([`ChunkStore::set_drop_behind`]) approximates it for the Unifier, so
//! that its units are the only cached copy of the data:
//!
//! * after a storage read, the aligned [`DROP_CHUNK`] before the one read
//!   is dropped from the page cache (`POSIX_FADV_DONTNEED`). Not the range
//!   just read: readahead fills the page cache with folios of up to 2 MiB,
//!   and `DONTNEED` drops only folios wholly inside its range, so dropping
//!   a 64 KiB unit's range would keep its pages, and dropping its whole
//!   chunk would throw away what readahead fetched for the next units. A
//!   sequential reader therefore keeps at most about a chunk (plus the
//!   readahead window) in the page cache; a random reader may keep more;
//! * after a storage write, the range written is advised `DONTNEED`, which
//!   starts its write-back; the pages go once clean (a later read's
//!   drop-behind, or the kernel).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use dafne_unifier::Storage;

/// Open files kept (each costs a descriptor).
const OPEN_FILES: usize = 256;

/// The granularity of page-cache drops: the largest page-cache folio on
/// x86-64 (a PMD, 2 MiB). `POSIX_FADV_DONTNEED` drops only folios wholly
/// inside its range, and folios are aligned to their size, so an aligned
/// chunk of this size is dropped whole whatever folios hold it.
pub const DROP_CHUNK: u64 = 2 << 20;

/// The objects of one io server.
#[derive(Debug)]
pub struct ChunkStore {
    dir: PathBuf,
    open: RefCell<HashMap<u64, File>>,
    drop_behind: Cell<bool>,
    /// Per object, the chunk most recently dropped behind a read.
    dropped: RefCell<HashMap<u64, u64>>,
}

impl ChunkStore {
    pub fn open(data_dir: &Path) -> io::Result<ChunkStore> {
        let dir = data_dir.join("objects");
        std::fs::create_dir_all(&dir)?;
        Ok(ChunkStore {
            dir,
            open: RefCell::new(HashMap::new()),
            drop_behind: Cell::new(false),
            dropped: RefCell::new(HashMap::new()),
        })
    }

    /// fsyncs every object file this store holds open.
    pub fn sync_all(&self) -> io::Result<()> {
        for f in self.open.borrow().values() {
            f.sync_all()?;
        }
        Ok(())
    }

    /// Size of the file system holding the objects and the bytes available
    /// on it (`statvfs`), for `statfs` and `dafne status`.
    /// Also the file system's id, to tell servers sharing one apart.
    pub fn capacity(&self) -> io::Result<(u64, u64, u64)> {
        let v = rustix::fs::statvfs(&self.dir).map_err(io::Error::from)?;
        Ok((v.f_blocks.saturating_mul(v.f_frsize), v.f_bavail.saturating_mul(v.f_frsize), v.f_fsid))
    }

    /// Drop each range read or written through [`Storage`] from the page
    /// cache afterwards (see the module docs).
    pub fn set_drop_behind(&self, on: bool) {
        self.drop_behind.set(on);
    }

    /// Asks the kernel to drop the object's `[offset, offset + len)` from the
    /// page cache (`POSIX_FADV_DONTNEED`): clean pages go at once, dirty ones
    /// are queued for write-back. Data is never lost. A missing object is
    /// not an error.
    pub fn drop_cache(&self, object: u64, offset: u64, len: u64) -> io::Result<()> {
        self.with_file(object, false, |f| {
            rustix::fs::fadvise(f, offset, std::num::NonZeroU64::new(len), rustix::fs::Advice::DontNeed)
                .map_err(io::Error::from)
        })
        .map(|_| ())
    }

    fn path(&self, object: u64) -> PathBuf {
        self.dir.join(format!("{object:016x}"))
    }

    /// Runs `f` on the object's file, opening (and with `create`, creating)
    /// it. `Ok(None)`: the object does not exist and `create` is false.
    pub fn with_file<T>(
        &self,
        object: u64,
        create: bool,
        f: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<Option<T>> {
        if let Some(file) = self.open.borrow().get(&object) {
            return f(file).map(Some);
        }
        let file =
            match OpenOptions::new().read(true).write(true).create(create).truncate(false).open(self.path(object)) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
                Err(e) => return Err(e),
            };
        let r = f(&file);
        let mut open = self.open.borrow_mut();
        if open.len() >= OPEN_FILES {
            open.clear();
        }
        open.insert(object, file);
        r.map(Some)
    }

    /// Bytes stored (the file length: the largest byte written or truncated to).
    pub fn size(&self, object: u64) -> io::Result<u64> {
        Ok(self.with_file(object, false, |f| Ok(f.metadata()?.len()))?.unwrap_or(0))
    }

    pub fn truncate(&self, object: u64, size: u64) -> io::Result<()> {
        self.with_file(object, true, |f| f.set_len(size)).map(|_| ())
    }

    pub fn remove(&self, object: u64) -> io::Result<()> {
        self.open.borrow_mut().remove(&object);
        self.dropped.borrow_mut().remove(&object);
        match std::fs::remove_file(self.path(object)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl Storage for ChunkStore {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.with_file(object, false, |f| {
            let mut done = 0;
            while done < buf.len() {
                match f.read_at(&mut buf[done..], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let chunk = offset / DROP_CHUNK;
            if self.drop_behind.get() && chunk > 0 {
                let behind = chunk - 1;
                let mut dropped = self.dropped.borrow_mut();
                if dropped.get(&object) != Some(&behind) {
                    if dropped.len() >= OPEN_FILES {
                        dropped.clear();
                    }
                    dropped.insert(object, behind);
                    let len = std::num::NonZeroU64::new(DROP_CHUNK);
                    let _ = rustix::fs::fadvise(f, behind * DROP_CHUNK, len, rustix::fs::Advice::DontNeed);
                }
            }
            Ok(done)
        })?;
        Ok(n.unwrap_or(0))
    }

    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.with_file(object, true, |f| {
            f.write_all_at(buf, offset)?;
            if self.drop_behind.get() {
                let _ = rustix::fs::fadvise(
                    f,
                    offset,
                    std::num::NonZeroU64::new(buf.len() as u64),
                    rustix::fs::Advice::DontNeed,
                );
            }
            Ok(())
        })
        .map(|_| ())
    }

    fn sync(&self, object: u64) -> io::Result<()> {
        self.with_file(object, false, |f| f.sync_data()).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_objects_read_back_with_holes_as_zeros() {
        let d = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(d.path()).unwrap();
        let mut buf = [9u8; 8];
        assert_eq!(s.read_at(7, 0, &mut buf).unwrap(), 0, "missing object reads empty");
        s.write_at(7, 1 << 20, b"hello").unwrap();
        assert_eq!(s.size(7).unwrap(), (1 << 20) + 5);
        let mut hole = [1u8; 16];
        assert_eq!(s.read_at(7, 100, &mut hole).unwrap(), 16);
        assert_eq!(hole, [0u8; 16]);
        let mut tail = [0u8; 8];
        assert_eq!(s.read_at(7, 1 << 20, &mut tail).unwrap(), 5);
        assert_eq!(&tail[..5], b"hello");
        s.truncate(7, 3).unwrap();
        assert_eq!(s.size(7).unwrap(), 3);
        s.sync(7).unwrap();
        s.remove(7).unwrap();
        assert_eq!(s.size(7).unwrap(), 0);
        s.remove(7).unwrap();
    }
}
