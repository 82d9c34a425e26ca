//! The transport frame: the fixed 40-byte header carried as the UCX
//! active-message header of every dafne message.
//!
//! ```text
//! offset size field
//!      0    2 magic        0xDAF0
//!      2    1 version      FRAME_VERSION
//!      3    1 kind         FrameKind
//!      4    4 status       transport status (0 = ok; see TransportStatus)
//!      8    4 conn_id      connection id assigned by the server (0 before)
//!     12    4 credits      request credits granted by the sender of this frame
//!     16    8 corr         correlation id (request <-> reply, hello <-> welcome)
//!     24    8 token        connection secret assigned by the server
//!     32    4 payload_len  length of the AM data that follows
//!     36    4 reserved     must be zero
//! ```
//! All fields little-endian. The header is decoded by [`FrameHeader::decode`],
//! which treats its input as hostile: every way it can be wrong has its own
//! [`FrameError`]. Bumping `FRAME_VERSION` is required for any layout change;
//! a receiver rejects other versions.

/// Size of the encoded header.
pub const FRAME_HEADER_LEN: usize = 40;
pub const FRAME_MAGIC: u16 = 0xDAF0;
pub const FRAME_VERSION: u8 = 2;

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
}

impl FrameHeader {
    pub fn new(kind: FrameKind) -> FrameHeader {
        FrameHeader { kind, status: 0, conn_id: 0, credits: 0, corr: 0, token: 0, payload_len: 0 }
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
        b
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
        Ok(FrameHeader {
            kind,
            status: u32_at(4) as i32,
            conn_id: u32_at(8),
            credits: u32_at(12),
            corr: u64_at(16),
            token: u64_at(24),
            payload_len,
        })
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
}

/// Server's answer: the connection id, token, credits and its worker address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub host_id: [u8; 16],
    /// Largest request payload the server accepts.
    pub max_request: u32,
    pub worker_address: Vec<u8>,
}

/// Bound on a worker address inside a hello/welcome.
pub const MAX_ADDRESS: usize = dafne_ucx::MAX_WORKER_ADDRESS_BYTES;

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24 + self.worker_address.len());
        v.extend_from_slice(&self.host_id);
        v.extend_from_slice(&self.max_reply.to_le_bytes());
        v.extend_from_slice(&(self.worker_address.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.worker_address);
        v
    }

    pub fn decode(b: &[u8]) -> Result<Hello, String> {
        let (host_id, rest) = take_host(b)?;
        if rest.len() < 4 {
            return Err("hello truncated before max_reply".into());
        }
        let max_reply = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let worker_address = take_blob(&rest[4..])?;
        Ok(Hello { host_id, max_reply, worker_address })
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
        assert_eq!(FrameHeader::decode(&good[..39], 100, 1000), Err(FrameError::BadLength(39)));
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
        b[39] = 1;
        assert!(matches!(FrameHeader::decode(&b, 100, 1000), Err(FrameError::Reserved(_))));
        assert_eq!(
            FrameHeader::decode(&good, 99, 1000),
            Err(FrameError::LengthMismatch { announced: 100, actual: 99 })
        );
        assert_eq!(FrameHeader::decode(&good, 100, 50), Err(FrameError::TooLarge { len: 100, limit: 50 }));
    }

    #[test]
    fn decode_never_panics_on_any_short_or_random_input() {
        // A deterministic sweep over lengths and byte patterns.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 0..64 {
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
        let h = Hello { host_id: [3; 16], max_reply: 1 << 24, worker_address: vec![1, 2, 3] };
        assert_eq!(Hello::decode(&h.encode()), Ok(h.clone()));
        let w = Welcome { host_id: [4; 16], max_request: 1 << 20, worker_address: vec![9; 200] };
        assert_eq!(Welcome::decode(&w.encode()), Ok(w));
        let mut lie = h.encode();
        lie[20..24].copy_from_slice(&(u32::MAX).to_le_bytes());
        assert!(Hello::decode(&lie).is_err());
        let mut short = h.encode();
        short.pop();
        assert!(Hello::decode(&short).is_err());
    }
}
