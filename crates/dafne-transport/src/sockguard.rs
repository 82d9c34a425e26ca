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
//! The guard is a small thread per listener that looks at our own accepted
//! sockets (the descriptor table, then `getsockname`, `TCP_INFO` and the
//! unread byte count of each new socket). A genuine UCX connection request
//! is answered by the server within milliseconds (UCX sends its own private
//! data back), so a socket on the listener port that the server never sent
//! a byte on is a handshake in progress; it is reset when
//! * UCX has read some of its bytes and the rest have not moved for
//!   [`STUCK_SCANS`] scans (UCX stopped reading: the spin above), or
//! * it is older than the handshake deadline (a stalled or idle peer), or
//! * more than [`MAX_PENDING_HANDSHAKES`] such sockets exist (a flood; the
//!   oldest go first, since genuine handshakes finish at once: a client
//!   that connects during a flood still gets through).
//!
//! Resetting is `dafne_ucx::sockets::abort_own_tcp_socket`: UCX sees an
//! error on its own socket and frees its endpoint; the descriptor is never
//! closed under UCX. Sockets the server has answered are never touched.
//!
//! Cost: per scan ([`SCAN_EVERY`]) one read of `/proc/self/fd` and a
//! `readlink` per descriptor; sockets already judged (answered, or not on
//! the port) are not probed again. `/proc/net/tcp` is not used: reading it
//! walks the kernel's whole connection hash (15 ms of system time here),
//! which at this rate was 4% of a core per server. Resets are counted
//! (`hostile_sockets_reset`) and logged at most once per [`LOG_EVERY`], so
//! a flood cannot flood the log.

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
/// Resets per scan, at most: UCX tears each reset endpoint down on its
/// async thread, and hundreds at once (a flood past ~1,000 descriptors)
/// were seen to make UCX 1.13 close descriptors twice; a flood is worked
/// off over a few seconds instead.
pub const MAX_RESETS_PER_SCAN: usize = 16;
/// At most one summary line per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// TCP states (include/net/tcp_states.h) in which a peer can still send.
const TCP_ESTABLISHED: u8 = 0x01;
const TCP_CLOSE_WAIT: u8 = 0x08;

/// The inode of a `socket:[N]` link target.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Our descriptors that are sockets: (inode, descriptor number).
fn our_sockets() -> Vec<(u64, i32)> {
    let mut v = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return v };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(target) = std::fs::read_link(e.path()) else { continue };
        if let Some(ino) = socket_inode(&target.to_string_lossy()) {
            v.push((ino, fd));
        }
    }
    v
}

/// What the guard remembers of one socket on the port.
#[derive(Debug, Clone, Copy)]
struct Seen {
    first_seen: Instant,
    last_rx: u32,
    still: u32,
}

/// Why a socket is reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    Stuck,
    Expired,
    Excess,
}

/// The decision for one unanswered socket, given how long it has been seen,
/// its unread bytes (`rx_queue`), the bytes UCX has read from it
/// (`consumed`) and how many scans its unread bytes stood still.
///
/// Stuck needs all three: bytes waiting, UCX having read some (the spin
/// starts once UCX's buffer is full), and no progress for [`STUCK_SCANS`]
/// scans. A request UCX has not read at all is a server that has not got
/// to it yet (its async thread busy or starved of a core on a loaded
/// machine), not the spin: such a socket is left to the deadline and the
/// cap on pending handshakes. (Before, a genuine client's connection to a
/// server busy for 750 ms was reset: seen once in CI as `dafne status`
/// failing with "Connection reset by remote peer" right after a client
/// was killed.)
pub fn judge(age: Duration, rx_queue: u32, consumed: u64, still_scans: u32, deadline: Duration) -> Verdict {
    if rx_queue > 0 && consumed > 0 && still_scans >= STUCK_SCANS {
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
    // Sockets judged for good: answered handshakes and sockets not on the
    // port (client sockets, UCX's own transport sockets, the listener).
    let mut settled: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut reset_since_log = 0u64;
    let mut last_log: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(SCAN_EVERY);
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        let socks = our_sockets();
        let live: std::collections::HashSet<u64> = socks.iter().map(|&(i, _)| i).collect();
        settled.retain(|ino| live.contains(ino));
        seen.retain(|ino, _| live.contains(ino));
        let mut resets_this_scan = 0usize;
        let mut pending: Vec<(u64, i32, Instant)> = Vec::new();
        for &(ino, fd) in &socks {
            if settled.contains(&ino) {
                continue;
            }
            let p = match dafne_ucx::sockets::probe_own_tcp_socket(fd, ino) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    settled.insert(ino); // not TCP, or gone
                    continue;
                }
                Err(_) => continue,
            };
            if p.local_port != port || p.bytes_acked > 0 || p.unacked_segments > 0 {
                settled.insert(ino);
                continue;
            }
            if p.state != TCP_ESTABLISHED && p.state != TCP_CLOSE_WAIT {
                continue; // the listener itself, or a socket on its way out
            }
            let fresh = !seen.contains_key(&ino);
            let e = seen.entry(ino).or_insert(Seen { first_seen: now, last_rx: p.unread, still: 0 });
            if fresh {
                // First sighting: nothing to compare with yet.
            } else if p.unread == e.last_rx {
                e.still += 1;
            } else {
                e.still = 0;
                e.last_rx = p.unread;
            }
            let consumed = p.bytes_received.saturating_sub(u64::from(p.unread));
            match judge(now.duration_since(e.first_seen), p.unread, consumed, e.still, deadline) {
                Verdict::Keep => pending.push((ino, fd, e.first_seen)),
                _ if resets_this_scan < MAX_RESETS_PER_SCAN => {
                    resets_this_scan += 1;
                    if reset(fd, ino, shared) {
                        reset_since_log += 1;
                    }
                }
                _ => {}
            }
        }
        if pending.len() > MAX_PENDING_HANDSHAKES {
            // Oldest first: a genuine handshake completes within
            // milliseconds, so the sockets that have waited longest are the
            // flood's, and a client arriving during a flood gets through.
            pending.sort_by_key(|&(_, _, t)| t);
            let excess = (pending.len() - MAX_PENDING_HANDSHAKES).min(MAX_RESETS_PER_SCAN - resets_this_scan);
            for &(ino, fd, _) in &pending[..excess] {
                if reset(fd, ino, shared) {
                    reset_since_log += 1;
                }
            }
        }
        if reset_since_log > 0 && last_log.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
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
    fn socket_links() {
        assert_eq!(socket_inode("socket:[123456]"), Some(123456));
        for bad in ["", "socket:[]", "socket:[12", "pipe:[5]", "/dev/null", "socket:[-1]"] {
            assert_eq!(socket_inode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn verdicts() {
        let d = Duration::from_secs(5);
        let t = Duration::from_millis(300);
        assert_eq!(judge(t, 2000, 4096, STUCK_SCANS, d), Verdict::Stuck);
        assert_eq!(judge(t, 2000, 4096, STUCK_SCANS - 1, d), Verdict::Keep);
        assert_eq!(judge(t, 0, 4096, 100, d), Verdict::Keep);
        // Not read at all yet: a busy server, not UCX's spin.
        assert_eq!(judge(t, 2000, 0, 100, d), Verdict::Keep);
        assert_eq!(judge(d, 2000, 0, 100, d), Verdict::Expired);
        assert_eq!(judge(d, 0, 0, 0, d), Verdict::Expired);
    }
}
