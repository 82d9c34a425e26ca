//! Every server of a `dafne up` cluster exports its counters in the
//! Prometheus text format on a metrics port of its own: the counts match
//! what a client did, the pages parse, `dafne status --metrics` gathers
//! them, a restarted server keeps its port (or, if something took it
//! meanwhile, serves on with another that status names), and hostile
//! peers on the port (garbage, a request never finished, more connections
//! than it serves) do not stop it.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::{p, Cluster};
use common::{dafne, free_ports, pattern, text, wait_for};

/// One sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// A tiny, independent checker of the text format: every line is a
/// `# HELP`/`# TYPE`/comment or a sample `name{k="v",...} value`, every
/// sample's name has a TYPE line before it, no TYPE twice, counters end in
/// `_total`. Returns the samples.
fn check_page(page: &str) -> Vec<Sample> {
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    for (n, line) in page.lines().enumerate() {
        let at = format!("line {}: {line:?}", n + 1);
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("{at}"));
            assert!(["counter", "gauge"].contains(&kind), "{at}");
            assert_eq!(kind == "counter", name.ends_with("_total"), "{at}: counters and only they end in _total");
            assert!(typed.insert(name.to_string(), kind.to_string()).is_none(), "{at}: TYPE twice");
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{at}: no value"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{at}: value"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').unwrap_or_else(|| panic!("{at}: labels"))),
            None => (series, ""),
        };
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{at}: name"
        );
        assert!(typed.contains_key(name), "{at}: no TYPE for {name}");
        let mut map = BTreeMap::new();
        // dafne's label values hold no commas or quotes.
        for kv in labels.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("{at}: label {kv}"));
            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or_else(|| panic!("{at}: quotes"));
            assert!(map.insert(k.to_string(), v.to_string()).is_none(), "{at}: label twice");
        }
        out.push((name.to_string(), map, value));
    }
    assert!(!out.is_empty(), "an empty page");
    out
}

/// The sum of `name`'s samples whose labels include `want`.
fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| n == name && want.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, _, v)| v)
        .sum()
}

/// `GET /metrics` by hand: status line and body.
fn get(addr: SocketAddr) -> Result<(String, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(|e| e.to_string())?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(|| format!("no head in {raw:?}"))?;
    Ok((head.lines().next().unwrap_or("").to_string(), body.to_string()))
}

fn page(addr: SocketAddr) -> String {
    let (status, body) = get(addr).unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    body
}

/// `server name → metrics address`, from cluster.json.
fn endpoints(dir: &Path) -> BTreeMap<String, SocketAddr> {
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    info["metrics"]
        .as_array()
        .expect("cluster.json lists the metrics ports")
        .iter()
        .map(|m| (m["server"].as_str().unwrap().to_string(), m["addr"].as_str().unwrap().parse().unwrap()))
        .collect()
}

/// A client of the cluster in `dir` (through `cluster.json`).
fn connect(dir: &Path) -> (dafne_transport::Runtime, dafne_client::file::Fs) {
    #[derive(serde::Deserialize)]
    struct Info {
        meta: SocketAddr,
        io: Vec<SocketAddr>,
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
    let meta = dafne_client::MetaSession::connect(&rt, info.meta, &secret, "test", 0, 0).unwrap();
    let data = dafne_client::data::DataClient::connect(&rt, &info.io, &secret).unwrap();
    (rt, dafne_client::file::Fs::new(meta, data))
}

#[test]
fn io_and_meta_metrics_count_what_a_client_did() {
    let c = Cluster::start_sized(2, "");
    let ends = endpoints(c.dir());
    assert_eq!(ends.keys().collect::<Vec<_>>(), ["io-0", "io-1", "meta"]);
    for addr in ends.values() {
        assert!(addr.ip().is_loopback(), "metrics listen on loopback by default: {addr}");
    }

    // 3 MiB over two io servers (stripe unit 1 MiB), then read back twice
    // (the second read may be the client's read-ahead's).
    let (_rt, fs) = connect(c.dir());
    let data = pattern(3 << 20, 7);
    let f = fs.create(fs.meta.root(), b"m.bin", 0o644, None).unwrap();
    f.write_at(0, &data, dafne_proto::io::Stability::FileSync).unwrap();
    let mut back = vec![0u8; data.len()];
    for _ in 0..2 {
        assert_eq!(f.read_at(0, &mut back).unwrap(), data.len());
    }
    assert!(back == data);
    f.close().unwrap();

    let mut written = 0.0;
    let mut read = 0.0;
    for server in ["io-0", "io-1"] {
        let s = check_page(&page(ends[server]));
        assert!(s.iter().all(|(_, l, _)| l.get("server").map(String::as_str) == Some(server)), "server label");
        let w = sum(&s, "dafne_io_bytes_total", &[("op", "write")]);
        let r = sum(&s, "dafne_io_bytes_total", &[("op", "read")]);
        assert!(w > 0.0 && sum(&s, "dafne_io_requests_total", &[("op", "write")]) > 0.0, "{server} wrote nothing");
        assert!(sum(&s, "dafne_io_requests_total", &[("op", "read")]) > 0.0, "{server} read nothing");
        assert!(sum(&s, "dafne_io_requests_total", &[("op", "login")]) > 0.0);
        assert_eq!(sum(&s, "dafne_io_request_errors_total", &[("op", "write")]), 0.0);
        assert_eq!(sum(&s, "dafne_io_cache_bytes", &[]), (8 << 20) as f64, "--cache-mib 8");
        assert!(sum(&s, "dafne_io_storage_capacity_bytes", &[]) > 0.0);
        assert!(sum(&s, "dafne_io_cache_misses_total", &[]) > 0.0);
        assert!(sum(&s, "dafne_ucx_bytes_got_total", &[]) >= w, "writes are RMA gets from the client");
        written += w;
        read += r;
    }
    assert!(written >= data.len() as f64, "bytes written over the io servers {written} < {}", data.len());
    // One write of 3 MiB: counted once, not once per layer.
    assert!(written < 1.5 * data.len() as f64, "bytes written over the io servers {written} for {}", data.len());
    assert!(read >= data.len() as f64, "bytes read over the io servers {read} < {}", data.len());

    let m = check_page(&page(ends["meta"]));
    assert!(sum(&m, "dafne_meta_requests_total", &[("op", "session_open")]) >= 1.0);
    assert!(sum(&m, "dafne_meta_requests_total", &[("op", "create")]) >= 1.0);
    assert!(sum(&m, "dafne_meta_sessions", &[]) >= 1.0, "this test's session is open");
    assert!(sum(&m, "dafne_meta_commits_total", &[]) >= 1.0, "the create committed");

    // `dafne status` names each port; `--metrics` gathers every page into one.
    let table = text(&dafne().args(["status", "--dir", p(c.dir())]).output().unwrap());
    assert!(table.contains(&format!("http://{}/metrics", ends["io-1"])), "{table}");
    let o = dafne().args(["status", "--dir", p(c.dir()), "--metrics"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let all = check_page(&String::from_utf8(o.stdout).unwrap());
    for server in ["meta", "io-0", "io-1"] {
        assert!(all.iter().any(|(_, l, _)| l.get("server").map(String::as_str) == Some(server)), "{server}");
    }
    assert!(sum(&all, "dafne_io_bytes_total", &[("op", "write")]) >= written);
    let o = dafne().args(["status", "--dir", p(c.dir()), "--metrics", "--json"]).output().unwrap();
    assert!(!o.status.success(), "--metrics and --json together");
}

#[test]
fn fixed_metrics_ports_and_a_restarted_server_keeps_its_port() {
    let (_, base) = free_ports(3);
    let c = Cluster::start_sized(2, &format!("[cluster]\nmetrics_base_port = {base}\n"));
    let ends = endpoints(c.dir());
    assert_eq!(ends["meta"].port(), base);
    assert_eq!(ends["io-0"].port(), base + 1);
    assert_eq!(ends["io-1"].port(), base + 2);
    let before = check_page(&page(ends["io-1"]));
    assert!(sum(&before, "process_cpu_seconds_total", &[]) > 0.0);
    // Kill io-1; the supervisor restarts it on the same metrics port.
    let servers = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(c.dir().join("servers.json")).unwrap()).unwrap()
    };
    let pid = servers()[2]["pid"].as_u64().unwrap();
    assert_eq!(servers()[2]["name"], "io-1");
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    wait_for("io-1 restarted", || servers()[2]["restarts"] == 1 && servers()[2]["state"] == "running");
    let after = check_page(&page(ends["io-1"]));
    assert_eq!(sum(&after, "dafne_io_requests_total", &[("op", "read")]), 0.0, "a new process counts from 0");
    assert_eq!(servers()[2]["metrics"].as_str(), Some(ends["io-1"].to_string().as_str()));
}

/// A restarted server whose metrics port something else took meanwhile
/// (the port is an ephemeral one by default, so any program may get it)
/// still starts: it serves its clients, takes another metrics port, and
/// servers.json, cluster.json and `dafne status` say which.
#[test]
fn a_restarted_server_whose_metrics_port_is_taken_still_serves() {
    let c = Cluster::start_sized(1, "");
    let json = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(c.dir().join(name)).unwrap()).unwrap()
    };
    let old = endpoints(c.dir())["io-0"];
    assert_eq!(json("servers.json")[1]["name"], "io-0");
    let pid = json("servers.json")[1]["pid"].as_u64().unwrap();
    let supervisor = json("cluster.json")["supervisor_pid"].as_u64().unwrap().to_string();
    // The supervisor paused, so the port is taken before it restarts io-0.
    std::process::Command::new("kill").args(["-STOP", &supervisor]).status().unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    wait_for("io-0 gone", || !common::alive(pid));
    let mut held = None;
    wait_for("the old metrics port free", || {
        held = std::net::TcpListener::bind(old).ok();
        held.is_some()
    });
    std::process::Command::new("kill").args(["-CONT", &supervisor]).status().unwrap();
    wait_for("io-0's restart settled", || {
        let s = json("servers.json");
        s[1]["restarts"] == 1 && s[1]["state"] != "restarting"
    });
    let s = json("servers.json");
    assert_eq!(s[1]["state"], "running", "io-0 did not come back: {s:#}\n{}", log_of(c.dir(), "io-0"));
    let new: SocketAddr = s[1]["metrics"].as_str().expect("servers.json records its metrics port").parse().unwrap();
    assert_ne!(new, old, "the port is held by the test");
    assert_eq!(new.ip(), old.ip(), "the same host");
    wait_for("cluster.json updated", || endpoints(c.dir())["io-0"] == new);
    let table = text(&dafne().args(["status", "--dir", p(c.dir())]).output().unwrap());
    assert!(table.contains(&format!("http://{new}/metrics")), "{table}");
    let log = log_of(c.dir(), "io-0");
    assert!(log.contains(&old.to_string()), "the log names the port it could not take: {log}");
    // It serves I/O, and its metrics count it where status says.
    let (_rt, fs) = connect(c.dir());
    let data = pattern(256 << 10, 3);
    let f = fs.create(fs.meta.root(), b"after.bin", 0o644, None).unwrap();
    f.write_at(0, &data, dafne_proto::io::Stability::FileSync).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(f.read_at(0, &mut back).unwrap(), data.len());
    assert!(back == data);
    f.close().unwrap();
    let m = check_page(&page(new));
    assert!(m.iter().all(|(_, l, _)| l.get("server").map(String::as_str) == Some("io-0")), "server label");
    assert!(sum(&m, "dafne_io_bytes_total", &[("op", "write")]) >= data.len() as f64);
    drop(held);
}

/// A server's log.
fn log_of(dir: &Path, server: &str) -> String {
    std::fs::read_to_string(dir.join("logs").join(format!("{server}.log"))).unwrap_or_default()
}

/// Garbage, a request that never ends, and more connections than the port
/// serves at once: the port answers garbage with 400, the extra connections
/// with 503, and serves the page again once the stalled peers' time is
/// up, while the server goes on serving its clients.
#[test]
fn hostile_peers_on_the_metrics_port_do_not_stop_it() {
    let c = Cluster::start_sized(1, "");
    let addr = endpoints(c.dir())["io-0"];
    let send = |bytes: &[u8]| -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(bytes);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(send(b"GET /admin HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(send(b"DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    assert!(send(&vec![b'x'; 64 << 10]).starts_with("HTTP/1.1 431"));
    // Requests that never finish, and many idle connections on top.
    let stalled: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n").unwrap();
            s
        })
        .collect();
    let idle: Vec<TcpStream> = (0..50).filter_map(|_| TcpStream::connect(addr).ok()).collect();
    // The page comes back once the stalled peers' deadline passed.
    let start = Instant::now();
    let body = loop {
        match get(addr) {
            Ok((status, body)) if status == "HTTP/1.1 200 OK" => break body,
            _ => {
                assert!(start.elapsed() < Duration::from_secs(20), "the metrics port never answered again");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    check_page(&body);
    drop((stalled, idle));
    // The io server itself was never disturbed.
    let o = dafne().args(["status", "--dir", p(c.dir()), "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// A server that is gone: `dafne status --metrics` prints the others' pages,
/// names it on stderr and exits non-zero.
#[test]
fn status_metrics_names_a_server_that_does_not_answer() {
    let c = Cluster::start_sized(1, "[cluster]\nrestart = false\n");
    let servers: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir().join("servers.json")).unwrap()).unwrap();
    assert_eq!(servers[1]["name"], "io-0");
    let pid = servers[1]["pid"].as_u64().unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    wait_for("io-0 gone", || !common::alive(pid));
    let o = dafne().args(["status", "--dir", p(c.dir()), "--metrics"]).output().unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("io-0") && err.contains("1 of 2 servers"), "{err}");
    assert!(err.contains("dafne status"), "points to where the servers' states are: {err}");
    let page = check_page(&String::from_utf8(o.stdout).unwrap());
    assert!(page.iter().all(|(_, l, _)| l.get("server").map(String::as_str) == Some("meta")), "only meta's page");

    // A page that is not Prometheus text hides only itself: io-0's port is
    // now a fake server's.
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = fake.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in fake.incoming().flatten() {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && matches!(s.read(&mut byte), Ok(1)) {
                head.push(byte[0]);
            }
            let body = "this is not a metrics page\n";
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    let path = c.dir().join("cluster.json");
    let mut info: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for m in info["metrics"].as_array_mut().unwrap() {
        if m["server"] == "io-0" {
            m["addr"] = fake_addr.to_string().into();
        }
    }
    std::fs::write(&path, serde_json::to_string(&info).unwrap()).unwrap();
    let o = dafne().args(["status", "--dir", p(c.dir()), "--metrics"]).output().unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("io-0") && err.contains("not valid Prometheus text"), "{err}");
    let page = check_page(&String::from_utf8(o.stdout).unwrap());
    assert!(page.iter().any(|(_, l, _)| l.get("server").map(String::as_str) == Some("meta")), "meta's page is printed");
}
