//! The fuzz targets' bodies, shared by cargo-fuzz (`fuzz_targets/*.rs`,
//! nightly, coverage-guided) and by the stable mutation sweep that CI runs
//! on every build (`tests/sweep.rs`). Each takes arbitrary bytes and panics
//! only on a broken property (a decoder that panics, allocates beyond its
//! input, or accepts something it does not re-encode canonically).

#![allow(clippy::missing_panics_doc)]

/// Every transport decoder (frame header, hello, welcome): no panic,
/// round trips of what is accepted; and the replay window, fed sequence
/// numbers from the same bytes, agrees with a set of what it accepted.
pub fn frame(data: &[u8]) {
    replay_window(data);
    use dafne_transport::frame::{FrameHeader, Hello, Welcome};
    let (claimed, rest) = data.split_at(data.len().min(4));
    let mut n = [0u8; 4];
    n[..claimed.len()].copy_from_slice(claimed);
    let actual = u32::from_le_bytes(n) as usize;
    if let Ok(h) = FrameHeader::decode(rest, actual, 1 << 20) {
        assert_eq!(FrameHeader::decode(&h.encode(), actual, 1 << 20), Ok(h));
    }
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }
    if let Ok(w) = Welcome::decode(data) {
        assert_eq!(Welcome::decode(&w.encode()), Ok(w));
    }
}

/// Sequence numbers from `data` (2 bytes each: a step forward or back
/// from the highest accepted) against a model: accepted exactly when above
/// the highest, or within the window and not accepted before.
fn replay_window(data: &[u8]) {
    use dafne_transport::frame::{Replay, ReplayWindow, REPLAY_WINDOW};
    let mut w = ReplayWindow::default();
    let mut seen = std::collections::HashSet::new();
    let mut top = 0u64;
    for c in data.chunks_exact(2) {
        let step = i16::from_le_bytes([c[0], c[1]]) as i64;
        let seq = (top as i64 + step).max(0) as u64;
        let want = if seq == 0 {
            Err(Replay::Zero)
        } else if seq > top {
            Ok(())
        } else if top - seq >= REPLAY_WINDOW {
            Err(Replay::TooOld { seq, top })
        } else if seen.contains(&seq) {
            Err(Replay::Seen { seq })
        } else {
            Ok(())
        };
        assert_eq!(w.check(seq), want);
        assert_eq!(w.record(seq), want);
        if want.is_ok() {
            seen.insert(seq);
            top = top.max(seq);
        }
    }
}

/// The io protocol's decoders: whole messages, or bodies behind a valid
/// header for the op the first byte names (so body decoders are reached).
pub fn io(data: &[u8]) {
    use dafne_proto::{
        decode_io_reply, decode_io_request, decode_reply, decode_request, encode_io_reply, encode_io_request, Envelope,
        IoOp, IoReplyHeader, IoRequestHeader, MAX_IO_BYTES,
    };
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
            // ServerInfo's counted field list is read leniently by design
            // (fields a decoder does not know are ignored, missing ones are
            // zero: fields can be added without a version change), so only
            // its value must round-trip; every other reply is canonical.
            if op != IoOp::ServerInfo {
                assert_eq!(again, msg, "io reply encoding is not canonical");
            }
            assert_eq!(decode_io_reply(&again), Ok((tag, op, res)));
            assert!(decode_reply(msg).is_err(), "an io reply decodes as a metadata reply");
        }
    }

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
    let env = Envelope::new(1, 2, 3);
    let mut msg = IoRequestHeader::new(op, env, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
    let mut msg = IoReplyHeader::new(op, 1, 0, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
    // The one error reply with a body: a chain refusal.
    let mut msg = IoReplyHeader::new(op, 1, dafne_proto::CHAIN_REFUSED.0, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
}

/// The metadata protocol's decoders, as [`io`].
pub fn proto(data: &[u8]) {
    use dafne_proto::{
        decode_reply, decode_request, encode_reply, encode_request, Envelope, Op, ReplyHeader, RequestHeader,
    };
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
    let env = Envelope::new(1, 2, 3);
    let mut msg = RequestHeader::new(op, env, len).encode().to_vec();
    // Half the time the body starts with supplementary groups.
    if sel & 0x40 != 0 {
        msg[4] = dafne_proto::REQUEST_FLAG_GROUPS as u8;
    }
    msg.extend_from_slice(rest);
    check(&msg);
    let mut msg = ReplyHeader::new(op, 1, 0, len).encode().to_vec();
    msg.extend_from_slice(rest);
    check(&msg);
}

/// The transport's reference service request decoder.
pub fn testsvc_request(data: &[u8]) {
    use dafne_transport::testsvc::{decode_rma, encode_rma};
    if let Ok((flags, seed, segs)) = decode_rma(data) {
        let again = encode_rma(0, flags, seed, &segs);
        assert_eq!(&again[1..], data);
    }
}

/// The NBD server (`dafne-nbd`) on arbitrary bytes from a client: its
/// decoders must not panic and what they accept must re-encode to the
/// same bytes; and a whole connection fed `data` (an in-memory export of
/// 64 KiB) must end, without a panic, once the client stops sending, with
/// every byte the server sent parseable as the protocol says (greeting
/// first).
pub fn nbd(data: &[u8]) {
    use dafne_nbd::proto;
    use std::io::{Read, Write};
    if let Ok(h) = <&[u8; proto::OPTION_LEN]>::try_from(data.get(..proto::OPTION_LEN).unwrap_or(&[])) {
        let _ = proto::decode_option_header(h);
    }
    let _ = proto::decode_go(data);
    if let Some(h) = data.get(..proto::REQUEST_LEN).and_then(|b| <&[u8; proto::REQUEST_LEN]>::try_from(b).ok()) {
        if let Ok(r) = proto::decode_request(h) {
            assert_eq!(&proto::encode_request(&r), h);
            let _ = proto::check(&r, 1 << 16, false);
        }
    }
    let cfg = dafne_nbd::ExportConfig { name: "x".into(), workers: 2, ..Default::default() };
    let server = dafne_nbd::Server::new(std::sync::Arc::new(dafne_nbd::mem::MemBackend::new(1 << 16, false)), cfg);
    let (a, b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    let (done_tx, done) = std::sync::mpsc::channel();
    let s = server.clone();
    std::thread::spawn(move || {
        let r = s.serve_stream(dafne_nbd::Stream::Unix(b));
        let _ = done_tx.send(matches!(r, Err(dafne_nbd::server::ConnError::WorkerPanicked)));
    });
    let mut w = a.try_clone().expect("clone");
    let input = data.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&input);
        let _ = w.shutdown(std::net::Shutdown::Write);
    });
    let mut out = Vec::new();
    let _ = (&a).read_to_end(&mut out);
    let _ = writer.join();
    let worker_panicked = done
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the server must end a connection whose client stopped, without a panic");
    assert!(!worker_panicked, "a worker panicked");
    assert_eq!(out.get(..18), Some(&proto::greeting()[..]), "the greeting comes first");
}
