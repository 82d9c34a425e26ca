//! Byte-range locks through the metadata server (`dafne_meta::locks` has
//! the server's rules): `fcntl` locks, OFD locks and `flock` that exclude
//! processes on every client of the cluster.
//!
//! # Identity
//! A session draws a random 64-bit *client id* when it connects and keeps
//! it across reconnects; every lock request names it and the lock's owner
//! within this client (for a FUSE mount, the kernel's lock owner). The
//! server ties the client's locks to the connection that last spoke for
//! it, and keeps them for its lease after that connection ends.
//!
//! # What the session remembers, and reclaims
//! The session keeps its own copy of every lock it holds (the same range
//! arithmetic as the server, [`dafne_proto::OwnerLocks`]). When a
//! connection is replaced (the server restarted, or the network broke),
//! the new connection claims each of them back ([`dafne_proto::LOCK_RECLAIM`])
//! right after the login, before any other call uses it, so within the
//! server's grace nobody else can take them. A reclaim the server refuses
//! (another client took the range after our lease ran out) is logged and
//! dropped from the copy: that lock is lost, as on NFS.
//!
//! An unlock is applied to the copy first, whatever the server answers:
//! when the server cannot be reached, the unlock is kept and sent first
//! on the next connection (before the reclaims), so a lock the
//! application let go is never claimed back, and the caller is not held
//! up by a server that is down (a close of a locked file returns).
//!
//! # Waiting
//! A request that may wait is sent without a call timeout (the server
//! answers when it grants it) and is retried, after reconnecting, when the
//! connection breaks under it, for up to [`RECONNECT_FOR`]; other lock
//! requests are tried on a new connection for up to the link's
//! reconnection wait, then fail with `EIO` like other calls. At most
//! [`MAX_WAITING`] requests of a session wait on the server at once (the
//! server's bound per connection, below the transport's request credits);
//! a request that finds them all taken does not queue behind them (it
//! might wait for a lock that one of them holds): it asks without waiting,
//! again and again with a growing pause (10 ms to 0.5 s), until it gets
//! the lock or a turn to wait on the server frees. Its tries are judged
//! as waiting requests ([`LOCK_FAIR`]: they do not jump the queue), but
//! it has no place in it (no `EDEADLK` for it).

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dafne_proto::{
    decode_reply, encode_request, Envelope, Errno, Ino, LockHolder, LockKind, OwnerLocks, Request, Response, LOCK_FAIR,
    LOCK_RECLAIM, LOCK_WAIT,
};
use dafne_transport::Client;

use crate::MetaSession;

/// Most lock requests of one session waiting on the server at once
/// (`dafne_meta::locks::MAX_WAITERS_PER_CONN`).
pub const MAX_WAITING: usize = 16;

/// How long a lock request keeps trying to reach a server whose
/// connection broke (a restart takes seconds).
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// The session's copy of its locks, and the turns for waiting requests.
#[derive(Debug, Default)]
pub(crate) struct Locks {
    held: Mutex<HashMap<(Ino, u64), (OwnerLocks, u32)>>,
    /// Unlocks the server has not confirmed (module docs), as (ino, owner,
    /// start, end): sent first on the next connection.
    unsent: Mutex<Vec<(Ino, u64, u64, u64)>>,
    waiting: Mutex<usize>,
    turn: Condvar,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Locks {
    /// Records a lock or unlock the server granted.
    fn record(&self, ino: Ino, owner: u64, pid: u32, start: u64, end: u64, kind: LockKind) {
        let mut held = guard(&self.held);
        let e = held.entry((ino, owner)).or_insert_with(|| (OwnerLocks::default(), pid));
        e.0.apply(start, end, kind);
        if kind != LockKind::Unlock {
            e.1 = pid;
        }
        if e.0.is_empty() {
            held.remove(&(ino, owner));
        }
    }

    /// Whether the session holds any lock.
    pub(crate) fn any(&self) -> bool {
        !guard(&self.held).is_empty()
    }

    /// Ranges held, over every file and owner.
    pub(crate) fn count(&self) -> usize {
        guard(&self.held).values().map(|(l, _)| l.ranges().len()).sum()
    }

    /// Claims every held lock back on a new connection `c` (module docs).
    /// A refused reclaim is logged and forgotten; a lost connection fails
    /// the reconnect.
    pub(crate) fn reclaim(&self, c: &Client, client: u64, uid: u32, gid: u32) -> Result<(), String> {
        let mut held = guard(&self.held);
        let unsent = std::mem::take(&mut *guard(&self.unsent));
        for (i, &(ino, owner, start, end)) in unsent.iter().enumerate() {
            let req = Request::Lock { ino, client, owner, pid: 0, start, end, kind: LockKind::Unlock, flags: 0 };
            if let Err(e) = c.call(encode_request(Envelope::new(0, uid, gid), &req)) {
                guard(&self.unsent).extend_from_slice(&unsent[i..]);
                return Err(format!("sending unlocks: {e}"));
            }
        }
        let mut lost = Vec::new();
        for (&(ino, owner), (locks, pid)) in held.iter() {
            for r in locks.ranges() {
                let req = Request::Lock {
                    ino,
                    client,
                    owner,
                    pid: *pid,
                    start: r.start,
                    end: r.end,
                    kind: r.kind,
                    flags: LOCK_RECLAIM,
                };
                let bytes = c.call(encode_request(Envelope::new(0, uid, gid), &req)).map_err(|e| e.to_string())?;
                match decode_reply(&bytes) {
                    Ok((_, _, Ok(_))) => {}
                    Ok((_, _, Err(e))) => {
                        tracing::warn!(
                            "lock on bytes {}..={} of inode {ino} (owner {owner:#x}) lost: the metadata server \
                             refused to give it back ({e}); another client took it after this one's lease ended",
                            r.start,
                            r.end
                        );
                        lost.push((ino, owner, r.start, r.end));
                    }
                    Err(e) => return Err(format!("reclaiming locks: {e}")),
                }
            }
        }
        for (ino, owner, start, end) in lost {
            if let Some(e) = held.get_mut(&(ino, owner)) {
                e.0.apply(start, end, LockKind::Unlock);
                if e.0.is_empty() {
                    held.remove(&(ino, owner));
                }
            }
        }
        Ok(())
    }

    /// A turn to wait on the server, if one is free (module docs).
    fn try_take_turn(&self) -> bool {
        let mut n = guard(&self.waiting);
        if *n >= MAX_WAITING {
            return false;
        }
        *n += 1;
        true
    }

    /// Waits up to `d` for a turn to free.
    fn wait_for_turn(&self, d: Duration) {
        let n = guard(&self.waiting);
        if *n >= MAX_WAITING {
            let _ = self.turn.wait_timeout(n, d);
        }
    }

    fn end_turn(&self) {
        *guard(&self.waiting) -= 1;
        self.turn.notify_one();
    }
}

impl MetaSession {
    /// This session's client id for locks (module docs, "Identity").
    pub fn lock_client(&self) -> u64 {
        self.inner.client_id
    }

    /// Byte-range locks this session holds (ranges, over all files).
    pub fn held_locks(&self) -> usize {
        self.inner.locks.count()
    }

    /// Whether `owner` holds a lock on `ino` (as far as this session knows:
    /// what the server granted it). A mount asks before it releases an
    /// owner's locks at every close, so closes of files never locked cost
    /// no round trip.
    pub fn holds_lock(&self, ino: Ino, owner: u64) -> bool {
        guard(&self.inner.locks.held).contains_key(&(ino, owner))
    }

    /// Takes (`Read`, `Write`) or releases (`Unlock`) the lock of `owner`
    /// over bytes `start..=end` of `ino` (`u64::MAX`: to the end of the
    /// file). Without `wait`, a conflicting lock fails it with `EAGAIN`;
    /// with it, the call returns when the lock is granted, or `EDEADLK`.
    /// Blocking: never call it from the transport's loop thread.
    #[allow(clippy::too_many_arguments)]
    pub fn lock(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        start: u64,
        end: u64,
        kind: LockKind,
        wait: bool,
    ) -> Result<(), Errno> {
        if end < start {
            return Err(Errno::EINVAL);
        }
        let locks = &self.inner.locks;
        let flags = if wait && kind != LockKind::Unlock { LOCK_WAIT } else { 0 };
        let req = Request::Lock { ino, client: self.inner.client_id, owner, pid, start, end, kind, flags };
        if kind == LockKind::Unlock {
            // The copy first (module docs): never reclaimed from now on.
            locks.record(ino, owner, pid, start, end, kind);
            return match self.call_retrying(req, false, crate::link::WAIT_FOR_RECONNECT) {
                Ok(Response::Done) => Ok(()),
                Ok(_) => Err(Errno::EPROTO),
                Err(e) if e == Errno::EIO || e == Errno::EAGAIN => {
                    tracing::debug!("unlock of inode {ino} not confirmed ({e}): sent again on the next connection");
                    guard(&locks.unsent).push((ino, owner, start, end));
                    Ok(())
                }
                Err(e) => Err(e),
            };
        }
        let r = if wait {
            self.wait_for_lock(&req)
        } else {
            self.call_retrying(req.clone(), false, crate::link::WAIT_FOR_RECONNECT)
        };
        self.granted(r, &req)
    }

    /// The answer to lock request `req`: on `Done`, the session's copy
    /// records the lock.
    fn granted(&self, r: Result<Response, Errno>, req: &Request) -> Result<(), Errno> {
        match (r?, req) {
            (Response::Done, &Request::Lock { ino, owner, pid, start, end, kind, .. }) => {
                self.inner.locks.record(ino, owner, pid, start, end, kind);
                Ok(())
            }
            _ => Err(Errno::EPROTO),
        }
    }

    /// A lock request that may wait (module docs, "Waiting"): on the server
    /// when a turn is free, else by asking without waiting until a turn
    /// frees or the lock is granted.
    fn wait_for_lock(&self, req: &Request) -> Result<Response, Errno> {
        let locks = &self.inner.locks;
        let mut now = req.clone();
        if let Request::Lock { flags, .. } = &mut now {
            *flags = LOCK_FAIR;
        }
        let mut pause = Duration::from_millis(10);
        loop {
            if locks.try_take_turn() {
                let r = self.call_retrying(req.clone(), true, RECONNECT_FOR);
                locks.end_turn();
                return r;
            }
            match self.call_retrying(now.clone(), false, crate::link::WAIT_FOR_RECONNECT) {
                Err(e) if e == Errno::EAGAIN => {}
                r => return r,
            }
            locks.wait_for_turn(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Takes a lock without waiting, but refused (`EAGAIN`) also when an
    /// earlier waiting request stands in the way: the first try of a
    /// caller that will then wait ([`Self::lock`] with `wait`) if it must,
    /// so that the try does not jump the queue (a mount's `F_SETLKW`).
    pub fn try_lock_fairly(
        &self,
        ino: Ino,
        owner: u64,
        pid: u32,
        start: u64,
        end: u64,
        kind: LockKind,
    ) -> Result<(), Errno> {
        if end < start || kind == LockKind::Unlock {
            return Err(Errno::EINVAL);
        }
        let req = Request::Lock { ino, client: self.inner.client_id, owner, pid, start, end, kind, flags: LOCK_FAIR };
        let r = self.call_retrying(req.clone(), false, crate::link::WAIT_FOR_RECONNECT);
        self.granted(r, &req)
    }

    /// The first lock of another owner that would stop `owner` taking a
    /// `kind` lock over `start..=end` (`F_GETLK`); its pid is 0 when
    /// another client holds it.
    pub fn test_lock(
        &self,
        ino: Ino,
        owner: u64,
        start: u64,
        end: u64,
        kind: LockKind,
    ) -> Result<Option<LockHolder>, Errno> {
        if end < start || kind == LockKind::Unlock {
            return Err(Errno::EINVAL);
        }
        let req = Request::TestLock { ino, client: self.inner.client_id, owner, start, end, kind };
        match self.call_retrying(req, false, crate::link::WAIT_FOR_RECONNECT)? {
            Response::LockTest { conflict } => Ok(conflict),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Sends a lock request, again on a new connection when the one it
    /// went on broke (lock requests may be repeated: granting a lock its
    /// owner holds, or releasing one it does not, changes nothing), for
    /// up to `patience`. `unbounded`: no call timeout (a waiting lock).
    pub(crate) fn call_retrying(&self, req: Request, unbounded: bool, patience: Duration) -> Result<Response, Errno> {
        let began = Instant::now();
        loop {
            let tag = self.next_tag();
            let Some((c, generation)) = self.inner.link.get() else {
                if began.elapsed() > patience {
                    return Err(Errno::EIO);
                }
                std::thread::sleep(crate::link::RETRY_EVERY);
                continue;
            };
            let payload = encode_request(self.envelope(tag), &req);
            if !matches!(req, Request::Watch { .. }) {
                crate::calls::meta_sent();
            }
            let answer = if unbounded {
                futures::executor::block_on(c.call_async_unbounded(payload))
            } else {
                futures::executor::block_on(c.call_async(payload))
            };
            match answer {
                Ok(bytes) => {
                    let (rtag, _, result) = decode_reply(&bytes).map_err(|_| Errno::EPROTO)?;
                    if rtag != tag {
                        return Err(Errno::EPROTO);
                    }
                    return result;
                }
                Err(e) => {
                    self.inner.link.failed(generation, &e);
                    if began.elapsed() > patience {
                        return Err(crate::io_err(e));
                    }
                }
            }
        }
    }
}
