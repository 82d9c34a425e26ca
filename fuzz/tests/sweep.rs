//! The fuzz targets on the stable toolchain, for CI: cargo-fuzz needs
//! nightly, so each target's body also runs here under a mutation harness
//! (seeds of valid and random messages; bit flips, byte writes, cuts,
//! insertions and splices) for a bounded time per target:
//! `DAFNE_FUZZ_SECONDS` (default 4). A panic inside a target fails the
//! test; the input that caused it is printed in hex so it can be replayed
//! (`cargo fuzz run <target> <file>`) and added as a unit test.

use std::time::{Duration, Instant};

use dafne_proto::io::{AllocateMode, IoExtent, IoRequest, KeysFollow, Stability, StripeSlots};
use dafne_proto::{
    encode_io_request, encode_reply, encode_request, CacheAdvice, CachePolicy, Capability, Envelope, Op, Request,
    Response,
};

/// xorshift64*: a fixed seed per target, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] ^= 1 << rng.below(8);
            }
            1 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            2 if !input.is_empty() => {
                let cut = rng.below(input.len());
                input.truncate(cut);
            }
            3 => {
                let at = rng.below(input.len() + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            4 if !pool.is_empty() => {
                let other = &pool[rng.below(pool.len())];
                let from = rng.below(other.len() + 1);
                let at = rng.below(input.len() + 1);
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            _ => {
                // A length-looking field: a little-endian u32 somewhere.
                if input.len() >= 4 {
                    let i = rng.below(input.len() - 3);
                    let v = [0u32, 1, 0xffff, 0x7fff_ffff, u32::MAX][rng.below(5)];
                    input[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

fn sweep(name: &str, target: fn(&[u8]), seeds: Vec<Vec<u8>>, seed: u64) {
    let secs = std::env::var("DAFNE_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut rng = Rng(seed | 1);
    let mut pool = seeds;
    for _ in 0..8 {
        let n = rng.below(300);
        pool.push((0..n).map(|_| rng.next() as u8).collect());
    }
    let mut runs = 0u64;
    while Instant::now() < until {
        for _ in 0..256 {
            let mut input = pool[rng.below(pool.len())].clone();
            mutate(&mut rng, &mut input, &pool);
            let result = std::panic::catch_unwind(|| target(&input));
            if result.is_err() {
                let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
                panic!("fuzz target {name} failed on input (hex): {hex}");
            }
            runs += 1;
            if rng.below(64) == 0 && pool.len() < 4096 {
                pool.push(input);
            }
        }
    }
    eprintln!("{name}: {runs} inputs");
    assert!(runs > 0);
}

fn env() -> Envelope {
    Envelope::new(7, 1000, 1000)
}

fn cap() -> Capability {
    Capability {
        object_id: 9,
        ino: 12,
        rights: 3,
        generation: 4,
        expiry_unix_ns: 1_900_000_000_000_000_000,
        advice: CacheAdvice { unit_kib: 16, policy: CachePolicy::Clock },
        mac: [5; 32],
    }
}

#[test]
fn frame() {
    use dafne_transport::frame::{Hello, Welcome};
    let seeds = vec![
        Hello {
            host_id: [3; 16],
            max_reply: 1 << 20,
            worker_address: vec![1; 180],
            shm_geometry: b"MM_FIFO_SIZE=256\n".to_vec(),
        }
        .encode(),
        Welcome { host_id: [4; 16], max_request: 1 << 20, worker_address: vec![2; 180] }.encode(),
    ];
    sweep("frame", dafne_fuzz::frame, seeds, 1);
}

#[test]
fn io() {
    let extent = IoExtent { offset: 4096, len: 8192, key: 0, addr: 0x7f00_0000_0000 };
    let seeds = vec![
        encode_io_request(
            env(),
            &IoRequest::Read {
                cap: cap(),
                keys: vec![vec![0xda; 40]],
                extents: vec![extent],
                inline_reply: false,
                keys_follow: None,
            },
        ),
        encode_io_request(
            env(),
            &IoRequest::Write {
                cap: cap(),
                keys: Vec::new(),
                extents: vec![IoExtent::inline(0, 5)],
                stability: Stability::FileSync,
                inline: b"hello".to_vec(),
                keys_follow: None,
            },
        ),
        encode_io_request(
            env(),
            &IoRequest::Read {
                cap: cap(),
                keys: vec![],
                extents: vec![extent],
                inline_reply: false,
                keys_follow: Some(KeysFollow { tag: 9, count: 1 }),
            },
        ),
        encode_io_request(env(), &IoRequest::Keys { tag: 9, keys: vec![vec![0xda; 40]] }),
        encode_io_request(
            env(),
            &IoRequest::Allocate {
                cap: cap(),
                offset: 3 << 20,
                len: 5 << 20,
                mode: AllocateMode::PunchHole,
                stripes: StripeSlots { unit: 1 << 20, count: 4, slots: vec![1, 2] },
            },
        ),
    ];
    let mut bodies: Vec<Vec<u8>> = seeds.iter().map(|s| [&[0x80u8][..], s].concat()).collect();
    bodies.extend(seeds);
    // A data request carrying its chain, and a refusal of it (protocol 18).
    bodies.push(encode_io_request(
        Envelope { chain: Some(dafne_proto::ChainVersion { chain: 3, version: 7 }), ..env() },
        &IoRequest::Truncate { cap: cap(), size: 4096 },
    ));
    // A write a chain's head forwards to its successor (protocol 19).
    bodies.push(encode_io_request(
        Envelope { chain: Some(dafne_proto::ChainVersion { chain: 3, version: 7 }), forwarded: true, ..env() },
        &IoRequest::Write {
            cap: cap(),
            keys: vec![vec![1, 2, 3]],
            extents: vec![dafne_proto::io::IoExtent { offset: 4096, len: 512, key: 0, addr: 1 << 20 }],
            stability: dafne_proto::io::Stability::Unstable,
            inline: vec![],
            keys_follow: None,
        },
    ));
    bodies.push(dafne_proto::encode_io_reply(
        4,
        dafne_proto::IoOp::Write,
        &Ok(dafne_proto::IoResponse::ChainRefused(dafne_proto::ChainRefusal {
            reason: dafne_proto::ChainRefusalReason::Stale,
            chain: 3,
            version: 9,
        })),
    ));
    // ServerInfo's answer: the fields, then the chain versions (ids in
    // order: mutations reach the order check and the count bound); the
    // lease state protocol 18 added (a value, not checked by the decoder).
    let info = dafne_proto::ServerInfo {
        capacity_bytes: 1 << 40,
        lease: dafne_proto::LEASE_PENDING,
        chains: vec![
            dafne_proto::ChainVersion { chain: 0, version: 3 },
            dafne_proto::ChainVersion { chain: 2, version: 9 },
        ],
        ..Default::default()
    };
    bodies.push(dafne_proto::encode_io_reply(
        3,
        dafne_proto::IoOp::ServerInfo,
        &Ok(dafne_proto::IoResponse::ServerInfo(Box::new(info))),
    ));
    sweep("io", dafne_fuzz::io, bodies, 2);
}

#[test]
fn proto() {
    let seeds = vec![
        encode_request(env(), &Request::Lookup { parent: 1, name: b"hello".to_vec() }),
        encode_request(env(), &Request::GetAttr { ino: 1 }),
        encode_request(
            env(),
            &Request::Lock {
                ino: 1,
                client: 2,
                owner: 3,
                pid: 4,
                start: 5,
                end: u64::MAX,
                kind: dafne_proto::LockKind::Write,
                flags: dafne_proto::LOCK_WAIT,
            },
        ),
        encode_request(env(), &Request::SetXattr { ino: 1, name: b"user.k".to_vec(), value: b"v".to_vec(), flags: 1 }),
        encode_request(
            env(),
            &Request::Rename {
                src_parent: 1,
                src_name: b"a".to_vec(),
                dst_parent: 1,
                dst_name: b"b".to_vec(),
                flags: 2,
            },
        ),
        encode_reply(3, Op::ListXattr, &Ok(Response::XattrNames { names: vec![b"user.a".to_vec()] })),
        // The membership ops (addresses and host names as text).
        encode_request(
            env(),
            &Request::ServerHeartbeat(dafne_proto::Heartbeat {
                server: 1,
                instance: 7,
                addr: "[::1]:7001".parse().unwrap(),
                host: "node-b".into(),
                capacity_bytes: 1 << 40,
                used_bytes: 1 << 30,
            }),
        ),
        // The heartbeat's answer: the versions of the sender's chains.
        encode_reply(
            3,
            Op::ServerHeartbeat,
            &Ok(Response::Heartbeat {
                chains: vec![
                    dafne_proto::ChainVersion { chain: 1, version: 2 },
                    dafne_proto::ChainVersion { chain: 4, version: 7 },
                ],
                // Protocol 19: the sender's place in each (head, successor).
                routes: vec![
                    dafne_proto::ChainRoute {
                        chain: 1,
                        head: true,
                        successor: Some(dafne_proto::Successor {
                            server: 4,
                            addr: Some("127.0.0.1:7001".parse().unwrap()),
                        }),
                    },
                    dafne_proto::ChainRoute { chain: 4, head: false, successor: None },
                ],
            }),
        ),
        encode_reply(
            3,
            Op::Members,
            &Ok(Response::Members {
                members: vec![dafne_proto::Member {
                    server: 0,
                    state: dafne_proto::MemberState::Down,
                    addr: "10.0.0.2:7000".parse().unwrap(),
                    host: "node-a".into(),
                    since_ms: 4000,
                    restarts: 1,
                    capacity_bytes: 1 << 40,
                    used_bytes: 5,
                }],
                // Two chains of two replicas: mutations reach the id order,
                // the repeated-server and the state checks.
                chains: vec![
                    dafne_proto::Chain {
                        id: 0,
                        version: 1,
                        replicas: vec![
                            dafne_proto::Replica { server: 0, state: dafne_proto::ReplicaState::Serving },
                            dafne_proto::Replica { server: 1, state: dafne_proto::ReplicaState::Syncing },
                        ],
                    },
                    dafne_proto::Chain {
                        id: 1,
                        version: 7,
                        replicas: vec![
                            dafne_proto::Replica { server: 1, state: dafne_proto::ReplicaState::Serving },
                            dafne_proto::Replica { server: 0, state: dafne_proto::ReplicaState::Offline },
                        ],
                    },
                ],
            }),
        ),
        // Groups and the exactly-once session sequence, both extensions.
        encode_request(
            Envelope {
                groups: dafne_proto::Groups::new(&[5, 6]),
                session: Some(dafne_proto::SessionSeq { client: 0xfeed, seq: 40, acked_below: 37 }),
                ..env()
            },
            &Request::Unlink { parent: 1, name: b"x".to_vec() },
        ),
        // Groups not read (a flag alone).
        encode_request(
            Envelope { groups: dafne_proto::Groups::OMITTED, ..env() },
            &Request::Lookup { parent: 1, name: b"x".to_vec() },
        ),
    ];
    sweep("proto", dafne_fuzz::proto, seeds, 3);
}

#[test]
fn testsvc_request() {
    use dafne_transport::testsvc::{encode_rma, SegDesc};
    let seeds = vec![encode_rma(1, 0, 7, &[SegDesc { addr: 0x1000, len: 4096, key: vec![1; 30] }])[1..].to_vec()];
    sweep("testsvc_request", dafne_fuzz::testsvc_request, seeds, 4);
}

#[test]
fn nbd() {
    use dafne_nbd::proto;
    use dafne_nbd::server::request;
    // A client's whole side: flags, GO for "x", then requests.
    let mut hello = 3u32.to_be_bytes().to_vec();
    hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&proto::OPT_GO.to_be_bytes());
    hello.extend_from_slice(&9u32.to_be_bytes());
    hello.extend_from_slice(&[0, 0, 0, 1, b'x', 0, 1, 0, 3]);
    let mut session = hello.clone();
    session.extend_from_slice(&request(proto::CMD_WRITE, proto::CMD_FLAG_FUA, 1, 4096, 8));
    session.extend_from_slice(b"abcdefgh");
    session.extend_from_slice(&request(proto::CMD_READ, 0, 2, 4000, 200));
    session.extend_from_slice(&request(proto::CMD_TRIM, 0, 3, 0, 100));
    session.extend_from_slice(&request(proto::CMD_WRITE_ZEROES, proto::CMD_FLAG_NO_HOLE, 4, 9, 10));
    session.extend_from_slice(&request(proto::CMD_FLUSH, 0, 5, 0, 0));
    session.extend_from_slice(&request(proto::CMD_DISC, 0, 6, 0, 0));
    let mut list = 1u32.to_be_bytes().to_vec();
    list.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    list.extend_from_slice(&proto::OPT_LIST.to_be_bytes());
    list.extend_from_slice(&0u32.to_be_bytes());
    list.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    list.extend_from_slice(&proto::OPT_EXPORT_NAME.to_be_bytes());
    list.extend_from_slice(&1u32.to_be_bytes());
    list.push(b'x');
    list.extend_from_slice(&request(proto::CMD_READ, 0, 9, 0, 65536));
    sweep("nbd", dafne_fuzz::nbd, vec![hello, session, list], 5);
}
