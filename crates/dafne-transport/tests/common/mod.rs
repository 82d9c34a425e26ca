//! Shared harness: starts real `dafne-transport-peer` processes and
//! in-process client runtimes, over a chosen UCX transport.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dafne_transport::{Runtime, RuntimeOptions};

/// The transports every test runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// TCP on loopback only.
    Tcp,
    /// Shared memory (posix, sysv) for messages; RMA by cma, since servers
    /// never map a peer's segment (see `dafne_ucx`'s `KeyShape`: without
    /// cma, UCX would emulate RMA with messages); TCP only for the control
    /// connection.
    Shm,
    /// cma (process_vm_readv/writev) for RMA on ordinary memory, sysv shared
    /// memory for messages and UCX-allocated memory; TCP for control.
    Cma,
}

pub const ALL: [Tls; 3] = [Tls::Tcp, Tls::Shm, Tls::Cma];

impl Tls {
    pub fn ucx(self) -> Vec<(String, String)> {
        let tls = match self {
            Tls::Tcp => "tcp",
            Tls::Shm => "posix,sysv,cma,self,tcp",
            Tls::Cma => "cma,sysv,self,tcp",
        };
        vec![("TLS".into(), tls.into()), ("NET_DEVICES".into(), "lo".into())]
    }

    pub fn args(self) -> Vec<String> {
        self.ucx().into_iter().flat_map(|(k, v)| ["--ucx".to_string(), format!("{k}={v}")]).collect()
    }
}

pub struct Peer {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn peer_bin() -> &'static str {
    env!("CARGO_BIN_EXE_dafne-transport-peer")
}

/// Starts `dafne-transport-peer serve` and waits for its address.
pub fn spawn_server(tls: Tls, extra: &[&str]) -> Peer {
    let mut child = Command::new(peer_bin())
        .args(tls.args())
        .arg("serve")
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn dafne-transport-peer");
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).expect("read server banner");
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected banner {line:?}"));
    Peer { addr: addr.parse().unwrap(), child }
}

pub fn client_runtime(tls: Tls) -> Runtime {
    client_runtime_with(tls, |_| {})
}

pub fn client_runtime_with(tls: Tls, f: impl FnOnce(&mut RuntimeOptions)) -> Runtime {
    let mut o = RuntimeOptions { name: format!("test-{tls:?}"), ucx_config: tls.ucx(), ..Default::default() };
    o.call_timeout = Duration::from_secs(20);
    f(&mut o);
    Runtime::new(o).expect("client runtime")
}
