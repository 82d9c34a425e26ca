//! `dafne bench writers` against real processes: a metadata server, an io
//! server and client processes, all of the `dafne` binary. The benchmark's
//! `verify` reads every client's file back and fails the run unless each
//! block holds what that client's reported writes imply, and unless the io
//! server got from the clients exactly the bytes they reported; here the
//! report is checked too. No speed is asserted.

mod common;

use std::io::Write as _;
use std::process::Stdio;
use std::time::Duration;

use common::{dafne, text};

#[test]
fn every_client_process_wrote_what_it_reported() {
    let scratch = tempfile::tempdir().unwrap();
    let o = dafne_bench::writers::Options {
        clients: vec![1, 3],
        duration: Duration::from_millis(200),
        verify: true,
        program: env!("CARGO_BIN_EXE_dafne").into(),
        scratch: scratch.path().to_path_buf(),
        ..Default::default()
    };
    let report = dafne_bench::writers::run(&o, |_| {}).expect("the benchmark runs and verifies");
    assert_eq!(report.rows.iter().map(|r| r.clients).collect::<Vec<_>>(), [1, 3]);
    for r in &report.rows {
        assert_eq!(r.per_client.len(), r.clients, "one result per client process");
        assert_eq!(r.verified_files, r.clients, "every file read back");
        assert!(r.per_client.iter().all(|c| c.requests > 0 && c.bytes == c.requests * o.size as u64), "{r:?}");
        assert_eq!(r.per_client.iter().map(|c| c.bytes).sum::<u64>(), r.bytes);
        assert_eq!(r.server_bytes_got, r.bytes, "the io server got what the clients reported");
        assert!(r.per_client.iter().all(|c| c.end_ns > c.start_ns));
    }
    let md = report.to_markdown();
    assert!(md.contains("| 3 |"), "{md}");
    let fig = report.figure();
    assert_eq!(fig.series[0].points.len(), 2);
    let h = report.headlines();
    assert_eq!(h.len(), 1);
    // The most clients over half as many (3 / 1: nothing at 1.5).
    assert!(h[0].quantity.contains("at 3 clients / at 1"), "{h:?}");
    let (r1, r3) = (&report.rows[0], &report.rows[1]);
    assert!((h[0].ours - r3.mb_per_s / r1.mb_per_s).abs() < 1e-9, "{h:?}");
}

#[test]
fn writers_client_refuses_a_bad_job_line() {
    let mut c = dafne()
        .args(["bench", "writers-client"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"not json\n").unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(!out.status.success());
    let t = text(&out);
    assert!(t.contains("not a writers-client job") && !t.contains("panicked"), "{t}");
}

#[test]
fn writers_refuses_files_that_would_not_fit_the_cache() {
    let out = dafne()
        .args(["bench", "writers", "--clients", "64", "--file-size", "1M", "--cache-mib", "64"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let t = text(&out);
    assert!(t.contains("an eighth of the 64 MiB cache") && !t.contains("panicked"), "{t}");
}
