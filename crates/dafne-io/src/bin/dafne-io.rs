//! The io server process: `dafne-io --data-dir DIR --secret FILE --listen ADDR [--mode normal|mmap|unifier]`.
//! Prints `listening on ADDR` once it serves.

use anyhow::Result;
use clap::Parser;
use dafne_io::server::{serve_forever, IoCommand};

#[derive(Parser)]
#[command(about = "dafne io server")]
struct Cli {
    #[command(flatten)]
    args: IoCommand,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DAFNE_LOG")
                .unwrap_or_else(|_| "warn,dafne_io::storage=info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: the supervisor writes servers' output
        // to log files, which must stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    serve_forever(&Cli::parse().args)
}
