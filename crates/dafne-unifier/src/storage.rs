//! The storage below the cache, and an in-memory twin with fault injection.
//!
//! # Why synchronous
//! The io server runs one event-loop thread, and so does the Unifier. A
//! `Storage` call blocks that thread for its duration, which is the right
//! trade-off for the storage the io server has today (chunk files in the
//! page cache, or O_DIRECT on a local NVMe device where a 64 KiB read takes
//! tens of microseconds): an asynchronous interface would buy overlap only
//! while the device is slow, and costs a state machine per fill. The
//! io server decides how to implement the trait (plain `pread`/`pwrite`, or
//! an io_uring it submits to and reaps from); the Unifier never holds a
//! borrow of its own state across a call, and keeps a unit being filled
//! marked as such, so an asynchronous storage can take this trait's place
//! without changing the cache's state machine.
//!
//! Every call reads into or writes out of unit memory itself: the bytes move
//! once between the device (or page cache) and the registered unit, and the
//! Unifier never copies them anywhere else.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::rc::Rc;

/// Byte-addressed objects (chunk files) below the cache.
///
/// Implementations must not call back into the [`crate::Unifier`] that owns
/// them except to read or write other units (the Unifier tolerates that, but
/// it can only deadlock a single-threaded server).
pub trait Storage {
    /// Reads up to `buf.len()` bytes of `object` at `offset` into `buf`,
    /// retrying partial reads itself. Returns the bytes read; a count short
    /// of `buf.len()` means end of object, and the Unifier zero-fills the
    /// rest (bytes past the end read as zeros, as in a sparse file). A
    /// missing object reads as empty.
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes all of `buf` to `object` at `offset`, extending it (with
    /// zeros in any hole) as needed.
    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes the object's written bytes durable (`fdatasync`).
    fn sync(&self, object: u64) -> io::Result<()>;
}

impl<T: Storage + ?Sized> Storage for Rc<T> {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(object, offset, buf)
    }
    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(object, offset, buf)
    }
    fn sync(&self, object: u64) -> io::Result<()> {
        (**self).sync(object)
    }
}

impl<T: Storage + ?Sized> Storage for Box<T> {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(object, offset, buf)
    }
    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(object, offset, buf)
    }
    fn sync(&self, object: u64) -> io::Result<()> {
        (**self).sync(object)
    }
}

/// Counters of a [`MemStorage`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemStorageStats {
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// A `HashMap`-backed [`Storage`] for tests, with injected failures: the
/// twin that lets tests cause the storage errors real disks cause rarely.
#[derive(Debug, Default)]
pub struct MemStorage {
    objects: RefCell<HashMap<u64, Vec<u8>>>,
    stats: Cell<MemStorageStats>,
    fail_reads: Cell<u32>,
    fail_writes: Cell<u32>,
    fail_syncs: Cell<u32>,
}

impl MemStorage {
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    /// A copy of the object's bytes (empty if it does not exist).
    pub fn contents(&self, object: u64) -> Vec<u8> {
        self.objects.borrow().get(&object).cloned().unwrap_or_default()
    }

    /// Replaces the object's bytes.
    pub fn set(&self, object: u64, bytes: Vec<u8>) {
        self.objects.borrow_mut().insert(object, bytes);
    }

    /// Cuts or zero-extends the object to `len` bytes.
    pub fn truncate(&self, object: u64, len: usize) {
        self.objects.borrow_mut().entry(object).or_default().resize(len, 0);
    }

    /// Deletes the object.
    pub fn remove(&self, object: u64) {
        self.objects.borrow_mut().remove(&object);
    }

    pub fn stats(&self) -> MemStorageStats {
        self.stats.get()
    }

    /// The next `n` reads fail with an I/O error.
    pub fn fail_next_reads(&self, n: u32) {
        self.fail_reads.set(n);
    }

    /// The next `n` writes fail with an I/O error (and write nothing).
    pub fn fail_next_writes(&self, n: u32) {
        self.fail_writes.set(n);
    }

    /// The next `n` syncs fail with an I/O error.
    pub fn fail_next_syncs(&self, n: u32) {
        self.fail_syncs.set(n);
    }

    fn injected(counter: &Cell<u32>, what: &str) -> io::Result<()> {
        match counter.get() {
            0 => Ok(()),
            n => {
                counter.set(n - 1);
                Err(io::Error::other(format!("injected {what} failure")))
            }
        }
    }

    fn count(&self, f: impl FnOnce(&mut MemStorageStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }
}

impl Storage for MemStorage {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        MemStorage::injected(&self.fail_reads, "read")?;
        let objects = self.objects.borrow();
        let data = objects.get(&object).map(Vec::as_slice).unwrap_or(&[]);
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
        let n = (data.len() - start).min(buf.len());
        buf[..n].copy_from_slice(&data[start..start + n]);
        self.count(|s| {
            s.reads += 1;
            s.bytes_read += n as u64;
        });
        Ok(n)
    }

    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        MemStorage::injected(&self.fail_writes, "write")?;
        let start = usize::try_from(offset).map_err(|_| io::Error::other("offset beyond memory"))?;
        let end = start.checked_add(buf.len()).ok_or_else(|| io::Error::other("offset beyond memory"))?;
        let mut objects = self.objects.borrow_mut();
        let data = objects.entry(object).or_default();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(buf);
        self.count(|s| {
            s.writes += 1;
            s.bytes_written += buf.len() as u64;
        });
        Ok(())
    }

    fn sync(&self, _object: u64) -> io::Result<()> {
        MemStorage::injected(&self.fail_syncs, "sync")?;
        self.count(|s| s.syncs += 1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_read_at_end_and_holes_are_zero() {
        let s = MemStorage::new();
        s.write_at(1, 10, b"abc").unwrap();
        assert_eq!(s.contents(1), [&[0u8; 10][..], b"abc"].concat());
        let mut buf = [9u8; 8];
        assert_eq!(s.read_at(1, 8, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], &[0, 0, b'a', b'b', b'c']);
        assert_eq!(s.read_at(1, 100, &mut buf).unwrap(), 0);
        assert_eq!(s.read_at(2, 0, &mut buf).unwrap(), 0);
        s.fail_next_reads(1);
        assert!(s.read_at(1, 0, &mut buf).is_err());
        assert!(s.read_at(1, 0, &mut buf).is_ok());
    }
}
