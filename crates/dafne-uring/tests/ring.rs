//! The ring against real files in a directory under the target directory
//! (`CARGO_TARGET_TMPDIR`: the build's own disk, where O_DIRECT is normally
//! accepted). Whether a file system refuses O_DIRECT is the io server's
//! concern (its probe, tested in `dafne-io`); tmpfs accepts it since Linux 6.6.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use dafne_uring::{Op, Ring};

/// O_DIRECT's value on this architecture (aarch64 and x86-64 differ).
fn o_direct() -> i32 {
    if cfg!(target_arch = "aarch64") {
        0o200000
    } else {
        0o40000
    }
}

fn disk_dir() -> tempfile::TempDir {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// A `len`-byte slice of `v` starting at a 4 KiB-aligned address.
fn aligned(v: &mut Vec<u8>, len: usize) -> &mut [u8] {
    v.resize(len + 4096, 0);
    let skip = v.as_ptr().align_offset(4096);
    &mut v[skip..skip + len]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn write_read_sync_roundtrip_through_the_page_cache() {
    let d = disk_dir();
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(d.path().join("f")).unwrap();
    let mut ring = Ring::new(8).unwrap();
    let data = pattern(10_000, 7);
    assert_eq!(ring.write_at(f.as_fd(), 3, &data).unwrap(), data.len());
    ring.sync(f.as_fd(), true).unwrap();
    let mut back = vec![0u8; 20_000];
    // Short read at end of file, as pread.
    assert_eq!(ring.read_at(f.as_fd(), 0, &mut back).unwrap(), 10_003);
    assert_eq!(&back[..3], &[0, 0, 0]);
    assert_eq!(&back[3..10_003], &data[..]);
    assert_eq!(ring.read_at(f.as_fd(), 1 << 20, &mut back).unwrap(), 0, "past the end");
    assert_eq!(std::fs::read(d.path().join("f")).unwrap()[3..], data[..]);
    let s = ring.stats();
    assert_eq!(s.ops, 4);
    assert_eq!(s.bytes, 10_000 + 10_003);
}

#[test]
fn a_batch_larger_than_the_ring_runs_whole_with_fewer_enters_than_ops() {
    let d = disk_dir();
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(d.path().join("b")).unwrap();
    let mut ring = Ring::new(8).unwrap();
    let n = 64;
    let blocks: Vec<Vec<u8>> = (0..n).map(|i| pattern(4096, i as u8)).collect();
    let mut ops: Vec<Op<'_>> =
        blocks.iter().enumerate().map(|(i, b)| Op::Write { fd: f.as_fd(), offset: i as u64 * 4096, buf: b }).collect();
    ops.push(Op::Sync { fd: f.as_fd(), data_only: false });
    let res = ring.run(&mut ops);
    assert_eq!(res.len(), n + 1);
    for r in &res[..n] {
        assert_eq!(*r.as_ref().unwrap(), 4096);
    }
    assert_eq!(*res[n].as_ref().unwrap(), 0);
    // 65 operations through 8 entries: 9 full-ring submissions (more
    // only if a signal interrupted one).
    let enters = ring.stats().enters;
    assert!((9..n as u64).contains(&enters), "{enters} enters for {} operations in a ring of 8", n + 1);

    let mut reads: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 4096]).collect();
    let mut ops: Vec<Op<'_>> = reads
        .iter_mut()
        .enumerate()
        .rev()
        .map(|(i, b)| Op::Read { fd: f.as_fd(), offset: i as u64 * 4096, buf: b })
        .collect();
    assert!(ring.run(&mut ops).iter().all(|r| matches!(r, Ok(4096))));
    drop(ops);
    assert!(reads == blocks, "reads came back into the wrong buffers");
}

#[test]
fn errors_are_per_operation() {
    let d = disk_dir();
    let path = d.path().join("e");
    std::fs::write(&path, b"hello").unwrap();
    let ro = File::open(&path).unwrap();
    let mut ring = Ring::new(4).unwrap();
    let mut buf = [0u8; 5];
    let mut ops =
        [Op::Write { fd: ro.as_fd(), offset: 0, buf: b"x" }, Op::Read { fd: ro.as_fd(), offset: 0, buf: &mut buf }];
    let res = ring.run(&mut ops);
    assert_eq!(res[0].as_ref().unwrap_err().raw_os_error(), Some(9), "EBADF: not open for writing");
    assert_eq!(*res[1].as_ref().unwrap(), 5);
    assert_eq!(&buf, b"hello");
}

#[test]
fn o_direct_on_a_disk_roundtrips_aligned_blocks_with_holes_and_a_short_tail() {
    let d = disk_dir();
    let path = d.path().join("direct");
    let f = match OpenOptions::new().read(true).write(true).create(true).custom_flags(o_direct()).open(&path) {
        Ok(f) => f,
        // The target directory is on a file system without O_DIRECT
        // (tmpfs): nothing to test here; the io server's probe covers it.
        Err(e) if e.raw_os_error() == Some(22) => {
            // CI sets DAFNE_REQUIRE_DIRECT (scripts/test.sh): there this
            // must run, never skip in silence.
            assert!(
                std::env::var_os("DAFNE_REQUIRE_DIRECT").is_none(),
                "{} refuses O_DIRECT and DAFNE_REQUIRE_DIRECT is set",
                d.path().display()
            );
            eprintln!("skipped: {} refuses O_DIRECT", d.path().display());
            return;
        }
        Err(e) => panic!("open {}: {e}", path.display()),
    };
    let mut ring = Ring::new(8).unwrap();
    let mut wv = Vec::new();
    let w = aligned(&mut wv, 64 << 10);
    w.copy_from_slice(&pattern(64 << 10, 3));
    assert_eq!(ring.write_at(f.as_fd(), 128 << 10, w).unwrap(), 64 << 10);
    ring.sync(f.as_fd(), true).unwrap();
    let mut rv = Vec::new();
    let r = aligned(&mut rv, 256 << 10);
    // A hole before, the data, end of file after: a short read.
    assert_eq!(ring.read_at(f.as_fd(), 0, r).unwrap(), 192 << 10);
    assert!(r[..128 << 10].iter().all(|&b| b == 0));
    assert_eq!(&r[128 << 10..192 << 10], &pattern(64 << 10, 3)[..]);
}
