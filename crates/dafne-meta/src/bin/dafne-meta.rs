//! The metadata server process: `dafne-meta --data-dir DIR --listen ADDR`.
//! Prints `listening on ADDR` once it serves. (`dafne serve meta` is the
//! same server behind the project's one command.)

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use dafne_meta::server::{serve_forever, ServeOptions};
use dafne_meta::LayoutPolicy;

#[derive(Parser)]
#[command(about = "dafne metadata server")]
struct Cli {
    /// Directory holding the metadata store (meta.redb).
    #[arg(long)]
    data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Cluster secret file (created on first start if absent).
    #[arg(long)]
    secret: Option<PathBuf>,
    /// Number of io servers (ids 0..N) that file layouts stripe over.
    #[arg(long, default_value_t = 0)]
    io_servers: u32,
    /// Default stripe unit in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    stripe_unit: u32,
    /// Default stripe count.
    #[arg(long, default_value_t = 4)]
    stripe_count: u32,
    /// UCX overrides as KEY=VALUE, repeatable.
    #[arg(long = "ucx", value_name = "KEY=VALUE")]
    ucx: Vec<String>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("DAFNE_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let ucx = cli
        .ucx
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.trim_start_matches("UCX_").to_string(), v.to_string()))
                .with_context(|| format!("--ucx {kv}: expected KEY=VALUE, e.g. TLS=tcp"))
        })
        .collect::<Result<Vec<_>>>()?;
    serve_forever(&ServeOptions {
        data_dir: cli.data_dir,
        listen: cli.listen,
        secret: cli.secret,
        policy: LayoutPolicy {
            servers: (0..cli.io_servers).collect(),
            default_stripe_unit: cli.stripe_unit,
            default_stripe_count: cli.stripe_count,
        },
        ucx,
    })
}
