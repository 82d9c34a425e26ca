//! One connection's frame keys at one end: sealing what it sends,
//! checking what it receives (`frame` module docs, "Frame authentication").

use std::cell::{Cell, RefCell};

use dafne_auth::FrameKey;

use crate::frame::{FrameHeader, Replay, ReplayWindow};

/// Why a frame on a connection was refused by its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("an untagged frame on a connection that has frame keys")]
    Untagged,
    #[error("a tagged frame on a connection without frame keys")]
    NoKeys,
    #[error("its tag does not verify")]
    BadTag,
    #[error("{0}")]
    Replayed(Replay),
}

/// The keys of one end of a connection.
pub(crate) struct ConnKeys {
    send: FrameKey,
    recv: FrameKey,
    /// The sequence number of the next frame sent (from 1).
    next_seq: Cell<u64>,
    window: RefCell<ReplayWindow>,
    /// Untagged frames are still accepted: a client's, until the first
    /// tagged frame from the server verifies (its login's answer). The
    /// client installs its keys as it sends the login, before it knows
    /// whether the server accepted it; a server that refused the login
    /// answers untagged, and that answer must reach the caller. The
    /// server installs keys only on a verified login: it is never lenient.
    lenient: Cell<bool>,
}

impl ConnKeys {
    pub(crate) fn new(send: FrameKey, recv: FrameKey, lenient: bool) -> ConnKeys {
        ConnKeys {
            send,
            recv,
            next_seq: Cell::new(1),
            window: RefCell::new(ReplayWindow::default()),
            lenient: Cell::new(lenient),
        }
    }

    /// Gives `h` the next sequence number and its tag over `payload`.
    pub(crate) fn seal(&self, h: &mut FrameHeader, payload: &[u8]) {
        let seq = self.next_seq.get();
        // 2^64 frames are never sent on one connection; a wrap would
        // reuse numbers, so it is a broken invariant, not an error.
        assert!(seq != u64::MAX, "frame sequence numbers exhausted");
        self.next_seq.set(seq + 1);
        h.seal(&self.send, seq, payload);
    }

    /// Whether a received frame is genuine and fresh; records its number.
    pub(crate) fn open(&self, h: &FrameHeader, payload: &[u8]) -> Result<(), Refused> {
        if h.seq == 0 {
            return if self.lenient.get() { Ok(()) } else { Err(Refused::Untagged) };
        }
        self.window.borrow().check(h.seq).map_err(Refused::Replayed)?;
        if !h.verify(&self.recv, payload) {
            return Err(Refused::BadTag);
        }
        self.window.borrow_mut().record(h.seq).map_err(Refused::Replayed)?;
        self.lenient.set(false);
        Ok(())
    }
}

/// What a receiver does with a frame on a connection with `keys` (None:
/// no keys yet). `accept_tagged_without_keys`: a client without keys takes
/// tagged frames unchecked (it has nothing to check them with, and never
/// asked for authentication); a server refuses them.
pub(crate) fn admit(
    keys: Option<&ConnKeys>,
    h: &FrameHeader,
    payload: &[u8],
    accept_tagged_without_keys: bool,
) -> Result<(), Refused> {
    match keys {
        Some(k) => k.open(h, payload),
        None if h.seq != 0 && !accept_tagged_without_keys => Err(Refused::NoKeys),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;

    fn pair() -> (ConnKeys, ConnKeys) {
        let k = dafne_auth::Secret::from_bytes([1; 32]).frame_keys(5, &[6; 16]);
        (ConnKeys::new(k.to_server.clone(), k.to_client.clone(), true), ConnKeys::new(k.to_client, k.to_server, false))
    }

    #[test]
    fn sealed_frames_pass_once_and_copies_changes_and_untagged_frames_do_not() {
        let (client, server) = pair();
        let mut frames = Vec::new();
        for i in 0..5u8 {
            let mut h = FrameHeader::new(FrameKind::Request);
            h.token = 77;
            h.payload_len = 1;
            client.seal(&mut h, &[i]);
            frames.push((h, vec![i]));
        }
        // Out of order is fine, twice is not.
        for i in [1, 0, 4, 2, 3] {
            let (h, p) = &frames[i];
            assert_eq!(server.open(h, p), Ok(()));
            assert_eq!(server.open(h, p), Err(Refused::Replayed(Replay::Seen { seq: h.seq })));
        }
        let (h, _) = &frames[0];
        let mut h2 = *h;
        h2.seq = 100;
        assert_eq!(server.open(&h2, &[0]), Err(Refused::BadTag), "renumbered");
        assert_eq!(server.open(&FrameHeader::new(FrameKind::Request), &[]), Err(Refused::Untagged));
        assert_eq!(admit(None, h, &[0], false), Err(Refused::NoKeys));
        assert_eq!(admit(None, h, &[0], true), Ok(()));
        // A forged frame does not move the window: the genuine one with
        // that number still passes.
        let mut genuine = FrameHeader::new(FrameKind::Request);
        client.seal(&mut genuine, b"x");
        let mut forged = genuine;
        forged.tag[0] ^= 1;
        assert_eq!(server.open(&forged, b"x"), Err(Refused::BadTag));
        assert_eq!(server.open(&genuine, b"x"), Ok(()));
        // The client takes untagged frames until a tagged one verified.
        let mut reply = FrameHeader::new(FrameKind::Reply);
        assert_eq!(client.open(&reply, &[]), Ok(()));
        server.seal(&mut reply, &[]);
        assert_eq!(client.open(&reply, &[]), Ok(()));
        assert_eq!(client.open(&FrameHeader::new(FrameKind::Pong), &[]), Err(Refused::Untagged));
    }
}
