//! Joining the cluster: an io server started with `--meta ADDR` tells the
//! metadata server that it lives, every second.
//!
//! Why: on several hosts no supervisor sees every io server, and the
//! metadata server is the one process they all reach; it keeps the table
//! that `dafne status` shows (`dafne_meta::members`). The heartbeat
//! ([`dafne_proto::Heartbeat`]) carries the server's id (its index among
//! the cluster's io servers), the address it serves on, its host's name,
//! an instance id chosen at random when the process starts (so meta tells
//! a restart from a late heartbeat) and its file system's size and use.
//!
//! It runs on a thread of its own with its own transport runtime (one for
//! the thread's life: see `Beat::runtime`) and a
//! session of the cluster secret as uid 0 (as the supervisor's reclaimer
//! logs in), so the serving loop never waits for meta. The session
//! reconnects by itself after meta restarts (`dafne_client`'s link); until
//! the first connection succeeds the thread retries every interval. A
//! refusal (meta does not know the id, another server has the address,
//! another process is up with this id elsewhere) is logged once and
//! retried: a configuration corrected on meta's side is
//! picked up. The thread stops when the [`Heartbeats`] handle is dropped,
//! which waits for it (at most [`STOP_WAIT`]).
//!
//! Each heartbeat meta answers successfully renews the server's lease
//! ([`crate::lease`]) from the time the heartbeat was sent: while the
//! lease has lapsed the server refuses data requests. The answer carries
//! the versions of the server's chains, which the lease keeps.
//!
//! The options are checked before the server binds its port
//! ([`prepare`]); a wildcard listen address needs `--advertise`, as meta's
//! table and `dafne status` need an address that reaches the server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dafne_proto::{Heartbeat, Request, Response, HEARTBEAT_INTERVAL, MAX_HOST_NAME};

use crate::lease::Lease;

/// The command-line options of joining (part of `dafne serve io`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct JoinArgs {
    /// The metadata server's address: send it a heartbeat every second, so
    /// that it knows this server is up (`dafne status` shows what it
    /// knows). `dafne up` passes it to every io server.
    #[arg(long, value_name = "ADDR")]
    pub meta: Option<SocketAddr>,
    /// This server's index among the cluster's io servers (what layouts
    /// name, `io-N`); required with --meta.
    #[arg(long, value_name = "N")]
    pub server_id: Option<u32>,
    /// The host name sent with the heartbeat (default: the system's):
    /// printable ASCII without spaces or `|`, at most 255 bytes.
    #[arg(long, value_name = "NAME")]
    pub host_name: Option<String>,
    /// The address meta and `dafne status` show for this server: IP or
    /// IP:PORT (an IP alone takes the listening port). Required with
    /// --meta when --listen is a wildcard (0.0.0.0 or ::). It changes
    /// nothing else: clients use cluster.json's addresses.
    #[arg(long, value_name = "ADDR", value_parser = parse_advertise)]
    pub advertise: Option<SocketAddr>,
}

/// The running heartbeat thread and the lease's watcher thread; dropping
/// it stops both and waits for them, at most [`STOP_WAIT`]: the heartbeat
/// thread checks for the stop every 100 ms between heartbeats, then drops
/// its session and runtime (closing its connection to meta), so a server
/// that stops leaves nothing of them running. One blocked on meta (a
/// heartbeat unanswered, up to the call timeout, or a connect, up to the
/// connect timeout) is not waited for beyond the bound: logged at info and
/// left to end with the process, which is what a stop did before for every
/// thread.
#[derive(Debug)]
pub struct Heartbeats {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// How long dropping [`Heartbeats`] waits for its threads to end.
pub const STOP_WAIT: Duration = Duration::from_secs(2);

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + STOP_WAIT;
        for t in self.threads.drain(..) {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::info!(
                    "the {} thread did not end within {STOP_WAIT:?} of the stop (waiting for meta): not waited for",
                    t.thread().name().unwrap_or("?")
                );
            }
        }
    }
}

/// This host's name, as the kernel has it (empty if unreadable), made
/// what the wire carries: a byte it refuses becomes `_`, cut to
/// [`MAX_HOST_NAME`].
fn system_host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    wire_host(name.trim())
}

fn wire_host(name: &str) -> String {
    name.bytes().take(MAX_HOST_NAME).map(|b| if dafne_proto::host_name_byte(b) { char::from(b) } else { '_' }).collect()
}

/// The file system of `dir`: (size, bytes in use); zeros if unreadable.
fn capacity(dir: &Path) -> (u64, u64) {
    match rustix::fs::statvfs(dir) {
        Ok(s) => {
            let size = s.f_blocks.saturating_mul(s.f_frsize);
            (size, size.saturating_sub(s.f_bfree.saturating_mul(s.f_frsize)))
        }
        Err(_) => (0, 0),
    }
}

/// `--advertise`: an address with a port, or an IP alone (port 0: the
/// port the server listens on).
fn parse_advertise(s: &str) -> Result<SocketAddr, String> {
    let addr = s
        .parse::<SocketAddr>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
        .map_err(|_| format!("{s:?} is not an IP address or IP:PORT (e.g. 10.0.0.11 or 10.0.0.11:7710)"))?;
    if addr.ip().is_unspecified() {
        return Err(format!("{s}: an unspecified address reaches no server; name one of this host's addresses"));
    }
    Ok(addr)
}

/// A join checked before the server binds its port ([`prepare`]); started
/// once the server listens ([`Join::start`]).
#[derive(Debug)]
pub struct Join {
    meta: SocketAddr,
    server: u32,
    secret: dafne_auth::Secret,
    host: String,
    advertise: Option<SocketAddr>,
    lease: Arc<Lease>,
}

/// Checks the join options (`None` without `--meta`) before the server
/// binds its port, so that a wrong command line fails before it serves:
/// `--meta` and `--server-id` go together, the host name fits the wire,
/// the secret file `secret` reads, and a wildcard `listen` address comes
/// with `--advertise` (meta's table and `dafne status` need an address
/// that reaches the server; two hosts' `0.0.0.0:7710` would collide).
pub fn prepare(j: &JoinArgs, listen: SocketAddr, secret: &Path) -> Result<Option<Join>> {
    let Some(meta) = j.meta else {
        if j.server_id.is_some() || j.advertise.is_some() {
            bail!("--server-id and --advertise are for joining a cluster: give --meta ADDR too");
        }
        return Ok(None);
    };
    let Some(server) = j.server_id else {
        bail!("--meta needs --server-id N: this server's index among the cluster's io servers (io-N)");
    };
    if listen.ip().is_unspecified() && j.advertise.is_none() {
        bail!(
            "--listen {listen} is every address of this host: with --meta, say which one reaches this server \
             (--advertise IP or IP:PORT), or listen on that address"
        );
    }
    let host = match &j.host_name {
        Some(h) => {
            dafne_proto::check_host_name(h).map_err(|why| anyhow::anyhow!("--host-name {h:?}: {why}"))?;
            h.clone()
        }
        None => system_host_name(),
    };
    let secret = dafne_auth::Secret::load(secret)
        .with_context(|| format!("reading the cluster secret {} (to join meta at {meta})", secret.display()))?;
    Ok(Some(Join { meta, server, secret, host, advertise: j.advertise, lease: Arc::new(Lease::new()) }))
}

impl Join {
    /// The lease the heartbeats renew, for the io service to check
    /// ([`crate::server::start_leased`]); not held until meta answered the
    /// first heartbeat.
    pub fn lease(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    /// Starts the heartbeat thread: heartbeats for the server listening on
    /// `bound` (or what `--advertise` says), measuring the file system of
    /// `data_dir`.
    pub fn start(self, bound: SocketAddr, data_dir: &Path, ucx: Vec<(String, String)>) -> Result<Heartbeats> {
        let addr = match self.advertise {
            Some(a) if a.port() == 0 => SocketAddr::new(a.ip(), bound.port()),
            Some(a) => a,
            None => bound,
        };
        let mut instance = [0u8; 8];
        if rustix::rand::getrandom(&mut instance, rustix::rand::GetRandomFlags::empty()).is_err() {
            // No randomness: the start time tells this instance from others.
            instance = u64::try_from(std::time::UNIX_EPOCH.elapsed().unwrap_or_default().as_nanos())
                .unwrap_or(u64::MAX)
                .to_le_bytes();
        }
        let beat = Heartbeat {
            server: self.server,
            instance: u64::from_le_bytes(instance),
            addr,
            host: self.host,
            capacity_bytes: 0,
            used_bytes: 0,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = self.lease.watch(stop.clone()).context("starting the lease watcher thread")?;
        // From here on, a failure stops the watcher (the drop).
        let mut beats = Heartbeats { stop: stop.clone(), threads: vec![watcher] };
        let thread = Beat {
            lease: self.lease,
            meta: self.meta,
            secret: self.secret,
            ucx,
            beat,
            data_dir: data_dir.to_path_buf(),
            stop: stop.clone(),
        };
        let beating = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || thread.run())
            .context("starting the heartbeat thread")?;
        // The heartbeat thread first: it may still be using the lease.
        beats.threads.insert(0, beating);
        Ok(beats)
    }
}

struct Beat {
    meta: SocketAddr,
    secret: dafne_auth::Secret,
    ucx: Vec<(String, String)>,
    beat: Heartbeat,
    data_dir: PathBuf,
    stop: Arc<AtomicBool>,
    lease: Arc<Lease>,
}

impl Beat {
    /// The thread's one transport runtime. Why one for the thread's life:
    /// a failed connect (meta reachable but not answering: no answer
    /// within the connect timeout) leaves its endpoint closing, and a
    /// runtime dropped then cannot finish the close; a runtime per try
    /// leaked a worker, its descriptors and ~13 MB every ~11 s (issue 13
    /// review, defect 1). Kept, the loop finishes each close by itself.
    fn runtime(&self) -> Result<dafne_transport::Runtime> {
        Ok(dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
            name: "heartbeat".into(),
            ucx_config: self.ucx.clone(),
            ..Default::default()
        })?)
    }

    fn connect(&self, rt: &dafne_transport::Runtime) -> Result<dafne_client::MetaSession> {
        let name = format!("io-{} heartbeat", self.beat.server);
        Ok(dafne_client::MetaSession::connect(rt, self.meta, &self.secret, &name, 0, 0)?)
    }

    fn run(mut self) {
        // Declared before the session, so dropped after it: the session's
        // last messages and closes run on it.
        let mut rt: Option<dafne_transport::Runtime> = None;
        let mut session: Option<dafne_client::MetaSession> = None;
        // The last failure logged, so that a lasting one is logged once.
        let mut logged: Option<String> = None;
        let mut next = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(100)));
                continue;
            }
            next = now + HEARTBEAT_INTERVAL;
            let result = match &session {
                Some(s) => {
                    (self.beat.capacity_bytes, self.beat.used_bytes) = capacity(&self.data_dir);
                    // The lease runs from the sending (module `lease`).
                    let sent = Instant::now();
                    s.request(Request::ServerHeartbeat(self.beat.clone()))
                        .map(|answer| {
                            if let Response::Heartbeat { chains, routes } = answer {
                                self.lease.set_chains(chains, routes);
                            }
                            self.lease.grant(sent)
                        })
                        .map_err(|e| format!("meta at {} answered the heartbeat with {e}", self.meta))
                }
                None => {
                    if rt.is_none() {
                        match self.runtime() {
                            Ok(made) => rt = Some(made),
                            Err(e) => {
                                self.log_failure(&mut logged, format!("cannot start a runtime to reach meta: {e:#}"));
                                continue;
                            }
                        }
                    }
                    match rt.as_ref().map(|rt| self.connect(rt)) {
                        Some(Ok(s)) => {
                            session = Some(s);
                            // The first heartbeat at once.
                            next = Instant::now();
                            continue;
                        }
                        Some(Err(e)) => Err(format!("cannot reach meta at {}: {e:#}", self.meta)),
                        None => continue,
                    }
                }
            };
            match result {
                Ok(()) => {
                    if logged.take().is_some() {
                        tracing::info!("heartbeats to meta at {} go through again", self.meta);
                    }
                }
                Err(why) => self.log_failure(&mut logged, why),
            }
        }
    }

    /// Logs `why` unless it is the failure logged last (a lasting one is
    /// logged once).
    fn log_failure(&self, logged: &mut Option<String>, why: String) {
        if logged.as_deref() != Some(why.as_str()) {
            tracing::warn!("{why} (retried every {}s)", HEARTBEAT_INTERVAL.as_secs());
            *logged = Some(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_host_name_is_made_what_the_wire_carries() {
        assert_eq!(wire_host("node-1"), "node-1");
        assert_eq!(wire_host("a b|é"), "a_b___");
        let cut = wire_host(&"é".repeat(200));
        assert_eq!(cut.len(), MAX_HOST_NAME);
        assert_eq!(dafne_proto::check_host_name(&cut), Ok(()));
    }

    #[test]
    fn join_options_are_checked_before_binding() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let none = Path::new("/nonexistent");
        let err = |j: &JoinArgs, listen: &str| prepare(j, listen.parse().unwrap(), none).unwrap_err().to_string();
        let j = JoinArgs { server_id: Some(1), ..Default::default() };
        assert!(err(&j, "127.0.0.1:7710").contains("--meta"));
        let j = JoinArgs { meta: Some(addr), ..Default::default() };
        assert!(err(&j, "127.0.0.1:7710").contains("--server-id"));
        assert!(prepare(&JoinArgs::default(), addr, none).unwrap().is_none());
        // A wildcard listen address needs --advertise (checked before the
        // secret is read).
        let j = JoinArgs { meta: Some(addr), server_id: Some(0), ..Default::default() };
        for wild in ["0.0.0.0:7710", "[::]:7710"] {
            let e = err(&j, wild);
            assert!(e.contains("--advertise"), "{e}");
        }
        let j = JoinArgs { advertise: Some("10.0.0.11:0".parse().unwrap()), ..j };
        let e = err(&j, "0.0.0.0:7710");
        assert!(e.contains("cluster secret"), "with --advertise the next check runs: {e}");
        // Host names the wire refuses are refused here.
        for bad in ["a|b", "two words", "bell\u{7}", "é", &"x".repeat(MAX_HOST_NAME + 1)] {
            let j = JoinArgs { host_name: Some(bad.to_string()), ..j.clone() };
            let e = err(&j, "127.0.0.1:7710");
            assert!(e.contains("--host-name"), "{bad:?}: {e}");
        }
    }

    /// The names of this process's threads.
    fn threads() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|c| c.trim().to_string())
            .collect()
    }

    /// Issue 13 step 2 review: dropping [`Heartbeats`] raised the stop and
    /// returned, leaving the heartbeat thread (its session, its runtime)
    /// and the lease's watcher running. They are waited for now. Here
    /// meta's address has no listener (each connect is refused at once).
    /// Failed before: both threads still ran after the drop.
    #[test]
    fn dropping_the_heartbeats_ends_their_threads() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        dafne_auth::Secret::load_or_create(&secret).unwrap();
        // A port nothing listens on: bound and closed.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let j = JoinArgs { meta: Some(free), server_id: Some(0), host_name: Some("h".into()), advertise: None };
        let join = prepare(&j, "127.0.0.1:1".parse().unwrap(), &secret).unwrap().unwrap();
        let beats = join.start("127.0.0.1:1".parse().unwrap(), dir.path(), Vec::new()).unwrap();
        let ours = |t: &String| t == "heartbeat" || t == "lease";
        // A thread takes its name once it runs: waited for.
        let deadline = Instant::now() + Duration::from_secs(30);
        while threads().iter().filter(|t| ours(t)).count() < 2 {
            assert!(Instant::now() < deadline, "{:?}", threads());
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let it try meta (not a wait for a state: the drop must end the
        // threads whatever they do).
        std::thread::sleep(Duration::from_millis(300));
        drop(beats);
        // Nor the heartbeat runtime's worker, which the thread dropped.
        let left: Vec<String> = threads().into_iter().filter(|t| ours(t) || t == "heartbeat-ucx").collect();
        assert!(left.is_empty(), "{left:?} still run");
    }

    #[test]
    fn advertised_addresses_parse() {
        assert_eq!(parse_advertise("10.0.0.11"), Ok("10.0.0.11:0".parse().unwrap()));
        assert_eq!(parse_advertise("10.0.0.11:7712"), Ok("10.0.0.11:7712".parse().unwrap()));
        assert_eq!(parse_advertise("::1"), Ok("[::1]:0".parse().unwrap()));
        assert!(parse_advertise("0.0.0.0").unwrap_err().contains("unspecified"));
        assert!(parse_advertise("node1").unwrap_err().contains("not an IP"));
    }
}
