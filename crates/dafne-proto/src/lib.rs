//! dafne's wire contracts: what a client says to the metadata server
//! (this page) and to the io servers (module [`io`]) inside the transport's
//! `Request`/`Reply` frames.
//!
//! This crate does no I/O. It turns [`Request`]s and [`Response`]s (and
//! [`IoRequest`]s and [`IoResponse`]s) into bytes and back, and treats every
//! byte it decodes as hostile: decoding never panics, never allocates more
//! than the input's length justifies (every count read from the wire is
//! checked against a stated maximum *and* against the bytes that remain
//! before anything is reserved), and says exactly why it refused, with a
//! [`DecodeError`].
//!
//! # Messages
//!
//! Every message is a 32-byte header followed by a body. All integers are
//! little-endian; there is no padding and no alignment inside a body.
//!
//! Request header ([`RequestHeader`]; [`IoRequestHeader`] for io ops):
//! ```text
//! offset size field
//!      0    2 version   PROTO_VERSION
//!      2    2 op        Op (table below) or IoOp (module io)
//!      4    4 flags     0, or REQUEST_FLAG_GROUPS (1): the body starts
//!                       with n u8 (1..=MAX_GROUPS), n × gid u32, the
//!                       caller's supplementary groups (body_len counts them);
//!                       REQUEST_FLAG_SESSION (2, metadata only): then client u64, seq u64,
//!                       acked_below u64, the exactly-once session sequence
//!                       (acked_below <= seq < acked_below + SEQ_WINDOW);
//!                       REQUEST_FLAG_GROUPS_OMITTED (4, metadata only, not
//!                       with 1): the caller's groups were not read;
//!                       REQUEST_FLAG_CHAIN (8, io only): then chain u32,
//!                       version u64, the chain the request is for
//!      8    8 tag       the client's request id, echoed in the reply
//!     16    4 uid       caller's credentials, checked by the server
//!     20    4 gid
//!     24    4 body_len  bytes that follow the header, exactly
//!     28    4 reserved  must be 0
//! ```
//! Reply header ([`ReplyHeader`]; [`IoReplyHeader`] for io ops):
//! ```text
//! offset size field
//!      0    2 version   PROTO_VERSION
//!      2    2 op        the op of the request answered
//!      4    4 errno     i32: 0 = success, else a Linux errno in 1..=MAX_ERRNO
//!      8    8 tag       the request's tag
//!     16    4 body_len  bytes that follow; 0 when errno != 0, except
//!                       an io reply's io::CHAIN_REFUSED (its ChainRefusal)
//!     20   12 reserved  must be 0
//! ```
//!
//! # Op numbers
//!
//! The header's op field is one number space shared by the two protocols,
//! so that a number names one op wherever it appears:
//!
//! | numbers | protocol | enum | decoders |
//! |---|---|---|---|
//! | 0 | never assigned | | |
//! | 1–63 ([`META_OP_NUMBERS`]) | metadata | [`Op`] | [`decode_request`], [`decode_reply`] |
//! | 64–127 ([`IO_OP_NUMBERS`]) | io servers | [`IoOp`] | [`decode_io_request`], [`decode_io_reply`] |
//! | 128–65535 | unassigned | | |
//!
//! Each decoder knows only its protocol's ops and refuses any other number,
//! the other protocol's included, with [`DecodeError::UnknownOp`] (so a
//! request sent to the wrong kind of server is refused, not misread). Both
//! enums are checked at compile time to stay inside their ranges.
//!
//! # Ops
//!
//! | op | number | request body | reply body ([`Response`]) |
//! |---|---|---|---|
//! | SessionOpen | 1 | client_name str, nonce \[16\], mac \[32\], credential? | `Session`: session_id u64, root u64 |
//! | Lookup | 2 | parent u64, name | `Entry`: attr |
//! | GetAttr | 3 | ino u64 | `Attr`: attr |
//! | SetAttr | 4 | ino u64, setattr | `Attr`: attr |
//! | Create | 5 | parent u64, name, mode u32, exclusive u8, hint? | `Entry`: attr |
//! | Mkdir | 6 | parent u64, name, mode u32 | `Entry`: attr |
//! | Readdir | 7 | ino u64, cookie u64, max_entries u32 | `Dir`: n u32, n × dirent, eof u8 |
//! | Unlink | 8 | parent u64, name | `Done`: empty |
//! | Rmdir | 9 | parent u64, name | `Done`: empty |
//! | Rename | 10 | src_parent u64, src_name, dst_parent u64, dst_name, flags u32 ([`RENAME_NOREPLACE`] \| [`RENAME_EXCHANGE`]) | `Done`: empty |
//! | Symlink | 11 | parent u64, name, target | `Entry`: attr |
//! | Readlink | 12 | ino u64 | `Link`: target |
//! | Link | 13 | ino u64, new_parent u64, new_name | `Entry`: attr |
//! | Statfs | 14 | empty | `StatFs`: blocks, bfree, bavail, files, ffree u64; bsize, namelen u32 |
//! | Open | 15 | ino u64, flags u32 | `Opened`: attr, layout, capability |
//! | Compound | 16 | n u32 (≤ MAX_COMPOUND), n × {flags u8, op u16, body} | `Compound`: n u32, n × {errno i32, if 0: kind u8, body} |
//! | Mknod | 17 | parent u64, name, kind u8, mode u32, rdev u64 | `Entry`: attr |
//! | ListOrphans | 18 | older_than_s u32, max u32 | `Orphans`: n u32 (≤ [`MAX_ORPHANS`]), n × {object_id u64, m u32 (≤ [`MAX_LAYOUT_SERVERS`]), m × server id u32}, generation u64 |
//! | ForgetOrphans | 19 | n u32 (≤ [`MAX_FORGET_ORPHANS`]), n × object_id u64 | `Done`: empty |
//! | Close | 20 | object_id u64 | `Done`: empty |
//! | Reopen | 21 | n u32 (≤ [`MAX_REOPEN`]), n × {object_id u64 (strictly increasing), count u32 (≥ 1)} | `Done`: empty |
//! | Recap | 22 | capability | `Cap`: capability |
//! | Revocations | 23 | instance u64, since u64 | `Revocations`: revocations |
//! | RevokeCredential | 24 | name str (1..=[`MAX_CLIENT_NAME`], UTF-8) | `Done`: empty |
//! | Lock | 25 | ino u64, client u64, owner u64, pid u32, start u64, end u64 (≥ start), kind u8 (Read 1, Write 2, Unlock 3), flags u8 ([`LOCK_WAIT`] 1, [`LOCK_RECLAIM`] 2, [`LOCK_FAIR`] 4) | `Done`: empty |
//! | TestLock | 26 | ino u64, client u64, owner u64, start u64, end u64 (≥ start), kind u8 (Read 1, Write 2) | `LockTest`: presence u8, then start u64, end u64, kind u8, pid u32 |
//! | Watch | 27 | since u64 | `Changes`: next u64, lost u8, n u32 (≤ [`MAX_CHANGES`]), n × {ino u64, parent u64, name (empty exactly when parent is 0)} |
//! | SetXattr | 30 | ino u64, name, value (≤ [`XATTR_SIZE_MAX`]), flags u32 ([`XATTR_CREATE`] \| [`XATTR_REPLACE`]) | `Done`: empty |
//! | GetXattr | 31 | ino u64, name | `Xattr`: value (≤ [`XATTR_SIZE_MAX`]) |
//! | ListXattr | 32 | ino u64 | `XattrNames`: n u32 (≤ [`MAX_XATTR_NAMES`]), n × name (≤ [`XATTR_NAME_MAX`]) |
//! | RemoveXattr | 33 | ino u64, name | `Done`: empty |
//! | ServerHeartbeat | 35 | server u32, instance u64, addr str (≤ [`MAX_ADDR_WIRE`], canonical `ip:port`), host str (≤ [`MAX_HOST_NAME`], UTF-8), capacity u64, used u64 | `Heartbeat`: c u32 (≤ [`MAX_CHAINS`]), c × {chain id u32 (strictly increasing), version u64}: the chains that hold the sender |
//! | Members | 36 | empty | `Members`: n u32 (≤ [`MAX_MEMBERS`]), n × {server u32 (strictly increasing), state u8 (Up 1, Down 2, Unknown 3), addr str, host str, since_ms u64, restarts u32, capacity u64, used u64}, then c u32 (≤ [`MAX_CHAINS`]), c × {id u32 (strictly increasing), version u64, r u32 (1..=[`MAX_CHAIN_REPLICAS`]), r × {server u32 (distinct), state u8 (Serving 1, Syncing 2, Offline 3)}} |
//!
//! Numbers 25–29 belong to the lock ops; 34 is reserved.
//!
//! ServerHeartbeat and Members are the membership ops (version 13, module
//! `members`): an io server started with the metadata server's address
//! sends a heartbeat every second over a session of the cluster secret as
//! uid 0 (anyone else gets `EPERM`), and any session may ask who is up.
//! Neither travels inside a Compound, nor do the `Members` answer (kind
//! 17) or the `Heartbeat` answer (kind 18) appear among a Compound's
//! results.
//!
//! Rename's flags are `renameat2(2)`'s, carried out by the server in the
//! same store transaction as the rename: [`RENAME_NOREPLACE`] fails with
//! `EEXIST` when the destination exists, [`RENAME_EXCHANGE`] swaps the two
//! names (both must exist). Any other bit is refused by the decoder; both
//! bits together are answered `EINVAL`, as Linux does.
//!
//! The extended attribute ops (`setxattr(2)` and its siblings; names carry
//! their namespace prefix, `user.`, `trusted.` or `security.`) never travel
//! inside a Compound, and their answers (`Xattr` 13, `XattrNames` 14)
//! never appear among a Compound's results. The server applies Linux's
//! rules and limits (`dafne_meta`'s store docs, "Extended attributes").
//!
//! SessionOpen's `credential?` is a per-client credential's policy
//! ([`Credential`]: name, uid and gid ranges, root) that the client proves
//! instead of the cluster secret; RevokeCredential (an admin's, never
//! inside a Compound) revokes one by name (`dafne_auth`'s module docs,
//! "Credentials").
//!
//! Recap and Revocations serve revocable capabilities (`dafne_auth`'s
//! module docs): Recap re-issues a capability a revocation made stale to a
//! session that holds an open of its object; Revocations (root only) is
//! meta's signed log of revocations, which the supervisor's relay carries
//! to the io servers (io op Revoke). Neither travels inside a Compound.
//!
//! ListOrphans and ForgetOrphans are the reclaimer's: only uid 0 may send
//! them (`EPERM` otherwise), and never inside a Compound. An orphan is the
//! data object of a file whose last link is gone; ListOrphans names those
//! orphaned at least `older_than_s` seconds ago, with the io servers that
//! hold them, and ForgetOrphans drops them from the list once removed.
//!
//! Close and Reopen keep the server's table of open files (an object with
//! an open is never listed as an orphan): every successful Open, alone or
//! in a Compound, registers one open of its data object for the session
//! (the connection); Close releases one (`EBADF` if the session holds
//! none); Reopen registers the opens a reconnecting client still holds.
//! Past the server's bounds an Open or Reopen fails with `EMFILE` (this
//! session holds too many) or `ENFILE` (the server does). Neither travels
//! inside a Compound.
//!
//! Lock and TestLock are byte-range locks held by the server for the
//! session (module `lock`; the server's rules are in `dafne_meta::locks`);
//! neither travels inside a Compound, and a Lock with [`LOCK_WAIT`] may be
//! answered much later than other requests (when the lock is granted).
//!
//! Numbers are never reused: a retired op keeps its number, unassigned. The
//! io ops (Read 64, Write 65, Truncate 66, Remove 67, Sync 68, Stat 69,
//! ServerInfo 70, Revoke 71, Login 72) are tabled, with their bodies, in module [`io`].
//!
//! Building blocks:
//! * `name`, `target`, `str`: u32 length + bytes. A name is at most
//!   [`MAX_NAME_WIRE`] bytes on the wire (the server itself answers
//!   `ENAMETOOLONG` above [`NAME_MAX`]), a symlink target at most
//!   [`MAX_SYMLINK`], a client name at most [`MAX_CLIENT_NAME`] and UTF-8.
//! * bool, and the presence byte of an optional field: u8, 0 or 1.
//! * `hint?`: presence u8, then stripe_unit u32, stripe_count u32.
//! * `timespec`: sec i64, nsec u32 (< 10⁹). 12 bytes.
//! * `kind`: u8, a [`FileType`]: Regular 1, Directory 2, Symlink 3, Fifo 4,
//!   Socket 5, CharDevice 6, BlockDevice 7.
//! * `attr`: ino u64, kind u8, mode u32 (only bits of [`MODE_MASK`]),
//!   nlink u32, uid u32, gid u32, rdev u64 (the device of a device node,
//!   as Linux user space encodes a `dev_t`; else 0), size u64, blocks u64,
//!   atime, mtime, ctime. 85 bytes.
//! * `setattr`: mask u32, then the fields the mask names, in bit order:
//!   bit 0 mode u32, 1 uid u32, 2 gid u32, 3 size u64, 4 atime timespec,
//!   5 atime = now (no bytes), 6 mtime timespec, 7 mtime = now (no bytes),
//!   8 grow_to u64 (the size if larger). Bits 4 and 5 (6 and 7) together,
//!   or any other bit, are refused.
//! * `dirent`: name, ino u64, kind u8, cookie u64; at most
//!   [`MAX_READDIR_ENTRIES`] per reply.
//! * `layout`: object_id u64, stripe_unit u32, stripe_count u32, n u32
//!   (≤ [`MAX_LAYOUT_SERVERS`]), n × server id u32.
//! * `capability`: object_id u64, ino u64, rights u8 ([`RIGHT_READ`] |
//!   [`RIGHT_WRITE`]), generation u64, expiry_unix_ns u64, advice (unit_kib
//!   u8: 0, 4, 8, 16, 32 or 64; policy u8: 0 default, 1 LRU, 2 CLOCK), mac
//!   \[32\]. 67 bytes.
//! * `revocations`: instance u64, from_seq u64, to_seq u64, reset_floor u64,
//!   n u32 (≤ [`MAX_REVOCATIONS`], = to_seq − from_seq), n × (object_id u64,
//!   floor u64), mac \[32\].
//! * `credential`: name str (1..=[`MAX_CLIENT_NAME`], UTF-8), n u32
//!   (≤ [`MAX_CREDENTIAL_RANGES`]) × uid range {first u32, last u32 ≥
//!   first}, m u32 (≤ [`MAX_CREDENTIAL_RANGES`]) × gid range, root bool.
//!
//! # Compound requests and chaining
//!
//! A `Compound` carries up to [`MAX_COMPOUND`] ops, each with a flags byte
//! whose bit 0 is `chain` (other bits are refused). As in DAFS, a chained op's
//! primary inode argument is replaced by the inode the previous op produced
//! ([`Response::ino`]); see [`CompoundOp::primary_ino_mut`] for which argument
//! that is. The decoder refuses a Compound inside a Compound, a SessionOpen
//! inside a Compound, `chain` on the first op, and `chain` on an op without
//! an inode argument (Statfs). The server runs the ops in order and stops at
//! the first error, so in the reply only the last result may be an error.
//! A compound result names its [`Response`] variant with a kind byte:
//! Entry 2, Attr 3, Dir 4, Done 5, Link 6, StatFs 7, Opened 8 (Session 1 and
//! Compound 9 cannot occur there, nor Orphans 10, Cap 11, Revocations 12,
//! Xattr 13, XattrNames 14, LockTest 15 and Changes 16, which answer only
//! a ListOrphans, Recap, Revocations, GetXattr, ListXattr, TestLock or
//! Watch sent alone).
//!
//! # Canonical encoding
//!
//! Every value has exactly one encoding and the decoder accepts nothing else,
//! so `encode(decode(bytes)) == bytes` whenever `decode` succeeds (the fuzz
//! targets `proto` and `io` check this, for the metadata and io protocols).
//! Encoders do not validate limits: a value beyond a limit (a 2000-byte
//! name, a Compound inside a Compound, an extent of 0 bytes) encodes, and
//! the receiver refuses it.
//!
//! # Versions
//!
//! Both ends must speak the same [`PROTO_VERSION`]; a receiver refuses any
//! other with [`DecodeError::BadVersion`] (there is no negotiation yet). The
//! version covers both protocols. Version 2 added the io ops; version 3
//! the special file types (Fifo, Socket, CharDevice, BlockDevice), `rdev`
//! in `attr` and the Mknod op (the io op ServerInfo, 70, came in the same
//! release); version 4 the orphan ops ListOrphans and ForgetOrphans;
//! version 5 Close and Reopen; version 6 io keys framed with their window
//! and revocable capabilities (`ino` and `generation` in the capability,
//! the ops Recap and Revocations, the generation in the Orphans reply, the
//! io op Revoke); version 7 the caller's supplementary groups
//! ([`REQUEST_FLAG_GROUPS`]); version 8 per-client credentials (the
//! optional credential in SessionOpen, RevokeCredential, the io op Login
//! reshaped); version 9 the lock ops Lock and TestLock (25, 26), Watch
//! (27), the
//! extended attribute ops (30–33), Rename's flags, the io op Allocate
//! (73: `fallocate`) and the exactly-once session sequence
//! ([`REQUEST_FLAG_SESSION`]); version 10 the cache advice in the
//! capability ([`CacheAdvice`]) and SetAttr's `grow_to` (mask bit 8);
//! version 11 io keys that follow their Read or Write (`keys_follow`, the
//! io op Keys, 74: FRRWP). Bump
//! it for *every* change to what a decoder accepts or how it reads it: a new
//! op, a field added, removed, resized or reordered, a new flag or mask bit,
//! a new enum value, a changed limit. Numbers (ops, errno values, file types,
//! compound result kinds, bits) are never reused for something else.
#![forbid(unsafe_code)]

mod errno;
mod error;
mod frame;
pub mod io;
mod lock;
mod members;
mod msg;
mod types;
mod wire;

use std::ops::RangeInclusive;

pub use errno::{Errno, MAX_ERRNO};
pub use error::DecodeError;
pub use frame::{
    decode_reply, decode_request, encode_reply, encode_request, Envelope, Groups, IoReplyHeader, IoRequestHeader,
    ReplyHeader, RequestHeader, SessionSeq,
};
pub use io::{
    decode_io_reply, decode_io_request, encode_io_reply, encode_io_request, AllocateMode, ChainRefusal,
    ChainRefusalReason, IoExtent, IoOp, IoRequest, IoResponse, KeysFollow, ScrubSlice, ServerInfo, Stability,
    StripeSlots, CHAIN_REFUSED, LEASE_HELD, LEASE_LAPSED, LEASE_NONE, LEASE_PENDING, MAX_INLINE, MAX_IO_BYTES,
    MAX_IO_EXTENTS, MAX_IO_KEYS, MAX_IO_KEY_BYTES, MAX_IO_REPLY_LEN, MAX_IO_REQUEST_LEN, MAX_SCRUB_BAD, NO_KEY,
};
pub use lock::{LockKind, LockRange, OwnerLocks, LOCK_FAIR, LOCK_FLAGS, LOCK_RECLAIM, LOCK_WAIT};
pub use members::{
    check_host_name, host_name_byte, Chain, ChainHealth, ChainRoute, ChainVersion, Heartbeat, Member, MemberState,
    Replica, ReplicaState, Successor, HEARTBEAT_INTERVAL, MAX_ADDR_WIRE, MAX_CHAINS, MAX_CHAIN_REPLICAS, MAX_HOST_NAME,
    MAX_MEMBERS, MEMBER_LEASE,
};
pub use msg::{Change, CompoundOp, HeldOpen, LockHolder, Op, Orphan, Request, Response};
pub use types::{
    AdviceError, Attr, CacheAdvice, CachePolicy, Capability, Credential, DirEntry, FileType, IdRange, Layout,
    LayoutHint, Revocation, Revocations, SetAttr, StatFs, TimeSet, Timespec, CACHE_ADVICE_XATTR, MAX_CREDENTIAL_RANGES,
    MAX_REVOCATIONS,
};

/// Version of this wire contract, first field of every header (metadata
/// and io alike). 2: io ops added. 3: special file types, `Attr::rdev`,
/// Mknod. 4: ListOrphans, ForgetOrphans. 5: Close, Reopen. 6: io request
/// keys carry the window they were registered for (`dafne_ucx` frames
/// them); revocable capabilities (capability `ino` and `generation`,
/// Recap, Revocations, the Orphans reply's generation, the io op Revoke).
/// 7: the io op Login (io servers drop connections that never show a
/// genuine capability); supplementary groups in front of a request body
/// ([`REQUEST_FLAG_GROUPS`]). 8: per-client credentials (an optional
/// [`Credential`] in SessionOpen, the op RevokeCredential, the io op Login
/// proven like a session instead of by a capability). 9: locks (Lock,
/// TestLock), Watch, extended attributes (SetXattr, GetXattr, ListXattr,
/// RemoveXattr), the flags of Rename ([`RENAME_NOREPLACE`],
/// [`RENAME_EXCHANGE`]) and the io op Allocate (`fallocate`: reserve,
/// punch a hole, zero a range), the exactly-once session sequence
/// ([`REQUEST_FLAG_SESSION`]). 10: the capability carries the file's cache
/// advice ([`CacheAdvice`]: unit size, replacement policy) to the io servers,
/// and SetAttr a grow-only size (`grow_to`). 11: a Read or Write whose
/// keys follow it (`keys_follow`) and the io op Keys (74) that brings them
/// (FRRWP; `io` module docs, "Keys that follow"). 12: the io op Scrub (75)
/// and `ServerInfo`'s `checksum_errors`. 13: the membership ops
/// ServerHeartbeat (35) and Members (36). 14: SetAttr's `lazy` bit (a
/// size publish that need not be durable before the answer). 15: the
/// `Members` answer carries meta's chain table after the members. 16:
/// [`REQUEST_FLAG_GROUPS_OMITTED`]. 17: the `ServerHeartbeat` answer
/// carries the versions of the sender's chains (`Heartbeat`, kind 18), and
/// the io op `ServerInfo`'s answer the lease state and chain versions the
/// io server holds. 18: io data requests carry the chain and its version
/// ([`REQUEST_FLAG_CHAIN`]) and an io server refuses one whose version is
/// not its own with [`io::CHAIN_REFUSED`], a reply whose body says why
/// ([`io::ChainRefusal`]); `ServerInfo`'s lease state [`LEASE_PENDING`]
/// (an io server waiting for its first lease, before shown as lapsed).
/// 19: chain writes: the `ServerHeartbeat` answer carries the sender's
/// place in each of its chains ([`ChainRoute`]), and a head forwards a
/// chain's write to its successor with [`REQUEST_FLAG_FORWARDED`].
pub const PROTO_VERSION: u16 = 19;

/// Request header `flags`: the body starts with the caller's supplementary
/// groups, `n u8` (1..=[`MAX_GROUPS`]) and `n × u32`. Bits other than this
/// [`REQUEST_FLAG_SESSION`] and [`REQUEST_FLAG_GROUPS_OMITTED`] are refused
/// ([`DecodeError::Reserved`]).
pub const REQUEST_FLAG_GROUPS: u32 = 1;

/// Request header `flags` (metadata only, never with
/// [`REQUEST_FLAG_GROUPS`]): the caller's supplementary groups were not
/// read ([`Groups::OMITTED`]; reading them is the FUSE daemon's costliest
/// step of a lookup). The server checks the caller as one in no other
/// group, except that it refuses (`EACCES`, `EPERM`) wherever a group
/// could have changed the outcome the other way: a group class that
/// denies what the other class grants, a setgid bit a non-member would
/// lose. The caller then asks again with its groups.
pub const REQUEST_FLAG_GROUPS_OMITTED: u32 = 4;

/// Request header `flags`: after the groups (if any), the body carries the
/// request's exactly-once identity ([`SessionSeq`]: client u64, seq u64,
/// acked_below u64). The metadata server answers a retry of a
/// non-idempotent op ([`Request::is_exactly_once`]) with the cached first
/// answer; other ops, and io servers, ignore it.
pub const REQUEST_FLAG_SESSION: u32 = 2;

/// Request header `flags` (io only): after the groups, the body carries
/// the chain the request is for and the version of the chain table row
/// the client knows, `chain u32, version u64` ([`ChainVersion`],
/// [`Envelope::chain`]). Only the io ops Read, Write, Truncate, Sync, Stat
/// and Allocate may carry it (`io` module docs, "Chains"); a chain id at
/// or above [`MAX_CHAINS`] is refused.
pub const REQUEST_FLAG_CHAIN: u32 = 8;

/// Request header `flags` (io only, protocol 19): a `Write` a chain's
/// replica forwards to the next one (docs/REPLICATION.md, "Writes"): its
/// keys and extents name the *sender's* cache units, which the receiver
/// gets by RMA; `Truncate`, `Sync` and `Allocate` are forwarded as they
/// are ([`IoOp::is_forwarded`]). Only with [`REQUEST_FLAG_CHAIN`] and only
/// on those ops (refused at decoding otherwise); an io server serves one
/// only from a connection logged in with the cluster secret
/// ([`Envelope::forwarded`]).
pub const REQUEST_FLAG_FORWARDED: u32 = 16;

/// How far a request's `seq` may run ahead of its `acked_below`
/// (exclusive): at most this many answers per client in a server's replay
/// cache. A client with more requests unanswered gives up the oldest
/// one's protection rather than send a sequence outside the window.
pub const SEQ_WINDOW: u64 = 4096;

/// Most supplementary groups a request carries (129 bytes). A FUSE mount
/// sends the first 32 of the caller's groups (`dafne_fuse`, "Groups").
pub const MAX_GROUPS: usize = 32;

/// The op numbers of the metadata protocol ([`Op`]).
pub const META_OP_NUMBERS: RangeInclusive<u16> = 1..=63;
/// The op numbers of the io protocol ([`IoOp`]).
pub const IO_OP_NUMBERS: RangeInclusive<u16> = 64..=127;

// Each op enum stays inside its range, and the ranges do not meet.
const _: () = {
    let (meta, io) = (&META_OP_NUMBERS, &IO_OP_NUMBERS);
    assert!(*meta.end() < *io.start());
    let mut i = 0;
    while i < Op::ALL.len() {
        let n = Op::ALL[i] as u16;
        assert!(*meta.start() <= n && n <= *meta.end(), "an Op number outside META_OP_NUMBERS");
        i += 1;
    }
    let mut i = 0;
    while i < IoOp::ALL.len() {
        let n = IoOp::ALL[i] as u16;
        assert!(*io.start() <= n && n <= *io.end(), "an IoOp number outside IO_OP_NUMBERS");
        i += 1;
    }
};

/// An inode number.
pub type Ino = u64;
/// The inode of the file system's root directory.
pub const ROOT_INO: Ino = 1;

/// Most bytes a name (a path component) may have on the wire.
pub const MAX_NAME_WIRE: usize = 1024;
/// Most bytes of a name the server accepts; it answers `ENAMETOOLONG` for a
/// longer name that still fits [`MAX_NAME_WIRE`].
pub const NAME_MAX: usize = 255;
/// Most bytes of a symbolic link's target.
pub const MAX_SYMLINK: usize = 4096;
/// Most bytes of the client name in `SessionOpen`.
pub const MAX_CLIENT_NAME: usize = 256;
/// Most ops in one `Compound`.
pub const MAX_COMPOUND: usize = 16;
/// Most entries in one `Readdir` reply; the server clamps `max_entries` to it.
pub const MAX_READDIR_ENTRIES: usize = 4096;
/// Most io servers in one [`Layout`].
pub const MAX_LAYOUT_SERVERS: usize = 256;
/// Most entries in one `ListOrphans` reply; the server clamps `max` to it.
/// At most 1024 × (12 + 4 × [`MAX_LAYOUT_SERVERS`]) bytes ≈ 1 MiB, under
/// the transport's 16 MiB reply limit.
pub const MAX_ORPHANS: usize = 1024;
/// Most object ids in one `ForgetOrphans` (8 KiB, under the transport's
/// 1 MiB request limit).
pub const MAX_FORGET_ORPHANS: usize = 1024;
/// Most entries in one `Reopen` (12 KiB, under the transport's 1 MiB
/// request limit); a client holding more sends several.
pub const MAX_REOPEN: usize = 1024;

/// Most changes in one [`Response::Changes`].
pub const MAX_CHANGES: usize = 1024;

/// Most bytes of an extended attribute's name, prefix included (Linux's
/// `XATTR_NAME_MAX`); the server answers `ERANGE` above it. On the wire a
/// name may have up to [`MAX_NAME_WIRE`] bytes.
pub const XATTR_NAME_MAX: usize = 255;
/// Most bytes of an extended attribute's value (Linux's `XATTR_SIZE_MAX`):
/// also the wire's limit, so a client answers `E2BIG` above it itself.
pub const XATTR_SIZE_MAX: usize = 65_536;
/// Most names in one `ListXattr` reply (at most 8192 × (4 + 255) bytes ≈
/// 2 MiB, under the transport's 16 MiB reply limit). The server's budget
/// per inode keeps a list below it (`dafne_meta`'s store docs, "Extended
/// attributes").
pub const MAX_XATTR_NAMES: usize = 8192;
/// `SetXattr` flags: fail with `EEXIST` if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// `SetXattr` flags: fail with `ENODATA` if the attribute does not exist.
pub const XATTR_REPLACE: u32 = 2;
/// `Rename` flags: fail with `EEXIST` if the destination exists.
pub const RENAME_NOREPLACE: u32 = 1;
/// `Rename` flags: swap source and destination, which must both exist.
pub const RENAME_EXCHANGE: u32 = 2;

/// The permission bits a mode may carry (rwx for user, group, other, plus
/// setuid, setgid and sticky); the file type travels separately.
pub const MODE_MASK: u32 = 0o7777;

/// [`Capability::rights`]: may read the object.
pub const RIGHT_READ: u8 = 1;
/// [`Capability::rights`]: may write the object.
pub const RIGHT_WRITE: u8 = 2;

/// `Open` flags: open for reading.
pub const OPEN_READ: u32 = 1;
/// `Open` flags: open for writing.
pub const OPEN_WRITE: u32 = 2;
/// `Open` flags: truncate to zero length.
pub const OPEN_TRUNC: u32 = 4;
