//! The io server's metrics page (`--metrics-listen`): its counters in the
//! Prometheus text format, every sample labelled `server="NAME"`.
//!
//! What is there: requests, errors and bytes by op (counted where requests
//! are answered); the cache's hits, misses, evictions, fills, write-backs,
//! bytes copied and registrations with the serving mode's merged in (the
//! view of `IoStats::merged`, the same in every mode); the cache size, its
//! dirty and pinned bytes; the data directory's size and free space; the
//! storage path's operations and bytes; the UCX context's and the
//! transport's counters; the process's CPU time and memory; whether it
//! serves data now and the requests refused for a lapsed lease from meta
//! (`crate::lease`), the version of each of its chains in meta's last
//! answer to its heartbeat, and the data requests refused for their chain
//! version, by reason (`crate::chaincheck`).

use dafne_metrics::{Kind, Text};
use dafne_proto::io::IoOp;
use dafne_transport::TransportStatsSnapshot;

use crate::server::IoStats;
use crate::service::Capacity;

/// The page of the server `server`.
pub fn render(server: &str, s: &IoStats, cap: &Capacity, transport: &TransportStatsSnapshot) -> String {
    let mut t = Text::new(&[("server", server)]);
    t.family("dafne_server_info", Kind::Gauge, "Always 1: what this server is, in its labels.")
        .sample(&[("kind", "io"), ("mode", s.mode.name()), ("version", env!("CARGO_PKG_VERSION"))], 1);
    let ops = |t: &mut Text, name: &str, help: &str, f: &dyn Fn(crate::service::OpCount) -> u64, only_data: bool| {
        let mut fam = t.family(name, Kind::Counter, help);
        for &op in IoOp::ALL {
            if only_data && !matches!(op, IoOp::Read | IoOp::Write) {
                continue;
            }
            fam.sample(&[("op", &dafne_metrics::snake(op.name()))], f(s.ops.of(op)));
        }
    };
    ops(&mut t, "dafne_io_requests_total", "Requests answered, by op (errors included).", &|c| c.requests, false);
    ops(&mut t, "dafne_io_request_errors_total", "Requests answered with an error, by op.", &|c| c.errors, false);
    ops(
        &mut t,
        "dafne_io_bytes_total",
        "Bytes moved by successful requests: returned by reads, written by writes.",
        &|c| c.bytes,
        true,
    );
    t.single(
        "dafne_io_lease_refusals_total",
        Kind::Counter,
        "Data requests refused (ENOTCONN) because the server's lease from meta had lapsed.",
        s.lease.refusals,
    );
    t.single(
        "dafne_io_serving",
        Kind::Gauge,
        "1 while data requests are served; 0 while the lease from meta has lapsed (or was never granted).",
        u64::from(s.lease.serving),
    );
    let mut f = t.family(
        "dafne_io_chain_version",
        Kind::Gauge,
        "The version of each chain that holds this server, as meta last answered its heartbeat.",
    );
    for c in &s.lease.chains {
        f.sample(&[("chain", &c.chain.to_string())], c.version);
    }
    let mut f = t.family(
        "dafne_io_chain_refusals_total",
        Kind::Counter,
        "Data requests refused for their chain version, by reason: stale (older than the server's), ahead \
         (newer: the server has not heard it yet), not_replica (the server holds no replica of the chain), \
         not_head (a client's request reached a replica that is not the chain's head).",
    );
    for (reason, n) in s.ops.chain_refusals.by_reason() {
        f.sample(&[("reason", reason)], n);
    }
    let fw = &s.lease.forward;
    t.single(
        "dafne_io_chain_forwards_total",
        Kind::Counter,
        "Chain writes (and Truncate, Sync, Allocate) this server forwarded to the next replica and saw done there.",
        fw.forwards,
    );
    t.single(
        "dafne_io_chain_forwarded_bytes_total",
        Kind::Counter,
        "Bytes of the writes this server forwarded: the next replica got them by RMA from this server's cache units.",
        fw.forwarded_bytes,
    );
    t.single(
        "dafne_io_chain_forward_failures_total",
        Kind::Counter,
        "Forwards to the next replica that failed (the client was answered ENOTCONN and sends again).",
        fw.failures,
    );
    t.single(
        "dafne_io_chain_received_total",
        Kind::Counter,
        "Forwarded writes this server received from the replica before it in a chain and served.",
        fw.received,
    );
    t.single(
        "dafne_io_chain_received_bytes_total",
        Kind::Counter,
        "Bytes of the forwarded writes served: got by RMA from the previous replica's cache units.",
        fw.received_bytes,
    );
    t.single(
        "dafne_io_undecodable_requests_total",
        Kind::Counter,
        "Requests that could not be decoded (answered EPROTO).",
        s.ops.undecodable,
    );

    let m = s.merged();
    let counters: [(&str, &str, u64); 13] = [
        ("dafne_io_cache_hits_total", "Cache lookups that found their unit (or page-cache block) cached.", m.hits),
        ("dafne_io_cache_misses_total", "Cache lookups that had to allocate and fill.", m.misses),
        ("dafne_io_cache_evictions_total", "Cache units (blocks) dropped to make room.", m.evictions),
        ("dafne_io_cache_fills_total", "Storage reads that filled a cache unit.", m.fills),
        ("dafne_io_cache_fill_bytes_total", "Bytes storage reads returned into the cache.", m.fill_bytes),
        ("dafne_io_cache_read_ahead_total", "Units read ahead of a sequential reader.", m.read_ahead),
        ("dafne_io_cache_writebacks_total", "Dirty ranges written back to storage.", m.writebacks),
        ("dafne_io_cache_writeback_bytes_total", "Bytes written back to storage.", m.writeback_bytes),
        (
            "dafne_io_cache_background_writebacks_total",
            "Write-backs made by the background thread (counted in writebacks too).",
            m.background_writebacks,
        ),
        (
            "dafne_io_bytes_copied_total",
            "Bytes copied between buffers while serving (0 in the unifier mode but for inline data).",
            m.bytes_copied,
        ),
        (
            "dafne_io_registrations_total",
            "Memory registrations made while serving (not counting those at start).",
            m.registrations,
        ),
        ("dafne_io_startup_registrations_total", "Memory registrations made at start.", m.startup_registrations),
        ("dafne_io_deregistrations_total", "Memory deregistrations while serving.", m.deregistrations),
    ];
    for (name, help, v) in counters {
        t.single(name, Kind::Counter, help, v);
    }
    t.family("dafne_io_registration_seconds_total", Kind::Counter, "Time spent registering memory while serving.")
        .sample_f64(&[], m.registration_ns as f64 / 1e9);

    let gauges: [(&str, &str, u64); 8] = [
        (
            "dafne_io_cache_bytes",
            "The cache's size (the Unifier's slabs, or the page cache counted on).",
            cap.cache_bytes,
        ),
        ("dafne_io_cache_dirty_bytes", "Bytes in the cache not yet written back.", s.unifier.dirty_bytes),
        ("dafne_io_cache_pinned_bytes", "Cache memory registered now (what an RDMA NIC pins).", s.unifier.pinned_bytes),
        (
            "dafne_io_cache_pinned_peak_bytes",
            "The most cache memory registered at once since start.",
            s.unifier.pinned_peak,
        ),
        ("dafne_io_cache_units_in_use", "Cache units holding data.", s.unifier.units_in_use),
        (
            "dafne_io_cache_parked_units",
            "Units holding data in deregistered (parked) raw memory.",
            s.unifier.parked_units,
        ),
        (
            "dafne_io_storage_capacity_bytes",
            "Size of the data directory's file system (0: statvfs failed).",
            cap.capacity_bytes,
        ),
        (
            "dafne_io_storage_available_bytes",
            "Bytes of the data directory's file system available to the server.",
            cap.available_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        t.single(name, Kind::Gauge, help, v);
    }
    let mut units = t.family("dafne_io_cache_units_by_size", Kind::Gauge, "Cache units holding data, by unit size.");
    for (size, n) in ["4k", "8k", "16k", "32k", "64k"].iter().zip(s.unifier.units_by_class) {
        units.sample(&[("size", size)], n);
    }

    t.single(
        "dafne_io_storage_direct",
        Kind::Gauge,
        "1 when storage is on the O_DIRECT path (io_uring), 0 when buffered.",
        u64::from(s.storage.direct),
    );
    t.family("dafne_io_storage_ops_total", Kind::Counter, "Storage reads and writes, by path.")
        .sample(&[("path", "direct")], s.storage.direct_ops)
        .sample(&[("path", "buffered")], s.storage.buffered_ops);
    t.family("dafne_io_storage_bytes_total", Kind::Counter, "Bytes read and written on storage, by path.")
        .sample(&[("path", "direct")], s.storage.direct_bytes)
        .sample(&[("path", "buffered")], s.storage.buffered_bytes);
    t.single("dafne_io_storage_syncs_total", Kind::Counter, "Syncs (fdatasync) of chunk files.", s.storage.syncs);
    t.single(
        "dafne_io_checksum_errors_total",
        Kind::Counter,
        "Blocks read from storage that did not match their checksum (each such read answered EIO).",
        s.storage.checksum_errors,
    );

    let u = &s.ucx;
    let ucx: [(&str, &str, u64); 6] = [
        ("dafne_ucx_bytes_put_total", "Bytes put to clients by RMA.", u.bytes_put),
        ("dafne_ucx_bytes_got_total", "Bytes got from clients by RMA.", u.bytes_got),
        ("dafne_ucx_puts_total", "RMA puts issued.", u.puts),
        ("dafne_ucx_gets_total", "RMA gets issued.", u.gets),
        (
            "dafne_ucx_registrations_total",
            "UCX memory registrations of the process (at start included).",
            u.registrations,
        ),
        ("dafne_ucx_rkey_unpacks_total", "Remote keys unpacked.", u.rkey_unpacks),
    ];
    for (name, help, v) in ucx {
        t.single(name, Kind::Counter, help, v);
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

    /// Every family is typed once, every sample parses, and the counts by
    /// op land under their op.
    #[test]
    fn the_page_is_valid_and_counts_by_op() {
        let mut s = IoStats::default();
        let read = IoOp::ALL.iter().position(|&o| o == IoOp::Read).unwrap();
        s.ops.by_op[read] = crate::service::OpCount { requests: 3, errors: 1, bytes: 8192 };
        s.unifier.hits = 5;
        s.storage.checksum_errors = 2;
        s.lease.chains = vec![dafne_proto::ChainVersion { chain: 2, version: 5 }];
        s.ops.chain_refusals.stale = 4;
        let cap = Capacity { cache_bytes: 8 << 20, ..Default::default() };
        let page = render("io-1", &s, &cap, &TransportStatsSnapshot::default());
        let families = dafne_metrics::parse(&page).unwrap_or_else(|e| panic!("{e}\n{page}"));
        let value = |name: &str, op: Option<&str>| {
            let f = families.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no {name}"));
            let s = f.samples.iter().find(|s| op.is_none_or(|o| s.label("op") == Some(o))).unwrap();
            assert_eq!(s.label("server"), Some("io-1"));
            s.value
        };
        assert_eq!(value("dafne_io_requests_total", Some("read")), 3.0);
        assert_eq!(value("dafne_io_requests_total", Some("server_info")), 0.0);
        assert_eq!(value("dafne_io_request_errors_total", Some("read")), 1.0);
        assert_eq!(value("dafne_io_bytes_total", Some("read")), 8192.0);
        assert_eq!(value("dafne_io_bytes_total", Some("write")), 0.0);
        assert_eq!(value("dafne_io_cache_hits_total", None), 5.0);
        assert_eq!(value("dafne_io_checksum_errors_total", None), 2.0);
        assert_eq!(value("dafne_io_cache_bytes", None), (8 << 20) as f64);
        assert!(page.contains("dafne_io_chain_version{server=\"io-1\",chain=\"2\"} 5\n"), "{page}");
        assert!(page.contains("dafne_io_chain_refusals_total{server=\"io-1\",reason=\"stale\"} 4\n"), "{page}");
        assert!(page.contains("dafne_io_chain_refusals_total{server=\"io-1\",reason=\"ahead\"} 0\n"), "{page}");
        assert!(families.iter().any(|f| f.name == "dafne_transport_requests_in_flight" && f.kind == "gauge"));
        for f in &families {
            assert_eq!(f.kind == "counter", f.name.ends_with("_total"), "{}", f.name);
        }
    }
}
