//! What the `dafne` command's multi-process tests share: running the
//! binary, free ports for a cluster, process liveness, waiting.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod cluster;

/// The `dafne` binary, with no cluster directory from the environment and
/// errors printed without backtraces (as a person sees them).
pub fn dafne() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dafne"));
    c.env_remove("DAFNE_HOME").env("RUST_BACKTRACE", "0").stdin(Stdio::null());
    c
}

/// Everything a command printed, stdout then stderr.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A free port for the metadata server and `n` consecutive free ones for
/// the io servers: `(meta_port, io_base_port)`.
pub fn free_ports(n: u16) -> (u16, u16) {
    for _ in 0..200 {
        let meta = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let base = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if base.checked_add(n).is_none() || (base..base + n).contains(&meta) {
            continue;
        }
        if (base..base + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return (meta, base);
        }
    }
    panic!("no {n} consecutive free ports");
}

/// A process that exists and is not a zombie (an exited daemon whose
/// adoptive parent has not reaped it yet is gone for every purpose here).
pub fn alive(pid: impl Into<u64>) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.into())) {
        Ok(s) => s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Polls `f` until it holds; panics after 30 s.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Bytes that differ at every offset (a shifted, torn or zeroed copy shows),
/// reproducible from `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}
