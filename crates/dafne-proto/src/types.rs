//! The values messages are made of, each with its wire encoding (layouts in
//! the crate docs).

use crate::wire::{Reader, Wire, Writer};
use crate::{DecodeError, Ino, MAX_LAYOUT_SERVERS, MAX_NAME_WIRE, MODE_MASK, RIGHT_READ, RIGHT_WRITE};

const NSEC_PER_SEC: u32 = 1_000_000_000;

/// A point in time: seconds since the Unix epoch and nanoseconds
/// (`nsec < 10⁹`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Wire for Timespec {
    fn put(&self, w: &mut Writer) {
        w.put_i64(self.sec);
        w.put_u32(self.nsec);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let sec = r.i64("timespec sec")?;
        let nsec = r.u32("timespec nsec")?;
        if nsec >= NSEC_PER_SEC {
            return Err(DecodeError::BadValue { what: "timespec nsec (must be below 10^9)", value: nsec.into() });
        }
        Ok(Timespec { sec, nsec })
    }
}

/// What an inode is. Numbers are the wire's and never reused.
///
/// The special files (FIFO, socket, character and block device) are names
/// and attributes only: they have no data on the io servers, and what
/// reading or writing them means is the local kernel's business (a pipe
/// buffer, a socket, a driver), never the file system's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileType {
    Regular = 1,
    Directory = 2,
    Symlink = 3,
    /// A named pipe (`S_IFIFO`).
    Fifo = 4,
    /// A Unix domain socket's name (`S_IFSOCK`).
    Socket = 5,
    /// A character device (`S_IFCHR`); its number is [`Attr::rdev`].
    CharDevice = 6,
    /// A block device (`S_IFBLK`); its number is [`Attr::rdev`].
    BlockDevice = 7,
}

impl FileType {
    /// Every file type, in number order.
    pub const ALL: &'static [FileType] = &[
        FileType::Regular,
        FileType::Directory,
        FileType::Symlink,
        FileType::Fifo,
        FileType::Socket,
        FileType::CharDevice,
        FileType::BlockDevice,
    ];

    /// `st_mode`'s file-type bits (`S_IFREG`, ...; Linux values), for the
    /// access paths that report a `stat` (C, Python).
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => 0o100000,
            FileType::Directory => 0o040000,
            FileType::Symlink => 0o120000,
            FileType::Fifo => 0o010000,
            FileType::Socket => 0o140000,
            FileType::CharDevice => 0o020000,
            FileType::BlockDevice => 0o060000,
        }
    }

    /// The file type with this wire number.
    pub fn from_u8(v: u8) -> Option<FileType> {
        match v {
            1 => Some(FileType::Regular),
            2 => Some(FileType::Directory),
            3 => Some(FileType::Symlink),
            4 => Some(FileType::Fifo),
            5 => Some(FileType::Socket),
            6 => Some(FileType::CharDevice),
            7 => Some(FileType::BlockDevice),
            _ => None,
        }
    }

    /// A device node: its [`Attr::rdev`] names the device.
    pub fn is_device(self) -> bool {
        matches!(self, FileType::CharDevice | FileType::BlockDevice)
    }

    /// A FIFO, socket or device: a name and attributes, no data.
    pub fn is_special(self) -> bool {
        matches!(self, FileType::Fifo | FileType::Socket | FileType::CharDevice | FileType::BlockDevice)
    }
}

impl Wire for FileType {
    fn put(&self, w: &mut Writer) {
        w.put_u8(*self as u8);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let v = r.u8("file type")?;
        FileType::from_u8(v).ok_or(DecodeError::BadValue { what: "file type", value: v.into() })
    }
}

/// Reads a mode and refuses bits outside [`MODE_MASK`].
pub(crate) fn get_mode(r: &mut Reader<'_>, what: &'static str) -> Result<u32, DecodeError> {
    let mode = r.u32(what)?;
    if mode & !MODE_MASK != 0 {
        return Err(DecodeError::BadValue { what, value: mode.into() });
    }
    Ok(mode)
}

/// An inode's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileType,
    /// Permission bits including setuid, setgid and sticky (only bits of
    /// [`MODE_MASK`]).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// The device a [`FileType::CharDevice`] or [`FileType::BlockDevice`]
    /// names, as Linux user space encodes a `dev_t` (glibc `makedev`:
    /// minor bits 0–7 and 20–43, major bits 8–19 and 44–63); 0 for every
    /// other type.
    pub rdev: u64,
    /// Bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

impl Wire for Attr {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.ino);
        self.kind.put(w);
        w.put_u32(self.mode);
        w.put_u32(self.nlink);
        w.put_u32(self.uid);
        w.put_u32(self.gid);
        w.put_u64(self.rdev);
        w.put_u64(self.size);
        w.put_u64(self.blocks);
        self.atime.put(w);
        self.mtime.put(w);
        self.ctime.put(w);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Attr {
            ino: r.u64("attr ino")?,
            kind: FileType::get(r)?,
            mode: get_mode(r, "attr mode")?,
            nlink: r.u32("attr nlink")?,
            uid: r.u32("attr uid")?,
            gid: r.u32("attr gid")?,
            rdev: r.u64("attr rdev")?,
            size: r.u64("attr size")?,
            blocks: r.u64("attr blocks")?,
            atime: Timespec::get(r)?,
            mtime: Timespec::get(r)?,
            ctime: Timespec::get(r)?,
        })
    }
}

/// How a new file should be striped; 0 in a field means "the cluster's
/// default".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LayoutHint {
    pub stripe_unit: u32,
    pub stripe_count: u32,
}

impl Wire for LayoutHint {
    fn put(&self, w: &mut Writer) {
        w.put_u32(self.stripe_unit);
        w.put_u32(self.stripe_count);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(LayoutHint { stripe_unit: r.u32("hint stripe_unit")?, stripe_count: r.u32("hint stripe_count")? })
    }
}

impl<T: Wire> Wire for Option<T> {
    fn put(&self, w: &mut Writer) {
        w.put_bool(self.is_some());
        if let Some(v) = self {
            v.put(w);
        }
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        if r.bool("presence byte of an optional field")? {
            T::get(r).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Where a file's bytes live: which io servers hold its stripes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    pub object_id: u64,
    pub stripe_unit: u32,
    pub stripe_count: u32,
    /// Io server ids, at most [`MAX_LAYOUT_SERVERS`].
    pub servers: Vec<u32>,
}

impl Wire for Layout {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.object_id);
        w.put_u32(self.stripe_unit);
        w.put_u32(self.stripe_count);
        w.put_len(self.servers.len());
        for s in &self.servers {
            w.put_u32(*s);
        }
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let object_id = r.u64("layout object_id")?;
        let stripe_unit = r.u32("layout stripe_unit")?;
        let stripe_count = r.u32("layout stripe_count")?;
        let n = r.count("layout servers", MAX_LAYOUT_SERVERS, 4)?;
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(r.u32("layout server id")?);
        }
        Ok(Layout { object_id, stripe_unit, stripe_count, servers })
    }
}

/// The metadata server's permission for a client to read and/or write an
/// object on the io servers until `expiry_unix_ns`. The io servers check
/// `mac` over [`Capability::signed_bytes`] with the cluster's secret, and
/// `generation` against the object's revocation floor (`dafne_auth`'s
/// module docs, "Revocation").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capability {
    pub object_id: u64,
    /// The file whose data the object holds (0 for a capability about no
    /// file): what meta checks before it re-issues one (`Recap`).
    pub ino: u64,
    /// [`RIGHT_READ`] | [`RIGHT_WRITE`].
    pub rights: u8,
    /// The cluster's capability generation when meta issued it: valid only
    /// while it is at least the object's revocation floor on the io server.
    pub generation: u64,
    pub expiry_unix_ns: u64,
    /// The file's cache advice, from its `user.dafne.cache` attribute when
    /// meta issued the capability: every io server of the stripe gets it
    /// with each request and gives it to its Unifier for the object.
    pub advice: CacheAdvice,
    pub mac: [u8; 32],
}

impl Capability {
    /// Length of [`Capability::signed_bytes`].
    pub const SIGNED_LEN: usize = 35;

    /// The bytes the MAC covers: object_id, ino (LE), rights, generation,
    /// expiry_unix_ns (LE), advice (unit KiB, policy).
    pub fn signed_bytes(&self) -> [u8; Self::SIGNED_LEN] {
        let mut b = [0u8; Self::SIGNED_LEN];
        b[..8].copy_from_slice(&self.object_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.ino.to_le_bytes());
        b[16] = self.rights;
        b[17..25].copy_from_slice(&self.generation.to_le_bytes());
        b[25..33].copy_from_slice(&self.expiry_unix_ns.to_le_bytes());
        b[33] = self.advice.unit_kib;
        b[34] = self.advice.policy as u8;
        b
    }
}

/// The extended attribute that holds a file's (or a directory's) cache
/// advice, as text: `unit=16k`, `policy=clock`, or both separated by a
/// comma or spaces. Meta refuses any other value (`EINVAL`); a file or
/// directory created in a directory that has it gets a copy.
pub const CACHE_ADVICE_XATTR: &[u8] = b"user.dafne.cache";

/// A replacement policy asked for by advice (the Unifier paper's "cache
/// policy selection").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CachePolicy {
    /// The io server's default.
    #[default]
    Default = 0,
    /// Least recently used.
    Lru = 1,
    /// Second chance (CLOCK).
    Clock = 2,
}

/// Per-file advice for the io servers' cache (the Unifier paper's
/// "semantic information": cache unit size and policy). The all-default
/// value ([`CacheAdvice::NONE`]) leaves both to the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CacheAdvice {
    /// The cache unit in KiB: 0 (the server's default) or one of
    /// [`CacheAdvice::UNIT_KIB`].
    pub unit_kib: u8,
    pub policy: CachePolicy,
}

/// Why a text is not cache advice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}; cache advice reads like `unit=16k,policy=clock` (unit 4k, 8k, 16k, 32k or 64k; policy lru or clock)")]
pub struct AdviceError(pub String);

impl CacheAdvice {
    /// No advice: the server's defaults.
    pub const NONE: CacheAdvice = CacheAdvice { unit_kib: 0, policy: CachePolicy::Default };
    /// The unit sizes an io server offers (its size classes), in KiB.
    pub const UNIT_KIB: [u8; 5] = [4, 8, 16, 32, 64];

    /// Whether nothing is advised.
    pub fn is_none(&self) -> bool {
        *self == CacheAdvice::NONE
    }

    /// The advised unit in bytes, if any.
    pub fn unit_bytes(&self) -> Option<usize> {
        (self.unit_kib != 0).then(|| usize::from(self.unit_kib) * 1024)
    }

    /// Reads the attribute's text (see [`CACHE_ADVICE_XATTR`]). An empty
    /// text is no advice.
    pub fn parse(text: &[u8]) -> Result<CacheAdvice, AdviceError> {
        let text = std::str::from_utf8(text).map_err(|_| AdviceError("the value is not UTF-8".into()))?;
        let mut a = CacheAdvice::NONE;
        for part in text.split([',', ' ', '\n', '\t']).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| AdviceError(format!("`{part}` is not KEY=VALUE")))?;
            match key {
                "unit" => a.unit_kib = Self::parse_unit(value)?,
                "policy" => {
                    a.policy = match value.to_ascii_lowercase().as_str() {
                        "lru" => CachePolicy::Lru,
                        "clock" => CachePolicy::Clock,
                        "default" => CachePolicy::Default,
                        _ => return Err(AdviceError(format!("policy `{value}` is not lru or clock"))),
                    }
                }
                _ => return Err(AdviceError(format!("unknown key `{key}`"))),
            }
        }
        Ok(a)
    }

    /// A unit size as `16k`, `16K`, `16KiB` or `16384`.
    pub fn parse_unit(value: &str) -> Result<u8, AdviceError> {
        let v = value.trim().to_ascii_lowercase();
        let kib = if let Some(n) = v.strip_suffix("kib").or_else(|| v.strip_suffix('k')) {
            n.parse::<u64>().ok()
        } else {
            v.parse::<u64>().ok().filter(|b| b % 1024 == 0).map(|b| b / 1024)
        };
        match kib {
            Some(k) if Self::UNIT_KIB.iter().any(|&u| u64::from(u) == k) => Ok(k as u8),
            _ => Err(AdviceError(format!("unit `{value}` is not 4k, 8k, 16k, 32k or 64k"))),
        }
    }
}

impl std::fmt::Display for CacheAdvice {
    /// The attribute's text: `unit=16k,policy=clock` (parts left at the
    /// default are left out; no advice is empty).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.unit_kib != 0 {
            parts.push(format!("unit={}k", self.unit_kib));
        }
        match self.policy {
            CachePolicy::Default => {}
            CachePolicy::Lru => parts.push("policy=lru".into()),
            CachePolicy::Clock => parts.push("policy=clock".into()),
        }
        f.write_str(&parts.join(","))
    }
}

impl Wire for CacheAdvice {
    fn put(&self, w: &mut Writer) {
        w.put_u8(self.unit_kib);
        w.put_u8(self.policy as u8);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let unit_kib = r.u8("advice unit_kib")?;
        if unit_kib != 0 && !Self::UNIT_KIB.contains(&unit_kib) {
            return Err(DecodeError::BadValue { what: "advice unit_kib", value: unit_kib.into() });
        }
        let policy = match r.u8("advice policy")? {
            0 => CachePolicy::Default,
            1 => CachePolicy::Lru,
            2 => CachePolicy::Clock,
            v => return Err(DecodeError::BadValue { what: "advice policy", value: v.into() }),
        };
        Ok(CacheAdvice { unit_kib, policy })
    }
}

impl Wire for Capability {
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.object_id);
        w.put_u64(self.ino);
        w.put_u8(self.rights);
        w.put_u64(self.generation);
        w.put_u64(self.expiry_unix_ns);
        self.advice.put(w);
        w.put_raw(&self.mac);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let object_id = r.u64("capability object_id")?;
        let ino = r.u64("capability ino")?;
        let rights = r.u8("capability rights")?;
        if rights & !(RIGHT_READ | RIGHT_WRITE) != 0 {
            return Err(DecodeError::BadValue { what: "capability rights", value: rights.into() });
        }
        Ok(Capability {
            object_id,
            ino,
            rights,
            generation: r.u64("capability generation")?,
            expiry_unix_ns: r.u64("capability expiry")?,
            advice: CacheAdvice::get(r)?,
            mac: r.array("capability mac")?,
        })
    }
}

/// Most entries in one [`Revocations`] batch.
pub const MAX_REVOCATIONS: usize = 4096;

/// One revocation: capabilities of `object_id` with a generation below
/// `floor` are no longer valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Revocation {
    pub object_id: u64,
    pub floor: u64,
}

/// Encoded size of a [`Revocation`].
const REVOCATION_SIZE: usize = 16;

/// A batch of meta's revocation log for the io servers, signed by meta:
/// the entries numbered `from_seq + 1 ..= to_seq` of the log of meta
/// instance `instance`, after raising every object's floor to
/// `reset_floor` (0: no reset). `mac` covers [`Revocations::signed_bytes`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Revocations {
    pub instance: u64,
    pub from_seq: u64,
    pub to_seq: u64,
    pub reset_floor: u64,
    /// Exactly `to_seq - from_seq` of them, at most [`MAX_REVOCATIONS`].
    pub entries: Vec<Revocation>,
    pub mac: [u8; 32],
}

impl Revocations {
    /// Smallest encoding: four u64, a count, no entries, the MAC.
    pub const MIN_SIZE: usize = 4 * 8 + 4 + 32;
    /// Largest encoding.
    pub const MAX_SIZE: usize = Self::MIN_SIZE + MAX_REVOCATIONS * REVOCATION_SIZE;

    /// The bytes the MAC covers: everything but the MAC, as encoded.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.put_fields(&mut w);
        w.into_vec()
    }

    fn put_fields(&self, w: &mut Writer) {
        w.put_u64(self.instance);
        w.put_u64(self.from_seq);
        w.put_u64(self.to_seq);
        w.put_u64(self.reset_floor);
        w.put_len(self.entries.len());
        for e in &self.entries {
            w.put_u64(e.object_id);
            w.put_u64(e.floor);
        }
    }
}

impl Wire for Revocations {
    fn put(&self, w: &mut Writer) {
        self.put_fields(w);
        w.put_raw(&self.mac);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let instance = r.u64("revocations instance")?;
        let from_seq = r.u64("revocations from_seq")?;
        let to_seq = r.u64("revocations to_seq")?;
        let reset_floor = r.u64("revocations reset_floor")?;
        let n = r.count("revocations entries", MAX_REVOCATIONS, REVOCATION_SIZE)?;
        if to_seq.checked_sub(from_seq) != Some(n as u64) {
            return Err(DecodeError::BadValue {
                what: "revocations to_seq (must be from_seq + the number of entries)",
                value: to_seq,
            });
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            entries.push(Revocation { object_id: r.u64("revocation object_id")?, floor: r.u64("revocation floor")? });
        }
        Ok(Revocations { instance, from_seq, to_seq, reset_floor, entries, mac: r.array("revocations mac")? })
    }
}

/// One directory entry of a `Readdir` reply.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileType,
    /// Pass as `Readdir::cookie` to continue after this entry.
    pub cookie: u64,
}

/// Smallest encoded [`DirEntry`] (empty name).
pub(crate) const DIRENT_MIN_SIZE: usize = 4 + 8 + 1 + 8;

impl Wire for DirEntry {
    fn put(&self, w: &mut Writer) {
        w.put_bytes(&self.name);
        w.put_u64(self.ino);
        self.kind.put(w);
        w.put_u64(self.cookie);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(DirEntry {
            name: r.bytes("dirent name", MAX_NAME_WIRE)?,
            ino: r.u64("dirent ino")?,
            kind: FileType::get(r)?,
            cookie: r.u64("dirent cookie")?,
        })
    }
}

/// A time to set: the server's clock, or a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeSet {
    Now,
    At(Timespec),
}

/// Which attributes `SetAttr` changes; `None` leaves one alone. A `size`
/// truncates or extends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The size becomes this if it is larger (never smaller): what a
    /// writer publishes after its writes, without first asking what the
    /// size is, so two writers' sizes can only grow (the larger wins). It
    /// does not by itself change mtime. With `size` too, `size` applies
    /// first.
    pub grow_to: Option<u64>,
    /// The change need not be durable before the answer: the metadata
    /// server may commit it without an fsync, and it becomes durable with
    /// the next durable commit (any client's create, unlink, or a setattr
    /// without this flag), at most about a second later. What a mount's size publish at `close` sends
    /// (POSIX asks no durability of `close`; `fsync` publishes without it).
    /// Honoured only where the batch holds nothing else that changes the
    /// namespace (`dafne_meta` store docs, "Lazy commits").
    pub lazy: bool,
}

// SetAttr mask bits; the fields follow in this order.
const SET_MODE: u32 = 1 << 0;
const SET_UID: u32 = 1 << 1;
const SET_GID: u32 = 1 << 2;
const SET_SIZE: u32 = 1 << 3;
const SET_ATIME: u32 = 1 << 4;
const SET_ATIME_NOW: u32 = 1 << 5;
const SET_MTIME: u32 = 1 << 6;
const SET_MTIME_NOW: u32 = 1 << 7;
const SET_GROW: u32 = 1 << 8;
const SET_LAZY: u32 = 1 << 9;
const SET_ALL: u32 = (1 << 10) - 1;

impl SetAttr {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == SetAttr::default()
    }

    fn mask(&self) -> u32 {
        let bit = |present: bool, b: u32| if present { b } else { 0 };
        let time = |t: Option<TimeSet>, at: u32, now: u32| match t {
            None => 0,
            Some(TimeSet::Now) => now,
            Some(TimeSet::At(_)) => at,
        };
        bit(self.mode.is_some(), SET_MODE)
            | bit(self.uid.is_some(), SET_UID)
            | bit(self.gid.is_some(), SET_GID)
            | bit(self.size.is_some(), SET_SIZE)
            | time(self.atime, SET_ATIME, SET_ATIME_NOW)
            | time(self.mtime, SET_MTIME, SET_MTIME_NOW)
            | bit(self.grow_to.is_some(), SET_GROW)
            | bit(self.lazy, SET_LAZY)
    }
}

fn put_time(w: &mut Writer, t: Option<TimeSet>) {
    if let Some(TimeSet::At(ts)) = t {
        ts.put(w);
    }
}

fn get_time(r: &mut Reader<'_>, mask: u32, at: u32, now: u32) -> Result<Option<TimeSet>, DecodeError> {
    Ok(match (mask & at != 0, mask & now != 0) {
        (false, false) => None,
        (true, false) => Some(TimeSet::At(Timespec::get(r)?)),
        (false, true) => Some(TimeSet::Now),
        (true, true) => {
            return Err(DecodeError::BadValue {
                what: "setattr mask (a time both 'now' and given)",
                value: mask.into(),
            })
        }
    })
}

impl Wire for SetAttr {
    fn put(&self, w: &mut Writer) {
        w.put_u32(self.mask());
        if let Some(v) = self.mode {
            w.put_u32(v);
        }
        if let Some(v) = self.uid {
            w.put_u32(v);
        }
        if let Some(v) = self.gid {
            w.put_u32(v);
        }
        if let Some(v) = self.size {
            w.put_u64(v);
        }
        put_time(w, self.atime);
        put_time(w, self.mtime);
        if let Some(v) = self.grow_to {
            w.put_u64(v);
        }
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mask = r.u32("setattr mask")?;
        if mask & !SET_ALL != 0 {
            return Err(DecodeError::BadValue { what: "setattr mask (unknown bits)", value: mask.into() });
        }
        let has = |b: u32| mask & b != 0;
        Ok(SetAttr {
            mode: has(SET_MODE).then(|| get_mode(r, "setattr mode")).transpose()?,
            uid: has(SET_UID).then(|| r.u32("setattr uid")).transpose()?,
            gid: has(SET_GID).then(|| r.u32("setattr gid")).transpose()?,
            size: has(SET_SIZE).then(|| r.u64("setattr size")).transpose()?,
            atime: get_time(r, mask, SET_ATIME, SET_ATIME_NOW)?,
            mtime: get_time(r, mask, SET_MTIME, SET_MTIME_NOW)?,
            grow_to: has(SET_GROW).then(|| r.u64("setattr grow_to")).transpose()?,
            lazy: has(SET_LAZY),
        })
    }
}

/// File-system totals, as `statfs(2)` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StatFs {
    /// Total blocks of `bsize` bytes.
    pub blocks: u64,
    pub bfree: u64,
    /// Free blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    /// Longest name accepted ([`crate::NAME_MAX`]).
    pub namelen: u32,
}

impl Wire for StatFs {
    fn put(&self, w: &mut Writer) {
        for v in [self.blocks, self.bfree, self.bavail, self.files, self.ffree] {
            w.put_u64(v);
        }
        w.put_u32(self.bsize);
        w.put_u32(self.namelen);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(StatFs {
            blocks: r.u64("statfs blocks")?,
            bfree: r.u64("statfs bfree")?,
            bavail: r.u64("statfs bavail")?,
            files: r.u64("statfs files")?,
            ffree: r.u64("statfs ffree")?,
            bsize: r.u32("statfs bsize")?,
            namelen: r.u32("statfs namelen")?,
        })
    }
}

/// Most ranges of each kind (uids, gids) in a [`Credential`].
pub const MAX_CREDENTIAL_RANGES: usize = 64;

/// Encoded size of an [`IdRange`]: first u32, last u32.
const ID_RANGE_SIZE: usize = 8;

/// The ids `first..=last` (uids or gids); `first <= last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdRange {
    pub first: u32,
    pub last: u32,
}

impl IdRange {
    pub fn contains(&self, id: u32) -> bool {
        self.first <= id && id <= self.last
    }
}

impl Wire for IdRange {
    fn put(&self, w: &mut Writer) {
        w.put_u32(self.first);
        w.put_u32(self.last);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let (first, last) = (r.u32("id range first")?, r.u32("id range last")?);
        if first > last {
            return Err(DecodeError::BadValue { what: "id range (first above last)", value: first.into() });
        }
        Ok(IdRange { first, last })
    }
}

fn get_ranges(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<IdRange>, DecodeError> {
    let n = r.count(what, MAX_CREDENTIAL_RANGES, ID_RANGE_SIZE)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(IdRange::get(r)?);
    }
    Ok(v)
}

/// A per-client credential's policy: which uids and gids a client that
/// proves it may state in its requests, and whether it may be root
/// (`dafne_auth`'s module docs, "Credentials", say how it is proven and
/// enforced). Its encoding is canonical, so the MAC key derived from it
/// (`dafne_auth::Secret::credential_key`) covers exactly one policy:
///
/// name str (1..=[`MAX_CLIENT_NAME`](crate::MAX_CLIENT_NAME) bytes,
/// UTF-8), n u32 (≤ [`MAX_CREDENTIAL_RANGES`]) × uid range {first u32,
/// last u32 (≥ first)}, m u32 (≤ [`MAX_CREDENTIAL_RANGES`]) × gid range,
/// root u8 (0 or 1).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credential {
    /// What an admin revokes it by.
    pub name: String,
    pub uids: Vec<IdRange>,
    pub gids: Vec<IdRange>,
    /// uid 0 stays root (otherwise it is squashed to nobody).
    pub root: bool,
}

impl Credential {
    /// The canonical encoding (what the key derivation covers).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.put(&mut w);
        w.into_vec()
    }

    /// The policy in `b`, which must be exactly one canonical encoding.
    pub fn decode(b: &[u8]) -> Result<Credential, DecodeError> {
        let mut r = Reader::new(b);
        let c = Credential::get(&mut r)?;
        r.finish()?;
        Ok(c)
    }

    pub fn allows_uid(&self, uid: u32) -> bool {
        self.uids.iter().any(|r| r.contains(uid))
    }

    pub fn allows_gid(&self, gid: u32) -> bool {
        self.gids.iter().any(|r| r.contains(gid))
    }
}

impl Wire for Credential {
    fn put(&self, w: &mut Writer) {
        w.put_bytes(self.name.as_bytes());
        for list in [&self.uids, &self.gids] {
            w.put_len(list.len());
            for r in list {
                r.put(w);
            }
        }
        w.put_bool(self.root);
    }

    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let name = r.bytes("credential name", crate::MAX_CLIENT_NAME)?;
        if name.is_empty() {
            return Err(DecodeError::BadValue { what: "credential name length", value: 0 });
        }
        let name = String::from_utf8(name).map_err(|_| DecodeError::NotUtf8("credential name"))?;
        Ok(Credential {
            name,
            uids: get_ranges(r, "credential uid ranges")?,
            gids: get_ranges(r, "credential gid ranges")?,
            root: r.bool("credential root")?,
        })
    }
}

/// A capability with every field set, for the decoders' tests.
#[cfg(test)]
pub(crate) fn sample_capability() -> Capability {
    Capability {
        object_id: 77,
        ino: 5,
        rights: crate::RIGHT_READ,
        generation: 6,
        expiry_unix_ns: 123,
        advice: CacheAdvice::NONE,
        mac: [9; 32],
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn round_trip<T: Wire + PartialEq + std::fmt::Debug>(v: &T) -> Vec<u8> {
        let mut w = Writer::default();
        v.put(&mut w);
        let b = w.into_vec();
        let mut r = Reader::new(&b);
        assert_eq!(&T::get(&mut r).unwrap(), v);
        assert_eq!(r.finish(), Ok(()));
        b
    }

    fn decode<T: Wire>(b: &[u8]) -> Result<T, DecodeError> {
        let mut r = Reader::new(b);
        let v = T::get(&mut r)?;
        r.finish()?;
        Ok(v)
    }

    pub(crate) fn attr() -> Attr {
        Attr {
            ino: 42,
            kind: FileType::Regular,
            mode: 0o4755,
            nlink: 1,
            uid: 1000,
            gid: 100,
            rdev: 0,
            size: 1 << 40,
            blocks: 7,
            atime: Timespec { sec: -1, nsec: 5 },
            mtime: Timespec { sec: 1_700_000_000, nsec: 999_999_999 },
            ctime: Timespec::default(),
        }
    }

    #[test]
    fn attr_round_trips_at_its_size() {
        // ino, kind, mode, nlink, uid, gid, rdev, size, blocks, 3 × timespec.
        assert_eq!(round_trip(&attr()).len(), 8 + 1 + 4 * 4 + 8 + 8 + 8 + 3 * 12);
        let dev = Attr { kind: FileType::BlockDevice, rdev: 0x0000_1234_5678_9abc, ..attr() };
        let b = round_trip(&dev);
        assert_eq!(b[8], 7);
        assert_eq!(b[25..33], 0x0000_1234_5678_9abcu64.to_le_bytes());
        assert_eq!(round_trip(&Timespec::default()).len(), 12);
    }

    #[test]
    fn attr_refuses_mode_bits_and_file_type() {
        let mut b = round_trip(&attr());
        b[9..13].copy_from_slice(&0o10_0644u32.to_le_bytes());
        assert_eq!(decode::<Attr>(&b), Err(DecodeError::BadValue { what: "attr mode", value: 0o10_0644 }));
        let mut b = round_trip(&attr());
        b[8] = 8;
        assert_eq!(decode::<Attr>(&b), Err(DecodeError::BadValue { what: "file type", value: 8 }));
        b[8] = 0;
        assert_eq!(decode::<Attr>(&b), Err(DecodeError::BadValue { what: "file type", value: 0 }));
    }

    #[test]
    fn file_types_have_stable_numbers() {
        let got: Vec<u8> = FileType::ALL.iter().map(|k| *k as u8).collect();
        assert_eq!(got, (1..=7).collect::<Vec<u8>>());
        for k in FileType::ALL {
            assert_eq!(FileType::from_u8(*k as u8), Some(*k));
            assert_eq!(k.is_special(), *k as u8 >= 4, "{k:?}");
            assert_eq!(k.is_device(), matches!(k, FileType::CharDevice | FileType::BlockDevice));
        }
        assert_eq!(FileType::from_u8(8), None);
    }

    #[test]
    fn timespec_refuses_nsec_of_a_second() {
        let mut b = round_trip(&Timespec { sec: 3, nsec: 0 });
        b[8..].copy_from_slice(&NSEC_PER_SEC.to_le_bytes());
        assert!(matches!(decode::<Timespec>(&b), Err(DecodeError::BadValue { value: 1_000_000_000, .. })));
    }

    #[test]
    fn setattr_mask_names_what_follows() {
        assert_eq!(round_trip(&SetAttr::default()), vec![0, 0, 0, 0]);
        let full = SetAttr {
            mode: Some(0o644),
            uid: Some(1),
            gid: Some(2),
            size: Some(3),
            atime: Some(TimeSet::Now),
            mtime: Some(TimeSet::At(Timespec { sec: 4, nsec: 5 })),
            grow_to: Some(6),
            lazy: true,
        };
        let b = round_trip(&full);
        assert_eq!(b[..4], 0b11_0110_1111u32.to_le_bytes());
        assert_eq!(b.len(), 4 + 4 + 4 + 4 + 8 + 12 + 8);
        round_trip(&SetAttr {
            atime: Some(TimeSet::At(Timespec { sec: 9, nsec: 0 })),
            mtime: Some(TimeSet::Now),
            ..SetAttr::default()
        });
        assert!(!full.is_empty());
        assert!(SetAttr::default().is_empty());
    }

    #[test]
    fn setattr_refuses_bad_masks() {
        assert!(matches!(
            decode::<SetAttr>(&(1u32 << 10).to_le_bytes()),
            Err(DecodeError::BadValue { value: 1024, .. })
        ));
        // The lazy bit alone carries no field.
        assert_eq!(decode::<SetAttr>(&SET_LAZY.to_le_bytes()).unwrap(), SetAttr { lazy: true, ..SetAttr::default() });
        assert!(matches!(
            decode::<SetAttr>(&(SET_MTIME | SET_MTIME_NOW).to_le_bytes()),
            Err(DecodeError::BadValue { value: 0xc0, .. })
        ));
        let mut b = SET_MODE.to_le_bytes().to_vec();
        b.extend_from_slice(&0o20_000u32.to_le_bytes());
        assert!(matches!(decode::<SetAttr>(&b), Err(DecodeError::BadValue { what: "setattr mode", .. })));
        // Mask promises a size that is not there.
        assert!(matches!(
            decode::<SetAttr>(&SET_SIZE.to_le_bytes()),
            Err(DecodeError::Truncated { what: "setattr size", needed: 8, left: 0 })
        ));
    }

    #[test]
    fn layout_server_count_is_bounded() {
        let l = Layout { object_id: 9, stripe_unit: 1 << 20, stripe_count: 2, servers: vec![3, 4] };
        let b = round_trip(&l);
        let mut over = b[..16].to_vec();
        over.extend_from_slice(&(MAX_LAYOUT_SERVERS as u32 + 1).to_le_bytes());
        assert!(matches!(decode::<Layout>(&over), Err(DecodeError::TooLong { len: 257, max: 256, .. })));
        // A count within the limit whose elements are missing allocates
        // nothing and says how many bytes it needed.
        let mut short = b[..16].to_vec();
        short.extend_from_slice(&200u32.to_le_bytes());
        assert_eq!(
            decode::<Layout>(&short),
            Err(DecodeError::Truncated { what: "layout servers", needed: 800, left: 0 })
        );
    }

    #[test]
    fn capability_signed_bytes_and_rights() {
        let c = Capability {
            object_id: 0x0102_0304_0506_0708,
            ino: 0x2122_2324_2526_2728,
            rights: RIGHT_READ | RIGHT_WRITE,
            generation: 0x3132_3334_3536_3738,
            expiry_unix_ns: 0x1112_1314_1516_1718,
            advice: CacheAdvice { unit_kib: 16, policy: CachePolicy::Clock },
            mac: [7; 32],
        };
        let b = round_trip(&c);
        assert_eq!(b.len(), 8 + 8 + 1 + 8 + 8 + 2 + 32);
        assert_eq!(&c.signed_bytes()[..], &b[..35]);
        assert_eq!(c.signed_bytes()[16], 3);
        assert_eq!(&c.signed_bytes()[33..], &[16, 2]);
        let mut bad = b.clone();
        bad[16] = 4;
        assert!(matches!(
            decode::<Capability>(&bad),
            Err(DecodeError::BadValue { what: "capability rights", value: 4 })
        ));
        // Advice: a unit that is no size class, a policy past CLOCK.
        for (at, v, what) in [(33, 12, "advice unit_kib"), (33, 128, "advice unit_kib"), (34, 3, "advice policy")] {
            let mut bad = b.clone();
            bad[at] = v;
            assert!(
                matches!(decode::<Capability>(&bad), Err(DecodeError::BadValue { what: w, .. }) if w == what),
                "{at}={v}"
            );
        }
    }

    #[test]
    fn cache_advice_reads_and_writes_the_attributes_text() {
        let a = CacheAdvice::parse(b"unit=16k,policy=clock").unwrap();
        assert_eq!(a, CacheAdvice { unit_kib: 16, policy: CachePolicy::Clock });
        assert_eq!(a.to_string(), "unit=16k,policy=clock");
        assert_eq!(CacheAdvice::parse(a.to_string().as_bytes()).unwrap(), a);
        assert_eq!(CacheAdvice::parse(b"policy=LRU unit=65536\n").unwrap().to_string(), "unit=64k,policy=lru");
        assert_eq!(CacheAdvice::parse(b"unit=4KiB").unwrap().unit_bytes(), Some(4096));
        assert_eq!(CacheAdvice::parse(b"").unwrap(), CacheAdvice::NONE);
        assert_eq!(CacheAdvice::NONE.to_string(), "");
        assert_eq!(CacheAdvice::NONE.unit_bytes(), None);
        for bad in [&b"unit=12k"[..], b"unit=128k", b"unit=", b"unit=4097", b"policy=mru", b"speed=1", b"unit", b"\xff"]
        {
            let e = CacheAdvice::parse(bad).unwrap_err().to_string();
            assert!(e.contains("cache advice reads like"), "{e}");
        }
    }

    #[test]
    fn revocations_round_trip_and_hostile_counts_are_refused() {
        let v = Revocations {
            instance: 9,
            from_seq: 5,
            to_seq: 7,
            reset_floor: 0,
            entries: vec![Revocation { object_id: 1, floor: 2 }, Revocation { object_id: 3, floor: 4 }],
            mac: [1; 32],
        };
        let b = round_trip(&v);
        assert_eq!(b.len(), Revocations::MIN_SIZE + 2 * REVOCATION_SIZE);
        assert_eq!(v.signed_bytes()[..], b[..b.len() - 32]);
        // to_seq that does not match the entries.
        let mut bad = b.clone();
        bad[16] = 8;
        assert!(matches!(decode::<Revocations>(&bad), Err(DecodeError::BadValue { .. })));
        // A huge count is refused before anything is allocated.
        let mut huge = b[..32].to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode::<Revocations>(&huge).is_err());
        // from_seq past to_seq.
        let mut wrap = b.clone();
        wrap[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<Revocations>(&wrap).is_err());
    }

    #[test]
    fn dirent_and_statfs_round_trip() {
        let e = DirEntry { name: b"a".to_vec(), ino: 5, kind: FileType::Symlink, cookie: 77 };
        assert_eq!(round_trip(&e).len(), DIRENT_MIN_SIZE + 1);
        let s = StatFs { blocks: 1, bfree: 2, bavail: 3, files: 4, ffree: 5, bsize: 4096, namelen: 255 };
        assert_eq!(round_trip(&s).len(), 48);
    }

    #[test]
    fn option_presence_byte() {
        round_trip(&Some(LayoutHint { stripe_unit: 1, stripe_count: 2 }));
        assert_eq!(round_trip(&None::<LayoutHint>), vec![0]);
        assert!(matches!(decode::<Option<LayoutHint>>(&[2]), Err(DecodeError::BadValue { value: 2, .. })));
    }
}
