//! FRRWP (keys that follow their Read or Write; `dafne_proto::io`, "Keys
//! that follow") against real io server processes: bytes written and read
//! back that way are the bytes, both ends count the requests that went
//! that way, and the server's hostile-input rules hold: keys for a tag
//! nothing waits for are refused, keys outside their window are refused as
//! when carried in the request, a request whose keys never come is
//! answered `ETIMEDOUT` at the deadline, and the requests one connection
//! may park are bounded.
//!
//! Servers and clients behave as on different hosts
//! (`common::as_if_across_hosts`): on one host io servers refuse keys to
//! memory the client registered (`EREMOTEIO`), and FRRWP sends only such
//! keys (a caller's buffer, registered while the request travels).

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use common::{cluster, pattern, Cluster};

use dafne_client::data::{info_capability, DataClient};
use dafne_client::{Errno, MetaSession, OpenFile, ROOT_INO};
use dafne_proto::io::{IoExtent, IoRequest, KeysFollow, Stability};
use dafne_proto::LayoutHint;
use dafne_transport::{Access, Region, Runtime};
use futures::executor::block_on;

fn clients(
    meta_addr: SocketAddr,
    secret: &std::path::Path,
    addrs: &[SocketAddr],
    rt: &Runtime,
) -> (MetaSession, DataClient) {
    let secret = dafne_auth::Secret::load(secret).unwrap();
    // The metadata server runs in this process, on this host's terms.
    let meta_rt: &'static Runtime = Box::leak(Box::new(common::runtime_on_this_host("frrwp-meta")));
    let meta = MetaSession::connect(meta_rt, meta_addr, &secret, "frrwp-test", 0, 0).unwrap();
    (meta, DataClient::connect(rt, addrs, &secret).unwrap())
}

fn addrs(c: &Cluster) -> Vec<SocketAddr> {
    c.ios.iter().map(|i| i.addr).collect()
}

fn open_new(m: &MetaSession, name: &str, stripe_count: u32) -> OpenFile {
    let hint = LayoutHint { stripe_unit: 64 << 10, stripe_count };
    let a = m.create_with(ROOT_INO, name.as_bytes(), 0o644, true, Some(hint)).unwrap();
    m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap()
}

/// (served, refused) FRRWP requests over all of `d`'s io servers.
fn server_counts(d: &DataClient, secret: &std::path::Path) -> (u64, u64) {
    let cap = info_capability(&dafne_auth::Secret::load(secret).unwrap());
    block_on(d.all_server_info(cap))
        .into_iter()
        .map(|i| i.unwrap())
        .fold((0, 0), |(s, r), i| (s + i.frrwp_requests, r + i.frrwp_refused))
}

fn follow_read(f: &OpenFile, tag: u64, addr: u64, len: u32) -> IoRequest {
    IoRequest::Read {
        cap: f.cap,
        keys: vec![],
        extents: vec![IoExtent { offset: 0, len, key: 0, addr }],
        inline_reply: false,
        keys_follow: Some(KeysFollow { tag, count: 1 }),
    }
}

#[test]
fn bytes_written_and_read_with_keys_following_round_trip_and_are_counted() {
    common::as_if_across_hosts();
    let c = cluster(16);
    let rt = common::runtime("frrwp-roundtrip");
    let (m, d) = clients(c.meta_addr, &c.secret, &addrs(&c), &rt);
    d.set_frrwp(true);
    let f = open_new(&m, "frrwp", 4);
    // 300 KiB + a bit, from offset 100: all four servers, one part each
    // or more, and a partial unit at both ends.
    let src = pattern((300 << 10) + 4321, 7);
    let mut dst = vec![0u8; src.len()];
    block_on(d.write_from_registered(&f, 100, &src, Stability::Unstable)).unwrap();
    let after_write = d.frrwp_requests();
    assert_eq!(after_write, 4, "one request per server went the FRRWP way");
    block_on(d.read_into_registered(&f, 100, &mut dst)).unwrap();
    assert!(dst == src, "the bytes read back with keys following are not the bytes written");
    let sent = d.frrwp_requests();
    assert_eq!(sent, 8);
    assert_eq!(server_counts(&d, &c.secret), (sent, 0), "the servers served what the client sent that way");
    // A buffer whose registration is cached has nothing to overlap: its
    // key goes in the request.
    dst.fill(0);
    block_on(d.read_into_registered(&f, 100, &mut dst)).unwrap();
    assert!(dst == src);
    assert_eq!(d.frrwp_requests(), sent, "a cached registration went the FRRWP way");
    assert!(d.regcache_stats().hits >= 1, "{:?}", d.regcache_stats());
    // Off: the key goes in the request again; the data is the same.
    d.set_frrwp(false);
    let other = pattern(200 << 10, 9);
    block_on(d.write_from_registered(&f, 1 << 20, &other, Stability::Unstable)).unwrap();
    let mut back = vec![0u8; other.len()];
    block_on(d.read_into_registered(&f, 1 << 20, &mut back)).unwrap();
    assert!(back == other);
    assert_eq!(d.frrwp_requests(), sent);
    assert_eq!(server_counts(&d, &c.secret), (sent, 0));
}

#[test]
fn keys_for_no_waiting_request_and_keys_outside_their_window_are_refused() {
    common::as_if_across_hosts();
    let c = cluster(8);
    let rt = common::runtime("frrwp-hostile");
    let (m, d) = clients(c.meta_addr, &c.secret, &addrs(&c), &rt);
    let f = open_new(&m, "hostile", 1);
    let region = Region::allocate(d.context().unwrap(), 64 << 10, Access::RemoteReadWrite).unwrap();
    let key = region.pack_key().unwrap();
    // A tag nothing waits for.
    let server = f.layout.servers[0] as usize;
    let r = block_on(d.raw_request(server, &IoRequest::Keys { tag: 0xdead, keys: vec![key.clone()] }));
    assert_eq!(r, Err(Errno::ENOENT));
    assert_eq!(server_counts(&d, &c.secret), (0, 1));
    // Keys that arrive for a request whose extent is outside their window:
    // refused as if carried in the request (EFAULT), nothing moved.
    let far = region.addr() + (1 << 30);
    let req = follow_read(&f, 1, far, 4096);
    let keys = IoRequest::Keys { tag: 1, keys: vec![key.clone()] };
    let (r, k) = block_on(futures::future::join(d.raw_request(server, &req), d.raw_request(server, &keys)));
    assert_eq!(k.map(|_| ()), Ok(()), "the keys were delivered");
    assert_eq!(r.map(|_| ()), Err(Errno::EFAULT));
    // The same request inside the window is served.
    let req = follow_read(&f, 2, region.addr(), 4096);
    let keys = IoRequest::Keys { tag: 2, keys: vec![key.clone()] };
    let (r, k) = block_on(futures::future::join(d.raw_request(server, &req), d.raw_request(server, &keys)));
    assert!(r.is_ok() && k.is_ok(), "{r:?} {k:?}");
    // The wrong number of keys fails the request and the keys.
    let req = follow_read(&f, 3, region.addr(), 4096);
    let keys = IoRequest::Keys { tag: 3, keys: vec![key.clone(), key.clone()] };
    let (r, k) = block_on(futures::future::join(d.raw_request(server, &req), d.raw_request(server, &keys)));
    assert_eq!((r.map(|_| ()), k.map(|_| ())), (Err(Errno::EINVAL), Err(Errno::EINVAL)));
    assert_eq!(server_counts(&d, &c.secret), (1, 3), "served: one; refused: unknown tag, window, count");
}

/// One io server with a keys deadline of `ms`, as across hosts.
fn io_with_deadline(dir: &std::path::Path, secret: &std::path::Path, ms: u64) -> common::IoProc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dafne-io"))
        .env("DAFNE_DATA_PATH", "peer")
        .args(["--data-dir", dir.to_str().unwrap(), "--secret", secret.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--cache-mib", "8", "--storage", &common::storage(), "--keys-deadline-ms", &ms.to_string()])
        .args(common::ucx_args().into_iter().flat_map(|kv| ["--ucx".to_string(), kv]))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dafne-io");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("banner {line:?}")).parse().unwrap();
    common::IoProc { child, addr, dir: dir.to_path_buf(), storage: common::storage() }
}

#[test]
fn requests_whose_keys_never_come_are_answered_at_the_deadline_and_bounded_per_connection() {
    common::as_if_across_hosts();
    let base = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = common::start_meta(root.path(), 1, 64 << 10, 1);
    let io = io_with_deadline(&root.path().join("io0"), &secret, 300);
    let rt = common::runtime("frrwp-deadline");
    let (m, d) = clients(meta.addr, &secret, &[io.addr], &rt);
    let f = open_new(&m, "parked", 1);
    let region = Region::allocate(d.context().unwrap(), 64 << 10, Access::RemoteReadWrite).unwrap();
    // No keys: the answer comes when the deadline passes (the call waits
    // for it; the client's call timeout is far longer).
    let r = block_on(d.raw_request(0, &follow_read(&f, 10, region.addr(), 4096)));
    assert_eq!(r.map(|_| ()), Err(Errno::ETIMEDOUT));
    assert_eq!(server_counts(&d, &secret), (0, 1));
    // The request left the table: its keys, late, find nothing.
    let key = region.pack_key().unwrap();
    let late = block_on(d.raw_request(0, &IoRequest::Keys { tag: 10, keys: vec![key] }));
    assert_eq!(late, Err(Errno::ENOENT));
    // One connection parks at most PARKED_PER_CONN requests: of one more
    // sent at once, the last is refused (EBUSY) at once, the others time
    // out; and so is a tag already waiting.
    let n = dafne_io::service::PARKED_PER_CONN as u64;
    let reqs: Vec<IoRequest> = (0..=n).map(|t| follow_read(&f, 100 + t, region.addr(), 4096)).collect();
    let answers = block_on(futures::future::join_all(reqs.iter().map(|r| d.raw_request(0, r))));
    let errs: Vec<Errno> = answers.into_iter().map(|a| a.unwrap_err()).collect();
    let mut want = vec![Errno::ETIMEDOUT; n as usize];
    want.push(Errno::EBUSY);
    assert_eq!(errs, want, "the request past the bound");
    let dup = [follow_read(&f, 300, region.addr(), 4096), follow_read(&f, 300, region.addr(), 4096)];
    let answers = block_on(futures::future::join_all(dup.iter().map(|r| d.raw_request(0, r))));
    let errs: Vec<Errno> = answers.into_iter().map(|a| a.unwrap_err()).collect();
    assert_eq!(errs, [Errno::ETIMEDOUT, Errno::EBUSY], "a tag already waiting");
    assert_eq!(server_counts(&d, &secret), (0, 1 + n + 2 + 1 + 1), "refused: timed out, late keys, bound, tag");
    // Afterwards the connection parks requests again.
    let key = region.pack_key().unwrap();
    let req = follow_read(&f, 500, region.addr(), 4096);
    let keys = IoRequest::Keys { tag: 500, keys: vec![key] };
    let (r, k) = block_on(futures::future::join(d.raw_request(0, &req), d.raw_request(0, &keys)));
    assert!(r.is_ok() && k.is_ok(), "{r:?} {k:?}");
    assert_eq!(server_counts(&d, &secret).0, 1);
    drop(io);
}
