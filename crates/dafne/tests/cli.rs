//! The `dafne` command as a person uses it: `up`, `status`, `down`, a
//! crashed server, and the mistakes people make. Every test runs the real
//! binary, which starts real server processes.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{alive, dafne, free_ports, pattern, text, wait_for};

fn run(args: &[&str]) -> Output {
    dafne().args(args).output().expect("running dafne")
}

/// A cluster directory; `down` runs when dropped, whatever the test did.
struct Cluster {
    dir: tempfile::TempDir,
    meta_port: u16,
    io_base: u16,
}

impl Cluster {
    fn new(io_servers: u16) -> Cluster {
        let (meta_port, io_base) = free_ports(io_servers);
        Cluster { dir: tempfile::tempdir().unwrap(), meta_port, io_base }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn d(&self) -> String {
        self.path().display().to_string()
    }

    fn up_args(&self, io_servers: u16) -> Vec<String> {
        let mut v: Vec<String> = vec!["up".into(), "--dir".into(), self.d()];
        v.extend(["--io-servers".into(), io_servers.to_string(), "--cache-mib".into(), "8".into()]);
        v.extend(["--meta-port".into(), self.meta_port.to_string()]);
        v.extend(["--io-base-port".into(), self.io_base.to_string()]);
        v
    }

    fn up(&self, io_servers: u16) -> Output {
        dafne().args(self.up_args(io_servers)).output().unwrap()
    }

    fn status_json(&self) -> serde_json::Value {
        let o = run(&["status", "--dir", &self.d(), "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn servers(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.path().join("servers.json")).unwrap()).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(&["down", "--dir", &self.d()]);
    }
}

#[test]
fn up_status_down_and_up_again() {
    let c = Cluster::new(2);
    let o = c.up(2);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("dafne is up") && out.contains(&format!("127.0.0.1:{}", c.meta_port)), "{out}");
    assert!(out.contains("first start: generating the cluster secret"), "progress is shown: {out}");
    assert!(c.path().join("meta/cluster.secret").exists());
    assert!(c.path().join("config.toml").exists());

    let s = c.status_json();
    assert_eq!(s["io"].as_array().unwrap().len(), 2);
    for io in s["io"].as_array().unwrap() {
        assert!(io["error"].is_null(), "{io}");
        assert!(io["info"]["capacity_bytes"].as_u64().unwrap() > 0, "{io}");
        assert_eq!(io["info"]["mode"].as_u64(), Some(2), "unifier mode: {io}");
        assert_eq!(io["info"]["cache_bytes"].as_u64(), Some(8 << 20), "{io}");
        assert_eq!(io["info"]["bytes_copied"].as_u64(), Some(0), "{io}");
        // A count since start is named as one (it was `connections`, read
        // as the connections open now).
        assert!(io["info"]["connections_accepted"].as_u64() >= Some(1), "{io}");
        assert!(io["info"].get("connections").is_none(), "{io}");
        assert_eq!(io["server"]["state"], "running");
    }
    assert!(s["meta"]["reachable"].is_null(), "{s}");
    let table = text(&run(&["status", "--dir", &c.d()]));
    assert!(table.contains("| io-1 | unifier |") && table.contains("credits in use"), "{table}");

    // `up` again is harmless.
    let o = c.up(2);
    assert!(o.status.success() && text(&o).contains("already running"), "{}", text(&o));

    let pids: Vec<u64> = c.servers().as_array().unwrap().iter().map(|s| s["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 3);
    let o = run(&["down", "--dir", &c.d()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!c.path().join("cluster.json").exists());
    for pid in pids {
        assert!(!alive(pid), "server {pid} still runs after down");
    }
    let o = run(&["down", "--dir", &c.d()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no dafne cluster is running"), "{}", text(&o));

    // The same ports at once: no wait for TIME_WAIT, same secret.
    let secret = std::fs::read(c.path().join("meta/cluster.secret")).unwrap();
    let o = c.up(2);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("generating the cluster secret"));
    assert_eq!(std::fs::read(c.path().join("meta/cluster.secret")).unwrap(), secret);
}

#[test]
fn a_crashed_server_is_reported_and_restarted() {
    let c = Cluster::new(2);
    assert!(c.up(2).status.success());
    let victim = c.servers()[2]["pid"].as_u64().unwrap();
    Command::new("kill").args(["-9", &victim.to_string()]).status().unwrap();
    wait_for("the restart", || {
        let s = c.servers();
        s[2]["restarts"] == 1 && s[2]["state"] == "running"
    });
    let s = c.servers();
    assert_ne!(s[2]["pid"].as_u64().unwrap(), victim);
    assert!(s[2]["last_exit"].as_str().unwrap().contains("SIGKILL"), "{s}");
    let table = text(&run(&["status", "--dir", &c.d()]));
    assert!(table.contains("1 restarts") && table.contains("SIGKILL"), "{table}");
    // It serves again, on the same address.
    let st = c.status_json();
    assert!(st["io"][1]["error"].is_null(), "{st}");
    assert_eq!(st["io"][1]["addr"], format!("127.0.0.1:{}", c.io_base + 1));
    let log = std::fs::read_to_string(c.path().join("logs/supervisor.log")).unwrap();
    assert!(log.contains("io-1") && log.contains("exited unexpectedly"), "{log}");
    // Log files are plain text: no terminal colour escapes in any of them
    // (issue 13: they are read with less, grep and log shippers).
    for entry in std::fs::read_dir(c.path().join("logs")).unwrap() {
        let path = entry.unwrap().path();
        let body = std::fs::read(&path).unwrap();
        assert!(!body.contains(&0x1b), "{} has terminal escapes:\n{}", path.display(), String::from_utf8_lossy(&body));
    }
}

/// Kills `c`'s server `k` (its pid in servers.json) and waits until the
/// supervisor has recorded the exit with state `running` or `failed`.
fn kill_and_wait(c: &Cluster, k: usize, restarts: u64) -> serde_json::Value {
    let victim = c.servers()[k]["pid"].as_u64().unwrap();
    Command::new("kill").args(["-9", &victim.to_string()]).status().unwrap();
    wait_for("the supervisor to handle the kill", || {
        let s = &c.servers()[k];
        s["state"] == "failed" || (s["state"] == "running" && s["restarts"] == restarts)
    });
    c.servers()[k].clone()
}

#[test]
fn max_restarts_counts_within_the_restart_window() {
    let c = Cluster::new(1);
    let cfg = c.path().join("my.toml");
    // One restart per window; a window short enough to wait for.
    std::fs::write(
        &cfg,
        format!(
            "[cluster]\nio_servers = 1\nmax_restarts = 1\nrestart_window_s = 5\nmeta_port = {}\n\
             io_base_port = {}\n[meta]\nstripe_count = 1\n[io]\ncache_mib = 8\n",
            c.meta_port, c.io_base
        ),
    )
    .unwrap();
    let o = run(&["up", "--dir", &c.d(), "--config", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    // The count of the window is read from what the supervisor logged at
    // the restart: the live count may already have been reset on a slow
    // machine (the window is 5 s).
    let log = || std::fs::read_to_string(c.path().join("logs/supervisor.log")).unwrap();
    let s = kill_and_wait(&c, 1, 1);
    assert_eq!(s["state"], "running", "{s}");
    assert!(log().contains("restarting io-0 (1/1 within 5s; 1 in all)"), "{}", log());
    // Once it has run the window, its count starts again: a second crash
    // (its lifetime's second, over max_restarts = 1) is restarted.
    let deadline = Instant::now() + Duration::from_secs(60);
    while c.servers()[1]["restarts_in_window"] != 0 {
        assert!(Instant::now() < deadline, "the window never reset the count: {}", c.servers());
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = kill_and_wait(&c, 1, 2);
    assert_eq!(s["state"], "running", "a crash after a quiet window is restarted: {s}");
    assert!(log().contains("restarting io-0 (1/1 within 5s; 2 in all)"), "{}", log());
    // Status still shows every restart.
    let table = text(&run(&["status", "--dir", &c.d()]));
    assert!(table.contains("2 restarts"), "{table}");
    // And the count max_restarts limits (before, status showed only the
    // total); 0 or 1 by now, as the window goes.
    assert!(
        table.contains("2 restarts (0 in the restart window)")
            || table.contains("2 restarts (1 in the restart window)"),
        "{table}"
    );
    // A crash within the window, over max_restarts: given up. Whether it
    // came within the window is the supervisor's to say (a reset is
    // logged before the exit it precedes is handled), not a guess at how
    // fast this machine is.
    let s = kill_and_wait(&c, 1, 3);
    let log = log();
    match log.matches("its count against max_restarts starts again").count() {
        1 => {
            assert_eq!(s["state"], "failed", "{s}\n{log}");
            assert!(log.contains("not restarting io-0 (max_restarts reached within restart_window_s)"), "{log}");
        }
        _ => assert_eq!(s["state"], "running", "the window passed again, so it is restarted: {s}\n{log}"),
    }
}

#[test]
fn without_restart_a_crash_leaves_the_server_failed() {
    let c = Cluster::new(1);
    let cfg = c.path().join("my.toml");
    std::fs::write(
        &cfg,
        format!(
            "[cluster]\nio_servers = 1\nrestart = false\nmeta_port = {}\nio_base_port = {}\n[meta]\nstripe_count = 1\n[io]\ncache_mib = 8\n",
            c.meta_port, c.io_base
        ),
    )
    .unwrap();
    let o = run(&["up", "--dir", &c.d(), "--config", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let victim = c.servers()[1]["pid"].as_u64().unwrap();
    Command::new("kill").args(["-9", &victim.to_string()]).status().unwrap();
    wait_for("the failure to be recorded", || c.servers()[1]["state"] == "failed");
    // The report still comes out, and the exit status says a server is
    // not serving.
    let o = run(&["status", "--dir", &c.d(), "--json"]);
    assert!(!o.status.success() && text(&o).contains("1 of 2 servers are not serving"), "{}", text(&o));
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(st["io"][0]["error"].as_str().unwrap().contains("cannot reach"), "{st}");
}

#[test]
fn mistakes_get_clear_messages_and_a_nonzero_exit() {
    // Nothing running.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    for cmd in ["status", "down"] {
        let o = run(&[cmd, "--dir", &d]);
        assert!(!o.status.success());
        let t = text(&o);
        assert!(t.contains("no dafne cluster is running") && t.contains("dafne up"), "{cmd}: {t}");
        assert!(!t.contains("Stack backtrace") && !t.contains("panicked"), "{t}");
    }

    // A file where the cluster's directory should be (review: a bare
    // "creating F: Not a directory" said nothing of what to pass).
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let o = run(&["up", "--dir", file.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("is not a directory") && text(&o).contains("pass a directory"), "{}", text(&o));

    // A typo in the configuration.
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[cluster]\nio_server = 3\n").unwrap();
    let o = run(&["up", "--dir", &d, "--config", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("io_server") && text(&o).contains("dafne config"), "{}", text(&o));

    // An impossible value.
    let o = run(&["up", "--dir", &d, "--io-servers", "0"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("io_servers"), "{}", text(&o));

    // Replicas: more than the io servers; two in a serving mode that
    // cannot forward writes: refused before anything starts.
    let cfg = dir.path().join("replicas.toml");
    std::fs::write(&cfg, "[cluster]\nio_servers = 2\n[meta]\nstripe_count = 2\nreplicas = 3\n").unwrap();
    let o = run(&["up", "--dir", &d, "--config", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("lower replicas to at most 2, or run more io servers"), "{}", text(&o));
    std::fs::write(&cfg, "[cluster]\nio_servers = 2\n[io]\nmode = \"mmap\"\n[meta]\nstripe_count = 2\nreplicas = 2\n")
        .unwrap();
    let o = run(&["up", "--dir", &d, "--config", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("replicas = 2 with io.mode = \"mmap\"") && t.contains("use mode = \"unifier\""), "{t}");
    assert!(!dir.path().join("cluster.json").exists(), "nothing started");

    // A metrics host that is none of this machine's addresses (TEST-NET-1).
    let cfg = dir.path().join("host.toml");
    std::fs::write(&cfg, "[cluster]\nmetrics_host = \"192.0.2.1\"\n").unwrap();
    let o = run(&["up", "--dir", &d, "--config", cfg.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("192.0.2.1 ([cluster] metrics_host"), "{}", text(&o));

    // The metadata server's port is taken.
    let c = Cluster::new(1);
    let _holder = TcpListener::bind(("127.0.0.1", c.meta_port)).unwrap();
    let o = c.up(1);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains(&format!("127.0.0.1:{}", c.meta_port)) && t.contains("already in use"), "{t}");
    assert!(t.contains("--meta-port"), "says how to fix it: {t}");
    assert!(!c.path().join("cluster.json").exists());

    // The example configuration is the embedded default and parses.
    let o = run(&["config"]);
    assert!(o.status.success());
    let ex = dir.path().join("ex.toml");
    std::fs::write(&ex, &o.stdout).unwrap();
    let o = run(&["up", "--dir", &d, "--config", ex.to_str().unwrap(), "--io-servers", "99"]);
    assert!(text(&o).contains("io_servers = 99"), "{}", text(&o));
}

#[test]
fn credential_mistakes_get_clear_messages_and_a_nonzero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let out = dir.path().join("a.cred");
    let o_ = out.display().to_string();
    let issue = |extra: &[&str]| {
        let mut args = vec!["credential", "issue"];
        args.extend_from_slice(extra);
        run(&args)
    };
    let refused = |o: Output, want: &[&str]| {
        assert!(!o.status.success(), "succeeded: {}", text(&o));
        let t = text(&o);
        for w in want {
            assert!(t.contains(w), "{w:?} not in: {t}");
        }
        assert!(!t.contains("panicked"), "{t}");
    };

    // No cluster secret here: say where it was looked for and where to run.
    refused(
        issue(&["a", "--uid", "1000", "--gid", "1000", "--dir", &d, "-o", &o_]),
        &["cluster.secret", "dafne up", "--secret"],
    );
    let secret = dir.path().join("meta").join("cluster.secret");
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    std::fs::write(&secret, [7u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(issue(&["a", "--uid", "1000", "--gid", "1000", "--dir", &d, "-o", &o_]), &["mode 0644", "chmod 600"]);
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Policies that say nothing, or too much without saying so.
    refused(issue(&["a", "--gid", "1000", "--dir", &d, "-o", &o_]), &["--uid", "which users"]);
    refused(issue(&["a", "--uid", "1000", "--dir", &d, "-o", &o_]), &["--gid", "which groups"]);
    refused(issue(&["a", "--uid", "0-2000", "--gid", "1000", "--dir", &d, "-o", &o_]), &["includes 0", "--root"]);
    refused(issue(&["a", "--uid", "2000-1000", "--gid", "1000", "--dir", &d]), &["ends before it starts"]);
    refused(issue(&["a", "--uid", "alice", "--gid", "1000", "--dir", &d]), &["not an id"]);
    refused(issue(&["a b", "--uid", "1000", "--gid", "1000", "--dir", &d, "-o", &o_]), &["no spaces"]);
    assert!(!out.exists(), "a refused issue wrote {o_}");

    // Issued once; never over an existing file.
    let o = issue(&["a", "--uid", "1000", "--uid", "1001-1999", "--gid", "100", "--dir", &d, "-o", &o_]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("uids: 1000-1999"), "ranges are merged: {}", text(&o));
    assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o600);
    refused(issue(&["a", "--uid", "1000", "--gid", "100", "--dir", &d, "-o", &o_]), &["exists already", "-o"]);

    // Revoking needs a running cluster; a mount needs one before it reads a credential.
    refused(run(&["credential", "revoke", "a", "--dir", &d]), &["no dafne cluster is running", "dafne up"]);
    refused(run(&["cp", "--dir", &d, "--credential", &o_, "x", "dafne:/x"]), &["no dafne cluster is running"]);
}

/// A client of the cluster in `dir` (through `cluster.json`).
fn connect(dir: &Path) -> (dafne_transport::Runtime, dafne_client::file::Fs) {
    use dafne_client::data::DataClient;
    use dafne_client::file::Fs;
    use dafne_client::MetaSession;
    #[derive(serde::Deserialize)]
    struct Info {
        meta: std::net::SocketAddr,
        io: Vec<std::net::SocketAddr>,
        secret: PathBuf,
        ucx: Vec<(String, String)>,
    }
    let info: Info = serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "test".into(),
        ucx_config: info.ucx,
        ..Default::default()
    })
    .unwrap();
    let secret = dafne_auth::Secret::load(&info.secret).unwrap();
    let meta = MetaSession::connect(&rt, info.meta, &secret, "test", 0, 0).unwrap();
    let data = DataClient::connect(&rt, &info.io, &secret).unwrap();
    (rt, Fs::new(meta, data))
}

#[test]
fn clients_reconnect_to_restarted_servers() {
    let c = Cluster::new(2);
    assert!(c.up(2).status.success());
    let (_rt, fs) = connect(c.path());
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let f = fs.create(fs.meta.root(), b"f", 0o644, None).unwrap();
    f.write_at(0, &data, dafne_proto::io::Stability::FileSync).unwrap();
    f.close().unwrap();
    let ino = fs.meta.lookup(fs.meta.root(), b"f").unwrap().ino;
    // Both kinds of server crash and are restarted by the supervisor.
    let before = c.servers();
    for i in [0, 1] {
        let pid = before[i]["pid"].as_u64().unwrap();
        Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    }
    wait_for("both restarts", || {
        let s = c.servers();
        s[0]["restarts"] == 1 && s[1]["restarts"] == 1 && s[0]["state"] == "running" && s[1]["state"] == "running"
    });
    // Calls in flight at the loss fail; later ones reconnect (no retry of
    // the failed call itself).
    let t = Instant::now();
    let attr = loop {
        match fs.meta.getattr(ino) {
            Ok(a) => break a,
            Err(e) => {
                assert_eq!(e, dafne_proto::Errno::EIO);
                assert!(t.elapsed() < Duration::from_secs(15), "the metadata session did not heal");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert_eq!(attr.size, data.len() as u64);
    assert!(fs.meta.reconnects() >= 1);
    let f = fs.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    let mut back = vec![0u8; data.len()];
    let t = Instant::now();
    loop {
        match f.read_at(0, &mut back) {
            Ok(n) => {
                assert_eq!(n, data.len());
                break;
            }
            Err(e) => {
                assert_eq!(e, dafne_proto::Errno::EIO);
                assert!(t.elapsed() < Duration::from_secs(15), "the io connections did not heal");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    assert!(back == data, "file-synced data is intact after the io server's crash");
    assert!(fs.data.reconnects() >= 1);
    // And writes work again.
    f.write_at(0, b"again", dafne_proto::io::Stability::FileSync).unwrap();
}

#[test]
fn data_written_before_down_is_there_after_up() {
    let c = Cluster::new(2);
    assert!(c.up(2).status.success());
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 4096) as u8).collect();
    {
        let (_rt, fs) = connect(c.path());
        let f = fs.create(fs.meta.root(), b"kept", 0o644, None).unwrap();
        // Unstable: acknowledged from the io servers' caches, not on disk;
        // no close or fsync either (close would make the servers write
        // back to answer the size), so only the servers' clean stop can
        // save the data.
        f.write_at(0, &data, dafne_proto::io::Stability::Unstable).unwrap();
        let st = c.status_json();
        let dirty: u64 = st["io"].as_array().unwrap().iter().map(|i| i["info"]["dirty_bytes"].as_u64().unwrap()).sum();
        assert!(dirty > 0, "some of the data is only in the caches: {st}");
        std::mem::forget(f);
    }
    let o = run(&["down", "--dir", &c.d()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(c.up(2).status.success());
    let (_rt, fs) = connect(c.path());
    let a = fs.meta.lookup(fs.meta.root(), b"kept").unwrap();
    let f = fs.open(a.ino, dafne_proto::OPEN_READ).unwrap();
    let stored = futures::executor::block_on(fs.data.stored_size(f.handle())).unwrap();
    assert_eq!(stored, data.len() as u64);
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(fs.data.read_at(f.handle(), 0, &mut back)).unwrap();
    assert!(back == data, "the io servers wrote back their caches when stopped");
}

/// An io server acknowledges unstable writes from its cache; when it
/// crashes before writing them back, the supervisor's restart brings up a
/// server with nothing dirty. The client's write verifier makes the next
/// fsync report the loss instead of succeeding.
#[test]
fn clients_reconnect_and_fsync_reports_unstable_writes_lost_in_a_crash() {
    let c = Cluster::new(1);
    assert!(c.up(1).status.success());
    let (_rt, fs) = connect(c.path());
    let f = fs.create(fs.meta.root(), b"u", 0o644, None).unwrap();
    let data: Vec<u8> = (0..600_000u32).map(|i| (i % 239) as u8).collect();
    f.write_at(0, &data, dafne_proto::io::Stability::Unstable).unwrap();
    let io = c.servers().as_array().unwrap().iter().position(|s| s["name"] == "io-0").expect("io-0 in servers.json");
    let pid = c.servers()[io]["pid"].as_u64().unwrap();
    Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    wait_for("the restart", || {
        let s = c.servers();
        s[io]["restarts"] == 1 && s[io]["state"] == "running"
    });
    // Heal the connection with calls that touch no file (the first ones
    // fail: the connection was lost).
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.path().join("cluster.json")).unwrap()).unwrap();
    let secret = dafne_auth::Secret::load(Path::new(info["secret"].as_str().unwrap())).unwrap();
    let cap = dafne_client::data::info_capability(&secret);
    let t = Instant::now();
    while let Err(e) = futures::executor::block_on(fs.data.server_info(0, cap)) {
        assert_eq!(e, dafne_proto::Errno::EIO);
        assert!(t.elapsed() < Duration::from_secs(15), "the io connection did not heal");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(fs.data.reconnects() >= 1);
    // The connection works; the new server never had the data.
    assert_eq!(f.fsync(), Err(dafne_proto::Errno::EIO), "fsync hid unstable writes lost in the crash");
    assert_eq!(f.fsync(), Ok(()), "the loss is reported once");
}

/// The write verifier records the oldest connection that acknowledged an
/// unstable write: writes acknowledged before a crash are reported lost
/// even when later writes went on the lost connection and were repeated,
/// and acknowledged, on the restarted server's (the record must not move
/// to the newer connection), at fsync and at close alike.
#[test]
fn writes_repeated_after_a_crash_do_not_hide_the_loss_of_those_acknowledged_before_it() {
    use dafne_proto::io::Stability;
    let c = Cluster::new(1);
    assert!(c.up(1).status.success());
    let (_rt, fs) = connect(c.path());
    let io = c.servers().as_array().unwrap().iter().position(|s| s["name"] == "io-0").expect("io-0 in servers.json");
    let data: Vec<u8> = (0..600_000u32).map(|i| (i % 241) as u8).collect();
    for (i, at_close) in [(0u64, false), (1, true)] {
        let f = fs.create(fs.meta.root(), format!("mixed-{at_close}").as_bytes(), 0o644, None).unwrap();
        // Acknowledged by io-0 from its cache.
        f.write_at(0, &data[..300_000], Stability::Unstable).unwrap();
        let pid = c.servers()[io]["pid"].as_u64().unwrap();
        Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
        wait_for("the restart", || {
            let s = c.servers();
            s[io]["restarts"] == i + 1 && s[io]["state"] == "running"
        });
        // Sent on the lost connection, then again on the next one, where
        // the restarted server acknowledges it.
        let repeats = fs.data.repeats_after_loss();
        f.write_at(300_000, &data[300_000..], Stability::Unstable).unwrap();
        assert!(fs.data.repeats_after_loss() > repeats, "the second write did not meet the lost connection");
        if at_close {
            assert_eq!(f.close(), Err(dafne_proto::Errno::EIO), "close hid unstable writes lost in the crash");
        } else {
            assert_eq!(f.fsync(), Err(dafne_proto::Errno::EIO), "fsync hid unstable writes lost in the crash");
            assert_eq!(f.fsync(), Ok(()), "the loss is reported once");
        }
    }
}

/// `dafne cp` sends unstable writes and syncs at the end: when the io
/// server that acknowledged a batch crashes and restarts before the copy
/// ends, the later writes are repeated on the new connection, and the
/// sync must still report the loss, failing the copy. The source is a
/// FIFO, so that the crash comes between two batches: cp blocked reading
/// it (its wchan `pipe_read`, `anon_pipe_read` on newer kernels) with
/// all of the first batch (4 regions of 8 MiB,
/// module `copy`) taken means that batch was acknowledged.
#[test]
fn cp_fails_when_the_io_server_that_acknowledged_its_writes_crashed_under_it() {
    use std::io::Write;
    let c = Cluster::new(1);
    assert!(c.up(1).status.success());
    let scratch = tempfile::tempdir().unwrap();
    let fifo = scratch.path().join("src");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let d = c.d();
    let mut cp = dafne()
        .args(["cp", "--dir", &d, fifo.to_str().unwrap(), "dafne:/piped"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Blocks until cp opens it.
    let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    w.write_all(&pattern(4 * (8 << 20), 3)).unwrap();
    let pid = cp.id();
    wait_for("cp to write its first batch and read on", || {
        std::fs::read_to_string(format!("/proc/{pid}/wchan")).is_ok_and(|w| w.ends_with("pipe_read"))
    });
    let io = c.servers().as_array().unwrap().iter().position(|s| s["name"] == "io-0").expect("io-0 in servers.json");
    let server = c.servers()[io]["pid"].as_u64().unwrap();
    Command::new("kill").args(["-9", &server.to_string()]).status().unwrap();
    wait_for("the restart", || {
        let s = c.servers();
        s[io]["restarts"] == 1 && s[io]["state"] == "running"
    });
    w.write_all(&pattern(1 << 20, 4)).unwrap();
    drop(w);
    wait_for("cp to end", || cp.try_wait().unwrap().is_some());
    let o = cp.wait_with_output().unwrap();
    assert!(
        !o.status.success(),
        "cp succeeded, though the io server that acknowledged its writes crashed: {}",
        text(&o)
    );
    assert!(text(&o).contains("syncing"), "cp failed, but not at its sync: {}", text(&o));
}

#[test]
fn a_killed_supervisor_is_seen_and_down_stops_what_it_left() {
    let c = Cluster::new(1);
    assert!(c.up(1).status.success());
    let sup: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.path().join("cluster.json")).unwrap()).unwrap();
    let sup = sup["supervisor_pid"].as_u64().unwrap();
    let servers: Vec<u64> = c.servers().as_array().unwrap().iter().map(|s| s["pid"].as_u64().unwrap()).collect();
    Command::new("kill").args(["-9", &sup.to_string()]).status().unwrap();
    wait_for("the supervisor to die", || !alive(sup));
    // Its lock went with it: nothing claims to run, whatever cluster.json says.
    let o = run(&["status", "--dir", &c.d()]);
    assert!(!o.status.success() && text(&o).contains("is not running"), "{}", text(&o));
    // `up` says what holds the cluster; `down` stops the servers it left
    // behind, and `up` works again.
    let o = c.up(1);
    assert!(!o.status.success() && text(&o).contains("left running by a supervisor that is gone"), "{}", text(&o));
    let o = run(&["down", "--dir", &c.d()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("left running by a supervisor that is gone"), "{}", text(&o));
    for pid in servers {
        assert!(!alive(pid), "server {pid} still runs");
    }
    let o = c.up(1);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn a_stale_cluster_file_with_a_reused_pid_is_not_a_running_cluster() {
    let dir = tempfile::tempdir().unwrap();
    // A cluster.json left by a dead cluster, whose supervisor pid now
    // belongs to another live process (this test).
    let info = serde_json::json!({
        "dir": dir.path(), "meta": "127.0.0.1:1", "io": [], "secret": dir.path().join("s"),
        "ucx": [], "supervisor_pid": std::process::id(), "attr_timeout_ms": 1, "entry_timeout_ms": 1
    });
    std::fs::write(dir.path().join("cluster.json"), info.to_string()).unwrap();
    let d = dir.path().display().to_string();
    let o = run(&["status", "--dir", &d]);
    assert!(!o.status.success() && text(&o).contains("is not running"), "{}", text(&o));
    let o = run(&["down", "--dir", &d]);
    assert!(!o.status.success());
    assert!(alive(std::process::id()), "down signalled nothing");
}

#[test]
fn up_refuses_fewer_io_servers_than_the_data_has_and_another_configuration_while_running() {
    let c = Cluster::new(2);
    assert!(c.up(2).status.success());
    let config = std::fs::read_to_string(c.path().join("config.toml")).unwrap();
    // Another configuration than the running one: refused, saying what
    // differs and what to do, and nothing changes.
    let o = run(&["up", "--dir", &c.d(), "--cache-mib", "16"]);
    let t = text(&o);
    assert!(!o.status.success(), "a different --cache-mib is not success: {t}");
    assert!(t.contains("already running") && t.contains("io.cache_mib: 8 running, 16 given"), "{t}");
    assert!(t.contains("dafne down"), "{t}");
    let other = c.path().join("other.toml");
    std::fs::write(&other, config.replace("restart = true", "restart = false")).unwrap();
    let o = run(&["up", "--dir", &c.d(), "--config", other.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("cluster.restart: true running, false given"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(c.path().join("config.toml")).unwrap(), config, "a refused up changes nothing");
    // What runs, asked for again (plainly, by the same flags, or by a copy
    // of the file): harmless.
    let same = c.path().join("same.toml");
    std::fs::write(&same, &config).unwrap();
    for args in [
        vec!["up".to_string(), "--dir".into(), c.d()],
        vec!["up".to_string(), "--dir".into(), c.d(), "--cache-mib".into(), "8".into()],
        vec!["up".to_string(), "--dir".into(), c.d(), "--config".into(), same.display().to_string()],
    ] {
        let o = dafne().args(&args).output().unwrap();
        assert!(o.status.success() && text(&o).contains("already running"), "{args:?}: {}", text(&o));
    }
    assert!(run(&["down", "--dir", &c.d()]).status.success());
    let config = std::fs::read_to_string(c.path().join("config.toml")).unwrap();
    let o = c.up(1);
    assert!(!o.status.success());
    assert_eq!(std::fs::read_to_string(c.path().join("config.toml")).unwrap(), config, "a refused up changes nothing");
    let t = text(&o);
    assert!(t.contains("io servers 0..=1") && t.contains("--io-servers 2"), "{t}");
}

#[test]
fn two_ups_at_once_start_one_cluster() {
    let c = Cluster::new(1);
    let args = c.up_args(1);
    let spawn = || {
        dafne().args(&args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let ok = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert!(ok >= 1, "{}\n{}", text(&a), text(&b));
    for o in [&a, &b] {
        let t = text(o);
        assert!(
            t.contains("dafne is up") || t.contains("already running") || t.contains("is starting"),
            "each says what happened: {t}"
        );
    }
    // One supervisor, serving.
    let st = c.status_json();
    assert!(st["io"][0]["error"].is_null(), "{st}");
    let sups = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|cmd| {
            let cmd = String::from_utf8_lossy(cmd);
            cmd.contains("supervise") && cmd.contains(&c.d())
        })
        .count();
    assert_eq!(sups, 1);
}

/// Starts `c` with 2 io servers, files striped over both, and deleted
/// files' data reclaimed 1 s after the unlink.
fn up_reclaiming_after_1s(c: &Cluster) {
    let cfg = c.path().join("reclaim.toml");
    std::fs::write(
        &cfg,
        format!(
            "[cluster]\nio_servers = 2\nreclaim_after_s = 1\nmeta_port = {}\nio_base_port = {}\n[meta]\nstripe_count = 2\n[io]\ncache_mib = 8\n",
            c.meta_port, c.io_base
        ),
    )
    .unwrap();
    let o = run(&["up", "--dir", &c.d(), "--config", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
}

/// The data of a deleted file leaves the io servers once `reclaim_after_s`
/// has passed; a file that keeps another hard link keeps its data.
#[test]
fn deleted_files_data_is_reclaimed_from_the_io_servers() {
    let c = Cluster::new(2);
    up_reclaiming_after_1s(&c);
    let (_rt, fs) = connect(c.path());
    let root = fs.meta.root();
    let data: Vec<u8> = (0..2u32 << 20).map(|i| (i % 251) as u8).collect();
    // The object files of a file: one per io server of its layout.
    let write = |name: &[u8]| -> Vec<PathBuf> {
        let f = fs.create(root, name, 0o644, None).unwrap();
        f.write_at(0, &data, dafne_proto::io::Stability::FileSync).unwrap();
        let layout = f.handle().layout.clone();
        f.close().unwrap();
        assert_eq!(layout.servers.len(), 2, "{layout:?}");
        let files: Vec<PathBuf> =
            layout.servers.iter().map(|s| c.path().join(format!("io-{s}/objects/{:016x}", layout.object_id))).collect();
        for p in &files {
            assert!(p.exists(), "{} after the write", p.display());
        }
        files
    };
    let gone = write(b"gone");
    let kept = write(b"kept");
    fs.meta.link(fs.meta.lookup(root, b"kept").unwrap().ino, root, b"kept2").unwrap();
    fs.meta.unlink(root, b"kept").unwrap();
    fs.meta.unlink(root, b"gone").unwrap();
    wait_for("the deleted file's objects to go", || gone.iter().all(|p| !p.exists()));
    // The reclaimer has had its round; the linked file's data stays.
    for p in &kept {
        assert!(p.exists(), "{} of a file still linked", p.display());
    }
    let f = fs.open(fs.meta.lookup(root, b"kept2").unwrap().ino, dafne_proto::OPEN_READ).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(f.read_at(0, &mut back).unwrap(), data.len());
    assert!(back == data);
    // The reclaimer logs a round after forgetting the orphans it removed.
    let log = || std::fs::read_to_string(c.path().join("logs/supervisor.log")).unwrap();
    wait_for("the reclaimer's log line", || log().contains("reclaimed the data of 1 deleted file"));
    assert!(!log().contains("error:"), "{}", log());
}

/// Polls `f` until it holds; panics after `limit`.
fn wait_up_to(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out ({limit:?}) waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 10, finding 9: a file opened, then unlinked, and read through the
/// open handle after the reclaimer has had a round past `reclaim_after_s`
/// returns the bytes written (POSIX keeps them until the last close); its
/// data leaves the io servers only after that close.
#[test]
fn an_unlinked_open_file_keeps_its_data_until_its_last_close() {
    let c = Cluster::new(2);
    up_reclaiming_after_1s(&c);
    let (_rt, fs) = connect(c.path());
    let root = fs.meta.root();
    let objects = |layout: &dafne_proto::Layout| -> Vec<PathBuf> {
        layout.servers.iter().map(|s| c.path().join(format!("io-{s}/objects/{:016x}", layout.object_id))).collect()
    };
    let write = |name: &[u8], data: &[u8]| -> Vec<PathBuf> {
        let f = fs.create(root, name, 0o644, None).unwrap();
        f.write_at(0, data, dafne_proto::io::Stability::FileSync).unwrap();
        let files = objects(&f.handle().layout);
        f.close().unwrap();
        for p in &files {
            assert!(p.exists(), "{} after the write", p.display());
        }
        files
    };
    let data = pattern(3_000_000, 10);
    let held = write(b"held", &data);
    let f = fs.open(fs.meta.lookup(root, b"held").unwrap().ino, dafne_proto::OPEN_READ).unwrap();
    fs.meta.unlink(root, b"held").unwrap();
    // A witness deleted after it and never opened: once its data is gone
    // and the reclaimer has logged the end of that round, the reclaimer has
    // had a round that found "held" old enough as well.
    let witness = write(b"witness", &pattern(2 << 20, 11));
    fs.meta.unlink(root, b"witness").unwrap();
    let log = || std::fs::read_to_string(c.path().join("logs/supervisor.log")).unwrap();
    wait_up_to(Duration::from_secs(90), "the reclaimer to remove the witness", || {
        witness.iter().all(|p| !p.exists()) && log().contains("reclaimed the data of")
    });
    let mut back = vec![0u8; data.len()];
    assert_eq!(f.read_at(0, &mut back).unwrap(), data.len());
    if let Some(at) = back.iter().zip(&data).position(|(a, b)| a != b) {
        panic!("the open file's bytes differ from what was written, first at offset {at} of {}", data.len());
    }
    for p in &held {
        assert!(p.exists(), "{} of a file still open", p.display());
    }
    // The last close lets the data go.
    drop(f);
    wait_up_to(Duration::from_secs(60), "the closed file's data to be reclaimed", || held.iter().all(|p| !p.exists()));
    assert!(!log().contains("error:"), "{}", log());
}

/// `dafne cp` both ways, as a person uses it: sizes around the stripe unit
/// and the client's buffers (empty, one byte, unaligned, several stripes),
/// every byte compared; an existing destination is kept unless `--force`;
/// and the mistakes (a missing source, no dafne side, a missing directory)
/// get a clear message and a non-zero exit without touching anything.
#[test]
fn cp_copies_in_and_out_byte_exact_and_refuses_mistakes() {
    let c = Cluster::new(2);
    assert!(c.up(2).status.success());
    let scratch = tempfile::tempdir().unwrap();
    let d = c.d();
    for (i, len) in [0usize, 1, 4095, 65_537, 3 * (1 << 20) + 12_345].into_iter().enumerate() {
        let src = scratch.path().join(format!("in-{i}"));
        let back = scratch.path().join(format!("out-{i}"));
        let data = pattern(len, 40 + i as u64);
        std::fs::write(&src, &data).unwrap();
        let remote = format!("dafne:/cp-{i}.bin");
        let o = run(&["cp", "--dir", &d, src.to_str().unwrap(), &remote]);
        assert!(o.status.success(), "cp in {len} B: {}", text(&o));
        let o = run(&["cp", "--dir", &d, &remote, back.to_str().unwrap()]);
        assert!(o.status.success(), "cp out {len} B: {}", text(&o));
        assert!(std::fs::read(&back).unwrap() == data, "{len} bytes came back different");
    }

    // An existing destination, either side, is not replaced without -f.
    let src = scratch.path().join("in-4");
    let other = scratch.path().join("in-1");
    let o = run(&["cp", "--dir", &d, other.to_str().unwrap(), "dafne:/cp-4.bin"]);
    assert!(!o.status.success(), "cp replaced an existing dafne file without --force");
    assert!(text(&o).contains("exists"), "{}", text(&o));
    let back = scratch.path().join("out-4");
    let o = run(&["cp", "--dir", &d, "dafne:/cp-1.bin", back.to_str().unwrap()]);
    assert!(!o.status.success(), "cp replaced an existing local file without --force");
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&src).unwrap(), "the local file was changed");
    let o = run(&["cp", "--dir", &d, "-f", other.to_str().unwrap(), "dafne:/cp-4.bin"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["cp", "--dir", &d, "-f", "dafne:/cp-4.bin", back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(std::fs::read(&back).unwrap() == pattern(1, 41), "--force did not replace the file");

    // Mistakes: each says what went wrong, exits non-zero.
    let missing = scratch.path().join("no-such-file");
    for (args, says) in [
        (vec!["cp", "--dir", &d, missing.to_str().unwrap(), "dafne:/x"], "no-such-file"),
        (vec!["cp", "--dir", &d, "dafne:/no-such-file", scratch.path().join("y").to_str().unwrap()], "no-such-file"),
        (vec!["cp", "--dir", &d, src.to_str().unwrap(), scratch.path().join("z").to_str().unwrap()], "dafne:"),
        (vec!["cp", "--dir", &d, src.to_str().unwrap(), "dafne:/no-such-dir/f"], "no-such-dir"),
    ] {
        let o = run(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(text(&o).contains(says), "{args:?}: the message does not name {says:?}: {}", text(&o));
    }
    assert!(!scratch.path().join("y").exists() && !scratch.path().join("z").exists());
}

/// `dafne scrub` (checksums, issue 13): an untouched cluster scrubs clean;
/// after one byte of a file is flipped in its chunk file on disk while the
/// cluster is down, a copy out of that file fails (the io server answers
/// EIO, never the flipped bytes), `checksum_errors` counts it, and scrub
/// names the object and the block's offset and exits non-zero; the other
/// file still copies out byte-exact.
#[test]
fn scrub_names_a_block_flipped_on_disk_and_exits_nonzero() {
    let c = Cluster::new(2);
    assert!(c.up(2).status.success());
    let d = c.d();
    let scratch = tempfile::tempdir().unwrap();
    let (good, bad) = (pattern(300_123, 1), pattern(1_000_001, 2));
    for (name, data) in [("good", &good), ("bad", &bad)] {
        let src = scratch.path().join(name);
        std::fs::write(&src, data).unwrap();
        let o = run(&["cp", "--dir", &d, src.to_str().unwrap(), &format!("dafne:/{name}")]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = run(&["scrub", "--dir", &d]);
    assert!(o.status.success(), "an untouched cluster scrubs clean: {}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).matches(" 0 bad blocks").count() == 2, "{}", text(&o));
    // Stopped cleanly: every byte is on disk. Flip one in the chunk file
    // that holds the start of "bad" (found by its first bytes).
    let o = run(&["down", "--dir", &d]);
    assert!(o.status.success(), "{}", text(&o));
    let chunks: Vec<PathBuf> = (0..2)
        .flat_map(|i| std::fs::read_dir(c.path().join(format!("io-{i}")).join("objects")).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none())
        .filter(|p| std::fs::read(p).unwrap().starts_with(&bad[..4096]))
        .collect();
    assert_eq!(chunks.len(), 1, "{chunks:?}");
    let object = u64::from_str_radix(chunks[0].file_name().unwrap().to_str().unwrap(), 16).unwrap();
    let mut bytes = std::fs::read(&chunks[0]).unwrap();
    bytes[5000] ^= 0x40;
    std::fs::write(&chunks[0], &bytes).unwrap();

    assert!(c.up(2).status.success());
    let back = scratch.path().join("back");
    let o = run(&["cp", "--dir", &d, "dafne:/bad", back.to_str().unwrap()]);
    assert!(!o.status.success(), "the flipped block was served");
    if let Ok(got) = std::fs::read(&back) {
        assert!(got.len() < 5001 || got[5000] == bad[5000], "the flipped byte reached the copy");
    }
    let o = run(&["cp", "--dir", &d, "-f", "dafne:/good", back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(std::fs::read(&back).unwrap() == good);
    let st = c.status_json();
    let errors: u64 = st["io"].as_array().unwrap().iter().map(|i| i["info"]["checksum_errors"].as_u64().unwrap()).sum();
    assert!(errors >= 1, "not counted: {st}");
    let o = run(&["scrub", "--dir", &d]);
    let out = text(&o);
    assert!(!o.status.success(), "scrub found a bad block and exited 0: {out}");
    let line = format!("bad block: object {object:016x} offset 4096: no replica to repair from");
    assert!(out.contains(&line), "{line:?} not in: {out}");
    assert_eq!(out.matches("bad block: ").count(), 1, "{out}");
}

/// Found by review: with a `[[hosts]]` list, `--meta-port`,
/// `--io-base-port` and `--metrics-base-port` were taken on one host (or
/// client) only, so that hosts' `cluster.json` files disagreed on where
/// the servers listen. They are refused (the file says, the same on every
/// host), like `--io-servers`.
#[test]
fn a_hosts_list_refuses_port_flags() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("hosts.toml");
    std::fs::write(
        &cfg,
        "[cluster]\nmeta_port = 7700\nio_base_port = 7710\n[[hosts]]\nname = \"m\"\naddress = \"127.0.0.2\"\n\
         meta = true\nio_servers = 1\n[[hosts]]\nname = \"a\"\naddress = \"127.0.0.3\"\nio_servers = 1\n",
    )
    .unwrap();
    let d = dir.path().join("c").display().to_string();
    for (flag, key) in
        [("--meta-port", "meta_port"), ("--io-base-port", "io_base_port"), ("--metrics-base-port", "metrics_base_port")]
    {
        let o = run(&["up", "--client", "--dir", &d, "--config", cfg.to_str().unwrap(), flag, "9000"]);
        assert!(
            !o.status.success() && text(&o).contains(&format!("{flag}: with a [[hosts]] list every host must use")),
            "{flag}: {}",
            text(&o)
        );
        assert!(text(&o).contains(&format!("[cluster] {key}")), "{}", text(&o));
        assert!(!Path::new(&d).join("cluster.json").exists(), "{flag}: nothing written");
    }
    let o = run(&["up", "--client", "--dir", &d, "--config", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let info = std::fs::read_to_string(Path::new(&d).join("cluster.json")).unwrap();
    assert!(info.contains("127.0.0.3:7710"), "{info}");
    // Found by review: a client machine could not name its own network
    // device (the file's, or the hosts', went into its cluster.json).
    let o = run(&["down", "--dir", &d]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["up", "--client", "--dir", &d, "--config", cfg.to_str().unwrap(), "--net-devices", "ens9"]);
    assert!(o.status.success(), "{}", text(&o));
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&d).join("cluster.json")).unwrap()).unwrap();
    let ucx: Vec<(String, String)> = serde_json::from_value(info["ucx"].clone()).unwrap();
    assert!(ucx.contains(&("NET_DEVICES".into(), "ens9".into())), "{ucx:?}");
    let o = run(&["down", "--dir", &d]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["up", "--client", "--dir", &d, "--config", cfg.to_str().unwrap(), "--net-devices", "a b"]);
    assert!(!o.status.success() && text(&o).contains("--net-devices \"a b\""), "{}", text(&o));
    let o = run(&["up", "--dir", &d, "--config", cfg.to_str().unwrap(), "--net-devices", "ens9"]);
    assert!(!o.status.success() && text(&o).contains("--client"), "{}", text(&o));
}

/// `--io-base-port 0` is refused with what to pass: io server i listens on
/// base + i, so 0 put io server 1 on port 1 (a new user reads 0 as "free
/// ports", as it is for `--meta-port`). So is a base whose io ports would
/// pass 65535, with the highest base that fits. Nothing is started.
#[test]
fn an_io_base_port_of_0_or_one_that_overflows_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    // Were it started after all (the bug), it is stopped.
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = run(&["down", "--dir", &self.0]);
        }
    }
    let _down = Down(d.clone());
    let o = run(&["up", "--dir", &d, "--io-servers", "2", "--meta-port", "0", "--io-base-port", "0"]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("io_base_port = 0") && t.contains("--io-base-port 7710"), "says what to pass: {t}");
    assert!(!dir.path().join("cluster.json").exists(), "{t}");
    let o = run(&["up", "--dir", &d, "--io-servers", "4", "--meta-port", "0", "--io-base-port", "65534"]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("leaves no room for 4 io servers") && t.contains("the highest base for 4 io servers is 65532"),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
    assert!(!dir.path().join("cluster.json").exists(), "{t}");
}

/// Found by review: `dafne status | head` panicked ("failed printing to
/// stdout: Broken pipe") once `head` had its lines. A reader that goes
/// away ends the command quietly, with SIGPIPE's status 141, as a C
/// program's. The pipe's reader is closed before the command starts, so
/// its first line meets it.
#[test]
fn a_reader_that_goes_away_ends_output_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = dafne().arg("config").stdout(writer).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(141), "{err}");
}
