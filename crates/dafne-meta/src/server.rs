//! Starting a metadata server: store, secret, runtime, service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Context, Result};
use dafne_auth::Secret;
use dafne_transport::{Runtime, RuntimeOptions};

use crate::service::{MetaHandler, MetaService};
use crate::store::{LayoutPolicy, MetaStore, RedbStore};

/// Everything a metadata server needs to start.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Holds `meta.redb`.
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// Cluster secret file; default `DATA_DIR/cluster.secret` (created if absent).
    pub secret: Option<PathBuf>,
    pub policy: LayoutPolicy,
    /// UCX overrides (`UCX_` keys without prefix).
    pub ucx: Vec<(String, String)>,
}

/// A running metadata server; dropping it stops the server.
#[derive(Debug)]
pub struct MetaServer {
    pub addr: SocketAddr,
    _rt: Runtime,
}

/// Starts a metadata server and returns once it listens.
pub fn start(o: &ServeOptions) -> Result<MetaServer> {
    std::fs::create_dir_all(&o.data_dir).with_context(|| format!("creating {}", o.data_dir.display()))?;
    let secret_path = o.secret.clone().unwrap_or_else(|| o.data_dir.join("cluster.secret"));
    let secret = Secret::load_or_create(&secret_path)?;
    let db = o.data_dir.join("meta.redb");
    let store = RedbStore::open(&db, o.policy.clone())
        .with_context(|| format!("opening the metadata store {} (is another meta server using it?)", db.display()))?;
    let rt = Runtime::new(RuntimeOptions { name: "meta".into(), ucx_config: o.ucx.clone(), ..Default::default() })?;
    let store: Arc<dyn MetaStore> = Arc::new(store);
    let addr = rt.serve(o.listen, move |_| MetaHandler(Rc::new(MetaService::new(store, secret))))?;
    Ok(MetaServer { addr, _rt: rt })
}

/// Starts a server, prints `listening on ADDR`, and serves until killed.
pub fn serve_forever(o: &ServeOptions) -> Result<()> {
    let server = start(o)?;
    println!("listening on {}", server.addr);
    use std::io::Write as _;
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}
