//! The local cluster: its configuration (a TOML file, every field with an
//! embedded default) and its state directory.
//!
//! # Why a state directory
//! `dafne up` starts a supervisor that outlives the command; `mount`,
//! `status` and `down` are later, separate commands. They find the running
//! cluster through one directory (`--dir`, else `$DAFNE_HOME`, else
//! `~/.dafne`):
//!
//! ```text
//! DIR/config.toml        the effective configuration (written at first `up`, edited by hand after)
//! DIR/cluster.json       written by the supervisor once every server listens; removed by `down`
//! DIR/meta/              the metadata store and the cluster secret (`cluster.secret`)
//! DIR/io-N/              io server N's chunk files
//! DIR/logs/              one log per server and the supervisor's
//! DIR/mounts/            one file per live mount (its mount point), so `down` can unmount
//! ```
//!
//! The file `cluster.json` is the rendezvous: clients read the server
//! addresses, the secret's path and the UCX settings (every process of a
//! cluster must use the same transports, see ARCHITECTURE "Trust") from it.
//!
//! # Several hosts
//! A configuration with a `[[hosts]]` list describes a cluster spread over
//! machines: each entry names a host, the address its servers listen on,
//! and what it runs (`meta = true`, `io_servers = N`). Io server ids follow
//! the file's order (the first host's io servers are 0.., the next host's
//! continue), and on each host its io servers take `io_base_port + k`,
//! `k` counting that host's own. The same file goes to every host:
//! `dafne up --host NAME` there starts and supervises only NAME's servers
//! (the reclaimer and the revocation relay only on the metadata server's
//! host) and writes a `cluster.json` with every address of the file, so
//! that any client there can use it; `dafne up --client` writes that file
//! on a machine that runs no server. Why one file rather than servers that
//! register with the metadata server: layouts name io servers by id, so
//! the ids must be fixed and the same for every host, which one file
//! copied everywhere gives with nothing to agree on at run time. Without
//! `[[hosts]]` the cluster is the one-host cluster of `[cluster] host`, as
//! it always was.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
pub use dafne_cluster::procs::{pid_alive, same_process_alive};
use serde::{Deserialize, Serialize};

/// The most io servers a cluster has.
pub const MAX_IO_SERVERS: u32 = 64;

/// The configuration file; every field has a default, so an empty file (or
/// none) is a valid configuration. Unknown keys are refused, so that a typo
/// is an error rather than a silently ignored setting.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub cluster: ClusterConfig,
    pub meta: MetaConfig,
    pub io: IoConfig,
    pub mount: MountConfig,
    /// UCX settings shared by every process of the cluster (KEY = "VALUE",
    /// without the `UCX_` prefix).
    pub ucx: BTreeMap<String, String>,
    /// The hosts of a cluster spread over several machines (module docs,
    /// "Several hosts"); empty: one host, `[cluster] host`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostConfig>,
}

/// One host of a multi-host cluster (`[[hosts]]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// The name `dafne up --host NAME` takes (letters, digits, `.`, `-`, `_`).
    pub name: String,
    /// The address this host's servers listen on, and clients connect to.
    pub address: IpAddr,
    /// Whether the metadata server runs here (on exactly one host).
    #[serde(default)]
    pub meta: bool,
    /// How many io servers run here.
    #[serde(default)]
    pub io_servers: u32,
    /// UCX settings for this host's servers over `[ucx]`'s (a network
    /// device named differently there, for instance).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ucx: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Address every server listens on.
    pub host: IpAddr,
    /// The metadata server's port.
    pub meta_port: u16,
    /// Io server `i` listens on `io_base_port + i`.
    pub io_base_port: u16,
    /// Number of io servers.
    pub io_servers: u32,
    /// Restart a server that exits unexpectedly.
    pub restart: bool,
    /// Restarts allowed per server within a window before the supervisor
    /// gives up on it.
    pub max_restarts: u32,
    /// The window: a server that has run this many seconds since its last
    /// (re)start has its count against `max_restarts` reset, so a rare
    /// crash is always restarted and only a crash loop is given up. 0: no
    /// window (`max_restarts` over the supervisor's lifetime).
    pub restart_window_s: u64,
    /// Seconds after a file's last unlink before the supervisor removes its
    /// data from the io servers, counted from the unlink; a file still open
    /// somewhere keeps its data until its last close whatever this says
    /// (the metadata server tracks opens; see `dafne_cluster::reclaim`).
    pub reclaim_after_s: u32,
    /// Address every server's metrics port (Prometheus text over HTTP,
    /// `GET /metrics`) listens on: loopback unless the network is trusted,
    /// as the page needs no login.
    pub metrics_host: IpAddr,
    /// The metadata server's metrics port; io server `i` has
    /// `metrics_base_port + 1 + i`. 0: each server takes a free port when
    /// the cluster starts (asked for again at its restarts), recorded in
    /// `cluster.json` and shown by `dafne status`; choose a base for ports
    /// a Prometheus configuration can name.
    pub metrics_base_port: u16,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            host: IpAddr::from([127, 0, 0, 1]),
            meta_port: 7700,
            io_base_port: 7710,
            io_servers: 4,
            restart: true,
            max_restarts: 5,
            restart_window_s: DEFAULT_RESTART_WINDOW_S,
            reclaim_after_s: 60,
            metrics_host: IpAddr::from([127, 0, 0, 1]),
            metrics_base_port: 0,
        }
    }
}

/// `[cluster] restart_window_s` by default: ten minutes of running make a
/// server's crashes a new series.
pub const DEFAULT_RESTART_WINDOW_S: u64 = 600;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetaConfig {
    /// Default stripe unit in bytes.
    pub stripe_unit: u32,
    /// Default stripe count (at most `io_servers`).
    pub stripe_count: u32,
    /// Seconds after the metadata server starts before it offers deleted
    /// files' data for reclaiming (its clients re-announce their open files
    /// meanwhile), and for which a closed or dead client's open files stay
    /// protected (`dafne_meta::opens`).
    pub open_grace_s: u32,
    /// Io servers per chain of meta's chain table (`dafne_meta::chains`):
    /// distinct servers, on distinct hosts with a `[[hosts]]` list. Only 1
    /// is accepted: writes are not replicated yet (docs/REPLICATION.md).
    pub replicas: u32,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            stripe_unit: 1 << 20,
            stripe_count: 4,
            open_grace_s: dafne_meta::opens::DEFAULT_GRACE.as_secs() as u32,
            replicas: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct IoConfig {
    /// Each io server's Unifier cache, in MiB; `None`: [`auto_cache_mib`]
    /// (a share of the machine's available memory, with a cap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_mib: Option<usize>,
    /// Serving mode: "unifier", "normal" or "mmap".
    pub mode: String,
    /// Percent of each cache that is raw memory, registered when first
    /// used instead of at start (`dafne serve io --raw-percent`).
    pub raw_percent: u8,
    /// Bound on each io server's registered cache memory, MiB
    /// (`--max-pinned-mib`); `None`: no bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pinned_mib: Option<usize>,
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig { cache_mib: None, mode: "unifier".into(), raw_percent: 0, max_pinned_mib: None }
    }
}

/// The share of the machine's available memory the io servers' caches
/// take together when `[io] cache_mib` is not set: one eighth.
pub const AUTO_CACHE_SHARE: u64 = 8;
/// The most an io server's cache takes by default, MiB (set `cache_mib`
/// for more).
pub const AUTO_CACHE_CAP_MIB: usize = 1024;
/// The least an io server's cache takes, MiB (also the floor `check`
/// enforces on a set `cache_mib`).
pub const MIN_CACHE_MIB: usize = 8;

/// Each io server's cache when `[io] cache_mib` is not set: an
/// [`AUTO_CACHE_SHARE`]th of `mem_available_mib` (the kernel's
/// MemAvailable: free memory plus what the page cache would give back)
/// shared by `io_servers`, rounded down to whole 8 MiB slabs, between
/// [`MIN_CACHE_MIB`] and [`AUTO_CACHE_CAP_MIB`]. The Unifier paper sized
/// its cache as "all free memory"; a share leaves room for the
/// applications and the other servers of a machine that runs them all.
pub fn auto_cache_mib(mem_available_mib: u64, io_servers: u32) -> usize {
    let share = mem_available_mib / AUTO_CACHE_SHARE / u64::from(io_servers.max(1));
    let mib = usize::try_from(share).unwrap_or(usize::MAX).min(AUTO_CACHE_CAP_MIB);
    (mib / 8 * 8).max(MIN_CACHE_MIB)
}

/// MemAvailable from `/proc/meminfo`, MiB; `None` where it cannot be read
/// (then the cache falls back to 64 MiB).
pub fn mem_available_mib() -> Option<u64> {
    dafne_client::machine::available_bytes().map(|b| b >> 20)
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MountConfig {
    /// How long the kernel may cache attributes, in milliseconds.
    pub attr_timeout_ms: u64,
    /// How long the kernel may cache name lookups, in milliseconds.
    pub entry_timeout_ms: u64,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig { attr_timeout_ms: 1000, entry_timeout_ms: 1000 }
    }
}

/// The commented example printed by `dafne config` and written at first `up`.
pub const EXAMPLE: &str = r#"# dafne configuration. Every key is optional; shown are the defaults.
# Pass it with `dafne up --config FILE`, or edit DIR/config.toml (written by
# the first `dafne up`) and restart the cluster.

[cluster]
host = "127.0.0.1"      # address every server listens on
meta_port = 7700        # the metadata server
io_base_port = 7710     # io server i listens on io_base_port + i
io_servers = 4          # number of io server processes
restart = true          # restart a server that exits unexpectedly
max_restarts = 5        # ... at most this many times per server in a row:
restart_window_s = 600  # a server that ran this long since its last start
                        # gets its count reset (0: count over the lifetime)
reclaim_after_s = 60    # remove an unlinked file's data this many seconds
                        # later, or at its last close if it is still open
metrics_host = "127.0.0.1" # every server's metrics port (Prometheus text,
                        # GET /metrics) listens here; the page needs no login
metrics_base_port = 0   # meta's metrics port; io server i: base + 1 + i.
                        # 0: free ports chosen at `up` (`dafne status` shows them)

[meta]
stripe_unit = 1048576   # default stripe unit, bytes
stripe_count = 4        # default stripe count (at most io_servers)
open_grace_s = 10       # after a meta start, and after a client's connection
                        # ends, keep deleted files' data that clients may
                        # still hold open this long (they re-announce it)
replicas = 1            # io servers per chain (`dafne status` lists the
                        # chains); only 1: writes are not replicated yet

[io]
# cache_mib = 64        # each io server's Unifier cache, MiB; unset: an eighth
                        # of the machine's MemAvailable shared by the io
                        # servers, 8 to 1024 MiB each (`dafne status` shows it)
raw_percent = 0         # percent of each cache registered when first used
                        # instead of at start (the seed's raw buffers)
# max_pinned_mib = 48   # bound on each cache's registered memory: cold raw
                        # memory is deregistered (its data kept) to stay under
mode = "unifier"        # unifier | normal | mmap (the seed's serving modes)

[mount]
attr_timeout_ms = 1000  # kernel attribute cache
entry_timeout_ms = 1000 # kernel name cache

[ucx]                   # UCX settings for every process (without the UCX_ prefix)
TLS = "posix,sysv,cma,self,tcp"
NET_DEVICES = "lo"
# MM_FIFO_SIZE = "256"  # added whenever TLS has shared memory (posix, sysv): UCX's
                        # default 64 overflows with reads in flight into application
                        # buffers; a key set here wins, as for every other key

# Several hosts (docs/DEPLOY.md): list them; each runs `dafne up --host NAME`
# with this same file. [cluster] host and io_servers are then not used; io
# server ids follow this order; each host's io servers take io_base_port + k.
# [[hosts]]
# name = "meta1"
# address = "10.0.0.10"
# meta = true
# [[hosts]]
# name = "io1"
# address = "10.0.0.11"
# io_servers = 2
# ucx = { NET_DEVICES = "eth0" }  # this host's own UCX settings over [ucx]'s
"#;

/// `ucx` with every embedded UCX setting it does not give (a key given
/// wins), except the shared-memory FIFO (`dafne_transport::SHM_FIFO`) when
/// its transports have no shared memory: UCX warns about a setting no
/// transport takes. So a configuration written before a default was added
/// gets it too.
///
/// A multi-host configuration does not get the embedded `NET_DEVICES =
/// "lo"` (loopback reaches no other host): UCX then uses every device,
/// unless `[ucx]` or a host's `ucx` names some.
fn with_embedded_ucx(mut ucx: BTreeMap<String, String>, multi_host: bool) -> BTreeMap<String, String> {
    for (k, v) in Config::embedded().ucx {
        if multi_host && k == "NET_DEVICES" {
            continue;
        }
        ucx.entry(k).or_insert(v);
    }
    let shm = dafne_transport::tls_has_shared_memory(ucx.get("TLS").map(String::as_str));
    let (fifo, _) = dafne_transport::SHM_FIFO;
    if !shm && ucx.get(fifo).map(String::as_str) == Some(dafne_transport::SHM_FIFO.1) {
        ucx.remove(fifo);
    }
    ucx
}

impl Config {
    /// The embedded defaults, UCX settings included (shared memory and cma
    /// within the machine, TCP on loopback for the connections).
    pub fn embedded() -> Config {
        let mut c = Config::default();
        c.ucx.insert("TLS".into(), "posix,sysv,cma,self,tcp".into());
        c.ucx.insert("NET_DEVICES".into(), "lo".into());
        let (k, v) = dafne_transport::SHM_FIFO;
        c.ucx.insert(k.into(), v.into());
        c
    }

    /// Parses a configuration; missing UCX settings take the embedded ones.
    pub fn parse(text: &str, origin: &Path) -> Result<Config> {
        let mut c: Config = toml::from_str(text).with_context(|| {
            format!("{}: not a valid dafne configuration (`dafne config` prints a commented example)", origin.display())
        })?;
        let multi = !c.hosts.is_empty();
        c.ucx = with_embedded_ucx(std::mem::take(&mut c.ucx), multi);
        if multi {
            c.apply_hosts(text).with_context(|| format!("{}", origin.display()))?;
        }
        c.check().with_context(|| format!("{}", origin.display()))?;
        Ok(c)
    }

    /// With a `[[hosts]]` list: the hosts decide how many io servers there
    /// are (each host's count bounded first, so that the sum cannot
    /// overflow), `[cluster] io_servers` and `host` are refused unless they
    /// agree (a file `up` saved writes them), and an unset `[meta]
    /// stripe_count` is clamped to the io servers, as on one host.
    fn apply_hosts(&mut self, text: &str) -> Result<()> {
        for h in &self.hosts {
            if h.io_servers > MAX_IO_SERVERS {
                bail!("host {:?}: io_servers = {}: choose between 0 and {MAX_IO_SERVERS}", h.name, h.io_servers);
            }
        }
        let total: u32 = self.hosts.iter().map(|h| h.io_servers).sum();
        let raw: toml::Table = toml::from_str(text).unwrap_or_default();
        let section = |name: &str, key: &str| raw.get(name).and_then(|t| t.get(key)).cloned();
        if let Some(n) = section("cluster", "io_servers") {
            if n.as_integer() != Some(i64::from(total)) {
                bail!(
                    "[cluster] io_servers = {n} is not used with a [[hosts]] list (each host's io_servers is; they \
                     add up to {total}): remove it"
                );
            }
        }
        if section("cluster", "host").is_some() && self.cluster.host != ClusterConfig::default().host {
            bail!(
                "[cluster] host = \"{}\" is not used with a [[hosts]] list (each host's address is): remove it",
                self.cluster.host
            );
        }
        self.cluster.io_servers = total;
        if section("meta", "stripe_count").is_none() {
            self.meta.stripe_count = self.meta.stripe_count.min(total.max(1));
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Config> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading configuration {}", path.display()))?;
        Config::parse(&text, path)
    }

    /// Values that parse but cannot work.
    pub fn check(&self) -> Result<()> {
        self.check_hosts()?;
        let c = &self.cluster;
        if c.io_servers == 0 || c.io_servers > MAX_IO_SERVERS {
            if self.multi_host() {
                bail!("the hosts' io_servers add up to {}: choose between 1 and {MAX_IO_SERVERS}", c.io_servers);
            }
            bail!("cluster.io_servers = {}: choose between 1 and {MAX_IO_SERVERS}", c.io_servers);
        }
        // Ports io_base_port ..= io_base_port + io_servers - 1 (with
        // [[hosts]], each host's own count: `check_hosts`).
        // 0 is not "a free port each" (as for meta_port): io server i
        // would listen on port i (io server 1 on port 1).
        if c.io_base_port == 0 {
            bail!(
                "cluster.io_base_port = 0 (--io-base-port 0): io server i listens on io_base_port + i, so 0 would \
                 put io server 1 on port 1; pass a free base port with {} free ports after it (e.g. --io-base-port \
                 7710, the default)",
                c.io_servers
            );
        }
        if !self.multi_host() && c.io_base_port as u32 + c.io_servers > u16::MAX as u32 + 1 {
            bail!(
                "cluster.io_base_port = {} leaves no room for {} io servers (ports {}..={} would pass 65535): the \
                 highest base for {} io servers is {}",
                c.io_base_port,
                c.io_servers,
                c.io_base_port,
                c.io_base_port as u32 + c.io_servers - 1,
                c.io_servers,
                u16::MAX as u32 + 1 - c.io_servers
            );
        }
        let io_ports = c.io_base_port as u32..c.io_base_port as u32 + c.io_servers;
        if !self.multi_host() && c.meta_port != 0 && io_ports.contains(&(c.meta_port as u32)) {
            bail!("cluster.meta_port = {} collides with the io servers' ports {:?}", c.meta_port, io_ports);
        }
        if c.metrics_base_port != 0 {
            let metrics = c.metrics_base_port as u32..c.metrics_base_port as u32 + 1 + c.io_servers;
            if metrics.end > u16::MAX as u32 + 1 {
                bail!(
                    "cluster.metrics_base_port = {} leaves no room for the metrics ports of 1 + {} servers: the \
                     highest base for {} io servers is {}",
                    c.metrics_base_port,
                    c.io_servers,
                    c.io_servers,
                    u16::MAX as u32 - c.io_servers
                );
            }
            let owner = |port: u32| -> Option<String> {
                if port == c.meta_port as u32 {
                    Some(format!("the metadata server's port (cluster.meta_port = {})", c.meta_port))
                } else if io_ports.contains(&port) {
                    Some(format!(
                        "io server {}'s port (cluster.io_base_port = {} + {})",
                        port - io_ports.start,
                        c.io_base_port,
                        port - io_ports.start
                    ))
                } else {
                    None
                }
            };
            if let Some((port, what)) = metrics.clone().find_map(|p| owner(p).map(|w| (p, w))) {
                let whose = match port - metrics.start {
                    0 => "the metadata server's metrics port".to_string(),
                    k => format!("io server {}'s metrics port", k - 1),
                };
                bail!(
                    "cluster.metrics_base_port = {}: port {port}, {whose}, collides with {what}; the metrics ports \
                     are {}..={}",
                    c.metrics_base_port,
                    metrics.start,
                    metrics.end - 1
                );
            }
        }
        if self.meta.stripe_count == 0 || self.meta.stripe_count > c.io_servers {
            bail!(
                "meta.stripe_count = {}: choose between 1 and {} ({})",
                self.meta.stripe_count,
                if self.multi_host() { "the io servers of [[hosts]]" } else { "cluster.io_servers" },
                c.io_servers
            );
        }
        dafne_meta::server::check_replicas(&self.layout_policy()).map_err(|e| anyhow::anyhow!("[meta] {e}"))?;
        // Chain writes forward from the Unifier's registered units.
        if self.meta.replicas > 1 && self.io.mode != "unifier" {
            bail!(
                "[meta] replicas = {} with io.mode = {:?}: replicated writes are forwarded from the unifier mode's \
                 cache only; use mode = \"unifier\" or replicas = 1",
                self.meta.replicas,
                self.io.mode
            );
        }
        if !self.meta.stripe_unit.is_power_of_two() || self.meta.stripe_unit < 4096 {
            bail!("meta.stripe_unit = {}: use a power of two of at least 4096 bytes", self.meta.stripe_unit);
        }
        if let Some(m) = self.io.cache_mib.filter(|&m| m < MIN_CACHE_MIB) {
            bail!("io.cache_mib = {m}: at least {MIN_CACHE_MIB} MiB (or leave it unset for a share of free memory)");
        }
        if self.io.raw_percent > 100 {
            bail!("io.raw_percent = {}: choose between 0 and 100", self.io.raw_percent);
        }
        if dafne_io::server::ServingMode::parse(&self.io.mode).is_none() {
            bail!("io.mode = {:?}: choose unifier, normal or mmap", self.io.mode);
        }
        Ok(())
    }

    /// Each io server's cache, MiB: `[io] cache_mib`, else
    /// [`auto_cache_mib`] of this machine's available memory (64 MiB if
    /// `/proc/meminfo` cannot be read).
    /// `local`: how many io servers this machine runs (a host of a
    /// multi-host cluster runs some of them).
    pub fn io_cache_mib_for(&self, local: u32) -> usize {
        self.io.cache_mib.unwrap_or_else(|| mem_available_mib().map_or(64, |m| auto_cache_mib(m, local)))
    }

    /// The hosts list's problems: names, one metadata server, a host with
    /// nothing to run, fixed ports that two servers would share.
    fn check_hosts(&self) -> Result<()> {
        if self.hosts.is_empty() {
            return Ok(());
        }
        let mut names = std::collections::BTreeSet::new();
        for h in &self.hosts {
            if h.name.is_empty()
                || h.name.len() > 64
                || !h.name.chars().all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '-' | '_'))
            {
                bail!("[[hosts]] name = {:?}: use 1 to 64 letters, digits, '.', '-' or '_'", h.name);
            }
            if !names.insert(h.name.as_str()) {
                bail!("[[hosts]] name = {:?} is listed twice: each host once, with all its servers", h.name);
            }
            if h.address.is_unspecified() || h.address.is_multicast() {
                bail!(
                    "host {:?}: address = \"{}\" is not an address clients can reach: give the host's own address \
                     on the cluster's network",
                    h.name,
                    h.address
                );
            }
            if h.address.is_loopback() != self.hosts[0].address.is_loopback() {
                bail!(
                    "host {:?}: address = \"{}\": a loopback address is reachable only from its own machine; give \
                     every host its address on the cluster's network (or every host a loopback address, for a \
                     cluster on one machine)",
                    if h.address.is_loopback() { &h.name } else { &self.hosts[0].name },
                    if h.address.is_loopback() { h.address } else { self.hosts[0].address }
                );
            }
            if !h.meta && h.io_servers == 0 {
                bail!(
                    "host {:?} runs nothing (neither meta = true nor io_servers): remove it from [[hosts]]; a machine \
                     that only runs clients needs no entry (`dafne up --client` there)",
                    h.name
                );
            }
            if u64::from(self.cluster.io_base_port) + u64::from(h.io_servers) > u64::from(u16::MAX) + 1 {
                bail!(
                    "host {:?}: cluster.io_base_port = {} leaves no room for its {} io servers",
                    h.name,
                    self.cluster.io_base_port,
                    h.io_servers
                );
            }
        }
        let metas: Vec<&str> = self.hosts.iter().filter(|h| h.meta).map(|h| h.name.as_str()).collect();
        match metas.len() {
            1 => {}
            0 => bail!("[[hosts]]: no host runs the metadata server: set meta = true on one of them"),
            _ => bail!("[[hosts]]: hosts {} all set meta = true: one metadata server per cluster", metas.join(", ")),
        }
        if self.cluster.meta_port == 0 || self.cluster.io_base_port == 0 {
            bail!(
                "cluster.meta_port and cluster.io_base_port must be fixed ports (not 0) for a cluster of several hosts"
            );
        }
        // Every server's address once: two hosts on one address share its ports.
        let mut seen: BTreeMap<SocketAddr, String> = BTreeMap::new();
        for (name, host, addr) in self.servers() {
            if let Some(other) = seen.insert(addr, format!("{name} of host {host:?}")) {
                bail!(
                    "[[hosts]]: {name} of host {host:?} and {other} would both listen on {addr}: give the hosts \
                     different addresses"
                );
            }
        }
        Ok(())
    }

    /// How meta lays files out: the io servers, their hosts (with a
    /// `[[hosts]]` list), the stripe defaults and the replicas per chain.
    pub fn layout_policy(&self) -> dafne_meta::LayoutPolicy {
        dafne_meta::LayoutPolicy {
            servers: (0..self.cluster.io_servers).collect(),
            default_stripe_unit: self.meta.stripe_unit,
            default_stripe_count: self.meta.stripe_count,
            replicas: self.meta.replicas,
            hosts: if self.multi_host() {
                (0..self.cluster.io_servers).map(|i| self.io_host(i).to_string()).collect()
            } else {
                Vec::new()
            },
        }
    }

    /// Whether this is a cluster of several hosts (`[[hosts]]`).
    pub fn multi_host(&self) -> bool {
        !self.hosts.is_empty()
    }

    /// Every server of the cluster: (name, host, address), meta first, then
    /// the io servers by id. One host: every server on `[cluster] host`
    /// (its host named "").
    pub fn servers(&self) -> Vec<(String, String, SocketAddr)> {
        let mut out = vec![("meta".to_string(), self.meta_host().to_string(), self.meta_addr())];
        out.extend(
            (0..self.cluster.io_servers).map(|i| (format!("io-{i}"), self.io_host(i).to_string(), self.io_addr(i))),
        );
        out
    }

    /// The host entry named `name`, or an error listing the names.
    pub fn host(&self, name: &str) -> Result<&HostConfig> {
        if self.hosts.is_empty() {
            bail!("--host {name}: this configuration lists no [[hosts]] (a one-host cluster): leave --host out");
        }
        self.hosts.iter().find(|h| h.name == name).with_context(|| {
            let names: Vec<&str> = self.hosts.iter().map(|h| h.name.as_str()).collect();
            format!("--host {name}: no such host in the configuration's [[hosts]] (it lists {})", names.join(", "))
        })
    }

    /// The name of the host the metadata server runs on ("" for one host).
    pub fn meta_host(&self) -> &str {
        self.hosts.iter().find(|h| h.meta).map_or("", |h| h.name.as_str())
    }

    /// The host of io server `i` ("" for one host), and its index among
    /// that host's io servers.
    fn io_place(&self, i: u32) -> (Option<&HostConfig>, u32) {
        let mut first = 0;
        for h in &self.hosts {
            if i < first + h.io_servers {
                return (Some(h), i - first);
            }
            first += h.io_servers;
        }
        (None, i)
    }

    /// The name of io server `i`'s host ("" for one host).
    pub fn io_host(&self, i: u32) -> &str {
        self.io_place(i).0.map_or("", |h| h.name.as_str())
    }

    /// The io servers `host` runs (every one for one host, `host` `None`).
    pub fn local_io(&self, host: Option<&str>) -> Vec<u32> {
        (0..self.cluster.io_servers).filter(|&i| host.is_none_or(|n| self.io_host(i) == n)).collect()
    }

    pub fn meta_addr(&self) -> SocketAddr {
        match self.hosts.iter().find(|h| h.meta) {
            Some(h) => SocketAddr::new(h.address, self.cluster.meta_port),
            None => SocketAddr::new(self.cluster.host, self.cluster.meta_port),
        }
    }

    pub fn io_addr(&self, i: u32) -> SocketAddr {
        match self.io_place(i) {
            (Some(h), k) => SocketAddr::new(h.address, self.cluster.io_base_port + k as u16),
            (None, k) => SocketAddr::new(self.cluster.host, self.cluster.io_base_port + k as u16),
        }
    }

    /// The metrics address of the metadata server (`None`) or io server
    /// `i`: port 0 (a free one) when `metrics_base_port` is 0.
    pub fn metrics_addr(&self, io: Option<u32>) -> SocketAddr {
        let c = &self.cluster;
        let port = match (c.metrics_base_port, io) {
            (0, _) => 0,
            (base, None) => base,
            (base, Some(i)) => base + 1 + i as u16,
        };
        SocketAddr::new(c.metrics_host, port)
    }

    /// The UCX settings of `host`'s processes: `[ucx]` with the host's own
    /// `ucx` over it.
    pub fn ucx_of(&self, host: Option<&str>) -> BTreeMap<String, String> {
        let mut u = self.ucx.clone();
        if let Some(h) = host.and_then(|n| self.hosts.iter().find(|h| h.name == n)) {
            u.extend(h.ucx.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        u
    }

    /// [`Config::ucx_of`] as `--ucx KEY=VALUE` arguments of the server
    /// commands.
    pub fn ucx_args_of(&self, host: Option<&str>) -> Vec<String> {
        Self::args_of(&self.ucx_of(host))
    }

    fn args_of(ucx: &BTreeMap<String, String>) -> Vec<String> {
        ucx.iter().flat_map(|(k, v)| ["--ucx".to_string(), format!("{k}={v}")]).collect()
    }
}

/// The cluster directory: `--dir`, else `$DAFNE_HOME`, else `~/.dafne`.
pub fn resolve_dir(flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(d) = flag {
        return Ok(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("DAFNE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".dafne")),
        None => bail!("no cluster directory: pass --dir DIR or set DAFNE_HOME"),
    }
}

/// How a client of the cluster logs in, and from which file: the
/// cluster secret (a fully trusted client) or a per-client credential
/// (`--credential FILE`), which never needs the secret file.
pub struct ClientLogin {
    pub key: dafne_auth::LoginKey,
    /// The secret or credential file it came from.
    pub file: PathBuf,
}

impl ClientLogin {
    /// With `credential`, that credential file (the cluster secret is not
    /// read at all); otherwise the cluster's secret file.
    pub fn load(info: &ClusterInfo, credential: Option<&Path>) -> Result<ClientLogin> {
        match credential {
            Some(f) => {
                let c = dafne_auth::CredentialFile::load(f)?;
                Ok(ClientLogin { key: c.into(), file: f.to_path_buf() })
            }
            None => {
                let secret = dafne_auth::Secret::load(&info.secret).with_context(|| {
                    format!(
                        "reading the cluster secret {} (a client without it logs in with --credential FILE, \
                         issued by `dafne credential issue` where the secret is)",
                        info.secret.display()
                    )
                })?;
                Ok(ClientLogin { key: secret.into(), file: info.secret.clone() })
            }
        }
    }

    fn is_credential(&self) -> bool {
        self.key.credential().is_some()
    }
}

/// What a client of the cluster `info` says when a connection is refused
/// or fails: a refusal names the secret or credential file this side used
/// (the usual causes: a secret that does not match the cluster's, a
/// credential edited, issued elsewhere, or revoked) and the fix.
pub fn explain_connect(info: &ClusterInfo, login: &ClientLogin, e: dafne_client::ConnectError) -> anyhow::Error {
    use dafne_client::ConnectError;
    let file = login.file.display();
    let refusal = is_refusal(&e);
    match e {
        ConnectError::Refused(errno) if errno == dafne_client::Errno::EKEYREVOKED => anyhow::anyhow!(
            "the metadata server at {} refused the session: the credential {file} was revoked (`dafne credential \
             revoke`); ask the cluster's admin for a new one",
            info.meta
        ),
        ConnectError::Refused(errno) if refusal && login.is_credential() => anyhow::anyhow!(
            "the metadata server at {} refused the session ({errno}): the credential {file} does not match the \
             cluster's secret (was it edited after it was issued, or issued for another cluster? ask for a new one \
             from `dafne credential issue`)",
            info.meta
        ),
        ConnectError::Refused(errno) if refusal => anyhow::anyhow!(
            "the metadata server at {} refused the session ({errno}): the secret file {file} does not match the \
             cluster's (use the cluster's own secret file, the one `dafne up` wrote)",
            info.meta
        ),
        ConnectError::IoLogin { addr, why } if refusal && login.is_credential() => anyhow::anyhow!(
            "the io server at {addr} refused the login ({why}): the credential {file} does not match the secret \
             that server was started with (edited, or issued for another cluster?)"
        ),
        ConnectError::IoLogin { addr, why } if refusal => anyhow::anyhow!(
            "the io server at {addr} refused the login ({why}): the secret file {file} does not match the one that \
             server was started with (its --secret)"
        ),
        other => anyhow::Error::new(other),
    }
}

/// Whether a server refused this client's secret or credential. Only
/// EACCES (and a revoked credential) is: a server that is stopping answers
/// EAGAIN, and a login can also fail in transport (a timeout).
pub fn is_refusal(e: &dafne_client::ConnectError) -> bool {
    use dafne_client::ConnectError;
    match e {
        ConnectError::Refused(errno) => {
            *errno == dafne_proto::Errno::EACCES || *errno == dafne_proto::Errno::EKEYREVOKED
        }
        ConnectError::IoLogin { why, .. } => *why == dafne_proto::Errno::EACCES.to_string(),
        _ => false,
    }
}

/// What a running cluster publishes in `DIR/cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterInfo {
    /// The cluster directory (absolute).
    pub dir: PathBuf,
    pub meta: SocketAddr,
    /// Io server addresses; index = server id in layouts.
    pub io: Vec<SocketAddr>,
    /// The cluster secret file.
    pub secret: PathBuf,
    /// UCX settings every process of the cluster uses.
    pub ucx: Vec<(String, String)>,
    /// The supervisor's process id (`down` signals it).
    pub supervisor_pid: u32,
    /// Kernel cache timeouts for mounts, milliseconds.
    pub attr_timeout_ms: u64,
    pub entry_timeout_ms: u64,
    /// Each server's metrics port (`GET /metrics`), meta first, then the io
    /// servers in order (of a multi-host cluster, this host's servers).
    #[serde(default)]
    pub metrics: Vec<MetricsEndpoint>,
    /// Of a multi-host cluster, the host whose supervisor wrote this file
    /// (`dafne up --host`); `None` for one host or a client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Written by `dafne up --client`: no server and no supervisor run
    /// here; the file only tells clients where the cluster's servers are.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub client: bool,
}

/// Where one server's metrics are.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MetricsEndpoint {
    /// `meta` or `io-N` (the `server` label of its samples).
    pub server: String,
    pub addr: SocketAddr,
}

impl ClusterInfo {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("cluster.json")
    }

    /// The running cluster of `dir`, or an error that says what to do.
    pub fn load(dir: &Path) -> Result<ClusterInfo> {
        let path = Self::path(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("no dafne cluster is running in {}: start one with `{}`", dir.display(), up_command(dir))
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let info: ClusterInfo = serde_json::from_str(&text).with_context(|| {
            format!("{} is damaged: stop the cluster with `dafne down` and start it again", path.display())
        })?;
        if info.client {
            return Ok(info);
        }
        if !supervisor_running(dir) || !pid_alive(info.supervisor_pid) {
            bail!(
                "the dafne cluster in {} is not running (its supervisor, pid {}, is gone): run `{}` again",
                dir.display(),
                info.supervisor_pid,
                up_command(dir)
            );
        }
        Ok(info)
    }

    /// Written atomically (rename), so a reader never sees half a file.
    pub fn save(&self) -> Result<()> {
        let path = Self::path(&self.dir);
        let tmp = self.dir.join("cluster.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    /// Records a live mount (by the pid of its daemon), so `down` can
    /// unmount it (`dafne_cluster::mounts`).
    pub fn record_mount(dir: &Path, pid: u32, mountpoint: &Path) -> Result<()> {
        Ok(dafne_cluster::mounts::record_mount(dir, pid, mountpoint)?)
    }

    pub fn forget_mount(dir: &Path, pid: u32) {
        dafne_cluster::mounts::forget_mount(dir, pid)
    }

    /// Recorded mounts whose daemon still runs: (pid, mount point).
    pub fn live_mounts(dir: &Path) -> Vec<(u32, PathBuf)> {
        dafne_cluster::mounts::live_mounts(dir)
    }
}

/// ` --dir DIR` when `dir` is not what the command finds by default.
/// The `dafne up` that starts `dir`'s cluster again: with the host its
/// last `up --host` recorded (`DIR/host`), `--client` for a machine of a
/// multi-host cluster that recorded none, plain otherwise.
pub fn up_command(dir: &Path) -> String {
    let f = dir_flag(dir);
    if let Some(h) = std::fs::read_to_string(dir.join("host")).ok().map(|s| s.trim().to_string()) {
        if !h.is_empty() {
            return format!("dafne up --host {h}{f}");
        }
    }
    if Config::load(&dir.join("config.toml")).is_ok_and(|c| c.multi_host()) {
        return format!("dafne up --client{f}` (or `dafne up --host NAME{f}` on a server's host");
    }
    format!("dafne up{f}")
}

pub fn dir_flag(dir: &Path) -> String {
    match resolve_dir(None) {
        Ok(d) if d == dir => String::new(),
        _ => format!(" --dir {}", dir.display()),
    }
}

/// The supervisor's lock, `DIR/supervisor.lock`: held (flock) by the
/// supervisor for its whole life, so "is a cluster running here" does not
/// depend on a pid that may have been reused (after a reboot, or a killed
/// supervisor), and two `dafne up` on one directory cannot both start one.
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join("supervisor.lock")
}

/// Takes the supervisor's lock without waiting; `None` when a live
/// supervisor holds it. The lock lasts as long as the returned file.
pub fn try_lock(dir: &Path) -> Result<Option<std::fs::File>> {
    let path = lock_path(dir);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(std::io::Error::from(e)).with_context(|| format!("locking {}", path.display())),
    }
}

/// Whether a supervisor holds `dir`'s lock (a cluster runs or is starting).
/// A probe opens the lock file read-only and takes the lock shared for an
/// instant (flock needs no write access); a supervisor starting at that
/// instant retries.
pub fn supervisor_running(dir: &Path) -> bool {
    let Ok(f) = std::fs::File::open(lock_path(dir)) else { return false };
    matches!(
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared),
        Err(rustix::io::Errno::WOULDBLOCK)
    )
}

/// Records the supervisor's pid in its lock file (for `down` when
/// `cluster.json` is missing or damaged).
pub fn set_lock_owner(lock: &std::fs::File, pid: u32) -> Result<()> {
    use std::io::{Seek, Write};
    let mut f = lock;
    f.set_len(0)?;
    f.seek(std::io::SeekFrom::Start(0))?;
    f.write_all(pid.to_string().as_bytes())?;
    Ok(())
}

/// Whether this process's stdin is `dir`'s lock file, locked (how `up`
/// hands the lock to the supervisor it starts).
pub fn holds_lock_as_stdin(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let stdin = std::io::stdin();
    let (Ok(st), Ok(lock)) = (rustix::fs::fstat(&stdin), std::fs::metadata(lock_path(dir))) else { return false };
    st.st_ino == lock.ino()
        && st.st_dev == lock.dev()
        // Same open file as the holder: taking it again succeeds at once.
        && rustix::fs::flock(&stdin, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// The pid recorded in the lock file by a running supervisor.
pub fn lock_owner(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(lock_path(dir)).ok()?.trim().parse().ok()
}

/// Whether `path` is a mount point (per /proc/self/mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .map(|mp| dafne_fuse::unescape_mountinfo(mp) == canon.as_os_str().to_string_lossy())
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_default_cache_is_a_capped_share_of_available_memory() {
        let meminfo = "MemTotal:       24684136 kB\nMemFree:  748000 kB\nMemAvailable:   22720512 kB\n";
        assert_eq!(dafne_client::machine::parse_available_bytes(meminfo).map(|b| b >> 20), Some(22188));
        // 22188 MiB / 8 / 4 servers = 693 -> 688 (whole 8 MiB slabs).
        assert_eq!(auto_cache_mib(22188, 4), 688);
        assert_eq!(auto_cache_mib(22188, 1), AUTO_CACHE_CAP_MIB, "capped");
        assert_eq!(auto_cache_mib(100, 4), MIN_CACHE_MIB, "floored");
        assert_eq!(auto_cache_mib(u64::MAX, 0), AUTO_CACHE_CAP_MIB);
        let mut c = Config::embedded();
        c.io.cache_mib = Some(16);
        assert_eq!(c.io_cache_mib_for(4), 16, "an explicit size wins");
        c.io.cache_mib = Some(4);
        assert!(c.check().unwrap_err().to_string().contains("at least 8 MiB"));
    }

    use super::*;

    /// Only a refusal blames the secret file: a server that is stopping
    /// (EAGAIN) or a login that timed out named the secret as the cause
    /// (review).
    #[test]
    fn only_a_refusal_is_blamed_on_the_secret() {
        use dafne_client::ConnectError;
        use dafne_proto::Errno;
        let info = ClusterInfo {
            dir: "/c".into(),
            meta: "127.0.0.1:7700".parse().unwrap(),
            io: vec![],
            secret: "/c/meta/cluster.secret".into(),
            ucx: vec![],
            supervisor_pid: 1,
            attr_timeout_ms: 1000,
            entry_timeout_ms: 1000,
            metrics: vec![],
            host: None,
            client: false,
        };
        let addr: SocketAddr = "127.0.0.1:7710".parse().unwrap();
        let login = ClientLogin { key: dafne_auth::Secret::from_bytes([1; 32]).into(), file: info.secret.clone() };
        let blames = |e: ConnectError| format!("{:#}", explain_connect(&info, &login, e)).contains("does not match");
        assert!(blames(ConnectError::Refused(Errno::EACCES)));
        assert!(blames(ConnectError::IoLogin { addr, why: Errno::EACCES.to_string() }));
        assert!(!blames(ConnectError::Refused(Errno::EAGAIN)), "a busy metadata server blamed on the secret");
        assert!(!blames(ConnectError::IoLogin { addr, why: Errno::EAGAIN.to_string() }), "a stopping io server");
        assert!(!blames(ConnectError::IoLogin { addr, why: "timed out after 5 s".into() }), "a timeout");
    }

    #[test]
    fn every_process_gets_the_larger_shared_memory_fifo() {
        // dafne_transport::SHM_FIFO's docs: UCX's default overflows with
        // several reads in flight into application buffers.
        let c = Config::embedded();
        assert_eq!(c.ucx.get("MM_FIFO_SIZE").map(String::as_str), Some("256"));
        assert!(
            c.ucx_args_of(None).windows(2).any(|w| w[0] == "--ucx" && w[1] == "MM_FIFO_SIZE=256"),
            "{:?}",
            c.ucx_args_of(None)
        );
    }

    #[test]
    fn a_ucx_section_keeps_its_keys_and_gets_the_embedded_ones_it_lacks() {
        let old = Config::parse("[ucx]\nTLS = \"posix,sysv,cma,self,tcp\"\nNET_DEVICES = \"lo\"\n", Path::new("old"))
            .unwrap();
        assert_eq!(old.ucx.get("MM_FIFO_SIZE").map(String::as_str), Some("256"), "a config from before the FIFO");
        let tcp = Config::parse("[ucx]\nTLS = \"tcp\"\n", Path::new("tcp")).unwrap();
        assert_eq!(tcp.ucx.get("TLS").map(String::as_str), Some("tcp"));
        assert_eq!(tcp.ucx.get("NET_DEVICES").map(String::as_str), Some("lo"));
        assert!(!tcp.ucx.contains_key("MM_FIFO_SIZE"), "no shared memory, no FIFO setting: {:?}", tcp.ucx);
        let own = Config::parse("[ucx]\nMM_FIFO_SIZE = \"512\"\n", Path::new("own")).unwrap();
        assert_eq!(own.ucx.get("MM_FIFO_SIZE").map(String::as_str), Some("512"), "a key given wins");
    }

    #[test]
    fn the_example_is_the_embedded_default() {
        let c = Config::parse(EXAMPLE, Path::new("example")).unwrap();
        assert_eq!(c, Config::embedded());
        assert_eq!(Config::parse("", Path::new("empty")).unwrap(), Config::embedded());
    }

    #[test]
    fn typos_and_impossible_values_are_refused_with_the_key() {
        let e = Config::parse("[cluster]\nio_server = 3\n", Path::new("c.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("io_server"), "{e:#}");
        let e = Config::parse("[meta]\nstripe_count = 9\n", Path::new("c.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("stripe_count"), "{e:#}");
        let e = Config::parse("[io]\nmode = \"fast\"\n", Path::new("c.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("io.mode"), "{e:#}");
        let e = Config::parse("[cluster]\nmeta_port = 7711\n", Path::new("c.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("collides"), "{e:#}");
        // Metrics ports 7705..=7709 are free; 7706..=7710 take io server 0's.
        let ok = Config::parse("[cluster]\nmetrics_base_port = 7705\n", Path::new("c.toml")).unwrap();
        assert_eq!(ok.metrics_addr(None).port(), 7705);
        assert_eq!(ok.metrics_addr(Some(3)).port(), 7709);
        let e = Config::parse("[cluster]\nmetrics_base_port = 7706\n", Path::new("c.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("metrics_base_port"), "{e:#}");
        assert!(
            format!("{e:#}").contains("port 7710, io server 3's metrics port, collides with io server 0's port"),
            "{e:#}"
        );
        let e = Config::parse("[cluster]\nmetrics_base_port = 7698\n", Path::new("c.toml")).unwrap_err();
        assert!(
            format!("{e:#}")
                .contains("port 7700, io server 1's metrics port, collides with the metadata server's port"),
            "{e:#}"
        );
        let e = Config::parse("[cluster]\nmetrics_base_port = 65533\n", Path::new("c.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("no room"), "{e:#}");
        assert!(format!("{e:#}").contains("the highest base for 4 io servers is 65531"), "{e:#}");
        Config::parse("[cluster]\nmetrics_base_port = 65531\n", Path::new("c.toml")).unwrap();
        assert_eq!(Config::embedded().metrics_addr(Some(2)), "127.0.0.1:0".parse().unwrap(), "free ports by default");
    }

    #[test]
    fn the_lock_is_held_by_one_owner() {
        let d = tempfile::tempdir().unwrap();
        assert!(!supervisor_running(d.path()));
        let held = try_lock(d.path()).unwrap().expect("free");
        assert!(supervisor_running(d.path()));
        assert!(try_lock(d.path()).unwrap().is_none());
        drop(held);
        assert!(!supervisor_running(d.path()));
    }
}

#[cfg(test)]
mod hosts_tests {
    use super::*;

    const THREE: &str = r#"
[cluster]
meta_port = 7700
io_base_port = 7710
[meta]
stripe_count = 3
[[hosts]]
name = "m"
address = "10.0.0.1"
meta = true
[[hosts]]
name = "a"
address = "10.0.0.2"
io_servers = 1
[[hosts]]
name = "b"
address = "10.0.0.3"
io_servers = 2
ucx = { NET_DEVICES = "eth1" }
"#;

    fn err(text: &str) -> String {
        format!("{:#}", Config::parse(text, Path::new("h.toml")).unwrap_err())
    }

    #[test]
    fn io_server_ids_follow_the_files_order_and_each_host_counts_its_ports() {
        let c = Config::parse(THREE, Path::new("h.toml")).unwrap();
        assert_eq!(c.cluster.io_servers, 3, "the hosts list decides");
        assert_eq!(c.meta_addr(), "10.0.0.1:7700".parse().unwrap());
        assert_eq!(c.io_addr(0), "10.0.0.2:7710".parse().unwrap());
        assert_eq!(c.io_addr(1), "10.0.0.3:7710".parse().unwrap());
        assert_eq!(c.io_addr(2), "10.0.0.3:7711".parse().unwrap());
        assert_eq!(c.local_io(Some("b")), vec![1, 2]);
        assert_eq!(c.local_io(Some("m")), Vec::<u32>::new());
        assert_eq!(c.meta_host(), "m");
        assert!(!c.ucx.contains_key("NET_DEVICES"), "no loopback-only default across hosts: {:?}", c.ucx);
        assert_eq!(c.ucx_of(Some("b")).get("NET_DEVICES").map(String::as_str), Some("eth1"));
        assert_eq!(c.ucx_of(Some("a")).get("NET_DEVICES"), None);
        // What `up` saves parses back to the same configuration.
        let saved = toml::to_string(&c).unwrap();
        assert_eq!(Config::parse(&saved, Path::new("saved")).unwrap(), c, "{saved}");
        assert!(format!("{:#}", c.host("x").unwrap_err()).contains("it lists m, a, b"));
    }

    #[test]
    fn a_one_host_configuration_is_unchanged() {
        let c = Config::embedded();
        assert!(!c.multi_host());
        assert_eq!(c.io_addr(3), "127.0.0.1:7713".parse().unwrap());
        assert_eq!(c.local_io(None), vec![0, 1, 2, 3]);
        assert!(format!("{:#}", c.host("m").unwrap_err()).contains("lists no [[hosts]]"));
        assert!(toml::to_string(&c).unwrap().find("hosts").is_none(), "no empty hosts list written");
    }

    #[test]
    fn impossible_host_lists_are_refused_with_the_reason() {
        let dup = THREE.replace("10.0.0.3", "10.0.0.2");
        assert!(err(&dup).contains("would both listen on 10.0.0.2:7710"), "{}", err(&dup));
        let twice = THREE.replace("name = \"b\"", "name = \"a\"");
        assert!(err(&twice).contains("listed twice"), "{}", err(&twice));
        let idle = THREE.replace("io_servers = 1\n", "");
        assert!(err(&idle).contains("host \"a\" runs nothing"), "{}", err(&idle));
        let wide = THREE.replace("stripe_count = 3", "stripe_count = 4");
        assert!(err(&wide).contains("between 1 and the io servers of [[hosts]] (3)"), "{}", err(&wide));
        let no_meta = THREE.replace("meta = true\n", "io_servers = 1\n");
        assert!(err(&no_meta).contains("no host runs the metadata server"), "{}", err(&no_meta));
        let two_metas = THREE.replace("io_servers = 1\n", "io_servers = 1\nmeta = true\n");
        assert!(err(&two_metas).contains("one metadata server per cluster"), "{}", err(&two_metas));
        let any = THREE.replace("10.0.0.2", "0.0.0.0");
        assert!(err(&any).contains("not an address clients can reach"), "{}", err(&any));
        let free = THREE.replace("meta_port = 7700", "meta_port = 0");
        assert!(err(&free).contains("fixed ports"), "{}", err(&free));
        let name = THREE.replace("name = \"a\"", "name = \"a/b\"");
        assert!(err(&name).contains("letters, digits"), "{}", err(&name));
        let typo = THREE.replace("io_servers = 1", "io_server = 1");
        assert!(err(&typo).contains("io_server"), "{}", err(&typo));
    }

    /// Found by review: the hosts' counts were summed unchecked (a debug
    /// build panicked, a release build wrapped to 1 io server and host b
    /// ran nothing); one io server at port 65535 was refused; a loopback
    /// address beside real ones, `[cluster] io_servers` and `host` were
    /// taken silently; the default stripe count refused a smaller cluster.
    #[test]
    fn host_counts_ports_and_ignored_settings_are_checked() {
        let huge = THREE.replace("io_servers = 1\n", "io_servers = 4294967295\n");
        assert!(err(&huge).contains("host \"a\": io_servers = 4294967295: choose between 0 and 64"), "{}", err(&huge));
        let many = THREE.replace("io_servers = 1\n", "io_servers = 63\n");
        assert!(err(&many).contains("add up to 65: choose between 1 and 64"), "{}", err(&many));
        let top = THREE.replace("io_base_port = 7710", "io_base_port = 65534");
        Config::parse(&top, Path::new("h.toml")).expect("ports 65534 and 65535 for host b's two io servers");
        let over = THREE.replace("io_base_port = 7710", "io_base_port = 65535");
        assert!(err(&over).contains("leaves no room for its 2 io servers"), "{}", err(&over));
        let lo = THREE.replace("10.0.0.2", "127.0.0.1");
        assert!(err(&lo).contains("host \"a\": address = \"127.0.0.1\": a loopback address"), "{}", err(&lo));
        let all_lo = THREE.replace("10.0.0.", "127.0.0.");
        Config::parse(&all_lo, Path::new("h.toml")).expect("every host on loopback: one machine");
        let count = THREE.replace("[cluster]\n", "[cluster]\nio_servers = 8\n");
        assert!(err(&count).contains("[cluster] io_servers = 8 is not used"), "{}", err(&count));
        let agreeing = THREE.replace("[cluster]\n", "[cluster]\nio_servers = 3\n");
        Config::parse(&agreeing, Path::new("h.toml")).expect("a count that agrees (as `up` saves it)");
        let host = THREE.replace("[cluster]\n", "[cluster]\nhost = \"10.0.0.9\"\n");
        assert!(err(&host).contains("[cluster] host = \"10.0.0.9\" is not used"), "{}", err(&host));
        let small = THREE.replace("stripe_count = 3\n", "");
        assert_eq!(Config::parse(&small, Path::new("h.toml")).unwrap().meta.stripe_count, 3, "default 4 clamped");
    }

    #[test]
    fn replicas_are_checked_against_servers_hosts_and_the_serving_mode() {
        let c = Config::parse(THREE, Path::new("h.toml")).unwrap();
        assert_eq!(c.meta.replicas, 1);
        let p = c.layout_policy();
        assert_eq!(p.hosts, vec!["a", "b", "b"]);
        assert_eq!(p.chains().unwrap().len(), 3);
        let with = |r: u32| THREE.replace("stripe_count = 3", &format!("stripe_count = 3\nreplicas = {r}"));
        let e = err(&with(3));
        assert!(e.contains("replicas = 3 but the io servers sit on 2 distinct hosts (a, b)"), "{e}");
        assert!(e.contains("add hosts"), "{e}");
        // Two hosts make chains of two, served by chain writes (unifier
        // mode only).
        assert_eq!(Config::parse(&with(2), Path::new("h.toml")).unwrap().meta.replicas, 2);
        let e = err(&with(2).replace("[meta]", "[io]\nmode = \"normal\"\n[meta]"));
        assert!(e.contains("replicas = 2 with io.mode = \"normal\""), "{e}");
        let e = err(&with(0));
        assert!(e.contains("replicas = 0"), "{e}");
        let one_host = "[cluster]\nio_servers = 2\n[meta]\nstripe_count = 2\nreplicas = 3\n";
        let e = err(one_host);
        assert!(e.contains("replicas = 3 but the cluster has 2 io servers"), "{e}");
        assert!(Config::parse(&one_host.replace("replicas = 3", "replicas = 1"), Path::new("h.toml"))
            .unwrap()
            .layout_policy()
            .hosts
            .is_empty());
    }
}
