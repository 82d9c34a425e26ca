//! Starting a metadata server: store, secret, runtime, service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

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
    /// How long after start no orphan is listed, and how long an ended
    /// session's open files stay protected (`crate::opens`).
    pub open_grace: Duration,
}

/// The command-line arguments of a metadata server, shared by the
/// `dafne-meta` binary and `dafne serve meta`.
#[derive(Debug, Clone, clap::Args)]
pub struct MetaArgs {
    /// Directory holding the metadata store (meta.redb).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Cluster secret file (default DATA_DIR/cluster.secret, created if absent).
    #[arg(long)]
    pub secret: Option<PathBuf>,
    /// Number of io servers (ids 0..N) that file layouts stripe over.
    #[arg(long, default_value_t = 0)]
    pub io_servers: u32,
    /// Default stripe unit in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub stripe_unit: u32,
    /// Default stripe count.
    #[arg(long, default_value_t = 4)]
    pub stripe_count: u32,
    /// Io servers per chain (`dafne_meta::chains`). Only 1 is served:
    /// writes are not replicated yet (docs/REPLICATION.md), so a larger
    /// value is refused at start.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Each io server's host, comma-separated in id order, one per io
    /// server (what the chain table keeps replicas apart by); none: one
    /// host.
    #[arg(long, value_delimiter = ',')]
    pub io_hosts: Vec<String>,
    /// UCX overrides as KEY=VALUE, repeatable.
    #[arg(long = "ucx", value_name = "KEY=VALUE")]
    pub ucx: Vec<String>,
    /// Seconds after start during which no deleted file's data is offered
    /// for reclaiming (clients re-announce their open files meanwhile), and
    /// for which a closed or dead session's open files stay protected.
    #[arg(long, default_value_t = crate::opens::DEFAULT_GRACE.as_secs())]
    pub open_grace_s: u64,
    /// Serve this server's counters in the Prometheus text format at
    /// http://ADDR/metrics (port 0: any free port; the address is printed
    /// as `metrics on ADDR` before `listening on`). If ADDR cannot be
    /// taken, a free port of its host is (a warning says so), else none:
    /// the server serves either way. Off unless given;
    /// `dafne up` gives every server one. Use a loopback address unless
    /// the network is trusted: the page needs no login.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// The server's name in its metrics (the `server` label).
    #[arg(long, default_value = "meta")]
    pub server_name: String,
}

impl MetaArgs {
    /// Serves until SIGTERM or SIGINT, with the metrics port if asked.
    pub fn serve(&self) -> Result<()> {
        serve_forever_with(&self.to_options()?, self.metrics_listen, &self.server_name)
    }

    pub fn to_options(&self) -> Result<ServeOptions> {
        self.check_io_hosts()?;
        Ok(ServeOptions {
            data_dir: self.data_dir.clone(),
            listen: self.listen,
            secret: self.secret.clone(),
            policy: LayoutPolicy {
                servers: (0..self.io_servers).collect(),
                default_stripe_unit: self.stripe_unit,
                default_stripe_count: self.stripe_count,
                replicas: self.replicas,
                hosts: self.io_hosts.clone(),
            },
            ucx: dafne_transport::parse_ucx_overrides(&self.ucx).map_err(anyhow::Error::msg)?,
            open_grace: Duration::from_secs(self.open_grace_s),
        })
    }
}

impl MetaArgs {
    /// `--io-hosts`, if given, names one host per io server, each a host
    /// name as the membership table takes it (`dafne_proto::check_host_name`)
    /// and not empty: a stray comma would otherwise make a host named "",
    /// which the chain table would keep replicas apart from.
    fn check_io_hosts(&self) -> Result<()> {
        if self.io_hosts.is_empty() {
            return Ok(());
        }
        if self.io_hosts.len() != self.io_servers as usize {
            anyhow::bail!(
                "--io-hosts names {} hosts for --io-servers {}: give one host per io server, in id order, or leave \
                 --io-hosts out (one host)",
                self.io_hosts.len(),
                self.io_servers
            );
        }
        for (i, h) in self.io_hosts.iter().enumerate() {
            if h.is_empty() {
                anyhow::bail!("--io-hosts: io server {i}'s host name is empty (a stray comma?): name every host");
            }
            dafne_proto::check_host_name(h)
                .map_err(|why| anyhow::anyhow!("--io-hosts: io server {i}'s host name {h:?}: {why}"))?;
        }
        Ok(())
    }
}

/// A running metadata server; dropping it stops the server.
#[derive(Debug)]
pub struct MetaServer {
    pub addr: SocketAddr,
    rt: Runtime,
    /// Dropped after `rt` (fields drop in order): once the loop has
    /// stopped, so nothing more is answered.
    _settle: SettleOnDrop,
}

/// Makes the store's lazy commits durable when dropped
/// (`MetaStore::settle`; `crate::store` docs, "Lazy commits"): a stop
/// (SIGTERM: `dafne down`) right after a size publish must not lose it.
/// The store thread may outlive the server (it is not joined) and the
/// process may exit before it closes the store, which would otherwise
/// have made them durable.
struct SettleOnDrop(Arc<dyn MetaStore>);

impl std::fmt::Debug for SettleOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SettleOnDrop")
    }
}

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        if let Err(e) = self.0.settle() {
            tracing::error!("making lazy commits durable at the stop: {e}");
        }
    }
}

thread_local! {
    /// The metadata service of this thread's runtime, so that its counters
    /// can be read on its loop thread when asked.
    static SERVICE: std::cell::RefCell<Option<std::rc::Weak<MetaService>>> = const { std::cell::RefCell::new(None) };
}

impl MetaServer {
    /// The counters, read on the loop thread (`None`: not serving).
    pub fn stats(&self) -> Option<crate::service::MetaStats> {
        self.rt
            .run_on_loop(|_| SERVICE.with(|s| s.borrow().as_ref().and_then(std::rc::Weak::upgrade).map(|s| s.stats())))
            .ok()
            .flatten()
    }

    /// This server's metrics page (`crate::metrics`).
    pub fn metrics_page(&self, server: &str) -> std::result::Result<String, String> {
        let stats = self.stats().ok_or("the metadata server is stopping")?;
        Ok(crate::metrics::render(server, &stats, &self.rt.stats().snapshot()))
    }
}

/// Why a cluster cannot serve `policy`'s replication factor, if it
/// cannot: the chain table it makes is impossible (`crate::chains`). R > 1
/// is served since chain writes (docs/REPLICATION.md, "Writes": the head
/// forwards each write to the other serving replicas); a replica that
/// returns is `syncing` and stays so (resync is not built).
pub fn check_replicas(policy: &LayoutPolicy) -> std::result::Result<(), String> {
    policy.chains().map_err(|e| e.to_string())?;
    Ok(())
}

/// Starts a metadata server and returns once it listens. Refuses a
/// replication factor the cluster cannot serve ([`check_replicas`]).
pub fn start(o: &ServeOptions) -> Result<MetaServer> {
    check_replicas(&o.policy).map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&o.data_dir).with_context(|| format!("creating {}", o.data_dir.display()))?;
    let secret_path = o.secret.clone().unwrap_or_else(|| o.data_dir.join("cluster.secret"));
    let secret = Secret::load_or_create(&secret_path)?;
    let db = o.data_dir.join("meta.redb");
    let store = RedbStore::open(&db, o.policy.clone())
        .with_context(|| format!("opening the metadata store {} (is another meta server using it?)", db.display()))?;
    // Every client logs in (SessionOpen) right after connecting; one that
    // has not after this long is not a client and loses its connection.
    let rt = Runtime::new(RuntimeOptions {
        name: "meta".into(),
        ucx_config: o.ucx.clone(),
        auth_timeout: Some(std::time::Duration::from_secs(10)),
        watchdog: Some(std::time::Duration::from_secs(60)),
        ..Default::default()
    })?;
    let store: Arc<dyn MetaStore> = Arc::new(store);
    let settle = SettleOnDrop(store.clone());
    let revoked =
        store.revoked_credentials().with_context(|| format!("reading the revoked credentials of {}", db.display()))?;
    let grace = o.open_grace;
    let dir = o.data_dir.clone();
    let io_servers = u32::try_from(o.policy.servers.len()).unwrap_or(u32::MAX);
    let addr = rt.serve(o.listen, move |l| {
        let service = Rc::new(MetaService::new(store, secret, grace, revoked, Some(&dir)).with_io_servers(io_servers));
        l.spawn(MetaService::watch_members(Rc::downgrade(&service)));
        SERVICE.with(|s| *s.borrow_mut() = Some(Rc::downgrade(&service)));
        MetaHandler(service)
    })?;
    Ok(MetaServer { addr, rt, _settle: settle })
}

/// Starts a server, prints `listening on ADDR`, and serves until killed.
pub fn serve_forever(o: &ServeOptions) -> Result<()> {
    serve_forever_with(o, None, "meta")
}

/// [`serve_forever`] with a metrics port on `metrics`, else elsewhere
/// (`MetricsServer::start_or_elsewhere`; printed as `metrics on ADDR`
/// before `listening on`), its samples labelled
/// `server="NAME"`.
pub fn serve_forever_with(o: &ServeOptions, metrics: Option<SocketAddr>, name: &str) -> Result<()> {
    dafne_transport::fail_fast_on_panic();
    let server = Arc::new(start(o)?);
    // A port it cannot take costs the metrics, never the server: another
    // port, or none (`start_or_elsewhere` logs which).
    let metrics = metrics.and_then(|addr| {
        let (s, name) = (server.clone(), name.to_string());
        dafne_metrics::MetricsServer::start_or_elsewhere(addr, move || s.metrics_page(&name))
    });
    if let Some(m) = &metrics {
        println!("metrics on {}", m.addr());
    }
    println!("listening on {}", server.addr);
    use std::io::Write as _;
    std::io::stdout().flush()?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("installing the stop signal handlers")?;
    }
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::park_timeout(std::time::Duration::from_millis(100));
    }
    // Every acknowledged change is committed already; dropping the server
    // closes the store cleanly (the metrics port first: it holds the server).
    drop(metrics);
    drop(server);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        meta: MetaArgs,
    }

    #[test]
    fn replicas_and_hosts_reach_the_policy_and_more_than_one_replica_is_refused() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["meta", "--data-dir", "d", "--io-servers", "3"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args).unwrap().meta.to_options().unwrap().policy
        };
        let p = parse(&[]);
        assert_eq!((p.replicas, p.hosts.len()), (1, 0));
        assert_eq!(check_replicas(&p), Ok(()));
        let p = parse(&["--replicas", "2", "--io-hosts", "a,b,b"]);
        assert_eq!(p.hosts, vec!["a", "b", "b"]);
        assert_eq!(p.chains().unwrap().len(), 3, "a possible table");
        assert_eq!(check_replicas(&p), Ok(()), "chain writes serve R = 2");
        let e = check_replicas(&parse(&["--replicas", "3", "--io-hosts", "a,b,b"])).unwrap_err();
        assert!(e.contains("2 distinct hosts"), "{e}");
    }

    #[test]
    fn bad_io_hosts_are_refused_naming_the_flag() {
        let options = |extra: &[&str]| {
            let mut args = vec!["meta", "--data-dir", "d", "--io-servers", "3"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args).unwrap().meta.to_options().map(|o| o.policy.hosts)
        };
        assert_eq!(options(&["--io-hosts", "a,b,b"]).unwrap(), vec!["a", "b", "b"]);
        // Empty names (a stray comma) would be one host named "", and a
        // name with a space or '|' is one `dafne status` cannot print.
        for (hosts, why) in [(",,", "empty"), ("a,,b", "empty"), ("a b,c,d", "0x20"), ("a,c|d,e", "0x7c")] {
            let e = format!("{:#}", options(&["--io-hosts", hosts]).unwrap_err());
            assert!(e.contains("--io-hosts") && e.contains(why), "{hosts}: {e}");
        }
        let e = format!("{:#}", options(&["--io-hosts", "a,b"]).unwrap_err());
        assert!(e.contains("--io-hosts names 2 hosts for --io-servers 3"), "{e}");
        assert!(e.contains("one host per io server"), "{e}");
    }
}
