//! A test cluster (`dafne up` in a temporary directory) and FUSE mounts
//! of it, for the tests that mount (`mount.rs`, `credentials.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::{dafne, free_ports, text};

/// A path as the `&str` a command line takes.
pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The metadata server's metrics address, from the `cluster.json` of `dir`.
pub fn meta_metrics_addr(dir: &Path) -> std::net::SocketAddr {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    info["metrics"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["server"] == "meta"))
        .and_then(|e| e["addr"].as_str())
        .expect("cluster.json names meta's metrics port")
        .parse()
        .unwrap()
}

/// The metrics page of the server `server` (`meta`, `io-N`; its address
/// from `cluster.json` of `dir`), parsed.
pub fn server_page(dir: &Path, server: &str) -> Vec<dafne_metrics::parse::Family> {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    let addr: std::net::SocketAddr = info["metrics"]
        .as_array()
        .and_then(|m| m.iter().find(|e| e["server"] == server))
        .and_then(|e| e["addr"].as_str())
        .unwrap_or_else(|| panic!("cluster.json names no metrics port of {server}"))
        .parse()
        .unwrap();
    let page = dafne_metrics::http::fetch(addr, std::time::Duration::from_secs(5)).expect("a metrics page");
    dafne_metrics::parse::parse(&page).expect("a well-formed page")
}

/// The first sample of the family `name` on the metrics page of the
/// server `server` ([`server_page`]); `None` when the page does not have it.
pub fn server_metric(dir: &Path, server: &str, name: &str) -> Option<f64> {
    server_page(dir, server).iter().find(|f| f.name == name).and_then(|f| f.samples.first()).map(|s| s.value)
}

/// The pid of the server `name` (`meta`, `io-N`) in `servers.json` of `dir`.
pub fn server_pid(dir: &Path, name: &str) -> u64 {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("servers.json")).unwrap()).unwrap();
    let e = s.as_array().unwrap().iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no {name} in {s}"));
    e["pid"].as_u64().unwrap()
}

/// A process stopped (`kill -STOP`): it answers nothing, yet is alive (no
/// supervisor restarts it). Continued (`kill -CONT`) when dropped, also
/// after a failed check, so that `dafne down` can stop it. The signals are
/// sent by kill(2), not by running `kill`: forking this process waits
/// while another of its threads is in an O_DIRECT read or write on a
/// mount (the kernel holds its memory map for the request), and that
/// request may be waiting for the stopped process (measured: the fork
/// waited 59 s, until the client library gave up the request).
pub struct Stopped(pub u64);

fn signal(pid: u64, sig: rustix::process::Signal) -> bool {
    let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw);
    pid.is_some_and(|p| rustix::process::kill_process(p, sig).is_ok())
}

impl Stopped {
    pub fn stop(pid: u64) -> Stopped {
        assert!(signal(pid, rustix::process::Signal::STOP), "kill -STOP {pid} failed");
        Stopped(pid)
    }

    /// `kill -CONT` now.
    pub fn resume(self) {}
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, rustix::process::Signal::CONT);
    }
}

/// A running cluster in its own directory; `dafne down` when dropped.
pub struct Cluster {
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// The one place a test cluster is started: `dafne up` with 4 io
    /// servers, small caches and free ports.
    pub fn start() -> Cluster {
        Cluster::start_with_config("")
    }

    /// [`Cluster::start`] with a configuration file of `toml` (the flags
    /// still choose io servers, cache and ports).
    pub fn start_with_config(toml: &str) -> Cluster {
        Cluster::start_sized(4, toml)
    }

    /// A cluster of `io_servers` io servers and a configuration of `toml`.
    pub fn start_sized(io_servers: u16, toml: &str) -> Cluster {
        let dir = tempfile::Builder::new().prefix("dafne-mount-test-").tempdir().unwrap();
        let config = dir.path().join("test-config.toml");
        std::fs::write(&config, toml).unwrap();
        let mut last = String::new();
        for _ in 0..3 {
            let (meta, base) = free_ports(io_servers);
            let o = dafne()
                .args(["up", "--dir", p(dir.path()), "--io-servers", &io_servers.to_string(), "--cache-mib", "8"])
                .args(["--config", p(&config)])
                .args(["--meta-port", &meta.to_string(), "--io-base-port", &base.to_string()])
                .output()
                .unwrap();
            if o.status.success() {
                return Cluster { dir };
            }
            last = text(&o);
            if !last.contains("already in use") {
                break;
            }
        }
        panic!("dafne up failed:\n{last}");
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until the metadata server's gauge `name` (its metrics page,
    /// from `cluster.json`; rendered at most once a second) reads `want`,
    /// at most 20 s: for a test that must know the server has a request
    /// (a lock waiter, say) rather than guess with a sleep.
    pub fn wait_meta_gauge(&self, name: &str, want: f64) {
        let addr = meta_metrics_addr(self.dir());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut seen = None;
        while std::time::Instant::now() < deadline {
            let page =
                dafne_metrics::http::fetch(addr, std::time::Duration::from_secs(5)).expect("meta's metrics page");
            let families = dafne_metrics::parse::parse(&page).expect("a well-formed page");
            seen = families.iter().find(|f| f.name == name).and_then(|f| f.samples.first()).map(|s| s.value);
            if seen == Some(want) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("meta's {name} stayed {seen:?}, waited for {want}");
    }

    /// A fresh directory beside the cluster's (not on the mount).
    pub fn scratch(&self, name: &str) -> PathBuf {
        let d = self.dir().join("scratch").join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    pub fn mount(&self) -> Mount {
        self.mount_with(&[])
    }

    pub fn mount_with(&self, extra: &[&str]) -> Mount {
        self.mount_at("mnt", extra)
    }

    /// `dafne mount DIR/name EXTRA...`, whatever it answers: the mount
    /// point and the output.
    pub fn try_mount_at(&self, name: &str, extra: &[&str]) -> (PathBuf, Output) {
        self.try_mount_at_env(name, extra, &[])
    }

    /// [`Cluster::try_mount_at`] with more environment for `dafne mount`
    /// (and so its daemon): e.g. `DAFNE_LOG=info` for a test that reads an
    /// info line, which CI's `DAFNE_LOG=error` would hide.
    pub fn try_mount_at_env(&self, name: &str, extra: &[&str], env: &[(&str, &str)]) -> (PathBuf, Output) {
        let mp = self.dir().join(name);
        std::fs::create_dir_all(&mp).unwrap();
        let o = dafne()
            .envs(env.iter().copied())
            .arg("mount")
            .arg(&mp)
            .args(["--dir", p(self.dir())])
            .args(extra)
            .output()
            .unwrap();
        (mp, o)
    }

    /// Another mount of the same cluster sees only what reached the
    /// servers (no shared kernel cache).
    pub fn mount_at(&self, name: &str, extra: &[&str]) -> Mount {
        self.mount_at_env(name, extra, &[])
    }

    /// [`Cluster::mount_at`] with more environment (see
    /// [`Cluster::try_mount_at_env`]).
    pub fn mount_at_env(&self, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Mount {
        let (mp, o) = self.try_mount_at_env(name, extra, env);
        assert!(o.status.success(), "dafne mount failed:\n{}", text(&o));
        let out = text(&o);
        assert!(out.contains("mounted dafne at"), "{out}");
        // When `dafne mount` returns, `dafne down` can already find the
        // mount by its record (CI once saw the record missing here).
        // This daemon's own record: another mount of the cluster may have
        // one already.
        let pid = out
            .split("daemon pid ")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .unwrap_or_else(|| panic!("no daemon pid in {out:?}"));
        let record = self.dir().join("mounts").join(pid);
        assert!(record.is_file(), "dafne mount returned before it recorded the mount in {}", record.display());
        Mount { mp, dir: self.dir().to_path_buf() }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let o = dafne().args(["down", "--dir", p(self.dir())]).output();
        if let Ok(o) = o {
            if !o.status.success() {
                eprintln!("dafne down: {}", text(&o));
            }
        }
    }
}

/// A live mount; unmounted when dropped (also after a failed check).
pub struct Mount {
    pub mp: PathBuf,
    pub dir: PathBuf,
}

impl Mount {
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mp.join(rel)
    }

    pub fn umount(&self) -> Output {
        dafne().arg("umount").arg(&self.mp).args(["--dir", p(&self.dir)]).output().unwrap()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if mounted(&self.mp) {
            let o = self.umount();
            if !o.status.success() {
                eprintln!("dafne umount: {}", text(&o));
                // Leave no mount behind for the next test.
                let _ = Command::new("fusermount3").arg("-uz").arg(&self.mp).status();
            }
        }
    }
}

pub fn mounted(mp: &Path) -> bool {
    let want = mp.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().any(|l| l.split(' ').nth(4) == Some(&want))
}

/// A server process a test started again by hand; killed when dropped.
pub struct Restarted(pub Child);

/// How to start a server process again: its command line and environment.
pub struct Again {
    pub cmdline: Vec<String>,
    pub environ: Vec<String>,
}

impl Again {
    /// Process `pid`'s command line and environment (read while it lives).
    pub fn of(pid: u64) -> Again {
        let split = |b: Vec<u8>| -> Vec<String> {
            b.split(|&x| x == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        };
        Again {
            cmdline: split(std::fs::read(format!("/proc/{pid}/cmdline")).unwrap()),
            environ: split(std::fs::read(format!("/proc/{pid}/environ")).unwrap()),
        }
    }

    /// Starts it, its output in `log_path`, and waits until it listens.
    /// CI once saw meta's view stay down for 30 s after such a start, with
    /// nothing to tell why: the instance is waited for until it listens,
    /// and its log goes with any failure. While the port was free another
    /// process of this machine may have taken it (an outgoing connection's
    /// ephemeral port): that is retried, as it is no fault of the server's.
    pub fn start(&self, log_path: &Path) -> Restarted {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::File::create(log_path).unwrap();
            let mut child = Command::new(&self.cmdline[0])
                .args(&self.cmdline[1..])
                .env_clear()
                .envs(self.environ.iter().filter_map(|kv| kv.split_once('=')))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            let listening = loop {
                let text = std::fs::read_to_string(log_path).unwrap_or_default();
                if text.contains("listening on") {
                    break None;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    break Some((status, text));
                }
                assert!(std::time::Instant::now() < deadline, "the server started again never listened:\n{text}");
                std::thread::sleep(Duration::from_millis(50));
            };
            match listening {
                None => return Restarted(child),
                Some((_, text)) if text.contains("in use") && std::time::Instant::now() < deadline => {
                    eprintln!("the server's port was taken meanwhile; starting it again:\n{text}");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Some((status, text)) => panic!("the server started again exited ({status}):\n{text}"),
            }
        }
    }
}

impl Drop for Restarted {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client of cluster `c` in this process named `name`: its runtime (first,
/// so that a destructuring binding drops it last), data client and file
/// layer (over a session of the cluster secret).
pub fn native_client(
    c: &Cluster,
    name: &str,
) -> (dafne_transport::Runtime, dafne_client::data::DataClient, dafne_client::file::Fs) {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir().join("cluster.json")).unwrap()).unwrap();
    let addr = |v: &serde_json::Value| v.as_str().unwrap().parse::<std::net::SocketAddr>().unwrap();
    let io: Vec<std::net::SocketAddr> = info["io"].as_array().unwrap().iter().map(addr).collect();
    let ucx: Vec<(String, String)> = serde_json::from_value(info["ucx"].clone()).unwrap();
    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: name.into(),
        ucx_config: ucx,
        ..Default::default()
    })
    .unwrap();
    let secret = dafne_auth::Secret::load(&c.dir().join("meta").join("cluster.secret")).unwrap();
    let session = dafne_client::MetaSession::connect(&rt, addr(&info["meta"]), &secret, name, 0, 0).unwrap();
    let data = dafne_client::data::DataClient::connect(&rt, &io, &secret).unwrap();
    let fs = dafne_client::file::Fs::new(session, data.clone());
    (rt, data, fs)
}
