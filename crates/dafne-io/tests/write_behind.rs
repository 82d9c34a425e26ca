//! Write-behind (`dafne_client::writebehind`) against real io servers:
//! bytes read back as last written, memory
//! stays within the budget, and a write that fails after it returned is
//! reported by the next drain (fsync, close) or write of its file, once.

mod common;

use std::net::SocketAddr;

use common::{cluster, pattern};

use dafne_client::data::DataClient;
use dafne_client::file::Fs;
use dafne_client::writebehind::{WriteBehind, SLOT};
use dafne_client::{MetaSession, ROOT_INO};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;

fn fs(c: &common::Cluster, rt: &dafne_transport::Runtime) -> Fs {
    let secret = dafne_auth::Secret::load(&c.secret).unwrap();
    let meta = MetaSession::connect(rt, c.meta_addr, &secret, "write-behind", 0, 0).unwrap();
    let addrs: Vec<SocketAddr> = c.ios.iter().map(|p| p.addr).collect();
    Fs::new(meta, DataClient::connect(rt, &addrs, &secret).unwrap())
}

/// Straight from the io servers (the file's size in meta was never
/// published: write-behind is below the size rule).
fn read(fs: &Fs, f: &dafne_client::OpenFile, at: u64, buf: &mut [u8]) -> usize {
    futures::executor::block_on(fs.data.read_at(f, at, buf)).unwrap()
}

#[test]
fn writes_read_back_whole_within_the_budget() {
    let c = cluster(16);
    let rt = common::runtime("write-behind");
    let fs = fs(&c, &rt);
    let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 4 });
    let f = fs.create(ROOT_INO, b"seq", 0o644, hint).unwrap();
    let budget = 4 * SLOT;
    let wb = WriteBehind::new(&fs.data, budget).unwrap();
    let mut c = 0;
    // 24 MiB in 128 KiB writes (six times the budget), then the same
    // 128 KiB rewritten 40 times with different bytes: only the last may
    // be left, although each rewrite returned before the one before it
    // reached the servers. (On one host the servers answer in order
    // anyway: the rule that makes it hold elsewhere is tested against a
    // server that delays its answers, in `writebehind`'s unit tests.)
    let mut want = pattern(24 << 20, 1);
    for (i, piece) in want.chunks(128 << 10).enumerate() {
        assert_eq!(wb.write(f.handle(), (i << 17) as u64, piece, Stability::Unstable, &mut c, None), Ok(piece.len()));
    }
    let at = 5 << 20;
    for round in 0..40u64 {
        let bytes = pattern(128 << 10, 100 + round);
        wb.write(f.handle(), at as u64, &bytes, Stability::Unstable, &mut c, None).unwrap();
        want[at..at + bytes.len()].copy_from_slice(&bytes);
    }
    // A write larger than a slot goes as several pieces.
    let big = pattern(3 * SLOT + 5, 7);
    wb.write(f.handle(), 30 << 20, &big, Stability::Unstable, &mut c, None).unwrap();
    wb.drain(f.handle().layout.object_id, &mut c).unwrap();
    assert_eq!(wb.in_flight(), 0);
    let mut got = vec![0u8; want.len()];
    assert_eq!(read(&fs, f.handle(), 0, &mut got), want.len());
    assert!(got == want, "the bytes read back differ from the last ones written");
    let mut got = vec![0u8; big.len()];
    assert_eq!(read(&fs, f.handle(), 30 << 20, &mut got), big.len());
    assert!(got == big, "the multi-slot write reads back different bytes");
    let s = wb.stats();
    assert_eq!(s.budget_bytes, budget as u64);
    assert!(s.peak_bytes <= s.budget_bytes, "{s:?}");
    assert_eq!(s.writes, 192 + 40 + 4, "{s:?}");
    assert_eq!(s.errors, 0, "{s:?}");
}

/// A write the io servers refuse (here: through a read-only open, whose
/// capability has no write right) returns at once, then fails; the file's
/// next write says so, and so does a drain, once.
#[test]
fn a_write_that_fails_after_it_returned_is_reported_once() {
    let c = cluster(8);
    let rt = common::runtime("write-behind-errors");
    let fs = fs(&c, &rt);
    let f = fs.create(ROOT_INO, b"ro", 0o644, None).unwrap();
    let ino = f.attr().ino;
    f.close().unwrap();
    let ro = fs.meta.open(ino, dafne_proto::OPEN_READ).unwrap();
    let wb = WriteBehind::new(&fs.data, 2 * SLOT).unwrap();
    let mut c = 0;
    let bytes = pattern(256 << 10, 3);
    assert_eq!(
        wb.write(&ro, 0, &bytes, Stability::Unstable, &mut c, None),
        Ok(bytes.len()),
        "returned before the servers answered"
    );
    wb.settle(ro.layout.object_id);
    let e = wb.write(&ro, 1 << 20, &bytes, Stability::Unstable, &mut c, None).unwrap_err();
    assert_eq!(e, dafne_proto::Errno::EACCES, "the next write reports the failure");
    // Reported once; a new failing write is reported by the drain.
    wb.write(&ro, 2 << 20, &bytes, Stability::Unstable, &mut c, None).unwrap();
    assert_eq!(wb.drain(ro.layout.object_id, &mut c), Err(dafne_proto::Errno::EACCES));
    assert_eq!(wb.drain(ro.layout.object_id, &mut c), Ok(()), "reported once");
    let s = wb.stats();
    assert_eq!(s.errors, 2, "{s:?}");
    // The failed writes' slots were replaced: write-behind still works, on
    // a file this client may write.
    let w = fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    for i in 0..4u64 {
        wb.write(w.handle(), i << 18, &bytes, Stability::Unstable, &mut c, None).unwrap();
    }
    wb.drain(w.handle().layout.object_id, &mut c).unwrap();
    let mut got = vec![0u8; bytes.len()];
    assert_eq!(read(&fs, w.handle(), 3 << 18, &mut got), bytes.len());
    assert!(got == bytes);
    fs.meta.close(ro.layout.object_id).unwrap();
}
