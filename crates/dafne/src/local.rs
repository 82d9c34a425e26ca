//! `dafne up`, `down`, `status`: a local cluster of separate server
//! processes under one supervisor.
//!
//! # Shape
//! `dafne up` checks the configuration and the ports, then starts
//! `dafne supervise` as a detached process (its own process group, its
//! output in `DIR/logs/supervisor.log`) and follows that log until the
//! cluster is up or has failed. The supervisor starts the metadata server
//! (which creates the cluster secret on first start), then the io servers,
//! each a `dafne serve …` child with its output in `DIR/logs/`; it writes
//! `DIR/cluster.json` once all of them listen, and `DIR/servers.json` with
//! each server's pid, state and restarts whenever that changes. A server
//! that exits unexpectedly is reported (in the log and in `dafne status`)
//! and restarted, when the configuration asks for it (`[cluster] restart`),
//! up to `max_restarts` times in a row: a server that has run
//! `restart_window_s` since its last start has that count
//! (`restarts_in_window`) reset; `restarts` is the total.
//!
//! Where the metadata server runs, the supervisor also runs the reclaimer
//! (deleted files' data) and the relay of revocations to the io servers
//! (`dafne_cluster`'s module `reclaim`).
//!
//! # What is here, what is in `dafne_cluster`
//! This module is the command: its flags, the checks `up` makes before
//! anything starts (configuration, ports, host, data directories), the
//! comparison with a running cluster's configuration, following the
//! supervisor's log, `status`, and turning the configuration into the
//! supervisor's plan (each server's `dafne serve …` arguments) and
//! `cluster.json`. Starting, watching, restarting and stopping the server
//! processes, `servers.json`, the reclaimer and the relay are the
//! library's (`crates/dafne-cluster`), which other programs that run a
//! cluster's servers share.
//!
//! `dafne down` signals the supervisor (SIGTERM), which unmounts the
//! cluster's mounts, stops the io servers (SIGTERM: each writes back its
//! cache first), then the metadata server, and removes `cluster.json`.
//!
//! # Several hosts
//! With a `[[hosts]]` list in the configuration (`cluster.rs`, "Several
//! hosts"), `dafne up --host NAME` runs on each host and its supervisor
//! starts only NAME's servers; the reclaimer and the revocation relay run
//! with the metadata server, and reach the other hosts' io servers at
//! their addresses in the file. Each host's `cluster.json` lists every
//! server of the file. The io servers of a host that is not the metadata
//! server's need the cluster secret before they start: the operator copies
//! it from the metadata server's host (`DIR/meta/cluster.secret`, the same
//! path on every host), and `up` says so when it is missing. `dafne up
//! --client` prepares a machine that runs no server: it writes
//! `cluster.json` from the file and starts nothing (its clients log in
//! with credentials). `--foreground` runs the supervisor in the command
//! itself, for a service manager (deploy/systemd/).
//!
//! Why a separate supervisor process rather than the servers detaching
//! themselves: someone has to notice a crash and restart it, and the
//! servers must not fork after UCX starts (UCX does not survive fork).

use std::io::{Read as _, Seek as _, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dafne_cluster::{
    load_states, logs_dir, tail, Plan, ReclaimTarget, RestartPolicy, ServerSpec, ServerState, Supervisor, Tee,
    IO_STOP_GRACE,
};
use serde::Serialize;

use crate::cluster::{dir_flag, same_process_alive, ClusterInfo, Config, EXAMPLE};

/// How long `up` waits for the cluster to come up.
const UP_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `down` follows a stopping supervisor (longer than its worst case).
const DOWN_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Configuration file (default DIR/config.toml; written with the
    /// embedded defaults at first start). `dafne config` prints an example.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Number of io servers (overrides [cluster] io_servers).
    #[arg(long)]
    pub io_servers: Option<u32>,
    /// Each io server's cache in MiB (overrides [io] cache_mib).
    #[arg(long)]
    pub cache_mib: Option<usize>,
    /// The metadata server's port (overrides [cluster] meta_port).
    #[arg(long)]
    pub meta_port: Option<u16>,
    /// The first io server's port (overrides [cluster] io_base_port).
    #[arg(long)]
    pub io_base_port: Option<u16>,
    /// The metadata server's metrics port; io server i gets this + 1 + i
    /// (overrides [cluster] metrics_base_port; 0: free ports, the default).
    #[arg(long)]
    pub metrics_base_port: Option<u16>,
    /// Of a configuration with a [[hosts]] list: the host this machine is;
    /// only its servers start here.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Of a configuration with a [[hosts]] list: start nothing, write
    /// DIR/cluster.json for the clients of this machine (which log in with
    /// `--credential`).
    #[arg(long, conflicts_with_all = ["host", "foreground"])]
    pub client: bool,
    /// Of --client: this machine's network devices for UCX, over the
    /// file's `[ucx] NET_DEVICES` (a NIC named differently here), as
    /// UCX_NET_DEVICES takes them (e.g. `ens9` or `mlx5_0:1`).
    #[arg(long, value_name = "DEVICES", requires = "client")]
    pub net_devices: Option<String>,
    /// Run the supervisor in this command until SIGTERM (for systemd and
    /// other service managers), its log on stdout, instead of in the
    /// background.
    #[arg(long)]
    pub foreground: bool,
}

#[derive(Debug, clap::Args)]
pub struct DirArgs {
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Log in with this per-client credential instead of the cluster
    /// secret, which is then not read.
    #[arg(long, value_name = "FILE")]
    pub credential: Option<PathBuf>,
    /// Print every server's metrics (fetched from its metrics port, see
    /// `cluster.json`) as one page in the Prometheus text format, instead
    /// of the tables.
    #[arg(long, conflicts_with_all = ["json", "credential"])]
    pub metrics: bool,
}

/// The configuration `up` uses: `--config`, else `DIR/config.toml`, else
/// the embedded defaults (then written to `DIR/config.toml`), with flags on
/// top. What was used is saved as `DIR/config.toml` for the supervisor.
/// Returns it with the text to save as `DIR/config.toml` (`up` saves it
/// once every check has passed, so a refused `up` changes nothing).
fn effective_config(a: &UpArgs, dir: &Path) -> Result<(Config, Option<String>)> {
    let saved = dir.join("config.toml");
    let mut save = None;
    let mut c = match &a.config {
        Some(p) => Config::load(p)?,
        None if saved.exists() => Config::load(&saved)?,
        None => {
            save = Some(EXAMPLE.to_string());
            Config::embedded()
        }
    };
    if c.multi_host() && a.io_servers.is_some() {
        bail!("--io-servers: this configuration's [[hosts]] list says how many io servers each host runs");
    }
    // Every host (and client) must agree on the ports: they come from the
    // one file, never from one host's command line.
    if c.multi_host() {
        for (flag, given, key) in [
            ("--meta-port", a.meta_port.is_some(), "meta_port"),
            ("--io-base-port", a.io_base_port.is_some(), "io_base_port"),
            ("--metrics-base-port", a.metrics_base_port.is_some(), "metrics_base_port"),
        ] {
            if given {
                bail!(
                    "{flag}: with a [[hosts]] list every host must use the same ports: set [cluster] {key} in the \
                     configuration file (the same file on every host) instead"
                );
            }
        }
    }
    if let Some(n) = a.io_servers {
        c.cluster.io_servers = n;
        c.meta.stripe_count = c.meta.stripe_count.min(n.max(1));
    }
    if let Some(m) = a.cache_mib {
        c.io.cache_mib = Some(m);
    }
    if let Some(p) = a.meta_port {
        c.cluster.meta_port = p;
    }
    if let Some(p) = a.io_base_port {
        c.cluster.io_base_port = p;
    }
    if let Some(p) = a.metrics_base_port {
        c.cluster.metrics_base_port = p;
    }
    c.check().context("the configuration with the command line's flags")?;
    if a.config.is_some() || flags_given(a) {
        let text = toml::to_string(&c).context("serializing the configuration")?;
        save = Some(format!(
            "# Written by `dafne up` (its flags applied). `dafne config` prints a commented example.\n{text}"
        ));
    }
    Ok((c, save))
}

/// What the configuration and flags of `a` change from the one a running
/// cluster in `dir` uses (`DIR/config.toml`, which `up` wrote before its
/// supervisor read it): each difference as "KEY: RUNNING running, GIVEN
/// given"; empty when they ask for what runs.
fn differs_from_running(a: &UpArgs, dir: &Path) -> Result<Vec<String>> {
    let saved = dir.join("config.toml");
    let running = Config::load(&saved).with_context(|| {
        format!(
            "dafne already runs in {}, but the configuration it uses, {}, cannot be read to compare with the one \
             given: `dafne down{}` first, then `dafne up` with it",
            dir.display(),
            saved.display(),
            dir_flag(dir)
        )
    })?;
    let (given, _) = effective_config(a, dir)?;
    // A --host the given configuration refuses is told as that (advice to
    // `down` and `up` with it would fail the same way).
    if !a.client {
        this_host(&given, a.host.as_deref())?;
    }
    let mut out = Vec::new();
    let value = |c: &Config| toml::Value::try_from(c).context("serializing the configuration");
    diff_values("", &value(&running)?, &value(&given)?, &mut out);
    let host = recorded_host(dir);
    if a.client {
        out.push("--client: this directory runs servers".to_string());
    } else if let Some(h) = a.host.as_deref().filter(|h| Some(*h) != host.as_deref()) {
        out.push(format!("--host: {} running, {h:?} given", host.map_or("none".to_string(), |r| format!("{r:?}"))));
    }
    Ok(out)
}

/// Appends to `out` the keys whose values differ between `running` and
/// `given` (TOML tables compared key by key; `at` is the path so far).
fn diff_values(at: &str, running: &toml::Value, given: &toml::Value, out: &mut Vec<String>) {
    let show = |v: Option<&toml::Value>| v.map_or("unset".to_string(), |v| v.to_string());
    match (running, given) {
        (toml::Value::Table(r), toml::Value::Table(g)) => {
            let keys: std::collections::BTreeSet<&String> = r.keys().chain(g.keys()).collect();
            for k in keys {
                let key = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                match (r.get(k), g.get(k)) {
                    (Some(rv), Some(gv)) => diff_values(&key, rv, gv, out),
                    (rv, gv) => out.push(format!("{key}: {} running, {} given", show(rv), show(gv))),
                }
            }
        }
        (r, g) if r != g => out.push(format!("{at}: {} running, {} given", show(Some(r)), show(Some(g)))),
        _ => {}
    }
}

/// Whether flags that change the configuration were given.
fn flags_given(a: &UpArgs) -> bool {
    a.io_servers.is_some()
        || a.cache_mib.is_some()
        || a.meta_port.is_some()
        || a.io_base_port.is_some()
        || a.metrics_base_port.is_some()
}

/// The file naming the host a multi-host supervisor runs (`up --host`).
fn host_path(dir: &Path) -> PathBuf {
    dir.join("host")
}

/// The host `dir`'s supervisor runs, as `up --host` recorded it.
fn recorded_host(dir: &Path) -> Option<String> {
    std::fs::read_to_string(host_path(dir)).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The `--host` given, checked against the configuration: required, and
/// listed, when it has [[hosts]]; refused when it has none.
fn this_host(c: &Config, flag: Option<&str>) -> Result<Option<String>> {
    match flag {
        Some(n) => c.host(n).map(|h| Some(h.name.clone())),
        None if c.multi_host() => {
            let names: Vec<&str> = c.hosts.iter().map(|h| h.name.as_str()).collect();
            bail!(
                "this configuration lists several hosts ({}): say which one this machine is with --host NAME, or \
                 --client on a machine that runs no server",
                names.join(", ")
            )
        }
        None => Ok(None),
    }
}

/// Refuses ports something else holds, before any process starts: those
/// of `host`'s servers (every server for one host).
fn check_ports(c: &Config, host: Option<&str>) -> Result<()> {
    let runs_meta = host.is_none_or(|h| c.meta_host() == h);
    let local = c.local_io(host);
    let mut addrs = Vec::new();
    if runs_meta {
        addrs.push(("metadata server", c.meta_addr()));
    }
    addrs.extend(local.iter().map(|&i| ("io server", c.io_addr(i))));
    if c.cluster.metrics_base_port != 0 {
        if runs_meta {
            addrs.push(("metadata server's metrics", c.metrics_addr(None)));
        }
        addrs.extend(local.iter().map(|&i| ("io server's metrics", c.metrics_addr(Some(i)))));
    }
    // Free ports (base 0) are taken by the servers, but the host must be
    // one of this machine's: else they would all serve without metrics.
    let metrics_host = SocketAddr::new(c.cluster.metrics_host, 0);
    if let Err(e) = TcpListener::bind(metrics_host) {
        bail!(
            "cannot listen for metrics on {} ([cluster] metrics_host in the configuration): {e}; choose an \
             address of this machine, such as 127.0.0.1",
            c.cluster.metrics_host
        );
    }
    for (what, addr) in addrs {
        if let Err(e) = TcpListener::bind(addr) {
            if let (Some(h), std::io::ErrorKind::AddrNotAvailable) = (host, e.kind()) {
                bail!(
                    "{} (for the {what}) is not an address of this machine: host {h:?}'s address in [[hosts]] \
                     must be one of this machine's (is this machine {h:?}? `ip addr` lists its addresses)",
                    addr.ip()
                );
            }
            if e.kind() == std::io::ErrorKind::AddrInUse && host.is_some() {
                bail!(
                    "address {addr} (for the {what}) is already in use, by another dafne cluster or another program \
                     (`ss -ltnp | grep {}` shows which): stop it, or choose other ports with [cluster] meta_port / \
                     io_base_port / metrics_base_port in the configuration file, changed on every host",
                    addr.port()
                );
            }
            if e.kind() == std::io::ErrorKind::AddrInUse {
                bail!(
                    "address {addr} (for the {what}) is already in use, by another dafne cluster or another program \
                     (`ss -ltnp | grep {}` shows which): stop it, or choose other ports with --meta-port / \
                     --io-base-port / --metrics-base-port or [cluster] meta_port / io_base_port / \
                     metrics_base_port in the configuration",
                    addr.port()
                );
            }
            return Err(e).with_context(|| format!("cannot listen on {addr} (for the {what})"));
        }
    }
    Ok(())
}

pub fn up(a: UpArgs) -> Result<()> {
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    if dir.exists() && !dir.is_dir() {
        bail!(
            "{} is not a directory: --dir (or $DAFNE_HOME) names the cluster's directory, created if missing; \
             pass a directory's path",
            dir.display()
        );
    }
    std::fs::create_dir_all(logs_dir(&dir))
        .with_context(|| format!("creating {} (pass --dir a directory you may create and write)", dir.display()))?;
    let dir = dir.canonicalize().with_context(|| format!("resolving {}", dir.display()))?;
    if crate::cluster::supervisor_running(&dir) {
        let Ok(info) = ClusterInfo::load(&dir) else {
            bail!(
                "a dafne supervisor is starting or stopping in {}: wait for it, then `dafne status{}`",
                dir.display(),
                dir_flag(&dir)
            );
        };
        // A script that asked for another configuration must not be told
        // success: what was given is compared with what the cluster runs.
        if a.config.is_some() || flags_given(&a) || a.host.is_some() || a.client {
            let differences = differs_from_running(&a, &dir)?;
            if !differences.is_empty() {
                bail!(
                    "dafne is already running in {} (supervisor pid {}) with another configuration than the one \
                     given: {}. Nothing was changed; `dafne down{}` first, then `dafne up` with it",
                    dir.display(),
                    info.supervisor_pid,
                    differences.join("; "),
                    dir_flag(&dir)
                );
            }
        }
        println!(
            "dafne is already running in {} (supervisor pid {}); `dafne status{}` shows it, `dafne down{}` stops it",
            dir.display(),
            info.supervisor_pid,
            dir_flag(&dir),
            dir_flag(&dir)
        );
        if a.foreground {
            // A service manager must not take this for a supervisor that
            // ran and stopped cleanly.
            bail!("--foreground: a supervisor already runs this cluster (pid {})", info.supervisor_pid);
        }
        return Ok(());
    }
    // Held while this command prepares the directory, so that a second
    // `dafne up` at the same moment stops here, and handed to the
    // supervisor as its stdin: a flock belongs to the open file, which the
    // child then shares, so the lock is never free in between.
    let prep = crate::cluster::try_lock(&dir)?
        .with_context(|| format!("another `dafne up` or a supervisor is starting in {}: wait for it", dir.display()))?;
    let (c, save) = effective_config(&a, &dir)?;
    if a.client {
        return up_client(&dir, &c, save, a.net_devices.as_deref());
    }
    // Without --host, the host this directory's last `up --host` ran.
    let recorded = a.host.is_none().then(|| recorded_host(&dir)).flatten().filter(|_| c.multi_host());
    let host = this_host(&c, a.host.as_deref().or(recorded.as_deref()))?;
    if let Some(h) = &host {
        // Is this machine `h` at all? Asked first: the other checks'
        // advice is for the right machine only.
        let address = c.host(h)?.address;
        if let Err(e) = TcpListener::bind(SocketAddr::new(address, 0)) {
            if e.kind() == std::io::ErrorKind::AddrNotAvailable {
                bail!(
                    "{address} is not an address of this machine: host {h:?}'s address in [[hosts]] must be one of \
                     this machine's (is this machine {h:?}? `ip addr` lists its addresses)"
                );
            }
        }
        // Io servers of a host without the metadata server need the
        // secret it created, before they start.
        let secret = dir.join("meta").join("cluster.secret");
        if c.meta_host() != h && !secret.exists() {
            bail!(
                "host {h:?} runs io servers without the metadata server, so it needs the cluster secret first: copy \
                 meta/cluster.secret from the cluster directory of host {:?} (its --dir there; created by its first \
                 `dafne up --host {}`) to {} on this machine, mode 0600 (e.g. `install -D -m 600 SECRET {}`)",
                c.meta_host(),
                c.meta_host(),
                secret.display(),
                secret.display()
            );
        }
        // Io server ids are the file's: data of a server this host no
        // longer runs means the file changed under existing data.
        let local = c.local_io(Some(h));
        if let Some(i) = (0..256u32).find(|i| !local.contains(i) && dir.join(format!("io-{i}")).is_dir()) {
            bail!(
                "{} holds the data of io server {i}, which the configuration puts on host {:?}, not {h:?}: the \
                 [[hosts]] list changed under existing data (io server ids follow the file's order); restore the \
                 list, or move the data to that host",
                dir.display(),
                c.io_host(i)
            );
        }
    }
    // Layouts name io servers by number: fewer servers than the data
    // directory has would leave files striped over the others unreadable.
    let existing = (0..256u32).filter(|i| dir.join(format!("io-{i}")).is_dir()).max();
    if let Some(top) = existing.filter(|&top| top >= c.cluster.io_servers) {
        bail!(
            "{} holds the data of io servers 0..={top}, but the configuration asks for {}: files striped over \
             the others would be unreadable. Use --io-servers {} (or more), or a new --dir",
            dir.display(),
            c.cluster.io_servers,
            top + 1
        );
    }
    let orphans: Vec<String> = load_states(&dir)
        .into_iter()
        .filter(|s| s.pid != 0 && s.start != 0 && same_process_alive(s.pid, s.start))
        .map(|s| format!("{} (pid {})", s.name, s.pid))
        .collect();
    if !orphans.is_empty() {
        bail!(
            "servers left running by a supervisor that is gone hold this cluster: {}. `dafne down{}` stops them",
            orphans.join(", "),
            dir_flag(&dir)
        );
    }
    check_ports(&c, host.as_deref())?;
    if let Some(text) = save {
        let path = dir.join("config.toml");
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    match &host {
        Some(h) => std::fs::write(host_path(&dir), format!("{h}\n"))
            .with_context(|| format!("writing {}", host_path(&dir).display()))?,
        None => {
            let _ = std::fs::remove_file(host_path(&dir));
        }
    }
    let _ = std::fs::remove_file(ClusterInfo::path(&dir));
    if a.foreground {
        crate::cluster::set_lock_owner(&prep, std::process::id())?;
        // What it prints goes to the service manager's journal and to
        // DIR/logs/supervisor.log, which `dafne down` follows (progress
        // and errors of the stop).
        let tee = Tee::start(&logs_dir(&dir).join("supervisor.log"))?;
        let r = supervise_locked(&dir, true);
        tee.finish();
        return r;
    }
    let log_path = logs_dir(&dir).join("supervisor.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("locating the dafne executable")?;
    let mut sup = Command::new(exe)
        .args(["supervise", "--dir"])
        .arg(&dir)
        .stdin(Stdio::from(prep.try_clone().context("handing the lock to the supervisor")?))
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the supervisor")?;
    crate::cluster::set_lock_owner(&prep, sup.id())?;
    drop(prep);
    match &host {
        Some(h) => eprintln!(
            "starting host {h:?} of dafne in {} ({}{} io servers)",
            dir.display(),
            if c.meta_host() == h { "the metadata server, " } else { "" },
            c.local_io(Some(h)).len()
        ),
        None => {
            eprintln!("starting dafne in {} (1 metadata server, {} io servers)", dir.display(), c.cluster.io_servers)
        }
    }
    // Follow the supervisor's log until cluster.json appears.
    let started = Instant::now();
    let mut follow = LogFollower::new(log_path.clone());
    loop {
        for line in follow.new_lines() {
            if let Some(p) = line.strip_prefix("progress: ") {
                eprintln!("[{:>5.1}s] {p}", started.elapsed().as_secs_f64());
            } else if line.starts_with("error: ") {
                eprintln!("{line}");
            }
        }
        if let Ok(info) = ClusterInfo::load(&dir) {
            eprintln!("[{:>5.1}s] up", started.elapsed().as_secs_f64());
            print_up(&info);
            return Ok(());
        }
        if let Some(status) = sup.try_wait()? {
            bail!(
                "dafne did not start (supervisor {status}). Its log, {}:\n{}",
                log_path.display(),
                tail(&log_path, 30)
            );
        }
        if started.elapsed() > UP_TIMEOUT {
            let _ = rustix::process::kill_process(pid_of(&sup), rustix::process::Signal::TERM);
            bail!(
                "dafne did not come up within {}s; stopped it. The supervisor's log, {}:\n{}",
                UP_TIMEOUT.as_secs(),
                log_path.display(),
                tail(&log_path, 30)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `dafne up --client`: the cluster file of a machine that runs no server.
fn up_client(dir: &Path, c: &Config, save: Option<String>, net_devices: Option<&str>) -> Result<()> {
    if !c.multi_host() {
        bail!(
            "--client: this configuration lists no [[hosts]]; a one-host cluster's clients use the cluster.json \
             its `dafne up` wrote"
        );
    }
    let mut ucx = c.ucx.clone();
    if let Some(d) = net_devices {
        let valid = |x: &str| !x.is_empty() && x.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.:-".contains(ch));
        if d.len() > 256 || !d.split(',').all(valid) {
            bail!(
                "--net-devices {d:?}: give this machine's network devices as UCX names them, comma-separated (e.g. \
                 ens9, or mlx5_0:1); `ucx_info -d` lists them"
            );
        }
        ucx.insert("NET_DEVICES".into(), d.to_string());
    }
    if let Some(text) = save {
        let path = dir.join("config.toml");
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let _ = std::fs::remove_file(host_path(dir));
    let info = ClusterInfo {
        dir: dir.to_path_buf(),
        meta: c.meta_addr(),
        io: (0..c.cluster.io_servers).map(|i| c.io_addr(i)).collect(),
        secret: dir.join("meta").join("cluster.secret"),
        ucx: ucx.into_iter().collect(),
        supervisor_pid: 0,
        attr_timeout_ms: c.mount.attr_timeout_ms,
        entry_timeout_ms: c.mount.entry_timeout_ms,
        metrics: Vec::new(),
        host: None,
        client: true,
    };
    info.save()?;
    let f = dir_flag(dir);
    println!("wrote {} for the clients of this machine (no server runs here)", ClusterInfo::path(dir).display());
    println!("  metadata server  {}", info.meta);
    for (i, a) in info.io.iter().enumerate() {
        println!("  io server {i:<6} {a}");
    }
    println!(
        "Clients here log in with a credential: `dafne credential issue` where the secret is, then e.g. `dafne cp \
         --credential FILE{f} ...` or `dafne status --credential FILE{f}`"
    );
    Ok(())
}

fn print_up(info: &ClusterInfo) {
    let f = dir_flag(&info.dir);
    match &info.host {
        Some(h) => println!("dafne host {h:?} is up in {} (every server of the cluster below)", info.dir.display()),
        None => println!("dafne is up in {}", info.dir.display()),
    }
    println!("  metadata server  {}", info.meta);
    for (i, a) in info.io.iter().enumerate() {
        println!("  io server {i:<6} {a}");
    }
    if !info.metrics.is_empty() {
        let list: Vec<String> = info.metrics.iter().map(|m| format!("{} {}", m.server, m.addr)).collect();
        println!("  metrics (GET /metrics): {}", list.join(", "));
    }
    println!("Next: `dafne mount <dir>{f}` to mount it, `dafne status{f}`, `dafne down{f}` to stop it.");
}

fn pid_of(c: &Child) -> rustix::process::Pid {
    rustix::process::Pid::from_raw(c.id() as i32).expect("a child's pid is positive")
}

/// The new complete lines of a growing log file.
struct LogFollower {
    path: PathBuf,
    pos: u64,
    partial: String,
}

impl LogFollower {
    fn new(path: PathBuf) -> Self {
        LogFollower { path, pos: 0, partial: String::new() }
    }

    fn new_lines(&mut self) -> Vec<String> {
        let Ok(mut f) = std::fs::File::open(&self.path) else { return Vec::new() };
        if f.seek(SeekFrom::Start(self.pos)).is_err() {
            return Vec::new();
        }
        let mut buf = Vec::new();
        let Ok(n) = f.read_to_end(&mut buf) else { return Vec::new() };
        self.pos += n as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        let mut out = Vec::new();
        while let Some(i) = self.partial.find('\n') {
            out.push(self.partial[..i].to_string());
            self.partial.drain(..=i);
        }
        out
    }
}

pub fn down(a: DirArgs) -> Result<()> {
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    let supervisor = match ClusterInfo::load(&dir) {
        Ok(i) if i.client => {
            // Mounts made here go with the file that found the cluster.
            dafne_cluster::mounts::unmount_all(&dir);
            std::fs::remove_file(ClusterInfo::path(&dir))
                .with_context(|| format!("removing {}", ClusterInfo::path(&dir).display()))?;
            println!("removed {} (a client's: no server ran here)", ClusterInfo::path(&dir).display());
            return Ok(());
        }
        Ok(i) => i.supervisor_pid,
        // A supervisor that is starting (or whose cluster.json is damaged):
        // its pid is in its lock file.
        Err(_) if crate::cluster::supervisor_running(&dir) => crate::cluster::lock_owner(&dir)
            .with_context(|| format!("a dafne supervisor runs in {} but its pid is unknown", dir.display()))?,
        Err(e) => {
            // No supervisor: stop servers it left behind (it was killed),
            // then clean up its stale files.
            let orphans: Vec<ServerState> = load_states(&dir)
                .into_iter()
                .filter(|s| s.pid != 0 && s.start != 0 && same_process_alive(s.pid, s.start))
                .collect();
            if !crate::cluster::supervisor_running(&dir) {
                let _ = std::fs::remove_file(ClusterInfo::path(&dir));
            }
            if orphans.is_empty() {
                return Err(e);
            }
            // Mounts first, then io servers (they write back their caches),
            // then meta: the supervisor's order.
            dafne_cluster::mounts::unmount_all(&dir);
            let (meta, io): (Vec<ServerState>, Vec<ServerState>) = orphans.into_iter().partition(|o| o.name == "meta");
            for group in [io, meta] {
                for o in &group {
                    eprintln!("stopping {} (pid {}), left running by a supervisor that is gone", o.name, o.pid);
                    if let Some(pid) = rustix::process::Pid::from_raw(o.pid as i32) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                    }
                }
                let deadline = Instant::now() + IO_STOP_GRACE;
                while group.iter().any(|o| same_process_alive(o.pid, o.start)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                if let Some(o) = group.iter().find(|o| same_process_alive(o.pid, o.start)) {
                    bail!("{} (pid {}) did not stop within {}s", o.name, o.pid, IO_STOP_GRACE.as_secs());
                }
            }
            // Not their parent, this command cannot see how they exited:
            // their logs can.
            println!(
                "dafne is down (data kept in {}; how the servers stopped is in {})",
                dir.display(),
                logs_dir(&dir).display()
            );
            return Ok(());
        }
    };
    let pid = rustix::process::Pid::from_raw(supervisor as i32).context("invalid supervisor pid")?;
    let log = logs_dir(&dir).join("supervisor.log");
    let mut follow = LogFollower::new(log.clone());
    follow.pos = std::fs::metadata(&follow.path).map(|m| m.len()).unwrap_or(0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)
        .with_context(|| format!("signalling the supervisor (pid {supervisor})"))?;
    eprintln!("stopping dafne in {} (supervisor pid {supervisor})", dir.display());
    let started = Instant::now();
    let mut errors = Vec::new();
    loop {
        for line in follow.new_lines() {
            if let Some(p) = line.strip_prefix("progress: ") {
                eprintln!("[{:>5.1}s] {p}", started.elapsed().as_secs_f64());
            } else if line.starts_with("error: ") {
                eprintln!("{line}");
                errors.push(line);
            }
        }
        if !crate::cluster::supervisor_running(&dir) {
            break;
        }
        if started.elapsed() > DOWN_TIMEOUT {
            bail!("the supervisor (pid {supervisor}) did not stop within {}s", DOWN_TIMEOUT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !errors.is_empty() {
        bail!(
            "dafne stopped, but not cleanly ({} error(s) above; the servers' logs are in {})",
            errors.len(),
            logs_dir(&dir).display()
        );
    }
    println!("dafne is down (data kept in {})", dir.display());
    Ok(())
}

// ---------------------------------------------------------------------------
// The supervisor: this host's plan from the configuration, run by
// `dafne_cluster` (restarts, servers.json, the reclaimer, the stop).

/// Where each server's metrics are now (a server without a port is left out).
fn metrics_endpoints<'a>(states: impl IntoIterator<Item = &'a ServerState>) -> Vec<crate::cluster::MetricsEndpoint> {
    states
        .into_iter()
        .filter_map(|s| Some(crate::cluster::MetricsEndpoint { server: s.name.clone(), addr: s.metrics? }))
        .collect()
}

/// `dafne supervise --dir DIR` (hidden): run by `up`.
pub fn supervise(a: DirArgs) -> Result<()> {
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    // The lock, held until this process exits: the cluster is running
    // while it is. `up` hands it over as stdin; started by hand, take it.
    let _lock = if crate::cluster::holds_lock_as_stdin(&dir) {
        None
    } else {
        let l = crate::cluster::try_lock(&dir)?
            .with_context(|| format!("another dafne supervisor runs in {}", dir.display()))?;
        crate::cluster::set_lock_owner(&l, std::process::id())?;
        Some(l)
    };
    supervise_locked(&dir, false)
}

/// The `dafne serve …` arguments of this host's servers (`host`: `DIR/host`,
/// written by `up --host`; every server without it), meta first when this
/// host runs it, each with the label of its `starting` progress line.
fn plan_servers(dir: &Path, c: &Config, host: Option<&str>) -> Vec<ServerSpec> {
    let runs_meta = host.is_none_or(|h| c.meta_host() == h);
    let local_io = c.local_io(host);
    let ucx = c.ucx_args_of(host);
    let meta_dir = dir.join("meta");
    let secret = meta_dir.join("cluster.secret");
    let fresh = !secret.exists();
    let mut servers = Vec::new();
    if runs_meta {
        let mut args: Vec<String> = vec!["serve".into(), "meta".into(), "--data-dir".into()];
        args.push(meta_dir.display().to_string());
        args.extend(["--listen".into(), c.meta_addr().to_string()]);
        args.extend(["--io-servers".into(), c.cluster.io_servers.to_string()]);
        args.extend(["--stripe-unit".into(), c.meta.stripe_unit.to_string()]);
        args.extend(["--stripe-count".into(), c.meta.stripe_count.to_string()]);
        args.extend(["--open-grace-s".into(), c.meta.open_grace_s.to_string()]);
        args.extend(["--replicas".into(), c.meta.replicas.to_string()]);
        let hosts = c.layout_policy().hosts;
        if !hosts.is_empty() {
            args.extend(["--io-hosts".into(), hosts.join(",")]);
        }
        args.extend(["--metrics-listen".into(), c.metrics_addr(None).to_string()]);
        args.extend(["--server-name".into(), "meta".into()]);
        args.extend(ucx.iter().cloned());
        let label =
            if fresh { "metadata server (first start: generating the cluster secret)" } else { "metadata server" };
        servers.push(ServerSpec { name: "meta".into(), addr: c.meta_addr(), args, label: label.into() });
    }
    // Computed once, so every io server gets the same cache.
    let cache_mib = c.io_cache_mib_for(local_io.len() as u32);
    if !local_io.is_empty() {
        dafne_cluster::progress(format_args!(
            "io caches: {cache_mib} MiB each{}",
            if c.io.cache_mib.is_some() { "" } else { " (a share of available memory; set [io] cache_mib to choose)" }
        ));
    }
    let n = local_io.len();
    for (k, &i) in local_io.iter().enumerate() {
        let mut args: Vec<String> = vec!["serve".into(), "io".into(), "--data-dir".into()];
        args.push(dir.join(format!("io-{i}")).display().to_string());
        args.extend(["--secret".into(), secret.display().to_string()]);
        args.extend(["--listen".into(), c.io_addr(i).to_string()]);
        args.extend(["--cache-mib".into(), cache_mib.to_string()]);
        args.extend(["--raw-percent".into(), c.io.raw_percent.to_string()]);
        if let Some(p) = c.io.max_pinned_mib {
            args.extend(["--max-pinned-mib".into(), p.to_string()]);
        }
        args.extend(["--mode".into(), c.io.mode.clone()]);
        args.extend(["--metrics-listen".into(), c.metrics_addr(Some(i)).to_string()]);
        args.extend(["--server-name".into(), format!("io-{i}")]);
        // Joining through meta (its membership table, `dafne status`): on
        // whichever host meta runs, with this host's name from the file.
        args.extend(["--meta".into(), c.meta_addr().to_string(), "--server-id".into(), i.to_string()]);
        if !c.io_host(i).is_empty() {
            args.extend(["--host-name".into(), c.io_host(i).to_string()]);
        }
        // `[cluster] host = "0.0.0.0"` (one host only; [[hosts]] refuse
        // it): meta's table shows the loopback address that reaches it.
        if c.io_addr(i).ip().is_unspecified() {
            let lo = if c.io_addr(i).is_ipv4() { "127.0.0.1" } else { "::1" };
            args.extend(["--advertise".into(), lo.into()]);
        }
        args.extend(ucx.iter().cloned());
        // Numbered as they start: meta, when here, was the first.
        let position = k + usize::from(runs_meta);
        let label = match host {
            None => format!("io server {position}/{n}"),
            Some(_) => format!("io-{i} ({}/{n} here)", k + 1),
        };
        servers.push(ServerSpec { name: format!("io-{i}"), addr: c.io_addr(i), args, label });
    }
    servers
}

/// The supervisor's work, its lock held by the caller (`supervise`, or
/// `up --foreground`, whose servers stop with it: `stop_with_supervisor`):
/// the servers of this host (`DIR/host`, written by `up --host`; every
/// server without it), until SIGTERM.
fn supervise_locked(dir: &Path, stop_with_supervisor: bool) -> Result<()> {
    let dir = dir.to_path_buf();
    let stop = dafne_cluster::stop_on_signals()?;
    let c = Config::load(&dir.join("config.toml"))?;
    let host = recorded_host(&dir);
    if let Some(h) = &host {
        c.host(h)
            .with_context(|| format!("{} names a host the configuration does not list", host_path(&dir).display()))?;
    } else if c.multi_host() {
        this_host(&c, None)?;
    }
    let runs_meta = host.as_deref().is_none_or(|h| c.meta_host() == h);
    let secret = dir.join("meta").join("cluster.secret");
    let plan = Plan {
        dir: dir.clone(),
        servers: plan_servers(&dir, &c, host.as_deref()),
        restart: RestartPolicy {
            restart: c.cluster.restart,
            max_restarts: c.cluster.max_restarts,
            window_s: c.cluster.restart_window_s,
        },
        stop_with_supervisor,
    };
    let mut sup = Supervisor::new(plan, stop)?;
    sup.start_all()?;
    // Every server's address: this host's as they listen, the others' from
    // the file (fixed ports).
    let addr_of = |name: &str, planned: SocketAddr| sup.states().find(|s| s.name == name).map_or(planned, |s| s.addr);
    let mut info = ClusterInfo {
        dir: dir.clone(),
        meta: addr_of("meta", c.meta_addr()),
        io: (0..c.cluster.io_servers).map(|i| addr_of(&format!("io-{i}"), c.io_addr(i))).collect(),
        secret: secret.clone(),
        ucx: c.ucx_of(host.as_deref()).into_iter().collect(),
        supervisor_pid: std::process::id(),
        attr_timeout_ms: c.mount.attr_timeout_ms,
        entry_timeout_ms: c.mount.entry_timeout_ms,
        metrics: metrics_endpoints(sup.states()),
        host: host.clone(),
        client: false,
    };
    if !sup.stopping() {
        info.save()?;
        dafne_cluster::progress("all servers listen");
    }
    // Where the metadata server runs: the reclaimer and the revocation
    // relay (they reach every io server, on whichever host).
    if !sup.stopping() && runs_meta {
        sup.start_reclaimer(&ReclaimTarget {
            meta: info.meta,
            io: info.io.clone(),
            secret: info.secret.clone(),
            ucx: info.ucx.clone(),
            after_s: c.cluster.reclaim_after_s,
        })?;
    }
    sup.supervise(|states| {
        info.metrics = metrics_endpoints(states.iter().copied());
        if let Err(e) = info.save() {
            println!("error: recording the new metrics ports: {e:#}");
        }
    });
    sup.stop_all();
    let _ = std::fs::remove_file(ClusterInfo::path(&dir));
    dafne_cluster::progress("stopped");
    Ok(())
}

// ---------------------------------------------------------------------------
// status

#[derive(Debug, Serialize)]
struct StatusReport {
    dir: PathBuf,
    supervisor_pid: u32,
    meta: MetaStatus,
    io: Vec<IoStatus>,
    /// The io servers as meta sees them from their heartbeats (`Members`);
    /// `None` when meta did not answer.
    members: Option<Vec<MemberStatus>>,
    /// Why `members` is `None` when meta answered `Members` with an error
    /// (its errno) or something else: an old meta, a refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    members_error: Option<String>,
    /// Meta's chain table (`dafne_meta::chains`), each chain's health from
    /// its replicas' states; `None` when meta did not answer `Members`.
    chains: Option<Vec<ChainStatus>>,
    mounts: Vec<PathBuf>,
}

/// One chain of meta's chain table.
#[derive(Debug, Serialize)]
struct ChainStatus {
    chain: u32,
    version: u64,
    /// `healthy` (every replica serving), `degraded` (some offline or
    /// syncing, one serving) or `unavailable` (none serving).
    health: &'static str,
    /// Head first.
    replicas: Vec<ReplicaStatus>,
}

#[derive(Debug, Serialize)]
struct ReplicaStatus {
    server: String,
    /// In the chain: `serving`, `syncing` or `offline`.
    state: &'static str,
    /// As meta's membership table sees the io server: `up`, `down` or
    /// `unknown`.
    member: &'static str,
}

impl ChainStatus {
    fn of(c: &dafne_proto::Chain, members: &[dafne_proto::Member]) -> ChainStatus {
        ChainStatus {
            chain: c.id,
            version: c.version,
            health: c.health().name(),
            replicas: c
                .replicas
                .iter()
                .map(|r| ReplicaStatus {
                    server: format!("io-{}", r.server),
                    state: r.state.name(),
                    member: members.iter().find(|m| m.server == r.server).map_or("unknown", |m| m.state.name()),
                })
                .collect(),
        }
    }
}

/// One io server in meta's membership table (`dafne_meta::members`).
#[derive(Debug, Serialize)]
struct MemberStatus {
    server: String,
    /// `up`, `down` or `unknown` (never heard since meta started).
    state: &'static str,
    addr: Option<SocketAddr>,
    host: String,
    /// Since its last heartbeat.
    since_ms: Option<u64>,
    restarts: u32,
    capacity_bytes: u64,
    used_bytes: u64,
}

impl MemberStatus {
    fn of(m: dafne_proto::Member) -> MemberStatus {
        let heard = m.state != dafne_proto::MemberState::Unknown;
        MemberStatus {
            server: format!("io-{}", m.server),
            state: m.state.name(),
            addr: heard.then_some(m.addr),
            host: m.host,
            since_ms: heard.then_some(m.since_ms),
            restarts: m.restarts,
            capacity_bytes: m.capacity_bytes,
            used_bytes: m.used_bytes,
        }
    }
}

#[derive(Debug, Serialize)]
struct MetaStatus {
    server: Option<ServerState>,
    addr: SocketAddr,
    /// Its metrics port (`GET /metrics`).
    metrics: Option<SocketAddr>,
    reachable: Option<String>,
    files: u64,
}

#[derive(Debug, Serialize)]
struct IoStatus {
    server: Option<ServerState>,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
    error: Option<String>,
    info: Option<std::collections::BTreeMap<&'static str, u64>>,
    /// The server's own view of its lease from meta (from its
    /// `ServerInfo`): `held` (it serves data), `lapsed` (it refuses data
    /// requests until meta answers its heartbeat again), `pending` (it
    /// joined meta and refuses data requests until meta answers its first
    /// heartbeat) or `none` (it runs without meta); `None` when it did not
    /// answer.
    lease: Option<&'static str>,
    /// The version of each of its chains in meta's last answer to its
    /// heartbeat (from its `ServerInfo`).
    chains: Vec<ChainVersionStatus>,
}

#[derive(Debug, Serialize)]
struct ChainVersionStatus {
    chain: u32,
    version: u64,
}

/// [`IoStatus::lease`] of a `ServerInfo`'s `lease` field.
fn lease_name(lease: u64) -> &'static str {
    match lease {
        dafne_proto::LEASE_NONE => "none",
        dafne_proto::LEASE_HELD => "held",
        dafne_proto::LEASE_PENDING => "pending",
        _ => "lapsed",
    }
}

/// Whether an io server serves data, as its own answer says: it answered,
/// and holds a lease from meta or needs none (`dafne status` exits
/// non-zero otherwise).
fn io_serves(s: &IoStatus) -> bool {
    s.error.is_none() && matches!(s.lease, Some("held" | "none"))
}

/// How long `status --metrics` waits for each server's page.
const METRICS_TIMEOUT: Duration = Duration::from_secs(5);

/// `dafne status --metrics`: every server's page, fetched from the
/// addresses in `cluster.json`, printed as one page (each family once,
/// with every server's samples). A server that does not answer is named on
/// stderr and makes the exit status non-zero; the others are printed.
fn print_metrics(info: &ClusterInfo) -> Result<()> {
    if info.client {
        bail!(
            "{} is a client's cluster file (`dafne up --client`): the metrics ports are on the server hosts, \
             loopback by default; run `dafne status --metrics` there",
            ClusterInfo::path(&info.dir).display()
        );
    }
    if info.metrics.is_empty() {
        bail!(
            "{} records no metrics ports (a cluster started by an older dafne): `dafne down` and `dafne up` again",
            ClusterInfo::path(&info.dir).display()
        );
    }
    let mut pages = Vec::new();
    let mut failed = Vec::new();
    for m in &info.metrics {
        match dafne_metrics::fetch(m.addr, METRICS_TIMEOUT) {
            // Each page checked alone, so that one bad page costs only itself.
            Ok(page) => match dafne_metrics::parse(&page) {
                Ok(_) => pages.push((m, page)),
                Err(e) => {
                    eprintln!("error: the metrics page of {} ({}) is not valid Prometheus text: {e}", m.server, m.addr);
                    failed.push(m.server.clone());
                }
            },
            Err(e) => {
                eprintln!("error: the metrics of {} ({}): {e}", m.server, m.addr);
                failed.push(m.server.clone());
            }
        }
    }
    // Valid pages can still disagree (a family a counter on one, a gauge
    // on another): the page merging finds at fault is left out, the rest
    // printed.
    let merged = loop {
        let texts: Vec<&str> = pages.iter().map(|(_, p)| p.as_str()).collect();
        match dafne_metrics::parse::merge(&texts) {
            Ok(merged) => break merged,
            Err((i, e)) if i < pages.len() => {
                let (m, _) = pages.remove(i);
                eprintln!("error: the metrics page of {} ({}) does not fit the others': {e}", m.server, m.addr);
                failed.push(m.server.clone());
            }
            Err((_, e)) => bail!("the gathered metrics are not valid Prometheus text: {e}"),
        }
    };
    print!("{merged}");
    if !failed.is_empty() {
        bail!(
            "{} of {} servers did not serve their metrics: {} (`dafne status --dir {}` shows whether they run, and \
             where their metrics are)",
            failed.len(),
            info.metrics.len(),
            failed.join(", "),
            info.dir.display()
        );
    }
    Ok(())
}

pub fn status(a: StatusArgs) -> Result<()> {
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    let info = ClusterInfo::load(&dir)?;
    if a.metrics {
        return print_metrics(&info);
    }
    let states = load_states(&dir);
    let metrics_of = |name: &str| info.metrics.iter().find(|m| m.server == name).map(|m| m.addr);
    let state_of = |name: &str| states.iter().find(|s| s.name == name).cloned();
    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "status".into(),
        ucx_config: info.ucx.clone(),
        // As long as a connect may take: a meta that hangs after the
        // session opened costs 10 s a call, not 30 (review defect 6).
        call_timeout: std::time::Duration::from_secs(10),
        ..Default::default()
    })?;
    let login = crate::cluster::ClientLogin::load(&info, a.credential.as_deref())?;
    // Servers that refused this client's secret or credential (they run;
    // the file is wrong).
    let mut refused = 0usize;
    let mut explain = |e: dafne_client::ConnectError| {
        refused += usize::from(crate::cluster::is_refusal(&e));
        format!("{:#}", crate::cluster::explain_connect(&info, &login, e))
    };
    let mut members_error = None;
    let mut chains = None;
    let (reachable, files, members) =
        match dafne_client::MetaSession::connect(&rt, info.meta, &login.key, "status", 0, 0) {
            Ok(s) => {
                let members = match s.request(dafne_proto::Request::Members) {
                    Ok(dafne_proto::Response::Members { members, chains: table }) => {
                        chains = Some(table.iter().map(|c| ChainStatus::of(c, &members)).collect());
                        Some(members.into_iter().map(MemberStatus::of).collect())
                    }
                    Ok(_) => {
                        members_error = Some("meta answered Members with another reply".to_string());
                        None
                    }
                    Err(e) => {
                        members_error = Some(format!("meta answered Members with {e}"));
                        None
                    }
                };
                match s.statfs() {
                    Ok(f) => (None, f.files, members),
                    Err(e) => (Some(format!("statfs: {e}")), 0, members),
                }
            }
            Err(e) => (Some(explain(e)), 0, None),
        };
    // The data client's connection is logged in: ServerInfo needs no
    // capability there.
    let cap = dafne_client::data::LOGGED_IN;
    let mut io = Vec::new();
    for (i, addr) in info.io.iter().enumerate() {
        let r = dafne_client::data::DataClient::connect(&rt, &[*addr], &login.key)
            .map_err(&mut explain)
            .and_then(|d| block_on(d.server_info(0, cap)).map_err(|e| e.to_string()));
        io.push(IoStatus {
            server: state_of(&format!("io-{i}")),
            addr: *addr,
            metrics: metrics_of(&format!("io-{i}")),
            error: r.as_ref().err().cloned(),
            lease: r.as_ref().ok().map(|s| lease_name(s.lease)),
            chains: r.as_ref().map_or_else(
                |_| Vec::new(),
                |s| s.chains.iter().map(|c| ChainVersionStatus { chain: c.chain, version: c.version }).collect(),
            ),
            info: r.ok().map(|s| s.fields().into_iter().collect()),
        });
    }
    let report = StatusReport {
        dir: dir.clone(),
        supervisor_pid: info.supervisor_pid,
        meta: MetaStatus { server: state_of("meta"), addr: info.meta, metrics: metrics_of("meta"), reachable, files },
        io,
        members,
        members_error,
        chains,
        mounts: ClusterInfo::live_mounts(&dir).into_iter().map(|(_, m)| m).collect(),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_status(&report);
    }
    // Scripts and monitors read the exit status: non-zero when a server
    // does not serve (the report above says which and why): one that does
    // not answer, or an io server that answers but refuses data requests
    // because its lease from meta lapsed or was not granted yet.
    let failing = usize::from(report.meta.reachable.is_some()) + report.io.iter().filter(|s| !io_serves(s)).count();
    if failing > 0 && refused == failing {
        let what = if login.key.credential().is_some() { "credential" } else { "secret file" };
        bail!(
            "this cluster does not accept the {what} {}: {refused} of {} servers refused it (they run; see above)",
            login.file.display(),
            1 + report.io.len()
        );
    }
    if failing > 0 {
        bail!("{failing} of {} servers are not serving (see above)", 1 + report.io.len());
    }
    Ok(())
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

fn mib(b: u64) -> String {
    if b >= 10 << 30 {
        format!("{} GiB", b >> 30)
    } else {
        format!("{} MiB", b >> 20)
    }
}

fn print_status(r: &StatusReport) {
    if r.supervisor_pid == 0 {
        println!("dafne from {} (a client's cluster file: no server runs here)", r.dir.display());
    } else {
        println!("dafne in {} (supervisor pid {})", r.dir.display(), r.supervisor_pid);
    }
    let st = |s: &Option<ServerState>| {
        s.as_ref()
            .map(|s| {
                let mut t = format!("{} pid {}", s.state, s.pid);
                if s.restarts > 0 {
                    // The window's count is what max_restarts limits.
                    t.push_str(&format!(
                        ", {} restarts ({} in the restart window), last exit: {}",
                        s.restarts,
                        s.restarts_in_window,
                        s.last_exit.as_deref().unwrap_or("?")
                    ));
                }
                t
            })
            .unwrap_or_else(|| "?".into())
    };
    let metrics = |m: &Option<SocketAddr>| m.map_or_else(|| "-".to_string(), |a| format!("http://{a}/metrics"));
    println!();
    println!("| server | address | process | state | metrics |");
    println!("|---|---|---|---|---|");
    let meta_state = match &r.meta.reachable {
        None => format!("serving, {} inodes", r.meta.files),
        Some(e) => format!("not serving: {e}"),
    };
    println!("| meta | {} | {} | {} | {} |", r.meta.addr, st(&r.meta.server), meta_state, metrics(&r.meta.metrics));
    for (i, s) in r.io.iter().enumerate() {
        let state = match (&s.error, s.lease) {
            (Some(e), _) => format!("not serving: {e}"),
            (None, Some("held")) => "serving (under a lease from meta)".to_string(),
            (None, Some("lapsed")) => {
                "not serving: its lease from meta lapsed (it refuses data requests until meta answers its \
                 heartbeat)"
                    .to_string()
            }
            (None, Some("pending")) => "not serving: waiting for its first lease from meta (it refuses data \
                                        requests until meta answers its heartbeat)"
                .to_string(),
            (None, _) => "serving".to_string(),
        };
        println!("| io-{i} | {} | {} | {} | {} |", s.addr, st(&s.server), state, metrics(&s.metrics));
    }
    println!();
    println!("| io server | mode | capacity | available | cache | dirty | hits | misses | evictions | bytes copied | registrations (start-up) | requests | credits in use | connections accepted | units retired |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, s) in r.io.iter().enumerate() {
        let Some(f) = &s.info else { continue };
        let g = |k: &str| f.get(k).copied().unwrap_or(0);
        let mode = ["normal", "mmap", "unifier"].get(g("mode") as usize).copied().unwrap_or("?");
        println!(
            "| io-{i} | {mode} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} |",
            mib(g("capacity_bytes")),
            mib(g("available_bytes")),
            mib(g("cache_bytes")),
            mib(g("dirty_bytes")),
            g("hits"),
            g("misses"),
            g("evictions"),
            g("bytes_copied"),
            g("registrations"),
            g("startup_registrations"),
            g("requests_served"),
            // This status request is one of them.
            g("requests_in_flight").saturating_sub(1),
            g("connections_accepted"),
            // Unifier mode, since start; a retired unit's memory is carved
            // again once UCX lets go of it.
            g("retired_units"),
        );
    }
    println!();
    match &r.members {
        None => println!(
            "io servers as meta sees them: unknown ({})",
            r.members_error.as_deref().unwrap_or("meta did not answer")
        ),
        Some(members) => {
            println!("| io server | as meta sees it | host | address | last heartbeat | restarts |");
            println!("|---|---|---|---|---|---|");
            for m in members {
                let addr = m.addr.map_or_else(|| "-".to_string(), |a| a.to_string());
                let since =
                    m.since_ms.map_or_else(|| "never".to_string(), |ms| format!("{:.1} s ago", ms as f64 / 1e3));
                let host = if m.host.is_empty() { "-" } else { m.host.as_str() };
                println!("| {} | {} | {host} | {addr} | {since} | {} |", m.server, m.state, m.restarts);
            }
        }
    }
    if let Some(chains) = &r.chains {
        println!();
        println!("| chain | version | health | io servers (head first: state in the chain, as meta sees it) | version as the head's io server last heard it |");
        println!("|---|---|---|---|---|");
        for c in chains {
            let servers: Vec<String> =
                c.replicas.iter().map(|x| format!("{} ({}, {})", x.server, x.state, x.member)).collect();
            // What the chain's first replica's io server reported in its
            // ServerInfo (meta's last answer to its heartbeat).
            let heard = c
                .replicas
                .first()
                .and_then(|x| x.server.strip_prefix("io-")?.parse::<usize>().ok())
                .and_then(|i| r.io.get(i))
                .and_then(|s| s.chains.iter().find(|v| v.chain == c.chain))
                .map_or_else(|| "-".to_string(), |v| v.version.to_string());
            println!("| {} | {} | {} | {} | {heard} |", c.chain, c.version, c.health, servers.join(", "));
        }
        if chains.iter().any(|c| c.replicas.iter().any(|x| x.state == "syncing")) {
            println!();
            println!(
                "syncing: a replica back after being offline; it gets no writes and serves no reads, and stays \
                 syncing (resync is not built yet: docs/REPLICATION.md). Its chains run on the other replicas."
            );
        }
    }
    println!();
    if r.mounts.is_empty() {
        println!("mounts: none (`dafne mount <dir>{}`)", dir_flag(&r.dir));
    } else {
        for m in &r.mounts {
            println!("mounted on {}", m.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 13 step 2 review: an io server waiting for its first lease
    /// showed `lapsed`; it shows `pending`, and counts as not serving (a
    /// non-zero exit) as a lapsed one does.
    #[test]
    fn an_io_server_waiting_for_its_first_lease_is_pending_and_not_serving() {
        let io = |lease: u64, error: Option<&str>| IoStatus {
            server: None,
            addr: "127.0.0.1:1".parse().unwrap(),
            metrics: None,
            error: error.map(str::to_string),
            info: None,
            lease: error.is_none().then(|| lease_name(lease)),
            chains: Vec::new(),
        };
        assert_eq!(lease_name(dafne_proto::LEASE_PENDING), "pending");
        assert_eq!(lease_name(dafne_proto::LEASE_LAPSED), "lapsed");
        assert!(!io_serves(&io(dafne_proto::LEASE_PENDING, None)));
        assert!(!io_serves(&io(dafne_proto::LEASE_LAPSED, None)));
        assert!(!io_serves(&io(dafne_proto::LEASE_HELD, Some("refused"))));
        assert!(io_serves(&io(dafne_proto::LEASE_HELD, None)));
        assert!(io_serves(&io(dafne_proto::LEASE_NONE, None)));
    }
}
