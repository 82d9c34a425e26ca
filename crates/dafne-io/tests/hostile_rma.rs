//! Issue 10, finding 2: a client with a valid capability sends io servers
//! addresses and keys no well-behaved client would. Before the fix, one
//! read to an address outside the registered window, with a key of UCX
//! allocated (shared) memory, made the io server write into its own heap
//! (a crash, or worse, silent corruption); a key naming another process's
//! shared-memory segment (here the io server's own cache slab) made it
//! write into that segment. Now the first is refused with `EFAULT` before
//! anything moves, the second reaches only the client's own memory, and
//! in both cases every server stays up and a well-behaved client reads
//! back what it wrote, byte for byte.

mod common;

use std::net::SocketAddr;

use common::{cluster, pattern, Cluster};

use dafne_client::data::DataClient;
use dafne_client::{Errno, MetaSession, OpenFile, ROOT_INO};
use dafne_proto::io::{IoExtent, IoRequest, Stability};
use dafne_proto::LayoutHint;
use dafne_transport::{Access, Region, Runtime};

fn connect(c: &Cluster, rt: &Runtime, name: &str) -> (MetaSession, DataClient) {
    let secret = dafne_auth::Secret::load(&c.secret).unwrap();
    let meta = MetaSession::connect(rt, c.meta_addr, &secret, name, 0, 0).unwrap();
    let addrs: Vec<SocketAddr> = c.ios.iter().map(|i| i.addr).collect();
    (meta, DataClient::connect(rt, &addrs, &secret).unwrap())
}

/// A new file striped over the four servers in 64 KiB units, holding
/// `data` (written through to storage).
fn file_with(m: &MetaSession, d: &DataClient, name: &str, data: &[u8]) -> OpenFile {
    let hint = LayoutHint { stripe_unit: 64 << 10, stripe_count: 4 };
    let a = m.create_with(ROOT_INO, name.as_bytes(), 0o644, true, Some(hint)).unwrap();
    let f = m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    futures::executor::block_on(d.write_at(&f, 0, data, Stability::FileSync)).unwrap();
    f
}

/// Every io server process is still the one started (none crashed).
fn all_alive(c: &mut Cluster) -> bool {
    c.ios.iter_mut().all(|i| i.child.try_wait().unwrap().is_none())
}

fn write_req(f: &OpenFile, key: &[u8], offset: u64, len: u32, addr: u64) -> IoRequest {
    IoRequest::Write {
        cap: f.cap,
        keys: vec![key.to_vec()],
        extents: vec![IoExtent { offset, len, key: 0, addr }],
        stability: Stability::FileSync,
        inline: Vec::new(),
        keys_follow: None,
    }
}

/// A read into and a write from `[addr, addr + len)` under `key` (file
/// offset 0), sent by `d` to each of the four io servers: what each
/// answered, labelled.
fn read_and_write_on_every_server(
    d: &DataClient,
    f: &OpenFile,
    key: &[u8],
    len: u32,
    addr: u64,
) -> Vec<(String, Result<dafne_proto::io::IoResponse, Errno>)> {
    let mut out = Vec::new();
    for server in 0..4 {
        for (op, req) in
            [("read into", read_req(f, key, 0, len, addr)), ("write from", write_req(f, key, 0, len, addr))]
        {
            out.push((format!("{op} io server {server}"), futures::executor::block_on(d.raw_request(server, &req))));
        }
    }
    out
}

fn read_req(f: &OpenFile, key: &[u8], offset: u64, len: u32, addr: u64) -> IoRequest {
    IoRequest::Read {
        cap: f.cap,
        keys: vec![key.to_vec()],
        extents: vec![IoExtent { offset, len, key: 0, addr }],
        inline_reply: false,
        keys_follow: None,
    }
}

#[test]
fn extents_outside_their_keys_window_are_refused_before_anything_moves() {
    let mut c = cluster(8);
    let rt = common::runtime("hostile-rma");
    let (m, d) = connect(&c, &rt, "hostile-rma");
    let data = pattern(1 << 20, 1);
    let f = file_with(&m, &d, "victim", &data);
    // Memory UCX allocates (a shared-memory segment whose key a server on
    // this host could map), 64 KiB of it, all zeros.
    let region = Region::allocate(d.context().unwrap(), 64 << 10, Access::RemoteReadWrite).unwrap();
    let key = region.pack_key().unwrap();
    let base = region.addr();
    let far = base.wrapping_add(1 << 40);
    let cases = [
        ("a terabyte past the window", far, 4096u32),
        ("straddling the window's end", base + (64 << 10) - 100, 4096),
        ("one byte before the window", base - 1, 16),
        ("wrapping around the address space", u64::MAX - 10, 4096),
    ];
    // A range that wraps is already refused where the request is decoded
    // (EPROTO, finding 6); the others are refused by the window check.
    let refused = |e: Option<Errno>| e == Some(Errno::EFAULT) || e == Some(Errno::EPROTO);
    for (what, addr, len) in cases {
        for (op, r) in read_and_write_on_every_server(&d, &f, &key, len, addr) {
            assert!(refused(r.as_ref().err().copied()), "{op}, {what}: {r:?}");
        }
    }
    assert!(all_alive(&mut c), "an io server died");
    assert!(region.as_slice().iter().all(|&b| b == 0), "a refused request wrote into the client's window");
    // The same key inside its window still works (the check is not a ban).
    let first = f.layout.servers[0] as usize;
    futures::executor::block_on(d.raw_request(first, &read_req(&f, &key, 0, 4096, base))).unwrap();
    assert!(region.as_slice()[..4096] == data[..4096]);
    // A second, well-behaved client reads back every byte.
    let (m2, d2) = connect(&c, &rt, "honest");
    let f2 = m2.open(f.attr.ino, dafne_proto::OPEN_READ).unwrap();
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(d2.read_at(&f2, 0, &mut back)).unwrap();
    assert!(back == data, "the honest client's bytes differ");
}

/// The System V segments process `pid` created: (shmid, size).
fn sysv_segments_of(pid: u32) -> Vec<(i32, u64)> {
    let table = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 4 && f[4].parse::<u32>().ok()? == pid).then(|| Some((f[1].parse().ok()?, f[3].parse().ok()?)))?
        })
        .collect()
}

#[test]
fn a_key_naming_the_servers_own_segment_reaches_only_the_clients_memory() {
    // Small caches, filled by the honest file: every unit of every io
    // server's cache holds its data.
    let mut c = cluster(2);
    let rt = common::runtime("hostile-shm");
    let (m, d) = connect(&c, &rt, "hostile-shm");
    let honest = pattern(8 << 20, 2);
    let f = file_with(&m, &d, "honest", &honest);
    let other = pattern(64 << 10, 3);
    let g = file_with(&m, &d, "other", &other);

    // The server that holds the other file's first unit.
    let first = g.layout.servers[0] as usize;
    let server_pid = c.ios[first].child.id();
    let (victim, victim_size) = sysv_segments_of(server_pid)
        .into_iter()
        .max_by_key(|s| s.1)
        .expect("the io server allocates its cache as System V shared memory (UCX's default on this host)");
    assert!(victim_size >= 64 << 10);

    // The hostile key: a real key of the client's own allocated memory
    // with the segment id replaced by the server's. UCX 1.13's System V
    // key part is the shmid (4 bytes) then the owner's address (8 bytes).
    let region = Region::allocate(d.context().unwrap(), 64 << 10, Access::RemoteReadWrite).unwrap();
    let mine = sysv_segments_of(std::process::id());
    let mut key = region.pack_key().unwrap();
    let mut needle = Vec::new();
    let at = mine
        .iter()
        .find_map(|(id, _)| {
            needle = [id.to_le_bytes().as_slice(), region.addr().to_le_bytes().as_slice()].concat();
            key.windows(needle.len()).position(|w| w == needle)
        })
        .expect("the key of allocated memory names its System V segment");
    key[at..at + 4].copy_from_slice(&victim.to_le_bytes());

    // The server puts the other file's first unit "into the client" at the
    // start of the key's window: the server's own slab, had it mapped it.
    let r = futures::executor::block_on(d.raw_request(first, &read_req(&g, &key, 0, 64 << 10, region.addr())));
    assert!(all_alive(&mut c), "an io server died");
    if r.is_ok() {
        assert!(region.as_slice() == &other[..], "the bytes went somewhere else than the client's own memory");
    }
    // Nothing of the server's cache changed: an honest client reads back
    // every byte of the file that fills it.
    let (m2, d2) = connect(&c, &rt, "honest");
    let f2 = m2.open(f.attr.ino, dafne_proto::OPEN_READ).unwrap();
    let mut back = vec![0u8; honest.len()];
    futures::executor::block_on(d2.read_at(&f2, 0, &mut back)).unwrap();
    assert!(back == honest, "an io server's cache was written through a key naming its own segment");
}

/// A key to ordinary memory the client registered (not a segment UCX
/// allocated): on one host UCX 1.13 reaches such memory only by RMA
/// emulated over messages that the client's own worker answers, so a
/// client that stops and then dies mid-request held the server's cache
/// units for good (see `crates/dafne/tests/hostile.rs`,
/// `clients_stopped_and_killed_mid_copy_leave_the_io_caches_whole`). The
/// servers refuse such keys with `EREMOTEIO` before anything moves; the
/// client library's own buffers are UCX memory and keep working.
#[test]
fn keys_to_registered_memory_are_refused_on_one_host_before_anything_moves() {
    let mut c = cluster(8);
    let rt = common::runtime("hostile-registered");
    let (m, d) = connect(&c, &rt, "hostile-registered");
    let data = pattern(1 << 20, 4);
    let f = file_with(&m, &d, "victim", &data);
    let region = Region::register(d.context().unwrap(), vec![0u8; 64 << 10], Access::RemoteReadWrite).unwrap();
    let key = region.pack_key().unwrap();
    for (op, r) in read_and_write_on_every_server(&d, &f, &key, 4096, region.addr()) {
        assert_eq!(r.err(), Some(Errno::EREMOTEIO), "{op}, registered memory");
    }
    assert!(all_alive(&mut c), "an io server died");
    assert!(region.as_slice().iter().all(|&b| b == 0), "a refused read wrote into the client's memory");
    // The client library: `register` copies into UCX memory, and caller
    // buffers (the registration cache) fall back to bounce buffers.
    let mut back = d.register(vec![0u8; data.len()], Access::RemoteReadWrite).unwrap();
    futures::executor::block_on(d.read_region(&f, 0, &back, 0, data.len())).unwrap();
    assert!(back.as_slice() == &data[..], "read through a registered copy");
    let other = pattern(data.len(), 5);
    futures::executor::block_on(d.write_from(&f, 0, &other, Stability::FileSync)).unwrap();
    let mut plain = vec![0u8; data.len()];
    futures::executor::block_on(d.read_into(&f, 0, &mut plain)).unwrap();
    assert!(plain == other, "caller buffers through the registration cache's fallback");
    back.as_mut_slice().fill(0);
    let (m2, d2) = connect(&c, &rt, "honest");
    let f2 = m2.open(f.attr.ino, dafne_proto::OPEN_READ).unwrap();
    futures::executor::block_on(d2.read_region(&f2, 0, &back, 0, data.len())).unwrap();
    assert!(back.as_slice() == &other[..], "the honest client's bytes differ");
}

/// Review of the fix above: the server chose shared memory or TCP for its
/// data endpoint from the host id the client's hello states, and allowed
/// every key on TCP (as across hosts). A client on this host that claimed
/// another host got a TCP endpoint, where all RMA is emulated by the
/// client's own worker, and every key was served: stopped mid-copy, such
/// clients held 97 and 128 units of two 8 MiB caches. Now whether the
/// client is on this host is the kernel's word (its end of the control
/// connection is one of this host's sockets), and such a client's keys
/// are refused, allocated memory included.
#[test]
fn a_client_that_claims_another_host_is_held_to_this_hosts_rule() {
    let mut c = cluster(8);
    let rt = common::runtime("honest-meta");
    let (m, d) = connect(&c, &rt, "honest-meta");
    let data = pattern(1 << 20, 6);
    let f = file_with(&m, &d, "victim", &data);
    let liar_rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "liar".into(),
        ucx_config: common::ucx(),
        claim_host_id: Some([0x5A; 16]),
        ..Default::default()
    })
    .unwrap();
    let (_lm, ld) = connect(&c, &liar_rt, "liar");
    let allocated = Region::allocate(ld.context().unwrap(), 64 << 10, Access::RemoteReadWrite).unwrap();
    let registered = Region::register(ld.context().unwrap(), vec![0u8; 64 << 10], Access::RemoteReadWrite).unwrap();
    for (what, region) in [("allocated", &allocated), ("registered", &registered)] {
        let key = region.pack_key().unwrap();
        for (op, r) in read_and_write_on_every_server(&ld, &f, &key, 4096, region.addr()) {
            assert_eq!(r.err(), Some(Errno::EREMOTEIO), "{op}, {what} memory of a lying client");
        }
        assert!(region.as_slice().iter().all(|&b| b == 0), "a refused read wrote into {what} memory");
    }
    assert!(all_alive(&mut c), "an io server died");
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(d.read_at(&f, 0, &mut back)).unwrap();
    assert!(back == data, "the honest client's bytes differ");
}
