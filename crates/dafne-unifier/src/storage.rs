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
//! without changing the cache's state machine. Syncs are the exception:
//! an `fdatasync` takes milliseconds to seconds on a real device, so the
//! Unifier awaits [`Storage::sync_later`], which the io server's chunk
//! store runs on threads of its own.
//!
//! Every call reads into or writes out of unit memory itself: the bytes move
//! once between the device (or page cache) and the registered unit, and the
//! Unifier never copies them anywhere else.

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

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
    /// [`Storage::sync`] without blocking the caller's thread while the
    /// device syncs: storage that can sync elsewhere (a thread of its own)
    /// starts the sync and returns a future that completes with it. The
    /// Unifier's flush and write-through await it, so an event loop serves
    /// other requests meanwhile. The default syncs at once, on this thread.
    fn sync_later(&self, object: u64) -> SyncFuture<'_> {
        Box::pin(std::future::ready(self.sync(object)))
    }
    /// Reads a batch of units (as [`Storage::read_at`] each; one result per
    /// read, in order). Storage that can submit several reads at once
    /// overrides it; the default reads one after the other.
    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<usize>> {
        reads.iter_mut().map(|r| self.read_at(r.object, r.offset, r.buf)).collect()
    }
    /// A writer for the Unifier's background write-back thread, which then
    /// writes dirty units while the loop serves (see `background.rs`).
    /// `None` (the default): write-behind stays synchronous. The writer
    /// must write to the same objects as `write_at`; it opens what it needs
    /// itself (the Unifier waits for an object's write-backs before it
    /// truncates or removes it).
    fn background(&self) -> Option<Box<dyn BackgroundStorage>> {
        None
    }
}

/// A sync under way ([`Storage::sync_later`]).
pub type SyncFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<()>> + 'a>>;

/// One read of a batch: a unit to fill.
#[derive(Debug)]
pub struct BatchRead<'a> {
    pub object: u64,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// One write of a background batch: a dirty range of a unit.
#[derive(Debug)]
pub struct BackgroundWrite<'a> {
    pub object: u64,
    pub offset: u64,
    pub buf: &'a [u8],
}

/// The storage side of background write-back, owned by its thread.
pub trait BackgroundStorage: Send {
    /// Writes every range (all of each `buf`), as [`Storage::write_at`]
    /// would; one result per write, in order. A batch may go to the
    /// device as one submission.
    fn write_batch(&mut self, writes: &[BackgroundWrite<'_>]) -> Vec<io::Result<()>>;
}

impl<T: Storage + ?Sized> Storage for Rc<T> {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(object, offset, buf)
    }
    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<usize>> {
        (**self).read_batch(reads)
    }
    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(object, offset, buf)
    }
    fn sync(&self, object: u64) -> io::Result<()> {
        (**self).sync(object)
    }
    fn sync_later(&self, object: u64) -> SyncFuture<'_> {
        (**self).sync_later(object)
    }
    fn background(&self) -> Option<Box<dyn BackgroundStorage>> {
        (**self).background()
    }
}

impl<T: Storage + ?Sized> Storage for Box<T> {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read_at(object, offset, buf)
    }
    fn read_batch(&self, reads: &mut [BatchRead<'_>]) -> Vec<io::Result<usize>> {
        (**self).read_batch(reads)
    }
    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_at(object, offset, buf)
    }
    fn sync(&self, object: u64) -> io::Result<()> {
        (**self).sync(object)
    }
    fn sync_later(&self, object: u64) -> SyncFuture<'_> {
        (**self).sync_later(object)
    }
    fn background(&self) -> Option<Box<dyn BackgroundStorage>> {
        (**self).background()
    }
}

/// Counters of a [`MemStorage`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MemStorageStats {
    /// Batches written by a background writer (their writes count in `writes`).
    pub background_batches: u64,
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// A `HashMap`-backed [`Storage`] for tests, with injected failures: the
/// twin that lets tests cause the storage errors real disks cause rarely.
/// Its state is shared (`Arc<Mutex>`) so that, with
/// [`MemStorage::set_background`], a background write-back thread writes
/// to the same objects.
#[derive(Debug, Default)]
pub struct MemStorage {
    shared: Arc<Mutex<MemState>>,
    background: Cell<bool>,
    /// While `true`, background batches wait before writing (tests hold
    /// units in flight with it).
    gate: Arc<(Mutex<bool>, Condvar)>,
}

#[derive(Debug, Default)]
struct MemState {
    objects: HashMap<u64, Vec<u8>>,
    stats: MemStorageStats,
    fail_reads: u32,
    fail_writes: u32,
    fail_syncs: u32,
}

impl MemStorage {
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    fn state(&self) -> MutexGuard<'_, MemState> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Offer a background writer to the Unifier (off by default: write-behind
    /// is then synchronous, as with a storage that cannot offer one).
    pub fn set_background(&self, on: bool) {
        self.background.set(on);
    }

    /// Holds (`true`) or releases background batches: a held batch waits,
    /// with its units in flight, until released.
    pub fn hold_background(&self, hold: bool) {
        let (m, cv) = &*self.gate;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = hold;
        cv.notify_all();
    }

    /// A copy of the object's bytes (empty if it does not exist).
    pub fn contents(&self, object: u64) -> Vec<u8> {
        self.state().objects.get(&object).cloned().unwrap_or_default()
    }

    /// Replaces the object's bytes.
    pub fn set(&self, object: u64, bytes: Vec<u8>) {
        self.state().objects.insert(object, bytes);
    }

    /// Cuts or zero-extends the object to `len` bytes.
    pub fn truncate(&self, object: u64, len: usize) {
        self.state().objects.entry(object).or_default().resize(len, 0);
    }

    /// Deletes the object.
    pub fn remove(&self, object: u64) {
        self.state().objects.remove(&object);
    }

    pub fn stats(&self) -> MemStorageStats {
        self.state().stats
    }

    /// The next `n` reads fail with an I/O error.
    pub fn fail_next_reads(&self, n: u32) {
        self.state().fail_reads = n;
    }

    /// The next `n` writes fail with an I/O error (and write nothing),
    /// background writes included.
    pub fn fail_next_writes(&self, n: u32) {
        self.state().fail_writes = n;
    }

    /// The next `n` syncs fail with an I/O error.
    pub fn fail_next_syncs(&self, n: u32) {
        self.state().fail_syncs = n;
    }
}

fn injected(counter: &mut u32, what: &str) -> io::Result<()> {
    match *counter {
        0 => Ok(()),
        n => {
            *counter = n - 1;
            Err(io::Error::other(format!("injected {what} failure")))
        }
    }
}

impl MemState {
    fn write_at(&mut self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        injected(&mut self.fail_writes, "write")?;
        let start = usize::try_from(offset).map_err(|_| io::Error::other("offset beyond memory"))?;
        let end = start.checked_add(buf.len()).ok_or_else(|| io::Error::other("offset beyond memory"))?;
        let data = self.objects.entry(object).or_default();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(buf);
        self.stats.writes += 1;
        self.stats.bytes_written += buf.len() as u64;
        Ok(())
    }
}

impl Storage for MemStorage {
    fn read_at(&self, object: u64, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut st = self.state();
        injected(&mut st.fail_reads, "read")?;
        let data = st.objects.get(&object).map(Vec::as_slice).unwrap_or(&[]);
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
        let n = (data.len() - start).min(buf.len());
        buf[..n].copy_from_slice(&data[start..start + n]);
        st.stats.reads += 1;
        st.stats.bytes_read += n as u64;
        Ok(n)
    }

    fn write_at(&self, object: u64, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.state().write_at(object, offset, buf)
    }

    fn sync(&self, _object: u64) -> io::Result<()> {
        let mut st = self.state();
        injected(&mut st.fail_syncs, "sync")?;
        st.stats.syncs += 1;
        Ok(())
    }

    fn background(&self) -> Option<Box<dyn BackgroundStorage>> {
        self.background.get().then(|| {
            Box::new(MemBackground { shared: self.shared.clone(), gate: self.gate.clone() })
                as Box<dyn BackgroundStorage>
        })
    }
}

/// [`MemStorage`]'s background writer: the same objects, from another thread.
#[derive(Debug)]
struct MemBackground {
    shared: Arc<Mutex<MemState>>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl BackgroundStorage for MemBackground {
    fn write_batch(&mut self, writes: &[BackgroundWrite<'_>]) -> Vec<io::Result<()>> {
        let (m, cv) = &*self.gate;
        let mut held = m.lock().unwrap_or_else(|e| e.into_inner());
        while *held {
            held = cv.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        drop(held);
        let mut st = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        let res = writes.iter().map(|w| st.write_at(w.object, w.offset, w.buf)).collect();
        st.stats.background_batches += 1;
        res
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
