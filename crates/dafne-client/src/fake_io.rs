//! A stand-in io server for unit tests: a transport server in this process
//! that answers io requests without storing anything. Writes, syncs, stats,
//! truncates and removes succeed; reads fail with `EIO` (an error the
//! server decided, after which no RMA of the request is pending). It
//! counts the writes it was asked to make stable, and fails writes (`EIO`)
//! or syncs (`EAGAIN`, as a timeout reads to the caller) when told to, or
//! refuses data requests as a server whose lease lapsed (`NOT_SERVING`)
//! or whose version of their chain is another (`CHAIN_REFUSED`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dafne_proto::io::{decode_io_request, encode_io_reply, IoRequest, IoResponse, Stability};
use dafne_proto::Errno;
use dafne_transport::{Request, Runtime, RuntimeOptions, Service};

/// What the fake server counts, and the faults a test switches on.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Writes sent `DataSync` or `FileSync`.
    pub stable_writes: AtomicU64,
    /// Answer writes with `EIO`.
    pub fail_writes: AtomicBool,
    /// Answer syncs with `EAGAIN`.
    pub fail_syncs: AtomicBool,
    /// Answer each write this many milliseconds after it arrived.
    pub write_delay_ms: AtomicU64,
    /// Writes arrived and not yet answered, and the most at once.
    pub writes_in_flight: AtomicU64,
    pub max_writes_in_flight: AtomicU64,
    /// What a `Stat` answers (0 unless set).
    pub stat_size: AtomicU64,
    /// Refuse this many more data requests (all but `Login`) with
    /// `NOT_SERVING`, as a server whose lease lapsed; and how many were.
    pub not_serving: AtomicU64,
    pub refused: AtomicU64,
    /// Refuse this many more requests that carry a chain as a server whose
    /// version of it is `chain_held` (a request at another version is
    /// refused `Ahead` or `Stale`); and how many were.
    pub chain_refusals_left: AtomicU64,
    pub chain_held: AtomicU64,
    pub chain_refused: AtomicU64,
    /// The version the last request that carried a chain carried (0: none).
    pub chain_seen: AtomicU64,
}

struct FakeIo {
    faults: Arc<Faults>,
}

impl Service for FakeIo {
    fn call(&self, req: Request) -> Pin<Box<dyn Future<Output = Vec<u8>>>> {
        let faults = &self.faults;
        let reply = match decode_io_request(&req.payload) {
            Ok((env, r)) => {
                if let IoRequest::Write { stability: Stability::DataSync | Stability::FileSync, .. } = &r {
                    faults.stable_writes.fetch_add(1, Ordering::Relaxed);
                }
                let refuse = !matches!(r, IoRequest::Login { .. })
                    && faults
                        .not_serving
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                if let Some(c) = env.chain {
                    faults.chain_seen.store(c.version, Ordering::SeqCst);
                }
                let chain_refusal = env.chain.and_then(|c| {
                    let held = faults.chain_held.load(Ordering::SeqCst);
                    let reason = match c.version.cmp(&held) {
                        std::cmp::Ordering::Less => dafne_proto::io::ChainRefusalReason::Stale,
                        std::cmp::Ordering::Greater => dafne_proto::io::ChainRefusalReason::Ahead,
                        std::cmp::Ordering::Equal => return None,
                    };
                    faults
                        .chain_refusals_left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .ok()?;
                    faults.chain_refused.fetch_add(1, Ordering::SeqCst);
                    Some(dafne_proto::io::ChainRefusal { reason, chain: c.chain, version: held })
                });
                let result = match &r {
                    _ if chain_refusal.is_some() => Ok(IoResponse::ChainRefused(chain_refusal.unwrap())),
                    _ if refuse => {
                        faults.refused.fetch_add(1, Ordering::SeqCst);
                        Err(dafne_proto::io::NOT_SERVING)
                    }
                    IoRequest::Write { .. } if faults.fail_writes.load(Ordering::Relaxed) => Err(Errno::EIO),
                    IoRequest::Write { .. } => Ok(IoResponse::Write { bytes: r.total_bytes() }),
                    IoRequest::Sync { .. } if faults.fail_syncs.load(Ordering::Relaxed) => Err(Errno::EAGAIN),
                    IoRequest::Read { .. } => Err(Errno::EIO),
                    IoRequest::Stat { .. } => Ok(IoResponse::Stat { size: faults.stat_size.load(Ordering::Relaxed) }),
                    IoRequest::ServerInfo { .. } => Err(Errno::ENOSYS),
                    // Like an io server: the login keys the frames.
                    IoRequest::Login { client_name, nonce, mac, credential } => {
                        let s = secret().login_key(credential.as_ref());
                        if s.verify_session(req.conn.token(), nonce, client_name, mac) {
                            req.conn.set_frame_keys(s.frame_keys(req.conn.token(), nonce));
                            Ok(IoResponse::Done)
                        } else {
                            Err(Errno::EACCES)
                        }
                    }
                    _ => Ok(IoResponse::Done),
                };
                let reply = encode_io_reply(env.tag, r.op(), &result);
                if let IoRequest::Write { .. } = r {
                    return self.write_reply(reply);
                }
                reply
            }
            Err(_) => Vec::new(),
        };
        Box::pin(async move { reply })
    }
}

impl FakeIo {
    /// A write's answer, after the configured delay; counts the writes in
    /// flight while they wait.
    fn write_reply(&self, reply: Vec<u8>) -> Pin<Box<dyn Future<Output = Vec<u8>>>> {
        let f = self.faults.clone();
        let now = f.writes_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        f.max_writes_in_flight.fetch_max(now, Ordering::SeqCst);
        let delay = f.write_delay_ms.load(Ordering::Relaxed);
        let (tx, rx) = futures::channel::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(delay));
            f.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(reply);
        });
        Box::pin(async move { rx.await.unwrap_or_default() })
    }
}

/// An open file of object `object_id` striped over servers `0..servers`
/// (1 MiB units), with a capability the fake server does not check.
pub(crate) fn file_on(object_id: u64, servers: u32) -> crate::OpenFile {
    use dafne_proto::{Attr, Capability, FileType, Layout, Timespec};
    let t = Timespec::default();
    let attr = Attr {
        ino: 2,
        kind: FileType::Regular,
        mode: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 0,
        blocks: 0,
        atime: t,
        mtime: t,
        ctime: t,
    };
    let layout = Layout { object_id, stripe_unit: 1 << 20, stripe_count: servers, servers: (0..servers).collect() };
    crate::OpenFile {
        attr,
        layout,
        cap: Capability {
            object_id,
            ino: 0,
            rights: 3,
            generation: 0,
            expiry_unix_ns: 0,
            advice: dafne_proto::CacheAdvice::NONE,
            mac: [0; 32],
        },
    }
}

pub(crate) fn runtime(name: &str) -> Runtime {
    Runtime::new(RuntimeOptions { name: name.into(), ..runtime_options() }).unwrap()
}

/// The options of [`runtime`]: shared memory and TCP on loopback.
pub(crate) fn runtime_options() -> RuntimeOptions {
    let ucx_config = vec![("TLS".into(), "posix,sysv,cma,self,tcp".into()), ("NET_DEVICES".into(), "lo".into())];
    RuntimeOptions { ucx_config, ..Default::default() }
}

/// A fake io server on its own runtime (keep it alive for the test), its
/// address, and its counters and faults.
pub(crate) fn start() -> (Runtime, SocketAddr, Arc<Faults>) {
    start_at("127.0.0.1:0".parse().unwrap())
}

/// [`start`] listening at `addr` (a port of 0: any free one).
pub(crate) fn start_at(addr: SocketAddr) -> (Runtime, SocketAddr, Arc<Faults>) {
    let rt = runtime("fake-io");
    let faults = Arc::new(Faults::default());
    let shared = faults.clone();
    let addr = rt.serve(addr, move |_| FakeIo { faults: shared.clone() }).unwrap();
    (rt, addr, faults)
}

/// An address of this host where nothing listens (a port the kernel gave
/// out and took back): a connection to it is refused, as to a server
/// that is down.
pub(crate) fn nothing_at() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).unwrap()
}

/// The secret test clients of the fake server log in with (the fake server
/// checks logins with it, and no capability).
pub(crate) fn secret() -> dafne_auth::Secret {
    dafne_auth::Secret::from_bytes([7; dafne_auth::SECRET_LEN])
}
