//! The transport frame: the fixed 64-byte header carried as the UCX
//! active-message header of every dafne message.
//!
//! ```text
//! offset size field
//!      0    2 magic        0xDAF0
//!      2    1 version      FRAME_VERSION (5)
//!      3    1 kind         FrameKind
//!      4    4 status       transport status (0 = ok; see TransportStatus)
//!      8    4 conn_id      connection id assigned by the server (0 before)
//!     12    4 credits      request credits granted by the sender of this frame
//!     16    8 corr         correlation id (request <-> reply, hello <-> welcome)
//!     24    8 token        connection secret assigned by the server
//!     32    4 payload_len  length of the AM data that follows
//!     36    4 reserved     must be zero
//!     40    8 seq          0: untagged; else this direction's sequence number (from 1)
//!     48   16 tag          keyed BLAKE3(direction key, payload ‖ bytes 0..48), first
//!                          16 bytes; all zero when seq is 0 (version 3: HMAC-SHA256)
//! ```
//! All fields little-endian. The header is decoded by [`FrameHeader::decode`],
//! which treats its input as hostile: every way it can be wrong has its own
//! [`FrameError`]. Bumping `FRAME_VERSION` is required for any layout change;
//! a receiver rejects other versions.
//!
//! # Frame authentication
//! Until an application login succeeds a connection's frames are untagged
//! (seq 0, tag zero): the token alone names the connection. The login
//! gives both ends per-direction keys (`dafne_auth::Secret::frame_keys`,
//! from the login's token and nonce and the secret it was verified with);
//! from then on every frame of that connection, both ways, carries the
//! next sequence number of its direction and a tag over its header and
//! payload. The receiver refuses a frame whose tag does not verify, an
//! untagged one, and a sequence number it has seen ([`ReplayWindow`]), so
//! a token or a whole frame copied off the wire is worth nothing: a copy
//! sent again is a replay, a changed one fails its tag, and a new frame
//! needs the key. What the tag does not cover: bulk data moved by RMA
//! (its bytes are never in a frame), and hello/welcome (before keys).

/// Size of the encoded header.
pub const FRAME_HEADER_LEN: usize = 64;
pub const FRAME_MAGIC: u16 = 0xDAF0;
/// 5: the hello states the client's shared-memory FIFO settings and the
/// server may send `FrameKind::Upgrade` (4: hellos without them, which a
/// version-5 server cannot decode; 3: HMAC-SHA256 tags).
pub const FRAME_VERSION: u8 = 5;
/// The header bytes a tag covers: everything before the tag.
pub const TAGGED_HEADER_LEN: usize = 48;
/// Length of a frame's tag.
pub const TAG_LEN: usize = dafne_auth::FRAME_TAG_LEN;
const _: () = assert!(TAGGED_HEADER_LEN + TAG_LEN == FRAME_HEADER_LEN);

/// The UCX active-message id all dafne frames use.
pub const AM_ID: u16 = 7;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Client -> server on the control endpoint: payload = [`Hello`].
    Hello = 1,
    /// Server -> client on the control endpoint: payload = [`Welcome`].
    Welcome = 2,
    /// Client -> server on the data endpoint: an application request.
    Request = 3,
    /// Server -> client on the data endpoint: the reply to `corr`.
    Reply = 4,
    /// Keepalive probe on the control endpoint (client -> server).
    Ping = 5,
    /// Keepalive answer (server -> client).
    Pong = 6,
    /// Orderly goodbye on the control endpoint.
    Bye = 7,
    /// Server -> client, once its login was verified, on the new data
    /// endpoint to the client's worker with every transport (shared memory
    /// on one host): payload = the server's full worker address (before,
    /// the welcome gave its network-only one). Tagged with the login's
    /// keys; see `server` module docs, "Shared memory after the login".
    Upgrade = 8,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Hello,
            2 => FrameKind::Welcome,
            3 => FrameKind::Request,
            4 => FrameKind::Reply,
            5 => FrameKind::Ping,
            6 => FrameKind::Pong,
            7 => FrameKind::Bye,
            8 => FrameKind::Upgrade,
            _ => return None,
        })
    }
}

/// Transport-level outcome carried in `status` (application errors travel
/// inside the payload, defined by the protocol above this layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum TransportStatus {
    Ok = 0,
    /// The request arrived while the client had no credit left.
    NoCredit = 1,
    /// The request named an unknown connection or a wrong token.
    BadConnection = 2,
    /// The payload exceeds the receiver's limit.
    TooLarge = 3,
    /// The server's handler failed without producing a reply.
    HandlerFailed = 4,
    /// The server is shutting down.
    ShuttingDown = 5,
}

impl TransportStatus {
    pub fn from_i32(v: i32) -> Option<TransportStatus> {
        Some(match v {
            0 => TransportStatus::Ok,
            1 => TransportStatus::NoCredit,
            2 => TransportStatus::BadConnection,
            3 => TransportStatus::TooLarge,
            4 => TransportStatus::HandlerFailed,
            5 => TransportStatus::ShuttingDown,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub status: i32,
    pub conn_id: u32,
    pub credits: u32,
    pub corr: u64,
    pub token: u64,
    pub payload_len: u32,
    /// This direction's sequence number once the connection has keys; 0
    /// in an untagged frame.
    pub seq: u64,
    /// The frame's tag (module docs); zero in an untagged frame.
    pub tag: [u8; TAG_LEN],
}

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("header is {0} bytes, expected {FRAME_HEADER_LEN}")]
    BadLength(usize),
    #[error("bad magic {0:#06x}, expected {FRAME_MAGIC:#06x}")]
    BadMagic(u16),
    #[error("unsupported frame version {0} (this build speaks {FRAME_VERSION})")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("reserved field is {0:#x}, must be zero")]
    Reserved(u32),
    #[error("header announces {announced} payload bytes but {actual} arrived")]
    LengthMismatch { announced: u32, actual: usize },
    #[error("payload of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("untagged frame (sequence number 0) with a non-zero tag")]
    StrayTag,
}

impl FrameHeader {
    pub fn new(kind: FrameKind) -> FrameHeader {
        FrameHeader {
            kind,
            status: 0,
            conn_id: 0,
            credits: 0,
            corr: 0,
            token: 0,
            payload_len: 0,
            seq: 0,
            tag: [0; TAG_LEN],
        }
    }

    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0..2].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[2] = FRAME_VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..12].copy_from_slice(&self.conn_id.to_le_bytes());
        b[12..16].copy_from_slice(&self.credits.to_le_bytes());
        b[16..24].copy_from_slice(&self.corr.to_le_bytes());
        b[24..32].copy_from_slice(&self.token.to_le_bytes());
        b[32..36].copy_from_slice(&self.payload_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.seq.to_le_bytes());
        b[48..64].copy_from_slice(&self.tag);
        b
    }

    /// Sets `seq` and the tag made with `key` over this header and `payload`.
    pub fn seal(&mut self, key: &dafne_auth::FrameKey, seq: u64, payload: &[u8]) {
        self.seq = seq;
        self.tag = key.tag(&self.encode()[..TAGGED_HEADER_LEN], payload);
    }

    /// Whether this (tagged) frame's tag is `key`'s over its header and
    /// `payload`. Constant time.
    pub fn verify(&self, key: &dafne_auth::FrameKey, payload: &[u8]) -> bool {
        key.verify(&self.encode()[..TAGGED_HEADER_LEN], payload, &self.tag)
    }

    /// Decodes and validates a header. `payload_len` is checked against the
    /// payload size UCX reports and against `max_payload`.
    pub fn decode(b: &[u8], actual_payload: usize, max_payload: usize) -> Result<FrameHeader, FrameError> {
        if b.len() != FRAME_HEADER_LEN {
            return Err(FrameError::BadLength(b.len()));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let magic = u16_at(0);
        if magic != FRAME_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[2] != FRAME_VERSION {
            return Err(FrameError::BadVersion(b[2]));
        }
        let kind = FrameKind::from_u8(b[3]).ok_or(FrameError::BadKind(b[3]))?;
        let reserved = u32_at(36);
        if reserved != 0 {
            return Err(FrameError::Reserved(reserved));
        }
        let payload_len = u32_at(32);
        if payload_len as usize != actual_payload {
            return Err(FrameError::LengthMismatch { announced: payload_len, actual: actual_payload });
        }
        if actual_payload > max_payload {
            return Err(FrameError::TooLarge { len: actual_payload, limit: max_payload });
        }
        let seq = u64_at(40);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&b[48..64]);
        if seq == 0 && tag != [0; TAG_LEN] {
            return Err(FrameError::StrayTag);
        }
        Ok(FrameHeader {
            kind,
            status: u32_at(4) as i32,
            conn_id: u32_at(8),
            credits: u32_at(12),
            corr: u64_at(16),
            token: u64_at(24),
            payload_len,
            seq,
            tag,
        })
    }
}

/// Width of the replay window, in sequence numbers.
pub const REPLAY_WINDOW: u64 = 1024;

/// The sequence numbers of one direction a receiver has accepted, IPsec
/// style (RFC 4303 3.4.3, with RFC 6479's ring of bits): the highest one,
/// and which of the [`REPLAY_WINDOW`] below it were seen. A frame is fresh
/// if its number is above the highest, or within the window and not seen;
/// anything older than the window is refused.
///
/// Why a window and not "each number one above the last": UCX does not
/// keep order between the frames of one endpoint. A small payload goes
/// eager and a large one by rendezvous (its payload fetched after the
/// header arrives), so a request sent after a large one may be delivered
/// first; pings and bye travel on the control endpoint, requests on the
/// data endpoint. Strict order would refuse honest frames. 1024 numbers
/// cover far more than can be out of order at once: a client has at most
/// its credits (64 by default) of requests in flight, plus a ping.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// The highest number accepted (0: none yet).
    top: u64,
    /// Bit `n % REPLAY_WINDOW` is set when `n` (within the window) was seen.
    seen: [u64; (REPLAY_WINDOW / 64) as usize],
}

/// Why a sequence number was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Replay {
    #[error("sequence number 0 (an untagged frame)")]
    Zero,
    #[error("sequence number {seq} was seen already")]
    Seen { seq: u64 },
    #[error("sequence number {seq} is older than the window (highest {top})")]
    TooOld { seq: u64, top: u64 },
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow { top: 0, seen: [0; (REPLAY_WINDOW / 64) as usize] }
    }
}

impl ReplayWindow {
    fn bit(seq: u64) -> (usize, u64) {
        let i = seq % REPLAY_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Whether `seq` would be accepted. Check before the tag (cheap), and
    /// [`ReplayWindow::record`] only after it verified: a forged frame
    /// must not move the window.
    pub fn check(&self, seq: u64) -> Result<(), Replay> {
        if seq == 0 {
            return Err(Replay::Zero);
        }
        if seq > self.top {
            return Ok(());
        }
        if self.top - seq >= REPLAY_WINDOW {
            return Err(Replay::TooOld { seq, top: self.top });
        }
        let (w, m) = Self::bit(seq);
        if self.seen[w] & m != 0 {
            return Err(Replay::Seen { seq });
        }
        Ok(())
    }

    /// Checks and records `seq` as seen.
    pub fn record(&mut self, seq: u64) -> Result<(), Replay> {
        self.check(seq)?;
        if seq > self.top {
            if seq - self.top >= REPLAY_WINDOW {
                self.seen = [0; (REPLAY_WINDOW / 64) as usize];
            } else {
                // The numbers between the old top and `seq` enter the
                // window unseen (their bits still hold numbers a window ago).
                for n in self.top + 1..seq {
                    let (w, m) = Self::bit(n);
                    self.seen[w] &= !m;
                }
            }
            self.top = seq;
        }
        let (w, m) = Self::bit(seq);
        self.seen[w] |= m;
        Ok(())
    }
}

/// Client's first message: who it is and how to reach its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Identifies the host (boot id): equal ids mean shared memory may work.
    pub host_id: [u8; 16],
    /// Largest reply payload the client accepts.
    pub max_reply: u32,
    /// The client worker's UCX address.
    pub worker_address: Vec<u8>,
    /// The client's shared-memory FIFO geometry (`shm_geometry`), at most
    /// [`MAX_SHM_GEOMETRY`] bytes: the server moves the connection to
    /// shared memory after the login only if it equals its own.
    pub shm_geometry: Vec<u8>,
}

/// Bound on [`Hello::shm_geometry`].
pub const MAX_SHM_GEOMETRY: usize = 512;

/// Server's answer: the connection id, token, credits and its worker address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub host_id: [u8; 16],
    /// Largest request payload the server accepts.
    pub max_request: u32,
    pub worker_address: Vec<u8>,
}

/// In a welcome's header `status`: the server made its data endpoint with
/// UCX error handling on and sent its network-only worker address, until
/// the client's login is verified (`FrameKind::Upgrade` then follows). The
/// client's data endpoint must have error handling on too: UCX refuses a
/// pair of endpoints whose error handling differs ("asymmetric endpoint
/// configuration"). 0: the data endpoints are made as the host ids say.
pub const WELCOME_SHM_AFTER_LOGIN: i32 = 1;

/// Bound on a worker address inside a hello/welcome.
pub const MAX_ADDRESS: usize = dafne_ucx::MAX_WORKER_ADDRESS_BYTES;

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(28 + self.worker_address.len() + self.shm_geometry.len());
        v.extend_from_slice(&self.host_id);
        v.extend_from_slice(&self.max_reply.to_le_bytes());
        v.extend_from_slice(&(self.worker_address.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.worker_address);
        v.extend_from_slice(&(self.shm_geometry.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.shm_geometry);
        v
    }

    pub fn decode(b: &[u8]) -> Result<Hello, String> {
        let (host_id, rest) = take_host(b)?;
        if rest.len() < 4 {
            return Err("hello truncated before max_reply".into());
        }
        let max_reply = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let rest = &rest[4..];
        if rest.len() < 4 {
            return Err("hello truncated before the address length".into());
        }
        let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if n == 0 || n > MAX_ADDRESS || rest.len() < 4 + n {
            return Err(format!("hello: worker address length {n} outside 1..={MAX_ADDRESS} or past the end"));
        }
        let worker_address = rest[4..4 + n].to_vec();
        let rest = &rest[4 + n..];
        if rest.len() < 4 {
            return Err("hello truncated before the shared-memory geometry".into());
        }
        let g = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if g > MAX_SHM_GEOMETRY || rest.len() != 4 + g {
            return Err(format!(
                "hello: shared-memory geometry of {g} bytes (at most {MAX_SHM_GEOMETRY}) does not fit"
            ));
        }
        Ok(Hello { host_id, max_reply, worker_address, shm_geometry: rest[4..].to_vec() })
    }
}

impl Welcome {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24 + self.worker_address.len());
        v.extend_from_slice(&self.host_id);
        v.extend_from_slice(&self.max_request.to_le_bytes());
        v.extend_from_slice(&(self.worker_address.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.worker_address);
        v
    }

    pub fn decode(b: &[u8]) -> Result<Welcome, String> {
        let (host_id, rest) = take_host(b)?;
        if rest.len() < 4 {
            return Err("welcome truncated before max_request".into());
        }
        let max_request = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let worker_address = take_blob(&rest[4..])?;
        Ok(Welcome { host_id, max_request, worker_address })
    }
}

fn take_host(b: &[u8]) -> Result<([u8; 16], &[u8]), String> {
    if b.len() < 16 {
        return Err(format!("{} bytes: too short for a host id", b.len()));
    }
    let mut h = [0u8; 16];
    h.copy_from_slice(&b[..16]);
    Ok((h, &b[16..]))
}

fn take_blob(b: &[u8]) -> Result<Vec<u8>, String> {
    if b.len() < 4 {
        return Err("truncated before the address length".into());
    }
    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if n == 0 || n > MAX_ADDRESS {
        return Err(format!("worker address length {n} outside 1..={MAX_ADDRESS}"));
    }
    if b.len() != 4 + n {
        return Err(format!("address announces {n} bytes, {} present", b.len() - 4));
    }
    Ok(b[4..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameHeader {
        FrameHeader {
            kind: FrameKind::Request,
            status: -3,
            conn_id: 7,
            credits: 9,
            corr: u64::MAX - 1,
            token: 0x1234_5678_9abc_def0,
            payload_len: 100,
            seq: 5,
            tag: [0xA5; TAG_LEN],
        }
    }

    #[test]
    fn header_round_trips() {
        let h = sample();
        assert_eq!(FrameHeader::decode(&h.encode(), 100, 1000), Ok(h));
    }

    #[test]
    fn every_corruption_is_named() {
        let good = sample().encode();
        assert_eq!(FrameHeader::decode(&good[..63], 100, 1000), Err(FrameError::BadLength(63)));
        let mut b = good;
        b[0] = 0;
        assert!(matches!(FrameHeader::decode(&b, 100, 1000), Err(FrameError::BadMagic(_))));
        let mut b = good;
        b[2] = 9;
        assert_eq!(FrameHeader::decode(&b, 100, 1000), Err(FrameError::BadVersion(9)));
        let mut b = good;
        b[3] = 200;
        assert_eq!(FrameHeader::decode(&b, 100, 1000), Err(FrameError::BadKind(200)));
        let mut b = good;
        b[40..48].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(FrameHeader::decode(&b, 100, 1000), Err(FrameError::StrayTag));
        let mut b = good;
        b[39] = 1;
        assert!(matches!(FrameHeader::decode(&b, 100, 1000), Err(FrameError::Reserved(_))));
        assert_eq!(
            FrameHeader::decode(&good, 99, 1000),
            Err(FrameError::LengthMismatch { announced: 100, actual: 99 })
        );
        assert_eq!(FrameHeader::decode(&good, 100, 50), Err(FrameError::TooLarge { len: 100, limit: 50 }));
    }

    #[test]
    fn a_sealed_frame_verifies_and_any_change_breaks_it() {
        let keys = dafne_auth::Secret::from_bytes([3; 32]).frame_keys(9, &[4; 16]);
        let payload = b"a request".to_vec();
        let mut h = sample();
        h.payload_len = payload.len() as u32;
        h.seal(&keys.to_server, 42, &payload);
        assert_eq!(h.seq, 42);
        let got = FrameHeader::decode(&h.encode(), payload.len(), 1000).unwrap();
        assert!(got.verify(&keys.to_server, &payload));
        assert!(!got.verify(&keys.to_client, &payload), "the other direction's key");
        let mut bad = payload.clone();
        bad[0] ^= 1;
        assert!(!got.verify(&keys.to_server, &bad), "payload changed");
        // Every header byte the tag covers matters.
        for i in 0..TAGGED_HEADER_LEN {
            let mut b = h.encode();
            b[i] ^= 0x10;
            if let Ok(x) = FrameHeader::decode(&b, payload.len(), 1000) {
                assert!(!x.verify(&keys.to_server, &payload), "byte {i} changed");
            }
        }
    }

    #[test]
    fn the_replay_window_takes_each_number_once_in_any_order_within_its_width() {
        let mut w = ReplayWindow::default();
        assert_eq!(w.record(0), Err(Replay::Zero));
        for s in [3, 1, 2, 10, 5] {
            assert_eq!(w.record(s), Ok(()), "{s}");
        }
        for s in [1, 2, 3, 5, 10] {
            assert_eq!(w.record(s), Err(Replay::Seen { seq: s }));
        }
        assert_eq!(w.check(4), Ok(()), "skipped, still in the window");
        assert_eq!(w.record(10 + REPLAY_WINDOW), Ok(()));
        assert_eq!(w.record(10), Err(Replay::TooOld { seq: 10, top: 10 + REPLAY_WINDOW }));
        assert_eq!(w.record(11), Ok(()), "the oldest number inside the window");
        assert_eq!(w.record(11), Err(Replay::Seen { seq: 11 }));
        // The ring's bits of numbers a window ago do not count as seen.
        let top = 10 + REPLAY_WINDOW;
        assert_eq!(w.record(top + 5), Ok(()));
        assert_eq!(w.record(top + 3), Ok(()), "{} shares a bit with 2 + window", top + 3);
        assert_eq!(w.record(top + 5 + 10 * REPLAY_WINDOW), Ok(()), "a jump clears the window");
        assert_eq!(w.record(top + 5), Err(Replay::TooOld { seq: top + 5, top: top + 5 + 10 * REPLAY_WINDOW }));
    }

    #[test]
    fn the_replay_window_agrees_with_a_set_model() {
        let mut w = ReplayWindow::default();
        let mut seen = std::collections::HashSet::new();
        let mut top = 0u64;
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly forward, sometimes back (reordering), sometimes replays.
            let s = match x % 8 {
                0 => i / 2 + 1,
                1 => (top + 1).saturating_sub(x % (REPLAY_WINDOW + 50)).max(1),
                _ => top + 1 + x % 4,
            };
            let want = if s > top {
                Ok(())
            } else if top - s >= REPLAY_WINDOW {
                Err(Replay::TooOld { seq: s, top })
            } else if seen.contains(&s) {
                Err(Replay::Seen { seq: s })
            } else {
                Ok(())
            };
            assert_eq!(w.record(s), want, "step {i}, seq {s}, top {top}");
            if want.is_ok() {
                seen.insert(s);
                top = top.max(s);
            }
        }
    }

    #[test]
    fn decode_never_panics_on_any_short_or_random_input() {
        // A deterministic sweep over lengths and byte patterns.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 0..80 {
            for _ in 0..200 {
                let buf: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                let _ = FrameHeader::decode(&buf, (x % 5000) as usize, 4096);
                let _ = Hello::decode(&buf);
                let _ = Welcome::decode(&buf);
            }
        }
    }

    #[test]
    fn hello_and_welcome_round_trip_and_reject_lies() {
        let h = Hello {
            host_id: [3; 16],
            max_reply: 1 << 24,
            worker_address: vec![1, 2, 3],
            shm_geometry: b"a=1".to_vec(),
        };
        assert_eq!(Hello::decode(&h.encode()), Ok(h.clone()));
        let w = Welcome { host_id: [4; 16], max_request: 1 << 20, worker_address: vec![9; 200] };
        assert_eq!(Welcome::decode(&w.encode()), Ok(w));
        let mut lie = h.encode();
        lie[20..24].copy_from_slice(&(u32::MAX).to_le_bytes());
        assert!(Hello::decode(&lie).is_err());
        let mut short = h.encode();
        short.pop();
        assert!(Hello::decode(&short).is_err());
        let mut long_geometry = h.encode();
        long_geometry[27..31].copy_from_slice(&10_000u32.to_le_bytes());
        assert!(Hello::decode(&long_geometry).is_err());
    }

    /// A peer of the previous layout (version 4: its hello has no FIFO
    /// settings, no `Upgrade` frame) is refused by its version, a clear
    /// error, not by a hello that fails to decode (and, the other way, its
    /// decoder misreading ours). Before, the layout changed without a new
    /// version.
    #[test]
    fn a_version_4_peer_is_refused_by_its_version() {
        let mut b = FrameHeader::new(FrameKind::Hello).encode();
        b[2] = 4;
        assert_eq!(FrameHeader::decode(&b, 0, 0), Err(FrameError::BadVersion(4)));
    }
}
