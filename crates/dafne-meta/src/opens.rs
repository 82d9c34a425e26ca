//! Which data objects clients hold open, so that an unlinked file's data
//! stays until its last close (POSIX) and is reclaimed after it.
//!
//! The table lives in memory, per session (one authenticated connection):
//! every successful `Open`, alone or in a Compound, adds one open of its
//! data object; `Close` removes one; `Reopen` adds those a reconnecting
//! client still holds. A session that ends (its connection closed or died,
//! which the transport reports) leaves its objects *lingering* for `grace`.
//!
//! # The rule
//! `ListOrphans` never names an object that is
//! * **held**: some live session opened it more often than it closed it;
//! * **lingering**: a session that held it ended less than `grace` ago. A
//!   client whose connection broke while this server lived on reconnects
//!   and re-announces its opens within that time;
//!
//! and names nothing at all during the first `grace` after this server
//! started: the table of the previous instance is gone, and its clients
//! re-announce what they hold once they have reconnected. The client
//! library remembers its opens, re-announces them right after every
//! reconnect's `SessionOpen`, and while it holds any it pings the server
//! every second, so it notices a lost server and reconnects within a
//! second or two of the server listening again (it would otherwise notice
//! only at its next call, which may never come for a file that is open but
//! idle). `grace` (default [`DEFAULT_GRACE`]) must exceed that.
//!
//! A killed client thus frees its files' data `grace` after the server sees
//! its connection die (at once for a closed socket, after the transport's
//! keepalive timeout otherwise), plus the reclaimer's wait.
//!
//! Sessions are trusted once authenticated (AUTH_SYS style), so a client
//! may claim to hold any object: the worst it can do is delay the reclaim
//! of data, bounded by its own session and by the bounds below.
//!
//! # Opens as proof for a new capability
//! A session that holds an open may have a capability re-issued after a
//! revocation (`Recap`, `dafne_auth`'s module docs "Revocation"), so the
//! table also records, per held object, the rights *proven*: those of the
//! `Open`s this session made, or all rights for a hold re-announced by
//! `Reopen` while the claim could be checked: during the start-up grace
//! (the previous instance's table is gone: every claim is believed, as for
//! reclaiming) or for an object lingering from an ended session (the
//! client's previous connection, most likely). Any other `Reopen` still
//! protects the data from the reclaimer but proves nothing:
//! [`OpenTable::proven`] is false for it, so a client cannot claim an open
//! it never had to get back rights a chmod took away, nor turn a read-only
//! open into the write capability it held before.
//!
//! # Bounds
//! One open counts one unit, whatever its object: [`MAX_OPENS_PER_SESSION`]
//! units per session (`EMFILE` past it) and [`MAX_OPENS`] in all, lingering
//! objects included (`ENFILE` past it). An open in flight holds its unit
//! from before it runs until its result is known (a reservation), so the
//! bounds hold whatever is in flight. Memory: a distinct (session, object)
//! entry costs ≈ 12 B of key and count, padded to 16, plus a control byte
//! in a hash table at most 7/8 full and up to half empty after it doubles:
//! ≤ 40 B, and ≤ 40 B more for its proven rights (8 B key and a byte,
//! padded to 16): ≤ 80 B. A lingering entry (object and deadline, 24 B)
//! ≤ 56 B. So 2²⁰ units take at most 2²⁰ × 80 B = 80 MiB, and the set of protected
//! objects built for a `ListOrphans` (8 B each, ≤ 24 B with its table) at
//! most 24 MiB more, for the time of that call.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use dafne_proto::{Errno, HeldOpen, RIGHT_READ, RIGHT_WRITE};

/// Most opens one session may hold (a FUSE mount is one session for all
/// its processes; 65536 is 16 processes at Linux's usual 4096-descriptor
/// hard limit).
pub const MAX_OPENS_PER_SESSION: usize = 1 << 16;

/// Most opens the server holds, over all sessions, lingering objects
/// included (module docs, "Bounds": ≤ 56 MiB).
pub const MAX_OPENS: usize = 1 << 20;

/// How long a restarted server lists no orphans, and how long an ended
/// session's objects stay protected, unless configured otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// Why the table refused a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error(
        "session of connection {conn} holds {held} opens and asks for {more} more (at most {MAX_OPENS_PER_SESSION})"
    )]
    SessionFull { conn: u32, held: usize, more: usize },
    #[error("the server holds {held} opens and connection {conn} asks for {more} more (at most {MAX_OPENS})")]
    ServerFull { conn: u32, held: usize, more: usize },
    #[error("connection {conn} has no session")]
    NoSession { conn: u32 },
    #[error("the session of connection {conn} does not hold object {object} open")]
    NotOpen { conn: u32, object: u64 },
}

impl OpenError {
    /// The errno a client gets.
    pub fn errno(&self) -> Errno {
        match self {
            OpenError::SessionFull { .. } => Errno::EMFILE,
            OpenError::ServerFull { .. } => Errno::ENFILE,
            OpenError::NoSession { .. } => Errno::EACCES,
            OpenError::NotOpen { .. } => Errno::EBADF,
        }
    }
}

#[derive(Debug, Default)]
struct Session {
    /// Object → opens held (≥ 1).
    objects: HashMap<u64, u32>,
    /// Units this session uses: the sum of `objects`' counts plus opens
    /// reserved and not settled yet.
    units: usize,
    /// Per object of `objects`, the rights its opens proved (module docs,
    /// "Opens as proof"); absent for a hold only an unchecked `Reopen` made.
    proven: HashMap<u64, u8>,
}

/// The open files of every session (module docs).
#[derive(Debug)]
pub struct OpenTable {
    grace: Duration,
    started: Instant,
    sessions: HashMap<u32, Session>,
    /// Objects of ended sessions → until when they stay protected.
    lingering: HashMap<u64, Instant>,
    /// Units in use: every session's `units` plus `lingering.len()`.
    units: usize,
}

impl OpenTable {
    /// An empty table for a server started at `now`.
    pub fn new(grace: Duration, now: Instant) -> OpenTable {
        OpenTable { grace, started: now, sessions: HashMap::new(), lingering: HashMap::new(), units: 0 }
    }

    /// A session was opened on connection `conn` (again: nothing changes).
    pub fn add_session(&mut self, conn: u32) {
        self.sessions.entry(conn).or_default();
    }

    /// The connection of a session is gone: its objects linger until
    /// `now + grace`.
    pub fn end_session(&mut self, conn: u32, now: Instant) {
        let Some(s) = self.sessions.remove(&conn) else { return };
        self.units -= s.units;
        let until = now + self.grace;
        for object in s.objects.into_keys() {
            if self.lingering.insert(object, until).is_none() {
                self.units += 1;
            }
        }
        self.prune(now);
    }

    /// Drops lingering objects whose time is up.
    fn prune(&mut self, now: Instant) {
        let before = self.lingering.len();
        self.lingering.retain(|_, until| *until > now);
        self.units -= before - self.lingering.len();
    }

    /// Whether `more` units fit the session and the server.
    fn check(&self, conn: u32, more: usize) -> Result<(), OpenError> {
        let s = self.sessions.get(&conn).ok_or(OpenError::NoSession { conn })?;
        if s.units + more > MAX_OPENS_PER_SESSION {
            return Err(OpenError::SessionFull { conn, held: s.units, more });
        }
        if self.units + more > MAX_OPENS {
            return Err(OpenError::ServerFull { conn, held: self.units, more });
        }
        Ok(())
    }

    /// Reserves `n` opens for a request about to run; [`OpenTable::settle`]
    /// says how many it made.
    pub fn reserve(&mut self, conn: u32, n: usize, now: Instant) -> Result<(), OpenError> {
        self.prune(now);
        self.check(conn, n)?;
        if let Some(s) = self.sessions.get_mut(&conn) {
            s.units += n;
        }
        self.units += n;
        Ok(())
    }

    /// A request that reserved `reserved` opens opened `opened` (at most
    /// that many); the rest of the reservation is returned. Nothing is
    /// recorded for a session that ended meanwhile (its units went with it).
    /// `opened` holds (object, capability rights) per open made.
    pub fn settle(&mut self, conn: u32, reserved: usize, opened: &[(u64, u8)]) {
        let Some(s) = self.sessions.get_mut(&conn) else { return };
        assert!(opened.len() <= reserved, "{} opens made on a reservation of {reserved}", opened.len());
        for &(object, rights) in opened {
            *s.objects.entry(object).or_insert(0) += 1;
            *s.proven.entry(object).or_insert(0) |= rights;
        }
        let unused = reserved - opened.len();
        s.units -= unused;
        self.units -= unused;
    }

    /// Releases one open of `object` by the session of `conn`.
    pub fn close(&mut self, conn: u32, object: u64) -> Result<(), OpenError> {
        let s = self.sessions.get_mut(&conn).ok_or(OpenError::NoSession { conn })?;
        let count = s.objects.get_mut(&object).ok_or(OpenError::NotOpen { conn, object })?;
        *count -= 1;
        if *count == 0 {
            s.objects.remove(&object);
            s.proven.remove(&object);
        }
        s.units -= 1;
        self.units -= 1;
        Ok(())
    }

    /// Registers opens a reconnecting client holds: all of them, or none
    /// past a bound.
    pub fn reopen(&mut self, conn: u32, held: &[HeldOpen], now: Instant) -> Result<(), OpenError> {
        self.prune(now);
        let n = held.iter().map(|h| h.count as usize).fold(0usize, usize::saturating_add);
        self.check(conn, n)?;
        let believed = self.in_startup_grace(now);
        if let Some(s) = self.sessions.get_mut(&conn) {
            for h in held {
                if believed || self.lingering.contains_key(&h.object_id) {
                    s.proven.insert(h.object_id, RIGHT_READ | RIGHT_WRITE);
                }
                *s.objects.entry(h.object_id).or_insert(0) += h.count;
            }
            s.units += n;
        }
        self.units += n;
        Ok(())
    }

    /// Whether the server started less than `grace` ago (no orphan may be
    /// listed yet).
    pub fn in_startup_grace(&self, now: Instant) -> bool {
        now < self.started + self.grace
    }

    /// The objects `ListOrphans` must not name now: held or lingering.
    pub fn protected(&mut self, now: Instant) -> HashSet<u64> {
        self.prune(now);
        let mut set: HashSet<u64> = self.lingering.keys().copied().collect();
        for s in self.sessions.values() {
            set.extend(s.objects.keys().copied());
        }
        set
    }

    /// Whether the session of `conn` holds `object` open with proof of
    /// `rights` (module docs, "Opens as proof"): what `Recap` requires.
    pub fn proven(&self, conn: u32, object: u64, rights: u8) -> bool {
        self.sessions.get(&conn).is_some_and(|s| {
            s.objects.contains_key(&object) && s.proven.get(&object).is_some_and(|p| p & rights == rights)
        })
    }

    /// Opens the session of `conn` holds (reservations included).
    pub fn session_units(&self, conn: u32) -> usize {
        self.sessions.get(&conn).map_or(0, |s| s.units)
    }

    /// Units in use over the server.
    pub fn units(&self) -> usize {
        self.units
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);

    fn table() -> (OpenTable, Instant) {
        let t0 = Instant::now();
        let mut t = OpenTable::new(GRACE, t0);
        t.add_session(1);
        t.add_session(2);
        (t, t0)
    }

    fn open(t: &mut OpenTable, conn: u32, object: u64, now: Instant) {
        t.reserve(conn, 1, now).unwrap();
        t.settle(conn, 1, &[(object, RIGHT_READ | RIGHT_WRITE)]);
    }

    #[test]
    fn opened_twice_and_closed_once_stays_protected() {
        let (mut t, t0) = table();
        open(&mut t, 1, 7, t0);
        open(&mut t, 1, 7, t0);
        assert!(t.protected(t0).contains(&7));
        t.close(1, 7).unwrap();
        assert!(t.protected(t0).contains(&7), "one open of two is left");
        t.close(1, 7).unwrap();
        assert!(!t.protected(t0).contains(&7), "the last close releases it");
        assert_eq!(t.close(1, 7), Err(OpenError::NotOpen { conn: 1, object: 7 }));
        assert_eq!(t.close(1, 7).unwrap_err().errno(), Errno::EBADF);
        assert_eq!(t.units(), 0);
    }

    #[test]
    fn another_sessions_open_keeps_the_object() {
        let (mut t, t0) = table();
        open(&mut t, 1, 7, t0);
        open(&mut t, 2, 7, t0);
        t.close(1, 7).unwrap();
        assert!(t.protected(t0).contains(&7));
        // A session cannot close another's open.
        assert_eq!(t.close(1, 7).unwrap_err().errno(), Errno::EBADF);
        t.close(2, 7).unwrap();
        assert!(t.protected(t0).is_empty());
    }

    #[test]
    fn an_ended_session_releases_its_opens_after_the_grace() {
        let (mut t, t0) = table();
        open(&mut t, 1, 7, t0);
        open(&mut t, 1, 7, t0);
        open(&mut t, 1, 8, t0);
        t.end_session(1, t0);
        assert_eq!(t.session_units(1), 0);
        assert_eq!(t.units(), 2, "two objects linger");
        assert_eq!(t.protected(t0 + GRACE - Duration::from_millis(1)), HashSet::from([7, 8]));
        assert!(t.protected(t0 + GRACE).is_empty(), "released once the grace is over");
        assert_eq!(t.units(), 0);
        // The ended session can do nothing more.
        assert_eq!(t.close(1, 8), Err(OpenError::NoSession { conn: 1 }));
        assert_eq!(t.reserve(1, 1, t0).unwrap_err().errno(), Errno::EACCES);
    }

    #[test]
    fn a_reconnected_client_takes_over_what_lingers() {
        let (mut t, t0) = table();
        open(&mut t, 1, 7, t0);
        t.end_session(1, t0);
        t.add_session(3);
        t.reopen(3, &[HeldOpen { object_id: 7, count: 2 }], t0).unwrap();
        let later = t0 + GRACE * 2;
        assert!(t.protected(later).contains(&7), "held by the new session after the grace");
        t.close(3, 7).unwrap();
        t.close(3, 7).unwrap();
        assert!(t.protected(later).is_empty());
        assert_eq!(t.units(), 0);
    }

    #[test]
    fn a_session_that_ends_while_an_open_runs_records_nothing() {
        let (mut t, t0) = table();
        t.reserve(1, 2, t0).unwrap();
        t.end_session(1, t0);
        t.settle(1, 2, &[(7, RIGHT_READ), (8, RIGHT_READ)]);
        assert!(t.protected(t0).is_empty());
        assert_eq!(t.units(), 0);
    }

    #[test]
    fn failed_opens_return_their_reservation() {
        let (mut t, t0) = table();
        t.reserve(1, 3, t0).unwrap();
        assert_eq!(t.session_units(1), 3);
        t.settle(1, 3, &[(7, RIGHT_READ)]);
        assert_eq!((t.session_units(1), t.units()), (1, 1));
    }

    #[test]
    fn the_bounds_are_enforced_with_clear_errnos() {
        let (mut t, t0) = table();
        t.reserve(1, MAX_OPENS_PER_SESSION, t0).unwrap();
        let e = t.reserve(1, 1, t0).unwrap_err();
        assert_eq!(e, OpenError::SessionFull { conn: 1, held: MAX_OPENS_PER_SESSION, more: 1 });
        assert_eq!(e.errno(), Errno::EMFILE);
        let too_many = [HeldOpen { object_id: 1, count: 1 }];
        assert_eq!(t.reopen(1, &too_many, t0).unwrap_err().errno(), Errno::EMFILE);
        // Another session may still open, up to the server's bound.
        let sessions = MAX_OPENS / MAX_OPENS_PER_SESSION;
        for conn in 2..=sessions as u32 {
            t.add_session(conn);
            t.reserve(conn, MAX_OPENS_PER_SESSION, t0).unwrap();
        }
        assert_eq!(t.units(), MAX_OPENS);
        t.add_session(1000);
        let e = t.reserve(1000, 1, t0).unwrap_err();
        assert_eq!(e.errno(), Errno::ENFILE);
        assert!(e.to_string().contains("1048576"), "{e}");
        // A huge count does not overflow into acceptance.
        let huge = [HeldOpen { object_id: 1, count: u32::MAX }, HeldOpen { object_id: 2, count: u32::MAX }];
        assert!(t.reopen(1000, &huge, t0).is_err());
        // Releasing makes room again.
        t.settle(2, MAX_OPENS_PER_SESSION, &[]);
        t.reserve(1000, 1, t0).unwrap();
    }

    #[test]
    fn only_opens_made_or_re_announced_with_proof_count_for_recap() {
        const RW: u8 = RIGHT_READ | RIGHT_WRITE;
        let (mut t, t0) = table();
        let after = t0 + GRACE * 2;
        open(&mut t, 1, 7, after);
        assert!(t.proven(1, 7, RW), "opened by this session");
        assert!(!t.proven(2, 7, RIGHT_READ), "another session's open proves nothing");
        // A claim out of the blue protects the data but proves nothing.
        t.reopen(2, &[HeldOpen { object_id: 8, count: 1 }], after).unwrap();
        assert!(t.protected(after).contains(&8));
        assert!(!t.proven(2, 8, RIGHT_READ));
        // A read-only open proves reading, not writing.
        t.reserve(2, 1, after).unwrap();
        t.settle(2, 1, &[(8, RIGHT_READ)]);
        assert!(t.proven(2, 8, RIGHT_READ));
        assert!(!t.proven(2, 8, RW), "a read-only open does not bring back a write capability");
        // Closing every open forgets.
        t.close(2, 8).unwrap();
        t.close(2, 8).unwrap();
        assert!(!t.proven(2, 8, RIGHT_READ));
        // A client whose connection ended re-announces what lingers: proven.
        t.end_session(1, after);
        t.add_session(3);
        t.reopen(3, &[HeldOpen { object_id: 7, count: 1 }], after).unwrap();
        assert!(t.proven(3, 7, RW));
        // During the start-up grace every claim is believed.
        let mut fresh = OpenTable::new(GRACE, t0);
        fresh.add_session(1);
        fresh.reopen(1, &[HeldOpen { object_id: 9, count: 1 }], t0).unwrap();
        assert!(fresh.proven(1, 9, RW));
    }

    #[test]
    fn nothing_is_listed_during_the_startup_grace() {
        let t0 = Instant::now();
        let t = OpenTable::new(GRACE, t0);
        assert!(t.in_startup_grace(t0));
        assert!(t.in_startup_grace(t0 + GRACE - Duration::from_millis(1)));
        assert!(!t.in_startup_grace(t0 + GRACE));
        assert!(!OpenTable::new(Duration::ZERO, t0).in_startup_grace(t0));
    }
}
