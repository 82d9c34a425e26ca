//! The metrics port: a minimal HTTP/1.1 server that answers `GET /metrics`
//! (and `HEAD`) with the page its render function builds, and [`fetch`],
//! the client `dafne status --metrics` uses.
//!
//! # Bounds
//! The port may be reached by anything, so nothing a peer sends can make
//! the server block, spin or grow:
//! * one accept thread; each connection is served on a thread of its own,
//!   at most [`MAX_CONNECTIONS`] at once (more are closed as they arrive),
//!   so a slow peer holds one slot, never the server;
//! * the request head is read within [`READ_DEADLINE`] in all (each read
//!   waits only for what is left of it) and up to [`MAX_HEAD`] bytes; past
//!   either the connection gets 408 or 431 and is closed;
//! * the answer is written within [`WRITE_DEADLINE`]; one request per
//!   connection (`Connection: close`);
//! * an accept that fails (out of file descriptors) is retried after a
//!   pause, not at once.
//!
//! The render function runs only for a well-formed `GET /metrics`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::text::CONTENT_TYPE;

/// The most bytes of request head (request line and headers) read.
pub const MAX_HEAD: usize = 8 << 10;
/// How long a peer has to send its whole request head.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);
/// How long writing the answer may take.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; more are closed when accepted.
pub const MAX_CONNECTIONS: usize = 4;
/// The path of the page.
pub const PATH: &str = "/metrics";
/// The largest page [`fetch`] accepts.
pub const MAX_PAGE: usize = 16 << 20;

/// Builds the page; an error is answered 503 with its text.
pub type Render = dyn Fn() -> Result<String, String> + Send + Sync;

/// A running metrics port; dropping it stops the accept thread and waits
/// for the connections being served (each bounded by the deadlines).
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer").field("addr", &self.addr).finish()
    }
}

impl MetricsServer {
    /// Listens on `addr` (port 0: any free port; [`MetricsServer::addr`]
    /// says which) and serves the page `render` builds.
    pub fn start(
        addr: SocketAddr,
        render: impl Fn() -> Result<String, String> + Send + Sync + 'static,
    ) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let render: Arc<Render> = Arc::new(render);
        let s = stop.clone();
        let thread =
            std::thread::Builder::new().name("metrics".into()).spawn(move || accept_loop(listener, render, &s))?;
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Decrements the count of connections being served when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn accept_loop(listener: TcpListener, render: Arc<Render>, stop: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut served: Vec<JoinHandle<()>> = Vec::new();
    let mut warned: Option<Instant> = None;
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        served.retain(|h| !h.is_finished());
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and the like repeat at once: pause instead of spinning.
                if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!("metrics port: accept failed: {e} (retrying; at most one such warning a minute)");
                    warned = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            // Closed unanswered: the peers holding the slots are what is slow.
            drop(stream);
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(active.clone());
        let r = render.clone();
        match std::thread::Builder::new().name("metrics-conn".into()).spawn(move || {
            let _slot = slot;
            serve_one(stream, &*r);
        }) {
            Ok(h) => served.push(h),
            Err(e) => tracing::warn!("metrics port: cannot start a connection thread: {e}"),
        }
    }
    for h in served {
        let _ = h.join();
    }
}

/// What the request head asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    /// `GET /metrics` (`head`: `HEAD`, no body).
    Page { head: bool },
    /// Any answer but the page: status, reason, extra header lines.
    Answer(u16, &'static str, &'static str),
}

/// Reads the request head: at most [`MAX_HEAD`] bytes, within `deadline`.
/// `Err` is the answer to give instead (`None`: just close).
pub fn read_head(
    s: &mut impl Read,
    deadline: Instant,
    set_timeout: &mut dyn FnMut(Duration),
) -> Result<Vec<u8>, Option<Asked>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = find_end(&buf) {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() >= MAX_HEAD {
            return Err(Some(Asked::Answer(431, "Request Header Fields Too Large", "")));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Some(Asked::Answer(408, "Request Timeout", "")));
        }
        set_timeout(left);
        let want = chunk.len().min(MAX_HEAD - buf.len());
        match s.read(&mut chunk[..want]) {
            Ok(0) => return Err(None),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(Some(Asked::Answer(408, "Request Timeout", "")))
            }
            Err(_) => return Err(None),
        }
    }
}

/// Where the head ends (the blank line), if it has.
fn find_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = buf.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What a request head asks for.
pub fn route(head: &[u8]) -> Asked {
    let bad = Asked::Answer(400, "Bad Request", "");
    let Ok(head) = std::str::from_utf8(head) else { return bad };
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return bad;
    }
    let path = target.split(['?', '#']).next().unwrap_or("");
    if path != PATH {
        return Asked::Answer(404, "Not Found", "");
    }
    match method {
        "GET" => Asked::Page { head: false },
        "HEAD" => Asked::Page { head: true },
        _ => Asked::Answer(405, "Method Not Allowed", "Allow: GET, HEAD\r\n"),
    }
}

fn respond(s: &mut TcpStream, code: u16, reason: &str, extra: &str, content_type: &str, body: &[u8], head: bool) {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head {
        out.extend_from_slice(body);
    }
    let _ = s.write_all(&out);
    let _ = s.flush();
    let _ = s.shutdown(Shutdown::Write);
}

fn serve_one(mut s: TcpStream, render: &Render) {
    let _ = s.set_write_timeout(Some(WRITE_DEADLINE));
    let _ = s.set_nodelay(true);
    let deadline = Instant::now() + READ_DEADLINE;
    let timeouts = s.try_clone();
    let mut set = |d: Duration| {
        if let Ok(t) = &timeouts {
            let _ = t.set_read_timeout(Some(d));
        }
    };
    let asked = match read_head(&mut s, deadline, &mut set) {
        Ok(head) => route(&head),
        Err(Some(a)) => a,
        Err(None) => return,
    };
    let text = "text/plain; charset=utf-8";
    match asked {
        Asked::Page { head } => match render() {
            Ok(page) => respond(&mut s, 200, "OK", "", CONTENT_TYPE, page.as_bytes(), head),
            Err(e) => respond(&mut s, 503, "Service Unavailable", "", text, format!("{e}\n").as_bytes(), head),
        },
        Asked::Answer(code, reason, extra) => {
            let body = format!("{code} {reason}: this port serves GET {PATH} only\n");
            respond(&mut s, code, reason, extra, text, body.as_bytes(), false)
        }
    }
}

/// Why [`fetch`] got no page.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("talking to {addr}: {source}")]
    Io { addr: SocketAddr, source: std::io::Error },
    #[error("{addr} answered {status}: {body}")]
    Status { addr: SocketAddr, status: String, body: String },
    #[error("{addr} did not answer in HTTP: {why}")]
    Malformed { addr: SocketAddr, why: String },
}

/// `GET /metrics` from `addr`, within `timeout` for each of connect, send
/// and every read; the page (at most [`MAX_PAGE`] bytes).
pub fn fetch(addr: SocketAddr, timeout: Duration) -> Result<String, FetchError> {
    let io = |source| FetchError::Io { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|source| FetchError::Connect { addr, source })?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(s, "GET {PATH} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n").map_err(io)?;
    let mut raw = Vec::new();
    (&mut s).take(MAX_PAGE as u64 + MAX_HEAD as u64).read_to_end(&mut raw).map_err(io)?;
    let malformed = |why: &str| FetchError::Malformed { addr, why: why.to_string() };
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| malformed("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| malformed("headers are not UTF-8"))?;
    let body = String::from_utf8(raw[end + 4..].to_vec()).map_err(|_| malformed("the page is not UTF-8"))?;
    let status = head.lines().next().unwrap_or("");
    let code = status.split(' ').nth(1).ok_or_else(|| malformed("no status line"))?;
    if !status.starts_with("HTTP/1.") {
        return Err(malformed("no status line"));
    }
    if code != "200" {
        let status = status.split_once(' ').map_or(status, |(_, s)| s).to_string();
        return Err(FetchError::Status { addr, status, body: body.trim().to_string() });
    }
    let length = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse::<usize>().ok()).flatten()
    });
    if length.is_some_and(|n| n != body.len()) {
        return Err(malformed("the page is shorter or longer than its Content-Length"));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn server() -> MetricsServer {
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), || {
            let mut t = crate::Text::new(&[("server", "test")]);
            t.single("up", crate::Kind::Gauge, "Up.", 1);
            Ok(t.finish())
        })
        .unwrap()
    }

    #[test]
    fn routes() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\nHost: x"), Asked::Page { head: false });
        assert_eq!(route(b"HEAD /metrics?x=1 HTTP/1.0"), Asked::Page { head: true });
        assert!(matches!(route(b"POST /metrics HTTP/1.1"), Asked::Answer(405, _, _)));
        assert!(matches!(route(b"GET / HTTP/1.1"), Asked::Answer(404, _, _)));
        assert!(matches!(route(b"GET /metrics"), Asked::Answer(400, _, _)));
        assert!(matches!(route(b"GET /metrics SPDY/3"), Asked::Answer(400, _, _)));
        assert!(matches!(route(b"get /metrics HTTP/1.1"), Asked::Answer(400, _, _)));
        assert!(matches!(route(&[0xff, 0xfe, b' ']), Asked::Answer(400, _, _)));
    }

    #[test]
    fn the_head_is_bounded_in_size_and_time() {
        let far = Instant::now() + Duration::from_secs(60);
        let mut none = |_| {};
        // Never ends: cut at MAX_HEAD.
        let mut endless = std::io::repeat(b'a');
        assert_eq!(
            read_head(&mut endless, far, &mut none).unwrap_err(),
            Some(Asked::Answer(431, "Request Header Fields Too Large", ""))
        );
        // Ends: the head without the blank line.
        let mut ok = &b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nbody"[..];
        assert_eq!(read_head(&mut ok, far, &mut none).unwrap(), b"GET /metrics HTTP/1.1\r\nHost: x");
        // Closed early: no answer.
        let mut short = &b"GET /met"[..];
        assert_eq!(read_head(&mut short, far, &mut none).unwrap_err(), None);
        // Past the deadline before the head is complete.
        let mut slow = &b"GET /metrics HTTP/1.1\r\n"[..];
        let past = Instant::now();
        assert_eq!(read_head(&mut slow, past, &mut none).unwrap_err(), Some(Asked::Answer(408, "Request Timeout", "")));
    }

    #[test]
    fn answers_the_page_and_refuses_the_rest() {
        let m = server();
        let page = fetch(m.addr(), Duration::from_secs(5)).unwrap();
        assert_eq!(page, "# HELP up Up.\n# TYPE up gauge\nup{server=\"test\"} 1\n");
        let ok = raw(m.addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.contains("text/plain; version=0.0.4"), "{ok}");
        let head = raw(m.addr(), b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(raw(m.addr(), b"GET /other HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let post = raw(m.addr(), b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"), "{post}");
        assert!(raw(m.addr(), b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        let big = vec![b'A'; MAX_HEAD * 4];
        assert!(raw(m.addr(), &big).starts_with("HTTP/1.1 431"));
        match fetch("127.0.0.1:1".parse().unwrap(), Duration::from_secs(1)) {
            Err(FetchError::Connect { .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failing_render_is_503() {
        let m = MetricsServer::start("127.0.0.1:0".parse().unwrap(), || Err("stopping".into())).unwrap();
        match fetch(m.addr(), Duration::from_secs(5)) {
            Err(FetchError::Status { status, body, .. }) => {
                assert!(status.starts_with("503") && body == "stopping", "{status} {body}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// Slow and silent peers fill the slots; more connections are closed;
    /// once the deadline passes, the page is served again.
    #[test]
    fn stalled_peers_do_not_stop_the_port() {
        let m = server();
        let stalled: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| {
                let mut s = TcpStream::connect(m.addr()).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        // Let the accept thread take them all.
        std::thread::sleep(Duration::from_millis(300));
        let extra: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(m.addr()).unwrap()).collect();
        for mut s in extra {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut out = Vec::new();
            // Closed at once, unanswered (or, on a machine so loaded that a
            // stalled peer's time ran out first, timed out itself): never
            // the page.
            let _ = s.read_to_end(&mut out);
            assert!(out.is_empty() || out.starts_with(b"HTTP/1.1 408"), "{}", String::from_utf8_lossy(&out));
        }
        let started = Instant::now();
        let page = loop {
            match fetch(m.addr(), Duration::from_secs(5)) {
                Ok(p) => break p,
                Err(_) => {
                    assert!(started.elapsed() < Duration::from_secs(10), "the port never recovered");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        assert!(page.contains("up{server=\"test\"} 1"));
        for mut s in stalled {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            assert!(out.starts_with("HTTP/1.1 408"), "a stalled peer got {out:?}");
        }
    }
}
