//! The NFS/RDMA designs experiment (`dafne bench designs`,
//! `dafne_bench::designs`) run quick against real server processes
//! (`dafne transport-peer`), with every record checked: each design must
//! move the server's bytes, and the designs without the registration cache
//! must register once per read. No speed is asserted.

use dafne_bench::designs::{self, Design, Options};
use dafne_bench::transport::{ServerCommand, Transport};

#[test]
fn every_design_reads_the_servers_bytes_and_no_cache_registers_per_read() {
    let o = Options {
        transports: vec![Transport::Shm, Transport::Tcp],
        verify: true,
        server: ServerCommand { program: env!("CARGO_BIN_EXE_dafne").into(), prefix: vec!["transport-peer".into()] },
        ..Options::quick()
    };
    let r = designs::run(&o, |_| {}).expect("the quick experiment");
    assert_eq!(r.rows.len(), 2 * Design::ALL.len() * o.threads.len());
    for row in &r.rows {
        let what = format!("{} over {}, {} threads", row.design.name(), row.transport.name(), row.threads);
        assert!(row.reads > 0, "{what}: no read completed");
        // Every read was checked against the server's pattern (a mismatch
        // fails the run itself).
        assert_eq!(row.verified_bytes, row.reads * row.record as u64, "{what}");
        match row.design {
            Design::ReadWriteNoCache | Design::ReadReadNoCache => {
                assert_eq!(row.client_registrations, row.reads, "{what}: one registration per read")
            }
            Design::ReadWrite | Design::ReadRead => assert!(
                row.client_registrations <= row.threads as u64,
                "{what}: {} registrations for {} buffers",
                row.client_registrations,
                row.threads
            ),
        }
    }
    let figs = r.figures();
    assert_eq!(figs.len(), 2);
    for f in &figs {
        assert_eq!(f.series.len(), Design::ALL.len());
        assert!(f.series.iter().all(|s| s.points.len() == o.threads.len()));
    }
    let heads = r.headlines();
    assert_eq!(heads.len(), 4, "two per transport");
    assert!(heads[0].quantity.contains("tcp"), "tcp first: {}", heads[0].quantity);
    assert!(heads.iter().all(|h| h.ours.is_finite() && h.ours > 0.0));
    assert!(r.to_markdown().contains("| 8 |"));
}
