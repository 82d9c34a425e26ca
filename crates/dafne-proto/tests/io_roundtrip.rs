//! Properties of the io wire contract over generated values and bytes:
//! everything encodable decodes to itself, encodings are canonical, no input
//! makes a decoder panic, and neither protocol accepts the other's messages.

use dafne_proto::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn capability() -> impl Strategy<Value = Capability> {
    let advice = (prop::sample::select(vec![0u8, 4, 8, 16, 32, 64]), 0..3u8).prop_map(|(unit_kib, p)| CacheAdvice {
        unit_kib,
        policy: [CachePolicy::Default, CachePolicy::Lru, CachePolicy::Clock][p as usize],
    });
    (any::<u64>(), any::<u64>(), 0..=(RIGHT_READ | RIGHT_WRITE), any::<u64>(), any::<u64>(), advice, any::<[u8; 32]>())
        .prop_map(|(object_id, ino, rights, generation, expiry_unix_ns, advice, mac)| Capability {
            object_id,
            ino,
            rights,
            generation,
            expiry_unix_ns,
            advice,
            mac,
        })
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (any::<u64>(), any::<u32>(), any::<u32>(), proptest::collection::vec(any::<u32>(), 0..=dafne_proto::MAX_GROUPS))
        .prop_map(|(tag, uid, gid, groups)| Envelope {
            tag,
            uid,
            gid,
            groups: dafne_proto::Groups::new(&groups),
            // Io requests carry no session sequence (the decoder refuses it).
            session: None,
            // Chains are checked by the unit tests (only some ops carry one).
            chain: None,
            forwarded: false,
        })
}

fn stability() -> impl Strategy<Value = Stability> {
    prop_oneof![Just(Stability::Unstable), Just(Stability::DataSync), Just(Stability::FileSync)]
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => vec(any::<u8>(), 1..64),
        1 => vec(any::<u8>(), 1..=MAX_IO_KEY_BYTES),
        1 => Just(vec![b'k'; MAX_IO_KEY_BYTES]),
    ]
}

/// 1 to `max` keys.
fn keys(max: usize) -> impl Strategy<Value = Vec<Vec<u8>>> {
    vec(key(), 1..=max)
}

/// An offset for an extent of `len` bytes that does not run past the
/// largest file size, often near either end.
fn offset(len: u32) -> BoxedStrategy<u64> {
    let last = dafne_proto::io::MAX_FILE_SIZE - u64::from(len);
    prop_oneof![
        4 => 0..(1u64 << 40),
        2 => 0..=last,
        1 => Just(last),
        1 => (last.saturating_sub(1 << 20))..=last,
    ]
    .boxed()
}

/// An extent with a key below `nkeys` and at most `max_len` bytes.
fn keyed_extent(nkeys: usize, max_len: u32) -> impl Strategy<Value = IoExtent> {
    (1..=max_len, 0..nkeys as u16, any::<u64>()).prop_flat_map(|(len, key, addr)| {
        // Client addresses do not wrap inside an extent.
        let addr = addr.min(u64::MAX - u64::from(len));
        offset(len).prop_map(move |offset| IoExtent { offset, len, key, addr })
    })
}

fn inline_extent(max_len: u32) -> impl Strategy<Value = IoExtent> {
    (1..=max_len).prop_flat_map(|len| offset(len).prop_map(move |offset| IoExtent::inline(offset, len)))
}

/// Up to 16 inline extents of up to 4 KiB: at most MAX_INLINE in all.
fn inline_extents() -> impl Strategy<Value = Vec<IoExtent>> {
    const _: () = assert!(16 * 4096 <= MAX_INLINE);
    vec(inline_extent(4096), 0..=16)
}

/// Keys and keyed extents within the limits (1024 × 64 KiB = MAX_IO_BYTES).
fn keys_and_extents() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<IoExtent>)> {
    const _: () = assert!(MAX_IO_EXTENTS * 65536 <= MAX_IO_BYTES);
    prop_oneof![
        1 => Just((vec![], vec![])),
        8 => keys(4).prop_flat_map(|ks| {
            let n = ks.len();
            (Just(ks), vec(keyed_extent(n, 65536), 0..8))
        }),
        1 => keys(MAX_IO_KEYS).prop_flat_map(|ks| {
            let n = ks.len();
            (Just(ks), vec(keyed_extent(n, 65536), 0..=MAX_IO_EXTENTS))
        }),
    ]
}

fn credential() -> impl Strategy<Value = dafne_proto::Credential> {
    let range =
        (any::<u32>(), any::<u32>()).prop_map(|(a, b)| dafne_proto::IdRange { first: a.min(b), last: a.max(b) });
    ("\\PC{1,64}", vec(range.clone(), 0..=4), vec(range, 0..=4), any::<bool>())
        .prop_map(|(name, uids, gids, root)| dafne_proto::Credential { name, uids, gids, root })
}

fn read() -> impl Strategy<Value = IoRequest> {
    let rma = (capability(), keys_and_extents()).prop_map(|(cap, (keys, extents))| IoRequest::Read {
        cap,
        keys,
        extents,
        inline_reply: false,
        keys_follow: None,
    });
    let inline = (capability(), inline_extents()).prop_map(|(cap, extents)| IoRequest::Read {
        cap,
        keys: vec![],
        extents,
        inline_reply: true,
        keys_follow: None,
    });
    let follow =
        (capability(), keys_and_extents(), any::<u64>()).prop_map(|(cap, (keys, extents), tag)| IoRequest::Read {
            cap,
            keys: vec![],
            extents,
            inline_reply: false,
            keys_follow: Some(dafne_proto::KeysFollow { tag, count: keys.len().max(1) as u16 }),
        });
    prop_oneof![rma, inline, follow]
}

fn write() -> impl Strategy<Value = IoRequest> {
    (capability(), keys_and_extents(), inline_extents(), stability())
        .prop_flat_map(|(cap, (keys, keyed), inlined, stability)| {
            let inline_len: usize = inlined.iter().map(|e| e.len as usize).sum();
            // Keyed and inline extents interleaved in any order; the total
            // stays within MAX_IO_BYTES only if the keyed part leaves room.
            // The count stays within MAX_IO_EXTENTS likewise (a full keyed
            // list plus inline extents went past it: a rare false failure).
            let keyed: Vec<IoExtent> = {
                let mut total = inline_len as u64;
                keyed
                    .into_iter()
                    .take(MAX_IO_EXTENTS - inlined.len())
                    .take_while(|e| {
                        total += u64::from(e.len);
                        total <= MAX_IO_BYTES as u64
                    })
                    .collect()
            };
            let mut extents = keyed;
            extents.extend(inlined);
            (Just(cap), Just(keys), Just(extents).prop_shuffle(), Just(stability), vec(any::<u8>(), inline_len))
        })
        .prop_map(|(cap, keys, extents, stability, inline)| IoRequest::Write {
            cap,
            keys,
            extents,
            stability,
            inline,
            keys_follow: None,
        })
}

fn allocate_mode() -> impl Strategy<Value = AllocateMode> {
    (0..=4u8).prop_map(|v| AllocateMode::from_u8(v).unwrap())
}

/// A server's slots of a layout: 1 to MAX_LAYOUT_SERVERS stripes, any
/// non-empty ascending subset.
fn stripe_slots() -> impl Strategy<Value = StripeSlots> {
    (prop_oneof![1..=u32::MAX, Just(1u32 << 20), 1..=4096u32], 1..=MAX_LAYOUT_SERVERS as u32).prop_flat_map(
        |(unit, count)| {
            proptest::sample::subsequence((0..count).collect::<Vec<u32>>(), 1..=count as usize)
                .prop_map(move |slots| StripeSlots { unit, count, slots })
        },
    )
}

/// An Allocate within the limits: its range spans at most
/// MAX_ALLOCATE_STRIPES stripe units and ends by the largest file size.
fn allocate() -> impl Strategy<Value = IoRequest> {
    (capability(), allocate_mode(), stripe_slots(), any::<u64>(), any::<u64>()).prop_map(
        |(cap, mode, stripes, a, b)| {
            let unit = u64::from(stripes.unit);
            let max = dafne_proto::io::MAX_FILE_SIZE;
            let offset = a % max;
            // Room to the end of the span limit and of the file.
            let span_end = (offset / unit + dafne_proto::io::MAX_ALLOCATE_STRIPES) * unit;
            let room = span_end.min(max) - offset;
            let len = 1 + b % room;
            IoRequest::Allocate { cap, offset, len, mode, stripes }
        },
    )
}

fn request() -> impl Strategy<Value = IoRequest> {
    prop_oneof![
        3 => read(),
        3 => write(),
        1 => (capability(), 0..=dafne_proto::io::MAX_FILE_SIZE).prop_map(|(cap, size)| IoRequest::Truncate { cap, size }),
        2 => allocate(),
        1 => (any::<u64>(), vec(vec(any::<u8>(), 1..64), 1..=MAX_IO_KEYS)).prop_map(|(tag, keys)| IoRequest::Keys { tag, keys }),
        1 => capability().prop_map(|cap| IoRequest::Remove { cap }),
        1 => capability().prop_map(|cap| IoRequest::Sync { cap }),
        1 => capability().prop_map(|cap| IoRequest::Stat { cap }),
        1 => capability().prop_map(|cap| IoRequest::ServerInfo { cap }),
        1 => (capability(), any::<u64>(), any::<u64>()).prop_map(|(cap, object, offset)| IoRequest::Scrub { cap, object, offset }),
        1 => ("\\PC{0,64}", any::<[u8; 16]>(), any::<[u8; 32]>(), proptest::option::of(credential())).prop_map(
            |(client_name, nonce, mac, credential)| IoRequest::Login { client_name, nonce, mac, credential }
        ),
        1 => (capability(), any::<u64>(), 0..u64::MAX / 2, vec((any::<u64>(), any::<u64>()), 0..8)).prop_map(
            |(cap, instance, from_seq, e)| IoRequest::Revoke {
                cap,
                batch: dafne_proto::Revocations {
                    instance,
                    from_seq,
                    to_seq: from_seq + e.len() as u64,
                    reset_floor: 0,
                    entries: e
                        .into_iter()
                        .map(|(object_id, floor)| dafne_proto::Revocation { object_id, floor })
                        .collect(),
                    mac: [3; 32],
                },
            }
        ),
    ]
}

fn errno() -> impl Strategy<Value = Errno> {
    prop_oneof![(1..=MAX_ERRNO).prop_map(Errno), Just(Errno::EACCES), Just(Errno::ENOSPC)]
}

fn one_of(ops: &'static [IoOp]) -> impl Strategy<Value = IoOp> {
    proptest::sample::select(ops)
}

/// What an io server may answer: (op, result).
fn reply() -> impl Strategy<Value = (IoOp, Result<IoResponse, Errno>)> {
    let bytes = || prop_oneof![0..=MAX_IO_BYTES as u64, Just(MAX_IO_BYTES as u64)];
    let data = prop_oneof![
        4 => vec(any::<u8>(), 1..256),
        1 => vec(any::<u8>(), 1..=MAX_INLINE),
    ];
    prop_oneof![
        2 => bytes().prop_map(|bytes| (IoOp::Read, Ok(IoResponse::Read { bytes, data: vec![] }))),
        2 => data.prop_map(|data| (IoOp::Read, Ok(IoResponse::Read { bytes: data.len() as u64, data }))),
        2 => bytes().prop_map(|bytes| (IoOp::Write, Ok(IoResponse::Write { bytes }))),
        2 => one_of(&[IoOp::Truncate, IoOp::Remove, IoOp::Sync, IoOp::Login, IoOp::Allocate, IoOp::Keys]).prop_map(|op| (op, Ok(IoResponse::Done))),
        1 => any::<u64>().prop_map(|size| (IoOp::Stat, Ok(IoResponse::Stat { size }))),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(instance, seq)| (IoOp::Revoke, Ok(IoResponse::Revoked { instance, seq }))),
        1 => (any::<[u64; 4]>(), vec((any::<u64>(), any::<u64>()), 0..=MAX_SCRUB_BAD), proptest::option::of((any::<u64>(), any::<u64>()))).prop_map(|(v, bad, next)| {
            (IoOp::Scrub, Ok(IoResponse::Scrubbed(ScrubSlice { objects: v[0], unverified: v[1], bytes: v[2], bad, more_bad: v[3], next })))
        }),
        1 => vec(any::<u64>(), 32).prop_map(|v| (IoOp::ServerInfo, Ok(IoResponse::ServerInfo(Box::new(ServerInfo::from_values(&v)))))),
        2 => (one_of(IoOp::ALL), errno()).prop_map(|(op, e)| (op, Err(e))),
    ]
}

/// If `b` decodes as an io request or reply, it is the canonical encoding
/// of what it decodes to; and no message decodes in both protocols.
fn check_canonical(b: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((env, req)) = decode_io_request(b) {
        prop_assert_eq!(encode_io_request(env, &req), b);
        prop_assert!(req.total_bytes() <= MAX_IO_BYTES as u64);
        prop_assert!(decode_request(b).is_err());
    }
    if let Ok((tag, op, res)) = decode_io_reply(b) {
        prop_assert!(res.as_ref().map_or(true, |r| r.answers(op)));
        prop_assert_eq!(encode_io_reply(tag, op, &res), b);
        prop_assert!(decode_reply(b).is_err());
    }
    Ok(())
}

proptest! {
    #[test]
    fn requests_round_trip(env in envelope(), req in request()) {
        let b = encode_io_request(env, &req);
        prop_assert!(b.len() <= MAX_IO_REQUEST_LEN);
        prop_assert_eq!(decode_io_request(&b), Ok((env, req)));
        // A metadata server refuses it by its op number.
        prop_assert_eq!(decode_request(&b), Err(DecodeError::UnknownOp(u16::from_le_bytes([b[2], b[3]]))));
    }

    #[test]
    fn replies_round_trip(tag in any::<u64>(), (op, res) in reply()) {
        let b = encode_io_reply(tag, op, &res);
        prop_assert!(b.len() <= MAX_IO_REPLY_LEN);
        prop_assert_eq!(decode_io_reply(&b), Ok((tag, op, res)));
        prop_assert_eq!(decode_reply(&b), Err(DecodeError::UnknownOp(op.into())));
    }

    #[test]
    fn decoders_never_panic_on_bytes(b in vec(any::<u8>(), 0..2048)) {
        check_canonical(&b)?;
    }

    /// Random bodies behind valid headers reach the body decoders.
    #[test]
    fn decoders_never_panic_on_bodies(
        op in one_of(IoOp::ALL),
        env in envelope(),
        body in vec(any::<u8>(), 0..2048),
    ) {
        let len = body.len() as u32;
        let mut b = IoRequestHeader::new(op, env, len).encode().to_vec();
        b.extend_from_slice(&body);
        check_canonical(&b)?;
        let mut b = IoReplyHeader::new(op, env.tag, 0, len).encode().to_vec();
        b.extend_from_slice(&body);
        check_canonical(&b)?;
    }

    /// A corrupted byte either is refused or yields a canonical message.
    #[test]
    fn corrupted_requests(env in envelope(), req in request(), at in any::<usize>(), x in 1..=255u8) {
        let mut b = encode_io_request(env, &req);
        let i = at % b.len();
        b[i] ^= x;
        check_canonical(&b)?;
    }

    #[test]
    fn corrupted_replies(tag in any::<u64>(), (op, res) in reply(), at in any::<usize>(), x in 1..=255u8) {
        let mut b = encode_io_reply(tag, op, &res);
        let i = at % b.len();
        b[i] ^= x;
        check_canonical(&b)?;
    }

    /// Every strict prefix of a message is refused.
    #[test]
    fn truncation_is_refused(env in envelope(), req in request(), (op, res) in reply(), at in any::<usize>()) {
        let b = encode_io_request(env, &req);
        prop_assert!(decode_io_request(&b[..at % b.len()]).is_err());
        let b = encode_io_reply(env.tag, op, &res);
        prop_assert!(decode_io_reply(&b[..at % b.len()]).is_err());
    }

    /// Metadata messages are refused by the io decoders.
    #[test]
    fn metadata_messages_are_not_io(env in envelope(), ino in any::<u64>(), errno in errno()) {
        let b = encode_request(env, &Request::GetAttr { ino });
        prop_assert_eq!(decode_io_request(&b), Err(DecodeError::UnknownOp(Op::GetAttr.into())));
        let b = encode_reply(env.tag, Op::Open, &Err(errno));
        prop_assert_eq!(decode_io_reply(&b), Err(DecodeError::UnknownOp(Op::Open.into())));
    }
}
