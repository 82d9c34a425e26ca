//! Checksums end to end on real io server processes, on both storage
//! paths: files written through the client and synced, one byte flipped in
//! a chunk file on disk while the server is down; after a restart, a read
//! of that block answers `EIO` (never the flipped bytes), `checksum_errors`
//! counts it, and a scrub names the object and the block's offset. Holes,
//! sizes that are not a multiple of 4 KiB, a partial overwrite, a truncate
//! and a punched hole raise no false alarm (scrub of the untouched files
//! is clean, and every file reads back as written).

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::{pattern, spawn_io_storage, start_meta, IoProc};

use dafne_client::data::{DataClient, LOGGED_IN};
use dafne_client::file::Fs;
use dafne_client::{MetaSession, ROOT_INO};
use dafne_proto::io::{AllocateMode, Stability};
use dafne_proto::{Errno, LayoutHint};

/// The retry deadline of a client whose server is about to be killed and
/// restarted at another address: its calls to the dead one give up after
/// this instead of `dafne_client::RETRY_DEADLINE` (30 s, riding over a
/// restart at the same address, which these tests do not do). What the
/// tests check is the restarted server's disk, not the client's wait.
const DOOMED_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// A client of the one server `addr`, about to be killed ([`DOOMED_RETRY`]).
fn doomed_client(rt: &dafne_transport::Runtime, addr: std::net::SocketAddr, s: &dafne_auth::Secret) -> DataClient {
    let d = DataClient::connect(rt, &[addr], s).unwrap();
    d.set_retry_deadline(DOOMED_RETRY);
    d
}

/// Every slice of a scrub of the client's server 0: (objects, bytes, bad blocks).
fn scrub(d: &DataClient) -> (u64, u64, Vec<(u64, u64)>) {
    let (mut objects, mut bytes, mut bad, mut at) = (0, 0, Vec::new(), (0, 0));
    loop {
        let s = futures::executor::block_on(d.scrub_slice(0, at.0, at.1)).unwrap();
        objects += s.objects;
        bytes += s.bytes;
        bad.extend(s.bad);
        match s.next {
            Some(n) => at = n,
            None => return (objects, bytes, bad),
        }
    }
}

fn checksum_errors(d: &DataClient) -> u64 {
    futures::executor::block_on(d.server_info(0, LOGGED_IN)).unwrap().checksum_errors
}

/// The chunk file whose length is `len` (the object of a file of that size).
fn chunk_of_size(dir: &Path, len: u64) -> (u64, PathBuf) {
    let objects = dir.join("objects");
    let found: Vec<_> = std::fs::read_dir(&objects)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none() && p.metadata().unwrap().len() == len)
        .collect();
    assert_eq!(found.len(), 1, "chunk files of {len} bytes in {}: {found:?}", objects.display());
    let id = u64::from_str_radix(found[0].file_name().unwrap().to_str().unwrap(), 16).unwrap();
    (id, found[0].clone())
}

fn a_flipped_byte_is_eio_and_scrub_names_it(storage: &str) {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 64 << 10, 1);
    let data_dir = root.path().join("io0");
    let rt = common::runtime("checksums");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "checksums", 0, 0).unwrap();
    let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 1 });
    let start = || -> (IoProc, Fs, DataClient) {
        let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", storage);
        let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
        let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
        (io, fs, admin)
    };

    let (io, fs, admin) = start();
    // The victim: 300 123 bytes (a partial last block), synced.
    let victim = pattern(300_123, 1);
    let f = fs.create(ROOT_INO, b"victim", 0o644, hint).unwrap();
    f.write_at(0, &victim, Stability::Unstable).unwrap();
    f.fsync().unwrap();
    let victim_ino = f.attr().ino;
    f.close().unwrap();
    // Files that must stay clean: a hole between two writes, a partial
    // overwrite of a synced block, a truncate into a block, a punched
    // hole with unaligned ends.
    let mut clean: Vec<(u64, Vec<u8>)> = Vec::new();
    let f = fs.create(ROOT_INO, b"holes", 0o644, hint).unwrap();
    let mut want = vec![0u8; (1 << 20) + 10];
    want[..5000].copy_from_slice(&pattern(5000, 2));
    want[1 << 20..].copy_from_slice(b"0123456789");
    f.write_at(0, &want[..5000], Stability::Unstable).unwrap();
    f.write_at(1 << 20, &want[1 << 20..], Stability::FileSync).unwrap();
    f.fsync().unwrap();
    f.write_at(3000, b"partial", Stability::Unstable).unwrap();
    want[3000..3007].copy_from_slice(b"partial");
    f.fsync().unwrap();
    clean.push((f.attr().ino, want));
    f.close().unwrap();
    let f = fs.create(ROOT_INO, b"cut", 0o644, hint).unwrap();
    let mut want = pattern(200_000, 3);
    f.write_at(0, &want, Stability::Unstable).unwrap();
    f.fsync().unwrap();
    f.truncate(150_001).unwrap();
    want.truncate(150_001);
    f.fallocate(10_000, 70_000, AllocateMode::PunchHole).unwrap();
    want[10_000..80_000].fill(0);
    f.fsync().unwrap();
    clean.push((f.attr().ino, want));
    f.close().unwrap();

    // On disk: synced; read back from storage by a new server.
    drop((fs, admin, io));
    let (io, fs, admin) = start();
    let read_all = |fs: &Fs, ino: u64, len: usize| {
        let f = fs.open(ino, dafne_proto::OPEN_READ).unwrap();
        let mut got = vec![0u8; len];
        let r = f.read_at(0, &mut got).map(|n| {
            got.truncate(n);
            got
        });
        f.close().unwrap();
        r
    };
    assert_eq!(read_all(&fs, victim_ino, victim.len()).unwrap(), victim, "{storage}");
    for (ino, want) in &clean {
        assert!(read_all(&fs, *ino, want.len()).unwrap() == *want, "{storage}: file ino {ino} read back otherwise");
    }
    let (objects, bytes, bad) = scrub(&admin);
    assert_eq!((objects, bad.len()), (3, 0), "{storage}: a scrub of untouched files ({bytes} bytes): {bad:?}");
    assert_eq!(checksum_errors(&admin), 0, "{storage}: a false alarm");

    // One byte flipped on the disk while the server is down.
    drop((fs, admin, io));
    let (object, chunk) = chunk_of_size(&data_dir, victim.len() as u64);
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&chunk).unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, 70_000).unwrap();
    file.write_all_at(&[b[0] ^ 0x01], 70_000).unwrap();
    file.sync_all().unwrap();
    drop(file);

    let (io, fs, admin) = start();
    let f = fs.open(victim_ino, dafne_proto::OPEN_READ).unwrap();
    let mut got = vec![0u8; 4096];
    assert_eq!(f.read_at(68 << 10, &mut got), Err(Errno::EIO), "{storage}: the bad block was served");
    // Not from the cache either, the second time (a failed fill keeps no unit).
    assert_eq!(f.read_at(70_000, &mut got[..10]), Err(Errno::EIO), "{storage}: the bad block was served");
    // The other units of the file read as before.
    let n = f.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..n], &victim[..4096]);
    let n = f.read_at(200_000, &mut got).unwrap();
    assert_eq!(&got[..n], &victim[200_000..204_096]);
    f.close().unwrap();
    assert!(checksum_errors(&admin) >= 1, "{storage}: not counted");
    let (objects, _, bad) = scrub(&admin);
    assert_eq!(objects, 3);
    assert_eq!(bad, [(object, 70_000 / 4096 * 4096)], "{storage}: scrub did not name the bad block alone");
    for (ino, want) in &clean {
        assert!(read_all(&fs, *ino, want.len()).unwrap() == *want, "{storage}: file ino {ino} read back otherwise");
    }
    drop((fs, admin, io));
}

#[test]
fn a_flipped_byte_is_eio_and_scrub_names_it_buffered() {
    a_flipped_byte_is_eio_and_scrub_names_it("buffered");
}

#[test]
fn a_flipped_byte_is_eio_and_scrub_names_it_direct() {
    a_flipped_byte_is_eio_and_scrub_names_it("direct");
}

/// Scrub reads every object: only a login with the cluster secret may ask.
#[test]
fn a_credential_may_not_scrub() {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (_meta, secret) = start_meta(root.path(), 1, 64 << 10, 1);
    let io = spawn_io_storage(&root.path().join("io0"), &secret, 16, "127.0.0.1:0", "buffered");
    let rt = common::runtime("checksums-cred");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    // A credential with root rights is refused too: scrub is for the
    // cluster secret.
    for root in [false, true] {
        let policy = dafne_proto::Credential {
            name: "someone".into(),
            uids: vec![dafne_proto::IdRange { first: 1000, last: 1000 }],
            gids: vec![dafne_proto::IdRange { first: 1000, last: 1000 }],
            root,
        };
        let cred = dafne_auth::CredentialFile::issue(&s, policy).unwrap();
        let d = DataClient::connect(&rt, &[io.addr], dafne_auth::LoginKey::from(cred)).unwrap();
        assert_eq!(futures::executor::block_on(d.scrub_slice(0, 0, 0)), Err(Errno::EACCES), "root: {root}");
    }
    drop(io);
}

/// The comparison modes read through the page cache with `pread`
/// (`normal`) or map the range (`mmap`): both verify what they serve.
#[test]
fn the_normal_and_mmap_modes_answer_eio_for_a_flipped_byte() {
    use dafne_io::server::{IoArgs, ModeArgs, ServingMode};
    for mode in [ServingMode::Normal, ServingMode::Mmap] {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(&base).unwrap();
        let root = tempfile::tempdir_in(base).unwrap();
        let (meta, secret) = start_meta(root.path(), 1, 1 << 20, 1);
        let args = IoArgs {
            data_dir: root.path().join("io0"),
            listen: "127.0.0.1:0".parse().unwrap(),
            secret: secret.clone(),
            cache_mib: 16,
            ucx: common::ucx_args(),
            storage: dafne_io::chunk::StorageMode::Buffered,
        };
        let io = dafne_io::server::start_with(&args, ModeArgs { mode, ..Default::default() }).unwrap();
        let rt = common::runtime("checksums-modes");
        let s = dafne_auth::Secret::load(&secret).unwrap();
        let m = MetaSession::connect(&rt, meta.addr, &s, "checksums", 0, 0).unwrap();
        let d = DataClient::connect(&rt, &[io.addr], &s).unwrap();
        let a = m.create_with(ROOT_INO, b"f", 0o644, true, None).unwrap();
        let f = m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
        let want = pattern(300_123, 5);
        futures::executor::block_on(d.write_at(&f, 0, &want, Stability::Unstable)).unwrap();
        let mut got = vec![0u8; want.len()];
        futures::executor::block_on(d.read_at(&f, 0, &mut got)).unwrap();
        assert!(got == want, "{mode}");
        assert_eq!(checksum_errors(&d), 0, "{mode}: a false alarm");

        let (object, chunk) = chunk_of_size(&args.data_dir, want.len() as u64);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&chunk).unwrap();
        let mut b = [0u8];
        file.read_exact_at(&mut b, 70_000).unwrap();
        file.write_all_at(&[b[0] ^ 0x80], 70_000).unwrap();
        drop(file);
        let mut block = vec![0u8; 200_000];
        let r = futures::executor::block_on(d.read_at(&f, 0, &mut block));
        assert_eq!(r, Err(Errno::EIO), "{mode}: the flipped block was served");
        futures::executor::block_on(d.read_at(&f, 0, &mut block[..65536])).unwrap();
        assert!(block[..65536] == want[..65536], "{mode}");
        assert!(checksum_errors(&d) >= 1, "{mode}: not counted");
        assert_eq!(scrub(&d).2, [(object, 69_632)], "{mode}");
    }
}

/// A scrub longer than one slice goes on where the last one stopped, and
/// finds a bad block past the first slices.
#[test]
fn scrub_goes_on_across_slices() {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 1 << 20, 1);
    let data_dir = root.path().join("io0");
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", "buffered");
    let rt = common::runtime("checksums-slices");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "checksums", 0, 0).unwrap();
    let fs = Fs::new(m, DataClient::connect(&rt, &[io.addr], &s).unwrap());
    let len = 2 * dafne_proto::io::SCRUB_SLICE_BYTES as usize + 12_345;
    let f = fs.create(ROOT_INO, b"big", 0o644, None).unwrap();
    f.write_at(0, &pattern(len, 9), Stability::Unstable).unwrap();
    f.fsync().unwrap();
    f.close().unwrap();
    let (object, chunk) = chunk_of_size(&data_dir, len as u64);
    let at = len as u64 - 5000;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&chunk).unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[!b[0]], at).unwrap();
    drop(file);
    let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
    let (mut slices, mut bytes, mut bad, mut next) = (0, 0, Vec::new(), (0, 0));
    loop {
        let sl = futures::executor::block_on(admin.scrub_slice(0, next.0, next.1)).unwrap();
        slices += 1;
        bytes += sl.bytes;
        bad.extend(sl.bad);
        match sl.next {
            Some(n) => next = n,
            None => break,
        }
    }
    assert!(slices >= 3, "{slices} slices");
    assert_eq!(bytes, len as u64);
    assert_eq!(bad, [(object, at / 4096 * 4096)]);
    drop(io);
}

/// A process killed between a write of data and the settling of its
/// checksums (fault injection: `DAFNE_FAULT_CRASH_AFTER_DATA`, at the
/// write-back an fsync starts) leaves no false alarm: after a restart the
/// file reads back (its stable bytes, and the rewritten ones old or new
/// within each block), and a scrub finds nothing bad. Partial blocks at
/// both ends and whole blocks between, on both storage paths.
fn a_crash_between_data_and_checksum_leaves_no_false_alarm(storage: &str) {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 64 << 10, 1);
    let data_dir = root.path().join("io0");
    let flag = root.path().join("crash-flag");
    let rt = common::runtime("checksums-crash");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "checksums", 0, 0).unwrap();
    let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 1 });
    let env = [("DAFNE_FAULT_CRASH_AFTER_DATA", flag.as_os_str())];
    let mut want = pattern(300_123, 11);
    let mut ino = 0;
    for round in 0..3u64 {
        let mut io = common::spawn_io_env(&data_dir, &secret, 16, "127.0.0.1:0", storage, &env);
        let fs = Fs::new(m.clone(), doomed_client(&rt, io.addr, &s));
        let f = match round {
            0 => {
                let f = fs.create(ROOT_INO, b"f", 0o644, hint).unwrap();
                f.write_at(0, &want, Stability::Unstable).unwrap();
                f.fsync().unwrap();
                ino = f.attr().ino;
                f
            }
            _ => fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap(),
        };
        // Rewrites (unstable), then the crash at their write-back.
        let (at, len) = [(5000, 20_000), (70_001, 3), (130_000, 60_000)][round as usize];
        let new = pattern(len, 20 + round);
        f.write_at(at as u64, &new, Stability::Unstable).unwrap();
        std::fs::write(&flag, b"").unwrap();
        let _ = f.fsync();
        assert!(io.child.wait().unwrap().code().is_none(), "{storage}: the server was not killed");
        assert!(!flag.exists(), "{storage}: the crash point was not reached");
        drop((f, fs, io));

        let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", storage);
        let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
        let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
        let f = fs.open(ino, dafne_proto::OPEN_READ).unwrap();
        let mut got = vec![0u8; want.len()];
        let n = f.read_at(0, &mut got).unwrap_or_else(|e| panic!("{storage} round {round}: read back: {e:?}"));
        assert_eq!(n, want.len(), "{storage} round {round}");
        // Each block holds the old bytes or the new ones.
        for b in (0..want.len()).step_by(4096) {
            let e = (b + 4096).min(want.len());
            let mut new_block = want[b..e].to_vec();
            let (lo, hi) = (b.max(at), e.min(at + len));
            if lo < hi {
                new_block[lo - b..hi - b].copy_from_slice(&new[lo - at..hi - at]);
            }
            assert!(got[b..e] == want[b..e] || got[b..e] == new_block[..], "{storage} round {round}: block at {b}");
        }
        f.close().unwrap();
        want = got;
        let (objects, _, bad) = scrub(&admin);
        assert_eq!((objects, bad), (1, vec![]), "{storage} round {round}: a false alarm");
        assert_eq!(checksum_errors(&admin), 0, "{storage} round {round}: a false alarm");
        // The state read back becomes the stable one for the next round.
        let f = fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
        f.fsync().unwrap();
        f.close().unwrap();
        drop((fs, admin, io));
    }

    // A crash in a truncate into a block, between the data's new length and
    // the sidecar's; then a write far past the end (the blocks between read
    // as zeros) and a scrub.
    let mut io = common::spawn_io_env(&data_dir, &secret, 16, "127.0.0.1:0", storage, &env);
    let fs = Fs::new(m.clone(), doomed_client(&rt, io.addr, &s));
    let f = fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    let cut = 100_001;
    std::fs::write(&flag, b"").unwrap();
    let _ = f.truncate(cut as u64);
    assert!(io.child.wait().unwrap().code().is_none(), "{storage}: the server was not killed in the truncate");
    drop((f, fs, io));
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", storage);
    let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
    let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
    let f = fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    let mut got = vec![0u8; cut];
    let n = f.read_at(0, &mut got).unwrap_or_else(|e| panic!("{storage}: read after a crash in a truncate: {e:?}"));
    assert!(n >= cut && got == want[..cut], "{storage}: {n} bytes read after a crash in a truncate");
    let far = 1u64 << 20;
    f.write_at(far, b"far", Stability::FileSync).unwrap();
    let mut got = vec![0u8; far as usize + 3];
    let n = f.read_at(0, &mut got).unwrap_or_else(|e| panic!("{storage}: read after extending: {e:?}"));
    assert_eq!(n, got.len(), "{storage}");
    assert!(got[..cut] == want[..cut] && got[cut..far as usize].iter().all(|&b| b == 0), "{storage}");
    let (_, _, bad) = scrub(&admin);
    assert_eq!(bad, vec![], "{storage}: a false alarm after a crash in a truncate");
    assert_eq!(checksum_errors(&admin), 0, "{storage}: a false alarm after a crash in a truncate");
    f.fsync().unwrap();
    f.close().unwrap();
    drop((fs, admin, io));

    // A crash in a punch with unaligned ends, between the data's hole and
    // the sidecar's.
    let mut io = common::spawn_io_env(&data_dir, &secret, 16, "127.0.0.1:0", storage, &env);
    let fs = Fs::new(m.clone(), doomed_client(&rt, io.addr, &s));
    let f = fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    std::fs::write(&flag, b"").unwrap();
    let _ = f.fallocate(10_000, 70_000, AllocateMode::PunchHole);
    assert!(io.child.wait().unwrap().code().is_none(), "{storage}: the server was not killed in the punch");
    drop((f, fs, io));
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", storage);
    let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
    let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
    let f = fs.open(ino, dafne_proto::OPEN_READ).unwrap();
    let mut got = vec![0u8; cut];
    f.read_at(0, &mut got).unwrap_or_else(|e| panic!("{storage}: read after a crash in a punch: {e:?}"));
    assert!(got[..10_000] == want[..10_000] && got[80_000..cut] == want[80_000..cut], "{storage}");
    assert!(got[10_000..80_000].iter().all(|&b| b == 0), "{storage}: the punch was done (before the sidecar)");
    let (_, _, bad) = scrub(&admin);
    assert_eq!(bad, vec![], "{storage}: a false alarm after a crash in a punch");
    f.close().unwrap();
    drop((fs, admin, io));
}

#[test]
fn a_crash_between_data_and_checksum_leaves_no_false_alarm_buffered() {
    a_crash_between_data_and_checksum_leaves_no_false_alarm("buffered");
}

#[test]
fn a_crash_between_data_and_checksum_leaves_no_false_alarm_direct() {
    a_crash_between_data_and_checksum_leaves_no_false_alarm("direct");
}

/// `kill -9` of an io server at a random instant while four writers make
/// overlapping unaligned writes, fsyncs and truncates on four files
/// through the client library (write-backs by the loop and the background
/// writer under way), a few rounds on the same data directory: after each
/// restart every file reads back whole (no `EIO`) and a scrub finds no
/// bad block. The review's stress script, as a test.
fn kill_9_while_writing_leaves_no_false_alarm(storage: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 64 << 10, 1);
    let data_dir = root.path().join("io0");
    let rt = common::runtime("checksums-kill");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "checksums", 0, 0).unwrap();
    let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 1 });
    let mut inos = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64 ^ std::process::id() as u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..4 {
        let mut io = spawn_io_storage(&data_dir, &secret, 8, "127.0.0.1:0", storage);
        if round == 0 {
            let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
            for i in 0..4u8 {
                let f = fs.create(ROOT_INO, &[b'f', b'0' + i], 0o644, hint).unwrap();
                inos.push(f.attr().ino);
                f.close().unwrap();
            }
        }
        let stop = AtomicBool::new(false);
        let seeds: Vec<u64> = (0..4).map(|_| next()).collect();
        std::thread::scope(|sc| {
            for (t, &seed) in seeds.iter().enumerate() {
                let (m, s, addr, inos, stop) = (&m, &s, io.addr, &inos, &stop);
                sc.spawn(move || {
                    let rt = common::runtime("checksums-kill-w");
                    let Ok(d) = DataClient::connect(&rt, &[addr], s) else { return };
                    d.set_retry_deadline(DOOMED_RETRY);
                    let fs = Fs::new(m.clone(), d);
                    let mut x = seed | 1;
                    let mut r = || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let files: Vec<_> = inos
                        .iter()
                        .filter_map(|&ino| fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).ok())
                        .collect();
                    if files.len() < inos.len() {
                        return;
                    }
                    let mut op = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        op += 1;
                        let f = &files[(r() % 4) as usize];
                        let res = match r() % 32 {
                            0 => f.truncate(r() % (3 << 20)),
                            1..=3 => f.fsync(),
                            _ => {
                                let len = 1 + (r() % 150_000) as usize;
                                f.write_at(r() % (3 << 20), &pattern(len, op * 8 + t as u64), Stability::Unstable)
                                    .map(|_| ())
                            }
                        };
                        if res.is_err() {
                            return;
                        }
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(200 + next() % 600));
            io.child.kill().unwrap(); // SIGKILL
            io.child.wait().unwrap();
            stop.store(true, Ordering::Relaxed);
        });
        drop(io);

        let io = spawn_io_storage(&data_dir, &secret, 8, "127.0.0.1:0", storage);
        let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
        let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
        for &ino in &inos {
            let f = fs.open(ino, dafne_proto::OPEN_READ).unwrap();
            let mut got = vec![0u8; 4 << 20];
            f.read_at(0, &mut got).unwrap_or_else(|e| panic!("{storage} round {round}: ino {ino}: {e:?}"));
            f.close().unwrap();
        }
        let (_, _, bad) = scrub(&admin);
        assert_eq!(bad, vec![], "{storage} round {round}: a false alarm");
        assert_eq!(checksum_errors(&admin), 0, "{storage} round {round}: a false alarm");
        drop((fs, admin, io));
    }
}

#[test]
fn kill_9_while_writing_leaves_no_false_alarm_buffered() {
    kill_9_while_writing_leaves_no_false_alarm("buffered");
}

#[test]
fn kill_9_while_writing_leaves_no_false_alarm_direct() {
    kill_9_while_writing_leaves_no_false_alarm("direct");
}

/// A scrub slice is bounded by objects too (many tiny objects cost an
/// open each), and holes are not read: a file truncated to 1 TiB with a
/// few bytes written is scrubbed in a slice or two reading only its data,
/// and a byte flipped in its data is still found.
#[test]
fn scrub_slices_are_bounded_by_objects_and_skip_holes() {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 1 << 20, 1);
    let data_dir = root.path().join("io0");
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", "buffered");
    let rt = common::runtime("checksums-bounds");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "checksums", 0, 0).unwrap();
    let fs = Fs::new(m, DataClient::connect(&rt, &[io.addr], &s).unwrap());
    let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
    let big = fs.create(ROOT_INO, b"sparse", 0o644, None).unwrap();
    big.write_at(0, b"head", Stability::Unstable).unwrap();
    big.truncate(1 << 40).unwrap();
    big.write_at((1 << 40) - 10_000, &pattern(5000, 4), Stability::Unstable).unwrap();
    big.fsync().unwrap();
    big.close().unwrap();
    for i in 0..150u32 {
        let f = fs.create(ROOT_INO, format!("t{i}").as_bytes(), 0o644, None).unwrap();
        f.write_at(0, b"x", Stability::Unstable).unwrap();
        f.close().unwrap();
    }
    let all = |admin: &DataClient| {
        let (mut slices, mut objects, mut bytes, mut bad, mut at) = (0, 0, 0, Vec::new(), (0, 0));
        loop {
            let sl = futures::executor::block_on(admin.scrub_slice(0, at.0, at.1)).unwrap();
            slices += 1;
            assert!(sl.objects <= 64, "a slice of {} objects", sl.objects);
            assert!(sl.bytes <= 1 << 20, "a slice read {} bytes of holes", sl.bytes);
            (objects, bytes) = (objects + sl.objects, bytes + sl.bytes);
            bad.extend(sl.bad);
            match sl.next {
                Some(n) => at = n,
                None => return (slices, objects, bytes, bad),
            }
        }
    };
    let (slices, objects, bytes, bad) = all(&admin);
    assert_eq!((objects, bad), (151, vec![]));
    assert!((3..=10).contains(&slices), "{slices} slices");
    assert!(bytes < 1 << 20, "{bytes} bytes read");
    // A flipped byte in the sparse file's far data is found.
    drop((fs, admin, io));
    let (object, chunk) = chunk_of_size(&data_dir, 1 << 40);
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&chunk).unwrap();
    let at = (1u64 << 40) - 8000;
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[!b[0]], at).unwrap();
    drop(file);
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", "buffered");
    let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
    assert_eq!(all(&admin).3, [(object, at / 4096 * 4096)]);
    drop(io);
}

/// A sidecar lost from a data directory whose objects all have one is
/// reported by scrub (offset `u64::MAX`), and the object is still read.
#[test]
fn scrub_reports_a_lost_sidecar() {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 1 << 20, 1);
    let data_dir = root.path().join("io0");
    let rt = common::runtime("checksums-lost");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "checksums", 0, 0).unwrap();
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", "buffered");
    let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
    let f = fs.create(ROOT_INO, b"f", 0o644, None).unwrap();
    f.write_at(0, &pattern(12_345, 6), Stability::FileSync).unwrap();
    f.close().unwrap();
    drop((fs, io));
    let (object, chunk) = chunk_of_size(&data_dir, 12_345);
    std::fs::remove_file(dafne_io::sums::sidecar_path(&chunk)).unwrap();
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", "buffered");
    let admin = DataClient::connect(&rt, &[io.addr], &s).unwrap();
    let (objects, bytes, bad) = scrub(&admin);
    assert_eq!((objects, bad), (1, vec![(object, u64::MAX)]));
    assert_eq!(bytes, 12_345, "the object is still read");
    drop(io);
}
