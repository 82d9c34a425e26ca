//! The metadata server's metrics page (`--metrics-listen`): requests and
//! errors by op (counted where requests are answered), sessions, open
//! files, locks, the store's batches and commits (group commit: jobs per
//! batch), the io servers' states from their heartbeats (`crate::members`:
//! a count per state, and per io server 1 or 0, labelled `io_server`,
//! since `server` names this page's server), the transport's counters and
//! the process's CPU time and memory, every sample labelled `server="NAME"`.

use dafne_metrics::{Kind, Text};
use dafne_transport::TransportStatsSnapshot;

use crate::service::MetaStats;

/// The page of the server `server`.
pub fn render(server: &str, s: &MetaStats, transport: &TransportStatsSnapshot) -> String {
    let mut t = Text::new(&[("server", server)]);
    t.family("dafne_server_info", Kind::Gauge, "Always 1: what this server is, in its labels.")
        .sample(&[("kind", "meta"), ("version", env!("CARGO_PKG_VERSION"))], 1);
    let mut f = t.family("dafne_meta_requests_total", Kind::Counter, "Requests answered, by op (errors included).");
    for (op, n, _) in &s.ops {
        f.sample(&[("op", &dafne_metrics::snake(op.name()))], *n);
    }
    let mut f = t.family("dafne_meta_request_errors_total", Kind::Counter, "Requests answered with an error, by op.");
    for (op, _, e) in &s.ops {
        f.sample(&[("op", &dafne_metrics::snake(op.name()))], *e);
    }
    t.single(
        "dafne_meta_undecodable_requests_total",
        Kind::Counter,
        "Requests that could not be decoded (answered EPROTO).",
        s.undecodable,
    );
    t.single("dafne_meta_sessions", Kind::Gauge, "Client sessions logged in now.", s.sessions);
    t.single("dafne_meta_sessions_opened_total", Kind::Counter, "Sessions opened since start.", s.sessions_opened);
    t.single(
        "dafne_meta_open_files",
        Kind::Gauge,
        "Opens held by all sessions, with those of ended sessions still protected.",
        s.open_files,
    );
    t.single("dafne_meta_locked_ranges", Kind::Gauge, "Byte ranges locked now.", s.locked_ranges);
    t.single("dafne_meta_lock_waiters", Kind::Gauge, "Lock requests waiting now.", s.lock_waiters);
    t.single(
        "dafne_meta_store_batches_total",
        Kind::Counter,
        "Batches the store thread executed (one transaction each).",
        s.store_batches,
    );
    t.single("dafne_meta_store_jobs_total", Kind::Counter, "Client jobs in those batches.", s.store_jobs);
    if let Some(c) = s.commits {
        t.single("dafne_meta_commits_total", Kind::Counter, "Store transactions committed (each one fsync).", c);
    }
    if let Some(c) = s.lazy_commits {
        t.single(
            "dafne_meta_lazy_commits_total",
            Kind::Counter,
            "Store transactions committed without an fsync (only lazy size publishes), durable with the next commit.",
            c,
        );
    }
    let mut counts = [0u64; 3];
    for m in &s.members {
        counts[m.state as usize - 1] += 1;
    }
    let mut f = t.family(
        "dafne_meta_io_servers",
        Kind::Gauge,
        "The cluster's io servers by state, as their heartbeats tell (up: heard within the lease; unknown: never \
         heard since this server started).",
    );
    for (state, n) in [("up", counts[0]), ("down", counts[1]), ("unknown", counts[2])] {
        f.sample(&[("state", state)], n);
    }
    let mut f = t.family(
        "dafne_meta_io_server_up",
        Kind::Gauge,
        "1 while the io server's heartbeats arrive within the lease, else 0.",
    );
    for m in &s.members {
        let name = format!("io-{}", m.server);
        f.sample(&[("io_server", &name), ("host", &m.host)], u64::from(m.state == dafne_proto::MemberState::Up));
    }
    let mut f = t.family(
        "dafne_meta_chains",
        Kind::Gauge,
        "The chain table's chains by health (healthy: every replica serving; degraded: some offline or \
         syncing, one serving; unavailable: none serving).",
    );
    let health: Vec<dafne_proto::ChainHealth> = s.chains.iter().map(|c| c.health()).collect();
    for h in
        [dafne_proto::ChainHealth::Healthy, dafne_proto::ChainHealth::Degraded, dafne_proto::ChainHealth::Unavailable]
    {
        f.sample(&[("health", h.name())], health.iter().filter(|&&x| x == h).count() as u64);
    }
    let mut f = t.family("dafne_meta_chain_version", Kind::Gauge, "Each chain's version in the chain table.");
    for c in &s.chains {
        f.sample(&[("chain", &c.id.to_string())], c.version);
    }
    dafne_metrics::write_fields(
        &mut t,
        "dafne_transport_",
        &transport.described(),
        &["requests_in_flight", "listener_paused"],
    );
    dafne_metrics::write_process(&mut t);
    t.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_valid() {
        let s = MetaStats {
            ops: vec![(dafne_proto::Op::Lookup, 4, 1), (dafne_proto::Op::SessionOpen, 1, 0)],
            commits: Some(2),
            sessions: 1,
            members: vec![
                dafne_proto::Member {
                    server: 0,
                    state: dafne_proto::MemberState::Up,
                    addr: "127.0.0.1:7001".parse().unwrap(),
                    host: "a \"b\"".into(),
                    since_ms: 10,
                    restarts: 0,
                    capacity_bytes: 0,
                    used_bytes: 0,
                },
                dafne_proto::Member {
                    server: 1,
                    state: dafne_proto::MemberState::Down,
                    addr: "127.0.0.1:7002".parse().unwrap(),
                    host: "b".into(),
                    since_ms: 9000,
                    restarts: 2,
                    capacity_bytes: 0,
                    used_bytes: 0,
                },
            ],
            chains: vec![
                dafne_proto::Chain {
                    id: 0,
                    version: 3,
                    replicas: vec![dafne_proto::Replica { server: 0, state: dafne_proto::ReplicaState::Serving }],
                },
                dafne_proto::Chain {
                    id: 1,
                    version: 1,
                    replicas: vec![dafne_proto::Replica { server: 1, state: dafne_proto::ReplicaState::Offline }],
                },
            ],
            ..Default::default()
        };
        let page = render("meta", &s, &TransportStatsSnapshot::default());
        let f = dafne_metrics::parse(&page).unwrap_or_else(|e| panic!("{e}\n{page}"));
        let req = f.iter().find(|f| f.name == "dafne_meta_requests_total").unwrap();
        assert_eq!(req.samples[0].label("op"), Some("lookup"));
        assert_eq!(req.samples[0].value, 4.0);
        assert_eq!(req.samples[1].label("op"), Some("session_open"));
        assert!(page.contains("dafne_meta_commits_total{server=\"meta\"} 2\n"), "{page}");
        assert!(page.contains("dafne_meta_sessions{server=\"meta\"} 1\n"), "{page}");
        assert!(page.contains("dafne_meta_io_servers{server=\"meta\",state=\"up\"} 1\n"), "{page}");
        assert!(page.contains("dafne_meta_io_servers{server=\"meta\",state=\"down\"} 1\n"), "{page}");
        let up = f.iter().find(|f| f.name == "dafne_meta_io_server_up").unwrap();
        assert_eq!(up.samples[0].label("io_server"), Some("io-0"));
        assert_eq!(up.samples[0].label("host"), Some("a \"b\""));
        assert_eq!((up.samples[0].value, up.samples[1].value), (1.0, 0.0));
        assert!(page.contains("dafne_meta_chains{server=\"meta\",health=\"healthy\"} 1\n"), "{page}");
        assert!(page.contains("dafne_meta_chains{server=\"meta\",health=\"unavailable\"} 1\n"), "{page}");
        assert!(page.contains("dafne_meta_chains{server=\"meta\",health=\"degraded\"} 0\n"), "{page}");
        assert!(page.contains("dafne_meta_chain_version{server=\"meta\",chain=\"0\"} 3\n"), "{page}");
    }
}
