//! The io-server wire contract: what a client and an io server say to each
//! other inside the transport's `Request`/`Reply` frames.
//!
//! Io servers store each file's data. The client splits a file range by
//! stripe and sends each io server one request listing *extents*: byte
//! ranges of the file, each with where its bytes are. Bulk data moves by
//! RMA driven by the server against memory keys the client packed into the
//! request (the server *puts* read data into client memory and *gets* write
//! data from it; the server never exposes memory of its own), or inline in
//! the request (small writes) or in the reply (small reads). The object is
//! the capability's `object_id`; an io server stores each object sparsely,
//! at file offsets.
//!
//! Framing is the metadata protocol's (crate docs): the same 32-byte
//! headers ([`IoRequestHeader`], [`IoReplyHeader`] are
//! [`RequestHeader`](crate::RequestHeader) and
//! [`ReplyHeader`](crate::ReplyHeader) with an [`IoOp`] in the op field), little-endian, no
//! padding, one canonical encoding per value, hostile decoding, errors as
//! Linux errno values. Io op numbers are 64 and up, in the one op number
//! space the two protocols share (crate docs, "Op numbers"): a metadata
//! decoder refuses them with [`DecodeError::UnknownOp`], and the io
//! decoders refuse metadata op numbers the same way.
//!
//! # Ops
//!
//! | op | number | request body | reply body ([`IoResponse`]) |
//! |---|---|---|---|
//! | Read | 64 | capability, keys_follow?, keys, extents, inline_reply u8 | `Read`: bytes u64, data |
//! | Write | 65 | capability, keys_follow?, keys, extents, stability u8, inline | `Write`: bytes u64 |
//! | Truncate | 66 | capability, size u64 | `Done`: empty |
//! | Remove | 67 | capability | `Done`: empty |
//! | Sync | 68 | capability | `Done`: empty |
//! | Stat | 69 | capability | `Stat`: size u64 |
//! | ServerInfo | 70 | capability | `ServerInfo`: n u32 (≤ [`MAX_INFO_FIELDS`]), n × u64, then c u32 (≤ [`crate::MAX_CHAINS`]), c × {chain id u32 (strictly increasing), version u64} |
//! | Revoke | 71 | capability, revocations | `Revoked`: instance u64, seq u64 |
//! | Login | 72 | client_name str, nonce \[16\], mac \[32\], credential? | `Done`: empty |
//! | Allocate | 73 | capability, offset u64, len u64, mode u8, stripes | `Done`: empty |
//! | Keys | 74 | tag u64, keys (1..=[`MAX_IO_KEYS`]) | `Done`: empty |
//! | Scrub | 75 | capability, object u64, offset u64 | `Scrubbed`: [`ScrubSlice`] |
//!
//! Read, Write, Truncate, Sync, Stat and Allocate may also be answered
//! [`CHAIN_REFUSED`] with a [`ChainRefusal`] body (below, "Chains"), and
//! carry their chain in front of the body ([`crate::REQUEST_FLAG_CHAIN`]).
//!
//! Numbers are never reused: a retired op keeps its number, unassigned.
//!
//! Building blocks:
//! * `capability`: as in the metadata protocol (object_id u64, rights u8,
//!   expiry_unix_ns u64, mac \[32\]; 49 bytes). The io server checks it.
//! * `keys`: n u32 (≤ [`MAX_IO_KEYS`]), n × {len u32 (1..=[`MAX_IO_KEY_BYTES`]),
//!   packed memory key bytes}. Keys no extent names are allowed (and
//!   useless).
//! * `extent` ([`IoExtent`]): offset u64, len u32, key u16, addr u64. 22
//!   bytes. `offset` is the byte offset in the *file*; `len` is at least 1
//!   and `offset + len` does not overflow u64; `key` indexes the request's
//!   keys, or is [`NO_KEY`] for inline data, in which case `addr` (the
//!   client address of the segment under that key) must be 0.
//! * `extents`: n u32 (≤ [`MAX_IO_EXTENTS`]), n × extent. The lengths add up
//!   to at most [`MAX_IO_BYTES`]. Extents may overlap and come in any order;
//!   none is also fine (a no-op).
//! * `data`, `inline`: u32 length (≤ [`MAX_INLINE`]) + bytes.
//! * `stability` ([`Stability`]): 0 Unstable, 1 DataSync, 2 FileSync.
//! * `mode` ([`AllocateMode`]): 0 Reserve, 1 ReserveKeepSize, 2 PunchHole,
//!   3 ZeroRange, 4 ZeroRangeKeepSize.
//! * `stripes` ([`StripeSlots`]): unit u32 (≥ 1), count u32 (1..=
//!   [`MAX_LAYOUT_SERVERS`](crate::MAX_LAYOUT_SERVERS)), n u32 (1..=count),
//!   n × slot u32, strictly ascending, each below count.
//!
//! # Read and Write
//!
//! * `Read` without `inline_reply`: every extent has a key; the server puts
//!   the file's bytes `[offset, offset + len)` at `addr` under that key. The
//!   reply's `data` is empty.
//! * `Read` with `inline_reply`: every extent is [`NO_KEY`], their lengths
//!   add up to at most [`MAX_INLINE`], and the reply's `data` holds the
//!   extents' bytes concatenated in request order.
//! * `Write`: an extent with a key is got from `addr` under that key; the
//!   [`NO_KEY`] extents take their bytes, in order, from `inline`, whose
//!   length must equal the sum of their lengths (so at most [`MAX_INLINE`]).
//!   `stability` says what must be stable before the reply: nothing
//!   (`Unstable`, made stable later by `Sync`), the data (`DataSync`, as
//!   `fdatasync`), or the data and the object's metadata (`FileSync`, as
//!   `fsync`).
//! * The reply's `bytes` counts bytes transferred, at most [`MAX_IO_BYTES`];
//!   when `data` is not empty it equals `data.len()`.
//!
//! `Truncate` discards the object's bytes at file offsets `size` and beyond
//! on this server; `Remove` deletes the object here; `Sync` makes every
//! acknowledged write of the object on this server stable; `Stat` answers
//! the end of the bytes stored here (largest offset stored + 1, 0 if none).
//!
//! # Keys that follow (FRRWP)
//!
//! A `Read` or `Write` may say that its keys follow it (`keys_follow`
//! present: a presence byte 1, then tag u64 and count u16, 1..=
//! [`MAX_IO_KEYS`]; byte 0 and nothing else when absent): its own `keys`
//! are then empty, its extents index the `count` keys to come, and it may
//! not be an inline-reply read. The client sends such a request *before*
//! it registers its memory (the FRRWP paper, Ou, He and Han: the client's
//! registration overlaps the server's own preparation), then a `Keys`
//! request on the same connection with the same tag and exactly `count`
//! keys. The server does its part at once (capability, a storage read of
//! the units it will need into its cache), holding nothing while it waits
//! for the keys; then checks them exactly as it checks keys carried in a
//! request, checks the capability again, and serves the request as one
//! that carried its keys; the `Read` or `Write` is answered as usual, the
//! `Keys` with `Done` once delivered.
//! The `Keys` must reach the server after its request (a server parks a
//! request as soon as it is delivered): the client sends it after the
//! request, on the same connection, and only for requests small enough
//! to travel eagerly (a large frame is received by rendezvous and may be
//! delivered after a small one sent later; a server may refuse, `EINVAL`,
//! keys to follow a request of more extents than it parks, 128 for dafne's
//! io server). A `Keys` whose tag names no
//! waiting request on its connection is refused (`ENOENT`); a request whose keys do not come within the
//! server's deadline is answered `ETIMEDOUT`; a tag already waiting on
//! the connection, or more waiting requests than the server allows per
//! connection, are refused (`EBUSY`). A `Keys` with the wrong number of
//! keys is refused (`EINVAL`), and so is the request it names.
//!
//! # Allocate
//!
//! `fallocate(2)` on the object's part of the file range
//! `[offset, offset + len)`: `len` is at least 1, `offset + len` is at most
//! [`MAX_FILE_SIZE`], and the range spans at most [`MAX_ALLOCATE_STRIPES`]
//! stripe units (a client splits a longer one), so that one request is a
//! bounded amount of work for the server. The server does not know the
//! layout; `stripes` tells it which stripe units of the range are its own:
//! unit `i` (bytes `[i × unit, (i + 1) × unit)`) when `i % count` is one of
//! `slots` (the positions of this server in the layout's server list). The
//! modes are Linux's:
//!
//! * `Reserve`: blocks are reserved under the server's own stripe units of
//!   the range (mode 0); the object here grows to the end of the last one,
//!   so that a later `Stat` answers the new end. The client publishes the
//!   file's new size to meta.
//! * `ReserveKeepSize`: the same without growing (`FALLOC_FL_KEEP_SIZE`).
//! * `PunchHole`: the range reads as zeros from now on and its blocks are
//!   freed; no size changes (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`,
//!   the only punch Linux allows). Cached bytes of the range are dropped or
//!   zeroed first, so a later write-back cannot bring them back.
//! * `ZeroRange`, `ZeroRangeKeepSize`: the range reads as zeros and its
//!   blocks are reserved (`FALLOC_FL_ZERO_RANGE`, with or without
//!   `KEEP_SIZE`): a punch, then a reserve.
//!
//! Write rights are required, as for `Write` and `Truncate`.
//!
//! `ServerInfo` asks about the server rather than an object: capacity of
//! its storage and its counters ([`ServerInfo`]), for `statfs` and `dafne
//! status`. It takes a capability like every io request (any object, read
//! rights), so only holders of the cluster secret or of an open file learn
//! them. Its fields travel as a counted list of u64 in [`ServerInfo`]'s
//! field order; a decoder takes the fields it knows and ignores the rest,
//! so fields can be added at the end without a version change. After
//! them come the chain versions the server last heard from meta
//! ([`ServerInfo::chains`]; version 17).
//!
//! # Scrub
//!
//! `Scrub` asks the server to read the blocks it stores from the device
//! and verify each against its checksum, one bounded slice per request
//! (at most [`SCRUB_SLICE_BYTES`] read, so serving goes on between
//! slices): from `(object, offset)`, in object id order; the reply says
//! what the slice checked, its bad blocks (at most [`MAX_SCRUB_BAD`],
//! the rest counted) and where the next slice starts (`None`: done).
//! Only a connection that logged in with the cluster secret (not a
//! credential) may ask (`EACCES` otherwise); its capability is not
//! checked, as for `ServerInfo`.
//!
//! # Login
//!
//! An io server drops a connection that has not shown a genuine
//! capability within its login deadline (10 s), so a peer without the
//! cluster secret or an open file cannot hold a connection by pinging.
//! Any request whose capability verifies (its MAC and expiry: a revoked
//! one too, since a login proves who signed it, not rights to an object)
//! authenticates its connection;
//! `Login` is the request that does only that, sent by the data client on
//! every new connection before its first use (an idle mount would
//! otherwise be dropped). It is proven like the metadata server's
//! SessionOpen, with the same fields (crate docs): a MAC over the
//! connection's token, the nonce and the client name, made with the
//! cluster secret, or with the key derived for `credential`
//! (`dafne_auth`'s module docs, "Credentials"), so a client that holds
//! only a credential logs in too. A logged-in connection may also ask
//! `ServerInfo` without a genuine capability (its capability is then not
//! checked).
//!
//! # Not serving
//!
//! An io server that joined meta serves data only while it holds a lease
//! from meta (`dafne_io::lease`). While the lease has lapsed it answers
//! `Read`, `Write`, `Truncate`, `Allocate`, `Sync`, `Stat` and `Remove`
//! with [`NOT_SERVING`] (`ENOTCONN`), decided before the request has any
//! effect: the same request may be sent again, whatever it is. No other
//! io answer is `ENOTCONN`.
//!
//! # Chains
//!
//! A layout's server indices name *chains* of meta's chain table
//! (docs/REPLICATION.md, "Chains"): stripe slot `s` is chain
//! `layout.servers[s]`, and a chain's requests go to its head, the first
//! `serving` replica in the table (R = 1: chain `c` is io server `c`
//! alone, the placement of before). A request of an op that reads or
//! changes a file's data on a replica ([`IoOp::carries_chain`]: `Read`,
//! `Write`, `Truncate`, `Sync`, `Stat`, `Allocate`) carries the chain and
//! the version of its row the client knows, once per request, in front of
//! the body ([`crate::REQUEST_FLAG_CHAIN`]: chain u32, below
//! [`crate::MAX_CHAINS`], version u64); any other op carrying one is
//! refused at decoding. `Remove` carries none: the reclaimer deletes an
//! object on every io server, whatever chain each replica is in.
//!
//! An io server that holds chain versions from meta (it joined meta:
//! `dafne_io::lease`) checks the request's after its lease and before
//! anything else of the request (`dafne_io::chaincheck`), and refuses it
//! with the error [`CHAIN_REFUSED`] (`ECHRNG`, which no other io answer
//! uses; the one error reply with a body, a [`ChainRefusal`]: reason u8,
//! chain u32, version u64, decoded as [`IoResponse::ChainRefused`]) when:
//! * the server holds no replica of the chain
//!   ([`ChainRefusalReason::NotReplica`], version 0);
//! * the request's version is older than the server's
//!   ([`ChainRefusalReason::Stale`], with the server's version): the
//!   client fetches the table from meta again and sends the request again;
//! * the request's version is newer ([`ChainRefusalReason::Ahead`], with
//!   the server's version): meta changed the row and the server has not
//!   heard it yet; its next heartbeat's answer, within a second, tells it,
//!   so the client sends again after a pause.
//!
//! A refused request had no effect. A request without a chain (a client
//! that has no meta session to fetch the table from: tools, tests
//! against a lone io server) is served unchecked, as is any request to a
//! server that holds no chain versions (started without meta). So the
//! check keeps a client from acting on its own stale table; it does not
//! hold back a client with a valid capability that leaves the chain out
//! (the server cannot tell it from a client without meta), except that
//! since chain writes (protocol 19) a `Write`, `Truncate` or `Allocate`
//! without a chain is refused (`EINVAL`) on a server that shares a chain
//! with another, and a client's data-changing request with a chain on a
//! replica that is not the chain's head is refused
//! ([`ChainRefusalReason::NotHead`]); a head forwards such requests to
//! the next replica marked [`crate::REQUEST_FLAG_FORWARDED`].
//!
//! # Sizes
//!
//! The largest request is [`MAX_IO_REQUEST_LEN`] bytes (153 789, under the
//! transport's default 1 MiB request limit), the largest reply
//! [`MAX_IO_REPLY_LEN`] (65 580).

use crate::msg::ops;
use crate::wire::{Reader, Wire, Writer};
use crate::{Capability, DecodeError, Envelope, Errno, IoReplyHeader, IoRequestHeader};

/// An io server's answer to a data request while its lease from meta has
/// lapsed (module docs, "Not serving"): not serving now, try again.
pub const NOT_SERVING: Errno = Errno::ENOTCONN;

/// The errno of an io server's refusal of a request's chain version
/// (module docs, "Chains"): `ECHRNG`, which no other io answer uses. The
/// one error reply with a body, a [`ChainRefusal`]; decoded as
/// [`IoResponse::ChainRefused`].
pub const CHAIN_REFUSED: Errno = Errno::ECHRNG;

/// Why an io server refused a request's chain (module docs, "Chains").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChainRefusalReason {
    /// The request's version is older than the server's: the client's
    /// chain table is stale (fetch it again from meta, send again).
    Stale = 1,
    /// The request's version is newer than the server's: meta changed the
    /// chain and the server has not heard it yet (its next heartbeat's
    /// answer, within a second, tells it): send again after a pause.
    Ahead = 2,
    /// The server is not a replica of the chain (a client whose table
    /// names the wrong server): fetch the table again.
    NotReplica = 3,
    /// A client's `Write` (not a forwarded one) reached a replica that is
    /// not the chain's head (protocol 19): only the head orders and
    /// forwards a chain's writes (docs/REPLICATION.md, "Writes"). With
    /// the server's version: fetch the table again.
    NotHead = 4,
}

impl ChainRefusalReason {
    /// The reason with this wire number.
    pub fn from_u8(v: u8) -> Option<ChainRefusalReason> {
        match v {
            1 => Some(ChainRefusalReason::Stale),
            2 => Some(ChainRefusalReason::Ahead),
            3 => Some(ChainRefusalReason::NotReplica),
            4 => Some(ChainRefusalReason::NotHead),
            _ => None,
        }
    }

    /// As the metrics page and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            ChainRefusalReason::Stale => "stale",
            ChainRefusalReason::Ahead => "ahead",
            ChainRefusalReason::NotReplica => "not_replica",
            ChainRefusalReason::NotHead => "not_head",
        }
    }
}

/// An io server's refusal of a request's chain version, before the request
/// had any effect (module docs, "Chains"): reason u8, chain u32, version
/// u64 (the server's version of the chain; 0 for
/// [`ChainRefusalReason::NotReplica`]). 13 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainRefusal {
    pub reason: ChainRefusalReason,
    /// The chain the request named.
    pub chain: u32,
    /// The server's version of that chain (0 when it holds no replica).
    pub version: u64,
}

impl Wire for ChainRefusal {
    fn put(&self, w: &mut Writer) {
        w.put_u8(self.reason as u8);
        w.put_u32(self.chain);
        w.put_u64(self.version);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let v = r.u8("io chain refusal reason")?;
        let reason = ChainRefusalReason::from_u8(v)
            .ok_or(DecodeError::BadValue { what: "io chain refusal reason", value: v.into() })?;
        let chain = r.u32("io chain refusal chain")?;
        if chain as usize >= crate::MAX_CHAINS {
            return Err(DecodeError::BadValue {
                what: "io chain refusal chain (below MAX_CHAINS)",
                value: chain.into(),
            });
        }
        let version = r.u64("io chain refusal version")?;
        if reason == ChainRefusalReason::NotReplica && version != 0 {
            // One encoding per message.
            return Err(DecodeError::BadValue {
                what: "io chain refusal version (0 when not a replica)",
                value: version,
            });
        }
        Ok(ChainRefusal { reason, chain, version })
    }
}

impl IoOp {
    /// Whether a chain's head forwards requests of this op to the next
    /// replica (protocol 19, [`crate::REQUEST_FLAG_FORWARDED`]): the ops
    /// that change a file's data or make it durable.
    pub fn is_forwarded(self) -> bool {
        matches!(self, IoOp::Write | IoOp::Truncate | IoOp::Sync | IoOp::Allocate)
    }

    /// Whether a request of this op may carry a chain
    /// ([`crate::REQUEST_FLAG_CHAIN`]; module docs, "Chains"): the ops that
    /// read or change a file's data on a chain's replica. Not `Remove`
    /// (the reclaimer deletes an object on every io server, each replica
    /// alike), nor the ops about the server or the connection.
    pub fn carries_chain(self) -> bool {
        matches!(self, IoOp::Read | IoOp::Write | IoOp::Truncate | IoOp::Sync | IoOp::Stat | IoOp::Allocate)
    }
}

ops! {
    /// What an io request asks for. The numbers are the wire's, in the op
    /// number space shared with [`crate::Op`] (io ops are 64..=127), and are
    /// never reused (the table with bodies is in the [module docs](self)).
    IoOp {
        /// Read extents of the object: into client memory by RMA, or inline
        /// in the reply.
        Read = 64,
        /// Write extents of the object: from client memory by RMA, or from
        /// inline bytes in the request.
        Write = 65,
        /// Discard the object's bytes at and beyond a file offset.
        Truncate = 66,
        /// Delete the object on this server.
        Remove = 67,
        /// Make the object's acknowledged writes stable.
        Sync = 68,
        /// How far the object extends on this server.
        Stat = 69,
        /// The server's capacity and counters.
        ServerInfo = 70,
        /// Meta's signed revocations, relayed: the server raises the
        /// objects' capability floors.
        Revoke = 71,
        /// Proves the connection's peer holds a genuine capability (the
        /// server's login deadline; module docs, "Login").
        Login = 72,
        /// `fallocate(2)` on the object's part of a range: reserve, punch a
        /// hole, zero (module docs, "Allocate").
        Allocate = 73,
        /// The keys of a `Read` or `Write` sent ahead of them (module docs,
        /// "Keys that follow (FRRWP)").
        Keys = 74,
        /// Verify a slice of the server's stored blocks against their
        /// checksums (module docs, "Scrub").
        Scrub = 75,
    }
}

/// A `Read` or `Write` whose keys follow it in a `Keys` request (module
/// docs, "Keys that follow (FRRWP)").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeysFollow {
    /// Names the request on its connection; the `Keys` repeats it.
    pub tag: u64,
    /// Keys to come, 1..=[`MAX_IO_KEYS`]; the extents index them.
    pub count: u16,
}

impl Wire for KeysFollow {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.tag);
        w.put_u16(self.count);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let tag = r.u64("io keys_follow tag")?;
        let count = r.u16("io keys_follow count")?;
        if count == 0 || usize::from(count) > MAX_IO_KEYS {
            return Err(DecodeError::BadValue { what: "io keys_follow count (1 to MAX_IO_KEYS)", value: count.into() });
        }
        Ok(KeysFollow { tag, count })
    }
}

/// Most extents in one Read or Write request.
pub const MAX_IO_EXTENTS: usize = 1024;
/// Most memory keys in one Read or Write request.
pub const MAX_IO_KEYS: usize = 16;
/// Most bytes of one packed memory key (restates `dafne_ucx`'s
/// `MAX_PACKED_KEY`, which this crate does not depend on).
pub const MAX_IO_KEY_BYTES: usize = 4096;
/// Most bytes of inline data: a Write's `inline`, an inline Read's reply
/// `data` (64 KiB).
pub const MAX_INLINE: usize = 64 << 10;
/// Most bytes one Read or Write moves: the sum of its extents' lengths
/// (64 MiB).
pub const MAX_IO_BYTES: usize = 64 << 20;
/// The extent index that means "inline data" rather than a key.
pub const NO_KEY: u16 = u16::MAX;

/// Most stripe units one `Allocate` range may span (module docs,
/// "Allocate"): a server then makes at most this many `fallocate` calls
/// for one request (one per own stripe unit; adjacent ones are joined).
/// With 1 MiB units that is 16 GiB per request.
pub const MAX_ALLOCATE_STRIPES: u64 = 16 << 10;

/// Encoded size of a capability: object_id u64, ino u64, rights u8,
/// generation u64, expiry u64, advice (2 bytes), mac.
const CAPABILITY_SIZE: usize = 8 + 8 + 1 + 8 + 8 + 2 + 32;
/// The largest file size, as on Linux (`MAX_LFS_FILESIZE` = 2^63 - 1): no
/// byte lives at or beyond it. Extents and truncates past it are refused at
/// decoding, so a hostile offset near `u64::MAX` never reaches a cache
/// unit (whose write-back could only fail) or a storage call.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Encoded size of an [`IoExtent`]: offset u64, len u32, key u16, addr u64.
const EXTENT_SIZE: usize = 8 + 4 + 2 + 8;

/// The largest io request: header + its chain + a Write with every limit
/// reached: 32 + 12 (chain, version) + 67 (capability) + 1 (no
/// keys_follow: a request with keys has none) + 4 + 16 × (4 + 4096)
/// (keys) + 4 + 1024 × 22 (extents) + 1 (stability) + 4 + 65 536
/// (inline) = 153 789 bytes. A Revoke is
/// smaller: 32 + 67 + at most 65 604 (revocations); a Keys too: 32 + 8 +
/// the keys.
pub const MAX_IO_REQUEST_LEN: usize = IoRequestHeader::SIZE
    + crate::members::CHAIN_VERSION_SIZE
    + CAPABILITY_SIZE
    + 1
    + 4
    + MAX_IO_KEYS * (4 + MAX_IO_KEY_BYTES)
    + 4
    + MAX_IO_EXTENTS * EXTENT_SIZE
    + 1
    + 4
    + MAX_INLINE;
/// The largest io reply: header + an inline Read reply:
/// 32 + 8 (bytes) + 4 + 65 536 (data) = 65 580 bytes.
pub const MAX_IO_REPLY_LEN: usize = IoReplyHeader::SIZE + 8 + 4 + MAX_INLINE;

const _: () = assert!(MAX_IO_REQUEST_LEN == 153_789 && MAX_IO_REPLY_LEN == 65_580);
const _: () = assert!(IoRequestHeader::SIZE + CAPABILITY_SIZE + crate::Revocations::MAX_SIZE <= MAX_IO_REQUEST_LEN);
// An Allocate: 32 + 67 + 8 + 8 + 1 + 4 + 4 + 4 + 256 × 4 = 1 152 bytes.
const _: () = assert!(
    IoRequestHeader::SIZE + CAPABILITY_SIZE + 8 + 8 + 1 + 4 + 4 + 4 + 4 * crate::MAX_LAYOUT_SERVERS
        <= MAX_IO_REQUEST_LEN
);
// Extent key indexes and NO_KEY cannot meet.
const _: () = assert!(MAX_IO_KEYS < NO_KEY as usize);

/// What must be stable storage before a Write is acknowledged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Stability {
    /// Nothing: the data may still be in the server's memory (a later
    /// `Sync` makes it stable).
    #[default]
    Unstable = 0,
    /// The data, as `fdatasync`.
    DataSync = 1,
    /// The data and the object's metadata, as `fsync`.
    FileSync = 2,
}

impl Stability {
    /// The stability with this wire number.
    pub fn from_u8(v: u8) -> Option<Stability> {
        match v {
            0 => Some(Stability::Unstable),
            1 => Some(Stability::DataSync),
            2 => Some(Stability::FileSync),
            _ => None,
        }
    }
}

impl Wire for Stability {
    fn put(&self, w: &mut Writer) {
        w.put_u8(*self as u8);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let v = r.u8("io write stability")?;
        Stability::from_u8(v).ok_or(DecodeError::BadValue { what: "io write stability", value: v.into() })
    }
}

/// What an `Allocate` does to its range: the `fallocate(2)` modes dafne
/// serves (module docs, "Allocate").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AllocateMode {
    /// Reserve blocks; the object grows to the range's end (mode 0).
    Reserve = 0,
    /// Reserve blocks; no size changes (`FALLOC_FL_KEEP_SIZE`).
    ReserveKeepSize = 1,
    /// Free the range's blocks: it reads as zeros; no size changes
    /// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`).
    PunchHole = 2,
    /// The range reads as zeros, its blocks reserved; the object grows to
    /// the range's end (`FALLOC_FL_ZERO_RANGE`).
    ZeroRange = 3,
    /// As `ZeroRange`, no size changes (`FALLOC_FL_ZERO_RANGE |
    /// FALLOC_FL_KEEP_SIZE`).
    ZeroRangeKeepSize = 4,
}

impl AllocateMode {
    /// The mode with this wire number.
    pub fn from_u8(v: u8) -> Option<AllocateMode> {
        match v {
            0 => Some(AllocateMode::Reserve),
            1 => Some(AllocateMode::ReserveKeepSize),
            2 => Some(AllocateMode::PunchHole),
            3 => Some(AllocateMode::ZeroRange),
            4 => Some(AllocateMode::ZeroRangeKeepSize),
            _ => None,
        }
    }

    /// Whether sizes stay as they are (else the range's end becomes the
    /// size where it is larger).
    pub fn keeps_size(self) -> bool {
        matches!(self, AllocateMode::ReserveKeepSize | AllocateMode::PunchHole | AllocateMode::ZeroRangeKeepSize)
    }

    /// Whether the range's bytes become zeros (else they stay).
    pub fn zeroes(self) -> bool {
        matches!(self, AllocateMode::PunchHole | AllocateMode::ZeroRange | AllocateMode::ZeroRangeKeepSize)
    }

    /// Whether blocks are reserved under the range (else freed).
    pub fn reserves(self) -> bool {
        self != AllocateMode::PunchHole
    }
}

impl Wire for AllocateMode {
    fn put(&self, w: &mut Writer) {
        w.put_u8(*self as u8);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let v = r.u8("io allocate mode")?;
        AllocateMode::from_u8(v).ok_or(DecodeError::BadValue { what: "io allocate mode", value: v.into() })
    }
}

/// Which stripe units of a range an io server holds (module docs,
/// "Allocate"): unit `i` when `i % count` is in `slots`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StripeSlots {
    /// The layout's stripe unit, bytes (at least 1).
    pub unit: u32,
    /// The layout's stripe count, 1..=[`MAX_LAYOUT_SERVERS`](crate::MAX_LAYOUT_SERVERS).
    pub count: u32,
    /// This server's positions in the layout: at least one, strictly
    /// ascending, each below `count`.
    pub slots: Vec<u32>,
}

impl StripeSlots {
    /// Every unit of the range (one server holding all the stripes).
    pub fn all(unit: u32) -> StripeSlots {
        StripeSlots { unit, count: 1, slots: vec![0] }
    }

    /// Whether stripe unit `index` is one of this server's.
    pub fn holds(&self, index: u64) -> bool {
        self.slots.binary_search(&((index % u64::from(self.count.max(1))) as u32)).is_ok()
    }
}

impl Wire for StripeSlots {
    fn put(&self, w: &mut Writer) {
        w.put_u32(self.unit);
        w.put_u32(self.count);
        w.put_len(self.slots.len());
        for s in &self.slots {
            w.put_u32(*s);
        }
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let unit = r.u32("io allocate stripe unit")?;
        if unit == 0 {
            return Err(DecodeError::BadValue { what: "io allocate stripe unit (must not be 0)", value: 0 });
        }
        let count = r.u32("io allocate stripe count")?;
        if count == 0 || count as usize > crate::MAX_LAYOUT_SERVERS {
            return Err(DecodeError::BadValue {
                what: "io allocate stripe count (1 to MAX_LAYOUT_SERVERS)",
                value: count.into(),
            });
        }
        let n = r.count("io allocate slots", count as usize, 4)?;
        if n == 0 {
            return Err(DecodeError::BadValue { what: "io allocate slots (at least one)", value: 0 });
        }
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            let s = r.u32("io allocate slot")?;
            if s >= count || slots.last().is_some_and(|&prev| s <= prev) {
                return Err(DecodeError::BadValue {
                    what: "io allocate slot (ascending, below the stripe count)",
                    value: s.into(),
                });
            }
            slots.push(s);
        }
        Ok(StripeSlots { unit, count, slots })
    }
}

/// One byte range of a Read or Write, and where its bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoExtent {
    /// Byte offset in the file (io servers store each object sparsely at
    /// file offsets).
    pub offset: u64,
    /// Bytes, at least 1.
    pub len: u32,
    /// Index into the request's keys, or [`NO_KEY`] for inline data.
    pub key: u16,
    /// Client address of the segment under `key`; 0 for inline data.
    pub addr: u64,
}

impl IoExtent {
    /// An extent whose bytes travel inline.
    pub fn inline(offset: u64, len: u32) -> IoExtent {
        IoExtent { offset, len, key: NO_KEY, addr: 0 }
    }

    /// Whether its bytes travel inline ([`NO_KEY`]).
    pub fn is_inline(&self) -> bool {
        self.key == NO_KEY
    }
}

impl Wire for IoExtent {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.offset);
        w.put_u32(self.len);
        w.put_u16(self.key);
        w.put_u64(self.addr);
    }

    /// Field checks only; the request decoder checks `key` against the
    /// keys and adds up the lengths.
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let e = IoExtent {
            offset: r.u64("io extent offset")?,
            len: r.u32("io extent len")?,
            key: r.u16("io extent key")?,
            addr: r.u64("io extent addr")?,
        };
        if e.len == 0 {
            return Err(DecodeError::BadValue { what: "io extent len (must not be 0)", value: 0 });
        }
        if e.offset.checked_add(e.len.into()).is_none_or(|end| end > MAX_FILE_SIZE) {
            return Err(DecodeError::BadValue {
                what: "io extent offset (offset + len past the largest file size)",
                value: e.offset,
            });
        }
        // The server computes client addresses inside the extent: they must
        // not wrap around.
        if !e.is_inline() && e.addr.checked_add(e.len.into()).is_none() {
            return Err(DecodeError::BadValue { what: "io extent addr (addr + len overflows u64)", value: e.addr });
        }
        if e.is_inline() && e.addr != 0 {
            return Err(DecodeError::BadValue { what: "io extent addr (must be 0 for inline data)", value: e.addr });
        }
        Ok(e)
    }
}

/// An io request body. The object is the capability's `object_id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IoRequest {
    Read {
        cap: Capability,
        /// Packed memory keys, at most [`MAX_IO_KEYS`] of 1 to
        /// [`MAX_IO_KEY_BYTES`] bytes each.
        keys: Vec<Vec<u8>>,
        /// At most [`MAX_IO_EXTENTS`], at most [`MAX_IO_BYTES`] in all.
        extents: Vec<IoExtent>,
        /// Return the data in the reply: then every extent is [`NO_KEY`]
        /// and they add up to at most [`MAX_INLINE`]. Otherwise none is.
        inline_reply: bool,
        /// The keys follow in a `Keys` request (FRRWP); `keys` is empty.
        keys_follow: Option<KeysFollow>,
    },
    Write {
        cap: Capability,
        /// As for `Read`.
        keys: Vec<Vec<u8>>,
        /// As for `Read`; the [`NO_KEY`] ones take their bytes from
        /// `inline`.
        extents: Vec<IoExtent>,
        stability: Stability,
        /// The bytes of the [`NO_KEY`] extents, concatenated in order:
        /// exactly their total length, at most [`MAX_INLINE`].
        inline: Vec<u8>,
        /// As for `Read`.
        keys_follow: Option<KeysFollow>,
    },
    /// Discard the bytes at file offsets `size` and beyond.
    Truncate {
        cap: Capability,
        size: u64,
    },
    Remove {
        cap: Capability,
    },
    Sync {
        cap: Capability,
    },
    Stat {
        cap: Capability,
    },
    /// About the server (the capability's object is not used).
    ServerInfo {
        cap: Capability,
    },
    /// Verify the next slice of stored blocks from `(object, offset)`
    /// (module docs, "Scrub"; the capability's object is not used).
    Scrub {
        cap: Capability,
        object: u64,
        offset: u64,
    },
    /// Revocations from meta's log, signed by meta (the capability, with
    /// write rights, is the relay's; the batch's MAC is what counts).
    Revoke {
        cap: Capability,
        batch: crate::Revocations,
    },
    /// `fallocate(2)` on this server's stripe units of `[offset, offset +
    /// len)` (module docs, "Allocate").
    Allocate {
        cap: Capability,
        offset: u64,
        /// At least 1; `offset + len` at most [`MAX_FILE_SIZE`]; the range
        /// spans at most [`MAX_ALLOCATE_STRIPES`] stripe units.
        len: u64,
        mode: AllocateMode,
        stripes: StripeSlots,
    },
    /// The first request on a connection: authenticates the connection,
    /// which an io server otherwise drops at its login deadline. Proven as
    /// the metadata protocol's `SessionOpen` (module docs, "Login").
    Login {
        /// UTF-8, at most [`MAX_CLIENT_NAME`](crate::MAX_CLIENT_NAME) bytes.
        client_name: String,
        nonce: [u8; 16],
        mac: [u8; 32],
        /// The per-client credential; `None` for the cluster secret.
        credential: Option<crate::Credential>,
    },
    /// The keys of the `Read` or `Write` sent on this connection with
    /// `keys_follow.tag == tag` (module docs, "Keys that follow (FRRWP)").
    Keys {
        tag: u64,
        /// 1..=[`MAX_IO_KEYS`] packed keys, as a request's `keys`.
        keys: Vec<Vec<u8>>,
    },
}

impl IoRequest {
    /// The op this request is.
    pub fn op(&self) -> IoOp {
        match self {
            IoRequest::Read { .. } => IoOp::Read,
            IoRequest::Write { .. } => IoOp::Write,
            IoRequest::Truncate { .. } => IoOp::Truncate,
            IoRequest::Remove { .. } => IoOp::Remove,
            IoRequest::Sync { .. } => IoOp::Sync,
            IoRequest::Stat { .. } => IoOp::Stat,
            IoRequest::ServerInfo { .. } => IoOp::ServerInfo,
            IoRequest::Scrub { .. } => IoOp::Scrub,
            IoRequest::Revoke { .. } => IoOp::Revoke,
            IoRequest::Login { .. } => IoOp::Login,
            IoRequest::Allocate { .. } => IoOp::Allocate,
            IoRequest::Keys { .. } => IoOp::Keys,
        }
    }

    /// The capability; its `object_id` names the object. `None` for
    /// `Login`, which carries none.
    pub fn cap(&self) -> Option<&Capability> {
        match self {
            IoRequest::Read { cap, .. }
            | IoRequest::Write { cap, .. }
            | IoRequest::Truncate { cap, .. }
            | IoRequest::Remove { cap }
            | IoRequest::Sync { cap }
            | IoRequest::Stat { cap }
            | IoRequest::ServerInfo { cap }
            | IoRequest::Scrub { cap, .. }
            | IoRequest::Revoke { cap, .. }
            | IoRequest::Allocate { cap, .. } => Some(cap),
            IoRequest::Login { .. } | IoRequest::Keys { .. } => None,
        }
    }

    /// The capability, to replace it (a client re-sending with a fresh one).
    pub fn cap_mut(&mut self) -> Option<&mut Capability> {
        match self {
            IoRequest::Read { cap, .. }
            | IoRequest::Write { cap, .. }
            | IoRequest::Truncate { cap, .. }
            | IoRequest::Remove { cap }
            | IoRequest::Sync { cap }
            | IoRequest::Stat { cap }
            | IoRequest::ServerInfo { cap }
            | IoRequest::Scrub { cap, .. }
            | IoRequest::Revoke { cap, .. }
            | IoRequest::Allocate { cap, .. } => Some(cap),
            IoRequest::Login { .. } | IoRequest::Keys { .. } => None,
        }
    }

    /// The bytes a Read or Write moves: the sum of its extents' lengths (0
    /// for the other ops). At most [`MAX_IO_BYTES`] in a decoded request.
    pub fn total_bytes(&self) -> u64 {
        match self {
            IoRequest::Read { extents, .. } | IoRequest::Write { extents, .. } => {
                extents.iter().map(|e| u64::from(e.len)).sum()
            }
            IoRequest::Truncate { .. }
            | IoRequest::Remove { .. }
            | IoRequest::Sync { .. }
            | IoRequest::Stat { .. }
            | IoRequest::ServerInfo { .. }
            | IoRequest::Scrub { .. }
            | IoRequest::Login { .. }
            | IoRequest::Revoke { .. }
            | IoRequest::Keys { .. }
            | IoRequest::Allocate { .. } => 0,
        }
    }

    fn put_body(&self, w: &mut Writer) {
        if let IoRequest::Login { client_name, nonce, mac, credential } = self {
            w.put_bytes(client_name.as_bytes());
            w.put_raw(nonce);
            w.put_raw(mac);
            credential.put(w);
            return;
        }
        if let IoRequest::Keys { tag, keys } = self {
            w.put_u64(*tag);
            put_keys(w, keys);
            return;
        }
        if let Some(cap) = self.cap() {
            cap.put(w);
        }
        match self {
            IoRequest::Read { keys, extents, inline_reply, keys_follow, .. } => {
                keys_follow.put(w);
                put_keys_extents(w, keys, extents);
                w.put_bool(*inline_reply);
            }
            IoRequest::Write { keys, extents, stability, inline, keys_follow, .. } => {
                keys_follow.put(w);
                put_keys_extents(w, keys, extents);
                stability.put(w);
                w.put_bytes(inline);
            }
            IoRequest::Truncate { size, .. } => w.put_u64(*size),
            IoRequest::Scrub { object, offset, .. } => {
                w.put_u64(*object);
                w.put_u64(*offset);
            }
            IoRequest::Revoke { batch, .. } => batch.put(w),
            IoRequest::Allocate { offset, len, mode, stripes, .. } => {
                w.put_u64(*offset);
                w.put_u64(*len);
                mode.put(w);
                stripes.put(w);
            }
            IoRequest::Login { .. } | IoRequest::Keys { .. } => unreachable!("written above"),
            IoRequest::Remove { .. }
            | IoRequest::Sync { .. }
            | IoRequest::Stat { .. }
            | IoRequest::ServerInfo { .. } => {}
        }
    }

    fn get_body(op: IoOp, r: &mut Reader<'_>) -> Result<IoRequest, DecodeError> {
        if op == IoOp::Login {
            let name = r.bytes("client name", crate::MAX_CLIENT_NAME)?;
            return Ok(IoRequest::Login {
                client_name: String::from_utf8(name).map_err(|_| DecodeError::NotUtf8("client name"))?,
                nonce: r.array("login nonce")?,
                mac: r.array("login mac")?,
                credential: Option::get(r)?,
            });
        }
        if op == IoOp::Keys {
            let tag = r.u64("io keys tag")?;
            let keys = get_keys(r)?;
            if keys.is_empty() {
                return Err(DecodeError::BadValue { what: "io keys (at least one)", value: 0 });
            }
            return Ok(IoRequest::Keys { tag, keys });
        }
        let cap = Capability::get(r)?;
        Ok(match op {
            IoOp::Read => {
                let keys_follow = Option::<KeysFollow>::get(r)?;
                let (keys, extents) = get_keys_extents(r, keys_follow)?;
                let inline_reply = r.bool("io read inline_reply")?;
                if inline_reply && keys_follow.is_some() {
                    return Err(DecodeError::BadValue {
                        what: "io read keys_follow (an inline-reply read has no keys to follow)",
                        value: 1,
                    });
                }
                if inline_reply {
                    if let Some(e) = extents.iter().find(|e| !e.is_inline()) {
                        return Err(DecodeError::BadValue {
                            what: "io extent key (an inline-reply read takes only NO_KEY extents)",
                            value: e.key.into(),
                        });
                    }
                    let total = sum_len(extents.iter());
                    if total > MAX_INLINE as u64 {
                        return Err(too_long("io read inline reply bytes", total, MAX_INLINE));
                    }
                } else if extents.iter().any(IoExtent::is_inline) {
                    return Err(DecodeError::BadValue {
                        what: "io extent key (NO_KEY in a read without inline_reply)",
                        value: NO_KEY.into(),
                    });
                }
                IoRequest::Read { cap, keys, extents, inline_reply, keys_follow }
            }
            IoOp::Write => {
                let keys_follow = Option::<KeysFollow>::get(r)?;
                let (keys, extents) = get_keys_extents(r, keys_follow)?;
                let stability = Stability::get(r)?;
                let want = sum_len(extents.iter().filter(|e| e.is_inline()));
                if want > MAX_INLINE as u64 {
                    return Err(too_long("io write inline extents", want, MAX_INLINE));
                }
                let inline = r.bytes("io write inline data", MAX_INLINE)?;
                if inline.len() as u64 != want {
                    return Err(DecodeError::BadValue {
                        what: "io write inline data length (must equal the NO_KEY extents' total)",
                        value: inline.len() as u64,
                    });
                }
                IoRequest::Write { cap, keys, extents, stability, inline, keys_follow }
            }
            IoOp::Truncate => {
                let size = r.u64("io truncate size")?;
                if size > MAX_FILE_SIZE {
                    return Err(DecodeError::BadValue {
                        what: "io truncate size (past the largest file size)",
                        value: size,
                    });
                }
                IoRequest::Truncate { cap, size }
            }
            IoOp::Remove => IoRequest::Remove { cap },
            IoOp::Sync => IoRequest::Sync { cap },
            IoOp::Stat => IoRequest::Stat { cap },
            IoOp::ServerInfo => IoRequest::ServerInfo { cap },
            IoOp::Scrub => {
                IoRequest::Scrub { cap, object: r.u64("io scrub object")?, offset: r.u64("io scrub offset")? }
            }
            IoOp::Revoke => IoRequest::Revoke { cap, batch: crate::Revocations::get(r)? },
            IoOp::Allocate => {
                let offset = r.u64("io allocate offset")?;
                let len = r.u64("io allocate len")?;
                if len == 0 {
                    return Err(DecodeError::BadValue { what: "io allocate len (must not be 0)", value: 0 });
                }
                if offset.checked_add(len).is_none_or(|end| end > MAX_FILE_SIZE) {
                    return Err(DecodeError::BadValue {
                        what: "io allocate offset (offset + len past the largest file size)",
                        value: offset,
                    });
                }
                let mode = AllocateMode::get(r)?;
                let stripes = StripeSlots::get(r)?;
                let unit = u64::from(stripes.unit);
                let spanned = (offset + len - 1) / unit - offset / unit + 1;
                if spanned > MAX_ALLOCATE_STRIPES {
                    return Err(too_long("io allocate stripe units spanned", spanned, MAX_ALLOCATE_STRIPES as usize));
                }
                IoRequest::Allocate { cap, offset, len, mode, stripes }
            }
            IoOp::Login | IoOp::Keys => unreachable!("decoded above"),
        })
    }
}

/// Most fields a [`ServerInfo`] reply may carry.
pub const MAX_INFO_FIELDS: usize = 64;

macro_rules! server_info {
    ($($(#[$m:meta])* $f:ident),* $(,)?) => {
        /// An io server's capacity and counters (`ServerInfo` reply). On
        /// the wire in this field order.
        #[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
        pub struct ServerInfo {
            $($(#[$m])* pub $f: u64,)*
            /// The version of each chain that holds this server, as meta's
            /// last answer to its heartbeat carried them (empty when it
            /// runs without meta or was never answered).
            pub chains: Vec<crate::ChainVersion>,
        }

        impl ServerInfo {
            /// `(name, value)` of the u64 fields, in wire order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($f), self.$f),)*]
            }

            /// From wire values: missing fields are 0, extra ones ignored.
            pub fn from_values(v: &[u64]) -> ServerInfo {
                let mut it = v.iter().copied();
                ServerInfo { $($f: it.next().unwrap_or(0),)* chains: Vec::new() }
            }
        }
    };
}

server_info! {
    /// Size of the file system holding the server's data, bytes.
    capacity_bytes,
    /// Bytes of it available to the server.
    available_bytes,
    /// Serving mode: 0 normal, 1 mmap, 2 unifier.
    mode,
    /// The cache's size, bytes (`--cache-mib`; how much of it is
    /// registered now: `pinned_bytes`).
    cache_bytes,
    /// Dirty bytes waiting for write-back.
    dirty_bytes,
    hits,
    misses,
    evictions,
    writebacks,
    /// Bytes copied between buffers on the data path (0 in unifier mode).
    bytes_copied,
    /// Memory registrations made (after start-up).
    registrations,
    /// Registrations made at start-up.
    startup_registrations,
    /// Requests served since start.
    requests_served,
    /// Requests being served now (credits in use, over all clients; the
    /// `ServerInfo` request that asks counts itself).
    requests_in_flight,
    /// Connections accepted since start (a count, not the connections
    /// open now).
    connections_accepted,
    /// The file system holding the data (`statvfs` f_fsid), so that
    /// servers sharing one are counted once.
    filesystem_id,
    /// Cache units retired because an RMA operation abandoned by a dead
    /// client still held their memory (lost until UCX lets go of it).
    retired_units,
    /// Cache units holding data, per unit size (files' advice, or the
    /// server's default unit).
    units_4k,
    units_8k,
    units_16k,
    units_32k,
    units_64k,
    /// Of those, units under CLOCK replacement (the others are LRU).
    clock_units,
    /// Cache memory registered now, bytes (ready slabs, and raw slabs
    /// once used).
    pinned_bytes,
    /// Raw slabs deregistered to stay under the pinned bound.
    deregistrations,
    /// The most cache memory registered at once since start, bytes.
    pinned_peak,
    /// Units holding data in deregistered (parked) raw memory.
    parked_units,
    /// Reads and writes whose keys followed them (FRRWP) that were served
    /// with their keys.
    frrwp_requests,
    /// Of the requests whose keys were to follow: refused (too many
    /// waiting on the connection, a tag waiting already, a wrong count)
    /// or answered `ETIMEDOUT` (keys never came); and `Keys` refused.
    frrwp_refused,
    /// Requests parked now, waiting for their keys (a gauge: tests wait
    /// on it instead of sleeping).
    frrwp_parked,
    /// Blocks read from storage that did not match their checksum (each
    /// such read answered `EIO`).
    checksum_errors,
    /// The server's lease from meta ([`LEASE_NONE`], [`LEASE_HELD`],
    /// [`LEASE_LAPSED`], [`LEASE_PENDING`]).
    lease,
}

/// [`ServerInfo::lease`]: the server holds no lease (started without
/// meta: it serves without one).
pub const LEASE_NONE: u64 = 0;
/// [`ServerInfo::lease`]: it serves under a lease from meta.
pub const LEASE_HELD: u64 = 1;
/// [`ServerInfo::lease`]: its lease lapsed: it refuses data requests
/// with [`NOT_SERVING`].
pub const LEASE_LAPSED: u64 = 2;
/// [`ServerInfo::lease`]: it joined meta and waits for its first lease
/// (meta has not answered a heartbeat yet): it refuses data requests with
/// [`NOT_SERVING`] (protocol 18; before, shown as [`LEASE_LAPSED`]).
pub const LEASE_PENDING: u64 = 3;

/// A reply's byte count, at most [`MAX_IO_BYTES`].
fn get_bytes(r: &mut Reader<'_>, what: &'static str) -> Result<u64, DecodeError> {
    let bytes = r.u64(what)?;
    if bytes > MAX_IO_BYTES as u64 {
        return Err(too_long(what, bytes, MAX_IO_BYTES));
    }
    Ok(bytes)
}

fn sum_len<'a>(extents: impl Iterator<Item = &'a IoExtent>) -> u64 {
    extents.map(|e| u64::from(e.len)).sum()
}

fn too_long(what: &'static str, len: u64, max: usize) -> DecodeError {
    DecodeError::TooLong { what, len: usize::try_from(len).unwrap_or(usize::MAX), max }
}

fn put_keys(w: &mut Writer, keys: &[Vec<u8>]) {
    w.put_len(keys.len());
    for k in keys {
        w.put_bytes(k);
    }
}

fn put_keys_extents(w: &mut Writer, keys: &[Vec<u8>], extents: &[IoExtent]) {
    put_keys(w, keys);
    w.put_len(extents.len());
    for e in extents {
        e.put(w);
    }
}

/// At most [`MAX_IO_KEYS`] keys of 1 to [`MAX_IO_KEY_BYTES`] bytes.
fn get_keys(r: &mut Reader<'_>) -> Result<Vec<Vec<u8>>, DecodeError> {
    // A key is at least its u32 length and one byte.
    let n = r.count("io keys", MAX_IO_KEYS, 4 + 1)?;
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        let k = r.bytes("io key", MAX_IO_KEY_BYTES)?;
        if k.is_empty() {
            return Err(DecodeError::BadValue { what: "io key length (must not be 0)", value: 0 });
        }
        keys.push(k);
    }
    Ok(keys)
}

/// Keys and extents, each extent's key in range (of the keys, or of the
/// keys to follow) and the total within [`MAX_IO_BYTES`].
fn get_keys_extents(
    r: &mut Reader<'_>,
    follow: Option<KeysFollow>,
) -> Result<(Vec<Vec<u8>>, Vec<IoExtent>), DecodeError> {
    let keys = get_keys(r)?;
    if follow.is_some() && !keys.is_empty() {
        return Err(DecodeError::BadValue {
            what: "io keys (a request whose keys follow carries none)",
            value: keys.len() as u64,
        });
    }
    let key_count = follow.map_or(keys.len(), |f| usize::from(f.count));
    let n = r.count("io extents", MAX_IO_EXTENTS, EXTENT_SIZE)?;
    let mut extents = Vec::with_capacity(n);
    let mut total = 0u64;
    for _ in 0..n {
        let e = IoExtent::get(r)?;
        if !e.is_inline() && usize::from(e.key) >= key_count {
            return Err(DecodeError::BadValue { what: "io extent key (past the request's keys)", value: e.key.into() });
        }
        total += u64::from(e.len);
        if total > MAX_IO_BYTES as u64 {
            return Err(too_long("io request bytes (sum of extent lengths)", total, MAX_IO_BYTES));
        }
        extents.push(e);
    }
    Ok((keys, extents))
}

/// The body of a successful io reply. Which variant answers which op is in
/// the [module docs](self)' table ([`IoResponse::answers`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IoResponse {
    /// Read: `bytes` transferred (at most [`MAX_IO_BYTES`]); `data` only
    /// for an inline-reply read (then `bytes == data.len()`, at most
    /// [`MAX_INLINE`]).
    Read { bytes: u64, data: Vec<u8> },
    /// Write: `bytes` transferred (at most [`MAX_IO_BYTES`]).
    Write { bytes: u64 },
    /// Truncate, Remove, Sync, Login, Allocate.
    Done,
    /// Stat: the largest file offset stored on this server + 1, 0 if none.
    Stat { size: u64 },
    /// ServerInfo.
    ServerInfo(Box<ServerInfo>),
    /// Revoke: the last log entry this server has applied, and of which
    /// meta instance (0, 0: none yet). A batch that did not follow on
    /// from it was not applied; the relay then sends what does.
    Revoked { instance: u64, seq: u64 },
    /// Scrub: what one slice checked.
    Scrubbed(ScrubSlice),
    /// Any op that carries a chain ([`IoOp::carries_chain`]): the server
    /// refused the request's chain version before doing anything (module
    /// docs, "Chains"). Travels as the error [`CHAIN_REFUSED`] with this
    /// body.
    ChainRefused(ChainRefusal),
}

/// Most bytes one `Scrub` request reads from the device (module docs,
/// "Scrub"): 16 MiB, some tens of milliseconds of the server's loop on a
/// disk that reads a few hundred MiB/s (the loop serves nothing else
/// meanwhile; other requests wait at most that long).
pub const SCRUB_SLICE_BYTES: u64 = 16 << 20;
/// Most bad blocks one `Scrub` reply names (the rest are counted).
pub const MAX_SCRUB_BAD: usize = 1024;

/// What one `Scrub` slice checked (module docs, "Scrub").
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ScrubSlice {
    /// Objects finished in this slice.
    pub objects: u64,
    /// Of those, objects stored without checksums (written before the
    /// server had them): read, not verified.
    pub unverified: u64,
    /// Bytes read and verified.
    pub bytes: u64,
    /// Bad blocks: (object, offset of the 4 KiB block); offset `u64::MAX`:
    /// the object's checksum sidecar is missing where every object should
    /// have one (it was lost; the object is read unverified).
    pub bad: Vec<(u64, u64)>,
    /// Bad blocks past [`MAX_SCRUB_BAD`], not named.
    pub more_bad: u64,
    /// Where the next slice starts; `None`: every object was checked.
    pub next: Option<(u64, u64)>,
}

impl Wire for ScrubSlice {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.objects);
        w.put_u64(self.unverified);
        w.put_u64(self.bytes);
        w.put_len(self.bad.len());
        for (o, off) in &self.bad {
            w.put_u64(*o);
            w.put_u64(*off);
        }
        w.put_u64(self.more_bad);
        w.put_bool(self.next.is_some());
        let (o, off) = self.next.unwrap_or_default();
        w.put_u64(o);
        w.put_u64(off);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let objects = r.u64("io scrub objects")?;
        let unverified = r.u64("io scrub unverified")?;
        let bytes = r.u64("io scrub bytes")?;
        let n = r.count("io scrub bad blocks", MAX_SCRUB_BAD, 16)?;
        let mut bad = Vec::with_capacity(n);
        for _ in 0..n {
            bad.push((r.u64("io scrub bad object")?, r.u64("io scrub bad offset")?));
        }
        let more_bad = r.u64("io scrub more bad")?;
        let more = r.bool("io scrub more")?;
        let next = (r.u64("io scrub next object")?, r.u64("io scrub next offset")?);
        // Without a next slice its position must be zero: one encoding per
        // message (the fuzz targets re-encode and compare).
        if !more && next != (0, 0) {
            return Err(DecodeError::BadValue { what: "io scrub next without more", value: next.0 | next.1 });
        }
        Ok(ScrubSlice { objects, unverified, bytes, bad, more_bad, next: more.then_some(next) })
    }
}

impl IoResponse {
    /// Whether this is a well-formed answer to `op`: the right variant, and
    /// within the limits the decoder checks.
    pub fn answers(&self, op: IoOp) -> bool {
        match (self, op) {
            (IoResponse::Read { bytes, data }, IoOp::Read) => {
                *bytes <= MAX_IO_BYTES as u64
                    && data.len() <= MAX_INLINE
                    && (data.is_empty() || *bytes == data.len() as u64)
            }
            (IoResponse::Write { bytes }, IoOp::Write) => *bytes <= MAX_IO_BYTES as u64,
            (
                IoResponse::Done,
                IoOp::Truncate | IoOp::Remove | IoOp::Sync | IoOp::Login | IoOp::Allocate | IoOp::Keys,
            ) => true,
            (IoResponse::Stat { .. }, IoOp::Stat) => true,
            (IoResponse::ServerInfo(_), IoOp::ServerInfo) => true,
            (IoResponse::Revoked { .. }, IoOp::Revoke) => true,
            (IoResponse::Scrubbed(_), IoOp::Scrub) => true,
            (IoResponse::ChainRefused(_), op) => op.carries_chain(),
            _ => false,
        }
    }

    fn put_body(&self, w: &mut Writer) {
        match self {
            IoResponse::Read { bytes, data } => {
                w.put_u64(*bytes);
                w.put_bytes(data);
            }
            IoResponse::Write { bytes } => w.put_u64(*bytes),
            IoResponse::Done => {}
            IoResponse::Stat { size } => w.put_u64(*size),
            IoResponse::Revoked { instance, seq } => {
                w.put_u64(*instance);
                w.put_u64(*seq);
            }
            IoResponse::Scrubbed(s) => s.put(w),
            IoResponse::ChainRefused(c) => c.put(w),
            IoResponse::ServerInfo(info) => {
                let f = info.fields();
                w.put_len(f.len());
                for (_, v) in f {
                    w.put_u64(v);
                }
                crate::members::put_chain_versions(w, &info.chains);
            }
        }
    }

    fn get_body(op: IoOp, r: &mut Reader<'_>) -> Result<IoResponse, DecodeError> {
        Ok(match op {
            IoOp::Read => {
                let bytes = get_bytes(r, "io read reply bytes")?;
                let data = r.bytes("io read reply data", MAX_INLINE)?;
                if !data.is_empty() && bytes != data.len() as u64 {
                    return Err(DecodeError::BadValue {
                        what: "io read reply bytes (must equal the inline data's length)",
                        value: bytes,
                    });
                }
                IoResponse::Read { bytes, data }
            }
            IoOp::Write => IoResponse::Write { bytes: get_bytes(r, "io write reply bytes")? },
            IoOp::Truncate | IoOp::Remove | IoOp::Sync | IoOp::Login | IoOp::Allocate | IoOp::Keys => IoResponse::Done,
            IoOp::Stat => IoResponse::Stat { size: r.u64("io stat size")? },
            IoOp::Revoke => {
                IoResponse::Revoked { instance: r.u64("io revoked instance")?, seq: r.u64("io revoked seq")? }
            }
            IoOp::Scrub => IoResponse::Scrubbed(ScrubSlice::get(r)?),
            IoOp::ServerInfo => {
                let n = r.count("io server info fields", MAX_INFO_FIELDS, 8)?;
                let mut values = Vec::with_capacity(n);
                for _ in 0..n {
                    values.push(r.u64("io server info field")?);
                }
                let mut info = ServerInfo::from_values(&values);
                info.chains = crate::members::get_chain_versions(r)?;
                IoResponse::ServerInfo(Box::new(info))
            }
        })
    }
}

/// The bytes of an io request: header with `env` and `req.op()`, then the
/// body. Limits are not checked here (the receiver checks them).
///
/// # Panics
/// If the body exceeds 4 GiB.
pub fn encode_io_request(env: Envelope, req: &IoRequest) -> Vec<u8> {
    crate::frame::encode_req::<IoRequestHeader, _>(env, req)
}

/// Decodes a whole io request message: header, a body of exactly
/// `body_len` bytes, and nothing else. Metadata op numbers are refused with
/// [`DecodeError::UnknownOp`].
pub fn decode_io_request(buf: &[u8]) -> Result<(Envelope, IoRequest), DecodeError> {
    let (env, req) = crate::frame::decode_req::<IoRequestHeader, IoRequest>(buf)?;
    if env.chain.is_some() && !req.op().carries_chain() {
        return Err(DecodeError::BadValue {
            what: "request chain (only Read, Write, Truncate, Sync, Stat and Allocate carry one)",
            value: u16::from(req.op()).into(),
        });
    }
    if env.forwarded && (env.chain.is_none() || !req.op().is_forwarded()) {
        return Err(DecodeError::BadValue {
            what: "forwarded request (only Write, Truncate, Sync and Allocate, carrying their chain)",
            value: u16::from(req.op()).into(),
        });
    }
    Ok((env, req))
}

/// The bytes of the reply to io request `tag` of `op`: on success the body
/// of `Ok`, on failure the errno and no body.
///
/// # Panics
/// If the result is not a well-formed answer to `op` (see
/// [`IoResponse::answers`]) or its errno is outside `1..=MAX_ERRNO`: the
/// server built a reply its client could not decode.
pub fn encode_io_reply(tag: u64, op: IoOp, result: &Result<IoResponse, Errno>) -> Vec<u8> {
    crate::frame::encode_rep::<IoReplyHeader, _>(tag, op, result)
}

/// Decodes a whole io reply message into (tag, op, result); the body is
/// read as the answer to `op`.
pub fn decode_io_reply(buf: &[u8]) -> Result<(u64, IoOp, Result<IoResponse, Errno>), DecodeError> {
    crate::frame::decode_rep::<IoReplyHeader, _>(buf)
}

impl crate::frame::RequestBody for IoRequest {
    type Op = IoOp;
    fn op(&self) -> IoOp {
        IoRequest::op(self)
    }
    fn put_body(&self, w: &mut Writer) {
        IoRequest::put_body(self, w)
    }
    fn get_body(op: IoOp, r: &mut Reader<'_>) -> Result<IoRequest, DecodeError> {
        IoRequest::get_body(op, r)
    }
}

impl crate::frame::ReplyBody for IoResponse {
    type Op = IoOp;
    fn answers(&self, op: IoOp) -> bool {
        IoResponse::answers(self, op)
    }
    fn put_body(&self, w: &mut Writer) {
        IoResponse::put_body(self, w)
    }
    fn get_body(op: IoOp, r: &mut Reader<'_>) -> Result<IoResponse, DecodeError> {
        IoResponse::get_body(op, r)
    }
    fn errno(&self) -> i32 {
        match self {
            IoResponse::ChainRefused(_) => CHAIN_REFUSED.0,
            _ => 0,
        }
    }
    fn get_errno_body(op: IoOp, errno: i32, r: &mut Reader<'_>) -> Result<Option<IoResponse>, DecodeError> {
        if errno != CHAIN_REFUSED.0 {
            return Ok(None);
        }
        if !op.carries_chain() {
            return Err(DecodeError::BadValue {
                what: "io chain refusal (answers only an op that carries a chain)",
                value: u16::from(op).into(),
            });
        }
        Ok(Some(IoResponse::ChainRefused(ChainRefusal::get(r)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_reply, decode_request, encode_reply, encode_request, Op, Request, Response, RIGHT_READ};

    const ENV: Envelope = Envelope::new(0x0102_0304_0506_0708, 1000, 100);

    fn cap() -> Capability {
        crate::types::sample_capability()
    }

    fn ext(offset: u64, len: u32, key: u16, addr: u64) -> IoExtent {
        IoExtent { offset, len, key, addr }
    }

    fn read(keys: Vec<Vec<u8>>, extents: Vec<IoExtent>, inline_reply: bool) -> IoRequest {
        IoRequest::Read { cap: cap(), keys, extents, inline_reply, keys_follow: None }
    }

    fn write(keys: Vec<Vec<u8>>, extents: Vec<IoExtent>, inline: Vec<u8>) -> IoRequest {
        IoRequest::Write { cap: cap(), keys, extents, stability: Stability::DataSync, inline, keys_follow: None }
    }

    fn allocate(offset: u64, len: u64, mode: AllocateMode, stripes: StripeSlots) -> IoRequest {
        IoRequest::Allocate { cap: cap(), offset, len, mode, stripes }
    }

    /// Requests of every op, in several shapes.
    fn requests() -> Vec<IoRequest> {
        let keys = vec![vec![1; 40], vec![2; MAX_IO_KEY_BYTES]];
        vec![
            read(keys.clone(), vec![ext(0, 4096, 0, 0x7f00_0000_1000), ext(1 << 40, 1, 1, 8)], false),
            read(vec![], vec![IoExtent::inline(10, 5), IoExtent::inline(0, 3)], true),
            read(vec![], vec![], false),
            read(vec![vec![3]], vec![], true),
            write(keys.clone(), vec![ext(0, 100, 1, 64), IoExtent::inline(100, 3), ext(50, 100, 0, 0)], vec![7, 8, 9]),
            write(vec![], vec![IoExtent::inline(MAX_FILE_SIZE - 2, 2)], vec![1, 2]),
            IoRequest::Write {
                cap: cap(),
                keys,
                extents: vec![ext(5, 5, 0, 5)],
                stability: Stability::Unstable,
                inline: vec![],
                keys_follow: None,
            },
            IoRequest::Write {
                cap: cap(),
                keys: vec![],
                extents: vec![],
                stability: Stability::FileSync,
                inline: vec![],
                keys_follow: None,
            },
            IoRequest::Truncate { cap: cap(), size: 12345 },
            IoRequest::Scrub { cap: cap(), object: 7, offset: u64::MAX },
            allocate(0, 8 << 20, AllocateMode::Reserve, StripeSlots { unit: 1 << 20, count: 4, slots: vec![1] }),
            allocate(7, 1, AllocateMode::ReserveKeepSize, StripeSlots::all(4096)),
            allocate(
                MAX_FILE_SIZE - 3,
                3,
                AllocateMode::PunchHole,
                StripeSlots { unit: 1, count: 256, slots: (0..256).collect() },
            ),
            allocate(1 << 30, 5, AllocateMode::ZeroRange, StripeSlots { unit: 64, count: 3, slots: vec![0, 2] }),
            allocate(0, 1 << 20, AllocateMode::ZeroRangeKeepSize, StripeSlots::all(u32::MAX)),
            IoRequest::Read {
                cap: cap(),
                keys: vec![],
                extents: vec![ext(0, 4096, 0, 0x1000), ext(8192, 10, 2, 0x9000)],
                inline_reply: false,
                keys_follow: Some(KeysFollow { tag: u64::MAX, count: 3 }),
            },
            IoRequest::Write {
                cap: cap(),
                keys: vec![],
                extents: vec![ext(0, 100, 0, 64), IoExtent::inline(100, 2)],
                stability: Stability::Unstable,
                inline: vec![5, 6],
                keys_follow: Some(KeysFollow { tag: 1, count: MAX_IO_KEYS as u16 }),
            },
            IoRequest::Keys { tag: 7, keys: vec![vec![1; 40]] },
            IoRequest::Keys { tag: 0, keys: vec![vec![9]; MAX_IO_KEYS] },
            IoRequest::Remove { cap: cap() },
            IoRequest::Sync { cap: cap() },
            IoRequest::Stat { cap: cap() },
            IoRequest::ServerInfo { cap: cap() },
            IoRequest::Login { client_name: "fuse@host".into(), nonce: [3; 16], mac: [4; 32], credential: None },
            IoRequest::Login {
                client_name: "c".into(),
                nonce: [0; 16],
                mac: [0; 32],
                credential: Some(crate::Credential {
                    name: "alice".into(),
                    uids: vec![crate::IdRange { first: 1000, last: 1999 }],
                    gids: vec![],
                    root: true,
                }),
            },
            IoRequest::Revoke {
                cap: cap(),
                batch: crate::Revocations {
                    instance: 1,
                    from_seq: 5,
                    to_seq: 6,
                    reset_floor: 2,
                    entries: vec![crate::Revocation { object_id: 77, floor: 9 }],
                    mac: [4; 32],
                },
            },
        ]
    }

    fn responses() -> Vec<(IoOp, IoResponse)> {
        vec![
            (IoOp::Read, IoResponse::Read { bytes: MAX_IO_BYTES as u64, data: vec![] }),
            (IoOp::Read, IoResponse::Read { bytes: 3, data: vec![1, 2, 3] }),
            (IoOp::Read, IoResponse::Read { bytes: 0, data: vec![] }),
            (IoOp::Write, IoResponse::Write { bytes: 4096 }),
            (IoOp::Truncate, IoResponse::Done),
            (IoOp::Remove, IoResponse::Done),
            (IoOp::Sync, IoResponse::Done),
            (IoOp::Login, IoResponse::Done),
            (IoOp::Allocate, IoResponse::Done),
            (IoOp::Keys, IoResponse::Done),
            (IoOp::Stat, IoResponse::Stat { size: u64::MAX }),
            (IoOp::Revoke, IoResponse::Revoked { instance: 3, seq: u64::MAX }),
            (
                IoOp::Scrub,
                IoResponse::Scrubbed(ScrubSlice {
                    objects: 3,
                    unverified: 1,
                    bytes: 1 << 30,
                    bad: vec![(9, 4096), (u64::MAX, 0)],
                    more_bad: 2,
                    next: Some((10, 0)),
                }),
            ),
            (IoOp::Scrub, IoResponse::Scrubbed(ScrubSlice::default())),
            (
                IoOp::ServerInfo,
                IoResponse::ServerInfo(Box::new(ServerInfo { capacity_bytes: 1 << 40, mode: 2, ..Default::default() })),
            ),
        ]
    }

    #[test]
    fn every_request_round_trips() {
        let reqs = requests();
        for op in IoOp::ALL {
            assert!(reqs.iter().any(|r| r.op() == *op), "no sample of {op}");
        }
        for req in reqs {
            let b = encode_io_request(ENV, &req);
            let hdr = IoRequestHeader::decode(&b).unwrap();
            assert_eq!((hdr.op, hdr.envelope()), (req.op(), ENV));
            assert_eq!(b.len(), IoRequestHeader::SIZE + hdr.body_len as usize);
            assert_eq!(decode_io_request(&b), Ok((ENV, req.clone())), "{req:?}");
        }
    }

    #[test]
    fn every_response_round_trips() {
        let resps = responses();
        for op in IoOp::ALL {
            assert!(resps.iter().any(|(o, _)| o == op), "no answer to {op}");
        }
        for (op, resp) in resps {
            assert!(resp.answers(op));
            let b = encode_io_reply(7, op, &Ok(resp.clone()));
            assert_eq!(decode_io_reply(&b), Ok((7, op, Ok(resp))));
        }
        let b = encode_io_reply(8, IoOp::Write, &Err(Errno::ENOSPC));
        assert_eq!(b.len(), IoReplyHeader::SIZE);
        assert_eq!(decode_io_reply(&b), Ok((8, IoOp::Write, Err(Errno::ENOSPC))));
    }

    #[test]
    fn accessors() {
        let reqs = requests();
        assert_eq!(reqs[0].total_bytes(), 4097);
        assert_eq!(reqs[1].total_bytes(), 8);
        assert_eq!(reqs[4].total_bytes(), 203);
        assert_eq!(IoRequest::Truncate { cap: cap(), size: 9 }.total_bytes(), 0);
        for r in &reqs {
            match r {
                IoRequest::Login { .. } | IoRequest::Keys { .. } => assert_eq!(r.cap(), None),
                _ => assert_eq!(r.cap(), Some(&cap())),
            }
        }
        assert!(IoExtent::inline(1, 2).is_inline());
        assert!(!ext(1, 2, 0, 0).is_inline());
        assert_eq!(Stability::default(), Stability::Unstable);
        assert!(Stability::Unstable < Stability::DataSync && Stability::DataSync < Stability::FileSync);
    }

    #[test]
    fn body_layout_is_the_documented_one() {
        let req = write(vec![vec![0xaa, 0xbb]], vec![ext(0x11, 0x22, 0, 0x33), IoExtent::inline(0x44, 1)], vec![0xcc]);
        let b = encode_io_request(ENV, &req);
        assert_eq!(&b[2..4], &65u16.to_le_bytes());
        let body = &b[IoRequestHeader::SIZE..];
        let mut want = Vec::new();
        want.extend_from_slice(&77u64.to_le_bytes()); // capability
        want.extend_from_slice(&5u64.to_le_bytes());
        want.push(RIGHT_READ);
        want.extend_from_slice(&6u64.to_le_bytes());
        want.extend_from_slice(&123u64.to_le_bytes());
        want.extend_from_slice(&[0, 0]); // advice: none
        want.extend_from_slice(&[9; 32]);
        want.push(0); // no keys_follow
        want.extend_from_slice(&1u32.to_le_bytes()); // keys
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&[0xaa, 0xbb]);
        want.extend_from_slice(&2u32.to_le_bytes()); // extents
        want.extend_from_slice(&0x11u64.to_le_bytes());
        want.extend_from_slice(&0x22u32.to_le_bytes());
        want.extend_from_slice(&0u16.to_le_bytes());
        want.extend_from_slice(&0x33u64.to_le_bytes());
        want.extend_from_slice(&0x44u64.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&[0xff, 0xff]);
        want.extend_from_slice(&0u64.to_le_bytes());
        want.push(1); // stability
        want.extend_from_slice(&1u32.to_le_bytes()); // inline
        want.push(0xcc);
        assert_eq!(body, &want[..]);
        assert_eq!(CAPABILITY_SIZE, 67);
        // Read: the same up to the extents, then inline_reply.
        let b = encode_io_request(ENV, &read(vec![], vec![], true));
        assert_eq!(&b[2..4], &64u16.to_le_bytes());
        assert_eq!(&b[IoRequestHeader::SIZE + 67..], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        // Keys to follow: presence 1, tag u64, count u16, before the keys.
        let f = IoRequest::Read {
            cap: cap(),
            keys: vec![],
            extents: vec![],
            inline_reply: false,
            keys_follow: Some(KeysFollow { tag: 0x55, count: 2 }),
        };
        let b = encode_io_request(ENV, &f);
        assert_eq!(&b[IoRequestHeader::SIZE + 67..], &[1, 0x55, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        // Keys: tag u64, then the keys as a request's.
        let b = encode_io_request(ENV, &IoRequest::Keys { tag: 3, keys: vec![vec![7]] });
        assert_eq!(&b[2..4], &74u16.to_le_bytes());
        assert_eq!(&b[IoRequestHeader::SIZE..], &[3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 7]);
        let b = encode_io_request(ENV, &IoRequest::Truncate { cap: cap(), size: 5 });
        assert_eq!(&b[IoRequestHeader::SIZE + 67..], &5u64.to_le_bytes());
        let b = encode_io_reply(1, IoOp::Read, &Ok(IoResponse::Read { bytes: 2, data: vec![5, 6] }));
        assert_eq!(&b[IoReplyHeader::SIZE..], &[2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 5, 6]);
    }

    #[test]
    fn largest_messages_fit_their_stated_sizes() {
        let keys = vec![vec![b'k'; MAX_IO_KEY_BYTES]; MAX_IO_KEYS];
        // 1023 keyed extents of 64 KiB (≈ 64 MiB) and one inline of 64 KiB.
        let each = (MAX_IO_BYTES / MAX_IO_EXTENTS) as u32;
        let mut extents: Vec<IoExtent> =
            (0..MAX_IO_EXTENTS as u64 - 1).map(|i| ext(i * u64::from(each), each, (i % 16) as u16, i)).collect();
        extents.push(IoExtent::inline(1 << 50, MAX_INLINE as u32));
        let req = IoRequest::Write {
            cap: cap(),
            keys,
            extents,
            stability: Stability::FileSync,
            inline: vec![1; MAX_INLINE],
            keys_follow: None,
        };
        assert_eq!(req.total_bytes(), MAX_IO_BYTES as u64);
        let env = Envelope { chain: Some(crate::ChainVersion { chain: 1, version: 2 }), ..ENV };
        let b = encode_io_request(env, &req);
        assert_eq!(b.len(), MAX_IO_REQUEST_LEN);
        assert_eq!(decode_io_request(&b), Ok((env, req)));
        let resp = IoResponse::Read { bytes: MAX_INLINE as u64, data: vec![2; MAX_INLINE] };
        let b = encode_io_reply(1, IoOp::Read, &Ok(resp.clone()));
        assert_eq!(b.len(), MAX_IO_REPLY_LEN);
        assert_eq!(decode_io_reply(&b), Ok((1, IoOp::Read, Ok(resp))));
    }

    #[test]
    fn each_protocol_refuses_the_others_ops() {
        let io = encode_io_request(ENV, &IoRequest::Stat { cap: cap() });
        assert_eq!(decode_request(&io), Err(DecodeError::UnknownOp(69)));
        assert_eq!(crate::RequestHeader::decode(&io), Err(DecodeError::UnknownOp(69)));
        let meta = encode_request(ENV, &Request::GetAttr { ino: 1 });
        assert_eq!(decode_io_request(&meta), Err(DecodeError::UnknownOp(3)));
        assert_eq!(IoRequestHeader::decode(&meta), Err(DecodeError::UnknownOp(3)));
        let io = encode_io_reply(1, IoOp::Read, &Ok(IoResponse::Read { bytes: 1, data: vec![] }));
        assert_eq!(decode_reply(&io), Err(DecodeError::UnknownOp(64)));
        let meta = encode_reply(1, Op::Unlink, &Ok(Response::Done));
        assert_eq!(decode_io_reply(&meta), Err(DecodeError::UnknownOp(8)));
        assert_eq!(IoReplyHeader::decode(&meta), Err(DecodeError::UnknownOp(8)));
        for n in 0..=u16::MAX {
            assert!(Op::from_u16(n).is_none() || IoOp::from_u16(n).is_none(), "{n} in both tables");
            if let Some(op) = IoOp::from_u16(n) {
                assert!(crate::IO_OP_NUMBERS.contains(&n), "{op}");
            }
            if let Some(op) = Op::from_u16(n) {
                assert!(crate::META_OP_NUMBERS.contains(&n), "{op}");
            }
        }
    }

    #[test]
    fn op_numbers_are_stable() {
        let got: Vec<u16> = IoOp::ALL.iter().map(|op| u16::from(*op)).collect();
        assert_eq!(got, (64..=75).collect::<Vec<u16>>());
        for op in IoOp::ALL {
            assert_eq!(IoOp::from_u16(u16::from(*op)), Some(*op));
        }
        assert_eq!(IoOp::Truncate.to_string(), "Truncate");
        assert_eq!([Stability::Unstable as u8, Stability::DataSync as u8, Stability::FileSync as u8], [0, 1, 2]);
        assert_eq!(Stability::from_u8(3), None);
    }

    fn refused(req: &IoRequest) -> DecodeError {
        decode_io_request(&encode_io_request(ENV, req)).unwrap_err()
    }

    fn bad_value(e: DecodeError) -> (&'static str, u64) {
        match e {
            DecodeError::BadValue { what, value } => (what, value),
            other => panic!("expected BadValue, got {other:?}"),
        }
    }

    #[test]
    fn extent_refusals() {
        let k = || vec![vec![1u8; 8]];
        let (what, v) = bad_value(refused(&read(k(), vec![ext(0, 0, 0, 0)], false)));
        assert_eq!((what, v), ("io extent len (must not be 0)", 0));
        let (what, v) = bad_value(refused(&read(k(), vec![ext(u64::MAX, 1, 0, 0)], false)));
        assert_eq!((what, v), ("io extent offset (offset + len past the largest file size)", u64::MAX));
        let (what, _) = bad_value(refused(&read(k(), vec![ext(u64::MAX - 1, 2, 0, 0)], false)));
        assert!(what.contains("largest file size"));
        // Offsets near u64::MAX (issue 10, finding 6) and just past the
        // largest file size are refused; its last byte is reachable.
        let (what, _) = bad_value(refused(&read(k(), vec![ext(u64::MAX - 4096, 1, 0, 0)], false)));
        assert!(what.contains("largest file size"));
        let (what, _) = bad_value(refused(&read(k(), vec![ext(MAX_FILE_SIZE, 1, 0, 0)], false)));
        assert!(what.contains("largest file size"));
        let ok = read(k(), vec![ext(MAX_FILE_SIZE - 1, 1, 0, 0)], false);
        assert!(decode_io_request(&encode_io_request(ENV, &ok)).is_ok());
        // Client addresses must not wrap inside an extent.
        let (what, v) = bad_value(refused(&read(k(), vec![ext(0, 16, 0, u64::MAX - 8)], false)));
        assert_eq!((what, v), ("io extent addr (addr + len overflows u64)", u64::MAX - 8));
        let b = encode_io_request(ENV, &IoRequest::Truncate { cap: cap(), size: MAX_FILE_SIZE + 1 });
        assert!(decode_io_request(&b).is_err(), "a truncate past the largest file size was accepted");
        let (what, v) = bad_value(refused(&read(k(), vec![ext(0, 1, 1, 0)], false)));
        assert_eq!((what, v), ("io extent key (past the request's keys)", 1));
        let (what, v) = bad_value(refused(&write(vec![], vec![ext(0, 1, 0, 0)], vec![])));
        assert_eq!((what, v), ("io extent key (past the request's keys)", 0));
        let (what, v) = bad_value(refused(&write(vec![], vec![ext(0, 1, NO_KEY, 4)], vec![0])));
        assert_eq!((what, v), ("io extent addr (must be 0 for inline data)", 4));
        // Too many extents, and a count whose extents are missing.
        let many = vec![ext(0, 1, 0, 0); MAX_IO_EXTENTS + 1];
        assert!(matches!(
            refused(&read(k(), many, false)),
            DecodeError::TooLong { what: "io extents", len: 1025, max: 1024 }
        ));
        let mut b = encode_io_request(ENV, &read(vec![], vec![], false));
        let at = b.len() - 5; // the extents count, before inline_reply
        b[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(decode_io_request(&b), Err(DecodeError::Truncated { what: "io extents", needed: 22_000, left: 1 }));
    }

    #[test]
    fn byte_total_is_bounded() {
        let quarter = (MAX_IO_BYTES / 4) as u32;
        let exact = vec![ext(0, quarter, 0, 0); 4];
        assert!(decode_io_request(&encode_io_request(ENV, &read(vec![vec![1]], exact.clone(), false))).is_ok());
        let mut over = exact;
        over.push(ext(0, 1, 0, 0));
        assert!(matches!(
            refused(&read(vec![vec![1]], over, false)),
            DecodeError::TooLong { what: "io request bytes (sum of extent lengths)", len, max }
                if len == MAX_IO_BYTES + 1 && max == MAX_IO_BYTES
        ));
        // A single extent of u32::MAX bytes is above the total.
        assert!(matches!(
            refused(&write(vec![vec![1]], vec![ext(0, u32::MAX, 0, 0)], vec![])),
            DecodeError::TooLong { max: MAX_IO_BYTES, .. }
        ));
    }

    #[test]
    fn key_refusals() {
        let many = vec![vec![1u8]; MAX_IO_KEYS + 1];
        assert!(matches!(
            refused(&read(many, vec![], false)),
            DecodeError::TooLong { what: "io keys", len: 17, max: 16 }
        ));
        let long = vec![vec![1u8; MAX_IO_KEY_BYTES + 1]];
        assert!(matches!(
            refused(&read(long, vec![], false)),
            DecodeError::TooLong { what: "io key", len: 4097, max: 4096 }
        ));
        let (what, v) = bad_value(refused(&write(vec![vec![1], vec![]], vec![], vec![])));
        assert_eq!((what, v), ("io key length (must not be 0)", 0));
        // A key count the input cannot hold allocates nothing.
        let mut b = encode_io_request(ENV, &read(vec![], vec![], false));
        let at = IoRequestHeader::SIZE + CAPABILITY_SIZE + 1;
        b[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
        assert_eq!(decode_io_request(&b), Err(DecodeError::Truncated { what: "io keys", needed: 80, left: 5 }));
    }

    #[test]
    fn read_refusals() {
        let (what, v) = bad_value(refused(&read(vec![vec![1]], vec![IoExtent::inline(0, 1)], false)));
        assert_eq!((what, v), ("io extent key (NO_KEY in a read without inline_reply)", u64::from(NO_KEY)));
        let (what, v) = bad_value(refused(&read(vec![vec![1]], vec![IoExtent::inline(0, 1), ext(0, 1, 0, 0)], true)));
        assert_eq!((what, v), ("io extent key (an inline-reply read takes only NO_KEY extents)", 0));
        let half = (MAX_INLINE / 2) as u32;
        let fits = read(vec![], vec![IoExtent::inline(0, half), IoExtent::inline(half.into(), half)], true);
        assert!(decode_io_request(&encode_io_request(ENV, &fits)).is_ok());
        let over = read(vec![], vec![IoExtent::inline(0, half), IoExtent::inline(0, half + 1)], true);
        assert!(matches!(
            refused(&over),
            DecodeError::TooLong { what: "io read inline reply bytes", len, max: MAX_INLINE } if len == MAX_INLINE + 1
        ));
        let mut b = encode_io_request(ENV, &read(vec![], vec![], false));
        *b.last_mut().unwrap() = 2;
        assert_eq!(decode_io_request(&b), Err(DecodeError::BadValue { what: "io read inline_reply", value: 2 }));
    }

    #[test]
    fn write_refusals() {
        let inl = |len| IoExtent::inline(0, len);
        let (what, v) = bad_value(refused(&write(vec![], vec![inl(3)], vec![1, 2])));
        assert_eq!((what, v), ("io write inline data length (must equal the NO_KEY extents' total)", 2));
        let (_, v) = bad_value(refused(&write(vec![], vec![inl(1)], vec![1, 2])));
        assert_eq!(v, 2);
        // Keyed extents take nothing from inline.
        let (_, v) = bad_value(refused(&write(vec![vec![1]], vec![ext(0, 4, 0, 0)], vec![1, 2, 3, 4])));
        assert_eq!(v, 4);
        let half = (MAX_INLINE / 2) as u32;
        assert!(matches!(
            refused(&write(vec![], vec![inl(half), inl(half + 1)], vec![])),
            DecodeError::TooLong { what: "io write inline extents", len, max: MAX_INLINE } if len == MAX_INLINE + 1
        ));
        assert!(matches!(
            refused(&write(vec![], vec![inl(1)], vec![0; MAX_INLINE + 1])),
            DecodeError::TooLong { what: "io write inline data", len, max: MAX_INLINE } if len == MAX_INLINE + 1
        ));
        // Stability byte: after the extents, before the inline data.
        let mut b = encode_io_request(ENV, &write(vec![], vec![inl(2)], vec![5, 6]));
        let at = b.len() - 2 - 4 - 1;
        assert_eq!(b[at], Stability::DataSync as u8);
        b[at] = 3;
        assert_eq!(decode_io_request(&b), Err(DecodeError::BadValue { what: "io write stability", value: 3 }));
    }

    #[test]
    fn framing_refusals() {
        let good = encode_io_request(ENV, &IoRequest::Truncate { cap: cap(), size: 1 });
        // Capability rights outside the known bits.
        let mut b = good.clone();
        b[IoRequestHeader::SIZE + 16] = 4;
        assert_eq!(decode_io_request(&b), Err(DecodeError::BadValue { what: "capability rights", value: 4 }));
        // A body one byte short, with a header that agrees.
        let mut b = good[..good.len() - 1].to_vec();
        b[24..28].copy_from_slice(&(CAPABILITY_SIZE as u32 + 7).to_le_bytes());
        assert_eq!(decode_io_request(&b), Err(DecodeError::Truncated { what: "io truncate size", needed: 8, left: 7 }));
        // A trailing byte the header counts.
        let mut b = good.clone();
        b.push(0);
        assert_eq!(decode_io_request(&b), Err(DecodeError::BodyLength { announced: 75, actual: 76 }));
        b[24..28].copy_from_slice(&76u32.to_le_bytes());
        assert_eq!(decode_io_request(&b), Err(DecodeError::Trailing(1)));
        let mut b = good.clone();
        b[0..2].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(decode_io_request(&b), Err(DecodeError::BadVersion(1)));
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(decode_io_request(&b), Err(DecodeError::Reserved));
        // The groups flag: the body's first byte (77) is read as a count.
        let mut b = good.clone();
        b[4] = 1;
        assert_eq!(decode_io_request(&b), Err(DecodeError::TooLong { what: "groups", len: 77, max: 32 }));
        let mut b = good.clone();
        b[2..4].copy_from_slice(&76u16.to_le_bytes());
        assert_eq!(decode_io_request(&b), Err(DecodeError::UnknownOp(76)));
        // The header alone decodes for a server that must reply.
        let hdr = IoRequestHeader::decode(&good).unwrap();
        assert_eq!((hdr.op, hdr.envelope(), hdr.body_len), (IoOp::Truncate, ENV, 75));
    }

    #[test]
    fn allocate_layout_and_refusals() {
        let quad = |slots: Vec<u32>| StripeSlots { unit: 1 << 20, count: 4, slots };
        let b = encode_io_request(ENV, &allocate(0x11, 0x22, AllocateMode::PunchHole, quad(vec![0, 3])));
        assert_eq!(&b[2..4], &73u16.to_le_bytes());
        let mut want = Vec::new();
        want.extend_from_slice(&0x11u64.to_le_bytes());
        want.extend_from_slice(&0x22u64.to_le_bytes());
        want.push(2);
        want.extend_from_slice(&(1u32 << 20).to_le_bytes());
        want.extend_from_slice(&4u32.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&3u32.to_le_bytes());
        assert_eq!(&b[IoRequestHeader::SIZE + CAPABILITY_SIZE..], &want[..]);

        let (what, v) = bad_value(refused(&allocate(5, 0, AllocateMode::Reserve, quad(vec![0]))));
        assert_eq!((what, v), ("io allocate len (must not be 0)", 0));
        let (what, _) = bad_value(refused(&allocate(MAX_FILE_SIZE, 1, AllocateMode::Reserve, quad(vec![0]))));
        assert!(what.contains("largest file size"));
        let (what, _) = bad_value(refused(&allocate(u64::MAX, 2, AllocateMode::Reserve, quad(vec![0]))));
        assert!(what.contains("largest file size"));
        let ok = allocate(MAX_FILE_SIZE - 1, 1, AllocateMode::Reserve, quad(vec![0]));
        assert!(decode_io_request(&encode_io_request(ENV, &ok)).is_ok());
        // Slots: at least one, ascending, each below the count.
        for slots in [vec![], vec![4], vec![1, 1], vec![2, 1]] {
            assert!(refused(&allocate(0, 1, AllocateMode::Reserve, quad(slots.clone()))).to_string().contains("slot"));
        }
        let no_unit = StripeSlots { unit: 0, count: 1, slots: vec![0] };
        assert!(bad_value(refused(&allocate(0, 1, AllocateMode::Reserve, no_unit))).0.contains("stripe unit"));
        for count in [0, crate::MAX_LAYOUT_SERVERS as u32 + 1] {
            let s = StripeSlots { unit: 1, count, slots: vec![0] };
            assert!(bad_value(refused(&allocate(0, 1, AllocateMode::Reserve, s))).0.contains("stripe count"));
        }
        // A hostile slot count is refused before anything is allocated.
        let mut b = encode_io_request(ENV, &allocate(0, 1, AllocateMode::Reserve, quad(vec![0])));
        let at = b.len() - 8;
        b[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_io_request(&b), Err(DecodeError::TooLong { what: "io allocate slots", .. })));
        // Modes past the known ones.
        let mut b = encode_io_request(ENV, &allocate(0, 1, AllocateMode::Reserve, quad(vec![0])));
        let at = IoRequestHeader::SIZE + CAPABILITY_SIZE + 16;
        assert_eq!(b[at], 0);
        b[at] = 5;
        assert_eq!(decode_io_request(&b), Err(DecodeError::BadValue { what: "io allocate mode", value: 5 }));
        // The span limit: exactly MAX_ALLOCATE_STRIPES units, then one more
        // byte (into the next unit).
        let unit = 4096u64;
        let exact = allocate(unit, MAX_ALLOCATE_STRIPES * unit, AllocateMode::Reserve, StripeSlots::all(4096));
        assert!(decode_io_request(&encode_io_request(ENV, &exact)).is_ok());
        let over = allocate(unit - 1, MAX_ALLOCATE_STRIPES * unit, AllocateMode::Reserve, StripeSlots::all(4096));
        assert!(matches!(
            refused(&over),
            DecodeError::TooLong { what: "io allocate stripe units spanned", len, .. }
                if len as u64 == MAX_ALLOCATE_STRIPES + 1
        ));
    }

    #[test]
    fn allocate_modes_and_slots() {
        let modes: Vec<u8> = (0..=255).filter(|&v| AllocateMode::from_u8(v).is_some()).collect();
        assert_eq!(modes, [0, 1, 2, 3, 4]);
        for v in modes {
            assert_eq!(AllocateMode::from_u8(v).map(|m| m as u8), Some(v));
        }
        use AllocateMode::*;
        let keeps: Vec<bool> =
            [Reserve, ReserveKeepSize, PunchHole, ZeroRange, ZeroRangeKeepSize].map(|m| m.keeps_size()).to_vec();
        assert_eq!(keeps, [false, true, true, false, true]);
        assert!(!Reserve.zeroes() && PunchHole.zeroes() && ZeroRange.zeroes() && !PunchHole.reserves());
        let s = StripeSlots { unit: 10, count: 4, slots: vec![1, 3] };
        let held: Vec<u64> = (0..9).filter(|&i| s.holds(i)).collect();
        assert_eq!(held, [1, 3, 5, 7]);
        assert!((0..9).all(|i| StripeSlots::all(1).holds(i)));
    }

    /// A reply whose body is `body`, with a header that agrees.
    fn raw_reply(op: IoOp, body: &[u8]) -> Vec<u8> {
        let mut b = IoReplyHeader::new(op, 1, 0, body.len() as u32).encode().to_vec();
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn reply_refusals() {
        let over = (MAX_IO_BYTES as u64 + 1).to_le_bytes();
        let mut body = over.to_vec();
        body.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            decode_io_reply(&raw_reply(IoOp::Read, &body)),
            Err(DecodeError::TooLong { what: "io read reply bytes", .. })
        ));
        assert!(matches!(
            decode_io_reply(&raw_reply(IoOp::Write, &over)),
            Err(DecodeError::TooLong { what: "io write reply bytes", .. })
        ));
        let mut body = 3u64.to_le_bytes().to_vec();
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(&[1, 2]);
        assert_eq!(
            decode_io_reply(&raw_reply(IoOp::Read, &body)),
            Err(DecodeError::BadValue { what: "io read reply bytes (must equal the inline data's length)", value: 3 })
        );
        let mut body = 0u64.to_le_bytes().to_vec();
        body.extend_from_slice(&(MAX_INLINE as u32 + 1).to_le_bytes());
        assert!(matches!(
            decode_io_reply(&raw_reply(IoOp::Read, &body)),
            Err(DecodeError::TooLong { what: "io read reply data", max: MAX_INLINE, .. })
        ));
        assert_eq!(decode_io_reply(&raw_reply(IoOp::Sync, &[0])), Err(DecodeError::Trailing(1)));
        assert!(matches!(
            decode_io_reply(&raw_reply(IoOp::Stat, &[0; 7])),
            Err(DecodeError::Truncated { what: "io stat size", .. })
        ));
        // An error reply with a body.
        let mut b = encode_io_reply(3, IoOp::Remove, &Err(Errno::ENOENT));
        b[16..20].copy_from_slice(&1u32.to_le_bytes());
        b.push(0);
        assert!(matches!(decode_io_reply(&b), Err(DecodeError::BadValue { value: 1, .. })));
        let mut b = encode_io_reply(3, IoOp::Remove, &Ok(IoResponse::Done));
        b[20] = 1;
        assert_eq!(decode_io_reply(&b), Err(DecodeError::Reserved));
    }

    #[test]
    fn answers_matches_ops() {
        assert!(IoResponse::Done.answers(IoOp::Truncate));
        assert!(!IoResponse::Done.answers(IoOp::Read));
        assert!(!IoResponse::Write { bytes: 1 }.answers(IoOp::Read));
        assert!(!IoResponse::Write { bytes: MAX_IO_BYTES as u64 + 1 }.answers(IoOp::Write));
        assert!(!IoResponse::Read { bytes: 2, data: vec![1] }.answers(IoOp::Read));
        assert!(!IoResponse::Read { bytes: 0, data: vec![0; MAX_INLINE + 1] }.answers(IoOp::Read));
        assert!(IoResponse::Stat { size: 0 }.answers(IoOp::Stat));
    }

    #[test]
    #[should_panic(expected = "not a well-formed answer to Stat")]
    fn encoding_a_wrong_answer_panics() {
        encode_io_reply(1, IoOp::Stat, &Ok(IoResponse::Done));
    }

    #[test]
    #[should_panic(expected = "errno 0 cannot travel")]
    fn encoding_errno_zero_panics() {
        encode_io_reply(1, IoOp::Read, &Err(Errno(0)));
    }

    #[test]
    fn server_info_takes_known_fields_and_ignores_the_rest() {
        let info = ServerInfo {
            capacity_bytes: 7,
            connections_accepted: 9,
            lease: LEASE_HELD,
            chains: vec![crate::ChainVersion { chain: 2, version: 5 }],
            ..Default::default()
        };
        let n = info.fields().len();
        let bytes = encode_io_reply(3, IoOp::ServerInfo, &Ok(IoResponse::ServerInfo(Box::new(info.clone()))));
        assert_eq!(decode_io_reply(&bytes).unwrap().2, Ok(IoResponse::ServerInfo(Box::new(info.clone()))));
        for cut in 1..=12 {
            assert!(decode_io_reply(&bytes[..bytes.len() - cut]).is_err(), "{cut} bytes of chain versions cut");
        }
        let info = ServerInfo { chains: Vec::new(), ..info };
        // A newer server with two more fields; an older one with fewer.
        let mut vals: Vec<u64> = info.fields().iter().map(|f| f.1).collect();
        vals.extend([1, 2]);
        assert_eq!(ServerInfo::from_values(&vals), info);
        assert_eq!(ServerInfo::from_values(&vals[..1]), ServerInfo { capacity_bytes: 7, ..Default::default() });
        // A hostile count is refused before anything is allocated.
        let mut w = bytes.clone();
        let body = IoReplyHeader::SIZE;
        w[body..body + 4].copy_from_slice(&(MAX_INFO_FIELDS as u32 + 1).to_le_bytes());
        assert!(decode_io_reply(&w).is_err());
        assert_eq!(n, 32, "update the field count in tests/io_roundtrip.rs");
    }

    #[test]
    fn keys_that_follow_are_checked_like_keys_carried() {
        let follow = |count: u16| Some(KeysFollow { tag: 3, count });
        let rd = |keys: Vec<Vec<u8>>, extents, inline_reply, keys_follow| IoRequest::Read {
            cap: cap(),
            keys,
            extents,
            inline_reply,
            keys_follow,
        };
        let bad = |req: IoRequest| decode_io_request(&encode_io_request(ENV, &req)).is_err();
        // Extents index the keys to come, not the (empty) keys carried.
        assert!(!bad(rd(vec![], vec![ext(0, 1, 1, 0)], false, follow(2))));
        assert!(bad(rd(vec![], vec![ext(0, 1, 2, 0)], false, follow(2))), "an extent past the keys to follow");
        assert!(bad(rd(vec![vec![1]], vec![ext(0, 1, 0, 0)], false, follow(1))), "keys carried and to follow");
        assert!(bad(rd(vec![], vec![], false, follow(0))), "no key to follow");
        assert!(bad(rd(vec![], vec![], false, follow(MAX_IO_KEYS as u16 + 1))), "too many keys to follow");
        assert!(bad(rd(vec![], vec![IoExtent::inline(0, 1)], true, follow(1))), "an inline reply has no keys");
        // A Keys: at least one key, each 1..=MAX_IO_KEY_BYTES, at most MAX_IO_KEYS.
        assert!(bad(IoRequest::Keys { tag: 1, keys: vec![] }));
        assert!(bad(IoRequest::Keys { tag: 1, keys: vec![vec![]] }));
        assert!(bad(IoRequest::Keys { tag: 1, keys: vec![vec![0; MAX_IO_KEY_BYTES + 1]] }));
        assert!(bad(IoRequest::Keys { tag: 1, keys: vec![vec![1]; MAX_IO_KEYS + 1] }));
        // Every prefix of a Keys, and every byte of it changed, decodes or
        // is refused without a panic; a presence byte other than 0 or 1 is refused.
        let b = encode_io_request(ENV, &IoRequest::Keys { tag: 9, keys: vec![vec![1; 40], vec![2; 3]] });
        for n in 0..b.len() {
            assert!(decode_io_request(&b[..n]).is_err(), "prefix of {n} bytes accepted");
        }
        for i in 0..b.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut g = b.clone();
                g[i] = v;
                let _ = decode_io_request(&g);
            }
        }
        let mut r = encode_io_request(ENV, &rd(vec![], vec![], false, None));
        let presence = IoRequestHeader::SIZE + CAPABILITY_SIZE;
        assert_eq!(r[presence], 0);
        r[presence] = 2;
        assert!(decode_io_request(&r).is_err());
    }

    /// Found by the fuzz sweep: a slice without a next one carried a next
    /// position that decoding dropped, so the message had two encodings.
    #[test]
    fn a_scrub_slice_without_more_must_carry_a_zero_position() {
        let ok = encode_io_reply(1, IoOp::Scrub, &Ok(IoResponse::Scrubbed(ScrubSlice::default())));
        assert!(decode_io_reply(&ok).is_ok());
        let mut bad = ok.clone();
        let n = bad.len();
        bad[n - 16] = 12;
        assert!(decode_io_reply(&bad).is_err(), "a position without a next slice was accepted");
    }

    /// Issue 13, step 3: the chain travels once per request, in front of
    /// the body, only on the ops that carry one, bounded.
    #[test]
    fn a_data_request_carries_its_chain_once_and_only_data_ops_may() {
        let chain = Some(crate::ChainVersion { chain: 3, version: 7 });
        let env = Envelope { chain, ..ENV };
        let data_ops = [
            read(vec![vec![1]], vec![IoExtent { offset: 0, len: 1, key: 0, addr: 4096 }], false),
            IoRequest::Truncate { cap: cap(), size: 5 },
            IoRequest::Sync { cap: cap() },
            IoRequest::Stat { cap: cap() },
        ];
        for req in &data_ops {
            let b = encode_io_request(env, req);
            assert_eq!(b.len(), encode_io_request(ENV, req).len() + 12, "{req:?}: chain u32 + version u64");
            assert_eq!(b[4] as u32 & crate::REQUEST_FLAG_CHAIN, crate::REQUEST_FLAG_CHAIN);
            assert_eq!(decode_io_request(&b), Ok((env, req.clone())));
            for n in 0..b.len() {
                assert!(decode_io_request(&b[..n]).is_err(), "prefix of {n} bytes accepted");
            }
        }
        // Ops that carry none refuse one.
        for req in [
            IoRequest::Remove { cap: cap() },
            IoRequest::ServerInfo { cap: cap() },
            IoRequest::Keys { tag: 1, keys: vec![vec![1]] },
            IoRequest::Scrub { cap: cap(), object: 0, offset: 0 },
        ] {
            assert!(decode_io_request(&encode_io_request(ENV, &req)).is_ok());
            assert!(
                matches!(decode_io_request(&encode_io_request(env, &req)), Err(DecodeError::BadValue { .. })),
                "{req:?} with a chain accepted"
            );
        }
        // A chain id at or above MAX_CHAINS is refused.
        let far = Envelope { chain: Some(crate::ChainVersion { chain: crate::MAX_CHAINS as u32, version: 1 }), ..ENV };
        let b = encode_io_request(far, &IoRequest::Sync { cap: cap() });
        assert!(matches!(decode_io_request(&b), Err(DecodeError::BadValue { .. })));
        let last = Envelope {
            chain: Some(crate::ChainVersion { chain: crate::MAX_CHAINS as u32 - 1, version: u64::MAX }),
            ..ENV
        };
        assert!(decode_io_request(&encode_io_request(last, &IoRequest::Sync { cap: cap() })).is_ok());
        // Forwarded: only a Write that carries its chain.
        let fwd = Envelope { forwarded: true, ..last };
        let write = IoRequest::Write {
            cap: cap(),
            keys: vec![],
            extents: vec![IoExtent { offset: 0, len: 1, key: NO_KEY, addr: 0 }],
            stability: Stability::Unstable,
            inline: vec![7],
            keys_follow: None,
        };
        let (got, _) = decode_io_request(&encode_io_request(fwd, &write)).unwrap();
        assert!(got.forwarded && got.chain.is_some());
        assert!(decode_io_request(&encode_io_request(fwd, &IoRequest::Sync { cap: cap() })).is_ok());
        let read = IoRequest::Read { cap: cap(), keys: vec![], extents: vec![], inline_reply: true, keys_follow: None };
        for (env, req) in [(fwd, read), (Envelope { forwarded: true, ..ENV }, write)] {
            assert!(
                matches!(decode_io_request(&encode_io_request(env, &req)), Err(DecodeError::BadValue { .. })),
                "{req:?} forwarded with {env:?} accepted"
            );
        }
        // The metadata protocol knows no such flag.
        let meta = encode_request(env, &Request::GetAttr { ino: 1 });
        assert_eq!(decode_request(&meta), Err(DecodeError::Reserved));
    }

    /// The refusal is the one error reply with a body, only for an op that
    /// carries a chain, and decodes strictly.
    #[test]
    fn a_chain_refusal_travels_as_its_errno_with_the_servers_version() {
        let refusal = ChainRefusal { reason: ChainRefusalReason::Stale, chain: 2, version: 9 };
        for op in [IoOp::Read, IoOp::Write, IoOp::Truncate, IoOp::Sync, IoOp::Stat, IoOp::Allocate] {
            let b = encode_io_reply(5, op, &Ok(IoResponse::ChainRefused(refusal)));
            let hdr = IoReplyHeader::decode(&b).unwrap();
            assert_eq!((hdr.errno, hdr.body_len), (CHAIN_REFUSED.0, 13));
            assert_eq!(decode_io_reply(&b), Ok((5, op, Ok(IoResponse::ChainRefused(refusal)))));
            for n in 0..b.len() {
                assert!(decode_io_reply(&b[..n]).is_err(), "prefix of {n} bytes accepted");
            }
        }
        // Without its body, the errno is malformed, not a plain error.
        let plain = encode_io_reply(5, IoOp::Read, &Err(CHAIN_REFUSED));
        assert!(decode_io_reply(&plain).is_err());
        // Another errno with a body is refused as before.
        let mut other = encode_io_reply(5, IoOp::Read, &Ok(IoResponse::ChainRefused(refusal)));
        other[4..8].copy_from_slice(&Errno::EIO.0.to_le_bytes());
        assert!(decode_io_reply(&other).is_err());
        // Not an answer to an op that carries no chain.
        assert!(!IoResponse::ChainRefused(refusal).answers(IoOp::Remove));
        let mut remove = encode_io_reply(5, IoOp::Read, &Ok(IoResponse::ChainRefused(refusal)));
        remove[2..4].copy_from_slice(&u16::from(IoOp::Remove).to_le_bytes());
        assert!(decode_io_reply(&remove).is_err());
        // Bad reasons, chains past the bound, a version for "not a replica".
        let at = IoReplyHeader::SIZE;
        let good = encode_io_reply(5, IoOp::Read, &Ok(IoResponse::ChainRefused(refusal)));
        // (Reason 4 is `NotHead` since protocol 19: 5 is the first unknown.)
        for (i, v) in [(at, 0u8), (at, 5), (at + 4, 1)] {
            let mut b = good.clone();
            b[i] = v;
            assert!(decode_io_reply(&b).is_err(), "byte {i} = {v} accepted");
        }
        let nr = ChainRefusal { reason: ChainRefusalReason::NotReplica, chain: 2, version: 0 };
        let mut b = encode_io_reply(5, IoOp::Sync, &Ok(IoResponse::ChainRefused(nr)));
        assert!(decode_io_reply(&b).is_ok());
        b[at + 5] = 1;
        assert!(decode_io_reply(&b).is_err(), "a version for a server that holds no replica");
        let nh = ChainRefusal { reason: ChainRefusalReason::NotHead, chain: 2, version: 8 };
        let b = encode_io_reply(5, IoOp::Write, &Ok(IoResponse::ChainRefused(nh)));
        assert_eq!(decode_io_reply(&b).unwrap().2, Ok(IoResponse::ChainRefused(nh)));
    }
}
