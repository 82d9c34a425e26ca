//! `DIR/servers.json`: each server as the supervisor sees it, rewritten
//! (atomically) whenever that changes; `dafne status` and `dafne down`
//! (for servers a killed supervisor left running) read it.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One server as the supervisor sees it (`DIR/servers.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServerState {
    /// `meta` or `io-N`.
    pub name: String,
    pub addr: SocketAddr,
    pub pid: u32,
    /// `starting`, `running`, `restarting`, `failed` or `stopped`.
    pub state: String,
    /// Restarts since the supervisor started it: the total, which
    /// `dafne status` shows.
    pub restarts: u32,
    /// Restarts that count against `[cluster] max_restarts`: those since
    /// the server last ran `restart_window_s` seconds in a row (reset to 0
    /// then).
    #[serde(default)]
    pub restarts_in_window: u32,
    /// How the last run ended, if it did.
    pub last_exit: Option<String>,
    /// When the process started ([`crate::procs::start_time`]), so that a
    /// reused pid is not taken for it.
    #[serde(default)]
    pub start: u64,
    /// Its metrics port (`GET /metrics`) as the server reported it at its
    /// last start (`None`: it serves none).
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
}

impl ServerState {
    /// A server about to be started for the first time.
    pub(crate) fn starting(name: impl Into<String>, addr: SocketAddr) -> ServerState {
        ServerState {
            name: name.into(),
            addr,
            pid: 0,
            state: "starting".into(),
            restarts: 0,
            restarts_in_window: 0,
            last_exit: None,
            start: 0,
            metrics: None,
        }
    }
}

/// Writes `DIR/servers.json` (best effort: a supervisor keeps running
/// when it cannot).
pub(crate) fn save_states<'a>(dir: &Path, states: impl IntoIterator<Item = &'a ServerState>) {
    let states: Vec<&ServerState> = states.into_iter().collect();
    let tmp = dir.join("servers.json.tmp");
    if let Ok(text) = serde_json::to_string_pretty(&states) {
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, dir.join("servers.json"));
        }
    }
}

/// What `DIR/servers.json` says; empty when there is none (or it does not
/// parse).
pub fn load_states(dir: &Path) -> Vec<ServerState> {
    std::fs::read_to_string(dir.join("servers.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_an_older_file_reads() {
        let d = tempfile::tempdir().unwrap();
        assert!(load_states(d.path()).is_empty());
        let mut s = ServerState::starting("io-0", "127.0.0.1:7710".parse().unwrap());
        s.restarts = 2;
        save_states(d.path(), [&s]);
        assert_eq!(load_states(d.path()), vec![s]);
        // Written before restarts_in_window, start and metrics existed.
        std::fs::write(
            d.path().join("servers.json"),
            r#"[{"name":"meta","addr":"127.0.0.1:7700","pid":5,"state":"running","restarts":1,"last_exit":null}]"#,
        )
        .unwrap();
        let old = load_states(d.path());
        assert_eq!((old[0].restarts, old[0].restarts_in_window, old[0].start), (1, 0, 0));
    }
}
