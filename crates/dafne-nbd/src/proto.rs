//! The NBD wire protocol (<https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md>)
//! as pure functions: every decoder takes the bytes a peer sent and says
//! what is wrong with them, without I/O, panics or allocation beyond the
//! bounds below. All integers are big-endian on the wire.
//!
//! Only the fixed newstyle handshake is spoken (the oldstyle and plain
//! newstyle ones are not: every client of the last decade speaks fixed
//! newstyle), and only simple replies (structured replies are refused
//! with `NBD_REP_ERR_UNSUP`, which the spec allows; clients then use
//! simple replies).

/// "NBDMAGIC": the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the server's second 8 bytes, and every option's first.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// The magic of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The magic of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// The magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags (server → client).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags (client → server).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags (per export).
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;

/// Information types of `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

/// Command types.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Largest READ or WRITE payload served: the spec's default maximum block
/// size (2^25), which interoperable clients stay under without being told
/// (and which `NBD_INFO_BLOCK_SIZE` announces). A READ above it is answered
/// `EINVAL`; a WRITE above it disconnects (its payload would have to be
/// swallowed unread).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option payload read. An `NBD_OPT_GO` carries a name of at most
/// [`MAX_NAME`] bytes and a few info requests; anything longer is refused
/// with `NBD_REP_ERR_INVALID` (its bytes skipped, up to this bound) or, past
/// it, by disconnecting.
pub const MAX_OPTION: u32 = 64 << 10;
/// Longest export name accepted (the spec's own bound is 4096).
pub const MAX_NAME: usize = 4096;

/// Bytes of a request header and of a simple reply header.
pub const REQUEST_LEN: usize = 28;
pub const REPLY_LEN: usize = 16;
/// Bytes of an option header (magic, option, length).
pub const OPTION_LEN: usize = 16;

/// NBD error numbers (the spec's own, not the host's errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
#[non_exhaustive]
pub enum NbdError {
    Perm = 1,
    Io = 5,
    NoMem = 12,
    Inval = 22,
    NoSpc = 28,
    Overflow = 75,
    NotSup = 95,
    Shutdown = 108,
}

/// The server's first 18 bytes: magic, IHAVEOPT, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut b = [0u8; 18];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    b
}

/// Why a handshake or a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("client flags {0:#x}: the client does not speak the fixed newstyle handshake, or sets unknown flags")]
    ClientFlags(u32),
    #[error("option magic {0:#x} is not IHAVEOPT")]
    OptionMagic(u64),
    #[error("option {option} carries {len} bytes, above the limit of {MAX_OPTION}")]
    OptionTooLong { option: u32, len: u32 },
    #[error("request magic {0:#x} is wrong")]
    RequestMagic(u32),
    #[error("a write of {0} bytes is above the limit of {MAX_PAYLOAD}")]
    WriteTooLarge(u32),
}

/// Checks the client's 4 flag bytes; returns whether it asked for no zeroes.
pub fn decode_client_flags(b: [u8; 4]) -> Result<bool, ProtoError> {
    let f = u32::from_be_bytes(b);
    if f & FLAG_C_FIXED_NEWSTYLE == 0 || f & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(ProtoError::ClientFlags(f));
    }
    Ok(f & FLAG_C_NO_ZEROES != 0)
}

/// An option header: which option, and how many bytes of data follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

pub fn decode_option_header(b: &[u8; OPTION_LEN]) -> Result<OptionHeader, ProtoError> {
    let magic = u64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
    if magic != IHAVEOPT {
        return Err(ProtoError::OptionMagic(magic));
    }
    let option = u32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
    let len = u32::from_be_bytes(b[12..16].try_into().expect("4 bytes"));
    if len > MAX_OPTION {
        return Err(ProtoError::OptionTooLong { option, len });
    }
    Ok(OptionHeader { option, len })
}

/// An `NBD_OPT_INFO` / `NBD_OPT_GO` payload: the export's name and the
/// information the client asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRequest {
    pub name: Vec<u8>,
    pub infos: Vec<u16>,
}

/// Decodes an `NBD_OPT_INFO` / `NBD_OPT_GO` payload; `None` when its
/// lengths do not add up (answered `NBD_REP_ERR_INVALID`).
pub fn decode_go(data: &[u8]) -> Option<GoRequest> {
    let name_len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
    if name_len > MAX_NAME {
        return None;
    }
    let name = data.get(4..4 + name_len)?.to_vec();
    let rest = &data[4 + name_len..];
    let n = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    let list = &rest[2..];
    if list.len() != n * 2 {
        return None;
    }
    let infos = list.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
    Some(GoRequest { name, infos })
}

/// An option reply: header and data.
pub fn encode_option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// `NBD_REP_INFO` data of type `NBD_INFO_EXPORT`: size and transmission flags.
pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b
}

/// `NBD_REP_INFO` data of type `NBD_INFO_BLOCK_SIZE`.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(14);
    b.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    for v in [min, preferred, max] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b
}

/// `NBD_REP_INFO` data of type `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`.
pub fn info_text(kind: u16, text: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + text.len());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(text);
    b
}

/// `NBD_REP_SERVER` data for `NBD_OPT_LIST`: one export's name and its
/// description.
pub fn list_entry(name: &[u8], description: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len() + description.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name);
    b.extend_from_slice(description);
    b
}

/// The answer to `NBD_OPT_EXPORT_NAME` (no option reply header): size,
/// transmission flags, and 124 zero bytes unless the client asked for none.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(134);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        b.extend_from_slice(&[0u8; 124]);
    }
    b
}

/// A transmission request's header (a WRITE's payload follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
}

/// Decodes a request header. A wrong magic means the stream is lost (the
/// connection is closed); a WRITE above [`MAX_PAYLOAD`] likewise (its
/// payload cannot be skipped at a bounded cost). Everything else, unknown
/// commands included, decodes and is judged by [`check`].
pub fn decode_request(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
    let magic = u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"));
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::RequestMagic(magic));
    }
    let r = Request {
        flags: u16::from_be_bytes([b[4], b[5]]),
        kind: u16::from_be_bytes([b[6], b[7]]),
        handle: u64::from_be_bytes(b[8..16].try_into().expect("8 bytes")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
        len: u32::from_be_bytes(b[24..28].try_into().expect("4 bytes")),
    };
    if r.kind == CMD_WRITE && r.len > MAX_PAYLOAD {
        return Err(ProtoError::WriteTooLarge(r.len));
    }
    Ok(r)
}

pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.handle.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.len.to_be_bytes());
    b
}

/// What a well-formed request asks for, once checked against the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read { offset: u64, len: u32 },
    Write { offset: u64, len: u32, fua: bool },
    Flush,
    Trim { offset: u64, len: u32 },
    WriteZeroes { offset: u64, len: u32, may_punch: bool, fua: bool },
    Disconnect,
}

/// Judges a request against an export of `size` bytes: the command, or
/// the error to answer (the connection stays open). A WRITE's payload has
/// been (or must still be) read whatever the verdict.
pub fn check(r: &Request, size: u64, read_only: bool) -> Result<Command, NbdError> {
    let fua = r.flags & CMD_FLAG_FUA != 0;
    let in_range = |len: u32| r.offset.checked_add(u64::from(len)).is_some_and(|end| end <= size);
    let known_flags = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE;
    if r.flags & !known_flags != 0 {
        return Err(NbdError::Inval);
    }
    match r.kind {
        CMD_READ => {
            if r.len > MAX_PAYLOAD {
                return Err(NbdError::Overflow);
            }
            if !in_range(r.len) {
                return Err(NbdError::Inval);
            }
            Ok(Command::Read { offset: r.offset, len: r.len })
        }
        CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES if read_only => Err(NbdError::Perm),
        CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES if !in_range(r.len) => Err(NbdError::NoSpc),
        CMD_WRITE => Ok(Command::Write { offset: r.offset, len: r.len, fua }),
        CMD_TRIM => Ok(Command::Trim { offset: r.offset, len: r.len }),
        CMD_WRITE_ZEROES => {
            Ok(Command::WriteZeroes { offset: r.offset, len: r.len, may_punch: r.flags & CMD_FLAG_NO_HOLE == 0, fua })
        }
        CMD_FLUSH => Ok(Command::Flush),
        CMD_DISC => Ok(Command::Disconnect),
        _ => Err(NbdError::Inval),
    }
}

/// A simple reply's header (a successful READ's data follows it).
pub fn encode_reply(handle: u64, error: Option<NbdError>) -> [u8; REPLY_LEN] {
    let mut b = [0u8; REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.map_or(0, |e| e as u32).to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request { flags, kind, handle: 7, offset, len }
    }

    #[test]
    fn the_greeting_is_the_fixed_newstyle_one() {
        let g = greeting();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), 3);
    }

    #[test]
    fn client_flags_without_fixed_newstyle_or_with_unknown_bits_are_refused() {
        assert_eq!(decode_client_flags([0, 0, 0, 1]), Ok(false));
        assert_eq!(decode_client_flags([0, 0, 0, 3]), Ok(true));
        assert_eq!(decode_client_flags([0, 0, 0, 0]), Err(ProtoError::ClientFlags(0)));
        assert_eq!(decode_client_flags([0, 0, 0, 2]), Err(ProtoError::ClientFlags(2)));
        assert_eq!(decode_client_flags([0x80, 0, 0, 1]), Err(ProtoError::ClientFlags(0x8000_0001)));
    }

    #[test]
    fn option_headers_check_magic_and_bound_the_length() {
        let mut b = [0u8; OPTION_LEN];
        b[0..8].copy_from_slice(b"IHAVEOPT");
        b[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        b[12..16].copy_from_slice(&10u32.to_be_bytes());
        assert_eq!(decode_option_header(&b), Ok(OptionHeader { option: OPT_GO, len: 10 }));
        b[12..16].copy_from_slice(&(MAX_OPTION + 1).to_be_bytes());
        assert!(matches!(decode_option_header(&b), Err(ProtoError::OptionTooLong { .. })));
        b[0] = b'X';
        assert!(matches!(decode_option_header(&b), Err(ProtoError::OptionMagic(_))));
    }

    #[test]
    fn go_payloads_must_add_up() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert_eq!(decode_go(&d), Some(GoRequest { name: b"abc".to_vec(), infos: vec![3, 1] }));
        // Every shorter or longer cut is refused, never a panic.
        for cut in 0..d.len() {
            assert_eq!(decode_go(&d[..cut]), None, "cut at {cut}");
        }
        let mut longer = d.clone();
        longer.push(0);
        assert_eq!(decode_go(&longer), None);
        // A name length past the data or the bound.
        let mut huge = u32::MAX.to_be_bytes().to_vec();
        huge.extend_from_slice(&[0; 8]);
        assert_eq!(decode_go(&huge), None);
    }

    #[test]
    fn requests_round_trip_and_bad_magic_or_huge_writes_end_the_stream() {
        let r = req(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        assert_eq!(decode_request(&encode_request(&r)), Ok(r));
        let mut b = encode_request(&r);
        b[0] ^= 1;
        assert!(matches!(decode_request(&b), Err(ProtoError::RequestMagic(_))));
        let big = req(CMD_WRITE, 0, 0, MAX_PAYLOAD + 1);
        assert_eq!(decode_request(&encode_request(&big)), Err(ProtoError::WriteTooLarge(MAX_PAYLOAD + 1)));
        // A huge read decodes (no payload follows) and is answered.
        let big_read = req(CMD_READ, 0, 0, u32::MAX);
        assert_eq!(
            check(&decode_request(&encode_request(&big_read)).unwrap(), u64::MAX, false),
            Err(NbdError::Overflow)
        );
    }

    #[test]
    fn requests_are_judged_against_the_export() {
        let size = 1 << 20;
        assert_eq!(check(&req(CMD_READ, 0, 0, 4096), size, false), Ok(Command::Read { offset: 0, len: 4096 }));
        assert_eq!(check(&req(CMD_READ, 0, size - 1, 2), size, false), Err(NbdError::Inval));
        assert_eq!(check(&req(CMD_READ, 0, u64::MAX, 2), size, false), Err(NbdError::Inval));
        assert_eq!(check(&req(CMD_WRITE, 0, size, 1), size, false), Err(NbdError::NoSpc));
        assert_eq!(check(&req(CMD_WRITE, 0, 0, 1), size, true), Err(NbdError::Perm));
        assert_eq!(check(&req(CMD_TRIM, 0, 0, 1), size, true), Err(NbdError::Perm));
        assert_eq!(
            check(&req(CMD_WRITE, CMD_FLAG_FUA, 0, 1), size, false),
            Ok(Command::Write { offset: 0, len: 1, fua: true })
        );
        assert_eq!(
            check(&req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 8), size, false),
            Ok(Command::WriteZeroes { offset: 0, len: 8, may_punch: false, fua: false })
        );
        assert_eq!(check(&req(CMD_FLUSH, 0, 0, 0), size, true), Ok(Command::Flush));
        assert_eq!(check(&req(CMD_DISC, 0, 0, 0), size, true), Ok(Command::Disconnect));
        assert_eq!(check(&req(99, 0, 0, 0), size, false), Err(NbdError::Inval));
        assert_eq!(check(&req(CMD_READ, 0x8000, 0, 1), size, false), Err(NbdError::Inval));
    }

    #[test]
    fn replies_and_export_answers_have_their_layout() {
        let r = encode_reply(0x1122, Some(NbdError::Io));
        assert_eq!(u32::from_be_bytes(r[0..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
        assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 5);
        assert_eq!(u64::from_be_bytes(r[8..16].try_into().unwrap()), 0x1122);
        assert_eq!(export_name_reply(1, 1, true).len(), 10);
        assert_eq!(export_name_reply(1, 1, false).len(), 134);
        let o = encode_option_reply(OPT_GO, REP_INFO, &info_export(5, 1));
        assert_eq!(o.len(), 20 + 12);
        assert_eq!(u64::from_be_bytes(o[0..8].try_into().unwrap()), OPT_REPLY_MAGIC);
    }
}
