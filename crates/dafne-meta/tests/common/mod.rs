//! What the metadata server's process tests share: starting a real
//! `dafne-meta` process and opening client sessions to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use dafne_auth::Secret;
use dafne_client::MetaSession;
use dafne_transport::{Runtime, RuntimeOptions};

/// A running `dafne-meta`; killed when dropped.
pub struct Meta {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    /// Its metrics page (`--metrics-listen 127.0.0.1:0`).
    pub metrics: SocketAddr,
}

impl Meta {
    /// Waits until the server's gauge `name` (its metrics page, which the
    /// server renders at most once a second) reads `want`, at most 20 s:
    /// tests wait on the server's state, not for a time that a loaded
    /// machine may outlast.
    pub fn wait_gauge(&self, name: &str, want: f64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut seen = None;
        while std::time::Instant::now() < deadline {
            let page =
                dafne_metrics::http::fetch(self.metrics, std::time::Duration::from_secs(5)).expect("metrics page");
            let families = dafne_metrics::parse::parse(&page).expect("a well-formed page");
            seen = families.iter().find(|f| f.name == name).and_then(|f| f.samples.first()).map(|s| s.value);
            if seen == Some(want) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("{name} stayed {seen:?}, waited for {want}");
    }
}

impl Drop for Meta {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn ucx() -> Vec<(String, String)> {
    vec![("TLS".into(), "posix,sysv,self,tcp".into()), ("NET_DEVICES".into(), "lo".into())]
}

/// Starts `dafne-meta` with its store in `dir`, listening on `listen`
/// (`127.0.0.1:0`: any port; the same address again after a kill: a
/// restart), with `io_servers` in its layouts, an open grace (and lock
/// lease) of `grace_s`, and the reply-dropping test hook set to `faults`
/// (empty: off).
pub fn spawn_meta(dir: &Path, listen: &str, io_servers: u32, grace_s: u32, faults: &str) -> Meta {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dafne-meta"));
    cmd.args(["--data-dir", dir.to_str().unwrap(), "--listen", listen, "--io-servers", &io_servers.to_string()])
        .args(["--open-grace-s", &grace_s.to_string(), "--metrics-listen", "127.0.0.1:0"])
        .args(ucx().iter().flat_map(|(k, v)| ["--ucx".to_string(), format!("{k}={v}")]))
        // A restart on the same port does not wait out TIME_WAIT.
        .env("UCX_TCP_CM_REUSEADDR", "y")
        .env_remove(dafne_meta::service::FAULT_DROP_REPLY)
        .stdout(Stdio::piped());
    if !faults.is_empty() {
        cmd.env(dafne_meta::service::FAULT_DROP_REPLY, faults);
    }
    let mut child = cmd.spawn().expect("spawn dafne-meta");
    // `metrics on ADDR`, then `listening on ADDR`.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut banner = || {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.trim().to_string()
    };
    let first = banner();
    let metrics = first.strip_prefix("metrics on ").unwrap_or_else(|| panic!("banner {first:?}")).parse().unwrap();
    let line = banner();
    let addr = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("banner {line:?}")).parse().unwrap();
    Meta { child, addr, dir: dir.to_path_buf(), metrics }
}

/// A client transport runtime named `name`.
pub fn runtime(name: &str) -> Runtime {
    Runtime::new(RuntimeOptions { name: name.into(), ucx_config: ucx(), ..Default::default() }).unwrap()
}

/// The cluster secret the server in `dir` made.
pub fn secret(dir: &Path) -> Secret {
    Secret::load_or_create(&dir.join("cluster.secret")).unwrap()
}

/// A session with the cluster secret to the server of `dir` at `addr`.
pub fn session_at(rt: &Runtime, dir: &Path, addr: SocketAddr, name: &str, uid: u32, gid: u32) -> MetaSession {
    MetaSession::connect(rt, addr, secret(dir), name, uid, gid).expect("session")
}
