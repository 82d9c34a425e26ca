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
//! Resetting is `dafne_ucx::sockets::OwnSockets::abort`: UCX sees an
//! error on its own socket and frees its endpoint; the descriptor is never
//! closed under UCX. Sockets the server has answered are never touched.
//!
//! A flood larger than the descriptor limit: the guard opens what it needs
//! before the server listens (`OwnSockets`: the `/proc/self/fd` directory
//! and one slot it duplicates sockets into), so it works at a full table.
//! UCX accepts far faster than the guard looks (a thousand connections
//! between two scans), so the guard alone cannot keep the table from
//! filling; `dafne_ucx::acceptgate` does, from inside UCX's `accept`: the
//! process's soft limit `S` is the hard one `H` less a reserve (256 at
//! `H` = 1,024), and the first `accept` on this listener that meets `S`
//! pauses it and opens the reserve (soft limit to `H`), so UCX's data
//! listener, the server's files and honest clients' sockets always find a
//! descriptor (at a full table UCX 1.13.1 closes its data listener for
//! good). The guard pauses too, below [`LOW_WATER`] free under `S`, and
//! resumes once [`HIGH_WATER`] are free under `S` and the accept queue
//! fits (or nothing is left to reset), lowering the soft limit back to `S`
//! first. Meanwhile new connections wait in the kernel's accept queue and
//! the guard looks every [`SCAN_UNDER_PRESSURE`] so the queue drains
//! quickly; a refused accept wakes it at once. Every pause and resume is
//! logged (at most one line per [`LOG_EVERY`]; a pause that lasts is
//! reported again every [`LOG_EVERY`], with what it waits for) and shown
//! in the stats (`listener_paused`, a gauge; `listener_pauses`;
//! `accepts_refused`; `accepts_from_reserve`). The guard's first scan comes
//! right after the listener is created: it must know the listener's number
//! for its own pauses (the gate's use the number UCX accepts on).
//!
//! Why pausing UCX is safe: the guard calls `ucs_async_modify_handler` with
//! the listener's descriptor number, and UCS finds handlers by number, so
//! the guard must never outlive the listener (a reused number could name
//! another socket's handler). `ServerSide` drops the guard first, and
//! `shutdown` takes it before the listener.
//!
//! Cost: per scan ([`SCAN_EVERY`]) one read of `/proc/self/fd`
//! (`getdents64` on the held directory) and a `readlinkat` per
//! descriptor; sockets already judged (answered, or not on the port) are
//! not probed again. `/proc/net/tcp` is not used: reading it
//! walks the kernel's whole connection hash (15 ms of system time here),
//! which at this rate was 4% of a core per server. Resets are counted
//! (`hostile_sockets_reset`) and logged at most once per [`LOG_EVERY`], so
//! a flood cannot flood the log.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dafne_ucx::sockets::OwnSockets;

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
/// async thread, and hundreds at once (a flood past ~1,000 descriptors,
/// before `ASYNC_MAX_EVENTS` was raised) were seen to make UCX 1.13 close
/// descriptors twice; a flood is worked off over a few scans instead.
/// Was 16; at 64 an honest round trip behind a reconnecting flood of
/// 1,500 took 2.9 to 6.0 s instead of 9.4 to 18.6 s, and no double close
/// showed (`hostile.rs`, the flood tests, four runs; ARCHITECTURE
/// "Connection floods").
pub const MAX_RESETS_PER_SCAN: usize = 64;
/// At most one summary line per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// How often the port is looked at while UCX's accepting is paused with
/// connections queued, or more handshakes are pending than allowed: resets
/// then drain the accept queue at up to [`MAX_RESETS_PER_SCAN`] per look
/// (1,280 a second), so an honest client queued behind a flood is accepted
/// within seconds (a round trip 1.1 to 1.5 s behind a one-shot flood of
/// 1,500, 2.9 to 6.0 s behind a reconnecting one, in `hostile.rs`).
pub const SCAN_UNDER_PRESSURE: Duration = Duration::from_millis(50);
/// Free descriptors (below the accept gate's soft limit `S`, module docs)
/// under which UCX stops accepting: the guard's own margin; the gate's
/// reserve above `S` is what the server's files and honest clients'
/// sockets keep whatever happens.
pub const LOW_WATER: usize = 64;
/// Free descriptors (below `S`) at which UCX accepts again.
pub const HIGH_WATER: usize = 128;

/// Whether UCX should accept, given free descriptors, whether it does now
/// (hysteresis between [`LOW_WATER`] and [`HIGH_WATER`]), the connections
/// waiting in the listener's accept queue, and whether more handshakes are
/// pending than allowed. A paused listener resumes when the whole queue
/// fits above [`LOW_WATER`], or when the guard has no excess left to reset
/// (then waiting would free nothing more): resuming into a queue that does
/// not fit fills the table again and UCX loops on EMFILE until the guard
/// pauses it once more.
pub fn should_accept(free: usize, accepting: bool, queued: usize, crowded: bool) -> bool {
    if accepting {
        free >= LOW_WATER
    } else {
        free >= HIGH_WATER && (queued + LOW_WATER <= free || !crowded)
    }
}

/// TCP states (include/net/tcp_states.h) in which a peer can still send.
const TCP_ESTABLISHED: u8 = 0x01;
const TCP_CLOSE_WAIT: u8 = 0x08;
/// A listening socket.
const TCP_LISTEN: u8 = 0x0a;

/// What the guard remembers of one socket on the port.
#[derive(Debug, Clone, Copy)]
struct Seen {
    first_seen: Instant,
    last_rx: u32,
    still: u32,
    /// When `still` was last counted: scans under pressure come faster
    /// than [`SCAN_EVERY`], and stillness is counted per [`SCAN_EVERY`].
    last_count: Instant,
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
    /// Opens the guard's descriptors; call before listening (module docs).
    pub(crate) fn prepare() -> Option<OwnSockets> {
        match OwnSockets::open() {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::error!("could not open the listener guard's descriptors: {e}; garbage could spin UCX");
                None
            }
        }
    }

    /// Starts guarding `port`. The guard must be dropped before the
    /// listener on `port` is destroyed (it pauses and resumes that
    /// listener's handler by descriptor number).
    pub(crate) fn start(own: Option<OwnSockets>, port: u16, deadline: Duration, shared: Arc<Shared>) -> SockGuard {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = own.and_then(|own| {
            std::thread::Builder::new()
                .name(format!("sockguard-{port}"))
                .spawn(move || run(own, port, deadline, &shared, &s))
                .ok()
        });
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

/// The listening socket on the port, once found: (descriptor, inode).
type ListenerFd = (i32, u64);

fn run(mut own: OwnSockets, port: u16, deadline: Duration, shared: &Shared, stop: &AtomicBool) {
    use dafne_ucx::acceptgate;
    // A refused accept (the table at the gate's limit) wakes this thread.
    let _wake = acceptgate::wake_on_refusal(std::thread::current());
    let gate = acceptgate::register(port);
    if gate.is_none() {
        tracing::warn!("port {port}: no room to register with the accept gate; a flood may fill the descriptor table");
    }
    // Sockets judged for good: answered handshakes and sockets not on the
    // port (client sockets, UCX's own transport sockets).
    let mut settled: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut seen: HashMap<u64, Seen> = HashMap::new();
    let mut reset_since_log = 0u64;
    let mut pauses_since_log = 0u64;
    let mut gate_since_log = acceptgate::GateCounts::default();
    let mut last_log: Option<Instant> = None;
    // Pause and resume lines, at most one per LOG_EVERY (one is owed when a
    // change came sooner; a long pause is reported every LOG_EVERY).
    let mut last_state_log: Option<Instant> = None;
    let mut state_log_owed = false;
    let mut paused_since: Option<Instant> = None;
    let mut listener: Option<ListenerFd> = None;
    // Whether UCX accepts, as this thread last saw it: the gate may pause
    // the listener from UCX's thread meanwhile.
    let mut accepting = true;
    let mut pressure = false;
    // The first look comes at once: it finds the listener, which the guard
    // must know to pause it.
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        if !first {
            std::thread::park_timeout(if pressure { SCAN_UNDER_PRESSURE } else { SCAN_EVERY });
        }
        first = false;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let now = Instant::now();
        let gated_pause = gate.as_ref().is_some_and(|g| g.paused());
        if accepting && gated_pause {
            // Paused by the gate, inside UCX's accept.
            accepting = false;
            pauses_since_log += 1;
            TransportStats::inc(&shared.stats.listener_pauses);
        }
        let table = match own.scan() {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!("listing our descriptors: {e}");
                continue;
            }
        };
        let live: std::collections::HashSet<u64> = table.sockets.iter().map(|&(i, _)| i).collect();
        settled.retain(|ino| live.contains(ino));
        seen.retain(|ino, _| live.contains(ino));
        if listener.is_some_and(|(_, ino)| !live.contains(&ino)) {
            listener = None;
        }
        let mut resets_this_scan = 0usize;
        let mut pending: Vec<(u64, i32, Instant)> = Vec::new();
        // Connections in the listener's accept queue (TCP_INFO of a
        // listening socket reports its queue length as `tcpi_unacked`).
        let mut queued = 0usize;
        for &(ino, fd) in &table.sockets {
            if settled.contains(&ino) {
                continue;
            }
            let p = match own.probe(fd, ino) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    settled.insert(ino); // not TCP, or gone
                    continue;
                }
                Err(_) => continue,
            };
            if p.local_port != port {
                settled.insert(ino);
                continue;
            }
            if p.state == TCP_LISTEN {
                if listener.is_none() {
                    if let Some(g) = &gate {
                        g.set_listener(fd);
                    }
                }
                listener = Some((fd, ino));
                queued = p.unacked_segments as usize;
                continue;
            }
            if p.bytes_acked > 0 || p.unacked_segments > 0 {
                settled.insert(ino);
                continue;
            }
            if p.state != TCP_ESTABLISHED && p.state != TCP_CLOSE_WAIT {
                continue; // a socket on its way out
            }
            let fresh = !seen.contains_key(&ino);
            let e = seen.entry(ino).or_insert(Seen { first_seen: now, last_rx: p.unread, still: 0, last_count: now });
            if fresh {
                // First sighting: nothing to compare with yet.
            } else if p.unread != e.last_rx {
                e.still = 0;
                e.last_rx = p.unread;
                e.last_count = now;
            } else if now.duration_since(e.last_count) >= SCAN_EVERY {
                e.still += 1;
                e.last_count = now;
            }
            let consumed = p.bytes_received.saturating_sub(u64::from(p.unread));
            match judge(now.duration_since(e.first_seen), p.unread, consumed, e.still, deadline) {
                Verdict::Keep => pending.push((ino, fd, e.first_seen)),
                _ if resets_this_scan < MAX_RESETS_PER_SCAN => {
                    resets_this_scan += 1;
                    if reset(&mut own, fd, ino, shared) {
                        reset_since_log += 1;
                    }
                }
                _ => {}
            }
        }
        let crowded = pending.len() > MAX_PENDING_HANDSHAKES;
        if crowded {
            // Oldest first: a genuine handshake completes within
            // milliseconds, so the sockets that have waited longest are the
            // flood's, and a client arriving during a flood gets through.
            pending.sort_by_key(|&(_, _, t)| t);
            let excess = (pending.len() - MAX_PENDING_HANDSHAKES).min(MAX_RESETS_PER_SCAN - resets_this_scan);
            for &(ino, fd, _) in &pending[..excess] {
                if reset(&mut own, fd, ino, shared) {
                    reset_since_log += 1;
                }
            }
        }
        // Descriptors left below the limit the listener may fill (the
        // gate's soft limit, whatever the soft limit is now): stop UCX
        // accepting before the table is full.
        let limit = acceptgate::limits().map(|(s, _)| s as usize).or_else(descriptor_limit);
        let free = limit.map_or(usize::MAX, |l| l.saturating_sub(table.open));
        let want = should_accept(free, accepting, queued, crowded);
        if want != accepting {
            if let Some((fd, ino)) = listener {
                let done = match (&gate, want) {
                    (Some(g), false) => g.pause(&mut own, fd, ino),
                    (Some(g), true) => g.resume(&mut own, fd, ino),
                    (None, on) => own.set_accepting(fd, ino, on),
                };
                match done {
                    Ok(true) => {
                        accepting = want;
                        if !want {
                            pauses_since_log += 1;
                            TransportStats::inc(&shared.stats.listener_pauses);
                        }
                    }
                    Ok(false) => listener = None,
                    Err(e) => tracing::warn!(
                        "port {port}: could not {} the listener: {e}",
                        if want { "resume" } else { "pause" }
                    ),
                }
            }
        }
        // UCX's data listener, paused by the gate at a full table: resumed
        // once descriptors are free below the hard limit again.
        if acceptgate::others_paused() {
            let hard_free = acceptgate::limits().map_or(0, |(_, h)| (h as usize).saturating_sub(table.open));
            if hard_free >= LOW_WATER {
                let n = acceptgate::resume_others(&mut own);
                tracing::debug!("UCX's data listener accepts again ({n} resumed): {} descriptors open", table.open);
            }
        }
        shared.stats.listener_paused.store(u64::from(!accepting), Ordering::Relaxed);
        // Paused with nobody queued, or with nothing this look could reset
        // (the table shrinks only as the server finishes with its own
        // descriptors): nothing to hurry for, so a server short of
        // descriptors for long is not scanned 20 times a second.
        pressure = crowded || (!accepting && queued > 0 && resets_this_scan > 0);
        let counts = acceptgate::take_counts();
        for (c, n) in [
            (&shared.stats.accepts_refused, counts.refused + counts.short),
            (&shared.stats.accepts_from_reserve, counts.rescued),
        ] {
            c.fetch_add(n, Ordering::Relaxed);
        }
        gate_since_log.refused += counts.refused;
        gate_since_log.rescued += counts.rescued;
        gate_since_log.short += counts.short;
        // Pause and resume, said at most once per LOG_EVERY, and a pause
        // that lasts said again every LOG_EVERY.
        let changed = accepting == paused_since.is_some();
        if changed {
            paused_since = if accepting { None } else { Some(now) };
            state_log_owed = true;
        }
        let due = last_state_log.is_none_or(|t| now.duration_since(t) >= LOG_EVERY);
        if due && (state_log_owed || paused_since.is_some()) {
            let lim = match acceptgate::limits() {
                Some((s, h)) => format!("{s}, {} more kept for UCX's data listener", h - s),
                None => limit.map_or("none".to_string(), |l| l.to_string()),
            };
            match paused_since {
                Some(t) => tracing::warn!(
                    "port {port}: UCX's accepting is paused (for {:.1} s): {} descriptors open, limit {lim}; \
                     it resumes at {HIGH_WATER} free once the {queued} queued connection(s) fit or nothing is \
                     left to reset",
                    now.duration_since(t).as_secs_f64(),
                    table.open
                ),
                None => tracing::warn!("port {port}: UCX accepts again: {} descriptors open, limit {lim}", table.open),
            }
            state_log_owed = false;
            last_state_log = Some(now);
        }
        let g = gate_since_log;
        let something = reset_since_log + pauses_since_log + g.refused + g.rescued + g.short > 0;
        if something && last_log.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
            tracing::warn!(
                "port {port}: reset {reset_since_log} connection(s) that never completed a UCX handshake \
                 (garbage, stalled, or too many at once); descriptors ran short {pauses_since_log} time(s) \
                 (UCX stops accepting below {LOW_WATER} free: {} open now); {} accept(s) on this listener \
                 refused at the limit, {} on UCX's data listener served from the reserve, {} refused there \
                 with the reserve full (UCX retries)",
                table.open,
                g.refused,
                g.rescued,
                g.short
            );
            reset_since_log = 0;
            pauses_since_log = 0;
            gate_since_log = acceptgate::GateCounts::default();
            last_log = Some(now);
        }
    }
    shared.stats.listener_paused.store(0, Ordering::Relaxed);
    // `gate` drops here, before the listener (SockGuard's contract).
}

/// The process's soft descriptor limit, if it has one.
fn descriptor_limit() -> Option<usize> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.map(|c| c as usize)
}

fn reset(own: &mut OwnSockets, fd: i32, inode: u64, shared: &Shared) -> bool {
    match own.abort(fd, inode) {
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
    use dafne_ucx::sockets::socket_inode;

    #[test]
    fn socket_links() {
        assert_eq!(socket_inode("socket:[123456]"), Some(123456));
        for bad in ["", "socket:[]", "socket:[12", "pipe:[5]", "/dev/null", "socket:[-1]"] {
            assert_eq!(socket_inode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn accepting_has_hysteresis_and_waits_for_room_for_the_queue() {
        assert!(should_accept(LOW_WATER, true, 1000, true));
        assert!(!should_accept(LOW_WATER - 1, true, 0, false));
        assert!(!should_accept(HIGH_WATER - 1, false, 0, false));
        assert!(should_accept(HIGH_WATER, false, 0, false));
        assert!(!should_accept(0, true, 0, false));
        // Paused with resets still to do: resume only if the queue fits.
        assert!(!should_accept(500, false, 500, true));
        assert!(should_accept(600, false, 500, true));
        // Nothing left to reset: resume whatever the queue.
        assert!(should_accept(HIGH_WATER, false, 4000, false));
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
