//! Multi-process transport tests: a real server process
//! (`dafne-transport-peer serve`) and a client runtime in this process,
//! over TCP, shared memory and cma. Data is checked byte for byte.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use dafne_transport::testsvc::{self, encode_rma, pattern, SegDesc, FLAG_PLAIN, FLAG_VERIFY, OP_GET, OP_PUT};
use dafne_transport::{Access, Client, Region, TransportError};

const SIZES: [usize; 8] = [1, 7, 4096, 4099, 65536 + 3, 1 << 20, (4 << 20) + 11, 16 << 20];

/// Registers `len` bytes at an odd offset inside a larger region, in one of
/// the two ways a client can: UCX-allocated, or the caller's own Vec.
fn client_region(c: &Client, len: usize, ucx_alloc: bool, access: Access) -> (Region, usize) {
    let off = 3;
    let r = if ucx_alloc {
        Region::allocate(c.context(), len + 64, access).unwrap()
    } else {
        Region::register(c.context(), vec![0u8; len + 64], access).unwrap()
    };
    (r, off)
}

fn seg(r: &Region, off: usize, len: usize) -> SegDesc {
    SegDesc { addr: r.addr() + off as u64, len: len as u64, key: r.pack_key().unwrap() }
}

fn check_pattern(got: &[u8], seed: u64, base: u64) {
    for (i, b) in got.iter().enumerate() {
        let want = pattern(seed, base + i as u64);
        assert_eq!(*b, want, "byte {} differs (seed {seed})", base + i as u64);
    }
}

fn put_and_check(c: &Client, len: usize, ucx_alloc: bool, flags: u8, seed: u64) {
    let (r, off) = client_region(c, len, ucx_alloc, Access::RemoteWrite);
    let reply = c.call(encode_rma(OP_PUT, flags | FLAG_VERIFY, seed, &[seg(&r, off, len)])).unwrap();
    testsvc::parse_reply(&reply).unwrap_or_else(|e| panic!("put of {len} bytes failed: {e}"));
    check_pattern(&r.as_slice()[off..off + len], seed, 0);
    // Bytes around the target range are untouched.
    assert!(r.as_slice()[..off].iter().all(|&b| b == 0));
    assert!(r.as_slice()[off + len..].iter().all(|&b| b == 0));
}

fn get_and_check(c: &Client, len: usize, ucx_alloc: bool, flags: u8, seed: u64) {
    let (mut r, off) = client_region(c, len, ucx_alloc, Access::RemoteRead);
    for (i, b) in r.as_mut_slice()[off..off + len].iter_mut().enumerate() {
        *b = pattern(seed, i as u64);
    }
    let reply = c.call(encode_rma(OP_GET, flags | FLAG_VERIFY, seed, &[seg(&r, off, len)])).unwrap();
    let body = testsvc::parse_reply(&reply).unwrap_or_else(|e| panic!("get of {len} bytes failed: {e}"));
    let want = testsvc::fnv1a([&r.as_slice()[off..off + len]]);
    assert_eq!(u64::from_le_bytes(body[..8].try_into().unwrap()), want, "get of {len} bytes: data differs");
    assert_eq!(u64::from_le_bytes(body[8..16].try_into().unwrap()), len as u64);
}

#[test]
fn put_and_get_every_size_over_every_transport() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let rt = client_runtime(tls);
        let c = Client::connect(&rt, server.addr).expect("connect");
        let before = c.context().stats().snapshot();
        for (i, &len) in SIZES.iter().enumerate() {
            for ucx_alloc in [true, false] {
                for flags in [0, FLAG_PLAIN] {
                    let seed = (i as u64) << 8 | flags as u64;
                    put_and_check(&c, len, ucx_alloc, flags, seed);
                    get_and_check(&c, len, ucx_alloc, flags, seed + 1);
                }
            }
        }
        let d = c.context().stats().snapshot().since(&before);
        // The client moved no bulk bytes itself: the server drove every
        // transfer, and the client only sent requests.
        assert_eq!(d.bytes_put + d.bytes_got, 0, "{tls:?}: the client issued RMA");
        assert!(d.am_bytes_sent < 64 * 1024 * SIZES.len() as u64, "{tls:?}: bulk data travelled in messages");
        eprintln!("{tls:?} ok: {} requests, {} registrations", d.am_sent, d.registrations);
    }
}

#[test]
fn multi_segment_lists_scatter_and_gather() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let rt = client_runtime(tls);
        let c = Client::connect(&rt, server.addr).unwrap();
        // Three regions, several odd segments each, 17 segments in all.
        let regions: Vec<Region> =
            (0..3).map(|i| Region::allocate(c.context(), 300_000 + i * 7, Access::RemoteReadWrite).unwrap()).collect();
        let mut segs = Vec::new();
        let mut layout = Vec::new();
        for (ri, r) in regions.iter().enumerate() {
            let mut off = 1 + ri;
            for k in 0..6 {
                if ri == 2 && k == 5 {
                    break;
                }
                let len = 1 + (k * 9973 + ri * 131) % 40_000;
                segs.push(seg(r, off, len));
                layout.push((ri, off, len));
                off += len + 5;
            }
        }
        assert_eq!(segs.len(), 17);
        let reply = c.call(encode_rma(OP_PUT, FLAG_VERIFY, 42, &segs)).unwrap();
        testsvc::parse_reply(&reply).unwrap();
        let mut base = 0u64;
        for &(ri, off, len) in &layout {
            check_pattern(&regions[ri].as_slice()[off..off + len], 42, base);
            base += len as u64;
        }
        // Gather the same bytes back: the server's hash must match.
        let reply = c.call(encode_rma(OP_GET, FLAG_VERIFY, 42, &segs)).unwrap();
        let body = testsvc::parse_reply(&reply).unwrap();
        let want = testsvc::fnv1a(layout.iter().map(|&(ri, off, len)| &regions[ri].as_slice()[off..off + len]));
        assert_eq!(u64::from_le_bytes(body[..8].try_into().unwrap()), want, "{tls:?}");
    }
}

/// Malformed keys are refused by dafne's structural check before UCX parses
/// them (UCX 1.13 crashes on some), and so are ranges outside a key's
/// window. Memory that is gone (a revoked key) is refused by the memory
/// system that serves RMA: the NIC on RDMA. On one host, servers never map
/// a peer's shared-memory segment (`dafne_ucx`'s `KeyShape`), so UCX 1.13
/// serves their puts and gets by RMA emulated over active messages, where
/// the *client's* UCX writes its own memory and checks no key
/// (ARCHITECTURE.md, "Trust"): a revoked key there harms only the client
/// that revoked memory under its own request, and no transport on this
/// machine refuses it, so that case is not run here.
#[test]
fn bad_keys_and_ranges_outside_the_window_fail_cleanly() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let rt = client_runtime(tls);
        let c = Client::connect(&rt, server.addr).unwrap();
        let region = Region::allocate(c.context(), 1 << 20, Access::RemoteWrite).unwrap();
        // Garbage key bytes (aimed at live memory, so a transport that
        // ignored the key could not corrupt anything).
        let bad = SegDesc { addr: region.addr(), len: 4096, key: vec![0xEE; 40] };
        let r = c.call(encode_rma(OP_PUT, FLAG_VERIFY, 1, &[bad])).unwrap();
        assert!(testsvc::parse_reply(&r).is_err(), "{tls:?}: a garbage key was accepted");
        assert!(region.as_slice()[..4096].iter().all(|&b| b == 0), "{tls:?}: garbage key wrote data");
        // A truncated real key.
        let mut k = region.pack_key().unwrap();
        k.truncate(3);
        let r =
            c.call(encode_rma(OP_PUT, FLAG_VERIFY, 1, &[SegDesc { addr: region.addr(), len: 64, key: k }])).unwrap();
        assert!(testsvc::parse_reply(&r).is_err(), "{tls:?}: a truncated key was accepted");
        // A range past the key's window (the key is real, the memory beyond
        // it too: the server refuses before UCX is asked).
        let past = SegDesc { addr: region.addr() + (1 << 20) - 64, len: 4096, key: region.pack_key().unwrap() };
        let r = c.call(encode_rma(OP_PUT, FLAG_VERIFY, 1, &[past])).unwrap();
        assert!(testsvc::parse_reply(&r).is_err(), "{tls:?}: a range past the window was accepted");
        drop(region);
        // The connection still works afterwards.
        put_and_check(&c, 65536, true, 0, 9);
        get_and_check(&c, 65536, true, 0, 10);
    }
}

#[test]
fn killing_the_server_fails_pending_calls_without_hanging() {
    for tls in ALL {
        let mut server = spawn_server(tls, &[]);
        // Calls wait 30 s on the server; the call timeout is longer still,
        // so only death detection can end them early.
        let rt = client_runtime_with(tls, |o| o.call_timeout = Duration::from_secs(120));
        let c = Client::connect(&rt, server.addr).unwrap();
        let futs: Vec<_> = (0..8)
            .map(|_| {
                let mut req = vec![testsvc::OP_SLEEP];
                req.extend_from_slice(&30_000u32.to_le_bytes());
                c.call_async(req)
            })
            .collect();
        wait_in_flight(&rt, server.addr, 8);
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        let t = Instant::now();
        for f in futs {
            match futures::executor::block_on(f) {
                Err(TransportError::PeerFailed { .. }) => {}
                other => panic!("{tls:?}: expected PeerFailed, got {other:?}"),
            }
        }
        assert!(t.elapsed() < Duration::from_secs(29), "{tls:?}: calls only ended when the server would have replied");
        // New calls on the dead connection fail at once with the same cause.
        assert!(matches!(c.call(vec![testsvc::OP_ECHO]), Err(TransportError::PeerFailed { .. })));
    }
}

/// Waits until the server at `addr` is handling `n` requests besides the
/// stats request that asks (so that a kill lands with them in flight, not
/// before they arrived).
fn wait_in_flight(rt: &dafne_transport::Runtime, addr: std::net::SocketAddr, n: u64) {
    let probe = Client::connect(rt, addr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = server_stats(&probe);
        if s["transport"]["requests_in_flight"].as_u64().unwrap() > n {
            return;
        }
        assert!(Instant::now() < deadline, "the server never had {n} requests in flight: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn server_stats(c: &Client) -> serde_json::Value {
    let r = c.call(vec![testsvc::OP_STATS]).unwrap();
    serde_json::from_slice(testsvc::parse_reply(&r).unwrap()).unwrap()
}

#[test]
fn killing_a_client_mid_transfer_leaves_the_server_serving() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let mut hammer = Command::new(peer_bin())
            .args(tls.args())
            .args(["hammer", "--connect", &server.addr.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(hammer.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "hammering");
        std::thread::sleep(Duration::from_millis(200));
        hammer.kill().unwrap();
        hammer.wait().unwrap();
        let rt = client_runtime(tls);
        let c = Client::connect(&rt, server.addr).unwrap();
        put_and_check(&c, 1 << 20, true, 0, 77);
        get_and_check(&c, 1 << 20, true, 0, 78);
        // The server noticed the death and released the connection.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = server_stats(&c);
            if s["transport"]["peer_failures"].as_u64().unwrap() >= 1 {
                break;
            }
            assert!(Instant::now() < deadline, "{tls:?}: server never noticed the dead client: {s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn malformed_frames_are_dropped_and_other_clients_carry_on() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let rt = client_runtime(tls);
        let a = Client::connect(&rt, server.addr).unwrap();
        put_and_check(&a, 4096, true, 0, 1);
        let out = Command::new(peer_bin())
            .args(tls.args())
            .args(["garbage", "--connect", &server.addr.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "garbage peer failed: {}", String::from_utf8_lossy(&out.stderr));
        // The existing client and a new one both still work.
        put_and_check(&a, 65536, true, 0, 2);
        let b = Client::connect(&rt, server.addr).unwrap();
        get_and_check(&b, 65536, true, 0, 3);
        let s = server_stats(&b);
        let malformed = s["transport"]["malformed_frames"].as_u64().unwrap();
        assert!(malformed >= 50, "{tls:?}: only {malformed} malformed frames counted: {s}");
        // Nothing from a peer without a connection was received into memory:
        // frames for unknown connections and payloads too big for their kind
        // are refused from the header alone (no rendezvous receive).
        assert_eq!(s["transport"]["rndv_payloads"].as_u64(), Some(0), "{tls:?}: {s}");
        let refused = s["transport"]["refused_before_receive"].as_u64().unwrap();
        assert!(refused >= 4, "{tls:?}: only {refused} frames refused before receive: {s}");
    }
}

#[test]
fn credits_bound_requests_in_flight() {
    let tls = Tls::Shm;
    let server = spawn_server(tls, &["--credits", "2"]);
    let rt = client_runtime(tls);
    let c = Client::connect(&rt, server.addr).unwrap();
    let futs: Vec<_> = (0..10)
        .map(|_| {
            let mut req = vec![testsvc::OP_SLEEP];
            req.extend_from_slice(&50u32.to_le_bytes());
            c.call_async(req)
        })
        .collect();
    for f in futs {
        testsvc::parse_reply(&futures::executor::block_on(f).unwrap()).unwrap();
    }
    let waits = rt.stats().snapshot().credit_waits;
    assert!(waits >= 8, "only {waits} calls waited for a credit with 2 granted");
    let s = server_stats(&c);
    assert_eq!(s["transport"]["credit_refusals"].as_u64(), Some(0), "client exceeded its credits: {s}");
}

#[test]
fn unreachable_server_gives_a_clear_error() {
    let rt = client_runtime(Tls::Tcp);
    // A port nothing listens on: bind, learn the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    match Client::connect(&rt, addr) {
        Err(e @ TransportError::Unreachable { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&addr.to_string()), "message does not name the address: {msg}");
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
}

#[test]
fn calls_time_out_and_oversized_requests_are_refused() {
    let tls = Tls::Tcp;
    let server = spawn_server(tls, &[]);
    let rt = client_runtime_with(tls, |o| o.call_timeout = Duration::from_millis(500));
    let c = Client::connect(&rt, server.addr).unwrap();
    let mut req = vec![testsvc::OP_SLEEP];
    req.extend_from_slice(&3000u32.to_le_bytes());
    assert!(matches!(c.call(req), Err(TransportError::TimedOut { .. })));
    let big = vec![testsvc::OP_ECHO; (1 << 20) + 1];
    assert!(matches!(c.call(big), Err(TransportError::TooLarge { .. })));
    // The connection is still usable, also for payloads large enough to
    // travel by rendezvous both ways (TCP's eager limit is ~20 KiB).
    let before = rt.stats().snapshot().rndv_payloads;
    let mut req = vec![testsvc::OP_ECHO];
    req.extend_from_slice(&[5; 100_000]);
    assert_eq!(testsvc::parse_reply(&c.call(req).unwrap()).unwrap(), &[5; 100_000][..]);
    assert!(rt.stats().snapshot().rndv_payloads > before, "the 100 kB reply did not arrive by rendezvous");
}

/// IPv6 socket addresses go through the same path as IPv4: the listener
/// binds `[::1]` and reports it. Connecting is not attempted here: UCX
/// 1.13's TCP transport has no IPv6 interface on loopback, and accepting an
/// IPv6 connection without one corrupts UCX's heap inside
/// `ucp_ep_create` (seen with gdb in `ucs_socket_connect`). On a cluster with
/// IPv6 interfaces the same code connects; see ARCHITECTURE.md.
#[test]
fn ipv6_listener_binds_and_reports_its_address() {
    let tls = Tls::Tcp;
    let server = spawn_server(tls, &["--listen", "[::1]:0"]);
    assert!(server.addr.is_ipv6(), "listener reported {}", server.addr);
    assert_eq!(server.addr.ip(), "::1".parse::<std::net::IpAddr>().unwrap());
    assert_ne!(server.addr.port(), 0);
    // The port is really bound: binding it again fails.
    assert!(std::net::TcpListener::bind(server.addr).is_err());
}

/// Data endpoints with UCX peer error handling (what RDMA clusters use) work
/// and detect a dead server on the data path too; the default on one host
/// turns error handling off so that shared memory can be used.
#[test]
fn data_endpoints_with_peer_error_handling() {
    for tls in [Tls::Tcp, Tls::Shm] {
        let mut child = Command::new(peer_bin())
            .args(tls.args())
            .args(["--data-path", "peer", "serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let mut server = Peer { addr: line.trim().strip_prefix("listening on ").unwrap().parse().unwrap(), child };
        let rt = client_runtime_with(tls, |o| {
            o.data_path = dafne_transport::DataPath::PeerErrorHandling;
            o.call_timeout = Duration::from_secs(120);
        });
        let c = Client::connect(&rt, server.addr).unwrap();
        put_and_check(&c, 1 << 20, true, 0, 11);
        get_and_check(&c, 1 << 20, false, 0, 12);
        let info = c.data_path_info().unwrap();
        assert!(info.contains("tcp"), "{tls:?}: peer error handling should put the data path on TCP here: {info}");
        let mut req = vec![testsvc::OP_SLEEP];
        req.extend_from_slice(&30_000u32.to_le_bytes());
        let pending = c.call_async(req);
        wait_in_flight(&rt, server.addr, 1);
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        assert!(matches!(futures::executor::block_on(pending), Err(TransportError::PeerFailed { .. })));
    }
}

/// A handler that blocks the event loop (a storage call that never
/// returns) makes the watchdog abort the server, so that a supervisor
/// restarts it; a short block does not.
#[test]
fn the_watchdog_aborts_a_server_whose_loop_is_stuck() {
    use std::os::unix::process::ExitStatusExt;
    // 3 s: room for a loaded 2-core machine, well under the 10 s block.
    let mut server = spawn_server(Tls::Tcp, &["--watchdog-ms", "3000"]);
    let rt = client_runtime(Tls::Tcp);
    let c = Client::connect(&rt, server.addr).unwrap();
    let block = |ms: u32| {
        let mut req = vec![testsvc::OP_BLOCK];
        req.extend_from_slice(&ms.to_le_bytes());
        req
    };
    c.call(block(300)).expect("a short block is answered");
    assert!(server.child.try_wait().unwrap().is_none(), "the server died on a short block");
    // A process stopped as a whole (SIGSTOP, a frozen cgroup) is not stuck:
    // it serves on when continued.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    std::thread::sleep(Duration::from_secs(4));
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    c.call(block(10)).expect("a server continued after a stop serves on");
    std::thread::sleep(Duration::from_secs(2));
    assert!(server.child.try_wait().unwrap().is_none(), "the watchdog killed a server that was only stopped");
    let _pending = c.call_async(block(10_000));
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the stuck server is still alive");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}");
}

/// A hello may claim any worker address. Before the welcome went to the
/// claimed address, a peer that claimed the server's own worker address got
/// a connection whose RMA the server drove against itself (a reviewer's
/// proof of concept crashed the server), and one that claimed another
/// client's address made the server move bytes in that client. Now only the
/// owner of the claimed address learns the token: the liar's connect times
/// out, nothing is served, and the server and the other client carry on.
#[test]
fn a_hello_that_claims_another_workers_address_gets_no_connection() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let victim_rt = client_runtime(tls);
        let victim = Client::connect(&victim_rt, server.addr).unwrap();
        put_and_check(&victim, 65536, true, 0, 1);
        let liar_rt = client_runtime_with(tls, |o| o.connect_timeout = Duration::from_secs(2));
        let claims = [
            ("the server's own", victim.server_worker_address().unwrap()),
            ("another client's", victim_rt.worker_address().unwrap()),
        ];
        for (whose, address) in claims {
            assert!(!address.is_empty());
            let started = Instant::now();
            match Client::connect_claiming(&liar_rt, server.addr, address) {
                // No welcome reaches the liar: its connect ends at its
                // deadline, as for a server that never answers.
                Err(TransportError::TimedOut { .. } | TransportError::Unreachable { .. }) => {}
                Ok(c) => {
                    // Show what the lie would have bought before failing.
                    let r = c.call(encode_rma(OP_GET, 0, 0, &[])).map(|_| "a served request");
                    panic!("{tls:?}: a hello claiming {whose} worker address got a connection ({r:?})");
                }
                Err(e) => panic!("{tls:?}: claiming {whose} address: expected a timeout, got {e}"),
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{tls:?}: the refused connect hung");
            // The server still serves the honest client, and an honest
            // connection from the liar's own runtime still works.
            put_and_check(&victim, 65536, false, 0, 2);
            get_and_check(&victim, 4096, true, 0, 3);
            let honest = Client::connect(&liar_rt, server.addr).unwrap();
            get_and_check(&honest, 4096, true, 0, 4);
        }
    }
}

/// Hellos whose welcome is never used (they claim an address whose owner
/// drops the welcome) fill `MAX_UNPROVEN`; an honest client must still
/// connect and be served: the oldest unproven connection makes room, and
/// the honest one proves itself at once. Failed before: with 256 such
/// hellos pending, every new hello was refused until the silence limit
/// ended them (renewed at will, no secret needed).
#[test]
fn hellos_that_never_use_their_welcome_do_not_lock_out_honest_clients() {
    for tls in ALL {
        let server = spawn_server(tls, &[]);
        let victim_rt = client_runtime(tls);
        let victim = Client::connect(&victim_rt, server.addr).unwrap();
        let sink = victim.server_worker_address().unwrap();
        let liar_rt = std::sync::Arc::new(client_runtime_with(tls, |o| o.connect_timeout = Duration::from_secs(15)));
        let liars: Vec<_> = (0..300)
            .map(|_| {
                let (rt, sink) = (liar_rt.clone(), sink.clone());
                // Spaced, so that each handshake completes (the server
                // takes only so many at once).
                std::thread::sleep(Duration::from_millis(10));
                std::thread::spawn(move || Client::connect_claiming(&rt, server.addr, sink).is_ok())
            })
            .collect();
        // Wait for the state under test: the server has accepted enough of
        // the liars' hellos to fill its unproven connections (256).
        let deadline = Instant::now() + Duration::from_secs(30);
        while server_stats(&victim)["transport"]["connections_accepted"].as_u64().unwrap() < 1 + 256 {
            assert!(Instant::now() < deadline, "{tls:?}: the liars' hellos never filled the unproven connections");
            std::thread::sleep(Duration::from_millis(20));
        }
        let honest_rt = client_runtime_with(tls, |o| o.connect_timeout = Duration::from_secs(5));
        let honest = Client::connect(&honest_rt, server.addr)
            .unwrap_or_else(|e| panic!("{tls:?}: an honest client was locked out by unproven hellos: {e}"));
        get_and_check(&honest, 4096, true, 0, 5);
        put_and_check(&victim, 4096, true, 0, 6);
        for l in liars {
            assert!(!l.join().unwrap(), "{tls:?}: a liar got a connection");
        }
    }
}

/// With frame keys (the reference service's `LOGIN`), every frame of the
/// connection is tagged and numbered both ways: small and rendezvous-sized
/// calls, server RMA, and the keepalive pings of a few seconds all pass,
/// out of order or not, and neither end refuses any frame. A second login
/// on the connection is refused.
#[test]
fn a_keyed_connection_tags_every_frame_both_ways() {
    for tls in [Tls::Tcp, Tls::Shm] {
        let server = spawn_server(tls, &[]);
        let rt = client_runtime(tls);
        let c = Client::connect(&rt, server.addr).unwrap();
        let plain = Client::connect(&rt, server.addr).unwrap();
        let nonce = [9u8; 16];
        let r = c.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(c.token(), &nonce)).unwrap();
        testsvc::parse_reply(&r).unwrap();
        // Many in flight, eager and rendezvous mixed: UCX may deliver them
        // out of order, which the replay window allows.
        let futs: Vec<_> = (0..200usize)
            .map(|i| {
                let mut req = vec![testsvc::OP_ECHO];
                req.resize(1 + if i % 3 == 0 { 300_000 } else { i }, i as u8);
                (req.clone(), c.call_async(req))
            })
            .collect();
        for (req, f) in futs {
            let r = futures::executor::block_on(f).unwrap();
            assert_eq!(testsvc::parse_reply(&r).unwrap(), &req[1..]);
        }
        put_and_check(&c, 1 << 20, true, FLAG_VERIFY, 5);
        get_and_check(&c, 65536 + 3, false, FLAG_VERIFY, 6);
        // Keepalives (every second) on both connections.
        std::thread::sleep(Duration::from_millis(2500));
        let again = c.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(c.token(), &nonce));
        assert!(again.is_err(), "a second login went through: {again:?}");
        let s = server_stats(&plain);
        for k in ["unauthenticated_frames", "replayed_frames"] {
            assert_eq!(s["transport"][k].as_u64(), Some(0), "{tls:?}: the server refused honest frames: {s}");
        }
        // The one frame an honest client may refuse: the untagged pong to
        // its first ping (sent before the login) when it arrives after
        // the login's tagged answer (another endpoint: no order).
        let mine = rt.stats().snapshot();
        assert!(
            mine.unauthenticated_frames <= 1 && mine.replayed_frames == 0,
            "{tls:?}: the client refused frames: {mine:?}"
        );
        testsvc::parse_reply(&c.call(vec![testsvc::OP_ECHO, 1]).unwrap()).unwrap();
    }
}

/// Takes a Read-Read lease of `len` bytes filled with `pattern(seed, ·)`.
fn rr_lease(c: &Client, seed: u64, len: u64) -> testsvc::RrLease {
    let r = c.call(testsvc::encode_rr_read(FLAG_VERIFY, seed, len)).unwrap();
    testsvc::RrLease::decode(testsvc::parse_reply(&r).unwrap()).unwrap()
}

/// The Read-Read ops of the reference service (`dafne_bench::designs`):
/// a lease names server memory that the client reads with a get it drives
/// itself; the pool is bounded (a read waits while every buffer is out);
/// only the holder's DONE returns a buffer; a closed connection's leases
/// come back; bad bodies are refused.
#[test]
fn read_read_leases_are_bounded_owned_and_returned() {
    for tls in [Tls::Tcp, Tls::Shm] {
        let srv = spawn_server(tls, &[]);
        let rt = client_runtime(tls);
        let a = Client::connect(&rt, srv.addr).unwrap();
        let b = Client::connect(&rt, srv.addr).unwrap();
        let leases: Vec<_> = (0..testsvc::RR_BUFFERS as u64).map(|i| rr_lease(&a, i, 4099)).collect();
        // Every lease is read by a client-driven get.
        for (i, lease) in leases.iter().enumerate() {
            let (a2, lease2) = (a.clone(), lease.clone());
            let got = rt
                .block_on_loop(move |l| async move {
                    a2.get_on_loop(&l, dafne_transport::Local::Bytes(vec![0; 4099]), lease2.addr, &lease2.key).await
                })
                .unwrap()
                .unwrap_or_else(|e| panic!("{tls:?}: get of lease {i}: {e}"))
                .expect("the filled buffer");
            check_pattern(&got, i as u64, 0);
        }
        // Every buffer is out: the next read waits.
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = b.clone();
        let waiter = std::thread::spawn(move || {
            let _ = tx.send(b2.call(testsvc::encode_rr_read(0, 99, 4096)));
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "{tls:?}: a read got a buffer from an empty pool"
        );
        // Another connection's DONE is refused; an unknown lease too.
        let e = testsvc::parse_reply(&b.call(testsvc::encode_rr_done(leases[0].id)).unwrap()).unwrap_err();
        assert!(e.contains("no lease"), "{e}");
        let e = testsvc::parse_reply(&a.call(testsvc::encode_rr_done(u64::MAX)).unwrap()).unwrap_err();
        assert!(e.contains("no lease"), "{e}");
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "{tls:?}: a refused DONE freed a buffer");
        // The holder's DONE frees one: the waiting read gets it.
        testsvc::parse_reply(&a.call(testsvc::encode_rr_done(leases[0].id)).unwrap()).unwrap();
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("the waiting read was served").unwrap();
        testsvc::RrLease::decode(testsvc::parse_reply(&r).unwrap()).unwrap();
        waiter.join().unwrap();
        // A second DONE of the same lease is refused.
        assert!(testsvc::parse_reply(&a.call(testsvc::encode_rr_done(leases[0].id)).unwrap()).is_err());
        // Bad bodies.
        for bad in [vec![testsvc::OP_RR_READ, 0], testsvc::encode_rr_read(0, 1, 0), vec![testsvc::OP_RR_DONE, 1]] {
            assert!(testsvc::parse_reply(&b.call(bad).unwrap()).is_err());
        }
        // `a` goes away holding 15 leases: they come back, so `b` (holding
        // one) can take the other 15.
        drop(a);
        for i in 0..testsvc::RR_BUFFERS as u64 - 1 {
            rr_lease(&b, 100 + i, 1);
        }
    }
}

/// CPU time (user + system) process `pid` has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); the slice starts at field 3.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// A same-host peer that chose another shared-memory FIFO size than the
/// server's (`UCX_MM_FIFO_SIZE`, which UCX never sends: each end assumes
/// its own for the other's FIFO) floods the server with calls and is
/// killed. Before the server gave shared memory only after a login (the
/// `server` module docs), a FIFO larger than the server's (1024 against
/// 256) left the server's loop spinning for good, even after the peer was
/// gone (measured: 1.85–2.09 s of CPU per 3 s), and no client got an
/// answer again. Now the peer, which does not log in, talks TCP; the server
/// is idle afterwards, and an honest client logs in, moves to shared
/// memory, and moves bytes that are checked.
#[test]
fn a_peer_with_another_shm_fifo_size_cannot_wedge_the_server() {
    let server = spawn_server(Tls::Shm, &["--shm-after-login"]);
    let pid = server.child.id();
    let mut hostile = Command::new(peer_bin())
        .args(Tls::Shm.args())
        .args(["--ucx", "MM_FIFO_SIZE=1024", "flood", "--connect", &server.addr.to_string(), "--seconds", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hostile.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "flooding");
    // Whether its calls are answered is the peer's business; it is killed
    // at the latest a few seconds after its flood should have ended.
    let deadline = Instant::now() + Duration::from_secs(6);
    while hostile.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = hostile.kill();
    hostile.wait().unwrap();
    // The server is idle: at most a quarter of a core over two seconds.
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_time(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_time(pid) - before;
    assert!(used < Duration::from_millis(500), "the server burnt {used:?} of CPU in 2 s after the peer was gone");
    // An honest client is served, over TCP until its login and over shared
    // memory after it.
    let rt = client_runtime(Tls::Shm);
    let c = Client::connect(&rt, server.addr).unwrap();
    let before_login = c.data_path_info().unwrap();
    assert!(
        !before_login.contains("posix") && !before_login.contains("sysv"),
        "shared memory before the login: {before_login}"
    );
    put_and_check(&c, 65536 + 3, true, FLAG_VERIFY, 21);
    let nonce = [3u8; 16];
    let r = c.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(c.token(), &nonce)).unwrap();
    testsvc::parse_reply(&r).unwrap();
    // The upgrade travels beside the login's answer: wait until it is in.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut info = c.data_path_info().unwrap();
    while !(info.contains("posix") || info.contains("sysv")) {
        assert!(Instant::now() < deadline, "no shared memory after the login: {info}");
        std::thread::sleep(Duration::from_millis(20));
        info = c.data_path_info().unwrap();
    }
    for (i, len) in [1usize, 4099, 1 << 20, (4 << 20) + 11].into_iter().enumerate() {
        put_and_check(&c, len, true, FLAG_VERIFY, 30 + i as u64);
        get_and_check(&c, len, i % 2 == 0, FLAG_VERIFY, 40 + i as u64);
    }
    let echo: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
    let r = c.call([vec![testsvc::OP_ECHO], echo.clone()].concat()).unwrap();
    assert_eq!(testsvc::parse_reply(&r).unwrap(), &echo[..]);
    let s = server_stats(&c);
    assert!(s["transport"]["upgrades"].as_u64().unwrap() >= 1, "{s}");
    for k in ["unauthenticated_frames", "replayed_frames"] {
        assert_eq!(s["transport"][k].as_u64(), Some(0), "the server refused honest frames: {s}");
    }
    // The client took the upgrade and every tagged frame after it (at most
    // the untagged pong to its first ping, arriving after the login's
    // answer, is refused: see `a_keyed_connection_tags_every_frame_both_ways`).
    let mine = rt.stats().snapshot();
    assert!(mine.unauthenticated_frames <= 1 && mine.replayed_frames == 0, "the client refused frames: {mine:?}");
    // A client that wants UCX error handling on its data endpoints
    // (`DAFNE_DATA_PATH=peer`) does not follow the upgrade and is served
    // over TCP after its login too.
    let rt = client_runtime_with(Tls::Shm, |o| o.data_path = dafne_transport::DataPath::PeerErrorHandling);
    let c = Client::connect(&rt, server.addr).unwrap();
    let r = c.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(c.token(), &nonce)).unwrap();
    testsvc::parse_reply(&r).unwrap();
    for (i, len) in [7usize, (1 << 20) + 5].into_iter().enumerate() {
        put_and_check(&c, len, true, FLAG_VERIFY, 50 + i as u64);
        get_and_check(&c, len, false, FLAG_VERIFY, 60 + i as u64);
    }
    let info = c.data_path_info().unwrap();
    assert!(info.contains("tcp") && !info.contains("posix"), "{info}");
}

/// A client that holds the login but has another shared-memory FIFO size
/// (a user's `UCX_MM_FIFO_SIZE=1024`): its hello states it, and the server
/// keeps it on TCP after the login instead of moving it to shared memory,
/// where it would wedge the server's loop as the peer above did.
#[test]
fn a_logged_in_client_with_another_shm_fifo_size_stays_on_tcp() {
    let server = spawn_server(Tls::Shm, &["--shm-after-login"]);
    let rt = client_runtime_with(Tls::Shm, |o| o.ucx_config.push(("MM_FIFO_SIZE".into(), "1024".into())));
    let c = Client::connect(&rt, server.addr).unwrap();
    let nonce = [4u8; 16];
    let r = c.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(c.token(), &nonce)).unwrap();
    testsvc::parse_reply(&r).unwrap();
    // Enough calls to go round a 256-element FIFO many times.
    for round in 0..40u8 {
        let futs: Vec<_> = (0..50u8).map(|i| c.call_async(vec![testsvc::OP_ECHO, round, i])).collect();
        for (i, f) in futs.into_iter().enumerate() {
            let r = futures::executor::block_on(f).unwrap();
            assert_eq!(testsvc::parse_reply(&r).unwrap(), &[round, i as u8]);
        }
    }
    put_and_check(&c, (1 << 20) + 5, true, FLAG_VERIFY, 70);
    get_and_check(&c, (1 << 20) + 5, false, FLAG_VERIFY, 71);
    let info = c.data_path_info().unwrap();
    assert!(!info.contains("posix") && !info.contains("sysv"), "shared memory with another FIFO size: {info}");
    let s = server_stats(&c);
    assert_eq!(s["transport"]["upgrades"].as_u64(), Some(0), "{s}");
    assert!(s["transport"]["upgrades_refused"].as_u64().unwrap() >= 1, "{s}");
    drop(c);
    drop(rt);
    let pid = server.child.id();
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_time(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_time(pid) - before;
    assert!(used < Duration::from_millis(500), "the server burnt {used:?} of CPU in 2 s after the client left");
    // And a client with the server's settings is served over shared memory.
    let rt = client_runtime(Tls::Shm);
    let c = Client::connect(&rt, server.addr).unwrap();
    let r = c.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(c.token(), &nonce)).unwrap();
    testsvc::parse_reply(&r).unwrap();
    put_and_check(&c, 4099, true, FLAG_VERIFY, 72);
}

/// Open descriptors of process `pid`.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn login(c: &Client, n: u8) {
    let nonce = [n; 16];
    let r = c.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(c.token(), &nonce)).unwrap();
    testsvc::parse_reply(&r).unwrap();
}

/// 200 connections of one long-lived client runtime come and go, logged in
/// (moved to shared memory) or not (on TCP until the end), on this host
/// and as from another (`claim_host_id`: TCP throughout): the server's
/// descriptors stay flat. Before, a data endpoint with error handling
/// (TCP) closed gracefully kept its socket open at both ends until the
/// client's runtime ended: 25 -> 225 descriptors in the server over 200
/// connections, same-host ones without a login included.
#[test]
fn connections_leave_no_descriptors_behind() {
    let server = spawn_server(Tls::Shm, &["--shm-after-login"]);
    let pid = server.child.id();
    for (remote, logged_in) in [(false, true), (false, false), (true, false)] {
        let rt = client_runtime_with(Tls::Shm, |o| {
            if remote {
                o.claim_host_id = Some([7; 16]);
            }
        });
        let warm = Client::connect(&rt, server.addr).unwrap();
        login(&warm, 1);
        put_and_check(&warm, 4099, true, FLAG_VERIFY, 1);
        drop(warm);
        std::thread::sleep(Duration::from_millis(500));
        let before = fd_count(pid);
        for i in 0..200u32 {
            let c = Client::connect(&rt, server.addr).unwrap();
            if logged_in {
                login(&c, (i % 250) as u8 + 2);
            }
            let r = c.call(vec![testsvc::OP_ECHO, 1, 2]).unwrap();
            assert_eq!(testsvc::parse_reply(&r).unwrap(), &[1, 2]);
        }
        std::thread::sleep(Duration::from_secs(1));
        let after = fd_count(pid);
        assert!(
            after <= before + 10,
            "server descriptors {before} -> {after} over 200 connections (remote {remote}, login {logged_in})"
        );
        let c = Client::connect(&rt, server.addr).unwrap();
        login(&c, 9);
        put_and_check(&c, 1 << 20, true, FLAG_VERIFY, 2);
    }
}

/// A client that keeps UCX error handling on its data endpoints
/// (`DAFNE_DATA_PATH=peer`) does not follow an upgrade, so its hello asks
/// for none: before, the server made the endpoint for it anyway, UCX paired
/// it (error handling off) with the client's next data endpoint (on), and
/// the client's second connection failed: "ucp_ep_create(address) failed:
/// Unsupported operation" after UCX's "asymmetric endpoint configuration".
#[test]
fn a_client_that_keeps_error_handling_connects_again() {
    let server = spawn_server(Tls::Shm, &["--shm-after-login"]);
    let rt = client_runtime_with(Tls::Shm, |o| o.data_path = dafne_transport::DataPath::PeerErrorHandling);
    for round in 0..4u8 {
        let c = Client::connect(&rt, server.addr).unwrap();
        login(&c, round + 1);
        for (i, len) in [7usize, (1 << 20) + 5].into_iter().enumerate() {
            put_and_check(&c, len, true, FLAG_VERIFY, 50 + i as u64);
            get_and_check(&c, len, false, FLAG_VERIFY, 60 + i as u64);
        }
        let info = c.data_path_info().unwrap();
        assert!(info.contains("tcp") && !info.contains("posix"), "{info}");
        // Let the server's side settle before the next connection.
        std::thread::sleep(Duration::from_millis(300));
    }
    let s = server_stats(&Client::connect(&rt, server.addr).unwrap());
    assert_eq!(s["transport"]["upgrades"].as_u64(), Some(0), "{s}");
}

/// Two connections of one runtime to one server, one logging in (and
/// moving to shared memory) while the other connects and logs in: both
/// serve RMA whose bytes are checked (UCX pairs the endpoints two workers
/// make to each other by order; an upgrade must not pair one with error
/// handling against one without).
#[test]
fn connections_of_one_runtime_upgrade_side_by_side() {
    let server = spawn_server(Tls::Shm, &["--shm-after-login"]);
    let rt = client_runtime(Tls::Shm);
    for round in 0..10u8 {
        let a = Client::connect(&rt, server.addr).unwrap();
        let addr = server.addr;
        let nonce = [round + 1; 16];
        std::thread::scope(|s| {
            s.spawn(|| {
                let r = a.login(testsvc::encode_login(&nonce), testsvc::test_frame_keys(a.token(), &nonce)).unwrap();
                testsvc::parse_reply(&r).unwrap();
            });
            let b = Client::connect(&rt, addr).unwrap();
            login(&b, 200 - round);
            put_and_check(&b, 4099, true, FLAG_VERIFY, 90);
        });
        put_and_check(&a, 4099, true, FLAG_VERIFY, 91);
        get_and_check(&a, 1 << 20, true, FLAG_VERIFY, 92);
    }
}
