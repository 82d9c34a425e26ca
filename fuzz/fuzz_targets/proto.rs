//! The metadata protocol's decoders on arbitrary bytes: must not panic, must
//! not allocate beyond the input's size, and what they accept must re-encode
//! to the same bytes (encodings are canonical) and decode to the same value.
//!
//! The first byte chooses how the rest is used: as a whole message, or as
//! the body behind a valid request and reply header for the op it names
//! (so the body decoders are reached without guessing a header).
#![no_main]
use dafne_proto::{
    decode_reply, decode_request, encode_reply, encode_request, Envelope, Op, ReplyHeader,
    RequestHeader,
};
use libfuzzer_sys::fuzz_target;

fn check(msg: &[u8]) {
    if let Ok((env, req)) = decode_request(msg) {
        let again = encode_request(env, &req);
        assert_eq!(again, msg, "request encoding is not canonical");
        assert_eq!(decode_request(&again), Ok((env, req)));
    }
    if let Ok((tag, op, res)) = decode_reply(msg) {
        let again = encode_reply(tag, op, &res);
        assert_eq!(again, msg, "reply encoding is not canonical");
        assert_eq!(decode_reply(&again), Ok((tag, op, res)));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        check(data);
        return;
    };
    let op = Op::ALL[usize::from(sel) % Op::ALL.len()];
    if sel < 128 {
        check(data);
        return;
    }
    let Ok(len) = u32::try_from(rest.len()) else {
        return;
    };
    let env = Envelope { tag: 1, uid: 2, gid: 3 };
    let mut msg = RequestHeader::new(op, env, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
    let mut msg = ReplyHeader::new(op, 1, 0, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
});
