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
//! It runs on a thread of its own with its own transport runtime and a
//! session of the cluster secret as uid 0 (as the supervisor's reclaimer
//! logs in), so the serving loop never waits for meta. The session
//! reconnects by itself after meta restarts (`dafne_client`'s link); until
//! the first connection succeeds the thread retries every interval. A
//! refusal (meta does not know the id, another server has the address) is
//! logged once and retried: a configuration corrected on meta's side is
//! picked up. The thread stops when the [`Heartbeats`] handle is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dafne_proto::{Heartbeat, Request, HEARTBEAT_INTERVAL, MAX_HOST_NAME};

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
    /// The host name sent with the heartbeat (default: the system's).
    #[arg(long, value_name = "NAME")]
    pub host_name: Option<String>,
}

/// The running heartbeat thread; dropping it stops the thread (at its next
/// tick, without waiting).
#[derive(Debug)]
pub struct Heartbeats {
    stop: Arc<AtomicBool>,
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// This host's name, as the kernel has it (empty if unreadable), cut to
/// what the wire carries.
fn system_host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    bounded_host(name.trim())
}

fn bounded_host(name: &str) -> String {
    let mut end = name.len().min(MAX_HOST_NAME);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
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

/// Starts the heartbeat thread if `--meta` was given (`None` otherwise):
/// heartbeats for server `addr` (where it serves), logging in with the
/// secret file `secret`, measuring the file system of `data_dir`.
pub fn start(
    j: &JoinArgs,
    addr: SocketAddr,
    data_dir: &Path,
    secret: &Path,
    ucx: Vec<(String, String)>,
) -> Result<Option<Heartbeats>> {
    let Some(meta) = j.meta else {
        if j.server_id.is_some() {
            bail!("--server-id is for joining a cluster: give --meta ADDR too");
        }
        return Ok(None);
    };
    let Some(server) = j.server_id else {
        bail!("--meta needs --server-id N: this server's index among the cluster's io servers (io-N)");
    };
    let secret = dafne_auth::Secret::load(secret)
        .with_context(|| format!("reading the cluster secret {} (to join meta at {meta})", secret.display()))?;
    let host = match &j.host_name {
        Some(h) if h.len() > MAX_HOST_NAME => bail!("--host-name is {} bytes, above {MAX_HOST_NAME}", h.len()),
        Some(h) => h.clone(),
        None => system_host_name(),
    };
    let mut instance = [0u8; 8];
    if rustix::rand::getrandom(&mut instance, rustix::rand::GetRandomFlags::empty()).is_err() {
        // No randomness: the start time tells this instance from others.
        instance = u64::try_from(std::time::UNIX_EPOCH.elapsed().unwrap_or_default().as_nanos())
            .unwrap_or(u64::MAX)
            .to_le_bytes();
    }
    let beat =
        Heartbeat { server, instance: u64::from_le_bytes(instance), addr, host, capacity_bytes: 0, used_bytes: 0 };
    let stop = Arc::new(AtomicBool::new(false));
    let thread = Beat { meta, secret, ucx, beat, data_dir: data_dir.to_path_buf(), stop: stop.clone() };
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || thread.run())
        .context("starting the heartbeat thread")?;
    Ok(Some(Heartbeats { stop }))
}

struct Beat {
    meta: SocketAddr,
    secret: dafne_auth::Secret,
    ucx: Vec<(String, String)>,
    beat: Heartbeat,
    data_dir: PathBuf,
    stop: Arc<AtomicBool>,
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
                    s.request(Request::ServerHeartbeat(self.beat.clone()))
                        .map(|_| ())
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
    fn host_names_are_cut_on_a_char_boundary() {
        assert_eq!(bounded_host("node-1"), "node-1");
        let long = "é".repeat(200);
        let cut = bounded_host(&long);
        assert!(cut.len() <= MAX_HOST_NAME && cut.len() == 254, "{}", cut.len());
    }

    #[test]
    fn server_id_and_meta_go_together() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let dir = Path::new("/");
        let j = JoinArgs { server_id: Some(1), ..Default::default() };
        assert!(start(&j, addr, dir, Path::new("/nonexistent"), vec![]).unwrap_err().to_string().contains("--meta"));
        let j = JoinArgs { meta: Some(addr), ..Default::default() };
        let e = start(&j, addr, dir, Path::new("/nonexistent"), vec![]).unwrap_err().to_string();
        assert!(e.contains("--server-id"), "{e}");
        assert!(start(&JoinArgs::default(), addr, dir, Path::new("/nonexistent"), vec![]).unwrap().is_none());
    }
}
