//! Starting an io server: chunk store, Unifier, secret, runtime, service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;

use anyhow::{Context, Result};
use dafne_auth::Secret;
use dafne_transport::{Runtime, RuntimeOptions};
use std::sync::{Arc, Mutex};

use dafne_unifier::{Unifier, UnifierConfig, UnifierStats};

use crate::chunk::ChunkStore;
use crate::service::{IoHandler, IoService};

/// The command-line arguments of an io server.
#[derive(Debug, Clone, clap::Args)]
pub struct IoArgs {
    /// Directory holding this server's chunk files.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7710")]
    pub listen: SocketAddr,
    /// The cluster secret file (written by the metadata server).
    #[arg(long)]
    pub secret: PathBuf,
    /// Unifier cache size in MiB (registered once at start).
    #[arg(long, default_value_t = 64)]
    pub cache_mib: usize,
    /// UCX overrides as KEY=VALUE, repeatable.
    #[arg(long = "ucx", value_name = "KEY=VALUE")]
    pub ucx: Vec<String>,
}

/// A running io server; dropping it stops the server.
#[derive(Debug)]
pub struct IoServer {
    pub addr: SocketAddr,
    stats: Arc<Mutex<UnifierStats>>,
    rt: Runtime,
}

impl IoServer {
    /// The Unifier's counters (hits, misses, evictions, bytes copied,
    /// registrations) as of the last request served.
    pub fn unifier_stats(&self) -> UnifierStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// The UCX counters of the server (RMA bytes, registrations).
    pub fn ucx_stats(&self) -> dafne_ucx::StatsSnapshot {
        self.rt.context().stats().snapshot()
    }
}

pub fn start(a: &IoArgs) -> Result<IoServer> {
    let secret =
        Secret::load(&a.secret).context("the io server needs the cluster secret the metadata server created")?;
    ChunkStore::open(&a.data_dir).with_context(|| format!("opening {}", a.data_dir.display()))?;
    let ucx = dafne_transport::parse_ucx_overrides(&a.ucx).map_err(anyhow::Error::msg)?;
    let rt = Runtime::new(RuntimeOptions { name: "io".into(), ucx_config: ucx, ..Default::default() })?;
    // 1 MiB slabs: the cache is `cache_mib` of them, registered once here.
    // Write-behind may hold a quarter of the cache dirty.
    let cache = a.cache_mib.max(1) << 20;
    let config = UnifierConfig {
        ready_slabs: a.cache_mib.max(1),
        slab_size: 1 << 20,
        max_dirty_bytes: cache / 4,
        ..Default::default()
    };
    config.validate().map_err(|e| anyhow::anyhow!("--cache-mib {}: {e}", a.cache_mib))?;
    let dir = a.data_dir.clone();
    let stats = Arc::new(Mutex::new(UnifierStats::default()));
    let published = stats.clone();
    let addr = rt.serve(a.listen, move |l| {
        let store = Rc::new(ChunkStore::open(&dir).expect("chunk store opened above"));
        let unifier = Unifier::new(l.context(), config, store.clone()).expect("registering the Unifier's slabs");
        IoHandler(Rc::new(IoService::new(secret, unifier, store, published)))
    })?;
    Ok(IoServer { addr, stats, rt })
}

/// Starts an io server, prints `listening on ADDR`, serves until killed.
pub fn serve_forever(a: &IoArgs) -> Result<()> {
    let s = start(a)?;
    println!("listening on {}", s.addr);
    use std::io::Write as _;
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}
