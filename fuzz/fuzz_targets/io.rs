//! The io protocol's decoders on arbitrary bytes: must not panic, must not
//! allocate beyond the input's size, what they accept must re-encode to the
//! same bytes (encodings are canonical) and decode to the same value, and
//! nothing decodes as both an io and a metadata message.
//!
//! The first byte chooses how the rest is used: as a whole message, or as
//! the body behind a valid io request and reply header for the op it names
//! (so the body decoders are reached without guessing a header).
#![no_main]
use dafne_proto::{
    decode_io_reply, decode_io_request, decode_reply, decode_request, encode_io_reply,
    encode_io_request, Envelope, IoOp, IoReplyHeader, IoRequestHeader, MAX_IO_BYTES,
};
use libfuzzer_sys::fuzz_target;

fn check(msg: &[u8]) {
    if let Ok((env, req)) = decode_io_request(msg) {
        let again = encode_io_request(env, &req);
        assert_eq!(again, msg, "io request encoding is not canonical");
        assert_eq!(decode_io_request(&again), Ok((env, req.clone())));
        assert!(req.total_bytes() <= MAX_IO_BYTES as u64);
        assert!(decode_request(msg).is_err(), "an io request decodes as a metadata request");
    }
    if let Ok((tag, op, res)) = decode_io_reply(msg) {
        assert!(res.as_ref().map_or(true, |r| r.answers(op)));
        let again = encode_io_reply(tag, op, &res);
        assert_eq!(again, msg, "io reply encoding is not canonical");
        assert_eq!(decode_io_reply(&again), Ok((tag, op, res)));
        assert!(decode_reply(msg).is_err(), "an io reply decodes as a metadata reply");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        check(data);
        return;
    };
    let op = IoOp::ALL[usize::from(sel) % IoOp::ALL.len()];
    if sel < 128 {
        check(data);
        return;
    }
    let Ok(len) = u32::try_from(rest.len()) else {
        return;
    };
    let env = Envelope { tag: 1, uid: 2, gid: 3 };
    let mut msg = IoRequestHeader::new(op, env, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
    let mut msg = IoReplyHeader::new(op, 1, 0, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
});
