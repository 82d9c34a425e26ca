//! Checksums of stored blocks: one CRC32C per 4 KiB block of every chunk
//! file, in a sidecar file beside it.
//!
//! # Grain: 4 KiB blocks aligned in the object's file
//! [`BLOCK`] = 4 KiB is the smallest thing the storage below ever moves:
//! the page of the page cache, the block of the direct path
//! ([`crate::chunk::DIRECT_ALIGN`]) and of ext4/xfs, and the smallest
//! Unifier unit (4–64 KiB, unit-aligned). So a unit fill and a write-back
//! of a whole unit cover whole blocks and verify or checksum them from the
//! unit's own memory, with no extra I/O; a larger grain (a unit) would
//! change with the per-file unit size, and a checksum per unit would have
//! to be recomputed from other bytes at every partial write. The cost is
//! 16 bytes of sidecar per 4 KiB of the file's written span (0.4 % for a
//! dense file; a one-block object's sidecar still takes a 4 KiB block of
//! the file system, and a sparse file's sidecar is sparse too).
//!
//! A block's checksum covers all its 4096 bytes, those past the end of the
//! file counted as zeros (what a read of them returns), so the last,
//! partial block of a file checks like any other.
//!
//! # The sidecar: `objects/<id>.crc`
//! Entry `i` (16 bytes at `16 · i`, little-endian u32s) is block `i`'s:
//! `tag, cur, stable, next`. `tag` = [`TAG`] marks a block that was
//! written; an entry of zeros (never written, or past the sidecar's end: a
//! sparse file) is a *hole*, which must read as zeros. So a hole never
//! raises a false alarm and garbage in a hole does. A read accepts any of
//! the three checksums:
//! * `cur`: the block's content (with no write of it under way);
//! * `stable`: its content at its object's last sync (a power cut may
//!   bring it back);
//! * `next`: the content a write under way leaves (`== cur` when none is).
//!
//! (Entries of the first format, tag [`TAG_V1`]: `tag, cur, prev, 0`, are
//! read as `cur, stable = prev, next = cur`.)
//!
//! # Crashes: begin, write, settle
//! Every change of a block's content (a write-back, a truncate or punch
//! that cuts into it) goes: (1) *begin*, under the [`Unsynced`] lock: the
//! entry becomes `cur` = the content now, `next` = the content after,
//! `stable` kept ([`plan`] reads a partial block to know both; a whole
//! block's content now is its settled entry's, zeros past the end of the
//! file, or else read); (2) the data is written; (3) *settle*: `cur :=
//! next :=` the checksum of what the file now holds. A truncate or punch
//! first makes the entries of the blocks it removes accept zeros too
//! ([`UnsyncedInner::accept_zeros`]), then changes the data, then cuts or
//! punches the sidecar (so a truncate or punch now reads and writes the
//! sidecar entries it removes, 16 bytes per 4 KiB of data removed, on the
//! loop; holes of the sidecar are skipped). The data write is outside the
//! lock; a block is
//! changed by one writer at a time (the Unifier writes a unit back from
//! one place at a time, and truncates and punches wait for an object's
//! write-backs).
//!
//! **What holds after a process crash** (`kill -9`, a panic, at any
//! instant; the page cache survives): every block reads correctly, never
//! `EIO`. A write's data and entry are in the page cache in the order
//! above, so a crash before (1) leaves the old entry and the old bytes;
//! between (1) and (3) the entry accepts the old and the new content and
//! the block holds one of them (a pwrite copies a 4 KiB page whole: a
//! crash does not split one); after (3), the new. Tested by
//! `tests/checksums.rs` (a fault hook that kills the server between (2)
//! and (3), and `kill -9` at random instants under four writers).
//!
//! # Syncs and cleaning
//! A sync makes the sidecar durable, then the data, then *cleans* the
//! entries written since the last sync (`stable := cur`; an entry with a
//! write under way keeps `next`: the synced content is one of the two).
//! The lock is not held across the fdatasyncs. Entries to clean are
//! remembered in memory per object, at most [`MAX_UNSYNCED`] blocks in
//! all; blocks written while the table is full are not remembered and not
//! cleaned: they keep accepting their older stable content too (a weaker
//! check of those blocks, never a false alarm, and a sync never walks a
//! sidecar). Objects never synced stay in the table until their object is
//! synced, removed or the server drains.
//!
//! # Power cut (what remains)
//! Data and sidecar reach the device in any order before a sync (the
//! sidecar is not made durable before each data write: that would cost an
//! fsync per write-back batch). At a power cut:
//! * neither reached it, or only the sidecar: the block holds its stable
//!   content, which `stable` (or the begun entry's `cur`) accepts;
//! * both: `cur` or `next` accepts it;
//! * a sync was under way: the sidecar is made durable *first*, so data
//!   that reached the device is accepted by a durable entry; once the sync
//!   returned, only acknowledged bytes remain;
//! * **what remains**: a block's data reached the device and its begun
//!   entry did not, for a block written after its last sync (on the direct
//!   path the data goes to the device at write-back, the sidecar up to the
//!   kernel's dirty expiry, ~30 s, later). That block then reads `EIO`,
//!   including those of its bytes that were stable before and not
//!   rewritten. Nothing is ever served wrong, and no byte acknowledged
//!   stable is lost *unless its block was rewritten after that sync and
//!   not synced again*. Closing it needs the sidecar durable before each
//!   data write (an fsync per write-back batch) or a journal; not built.
//!   Likewise a block torn by the device reads `EIO`.
//!
//! # Objects without a sidecar
//! Chunk files written before checksums existed have no sidecar and are
//! served unverified (scrub counts them apart and still reads them, so a
//! device error surfaces). A data directory whose chunk files all have one
//! when the server starts gets a marker, `objects/all-checksummed`; from
//! then on, a chunk file without a sidecar there lost it, and scrub
//! reports it as a bad block at offset [`NO_SIDECAR`]; the sidecar is created with the chunk file
//! (before it, under the [`Unsynced`] lock, looking again under it: the
//! loop and the background writer may both create a new object, and a
//! sidecar one of them filled is never emptied), never later: a sidecar
//! made for an old file would call its written blocks holes.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The checksum grain.
pub const BLOCK: u64 = 4096;
/// Bytes of one sidecar entry.
pub const ENTRY: u64 = 16;
/// Marks a written block's entry of the first format (`tag, cur, prev,
/// 0`; "dcrc"), still read: it accepts `cur` and `prev`.
pub const TAG_V1: u32 = 0x6463_7263;
/// Marks a written block's entry (`tag, cur, stable, next`; "dcr3").
pub const TAG: u32 = 0x6463_7233;
/// Blocks remembered as written since their object's last sync, over all
/// objects (8 bytes each, plus the table's overhead).
pub const MAX_UNSYNCED: usize = 1 << 18;

static ZEROS: [u8; BLOCK as usize] = [0; BLOCK as usize];

/// The checksum of a block of zeros (a hole).
pub fn zero_crc() -> u32 {
    static Z: OnceLock<u32> = OnceLock::new();
    *Z.get_or_init(|| crc32c::crc32c(&ZEROS))
}

/// The checksum of a block whose first `data.len()` (≤ [`BLOCK`]) bytes
/// are `data` and the rest zeros.
pub fn block_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    crc32c::crc32c_append(c, &ZEROS[..BLOCK as usize - data.len()])
}

/// The sidecar of the chunk file at `chunk`.
pub fn sidecar_path(chunk: &Path) -> PathBuf {
    let mut s = chunk.as_os_str().to_owned();
    s.push(".crc");
    PathBuf::from(s)
}

/// One block's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Never written (or punched): reads as zeros.
    Hole,
    /// A written block: it may hold any of three contents (module docs).
    Written {
        /// The block's content when no write is under way (the one before
        /// it while one is).
        cur: u32,
        /// Its content when its object was last synced.
        stable: u32,
        /// What the write under way (or one a crash interrupted) leaves;
        /// `== cur` when none is.
        next: u32,
    },
}

impl Entry {
    /// Whether a block with checksum `crc` is what this entry allows.
    pub fn accepts(self, crc: u32) -> bool {
        match self {
            Entry::Hole => crc == zero_crc(),
            Entry::Written { cur, stable, next } => crc == cur || crc == stable || crc == next,
        }
    }

    /// No write under way and none interrupted: `cur` is the content.
    fn settled(self) -> Option<u32> {
        match self {
            Entry::Hole => Some(zero_crc()),
            Entry::Written { cur, next, .. } => (cur == next).then_some(cur),
        }
    }

    fn decode(b: &[u8]) -> Entry {
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        match u(0) {
            TAG => Entry::Written { cur: u(4), stable: u(8), next: u(12) },
            TAG_V1 => Entry::Written { cur: u(4), stable: u(8), next: u(4) },
            _ => Entry::Hole,
        }
    }

    fn encode(self) -> [u8; ENTRY as usize] {
        let mut b = [0u8; ENTRY as usize];
        if let Entry::Written { cur, stable, next } = self {
            b[0..4].copy_from_slice(&TAG.to_le_bytes());
            b[4..8].copy_from_slice(&cur.to_le_bytes());
            b[8..12].copy_from_slice(&stable.to_le_bytes());
            b[12..16].copy_from_slice(&next.to_le_bytes());
        }
        b
    }

    /// Before a write that changes the block from checksum `before` to
    /// `new`: all three contents accepted until it is settled.
    fn begun(self, before: u32, new: u32) -> Entry {
        match self {
            Entry::Hole => Entry::Written { cur: before, stable: zero_crc(), next: new },
            Entry::Written { stable, .. } => Entry::Written { cur: before, stable, next: new },
        }
    }

    /// After the write: the block holds `crc`.
    fn settle(self, crc: u32) -> Entry {
        match self {
            Entry::Hole => Entry::Written { cur: crc, stable: zero_crc(), next: crc },
            Entry::Written { stable, .. } => Entry::Written { cur: crc, stable, next: crc },
        }
    }
}

/// Reads the entries of blocks `[first, first + count)`.
pub fn read_entries(sums: &File, first: u64, count: usize) -> io::Result<Vec<Entry>> {
    let mut buf = vec![0u8; count * ENTRY as usize];
    let mut done = 0;
    while done < buf.len() {
        match sums.read_at(&mut buf[done..], first * ENTRY + done as u64) {
            Ok(0) => break, // past the end: holes
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf.chunks_exact(ENTRY as usize).map(Entry::decode).collect())
}

fn write_entries(sums: &File, first: u64, entries: &[Entry]) -> io::Result<()> {
    let buf: Vec<u8> = entries.iter().flat_map(|e| e.encode()).collect();
    sums.write_all_at(&buf, first * ENTRY)
}

/// The blocks written since their object's last sync, shared by the loop's
/// store and the background writer; its lock also serializes every
/// read-modify-write of sidecar entries.
#[derive(Debug, Default)]
pub struct Unsynced {
    inner: Mutex<UnsyncedInner>,
}

#[derive(Debug, Default)]
pub struct UnsyncedInner {
    blocks: HashMap<u64, HashSet<u64>>,
    total: usize,
    /// Blocks not remembered because the table was full (they keep
    /// accepting their older stable content too).
    dropped: u64,
}

impl Unsynced {
    pub fn lock(&self) -> MutexGuard<'_, UnsyncedInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl UnsyncedInner {
    /// Remembers blocks to clean at their object's next sync; past
    /// [`MAX_UNSYNCED`] they are not (module docs, "Cleaning").
    fn note(&mut self, object: u64, blocks: std::ops::Range<u64>) {
        if self.total + (blocks.end - blocks.start) as usize > MAX_UNSYNCED {
            self.dropped += blocks.end - blocks.start;
            return;
        }
        let set = self.blocks.entry(object).or_default();
        for b in blocks {
            if set.insert(b) {
                self.total += 1;
            }
        }
    }

    /// Forgets the object (removed, or truncated to nothing).
    pub fn forget(&mut self, object: u64) {
        if let Some(s) = self.blocks.remove(&object) {
            self.total -= s.len();
        }
    }

    /// Before a write: blocks `first..` go from checksums `befores` to
    /// `news` ([`plan`]); until [`UnsyncedInner::settle`], their entries
    /// accept the stable, the before and the new content.
    pub fn begin(&mut self, sums: &File, object: u64, first: u64, befores: &[u32], news: &[u32]) -> io::Result<()> {
        let old = read_entries(sums, first, news.len())?;
        let new: Vec<Entry> = old.iter().zip(befores.iter().zip(news)).map(|(e, (&b, &n))| e.begun(b, n)).collect();
        write_entries(sums, first, &new)?;
        self.note(object, first..first + news.len() as u64);
        Ok(())
    }

    /// After a write (or a change by a truncate or punch): blocks `first..`
    /// hold the checksums `crcs`.
    pub fn settle(&mut self, sums: &File, object: u64, first: u64, crcs: &[u32]) -> io::Result<()> {
        let old = read_entries(sums, first, crcs.len())?;
        let new: Vec<Entry> = old.iter().zip(crcs).map(|(e, &c)| e.settle(c)).collect();
        write_entries(sums, first, &new)?;
        self.note(object, first..first + crcs.len() as u64);
        Ok(())
    }

    /// Before a truncate or punch makes blocks `[first, end)` read as
    /// zeros: their written entries accept zeros too (and what the block
    /// holds now), so that a crash before [`UnsyncedInner::punch`] leaves
    /// no false alarm. Holes of the sidecar are skipped.
    pub fn accept_zeros(&mut self, file: &File, sums: &File, first: u64, end: u64) -> io::Result<()> {
        for (a, b) in data_runs(sums, first, end)? {
            let mut entries = read_entries(sums, a, (b - a) as usize)?;
            let mut changed = false;
            for (i, e) in entries.iter_mut().enumerate() {
                if let Entry::Written { stable, .. } = *e {
                    let cur = current(file, *e, a + i as u64)?;
                    *e = Entry::Written { cur, stable, next: zero_crc() };
                    changed = true;
                }
            }
            if changed {
                write_entries(sums, a, &entries)?;
            }
        }
        Ok(())
    }

    /// Makes blocks `[first, end)` holes (a punch, a truncate).
    pub fn punch(&mut self, sums: &File, first: u64, end: u64) -> io::Result<()> {
        if end <= first {
            return Ok(());
        }
        let len = sums.metadata()?.len();
        let (start, stop) = (first * ENTRY, (end * ENTRY).min(len));
        if stop > start {
            use rustix::fs::{fallocate, FallocateFlags};
            fallocate(sums, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, start, stop - start)
                .map_err(io::Error::from)?;
        }
        Ok(())
    }

    /// After a successful sync of the object's data: its dirty entries
    /// accept only their current checksum again.
    pub fn clean(&mut self, sums: &File, object: u64) -> io::Result<()> {
        let blocks = self.blocks.remove(&object).unwrap_or_default();
        self.total -= blocks.len();
        let mut list: Vec<u64> = blocks.into_iter().collect();
        list.sort_unstable();
        // Runs of consecutive blocks, each read and written once.
        let mut i = 0;
        while i < list.len() {
            let mut j = i + 1;
            while j < list.len() && list[j] == list[j - 1] + 1 && j - i < CLEAN_RUN {
                j += 1;
            }
            clean_run(sums, list[i], j - i)?;
            i = j;
        }
        Ok(())
    }
}

/// Entries cleaned per read and write of the sidecar (64 KiB).
const CLEAN_RUN: usize = 4096;

/// `prev := cur` for the entries of blocks `[first, first + count)`.
fn clean_run(sums: &File, first: u64, count: usize) -> io::Result<()> {
    let mut entries = read_entries(sums, first, count)?;
    let mut changed = false;
    for e in &mut entries {
        // A write under way keeps its two contents; the synced one is
        // either of them.
        if let Entry::Written { cur, stable, .. } = e {
            if cur != stable {
                *stable = *cur;
                changed = true;
            }
        }
    }
    if changed {
        write_entries(sums, first, &entries)?;
    }
    Ok(())
}

/// The checksums of the blocks a write of `buf` at `offset` touched, read
/// back from `file` for the partial blocks at its ends (the data is in the
/// file by then). Returns the first block and the checksums.
pub fn written_crcs(file: &File, offset: u64, buf: &[u8]) -> io::Result<(u64, Vec<u32>)> {
    let end = offset + buf.len() as u64;
    let first = offset / BLOCK;
    let last = end.div_ceil(BLOCK);
    let mut crcs = Vec::with_capacity((last - first) as usize);
    let mut block = [0u8; BLOCK as usize];
    for b in first..last {
        let (bs, be) = (b * BLOCK, (b + 1) * BLOCK);
        if bs >= offset && be <= end {
            crcs.push(block_crc(&buf[(bs - offset) as usize..(be - offset) as usize]));
        } else {
            let n = read_full(file, bs, &mut block)?;
            crcs.push(block_crc(&block[..n]));
        }
    }
    Ok((first, crcs))
}

/// Before a write of `buf` at `offset` to `file`: the first block it
/// touches, each block's checksum now and the one it will have after.
/// Partial blocks are read (and their new content is the read one with
/// `buf` laid over it); a whole block's current checksum is its settled
/// entry's, or zeros past the end of the file, or else read.
pub fn plan(file: &File, sums: &File, offset: u64, buf: &[u8]) -> io::Result<(u64, Vec<u32>, Vec<u32>)> {
    let end = offset + buf.len() as u64;
    let first = offset / BLOCK;
    let last = end.div_ceil(BLOCK);
    let entries = read_entries(sums, first, (last - first) as usize)?;
    let len = file.metadata()?.len();
    let (mut befores, mut news) = (Vec::with_capacity(entries.len()), Vec::with_capacity(entries.len()));
    let mut block = [0u8; BLOCK as usize];
    for (b, e) in (first..last).zip(entries) {
        let (bs, be) = (b * BLOCK, (b + 1) * BLOCK);
        if bs >= offset && be <= end {
            befores.push(if bs >= len { zero_crc() } else { current(file, e, b)? });
            news.push(block_crc(&buf[(bs - offset) as usize..(be - offset) as usize]));
        } else {
            let n = read_full(file, bs, &mut block)?;
            befores.push(block_crc(&block[..n]));
            let (lo, hi) = (offset.max(bs), end.min(be));
            block[n..].fill(0);
            block[(lo - bs) as usize..(hi - bs) as usize]
                .copy_from_slice(&buf[(lo - offset) as usize..(hi - offset) as usize]);
            news.push(block_crc(&block[..n.max((hi - bs) as usize)]));
        }
    }
    Ok((first, befores, news))
}

/// The checksum of block `b` now: its entry's if settled, else read.
fn current(file: &File, e: Entry, b: u64) -> io::Result<u32> {
    if let Some(c) = e.settled() {
        return Ok(c);
    }
    let mut block = [0u8; BLOCK as usize];
    let n = read_full(file, b * BLOCK, &mut block)?;
    Ok(block_crc(&block[..n]))
}

/// The runs of entries in `[first, end)` (at most [`CLEAN_RUN`] each) that
/// lie in data extents of the sidecar (its holes are all-hole entries).
fn data_runs(sums: &File, first: u64, end: u64) -> io::Result<Vec<(u64, u64)>> {
    use rustix::fs::{seek, SeekFrom};
    let stop = end.min(sums.metadata()?.len().div_ceil(ENTRY));
    let mut runs = Vec::new();
    let mut at = first;
    while at < stop {
        let data = match seek(sums, SeekFrom::Data(at * ENTRY)) {
            Ok(d) => d / ENTRY,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = match seek(sums, SeekFrom::Hole(data * ENTRY)) {
            Ok(h) => h.div_ceil(ENTRY),
            Err(rustix::io::Errno::NXIO) => stop,
            Err(e) => return Err(e.into()),
        };
        let (a, b) = (data.max(at), hole.min(stop));
        let mut x = a;
        while x < b {
            let y = b.min(x + CLEAN_RUN as u64);
            runs.push((x, y));
            x = y;
        }
        at = b.max(at + 1);
    }
    Ok(runs)
}

/// `pread` until `buf` is full or the end of the file; the count.
pub fn read_full(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The blocks of `[first, end)`, a hole of the data file (they read as
/// zeros), whose entries do not accept zeros. Only the sidecar's data
/// extents are read.
pub fn check_hole(sums: &File, object: u64, first: u64, end: u64) -> io::Result<Vec<BadBlock>> {
    let mut bad = Vec::new();
    for (a, b) in data_runs(sums, first, end)? {
        for (i, e) in read_entries(sums, a, (b - a) as usize)?.into_iter().enumerate() {
            if !e.accepts(zero_crc()) {
                bad.push(BadBlock { object, offset: (a + i as u64) * BLOCK });
            }
        }
    }
    Ok(bad)
}

/// The offset of a [`BadBlock`] that stands for a lost sidecar (scrub).
pub const NO_SIDECAR: u64 = u64::MAX;

/// A block whose bytes do not match its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadBlock {
    pub object: u64,
    /// The block's offset in the object.
    pub offset: u64,
}

/// Checks the blocks of `[offset, offset + data.len())`, whose bytes were
/// just read into `data`; `at_end`: the read came back short there (end of
/// file: the rest of the last block is zeros). Blocks only partly inside
/// are read whole from `file`. Returns the bad ones.
pub fn verify(
    file: &File,
    sums: &File,
    object: u64,
    offset: u64,
    data: &[u8],
    at_end: bool,
) -> io::Result<Vec<BadBlock>> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let end = offset + data.len() as u64;
    let first = offset / BLOCK;
    let last = end.div_ceil(BLOCK);
    let entries = read_entries(sums, first, (last - first) as usize)?;
    let mut bad = Vec::new();
    let mut block = [0u8; BLOCK as usize];
    for (b, e) in (first..last).zip(entries) {
        let (bs, be) = (b * BLOCK, (b + 1) * BLOCK);
        let crc = if bs >= offset && (be <= end || at_end) {
            block_crc(&data[(bs - offset) as usize..(be.min(end) - offset) as usize])
        } else {
            let n = read_full(file, bs, &mut block)?;
            block_crc(&block[..n])
        };
        if !e.accepts(crc) {
            bad.push(BadBlock { object, offset: bs });
        }
    }
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_the_stable_checksum_until_cleaned() {
        let d = tempfile::tempdir().unwrap();
        let f = File::options().read(true).write(true).create(true).truncate(true).open(d.path().join("s")).unwrap();
        let data = File::options().read(true).write(true).create(true).truncate(true).open(d.path().join("d")).unwrap();
        let w = |cur, stable, next| Entry::Written { cur, stable, next };
        let u = Unsynced::default();
        let mut g = u.lock();
        assert_eq!(read_entries(&f, 5, 1).unwrap(), [Entry::Hole]);
        g.settle(&f, 1, 5, &[10]).unwrap();
        assert_eq!(read_entries(&f, 5, 1).unwrap(), [w(10, zero_crc(), 10)]);
        g.clean(&f, 1).unwrap();
        assert_eq!(read_entries(&f, 5, 1).unwrap(), [w(10, 10, 10)]);
        g.settle(&f, 1, 5, &[11]).unwrap();
        g.settle(&f, 1, 5, &[12]).unwrap();
        let e = read_entries(&f, 5, 1).unwrap()[0];
        assert_eq!(e, w(12, 10, 12), "the stable 10 is kept over an unsynced 11");
        assert!(e.accepts(10) && e.accepts(12) && !e.accepts(11));
        // A write begun and not settled (a crash): stable, before and new.
        g.begin(&f, 1, 5, &[12], &[13]).unwrap();
        let e = read_entries(&f, 5, 1).unwrap()[0];
        assert!(e.accepts(10) && e.accepts(12) && e.accepts(13) && !e.accepts(11), "{e:?}");
        // A sync meanwhile: the before is the stable one now, the new still accepted.
        g.clean(&f, 1).unwrap();
        let e = read_entries(&f, 5, 1).unwrap()[0];
        assert!(e.accepts(12) && e.accepts(13) && !e.accepts(10), "{e:?}");
        g.settle(&f, 1, 5, &[13]).unwrap();
        g.clean(&f, 1).unwrap();
        assert_eq!(read_entries(&f, 5, 1).unwrap(), [w(13, 13, 13)]);
        // Before a truncate: zeros accepted too.
        g.accept_zeros(&data, &f, 0, 100).unwrap();
        let e = read_entries(&f, 5, 1).unwrap()[0];
        assert!(e.accepts(13) && e.accepts(zero_crc()), "{e:?}");
        g.punch(&f, 5, 6).unwrap();
        assert_eq!(read_entries(&f, 5, 1).unwrap(), [Entry::Hole]);
        assert!(Entry::Hole.accepts(block_crc(&[])) && !Entry::Hole.accepts(block_crc(&[1])));
        // The first format still reads.
        let mut v1 = [0u8; 16];
        v1[0..4].copy_from_slice(&TAG_V1.to_le_bytes());
        v1[4..8].copy_from_slice(&21u32.to_le_bytes());
        v1[8..12].copy_from_slice(&20u32.to_le_bytes());
        assert_eq!(Entry::decode(&v1), w(21, 20, 21));

        // More blocks than remembered: not cleaned (they keep accepting
        // their older stable content), and a sync costs nothing for them.
        let n = MAX_UNSYNCED as u64 + 1;
        g.settle(&f, 2, 0, &vec![7; n as usize]).unwrap();
        assert_eq!(g.dropped, n);
        g.settle(&f, 2, 0, &[8]).unwrap();
        assert_eq!(read_entries(&f, 0, 1).unwrap(), [w(8, zero_crc(), 8)]);
        g.clean(&f, 2).unwrap();
        assert_eq!(read_entries(&f, 0, 1).unwrap(), [w(8, 8, 8)]);
        assert_eq!(read_entries(&f, n - 1, 1).unwrap(), [w(7, zero_crc(), 7)]);
        assert_eq!(g.total, 0);
    }

    #[test]
    fn a_plan_reads_partial_blocks_and_lays_the_write_over_them() {
        let d = tempfile::tempdir().unwrap();
        let f = File::options().read(true).write(true).create(true).truncate(true).open(d.path().join("s")).unwrap();
        let data = File::options().read(true).write(true).create(true).truncate(true).open(d.path().join("d")).unwrap();
        let old: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        data.write_all_at(&old, 0).unwrap();
        let (first, before, new) = plan(&data, &f, 3000, &[7u8; 6000]).unwrap();
        let mut want = old.clone();
        want[3000..9000].fill(7);
        assert_eq!(first, 0);
        assert_eq!(before, [block_crc(&old[..4096]), zero_crc(), block_crc(&old[8192..])], "a hole entry: zeros");
        assert_eq!(new, [block_crc(&want[..4096]), block_crc(&want[4096..8192]), block_crc(&want[8192..])]);
        data.write_all_at(&want[3000..9000], 3000).unwrap();
        assert_eq!(written_crcs(&data, 3000, &want[3000..9000]).unwrap(), (first, new));
    }
}
