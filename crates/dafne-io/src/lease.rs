//! The lease an io server holds from the metadata server (docs/REPLICATION.md,
//! "Membership: leases held from meta"): a server cut off from meta stops
//! serving data within [`MEMBER_LEASE`].
//!
//! Who holds one: an io server that joined meta (`--meta`, so it sends
//! heartbeats: [`crate::heartbeat`]). A server started without a meta to
//! join holds none and serves as before.
//!
//! Its length is [`MEMBER_LEASE`] (3 s), the deadline after which meta
//! counts the server `down`, so both sides agree. It runs from when the
//! heartbeat that meta answered successfully was *sent* (monotonic time),
//! not from when the answer came: meta counts from when it received the
//! heartbeat, which is later, so the server's lease always ends no later
//! than meta's view of it ([`Lease::grant`]). An answer that comes late
//! (meta stopped and resumed) extends nothing beyond its heartbeat's
//! sent-time + L. The heartbeat thread publishes the expiry as nanoseconds
//! since the lease was made, in an atomic that the service reads once per
//! request ([`Lease::held`]).
//!
//! What is refused while the lease has lapsed (and before the first
//! heartbeat meta answered): every request that reads or changes file data
//! or state — `Read`, `Write`, `Truncate`, `Allocate`, `Sync`, `Stat` and
//! `Remove` — with [`NOT_SERVING`], decided before anything else of the
//! request is done (`crate::service`, `IoService::serve`): a refused
//! request had no effect, so a client may send it again whatever it is.
//! A `Read` or `Write` whose keys follow (FRRWP) is refused before it is
//! parked (its `Keys` then finds nothing, `ENOENT`), and one parked before
//! the lapse checks the lease again once its keys came, before it takes a
//! unit. Still answered: `Login` (it only keys the connection),
//! `ServerInfo` (capacity and counters, for `statfs` and `dafne status`,
//! which should show a server cut off from meta), `Keys` (it only hands
//! keys to a parked request, which checks the lease itself), `Revoke`
//! (meta's signed revocations only ever make the server refuse more) and
//! `Scrub` (it reads the device to verify checksums and answers positions
//! of bad blocks, not file bytes; a scrub that repairs, when built, must
//! check the lease).
//!
//! The lease is checked when a request is admitted (and, for a parked
//! one, when its keys came), not again while it runs: a request admitted
//! before the lapse completes after it, taking its units, moving its bytes
//! by RMA (each batch bounded by the transport's call timeout, 30 s) and
//! committing them. So "stops serving within L" holds for requests that
//! arrive after the lapse; one already under way when it came may still
//! change the file later. Meta acting on a lapse (moving a chain's head,
//! docs/REPLICATION.md) must allow for that (a margin past L longer than
//! such a request, or a check of the lease before each commit).
//!
//! Chain versions: meta's answer to a heartbeat carries the version of
//! each chain that holds this server (`dafne_proto::Response::Heartbeat`);
//! the lease keeps the last ones answered ([`Lease::chains`]) and the
//! server reports them, with whether the lease holds, in `ServerInfo`
//! (`dafne status`) and on its metrics page (`dafne_io_chain_version`).
//! `ServerInfo` tells a lease never granted yet (`pending`: the server
//! joined and waits for meta's first answer) from one that lapsed
//! ([`Lease::state`]); both refuse data requests alike.
//! Data requests are checked against them ([`crate::chaincheck`]). They
//! are kept before the lease is extended, so a request admitted under
//! the new lease is checked against the new versions.
//!
//! Logged once each, not per request: the lapse at warn (by a watcher
//! thread, so it shows even with no request coming) and the lease granted
//! again at info. Refusals are counted (`dafne_io_lease_refusals_total` on
//! the metrics page) and the state shown (`dafne_io_serving`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dafne_proto::{ChainRoute, ChainVersion, Errno, MEMBER_LEASE};

/// What an io server answers a data request while its lease has lapsed:
/// "not serving now, try again" ([`dafne_proto::io::NOT_SERVING`]).
/// `ENOTCONN` (not connected... to meta): no other io answer uses it, so
/// a client tells it from every other error. The client library sends
/// such a request again, as one whose connection was lost, until its
/// retry deadline (`dafne_client::data`, "Riding over a restart"), then
/// fails it with `EIO`.
pub const NOT_SERVING: Errno = dafne_proto::io::NOT_SERVING;

/// The lease of one io server (module docs).
#[derive(Debug)]
pub struct Lease {
    /// What expiries count from.
    epoch: Instant,
    /// When the lease ends, in nanoseconds since `epoch`; 0: never granted.
    expiry_ns: AtomicU64,
    /// Its length ([`MEMBER_LEASE`]; shorter in unit tests).
    length: Duration,
    /// The lapse was logged and not yet the grant after it.
    lapse_logged: AtomicBool,
    /// Granted at least once (the first grant is logged as such).
    granted_once: AtomicBool,
    /// The chain versions of meta's last answer (module docs).
    chains: Mutex<Vec<ChainVersion>>,
    /// This server's place in each of its chains (protocol 19): head or
    /// not, and where it forwards the chain's writes (`crate::forward`).
    routes: Mutex<Vec<ChainRoute>>,
}

impl Default for Lease {
    fn default() -> Self {
        Lease::new()
    }
}

impl Lease {
    /// A lease never granted: [`Lease::held`] is false until the first
    /// [`Lease::grant`].
    pub fn new() -> Lease {
        Lease::with_length(MEMBER_LEASE)
    }

    fn with_length(length: Duration) -> Lease {
        Lease {
            epoch: Instant::now(),
            expiry_ns: AtomicU64::new(0),
            length,
            lapse_logged: AtomicBool::new(false),
            granted_once: AtomicBool::new(false),
            chains: Mutex::new(Vec::new()),
            routes: Mutex::new(Vec::new()),
        }
    }

    /// Keeps the chain versions of meta's answer to a heartbeat (module
    /// docs); the heartbeat thread sends one heartbeat at a time, so the
    /// last kept is the newest answer's.
    pub fn set_chains(&self, chains: Vec<ChainVersion>, routes: Vec<ChainRoute>) {
        // Routes first: a request checked against the new versions finds
        // the routes that came with them.
        *self.routes.lock().unwrap_or_else(|p| p.into_inner()) = routes;
        *self.chains.lock().unwrap_or_else(|p| p.into_inner()) = chains;
    }

    /// Whether this server shares a chain with another server now (meta's
    /// last routes: it heads one with a successor, or follows a head):
    /// then a request that changes data without naming its chain is
    /// refused (`crate::service`), as it would reach one replica only.
    pub fn replicated(&self) -> bool {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|r| !r.head || r.successor.is_some())
    }

    /// This server's route in `chain`, from meta's last answer (`None`:
    /// it holds no replica of it, or meta sent no routes).
    pub fn route(&self, chain: u32) -> Option<ChainRoute> {
        let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        routes.binary_search_by_key(&chain, |c| c.chain).ok().map(|i| routes[i])
    }

    /// The chain versions of meta's last answer (empty before the first).
    pub fn chains(&self) -> Vec<ChainVersion> {
        self.chains.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The version of `chain` in meta's last answer; `None` when it did
    /// not name it (this server holds no replica of it): what a data
    /// request's chain is checked against ([`crate::chaincheck`]).
    pub fn chain_version(&self, chain: u32) -> Option<u64> {
        let chains = self.chains.lock().unwrap_or_else(|p| p.into_inner());
        chains.binary_search_by_key(&chain, |c| c.chain).ok().map(|i| chains[i].version)
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Meta answered successfully a heartbeat sent at `sent`: the lease
    /// runs until `sent` + L (never shortened by an older heartbeat's
    /// answer coming after a newer one's). Logs at info when the lease was
    /// lapsed and is held again.
    pub fn grant(&self, sent: Instant) {
        let until = self.nanos(sent).saturating_add(u64::try_from(self.length.as_nanos()).unwrap_or(u64::MAX));
        self.expiry_ns.fetch_max(until, Ordering::AcqRel);
        if !self.held_at(Instant::now()) {
            // A late answer: nothing gained.
            return;
        }
        if !self.granted_once.swap(true, Ordering::AcqRel) {
            tracing::info!("lease from meta granted: serving data requests");
        } else if self.lapse_logged.swap(false, Ordering::AcqRel) {
            tracing::info!("lease from meta granted again: serving data requests again");
        }
    }

    /// Whether the lease holds at `now`.
    pub fn held_at(&self, now: Instant) -> bool {
        self.nanos(now) < self.expiry_ns.load(Ordering::Acquire)
    }

    /// What `ServerInfo` reports of it now: [`dafne_proto::LEASE_HELD`]
    /// while it holds, [`dafne_proto::LEASE_PENDING`] before the first
    /// grant (waiting for meta's first answer), [`dafne_proto::LEASE_LAPSED`]
    /// after one (module docs).
    pub fn state(&self) -> u64 {
        if self.held() {
            dafne_proto::LEASE_HELD
        } else if self.granted_once.load(Ordering::Acquire) {
            dafne_proto::LEASE_LAPSED
        } else {
            dafne_proto::LEASE_PENDING
        }
    }

    /// Whether the lease holds now (one atomic load and a clock read).
    pub fn held(&self) -> bool {
        self.held_at(Instant::now())
    }

    /// Logs the lapse at warn if the lease was held and is no more, once
    /// per lapse; returns whether it logged.
    pub fn log_if_lapsed(&self, now: Instant) -> bool {
        if self.held_at(now) || !self.granted_once.load(Ordering::Acquire) {
            return false;
        }
        if self.lapse_logged.swap(true, Ordering::AcqRel) {
            return false;
        }
        tracing::warn!(
            "lease from meta lapsed (no heartbeat answered for {} s): refusing data requests ({}) until meta \
             answers again",
            self.length.as_secs(),
            NOT_SERVING
        );
        true
    }

    /// Starts the thread that logs a lapse when it happens (the heartbeat
    /// thread may be waiting for an answer then); it ends within 100 ms of
    /// `stop` being raised.
    pub fn watch(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
        let lease = self.clone();
        std::thread::Builder::new().name("lease".into()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                lease.log_if_lapsed(Instant::now());
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Duration = Duration::from_secs(3);

    #[test]
    fn a_lease_never_granted_is_not_held() {
        let l = Lease::with_length(L);
        assert!(!l.held());
        assert!(!l.log_if_lapsed(Instant::now()), "nothing lapsed before the first grant");
    }

    /// Issue 13 step 2 review: `ServerInfo` showed a server that never
    /// had a lease as `lapsed`. Failed before: no `state` told them apart.
    #[test]
    fn the_reported_state_tells_waiting_for_the_first_lease_from_a_lapse() {
        let l = Lease::with_length(Duration::from_millis(50));
        assert_eq!(l.state(), dafne_proto::LEASE_PENDING);
        // An answer too late to hold grants nothing: still waiting.
        std::thread::sleep(Duration::from_millis(60));
        l.grant(l.epoch);
        assert_eq!(l.state(), dafne_proto::LEASE_PENDING);
        l.grant(Instant::now());
        assert_eq!(l.state(), dafne_proto::LEASE_HELD);
        let deadline = Instant::now() + Duration::from_secs(30);
        while l.held() {
            assert!(Instant::now() < deadline, "a 50 ms lease still held");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(l.state(), dafne_proto::LEASE_LAPSED);
    }

    #[test]
    fn the_lease_runs_from_the_heartbeat_sent_not_from_its_answer() {
        let l = Lease::with_length(L);
        let sent = l.epoch + Duration::from_secs(10);
        l.grant(sent);
        assert!(l.held_at(sent));
        assert!(l.held_at(sent + L - Duration::from_millis(1)));
        assert!(!l.held_at(sent + L), "the lease ends at sent + L");
        assert!(!l.held_at(sent + L + Duration::from_secs(1)));
    }

    #[test]
    fn a_late_answer_extends_nothing_beyond_its_sent_time() {
        let l = Lease::with_length(L);
        let t0 = l.epoch + Duration::from_secs(100);
        l.grant(t0 + Duration::from_secs(2));
        // The answer of an older heartbeat, arriving after a newer one's:
        // the lease is not shortened.
        l.grant(t0);
        assert!(l.held_at(t0 + Duration::from_secs(4)));
        assert!(!l.held_at(t0 + Duration::from_secs(5)));
        // However late the answer came, the lease is what it was sent for.
        l.grant(t0 + Duration::from_secs(1));
        assert!(!l.held_at(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn a_heartbeat_answered_after_its_lease_ended_grants_nothing_now() {
        let l = Lease::with_length(Duration::from_millis(1));
        // Sent "long" ago (the lease of 1 ms is over by now).
        let sent = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        l.grant(sent);
        assert!(!l.held(), "an answer after sent + L grants nothing");
        assert!(!l.granted_once.load(Ordering::Relaxed), "nor counts as granted");
    }

    #[test]
    fn a_lapse_is_logged_once_and_a_grant_again_rearms_it() {
        let l = Lease::with_length(L);
        let now = Instant::now();
        l.grant(now);
        assert!(l.granted_once.load(Ordering::Relaxed));
        assert!(!l.log_if_lapsed(now), "held: nothing to log");
        assert!(l.log_if_lapsed(now + L));
        assert!(!l.log_if_lapsed(now + L + Duration::from_secs(1)), "logged once per lapse");
        l.grant(Instant::now());
        assert!(!l.lapse_logged.load(Ordering::Relaxed), "granted again: the next lapse is logged");
    }
}
