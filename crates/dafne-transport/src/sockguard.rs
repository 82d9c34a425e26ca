//! Guard of a server's listener port against unauthenticated bytes.
//!
//! A server listens through UCX's connection manager (`tcp_sockcm` here):
//! anyone who reaches the port talks to UCX before dafne sees anything.
//! UCX 1.13 spins a core forever on a socket that sent it bytes it cannot
//! parse (see `dafne_ucx::sockets` for the mechanism; measured in issue 10,
//! finding 11: one `head -c 4096 /dev/urandom > /dev/tcp/HOST/PORT` kept
//! an io server at 100% of a core), and it keeps a buffer and a descriptor
//! for every connection that never completes its handshake.
//!
//! The guard is a small thread per listener that looks at the kernel's view
//! of the port (`/proc/net/tcp`, `/proc/net/tcp6`) and at `TCP_INFO` of our
//! own accepted sockets. A genuine UCX connection request is answered by
//! the server within milliseconds (UCX sends its own private data back), so
//! a socket on the listener port that the server never sent a byte on is a
//! handshake in progress; it is reset when
//! * its unread bytes have not moved for [`STUCK_SCANS`] scans (UCX stopped
//!   reading: the spin above), or
//! * it is older than the handshake deadline (a stalled or idle peer), or
//! * more than [`MAX_PENDING_HANDSHAKES`] such sockets exist (a flood; the
//!   newest go first, since genuine handshakes finish at once).
//!
//! Resetting is `dafne_ucx::sockets::abort_own_tcp_socket`: UCX sees an
//! error on its own socket and frees its endpoint; the descriptor is never
//! closed under UCX. Sockets the server has answered are never touched.
//!
//! Cost: one read of `/proc/net/tcp{,6}` per scan ([`SCAN_EVERY`]); the
//! descriptor table is read only when an unknown socket shows up on the
//! port. Resets are counted (`hostile_sockets_reset`) and logged at most
//! once per [`LOG_EVERY`], so a flood cannot flood the log.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::runtime::Shared;
use crate::stats::TransportStats;

/// How often the port is looked at.
pub const SCAN_EVERY: Duration = Duration::from_millis(250);
/// Scans with unchanged unread bytes before a silent socket counts as stuck
/// (UCX reads whatever arrives at once; 3 × 250 ms of not reading is not a
/// slow scheduler, it is UCX's full buffer).
pub const STUCK_SCANS: u32 = 3;
/// Unanswered handshakes allowed at once. A UCX handshake completes in
/// well under a millisecond on a live server, so even a few hundred clients
/// connecting together leave only a handful pending; each pending one costs
/// UCX a descriptor and its private-data buffer (~2 KiB).
pub const MAX_PENDING_HANDSHAKES: usize = 64;
/// At most one summary line per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// TCP states (include/net/tcp_states.h) in which a peer can still send.
const TCP_ESTABLISHED: u8 = 0x01;
const TCP_CLOSE_WAIT: u8 = 0x08;

/// One socket of `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcTcp {
    pub local_port: u16,
    pub state: u8,
    pub rx_queue: u32,
    pub inode: u64,
}

/// Parses one line of `/proc/net/tcp` or `/proc/net/tcp6` (the header and
/// anything malformed give `None`).
pub fn parse_proc_tcp_line(line: &str) -> Option<ProcTcp> {
    let mut f = line.split_whitespace();
    let _sl = f.next()?.strip_suffix(':')?;
    let local = f.next()?;
    let _remote = f.next()?;
    let state = u8::from_str_radix(f.next()?, 16).ok()?;
    let queues = f.next()?;
    let _timer = f.next()?;
    let _retrnsmt = f.next()?;
    let _uid = f.next()?;
    let _timeout = f.next()?;
    let inode: u64 = f.next()?.parse().ok()?;
    let (_, port) = local.rsplit_once(':')?;
    let local_port = u16::from_str_radix(port, 16).ok()?;
    let (_, rx) = queues.split_once(':')?;
    let rx_queue = u32::from_str_radix(rx, 16).ok()?;
    Some(ProcTcp { local_port, state, rx_queue, inode })
}

/// The sockets on `port` that a peer can still send on.
fn sockets_on(port: u16) -> Vec<ProcTcp> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        out.extend(
            text.lines()
                .filter_map(parse_proc_tcp_line)
                .filter(|s| s.local_port == port && s.inode != 0)
                .filter(|s| s.state == TCP_ESTABLISHED || s.state == TCP_CLOSE_WAIT),
        );
    }
    out
}

/// Socket inode -> our descriptor number, from `/proc/self/fd`.
fn our_socket_fds() -> HashMap<u64, i32> {
    let mut m = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return m };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(target) = std::fs::read_link(e.path()) else { continue };
        let t = target.to_string_lossy();
        if let Some(ino) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')).and_then(|n| n.parse().ok()) {
            m.insert(ino, fd);
        }
    }
    m
}

/// What the guard remembers of one socket on the port.
#[derive(Debug, Clone, Copy)]
struct Seen {
    fd: i32,
    first_seen: Instant,
    last_rx: u32,
    still: u32,
    /// The server has sent bytes on it: a completed handshake, left alone.
    answered: bool,
}

/// Why a socket is reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    Stuck,
    Expired,
    Excess,
}

/// The decision for one unanswered socket, given how long it has been seen
/// and how many scans its unread bytes stood still.
pub fn judge(age: Duration, rx_queue: u32, still_scans: u32, deadline: Duration) -> Verdict {
    if rx_queue > 0 && still_scans >= STUCK_SCANS {
        Verdict::Stuck
    } else if age >= deadline {
        Verdict::Expired
    } else {
        Verdict::Keep
    }
}

/// The guard thread of one listener; stops when dropped.
pub(crate) struct SockGuard {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SockGuard {
    pub(crate) fn start(port: u16, deadline: Duration, shared: Arc<Shared>) -> SockGuard {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sockguard-{port}"))
            .spawn(move || run(port, deadline, &shared, &s))
            .ok();
        if thread.is_none() {
            tracing::error!("could not start the guard of port {port}: garbage on it could spin UCX");
        }
        SockGuard { stop, thread }
    }
}

impl Drop for SockGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn run(port: u16, deadline: Duration, shared: &Shared, stop: &AtomicBool) {
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut reset_since_log = 0u64;
    let mut last_log: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(SCAN_EVERY);
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        let socks = sockets_on(port);
        seen.retain(|ino, _| socks.iter().any(|s| s.inode == *ino));
        let unknown = socks.iter().any(|s| !seen.contains_key(&s.inode));
        let fds = if unknown { our_socket_fds() } else { HashMap::new() };
        let mut pending: Vec<(u64, Instant)> = Vec::new();
        for s in &socks {
            let e = match seen.get_mut(&s.inode) {
                Some(e) => e,
                None => {
                    // Not one of ours (another process on the port) or it
                    // went away between the two reads: look again next scan.
                    let Some(&fd) = fds.get(&s.inode) else { continue };
                    seen.entry(s.inode).or_insert(Seen {
                        fd,
                        first_seen: now,
                        last_rx: s.rx_queue,
                        still: 0,
                        answered: false,
                    })
                }
            };
            if e.answered {
                continue;
            }
            match dafne_ucx::sockets::probe_own_tcp_socket(e.fd, s.inode) {
                Ok(Some(p)) if p.bytes_acked > 0 || p.unacked_segments > 0 => {
                    e.answered = true;
                    continue;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => continue,
            }
            if s.rx_queue == e.last_rx {
                e.still += 1;
            } else {
                e.still = 0;
                e.last_rx = s.rx_queue;
            }
            let verdict = judge(now.duration_since(e.first_seen), s.rx_queue, e.still, deadline);
            if verdict == Verdict::Keep {
                pending.push((s.inode, e.first_seen));
            } else if reset(e.fd, s.inode, shared) {
                reset_since_log += 1;
            }
        }
        if pending.len() > MAX_PENDING_HANDSHAKES {
            pending.sort_by_key(|&(_, t)| std::cmp::Reverse(t));
            let excess = pending.len() - MAX_PENDING_HANDSHAKES;
            for &(ino, _) in &pending[..excess] {
                if let Some(e) = seen.get(&ino) {
                    if reset(e.fd, ino, shared) {
                        reset_since_log += 1;
                    }
                }
            }
        }
        if reset_since_log > 0 && (last_log.is_none_or(|t| now.duration_since(t) >= LOG_EVERY)) {
            tracing::warn!(
                "port {port}: reset {reset_since_log} connection(s) that never completed a UCX handshake \
                 (garbage, stalled, or too many at once)"
            );
            reset_since_log = 0;
            last_log = Some(now);
        }
    }
}

fn reset(fd: i32, inode: u64, shared: &Shared) -> bool {
    match dafne_ucx::sockets::abort_own_tcp_socket(fd, inode) {
        Ok(true) => {
            TransportStats::inc(&shared.stats.hostile_sockets_reset);
            true
        }
        Ok(false) => false,
        Err(e) => {
            tracing::debug!("resetting socket {fd}: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_net_tcp_lines() {
        let v4 = "   3: 0100007F:1E1E 0100007F:BC46 08 00000000:000007E1 00:00000000 00000000     0        0 123456 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_proc_tcp_line(v4),
            Some(ProcTcp { local_port: 0x1e1e, state: 8, rx_queue: 0x7e1, inode: 123456 })
        );
        let v6 = "   0: 00000000000000000000000001000000:1E1E 00000000000000000000000001000000:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 42 1 0000000000000000 20 4 0 10 -1";
        assert_eq!(parse_proc_tcp_line(v6).map(|s| (s.local_port, s.state, s.inode)), Some((0x1e1e, 1, 42)));
        for bad in [
            "",
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
            "3: 0100007F:ZZZZ 0100007F:BC46 08 00000000:000007E1 00:00000000 00000000 0 0 1",
            "3: 0100007F 0100007F:BC46 08 00000000:000007E1 00:00000000 00000000 0 0 1",
        ] {
            assert_eq!(parse_proc_tcp_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn verdicts() {
        let d = Duration::from_secs(5);
        assert_eq!(judge(Duration::from_millis(300), 2000, STUCK_SCANS, d), Verdict::Stuck);
        assert_eq!(judge(Duration::from_millis(300), 2000, STUCK_SCANS - 1, d), Verdict::Keep);
        assert_eq!(judge(Duration::from_millis(300), 0, 100, d), Verdict::Keep);
        assert_eq!(judge(d, 0, 0, d), Verdict::Expired);
    }
}
