//! Why a message could not be decoded.

use crate::PROTO_VERSION;

/// Why bytes are not a valid message. Each variant names the field at fault
/// (`what`) where one is. A server that decoded the header but not the body
/// answers `EPROTO` with the header's tag; a client that cannot decode a
/// reply treats the call as failed with `EPROTO`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended inside `what`.
    #[error("truncated {what}: needs {needed} bytes, {left} left")]
    Truncated { what: &'static str, needed: usize, left: usize },
    /// The header's version is not [`PROTO_VERSION`].
    #[error("protocol version {0} is not supported (this side speaks {PROTO_VERSION})")]
    BadVersion(u16),
    /// The op number is not in the table (in a header or inside a Compound).
    #[error("unknown op {0}")]
    UnknownOp(u16),
    /// A length or count read from the wire is above its limit.
    #[error("{what} is {len} long, above the limit of {max}")]
    TooLong { what: &'static str, len: usize, max: usize },
    /// Bytes were left after the body was decoded.
    #[error("{0} trailing bytes after the message body")]
    Trailing(usize),
    /// A field holds a value outside its domain (an unknown enum value, a
    /// flag bit, nsec ≥ 10⁹, mode bits outside 0o7777, …).
    #[error("invalid {what}: {value}")]
    BadValue { what: &'static str, value: u64 },
    /// A header field that must be zero (request `flags`/`reserved`, reply
    /// `reserved`) is not.
    #[error("a header field that must be zero (flags or reserved) is not")]
    Reserved,
    /// The header's `body_len` differs from the bytes that follow it.
    #[error("header announces a {announced}-byte body but {actual} bytes follow")]
    BodyLength { announced: u32, actual: usize },
    /// A text field is not UTF-8.
    #[error("{0} is not valid UTF-8")]
    NotUtf8(&'static str),
    /// A Compound contains a Compound (in a request or in a reply).
    #[error("a Compound may not contain another Compound")]
    NestedCompound,
}
