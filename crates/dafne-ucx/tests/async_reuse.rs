//! Many workers in one process, each on its own thread, making and closing
//! sockaddr connections: what a test binary of client runtimes (or a
//! server with a second runtime) does. Each connection is a UCX
//! `tcp_sockcm` socket whose handler UCS registers, by descriptor number,
//! with the worker's async context in a process-wide table.
//!
//! UCX 1.13.1's `__ucs_async_poll_missed` asserts `handler->async == async`
//! when a worker drains an event it queued as "missed" (its async context
//! was blocked when UCX's async thread saw the event) for a descriptor that
//! was closed meanwhile and reopened by another worker, whose handler the
//! number now finds (upstream fix: openucx/ucx#9942, not in 1.13). It
//! aborted `dafne-transport`'s `tests/transport.rs` once in CI. Without
//! `dafne_ucx`'s ordering of handler registrations against those windows
//! (`src/handler_ids.rs`) this test aborted with that assertion in 2 of 19
//! runs of 30 s (`ASYNC_REUSE_SECS=30`) on a loaded 2-core VM (none of 19
//! with it): a stress test, it can pass on a run where the race did not
//! happen.
//!
//! The listeners run in a child process of their own, as the transport
//! tests' servers do, so that only the clients' workers share this
//! process. The test runs its clients in a child too, so that an abort is
//! a failed assertion here rather than a dead test binary, and a stuck
//! child (a deadlock) is killed and fails the test past its deadline.
//!
//! `ASYNC_REUSE_SECS` (default 8, to keep CI short: a longer run, `ASYNC_REUSE_SECS=30`, catches the race more often) and `ASYNC_REUSE_THREADS` (default 8)
//! set the run's length and its client threads.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dafne_ucx::{Context, ContextOptions, Worker};

const ROLE: &str = "DAFNE_ASYNC_REUSE_ROLE";

fn ctx(name: &str) -> Context {
    Context::new(&ContextOptions {
        name: name.into(),
        config: vec![("TLS".into(), "tcp".into()), ("NET_DEVICES".into(), "lo".into())],
    })
    .unwrap()
}

/// A line to the parent on stdout (not `println!`, which the test harness
/// may capture).
fn say(line: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    writeln!(o, "{line}").unwrap();
    o.flush().unwrap();
}

fn env_num(k: &str, default: u64) -> u64 {
    std::env::var(k).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn self_exe(role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "many_workers_making_and_closing_sockaddr_connections", "--nocapture", "--test-threads=1"])
        .env(ROLE, role);
    c
}

/// One listening worker; accepts everything, keeps each endpoint until the
/// client closes it. Ends when its stdin closes (the parent went away).
fn serve() {
    let c = ctx("srv");
    let w = Worker::new(&c).unwrap();
    let reqs = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let q = reqs.clone();
    let l = w.listen("127.0.0.1:0".parse().unwrap(), move |r| q.borrow_mut().push(r)).unwrap();
    say(&format!("listening on {}", l.local_addr().unwrap()));
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::spawn(move || {
        let mut b = String::new();
        let _ = std::io::stdin().read_line(&mut b);
        s.store(true, Relaxed);
    });
    let mut eps = Vec::new();
    while !stop.load(Relaxed) {
        w.progress();
        for r in std::mem::take(&mut *reqs.borrow_mut()) {
            if let Ok(ep) = w.accept(r) {
                eps.push(ep);
            }
        }
        eps.retain(|ep: &dafne_ucx::Endpoint| ep.failed().is_none());
    }
    std::process::exit(0);
}

/// A client thread: a worker of its own (made again every 20 connections),
/// connecting, progressing a little, closing.
fn client(addr: SocketAddr, until: Instant, n: Arc<AtomicU64>) {
    while Instant::now() < until {
        let c = ctx("cli");
        let w = Worker::new(&c).unwrap();
        for _ in 0..20 {
            if Instant::now() >= until {
                break;
            }
            let ep = w.connect_sockaddr(addr).unwrap();
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(3) {
                w.progress();
            }
            n.fetch_add(1, Relaxed);
            drop(ep);
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(1) {
                w.progress();
            }
        }
    }
}

fn clients(addr: SocketAddr) {
    let secs = env_num("ASYNC_REUSE_SECS", 8);
    let threads = env_num("ASYNC_REUSE_THREADS", 8);
    let until = Instant::now() + Duration::from_secs(secs);
    let n = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let n = n.clone();
            std::thread::spawn(move || client(addr, until, n))
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    say(&format!("{} connections", n.load(Relaxed)));
}

/// How long the clients' process may take: its run plus a generous margin
/// for starting UCX and joining on a loaded machine. Past it the clients
/// are stuck (a deadlock between workers is this test's other failure:
/// `handler_ids` orders them with a lock).
fn clients_deadline() -> Duration {
    Duration::from_secs(env_num("ASYNC_REUSE_SECS", 8) + 120)
}

/// Runs `cmd` to its end, its output captured, or kills it at `limit`: a
/// stuck child fails the test instead of holding CI until its own limit.
fn run_bounded(mut cmd: Command, limit: Duration) -> std::process::Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Read both pipes on threads, so a full pipe never stops the child.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut so, &mut b);
        b
    });
    let err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = std::io::Read::read_to_end(&mut se, &mut b);
        b
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let (o, e) = (out.join().unwrap(), err.join().unwrap());
            panic!(
                "the clients' process did not finish within {limit:?} (stuck: a deadlock?); killed\n{}\n{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    std::process::Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

#[test]
fn many_workers_making_and_closing_sockaddr_connections() {
    match std::env::var(ROLE).as_deref() {
        Ok("server") => return serve(),
        Ok(addr) if addr.starts_with("clients=") => return clients(addr["clients=".len()..].parse().unwrap()),
        _ => {}
    }
    let mut server = self_exe("server").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    loop {
        line.clear();
        assert_ne!(out.read_line(&mut line).unwrap(), 0, "the server child ended before listening");
        // After libtest's "test NAME ... " (no newline of its own).
        if let Some(a) = line.trim().split("listening on ").nth(1) {
            line = a.to_string();
            break;
        }
    }
    let o = run_bounded(self_exe(&format!("clients={line}")), clients_deadline());
    drop(server.stdin.take());
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the clients' process failed ({}):\n{stdout}\n{stderr}", o.status);
    assert!(stdout.contains(" connections"), "{stdout}\n{stderr}");
    eprintln!("{}", stdout.lines().find(|l| l.ends_with(" connections")).unwrap_or(""));
}
