//! The metadata server process: `dafne-meta --data-dir DIR --listen ADDR`.
//! Prints `listening on ADDR` once it serves. (`dafne serve meta` is the
//! same server behind the project's one command.)

use anyhow::Result;
use clap::Parser;
use dafne_meta::server::MetaArgs;

#[derive(Parser)]
#[command(about = "dafne metadata server")]
struct Cli {
    #[command(flatten)]
    args: MetaArgs,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("DAFNE_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colour only on a terminal: the supervisor writes servers' output
        // to log files, which must stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    Cli::parse().args.serve()
}
