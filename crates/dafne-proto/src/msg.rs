//! Ops, request bodies and reply bodies.

use crate::lock::{LockKind, LOCK_FLAGS};
use crate::members::{
    get_chain_routes, get_chain_versions, get_chains, get_members, put_chain_routes, put_chain_versions, Chain,
    ChainRoute, ChainVersion, Heartbeat, Member,
};
use crate::types::Revocations;
use crate::types::{get_mode, DIRENT_MIN_SIZE};
use crate::wire::{Reader, Wire, Writer};
use crate::{
    Attr, Capability, Credential, DecodeError, DirEntry, Errno, FileType, Ino, Layout, LayoutHint, SetAttr, StatFs,
    MAX_CHANGES, MAX_CLIENT_NAME, MAX_COMPOUND, MAX_FORGET_ORPHANS, MAX_LAYOUT_SERVERS, MAX_NAME_WIRE, MAX_ORPHANS,
    MAX_READDIR_ENTRIES, MAX_REOPEN, MAX_SYMLINK, MAX_XATTR_NAMES, OPEN_READ, OPEN_TRUNC, OPEN_WRITE, RENAME_EXCHANGE,
    RENAME_NOREPLACE, XATTR_CREATE, XATTR_NAME_MAX, XATTR_REPLACE, XATTR_SIZE_MAX,
};

/// Defines an op enum: `#[repr(u16)]` with the wire numbers, `ALL`,
/// `from_u16`, `name`, `Display` and `From<_> for u16`. Used for [`Op`] and
/// [`crate::IoOp`], which share the header's op field (see the crate docs,
/// "Op numbers").
macro_rules! ops {
    ($(#[$edoc:meta])* $enum:ident { $($(#[$doc:meta])* $name:ident = $num:literal,)* }) => {
        $(#[$edoc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum $enum {
            $($(#[$doc])* $name = $num,)*
        }

        impl $enum {
            /// Every op, in number order.
            pub const ALL: &'static [$enum] = &[$($enum::$name,)*];

            /// The op with this wire number.
            pub fn from_u16(v: u16) -> Option<$enum> {
                match v {
                    $($num => Some($enum::$name),)*
                    _ => None,
                }
            }

            /// The op's name, as in the table.
            pub fn name(self) -> &'static str {
                match self {
                    $($enum::$name => stringify!($name),)*
                }
            }
        }

        impl std::fmt::Display for $enum {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl From<$enum> for u16 {
            fn from(op: $enum) -> u16 {
                op as u16
            }
        }
    };
}
pub(crate) use ops;

ops! {
    /// What a metadata request asks for. The numbers are the wire's and are
    /// never reused (the table with bodies is in the crate docs).
    Op {
        /// Open a session: authenticates the client, returns the root inode.
        SessionOpen = 1,
        /// Find a name in a directory.
        Lookup = 2,
        GetAttr = 3,
        SetAttr = 4,
        /// Create a regular file.
        Create = 5,
        Mkdir = 6,
        Readdir = 7,
        Unlink = 8,
        Rmdir = 9,
        Rename = 10,
        Symlink = 11,
        Readlink = 12,
        /// Make a hard link.
        Link = 13,
        Statfs = 14,
        /// Open a regular file for I/O: returns its layout and a capability.
        Open = 15,
        /// Several ops run in order, possibly chained.
        Compound = 16,
        /// Make a file of any type but directory and symlink: a FIFO, a
        /// socket, a device node, or a regular file (created, not opened).
        Mknod = 17,
        /// Root only: data objects whose file is gone, for reclaiming.
        ListOrphans = 18,
        /// Root only: drop reclaimed objects from the orphan list.
        ForgetOrphans = 19,
        /// Release one open of a data object (what an `Open` registered).
        Close = 20,
        /// Register again the opens a client holds, on a new connection
        /// (after a reconnect, or a metadata server restart).
        Reopen = 21,
        /// A fresh capability for an object this session holds open, in
        /// place of one a revocation made stale.
        Recap = 22,
        /// Root only: meta's revocation log for the io servers.
        Revocations = 23,
        /// Admin only (a session proven with the cluster secret itself, as
        /// root): refuse a credential's logins from now on and end its
        /// sessions.
        RevokeCredential = 24,
        /// Take, change or release a byte-range lock (POSIX `fcntl` locks,
        /// OFD locks, `flock`), held by the server for the session.
        Lock = 25,
        /// Which lock, if any, would stop a lock request (`F_GETLK`).
        TestLock = 26,
        /// Changes other sessions made to the namespace (so a mount can
        /// drop what its kernel caches), answered once there are some.
        Watch = 27,
        // 25..=29: the lock ops.
        /// Set an extended attribute.
        SetXattr = 30,
        /// Read an extended attribute's value.
        GetXattr = 31,
        /// The names of an inode's extended attributes the caller may see.
        ListXattr = 32,
        /// Remove an extended attribute.
        RemoveXattr = 33,
        /// Root only (a session of the cluster secret itself, as uid 0): an
        /// io server's heartbeat, every second (`crate::members`).
        ServerHeartbeat = 35,
        /// The io servers as meta sees them: up, down, or never heard from.
        Members = 36,
    }
}

/// A data object whose file is gone ([`Response::Orphans`]): what to remove
/// from which io servers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Orphan {
    pub object_id: u64,
    /// The io servers of the object's layout, at most [`MAX_LAYOUT_SERVERS`].
    pub servers: Vec<u32>,
}

/// Smallest encoded orphan: object_id u64 + n u32.
const ORPHAN_MIN_SIZE: usize = 12;

impl Wire for Orphan {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.object_id);
        w.put_len(self.servers.len());
        for s in &self.servers {
            w.put_u32(*s);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Orphan, DecodeError> {
        let object_id = r.u64("orphan object_id")?;
        let n = r.count("orphan servers", MAX_LAYOUT_SERVERS, 4)?;
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(r.u32("orphan server")?);
        }
        Ok(Orphan { object_id, servers })
    }
}

/// A data object a client holds open, and how many times
/// ([`Request::Reopen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeldOpen {
    pub object_id: u64,
    /// At least 1.
    pub count: u32,
}

/// Encoded size of a [`HeldOpen`]: object_id u64 + count u32.
const HELD_OPEN_SIZE: usize = 12;

/// A request body. Names and targets are bytes (POSIX names need not be
/// UTF-8); the server applies `NAME_MAX` and the rules about `/`, NUL, `.`
/// and `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Request {
    SessionOpen {
        /// UTF-8, at most [`MAX_CLIENT_NAME`] bytes.
        client_name: String,
        nonce: [u8; 16],
        /// The client's proof of its key (the metadata server defines what
        /// it covers): the cluster secret itself, or, with `credential`,
        /// the key derived from it for that policy.
        mac: [u8; 32],
        /// The per-client credential the client logs in with; `None` for a
        /// holder of the cluster secret (a fully trusted client).
        credential: Option<Credential>,
    },
    Lookup {
        parent: Ino,
        name: Vec<u8>,
    },
    GetAttr {
        ino: Ino,
    },
    SetAttr {
        ino: Ino,
        set: SetAttr,
    },
    Create {
        parent: Ino,
        name: Vec<u8>,
        mode: u32,
        /// Fail with `EEXIST` if the name exists (`O_EXCL`).
        exclusive: bool,
        hint: Option<LayoutHint>,
    },
    Mkdir {
        parent: Ino,
        name: Vec<u8>,
        mode: u32,
    },
    Readdir {
        ino: Ino,
        /// 0 to start; else the cookie of the last entry received.
        cookie: u64,
        /// Most entries wanted; the server sends at most
        /// `min(max_entries, MAX_READDIR_ENTRIES)`.
        max_entries: u32,
    },
    Unlink {
        parent: Ino,
        name: Vec<u8>,
    },
    Rmdir {
        parent: Ino,
        name: Vec<u8>,
    },
    Rename {
        src_parent: Ino,
        src_name: Vec<u8>,
        dst_parent: Ino,
        dst_name: Vec<u8>,
        /// 0, [`RENAME_NOREPLACE`] or [`RENAME_EXCHANGE`] (both: `EINVAL`
        /// from the server; other bits are refused by the decoder).
        flags: u32,
    },
    Symlink {
        parent: Ino,
        name: Vec<u8>,
        /// At most [`MAX_SYMLINK`] bytes.
        target: Vec<u8>,
    },
    Readlink {
        ino: Ino,
    },
    Link {
        ino: Ino,
        new_parent: Ino,
        new_name: Vec<u8>,
    },
    Statfs,
    Open {
        ino: Ino,
        /// [`OPEN_READ`] | [`OPEN_WRITE`] | [`OPEN_TRUNC`].
        flags: u32,
    },
    Compound {
        /// At most [`MAX_COMPOUND`]; no `Compound` or `SessionOpen` inside.
        ops: Vec<CompoundOp>,
    },
    Mknod {
        parent: Ino,
        name: Vec<u8>,
        /// What to make; the server refuses `Directory` and `Symlink`
        /// (they have their own ops).
        kind: FileType,
        mode: u32,
        /// The device, for a character or block device (`Attr::rdev`'s
        /// encoding); the server ignores it for other types.
        rdev: u64,
    },
    /// Root only (`EPERM` otherwise); never inside a Compound.
    ListOrphans {
        /// Only objects orphaned at least this many seconds ago.
        older_than_s: u32,
        /// Most entries wanted; the server sends at most
        /// `min(max, MAX_ORPHANS)`.
        max: u32,
    },
    /// Root only (`EPERM` otherwise); never inside a Compound. Ids not in
    /// the list are ignored.
    ForgetOrphans {
        /// At most [`MAX_FORGET_ORPHANS`].
        objects: Vec<u64>,
    },
    /// Releases one open of `object_id` by this session (`EBADF` if it
    /// holds none); never inside a Compound.
    Close {
        object_id: u64,
    },
    /// Registers opens this client holds for this session, as if each had
    /// been opened here; never inside a Compound. What a reconnecting
    /// client sends after `SessionOpen` so that meta keeps the data of its
    /// unlinked open files.
    Reopen {
        /// At most [`MAX_REOPEN`], object ids strictly increasing, counts ≥ 1.
        held: Vec<HeldOpen>,
    },
    /// A capability like `cap` (same object, file and rights) at the
    /// current generation; never inside a Compound. Meta refuses unless
    /// `cap` is genuine and this session holds an open of its object that
    /// it made itself (or re-announced while meta could check it), and the
    /// object is still the file's or an unlinked file's not yet reclaimed.
    Recap {
        cap: Capability,
    },
    /// Root only (`EPERM` otherwise); never inside a Compound. The
    /// revocation log after entry `since` of meta instance `instance`
    /// (another instance, or entries no longer kept: a reset).
    Revocations {
        instance: u64,
        since: u64,
    },
    /// Admin only (`EPERM` for a credential session or a uid other than
    /// 0); never inside a Compound. Records the credential `name` as
    /// revoked: its logins are refused and its live sessions end.
    RevokeCredential {
        /// 1..=[`MAX_CLIENT_NAME`] bytes, UTF-8.
        name: String,
    },
    /// Takes (`Read`, `Write`) or releases (`Unlock`) the lock of owner
    /// (`client`, `owner`) over bytes `start..=end` of `ino`; never inside
    /// a Compound. `Done` when granted; `EAGAIN` when another owner's lock
    /// (or, for fairness, an earlier waiting request) stands in the way and
    /// `flags` lacks [`crate::LOCK_WAIT`]; with it, the server answers once
    /// the lock is granted, or `EDEADLK` at once when waiting would close a
    /// cycle of owners waiting for each other. `ENOLCK` past the server's
    /// bounds.
    Lock {
        ino: Ino,
        /// The client's identity for its locks: a random number it chose
        /// when its session began, kept across reconnects.
        client: u64,
        /// Who holds the lock within the client (for a FUSE mount, the
        /// kernel's lock owner: a process's file table, or an open file
        /// for OFD locks and `flock`).
        owner: u64,
        /// The locking process, as the client sees it (`F_GETLK` reports
        /// it to the same client).
        pid: u32,
        start: u64,
        /// Inclusive, ≥ `start`; `u64::MAX`: to the end of the file.
        end: u64,
        kind: LockKind,
        /// [`crate::LOCK_WAIT`] | [`crate::LOCK_RECLAIM`].
        flags: u8,
    },
    /// The changes other sessions made after change `since` of this
    /// server's log (0: from now on); never inside a Compound. The server
    /// answers when there is at least one (or at once when `since` is not
    /// in its log: `lost`), so a client sends it without a call timeout and
    /// sends the next with the answer's `next`.
    Watch {
        since: u64,
    },
    /// The first lock of another owner that conflicts with `kind`
    /// (`Read` or `Write`) over `start..=end`, if any; never inside a
    /// Compound.
    TestLock {
        ino: Ino,
        client: u64,
        owner: u64,
        start: u64,
        /// Inclusive, ≥ `start`.
        end: u64,
        kind: LockKind,
    },
    /// Never inside a Compound (nor the other xattr ops).
    SetXattr {
        ino: Ino,
        /// With its namespace prefix (`user.`, `trusted.`, `security.`).
        name: Vec<u8>,
        /// At most [`XATTR_SIZE_MAX`] bytes.
        value: Vec<u8>,
        /// [`XATTR_CREATE`] | [`XATTR_REPLACE`]; other bits are refused.
        flags: u32,
    },
    GetXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    ListXattr {
        ino: Ino,
    },
    RemoveXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    /// Root only (`EPERM` for a credential session or a uid other than
    /// 0); never inside a Compound. An io server's report that it lives.
    ServerHeartbeat(Heartbeat),
    /// Never inside a Compound.
    Members,
}

/// One op of a `Compound`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompoundOp {
    /// Replace this op's primary inode argument with the inode the previous
    /// op produced ([`Response::ino`]).
    pub chain: bool,
    pub req: Request,
}

/// Compound op flags: bit 0.
const CHAIN: u8 = 1;
/// Smallest encoded compound op: flags u8 + op u16 + empty body (Statfs).
const COMPOUND_OP_MIN_SIZE: usize = 3;

impl CompoundOp {
    /// The argument chaining replaces: `parent` for Lookup, Create, Mkdir,
    /// Mknod, Unlink, Rmdir and Symlink; `ino` for GetAttr, SetAttr, Readdir,
    /// Readlink, Open and Link; `src_parent` for Rename. `None` for Statfs
    /// (and for SessionOpen, Compound, ListOrphans, ForgetOrphans, Close and
    /// Reopen, which cannot be inside a Compound).
    pub fn primary_ino_mut(&mut self) -> Option<&mut Ino> {
        match &mut self.req {
            Request::Lookup { parent, .. }
            | Request::Create { parent, .. }
            | Request::Mkdir { parent, .. }
            | Request::Mknod { parent, .. }
            | Request::Unlink { parent, .. }
            | Request::Rmdir { parent, .. }
            | Request::Symlink { parent, .. } => Some(parent),
            Request::GetAttr { ino }
            | Request::SetAttr { ino, .. }
            | Request::Readdir { ino, .. }
            | Request::Readlink { ino }
            | Request::Open { ino, .. }
            | Request::Link { ino, .. } => Some(ino),
            Request::Rename { src_parent, .. } => Some(src_parent),
            Request::Statfs
            | Request::SessionOpen { .. }
            | Request::Compound { .. }
            | Request::ListOrphans { .. }
            | Request::ForgetOrphans { .. }
            | Request::Close { .. }
            | Request::Reopen { .. }
            | Request::Recap { .. }
            | Request::Revocations { .. }
            | Request::RevokeCredential { .. }
            | Request::Lock { .. }
            | Request::TestLock { .. }
            | Request::Watch { .. } => None,
            Request::SetXattr { .. }
            | Request::GetXattr { .. }
            | Request::ListXattr { .. }
            | Request::RemoveXattr { .. } => None,
            Request::ServerHeartbeat(_) | Request::Members => None,
        }
    }

    /// The request to run, given the inode the previous op produced (`None`
    /// for the first op, or when the previous op produced none): chaining
    /// applied. `EINVAL` if the op is chained but there is nothing to chain
    /// from, or it has no inode argument.
    pub fn resolve(mut self, prev: Option<Ino>) -> Result<Request, Errno> {
        if self.chain {
            let prev = prev.ok_or(Errno::EINVAL)?;
            *self.primary_ino_mut().ok_or(Errno::EINVAL)? = prev;
        }
        Ok(self.req)
    }
}

fn get_name(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u8>, DecodeError> {
    r.bytes(what, MAX_NAME_WIRE)
}

impl Request {
    /// Whether a repeat of this request could answer differently from its
    /// first execution (a create that exists now, an unlink of a name now
    /// gone), so that a retry must get the first answer: what the metadata
    /// server's replay cache keeps ([`crate::REQUEST_FLAG_SESSION`]). A
    /// Compound is when any op inside it is. Locks are repeatable by
    /// design (granting a held lock, releasing a free range change
    /// nothing) and `Open` with truncation is not cached either.
    pub fn is_exactly_once(&self) -> bool {
        match self {
            Request::Create { .. }
            | Request::Mkdir { .. }
            | Request::Mknod { .. }
            | Request::Symlink { .. }
            | Request::Link { .. }
            | Request::Rename { .. }
            | Request::Unlink { .. }
            | Request::Rmdir { .. }
            | Request::SetAttr { .. }
            | Request::SetXattr { .. }
            | Request::RemoveXattr { .. } => true,
            Request::Compound { ops } => ops.iter().any(|o| o.req.is_exactly_once()),
            _ => false,
        }
    }

    /// Whether this request never changes the namespace: reads of state,
    /// and `Open` without truncation (it counts an open in meta's table of
    /// open files, which lives with the connection, but changes nothing
    /// stored). A Compound is when every op inside it is. The one
    /// classification both ends use: the metadata server runs a batch of
    /// such requests without a commit or an fsync, and the client library
    /// sends one again on its next connection after a lost one (a repeat
    /// answers as the first would have).
    pub fn changes_nothing(&self) -> bool {
        match self {
            Request::Lookup { .. }
            | Request::GetAttr { .. }
            | Request::Readdir { .. }
            | Request::Readlink { .. }
            | Request::Statfs
            | Request::ListOrphans { .. }
            | Request::Recap { .. }
            | Request::Revocations { .. }
            | Request::GetXattr { .. }
            | Request::ListXattr { .. } => true,
            Request::Open { flags, .. } => flags & crate::OPEN_TRUNC == 0,
            Request::Compound { ops } => ops.iter().all(|o| o.req.changes_nothing()),
            _ => false,
        }
    }

    /// The op this request is.
    pub fn op(&self) -> Op {
        match self {
            Request::SessionOpen { .. } => Op::SessionOpen,
            Request::Lookup { .. } => Op::Lookup,
            Request::GetAttr { .. } => Op::GetAttr,
            Request::SetAttr { .. } => Op::SetAttr,
            Request::Create { .. } => Op::Create,
            Request::Mkdir { .. } => Op::Mkdir,
            Request::Readdir { .. } => Op::Readdir,
            Request::Unlink { .. } => Op::Unlink,
            Request::Rmdir { .. } => Op::Rmdir,
            Request::Rename { .. } => Op::Rename,
            Request::Symlink { .. } => Op::Symlink,
            Request::Readlink { .. } => Op::Readlink,
            Request::Link { .. } => Op::Link,
            Request::Statfs => Op::Statfs,
            Request::Open { .. } => Op::Open,
            Request::Compound { .. } => Op::Compound,
            Request::Mknod { .. } => Op::Mknod,
            Request::ListOrphans { .. } => Op::ListOrphans,
            Request::ForgetOrphans { .. } => Op::ForgetOrphans,
            Request::Close { .. } => Op::Close,
            Request::Reopen { .. } => Op::Reopen,
            Request::Recap { .. } => Op::Recap,
            Request::Revocations { .. } => Op::Revocations,
            Request::RevokeCredential { .. } => Op::RevokeCredential,
            Request::Lock { .. } => Op::Lock,
            Request::TestLock { .. } => Op::TestLock,
            Request::Watch { .. } => Op::Watch,
            Request::SetXattr { .. } => Op::SetXattr,
            Request::GetXattr { .. } => Op::GetXattr,
            Request::ListXattr { .. } => Op::ListXattr,
            Request::RemoveXattr { .. } => Op::RemoveXattr,
            Request::ServerHeartbeat(_) => Op::ServerHeartbeat,
            Request::Members => Op::Members,
        }
    }

    pub(crate) fn put_body(&self, w: &mut Writer) {
        match self {
            Request::SessionOpen { client_name, nonce, mac, credential } => {
                w.put_bytes(client_name.as_bytes());
                w.put_raw(nonce);
                w.put_raw(mac);
                credential.put(w);
            }
            Request::Lookup { parent, name } | Request::Unlink { parent, name } | Request::Rmdir { parent, name } => {
                w.put_u64(*parent);
                w.put_bytes(name);
            }
            Request::GetAttr { ino } | Request::Readlink { ino } => w.put_u64(*ino),
            Request::SetAttr { ino, set } => {
                w.put_u64(*ino);
                set.put(w);
            }
            Request::Create { parent, name, mode, exclusive, hint } => {
                w.put_u64(*parent);
                w.put_bytes(name);
                w.put_u32(*mode);
                w.put_bool(*exclusive);
                hint.put(w);
            }
            Request::Mkdir { parent, name, mode } => {
                w.put_u64(*parent);
                w.put_bytes(name);
                w.put_u32(*mode);
            }
            Request::Mknod { parent, name, kind, mode, rdev } => {
                w.put_u64(*parent);
                w.put_bytes(name);
                kind.put(w);
                w.put_u32(*mode);
                w.put_u64(*rdev);
            }
            Request::Readdir { ino, cookie, max_entries } => {
                w.put_u64(*ino);
                w.put_u64(*cookie);
                w.put_u32(*max_entries);
            }
            Request::Rename { src_parent, src_name, dst_parent, dst_name, flags } => {
                w.put_u64(*src_parent);
                w.put_bytes(src_name);
                w.put_u64(*dst_parent);
                w.put_bytes(dst_name);
                w.put_u32(*flags);
            }
            Request::Symlink { parent, name, target } => {
                w.put_u64(*parent);
                w.put_bytes(name);
                w.put_bytes(target);
            }
            Request::Link { ino, new_parent, new_name } => {
                w.put_u64(*ino);
                w.put_u64(*new_parent);
                w.put_bytes(new_name);
            }
            Request::Statfs => {}
            Request::Open { ino, flags } => {
                w.put_u64(*ino);
                w.put_u32(*flags);
            }
            Request::ListOrphans { older_than_s, max } => {
                w.put_u32(*older_than_s);
                w.put_u32(*max);
            }
            Request::ForgetOrphans { objects } => {
                w.put_len(objects.len());
                for o in objects {
                    w.put_u64(*o);
                }
            }
            Request::Close { object_id } => w.put_u64(*object_id),
            Request::Reopen { held } => {
                w.put_len(held.len());
                for h in held {
                    w.put_u64(h.object_id);
                    w.put_u32(h.count);
                }
            }
            Request::Recap { cap } => cap.put(w),
            Request::Revocations { instance, since } => {
                w.put_u64(*instance);
                w.put_u64(*since);
            }
            Request::RevokeCredential { name } => w.put_bytes(name.as_bytes()),
            Request::Lock { ino, client, owner, pid, start, end, kind, flags } => {
                w.put_u64(*ino);
                w.put_u64(*client);
                w.put_u64(*owner);
                w.put_u32(*pid);
                w.put_u64(*start);
                w.put_u64(*end);
                kind.put(w);
                w.put_u8(*flags);
            }
            Request::TestLock { ino, client, owner, start, end, kind } => {
                w.put_u64(*ino);
                w.put_u64(*client);
                w.put_u64(*owner);
                w.put_u64(*start);
                w.put_u64(*end);
                kind.put(w);
            }
            Request::SetXattr { ino, name, value, flags } => {
                w.put_u64(*ino);
                w.put_bytes(name);
                w.put_bytes(value);
                w.put_u32(*flags);
            }
            Request::GetXattr { ino, name } | Request::RemoveXattr { ino, name } => {
                w.put_u64(*ino);
                w.put_bytes(name);
            }
            Request::ListXattr { ino } => w.put_u64(*ino),
            Request::Watch { since } => w.put_u64(*since),
            Request::ServerHeartbeat(hb) => hb.put(w),
            Request::Members => {}
            Request::Compound { ops } => {
                w.put_len(ops.len());
                for op in ops {
                    w.put_u8(if op.chain { CHAIN } else { 0 });
                    w.put_u16(op.req.op().into());
                    op.req.put_body(w);
                }
            }
        }
    }

    /// Decodes the body of an `op` request (the caller checks that nothing
    /// trails it).
    pub(crate) fn get_body(op: Op, r: &mut Reader<'_>) -> Result<Request, DecodeError> {
        Ok(match op {
            Op::SessionOpen => {
                let name = r.bytes("client name", MAX_CLIENT_NAME)?;
                Request::SessionOpen {
                    client_name: String::from_utf8(name).map_err(|_| DecodeError::NotUtf8("client name"))?,
                    nonce: r.array("session nonce")?,
                    mac: r.array("session mac")?,
                    credential: Option::get(r)?,
                }
            }
            Op::Lookup => Request::Lookup { parent: r.u64("parent")?, name: get_name(r, "name")? },
            Op::GetAttr => Request::GetAttr { ino: r.u64("ino")? },
            Op::SetAttr => Request::SetAttr { ino: r.u64("ino")?, set: SetAttr::get(r)? },
            Op::Create => Request::Create {
                parent: r.u64("parent")?,
                name: get_name(r, "name")?,
                mode: get_mode(r, "create mode")?,
                exclusive: r.bool("create exclusive")?,
                hint: Option::get(r)?,
            },
            Op::Mkdir => Request::Mkdir {
                parent: r.u64("parent")?,
                name: get_name(r, "name")?,
                mode: get_mode(r, "mkdir mode")?,
            },
            Op::Readdir => Request::Readdir {
                ino: r.u64("ino")?,
                cookie: r.u64("readdir cookie")?,
                max_entries: r.u32("readdir max_entries")?,
            },
            Op::Unlink => Request::Unlink { parent: r.u64("parent")?, name: get_name(r, "name")? },
            Op::Rmdir => Request::Rmdir { parent: r.u64("parent")?, name: get_name(r, "name")? },
            Op::Rename => Request::Rename {
                src_parent: r.u64("rename src_parent")?,
                src_name: get_name(r, "rename src_name")?,
                dst_parent: r.u64("rename dst_parent")?,
                dst_name: get_name(r, "rename dst_name")?,
                flags: {
                    let flags = r.u32("rename flags")?;
                    if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0 {
                        return Err(DecodeError::BadValue { what: "rename flags", value: flags.into() });
                    }
                    flags
                },
            },
            Op::Symlink => Request::Symlink {
                parent: r.u64("parent")?,
                name: get_name(r, "name")?,
                target: r.bytes("symlink target", MAX_SYMLINK)?,
            },
            Op::Readlink => Request::Readlink { ino: r.u64("ino")? },
            Op::Link => Request::Link {
                ino: r.u64("ino")?,
                new_parent: r.u64("link new_parent")?,
                new_name: get_name(r, "link new_name")?,
            },
            Op::Statfs => Request::Statfs,
            Op::Open => {
                let ino = r.u64("ino")?;
                let flags = r.u32("open flags")?;
                if flags & !(OPEN_READ | OPEN_WRITE | OPEN_TRUNC) != 0 {
                    return Err(DecodeError::BadValue { what: "open flags", value: flags.into() });
                }
                Request::Open { ino, flags }
            }
            Op::Compound => Request::Compound { ops: get_compound_ops(r)? },
            Op::Mknod => Request::Mknod {
                parent: r.u64("parent")?,
                name: get_name(r, "name")?,
                kind: FileType::get(r)?,
                mode: get_mode(r, "mknod mode")?,
                rdev: r.u64("mknod rdev")?,
            },
            Op::ListOrphans => {
                Request::ListOrphans { older_than_s: r.u32("orphans older_than_s")?, max: r.u32("orphans max")? }
            }
            Op::ForgetOrphans => {
                let n = r.count("forget orphans", MAX_FORGET_ORPHANS, 8)?;
                let mut objects = Vec::with_capacity(n);
                for _ in 0..n {
                    objects.push(r.u64("forget orphan object_id")?);
                }
                Request::ForgetOrphans { objects }
            }
            Op::Close => Request::Close { object_id: r.u64("close object_id")? },
            Op::Reopen => {
                let n = r.count("reopen entries", MAX_REOPEN, HELD_OPEN_SIZE)?;
                let mut held: Vec<HeldOpen> = Vec::with_capacity(n);
                for _ in 0..n {
                    let object_id = r.u64("reopen object_id")?;
                    let count = r.u32("reopen count")?;
                    if count == 0 {
                        return Err(DecodeError::BadValue { what: "reopen count (must be at least 1)", value: 0 });
                    }
                    // One entry per object, in order: one meaning, one encoding.
                    if held.last().is_some_and(|h| h.object_id >= object_id) {
                        return Err(DecodeError::BadValue {
                            what: "reopen object_id (must be strictly increasing)",
                            value: object_id,
                        });
                    }
                    held.push(HeldOpen { object_id, count });
                }
                Request::Reopen { held }
            }
            Op::Recap => Request::Recap { cap: Capability::get(r)? },
            Op::Revocations => {
                Request::Revocations { instance: r.u64("revocations instance")?, since: r.u64("revocations since")? }
            }
            Op::RevokeCredential => {
                let name = r.bytes("credential name", MAX_CLIENT_NAME)?;
                if name.is_empty() {
                    return Err(DecodeError::BadValue { what: "credential name length", value: 0 });
                }
                Request::RevokeCredential {
                    name: String::from_utf8(name).map_err(|_| DecodeError::NotUtf8("credential name"))?,
                }
            }
            Op::Lock => {
                let ino = r.u64("ino")?;
                let client = r.u64("lock client")?;
                let owner = r.u64("lock owner")?;
                let pid = r.u32("lock pid")?;
                let (start, end) = get_lock_range(r)?;
                let kind = LockKind::get(r, "lock kind")?;
                let flags = r.u8("lock flags")?;
                if flags & !LOCK_FLAGS != 0 {
                    return Err(DecodeError::BadValue { what: "lock flags", value: flags.into() });
                }
                Request::Lock { ino, client, owner, pid, start, end, kind, flags }
            }
            Op::TestLock => {
                let ino = r.u64("ino")?;
                let client = r.u64("lock client")?;
                let owner = r.u64("lock owner")?;
                let (start, end) = get_lock_range(r)?;
                let kind = LockKind::get(r, "test lock kind")?;
                if kind == LockKind::Unlock {
                    return Err(DecodeError::BadValue { what: "test lock kind (Read or Write)", value: kind as u64 });
                }
                Request::TestLock { ino, client, owner, start, end, kind }
            }
            Op::Watch => Request::Watch { since: r.u64("watch since")? },
            Op::SetXattr => {
                let ino = r.u64("ino")?;
                let name = get_name(r, "xattr name")?;
                let value = r.bytes("xattr value", XATTR_SIZE_MAX)?;
                let flags = r.u32("setxattr flags")?;
                if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
                    return Err(DecodeError::BadValue { what: "setxattr flags", value: flags.into() });
                }
                Request::SetXattr { ino, name, value, flags }
            }
            Op::GetXattr => Request::GetXattr { ino: r.u64("ino")?, name: get_name(r, "xattr name")? },
            Op::ListXattr => Request::ListXattr { ino: r.u64("ino")? },
            Op::RemoveXattr => Request::RemoveXattr { ino: r.u64("ino")?, name: get_name(r, "xattr name")? },
            Op::ServerHeartbeat => Request::ServerHeartbeat(Heartbeat::get(r)?),
            Op::Members => Request::Members,
        })
    }
}

/// A lock's `start, end`: inclusive, so `end >= start`.
fn get_lock_range(r: &mut Reader<'_>) -> Result<(u64, u64), DecodeError> {
    let start = r.u64("lock start")?;
    let end = r.u64("lock end")?;
    if end < start {
        return Err(DecodeError::BadValue { what: "lock end (before its start)", value: end });
    }
    Ok((start, end))
}

fn get_compound_ops(r: &mut Reader<'_>) -> Result<Vec<CompoundOp>, DecodeError> {
    let n = r.count("compound ops", MAX_COMPOUND, COMPOUND_OP_MIN_SIZE)?;
    let mut ops = Vec::with_capacity(n);
    for i in 0..n {
        let flags = r.u8("compound op flags")?;
        if flags & !CHAIN != 0 {
            return Err(DecodeError::BadValue { what: "compound op flags", value: flags.into() });
        }
        let raw = r.u16("compound op")?;
        let op = Op::from_u16(raw).ok_or(DecodeError::UnknownOp(raw))?;
        match op {
            Op::Compound => return Err(DecodeError::NestedCompound),
            Op::SessionOpen
            | Op::ListOrphans
            | Op::ForgetOrphans
            | Op::Close
            | Op::Reopen
            | Op::Recap
            | Op::Revocations
            | Op::RevokeCredential
            | Op::Lock
            | Op::TestLock
            | Op::Watch
            | Op::SetXattr
            | Op::GetXattr
            | Op::ListXattr
            | Op::RemoveXattr
            | Op::ServerHeartbeat
            | Op::Members => {
                return Err(DecodeError::BadValue {
                    what: "op inside a Compound (SessionOpen, the orphan ops, Close, Reopen, Recap, Revocations, \
                           RevokeCredential, the lock ops, the xattr ops and the membership ops are not allowed \
                           there)",
                    value: raw.into(),
                })
            }
            _ => {}
        }
        let mut cop = CompoundOp { chain: flags & CHAIN != 0, req: Request::get_body(op, r)? };
        if cop.chain && i == 0 {
            return Err(DecodeError::BadValue {
                what: "chain flag on the first op of a Compound",
                value: flags.into(),
            });
        }
        if cop.chain && cop.primary_ino_mut().is_none() {
            return Err(DecodeError::BadValue {
                what: "chain flag on an op without an inode argument",
                value: raw.into(),
            });
        }
        ops.push(cop);
    }
    Ok(ops)
}

/// The body of a successful reply. Which variant answers which op is in the
/// crate docs' table ([`Response::answers`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Response {
    /// SessionOpen.
    Session { session_id: u64, root: Ino },
    /// Lookup, Create, Mkdir, Mknod, Symlink, Link.
    Entry { attr: Attr },
    /// GetAttr, SetAttr.
    Attr { attr: Attr },
    /// Readdir: at most [`MAX_READDIR_ENTRIES`] entries; `eof` when the
    /// directory has no more.
    Dir { entries: Vec<DirEntry>, eof: bool },
    /// Unlink, Rmdir, Rename, ForgetOrphans, Close, Reopen, RevokeCredential,
    /// SetXattr, RemoveXattr, Lock.
    Done,
    /// Readlink.
    Link { target: Vec<u8> },
    /// Statfs.
    StatFs(StatFs),
    /// Open.
    Opened { attr: Attr, layout: Layout, cap: Capability },
    /// Compound: one result per op run, in order. The server stops at the
    /// first error, so only the last may be `Err`.
    Compound { results: Vec<Result<Response, Errno>> },
    /// ListOrphans: at most [`MAX_ORPHANS`] entries, and the capability
    /// generation from which no capability of theirs was issued (what the
    /// reclaimer's removal records on the io servers).
    Orphans { orphans: Vec<Orphan>, generation: u64 },
    /// Recap.
    Cap { cap: Capability },
    /// Revocations.
    Revocations(Revocations),
    /// GetXattr: the value, at most [`XATTR_SIZE_MAX`] bytes.
    Xattr { value: Vec<u8> },
    /// ListXattr: at most [`MAX_XATTR_NAMES`] names of at most
    /// [`XATTR_NAME_MAX`] bytes, prefixes included.
    XattrNames { names: Vec<Vec<u8>> },
    /// TestLock: the conflicting lock, if any.
    LockTest { conflict: Option<LockHolder> },
    /// Watch: at most [`MAX_CHANGES`] changes, oldest first; `next` is the
    /// `since` of the next Watch; `lost` when changes after `since` are no
    /// longer known (the server's log moved on, or it restarted).
    Changes { next: u64, lost: bool, changes: Vec<Change> },
    /// Members: at most [`crate::MAX_MEMBERS`] io servers, ids strictly
    /// increasing, and meta's chain table (at most [`crate::MAX_CHAINS`]
    /// chains, ids strictly increasing).
    Members { members: Vec<Member>, chains: Vec<Chain> },
    /// ServerHeartbeat: the version of each chain that holds the io server
    /// that sent it (at most [`crate::MAX_CHAINS`], ids strictly
    /// increasing); and, for each of them, the sender's place in it
    /// (protocol 19, [`ChainRoute`]: head or not, the replica it
    /// forwards writes to), same bound and order.
    Heartbeat { chains: Vec<ChainVersion>, routes: Vec<ChainRoute> },
}

/// Something another session changed ([`Response::Changes`]): an inode
/// whose attributes (or data, or listing) a client may have cached, and/or
/// a name in a directory that was removed or replaced.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Change {
    /// 0: none.
    pub ino: Ino,
    /// The directory of `name`; 0: no name changed.
    pub parent: Ino,
    /// Empty when `parent` is 0.
    pub name: Vec<u8>,
}

/// Smallest encoded change: ino, parent u64, name length u32.
const CHANGE_MIN_SIZE: usize = 20;

impl Wire for Change {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.ino);
        w.put_u64(self.parent);
        w.put_bytes(&self.name);
    }
    fn get(r: &mut Reader<'_>) -> Result<Change, DecodeError> {
        let ino = r.u64("change ino")?;
        let parent = r.u64("change parent")?;
        let name = r.bytes("change name", MAX_NAME_WIRE)?;
        if (parent == 0) != name.is_empty() {
            return Err(DecodeError::BadValue { what: "change name (present exactly when parent is)", value: parent });
        }
        Ok(Change { ino, parent, name })
    }
}

/// A lock that stands in the way ([`Response::LockTest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockHolder {
    pub start: u64,
    /// Inclusive, ≥ `start`.
    pub end: u64,
    /// `Read` or `Write`.
    pub kind: LockKind,
    /// The holder's process when the holder is the asking client; 0 for
    /// another client's (its pid means nothing on this host).
    pub pid: u32,
}

/// Which [`Response`] variant a body is: the wire's kind byte in compound
/// results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Session = 1,
    Entry = 2,
    Attr = 3,
    Dir = 4,
    Done = 5,
    Link = 6,
    StatFs = 7,
    Opened = 8,
    Compound = 9,
    Orphans = 10,
    Cap = 11,
    Revocations = 12,
    Xattr = 13,
    XattrNames = 14,
    LockTest = 15,
    Changes = 16,
    Members = 17,
    Heartbeat = 18,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Session,
            2 => Kind::Entry,
            3 => Kind::Attr,
            4 => Kind::Dir,
            5 => Kind::Done,
            6 => Kind::Link,
            7 => Kind::StatFs,
            8 => Kind::Opened,
            9 => Kind::Compound,
            10 => Kind::Orphans,
            11 => Kind::Cap,
            12 => Kind::Revocations,
            13 => Kind::Xattr,
            14 => Kind::XattrNames,
            15 => Kind::LockTest,
            16 => Kind::Changes,
            17 => Kind::Members,
            18 => Kind::Heartbeat,
            _ => return None,
        })
    }

    /// The variant that answers `op`.
    pub(crate) fn answering(op: Op) -> Kind {
        match op {
            Op::SessionOpen => Kind::Session,
            Op::Lookup | Op::Create | Op::Mkdir | Op::Mknod | Op::Symlink | Op::Link => Kind::Entry,
            Op::GetAttr | Op::SetAttr => Kind::Attr,
            Op::Readdir => Kind::Dir,
            Op::Unlink
            | Op::Rmdir
            | Op::Rename
            | Op::ForgetOrphans
            | Op::Close
            | Op::Reopen
            | Op::RevokeCredential
            | Op::Lock
            | Op::SetXattr
            | Op::RemoveXattr => Kind::Done,
            Op::ServerHeartbeat => Kind::Heartbeat,
            Op::Readlink => Kind::Link,
            Op::Statfs => Kind::StatFs,
            Op::Open => Kind::Opened,
            Op::Compound => Kind::Compound,
            Op::ListOrphans => Kind::Orphans,
            Op::Recap => Kind::Cap,
            Op::Revocations => Kind::Revocations,
            Op::TestLock => Kind::LockTest,
            Op::Watch => Kind::Changes,
            Op::GetXattr => Kind::Xattr,
            Op::ListXattr => Kind::XattrNames,
            Op::Members => Kind::Members,
        }
    }
}

/// Smallest encoded compound result: errno i32 + kind u8 + empty body.
const COMPOUND_RESULT_MIN_SIZE: usize = 4;

impl Response {
    /// The inode this result produced, which a chained next op uses: the
    /// attributes' inode for Entry, Attr and Opened, the root for Session.
    pub fn ino(&self) -> Option<Ino> {
        match self {
            Response::Entry { attr } | Response::Attr { attr } | Response::Opened { attr, .. } => Some(attr.ino),
            Response::Session { root, .. } => Some(*root),
            Response::Dir { .. }
            | Response::Done
            | Response::Link { .. }
            | Response::StatFs(_)
            | Response::Compound { .. }
            | Response::Orphans { .. }
            | Response::Cap { .. }
            | Response::Revocations(_)
            | Response::LockTest { .. }
            | Response::Changes { .. }
            | Response::Xattr { .. }
            | Response::XattrNames { .. }
            | Response::Members { .. }
            | Response::Heartbeat { .. } => None,
        }
    }

    /// Whether this is a well-formed answer to `op`: the right variant, and
    /// for a Compound, results that may appear there (no Session, Compound
    /// or Orphans; only the last an error, with a valid errno).
    pub fn answers(&self, op: Op) -> bool {
        if self.kind() != Kind::answering(op) {
            return false;
        }
        let Response::Compound { results } = self else {
            return true;
        };
        results.len() <= MAX_COMPOUND
            && results.iter().enumerate().all(|(i, res)| match res {
                Ok(r) => !matches!(
                    r.kind(),
                    Kind::Session
                        | Kind::Compound
                        | Kind::Orphans
                        | Kind::Cap
                        | Kind::Revocations
                        | Kind::Xattr
                        | Kind::XattrNames
                        | Kind::LockTest
                        | Kind::Changes
                        | Kind::Members
                        | Kind::Heartbeat
                ),
                Err(e) => e.is_valid() && i + 1 == results.len(),
            })
    }

    pub(crate) fn kind(&self) -> Kind {
        match self {
            Response::Session { .. } => Kind::Session,
            Response::Entry { .. } => Kind::Entry,
            Response::Attr { .. } => Kind::Attr,
            Response::Dir { .. } => Kind::Dir,
            Response::Done => Kind::Done,
            Response::Link { .. } => Kind::Link,
            Response::StatFs(_) => Kind::StatFs,
            Response::Opened { .. } => Kind::Opened,
            Response::Compound { .. } => Kind::Compound,
            Response::Orphans { .. } => Kind::Orphans,
            Response::Cap { .. } => Kind::Cap,
            Response::Revocations(_) => Kind::Revocations,
            Response::LockTest { .. } => Kind::LockTest,
            Response::Changes { .. } => Kind::Changes,
            Response::Xattr { .. } => Kind::Xattr,
            Response::XattrNames { .. } => Kind::XattrNames,
            Response::Members { .. } => Kind::Members,
            Response::Heartbeat { .. } => Kind::Heartbeat,
        }
    }

    pub(crate) fn put_body(&self, w: &mut Writer) {
        match self {
            Response::Session { session_id, root } => {
                w.put_u64(*session_id);
                w.put_u64(*root);
            }
            Response::Entry { attr } | Response::Attr { attr } => attr.put(w),
            Response::Dir { entries, eof } => {
                w.put_len(entries.len());
                for e in entries {
                    e.put(w);
                }
                w.put_bool(*eof);
            }
            Response::Done => {}
            Response::Link { target } => w.put_bytes(target),
            Response::StatFs(s) => s.put(w),
            Response::Opened { attr, layout, cap } => {
                attr.put(w);
                layout.put(w);
                cap.put(w);
            }
            Response::Orphans { orphans, generation } => {
                w.put_len(orphans.len());
                for o in orphans {
                    o.put(w);
                }
                w.put_u64(*generation);
            }
            Response::Cap { cap } => cap.put(w),
            Response::Revocations(v) => v.put(w),
            Response::LockTest { conflict } => match conflict {
                None => w.put_bool(false),
                Some(h) => {
                    w.put_bool(true);
                    w.put_u64(h.start);
                    w.put_u64(h.end);
                    h.kind.put(w);
                    w.put_u32(h.pid);
                }
            },
            Response::Xattr { value } => w.put_bytes(value),
            Response::XattrNames { names } => {
                w.put_len(names.len());
                for n in names {
                    w.put_bytes(n);
                }
            }
            Response::Changes { next, lost, changes } => {
                w.put_u64(*next);
                w.put_bool(*lost);
                w.put_len(changes.len());
                for c in changes {
                    c.put(w);
                }
            }
            Response::Members { members, chains } => {
                w.put_len(members.len());
                for m in members {
                    m.put(w);
                }
                w.put_len(chains.len());
                for c in chains {
                    c.put(w);
                }
            }
            Response::Heartbeat { chains, routes } => {
                put_chain_versions(w, chains);
                put_chain_routes(w, routes);
            }
            Response::Compound { results } => {
                w.put_len(results.len());
                for res in results {
                    match res {
                        Ok(resp) => {
                            w.put_i32(0);
                            w.put_u8(resp.kind() as u8);
                            resp.put_body(w);
                        }
                        Err(e) => w.put_i32(e.0),
                    }
                }
            }
        }
    }

    /// Decodes the body of the reply to `op` (the caller checks that
    /// nothing trails it).
    pub(crate) fn get_body(op: Op, r: &mut Reader<'_>) -> Result<Response, DecodeError> {
        Response::get_kind(Kind::answering(op), r)
    }

    fn get_kind(kind: Kind, r: &mut Reader<'_>) -> Result<Response, DecodeError> {
        Ok(match kind {
            Kind::Session => Response::Session { session_id: r.u64("session id")?, root: r.u64("session root")? },
            Kind::Entry => Response::Entry { attr: Attr::get(r)? },
            Kind::Attr => Response::Attr { attr: Attr::get(r)? },
            Kind::Dir => {
                let n = r.count("readdir entries", MAX_READDIR_ENTRIES, DIRENT_MIN_SIZE)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(DirEntry::get(r)?);
                }
                Response::Dir { entries, eof: r.bool("readdir eof")? }
            }
            Kind::Done => Response::Done,
            Kind::Link => Response::Link { target: r.bytes("symlink target", MAX_SYMLINK)? },
            Kind::StatFs => Response::StatFs(StatFs::get(r)?),
            Kind::Opened => Response::Opened { attr: Attr::get(r)?, layout: Layout::get(r)?, cap: Capability::get(r)? },
            Kind::Compound => Response::Compound { results: get_compound_results(r)? },
            Kind::Orphans => {
                let n = r.count("orphans", MAX_ORPHANS, ORPHAN_MIN_SIZE)?;
                let mut orphans = Vec::with_capacity(n);
                for _ in 0..n {
                    orphans.push(Orphan::get(r)?);
                }
                Response::Orphans { orphans, generation: r.u64("orphans generation")? }
            }
            Kind::Cap => Response::Cap { cap: Capability::get(r)? },
            Kind::Revocations => Response::Revocations(Revocations::get(r)?),
            Kind::LockTest => {
                let conflict = if r.bool("lock conflict presence")? {
                    let (start, end) = get_lock_range(r)?;
                    let kind = LockKind::get(r, "lock conflict kind")?;
                    if kind == LockKind::Unlock {
                        return Err(DecodeError::BadValue { what: "lock conflict kind (Read or Write)", value: 3 });
                    }
                    Some(LockHolder { start, end, kind, pid: r.u32("lock conflict pid")? })
                } else {
                    None
                };
                Response::LockTest { conflict }
            }
            Kind::Changes => {
                let next = r.u64("changes next")?;
                let lost = r.bool("changes lost")?;
                let n = r.count("changes", MAX_CHANGES, CHANGE_MIN_SIZE)?;
                let mut changes = Vec::with_capacity(n);
                for _ in 0..n {
                    changes.push(Change::get(r)?);
                }
                Response::Changes { next, lost, changes }
            }
            Kind::Xattr => Response::Xattr { value: r.bytes("xattr value", XATTR_SIZE_MAX)? },
            Kind::XattrNames => {
                // Smallest name: its u32 length.
                let n = r.count("xattr names", MAX_XATTR_NAMES, 4)?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(r.bytes("xattr name", XATTR_NAME_MAX)?);
                }
                Response::XattrNames { names }
            }
            Kind::Members => Response::Members { members: get_members(r)?, chains: get_chains(r)? },
            Kind::Heartbeat => Response::Heartbeat { chains: get_chain_versions(r)?, routes: get_chain_routes(r)? },
        })
    }
}

fn get_compound_results(r: &mut Reader<'_>) -> Result<Vec<Result<Response, Errno>>, DecodeError> {
    let n = r.count("compound results", MAX_COMPOUND, COMPOUND_RESULT_MIN_SIZE)?;
    let mut results = Vec::with_capacity(n);
    for i in 0..n {
        if matches!(results.last(), Some(Err(_))) {
            return Err(DecodeError::BadValue {
                what: "compound result after an error (the server stops at the first)",
                value: i as u64,
            });
        }
        let errno = r.i32("compound result errno")?;
        if errno != 0 {
            results.push(Err(get_errno(errno, "compound result errno")?));
            continue;
        }
        let raw = r.u8("compound result kind")?;
        let kind = match Kind::from_u8(raw) {
            Some(Kind::Compound) => return Err(DecodeError::NestedCompound),
            Some(
                Kind::Session
                | Kind::Orphans
                | Kind::Cap
                | Kind::Revocations
                | Kind::Xattr
                | Kind::XattrNames
                | Kind::LockTest
                | Kind::Changes
                | Kind::Members
                | Kind::Heartbeat,
            )
            | None => return Err(DecodeError::BadValue { what: "compound result kind", value: raw.into() }),
            Some(k) => k,
        };
        results.push(Ok(Response::get_kind(kind, r)?));
    }
    Ok(results)
}

/// A non-zero errno from the wire, which must be in `1..=MAX_ERRNO`.
pub(crate) fn get_errno(raw: i32, what: &'static str) -> Result<Errno, DecodeError> {
    let e = Errno(raw);
    if !e.is_valid() {
        return Err(DecodeError::BadValue {
            what,
            // Shown as the i32's bit pattern, so -1 reads as 4294967295.
            value: u64::from(raw as u32),
        });
    }
    Ok(e)
}

impl crate::frame::RequestBody for Request {
    type Op = Op;
    fn op(&self) -> Op {
        Request::op(self)
    }
    fn put_body(&self, w: &mut Writer) {
        Request::put_body(self, w)
    }
    fn get_body(op: Op, r: &mut Reader<'_>) -> Result<Request, DecodeError> {
        Request::get_body(op, r)
    }
}

impl crate::frame::ReplyBody for Response {
    type Op = Op;
    fn answers(&self, op: Op) -> bool {
        Response::answers(self, op)
    }
    fn put_body(&self, w: &mut Writer) {
        Response::put_body(self, w)
    }
    fn get_body(op: Op, r: &mut Reader<'_>) -> Result<Response, DecodeError> {
        Response::get_body(op, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(req: Request) -> CompoundOp {
        CompoundOp { chain: false, req }
    }

    #[test]
    fn what_changes_nothing_is_never_exactly_once() {
        let lookup = Request::Lookup { parent: 1, name: b"a".to_vec() };
        let unlink = Request::Unlink { parent: 1, name: b"a".to_vec() };
        let open = |flags| Request::Open { ino: 2, flags };
        assert!(lookup.changes_nothing());
        assert!(open(crate::OPEN_READ | crate::OPEN_WRITE).changes_nothing());
        assert!(
            !open(crate::OPEN_WRITE | crate::OPEN_TRUNC).changes_nothing(),
            "a repeated truncate could cut a later write"
        );
        assert!(!unlink.changes_nothing());
        let reads = Request::Compound { ops: vec![op(lookup.clone()), op(Request::GetAttr { ino: 2 })] };
        assert!(reads.changes_nothing());
        let mixed = Request::Compound { ops: vec![op(lookup), op(unlink)] };
        assert!(!mixed.changes_nothing());
        for r in [reads, mixed, Request::Statfs, open(crate::OPEN_READ)] {
            assert!(!(r.changes_nothing() && r.is_exactly_once()), "{r:?} is in both classes");
        }
    }
}
