//! The metrics port: a minimal HTTP/1.1 server that answers `GET /metrics`
//! (and `HEAD`) with the page its render function builds, and [`fetch`],
//! the client `dafne status --metrics` uses.
//!
//! # Bounds
//! The port may be reached by anything, so nothing a peer sends can make
//! the server block, spin or grow:
//! * one accept thread; each connection is served on a thread of its own,
//!   at most [`MAX_CONNECTIONS`] at once, so a slow peer holds one slot,
//!   never the server; connections beyond them get `503 Service
//!   Unavailable` with `Retry-After` at once (one non-blocking write from
//!   the accept thread, which never waits on a peer);
//! * the request head is read within [`READ_DEADLINE`] in all (each read
//!   waits only for what is left of it) and up to [`MAX_HEAD`] bytes; past
//!   either the connection gets 408 or 431 and is closed;
//! * the answer is written within [`WRITE_DEADLINE`] in all (each write
//!   waits only for what is left); one request per connection
//!   (`Connection: close`);
//! * the page is rendered at most once per [`CACHE_FOR`]: requests within
//!   it get the same page, so a flood of GETs costs the server's loop and
//!   statvfs nothing more;
//! * an accept that fails (out of file descriptors) is retried after a
//!   pause, not at once.
//!
//! The timeouts are set on the connection's socket itself, never on a
//! `try_clone` of it: a clone needs a file descriptor, and without one a
//! read would have had no timeout at all.
//!
//! # Stopping
//! Dropping [`MetricsServer`] stops the accept thread and withdraws the
//! render function; it waits (at most [`STOP_WAIT`]) only for pages being
//! rendered, as they hold what the render function holds (the server).
//! Connection threads are not waited for: each ends by its deadlines, and
//! one that would render finds the function gone and answers 503. So no
//! peer, idle or slow, can hold up a server's shutdown.
//!
//! The render function runs only for a well-formed `GET /metrics`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::text::CONTENT_TYPE;

/// The most bytes of request head (request line and headers) read.
pub const MAX_HEAD: usize = 8 << 10;
/// How long a peer has to send its whole request head (a scraper sends it
/// in one packet at once).
pub const READ_DEADLINE: Duration = Duration::from_secs(1);
/// How long writing the whole answer may take.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; more are answered 503.
pub const MAX_CONNECTIONS: usize = 16;
/// What a 503 for a connection beyond [`MAX_CONNECTIONS`] asks the peer
/// to wait before trying again, seconds.
pub const RETRY_AFTER_S: u32 = 1;
/// How long a rendered page is served again before it is rendered anew.
pub const CACHE_FOR: Duration = Duration::from_secs(1);
/// How long dropping a [`MetricsServer`] waits for pages being rendered.
pub const STOP_WAIT: Duration = Duration::from_secs(1);
/// The path of the page.
pub const PATH: &str = "/metrics";
/// The largest page [`fetch`] accepts.
pub const MAX_PAGE: usize = 16 << 20;

/// Builds the page; an error is answered 503 with its text.
pub type Render = dyn Fn() -> Result<String, String> + Send + Sync;

/// The bounds of a [`MetricsServer`] (the defaults are the constants of
/// this module; tests choose others).
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub max_connections: usize,
    pub read_deadline: Duration,
    pub write_deadline: Duration,
    pub cache_for: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_connections: MAX_CONNECTIONS,
            read_deadline: READ_DEADLINE,
            write_deadline: WRITE_DEADLINE,
            cache_for: CACHE_FOR,
        }
    }
}

/// What the accept thread and the connection threads share.
struct Shared {
    opts: Options,
    /// `None` once the server is dropped.
    render: Mutex<Option<Arc<Render>>>,
    /// Pages being rendered (each holds a clone of `render`).
    rendering: AtomicUsize,
    /// The last page and when it was rendered; locked while rendering, so
    /// requests arriving meanwhile get that page rather than render again.
    cache: Mutex<Option<(Instant, Result<String, String>)>>,
}

/// Decrements a count when dropped.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    /// The page: the cached one if it is recent, else a new one.
    fn page(&self) -> Result<String, String> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, page)) = &*cache {
            if at.elapsed() < self.opts.cache_for {
                return page.clone();
            }
        }
        let (_counted, render) = {
            let slot = self.render.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(r) = &*slot else { return Err("the server is stopping".into()) };
            // Counted under the lock, so a drop that took the function
            // sees every clone of it still out.
            self.rendering.fetch_add(1, Ordering::SeqCst);
            (Counted(&self.rendering), r.clone())
        };
        let page = render();
        // The clone goes before the count does.
        drop(render);
        *cache = Some((Instant::now(), page.clone()));
        page
    }
}

/// A running metrics port; dropping it stops it (module docs, "Stopping").
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
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
        Self::start_with(addr, Options::default(), Arc::new(render))
    }

    /// [`MetricsServer::start`] with other bounds.
    pub fn start_with(addr: SocketAddr, opts: Options, render: Arc<Render>) -> std::io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            opts,
            render: Mutex::new(Some(render)),
            rendering: AtomicUsize::new(0),
            cache: Mutex::new(None),
        });
        let (s, sh) = (stop.clone(), shared.clone());
        let thread =
            std::thread::Builder::new().name("metrics".into()).spawn(move || accept_loop(listener, &sh, &s))?;
        Ok(MetricsServer { addr, stop, thread: Some(thread), shared })
    }

    /// For a data server, whose metrics are optional: listens on `addr`,
    /// else (the port is taken, say) on a free port of the same host, else
    /// not at all; each fallback is written on stderr (the server's log
    /// file), naming `addr`, whatever the log level.
    /// A metrics port must never keep a server from serving its clients.
    pub fn start_or_elsewhere(
        addr: SocketAddr,
        render: impl Fn() -> Result<String, String> + Send + Sync + 'static,
    ) -> Option<MetricsServer> {
        let render: Arc<Render> = Arc::new(render);
        let e = match Self::start_with(addr, Options::default(), render.clone()) {
            Ok(m) => return Some(m),
            Err(e) => e,
        };
        if addr.port() != 0 {
            let any = SocketAddr::new(addr.ip(), 0);
            match Self::start_with(any, Options::default(), render) {
                Ok(m) => {
                    // On stderr whatever the log level: the operator looks
                    // for the port where it was (the server's log file).
                    eprintln!("metrics port: cannot listen on {addr} ({e}); listening on {} instead", m.addr());
                    return Some(m);
                }
                Err(e2) => eprintln!(
                    "metrics port: cannot listen on {addr} ({e}) nor on a free port of {} ({e2}); serving without \
                     metrics",
                    addr.ip()
                ),
            }
        } else {
            eprintln!("metrics port: cannot listen on {addr} ({e}); serving without metrics");
        }
        None
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call; it then sees `stop` (the accept thread never
        // waits on a peer, so joining it is bounded once it is woken).
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let woken = TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok();
        if let Some(t) = self.thread.take() {
            if woken {
                let _ = t.join();
            } else {
                tracing::warn!("metrics port: cannot wake the accept thread at {wake}; leaving it");
            }
        }
        let render = self.shared.render.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(render);
        let until = Instant::now() + STOP_WAIT;
        while self.shared.rendering.load(Ordering::SeqCst) > 0 {
            if Instant::now() >= until {
                tracing::warn!(
                    "metrics port: a page still being rendered after {} ms; not waiting for it",
                    STOP_WAIT.as_millis()
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn accept_loop(listener: TcpListener, shared: &Arc<Shared>, stop: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut warned: Option<Instant> = None;
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
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
        if active.load(Ordering::SeqCst) >= shared.opts.max_connections {
            refuse(stream);
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (active, shared) = (active.clone(), shared.clone());
        // Not joined (module docs, "Stopping"); the closure, and with it
        // the slot, is dropped if the thread does not start.
        if let Err(e) = std::thread::Builder::new().name("metrics-conn".into()).spawn(move || {
            let _slot = Counted(&active);
            serve_one(stream, &shared);
        }) {
            tracing::warn!("metrics port: cannot start a connection thread: {e}");
        }
    }
}

/// A connection beyond the slots: `503` with `Retry-After`, written at
/// once without waiting (a fresh socket's send buffer takes it whole),
/// then what the peer sent already is read and dropped, so that closing
/// does not reset the connection before the peer reads the answer.
fn refuse(s: TcpStream) {
    let body = "503 Service Unavailable: too many connections to the metrics port; try again\n";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Retry-After: {RETRY_AFTER_S}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.set_nonblocking(true).is_err() {
        return;
    }
    let _ = (&s).write(answer.as_bytes());
    let _ = s.shutdown(Shutdown::Write);
    let mut sink = [0u8; 1024];
    for _ in 0..(MAX_HEAD / sink.len()) {
        match (&s).read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
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

/// Reads the request head: at most [`MAX_HEAD`] bytes, within `deadline`;
/// before each read, `set_timeout` is given what is left of it (a failure
/// there ends the connection: a read must never wait unbounded).
/// `Err` is the answer to give instead (`None`: just close).
pub fn read_head(
    s: &mut impl Read,
    deadline: Instant,
    set_timeout: &mut dyn FnMut(Duration) -> std::io::Result<()>,
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
        if set_timeout(left).is_err() {
            return Err(None);
        }
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

/// Writes all of `buf` by `deadline` (each write waits only for what is
/// left of it); gives up, silently, past it or on an error.
fn write_within(s: &TcpStream, mut buf: &[u8], deadline: Instant) {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_write_timeout(Some(left)).is_err() {
            return;
        }
        match (&*s).write(buf) {
            Ok(0) => return,
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn respond(
    s: &TcpStream,
    deadline: Instant,
    (code, reason, extra): (u16, &str, &str),
    content_type: &str,
    body: &[u8],
    head: bool,
) {
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head {
        out.extend_from_slice(body);
    }
    write_within(s, &out, deadline);
    let _ = s.shutdown(Shutdown::Write);
}

fn serve_one(s: TcpStream, shared: &Shared) {
    let _ = s.set_nodelay(true);
    let opts = shared.opts;
    let deadline = Instant::now() + opts.read_deadline;
    let mut reader = &s;
    let mut set = |d: Duration| s.set_read_timeout(Some(d));
    let (asked, head) = match read_head(&mut reader, deadline, &mut set) {
        Ok(head) => (route(&head), head.starts_with(b"HEAD ")),
        Err(Some(a)) => (a, false),
        Err(None) => return,
    };
    let deadline = Instant::now() + opts.write_deadline;
    let text = "text/plain; charset=utf-8";
    match asked {
        Asked::Page { head } => match shared.page() {
            Ok(page) => respond(&s, deadline, (200, "OK", ""), CONTENT_TYPE, page.as_bytes(), head),
            Err(e) => respond(&s, deadline, (503, "Service Unavailable", ""), text, format!("{e}\n").as_bytes(), head),
        },
        Asked::Answer(code, reason, extra) => {
            let body = format!("{code} {reason}: this port serves GET {PATH} only\n");
            respond(&s, deadline, (code, reason, extra), text, body.as_bytes(), head)
        }
    }
}

/// `d` as people read it: `5 s`, `1500 ms`.
fn shown(d: &Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Why [`fetch`] got no page.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("no answer from {addr} within {}", shown(.within))]
    Timeout { addr: SocketAddr, within: Duration },
    #[error("talking to {addr}: {source}")]
    Io { addr: SocketAddr, source: std::io::Error },
    #[error("{addr} answered {status}: {body}")]
    Status { addr: SocketAddr, status: String, body: String },
    #[error("{addr} did not answer in HTTP: {why}")]
    Malformed { addr: SocketAddr, why: String },
}

/// `GET /metrics` from `addr`, all of it (connecting, sending, reading)
/// within `timeout`; the page (at most [`MAX_PAGE`] bytes).
pub fn fetch(addr: SocketAddr, timeout: Duration) -> Result<String, FetchError> {
    let deadline = Instant::now() + timeout;
    let late = || FetchError::Timeout { addr, within: timeout };
    let left = || {
        let l = deadline.saturating_duration_since(Instant::now());
        if l.is_zero() {
            Err(late())
        } else {
            Ok(l)
        }
    };
    let io = |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => late(),
        _ => FetchError::Io { addr, source },
    };
    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|source| match source.kind() {
        std::io::ErrorKind::TimedOut => late(),
        _ => FetchError::Connect { addr, source },
    })?;
    s.set_write_timeout(Some(left()?)).map_err(io)?;
    // A few dozen bytes, written at once (one segment, as servers expect).
    let request = format!("GET {PATH} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n");
    (&s).write_all(request.as_bytes()).map_err(io)?;
    let limit = MAX_PAGE + MAX_HEAD;
    let mut raw = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while raw.len() < limit {
        s.set_read_timeout(Some(left()?)).map_err(io)?;
        let want = chunk.len().min(limit - raw.len());
        match (&s).read(&mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
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
        let mut none = |_: Duration| -> std::io::Result<()> { Ok(()) };
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
        let head404 = raw(m.addr(), b"HEAD /other HTTP/1.1\r\n\r\n");
        assert!(head404.starts_with("HTTP/1.1 404") && head404.ends_with("\r\n\r\n"), "HEAD gets no body: {head404}");
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

    fn opts(max_connections: usize, read_deadline: Duration, cache_for: Duration) -> Options {
        Options { max_connections, read_deadline, write_deadline: WRITE_DEADLINE, cache_for }
    }

    fn counting(cache_for: Duration) -> (MetricsServer, Arc<AtomicUsize>) {
        let renders = Arc::new(AtomicUsize::new(0));
        let r = renders.clone();
        let render: Arc<Render> = Arc::new(move || Ok(format!("n {}\n", r.fetch_add(1, Ordering::SeqCst) + 1)));
        let m = MetricsServer::start_with("127.0.0.1:0".parse().unwrap(), opts(4, READ_DEADLINE, cache_for), render)
            .unwrap();
        (m, renders)
    }

    /// Requests within the cache window get the page rendered once.
    #[test]
    fn the_page_is_rendered_once_per_window() {
        let (m, renders) = counting(Duration::from_secs(600));
        for _ in 0..5 {
            assert_eq!(fetch(m.addr(), Duration::from_secs(10)).unwrap(), "n 1\n");
        }
        assert_eq!(renders.load(Ordering::SeqCst), 1);
        // No window: every request renders (so the count above is the cache's doing).
        let (m, renders) = counting(Duration::ZERO);
        assert_eq!(fetch(m.addr(), Duration::from_secs(10)).unwrap(), "n 1\n");
        assert_eq!(fetch(m.addr(), Duration::from_secs(10)).unwrap(), "n 2\n");
        assert_eq!(renders.load(Ordering::SeqCst), 2);
    }

    /// Stalled peers hold every slot: further connections get 503 with
    /// Retry-After, and the page again once the stalled peers leave.
    #[test]
    fn connections_beyond_the_slots_get_503() {
        let render: Arc<Render> = Arc::new(|| Ok("up 1\n".to_string()));
        let m = MetricsServer::start_with(
            "127.0.0.1:0".parse().unwrap(),
            opts(2, Duration::from_secs(600), CACHE_FOR),
            render,
        )
        .unwrap();
        let stalled: Vec<TcpStream> = (0..2)
            .map(|_| {
                let mut s = TcpStream::connect(m.addr()).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        // Accepted in order: these come after the stalled ones.
        for _ in 0..5 {
            let mut s = TcpStream::connect(m.addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            assert!(out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{out:?}");
            assert!(out.contains(&format!("\r\nRetry-After: {RETRY_AFTER_S}\r\n")), "{out:?}");
        }
        drop(stalled);
        let started = Instant::now();
        while fetch(m.addr(), Duration::from_secs(5)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "the slots were never freed");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A connection left idle and a page whose rendering hangs do not hold
    /// up dropping the server (it used to join every connection thread).
    #[test]
    fn dropping_the_server_does_not_wait_for_its_peers() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, release_rx) = (Mutex::new(started_tx), Mutex::new(release_rx));
        let m = MetricsServer::start("127.0.0.1:0".parse().unwrap(), move || {
            let _ = started_tx.lock().unwrap().send(());
            let _ = release_rx.lock().unwrap().recv_timeout(Duration::from_secs(120));
            Ok("up 1\n".into())
        })
        .unwrap();
        let addr = m.addr();
        let _idle = TcpStream::connect(addr).unwrap();
        let client = std::thread::spawn(move || fetch(addr, Duration::from_secs(150)));
        started.recv_timeout(Duration::from_secs(30)).expect("the page is being rendered");
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(m);
            let _ = done_tx.send(());
        });
        let dropped = done.recv_timeout(Duration::from_secs(20));
        let _ = release.send(());
        dropped.expect("dropping the server waited for its connections");
        assert_eq!(client.join().unwrap().unwrap(), "up 1\n", "the page being rendered is still answered");
    }

    /// A peer that trickles its answer a byte at a time still meets the
    /// fetch's one deadline, and the error says so.
    #[test]
    fn fetch_has_one_deadline_for_everything() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            for _ in 0..600 {
                if s.write_all(b"H").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(fetch(addr, Duration::from_secs(1)));
        });
        let r = rx.recv_timeout(Duration::from_secs(30)).expect("fetch stalled past its deadline");
        let e = r.unwrap_err();
        assert!(matches!(e, FetchError::Timeout { .. }), "{e:?}");
        assert_eq!(e.to_string(), format!("no answer from {addr} within 1 s"));
    }

    /// Slow and silent peers fill the slots; more connections get 503;
    /// once the deadline passes, the page is served again.
    #[test]
    fn stalled_peers_do_not_stop_the_port() {
        let render: Arc<Render> = Arc::new(|| {
            let mut t = crate::Text::new(&[("server", "test")]);
            t.single("up", crate::Kind::Gauge, "Up.", 1);
            Ok(t.finish())
        });
        let m = MetricsServer::start_with(
            "127.0.0.1:0".parse().unwrap(),
            opts(4, Duration::from_secs(1), CACHE_FOR),
            render,
        )
        .unwrap();
        let stalled: Vec<TcpStream> = (0..4)
            .map(|_| {
                let mut s = TcpStream::connect(m.addr()).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                s
            })
            .collect();
        let extra: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(m.addr()).unwrap()).collect();
        for mut s in extra {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut out = Vec::new();
            // 503 (or, on a machine so loaded that a stalled peer's time
            // ran out first, served and timed out itself): never the page.
            let _ = s.read_to_end(&mut out);
            assert!(
                out.starts_with(b"HTTP/1.1 503") || out.starts_with(b"HTTP/1.1 408"),
                "{}",
                String::from_utf8_lossy(&out)
            );
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
