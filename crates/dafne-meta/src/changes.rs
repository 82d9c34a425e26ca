//! The namespace's change log, for clients that cache: every committed
//! change another session may have cached (an inode's attributes, a name
//! in a directory) is appended here, and a `Watch` waiting for changes is
//! answered the moment one is (issue 11, coherence between mounts).
//!
//! # Why a log and a long call
//! A FUSE mount's kernel caches attributes and names for the cluster's
//! timeouts; without word from the server a second mount sees a chmod, a
//! new size or a removed name only when they expire. The transport carries
//! requests from client to server only, so a mount keeps one `Watch` call
//! open at all times (sent without a call timeout); the server answers it
//! with whatever changed after the client's cursor, and the mount has its
//! kernel drop those entries (`FUSE_NOTIFY_INVAL_*`) and sends the next
//! `Watch`. Changes are logged only once committed (a reply has left for
//! the session that made them), and a session is not told of its own.
//!
//! # Bounds
//! The log keeps the last [`LOG_LEN`] changes (a change with a name is
//! at most ~1.1 KiB on the wire limit, 255-byte names in practice: ≤ 18
//! MiB, typically ~5 MiB). A watcher whose cursor fell out of it (or
//! points past it: the server restarted) is answered at once with `lost`,
//! and starts again from the head; its kernel's caches then expire by
//! their timeouts as before. At most [`MAX_WATCHERS_PER_CONN`] calls of
//! one connection and [`MAX_WATCHERS`] in all wait (`EBUSY` past them).

use std::collections::VecDeque;

use dafne_proto::{Change, CompoundOp, Errno, Request, Response, MAX_CHANGES, OPEN_TRUNC};
use futures::channel::oneshot;

/// Changes kept.
pub const LOG_LEN: usize = 1 << 14;
/// Most waiting `Watch` calls of one connection.
pub const MAX_WATCHERS_PER_CONN: usize = 4;
/// Most waiting `Watch` calls in all.
pub const MAX_WATCHERS: usize = 4096;

/// What a `Watch` gets now, or the wait for it.
#[derive(Debug)]
pub enum Poll {
    Ready { next: u64, lost: bool, changes: Vec<Change> },
    Wait { since: u64, rx: oneshot::Receiver<()> },
}

/// The log (module docs).
#[derive(Debug)]
pub struct ChangeLog {
    /// The sequence number of `entries[0]`; numbers start at 1 or later
    /// (`Default`), so a `since` of 0 means "from now on".
    first: u64,
    /// (connection that made it, change).
    entries: VecDeque<(u32, Change)>,
    waiters: Vec<(u32, oneshot::Sender<()>)>,
}

impl Default for ChangeLog {
    /// Numbers start at a random point (below 2⁶²), so a cursor of an
    /// earlier instance of the server is almost surely outside this one's
    /// log and is answered `lost` rather than with the wrong changes.
    fn default() -> ChangeLog {
        let mut b = [0u8; 8];
        let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
        let seed = match random {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            }
        };
        ChangeLog::starting_at(1 + (seed >> 2))
    }
}

impl ChangeLog {
    /// A log whose first change gets number `first` (≥ 1).
    pub fn starting_at(first: u64) -> ChangeLog {
        ChangeLog { first: first.max(1), entries: VecDeque::new(), waiters: Vec::new() }
    }

    /// The number the next change gets.
    pub fn head(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    /// Appends what connection `conn` changed and wakes every watcher.
    pub fn record(&mut self, conn: u32, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        for c in changes {
            if self.entries.len() == LOG_LEN {
                self.entries.pop_front();
                self.first += 1;
            }
            self.entries.push_back((conn, c));
        }
        for (_, tx) in self.waiters.drain(..) {
            let _ = tx.send(());
        }
    }

    /// The changes after `since` that connection `conn` did not make, or a
    /// wait for them (module docs).
    pub fn poll(&mut self, conn: u32, since: u64) -> Result<Poll, Errno> {
        let head = self.head();
        if since == 0 {
            return Ok(Poll::Ready { next: head, lost: false, changes: Vec::new() });
        }
        if since < self.first || since > head {
            return Ok(Poll::Ready { next: head, lost: true, changes: Vec::new() });
        }
        let mut next = since;
        let mut changes = Vec::new();
        let skip = (since - self.first) as usize;
        for (who, c) in self.entries.iter().skip(skip) {
            if changes.len() == MAX_CHANGES {
                break;
            }
            next += 1;
            if *who != conn {
                changes.push(c.clone());
            }
        }
        if !changes.is_empty() {
            return Ok(Poll::Ready { next, lost: false, changes });
        }
        self.waiters.retain(|(_, tx)| !tx.is_canceled());
        let mine = self.waiters.iter().filter(|(c, _)| *c == conn).count();
        if mine >= MAX_WATCHERS_PER_CONN || self.waiters.len() >= MAX_WATCHERS {
            return Err(Errno::EBUSY);
        }
        let (tx, rx) = oneshot::channel();
        self.waiters.push((conn, tx));
        Ok(Poll::Wait { since: next, rx })
    }

    /// Connection `conn` ended: its waiting calls go.
    pub fn disconnected(&mut self, conn: u32) {
        self.waiters.retain(|(c, _)| *c != conn);
    }
}

fn changed(ino: u64) -> Change {
    Change { ino, parent: 0, name: Vec::new() }
}

fn named(parent: u64, name: &[u8]) -> Change {
    Change { ino: parent, parent, name: name.to_vec() }
}

/// What one successful request changed that a client may have cached: the
/// inodes whose attributes changed, and the names removed or replaced (a
/// new name needs no word: mounts do not cache a name's absence).
pub fn of_request(req: &Request) -> Vec<Change> {
    match req {
        Request::SetAttr { ino, .. } | Request::SetXattr { ino, .. } | Request::RemoveXattr { ino, .. } => {
            vec![changed(*ino)]
        }
        Request::Open { ino, flags } if flags & OPEN_TRUNC != 0 => vec![changed(*ino)],
        // A new name is logged with its name (not only its directory): a
        // mount may cache that the name did not exist (a negative entry,
        // `dafne_fuse`), which must go when another client makes it.
        Request::Create { parent, name, .. }
        | Request::Mkdir { parent, name, .. }
        | Request::Mknod { parent, name, .. }
        | Request::Symlink { parent, name, .. } => vec![named(*parent, name)],
        Request::Link { ino, new_parent, new_name } => vec![changed(*ino), named(*new_parent, new_name)],
        Request::Unlink { parent, name } | Request::Rmdir { parent, name } => vec![named(*parent, name)],
        Request::Rename { src_parent, src_name, dst_parent, dst_name, .. } => {
            vec![named(*src_parent, src_name), named(*dst_parent, dst_name)]
        }
        _ => Vec::new(),
    }
}

/// [`of_request`] for each op of a compound that succeeded, with chaining
/// resolved from the results before it.
pub fn of_compound(ops: &[CompoundOp], results: &[Result<Response, Errno>]) -> Vec<Change> {
    let mut out = Vec::new();
    let mut prev = None;
    for (op, r) in ops.iter().zip(results) {
        let Ok(resp) = r else { break };
        if let Ok(req) = op.clone().resolve(prev) {
            out.extend(of_request(&req));
        }
        prev = resp.ino();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_gets_others_changes_in_order_and_never_its_own() {
        let mut log = ChangeLog::default();
        let Ok(Poll::Ready { next, lost: false, changes }) = log.poll(1, 0) else { panic!() };
        assert!(changes.is_empty());
        log.record(1, vec![changed(5)]);
        log.record(2, vec![changed(6), named(7, b"x")]);
        let Ok(Poll::Ready { next: n2, changes, .. }) = log.poll(1, next) else { panic!() };
        assert_eq!(changes, vec![changed(6), named(7, b"x")]);
        // Only its own change since: it waits, and is woken by another's.
        log.record(1, vec![changed(8)]);
        let Ok(Poll::Wait { since, mut rx }) = log.poll(1, n2) else { panic!("should wait") };
        assert_eq!(rx.try_recv(), Ok(None));
        log.record(3, vec![changed(9)]);
        assert_eq!(rx.try_recv(), Ok(Some(())));
        let Ok(Poll::Ready { changes, .. }) = log.poll(1, since) else { panic!() };
        assert_eq!(changes, vec![changed(9)]);
    }

    #[test]
    fn a_cursor_out_of_the_log_is_told_it_lost_changes() {
        let mut log = ChangeLog::default();
        let start = log.head();
        for i in 0..LOG_LEN as u64 + 10 {
            log.record(2, vec![changed(i)]);
        }
        assert!(matches!(log.poll(1, start), Ok(Poll::Ready { lost: true, .. })));
        assert!(matches!(log.poll(1, log.head() + 5), Ok(Poll::Ready { lost: true, .. })), "a restarted server");
        let Ok(Poll::Ready { changes, next, lost: false }) = log.poll(1, log.head() - 2000) else { panic!() };
        assert_eq!(changes.len(), MAX_CHANGES);
        assert_eq!(next, log.head() - 2000 + MAX_CHANGES as u64);
    }

    #[test]
    fn a_restarted_servers_log_does_not_take_an_old_cursor_for_its_own() {
        let mut old = ChangeLog::default();
        old.record(2, vec![changed(1)]);
        let cursor = old.head();
        let mut new = ChangeLog::default();
        for i in 0..100 {
            new.record(2, vec![changed(i)]);
        }
        assert!(matches!(new.poll(1, cursor), Ok(Poll::Ready { lost: true, .. })));
    }

    #[test]
    fn watchers_are_bounded_per_connection() {
        let mut log = ChangeLog::default();
        let head = log.head();
        let mut keep = Vec::new();
        for _ in 0..MAX_WATCHERS_PER_CONN {
            keep.push(log.poll(1, head).unwrap());
        }
        assert_eq!(log.poll(1, head).err(), Some(Errno::EBUSY));
        assert!(matches!(log.poll(2, head), Ok(Poll::Wait { .. })));
        log.disconnected(1);
        assert!(matches!(log.poll(1, head), Ok(Poll::Wait { .. })));
    }

    #[test]
    fn chained_compound_ops_are_logged_with_the_inode_they_ran_on() {
        let ops = vec![
            CompoundOp { chain: false, req: Request::Lookup { parent: 1, name: b"d".to_vec() } },
            CompoundOp { chain: true, req: Request::Unlink { parent: 0, name: b"f".to_vec() } },
        ];
        // Any answer that names an inode chains; a Session's root will do.
        let results = vec![Ok(Response::Session { session_id: 1, root: 42 }), Ok(Response::Done)];
        assert_eq!(of_compound(&ops, &results), vec![named(42, b"f")]);
        assert_eq!(of_compound(&ops, &[Err(Errno::ENOENT)]), vec![]);
    }

    /// Negative entries (a name cached as absent) go when another client
    /// makes the name: every op that makes one logs it.
    #[test]
    fn new_names_are_logged_with_their_name() {
        let n = b"n".to_vec();
        for req in [
            Request::Create { parent: 7, name: n.clone(), mode: 0o644, exclusive: true, hint: None },
            Request::Mkdir { parent: 7, name: n.clone(), mode: 0o755 },
            Request::Mknod { parent: 7, name: n.clone(), kind: dafne_proto::FileType::Fifo, mode: 0o644, rdev: 0 },
            Request::Symlink { parent: 7, name: n.clone(), target: b"t".to_vec() },
        ] {
            assert_eq!(of_request(&req), vec![named(7, b"n")], "{req:?}");
        }
        let link = Request::Link { ino: 3, new_parent: 7, new_name: n };
        assert_eq!(of_request(&link), vec![changed(3), named(7, b"n")]);
    }
}
