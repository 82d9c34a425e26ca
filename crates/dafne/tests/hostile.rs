//! A hostile network against a real cluster (issue 10): whatever a peer
//! that does not hold the secret sends to any port, the servers stay up,
//! return to idle once it stops, and a well-behaved client then finishes
//! its work with every byte checked.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::{alive, dafne, free_ports, pattern, text, wait_for};

fn run(args: &[&str]) -> Output {
    dafne().args(args).output().expect("running dafne")
}

/// One cluster at a time: the floods and deadlines here are measured on a
/// 2-core machine, and a flood against another test's cluster took the
/// CPU a listener's guard needs (a garbage connection outlived its 20 s).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running cluster in a temporary directory; `down` when dropped (then
/// the next test's cluster may start).
struct Up {
    dir: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Up {
    fn start(io_servers: u16) -> Up {
        Up::start_logging(io_servers, None)
    }

    /// A cluster whose servers log at `level` (`DAFNE_LOG`; the test suite
    /// may run with errors only, `scripts/test.sh`).
    fn start_logging(io_servers: u16, level: Option<&str>) -> Up {
        let _serial = serial();
        let (meta, io) = free_ports(io_servers);
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let (n, m, i) = (io_servers.to_string(), meta.to_string(), io.to_string());
        let mut up = dafne();
        up.args(["up", "--dir", &d, "--io-servers", &n, "--cache-mib", "8", "--meta-port", &m, "--io-base-port", &i]);
        if let Some(level) = level {
            up.env("DAFNE_LOG", level);
        }
        let o = up.output().expect("running dafne up");
        assert!(o.status.success(), "{}", text(&o));
        Up { dir, _serial }
    }

    fn d(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// The last lines of every server's log, for a failure's message.
    fn log_tails(&self) -> String {
        let mut out = String::new();
        let Ok(dir) = std::fs::read_dir(self.dir.path().join("logs")) else { return out };
        for e in dir.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- {} (last 20 lines)\n", e.path().display());
            for l in &lines[lines.len().saturating_sub(20)..] {
                out += l;
                out.push('\n');
            }
        }
        out
    }

    /// (name, pid, listener port) of every server.
    fn servers(&self) -> Vec<(String, u32, u16)> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.dir.path().join("servers.json")).unwrap()).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let port = s["addr"].as_str().unwrap().rsplit_once(':').unwrap().1.parse().unwrap();
                (s["name"].as_str().unwrap().to_string(), s["pid"].as_u64().unwrap() as u32, port)
            })
            .collect()
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = run(&["down", "--dir", &self.d()]);
    }
}

/// Every TCP port process `pid` listens on (its UCX listener and UCX's own
/// TCP transport ports): what an attacker finds with a port scan.
fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            if let Some(n) = t.to_string_lossy().strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(n.parse::<u64>().unwrap());
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.contains(&f[9].parse::<u64>().unwrap_or(0)) {
                let port = u16::from_str_radix(f[1].rsplit_once(':').unwrap().1, 16).unwrap();
                ports.push(port);
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// CPU time (user + system) a process has used so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

/// The most memory process `pid` has held resident so far (`VmHWM`), in
/// bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in /proc/{pid}/status"));
    kib << 10
}

/// What hostile peers without the secret may add to a server's peak
/// memory. Before authentication a server holds, per connection, a UCX
/// endpoint and at most a hello (frames of a connection it does not have
/// are refused before their payload is received), and the listener's guard
/// resets what does not finish its handshake; 1,500 connections measured
/// about 5 MiB (3.4 KiB each) on each server. The bound is six times that:
/// what it catches is a buffer per connection that is written (one 64 KiB
/// receive buffer each, filled, would be 94 MiB). `VmHWM` counts resident
/// pages only: a buffer allocated per connection and never touched (a
/// silent peer writes nothing into it; large and zeroed allocations come
/// as untouched pages) does not show, so the silent flood bounds what a
/// connection touches, not what it allocates.
const HOSTILE_PEAK_GROWTH: u64 = 32 << 20;

/// Whether the server ended this connection (EOF or reset) within `within`.
fn ended_by_server(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(_) => return true,
        }
    }
    false
}

/// A well-behaved client's whole workload: a file in and out through the
/// client library, every byte compared.
fn honest_client_round_trip(c: &Up, tag: u64) {
    honest_round_trip_in(&c.d(), tag);
}

/// [`honest_client_round_trip`] for the cluster in directory `d` (for a
/// thread of its own).
fn honest_round_trip_in(d: &str, tag: u64) {
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("in.bin");
    let back = scratch.path().join("out.bin");
    let data = pattern(3_000_000, tag);
    std::fs::write(&src, &data).unwrap();
    let remote = format!("dafne:/honest-{tag}.bin");
    let o = run(&["cp", "--dir", d, src.to_str().unwrap(), &remote]);
    assert!(o.status.success(), "cp in: {}", text(&o));
    let o = run(&["cp", "--dir", d, &remote, back.to_str().unwrap()]);
    assert!(o.status.success(), "cp out: {}", text(&o));
    assert!(std::fs::read(Path::new(&back)).unwrap() == data, "the honest client's bytes differ");
}

/// Issue 10, finding 11: random bytes on a server's port made UCX's async
/// thread spin a core for as long as the socket lived. Every port of every
/// server gets garbage, on connections left open and on connections closed
/// at once (the `> /dev/tcp/...` case).
#[test]
fn garbage_on_every_port_leaves_the_servers_idle_and_serving() {
    let c = Up::start(2);
    let servers = c.servers();
    let peaks: Vec<u64> = servers.iter().map(|(_, p, _)| peak_rss(*p)).collect();
    let mut kept = Vec::new();
    let mut attempts = 0;
    for (name, pid, _) in &servers {
        let ports = listening_ports(*pid);
        assert!(ports.len() >= 2, "{name}: expected the listener and UCX's tcp port, found {ports:?}");
        for port in ports {
            for k in 0..4u64 {
                let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { continue };
                attempts += 1;
                let _ = s.write_all(&pattern(4096, port as u64 * 31 + k));
                if k % 2 == 0 {
                    kept.push((name.clone(), port, s));
                } // else: dropped here, closed right after writing
            }
        }
    }
    assert!(attempts >= 4 * 2 * servers.len(), "only {attempts} hostile connections were made");
    // Every connection left open is ended by the server (UCX itself, or
    // the listener's guard for what UCX's connection manager cannot parse).
    for (name, port, s) in &mut kept {
        assert!(ended_by_server(s, Duration::from_secs(20)), "{name}: a garbage connection on port {port} stays open");
    }
    drop(kept);
    // Then every server is back to idle: at most a quarter of a core over
    // two seconds (before the fix, each spun a whole core: ~2 s of 2 s).
    let before: Vec<Duration> = servers.iter().map(|(_, p, _)| cpu_time(*p)).collect();
    std::thread::sleep(Duration::from_secs(2));
    for ((name, pid, _), b) in servers.iter().zip(before) {
        let used = cpu_time(*pid) - b;
        assert!(used < Duration::from_millis(500), "{name} burnt {used:?} of CPU in 2 s while idle");
        assert!(alive(*pid), "{name} died");
    }
    for ((name, pid, _), before) in servers.iter().zip(&peaks) {
        let grew = peak_rss(*pid).saturating_sub(*before);
        assert!(grew <= HOSTILE_PEAK_GROWTH, "{name}: garbage peers raised its peak memory by {grew} bytes");
    }
    honest_client_round_trip(&c, 1);
    // Nobody was restarted: the same processes served throughout.
    assert_eq!(c.servers(), servers);
}

/// The value `f` settles at: the same for 2 s in a row (at most 30 s).
fn settled(mut f: impl FnMut() -> usize) -> usize {
    let start = Instant::now();
    let (mut last, mut since) = (f(), Instant::now());
    while since.elapsed() < Duration::from_secs(2) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
        let now = f();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

/// A flood of connections that send nothing: each is reset once it is past
/// the handshake deadline, so the servers' descriptors return to what they
/// were, and honest clients are served meanwhile.
#[test]
fn silent_connections_are_reset_and_do_not_pile_up() {
    let c = Up::start(1);
    let servers = c.servers();
    let (_, io_pid, port) = servers.iter().find(|(n, _, _)| n.starts_with("io")).unwrap().clone();
    // Sockets the io server holds (its chunk files come and go with the
    // honest client's work; sockets are what a flood would pile up).
    let fds = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:")))
            .count()
    };
    // The baseline is taken once the server's own connections are made
    // (its heartbeat to meta, the revocation relay and the reclaimer, each
    // with its shared-memory upgrade after login: 9 more sockets than
    // right after start, measured) and an honest client has come and
    // gone: a baseline read at start was below what the server holds
    // idle, and a loaded CI run failed on it.
    honest_client_round_trip(&c, 1);
    let baseline = settled(|| fds(io_pid));
    let mut silent: Vec<TcpStream> = (0..100).filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    assert!(silent.len() >= 90, "only {} connections were accepted", silent.len());
    honest_client_round_trip(&c, 2);
    for s in &mut silent {
        assert!(ended_by_server(s, Duration::from_secs(30)), "a silent connection is never reset");
    }
    drop(silent);
    // The margin covers connections honest peers may open meanwhile (the
    // supervisor's reclaimer connects once the cluster is up): a few, where
    // the flood alone would leave a hundred.
    wait_for("the io server's sockets to return to their baseline", || fds(io_pid) <= baseline + 8);
    assert!(alive(io_pid));
}

/// Issue 10, finding 1: a flood of ~1,500 silent connections to one server.
/// At UCS's default limit of 1,024 async handlers per process, UCX 1.13
/// failed to register the 1,024th accepted socket and took an error path
/// that closed it twice and left a freed endpoint in its list: other
/// descriptors were closed under their owners ("failed to close fd" in
/// the log, hundreds of times) and the server died of SIGSEGV at `dafne
/// down`. Servers now raise the limit (`dafne_ucx::ASYNC_MAX_EVENTS`): the
/// flood on both the metadata server and an io server is reset by the
/// listeners' guard, an honest client is served meanwhile, and the
/// cluster stops cleanly.
#[test]
fn a_flood_of_1500_silent_connections_leaves_the_servers_whole() {
    // 3,000 sockets in this process.
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if lim.current.is_some_and(|c| c < 4096) {
        let raised = rustix::process::Rlimit { current: lim.maximum.map(|m| m.min(8192)), maximum: lim.maximum };
        rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).unwrap();
    }
    let c = Up::start(1);
    let servers = c.servers();
    let peaks: Vec<u64> = servers.iter().map(|(_, p, _)| peak_rss(*p)).collect();
    let mut flood = Vec::new();
    for (name, _, port) in servers.iter().filter(|(n, _, _)| n == "meta" || n == "io-0") {
        let before = flood.len();
        flood.extend((0..1500).filter_map(|_| TcpStream::connect(("127.0.0.1", *port)).ok()));
        assert!(flood.len() - before >= 1400, "{name}: only {} connections were accepted", flood.len() - before);
    }
    honest_client_round_trip(&c, 4);
    for s in &mut flood {
        assert!(ended_by_server(s, Duration::from_secs(60)), "a silent connection is never reset");
    }
    drop(flood);
    // Peak memory while flooded (the honest client's own use included).
    for ((name, pid, _), before) in servers.iter().zip(&peaks) {
        let grew = peak_rss(*pid).saturating_sub(*before);
        assert!(grew <= HOSTILE_PEAK_GROWTH, "{name}: the flood raised its peak memory by {grew} bytes");
    }
    honest_client_round_trip(&c, 5);
    for (name, pid, _) in &servers {
        assert!(alive(*pid), "{name} died");
        let log = std::fs::read_to_string(c.dir.path().join(format!("logs/{name}.log"))).unwrap_or_default();
        assert!(!log.contains("failed to close fd"), "{name}: UCX closed descriptors twice:\n{log}");
    }
    let o = run(&["down", "--dir", &c.d()]);
    assert!(o.status.success(), "the cluster did not stop cleanly after the flood: {}", text(&o));
}

/// The same flood at the descriptor limit most shells give (`ulimit -Sn`
/// 1024; the flood test above runs with this machine's, 20,000 here):
/// UCX's `accept` failed with EMFILE in a loop (2.8 GB of "accept()
/// failed" log in 30 s, most of a core), and the listener's guard, which
/// listed `/proc/self/fd`, could not open it, so the flood was never reset
/// (the server held 1,024 descriptors until the peer left). Servers now
/// raise their soft descriptor limit to the hard one less a reserve of 256
/// (19,744 here, `dafne_ucx::acceptgate`); a flood past the hard limit is
/// the next test.
#[test]
fn a_flood_at_the_usual_descriptor_limit_is_reset_and_floods_no_log() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if lim.current.is_some_and(|c| c < 4096) {
        let raised = rustix::process::Rlimit { current: lim.maximum.map(|m| m.min(8192)), maximum: lim.maximum };
        rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).unwrap();
    }
    let (meta, io) = free_ports(1);
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let exe = dafne().get_program().to_string_lossy().into_owned();
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 1024 && exec {exe} up --dir {d} --io-servers 1 --cache-mib 8 --meta-port {meta} \
             --io-base-port {io}"
        ))
        .env_remove("DAFNE_HOME")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let c = Up { dir, _serial };
    let servers = c.servers();
    let (_, io_pid, io_port) = servers.iter().find(|(n, _, _)| n == "io-0").cloned().unwrap();
    let log = c.dir.path().join("logs/io-0.log");
    let fds = || std::fs::read_dir(format!("/proc/{io_pid}/fd")).map(|d| d.count()).unwrap_or(0);
    let baseline = fds();
    let mut flood: Vec<TcpStream> = (0..1500).filter_map(|_| TcpStream::connect(("127.0.0.1", io_port)).ok()).collect();
    assert!(flood.len() >= 1400, "only {} connections were accepted", flood.len());
    let log_len = || std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while fds() > baseline + 70 && Instant::now() < deadline {
        assert!(log_len() < 16 << 20, "io-0 logged {} bytes under the flood", log_len());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(fds() <= baseline + 70, "io-0 still holds {} descriptors (before: {baseline})", fds());
    for s in &mut flood {
        assert!(ended_by_server(s, Duration::from_secs(20)), "a silent connection is never reset");
    }
    drop(flood);
    assert!(log_len() < 16 << 20, "io-0 logged {} bytes under the flood", log_len());
    honest_client_round_trip(&c, 6);
    assert!(alive(io_pid), "io-0 died");
}

/// Issue 10's last finding: a flood larger than the *hard* descriptor
/// limit (servers run at `ulimit -Hn 1024`, so raising the soft limit
/// gains nothing; 1,500 silent connections each on meta and an io
/// server). Before, the whole table filled: UCX's `accept` failed with
/// EMFILE in a busy loop, logging two lines each time (this test failed on
/// the log bound within a second of the flood), and the guard, which
/// needed a free descriptor to list `/proc/self/fd` and to `dup` a
/// socket, reset nothing. Now the guard opens what it needs before the
/// server listens, stops UCX accepting while fewer than 64 descriptors are
/// free (`dafne_transport::sockguard`), and UCX's `accept` at the soft limit
/// pauses the listener and answers EAGAIN, so UCX logs nothing
/// (`dafne_ucx::acceptgate`). Checked: an honest client
/// copies in and out while the tables are full and again after, each log
/// stays under 1 MiB, the servers are idle once the flood has gone, the
/// same processes serve throughout, and `down` is clean.
#[test]
fn a_flood_past_the_hard_descriptor_limit_is_reset_quietly_and_leaves_the_servers_idle() {
    // 3,000 sockets in this process.
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if lim.current.is_some_and(|c| c < 4096) {
        let raised = rustix::process::Rlimit { current: lim.maximum.map(|m| m.min(8192)), maximum: lim.maximum };
        rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).unwrap();
    }
    const LIMIT: usize = 1024;
    const LOG_BOUND: u64 = 1 << 20;
    let (meta, io) = free_ports(1);
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let exe = dafne().get_program().to_string_lossy().into_owned();
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn {LIMIT} && ulimit -Hn {LIMIT} && exec {exe} up --dir {d} --io-servers 1 --cache-mib 8 \
             --meta-port {meta} --io-base-port {io}"
        ))
        .env_remove("DAFNE_HOME")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let c = Up { dir, _serial };
    let servers = c.servers();
    let flooded: Vec<(String, u32, u16)> =
        servers.iter().filter(|(n, _, _)| n == "meta" || n == "io-0").cloned().collect();
    assert_eq!(flooded.len(), 2);
    for (name, pid, _) in &servers {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        // The soft limit keeps 256 back (`dafne_ucx::acceptgate`).
        assert_eq!((f[3], f[4]), ("768", "1024"), "{name} runs with other limits: {line}");
    }
    let fds = |pid: u32| std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    let log_len = |name: &str| std::fs::metadata(c.dir.path().join(format!("logs/{name}.log"))).map_or(0, |m| m.len());
    let logs_small = || {
        for (name, _, _) in &servers {
            if log_len(name) >= LOG_BOUND {
                let mut head = String::new();
                let f = std::fs::File::open(c.dir.path().join(format!("logs/{name}.log"))).unwrap();
                let _ = f.take(600).read_to_string(&mut head);
                panic!("{name} logged {} bytes under the flood, starting:\n{head}", log_len(name));
            }
        }
    };
    let baselines: Vec<usize> = flooded.iter().map(|(_, p, _)| fds(*p)).collect();
    let cpu_before: Vec<Duration> = flooded.iter().map(|(_, p, _)| cpu_time(*p)).collect();
    let flood_start = Instant::now();
    let mut flood = Vec::new();
    for (name, pid, port) in &flooded {
        let before = flood.len();
        flood.extend((0..1500).filter_map(|_| TcpStream::connect(("127.0.0.1", *port)).ok()));
        assert!(flood.len() - before >= 1400, "{name}: only {} connections were accepted", flood.len() - before);
        // The state this test is about: the table (nearly) full up to the
        // soft limit, 768 (the hard one less the 256 the accept gate keeps
        // back). The guard resets at most 64 sockets a look (1,280 a second)
        // and UCX refills what it frees from the queue, so the table stays
        // this full for about a second.
        wait_for(&format!("{name}'s descriptor table to fill"), || {
            logs_small();
            fds(*pid) >= LIMIT - 256 - 100
        });
    }
    // An honest client while the tables are full, the logs watched
    // meanwhile (before the fix they grew by ~90 MB a second).
    let honest = std::thread::spawn({
        let d = c.d();
        move || honest_round_trip_in(&d, 7)
    });
    let t = Instant::now();
    while !honest.is_finished() {
        logs_small();
        assert!(t.elapsed() < Duration::from_secs(120), "the honest client did not finish during the flood");
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Err(e) = honest.join() {
        std::panic::resume_unwind(e);
    }
    eprintln!("honest client during the flood: {:?}", t.elapsed());
    for s in &mut flood {
        assert!(ended_by_server(s, Duration::from_secs(60)), "a silent connection is never reset");
    }
    drop(flood);
    for ((name, pid, _), baseline) in flooded.iter().zip(&baselines) {
        wait_for(&format!("{name}'s descriptors to return to their baseline"), || {
            logs_small();
            fds(*pid) <= baseline + 70
        });
    }
    for ((name, pid, _), b) in flooded.iter().zip(&cpu_before) {
        eprintln!(
            "{name}: {:?} of CPU from the flood's start to its end ({:?})",
            cpu_time(*pid) - *b,
            flood_start.elapsed()
        );
    }
    honest_client_round_trip(&c, 8);
    // Idle once the flood has gone: no EMFILE loop left behind, and no
    // listener left paused (the second copy above needed it).
    let before: Vec<Duration> = servers.iter().map(|(_, p, _)| cpu_time(*p)).collect();
    let window = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let window = window.elapsed();
    for ((name, pid, _), b) in servers.iter().zip(before) {
        let used = cpu_time(*pid) - b;
        eprintln!("{name}: {used:?} of CPU in {window:?} after the flood");
        assert!(used < window / 4, "{name} burnt {used:?} of CPU in {window:?} after the flood");
        assert!(alive(*pid), "{name} died");
    }
    logs_small();
    for (name, _, _) in &servers {
        let log = std::fs::read_to_string(c.dir.path().join(format!("logs/{name}.log"))).unwrap_or_default();
        assert!(!log.contains("failed to close fd"), "{name}: UCX closed descriptors twice:\n{log}");
        eprintln!("{name}: log {} bytes; its guard said:", log.len());
        for l in log.lines().filter(|l| l.contains("descriptors ran short")) {
            eprintln!("  {l}");
        }
    }
    assert_eq!(c.servers(), servers, "a server was restarted");
    let o = run(&["down", "--dir", &c.d()]);
    if !o.status.success() {
        // The servers' logs go with the test's directory: their last lines
        // say why one did not stop cleanly.
        let logs: String = servers
            .iter()
            .map(|(name, _, _)| {
                let log = std::fs::read_to_string(c.dir.path().join(format!("logs/{name}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
                format!("--- {name}.log (last lines)\n{}\n", tail.join("\n"))
            })
            .collect();
        panic!("the cluster did not stop cleanly after the flood: {}\n{logs}", text(&o));
    }
}

/// Opens `n` connections to `port` and, until `stop`, opens a new one for
/// every one the server ends: a peer that keeps reconnecting. Returns how
/// many it opened in all.
fn reconnecting_flood(port: u16, n: usize, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::sync::atomic::Ordering;
    let connect = || {
        let s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300)).ok()?;
        s.set_nonblocking(true).ok()?;
        Some(s)
    };
    let mut live: Vec<TcpStream> = Vec::new();
    let mut opened = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut buf = [0u8; 64];
        live.retain_mut(|s| match s.read(&mut buf) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
        });
        let mut added = 0;
        while live.len() < n && added < 200 && !stop.load(Ordering::Relaxed) {
            match connect() {
                Some(s) => {
                    live.push(s);
                    opened += 1;
                    added += 1;
                }
                None => break,
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    opened
}

/// One value of `name` (the first sample) on server `server`'s metrics
/// page, from cluster.json.
fn metric(dir: &Path, server: &str, name: &str) -> Option<f64> {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).ok()?).ok()?;
    let addr: std::net::SocketAddr =
        info["metrics"].as_array()?.iter().find(|e| e["server"] == server)?["addr"].as_str()?.parse().ok()?;
    let page = dafne_metrics::http::fetch(addr, Duration::from_secs(5)).ok()?;
    let families = dafne_metrics::parse::parse(&page).ok()?;
    families.iter().find(|f| f.name == name)?.samples.first().map(|s| s.value)
}

/// Review of the change above: a flood that keeps reconnecting (every
/// reset socket opened again at once) past the hard limit refilled the
/// table on every resume, and once UCX's TCP *data* listener met a full
/// table its `accept` failed, UCX 1.13.1 closed that listener for good
/// (clients: "Destination is unreachable"), and meta died of SIGSEGV at
/// `down`. After such a flood every server still listens on every port it
/// listened on, an honest client works, the listener was paused (not left
/// to UCX's EMFILE loop: the refused accepts stay few), and `down` is clean.
#[test]
fn a_reconnecting_flood_past_the_hard_limit_breaks_no_listener() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if lim.current.is_some_and(|c| c < 4096) {
        let raised = rustix::process::Rlimit { current: lim.maximum.map(|m| m.min(8192)), maximum: lim.maximum };
        rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).unwrap();
    }
    const LIMIT: usize = 1024;
    const FLOOD: Duration = Duration::from_secs(15);
    let (meta, io) = free_ports(1);
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let exe = dafne().get_program().to_string_lossy().into_owned();
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn {LIMIT} && ulimit -Hn {LIMIT} && exec {exe} up --dir {d} --io-servers 1 --cache-mib 8 \
             --meta-port {meta} --io-base-port {io}"
        ))
        .env_remove("DAFNE_HOME")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let c = Up { dir, _serial };
    let servers = c.servers();
    let flooded: Vec<(String, u32, u16)> =
        servers.iter().filter(|(n, _, _)| n == "meta" || n == "io-0").cloned().collect();
    assert_eq!(flooded.len(), 2);
    // Every server's ports, the UCX data listener's among them.
    let ports_before: Vec<Vec<u16>> = servers.iter().map(|(_, p, _)| listening_ports(*p)).collect();
    for ((name, _, _), p) in servers.iter().zip(&ports_before) {
        assert!(p.len() >= 2, "{name} listens on {p:?} only");
    }
    honest_client_round_trip(&c, 20);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let floods: Vec<_> = flooded
        .iter()
        .map(|(_, _, port)| {
            let (port, stop) = (*port, stop.clone());
            std::thread::spawn(move || reconnecting_flood(port, 1500, &stop))
        })
        .collect();
    // Honest clients during the flood (their outcome is printed: a flood
    // from one address may still delay them, ARCHITECTURE "Trust").
    let t = Instant::now();
    let mut tag = 21;
    while t.elapsed() < FLOOD {
        let s = Instant::now();
        let d = c.d();
        let r = std::thread::spawn(move || honest_round_trip_in(&d, tag)).join();
        eprintln!(
            "honest client during the flood at {:?}: {} in {:?}",
            s - t,
            if r.is_ok() { "ok" } else { "FAILED" },
            s.elapsed()
        );
        tag += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for ((name, _, _), f) in flooded.iter().zip(floods) {
        eprintln!("{name}: the flood opened {} connections", f.join().unwrap());
    }
    for (name, pid, _) in &servers {
        assert!(alive(*pid), "{name} died under the flood:\n{}", c.log_tails());
    }
    // Once the flood has gone the servers come back: same ports listening.
    let t = Instant::now();
    loop {
        let now: Vec<Vec<u16>> = servers.iter().map(|(_, p, _)| listening_ports(*p)).collect();
        if now == ports_before {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "a listener is gone after the flood: before {ports_before:?}, now {now:?}\n{}",
            c.log_tails()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    honest_client_round_trip(&c, 40);
    honest_client_round_trip(&c, 41);
    // The pause worked: the listener was paused, and UCX was not left
    // calling `accept` on a full table (with the pause a no-op, UCX
    // refused hundreds of thousands in 10 s; review, defect 4).
    for (name, _, _) in &flooded {
        let pauses = metric(c.dir.path(), name, "dafne_transport_listener_pauses_total").unwrap_or(0.0);
        let refused = metric(c.dir.path(), name, "dafne_transport_accepts_refused_total").unwrap_or(f64::NAN);
        let paused = metric(c.dir.path(), name, "dafne_transport_listener_paused").unwrap_or(f64::NAN);
        eprintln!("{name}: listener paused {pauses} time(s), {refused} accept(s) refused, paused now: {paused}");
        assert!(pauses >= 1.0, "{name}'s listener was never paused under the flood");
        assert!(refused < 20_000.0, "{name}: UCX was refused {refused} accepts: the pause did not hold");
        assert_eq!(paused, 0.0, "{name}'s listener is still paused after the flood");
    }
    for (name, _, _) in &servers {
        let log = std::fs::read_to_string(c.dir.path().join(format!("logs/{name}.log"))).unwrap_or_default();
        assert!(!log.contains("failed to close fd"), "{name}: UCX closed descriptors twice:\n{log}");
        eprintln!("{name}: log {} bytes; its guard said:", log.len());
        for l in log.lines().filter(|l| l.contains("port ")) {
            eprintln!("  {}", &l[..l.len().min(400)]);
        }
    }
    assert_eq!(c.servers(), servers, "a server was restarted");
    let o = run(&["down", "--dir", &c.d()]);
    assert!(o.status.success(), "the cluster did not stop cleanly after the flood: {}", text(&o));
}

/// A client with another secret, again and again (a script retrying, or
/// a peer without the secret probing): every server says so in its log,
/// at most once per 10 s, so it cannot flood the log. The io servers did
/// (review); the metadata server logged every refused session.
#[test]
fn refused_sessions_and_logins_are_logged_at_most_once_per_10_s() {
    // Warnings logged whatever the suite runs with (CI: errors only).
    let c = Up::start_logging(1, Some("warn"));
    let info_path = c.dir.path().join("cluster.json");
    let mut info: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&info_path).unwrap()).unwrap();
    let wrong = c.dir.path().join("wrong.secret");
    std::fs::write(&wrong, [7u8; 32]).unwrap();
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    info["secret"] = wrong.display().to_string().into();
    std::fs::write(&info_path, info.to_string()).unwrap();
    let t = Instant::now();
    for _ in 0..8 {
        let o = run(&["status", "--dir", &c.d()]);
        assert!(!o.status.success() && text(&o).contains("refused"), "{}", text(&o));
        // The servers run: the summary says this client's secret is wrong,
        // not that the servers are down (it said "2 of 2 servers are not
        // serving").
        let t = text(&o);
        assert!(!t.contains("servers are not serving") && t.contains("2 of 2 servers refused it"), "{t}");
    }
    assert!(t.elapsed() < Duration::from_secs(10), "too slow to test the rate: {:?}", t.elapsed());
    for (name, needle) in [("meta", "session refused"), ("io-0", "refused a login")] {
        let log = std::fs::read_to_string(c.dir.path().join(format!("logs/{name}.log"))).unwrap_or_default();
        let n = log.matches(needle).count();
        assert!((1..=1).contains(&n), "{name} logged {n} refusals for 8 in under 10 s:\n{log}");
    }
}

/// Issue 10, finding 1: a peer that completes the transport handshake but
/// never logs in held its connection for as long as it pinged. The
/// metadata server and the io servers now drop it once the login deadline
/// has passed (io servers kept such connections forever before the io op
/// `Login`). A data client that logged in and then stays idle keeps its
/// connections.
#[test]
fn a_connection_that_never_logs_in_is_dropped() {
    let c = Up::start(1);
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir.path().join("cluster.json")).unwrap()).unwrap();
    let meta: std::net::SocketAddr = info["meta"].as_str().unwrap().parse().unwrap();
    let io: std::net::SocketAddr = info["io"][0].as_str().unwrap().parse().unwrap();
    let ucx = info["ucx"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| (kv[0].as_str().unwrap().to_string(), kv[1].as_str().unwrap().to_string()))
        .collect();
    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "no-login".into(),
        ucx_config: ucx,
        ..Default::default()
    })
    .unwrap();
    let secret = dafne_auth::Secret::load(std::path::Path::new(info["secret"].as_str().unwrap())).unwrap();
    // An honest data client, idle from here on.
    let honest = dafne_client::data::DataClient::connect(&rt, &[io], &secret).unwrap();
    let start = Instant::now();
    let clients: Vec<_> = [("meta", meta), ("io server", io)]
        .into_iter()
        .map(|(who, addr)| {
            let client = dafne_transport::Client::connect(&rt, addr).unwrap();
            // Without a login every request is refused, but the connection
            // is answered (keepalive pings run underneath the whole time).
            assert!(client.call(vec![0u8; 8]).is_ok(), "the fresh connection to the {who} works");
            (who, client)
        })
        .collect();
    for (who, client) in &clients {
        wait_for(&format!("the {who} to drop the connection that never logged in"), || {
            client.call(vec![0u8; 8]).is_err()
        });
        assert!(start.elapsed() >= Duration::from_secs(5), "dropped before the deadline: {:?}", start.elapsed());
    }
    // Past the deadline, the honest client's first connection still serves.
    let cap = dafne_client::data::info_capability(&secret);
    futures::executor::block_on(honest.server_info(0, cap)).unwrap();
    assert_eq!(honest.reconnects(), 0, "the idle, logged-in data client lost its connection");
}

/// Issue 10, finding 7: a panic on a server's event-loop thread left a
/// process that was alive but served nothing, which the supervisor never
/// restarted. Now the panic aborts the process, the supervisor restarts
/// it, and it serves again.
#[test]
fn a_panicking_handler_takes_its_server_down_and_it_is_restarted() {
    let scratch = tempfile::tempdir().unwrap();
    let flag = scratch.path().join("panic-once");
    std::fs::write(&flag, b"").unwrap();
    let (meta, io) = free_ports(1);
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let (m, i) = (meta.to_string(), io.to_string());
    let o = dafne()
        .env("DAFNE_FAULT_PANIC_ONCE", &flag)
        .args(["up", "--dir", &d, "--io-servers", "1", "--cache-mib", "8", "--meta-port", &m, "--io-base-port", &i])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let c = Up { dir, _serial };
    let victim = c.servers().iter().find(|s| s.0 == "io-0").unwrap().1;
    // `status` asks the io server for ServerInfo: its handler panics.
    let _ = run(&["status", "--dir", &c.d()]);
    assert!(!flag.exists(), "the io server never ran the panicking handler");
    wait_for("the panicked io server to be restarted", || {
        c.servers().iter().any(|s| s.0 == "io-0" && s.1 != victim) && !alive(victim)
    });
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir.path().join("servers.json")).unwrap()).unwrap();
    let io0 = v.as_array().unwrap().iter().find(|s| s["name"] == "io-0").unwrap();
    assert!(io0["last_exit"].as_str().unwrap_or("").contains("SIGABRT"), "{io0}");
    let log = std::fs::read_to_string(c.dir.path().join("logs/io-0.log")).unwrap();
    assert!(log.contains("injected fault") && log.contains("aborting"), "{log}");
    wait_for("the restarted io server to answer", || {
        let o = run(&["status", "--dir", &c.d(), "--json"]);
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        o.status.success() && s["io"][0]["error"].is_null()
    });
    honest_client_round_trip(&c, 3);
}

// ---------------------------------------------------------------------
// Issue 10, finding 5: capabilities that are forged, expired or revoked.
// ---------------------------------------------------------------------

/// What `cluster.json` tells a client.
#[derive(serde::Deserialize)]
struct Info {
    meta: std::net::SocketAddr,
    io: Vec<std::net::SocketAddr>,
    secret: std::path::PathBuf,
    ucx: Vec<(String, String)>,
}

/// Clients of one cluster on one runtime.
struct Clients {
    rt: dafne_transport::Runtime,
    info: Info,
    secret: dafne_auth::Secret,
}

impl Clients {
    fn new(c: &Up) -> Clients {
        let info: Info =
            serde_json::from_str(&std::fs::read_to_string(c.dir.path().join("cluster.json")).unwrap()).unwrap();
        let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
            name: "caps".into(),
            ucx_config: info.ucx.clone(),
            ..Default::default()
        })
        .unwrap();
        let secret = dafne_auth::Secret::load(&info.secret).unwrap();
        Clients { rt, info, secret }
    }

    /// A well-behaved client acting as `uid`/`gid`: a session and a data
    /// client that go together.
    fn fs(&self, uid: u32, gid: u32) -> dafne_client::file::Fs {
        let meta =
            dafne_client::MetaSession::connect(&self.rt, self.info.meta, &self.secret, "caps-test", uid, gid).unwrap();
        dafne_client::file::Fs::new(meta, self.raw())
    }

    /// A raw data client: connections to the io servers and nothing else;
    /// whatever capability it is handed, it sends as it is.
    fn raw(&self) -> dafne_client::data::DataClient {
        dafne_client::data::DataClient::connect(&self.rt, &self.info.io, &self.secret).unwrap()
    }
}

/// Starts a cluster of 2 io servers, files striped over both, deleted
/// files' data reclaimed 1 s after the unlink.
fn up_reclaiming(io_servers: u16) -> Up {
    let (meta, io) = free_ports(io_servers);
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("caps.toml");
    std::fs::write(
        &cfg,
        format!(
            "[cluster]\nio_servers = {io_servers}\nreclaim_after_s = 1\nmeta_port = {meta}\nio_base_port = {io}\n\
             [meta]\nstripe_count = {io_servers}\nopen_grace_s = 2\n[io]\ncache_mib = 8\n"
        ),
    )
    .unwrap();
    let d = dir.path().display().to_string();
    let o = run(&["up", "--dir", &d, "--config", cfg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    Up { dir, _serial }
}

/// The object files of an open file on the io servers.
fn object_files(c: &Up, f: &dafne_client::OpenFile) -> Vec<std::path::PathBuf> {
    f.layout.servers.iter().map(|s| c.dir.path().join(format!("io-{s}/objects/{:016x}", f.layout.object_id))).collect()
}

fn write(
    d: &dafne_client::data::DataClient,
    f: &dafne_client::OpenFile,
    at: u64,
    data: &[u8],
) -> Result<usize, dafne_proto::Errno> {
    futures::executor::block_on(d.write_at(f, at, data, dafne_proto::io::Stability::FileSync))
}

fn read(
    d: &dafne_client::data::DataClient,
    f: &dafne_client::OpenFile,
    at: u64,
    len: usize,
) -> Result<Vec<u8>, dafne_proto::Errno> {
    let mut b = vec![0u8; len];
    let n = futures::executor::block_on(d.read_at(f, at, &mut b))?;
    b.truncate(n);
    Ok(b)
}

/// A file `name` in the root, mode `mode`, owned by root, holding `data`.
fn root_file(fs: &dafne_client::file::Fs, name: &[u8], mode: u32, data: &[u8]) -> u64 {
    let f = fs.create(fs.meta.root(), name, mode, None).unwrap();
    f.write_at(0, data, dafne_proto::io::Stability::FileSync).unwrap();
    let ino = f.attr().ino;
    f.close().unwrap();
    ino
}

/// A forged capability (its MAC does not match: rights raised, object
/// changed, bytes flipped) and an expired one (genuinely signed, but
/// before its hour) are refused by every io server, and the file is as
/// it was.
#[test]
fn forged_and_expired_capabilities_are_refused() {
    let c = up_reclaiming(2);
    let cl = Clients::new(&c);
    let root = cl.fs(0, 0);
    let data = pattern(2 << 20, 20);
    let ino = root_file(&root, b"target", 0o644, &data);
    let reader = root.meta.open(ino, dafne_proto::OPEN_READ).unwrap();
    let raw = cl.raw();
    let junk = pattern(4096, 21);
    // Rights raised without the secret.
    let mut f = reader.clone();
    f.cap.rights |= dafne_proto::RIGHT_WRITE;
    assert_eq!(write(&raw, &f, 0, &junk), Err(dafne_proto::Errno::EACCES), "a read capability raised to write");
    // The MAC itself tampered with.
    let mut f = reader.clone();
    f.cap.mac[0] ^= 1;
    assert_eq!(read(&raw, &f, 0, 4096), Err(dafne_proto::Errno::EACCES), "a capability with a bad MAC");
    // Another object named under this MAC.
    let mut f = reader.clone();
    f.cap.object_id += 1;
    assert_eq!(read(&raw, &f, 0, 4096), Err(dafne_proto::Errno::EACCES), "a capability moved to another object");
    // Expired: signed with the real secret, two hours ago.
    let mut f = reader.clone();
    f.cap.rights |= dafne_proto::RIGHT_WRITE;
    cl.secret.sign(&mut f.cap, std::time::SystemTime::now() - 2 * dafne_auth::CAP_LIFETIME);
    assert_eq!(write(&raw, &f, 0, &junk), Err(dafne_proto::Errno::EACCES), "an expired capability");
    // The genuine one still reads, and the bytes are untouched.
    assert!(read(&raw, &reader, 0, data.len()).unwrap() == data, "the file changed");
    root.meta.close(reader.layout.object_id).unwrap();
    honest_client_round_trip(&c, 20);
}

/// A capability taken before a chmod (or chown) that removed the holder's
/// rights is refused once that client no longer holds an open of the file;
/// a client that opened the file before the chmod and still holds its
/// open keeps reading and writing (POSIX).
#[test]
fn a_capability_revoked_by_chmod_is_refused() {
    let c = up_reclaiming(2);
    let cl = Clients::new(&c);
    let root = cl.fs(0, 0);
    let data = pattern(1 << 20, 30);
    let ino = root_file(&root, b"shared", 0o666, &data);
    // A witness deleted now: once its data is gone, meta's start-up grace
    // (when every re-announced open is believed) is over.
    let witness = root.open(root_file(&root, b"witness", 0o644, &data), dafne_proto::OPEN_READ).unwrap();
    let witness_files = object_files(&c, witness.handle());
    drop(witness);
    root.meta.unlink(root.meta.root(), b"witness").unwrap();
    // The attacker opens while it may, keeps the capability, closes.
    let attacker = cl.fs(1000, 1000);
    let stolen = attacker.meta.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    attacker.meta.close(stolen.layout.object_id).unwrap();
    // A well-behaved user opens before the chmod and keeps its open.
    let user = cl.fs(1001, 1001);
    let held = user.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    root.meta.setattr(ino, dafne_proto::SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    assert_eq!(
        attacker.meta.open(ino, dafne_proto::OPEN_READ).map(|_| ()),
        Err(dafne_proto::Errno::EACCES),
        "meta itself refuses a new open"
    );
    let raw = cl.raw();
    let same = &data[..4096];
    // Both halves of the stripe refuse it, for reading and writing. Each
    // io server hears of the revocation on its own (its relay polls meta),
    // so the wait covers both (CI once saw the second still accept a write
    // right after the first refused).
    wait_for("the io servers to refuse the capability taken before the chmod", || {
        [0u64, 1 << 20, 3 << 20]
            .iter()
            .all(|&at| write(&raw, &stolen, at, same).is_err() && read(&raw, &stolen, at, 4096).is_err())
    });
    for at in [0u64, 1 << 20, 3 << 20] {
        assert_eq!(write(&raw, &stolen, at, same), Err(dafne_proto::Errno::ESTALE), "write at {at}");
        assert!(read(&raw, &stolen, at, 10).is_err(), "read at {at}");
    }
    // Meta re-issues it to no session without an open taken before the
    // chmod: not the attacker's, not even after it claims an open it never
    // had (once the start-up grace, when claims are believed, is over).
    assert_eq!(attacker.meta.recap(stolen.cap), Err(dafne_proto::Errno::EACCES), "recap without an open");
    wait_for("the reclaimer to have had a round past meta's start-up grace", || {
        witness_files.iter().all(|p| !p.exists())
    });
    let claim = dafne_proto::HeldOpen { object_id: stolen.layout.object_id, count: 1 };
    futures::executor::block_on(attacker.meta.request_async(dafne_proto::Request::Reopen { held: vec![claim] }))
        .unwrap();
    assert_eq!(attacker.meta.recap(stolen.cap), Err(dafne_proto::Errno::EACCES), "recap on a claimed open");
    assert_eq!(write(&raw, &stolen, 0, same), Err(dafne_proto::Errno::ESTALE));
    // The open taken before the chmod keeps working.
    let more = pattern(3 << 20, 31);
    held.write_at(1 << 20, &more, dafne_proto::io::Stability::FileSync).unwrap();
    let mut back = vec![0u8; more.len()];
    assert_eq!(held.read_at(1 << 20, &mut back).unwrap(), more.len());
    assert!(back == more, "the holder's bytes differ");
    // Closed in meta (without publishing a size, which user 1001 may no
    // longer set).
    drop(held);
    // chown revokes too.
    let owner = cl.fs(1002, 1002);
    root.meta.setattr(ino, dafne_proto::SetAttr { mode: Some(0o666), ..Default::default() }).unwrap();
    let before_chown = owner.meta.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    owner.meta.close(before_chown.layout.object_id).unwrap();
    root.meta.setattr(ino, dafne_proto::SetAttr { uid: Some(0), mode: Some(0o600), ..Default::default() }).unwrap();
    wait_for("the io servers to refuse the capability taken before the chown", || {
        write(&raw, &before_chown, 0, same).is_err()
    });
    let back = read(&root.data, &root.meta.open(ino, dafne_proto::OPEN_READ).unwrap(), 0, 1 << 20).unwrap();
    assert!(back == data, "the file's first MiB changed");
    honest_client_round_trip(&c, 30);
}

/// Found by review (issue 10): revoking a credential ended its sessions
/// in meta, but the capabilities they had been issued stayed good on the
/// io servers for the rest of their hour: a client whose credential was
/// revoked went on reading and writing every file it had opened, and the
/// io servers were never told. Now a revocation revokes every capability
/// issued before it; a fully trusted client that holds an open gets its
/// capability re-issued (`Recap`) and carries on, the revoked client
/// cannot (its session is gone).
#[test]
fn a_revoked_credentials_capabilities_are_refused_by_the_io_servers() {
    let c = up_reclaiming(2);
    let cl = Clients::new(&c);
    let root = cl.fs(0, 0);
    let data = pattern(2 << 20, 40);
    let ino = root_file(&root, b"shared", 0o666, &data);
    let cred = c.dir.path().join("mallory.cred");
    let o = run(&["credential", "issue", "mallory", "--uid", "1000", "--gid", "1000", "--dir", &c.d(), "-o"]
        .into_iter()
        .chain([cred.to_str().unwrap()])
        .collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o));
    let key: dafne_auth::LoginKey = dafne_auth::CredentialFile::load(&cred).unwrap().into();
    let mallory = dafne_client::MetaSession::connect(&cl.rt, cl.info.meta, &key, "mallory", 1000, 1000).unwrap();
    let raw = dafne_client::data::DataClient::connect(&cl.rt, &cl.info.io, &key).unwrap();
    let stolen = mallory.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    assert!(read(&raw, &stolen, 0, 4096).unwrap() == data[..4096], "the credential's own read");
    // A trusted user holds an open across the revocation.
    let user = cl.fs(1001, 1001);
    let held = user.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    let o = run(&["credential", "revoke", "mallory", "--dir", &c.d()]);
    assert!(o.status.success(), "{}", text(&o));
    let junk = pattern(4096, 41);
    wait_for("the io servers to refuse the revoked credential's capability", || {
        read(&raw, &stolen, 0, 4096).is_err() && read(&raw, &stolen, 1 << 20, 4096).is_err()
    });
    for at in [0u64, 1 << 20] {
        assert_eq!(write(&raw, &stolen, at, &junk), Err(dafne_proto::Errno::ESTALE), "write at {at}");
    }
    assert!(mallory.recap(stolen.cap).is_err(), "meta re-issued a capability to a revoked credential");
    // The trusted holder carries on (its data client re-obtains the
    // capability), and the file is untouched by the revoked client.
    let mut back = vec![0u8; data.len()];
    assert_eq!(held.read_at(0, &mut back).unwrap(), data.len());
    assert!(back == data, "the file changed");
    let more = pattern(1 << 20, 42);
    held.write_at(1 << 20, &more, dafne_proto::io::Stability::FileSync).unwrap();
    drop(held);
    honest_client_round_trip(&c, 40);
}

/// A write capability taken before a truncate is refused afterwards to a
/// client without an open: it cannot put back bytes the truncate cut.
#[test]
fn a_capability_revoked_by_truncate_is_refused() {
    let c = up_reclaiming(2);
    let cl = Clients::new(&c);
    let root = cl.fs(0, 0);
    let data = pattern(4 << 20, 40);
    let ino = root_file(&root, b"cut", 0o666, &data);
    let attacker = cl.fs(1000, 1000);
    let stale = attacker.meta.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    attacker.meta.close(stale.layout.object_id).unwrap();
    let f = root.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    f.truncate(1000).unwrap();
    f.close().unwrap();
    let raw = cl.raw();
    let junk = pattern(4096, 41);
    wait_for("the io servers to refuse the capability taken before the truncate", || {
        write(&raw, &stale, 2 << 20, &junk).is_err()
    });
    assert!(read(&raw, &stale, 0, 10).is_err(), "a stale read capability");
    let now = root.open(ino, dafne_proto::OPEN_READ).unwrap();
    assert_eq!(now.attr().size, 1000, "the truncated size");
    let mut back = vec![0u8; 1000];
    assert_eq!(now.read_at(0, &mut back).unwrap(), 1000);
    assert!(back[..] == data[..1000]);
    drop(now);
    honest_client_round_trip(&c, 40);
}

/// After an unlink and the reclaim of the file's data, a stale write
/// capability neither reads nor writes, and the object does not come back
/// on any io server's disk (before, the write re-created it and nothing
/// ever removed it again).
#[test]
fn a_stale_write_capability_after_reclaim_does_not_recreate_the_object() {
    let c = up_reclaiming(2);
    let cl = Clients::new(&c);
    let root = cl.fs(0, 0);
    let data = pattern(3 << 20, 50);
    let ino = root_file(&root, b"doomed", 0o666, &data);
    let attacker = cl.fs(1000, 1000);
    let stale = attacker.meta.open(ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap();
    attacker.meta.close(stale.layout.object_id).unwrap();
    let files = object_files(&c, &stale);
    assert_eq!(files.len(), 2);
    for p in &files {
        assert!(p.exists(), "{}", p.display());
    }
    root.meta.unlink(root.meta.root(), b"doomed").unwrap();
    wait_for("the reclaimer to remove the unlinked file's data", || files.iter().all(|p| !p.exists()));
    let raw = cl.raw();
    let junk = pattern(2 << 20, 51);
    assert!(write(&raw, &stale, 0, &junk).is_err(), "a write with a capability of a reclaimed object");
    assert!(read(&raw, &stale, 0, 10).is_err(), "a read with a capability of a reclaimed object");
    assert!(futures::executor::block_on(raw.truncate(&stale, 1 << 30)).is_err(), "a truncate of a reclaimed object");
    for p in &files {
        assert!(!p.exists(), "{} was re-created by a stale capability", p.display());
    }
    honest_client_round_trip(&c, 50);
}

// ---------------------------------------------------------------------
// Issue 10, finding 3: frames copied from a logged-in connection.
// ---------------------------------------------------------------------

/// Sends raw frames `(header, payload)` to the server at `addr` from an
/// endpoint of a fresh UCX worker (not a dafne connection: what a peer
/// that copied frames off the wire has), then lets them leave.
fn send_raw(c: &Clients, addr: std::net::SocketAddr, frames: &[(Vec<u8>, Vec<u8>)]) {
    let ctx =
        dafne_ucx::Context::new(&dafne_ucx::ContextOptions { name: "wiretap".into(), config: c.info.ucx.clone() })
            .unwrap();
    let worker = dafne_ucx::Worker::new(&ctx).unwrap();
    let ep = worker.connect_sockaddr(addr).unwrap();
    let mut ops = Vec::new();
    for (h, p) in frames {
        ops.push(ep.am_send(dafne_transport::frame::AM_ID, h.clone(), p.clone(), false).unwrap());
    }
    ops.push(ep.flush().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while ops.iter().any(|o| o.poll_done().is_none()) && Instant::now() < deadline {
        worker.progress();
    }
    assert!(ops.iter().all(|o| o.poll_done().is_some()), "the raw frames did not leave");
    // Time for the server to act on them.
    let linger = Instant::now() + Duration::from_millis(500);
    while Instant::now() < linger {
        worker.progress();
    }
}

/// An honest metadata session, the transport connection under it, and a
/// way to encode requests for it.
fn victim(c: &Clients) -> (dafne_client::MetaSession, dafne_transport::Client) {
    let s = dafne_client::MetaSession::connect(&c.rt, c.info.meta, &c.secret, "victim", 0, 0).unwrap();
    let t = s.transport().unwrap();
    (s, t)
}

fn meta_request(req: &dafne_proto::Request) -> Vec<u8> {
    dafne_proto::encode_request(dafne_proto::Envelope::new(0, 0, 0), req)
}

fn exists(s: &dafne_client::MetaSession, name: &[u8]) -> bool {
    match s.request(dafne_proto::Request::Lookup { parent: s.root(), name: name.to_vec() }) {
        Ok(_) => true,
        Err(dafne_proto::Errno::ENOENT) => false,
        Err(e) => panic!("lookup {:?}: {e}", String::from_utf8_lossy(name)),
    }
}

fn mkdir(s: &dafne_client::MetaSession, name: &[u8]) {
    s.request(dafne_proto::Request::Mkdir { parent: s.root(), name: name.to_vec(), mode: 0o755 }).unwrap();
}

/// The honest session still works on its first connection.
fn still_serving(s: &dafne_client::MetaSession) {
    s.request(dafne_proto::Request::GetAttr { ino: s.root() }).unwrap();
    assert_eq!(s.reconnects(), 0, "the honest session lost its connection");
}

/// A peer that learned a logged-in connection's id and token (they travel
/// in every frame) sends a request and a goodbye with them from its own
/// endpoint: both were served before (the request ran as the victim's
/// session, the goodbye closed it). Now neither has a valid tag.
#[test]
fn frames_with_a_stolen_token_from_another_endpoint_are_refused() {
    let up = Up::start(1);
    let c = Clients::new(&up);
    let (s, t) = victim(&c);
    let (conn_id, token) = (t.conn_id(), t.token());
    assert_ne!(conn_id, 0);
    let header = |kind, len: usize| {
        let mut h = dafne_transport::frame::FrameHeader::new(kind);
        h.conn_id = conn_id;
        h.token = token;
        h.corr = 1 << 40;
        h.payload_len = len as u32;
        h.encode().to_vec()
    };
    let inject =
        meta_request(&dafne_proto::Request::Mkdir { parent: s.root(), name: b"injected".to_vec(), mode: 0o777 });
    let frames = vec![
        (header(dafne_transport::frame::FrameKind::Request, inject.len()), inject),
        (header(dafne_transport::frame::FrameKind::Bye, 0), Vec::new()),
    ];
    send_raw(&c, c.info.meta, &frames);
    assert!(!exists(&s, b"injected"), "a request with a stolen token was served");
    still_serving(&s);
}

/// A frame copied off the wire with its valid tag, sent again: refused.
#[test]
fn a_replayed_frame_is_refused() {
    let up = Up::start(1);
    let c = Clients::new(&up);
    let (s, t) = victim(&c);
    mkdir(&s, b"r");
    let frame =
        t.forge_request(meta_request(&dafne_proto::Request::Rmdir { parent: s.root(), name: b"r".to_vec() })).unwrap();
    // The first copy is the one the client would have sent: it is served.
    send_raw(&c, c.info.meta, std::slice::from_ref(&frame));
    wait_for("the genuine frame to be served", || !exists(&s, b"r"));
    mkdir(&s, b"r");
    send_raw(&c, c.info.meta, std::slice::from_ref(&frame));
    assert!(exists(&s, b"r"), "the replayed frame was served again");
    still_serving(&s);
}

/// A copied frame whose payload was changed in flight: refused.
#[test]
fn a_frame_with_a_tampered_payload_is_refused() {
    let up = Up::start(1);
    let c = Clients::new(&up);
    let (s, t) = victim(&c);
    mkdir(&s, b"s");
    mkdir(&s, b"t");
    let (h, p) =
        t.forge_request(meta_request(&dafne_proto::Request::Rmdir { parent: s.root(), name: b"s".to_vec() })).unwrap();
    let at = p.iter().rposition(|&b| b == b's').unwrap();
    let mut tampered = p.clone();
    tampered[at] = b't';
    send_raw(&c, c.info.meta, &[(h.clone(), tampered)]);
    assert!(exists(&s, b"t"), "a tampered frame was served");
    // The untouched frame goes through: the refusal was the tag's.
    send_raw(&c, c.info.meta, &[(h, p)]);
    wait_for("the genuine frame to be served", || !exists(&s, b"s"));
    still_serving(&s);
}

/// The io servers' counters from `dafne status --json`, one object each.
fn io_info(c: &Up) -> Vec<serde_json::Value> {
    let o = run(&["status", "--dir", &c.d(), "--json"]);
    assert!(o.status.success(), "dafne status: {}\n{}", text(&o), c.log_tails());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["io"].as_array().unwrap().iter().map(|s| s["info"].clone()).collect()
}

/// [`io_info`], or `None` (reported on stderr) when `dafne status` did not
/// reach every server.
fn try_io_info(c: &Up) -> Option<Vec<serde_json::Value>> {
    let o = run(&["status", "--dir", &c.d(), "--json"]);
    if !o.status.success() {
        eprintln!("dafne status failed (retrying): {}", text(&o));
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    Some(v["io"].as_array()?.iter().map(|s| s["info"].clone()).collect())
}

fn io_sum(c: &Up, field: &str) -> u64 {
    io_info(c).iter().map(|i| i[field].as_u64().unwrap_or_else(|| panic!("no {field} in {i}"))).sum()
}

/// Bytes process `pid` has read and written through system calls
/// (`/proc/PID/io`): how far a `dafne cp` got.
fn io_bytes(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    s.lines()
        .filter(|l| l.starts_with("rchar:") || l.starts_with("wchar:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Found by trying (issue 10, "a slow client holding units"): a `dafne cp`
/// stopped in the middle (`kill -STOP`) and then killed left every RMA
/// operation the io servers had posted to it pending for good (UCX 1.13
/// emulates RMA to a process's ordinary memory over messages that process
/// must answer, and on one host nothing tells UCX the process died); each
/// held a cache unit, which the Unifier then had to retire. Three rounds
/// retired every unit of two 8 MiB caches, and every later copy failed
/// with EAGAIN. Now the servers refuse keys that need the client's help
/// on one host and the client library's buffers are memory the servers
/// reach directly: nothing is retired and an honest copy succeeds.
#[test]
fn clients_stopped_and_killed_mid_copy_leave_the_io_caches_whole() {
    let c = Up::start(2);
    let scratch = tempfile::tempdir().unwrap();
    let src = scratch.path().join("src.bin");
    let data = pattern(128 << 20, 11);
    std::fs::write(&src, &data).unwrap();
    let src = src.to_str().unwrap();
    let o = run(&["cp", "--dir", &c.d(), src, "dafne:/data"]);
    assert!(o.status.success(), "cp in: {}", text(&o));
    for round in 0..4 {
        let to = format!("dafne:/up-{round}");
        let (from, to) = if round % 2 == 0 { ("dafne:/data", "/dev/null") } else { (src, to.as_str()) };
        let mut child = dafne()
            .args(["cp", "-f", "--dir", &c.d(), from, to])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Stop it once it is moving data (a few of its 8 MiB buffers): the
        // copy takes a fraction of a second, so this polls every 1 ms.
        let start = Instant::now();
        while io_bytes(pid) < 24 << 20 {
            // (Before the fix, from the second round on, the copy failed
            // at once here: EAGAIN, its cache units lost to round one.)
            if let Some(status) = child.try_wait().unwrap() {
                panic!("round {round}: the copy ended ({status}) before it moved 24 MiB: {:?}", io_info(&c));
            }
            assert!(start.elapsed() < Duration::from_secs(30), "round {round}: the copy did not start");
            std::thread::sleep(Duration::from_millis(1));
        }
        let stopped = std::process::Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
        assert!(stopped.success());
        assert!(child.try_wait().unwrap().is_none(), "round {round}: the copy ended before it was stopped");
        // A while stopped with requests in flight, then killed.
        std::thread::sleep(Duration::from_millis(500));
        child.kill().unwrap();
        child.wait().unwrap();
        // (Each server counts the status request it is answering. A status
        // that could not reach a server counts as not yet: the servers
        // must answer again within the wait, and `io_info` below insists.)
        wait_for("the dead client's requests to end", || {
            try_io_info(&c).is_some_and(|v| v.iter().all(|i| i["requests_in_flight"].as_u64() <= Some(1)))
        });
    }
    assert_eq!(io_sum(&c, "retired_units"), 0, "cache units lost to dead clients: {:?}", io_info(&c));
    let back = scratch.path().join("back.bin");
    let o = run(&["cp", "--dir", &c.d(), src, "dafne:/after"]);
    assert!(o.status.success(), "an honest copy in after the killed ones: {}", text(&o));
    let o = run(&["cp", "--dir", &c.d(), "dafne:/after", back.to_str().unwrap()]);
    assert!(o.status.success(), "an honest copy out: {}", text(&o));
    assert!(std::fs::read(&back).unwrap() == data, "the honest client's bytes differ");
}

// ---------------------------------------------------------------------
// Issue 10, last finding: UCX shared memory trusts the peer.
// ---------------------------------------------------------------------

/// Peers on this host whose UCX shared-memory FIFO is larger than the
/// servers' (1024 elements against 256: UCX sizes the peer's FIFO with its
/// own setting, which travels nowhere) call every server, without a login
/// and with one. When servers offered shared memory to any peer on this
/// host, such a peer left a server's loop spinning for good and answering
/// nobody (`dafne_transport` `server` module docs; the transport's tests
/// measure it). Now a peer without the login talks TCP, and a logged-in
/// one whose settings differ stays on TCP: the servers are idle once the
/// peers are gone, the same processes serve throughout, and an honest
/// client's bytes come back whole.
#[test]
fn peers_with_another_shm_fifo_size_leave_the_servers_idle_and_serving() {
    let up = Up::start(1);
    let c = Clients::new(&up);
    let servers = up.servers();
    let mut ucx: Vec<(String, String)> = c.info.ucx.iter().filter(|(k, _)| k != "MM_FIFO_SIZE").cloned().collect();
    ucx.push(("MM_FIFO_SIZE".into(), "1024".into()));
    {
        let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
            name: "odd-fifo".into(),
            ucx_config: ucx,
            call_timeout: Duration::from_secs(5),
            ..Default::default()
        })
        .unwrap();
        let mut answered = 0;
        for addr in std::iter::once(c.info.meta).chain(c.info.io.iter().copied()) {
            let t = dafne_transport::Client::connect(&rt, addr).unwrap();
            // Enough calls to go round a 256-element FIFO many times; the
            // answers are refusals (no session), or the server cuts the
            // connection: either ends it.
            'flood: for _ in 0..40 {
                let req = meta_request(&dafne_proto::Request::GetAttr { ino: 1 });
                let futs: Vec<_> = (0..50).map(|_| t.call_async(req.clone())).collect();
                for f in futs {
                    if futures::executor::block_on(f).is_err() {
                        break 'flood;
                    }
                    answered += 1;
                }
            }
        }
        assert!(answered >= 500, "only {answered} calls of the peer without a login were answered");
        // With the secret: a session whose every request is answered.
        let s = dafne_client::MetaSession::connect(&rt, c.info.meta, &c.secret, "odd-fifo", 0, 0).unwrap();
        for i in 0..1500 {
            s.request(dafne_proto::Request::GetAttr { ino: s.root() }).unwrap_or_else(|e| panic!("call {i}: {e}"));
        }
        let t = s.transport().unwrap();
        let info = t.data_path_info().unwrap();
        assert!(!info.contains("posix") && !info.contains("sysv"), "shared memory with another FIFO size: {info}");
    }
    let before: Vec<Duration> = servers.iter().map(|(_, p, _)| cpu_time(*p)).collect();
    std::thread::sleep(Duration::from_secs(2));
    for ((name, pid, _), b) in servers.iter().zip(before) {
        let used = cpu_time(*pid) - b;
        assert!(used < Duration::from_millis(500), "{name} burnt {used:?} of CPU in 2 s after the peers left");
    }
    honest_client_round_trip(&up, 60);
    // An honest session with the cluster's settings is moved to shared
    // memory by its login (the data path keeps its speed).
    let s = dafne_client::MetaSession::connect(&c.rt, c.info.meta, &c.secret, "honest", 0, 0).unwrap();
    s.request(dafne_proto::Request::GetAttr { ino: s.root() }).unwrap();
    let t = s.transport().unwrap();
    wait_for("the honest session to move to shared memory", || {
        let info = t.data_path_info().unwrap();
        info.contains("posix") || info.contains("sysv")
    });
    s.request(dafne_proto::Request::GetAttr { ino: s.root() }).unwrap();
    assert_eq!(up.servers(), servers, "a server was restarted");
}
