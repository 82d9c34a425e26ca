//! Chain replication (issue 13, step 3; docs/REPLICATION.md, "Writes"),
//! with real processes: a cluster of two io servers with `[meta]
//! replicas = 2`, so each chain is both servers, head first. A client's
//! write goes to the chain's head, which forwards it to the other replica
//! with its own cache units' keys: the successor gets the bytes from the
//! head's memory by RMA, and both hold them.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{native_client, p, server_metric, server_pid, Again, Cluster};
use common::{dafne, text};
use dafne_proto::io::Stability;

/// One chain as `dafne status --json` shows it: (chain, health,
/// [(server, state)], head first).
type Row = (u64, String, Vec<(String, String)>);

/// `dafne status --json`'s chains.
fn chains(dir: &Path) -> Vec<Row> {
    let o = dafne().args(["status", "--json", "--dir", p(dir)]).output().unwrap();
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let Some(chains) = s["chains"].as_array() else { return Vec::new() };
    chains
        .iter()
        .map(|c| {
            let replicas = c["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| (r["server"].as_str().unwrap().to_string(), r["state"].as_str().unwrap().to_string()))
                .collect();
            (c["chain"].as_u64().unwrap(), c["health"].as_str().unwrap().to_string(), replicas)
        })
        .collect()
}

/// Whether a chunk file of io server `io` holds `want` from offset 0.
fn chunk_holds(dir: &Path, io: &str, want: &[u8]) -> bool {
    let Ok(entries) = std::fs::read_dir(dir.join(io).join("objects")) else { return false };
    entries.flatten().any(|e| std::fs::read(e.path()).is_ok_and(|b| b.len() >= want.len() && b[..want.len()] == *want))
}

fn metric(dir: &Path, io: &str, name: &str) -> f64 {
    server_metric(dir, io, name).unwrap_or_else(|| panic!("{name} on {io}'s metrics page"))
}

/// The test that matters for chain writes: a client writes and fsyncs;
/// both replicas hold the bytes on their device (each one's chunk file),
/// the successor having got them by RMA from the head's cache units (its
/// counter of received bytes, and no byte copied by its cache); then the
/// head is killed (-9), meta marks it offline once its lease lapsed, the
/// other replica heads the chain, and the client reads every byte back
/// from it with no error. Failed with the forward disabled (meta routing
/// no successor): the successor's chunk file did not hold the bytes; and
/// with the client's refetch of the chain table on a lost connection
/// disabled: the read after the kill failed with `EIO` at the retry
/// deadline.
#[test]
fn a_write_reaches_both_replicas_and_is_read_back_after_the_heads_kill() {
    let c = Cluster::start_sized(2, "[cluster]\nrestart = false\n[meta]\nstripe_count = 1\nreplicas = 2\n");
    for io in ["io-0", "io-1"] {
        common::wait_for("both io servers serving", || server_metric(c.dir(), io, "dafne_io_serving") == Some(1.0));
    }
    common::wait_for("every chain healthy with both replicas", || {
        let t = chains(c.dir());
        t.len() == 2 && t.iter().all(|(_, h, r)| h == "healthy" && r.len() == 2)
    });
    let (_rt, data, fs) = native_client(&c, "replication");
    let f = fs.create(fs.meta.root(), b"replicated", 0o644, None).unwrap();
    let h = f.handle().clone();
    assert_eq!(h.layout.servers.len(), 1);
    let chain = h.layout.servers[0] as u64;
    let row = chains(c.dir()).into_iter().find(|(id, _, _)| *id == chain).unwrap();
    let (head, successor) = (row.2[0].0.clone(), row.2[1].0.clone());

    let received = metric(c.dir(), &successor, "dafne_io_chain_received_bytes_total");
    let forwarded = metric(c.dir(), &head, "dafne_io_chain_forwarded_bytes_total");
    let copied = metric(c.dir(), &successor, "dafne_io_bytes_copied_total");
    // Several batches of units (8 MiB caches: 32 units of 64 KiB a batch).
    let len = (3 << 20) + 1234;
    let want = common::pattern(len, 13);
    f.write_at(0, &want, Stability::Unstable).unwrap();
    f.fsync().unwrap();
    // The fsync reached both replicas' devices.
    assert!(chunk_holds(c.dir(), &head, &want), "the head's chunk file holds the bytes");
    assert!(chunk_holds(c.dir(), &successor, &want), "the successor's chunk file holds the bytes");
    // The metrics pages render at most once a second: waited for.
    common::wait_for("the successor counting every byte got by RMA from the head", || {
        metric(c.dir(), &successor, "dafne_io_chain_received_bytes_total") - received >= len as f64
    });
    common::wait_for("the head counting every byte forwarded", || {
        metric(c.dir(), &head, "dafne_io_chain_forwarded_bytes_total") - forwarded >= len as f64
    });
    assert_eq!(
        metric(c.dir(), &successor, "dafne_io_bytes_copied_total"),
        copied,
        "no byte copied on the successor: the forward is zero-copy"
    );

    let pid = server_pid(c.dir(), &head);
    let again = Again::of(pid);
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    // Meta marks it offline a margin after its lease lapsed: the other
    // replica heads the chain.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let t = chains(c.dir());
        let r = t.iter().find(|(id, _, _)| *id == chain);
        if r.is_some_and(|(_, h, r)| h == "degraded" && r[0] == (successor.clone(), "serving".into())) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the chain stayed {r:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut got = vec![0u8; len];
    let n = futures::executor::block_on(data.read_at(&h, 0, &mut got)).expect("read back with no error");
    assert_eq!(n, len);
    assert!(got == want, "every byte read back from the new head");

    // The old head returns: it missed nothing yet, but resync is not
    // built, so meta makes it `syncing` (no writes, no reads) and says so.
    let _back = again.start(&c.dir().join("returned.log"));
    common::wait_for("the returned replica syncing behind the new head", || {
        chains(c.dir()).iter().find(|(id, _, _)| *id == chain).is_some_and(|(_, h, r)| {
            h == "degraded" && r[0] == (successor.clone(), "serving".into()) && r[1] == (head.clone(), "syncing".into())
        })
    });
    let table = text(&dafne().args(["status", "--dir", p(c.dir())]).output().unwrap());
    assert!(table.contains("syncing: a replica back after being offline"), "{table}");
    let mut again = vec![0u8; len];
    assert_eq!(futures::executor::block_on(data.read_at(&h, 0, &mut again)), Ok(len));
    assert!(again == want, "read from the serving head, not the syncing replica");
}

/// A client's write that reaches a replica which is not its chain's head
/// is refused before any effect (`not_head`): only the head orders and
/// forwards a chain's writes; and one marked forwarded from a connection
/// that is not a peer's (a credential's login) is refused (`EACCES`).
/// (With the forward disabled it failed too: the follower's chunk file
/// lacked what the head had been sent.)
#[test]
fn a_write_sent_to_a_replica_that_is_not_the_head_is_refused() {
    use dafne_proto::io::{decode_io_reply, encode_io_request, ChainRefusalReason, IoExtent, IoRequest, IoResponse};
    let c = Cluster::start_sized(2, "[meta]\nstripe_count = 1\nreplicas = 2\n");
    for io in ["io-0", "io-1"] {
        common::wait_for("both io servers serving", || server_metric(c.dir(), io, "dafne_io_serving") == Some(1.0));
    }
    common::wait_for("every chain healthy", || {
        let t = chains(c.dir());
        t.len() == 2 && t.iter().all(|(_, h, _)| h == "healthy")
    });
    let (rt, data, fs) = native_client(&c, "not-head");
    let f = fs.create(fs.meta.root(), b"f", 0o644, None).unwrap();
    let h = f.handle().clone();
    f.write_at(0, b"before", Stability::FileSync).unwrap();
    let chain = h.layout.servers[0];
    let version = data.chains().unwrap().iter().find(|c| c.id == chain).unwrap().version;
    let row = chains(c.dir()).into_iter().find(|(id, _, _)| *id == chain as u64).unwrap();
    let follower: usize = row.2[1].0.trim_start_matches("io-").parse().unwrap();
    // A crafted write with the right version, to the follower.
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir().join("cluster.json")).unwrap()).unwrap();
    let addr: std::net::SocketAddr = info["io"][follower].as_str().unwrap().parse().unwrap();
    let secret = dafne_auth::Secret::load(&c.dir().join("meta").join("cluster.secret")).unwrap();
    let client = dafne_transport::Client::connect(&rt, addr).unwrap();
    let nonce = [9u8; 16];
    let mac = secret.session_mac(client.token(), &nonce, "crafted");
    let keys = secret.frame_keys(client.token(), &nonce);
    let login = IoRequest::Login { client_name: "crafted".into(), nonce, mac, credential: None };
    client.login(encode_io_request(dafne_proto::Envelope::new(0, 0, 0), &login), keys).unwrap();
    let env = dafne_proto::Envelope {
        chain: Some(dafne_proto::ChainVersion { chain, version }),
        ..dafne_proto::Envelope::new(1, 0, 0)
    };
    let write = IoRequest::Write {
        cap: h.cap,
        keys: vec![],
        extents: vec![IoExtent { offset: 0, len: 5, key: dafne_proto::io::NO_KEY, addr: 0 }],
        stability: Stability::FileSync,
        inline: b"AFTER".to_vec(),
        keys_follow: None,
    };
    let answer = decode_io_reply(&client.call(encode_io_request(env, &write)).unwrap()).unwrap().2;
    assert!(matches!(answer, Ok(IoResponse::ChainRefused(r)) if r.reason == ChainRefusalReason::NotHead), "{answer:?}");
    // A client's read (and stat) of the chain goes to its head only: a
    // replica that is not the head may be `syncing` (back from offline,
    // missing writes: its route is the same, not head and no successor),
    // and a client sends it one only when its table names no serving
    // replica; it must be refused, not answered with what it holds.
    // Failed before: the follower answered the read with its bytes.
    let read = IoRequest::Read {
        cap: h.cap,
        keys: vec![],
        extents: vec![IoExtent { offset: 0, len: 6, key: dafne_proto::io::NO_KEY, addr: 0 }],
        inline_reply: true,
        keys_follow: None,
    };
    let answer = decode_io_reply(&client.call(encode_io_request(env, &read)).unwrap()).unwrap().2;
    assert!(
        matches!(answer, Ok(IoResponse::ChainRefused(r)) if r.reason == ChainRefusalReason::NotHead),
        "a client's read on a replica that is not the head: {answer:?}"
    );
    // Marked forwarded, from a connection that logged in with a
    // credential (even one that keeps root), not the cluster secret:
    // refused too, before any effect (only a peer io server forwards).
    let cred = c.dir().join("alice.cred");
    let o = dafne()
        .args(["credential", "issue", "alice", "--dir", p(c.dir()), "-o", p(&cred)])
        .args(["--uid", "0", "--gid", "0", "--root"])
        .output()
        .unwrap();
    assert!(o.status.success(), "dafne credential issue failed:\n{}", text(&o));
    let key: dafne_auth::LoginKey = dafne_auth::CredentialFile::load(&cred).unwrap().into();
    let peer = dafne_transport::Client::connect(&rt, addr).unwrap();
    let mac = key.session_mac(peer.token(), &nonce, "crafted");
    let keys = key.key().frame_keys(peer.token(), &nonce);
    let login = IoRequest::Login { client_name: "crafted".into(), nonce, mac, credential: key.credential().cloned() };
    let answer =
        decode_io_reply(&peer.login(encode_io_request(dafne_proto::Envelope::new(0, 0, 0), &login), keys).unwrap())
            .unwrap()
            .2;
    assert_eq!(answer, Ok(IoResponse::Done), "the credential's login");
    let fwd = dafne_proto::Envelope { forwarded: true, ..env };
    let answer = decode_io_reply(&peer.call(encode_io_request(fwd, &write)).unwrap()).unwrap().2;
    assert_eq!(answer, Err(dafne_proto::Errno::EACCES), "a forwarded write from a non-peer");
    // No effect: the follower's chunk file holds what the head forwarded.
    assert!(chunk_holds(c.dir(), &format!("io-{follower}"), b"before"));
    let mut got = vec![0u8; 6];
    futures::executor::block_on(data.read_at(&h, 0, &mut got)).unwrap();
    assert_eq!(&got, b"before", "the head's copy, which the refused write did not reach");
}
