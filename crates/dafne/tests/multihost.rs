//! A cluster of several hosts on one machine: each host a network
//! namespace with its own address on a bridge (veth pairs), its servers
//! started there by `dafne up --host NAME` under `ip netns exec`, and a
//! client in a namespace of its own that runs no server (`dafne up
//! --client`, a credential). UCX is restricted to TCP on the namespaces'
//! `eth0`, so every byte between hosts crosses a veth link: the test
//! checks that on the links' byte counters, which shared memory or CMA
//! (what UCX would pick between processes of one machine) never touch.
//!
//! Needs root (network namespaces); without it the test fails and says
//! so, unless `DAFNE_SKIP_NETNS=1` asks to skip it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, text};

/// The `dafne` binary run inside namespace `ns` (`ip netns exec`), with
/// no cluster directory from the environment.
fn dafne_in(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_dafne")])
        .env_remove("DAFNE_HOME")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    c
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("running a command")
}

/// Runs `ip ARGS`, panicking with its output on failure.
fn ip(args: &[&str]) {
    let o = run(Command::new("ip").args(args));
    assert!(o.status.success(), "ip {}: {}", args.join(" "), text(&o));
}

/// One host of the test cluster: its namespace, the root side of its veth
/// pair (on the bridge), its address and its cluster directory.
struct Host {
    name: &'static str,
    ns: String,
    veth: String,
    addr: String,
    dir: PathBuf,
}

/// The namespaces, links and clusters of one test, removed when dropped
/// (a panicking test too): each host's cluster is stopped (`dafne down`),
/// whatever still runs in its namespace is killed by pid (only this
/// test's processes are in it), then the namespaces and the bridge go.
struct Net {
    hosts: Vec<Host>,
    bridge: String,
    _tmp: tempfile::TempDir,
    /// Locked while this run lives ([`run_lock`]).
    _lock: std::fs::File,
    /// The tests of this process take turns (their namespaces, bridge and
    /// lock file are named by the pid); held from before the probe until
    /// everything is removed, so dropped last.
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// Whose turn it is among this process's tests ([`Net::_turn`]).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The lock file of the run of pid `pid`: held (flock) while the run
/// lives, so that another run, even from another pid namespace (where
/// `/proc/PID` says nothing), can tell a live run's namespaces from those
/// of a run that was killed.
fn run_lock(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("dafne-multihost-{pid}.lock"))
}

/// Whether the run of pid `pid` is gone: its lock file is free (or, for a
/// run older than the lock files, no such process exists here).
fn run_gone(pid: u32) -> bool {
    match std::fs::File::open(run_lock(pid)) {
        Ok(f) => f.try_lock().is_ok(),
        Err(_) => !Path::new(&format!("/proc/{pid}")).exists(),
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            if h.dir.join("cluster.json").exists() {
                let _ = run(Command::new("timeout").args(["150", "ip", "netns", "exec", &h.ns]).args([
                    env!("CARGO_BIN_EXE_dafne"),
                    "down",
                    "--dir",
                    h.dir.to_str().unwrap(),
                ]));
            }
        }
        for h in &self.hosts {
            let o = run(Command::new("ip").args(["netns", "pids", &h.ns]));
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = run(Command::new("kill").args(["-9", pid]));
            }
            let _ = run(Command::new("ip").args(["netns", "del", &h.ns]));
            let _ = run(Command::new("ip").args(["link", "del", &h.veth]));
        }
        let _ = run(Command::new("ip").args(["link", "del", &self.bridge]));
        let _ = std::fs::remove_file(run_lock(std::process::id()));
    }
}

impl Net {
    /// Namespaces named after this process (unique while it runs), a
    /// bridge in the root namespace without an address (traffic stays
    /// between the namespaces), and a veth pair per host whose inner end
    /// is `eth0` in the host's namespace. `None`: the test is skipped
    /// (not root, and DAFNE_SKIP_NETNS=1 said so).
    fn create(names: &[&'static str]) -> Option<Net> {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        let probe = format!("dafne-probe-{pid}");
        let o = run(Command::new("ip").args(["netns", "add", &probe]));
        if !o.status.success() {
            if std::env::var("DAFNE_SKIP_NETNS").is_ok_and(|v| v == "1") {
                eprintln!("skipped: cannot create network namespaces ({}); DAFNE_SKIP_NETNS=1", text(&o).trim());
                return None;
            }
            panic!(
                "this test creates network namespaces and needs root (`ip netns add` failed: {}). Run it as root, or \
                 set DAFNE_SKIP_NETNS=1 to skip it",
                text(&o).trim()
            );
        }
        let _ = run(Command::new("ip").args(["netns", "del", &probe]));
        let lock = std::fs::File::create(run_lock(pid)).unwrap();
        lock.lock().unwrap();
        remove_leftovers();
        let tmp = tempfile::Builder::new().prefix("dafne-hosts-test-").tempdir().unwrap();
        // A /24 of 10.0.0.0/8 picked by the pid, so that two runs side by
        // side do not share one (each has its own bridge anyway).
        let subnet = format!("10.{}.{}", 200 + pid % 50, (pid / 50) % 250);
        let mut net = Net { hosts: Vec::new(), bridge: format!("dhb{pid}"), _tmp: tmp, _lock: lock, _turn: turn };
        ip(&["link", "add", &net.bridge, "type", "bridge"]);
        ip(&["link", "set", &net.bridge, "up"]);
        for (k, name) in names.iter().enumerate() {
            let h = Host {
                name,
                ns: format!("dafne-{pid}-{name}"),
                veth: format!("dh{pid}{k}"),
                addr: format!("{subnet}.{}", 10 + k),
                dir: net._tmp.path().join(name),
            };
            let inner = format!("dn{pid}{k}");
            ip(&["netns", "add", &h.ns]);
            net.hosts.push(h);
            let h = net.hosts.last().unwrap();
            ip(&["link", "add", &h.veth, "type", "veth", "peer", "name", &inner]);
            ip(&["link", "set", &inner, "netns", &h.ns]);
            ip(&["-n", &h.ns, "link", "set", &inner, "name", "eth0"]);
            ip(&["-n", &h.ns, "addr", "add", &format!("{}/24", h.addr), "dev", "eth0"]);
            ip(&["-n", &h.ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &h.ns, "link", "set", "lo", "up"]);
            ip(&["link", "set", &h.veth, "master", &net.bridge]);
            ip(&["link", "set", &h.veth, "up"]);
            std::fs::create_dir_all(&h.dir).unwrap();
        }
        Some(net)
    }

    fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self._tmp.path().join(name)
    }
}

/// Removes what a run of this test that was killed (no Drop) left: the
/// namespaces `dafne-PID-*` and bridges `dhbPID` of a PID that no longer
/// runs, with whatever still runs in those namespaces.
fn remove_leftovers() {
    let o = run(Command::new("ip").args(["netns", "list"]));
    for ns in String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = ns.strip_prefix("dafne-").and_then(|r| r.split('-').next()) else { continue };
        if !pid.parse::<u32>().is_ok_and(run_gone) {
            continue;
        }
        let o = run(Command::new("ip").args(["netns", "pids", ns]));
        for p in String::from_utf8_lossy(&o.stdout).split_whitespace() {
            let _ = run(Command::new("kill").args(["-9", p]));
        }
        let _ = run(Command::new("ip").args(["netns", "del", ns]));
        eprintln!("removed namespace {ns}, left by a run that was killed");
    }
    let o = run(Command::new("ip").args(["-o", "link", "show", "type", "bridge"]));
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let Some(name) = l.split(": ").nth(1) else { continue };
        let Some(pid) = name.strip_prefix("dhb").and_then(|p| p.parse::<u32>().ok()) else { continue };
        if run_gone(pid) {
            let _ = run(Command::new("ip").args(["link", "del", name]));
        }
    }
}

/// Bytes a veth link carried so far, both ways (root side's counters).
fn link_bytes(veth: &str) -> u64 {
    ["rx_bytes", "tx_bytes"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(format!("/sys/class/net/{veth}/statistics/{f}"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `dafne up` in `h`'s namespace and directory with `args`.
fn up(h: &Host, config: &Path, args: &[&str]) -> Output {
    run(dafne_in(&h.ns).args(["up", "--dir", p(&h.dir), "--config", p(config)]).args(args))
}

/// `dafne cp --force` from the client namespace, retried until it
/// succeeds (an application retrying after an error) or 120 s pass;
/// returns the errors seen.
fn cp_until_done(client: &Host, cred: &Path, from: &str, to: &str) -> Vec<String> {
    let start = Instant::now();
    let mut errors = Vec::new();
    loop {
        let o = run(dafne_in(&client.ns).args([
            "cp",
            "--force",
            "--dir",
            p(&client.dir),
            "--credential",
            p(cred),
            from,
            to,
        ]));
        if o.status.success() {
            return errors;
        }
        // An error is retried; a crash or an abort (killed by a signal,
        // UCX's assertions) is a failure of the test.
        assert!(o.status.code().is_some(), "cp {from} {to} crashed ({}): {}", o.status, text(&o));
        errors.push(text(&o).trim().to_string());
        assert!(start.elapsed() < Duration::from_secs(120), "cp {from} {to} kept failing: {errors:#?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The long-lived client: this test's own binary, run again in the
/// client's namespace with this variable set to "CLUSTER_DIR\nCREDENTIAL\nSTOP_FILE".
const CLIENT_ROLE: &str = "DAFNE_MULTIHOST_CLIENT";
const TEST_NAME: &str = "a_cluster_of_four_namespaces_serves_a_client_over_tcp_and_survives_a_cut_link";

/// One process, one cluster connection for its whole life: rounds of a
/// 1 MiB write (DataSync) and its read-back at offsets over all three io
/// servers; a round that fails is retried after 300 ms on the same
/// connections (which heal: `dafne_client::link`), until the stop file
/// exists and three more rounds passed. Prints a summary line (`client:
/// N rounds, E errors, longest round T ms`) and each error; panics (a non-zero exit) on a byte that differs or
/// when a round keeps failing for 120 s.
fn long_lived_client(spec: &str) {
    use dafne_client::cluster::{Cluster, OpenOptions};
    let mut it = spec.split('\n');
    let (dir, cred, stop) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let mut o = OpenOptions::new(dir, "multihost-client");
    o.credential = Some(cred.into());
    let c = Cluster::open(&o).expect("opening the cluster from the client's cluster.json");
    let fs = dafne_client::file::Fs::new(c.meta.clone(), c.data.clone());
    let root = fs.meta.resolve("/").unwrap().ino;
    let f = fs.create(root, b"long-lived", 0o644, None).unwrap();
    let chunk = 1 << 20;
    let (mut round, mut after, mut errors, mut longest) = (0u64, 0, 0, Duration::ZERO);
    let mut first_fds = 0;
    while after < 3 {
        let data = pattern(chunk, 1000 + round);
        let off = (round % 8) * chunk as u64;
        let started = Instant::now();
        loop {
            let mut back = vec![0u8; chunk];
            let r =
                f.write_at(off, &data, dafne_proto::io::Stability::DataSync).and_then(|_| f.read_at(off, &mut back));
            match r {
                Ok(n) => {
                    assert_eq!(n, chunk, "round {round}: a short read");
                    assert!(back == data, "round {round}: the bytes read back differ from those written");
                    longest = longest.max(started.elapsed());
                    break;
                }
                Err(e) => {
                    errors += 1;
                    println!("client error: round {round} after {:?}: {e} (retried)", started.elapsed());
                    assert!(started.elapsed() < Duration::from_secs(120), "round {round} kept failing: {e}");
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        }
        if round == 0 {
            first_fds = fds(u64::from(std::process::id()));
        }
        round += 1;
        if Path::new(stop).exists() {
            after += 1;
        }
    }
    let last_fds = fds(u64::from(std::process::id()));
    println!("\nclient fds: {first_fds} after its first round, {last_fds} at the end");
    println!("\nclient: {round} rounds, {errors} errors, longest round {} ms", longest.as_millis());
}

#[test]
fn a_cluster_of_four_namespaces_serves_a_client_over_tcp_and_survives_a_cut_link() {
    if let Ok(spec) = std::env::var(CLIENT_ROLE) {
        return long_lived_client(&spec);
    }
    let Some(net) = Net::create(&["meta", "io1", "io2", "client"]) else { return };
    let (meta, io1, io2, client) = (net.host("meta"), net.host("io1"), net.host("io2"), net.host("client"));
    let config = net.path("hosts.toml");
    std::fs::write(
        &config,
        format!(
            r#"[cluster]
meta_port = 7700
io_base_port = 7710
reclaim_after_s = 2
[meta]
stripe_count = 3
stripe_unit = 65536
[io]
cache_mib = 8
[ucx]
TLS = "tcp"
NET_DEVICES = "eth0"
[[hosts]]
name = "meta"
address = "{}"
meta = true
[[hosts]]
name = "io1"
address = "{}"
io_servers = 1
[[hosts]]
name = "io2"
address = "{}"
io_servers = 2
"#,
            meta.addr, io1.addr, io2.addr
        ),
    )
    .unwrap();

    // Mistakes are refused with what to do.
    let o = up(meta, &config, &[]);
    assert!(!o.status.success() && text(&o).contains("with --host NAME"), "{}", text(&o));
    let o = up(meta, &config, &["--host", "nosuch"]);
    assert!(text(&o).contains("no such host") && text(&o).contains("meta, io1, io2"), "{}", text(&o));
    let o = up(io1, &config, &["--host", "io1"]);
    assert!(!o.status.success() && text(&o).contains("needs the cluster secret first"), "{}", text(&o));
    assert!(text(&o).contains("from the cluster directory of host \"meta\""), "{}", text(&o));
    // Found by review: on another machine, the secret's advice came first.
    let o = up(client, &config, &["--host", "io1"]);
    assert!(!o.status.success() && text(&o).contains("is not an address of this machine"), "{}", text(&o));

    // The metadata server's host first: it creates the secret, which the
    // operator copies to the io hosts.
    let o = up(meta, &config, &["--host", "meta"]);
    assert!(o.status.success(), "{}", text(&o));
    let secret = std::fs::read(meta.dir.join("meta/cluster.secret")).unwrap();
    for h in [io1, io2, client] {
        std::fs::create_dir_all(h.dir.join("meta")).unwrap();
        std::fs::write(h.dir.join("meta/cluster.secret"), &secret).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(h.dir.join("meta/cluster.secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // A host name that is not this machine's addresses.
    let o = up(client, &config, &["--host", "io1"]);
    assert!(!o.status.success() && text(&o).contains("is not an address of this machine"), "{}", text(&o));
    std::fs::remove_file(client.dir.join("meta/cluster.secret")).unwrap();
    for h in [io1, io2] {
        let o = up(h, &config, &["--host", h.name]);
        assert!(o.status.success(), "{}", text(&o));
    }
    // Each host's cluster.json lists every server of the file.
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(io2.dir.join("cluster.json")).unwrap()).unwrap();
    let io: Vec<&str> = info["io"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let want = [format!("{}:7710", io1.addr), format!("{}:7710", io2.addr), format!("{}:7711", io2.addr)];
    assert_eq!(io, want, "io server ids follow the file");
    assert_eq!(info["meta"], format!("{}:7700", meta.addr));

    // The client: no server, no secret; a credential issued on meta's host.
    let cred = net.path("client.cred");
    let o = run(dafne_in(&meta.ns)
        .args(["credential", "issue", "tester", "--uid", "0", "--gid", "0", "--root"])
        .args(["-o", p(&cred), "--dir", p(&meta.dir)]));
    assert!(o.status.success(), "{}", text(&o));
    let o = up(client, &config, &["--client", "--io-servers", "2"]);
    assert!(!o.status.success() && text(&o).contains("[[hosts]] list says how many"), "{}", text(&o));
    // The client's network device is named otherwise than the file's
    // `[ucx] NET_DEVICES`: `--net-devices` names its own.
    for args in
        [&["link", "set", "eth0", "down"][..], &["link", "set", "eth0", "name", "ens9"], &["link", "set", "ens9", "up"]]
    {
        ip(&[&["-n", client.ns.as_str()][..], args].concat());
    }
    let o = up(client, &config, &["--client", "--net-devices", "ens9"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(dafne_in(&client.ns).args(["status", "--dir", p(&client.dir)]));
    assert!(!o.status.success() && text(&o).contains("--credential"), "without the secret: {}", text(&o));
    let o = run(dafne_in(&client.ns).args(["status", "--dir", p(&client.dir), "--credential", p(&cred)]));
    assert!(o.status.success(), "{}", text(&o));
    let status = text(&o);
    assert_eq!(status.matches("| serving").count(), 4, "meta and 3 io servers serve: {status}");
    assert!(status.contains("no server runs here"), "{status}");
    // Every io server joined through meta, which the client's status shows
    // with the hosts file's names (polled: the first heartbeats follow the
    // servers' start by up to a second).
    let joined = ["| io-0 | up | io1 |", "| io-1 | up | io2 |", "| io-2 | up | io2 |"];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut status = status;
    while !joined.iter().all(|j| status.contains(j)) {
        assert!(Instant::now() < deadline, "the io servers did not all join meta: {status}");
        std::thread::sleep(Duration::from_millis(200));
        status = text(&run(dafne_in(&client.ns).args(["status", "--dir", p(&client.dir), "--credential", p(&cred)])));
    }
    let o = run(dafne_in(&client.ns).args(["status", "--metrics", "--dir", p(&client.dir)]));
    assert!(!o.status.success() && text(&o).contains("run `dafne status --metrics` there"), "{}", text(&o));
    // A server host's status shows the other hosts' servers too.
    let o = run(dafne_in(&meta.ns).args(["status", "--dir", p(&meta.dir)]));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(text(&o).matches("| serving").count(), 4, "from meta's host: {}", text(&o));

    // A file of some MiB in and out, every byte checked, and the bytes on
    // the io hosts' links: UCX carried them over the network.
    let size = 6 << 20;
    let data = pattern(size, 13);
    let src = net.path("src.bin");
    std::fs::write(&src, &data).unwrap();
    let before: u64 = [io1, io2].iter().map(|h| link_bytes(&h.veth)).sum();
    let o =
        run(dafne_in(&client.ns).args(["cp", "--dir", p(&client.dir), "--credential", p(&cred), p(&src), "dafne:/f"]));
    assert!(o.status.success(), "{}", text(&o));
    let back = net.path("back.bin");
    let o =
        run(dafne_in(&client.ns).args(["cp", "--dir", p(&client.dir), "--credential", p(&cred), "dafne:/f", p(&back)]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(std::fs::read(&back).unwrap() == data, "the copy out differs from what was written");
    let carried: u64 = [io1, io2].iter().map(|h| link_bytes(&h.veth)).sum::<u64>() - before;
    assert!(carried >= 2 * size as u64, "the io hosts' links carried {carried} bytes for 2 x {size}: not over TCP?");
    eprintln!("io hosts' links carried {carried} bytes for {size} bytes written and read");
    // TCP connections between namespaces: meta's reclaimer (which retries
    // until the io hosts are up) to io2's servers.
    let start = Instant::now();
    loop {
        let o = run(Command::new("ip").args(["netns", "exec", &io2.ns, "ss", "-tn", "state", "established"]));
        if text(&o).contains(&format!("{}:", meta.addr)) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no TCP connection from meta's host on io2: {}", text(&o));
        std::thread::sleep(Duration::from_millis(200));
    }

    // Cut io2 off during a write-and-read workload, bring it back: rounds
    // of a copy in and out run from before the cut until two rounds after
    // the link is back.
    let outage =
        Duration::from_secs(std::env::var("DAFNE_TEST_OUTAGE_S").ok().and_then(|v| v.parse().ok()).unwrap_or(10));
    let restored = std::sync::atomic::AtomicBool::new(false);
    let stop = net.path("stop");
    let client_log = net.path("client.log");
    let mut long_lived = Command::new("ip")
        .args(["netns", "exec", &client.ns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads", "1"])
        .env(CLIENT_ROLE, format!("{}\n{}\n{}", p(&client.dir), p(&cred), p(&stop)))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&client_log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (workload, rounds, during) = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let mut errors = Vec::new();
            let (mut round, mut after, mut during) = (0u64, 0, 0);
            while after < 2 {
                let back_already = restored.load(std::sync::atomic::Ordering::SeqCst);
                let data = pattern(2 << 20, 100 + round);
                let src = net.path(&format!("w{round}.bin"));
                std::fs::write(&src, &data).unwrap();
                let name = format!("dafne:/w{round}");
                errors.extend(cp_until_done(client, &cred, p(&src), &name));
                let back = net.path(&format!("w{round}.back"));
                errors.extend(cp_until_done(client, &cred, &name, p(&back)));
                assert!(std::fs::read(&back).unwrap() == data, "round {round}: the copy out differs");
                std::fs::remove_file(&src).unwrap();
                std::fs::remove_file(&back).unwrap();
                if back_already {
                    after += 1;
                } else if restored.load(std::sync::atomic::Ordering::SeqCst) {
                    during += 1;
                }
                round += 1;
            }
            (errors, round, during)
        });
        std::thread::sleep(Duration::from_millis(500));
        ip(&["link", "set", &io2.veth, "down"]);
        std::thread::sleep(outage);
        ip(&["link", "set", &io2.veth, "up"]);
        restored.store(true, std::sync::atomic::Ordering::SeqCst);
        std::fs::write(&stop, "").unwrap();
        w.join().unwrap()
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = long_lived.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(200) {
            let _ = long_lived.kill();
            panic!("the long-lived client did not finish: {}", std::fs::read_to_string(&client_log).unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(&client_log).unwrap();
    assert!(status.success(), "the long-lived client failed ({status}): {log}");
    let summary = log
        .lines()
        .find_map(|l| l.strip_prefix("client: "))
        .unwrap_or_else(|| panic!("no summary from the client: {log}"));
    eprintln!("long-lived client (errors retried on the same connections): {summary}");
    // Found by review: the endpoints of the connection that died were
    // closed gracefully, which never finished (the peer was gone), and
    // kept their sockets: 28 descriptors after the first round, 34 at the
    // end, here. With forced closes, 28 and 30: the 2 more were, in one
    // run looked at with `ss`, the old incoming connections of io2's
    // server-side data endpoints, still ESTABLISHED with 366 bytes unsent
    // (TCP's retransmission backoff after the outage; not followed to
    // their end). The bound leaves one of slack.
    let fd_line = log.lines().find(|l| l.starts_with("client fds: ")).unwrap_or_else(|| panic!("{log}"));
    eprintln!("long-lived {fd_line}");
    let counts: Vec<usize> = fd_line.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert!(counts.len() == 2 && counts[1] <= counts[0] + 3, "the long-lived client's descriptors grew: {fd_line}");
    for l in log.lines().filter_map(|l| l.find("client error").map(|i| &l[i..])) {
        eprintln!("  {l}");
    }
    // Every round touches every io server: one of them was held up by the
    // cut, so the cut was under the client's workload.
    let longest: u64 = summary.rsplit(' ').nth(1).and_then(|t| t.parse().ok()).unwrap();
    assert!(longest >= 1000, "no round of the long-lived client was held up by the cut: {summary}");
    assert!(during >= 1, "no round of the workload was under way when the link came back ({rounds} rounds)");
    eprintln!(
        "{rounds} rounds; {during} spanned the return of io2's link after {} s; failed copies, each retried: {}",
        outage.as_secs(),
        workload.len()
    );
    for e in &workload {
        eprintln!("  cp: {}", e.lines().last().unwrap_or(""));
    }
    for e in &workload {
        eprintln!("  {e}");
    }
    // Every server serves again, and io2's supervisor restarted nothing
    // (its servers lived through the cut).
    let o = run(dafne_in(&client.ns).args(["status", "--dir", p(&client.dir), "--credential", p(&cred)]));
    assert!(o.status.success(), "{}", text(&o));
    let states: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(io2.dir.join("servers.json")).unwrap()).unwrap();
    let servers = states.as_array().unwrap();
    assert_eq!(servers.len(), 2, "{states}");
    assert!(servers.iter().all(|s| s["restarts"] == 0), "io2's servers were restarted: {states}");
    let o = run(dafne_in(&client.ns).args(["down", "--dir", p(&client.dir)]));
    assert!(o.status.success() && text(&o).contains("no server ran here"), "{}", text(&o));
    // Found by review: the hints to start again named a plain `dafne up`,
    // which a host's or a client's directory refuses.
    let o = run(dafne_in(&client.ns).args(["down", "--dir", p(&client.dir)]));
    assert!(!o.status.success() && text(&o).contains("dafne up --client"), "{}", text(&o));
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(io1.dir.join("cluster.json")).unwrap()).unwrap();
    let o = run(Command::new("kill").args(["-KILL", &info["supervisor_pid"].to_string()]));
    assert!(o.status.success());
    common::wait_for("io1's supervisor to die", || !common::alive(info["supervisor_pid"].as_u64().unwrap()));
    let o = run(dafne_in(&io1.ns).args(["status", "--dir", p(&io1.dir)]));
    assert!(!o.status.success() && text(&o).contains("dafne up --host io1"), "{}", text(&o));
    let o = run(dafne_in(&io1.ns).args(["down", "--dir", p(&io1.dir)]));
    assert!(o.status.success(), "{}", text(&o));
    // `up` without --host starts the host this directory ran.
    let o = run(dafne_in(&io1.ns).args(["up", "--dir", p(&io1.dir)]));
    assert!(o.status.success() && text(&o).contains("host \"io1\""), "{}", text(&o));
    drop(net);
}

/// `dafne up --foreground` (what the systemd unit runs): the supervisor
/// in the command itself, the cluster usable while it runs, everything
/// stopped and `cluster.json` gone when it gets SIGTERM, exit status 0.
/// Found by review: a second `up --foreground` beside it exited 0 (a
/// service manager took that for success); `dafne down` on it showed no
/// progress (no supervisor.log); and when it died (SIGKILL) its servers ran
/// on unsupervised, so the next `up --foreground` refused to start. Now
/// the second one fails, `down` follows its log, and its servers stop
/// with it. One host, no namespaces.
#[test]
fn the_foreground_supervisor_serves_until_sigterm() {
    let dir = tempfile::Builder::new().prefix("dafne-foreground-test-").tempdir().unwrap();
    let d = p(dir.path()).to_string();
    let (meta, base) = common::free_ports(1);
    let (meta, base) = (meta.to_string(), base.to_string());
    let log = dir.path().join("foreground.out");
    let start = |log: &Path| {
        let sup = common::dafne()
            .args(["up", "--foreground", "--dir", &d, "--io-servers", "1", "--cache-mib", "8"])
            .args(["--meta-port", &meta, "--io-base-port", &base])
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let guard = KillOnDrop(sup.id());
        common::wait_for("cluster.json", || {
            std::fs::read_to_string(dir.path().join("cluster.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|i| i["supervisor_pid"] == sup.id())
        });
        (sup, guard)
    };
    let wait = |sup: &mut std::process::Child| {
        let start = Instant::now();
        loop {
            if let Some(s) = sup.try_wait().unwrap() {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(150), "the supervisor did not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Stopped when a `down` of this directory leaves anything behind
    // (after a panic too).
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = common::dafne().args(["down", "--dir", &self.0]).output();
        }
    }
    let _down = Down(d.clone());

    let (mut sup, guard) = start(&log);
    let o = run(common::dafne().args(["status", "--dir", &d]));
    assert!(o.status.success(), "{}", text(&o));
    let o = run(common::dafne().args(["up", "--foreground", "--dir", &d]));
    assert!(!o.status.success() && text(&o).contains("already runs this cluster"), "{}", text(&o));
    let o = run(Command::new("kill").args(["-TERM", &sup.id().to_string()]));
    assert!(o.status.success());
    let status = wait(&mut sup);
    drop(guard);
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}: {out}");
    assert!(out.contains("progress: stopping io-0") && out.contains("progress: stopped"), "{out}");
    assert!(!dir.path().join("cluster.json").exists());
    let states = std::fs::read_to_string(dir.path().join("servers.json")).unwrap();
    assert_eq!(states.matches("\"stopped\"").count(), 2, "{states}");

    // A supervisor killed: its servers stop too, and a new one starts.
    let (mut sup, guard) = start(&log);
    let states: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("servers.json")).unwrap()).unwrap();
    let pids: Vec<u64> = states.as_array().unwrap().iter().map(|s| s["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{states}");
    assert!(pids.iter().all(|&p| common::alive(p)), "{states}");
    let o = run(Command::new("kill").args(["-KILL", &sup.id().to_string()]));
    assert!(o.status.success());
    wait(&mut sup);
    drop(guard);
    let start_wait = Instant::now();
    while pids.iter().any(|&p| common::alive(p)) {
        assert!(
            start_wait.elapsed() < Duration::from_secs(150),
            "servers {pids:?} still run 150 s after their foreground supervisor was killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut sup, guard) = start(&log);
    // `down` follows the foreground supervisor's stop.
    let o = run(common::dafne().args(["down", "--dir", &d]));
    assert!(o.status.success() && text(&o).contains("stopping io-0"), "{}", text(&o));
    let status = wait(&mut sup);
    drop(guard);
    assert!(status.success(), "{status}");
}

/// The revoking client of `a_silent_host_neither_leaks_nor_delays_revocations`:
/// this test's binary run again in the metadata server's namespace (it
/// logs in with the cluster secret there) with this variable set to
/// "CLUSTER_DIR\nREADY_FILE\nGO_FILE".
const REVOKER_ROLE: &str = "DAFNE_MULTIHOST_REVOKER";
const SILENT_TEST: &str = "a_silent_host_neither_leaks_nor_delays_revocations";

/// Before the cut: a file of mode 0666 on io server 1 (io2's), written by
/// root; then READY_FILE, and a wait for GO_FILE. After: user 1000 opens
/// it, keeps the capability and closes; the capability writes (io2
/// honours it); root chmods the file 0600, and the capability is tried
/// until io2 refuses it (`ESTALE`: meta's revocation, relayed by the
/// supervisor), for at most 60 s. Prints `revoked after N ms`.
fn revoker(spec: &str) {
    let mut it = spec.split('\n');
    let (dir, ready, go) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(dir).join("cluster.json")).unwrap()).unwrap();
    let addr = |v: &serde_json::Value| v.as_str().unwrap().parse::<std::net::SocketAddr>().unwrap();
    let meta = addr(&info["meta"]);
    let io: Vec<std::net::SocketAddr> = info["io"].as_array().unwrap().iter().map(addr).collect();
    let ucx: Vec<(String, String)> = serde_json::from_value(info["ucx"].clone()).unwrap();
    let secret = dafne_auth::Secret::load(Path::new(info["secret"].as_str().unwrap())).unwrap();
    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "revoker".into(),
        ucx_config: ucx,
        ..Default::default()
    })
    .unwrap();
    let data = dafne_client::data::DataClient::connect(&rt, &io, &secret).unwrap();
    let session = |uid| dafne_client::MetaSession::connect(&rt, meta, &secret, "revoker", uid, uid).unwrap();
    let root = dafne_client::file::Fs::new(session(0), data.clone());
    let hint = dafne_proto::LayoutHint { stripe_unit: 65536, stripe_count: 1 };
    let payload = pattern(65536, 7);
    let (ino, name) = (0..64)
        .find_map(|k| {
            let f = root.create(root.meta.root(), format!("r{k}").as_bytes(), 0o666, Some(hint)).unwrap();
            let on_io2 = f.handle().layout.servers == [1];
            if on_io2 {
                f.write_at(0, &payload, dafne_proto::io::Stability::FileSync).unwrap();
            }
            let ino = f.attr().ino;
            f.close().unwrap();
            on_io2.then_some((ino, format!("r{k}")))
        })
        .expect("no file of 64 placed on io server 1");
    let f = root.open(ino, dafne_proto::OPEN_READ).unwrap();
    println!("\nobject {:016x}", f.handle().layout.object_id);
    f.close().unwrap();
    std::fs::write(ready, "").unwrap();
    while !Path::new(go).exists() {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Meta restarted meanwhile: the root session reconnects by itself.
    let attacker = session(1000);
    let stolen = attacker.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    attacker.close(stolen.layout.object_id).unwrap();
    let write = |f: &dafne_client::OpenFile| {
        futures::executor::block_on(data.write_at(f, 0, &payload[..4096], dafne_proto::io::Stability::FileSync))
    };
    assert_eq!(write(&stolen), Ok(4096), "io2 honours the capability before the chmod");
    let mut tries = 0;
    while let Err(e) = root.meta.setattr(ino, dafne_proto::SetAttr { mode: Some(0o600), ..Default::default() }) {
        tries += 1;
        assert!(tries < 100, "chmod kept failing: {e:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let start = Instant::now();
    loop {
        match write(&stolen) {
            Err(dafne_proto::Errno::ESTALE) => break,
            r => assert!(
                start.elapsed() < Duration::from_secs(60),
                "io2 still answers {r:?} to a capability revoked 60 s ago (the relay is held up)"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("\nrevoked after {} ms", start.elapsed().as_millis());
    // Its data is reclaimed from io2 too (the test watches the file).
    root.meta.unlink(root.meta.root(), name.as_bytes()).unwrap();
    println!("unlinked its object");
}

/// The open file descriptors of process `pid`.
fn fds(pid: u64) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Writes the hosts file of a cluster of hosts `meta`, `io1` and `io2` of
/// `net` (one io server on each io host, UCX over TCP on the links; with
/// `cluster` and `meta_lines` added to those sections), brings up meta on
/// its host, copies the cluster secret to the io hosts and brings up their
/// servers. Returns the hosts file.
fn up_three_hosts(net: &Net, cluster: &str, meta_lines: &str) -> PathBuf {
    let (meta, io1, io2) = (net.host("meta"), net.host("io1"), net.host("io2"));
    let config = net.path("hosts.toml");
    std::fs::write(
        &config,
        format!(
            r#"[cluster]
meta_port = 7700
io_base_port = 7710
{cluster}[meta]
{meta_lines}[io]
cache_mib = 8
[ucx]
TLS = "tcp"
NET_DEVICES = "eth0"
[[hosts]]
name = "meta"
address = "{}"
meta = true
[[hosts]]
name = "io1"
address = "{}"
io_servers = 1
[[hosts]]
name = "io2"
address = "{}"
io_servers = 1
"#,
            meta.addr, io1.addr, io2.addr
        ),
    )
    .unwrap();
    let o = up(meta, &config, &["--host", "meta"]);
    assert!(o.status.success(), "{}", text(&o));
    let secret = std::fs::read(meta.dir.join("meta/cluster.secret")).unwrap();
    for h in [io1, io2] {
        std::fs::create_dir_all(h.dir.join("meta")).unwrap();
        std::fs::write(h.dir.join("meta/cluster.secret"), &secret).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(h.dir.join("meta/cluster.secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let o = up(h, &config, &["--host", h.name]);
        assert!(o.status.success(), "{}", text(&o));
    }
    config
}

/// Found by review: while an io host did not answer (its link down), the
/// metadata host's supervisor made a new UCX context and worker for each
/// failed connection attempt of its reclaimer and leaked them (the close
/// of an endpoint to a silent peer never finished, so the worker could
/// not be destroyed): +7 descriptors per attempt, never freed. And its
/// revocation relay went through the io servers one after the other, a
/// silent one holding up the others for its connect timeout, or (as
/// here: the supervisor started while the host was cut off) for ever.
/// Now the descriptors stay bounded over several attempts, and a chmod's
/// revocation reaches the healthy host's io server while the other is
/// still cut off, as does the reclaiming of a deleted file's data.
#[test]
fn a_silent_host_neither_leaks_nor_delays_revocations() {
    if let Ok(spec) = std::env::var(REVOKER_ROLE) {
        return revoker(&spec);
    }
    let Some(net) = Net::create(&["meta", "io1", "io2"]) else { return };
    let (meta, io1, io2) = (net.host("meta"), net.host("io1"), net.host("io2"));
    let config = up_three_hosts(&net, "reclaim_after_s = 2\n", "stripe_count = 1\nopen_grace_s = 1\n");
    // The revoking client prepares its file while every host answers.
    let (ready, go, log) = (net.path("ready"), net.path("go"), net.path("revoker.log"));
    let mut revoker = Command::new("ip")
        .args(["netns", "exec", &meta.ns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", SILENT_TEST, "--nocapture", "--test-threads", "1"])
        .env(REVOKER_ROLE, format!("{}\n{}\n{}", p(&meta.dir), p(&ready), p(&go)))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(revoker.id());
    let start = Instant::now();
    while !ready.exists() {
        if let Some(s) = revoker.try_wait().unwrap() {
            panic!("the revoking client exited ({s}): {}", std::fs::read_to_string(&log).unwrap());
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the revoking client did not get ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log_text = std::fs::read_to_string(&log).unwrap();
    let object = log_text.lines().find_map(|l| l.strip_prefix("object ")).unwrap_or_else(|| panic!("{log_text}"));
    let data = io2.dir.join("io-1/objects").join(object);
    assert!(data.exists(), "{} holds the file's data", data.display());
    // io1 goes silent, and meta's supervisor starts again meanwhile (its
    // reclaimer and relay cannot reach io1 from the start).
    ip(&["link", "set", &io1.veth, "down"]);
    let o = run(dafne_in(&meta.ns).args(["down", "--dir", p(&meta.dir)]));
    assert!(o.status.success(), "{}", text(&o));
    let o = up(meta, &config, &["--host", "meta"]);
    assert!(o.status.success(), "{}", text(&o));
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(meta.dir.join("cluster.json")).unwrap()).unwrap();
    let sup = info["supervisor_pid"].as_u64().unwrap();
    // Several reclaimer rounds and connection attempts to io1 (each waits
    // out the 10 s connect timeout).
    std::thread::sleep(Duration::from_secs(5));
    let first = fds(sup);
    let mut counts = vec![first];
    for _ in 0..8 {
        std::thread::sleep(Duration::from_secs(5));
        counts.push(fds(sup));
    }
    eprintln!("meta host's supervisor's descriptors every 5 s while io1 is cut off: {counts:?}");
    let most = *counts.iter().max().unwrap();
    assert!(most <= first + 4, "the supervisor's descriptors grow while io1 is cut off: {counts:?}");
    // A chmod's revocation reaches io2 while io1 is still cut off.
    std::fs::write(&go, "").unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = revoker.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(150), "the revoking client did not finish");
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(guard);
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "the revoking client failed ({status}): {out}");
    let line = out.lines().find(|l| l.starts_with("revoked after")).unwrap_or_else(|| panic!("{out}"));
    eprintln!("while io1 is cut off, io2 refused a capability {line} the chmod");
    // And the reclaimer removes a deleted file's data from io2 meanwhile.
    assert!(out.contains("unlinked its object"), "{out}");
    let start = Instant::now();
    while data.exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "{} not reclaimed while io1 is cut off", data.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    ip(&["link", "set", &io1.veth, "up"]);
    drop(net);
}

/// Kills a process by pid when dropped (a panicking test too).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = run(Command::new("kill").args(["-9", &self.0.to_string()]));
    }
}

/// Issue 13, item 6, its lease half (docs/REPLICATION.md, "Membership:
/// leases held from meta"): an io host cut off from the metadata server
/// while clients still reach it (blackhole routes between the two hosts
/// only) stops accepting writes once its lease lapsed (3 s): a copy into
/// the file system from another host fails (`EIO` after the client's
/// retry deadline, 2 s here) instead of being accepted by a server meta
/// no longer hears. Once the routes are back it serves again, and what
/// was written before and after reads back. Failed before the change:
/// copies went on succeeding.
#[test]
fn an_io_host_cut_off_from_meta_stops_accepting_writes() {
    let Some(net) = Net::create(&["meta", "io1", "io2"]) else { return };
    let (meta, io1, io2) = (net.host("meta"), net.host("io1"), net.host("io2"));
    up_three_hosts(&net, "", "stripe_count = 2\nstripe_unit = 65536\n");
    // The client runs on io2's host (it has the secret and reaches both
    // io servers and meta); it gives up on a refused request after 2 s.
    let cp = |from: &Path, to: &str| {
        run(dafne_in(&io2.ns).env("DAFNE_RETRY_DEADLINE_S", "2").args(["cp", "--dir", p(&io2.dir), p(from), to]))
    };
    let cp_out = |from: &str, to: &Path| run(dafne_in(&io2.ns).args(["cp", "--dir", p(&io2.dir), from, p(to)]));
    // 1 MiB over both io servers (64 KiB stripes, two servers).
    let (before, after) = (pattern(1 << 20, 21), pattern(1 << 20, 22));
    let (before_src, after_src) = (net.path("before.bin"), net.path("after.bin"));
    std::fs::write(&before_src, &before).unwrap();
    std::fs::write(&after_src, &after).unwrap();
    let o = cp(&before_src, "dafne:/before");
    assert!(o.status.success(), "{}", text(&o));

    // io1's host and meta's no longer reach each other; io2 reaches both.
    let cut = [(io1, meta), (meta, io1)];
    for (from, to) in cut {
        ip(&["-n", &from.ns, "route", "add", "blackhole", &format!("{}/32", to.addr)]);
    }
    let start = Instant::now();
    let refused = (0..)
        .find_map(|k| {
            let o = cp(&after_src, &format!("dafne:/during{k}"));
            if !o.status.success() {
                return Some(text(&o));
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "io1 still accepted writes 60 s after its host was cut off from meta"
            );
            std::thread::sleep(Duration::from_millis(500));
            None
        })
        .unwrap();
    eprintln!("refused {:?} after the cut: {}", start.elapsed(), refused.trim());
    assert!(refused.contains("Input/output error") || refused.contains("EIO"), "{refused}");
    // `dafne status` from io2's host (it reaches meta and both io servers)
    // says io1's server does not serve, and so does its exit status
    // (scripts and monitors read it). Failed before: the table said "not
    // serving" and the command exited 0.
    let o = run(dafne_in(&io2.ns).args(["status", "--dir", p(&io2.dir)]));
    let status = text(&o);
    assert!(status.contains("its lease from meta lapsed"), "{status}");
    assert!(!o.status.success(), "status exited 0 while an io server's lease had lapsed: {status}");
    assert!(status.contains("1 of 3 servers are not serving"), "{status}");

    // Back: io1 serves again once meta answers its heartbeat.
    for (from, to) in cut {
        ip(&["-n", &from.ns, "route", "del", "blackhole", &format!("{}/32", to.addr)]);
    }
    let start = Instant::now();
    loop {
        let o = cp(&after_src, "dafne:/after");
        if o.status.success() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "io1 did not serve again: {}", text(&o));
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("served again {:?} after the routes came back", start.elapsed());
    for (name, want) in [("before", &before), ("after", &after)] {
        let back = net.path(&format!("{name}.back"));
        let o = cp_out(&format!("dafne:/{name}"), &back);
        assert!(o.status.success(), "{}", text(&o));
        assert!(std::fs::read(&back).unwrap() == *want, "/{name} differs from what was written");
    }
}
