//! Runs Debian's `ucx_perftest` (package `ucx-utils`) as the reference for
//! what UCX itself achieves on a transport, with the same sizes and window.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// One `ucx_perftest` measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PerftestResult {
    pub test: String,
    pub size: usize,
    pub iterations: usize,
    /// `overall_bw` as printed by ucx_perftest, in MiB/s (it divides by 2^20).
    pub mib_per_s: f64,
    /// `50.0_percentile_lat`, microseconds.
    pub p50_lat_us: f64,
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether `ucx_perftest` is installed.
pub fn available() -> bool {
    Command::new("ucx_perftest").arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Runs `ucx_perftest -t TEST -s SIZE -O WINDOW` between two processes on
/// loopback with the given UCX environment.
pub fn run(
    test: &str,
    size: usize,
    window: usize,
    iterations: usize,
    env: &[(String, String)],
) -> Result<PerftestResult> {
    let port = free_port()?;
    let mut srv = Command::new("ucx_perftest");
    srv.args(["-p", &port.to_string()]).stdout(Stdio::null()).stderr(Stdio::null());
    for (k, v) in env {
        srv.env(format!("UCX_{k}"), v);
    }
    let _server = Server(srv.spawn().context("starting ucx_perftest (install Debian's ucx-utils)")?);
    let warmup = (iterations / 10).max(10);
    let mut last_err = String::new();
    // The server needs a moment to listen; retry the client briefly.
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let mut cli = Command::new("ucx_perftest");
        cli.args(["127.0.0.1", "-p", &port.to_string(), "-t", test, "-s", &size.to_string()]).args([
            "-n",
            &iterations.to_string(),
            "-w",
            &warmup.to_string(),
            "-O",
            &window.to_string(),
            "-f",
            "-v",
        ]);
        for (k, v) in env {
            cli.env(format!("UCX_{k}"), v);
        }
        let out = cli.output().context("running ucx_perftest")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            return parse(test, size, &stdout);
        }
        last_err = format!("{}{}", stdout, String::from_utf8_lossy(&out.stderr));
    }
    bail!("ucx_perftest {test} -s {size} failed: {last_err}")
}

fn parse(test: &str, size: usize, out: &str) -> Result<PerftestResult> {
    // CSV: iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
    let line = out
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.split(',').count() == 8 && l.chars().next().is_some_and(|c| c.is_ascii_digit()))
        .with_context(|| format!("no result line in ucx_perftest output: {out}"))?;
    let f: Vec<&str> = line.split(',').collect();
    Ok(PerftestResult {
        test: test.to_string(),
        size,
        iterations: f[0].trim().parse()?,
        p50_lat_us: f[1].trim().parse()?,
        mib_per_s: f[5].trim().parse()?,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_csv_line() {
        let out = "junk\niterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n 20000,1.435,1.342,1.342,46568.61,46568.61,745098,745098\n";
        let r = super::parse("ucp_put_bw", 65536, out).unwrap();
        assert_eq!(r.iterations, 20000);
        assert!((r.mib_per_s - 46568.61).abs() < 1e-6);
        assert!((r.p50_lat_us - 1.435).abs() < 1e-9);
        assert!(super::parse("x", 1, "nothing here").is_err());
    }
}
