//! A dafne transport peer for tests and benchmarks: `serve` runs the
//! reference service; `hammer` is a client that keeps large transfers in
//! flight (to be killed mid-transfer by a test); `flood` keeps small calls
//! in flight (with other UCX settings: the peer of the shared-memory FIFO
//! test); `garbage` sends malformed frames at a server.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use dafne_transport::testsvc::{self, SegDesc};
use dafne_transport::{Access, Client, DataPath, Region, Runtime, RuntimeOptions};

#[derive(Parser)]
#[command(about = "dafne transport peer (tests and benchmarks)")]
struct Cli {
    /// UCX overrides as KEY=VALUE (UCX_ prefix optional), repeatable.
    #[arg(long = "ucx", value_name = "KEY=VALUE")]
    ucx: Vec<String>,
    /// Busy-poll window after activity, microseconds.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Data endpoints: auto, none (no UCX error handling), peer (UCX error handling).
    #[arg(long, default_value = "auto")]
    data_path: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the reference service; prints `listening on ADDR` when ready.
    Serve {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Credits granted per connection.
        #[arg(long, default_value_t = 64)]
        credits: u32,
        /// Abort when the event loop stalls this long (milliseconds).
        #[arg(long)]
        watchdog_ms: Option<u64>,
        /// Give same-host clients shared memory only once they logged in,
        /// as dafne's servers do (`RuntimeOptions::shm_before_login`).
        /// Without it this reference service offers it at once: its tests
        /// and benchmarks measure shared memory without logging in.
        #[arg(long)]
        shm_after_login: bool,
    },
    /// Keep 16 MiB server puts in flight forever (prints `hammering` once going).
    Hammer {
        #[arg(long)]
        connect: SocketAddr,
    },
    /// Keep small echo calls in flight, `--window` at a time, for
    /// `--seconds` (forever without it), printing `flooding` once going.
    /// Started with other UCX settings than the server's (e.g. `--ucx
    /// MM_FIFO_SIZE=64`), it is the hostile same-host peer of the
    /// shared-memory test (`tests/transport.rs`).
    Flood {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value_t = 32)]
        window: usize,
        #[arg(long)]
        seconds: Option<u64>,
    },
    /// Send malformed frames over raw UCX endpoints, then exit.
    Garbage {
        #[arg(long)]
        connect: SocketAddr,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DAFNE_LOG"))
        .with_writer(std::io::stderr)
        // Colour only on a terminal: the supervisor writes servers' output
        // to log files, which must stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let data_path = match cli.data_path.as_str() {
        "auto" => DataPath::Auto,
        "none" => DataPath::NoErrorHandling,
        "peer" => DataPath::PeerErrorHandling,
        other => anyhow::bail!("--data-path {other}: expected auto, none or peer"),
    };
    let opts = RuntimeOptions {
        name: "peer".into(),
        data_path,
        ucx_config: dafne_transport::parse_ucx_overrides(&cli.ucx).map_err(anyhow::Error::msg)?,
        spin: Duration::from_micros(cli.spin_us),
        ..Default::default()
    };
    match cli.cmd {
        Cmd::Serve { listen, credits, watchdog_ms, shm_after_login } => {
            dafne_transport::fail_fast_on_panic();
            let watchdog = watchdog_ms.map(Duration::from_millis);
            let shm_before_login = !shm_after_login;
            Ok(testsvc::serve_forever(RuntimeOptions { credits, watchdog, shm_before_login, ..opts }, listen)?)
        }
        Cmd::Hammer { connect } => {
            let rt = Runtime::new(opts)?;
            let client = Client::connect(&rt, connect)?;
            let regions: Vec<Region> = (0..4)
                .map(|_| Region::allocate(client.context(), testsvc::SLOT_SIZE, Access::RemoteWrite))
                .collect::<Result<_, _>>()?;
            let reqs: Vec<Vec<u8>> = regions
                .iter()
                .map(|r| {
                    let seg = SegDesc { addr: r.addr(), len: r.len() as u64, key: r.pack_key().unwrap_or_default() };
                    testsvc::encode_rma(testsvc::OP_PUT, 0, 0, &[seg])
                })
                .collect();
            let mut first = true;
            loop {
                let futs: Vec<_> = reqs.iter().map(|r| client.call_async(r.clone())).collect();
                if first {
                    println!("hammering");
                    first = false;
                }
                for f in futs {
                    futures::executor::block_on(f)?;
                }
            }
        }
        Cmd::Flood { connect, window, seconds } => flood(connect, window, seconds, opts),
        Cmd::Garbage { connect } => garbage(connect, opts),
    }
}

/// See `Cmd::Flood`. Failed calls (the server cut the connection, or the
/// calls time out) end it with an error.
fn flood(connect: SocketAddr, window: usize, seconds: Option<u64>, opts: RuntimeOptions) -> Result<()> {
    let rt = Runtime::new(opts)?;
    let client = Client::connect(&rt, connect)?;
    let end = seconds.map(|s| std::time::Instant::now() + Duration::from_secs(s));
    let mut first = true;
    let mut done = 0u64;
    while end.is_none_or(|e| std::time::Instant::now() < e) {
        let futs: Vec<_> =
            (0..window.max(1)).map(|i| client.call_async(vec![testsvc::OP_ECHO, i as u8, 7, 7])).collect();
        if first {
            println!("flooding");
            first = false;
        }
        for f in futs {
            futures::executor::block_on(f)?;
            done += 1;
        }
    }
    println!("{done} calls answered");
    Ok(())
}

/// Malformed traffic that bypasses the transport's encoder: raw frames with
/// bad magic, wrong versions, lying lengths, unknown connections, and raw
/// bytes, sent on a UCX endpoint to the server's listener.
fn garbage(connect: SocketAddr, opts: RuntimeOptions) -> Result<()> {
    use dafne_transport::frame::{FrameHeader, FrameKind, AM_ID};
    let ctx = dafne_ucx::Context::new(&dafne_ucx::ContextOptions { name: "garbage".into(), config: opts.ucx_config })?;
    let worker = dafne_ucx::Worker::new(&ctx)?;
    let ep = worker.connect_sockaddr(connect)?;
    let good = |k: FrameKind| {
        let mut h = FrameHeader::new(k);
        h.conn_id = 1;
        h.token = 12345;
        h
    };
    let mut frames: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut bad_magic = good(FrameKind::Request).encode().to_vec();
    bad_magic[0] ^= 0xff;
    frames.push((bad_magic, vec![1, 2, 3]));
    let mut bad_version = good(FrameKind::Request).encode().to_vec();
    bad_version[2] = 99;
    frames.push((bad_version, vec![]));
    frames.push((good(FrameKind::Request).encode()[..20].to_vec(), vec![])); // truncated header
    frames.push((vec![], vec![0xAB; 64])); // no header at all
    let mut lying = good(FrameKind::Request);
    lying.payload_len = 1_000_000;
    frames.push((lying.encode().to_vec(), vec![0; 10])); // announced length lies
    let mut unknown = good(FrameKind::Request);
    unknown.payload_len = 4;
    frames.push((unknown.encode().to_vec(), vec![1, 2, 3, 4])); // unknown connection
    let mut x: u64 = 0x1234_5678;
    for _ in 0..50 {
        let hdr: Vec<u8> = (0..40)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        frames.push((hdr, vec![x as u8; (x % 300) as usize]));
    }
    // A request under the size limit but too big to travel eager, for a
    // connection that does not exist: refused before its payload is taken.
    let mut unknown_big = good(FrameKind::Request);
    unknown_big.payload_len = 900 << 10;
    frames.push((unknown_big.encode().to_vec(), vec![0xA5; 900 << 10]));
    // Control frames carry no payload: a ping with one is refused.
    let mut fat_ping = good(FrameKind::Ping);
    fat_ping.payload_len = 200 << 10;
    frames.push((fat_ping.encode().to_vec(), vec![0x11; 200 << 10]));
    // An oversized rendezvous payload with a valid-looking header.
    let mut big = good(FrameKind::Request);
    big.payload_len = 32 << 20;
    frames.push((big.encode().to_vec(), vec![0x5A; 32 << 20]));
    // Last, because the server answers a bad hello by closing the session.
    let mut hello = good(FrameKind::Hello);
    hello.payload_len = 7;
    frames.push((hello.encode().to_vec(), vec![9; 7]));
    let mut ops = Vec::new();
    for (h, p) in frames {
        ops.push(ep.am_send(AM_ID, h.clone(), p.clone(), false)?);
        ops.push(ep.am_send(AM_ID, h, p, true)?);
    }
    // Make sure everything left this process before exiting.
    ops.push(ep.flush()?);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ops.iter().any(|o| o.poll_done().is_none()) && std::time::Instant::now() < deadline {
        worker.progress();
    }
    let linger = std::time::Instant::now() + Duration::from_millis(300);
    while std::time::Instant::now() < linger {
        worker.progress();
    }
    println!("sent {} malformed frames", ops.len());
    Ok(())
}
