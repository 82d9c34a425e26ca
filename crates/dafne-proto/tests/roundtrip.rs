//! Properties of the wire contract over generated values and bytes:
//! everything encodable decodes to itself, encodings are canonical, and no
//! input makes a decoder panic.

use dafne_proto::*;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => vec(any::<u8>(), 0..24),
        1 => vec(any::<u8>(), 0..=MAX_NAME_WIRE),
        1 => Just(vec![b'n'; MAX_NAME_WIRE]),
    ]
}

fn target() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => vec(any::<u8>(), 0..64),
        1 => vec(any::<u8>(), 0..=MAX_SYMLINK),
        1 => Just(vec![b't'; MAX_SYMLINK]),
    ]
}

fn timespec() -> impl Strategy<Value = Timespec> {
    (any::<i64>(), 0..1_000_000_000u32).prop_map(|(sec, nsec)| Timespec { sec, nsec })
}

fn file_type() -> impl Strategy<Value = FileType> {
    proptest::sample::select(FileType::ALL)
}

fn mode() -> impl Strategy<Value = u32> {
    0..=MODE_MASK
}

fn attr() -> impl Strategy<Value = Attr> {
    (
        any::<u64>(),
        file_type(),
        mode(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        timespec(),
        timespec(),
        timespec(),
    )
        .prop_map(|(ino, kind, mode, nlink, uid, gid, rdev, size, blocks, atime, mtime, ctime)| Attr {
            ino,
            kind,
            mode,
            nlink,
            uid,
            gid,
            rdev,
            size,
            blocks,
            atime,
            mtime,
            ctime,
        })
}

fn time_set() -> impl Strategy<Value = TimeSet> {
    prop_oneof![Just(TimeSet::Now), timespec().prop_map(TimeSet::At)]
}

fn set_attr() -> impl Strategy<Value = SetAttr> {
    (
        option::of(mode()),
        option::of(any::<u32>()),
        option::of(any::<u32>()),
        option::of(any::<u64>()),
        option::of(time_set()),
        option::of(time_set()),
        option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(mode, uid, gid, size, atime, mtime, grow_to, lazy)| SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            grow_to,
            lazy,
        })
}

fn hint() -> impl Strategy<Value = Option<LayoutHint>> {
    option::of(
        (any::<u32>(), any::<u32>()).prop_map(|(stripe_unit, stripe_count)| LayoutHint { stripe_unit, stripe_count }),
    )
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        proptest::collection::vec(any::<u32>(), 0..=dafne_proto::MAX_GROUPS),
        proptest::option::of((any::<u64>(), any::<u64>(), 0..dafne_proto::SEQ_WINDOW)),
    )
        .prop_map(|(tag, uid, gid, groups, session)| Envelope {
            tag,
            uid,
            gid,
            groups: dafne_proto::Groups::new(&groups),
            // Any sequence inside the window the decoder accepts.
            session: session.map(|(client, seq, behind)| dafne_proto::SessionSeq {
                client,
                seq,
                acked_below: seq.saturating_sub(behind),
            }),
            // Io only.
            chain: None,
            forwarded: false,
        })
}

/// Any request but Compound; SessionOpen only if `session`.
fn simple_request(session: bool) -> BoxedStrategy<Request> {
    let ino = any::<Ino>;
    let others = prop_oneof![
        (ino(), name()).prop_map(|(parent, name)| Request::Lookup { parent, name }),
        ino().prop_map(|ino| Request::GetAttr { ino }),
        (ino(), set_attr()).prop_map(|(ino, set)| Request::SetAttr { ino, set }),
        (ino(), name(), mode(), any::<bool>(), hint())
            .prop_map(|(parent, name, mode, exclusive, hint)| Request::Create { parent, name, mode, exclusive, hint }),
        (ino(), name(), mode()).prop_map(|(parent, name, mode)| Request::Mkdir { parent, name, mode }),
        (ino(), name(), file_type(), mode(), any::<u64>())
            .prop_map(|(parent, name, kind, mode, rdev)| Request::Mknod { parent, name, kind, mode, rdev }),
        (ino(), any::<u64>(), any::<u32>())
            .prop_map(|(ino, cookie, max_entries)| { Request::Readdir { ino, cookie, max_entries } }),
        (ino(), name()).prop_map(|(parent, name)| Request::Unlink { parent, name }),
        (ino(), name()).prop_map(|(parent, name)| Request::Rmdir { parent, name }),
        (ino(), name(), ino(), name(), 0..=(RENAME_NOREPLACE | RENAME_EXCHANGE)).prop_map(
            |(src_parent, src_name, dst_parent, dst_name, flags)| Request::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                flags
            }
        ),
        (ino(), name(), target()).prop_map(|(parent, name, target)| Request::Symlink { parent, name, target }),
        ino().prop_map(|ino| Request::Readlink { ino }),
        (ino(), ino(), name()).prop_map(|(ino, new_parent, new_name)| Request::Link { ino, new_parent, new_name }),
        Just(Request::Statfs),
        (ino(), 0..=(OPEN_READ | OPEN_WRITE | OPEN_TRUNC)).prop_map(|(ino, flags)| Request::Open { ino, flags }),
    ];
    if !session {
        return others.boxed();
    }
    let session = ("\\PC{0,64}", any::<[u8; 16]>(), any::<[u8; 32]>(), option::of(credential()))
        .prop_map(|(client_name, nonce, mac, credential)| Request::SessionOpen { client_name, nonce, mac, credential });
    prop_oneof![1 => session, 15 => others].boxed()
}

/// A Compound the decoder accepts: chain only where there is a previous op
/// and an inode argument to replace.
fn compound_request() -> impl Strategy<Value = Request> {
    vec((any::<bool>(), simple_request(false)), 0..=MAX_COMPOUND).prop_map(|ops| {
        let ops = ops
            .into_iter()
            .enumerate()
            .map(|(i, (chain, req))| {
                let mut op = CompoundOp { chain, req };
                op.chain = chain && i > 0 && op.primary_ino_mut().is_some();
                op
            })
            .collect();
        Request::Compound { ops }
    })
}

/// The orphan ops, which travel alone (never inside a Compound).
fn orphan_request() -> impl Strategy<Value = Request> {
    let objects = prop_oneof![
        4 => vec(any::<u64>(), 0..8),
        1 => vec(any::<u64>(), 0..=MAX_FORGET_ORPHANS),
    ];
    prop_oneof![
        (any::<u32>(), any::<u32>()).prop_map(|(older_than_s, max)| Request::ListOrphans { older_than_s, max }),
        objects.prop_map(|objects| Request::ForgetOrphans { objects }),
    ]
}

/// Opens held, as a reconnecting client re-announces them: object ids
/// strictly increasing (a set, in order), counts at least 1.
fn held_opens(max: usize) -> impl Strategy<Value = Vec<HeldOpen>> {
    vec((any::<u64>(), 1..=u32::MAX), 0..=max).prop_map(|v| {
        let set: std::collections::BTreeMap<u64, u32> = v.into_iter().collect();
        set.into_iter().map(|(object_id, count)| HeldOpen { object_id, count }).collect()
    })
}

/// An id range the decoder accepts (first ≤ last).
fn id_range() -> impl Strategy<Value = IdRange> {
    (any::<u32>(), any::<u32>()).prop_map(|(a, b)| IdRange { first: a.min(b), last: a.max(b) })
}

/// A credential policy the decoder accepts.
pub fn credential() -> impl Strategy<Value = Credential> {
    ("\\PC{1,64}", vec(id_range(), 0..=8), vec(id_range(), 0..=MAX_CREDENTIAL_RANGES), any::<bool>())
        .prop_map(|(name, uids, gids, root)| Credential { name, uids, gids, root })
}

/// The open-table ops, which travel alone (never inside a Compound).
fn open_table_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        any::<u64>().prop_map(|object_id| Request::Close { object_id }),
        prop_oneof![4 => held_opens(8), 1 => held_opens(MAX_REOPEN)].prop_map(|held| Request::Reopen { held }),
        capability().prop_map(|cap| Request::Recap { cap }),
        (any::<u64>(), any::<u64>()).prop_map(|(instance, since)| Request::Revocations { instance, since }),
        "\\PC{1,64}".prop_map(|name| Request::RevokeCredential { name }),
    ]
}

/// Any socket address (the decoder accepts exactly the text Rust prints).
fn socket_addr() -> impl Strategy<Value = std::net::SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| std::net::SocketAddr::from((ip, port))),
        (any::<[u8; 16]>(), any::<u16>(), any::<u32>()).prop_map(|(ip, port, scope)| {
            std::net::SocketAddr::V6(std::net::SocketAddrV6::new(ip.into(), port, 0, scope))
        }),
    ]
}

fn host_name() -> impl Strategy<Value = String> {
    // Printable ASCII without spaces or '|' (what the decoder accepts).
    prop_oneof![4 => "[!-{}~]{0,32}", 1 => "[a-z]{255}"]
}

/// The membership ops, which travel alone.
fn member_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u32>(), any::<u64>(), socket_addr(), host_name(), any::<u64>(), any::<u64>()).prop_map(
            |(server, instance, addr, host, capacity_bytes, used_bytes)| {
                Request::ServerHeartbeat(Heartbeat { server, instance, addr, host, capacity_bytes, used_bytes })
            }
        ),
        Just(Request::Members),
    ]
}

/// A `Members` answer: ids strictly increasing, up to the bound.
fn members_response() -> impl Strategy<Value = Response> {
    let state = prop_oneof![Just(MemberState::Up), Just(MemberState::Down), Just(MemberState::Unknown)];
    let member = (state, socket_addr(), host_name(), any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).boxed();
    let members = prop_oneof![4 => vec(member.clone(), 0..8), 1 => vec(member, MAX_MEMBERS..=MAX_MEMBERS)];
    (members, chains()).prop_map(|(ms, chains)| {
        let members = ms
            .into_iter()
            .enumerate()
            .map(|(i, (state, addr, host, since_ms, restarts, capacity_bytes, used_bytes))| {
                let m =
                    Member { server: i as u32 * 2, state, addr, host, since_ms, restarts, capacity_bytes, used_bytes };
                // An unknown server carries nothing but its id.
                match state {
                    MemberState::Unknown => Member {
                        addr: "0.0.0.0:0".parse().unwrap(),
                        host: String::new(),
                        since_ms: 0,
                        restarts: 0,
                        capacity_bytes: 0,
                        used_bytes: 0,
                        ..m
                    },
                    _ => m,
                }
            })
            .collect();
        Response::Members { members, chains }
    })
}

/// Meta's chain table: ids strictly increasing, each chain's servers
/// distinct, up to the bounds.
fn chains() -> impl Strategy<Value = Vec<dafne_proto::Chain>> {
    use dafne_proto::{Chain, Replica, ReplicaState, MAX_CHAINS, MAX_CHAIN_REPLICAS};
    let state = prop_oneof![Just(ReplicaState::Serving), Just(ReplicaState::Syncing), Just(ReplicaState::Offline)];
    let chain = (any::<u64>(), any::<u32>(), vec(state, 1..=MAX_CHAIN_REPLICAS)).boxed();
    prop_oneof![4 => vec(chain.clone(), 0..6), 1 => vec(chain, MAX_CHAINS..=MAX_CHAINS)].prop_map(|cs| {
        cs.into_iter()
            .enumerate()
            .map(|(i, (version, base, states))| Chain {
                id: i as u32 * 3,
                version,
                replicas: states
                    .into_iter()
                    .enumerate()
                    .map(|(j, state)| Replica { server: base.wrapping_add(j as u32), state })
                    .collect(),
            })
            .collect()
    })
}

/// A lock range the decoder accepts (start ≤ end), often to the end of the
/// file.
fn lock_range() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        (any::<u64>(), any::<u64>()).prop_map(|(a, b)| (a.min(b), a.max(b))),
        any::<u64>().prop_map(|a| (a, u64::MAX)),
    ]
}

fn lock_kind() -> impl Strategy<Value = LockKind> {
    prop_oneof![Just(LockKind::Read), Just(LockKind::Write), Just(LockKind::Unlock)]
}

/// The lock ops, which travel alone (never inside a Compound).
fn lock_request() -> impl Strategy<Value = Request> {
    let ids = (any::<Ino>(), any::<u64>(), any::<u64>());
    prop_oneof![
        (ids, any::<u32>(), lock_range(), lock_kind(), 0..=LOCK_FLAGS).prop_map(
            |((ino, client, owner), pid, (start, end), kind, flags)| Request::Lock {
                ino,
                client,
                owner,
                pid,
                start,
                end,
                kind,
                flags
            }
        ),
        any::<u64>().prop_map(|since| Request::Watch { since }),
        (ids, lock_range(), prop_oneof![Just(LockKind::Read), Just(LockKind::Write)]).prop_map(
            |((ino, client, owner), (start, end), kind)| Request::TestLock { ino, client, owner, start, end, kind }
        ),
    ]
}

/// An extended attribute value: mostly short, sometimes up to the limit.
fn xattr_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => vec(any::<u8>(), 0..64),
        1 => vec(any::<u8>(), 0..=XATTR_SIZE_MAX),
        1 => Just(vec![b'v'; XATTR_SIZE_MAX]),
    ]
}

/// The extended attribute ops, which travel alone (never inside a Compound).
fn xattr_request() -> impl Strategy<Value = Request> {
    let ino = any::<Ino>;
    prop_oneof![
        (ino(), name(), xattr_value(), 0..=(XATTR_CREATE | XATTR_REPLACE))
            .prop_map(|(ino, name, value, flags)| Request::SetXattr { ino, name, value, flags }),
        (ino(), name()).prop_map(|(ino, name)| Request::GetXattr { ino, name }),
        ino().prop_map(|ino| Request::ListXattr { ino }),
        (ino(), name()).prop_map(|(ino, name)| Request::RemoveXattr { ino, name }),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        3 => simple_request(true),
        1 => compound_request(),
        1 => orphan_request(),
        1 => open_table_request(),
        1 => lock_request(),
        1 => xattr_request(),
        1 => member_request(),
    ]
}

fn errno() -> impl Strategy<Value = Errno> {
    prop_oneof![(1..=MAX_ERRNO).prop_map(Errno), Just(Errno::ENOENT), Just(Errno::ESTALE),]
}

fn dir_entry() -> impl Strategy<Value = DirEntry> {
    (name(), any::<Ino>(), file_type(), any::<u64>()).prop_map(|(name, ino, kind, cookie)| DirEntry {
        name,
        ino,
        kind,
        cookie,
    })
}

fn layout() -> impl Strategy<Value = Layout> {
    let servers = prop_oneof![
        4 => vec(any::<u32>(), 0..8),
        1 => vec(any::<u32>(), 0..=MAX_LAYOUT_SERVERS),
    ];
    (any::<u64>(), any::<u32>(), any::<u32>(), servers).prop_map(|(object_id, stripe_unit, stripe_count, servers)| {
        Layout { object_id, stripe_unit, stripe_count, servers }
    })
}

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

fn stat_fs() -> impl Strategy<Value = StatFs> {
    (any::<[u64; 5]>(), any::<u32>(), any::<u32>()).prop_map(|(n, bsize, namelen)| StatFs {
        blocks: n[0],
        bfree: n[1],
        bavail: n[2],
        files: n[3],
        ffree: n[4],
        bsize,
        namelen,
    })
}

fn one_of(ops: &'static [Op]) -> impl Strategy<Value = Op> {
    proptest::sample::select(ops)
}

/// A successful answer (not Session, not Compound) with an op it answers.
fn simple_response() -> BoxedStrategy<(Op, Response)> {
    prop_oneof![
        (one_of(&[Op::Lookup, Op::Create, Op::Mkdir, Op::Mknod, Op::Symlink, Op::Link]), attr())
            .prop_map(|(op, attr)| (op, Response::Entry { attr })),
        (one_of(&[Op::GetAttr, Op::SetAttr]), attr()).prop_map(|(op, attr)| (op, Response::Attr { attr })),
        (
            prop_oneof![
                4 => vec(dir_entry(), 0..8),
                1 => vec(dir_entry(), 0..=MAX_READDIR_ENTRIES),
            ],
            any::<bool>()
        )
            .prop_map(|(entries, eof)| (Op::Readdir, Response::Dir { entries, eof })),
        one_of(&[
            Op::Unlink,
            Op::Rmdir,
            Op::Rename,
            Op::ForgetOrphans,
            Op::Close,
            Op::Reopen,
            Op::SetXattr,
            Op::RemoveXattr,
            Op::Lock
        ])
        .prop_map(|op| (op, Response::Done)),
        target().prop_map(|target| (Op::Readlink, Response::Link { target })),
        stat_fs().prop_map(|s| (Op::Statfs, Response::StatFs(s))),
        (attr(), layout(), capability())
            .prop_map(|(attr, layout, cap)| (Op::Open, Response::Opened { attr, layout, cap })),
    ]
    .boxed()
}

fn orphan() -> impl Strategy<Value = Orphan> {
    let servers = prop_oneof![
        4 => vec(any::<u32>(), 0..8),
        1 => vec(any::<u32>(), 0..=MAX_LAYOUT_SERVERS),
    ];
    (any::<u64>(), servers).prop_map(|(object_id, servers)| Orphan { object_id, servers })
}

/// A ListOrphans answer (never inside a Compound).
fn orphans_response() -> impl Strategy<Value = Response> {
    prop_oneof![
        4 => vec(orphan(), 0..8),
        1 => vec(orphan(), 0..=MAX_ORPHANS),
    ]
    .prop_map(|orphans| Response::Orphans { orphans, generation: 7 })
}

/// A Revocations answer (never inside a Compound).
fn revocations() -> impl Strategy<Value = dafne_proto::Revocations> {
    let entries = prop_oneof![
        4 => vec((any::<u64>(), any::<u64>()), 0..8),
        1 => vec((any::<u64>(), any::<u64>()), 0..=dafne_proto::MAX_REVOCATIONS),
    ];
    (any::<u64>(), 0..u64::MAX / 2, any::<u64>(), entries, any::<[u8; 32]>()).prop_map(
        |(instance, from_seq, reset_floor, e, mac)| dafne_proto::Revocations {
            instance,
            from_seq,
            to_seq: from_seq + e.len() as u64,
            reset_floor,
            entries: e.into_iter().map(|(object_id, floor)| dafne_proto::Revocation { object_id, floor }).collect(),
            mac,
        },
    )
}

/// A GetXattr or ListXattr answer (never inside a Compound).
fn xattr_response() -> impl Strategy<Value = (Op, Result<Response, Errno>)> {
    let xname = vec(any::<u8>(), 0..=XATTR_NAME_MAX);
    prop_oneof![
        xattr_value().prop_map(|value| (Op::GetXattr, Ok(Response::Xattr { value }))),
        prop_oneof![4 => vec(xname.clone(), 0..8), 1 => vec(xname, 0..=MAX_XATTR_NAMES)]
            .prop_map(|names| (Op::ListXattr, Ok(Response::XattrNames { names }))),
    ]
}

/// A Compound answer: successes, possibly ended by one error.
fn compound_response() -> impl Strategy<Value = Response> {
    (vec(simple_response(), 0..MAX_COMPOUND), option::of(errno())).prop_map(|(oks, err)| {
        let mut results: Vec<_> = oks.into_iter().map(|(_, r)| Ok(r)).collect();
        results.extend(err.map(Err));
        Response::Compound { results }
    })
}

/// What a server may answer: (op, result).
fn reply() -> impl Strategy<Value = (Op, Result<Response, Errno>)> {
    let session = (any::<u64>(), any::<Ino>())
        .prop_map(|(session_id, root)| (Op::SessionOpen, Ok(Response::Session { session_id, root })));
    prop_oneof![
        6 => simple_response().prop_map(|(op, r)| (op, Ok(r))),
        1 => session,
        2 => compound_response().prop_map(|r| (Op::Compound, Ok(r))),
        1 => orphans_response().prop_map(|r| (Op::ListOrphans, Ok(r))),
        1 => capability().prop_map(|cap| (Op::Recap, Ok(Response::Cap { cap }))),
        1 => revocations().prop_map(|v| (Op::Revocations, Ok(Response::Revocations(v)))),
        1 => option::of((lock_range(), prop_oneof![Just(LockKind::Read), Just(LockKind::Write)], any::<u32>()))
            .prop_map(|c| {
                let conflict = c.map(|((start, end), kind, pid)| LockHolder { start, end, kind, pid });
                (Op::TestLock, Ok(Response::LockTest { conflict }))
            }),
        1 => xattr_response(),
        1 => members_response().prop_map(|r| (Op::Members, Ok(r))),
        1 => (any::<u64>(), any::<bool>(), vec((any::<u64>(), option::of((1..=u64::MAX, name()))), 0..8)).prop_map(
            |(next, lost, c)| {
                let changes = c
                    .into_iter()
                    .map(|(ino, entry)| match entry {
                        Some((parent, name)) if !name.is_empty() => Change { ino, parent, name },
                        _ => Change { ino, parent: 0, name: vec![] },
                    })
                    .collect();
                (Op::Watch, Ok(Response::Changes { next, lost, changes }))
            }
        ),
        2 => (one_of(Op::ALL), errno()).prop_map(|(op, e)| (op, Err(e))),
    ]
}

/// If `b` decodes as a request or reply, it is the canonical encoding of
/// what it decodes to.
fn check_canonical(b: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((env, req)) = decode_request(b) {
        prop_assert_eq!(encode_request(env, &req), b);
    }
    if let Ok((tag, op, res)) = decode_reply(b) {
        prop_assert!(res.as_ref().map_or(true, |r| r.answers(op)));
        prop_assert_eq!(encode_reply(tag, op, &res), b);
    }
    Ok(())
}

proptest! {
    #[test]
    fn requests_round_trip(env in envelope(), req in request()) {
        let b = encode_request(env, &req);
        prop_assert_eq!(decode_request(&b), Ok((env, req)));
    }

    #[test]
    fn replies_round_trip(tag in any::<u64>(), (op, res) in reply()) {
        let b = encode_reply(tag, op, &res);
        prop_assert_eq!(decode_reply(&b), Ok((tag, op, res)));
    }

    #[test]
    fn decoders_never_panic_on_bytes(b in vec(any::<u8>(), 0..2048)) {
        check_canonical(&b)?;
    }

    /// Random bodies behind valid headers reach the body decoders.
    #[test]
    fn decoders_never_panic_on_bodies(
        op in one_of(Op::ALL),
        env in envelope(),
        body in vec(any::<u8>(), 0..2048),
    ) {
        let len = body.len() as u32;
        let mut b = RequestHeader::new(op, env, len).encode().to_vec();
        b.extend_from_slice(&body);
        check_canonical(&b)?;
        let mut b = ReplyHeader::new(op, env.tag, 0, len).encode().to_vec();
        b.extend_from_slice(&body);
        check_canonical(&b)?;
    }

    /// A corrupted byte either is refused or yields a canonical message.
    #[test]
    fn corrupted_requests(env in envelope(), req in request(), at in any::<usize>(), x in 1..=255u8) {
        let mut b = encode_request(env, &req);
        let i = at % b.len();
        b[i] ^= x;
        check_canonical(&b)?;
    }

    #[test]
    fn corrupted_replies(tag in any::<u64>(), (op, res) in reply(), at in any::<usize>(), x in 1..=255u8) {
        let mut b = encode_reply(tag, op, &res);
        let i = at % b.len();
        b[i] ^= x;
        check_canonical(&b)?;
    }

    /// The orphan ops are refused inside a Compound, and their answer
    /// inside a Compound's results.
    #[test]
    fn orphan_ops_travel_alone(env in envelope(), req in orphan_request(), resp in orphans_response()) {
        let b = encode_request(env, &Request::Compound { ops: vec![CompoundOp { chain: false, req }] });
        prop_assert!(decode_request(&b).is_err());
        let alone = encode_reply(env.tag, Op::ListOrphans, &Ok(resp.clone()));
        let compound = Response::Compound { results: vec![Ok(resp)] };
        prop_assert!(!compound.answers(Op::Compound));
        // A Compound reply of one result: errno 0, kind Orphans (10), body.
        let mut body = 1u32.to_le_bytes().to_vec();
        body.extend_from_slice(&0i32.to_le_bytes());
        body.push(10);
        body.extend_from_slice(&alone[ReplyHeader::SIZE..]);
        let mut b = ReplyHeader::new(Op::Compound, env.tag, 0, body.len() as u32).encode().to_vec();
        b.extend_from_slice(&body);
        prop_assert!(decode_reply(&b).is_err());
    }

    /// The xattr ops are refused inside a Compound.
    #[test]
    fn xattr_ops_travel_alone(env in envelope(), req in xattr_request()) {
        let b = encode_request(env, &Request::Compound { ops: vec![CompoundOp { chain: false, req }] });
        prop_assert!(decode_request(&b).is_err());
    }

    /// The membership ops are refused inside a Compound, and their answer
    /// inside a Compound's results.
    #[test]
    fn member_ops_travel_alone(env in envelope(), req in member_request(), resp in members_response()) {
        let b = encode_request(env, &Request::Compound { ops: vec![CompoundOp { chain: false, req }] });
        prop_assert!(decode_request(&b).is_err());
        let alone = encode_reply(env.tag, Op::Members, &Ok(resp));
        // A Compound reply of one result: errno 0, kind Members (17), body.
        let mut body = 1u32.to_le_bytes().to_vec();
        body.extend_from_slice(&0i32.to_le_bytes());
        body.push(17);
        body.extend_from_slice(&alone[ReplyHeader::SIZE..]);
        let mut b = ReplyHeader::new(Op::Compound, env.tag, 0, body.len() as u32).encode().to_vec();
        b.extend_from_slice(&body);
        prop_assert!(decode_reply(&b).is_err());
    }

    /// Close and Reopen are refused inside a Compound.
    #[test]
    fn open_table_ops_travel_alone(env in envelope(), req in open_table_request()) {
        let b = encode_request(env, &Request::Compound { ops: vec![CompoundOp { chain: false, req }] });
        prop_assert!(decode_request(&b).is_err());
    }

    /// A Reopen with an object twice, out of order, or a count of 0 is
    /// refused (one meaning, one encoding); the same entries in order with
    /// counts of at least 1 are accepted.
    #[test]
    fn reopen_entries_are_a_set_in_order(env in envelope(), held in held_opens(16), i in any::<usize>(), j in any::<usize>()) {
        prop_assume!(held.len() >= 2);
        let ok = encode_request(env, &Request::Reopen { held: held.clone() });
        prop_assert!(decode_request(&ok).is_ok());
        let (i, j) = (i % held.len(), j % held.len());
        let mut swapped = held.clone();
        swapped.swap(i, j);
        let mut twice = held.clone();
        twice[j] = twice[i];
        let mut zero = held.clone();
        zero[i].count = 0;
        for bad in [swapped, twice, zero] {
            if bad != held {
                let req = Request::Reopen { held: bad };
                let refused = decode_request(&encode_request(env, &req)).is_err();
                prop_assert!(refused, "accepted {:?}", req);
            }
        }
    }

    /// Every strict prefix of a message is refused.
    #[test]
    fn truncation_is_refused(env in envelope(), req in request(), (op, res) in reply(), at in any::<usize>()) {
        let b = encode_request(env, &req);
        prop_assert!(decode_request(&b[..at % b.len()]).is_err());
        let b = encode_reply(env.tag, op, &res);
        prop_assert!(decode_reply(&b[..at % b.len()]).is_err());
    }
}
