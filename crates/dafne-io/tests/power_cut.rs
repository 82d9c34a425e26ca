//! A power cut under an io server: what an fsync acknowledged must be on
//! the disk, not only in the page cache (audit: durability was tested only
//! by kill -9, which keeps the page cache and so cannot catch a missing
//! fsync).
//!
//! The io server's data directory is a real ext4 file system on a loop
//! device backed by an image file. The "disk" is that image: a copy of it
//! taken while the server runs holds exactly what the file system sent to
//! its device, and nothing of what sits dirty in its page cache — what a
//! power cut would leave. The copy is then mounted (ext4 replays its
//! journal, as after a crash), a new io server serves it, and every byte
//! whose write was acknowledged as stable must read back. A missing
//! `fdatasync` of a chunk file makes this fail on both storage paths
//! (tried: the copy held other bytes from offset 0), since the kernel
//! writes dirty pages back only after 30 s. A missing `fsync` of the
//! objects directory does not show on ext4, whose fdatasync of a new file
//! commits the journal transaction that holds its directory entry too.
//! Needs root (loop devices, mount); CI runs as root.

mod common;

use std::path::PathBuf;

use common::disk::Mounted;
use common::{pattern, spawn_io_storage, start_meta};

use dafne_client::data::DataClient;
use dafne_client::file::Fs;
use dafne_client::{MetaSession, ROOT_INO};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;

fn acknowledged_writes_survive_a_power_cut(storage: &str) {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 1, 64 << 10, 1);
    let image = root.path().join("disk.img");
    let disk = Mounted::new_ext4(&image, &root.path().join("mnt"), 64);
    let data_dir = disk.dir.join("io0");
    let io = spawn_io_storage(&data_dir, &secret, 16, "127.0.0.1:0", storage);
    let rt = common::runtime("power-cut");
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &s, "power-cut", 0, 0).unwrap();
    let fs = Fs::new(m.clone(), DataClient::connect(&rt, &[io.addr], &s).unwrap());
    let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 1 });

    // Acknowledged as stable, in the two ways a client can: unstable
    // writes then fsync, and writes that are file-sync themselves. New
    // files each (a new chunk file needs its directory entry on disk too),
    // odd sizes (a partial last block).
    let mut stable = Vec::new();
    for i in 0..6u64 {
        let want = pattern(300_000 + 4097 * i as usize, i);
        let f = fs.create(ROOT_INO, format!("f{i}").as_bytes(), 0o644, hint).unwrap();
        if i % 2 == 0 {
            f.write_at(0, &want, Stability::Unstable).unwrap();
            f.fsync().unwrap();
        } else {
            f.write_at(0, &want, Stability::FileSync).unwrap();
        }
        stable.push((f.attr().ino, want));
        f.close().unwrap();
    }
    // And one overwrite in the middle of an existing, synced file.
    let (ino0, want0) = &mut stable[0];
    let patch = pattern(70_000, 99);
    let f = fs.open(*ino0, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    f.write_at(10_000, &patch, Stability::Unstable).unwrap();
    f.fsync().unwrap();
    want0[10_000..80_000].copy_from_slice(&patch);
    f.close().unwrap();

    // The power cut: the disk as it is now, then the server is gone.
    let snapshot = root.path().join("after-cut.img");
    std::fs::copy(&image, &snapshot).unwrap();
    drop(io);
    drop(fs);

    // Power back: the copy mounted (journal replayed), a new server on it.
    let after = Mounted::ext4(&snapshot, &root.path().join("mnt-after"));
    let io = spawn_io_storage(&after.dir.join("io0"), &secret, 16, "127.0.0.1:0", storage);
    let fs = Fs::new(m, DataClient::connect(&rt, &[io.addr], &s).unwrap());
    for (ino, want) in &stable {
        let f = fs.open(*ino, dafne_proto::OPEN_READ).unwrap();
        let mut got = vec![0u8; want.len()];
        let n = f.read_at(0, &mut got).unwrap();
        let first_bad = got.iter().zip(want.iter()).position(|(a, b)| a != b);
        assert!(
            n == want.len() && first_bad.is_none(),
            "{storage}: file ino {ino} after the power cut: {n} of {} bytes read, first difference at {first_bad:?}",
            want.len()
        );
    }
    drop(io);
    drop(after);
    drop(disk);
}

#[test]
fn acknowledged_writes_survive_a_power_cut_buffered() {
    acknowledged_writes_survive_a_power_cut("buffered");
}

#[test]
fn acknowledged_writes_survive_a_power_cut_direct() {
    acknowledged_writes_survive_a_power_cut("direct");
}
