//! The chunk store's two storage paths against a reference model, the
//! `--storage` decision with the failures this machine does not have
//! injected, and the probe on a real disk (`CARGO_TARGET_TMPDIR`).

mod common;

use std::io;
use std::path::{Path, PathBuf};

use dafne_io::chunk::{
    decide, probe_direct, AlignedBuf, ChunkStore, DirectRefused, StorageMode, StoragePath, DIRECT_ALIGN,
};
use dafne_unifier::{BatchRead, Storage};

use common::Rng;

fn disk_dir() -> tempfile::TempDir {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// A direct store on a real disk, or `None` (with a note) where the
/// target directory's file system cannot do it.
fn direct_store(dir: &Path) -> Option<ChunkStore> {
    let objects = ChunkStore::objects_dir(dir);
    std::fs::create_dir_all(&objects).unwrap();
    match decide(StorageMode::Auto, &objects, probe_direct).unwrap() {
        StoragePath::Direct(ring) => Some(ChunkStore::open_with(dir, Some(*ring)).unwrap()),
        StoragePath::Buffered(why) => {
            // CI sets DAFNE_REQUIRE_DIRECT (scripts/test.sh): there the
            // direct path must be tested, never skipped in silence.
            assert!(
                std::env::var_os("DAFNE_REQUIRE_DIRECT").is_none(),
                "{} cannot do O_DIRECT via io_uring ({why}) and DAFNE_REQUIRE_DIRECT is set",
                dir.display()
            );
            eprintln!("skipped: {} cannot do O_DIRECT via io_uring: {why}", dir.display());
            None
        }
    }
}

/// Random unit fills and write-backs (aligned, as from the Unifier) and
/// arbitrary reads and writes (as from the comparison modes), checked
/// against a `Vec` model: holes, the unaligned tail, short reads at the end.
fn run_model(s: &ChunkStore, seed: u64) {
    let mut rng = Rng(seed);
    let mut model: Vec<u8> = Vec::new();
    let object = 42;
    for step in 0..400u64 {
        let unit = [4096usize, 16384, 65536][rng.below(3) as usize];
        let aligned_io = rng.below(2) == 0;
        let (off, len) = if aligned_io {
            // A unit, or a dirty range of one (a partial write-back).
            let base = rng.below(64) * unit as u64;
            let lo = if rng.below(2) == 0 { 0 } else { rng.below(unit as u64) as usize };
            let hi = lo + 1 + rng.below((unit - lo) as u64) as usize;
            (base + lo as u64, hi - lo)
        } else {
            (rng.below(4 << 20), 1 + rng.below(100_000) as usize)
        };
        // The unit's memory: page-aligned, the range at its place in it.
        let skew = if aligned_io { (off % unit as u64) as usize } else { rng.below(4096) as usize };
        let mut mem = AlignedBuf::new(skew + len);
        match rng.below(3) {
            0 => {
                let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ off ^ step).wrapping_mul(151) as u8 | 1).collect();
                mem.as_mut_slice()[skew..].copy_from_slice(&data);
                s.write_at(object, off, &mem.as_slice()[skew..]).unwrap();
                let end = off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            _ => {
                mem.as_mut_slice().fill(0xEE);
                let n = s.read_at(object, off, &mut mem.as_mut_slice()[skew..]).unwrap();
                let want = model.len().saturating_sub(off as usize).min(len);
                assert_eq!(n, want, "step {step}: read {off}+{len} count");
                assert!(
                    n == 0 || mem.as_slice()[skew..skew + n] == model[off as usize..off as usize + n],
                    "step {step}: read {off}+{len} differs"
                );
            }
        }
        if rng.below(50) == 0 {
            s.sync(object).unwrap();
        }
    }
    assert_eq!(s.size(object).unwrap(), model.len() as u64, "file size");
    let mut all = AlignedBuf::new(model.len());
    assert_eq!(s.read_at(object, 0, all.as_mut_slice()).unwrap(), model.len());
    assert!(all.as_slice() == &model[..], "final contents");
}

#[test]
fn the_direct_path_matches_a_reference_model() {
    let d = disk_dir();
    let Some(s) = direct_store(d.path()) else { return };
    assert!(s.is_direct());
    run_model(&s, 0x5EED);
    let st = s.stats();
    assert!(st.direct);
    assert!(st.direct_ops > 0 && st.direct_bytes > 0, "{st:?}");
    assert!(st.buffered_ops > 0, "unaligned heads and tails go buffered: {st:?}");
    assert!(st.ring_enters >= st.direct_ops, "{st:?}");
}

#[test]
fn the_buffered_path_matches_the_same_model_and_never_goes_direct() {
    let d = disk_dir();
    let s = ChunkStore::open(d.path()).unwrap();
    run_model(&s, 0x5EED);
    let st = s.stats();
    assert!(!st.direct);
    assert_eq!((st.direct_ops, st.ring_enters), (0, 0));
    assert!(st.buffered_ops > 0);
}

#[test]
fn a_unit_fill_and_a_whole_unit_write_back_are_direct_only() {
    let d = disk_dir();
    let Some(s) = direct_store(d.path()) else { return };
    let mut unit = AlignedBuf::new(64 << 10);
    unit.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    s.write_at(3, 128 << 10, unit.as_slice()).unwrap();
    let mut back = AlignedBuf::new(64 << 10);
    // Unit 0 is a hole: zeros, and a full count (the file goes further).
    assert_eq!(s.read_at(3, 0, back.as_mut_slice()).unwrap(), 64 << 10);
    assert!(back.as_slice().iter().all(|&b| b == 0));
    assert_eq!(s.read_at(3, 128 << 10, back.as_mut_slice()).unwrap(), 64 << 10);
    assert!(back.as_slice() == unit.as_slice());
    // Past the end: nothing.
    assert_eq!(s.read_at(3, 192 << 10, back.as_mut_slice()).unwrap(), 0);
    let st = s.stats();
    assert_eq!(st.buffered_ops, 0, "{st:?}");
    assert_eq!(st.direct_bytes, 3 * (64 << 10), "{st:?}");
    // A file whose end is not aligned: the direct read stops short there.
    s.write_at(4, 0, &unit.as_slice()[..5000]).unwrap();
    assert_eq!(s.read_at(4, 0, back.as_mut_slice()).unwrap(), 5000);
    assert!(back.as_slice()[..5000] == unit.as_slice()[..5000]);
    assert_eq!(s.size(4).unwrap(), 5000);
}

#[test]
fn auto_falls_back_when_the_file_system_refuses_o_direct_and_direct_refuses_to_start() {
    let d = disk_dir();
    let einval = |_: &Path| -> Result<dafne_uring::Ring, DirectRefused> {
        Err(DirectRefused::FileSystem { source: io::Error::from_raw_os_error(22) })
    };
    let path = decide(StorageMode::Auto, d.path(), einval).unwrap();
    let line = path.describe(Path::new("/x"));
    assert!(matches!(path, StoragePath::Buffered(DirectRefused::FileSystem { .. })));
    assert!(
        line.starts_with("storage: buffered pread/pwrite on /x: O_DIRECT refused by the file system (")
            && line.contains("os error 22"),
        "{line}"
    );
    let e = decide(StorageMode::Direct, d.path(), einval).unwrap_err();
    assert!(e.to_string().contains("--storage direct") && e.to_string().contains("O_DIRECT refused"), "{e}");
    // No io_uring (seccomp, old kernel): the same fallback.
    let no_ring = |_: &Path| -> Result<dafne_uring::Ring, DirectRefused> {
        Err(DirectRefused::Ring { source: dafne_uring::Ring::new(0).unwrap_err() })
    };
    assert!(matches!(
        decide(StorageMode::Auto, d.path(), no_ring).unwrap(),
        StoragePath::Buffered(DirectRefused::Ring { .. })
    ));
    // `buffered` does not probe at all.
    let never = |_: &Path| -> Result<dafne_uring::Ring, DirectRefused> { panic!("probed") };
    let b = decide(StorageMode::Buffered, d.path(), never).unwrap();
    assert!(matches!(b, StoragePath::Buffered(DirectRefused::NotAsked)));
}

#[test]
fn the_probe_on_a_real_disk_leaves_nothing_behind() {
    let d = disk_dir();
    match probe_direct(d.path()) {
        Ok(ring) => assert_eq!(ring.stats().ops, 2, "one write, one read"),
        Err(why) => eprintln!("note: {} cannot do O_DIRECT via io_uring: {why}", d.path().display()),
    }
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "the probe file was removed");
    assert_eq!(DIRECT_ALIGN % 512, 0);
}

#[test]
fn a_batch_of_unit_fills_is_one_ring_submission_with_holes_and_the_end_of_file() {
    let d = disk_dir();
    let Some(s) = direct_store(d.path()) else { return };
    let unit = 64usize << 10;
    let mut data = AlignedBuf::new(3 * unit + 1000);
    data.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8 + 1);
    // Units 0, 1 written; unit 2 a hole; unit 3 ends after 1000 bytes.
    s.write_at(9, 0, &data.as_slice()[..2 * unit]).unwrap();
    s.write_at(9, 3 * unit as u64, &data.as_slice()[3 * unit..]).unwrap();
    let enters = s.stats().ring_enters;
    let mut bufs: Vec<AlignedBuf> = (0..5).map(|_| AlignedBuf::new(unit)).collect();
    let mut reads: Vec<BatchRead<'_>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| BatchRead { object: 9, offset: (i * unit) as u64, buf: b.as_mut_slice() })
        .collect();
    let res: Vec<usize> = s.read_batch(&mut reads).into_iter().map(Result::unwrap).collect();
    drop(reads);
    assert_eq!(res, [unit, unit, unit, 1000, 0]);
    assert_eq!(s.stats().ring_enters - enters, 1, "one submission for the batch");
    assert!(bufs[0].as_slice() == &data.as_slice()[..unit]);
    assert!(bufs[1].as_slice() == &data.as_slice()[unit..2 * unit]);
    assert!(bufs[2].as_slice().iter().all(|&b| b == 0), "the hole");
    assert!(bufs[3].as_slice()[..1000] == data.as_slice()[3 * unit..]);
    // A missing object reads as empty, through the fallback.
    let mut b = AlignedBuf::new(unit);
    let r = s.read_batch(&mut [BatchRead { object: 10, offset: 0, buf: b.as_mut_slice() }]);
    assert_eq!(*r[0].as_ref().unwrap(), 0);
}

/// A batch of one read (a random read's unit fill) is read in place, not
/// through the ring: the ring's call waits for it anyway, and on a file
/// system that cannot read without blocking (tmpfs) the ring hands each
/// read to an io_uring worker thread and back (docs/BENCHMARKS.md, "Random
/// 4 KiB reads through the mount, profiled"). The bytes, the short count
/// at the end of the file, and the direct path's counters are as through
/// the ring.
#[test]
fn a_batch_of_one_unit_fill_is_read_without_the_ring() {
    let d = disk_dir();
    let Some(s) = direct_store(d.path()) else { return };
    let unit = 64usize << 10;
    let mut data = AlignedBuf::new(unit + 1000);
    data.as_mut_slice().iter_mut().enumerate().for_each(|(i, b)| *b = (i % 253) as u8 + 1);
    s.write_at(9, 0, data.as_slice()).unwrap();
    let (enters, ops) = (s.stats().ring_enters, s.stats().direct_ops);
    let mut b = AlignedBuf::new(unit);
    let r = s.read_batch(&mut [BatchRead { object: 9, offset: 0, buf: b.as_mut_slice() }]);
    assert_eq!(*r[0].as_ref().unwrap(), unit);
    assert!(b.as_slice() == &data.as_slice()[..unit]);
    let r = s.read_batch(&mut [BatchRead { object: 9, offset: unit as u64, buf: b.as_mut_slice() }]);
    assert_eq!(*r[0].as_ref().unwrap(), 1000, "the end of the file");
    assert!(b.as_slice()[..1000] == data.as_slice()[unit..]);
    assert_eq!(s.stats().ring_enters, enters, "a read of one unit went through the ring");
    assert_eq!(s.stats().direct_ops - ops, 2, "each read counts as a direct operation");
    // Past the end of the file: nothing. Then a hole of a sparse file
    // (written after it): zeros, the buffer's old bytes overwritten.
    let r = s.read_batch(&mut [BatchRead { object: 9, offset: 2 * unit as u64, buf: b.as_mut_slice() }]);
    assert_eq!(*r[0].as_ref().unwrap(), 0, "past the end of the file");
    s.write_at(9, 3 * unit as u64, &data.as_slice()[..DIRECT_ALIGN]).unwrap();
    let enters = s.stats().ring_enters; // the write's
    b.as_mut_slice().fill(0xEE);
    let r = s.read_batch(&mut [BatchRead { object: 9, offset: 2 * unit as u64, buf: b.as_mut_slice() }]);
    assert_eq!(*r[0].as_ref().unwrap(), unit, "a hole reads in full");
    assert!(b.as_slice().iter().all(|&x| x == 0), "a hole reads as zeros");
    assert_eq!(s.stats().ring_enters, enters, "a read of one unit went through the ring");
}
