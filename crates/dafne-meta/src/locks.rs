//! Byte-range locks across clients: POSIX `fcntl` locks, OFD locks and
//! `flock`, held by the metadata server (DAFS's locking, NFSv4's lock
//! state), so that a lock taken through one mount excludes a process on
//! another.
//!
//! # Owners, clients and leases
//! A lock belongs to an [`Owner`]: a *client* (a random 64-bit number the
//! client library draws when its session begins and keeps across
//! reconnects, so knowing it is the proof of being that client) and an
//! *owner* within it (for a FUSE mount the kernel's lock owner: a
//! process's file table for `fcntl` locks, the open file for OFD locks and
//! `flock`). The table remembers which connection last spoke for each
//! client. A client's locks live as long as that connection does, and for
//! a *lease* of `grace` after it ends: a client whose connection broke
//! reconnects, re-sends its locks as reclaims and keeps them; one that died
//! loses them when the lease runs out, and whoever waits for them is woken.
//!
//! # Waiting without polling
//! A request that may wait ([`dafne_proto::LOCK_WAIT`]) and cannot be
//! granted is queued on its file with the sender of its answer; the service
//! awaits the receiver, so the reply goes out the moment an unlock, a
//! lease's end or a dead waiter's removal lets the lock be granted. The
//! client sends such a request without a call timeout (its transport's
//! keepalive still notices a dead server). A waiter whose connection ends
//! is dropped (its client re-sends after reconnecting).
//!
//! # Fairness and deadlock
//! Waiters of a file are served in order: a request that may wait is
//! granted only if no other owner's held lock conflicts with it *and* no
//! earlier waiter of another owner wants a conflicting range, so a waiting
//! writer is not starved by a stream of waiting readers. Exceptions: a
//! request does not yield to an earlier waiter that itself waits for a
//! lock the request's owner holds (an upgrade, or an extension next to a
//! held range, would otherwise close a cycle); and a request that may not
//! wait (`F_SETLK`) gets what POSIX says: granted unless a held lock
//! conflicts (what `F_GETLK` reports). A client's first try of a request
//! that will wait if it must (the mount tries `F_SETLKW` without waiting
//! first) carries [`dafne_proto::LOCK_FAIR`] and is judged as a waiting
//! one. Any grant (an unlock, but also a downgrade or a shrink) wakes the
//! file's waiters.
//! Before a request waits, the owners it would wait for (holders and, by
//! the rule above, earlier waiters) are followed through what *they* wait
//! for; if the chain comes back to the requester, the request fails with
//! `EDEADLK` instead (POSIX asks this of `F_SETLKW`; Linux's `flock` does
//! not detect deadlocks, and here `flock` is a whole-file lock like any
//! other, as on NFS).
//!
//! # After a restart
//! The table lives in memory. For `grace` after the server starts, only
//! reclaims ([`dafne_proto::LOCK_RECLAIM`]) and unlocks are judged; other
//! lock and test requests wait for the grace to end (the service holds them), so a
//! lock held before the restart is claimed back by its client before
//! anyone else can take its range. A reclaim that conflicts (another
//! client reclaimed an overlapping range: impossible unless a client lies)
//! fails with `EAGAIN`; a reclaim after the grace is granted when nothing
//! conflicts, like any lock.
//!
//! # Bounds
//! The lease is the server's open grace (`--open-grace-s`, 10 s by
//! default), and so is the grace after a start when it applies
//! (`crate::service`'s module docs, "Locks").
//!
//! A client holds at most [`MAX_RANGES_PER_CLIENT`] ranges and the server
//! [`MAX_RANGES`], an unlock that splits a range included (each range ≈
//! 24 B in its owner's list plus its share of the maps: about 100 B at
//! most, so 2²⁰ ranges ≤ 100 MiB); a connection speaks for at most
//! [`MAX_CLIENTS_PER_CONN`] client ids (a client id is made only by a
//! lock, never by a test or an unlock of nothing) and has at most
//! [`MAX_WAITERS_PER_CONN`] requests waiting (fewer than the transport's
//! 64 request credits, so waiting locks never starve the connection's
//! other requests), the server [`MAX_WAITERS`]. Past a bound a request
//! fails with `ENOLCK`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use dafne_proto::{Errno, Ino, LockHolder, LockKind, OwnerLocks};
use futures::channel::oneshot;

/// Most ranges one client may hold over all its files and owners.
pub const MAX_RANGES_PER_CLIENT: usize = 1 << 16;
/// Most ranges the server holds.
pub const MAX_RANGES: usize = 1 << 20;
/// Most lock requests one connection may have waiting.
pub const MAX_WAITERS_PER_CONN: usize = 16;
/// Most lock requests waiting on the server (the deadlock check walks
/// the waiters: at most 4096² steps, on the loop thread).
pub const MAX_WAITERS: usize = 1 << 12;
/// Most client ids one connection may speak for (a native client has one;
/// a hostile one must not grow the table of clients without bound).
pub const MAX_CLIENTS_PER_CONN: usize = 16;

/// Who holds a lock: a client and an owner within it (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    pub client: u64,
    pub owner: u64,
}

/// A lock or unlock request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRequest {
    pub ino: Ino,
    pub owner: Owner,
    pub pid: u32,
    pub start: u64,
    pub end: u64,
    pub kind: LockKind,
    pub wait: bool,
    pub reclaim: bool,
    /// Judged as a waiting request (fairness) though it does not wait
    /// ([`dafne_proto::LOCK_FAIR`]).
    pub fair: bool,
}

/// What became of a lock request.
#[derive(Debug)]
pub enum Outcome {
    /// Granted (or released) now.
    Done,
    /// Refused now (`EAGAIN`, `EDEADLK`, `ENOLCK`).
    Refused(Errno),
    /// Queued: the receiver gets the answer when it is decided.
    Wait(oneshot::Receiver<Result<(), Errno>>),
}

#[derive(Debug)]
struct Waiter {
    conn: u32,
    req: LockRequest,
    reply: oneshot::Sender<Result<(), Errno>>,
}

#[derive(Debug, Default)]
struct FileLocks {
    /// Every owner with ranges on this file (never an empty list).
    held: BTreeMap<Owner, OwnerLocks>,
    /// The pid of each owner's last lock here (for `F_GETLK`).
    pids: HashMap<Owner, u32>,
    waiters: VecDeque<Waiter>,
}

impl FileLocks {
    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.waiters.is_empty()
    }

    /// The first range of another owner that conflicts with `req`.
    fn held_conflict(&self, req: &LockRequest) -> Option<(Owner, LockHolder)> {
        self.held.iter().filter(|(o, _)| **o != req.owner).find_map(|(o, locks)| {
            locks.overlapping(req.start, req.end).iter().find(|r| r.kind.conflicts(req.kind)).map(|r| {
                let pid = self.pids.get(o).copied().unwrap_or(0);
                (*o, LockHolder { start: r.start, end: r.end, kind: r.kind, pid })
            })
        })
    }

    /// Whether waiting request `req` must yield to one of `earlier`
    /// (fairness, module docs): an earlier waiter of another owner that
    /// wants a conflicting range, unless that waiter itself waits for a
    /// lock `req`'s owner holds (yielding would close a cycle: an upgrade,
    /// an extension next to a held range).
    fn yields_to<'a>(&self, req: &LockRequest, mut earlier: impl Iterator<Item = &'a Waiter>) -> Option<Owner> {
        let mine = self.held.get(&req.owner);
        earlier
            .find(|w| {
                w.req.owner != req.owner
                    && w.req.start <= req.end
                    && req.start <= w.req.end
                    && w.req.kind.conflicts(req.kind)
                    && !mine.is_some_and(|l| {
                        l.overlapping(w.req.start, w.req.end).iter().any(|r| r.kind.conflicts(w.req.kind))
                    })
            })
            .map(|w| w.req.owner)
    }
}

#[derive(Debug, Default)]
struct Client {
    /// The connection that last spoke for this client; `None` once it ended.
    conn: Option<u32>,
    /// When its lease ends, once its connection has ended.
    expires: Option<Instant>,
    /// Files where it holds ranges.
    files: HashSet<Ino>,
    /// Ranges it holds.
    ranges: usize,
}

/// Every lock of the server (module docs).
#[derive(Debug)]
pub struct LockTable {
    grace: Duration,
    /// How long a client's locks outlive its connection.
    lease: Duration,
    started: Instant,
    files: HashMap<Ino, FileLocks>,
    clients: HashMap<u64, Client>,
    /// Clients each live connection speaks for.
    conns: HashMap<u32, HashSet<u64>>,
    ranges: usize,
    waiting: usize,
}

impl LockTable {
    /// An empty table for a server started at `now`.
    pub fn new(grace: Duration, now: Instant) -> LockTable {
        LockTable {
            grace,
            lease: grace,
            started: now,
            files: HashMap::new(),
            clients: HashMap::new(),
            conns: HashMap::new(),
            ranges: 0,
            waiting: 0,
        }
    }

    /// How long a client's locks outlive its connection (default: the
    /// grace given to [`Self::new`]).
    pub fn set_lease(&mut self, lease: Duration) {
        self.lease = lease;
    }

    /// When the first running lease ends.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.clients.values().filter_map(|c| c.expires).min()
    }

    /// Until when requests other than reclaims wait (module docs, "After
    /// a restart"); `None` once the grace is over.
    pub fn grace_until(&self, now: Instant) -> Option<Instant> {
        let end = self.started + self.grace;
        (now < end).then_some(end)
    }

    /// Ranges held, over every file.
    pub fn ranges(&self) -> usize {
        self.ranges
    }

    /// Requests waiting.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Connection `conn` speaks for `client` from now on (a reconnect
    /// moves it; a lease in progress ends). `ENOLCK` for a new client id
    /// past [`MAX_CLIENTS_PER_CONN`].
    fn bind(&mut self, conn: u32, client: u64) -> Result<(), Errno> {
        if !self.clients.contains_key(&client)
            && self.conns.get(&conn).is_some_and(|set| set.len() >= MAX_CLIENTS_PER_CONN)
        {
            return Err(Errno::ENOLCK);
        }
        let c = self.clients.entry(client).or_default();
        if c.conn != Some(conn) {
            if let Some(old) = c.conn {
                if let Some(set) = self.conns.get_mut(&old) {
                    set.remove(&client);
                }
            }
            c.conn = Some(conn);
            self.conns.entry(conn).or_default().insert(client);
        }
        c.expires = None;
        Ok(())
    }

    /// The first lock of another owner that conflicts with a `kind` lock
    /// over `start..=end` (`F_GETLK`); its pid only for the same client.
    pub fn test(&self, ino: Ino, owner: Owner, start: u64, end: u64, kind: LockKind) -> Option<LockHolder> {
        let req = LockRequest { ino, owner, pid: 0, start, end, kind, wait: false, reclaim: false, fair: false };
        let (holder, mut h) = self.files.get(&ino)?.held_conflict(&req)?;
        if holder.client != owner.client {
            h.pid = 0;
        }
        Some(h)
    }

    /// Takes, changes or releases a lock for connection `conn` (module docs).
    pub fn lock(&mut self, conn: u32, req: LockRequest) -> Outcome {
        if req.kind == LockKind::Unlock && !self.clients.contains_key(&req.owner.client) {
            return Outcome::Done; // nothing held, nothing to bind
        }
        if let Err(e) = self.bind(conn, req.owner.client) {
            return Outcome::Refused(e);
        }
        let file = self.files.entry(req.ino).or_default();
        let blocker = match file.held_conflict(&req) {
            _ if req.kind == LockKind::Unlock => None,
            Some((o, _)) => Some(o),
            // Fairness is for requests that wait (or will: LOCK_FAIR):
            // F_SETLK gets what POSIX says (and agrees with F_GETLK).
            None if req.reclaim || !(req.wait || req.fair) => None,
            None => file.yields_to(&req, file.waiters.iter()),
        };
        if blocker.is_none() {
            // Unlocks too: splitting a range adds one.
            if let Err(e) = self.room_for(&req) {
                self.drop_if_empty(req.ino);
                return Outcome::Refused(e);
            }
            self.set(req);
            // An unlock, a downgrade or a shrink may free bytes a waiter wants.
            self.wake(req.ino);
            return Outcome::Done;
        }
        if !req.wait || req.reclaim {
            self.drop_if_empty(req.ino);
            return Outcome::Refused(Errno::EAGAIN);
        }
        if self.deadlocks(&req) {
            self.drop_if_empty(req.ino);
            return Outcome::Refused(Errno::EDEADLK);
        }
        let conn_waiting = self.files.values().flat_map(|f| &f.waiters).filter(|w| w.conn == conn).count();
        if self.waiting >= MAX_WAITERS || conn_waiting >= MAX_WAITERS_PER_CONN {
            self.drop_if_empty(req.ino);
            return Outcome::Refused(Errno::ENOLCK);
        }
        let (tx, rx) = oneshot::channel();
        self.files.entry(req.ino).or_default().waiters.push_back(Waiter { conn, req, reply: tx });
        self.waiting += 1;
        Outcome::Wait(rx)
    }

    /// `ENOLCK` when granting `req` would pass a bound on ranges.
    fn room_for(&self, req: &LockRequest) -> Result<(), Errno> {
        let client = self.clients.get(&req.owner.client).map_or(0, |c| c.ranges);
        // A request adds at most two ranges (one split in three); only
        // near a bound is the exact count worth working out.
        if client + 2 <= MAX_RANGES_PER_CLIENT && self.ranges + 2 <= MAX_RANGES {
            return Ok(());
        }
        let file = self.files.get(&req.ino);
        let now = file.and_then(|f| f.held.get(&req.owner)).map_or(0, |l| l.ranges().len());
        let after = file.and_then(|f| f.held.get(&req.owner)).map_or(1, |l| l.len_after(req.start, req.end, req.kind));
        let grows = after.saturating_sub(now);
        if grows > 0 && (client + grows > MAX_RANGES_PER_CLIENT || self.ranges + grows > MAX_RANGES) {
            return Err(Errno::ENOLCK);
        }
        Ok(())
    }

    /// Applies `req` to its owner's ranges, keeping the counts.
    fn set(&mut self, req: LockRequest) {
        let Some(file) = self.files.get_mut(&req.ino) else {
            if req.kind == LockKind::Unlock {
                return;
            }
            self.files.insert(req.ino, FileLocks::default());
            return self.set(req);
        };
        let locks = file.held.entry(req.owner).or_default();
        let before = locks.ranges().len();
        locks.apply(req.start, req.end, req.kind);
        let after = locks.ranges().len();
        if locks.is_empty() {
            file.held.remove(&req.owner);
            file.pids.remove(&req.owner);
        } else if req.kind != LockKind::Unlock {
            file.pids.insert(req.owner, req.pid);
        }
        let client_holds_here = file.held.keys().any(|o| o.client == req.owner.client);
        self.ranges = self.ranges + after - before;
        let c = self.clients.entry(req.owner.client).or_default();
        c.ranges = c.ranges + after - before;
        if client_holds_here {
            c.files.insert(req.ino);
        } else {
            c.files.remove(&req.ino);
        }
        self.drop_if_empty(req.ino);
    }

    fn drop_if_empty(&mut self, ino: Ino) {
        if self.files.get(&ino).is_some_and(FileLocks::is_empty) {
            self.files.remove(&ino);
        }
    }

    /// Grants, in order, every waiter of `ino` that can be granted now;
    /// drops those whose requester is gone.
    fn wake(&mut self, ino: Ino) {
        let Some(file) = self.files.get_mut(&ino) else { return };
        let mut queue = std::mem::take(&mut file.waiters);
        let mut kept: VecDeque<Waiter> = VecDeque::with_capacity(queue.len());
        while let Some(w) = queue.pop_front() {
            if w.reply.is_canceled() {
                self.waiting -= 1;
                continue;
            }
            let file = self.files.entry(ino).or_default();
            let blocked = file.held_conflict(&w.req).is_some() || file.yields_to(&w.req, kept.iter()).is_some();
            if blocked {
                kept.push_back(w);
                continue;
            }
            self.waiting -= 1;
            match self.room_for(&w.req) {
                Ok(()) => {
                    self.set(w.req);
                    let _ = w.reply.send(Ok(()));
                }
                Err(e) => {
                    let _ = w.reply.send(Err(e));
                }
            }
        }
        self.files.entry(ino).or_default().waiters = kept;
        self.drop_if_empty(ino);
    }

    /// The owners `req` would wait for: holders of conflicting ranges, and
    /// earlier conflicting waiters it must yield to.
    fn blockers(&self, req: &LockRequest, earlier: &[&Waiter]) -> Vec<Owner> {
        let Some(file) = self.files.get(&req.ino) else { return Vec::new() };
        let mut out: Vec<Owner> = file
            .held
            .iter()
            .filter(|(o, l)| {
                **o != req.owner && l.overlapping(req.start, req.end).iter().any(|r| r.kind.conflicts(req.kind))
            })
            .map(|(o, _)| *o)
            .collect();
        out.extend(file.yields_to(req, earlier.iter().copied()));
        out
    }

    /// Whether `req` waiting would close a cycle of owners waiting for
    /// each other (module docs, "Fairness and deadlock").
    fn deadlocks(&self, req: &LockRequest) -> bool {
        let queue: Vec<&Waiter> = self.files.get(&req.ino).map(|f| f.waiters.iter().collect()).unwrap_or_default();
        let mut todo = self.blockers(req, &queue);
        let mut seen: HashSet<Owner> = HashSet::new();
        while let Some(o) = todo.pop() {
            if o == req.owner {
                return true;
            }
            if !seen.insert(o) {
                continue;
            }
            for file in self.files.values() {
                for (i, w) in file.waiters.iter().enumerate() {
                    if w.req.owner == o {
                        let earlier: Vec<&Waiter> = file.waiters.iter().take(i).collect();
                        todo.extend(self.blockers(&w.req, &earlier));
                    }
                }
            }
        }
        false
    }

    /// Connection `conn` ended at `now`: its waiters are dropped and the
    /// clients it spoke for start their lease. Returns when the lease ends
    /// (for [`Self::expire`]), if it spoke for any.
    pub fn disconnected(&mut self, conn: u32, now: Instant) -> Option<Instant> {
        let mut touched = Vec::new();
        for (ino, file) in self.files.iter_mut() {
            let before = file.waiters.len();
            file.waiters.retain(|w| w.conn != conn);
            if file.waiters.len() != before {
                self.waiting -= before - file.waiters.len();
                touched.push(*ino);
            }
        }
        // Later waiters may have yielded to those dropped.
        for ino in touched {
            self.wake(ino);
        }
        let clients = self.conns.remove(&conn)?;
        let until = now + self.lease;
        for id in clients {
            if let Some(c) = self.clients.get_mut(&id) {
                if c.conn == Some(conn) {
                    c.conn = None;
                    c.expires = Some(until);
                }
            }
        }
        Some(until)
    }

    /// Ends the leases that ran out by `now`: their clients' locks go, and
    /// their waiters are woken.
    pub fn expire(&mut self, now: Instant) {
        let gone: Vec<u64> =
            self.clients.iter().filter(|(_, c)| c.expires.is_some_and(|t| t <= now)).map(|(id, _)| *id).collect();
        for id in gone {
            let Some(c) = self.clients.remove(&id) else { continue };
            if c.ranges > 0 {
                tracing::info!(
                    "lock lease of client {id:#x} ended: {} range(s) on {} file(s) released",
                    c.ranges,
                    c.files.len()
                );
            }
            for ino in c.files {
                let Some(file) = self.files.get_mut(&ino) else { continue };
                let owners: Vec<Owner> = file.held.keys().filter(|o| o.client == id).copied().collect();
                for o in owners {
                    if let Some(l) = file.held.remove(&o) {
                        self.ranges -= l.ranges().len();
                    }
                    file.pids.remove(&o);
                }
                self.wake(ino);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockKind::{Read, Unlock, Write};

    const A: Owner = Owner { client: 1, owner: 10 };
    const B: Owner = Owner { client: 2, owner: 20 };
    const C: Owner = Owner { client: 3, owner: 30 };

    fn req(owner: Owner, start: u64, end: u64, kind: LockKind, wait: bool) -> LockRequest {
        LockRequest { ino: 5, owner, pid: owner.owner as u32, start, end, kind, wait, reclaim: false, fair: false }
    }

    fn table() -> LockTable {
        LockTable::new(Duration::from_secs(10), Instant::now() - Duration::from_secs(60))
    }

    fn granted(o: &Outcome) -> bool {
        matches!(o, Outcome::Done)
    }

    fn answer(rx: &mut oneshot::Receiver<Result<(), Errno>>) -> Option<Result<(), Errno>> {
        rx.try_recv().ok().flatten()
    }

    #[test]
    fn readers_share_and_a_writer_is_refused_or_waits_until_they_leave() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 99, Read, false))));
        assert!(granted(&t.lock(2, req(B, 50, 149, Read, false))));
        assert!(matches!(t.lock(3, req(C, 90, 95, Write, false)), Outcome::Refused(Errno::EAGAIN)));
        let Outcome::Wait(mut rx) = t.lock(3, req(C, 90, 95, Write, true)) else { panic!("should wait") };
        assert_eq!(answer(&mut rx), None);
        assert!(granted(&t.lock(1, req(A, 0, u64::MAX, Unlock, false))));
        assert_eq!(answer(&mut rx), None, "B still reads 50..149");
        assert!(granted(&t.lock(2, req(B, 90, 95, Unlock, false))));
        assert_eq!(answer(&mut rx), Some(Ok(())), "B let go of exactly the bytes C waits for");
        assert_eq!(t.test(5, A, 0, u64::MAX, Read).map(|h| (h.start, h.end, h.kind)), Some((90, 95, Write)));
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn a_waiting_writer_is_not_starved_by_later_waiting_readers() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Read, false))));
        let Outcome::Wait(mut w) = t.lock(2, req(B, 0, 9, Write, true)) else { panic!() };
        // A reader that arrives later and may wait queues behind the writer.
        let Outcome::Wait(mut r) = t.lock(3, req(C, 0, 9, Read, true)) else { panic!() };
        t.lock(1, req(A, 0, 9, Unlock, false));
        assert_eq!(answer(&mut w), Some(Ok(())));
        assert_eq!(answer(&mut r), None);
        t.lock(2, req(B, 0, 9, Unlock, false));
        assert_eq!(answer(&mut r), Some(Ok(())));
    }

    #[test]
    fn f_setlk_gets_what_posix_says_whatever_waits_and_agrees_with_f_getlk() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Read, false))));
        let Outcome::Wait(_w) = t.lock(2, req(B, 0, 19, Write, true)) else { panic!() };
        assert_eq!(t.test(5, C, 0, 9, Read), None);
        assert!(granted(&t.lock(3, req(C, 0, 9, Read, false))), "no held lock conflicts");
    }

    #[test]
    fn a_fair_try_does_not_jump_the_queue_and_a_lock_elsewhere_gives_no_pass() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Read, false))));
        let Outcome::Wait(_w) = t.lock(2, req(B, 0, 9, Write, true)) else { panic!() };
        // The first, non-waiting try of an F_SETLKW (LOCK_FAIR) yields to
        // the waiting writer; a plain F_SETLK does not.
        let mut fair = req(C, 0, 9, Read, false);
        fair.fair = true;
        assert!(matches!(t.lock(3, fair), Outcome::Refused(Errno::EAGAIN)));
        // A reader holding a lock elsewhere in the file still queues.
        let d = Owner { client: 4, owner: 40 };
        assert!(granted(&t.lock(4, req(d, 1000, 1000, Read, false))));
        assert!(matches!(t.lock(4, req(d, 0, 9, Read, true)), Outcome::Wait(_)));
    }

    #[test]
    fn a_downgrade_wakes_the_readers_waiting_for_it() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Write, false))));
        let Outcome::Wait(mut r) = t.lock(2, req(B, 0, 9, Read, true)) else { panic!() };
        assert!(granted(&t.lock(1, req(A, 0, 9, Read, false))));
        assert_eq!(answer(&mut r), Some(Ok(())));
    }

    #[test]
    fn an_owner_changing_its_own_locks_does_not_wait_behind_a_writer_that_waits_for_it() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Read, false))));
        let Outcome::Wait(mut w) = t.lock(2, req(B, 0, 19, Write, true)) else { panic!() };
        // Extending its read lock next to the one it holds: granted, no
        // EDEADLK (B waits for A, but A need not wait for B).
        assert!(granted(&t.lock(1, req(A, 10, 19, Read, true))));
        assert!(granted(&t.lock(1, req(A, 0, 9, Write, true))), "no other holder: the upgrade is granted");
        t.lock(1, req(A, 0, 19, Unlock, false));
        assert_eq!(answer(&mut w), Some(Ok(())));
    }

    #[test]
    fn two_owners_waiting_for_each_other_get_edeadlk() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Write, false))));
        assert!(granted(&t.lock(2, req(B, 100, 109, Write, false))));
        let Outcome::Wait(_a_waits) = t.lock(1, req(A, 100, 109, Write, true)) else { panic!() };
        assert!(matches!(t.lock(2, req(B, 0, 9, Write, true)), Outcome::Refused(Errno::EDEADLK)));
        // Through a third owner too: C waits for B, B for A... A for C.
        let mut t = table();
        for (conn, o, at) in [(1, A, 0), (2, B, 100), (3, C, 200)] {
            assert!(granted(&t.lock(conn, req(o, at, at + 9, Write, false))));
        }
        let Outcome::Wait(_c) = t.lock(3, req(C, 100, 109, Write, true)) else { panic!() };
        let Outcome::Wait(_b) = t.lock(2, req(B, 0, 9, Write, true)) else { panic!() };
        assert!(matches!(t.lock(1, req(A, 200, 209, Write, true)), Outcome::Refused(Errno::EDEADLK)));
    }

    #[test]
    fn a_dead_clients_locks_go_when_its_lease_ends_and_a_reconnect_keeps_them() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Write, false))));
        let Outcome::Wait(mut rx) = t.lock(2, req(B, 0, 9, Write, true)) else { panic!() };
        let now = Instant::now();
        let until = t.disconnected(1, now).expect("connection 1 spoke for client 1");
        t.expire(until - Duration::from_millis(1));
        assert_eq!(answer(&mut rx), None, "the lease still runs");
        // The client comes back on connection 7 within its lease: it keeps
        // its lock (a reclaim of what it holds changes nothing).
        let mut again = req(A, 0, 9, Write, false);
        again.reclaim = true;
        assert!(granted(&t.lock(7, again)));
        t.expire(until + Duration::from_secs(1));
        assert_eq!(answer(&mut rx), None);
        // Connection 7 dies too, and this time nobody comes back.
        let until = t.disconnected(7, until).unwrap();
        t.expire(until);
        assert_eq!(answer(&mut rx), Some(Ok(())));
        assert_eq!(t.ranges(), 1);
    }

    #[test]
    fn waiters_of_a_closed_connection_are_dropped_and_no_longer_block_others() {
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 9, Read, false))));
        let Outcome::Wait(_w) = t.lock(2, req(B, 0, 9, Write, true)) else { panic!() };
        let Outcome::Wait(mut r) = t.lock(3, req(C, 0, 9, Read, true)) else { panic!("queued behind B") };
        t.disconnected(2, Instant::now());
        assert_eq!(answer(&mut r), Some(Ok(())), "B's waiter went: C no longer yields to it");
        assert_eq!(t.waiting(), 0);
    }

    #[test]
    fn bounds_refuse_with_enolck() {
        let mut t = table();
        let mut waiting = Vec::new();
        for i in 0..MAX_WAITERS_PER_CONN as u64 {
            assert!(granted(&t.lock(1, req(Owner { client: 1, owner: i }, i * 10, i * 10, Write, false))));
            let waiter = Owner { client: 2, owner: i };
            let o = t.lock(2, req(waiter, i * 10, i * 10, Write, true));
            assert!(matches!(o, Outcome::Wait(_)));
            waiting.push(o);
        }
        let extra = Owner { client: 2, owner: 999 };
        let o = t.lock(2, req(extra, 0, 0, Write, true));
        assert!(matches!(o, Outcome::Refused(Errno::ENOLCK)), "{o:?}");
        // Ranges: a client that splits its locks into too many pieces.
        let mut t = table();
        for i in 0..MAX_RANGES_PER_CLIENT as u64 {
            assert!(granted(&t.lock(1, req(A, i * 2, i * 2, Write, false))));
        }
        let next = MAX_RANGES_PER_CLIENT as u64 * 2;
        assert!(matches!(t.lock(1, req(A, next, next, Write, false)), Outcome::Refused(Errno::ENOLCK)));
        // Merging does not grow: extending the last range is fine.
        assert!(granted(&t.lock(1, req(A, next - 2, next - 1, Write, false))));
        // Unlocks that split a range count too.
        let mut t = table();
        assert!(granted(&t.lock(1, req(A, 0, 1 << 40, Write, false))));
        let mut refused = None;
        for i in 0..MAX_RANGES_PER_CLIENT as u64 + 10 {
            if let Outcome::Refused(e) = t.lock(1, req(A, 2 * i + 1, 2 * i + 1, Unlock, false)) {
                refused = Some((i, e));
                break;
            }
        }
        assert_eq!(refused.map(|(_, e)| e), Some(Errno::ENOLCK));
        assert!(t.ranges() <= MAX_RANGES_PER_CLIENT);
        // A connection cycling client ids does not grow the table of clients.
        let mut t = table();
        for c in 0..MAX_CLIENTS_PER_CONN as u64 {
            assert!(granted(&t.lock(9, req(Owner { client: 100 + c, owner: 1 }, c, c, Read, false))));
        }
        let one_more = Owner { client: 999, owner: 1 };
        assert!(matches!(t.lock(9, req(one_more, 0, 0, Read, false)), Outcome::Refused(Errno::ENOLCK)));
        assert!(granted(&t.lock(9, req(one_more, 0, 0, Unlock, false))), "an unlock of nothing binds nothing");
    }

    #[test]
    fn the_pid_of_another_clients_lock_is_not_reported() {
        let mut t = table();
        let same_client_other_owner = Owner { client: A.client, owner: 99 };
        assert!(granted(&t.lock(1, req(A, 0, 9, Write, false))));
        assert_eq!(t.test(5, same_client_other_owner, 0, 0, Read).map(|h| h.pid), Some(10));
        assert_eq!(t.test(5, B, 0, 0, Read).map(|h| h.pid), Some(0));
        assert_eq!(t.test(5, A, 0, 0, Write), None, "an owner never conflicts with itself");
    }
}
