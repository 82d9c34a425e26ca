//! Headers and whole messages: what the transport carries as a request or
//! reply payload.

use crate::msg::get_errno;
use crate::wire::{Reader, Writer};
use crate::{
    ChainVersion, DecodeError, Errno, IoOp, Op, Request, Response, MAX_CHAINS, MAX_GROUPS, PROTO_VERSION,
    REQUEST_FLAG_CHAIN, REQUEST_FLAG_FORWARDED, REQUEST_FLAG_GROUPS, REQUEST_FLAG_GROUPS_OMITTED, REQUEST_FLAG_SESSION,
    SEQ_WINDOW,
};

/// Who sends a request and under which id: the header fields a caller
/// chooses, and the caller's supplementary groups (which travel in front
/// of the body, crate docs "Messages").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Envelope {
    /// The client's request id, echoed in the reply (for matching and for
    /// recognising a retry).
    pub tag: u64,
    /// Credentials the server checks permissions against.
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, checked like `gid`.
    pub groups: Groups,
    /// The request's place in its client's exactly-once session
    /// ([`REQUEST_FLAG_SESSION`]); `None`: executed every time it arrives.
    pub session: Option<SessionSeq>,
    /// Io data requests: the chain the request is for and the version of
    /// its row the client knows ([`REQUEST_FLAG_CHAIN`]; `io` module docs,
    /// "Chains"). `None`: not checked.
    pub chain: Option<ChainVersion>,
    /// Io `Write` only: forwarded by a chain's replica to the next one
    /// ([`REQUEST_FLAG_FORWARDED`]; needs a chain).
    pub forwarded: bool,
}

impl Envelope {
    /// An envelope without supplementary groups, session sequence or chain.
    pub const fn new(tag: u64, uid: u32, gid: u32) -> Envelope {
        Envelope { tag, uid, gid, groups: Groups::NONE, session: None, chain: None, forwarded: false }
    }

    /// The header flags this envelope's extensions need.
    fn flags(&self) -> u32 {
        let groups = if self.groups.is_omitted() {
            REQUEST_FLAG_GROUPS_OMITTED
        } else if self.groups.is_empty() {
            0
        } else {
            REQUEST_FLAG_GROUPS
        };
        let session = if self.session.is_some() { REQUEST_FLAG_SESSION } else { 0 };
        let chain = if self.chain.is_some() { REQUEST_FLAG_CHAIN } else { 0 };
        let forwarded = if self.forwarded { REQUEST_FLAG_FORWARDED } else { 0 };
        groups | session | chain | forwarded
    }
}

/// Exactly-once identity of a request (crate docs, "Messages";
/// `dafne_meta`'s replay cache): a server that has answered
/// (`client`, `seq`) before answers a retry with that first answer
/// instead of executing it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SessionSeq {
    /// The client's random id, constant across its reconnects.
    pub client: u64,
    /// This request's number in the client's sequence (a retry repeats it).
    pub seq: u64,
    /// Every request of this client below this number has had its answer
    /// received (or been given up): the server may forget their answers.
    /// `acked_below <= seq < acked_below + SEQ_WINDOW`.
    pub acked_below: u64,
}

impl SessionSeq {
    /// `client u64, seq u64, acked_below u64`, after the groups.
    fn put(&self, w: &mut Writer) {
        w.put_u64(self.client);
        w.put_u64(self.seq);
        w.put_u64(self.acked_below);
    }

    /// Refuses a sequence outside its window: `acked_below > seq` (a
    /// request its own client says was answered) or `seq` at least
    /// [`SEQ_WINDOW`] above `acked_below` (which would let one client
    /// keep unbounded answers in the server's cache).
    fn get(r: &mut Reader<'_>) -> Result<SessionSeq, DecodeError> {
        let s = SessionSeq {
            client: r.u64("session client")?,
            seq: r.u64("session seq")?,
            acked_below: r.u64("acked_below")?,
        };
        if s.acked_below > s.seq {
            return Err(DecodeError::BadValue { what: "acked_below above seq", value: s.acked_below });
        }
        if s.seq - s.acked_below >= SEQ_WINDOW {
            return Err(DecodeError::TooLong {
                what: "session window (seq - acked_below)",
                len: usize::try_from(s.seq - s.acked_below).unwrap_or(usize::MAX),
                max: SEQ_WINDOW as usize - 1,
            });
        }
        Ok(s)
    }
}

/// Up to [`MAX_GROUPS`] supplementary group ids, in the order given, or
/// [`Groups::OMITTED`]. Unused slots are always 0, so the derived
/// comparisons compare the list.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Groups {
    n: u8,
    ids: [u32; MAX_GROUPS],
    omitted: bool,
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.omitted {
            return f.write_str("omitted");
        }
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Groups {
    /// No supplementary groups.
    pub const NONE: Groups = Groups { n: 0, ids: [0; MAX_GROUPS], omitted: false };

    /// The caller's groups were not read ([`crate::REQUEST_FLAG_GROUPS_OMITTED`]):
    /// a server refuses what they could have changed (the caller asks
    /// again with them). Contains no group.
    pub const OMITTED: Groups = Groups { n: 0, ids: [0; MAX_GROUPS], omitted: true };

    /// Whether this is [`Groups::OMITTED`].
    pub fn is_omitted(&self) -> bool {
        self.omitted
    }

    /// The first [`MAX_GROUPS`] of `ids` (a caller in more groups is
    /// checked with fewer: it may be refused, never granted more).
    pub fn new(ids: &[u32]) -> Groups {
        let mut g = Groups::NONE;
        for &id in ids.iter().take(MAX_GROUPS) {
            g.ids[g.n as usize] = id;
            g.n += 1;
        }
        g
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.ids[..self.n as usize]
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn contains(&self, gid: u32) -> bool {
        self.as_slice().contains(&gid)
    }

    /// `n u8, n × u32`, written only when not empty (the header's
    /// [`REQUEST_FLAG_GROUPS`] says so).
    fn put(&self, w: &mut Writer) {
        w.put_u8(self.n);
        for &id in self.as_slice() {
            w.put_u32(id);
        }
    }

    /// The groups in front of a body whose header has
    /// [`REQUEST_FLAG_GROUPS`]: 1..=[`MAX_GROUPS`] of them (an empty list
    /// is sent as no flag, so each list has one encoding).
    fn get(r: &mut Reader<'_>) -> Result<Groups, DecodeError> {
        let n = r.u8("group count")? as usize;
        if n == 0 {
            return Err(DecodeError::BadValue { what: "group count", value: 0 });
        }
        if n > MAX_GROUPS {
            return Err(DecodeError::TooLong { what: "groups", len: n, max: MAX_GROUPS });
        }
        let mut g = Groups::NONE;
        for _ in 0..n {
            g.ids[g.n as usize] = r.u32("group")?;
            g.n += 1;
        }
        Ok(g)
    }
}

/// Defines a request header and a reply header whose op field is of the
/// given op enum: [`RequestHeader`]/[`ReplyHeader`] for [`Op`],
/// [`crate::IoRequestHeader`]/[`crate::IoReplyHeader`] for [`crate::IoOp`];
/// a request header with a flag outside the given mask is refused.
/// One definition, so the two protocols' headers cannot drift apart; a
/// header decoder refuses the other protocol's op numbers (`UnknownOp`).
macro_rules! headers {
    ($(#[$rqdoc:meta])* $req:ident, $(#[$rpdoc:meta])* $rep:ident, $op:ident, $flags:expr, $body_errno:expr) => {
        $(#[$rqdoc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(C)]
        pub struct $req {
            /// [`PROTO_VERSION`].
            pub version: u16,
            pub op: $op,
            /// 0, or [`REQUEST_FLAG_GROUPS`] (the body starts with the
            /// caller's supplementary groups) or, for metadata requests,
            /// [`crate::REQUEST_FLAG_GROUPS_OMITTED`] (they were not read),
            /// and/or [`REQUEST_FLAG_SESSION`] (then the session sequence).
            pub flags: u32,
            pub tag: u64,
            pub uid: u32,
            pub gid: u32,
            /// Bytes of body that follow the header.
            pub body_len: u32,
            /// Must be 0.
            pub reserved: u32,
        }

        const _: () = assert!(std::mem::size_of::<$req>() == $req::SIZE);

        impl $req {
            /// Encoded size.
            pub const SIZE: usize = 32;

            /// A valid header for a body of `body_len` bytes.
            pub fn new(op: $op, env: Envelope, body_len: u32) -> $req {
                $req {
                    version: PROTO_VERSION,
                    op,
                    flags: env.flags(),
                    tag: env.tag,
                    uid: env.uid,
                    gid: env.gid,
                    body_len,
                    reserved: 0,
                }
            }

            /// The caller-chosen fields of the header (the groups and the
            /// session sequence, if any, are in the body: [`decode_request`]
            /// reads them).
            pub fn envelope(&self) -> Envelope {
                Envelope::new(self.tag, self.uid, self.gid)
            }

            /// The header's bytes, fields written as they are (a header with
            /// unknown `flags` encodes, and the receiver refuses it).
            pub fn encode(&self) -> [u8; Self::SIZE] {
                let mut w = Writer::default();
                w.put_u16(self.version);
                w.put_u16(self.op.into());
                w.put_u32(self.flags);
                w.put_u64(self.tag);
                w.put_u32(self.uid);
                w.put_u32(self.gid);
                w.put_u32(self.body_len);
                w.put_u32(self.reserved);
                let mut out = [0u8; Self::SIZE];
                out.copy_from_slice(&w.into_vec());
                out
            }

            /// Decodes and checks the header at the start of `buf` (bytes
            /// after the first [`Self::SIZE`] are not looked at). A server
            /// that gets this far can answer a bad body with an error reply
            /// carrying the tag.
            pub fn decode(buf: &[u8]) -> Result<$req, DecodeError> {
                Self::read(&mut Reader::new(buf))
            }

            pub(crate) fn read(r: &mut Reader<'_>) -> Result<$req, DecodeError> {
                let mut r = Reader::new(r.take(Self::SIZE, "request header")?);
                let version = r.u16("version")?;
                if version != PROTO_VERSION {
                    return Err(DecodeError::BadVersion(version));
                }
                let raw = r.u16("op")?;
                let op = $op::from_u16(raw).ok_or(DecodeError::UnknownOp(raw))?;
                let hdr = $req {
                    version,
                    op,
                    flags: r.u32("flags")?,
                    tag: r.u64("tag")?,
                    uid: r.u32("uid")?,
                    gid: r.u32("gid")?,
                    body_len: r.u32("body_len")?,
                    reserved: r.u32("reserved")?,
                };
                if hdr.flags & !($flags) != 0 || hdr.reserved != 0 {
                    return Err(DecodeError::Reserved);
                }
                Ok(hdr)
            }
        }

        $(#[$rpdoc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(C)]
        pub struct $rep {
            /// [`PROTO_VERSION`].
            pub version: u16,
            /// The op of the request this answers.
            pub op: $op,
            /// 0 for success, else an errno in `1..=MAX_ERRNO` and an empty
            /// body.
            pub errno: i32,
            /// The request's tag.
            pub tag: u64,
            pub body_len: u32,
            /// Must be zero.
            pub reserved: [u8; 12],
        }

        const _: () = assert!(std::mem::size_of::<$rep>() == $rep::SIZE);

        impl $rep {
            /// Encoded size.
            pub const SIZE: usize = 32;

            /// A valid header; `errno` 0 for success.
            pub fn new(op: $op, tag: u64, errno: i32, body_len: u32) -> $rep {
                $rep { version: PROTO_VERSION, op, errno, tag, body_len, reserved: [0; 12] }
            }

            /// The header's bytes, fields written as they are.
            pub fn encode(&self) -> [u8; Self::SIZE] {
                let mut w = Writer::default();
                w.put_u16(self.version);
                w.put_u16(self.op.into());
                w.put_i32(self.errno);
                w.put_u64(self.tag);
                w.put_u32(self.body_len);
                w.put_raw(&self.reserved);
                let mut out = [0u8; Self::SIZE];
                out.copy_from_slice(&w.into_vec());
                out
            }

            /// Decodes and checks the header at the start of `buf` (bytes
            /// after the first [`Self::SIZE`] are not looked at).
            pub fn decode(buf: &[u8]) -> Result<$rep, DecodeError> {
                Self::read(&mut Reader::new(buf))
            }

            pub(crate) fn read(r: &mut Reader<'_>) -> Result<$rep, DecodeError> {
                let mut r = Reader::new(r.take(Self::SIZE, "reply header")?);
                let version = r.u16("version")?;
                if version != PROTO_VERSION {
                    return Err(DecodeError::BadVersion(version));
                }
                let raw = r.u16("op")?;
                let op = $op::from_u16(raw).ok_or(DecodeError::UnknownOp(raw))?;
                let hdr = $rep {
                    version,
                    op,
                    errno: r.i32("errno")?,
                    tag: r.u64("tag")?,
                    body_len: r.u32("body_len")?,
                    reserved: r.array("reserved")?,
                };
                if hdr.reserved != [0; 12] {
                    return Err(DecodeError::Reserved);
                }
                if hdr.errno != 0 {
                    get_errno(hdr.errno, "reply errno")?;
                    // The one errno whose reply has a body (an io chain
                    // refusal; none for metadata replies).
                    let body_errno: Option<Errno> = $body_errno;
                    if hdr.body_len != 0 && body_errno.is_none_or(|e| e.0 != hdr.errno) {
                        return Err(DecodeError::BadValue {
                            what: "body_len of an error reply (must be 0)",
                            value: hdr.body_len.into(),
                        });
                    }
                }
                Ok(hdr)
            }
        }

        impl Framed for $req {
            type Op = $op;
            const SIZE: usize = <$req>::SIZE;
            fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                <$req>::read(r)
            }
            fn body_len(&self) -> u32 {
                self.body_len
            }
        }

        impl RequestFrame for $req {
            fn flags(&self) -> u32 {
                self.flags
            }
            fn make(op: $op, env: Envelope, body_len: u32) -> Self {
                <$req>::new(op, env, body_len)
            }
            fn bytes(&self) -> [u8; 32] {
                self.encode()
            }
            fn op(&self) -> $op {
                self.op
            }
            fn envelope(&self) -> Envelope {
                <$req>::envelope(self)
            }
        }

        impl Framed for $rep {
            type Op = $op;
            const SIZE: usize = <$rep>::SIZE;
            fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                <$rep>::read(r)
            }
            fn body_len(&self) -> u32 {
                self.body_len
            }
        }

        impl ReplyFrame for $rep {
            fn make(op: $op, tag: u64, errno: i32, body_len: u32) -> Self {
                <$rep>::new(op, tag, errno, body_len)
            }
            fn bytes(&self) -> [u8; 32] {
                self.encode()
            }
            fn parts(&self) -> (u64, $op, i32) {
                (self.tag, self.op, self.errno)
            }
        }
    };
}

headers! {
    /// The 32-byte header in front of every metadata request body. Its
    /// fields are in wire order and `#[repr(C)]` without padding (asserted
    /// below), so the struct is the byte layout of the crate docs.
    RequestHeader,
    /// The 32-byte header in front of every metadata reply body,
    /// `#[repr(C)]` in wire order like [`RequestHeader`].
    ReplyHeader,
    Op,
    REQUEST_FLAG_GROUPS | REQUEST_FLAG_SESSION | REQUEST_FLAG_GROUPS_OMITTED,
    None
}

headers! {
    /// The 32-byte header in front of every io request body: the layout of
    /// [`RequestHeader`], with an [`IoOp`] (crate docs, "Op numbers").
    IoRequestHeader,
    /// The 32-byte header in front of every io reply body: the layout of
    /// [`ReplyHeader`], with an [`IoOp`].
    IoReplyHeader,
    IoOp,
    // Io requests are repeatable (a write of the same bytes, a read):
    // no session sequence. Data requests carry their chain.
    REQUEST_FLAG_GROUPS | REQUEST_FLAG_CHAIN | REQUEST_FLAG_FORWARDED,
    Some(crate::io::CHAIN_REFUSED)
}

pub(crate) fn body_len(total: usize, header: usize) -> u32 {
    u32::try_from(total - header).expect("a message body above u32::MAX bytes")
}

/// A 32-byte header of either protocol.
pub(crate) trait Framed: Sized {
    type Op: Copy + std::fmt::Display;
    const SIZE: usize;
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
    fn body_len(&self) -> u32;
}

pub(crate) trait RequestFrame: Framed {
    fn flags(&self) -> u32;
    fn make(op: Self::Op, env: Envelope, body_len: u32) -> Self;
    fn bytes(&self) -> [u8; 32];
    fn op(&self) -> Self::Op;
    fn envelope(&self) -> Envelope;
}

pub(crate) trait ReplyFrame: Framed {
    fn make(op: Self::Op, tag: u64, errno: i32, body_len: u32) -> Self;
    fn bytes(&self) -> [u8; 32];
    fn parts(&self) -> (u64, Self::Op, i32);
}

/// A request body of either protocol.
pub(crate) trait RequestBody: Sized {
    type Op;
    fn op(&self) -> Self::Op;
    fn put_body(&self, w: &mut Writer);
    fn get_body(op: Self::Op, r: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

/// A successful reply body of either protocol.
pub(crate) trait ReplyBody: Sized + std::fmt::Debug {
    type Op;
    fn answers(&self, op: Self::Op) -> bool;
    fn put_body(&self, w: &mut Writer);
    fn get_body(op: Self::Op, r: &mut Reader<'_>) -> Result<Self, DecodeError>;
    /// The errno this answer travels under (0: a success); a non-zero one
    /// is the header's `$body_errno` and its body follows.
    fn errno(&self) -> i32 {
        0
    }
    /// The body of a reply whose header carries `errno`, for the one errno
    /// that has a body (`None`: a plain error, no body).
    fn get_errno_body(_op: Self::Op, _errno: i32, _r: &mut Reader<'_>) -> Result<Option<Self>, DecodeError> {
        Ok(None)
    }
}

/// Header + body of a request (`H` and `B` of the same protocol).
pub(crate) fn encode_req<H: RequestFrame, B: RequestBody<Op = H::Op>>(env: Envelope, req: &B) -> Vec<u8> {
    let mut w = Writer::with_prefix(H::SIZE);
    if !env.groups.is_empty() {
        env.groups.put(&mut w);
    }
    if let Some(s) = &env.session {
        s.put(&mut w);
    }
    if let Some(c) = &env.chain {
        w.put_u32(c.chain);
        w.put_u64(c.version);
    }
    req.put_body(&mut w);
    let mut buf = w.into_vec();
    let hdr = H::make(req.op(), env, body_len(buf.len(), H::SIZE));
    buf[..H::SIZE].copy_from_slice(&hdr.bytes());
    buf
}

/// A whole request: header, a body of exactly `body_len` bytes, nothing else.
pub(crate) fn decode_req<H: RequestFrame, B: RequestBody<Op = H::Op>>(
    buf: &[u8],
) -> Result<(Envelope, B), DecodeError> {
    let mut r = Reader::new(buf);
    let hdr = H::read(&mut r)?;
    check_body_len(hdr.body_len(), r.left())?;
    let mut env = hdr.envelope();
    if hdr.flags() & REQUEST_FLAG_GROUPS != 0 {
        if hdr.flags() & REQUEST_FLAG_GROUPS_OMITTED != 0 {
            // Groups sent and said omitted: one of the two lies.
            return Err(DecodeError::BadValue {
                what: "flags (groups both sent and omitted)",
                value: hdr.flags() as u64,
            });
        }
        env.groups = Groups::get(&mut r)?;
    } else if hdr.flags() & REQUEST_FLAG_GROUPS_OMITTED != 0 {
        env.groups = Groups::OMITTED;
    }
    if hdr.flags() & REQUEST_FLAG_SESSION != 0 {
        env.session = Some(SessionSeq::get(&mut r)?);
    }
    if hdr.flags() & REQUEST_FLAG_CHAIN != 0 {
        let chain = r.u32("request chain id")?;
        if chain as usize >= MAX_CHAINS {
            return Err(DecodeError::BadValue { what: "request chain id (below MAX_CHAINS)", value: chain.into() });
        }
        env.chain = Some(ChainVersion { chain, version: r.u64("request chain version")? });
    }
    env.forwarded = hdr.flags() & REQUEST_FLAG_FORWARDED != 0;
    let req = B::get_body(hdr.op(), &mut r)?;
    r.finish()?;
    Ok((env, req))
}

/// The reply to request `tag` of `op`: the body of `Ok`, or the errno and
/// no body.
///
/// # Panics
/// If the result is not a well-formed answer to `op` or its errno is
/// outside `1..=MAX_ERRNO`: the server built a reply its client could not
/// decode.
pub(crate) fn encode_rep<H: ReplyFrame, A: ReplyBody<Op = H::Op>>(
    tag: u64,
    op: H::Op,
    result: &Result<A, Errno>,
) -> Vec<u8> {
    let mut w = Writer::with_prefix(H::SIZE);
    let errno = match result {
        Ok(resp) => {
            assert!(resp.answers(op), "not a well-formed answer to {op}: {resp:?}");
            resp.put_body(&mut w);
            resp.errno()
        }
        Err(e) => {
            assert!(e.is_valid(), "errno {} cannot travel in a reply", e.0);
            e.0
        }
    };
    let mut buf = w.into_vec();
    let hdr = H::make(op, tag, errno, body_len(buf.len(), H::SIZE));
    buf[..H::SIZE].copy_from_slice(&hdr.bytes());
    buf
}

/// A whole reply into (tag, op, result); the body is read as the answer to `op`.
#[allow(clippy::type_complexity)]
pub(crate) fn decode_rep<H: ReplyFrame, A: ReplyBody<Op = H::Op>>(
    buf: &[u8],
) -> Result<(u64, H::Op, Result<A, Errno>), DecodeError> {
    let mut r = Reader::new(buf);
    let hdr = H::read(&mut r)?;
    check_body_len(hdr.body_len(), r.left())?;
    let (tag, op, errno) = hdr.parts();
    if errno != 0 {
        // The header check made it a valid errno, with an empty body but
        // for the protocol's one errno that has one.
        if let Some(resp) = A::get_errno_body(op, errno, &mut r)? {
            r.finish()?;
            return Ok((tag, op, Ok(resp)));
        }
        r.finish()?;
        return Ok((tag, op, Err(get_errno(errno, "reply errno")?)));
    }
    let resp = A::get_body(op, &mut r)?;
    r.finish()?;
    Ok((tag, op, Ok(resp)))
}

/// The bytes of a request: header with `env` and `req.op()`, then the body.
/// Limits are not checked here (the receiver checks them).
///
/// # Panics
/// If the body exceeds 4 GiB.
pub fn encode_request(env: Envelope, req: &Request) -> Vec<u8> {
    encode_req::<RequestHeader, _>(env, req)
}

/// Decodes a whole request message: header, a body of exactly `body_len`
/// bytes, and nothing else.
pub fn decode_request(buf: &[u8]) -> Result<(Envelope, Request), DecodeError> {
    decode_req::<RequestHeader, _>(buf)
}

/// The bytes of the reply to request `tag` of `op`: on success the body of
/// `Ok`, on failure the errno and no body.
///
/// # Panics
/// If the result is not a well-formed answer to `op` (see
/// [`Response::answers`]) or its errno is outside `1..=MAX_ERRNO`: the
/// server built a reply its client could not decode.
pub fn encode_reply(tag: u64, op: Op, result: &Result<Response, Errno>) -> Vec<u8> {
    encode_rep::<ReplyHeader, _>(tag, op, result)
}

/// Decodes a whole reply message into (tag, op, result); the body is read as
/// the answer to `op`.
pub fn decode_reply(buf: &[u8]) -> Result<(u64, Op, Result<Response, Errno>), DecodeError> {
    decode_rep::<ReplyHeader, _>(buf)
}

pub(crate) fn check_body_len(announced: u32, actual: usize) -> Result<(), DecodeError> {
    if announced as usize != actual {
        return Err(DecodeError::BodyLength { announced, actual });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Kind;
    use crate::types::tests::attr;
    use crate::*;

    const ENV: Envelope = Envelope::new(0x1122_3344_5566_7788, 1000, 100);

    fn cap() -> Capability {
        crate::types::sample_capability()
    }

    /// One request of every op (Compound with chaining).
    fn requests() -> Vec<Request> {
        let n = |s: &str| s.as_bytes().to_vec();
        vec![
            Request::ServerHeartbeat(crate::Heartbeat {
                server: 2,
                instance: 0xfeed,
                addr: "[fe80::1%3]:7002".parse().unwrap(),
                host: "node-1.example.org".into(),
                capacity_bytes: 1 << 40,
                used_bytes: 1 << 20,
            }),
            Request::Members,
            Request::SessionOpen {
                client_name: "host-1/pid 42 ✓".into(),
                nonce: [1; 16],
                mac: [2; 32],
                credential: None,
            },
            Request::SessionOpen {
                client_name: "c".into(),
                nonce: [1; 16],
                mac: [2; 32],
                credential: Some(crate::Credential {
                    name: "alice ✓".into(),
                    uids: vec![crate::IdRange { first: 1000, last: 1999 }, crate::IdRange { first: 7, last: 7 }],
                    gids: vec![crate::IdRange { first: 0, last: u32::MAX }],
                    root: false,
                }),
            },
            Request::RevokeCredential { name: "alice ✓".into() },
            Request::Lookup { parent: ROOT_INO, name: n("etc") },
            Request::GetAttr { ino: 5 },
            Request::SetAttr {
                ino: 5,
                set: SetAttr { size: Some(0), mtime: Some(TimeSet::Now), ..SetAttr::default() },
            },
            Request::Create {
                parent: 2,
                name: n("f"),
                mode: 0o644,
                exclusive: true,
                hint: Some(LayoutHint { stripe_unit: 1 << 20, stripe_count: 4 }),
            },
            Request::Mkdir { parent: 2, name: vec![0xff, 0xfe], mode: 0o1777 },
            Request::Mknod { parent: 2, name: n("fifo"), kind: FileType::Fifo, mode: 0o644, rdev: 0 },
            Request::Mknod { parent: 2, name: n("sda"), kind: FileType::BlockDevice, mode: 0o660, rdev: 0x0800 },
            Request::Readdir { ino: 2, cookie: 9, max_entries: 100 },
            Request::Unlink { parent: 2, name: n("f") },
            Request::Rmdir { parent: 2, name: n("d") },
            Request::Rename { src_parent: 2, src_name: n("a"), dst_parent: 3, dst_name: n("b"), flags: 0 },
            Request::Rename {
                src_parent: 2,
                src_name: n("a"),
                dst_parent: 3,
                dst_name: n("b"),
                flags: RENAME_NOREPLACE,
            },
            Request::Rename {
                src_parent: 2,
                src_name: n("a"),
                dst_parent: 2,
                dst_name: n("b"),
                flags: RENAME_EXCHANGE,
            },
            Request::SetXattr { ino: 8, name: n("user.k"), value: vec![0, 1, 2], flags: XATTR_CREATE },
            Request::SetXattr { ino: 8, name: n("trusted.k"), value: vec![7; XATTR_SIZE_MAX], flags: XATTR_REPLACE },
            Request::GetXattr { ino: 8, name: n("security.k") },
            Request::ListXattr { ino: 8 },
            Request::RemoveXattr { ino: 8, name: vec![b'x'; MAX_NAME_WIRE] },
            Request::Symlink { parent: 2, name: n("l"), target: vec![b'x'; MAX_SYMLINK] },
            Request::Readlink { ino: 8 },
            Request::Link { ino: 8, new_parent: 2, new_name: vec![b'n'; MAX_NAME_WIRE] },
            Request::Statfs,
            Request::Open { ino: 8, flags: OPEN_READ | OPEN_WRITE | OPEN_TRUNC },
            Request::ListOrphans { older_than_s: 60, max: MAX_ORPHANS as u32 },
            Request::ForgetOrphans { objects: vec![3, u64::MAX] },
            Request::Close { object_id: 77 },
            Request::Recap { cap: cap() },
            Request::Revocations { instance: 3, since: u64::MAX },
            Request::Lock {
                ino: 8,
                client: 0xfeed,
                owner: 7,
                pid: 4242,
                start: 10,
                end: u64::MAX,
                kind: crate::LockKind::Write,
                flags: crate::LOCK_WAIT,
            },
            Request::TestLock { ino: 8, client: 1, owner: 2, start: 0, end: 0, kind: crate::LockKind::Read },
            Request::Watch { since: 7 },
            Request::Reopen {
                held: vec![
                    crate::HeldOpen { object_id: 3, count: 1 },
                    crate::HeldOpen { object_id: 77, count: u32::MAX },
                ],
            },
            Request::Compound {
                ops: vec![
                    CompoundOp { chain: false, req: Request::Lookup { parent: 1, name: n("a") } },
                    CompoundOp { chain: true, req: Request::Lookup { parent: 0, name: n("b") } },
                    CompoundOp { chain: true, req: Request::Open { ino: 0, flags: 1 } },
                    CompoundOp { chain: false, req: Request::Statfs },
                    CompoundOp {
                        chain: true,
                        req: Request::Mknod {
                            parent: 0,
                            name: n("tty"),
                            kind: FileType::CharDevice,
                            mode: 0o620,
                            rdev: 0x0401,
                        },
                    },
                ],
            },
        ]
    }

    /// One response of every variant, with the op it answers.
    fn responses() -> Vec<(Op, Response)> {
        let a = attr();
        let entry = |name: &str, cookie| DirEntry {
            name: name.as_bytes().to_vec(),
            ino: cookie + 10,
            kind: FileType::Directory,
            cookie,
        };
        vec![
            (Op::SessionOpen, Response::Session { session_id: 3, root: ROOT_INO }),
            (Op::Lookup, Response::Entry { attr: a }),
            (Op::SetAttr, Response::Attr { attr: a }),
            (Op::Readdir, Response::Dir { entries: vec![entry(".", 1), entry("..", 2), entry("x", 3)], eof: true }),
            (Op::Rename, Response::Done),
            (Op::Readlink, Response::Link { target: b"/a/b".to_vec() }),
            (
                Op::Statfs,
                Response::StatFs(StatFs {
                    blocks: 10,
                    bfree: 5,
                    bavail: 4,
                    files: 100,
                    ffree: 50,
                    bsize: 4096,
                    namelen: NAME_MAX as u32,
                }),
            ),
            (
                Op::Open,
                Response::Opened {
                    attr: a,
                    layout: Layout { object_id: 77, stripe_unit: 1 << 20, stripe_count: 2, servers: vec![0, 1] },
                    cap: cap(),
                },
            ),
            (
                Op::ListOrphans,
                Response::Orphans {
                    orphans: vec![
                        crate::Orphan { object_id: 9, servers: vec![0, 1, 2] },
                        crate::Orphan { object_id: 10, servers: vec![] },
                    ],
                    generation: 12,
                },
            ),
            (Op::ForgetOrphans, Response::Done),
            (Op::Close, Response::Done),
            (Op::Reopen, Response::Done),
            (Op::Recap, Response::Cap { cap: cap() }),
            (Op::Lock, Response::Done),
            (Op::TestLock, Response::LockTest { conflict: None }),
            (
                Op::Watch,
                Response::Changes {
                    next: 9,
                    lost: false,
                    changes: vec![
                        crate::Change { ino: 5, parent: 0, name: vec![] },
                        crate::Change { ino: 0, parent: 1, name: b"gone".to_vec() },
                    ],
                },
            ),
            (
                Op::TestLock,
                Response::LockTest {
                    conflict: Some(crate::LockHolder { start: 5, end: 9, kind: crate::LockKind::Write, pid: 0 }),
                },
            ),
            (Op::SetXattr, Response::Done),
            (Op::RemoveXattr, Response::Done),
            (
                Op::ServerHeartbeat,
                Response::Heartbeat {
                    chains: vec![
                        crate::ChainVersion { chain: 0, version: 3 },
                        crate::ChainVersion { chain: 4, version: 9 },
                    ],
                    routes: vec![
                        crate::ChainRoute {
                            chain: 0,
                            head: true,
                            successor: Some(crate::Successor {
                                server: 4,
                                addr: Some("127.0.0.1:7001".parse().unwrap()),
                            }),
                        },
                        crate::ChainRoute {
                            chain: 4,
                            head: false,
                            successor: Some(crate::Successor { server: 1, addr: None }),
                        },
                    ],
                },
            ),
            (
                Op::Members,
                Response::Members {
                    members: vec![
                        crate::Member {
                            server: 0,
                            state: crate::MemberState::Up,
                            addr: "10.0.0.2:7000".parse().unwrap(),
                            host: "b".into(),
                            since_ms: 400,
                            restarts: 1,
                            capacity_bytes: 1 << 40,
                            used_bytes: 5,
                        },
                        crate::Member {
                            server: 3,
                            state: crate::MemberState::Unknown,
                            addr: "0.0.0.0:0".parse().unwrap(),
                            host: String::new(),
                            since_ms: 0,
                            restarts: 0,
                            capacity_bytes: 0,
                            used_bytes: 0,
                        },
                    ],
                    chains: vec![crate::Chain {
                        id: 0,
                        version: 2,
                        replicas: vec![
                            crate::Replica { server: 0, state: crate::ReplicaState::Serving },
                            crate::Replica { server: 3, state: crate::ReplicaState::Syncing },
                        ],
                    }],
                },
            ),
            (Op::GetXattr, Response::Xattr { value: vec![0xff; XATTR_SIZE_MAX] }),
            (Op::GetXattr, Response::Xattr { value: vec![] }),
            (
                Op::ListXattr,
                Response::XattrNames { names: vec![b"user.a".to_vec(), vec![b't'; XATTR_NAME_MAX], vec![]] },
            ),
            (
                Op::Revocations,
                Response::Revocations(crate::Revocations {
                    instance: 1,
                    from_seq: 2,
                    to_seq: 3,
                    reset_floor: 4,
                    entries: vec![crate::Revocation { object_id: 5, floor: 6 }],
                    mac: [7; 32],
                }),
            ),
            (
                Op::Compound,
                Response::Compound {
                    results: vec![Ok(Response::Entry { attr: a }), Ok(Response::Done), Err(Errno::ENOENT)],
                },
            ),
        ]
    }

    #[test]
    fn every_request_round_trips() {
        let reqs = requests();
        for op in Op::ALL {
            assert!(reqs.iter().any(|r| r.op() == *op), "no sample of {op}");
        }
        for req in reqs {
            let b = encode_request(ENV, &req);
            let hdr = RequestHeader::decode(&b).unwrap();
            assert_eq!(b.len(), RequestHeader::SIZE + hdr.body_len as usize);
            assert_eq!(decode_request(&b), Ok((ENV, req.clone())), "{req:?}");
        }
    }

    #[test]
    fn every_response_round_trips() {
        for (op, resp) in responses() {
            assert!(resp.answers(op));
            let b = encode_reply(7, op, &Ok(resp.clone()));
            assert_eq!(decode_reply(&b), Ok((7, op, Ok(resp))));
        }
        // Every op's answer has a sample variant.
        for op in Op::ALL {
            assert!(responses().iter().any(|(_, r)| Kind::answering(*op) == r.kind()), "{op}");
        }
        let b = encode_reply(8, Op::Mkdir, &Err(Errno::EEXIST));
        assert_eq!(b.len(), ReplyHeader::SIZE);
        assert_eq!(decode_reply(&b), Ok((8, Op::Mkdir, Err(Errno::EEXIST))));
    }

    /// Past their limits, or with unknown flag bits, the xattr and rename
    /// bodies are refused; the xattr ops and their answers never travel in
    /// a Compound.
    #[test]
    fn xattr_and_rename_bodies_are_bounded() {
        let n = |s: &str| s.as_bytes().to_vec();
        let refused = |req: Request| {
            let b = encode_request(ENV, &req);
            assert!(decode_request(&b).is_err(), "accepted {:?}", req.op());
        };
        refused(Request::SetXattr { ino: 1, name: n("user.a"), value: vec![0; XATTR_SIZE_MAX + 1], flags: 0 });
        refused(Request::SetXattr { ino: 1, name: vec![b'a'; MAX_NAME_WIRE + 1], value: vec![], flags: 0 });
        refused(Request::SetXattr { ino: 1, name: n("user.a"), value: vec![], flags: 4 });
        refused(Request::GetXattr { ino: 1, name: vec![b'a'; MAX_NAME_WIRE + 1] });
        refused(Request::Rename { src_parent: 1, src_name: n("a"), dst_parent: 1, dst_name: n("b"), flags: 4 });
        // Both rename bits decode: the server answers EINVAL, as Linux.
        let both = Request::Rename {
            src_parent: 1,
            src_name: n("a"),
            dst_parent: 1,
            dst_name: n("b"),
            flags: RENAME_NOREPLACE | RENAME_EXCHANGE,
        };
        assert_eq!(decode_request(&encode_request(ENV, &both)), Ok((ENV, both)));
        for req in [
            Request::SetXattr { ino: 1, name: n("user.a"), value: vec![], flags: 0 },
            Request::GetXattr { ino: 1, name: n("user.a") },
            Request::ListXattr { ino: 1 },
            Request::RemoveXattr { ino: 1, name: n("user.a") },
        ] {
            refused(Request::Compound { ops: vec![CompoundOp { chain: false, req }] });
        }
        let refused_reply = |op: Op, resp: Response| {
            let b = encode_reply(3, op, &Ok(resp));
            assert!(decode_reply(&b).is_err(), "accepted an answer to {op}");
        };
        refused_reply(Op::GetXattr, Response::Xattr { value: vec![0; XATTR_SIZE_MAX + 1] });
        refused_reply(Op::ListXattr, Response::XattrNames { names: vec![vec![b'n'; XATTR_NAME_MAX + 1]] });
        refused_reply(Op::ListXattr, Response::XattrNames { names: vec![vec![]; MAX_XATTR_NAMES + 1] });
        for (kind, op, r) in [
            (13u8, Op::GetXattr, Response::Xattr { value: vec![1] }),
            (14, Op::ListXattr, Response::XattrNames { names: vec![] }),
        ] {
            let alone = encode_reply(3, op, &Ok(r.clone()));
            assert!(!Response::Compound { results: vec![Ok(r)] }.answers(Op::Compound));
            // A Compound reply of one result: errno 0, the kind, the body.
            let mut body = 1u32.to_le_bytes().to_vec();
            body.extend_from_slice(&0i32.to_le_bytes());
            body.push(kind);
            body.extend_from_slice(&alone[ReplyHeader::SIZE..]);
            let mut b = ReplyHeader::new(Op::Compound, 3, 0, body.len() as u32).encode().to_vec();
            b.extend_from_slice(&body);
            assert!(decode_reply(&b).is_err(), "kind {kind} accepted in a Compound");
        }
    }

    #[test]
    fn header_layout_is_the_documented_one() {
        let b = RequestHeader::new(Op::Rename, ENV, 0x0a0b_0c0d).encode();
        assert_eq!(&b[0..2], &PROTO_VERSION.to_le_bytes());
        assert_eq!(&b[2..4], &10u16.to_le_bytes());
        assert_eq!(&b[4..8], &[0; 4]);
        assert_eq!(&b[8..16], &ENV.tag.to_le_bytes());
        assert_eq!(&b[16..20], &ENV.uid.to_le_bytes());
        assert_eq!(&b[20..24], &ENV.gid.to_le_bytes());
        assert_eq!(&b[24..28], &0x0a0b_0c0du32.to_le_bytes());
        assert_eq!(&b[28..32], &[0; 4]);
        let b = ReplyHeader::new(Op::Open, 5, 2, 0).encode();
        assert_eq!(&b[0..2], &PROTO_VERSION.to_le_bytes());
        assert_eq!(&b[2..4], &15u16.to_le_bytes());
        assert_eq!(&b[4..8], &2i32.to_le_bytes());
        assert_eq!(&b[8..16], &5u64.to_le_bytes());
        assert_eq!(&b[16..20], &[0; 4]);
        assert_eq!(&b[20..32], &[0; 12]);
    }

    fn lookup() -> Vec<u8> {
        encode_request(ENV, &Request::Lookup { parent: 1, name: b"abc".to_vec() })
    }

    fn set(b: &mut [u8], at: usize, v: &[u8]) {
        b[at..at + v.len()].copy_from_slice(v);
    }

    /// Groups not read travel as a flag alone (no prefix); a header that
    /// both carries groups and says them omitted is refused.
    #[test]
    fn omitted_groups_travel_as_a_flag_and_cannot_come_with_groups() {
        let env = Envelope { groups: Groups::OMITTED, ..ENV };
        let req = Request::GetAttr { ino: 9 };
        let b = encode_request(env, &req);
        assert_eq!((b.len(), b[4]), (40, REQUEST_FLAG_GROUPS_OMITTED as u8));
        let (got, _) = decode_request(&b).unwrap();
        assert!(got.groups.is_omitted() && got.groups.is_empty() && !got.groups.contains(0));
        assert_eq!(got, env);
        let with = encode_request(Envelope { groups: Groups::new(&[5]), ..ENV }, &req);
        let mut both = with.clone();
        both[4] |= REQUEST_FLAG_GROUPS_OMITTED as u8;
        assert!(matches!(decode_request(&both), Err(DecodeError::BadValue { .. })), "{:?}", decode_request(&both));
    }

    #[test]
    fn supplementary_groups_travel_and_hostile_counts_are_refused() {
        let ids: Vec<u32> = (100..140).collect();
        let env = Envelope { groups: Groups::new(&ids), ..ENV };
        assert_eq!(env.groups.as_slice(), &ids[..MAX_GROUPS], "the first MAX_GROUPS are kept");
        let req = Request::GetAttr { ino: 9 };
        let b = encode_request(env, &req);
        assert_eq!(b.len(), 32 + 1 + 4 * MAX_GROUPS + 8);
        assert_eq!(b[4], REQUEST_FLAG_GROUPS as u8);
        assert_eq!(decode_request(&b), Ok((env, req.clone())));
        assert!(env.groups.contains(131) && !env.groups.contains(132) && !env.groups.contains(99));
        // No groups: no flag, no prefix, the bytes of before.
        let plain = encode_request(ENV, &req);
        assert_eq!((plain.len(), plain[4]), (40, 0));
        // The flag with a count of 0, or above MAX_GROUPS, or more groups
        // announced than bytes follow.
        let with = |count: u8, groups: u32| {
            let mut body = vec![count];
            for g in 0..groups {
                body.extend_from_slice(&(1000 + g).to_le_bytes());
            }
            body.extend_from_slice(&9u64.to_le_bytes());
            let mut b = RequestHeader::new(Op::GetAttr, ENV, body.len() as u32).encode().to_vec();
            b[4] = REQUEST_FLAG_GROUPS as u8;
            b.extend_from_slice(&body);
            b
        };
        assert!(decode_request(&with(3, 3)).is_ok());
        assert_eq!(decode_request(&with(0, 0)), Err(DecodeError::BadValue { what: "group count", value: 0 }));
        assert_eq!(
            decode_request(&with(33, 33)),
            Err(DecodeError::TooLong { what: "groups", len: 33, max: MAX_GROUPS })
        );
        assert_eq!(
            decode_request(&with(255, 0)),
            Err(DecodeError::TooLong { what: "groups", len: 255, max: MAX_GROUPS })
        );
        // 4 groups announced, 3 sent: the op body's bytes are read as the
        // fourth group and the ino comes up short.
        assert!(matches!(decode_request(&with(4, 3)), Err(DecodeError::Truncated { .. })));
        // Every truncation of a message with groups is refused, none panics.
        for n in 0..b.len() {
            assert!(decode_request(&b[..n]).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn the_session_sequence_travels_after_the_groups_and_its_window_is_checked() {
        let seq = SessionSeq { client: 0x00c1_1e47, seq: 4200, acked_below: 4100 };
        let env = Envelope { groups: Groups::new(&[7, 8]), session: Some(seq), ..ENV };
        let req = Request::Unlink { parent: 1, name: b"f".to_vec() };
        let b = encode_request(env, &req);
        assert_eq!(b[4], (REQUEST_FLAG_GROUPS | REQUEST_FLAG_SESSION) as u8);
        // Groups (1 + 2 × 4), then client, seq, acked_below.
        assert_eq!(&b[32 + 9..32 + 17], &0x00c1_1e47_u64.to_le_bytes());
        assert_eq!(&b[32 + 17..32 + 25], &4200u64.to_le_bytes());
        assert_eq!(&b[32 + 25..32 + 33], &4100u64.to_le_bytes());
        assert_eq!(decode_request(&b), Ok((env, req.clone())));
        // Without groups the sequence comes first.
        let alone = Envelope { session: Some(seq), ..ENV };
        let b2 = encode_request(alone, &req);
        assert_eq!((b2[4], b2.len()), (REQUEST_FLAG_SESSION as u8, encode_request(ENV, &req).len() + 24));
        assert_eq!(decode_request(&b2), Ok((alone, req.clone())));
        // Outside the window: acked_below above seq, or seq too far ahead.
        let with = |seq: u64, acked_below: u64| {
            encode_request(Envelope { session: Some(SessionSeq { client: 1, seq, acked_below }), ..ENV }, &req)
        };
        assert!(decode_request(&with(SEQ_WINDOW - 1, 0)).is_ok());
        assert!(decode_request(&with(u64::MAX, u64::MAX - (SEQ_WINDOW - 1))).is_ok());
        assert_eq!(decode_request(&with(5, 6)), Err(DecodeError::BadValue { what: "acked_below above seq", value: 6 }));
        assert!(matches!(
            decode_request(&with(SEQ_WINDOW, 0)),
            Err(DecodeError::TooLong { what: "session window (seq - acked_below)", .. })
        ));
        assert!(matches!(decode_request(&with(u64::MAX, 0)), Err(DecodeError::TooLong { .. })));
        // A fourth flag bit is still refused; every truncation too.
        let mut b3 = b2.clone();
        b3[4] |= 8;
        assert_eq!(decode_request(&b3), Err(DecodeError::Reserved));
        for n in 0..b.len() {
            assert!(decode_request(&b[..n]).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn request_header_corruption_is_caught() {
        let good = lookup();
        let mut b = good.clone();
        set(&mut b, 0, &(PROTO_VERSION + 1).to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::BadVersion(PROTO_VERSION + 1)));
        let mut b = good.clone();
        set(&mut b, 2, &63u16.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::UnknownOp(63)));
        let mut b = good.clone();
        set(&mut b, 2, &0u16.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::UnknownOp(0)));
        let mut b = good.clone();
        b[4] = 8;
        assert_eq!(decode_request(&b), Err(DecodeError::Reserved));
        let mut b = good.clone();
        b[7] = 0x80;
        assert_eq!(decode_request(&b), Err(DecodeError::Reserved));
        let mut b = good.clone();
        b[31] = 0x80;
        assert_eq!(decode_request(&b), Err(DecodeError::Reserved));
        let mut b = good.clone();
        set(&mut b, 24, &100u32.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::BodyLength { announced: 100, actual: 15 }));
        assert_eq!(
            decode_request(&good[..31]),
            Err(DecodeError::Truncated { what: "request header", needed: 32, left: 31 })
        );
        // A body cut short, with a header that agrees.
        let mut b = good[..good.len() - 1].to_vec();
        set(&mut b, 24, &14u32.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::Truncated { what: "name", needed: 3, left: 2 }));
        // Extra bytes the header counts but the body does not use.
        let mut b = good.clone();
        b.push(0);
        set(&mut b, 24, &16u32.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::Trailing(1)));
        // The header alone decodes for a server that must reply.
        let hdr = RequestHeader::decode(&good).unwrap();
        assert_eq!((hdr.op, hdr.envelope(), hdr.body_len), (Op::Lookup, ENV, 15));
    }

    #[test]
    fn reply_header_corruption_is_caught() {
        let good = encode_reply(3, Op::Rmdir, &Ok(Response::Done));
        let mut b = good.clone();
        set(&mut b, 0, &0u16.to_le_bytes());
        assert_eq!(decode_reply(&b), Err(DecodeError::BadVersion(0)));
        let mut b = good.clone();
        set(&mut b, 2, &999u16.to_le_bytes());
        assert_eq!(decode_reply(&b), Err(DecodeError::UnknownOp(999)));
        let mut b = good.clone();
        b[20] = 1;
        assert_eq!(decode_reply(&b), Err(DecodeError::Reserved));
        let mut b = good.clone();
        set(&mut b, 4, &(-5i32).to_le_bytes());
        assert!(matches!(decode_reply(&b), Err(DecodeError::BadValue { what: "reply errno", .. })));
        let mut b = good.clone();
        set(&mut b, 4, &(MAX_ERRNO + 1).to_le_bytes());
        assert!(matches!(decode_reply(&b), Err(DecodeError::BadValue { value: 4096, .. })));
        // An error reply with a body.
        let mut b = encode_reply(3, Op::Rmdir, &Err(Errno::ENOTEMPTY));
        set(&mut b, 16, &1u32.to_le_bytes());
        b.push(0);
        assert!(matches!(decode_reply(&b), Err(DecodeError::BadValue { value: 1, .. })));
        let mut b = good.clone();
        b.push(0);
        assert_eq!(decode_reply(&b), Err(DecodeError::BodyLength { announced: 0, actual: 1 }));
        // Done with a byte of body the header counts.
        set(&mut b, 16, &1u32.to_le_bytes());
        assert_eq!(decode_reply(&b), Err(DecodeError::Trailing(1)));
        assert!(matches!(decode_reply(&good[..0]), Err(DecodeError::Truncated { left: 0, .. })));
    }

    /// A request whose body is `body`, with a header that agrees.
    fn raw_request(op: Op, body: &[u8]) -> Vec<u8> {
        let mut b = RequestHeader::new(op, ENV, body.len() as u32).encode().to_vec();
        b.extend_from_slice(body);
        b
    }

    fn raw_reply(op: Op, body: &[u8]) -> Vec<u8> {
        let mut b = ReplyHeader::new(op, 1, 0, body.len() as u32).encode().to_vec();
        b.extend_from_slice(body);
        b
    }

    fn le32(v: u32) -> [u8; 4] {
        v.to_le_bytes()
    }

    #[test]
    fn body_limits_are_enforced() {
        // Name one byte over the wire limit.
        let mut body = 1u64.to_le_bytes().to_vec();
        body.extend_from_slice(&le32(MAX_NAME_WIRE as u32 + 1));
        assert_eq!(
            decode_request(&raw_request(Op::Lookup, &body)),
            Err(DecodeError::TooLong { what: "name", len: 1025, max: 1024 })
        );
        // A huge count allocates nothing.
        let body = le32(u32::MAX);
        assert!(matches!(
            decode_request(&raw_request(Op::Compound, &body)),
            Err(DecodeError::TooLong { what: "compound ops", .. })
        ));
        assert!(matches!(
            decode_reply(&raw_reply(Op::Readdir, &body)),
            Err(DecodeError::TooLong { what: "readdir entries", max: 4096, .. })
        ));
        // 4096 entries promised, 21 bytes each needed, none there.
        assert_eq!(
            decode_reply(&raw_reply(Op::Readdir, &le32(4096))),
            Err(DecodeError::Truncated { what: "readdir entries", needed: 4096 * 21, left: 0 })
        );
        let mut body = le32(MAX_CLIENT_NAME as u32 + 1).to_vec();
        body.extend_from_slice(&[b'a'; MAX_CLIENT_NAME + 1 + 48]);
        assert!(matches!(
            decode_request(&raw_request(Op::SessionOpen, &body)),
            Err(DecodeError::TooLong { max: 256, .. })
        ));
        let mut body = 1u64.to_le_bytes().to_vec();
        body.extend_from_slice(&le32(0));
        body.extend_from_slice(&le32(MAX_SYMLINK as u32 + 1));
        assert!(matches!(
            decode_request(&raw_request(Op::Symlink, &body)),
            Err(DecodeError::TooLong { what: "symlink target", .. })
        ));
    }

    /// A SessionOpen body: name "c", zero nonce and mac, then `tail`.
    fn session_with(tail: &[u8]) -> Vec<u8> {
        let mut body = le32(1).to_vec();
        body.push(b'c');
        body.extend_from_slice(&[0; 48]);
        body.extend_from_slice(tail);
        raw_request(Op::SessionOpen, &body)
    }

    #[test]
    fn hostile_credentials_are_refused() {
        // No credential (presence 0) decodes; a presence byte of 2 does not.
        assert!(decode_request(&session_with(&[0])).is_ok());
        assert!(matches!(decode_request(&session_with(&[2])), Err(DecodeError::BadValue { value: 2, .. })));
        // An empty name.
        let mut t = vec![1];
        t.extend_from_slice(&le32(0));
        assert_eq!(
            decode_request(&session_with(&t)),
            Err(DecodeError::BadValue { what: "credential name length", value: 0 })
        );
        // Too many ranges, promised and absent.
        let mut t = vec![1];
        t.extend_from_slice(&le32(1));
        t.push(b'a');
        t.extend_from_slice(&le32(crate::MAX_CREDENTIAL_RANGES as u32 + 1));
        assert!(matches!(
            decode_request(&session_with(&t)),
            Err(DecodeError::TooLong { what: "credential uid ranges", max: crate::MAX_CREDENTIAL_RANGES, .. })
        ));
        let mut t = vec![1];
        t.extend_from_slice(&le32(1));
        t.push(b'a');
        t.extend_from_slice(&le32(3));
        t.extend_from_slice(&[0; 8]);
        assert!(matches!(
            decode_request(&session_with(&t)),
            Err(DecodeError::Truncated { what: "credential uid ranges", needed: 24, left: 8 })
        ));
        // A range whose first id is above its last.
        let mut t = vec![1];
        t.extend_from_slice(&le32(1));
        t.push(b'a');
        t.extend_from_slice(&le32(1));
        t.extend_from_slice(&le32(10));
        t.extend_from_slice(&le32(9));
        t.extend_from_slice(&le32(0));
        t.push(0);
        assert_eq!(
            decode_request(&session_with(&t)),
            Err(DecodeError::BadValue { what: "id range (first above last)", value: 10 })
        );
        // The same with a valid range decodes; a root byte of 2 does not.
        let n = t.len();
        t[n - 9..n - 5].copy_from_slice(&le32(11));
        assert!(decode_request(&session_with(&t)).is_ok());
        t[n - 1] = 2;
        assert!(matches!(decode_request(&session_with(&t)), Err(DecodeError::BadValue { value: 2, .. })));
        // RevokeCredential: an empty name, a name that is not UTF-8.
        assert!(decode_request(&raw_request(Op::RevokeCredential, &le32(0))).is_err());
        let mut b = le32(1).to_vec();
        b.push(0xff);
        assert_eq!(
            decode_request(&raw_request(Op::RevokeCredential, &b)),
            Err(DecodeError::NotUtf8("credential name"))
        );
    }

    #[test]
    fn bad_values_in_bodies() {
        let mut body = le32(2).to_vec();
        body.extend_from_slice(&[0xc3, 0x28]);
        body.extend_from_slice(&[0; 49]);
        assert_eq!(decode_request(&raw_request(Op::SessionOpen, &body)), Err(DecodeError::NotUtf8("client name")));
        let mut body = 8u64.to_le_bytes().to_vec();
        body.extend_from_slice(&le32(8));
        assert_eq!(
            decode_request(&raw_request(Op::Open, &body)),
            Err(DecodeError::BadValue { what: "open flags", value: 8 })
        );
        let mut body = 2u64.to_le_bytes().to_vec();
        body.extend_from_slice(&le32(1));
        body.push(b'f');
        body.extend_from_slice(&le32(0o644));
        body.push(2); // exclusive must be 0 or 1
        body.push(0);
        assert_eq!(
            decode_request(&raw_request(Op::Create, &body)),
            Err(DecodeError::BadValue { what: "create exclusive", value: 2 })
        );
        let mut body = 2u64.to_le_bytes().to_vec();
        body.extend_from_slice(&le32(0));
        body.extend_from_slice(&le32(0o40_755));
        assert!(matches!(
            decode_request(&raw_request(Op::Mkdir, &body)),
            Err(DecodeError::BadValue { what: "mkdir mode", .. })
        ));
        // Readdir eof byte.
        let mut body = le32(0).to_vec();
        body.push(7);
        assert!(matches!(
            decode_reply(&raw_reply(Op::Readdir, &body)),
            Err(DecodeError::BadValue { what: "readdir eof", value: 7 })
        ));
    }

    /// A compound request body from (flags, op, body) triples.
    fn compound(ops: &[(u8, Op, &[u8])]) -> Vec<u8> {
        let mut body = le32(ops.len() as u32).to_vec();
        for (flags, op, b) in ops {
            body.push(*flags);
            body.extend_from_slice(&u16::from(*op).to_le_bytes());
            body.extend_from_slice(b);
        }
        raw_request(Op::Compound, &body)
    }

    #[test]
    fn compound_request_rules() {
        let ino = 5u64.to_le_bytes();
        assert!(decode_request(&compound(&[(0, Op::GetAttr, &ino), (1, Op::Readlink, &ino)])).is_ok());
        let inner = compound(&[(0, Op::Statfs, &[])]);
        let nested = compound(&[(0, Op::Compound, &inner[RequestHeader::SIZE..])]);
        assert_eq!(decode_request(&nested), Err(DecodeError::NestedCompound));
        let mut sess = le32(0).to_vec();
        sess.extend_from_slice(&[0; 48]);
        assert!(matches!(
            decode_request(&compound(&[(0, Op::SessionOpen, &sess)])),
            Err(DecodeError::BadValue { value: 1, .. })
        ));
        assert!(matches!(
            decode_request(&compound(&[(1, Op::GetAttr, &ino)])),
            Err(DecodeError::BadValue { what: "chain flag on the first op of a Compound", .. })
        ));
        assert!(matches!(
            decode_request(&compound(&[(0, Op::GetAttr, &ino), (1, Op::Statfs, &[])])),
            Err(DecodeError::BadValue { what: "chain flag on an op without an inode argument", value: 14 })
        ));
        assert!(matches!(
            decode_request(&compound(&[(2, Op::GetAttr, &ino)])),
            Err(DecodeError::BadValue { what: "compound op flags", value: 2 })
        ));
        let mut b = compound(&[(0, Op::GetAttr, &ino)]);
        set(&mut b, RequestHeader::SIZE + 5, &40u16.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::UnknownOp(40)));
        let seventeen: Vec<(u8, Op, &[u8])> = vec![(0, Op::Statfs, &[]); MAX_COMPOUND + 1];
        assert!(matches!(decode_request(&compound(&seventeen)), Err(DecodeError::TooLong { len: 17, max: 16, .. })));
        assert_eq!(decode_request(&compound(&[])), Ok((ENV, Request::Compound { ops: vec![] })));
    }

    #[test]
    fn compound_reply_rules() {
        let results = |rs: Vec<Result<Response, Errno>>| Response::Compound { results: rs };
        // Only the last result may be an error.
        let bad = results(vec![Err(Errno::EIO), Ok(Response::Done)]);
        assert!(!bad.answers(Op::Compound));
        let mut w = Writer::default();
        bad.put_body(&mut w);
        assert!(matches!(
            decode_reply(&raw_reply(Op::Compound, &w.into_vec())),
            Err(DecodeError::BadValue { value: 1, .. })
        ));
        // No Compound or Session inside.
        for (inner, want) in [
            (results(vec![]), DecodeError::NestedCompound),
            (
                Response::Session { session_id: 1, root: 1 },
                DecodeError::BadValue { what: "compound result kind", value: 1 },
            ),
        ] {
            let r = results(vec![Ok(inner)]);
            assert!(!r.answers(Op::Compound));
            let mut w = Writer::default();
            r.put_body(&mut w);
            assert_eq!(decode_reply(&raw_reply(Op::Compound, &w.into_vec())), Err(want));
        }
        let mut body = le32(1).to_vec();
        body.extend_from_slice(&0i32.to_le_bytes());
        body.push(10);
        assert!(matches!(decode_reply(&raw_reply(Op::Compound, &body)), Err(DecodeError::BadValue { value: 10, .. })));
        let mut body = le32(1).to_vec();
        body.extend_from_slice(&(-1i32).to_le_bytes());
        assert!(matches!(
            decode_reply(&raw_reply(Op::Compound, &body)),
            Err(DecodeError::BadValue { what: "compound result errno", value: 0xffff_ffff })
        ));
    }

    #[test]
    fn answers_matches_ops() {
        assert!(Response::Done.answers(Op::Unlink));
        assert!(!Response::Done.answers(Op::Lookup));
        assert!(Response::Entry { attr: attr() }.answers(Op::Link));
        assert!(!Response::Entry { attr: attr() }.answers(Op::GetAttr));
    }

    #[test]
    #[should_panic(expected = "not a well-formed answer to Lookup")]
    fn encoding_a_wrong_answer_panics() {
        encode_reply(1, Op::Lookup, &Ok(Response::Done));
    }

    #[test]
    #[should_panic(expected = "errno 0 cannot travel")]
    fn encoding_errno_zero_panics() {
        encode_reply(1, Op::Lookup, &Err(Errno(0)));
    }

    #[test]
    fn chaining() {
        let mut op = CompoundOp {
            chain: true,
            req: Request::Rename { src_parent: 0, src_name: vec![], dst_parent: 9, dst_name: vec![], flags: 0 },
        };
        *op.primary_ino_mut().unwrap() = 4;
        assert!(matches!(op.req, Request::Rename { src_parent: 4, dst_parent: 9, .. }));
        assert_eq!(
            op.clone().resolve(Some(6)).unwrap(),
            Request::Rename { src_parent: 6, src_name: vec![], dst_parent: 9, dst_name: vec![], flags: 0 }
        );
        assert_eq!(op.clone().resolve(None), Err(Errno::EINVAL));
        let statfs = CompoundOp { chain: true, req: Request::Statfs };
        assert_eq!(statfs.resolve(Some(1)), Err(Errno::EINVAL));
        let unchained = CompoundOp { chain: false, req: Request::GetAttr { ino: 3 } };
        assert_eq!(unchained.resolve(Some(1)), Ok(Request::GetAttr { ino: 3 }));
        let produced = Response::Opened {
            attr: attr(),
            layout: Layout { object_id: 1, stripe_unit: 0, stripe_count: 0, servers: vec![] },
            cap: cap(),
        };
        assert_eq!(produced.ino(), Some(attr().ino));
        assert_eq!(Response::Session { session_id: 1, root: ROOT_INO }.ino(), Some(ROOT_INO));
        assert_eq!(Response::Done.ino(), None);
    }

    #[test]
    fn mknod_refuses_unknown_kinds_and_type_bits_in_the_mode() {
        let req = Request::Mknod { parent: 2, name: b"p".to_vec(), kind: FileType::Fifo, mode: 0o644, rdev: 0 };
        let good = encode_request(ENV, &req);
        // Body: parent u64, name (u32 len + 1 byte), kind u8, mode u32, rdev u64.
        let kind_at = RequestHeader::SIZE + 8 + 4 + 1;
        assert_eq!(good.len(), kind_at + 1 + 4 + 8);
        assert_eq!(good[kind_at], 4);
        let mut b = good.clone();
        b[kind_at] = 8;
        assert_eq!(decode_request(&b), Err(DecodeError::BadValue { what: "file type", value: 8 }));
        let mut b = good.clone();
        b[kind_at + 1..kind_at + 5].copy_from_slice(&0o010_644u32.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::BadValue { what: "mknod mode", value: 0o010_644 }));
        assert!(matches!(
            decode_request(&good[..good.len() - 1]),
            Err(DecodeError::BodyLength { .. } | DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn lock_requests_with_a_backwards_range_an_unknown_kind_or_flag_are_refused() {
        let req = Request::Lock {
            ino: 8,
            client: 1,
            owner: 2,
            pid: 3,
            start: 10,
            end: 20,
            kind: crate::LockKind::Read,
            flags: 0,
        };
        let good = encode_request(ENV, &req);
        // Body: ino, client, owner u64, pid u32, start, end u64, kind u8, flags u8.
        let start_at = good.len() - 2 - 16;
        let kind_at = good.len() - 2;
        let mut b = good.clone();
        b[start_at..start_at + 8].copy_from_slice(&21u64.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::BadValue { what: "lock end (before its start)", value: 20 }));
        let mut b = good.clone();
        b[kind_at] = 0;
        assert_eq!(decode_request(&b), Err(DecodeError::BadValue { what: "lock kind", value: 0 }));
        let mut b = good.clone();
        b[kind_at + 1] = 8;
        assert_eq!(decode_request(&b), Err(DecodeError::BadValue { what: "lock flags", value: 8 }));
        // Never inside a Compound.
        let c = encode_request(ENV, &Request::Compound { ops: vec![CompoundOp { chain: false, req }] });
        assert!(matches!(decode_request(&c), Err(DecodeError::BadValue { what, .. }) if what.contains("lock ops")));
        for n in 0..good.len() {
            assert!(decode_request(&good[..n]).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn op_numbers_are_stable() {
        let want: Vec<u16> = (1..=27).chain(30..=33).chain(35..=36).collect();
        let got: Vec<u16> = Op::ALL.iter().map(|op| u16::from(*op)).collect();
        assert_eq!(got, want);
        for op in Op::ALL {
            assert_eq!(Op::from_u16(u16::from(*op)), Some(*op));
        }
        assert_eq!(Op::Compound.to_string(), "Compound");
    }

    #[test]
    fn errors_say_why() {
        assert_eq!(
            DecodeError::Truncated { what: "name", needed: 3, left: 2 }.to_string(),
            "truncated name: needs 3 bytes, 2 left"
        );
        assert_eq!(
            DecodeError::BadVersion(9).to_string(),
            format!("protocol version 9 is not supported (this side speaks {PROTO_VERSION})")
        );
    }
}
