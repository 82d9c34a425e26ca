//! Serving the mount over FUSE-over-io_uring, with the classic
//! `/dev/fuse` workers beside it.
//!
//! # Why
//! Classic FUSE costs two system calls per request (`read` and `writev`
//! on `/dev/fuse`) and one shared queue for all CPUs. With the kernel's
//! FUSE ring (Linux ≥ 6.14, module parameter `fuse.enable_uring`), a
//! request is a completion on a ring entry of the issuing CPU's queue, and
//! its reply plus the wait for the next request is one `io_uring_enter`.
//!
//! # Shape
//! * [`Uring`] is the choice (`--fuse-uring auto|on|off`); [`decide`] reads
//!   the kernel parameter and probes io_uring *before* the mount, since a
//!   connection that agreed to the ring holds every request until the ring
//!   is registered.
//! * One thread per ring entry: `threads` threads for each queue (one
//!   queue per possible CPU; fewer beyond 8 queues, [`threads_per_queue`]),
//!   each with its own io_uring and one entry (`dafne_uring::fuse`). A thread takes a request, dispatches it inline
//!   through fuser's [`fuser::Dispatcher`] (the vendored patch), waits for
//!   its reply (which a lock wait sends from another thread) and commits it. One entry per thread means the kernel never
//!   queues a request behind a busy thread while another is idle.
//! * The classic workers still read `/dev/fuse`: FORGET and INTERRUPT
//!   always come that way, and so does everything if the ring is refused.
//!   A registration that fails after INIT agreed is followed by one the
//!   kernel always refuses (`FuseRing::refuse_registration`): only a
//!   refused registration sets the connection back to `/dev/fuse`, and
//!   until then the kernel holds every request.
//! * Counters: requests served by the ring and by `/dev/fuse` go to the
//!   stats file (`fuse_requests_ring`, `fuse_requests_dev`).
//!
//! * A request whose reply comes later from another thread (an `F_SETLKW`
//!   that waits) keeps its ring entry busy until then: the kernel has no
//!   way to take a request back from an entry. So that the queue keeps its
//!   capacity (the unlock that frees the wait may come on the same CPU),
//!   the thread that finds its reply deferred starts a spare entry on its
//!   queue whenever fewer than `threads` of the queue's entries are free
//!   of deferred replies ([`Spares`]). The kernel has no unregistration:
//!   a spare stays until the unmount and serves like the others.
//!
//! # Limits
//! Spares are bounded per mount by [`crate::fuse::MAX_LOCK_WAITERS`], the
//! bound on deferred replies (a lock wait beyond it gets `ENOLCK` at once),
//! so a queue can always serve while lock waits are deferred. Each spare
//! holds a thread and a payload buffer (`max_write`, 1 MiB, of which only
//! what a request uses is touched).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use dafne_uring::fuse::{FuseReplier, FuseRing, FuseRingError};

use crate::fuse::FuseFs;

/// Where the kernel's switch for FUSE over io_uring is.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the mount uses FUSE over io_uring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Uring {
    /// The ring if the kernel offers it, else classic (with one info line).
    #[default]
    Auto,
    /// The ring, or no mount.
    On,
    /// Classic `/dev/fuse` only.
    Off,
}

impl std::str::FromStr for Uring {
    type Err = String;
    fn from_str(s: &str) -> Result<Uring, String> {
        match s {
            "auto" => Ok(Uring::Auto),
            "on" => Ok(Uring::On),
            "off" => Ok(Uring::Off),
            _ => Err(format!("--fuse-uring takes auto, on or off, not {s:?}")),
        }
    }
}

impl std::fmt::Display for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Uring::Auto => "auto",
            Uring::On => "on",
            Uring::Off => "off",
        })
    }
}

/// What the kernel offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// Parameter Y and io_uring works.
    Yes,
    /// Why not, in words for the user.
    No(String),
}

/// Reads the kernel parameter and probes io_uring with 128-byte SQEs.
pub fn offer() -> Offer {
    match std::fs::read_to_string(ENABLE_URING) {
        Err(_) => Offer::No(format!("this kernel has no FUSE over io_uring ({ENABLE_URING} is missing; Linux 6.14 or later built with CONFIG_FUSE_IO_URING)")),
        Ok(v) if v.trim() != "Y" => Offer::No(format!(
            "FUSE over io_uring is off in this kernel ({ENABLE_URING} is {}); as root: echo Y > {ENABLE_URING}",
            v.trim()
        )),
        Ok(_) => match FuseRing::probe() {
            Ok(()) => Offer::Yes,
            Err(e) => Offer::No(format!("io_uring cannot be set up here: {e}")),
        },
    }
}

/// The choice for one mount: ask the kernel for the ring or not. `Err`
/// (with the reason) when `on` cannot be honoured.
pub fn decide(mode: Uring) -> Result<bool, String> {
    match (mode, offer()) {
        (Uring::Off, _) => Ok(false),
        (_, Offer::Yes) => Ok(true),
        (Uring::On, Offer::No(why)) => Err(why),
        (Uring::Auto, Offer::No(why)) => {
            tracing::info!("serving the mount through /dev/fuse: {why}");
            Ok(false)
        }
    }
}

/// How many queues the kernel makes: one per possible CPU.
pub fn queues() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    parse_cpu_list(text.trim()).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The kernel's page size (`AT_PAGESZ` from `/proc/self/auxv`), which the
/// kernel's max payload is counted in (`max_pages × PAGE_SIZE`): 4 KiB on
/// x86-64, 16 or 64 KiB on some arm64 kernels, where a payload counted in
/// 4 KiB pages would be too small and the registration refused.
pub fn page_size() -> usize {
    std::fs::read("/proc/self/auxv").ok().and_then(|a| auxv_page_size(&a)).unwrap_or(4096)
}

/// `AT_PAGESZ` (6) in an auxiliary vector of native-endian `usize` pairs.
pub fn auxv_page_size(auxv: &[u8]) -> Option<usize> {
    const W: usize = std::mem::size_of::<usize>();
    let word = |c: &[u8]| c.try_into().ok().map(usize::from_ne_bytes);
    auxv.chunks_exact(2 * W)
        .map(|p| (word(&p[..W]), word(&p[W..])))
        .take_while(|(k, _)| *k != Some(0))
        .find_map(|(k, v)| if k == Some(6) { v.filter(|v| v.is_power_of_two()) } else { None })
}

/// `0-3,5` → 6 (highest + 1, as the kernel's `num_possible_cpus` for a
/// contiguous list; a gap only adds idle queues we register anyway).
pub fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut max = None::<usize>;
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let hi = part.rsplit('-').next()?.trim().parse::<usize>().ok()?;
        max = Some(max.map_or(hi, |m| m.max(hi)));
    }
    max.map(|m| m + 1)
}

/// Ring threads per queue for `threads` (`--threads`): as many as
/// `threads`, so that one CPU's processes get as many concurrent handlers
/// as the classic workers give, while there are at most 8 queues; beyond
/// that fewer, down to one, so that all queues together have at most
/// `8 × threads` threads (each holds a payload buffer of `max_write`, 1 MiB).
pub fn threads_per_queue(threads: usize, queues: usize) -> usize {
    let threads = threads.max(1);
    threads.min(threads * 8 / queues.max(1)).max(1)
}

/// Requests served per path.
#[derive(Debug, Default)]
pub struct RequestCounters {
    pub ring: Arc<AtomicU64>,
    pub dev: Arc<AtomicU64>,
}

/// The reply sink fuser gets for a ring request.
#[derive(Debug)]
struct RingSink(FuseReplier);

impl fuser::ReplySink for RingSink {
    fn send(&self, data: &[std::io::IoSlice<'_>]) -> std::io::Result<()> {
        self.0.reply(data)
    }
}

/// Spare ring entries: what a ring thread needs to start one on its
/// queue, and how many of each queue's entries are free of a deferred reply.
#[derive(Debug)]
struct Spares {
    dev: OwnedFd,
    payload: usize,
    /// Entries per queue that should be free of deferred replies.
    per_queue: usize,
    /// Per queue: registered entries not holding a deferred reply.
    free: Vec<AtomicUsize>,
    /// Spares started on this mount (at most `MAX_LOCK_WAITERS`).
    started: AtomicUsize,
    count: Arc<AtomicU64>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Spares {
    /// The request just dispatched on queue `qid` waits for a later reply:
    /// one entry fewer is free; start a spare if the queue is now short.
    fn deferred(self: &Arc<Self>, qid: u16, d: &fuser::Dispatcher<FuseFs>) {
        let Some(free) = self.free.get(usize::from(qid)) else { return };
        let now = free.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        if now >= self.per_queue {
            return;
        }
        if self.started.fetch_add(1, Ordering::AcqRel) >= crate::fuse::MAX_LOCK_WAITERS {
            self.started.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let ring = self
            .dev
            .try_clone()
            .map_err(|e| format!("duplicating /dev/fuse: {e}"))
            .and_then(|fd| FuseRing::new(fd, qid, self.payload).map_err(|e| e.to_string()));
        let mut ring = match ring {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("FUSE ring queue {qid}: no spare entry for a deferred reply: {e}");
                return;
            }
        };
        let (me, d) = (self.clone(), d.clone());
        let spawned =
            std::thread::Builder::new().name(format!("fuse-ring-{qid}.s")).spawn(move || match ring.register() {
                Ok(()) => {
                    me.free[usize::from(qid)].fetch_add(1, Ordering::AcqRel);
                    let (tx, rx) = mpsc::channel();
                    let _ = tx.send(d);
                    serve_ring(ring, rx, &me);
                }
                Err(e) => tracing::warn!("FUSE ring queue {qid}: registering a spare entry: {e}"),
            });
        match spawned {
            Ok(h) => self.handles.lock().unwrap_or_else(|p| p.into_inner()).push(h),
            Err(e) => tracing::warn!("FUSE ring queue {qid}: no thread for a spare entry: {e}"),
        }
    }

    /// The deferred reply on queue `qid` came: its entry is free again.
    fn answered(&self, qid: u16) {
        if let Some(free) = self.free.get(usize::from(qid)) {
            free.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The ring threads of one mount, registered and waiting for requests.
#[derive(Debug)]
pub struct RingThreads {
    handles: Vec<JoinHandle<()>>,
    dispatchers: Vec<mpsc::Sender<fuser::Dispatcher<FuseFs>>>,
    spares: Option<Arc<Spares>>,
}

impl RingThreads {
    /// Starts `per_queue` threads for each queue, each registering one
    /// entry of `payload` bytes on a duplicate of `dev`, and waits until
    /// every registration is done. The threads are returned also when one
    /// failed (the error beside them): an entry that did register may get
    /// requests and must be served. On a failure the connection is set back
    /// to `/dev/fuse` ([`FuseRing::refuse_registration`]), which the kernel
    /// does by itself when it refused a registration.
    pub fn start(
        dev: &OwnedFd,
        payload: usize,
        per_queue: usize,
        ring_count: Arc<AtomicU64>,
    ) -> (RingThreads, Result<(), String>) {
        let mut threads = RingThreads { handles: Vec::new(), dispatchers: Vec::new(), spares: None };
        let r = threads.spawn_all(dev, payload, per_queue, ring_count);
        if r.is_err() {
            match dev
                .try_clone()
                .map_err(|e| e.to_string())
                .and_then(|d| FuseRing::refuse_registration(d).map_err(|e| e.to_string()))
            {
                Ok(()) => {}
                Err(e) => tracing::error!("could not switch the mount back to /dev/fuse: {e}"),
            }
        }
        (threads, r)
    }

    fn spawn_all(
        &mut self,
        dev: &OwnedFd,
        payload: usize,
        per_queue: usize,
        ring_count: Arc<AtomicU64>,
    ) -> Result<(), String> {
        let nq = queues();
        let spares = Arc::new(Spares {
            dev: dev.try_clone().map_err(|e| format!("duplicating /dev/fuse: {e}"))?,
            payload,
            per_queue: per_queue.max(1),
            free: (0..nq).map(|_| AtomicUsize::new(0)).collect(),
            started: AtomicUsize::new(0),
            count: ring_count,
            handles: Mutex::new(Vec::new()),
        });
        self.spares = Some(spares.clone());
        let (done_tx, done_rx) = mpsc::channel::<Result<(), String>>();
        let mut started = 0;
        let mut first_err = None;
        'spawn: for qid in 0..nq {
            for i in 0..per_queue.max(1) {
                let ring = dev.try_clone().map_err(|e| format!("duplicating /dev/fuse: {e}")).and_then(|fd| {
                    let q = u16::try_from(qid).map_err(|_| format!("queue {qid} out of range"))?;
                    FuseRing::new(fd, q, payload).map_err(|e| e.to_string())
                });
                let mut ring = match ring {
                    Ok(r) => r,
                    Err(e) => {
                        first_err = Some(e);
                        break 'spawn;
                    }
                };
                let (tx, rx) = mpsc::channel();
                let done = done_tx.clone();
                let spares = spares.clone();
                let spawned = std::thread::Builder::new().name(format!("fuse-ring-{qid}.{i}")).spawn(move || {
                    let reg = ring.register();
                    let ok = reg.is_ok();
                    if ok {
                        spares.free[qid].fetch_add(1, Ordering::AcqRel);
                    }
                    let _ = done.send(reg.map_err(|e| e.to_string()));
                    if ok {
                        serve_ring(ring, rx, &spares);
                    }
                });
                match spawned {
                    Ok(h) => {
                        self.handles.push(h);
                        self.dispatchers.push(tx);
                        started += 1;
                    }
                    Err(e) => {
                        first_err = Some(format!("starting a ring thread: {e}"));
                        break 'spawn;
                    }
                }
            }
        }
        drop(done_tx);
        for _ in 0..started {
            match done_rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(format!("registering a FUSE ring entry: {e}"));
                }
                Err(_) => {
                    first_err.get_or_insert("a FUSE ring thread did not report its registration".into());
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Hands every thread the dispatcher (once the session runs).
    pub fn dispatch_with(&mut self, d: &fuser::Dispatcher<FuseFs>) {
        for tx in self.dispatchers.drain(..) {
            let _ = tx.send(d.clone());
        }
    }

    /// Waits for the threads (they end when the kernel tears the ring
    /// down at unmount).
    pub fn join(self) {
        drop(self.dispatchers);
        for h in self.handles {
            let _ = h.join();
        }
        // Spares end like the others; one may start another meanwhile.
        if let Some(spares) = self.spares {
            loop {
                let more: Vec<_> = std::mem::take(&mut *spares.handles.lock().unwrap_or_else(|p| p.into_inner()));
                if more.is_empty() {
                    break;
                }
                for h in more {
                    let _ = h.join();
                }
            }
        }
    }
}

/// One ring thread: wait, dispatch, commit, until the unmount.
fn serve_ring(mut ring: FuseRing, dispatcher: mpsc::Receiver<fuser::Dispatcher<FuseFs>>, spares: &Arc<Spares>) {
    let count = &spares.count;
    if let Err(e) = ring.wait() {
        log_end(&ring, &e);
        return;
    }
    // The first request may come before the session runs; wait for it.
    let Ok(d) = dispatcher.recv() else { return };
    loop {
        match ring.request() {
            Ok(req) => {
                count.fetch_add(1, Ordering::Relaxed);
                let sink: Arc<dyn fuser::ReplySink> = Arc::new(RingSink(req.replier()));
                if let Err(e) = d.dispatch(req.bytes(), sink) {
                    tracing::warn!("FUSE ring queue {}: {e}", ring.qid());
                }
                if !ring.answered() {
                    // Answered later from another thread (a lock wait):
                    // keep the queue's capacity meanwhile.
                    spares.deferred(ring.qid(), &d);
                    ring.wait_answered();
                    spares.answered(ring.qid());
                }
            }
            // Answered with EIO by `commit`.
            Err(e) => tracing::warn!("FUSE ring queue {}: {e}", ring.qid()),
        }
        if let Err(e) = ring.commit() {
            log_end(&ring, &e);
            return;
        }
    }
}

fn log_end(ring: &FuseRing, e: &FuseRingError) {
    if e.is_disconnected() {
        tracing::debug!("FUSE ring queue {}: unmounted", ring.qid());
    } else {
        tracing::error!("FUSE ring queue {} stopped: {e}", ring.qid());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_give_the_queue_count() {
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn big_machines_get_fewer_ring_threads_per_queue() {
        assert_eq!(threads_per_queue(4, 2), 4);
        assert_eq!(threads_per_queue(4, 8), 4);
        assert_eq!(threads_per_queue(4, 16), 2);
        assert_eq!(threads_per_queue(4, 64), 1);
        assert_eq!(threads_per_queue(0, 1), 1);
    }

    #[test]
    fn the_page_size_comes_from_the_auxiliary_vector() {
        let pair = |k: usize, v: usize| [k.to_ne_bytes(), v.to_ne_bytes()].concat();
        let auxv = [pair(33, 7), pair(6, 65536), pair(0, 0)].concat();
        assert_eq!(auxv_page_size(&auxv), Some(65536));
        assert_eq!(auxv_page_size(&[pair(33, 7), pair(0, 0), pair(6, 4096)].concat()), None);
        assert_eq!(auxv_page_size(&pair(6, 3000)), None);
        assert!(page_size() >= 4096 && page_size().is_power_of_two());
    }

    #[test]
    fn modes_parse() {
        assert_eq!("on".parse::<Uring>(), Ok(Uring::On));
        assert_eq!("auto".parse::<Uring>(), Ok(Uring::Auto));
        assert_eq!("off".parse::<Uring>(), Ok(Uring::Off));
        assert!("yes".parse::<Uring>().is_err());
    }
}
