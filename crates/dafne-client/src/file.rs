//! Files: the namespace session and the data client together, with the
//! size rule of the design: a file's length may lag while it is open for
//! writing, and is exact in meta after `fsync` or `close`, also with several
//! writers on several stripes (each publishes the largest byte any io
//! server holds, which the servers compute after writing back their cache).
//!
//! A [`File`] holds its open in meta (so its data outlives an unlink) until
//! it is closed or dropped; dropping closes it in meta too, without
//! publishing the size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dafne_proto::io::{AllocateMode, Stability};
use dafne_proto::{Errno, Ino, LayoutHint, SetAttr};

use crate::cq::{CompletionQueue, Ticket};
use crate::data::{DataClient, RegionSlice};
use crate::{Attr, MetaSession, OpenFile};

/// A client of one cluster: namespace and data.
#[derive(Debug, Clone)]
pub struct Fs {
    pub meta: MetaSession,
    pub data: DataClient,
}

/// An open file; closed in meta when dropped.
#[derive(Debug)]
pub struct File {
    fs: Fs,
    open: OpenFile,
    /// The size known to this handle: meta's at open, grown by own writes
    /// (shared with the writes posted to completion queues).
    size: Arc<AtomicU64>,
}

impl Fs {
    /// The data client is attached to the session, which re-issues the
    /// capabilities of its opens after a revocation (`data`'s module docs).
    pub fn new(meta: MetaSession, data: DataClient) -> Fs {
        data.attach_meta(meta.clone());
        Fs { meta, data }
    }

    /// Creates (exclusively) and opens a file for reading and writing.
    pub fn create(&self, parent: Ino, name: &[u8], mode: u32, hint: Option<LayoutHint>) -> Result<File, Errno> {
        let a = self.meta.create_with(parent, name, mode, true, hint)?;
        self.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE)
    }

    /// Opens by inode (`OPEN_*` flags; `OPEN_TRUNC` also empties the data).
    pub fn open(&self, ino: Ino, flags: u32) -> Result<File, Errno> {
        let open = self.meta.open(ino, flags)?;
        let size = Arc::new(AtomicU64::new(open.attr.size));
        // Built first, so that a failed truncation closes it again.
        let f = File { fs: self.clone(), open, size };
        if flags & dafne_proto::OPEN_TRUNC != 0 {
            futures::executor::block_on(self.data.truncate(&f.open, 0))?;
        }
        Ok(f)
    }
}

impl File {
    pub fn attr(&self) -> &Attr {
        &self.open.attr
    }

    pub fn handle(&self) -> &OpenFile {
        &self.open
    }

    /// The size as this handle knows it.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    pub fn write_at(&self, offset: u64, data: &[u8], stability: Stability) -> Result<usize, Errno> {
        let n = futures::executor::block_on(self.fs.data.write_at(&self.open, offset, data, stability))?;
        self.size.fetch_max(offset + n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Reads up to `buf.len()` bytes, never past the size this handle knows.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let n = self.readable(offset, buf.len());
        if n == 0 {
            return Ok(0);
        }
        futures::executor::block_on(self.fs.data.read_at(&self.open, offset, &mut buf[..n]))
    }

    /// [`Self::read_at`] through [`DataClient::read_into`]: zero-copy on a
    /// cached registration of `buf` from
    /// [`ZERO_COPY_MIN`](crate::data::ZERO_COPY_MIN) bytes up where the io
    /// servers can reach it, else one copy through a bounce buffer.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        let n = self.readable(offset, buf.len());
        if n == 0 {
            return Ok(0);
        }
        futures::executor::block_on(self.fs.data.read_into(&self.open, offset, &mut buf[..n]))
    }

    /// [`Self::write_at`] through [`DataClient::write_from`] (zero-copy as
    /// [`Self::read_into`]).
    pub fn write_from(&self, offset: u64, buf: &[u8], stability: Stability) -> Result<usize, Errno> {
        let n = futures::executor::block_on(self.fs.data.write_from(&self.open, offset, buf, stability))?;
        self.size.fetch_max(offset + n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Reads into registered memory (`len` bytes at `region_offset`),
    /// zero-copy: the io servers put straight into it. Never past the size
    /// this handle knows.
    pub fn read_region(&self, offset: u64, from: &RegionSlice) -> Result<usize, Errno> {
        let n = self.readable(offset, from.len);
        if n == 0 {
            return Ok(0);
        }
        futures::executor::block_on(self.fs.data.read_region(&self.open, offset, &from.region, from.offset, n))
    }

    /// Writes from registered memory, zero-copy: the io servers get
    /// straight from it.
    pub fn write_region(&self, offset: u64, from: &RegionSlice, stability: Stability) -> Result<usize, Errno> {
        let n = futures::executor::block_on(self.fs.data.write_region(
            &self.open,
            offset,
            &from.region,
            from.offset,
            from.len,
            stability,
        ))?;
        self.size.fetch_max(offset + n as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Posts a zero-copy read into registered memory on `cq`, clamped now
    /// to the size this handle knows (a read at or past it completes with
    /// 0 bytes).
    pub fn post_read(&self, cq: &CompletionQueue, offset: u64, into: RegionSlice) -> Ticket {
        let len = into.len;
        self.post_read_with(cq, offset, len, move |data, open, n| async move {
            data.read_region(&open, offset, &into.region, into.offset, n).await
        })
    }

    /// Posts a zero-copy write from registered memory on `cq`; the size
    /// this handle knows grows when it completes.
    pub fn post_write(&self, cq: &CompletionQueue, offset: u64, from: RegionSlice, stability: Stability) -> Ticket {
        self.post_write_with(cq, offset, move |data, open| async move {
            data.write_region(&open, offset, &from.region, from.offset, from.len, stability).await
        })
    }

    /// Posts on `cq` the read of up to `len` bytes at `offset` that `read`
    /// makes from the data client, the open and the length clamped to the
    /// size this handle knows (0 bytes complete at once, without calling
    /// `read`). For callers with memory of their own kind (the C library's
    /// registered application buffers).
    pub fn post_read_with<F>(
        &self,
        cq: &CompletionQueue,
        offset: u64,
        len: usize,
        read: impl FnOnce(DataClient, OpenFile, usize) -> F,
    ) -> Ticket
    where
        F: std::future::Future<Output = Result<usize, Errno>> + Send + 'static,
    {
        let n = self.readable(offset, len);
        if n == 0 {
            return cq.post(async { Ok(0) });
        }
        cq.post(read(self.fs.data.clone(), self.open.clone(), n))
    }

    /// Posts on `cq` the write at `offset` that `write` makes from the
    /// data client and the open; the size this handle knows grows by the
    /// bytes it reports when it completes.
    pub fn post_write_with<F>(
        &self,
        cq: &CompletionQueue,
        offset: u64,
        write: impl FnOnce(DataClient, OpenFile) -> F,
    ) -> Ticket
    where
        F: std::future::Future<Output = Result<usize, Errno>> + Send + 'static,
    {
        let size = self.size.clone();
        let op = write(self.fs.data.clone(), self.open.clone());
        cq.post(async move {
            let n = op.await?;
            size.fetch_max(offset + n as u64, Ordering::Relaxed);
            Ok(n)
        })
    }

    /// Bytes of `len` at `offset` before the size this handle knows.
    fn readable(&self, offset: u64, len: usize) -> usize {
        let size = self.size();
        if offset >= size {
            return 0;
        }
        len.min((size - offset).min(usize::MAX as u64) as usize)
    }

    /// Learns meta's size where it is larger than this handle's (writes
    /// another client published since the open); returns the size known
    /// now. Sizes only grow here, as in publishing. A file unlinked while
    /// open is no longer in meta (its data object waits for the last
    /// close as an orphan), so nobody else can grow it: `ENOENT` there
    /// means the size this handle knows, not an error of the caller's
    /// read (`tempfile.TemporaryFile` reads back such a file).
    pub fn refresh_size(&self) -> Result<u64, Errno> {
        let current = match self.fs.meta.getattr(self.open.attr.ino) {
            Ok(a) => a.size,
            Err(Errno::ENOENT) => return Ok(self.size()),
            Err(e) => return Err(e),
        };
        Ok(self.size.fetch_max(current, Ordering::Relaxed).max(current))
    }

    /// The size changed through another path to the same file (a
    /// truncation through the mount, which set it on the servers and in
    /// meta): this handle knows exactly `size` from now on.
    pub fn set_known_size(&self, size: u64) {
        self.size.store(size, Ordering::Relaxed);
    }

    /// The file is at least `size` long (another handle of the same
    /// process wrote up to there and has not published it yet): reads
    /// through this handle reach that far.
    pub fn grow_known_size(&self, size: u64) {
        self.size.fetch_max(size, Ordering::Relaxed);
    }

    /// Publishes the size (as `close` does) and keeps the file open.
    pub fn publish(&self) -> Result<(), Errno> {
        self.publish_size()
    }

    /// Sets the size on every io server and in meta.
    pub fn truncate(&self, size: u64) -> Result<(), Errno> {
        futures::executor::block_on(self.fs.data.truncate(&self.open, size))?;
        self.fs.meta.setattr(self.open.attr.ino, SetAttr { size: Some(size), ..Default::default() })?;
        self.size.store(size, Ordering::Relaxed);
        Ok(())
    }

    /// `fallocate` of `[offset, offset + len)` ([`DataClient::fallocate`]);
    /// a mode that does not keep the size makes the range's end the size
    /// where it is larger, in meta too (as a write past the end would once
    /// published).
    pub fn fallocate(&self, offset: u64, len: u64, mode: AllocateMode) -> Result<(), Errno> {
        futures::executor::block_on(self.fs.data.fallocate(&self.open, offset, len, mode))?;
        let end = offset + len;
        if !mode.keeps_size() && end > self.size() {
            let current = self.fs.meta.getattr(self.open.attr.ino)?.size;
            if end > current {
                self.fs.meta.setattr(self.open.attr.ino, SetAttr { size: Some(end), ..Default::default() })?;
            }
            self.size.fetch_max(end, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Makes the data durable and the size exact in meta.
    pub fn fsync(&self) -> Result<(), Errno> {
        futures::executor::block_on(self.fs.data.sync(&self.open))?;
        self.publish_size()
    }

    /// Publishes the size (without forcing data to disk) and closes (in
    /// meta too, whatever the publishing's outcome). A handle that may not
    /// write has nothing to publish.
    pub fn close(self) -> Result<(), Errno> {
        if self.open.cap.rights & dafne_proto::RIGHT_WRITE == 0 {
            return Ok(());
        }
        self.publish_size()
        // `drop(self)` closes in meta.
    }

    /// Meta's size becomes the largest byte any io server holds (what
    /// `close` does; for a handle shared by several users, the last of
    /// which drops it). Sizes only grow here; shrinking is `truncate`'s job.
    /// A file unlinked while open has no size to publish.
    pub fn publish_size(&self) -> Result<(), Errno> {
        match self.try_publish_size() {
            Err(Errno::ENOENT) => Ok(()),
            r => r,
        }
    }

    fn try_publish_size(&self) -> Result<(), Errno> {
        let ino = self.open.attr.ino;
        let stored = match futures::executor::block_on(self.fs.data.stored_size(&self.open)) {
            Err(Errno::EACCES) if self.open.cap.rights & dafne_proto::RIGHT_READ == 0 => {
                self.stored_size_as_reader(ino)?
            }
            r => r?,
        };
        let current = self.fs.meta.getattr(ino)?.size;
        if stored > current {
            self.fs.meta.setattr(ino, SetAttr { size: Some(stored), ..Default::default() })?;
        }
        self.size.store(stored.max(current), Ordering::Relaxed);
        Ok(())
    }

    /// The stored size through a reading capability: io servers before
    /// protocol 14 tell it only to one that may read, so a write-only
    /// handle asks meta for one (as the mount does), and releases that
    /// open right away. (Newer ones answer the writer's own.)
    fn stored_size_as_reader(&self, ino: Ino) -> Result<u64, Errno> {
        let reader = self.fs.meta.open(ino, dafne_proto::OPEN_READ)?;
        let r = futures::executor::block_on(self.fs.data.stored_size(&reader));
        if let Err(e) = self.fs.meta.close(reader.layout.object_id) {
            tracing::debug!("closing object {} in meta: {e}", reader.layout.object_id);
        }
        r
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // Losing the connection releases the open in meta as well, so a
        // failure here leaves nothing held for long (`dafne_meta::opens`).
        if let Err(e) = self.fs.meta.close(self.open.layout.object_id) {
            tracing::debug!("closing object {} in meta: {e}", self.open.layout.object_id);
        }
    }
}
