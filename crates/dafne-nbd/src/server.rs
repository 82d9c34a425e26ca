//! The serving loop: a handshake per connection, then a reader that takes
//! requests off the socket and hands them to a pool of workers, which run
//! them on the [`Backend`] and answer each as soon as it is done, so
//! requests overlap and replies go out in completion order, each naming
//! its request by the client's handle.
//!
//! # Bounds (a client is not trusted)
//! * Bytes: a request header is 28 bytes; an option at most
//!   [`MAX_OPTION`](crate::proto::MAX_OPTION); a READ or WRITE at most
//!   [`MAX_PAYLOAD`](crate::proto::MAX_PAYLOAD) (32 MiB), and its buffer
//!   comes from the backend, which bounds the memory of all connections
//!   together (the dafne backend: a pool of registered buffers).
//! * Requests in flight per connection: the workers plus the queue in
//!   front of them and the one the reader holds, `2 × workers + 1` in all;
//!   the reader stops reading the socket past that, and TCP flow control
//!   stops the client.
//! * Connections: at most [`ExportConfig::max_connections`]; one more is
//!   closed as it arrives. The whole handshake must end within
//!   [`HANDSHAKE_TIMEOUT`] and within [`MAX_OPTIONS`] options.
//! * Time: a WRITE's whole payload must arrive, and a whole reply be
//!   taken, within [`STALL_TIMEOUT`] of its start; a client that stalls or
//!   trickles there would hold buffers all connections share, and is
//!   disconnected. Idle between requests is fine. These are deadlines on
//!   the whole exchange, not on each read or write: the socket's timeout is
//!   set to the time left before every system call ([`Timed`]), so a client
//!   sending a byte now and then cannot stretch them.
//! * A stream that stops making sense (a wrong magic, a WRITE above the
//!   limit, an option above its limit, a client that does not speak the
//!   fixed newstyle handshake) is closed; requests already taken finish
//!   first. Nothing a client sends ends the server.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::proto::{self, Command, NbdError, ProtoError, Request};

/// How long a client may take over its whole handshake (the default of
/// [`ExportConfig::handshake_timeout`]).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client may take to send a WRITE's whole payload once its
/// header came, and to take a whole reply the server is writing (the
/// default of [`ExportConfig::stall_timeout`]): a client that stalls there
/// holds buffers every connection shares, so it is disconnected. (Between
/// requests a client may stay idle as long as it likes.)
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Options a client may send before it chooses an export.
pub const MAX_OPTIONS: usize = 256;
/// The preferred block size announced (`NBD_INFO_BLOCK_SIZE`).
pub const PREFERRED_BLOCK: u32 = 4096;

/// Memory a request's data travels through: filled from the socket for a
/// WRITE, sent to it for a READ.
pub trait Buffer: Send + 'static {
    /// Reads exactly `len` bytes from `r` into the buffer's first `len`.
    fn fill_from(&mut self, r: &mut dyn Read, len: usize) -> io::Result<()>;
    /// Writes the buffer's first `len` bytes to `w`.
    fn send_to(&self, w: &mut dyn Write, len: usize) -> io::Result<()>;
}

/// The byte store an export serves. Calls come from several threads at
/// once (one per request in flight).
pub trait Backend: Send + Sync + 'static {
    type Buf: Buffer;
    /// The export's size in bytes (fixed while it is served).
    fn size(&self) -> u64;
    fn read_only(&self) -> bool;
    /// A buffer of at least `len` (≤ `MAX_PAYLOAD`) bytes; may wait until
    /// memory is free.
    fn buffer(&self, len: usize) -> Result<Self::Buf, NbdError>;
    fn read(&self, offset: u64, len: u32, buf: &mut Self::Buf) -> Result<(), NbdError>;
    /// Writes; `fua`: durable before this returns.
    fn write(&self, offset: u64, len: u32, buf: &mut Self::Buf, fua: bool) -> Result<(), NbdError>;
    /// Makes every write completed so far durable, from every connection
    /// (this is what `NBD_FLAG_CAN_MULTI_CONN` promises).
    fn flush(&self) -> Result<(), NbdError>;
    /// Discards a range: it reads as zeros afterwards.
    fn trim(&self, offset: u64, len: u32) -> Result<(), NbdError>;
    /// Zeroes a range, freeing its blocks when `may_punch`.
    fn write_zeroes(&self, offset: u64, len: u32, may_punch: bool, fua: bool) -> Result<(), NbdError>;
}

/// What an export is called and how it is served.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The export's name (a client asking for "" gets it too).
    pub name: String,
    pub description: String,
    /// Requests one connection runs at once.
    pub workers: usize,
    pub max_connections: usize,
    /// The deadline of a connection's whole handshake.
    pub handshake_timeout: Duration,
    /// The deadline of a WRITE's whole payload and of a whole reply.
    pub stall_timeout: Duration,
}

impl Default for ExportConfig {
    fn default() -> Self {
        ExportConfig {
            name: String::new(),
            description: String::new(),
            workers: 16,
            max_connections: 32,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            stall_timeout: STALL_TIMEOUT,
        }
    }
}

/// Counters of a server (all connections).
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub refused_connections: AtomicU64,
    /// Connections closed because their bytes made no sense.
    pub protocol_errors: AtomicU64,
    pub requests: AtomicU64,
    pub error_replies: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

/// A connected client, over TCP or a Unix socket.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// A stream under a deadline: before every read or write system call the
/// socket's timeout becomes the time left (an error once none is), so the
/// deadline bounds a whole exchange however the client paces its bytes.
/// Without a deadline it waits as long as it takes.
#[derive(Debug)]
pub(crate) struct Timed {
    s: Stream,
    deadline: Option<Instant>,
    /// A timeout is set on the socket (to clear when the deadline goes).
    armed: bool,
}

impl Timed {
    fn new(s: Stream) -> Timed {
        Timed { s, deadline: None, armed: false }
    }

    /// From now on, `limit` from now is the deadline.
    fn start(&mut self, limit: Duration) {
        self.deadline = Some(Instant::now() + limit);
    }

    /// No deadline from now on.
    fn stop(&mut self) {
        self.deadline = None;
    }

    /// The timeout for the next system call: the time left, or none.
    fn left(&mut self) -> io::Result<Option<Duration>> {
        match self.deadline {
            None if !self.armed => Ok(None),
            None => {
                self.armed = false;
                Ok(None)
            }
            Some(d) => match d.checked_duration_since(Instant::now()).filter(|t| !t.is_zero()) {
                Some(t) => {
                    self.armed = true;
                    Ok(Some(t))
                }
                None => Err(too_long()),
            },
        }
    }

    /// `r`, with a socket timeout under the deadline said as such.
    fn said<T>(&self, r: io::Result<T>) -> io::Result<T> {
        match r {
            Err(e)
                if self.deadline.is_some()
                    && matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
            {
                Err(too_long())
            }
            r => r,
        }
    }
}

fn too_long() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the client took too long")
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let was = self.armed;
        let t = self.left()?;
        if t.is_some() || was {
            self.s.set_read_timeout(t)?;
        }
        let r = self.s.read(buf);
        self.said(r)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let was = self.armed;
        let t = self.left()?;
        if t.is_some() || was {
            self.s.set_write_timeout(t)?;
        }
        let r = self.s.write(buf);
        self.said(r)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

/// Where clients connect.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                // Replies are small and written whole: send them at once.
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Listener::Unix(l) => Stream::Unix(l.accept()?.0),
        })
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    #[error("the client asked for export {0:?}, which is not served here")]
    UnknownExport(String),
    #[error("the handshake took more than {MAX_OPTIONS} options")]
    TooManyOptions,
    /// A bug: a worker panicked (the connection ends, the server goes on).
    #[error("a request's worker panicked")]
    WorkerPanicked,
}

/// An NBD server of one export.
#[derive(Debug)]
pub struct Server<B: Backend> {
    backend: Arc<B>,
    cfg: ExportConfig,
    stats: Arc<Stats>,
    active: Arc<AtomicUsize>,
}

impl<B: Backend> Clone for Server<B> {
    fn clone(&self) -> Self {
        Server {
            backend: self.backend.clone(),
            cfg: self.cfg.clone(),
            stats: self.stats.clone(),
            active: self.active.clone(),
        }
    }
}

/// What the handshake ended with.
enum Handshake {
    Transmit,
    Abort,
}

/// One request taken off the socket.
struct Job<T> {
    handle: u64,
    cmd: Command,
    buf: Option<T>,
}

type Writer = Arc<Mutex<BufWriter<Timed>>>;

impl<B: Backend> Server<B> {
    pub fn new(backend: Arc<B>, cfg: ExportConfig) -> Server<B> {
        Server { backend, cfg, stats: Arc::default(), active: Arc::default() }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The transmission flags of this export.
    pub fn flags(&self) -> u16 {
        let mut f = proto::TF_HAS_FLAGS | proto::TF_SEND_FLUSH | proto::TF_CAN_MULTI_CONN;
        if self.backend.read_only() {
            f |= proto::TF_READ_ONLY;
        } else {
            f |= proto::TF_SEND_FUA | proto::TF_SEND_TRIM | proto::TF_SEND_WRITE_ZEROES;
        }
        f
    }

    /// Accepts clients forever, each on a thread of its own.
    pub fn serve(&self, listener: Listener) -> io::Result<()> {
        loop {
            let s = match listener.accept() {
                Ok(s) => s,
                // A client that went before we took it, or a full fd
                // table: wait a little rather than spin.
                Err(e) => {
                    tracing::warn!("nbd: accepting a client: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            if self.active.fetch_add(1, Ordering::AcqRel) >= self.cfg.max_connections {
                self.active.fetch_sub(1, Ordering::AcqRel);
                self.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("nbd: more than {} clients: one refused", self.cfg.max_connections);
                s.shutdown();
                continue;
            }
            let me = self.clone();
            let spawned = std::thread::Builder::new().name("nbd-conn".into()).spawn(move || {
                if let Err(e) = me.serve_stream(s) {
                    tracing::warn!("nbd: a client's connection ended: {e}");
                }
                me.active.fetch_sub(1, Ordering::AcqRel);
            });
            if let Err(e) = spawned {
                self.active.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!("nbd: no thread for a client: {e}");
            }
        }
    }

    /// Serves one connection to its end (the client's `NBD_CMD_DISC`, its
    /// going away, or a protocol error).
    pub fn serve_stream(&self, s: Stream) -> Result<(), ConnError> {
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let r = self.serve_inner(&s);
        if let Err(ConnError::Proto(_) | ConnError::UnknownExport(_) | ConnError::TooManyOptions) = &r {
            self.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
        }
        s.shutdown();
        r
    }

    fn serve_inner(&self, s: &Stream) -> Result<(), ConnError> {
        let mut r = BufReader::with_capacity(64 << 10, Timed::new(s.try_clone()?));
        let mut w = Timed::new(s.try_clone()?);
        // One deadline for the whole handshake, both directions.
        r.get_mut().start(self.cfg.handshake_timeout);
        w.start(self.cfg.handshake_timeout);
        match self.handshake(&mut r, &mut w)? {
            Handshake::Abort => return Ok(()),
            Handshake::Transmit => {}
        }
        r.get_mut().stop();
        w.stop();
        let w: Writer = Arc::new(Mutex::new(BufWriter::with_capacity(64 << 10, w)));
        self.transmit(r, w, s)
    }

    fn handshake(&self, r: &mut impl Read, w: &mut impl Write) -> Result<Handshake, ConnError> {
        w.write_all(&proto::greeting())?;
        w.flush()?;
        let mut flags = [0u8; 4];
        r.read_exact(&mut flags)?;
        let no_zeroes = proto::decode_client_flags(flags)?;
        let name = self.cfg.name.as_bytes();
        let size = self.backend.size();
        for _ in 0..MAX_OPTIONS {
            let mut h = [0u8; proto::OPTION_LEN];
            r.read_exact(&mut h)?;
            let h = proto::decode_option_header(&h)?;
            let mut data = vec![0u8; h.len as usize];
            r.read_exact(&mut data)?;
            let reply =
                |w: &mut dyn Write, kind: u32, d: &[u8]| w.write_all(&proto::encode_option_reply(h.option, kind, d));
            match h.option {
                proto::OPT_EXPORT_NAME => {
                    if !data.is_empty() && data != name {
                        // The spec's only answer to an unknown name here.
                        return Err(ConnError::UnknownExport(String::from_utf8_lossy(&data).into_owned()));
                    }
                    w.write_all(&proto::export_name_reply(size, self.flags(), no_zeroes))?;
                    w.flush()?;
                    return Ok(Handshake::Transmit);
                }
                proto::OPT_ABORT => {
                    // The client may already have gone.
                    let _ = reply(w, proto::REP_ACK, &[]).and_then(|_| w.flush());
                    return Ok(Handshake::Abort);
                }
                proto::OPT_LIST if !data.is_empty() => reply(w, proto::REP_ERR_INVALID, &[])?,
                proto::OPT_LIST => {
                    reply(w, proto::REP_SERVER, &proto::list_entry(name, self.cfg.description.as_bytes()))?;
                    reply(w, proto::REP_ACK, &[])?;
                }
                proto::OPT_INFO | proto::OPT_GO => match proto::decode_go(&data) {
                    None => reply(w, proto::REP_ERR_INVALID, &[])?,
                    Some(go) if !go.name.is_empty() && go.name != name => reply(w, proto::REP_ERR_UNKNOWN, &[])?,
                    Some(go) => {
                        reply(w, proto::REP_INFO, &proto::info_export(size, self.flags()))?;
                        for info in go.infos {
                            let d = match info {
                                proto::INFO_NAME => proto::info_text(info, name),
                                proto::INFO_DESCRIPTION => proto::info_text(info, self.cfg.description.as_bytes()),
                                proto::INFO_BLOCK_SIZE => {
                                    proto::info_block_size(1, PREFERRED_BLOCK, proto::MAX_PAYLOAD)
                                }
                                _ => continue,
                            };
                            reply(w, proto::REP_INFO, &d)?;
                        }
                        reply(w, proto::REP_ACK, &[])?;
                        if h.option == proto::OPT_GO {
                            w.flush()?;
                            return Ok(Handshake::Transmit);
                        }
                    }
                },
                // TLS, structured replies and the rest: not offered (the
                // client goes on without them).
                _ => reply(w, proto::REP_ERR_UNSUP, &[])?,
            }
            w.flush()?;
        }
        Err(ConnError::TooManyOptions)
    }

    fn transmit(&self, mut r: BufReader<Timed>, w: Writer, s: &Stream) -> Result<(), ConnError> {
        let workers = self.cfg.workers.max(1);
        let (tx, rx) = crossbeam_channel::bounded::<Job<B::Buf>>(workers);
        let mut pool = Vec::with_capacity(workers);
        for _ in 0..workers {
            let (me, rx, w, s) = (self.clone(), rx.clone(), w.clone(), s.try_clone()?);
            pool.push(std::thread::Builder::new().name("nbd-worker".into()).spawn(move || {
                for job in rx {
                    if let Err(e) = me.run(job, &w) {
                        // The client is gone: stop its reader too.
                        tracing::debug!("nbd: sending a reply: {e}");
                        s.shutdown();
                        break;
                    }
                }
            })?);
        }
        let mut result = self.read_requests(&mut r, &w, &tx);
        // Requests already taken finish (and are answered if the client
        // still listens) before the connection closes.
        drop(tx);
        for t in pool {
            if t.join().is_err() {
                result = Err(ConnError::WorkerPanicked);
            }
        }
        let _ = w.lock().map(|mut w| w.flush());
        result
    }

    fn read_requests(
        &self,
        r: &mut BufReader<Timed>,
        w: &Writer,
        tx: &crossbeam_channel::Sender<Job<B::Buf>>,
    ) -> Result<(), ConnError> {
        let size = self.backend.size();
        let read_only = self.backend.read_only();
        loop {
            let mut h = [0u8; proto::REQUEST_LEN];
            match r.read_exact(&mut h) {
                Ok(()) => {}
                // Gone without NBD_CMD_DISC: as good as one.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            let req = proto::decode_request(&h)?;
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            let job = match proto::check(&req, size, read_only) {
                Ok(Command::Disconnect) => return Ok(()),
                Ok(c @ Command::Write { len, .. }) => match self.backend.buffer(len as usize) {
                    Ok(mut buf) => {
                        // The whole payload must follow its header promptly.
                        r.get_mut().start(self.cfg.stall_timeout);
                        let filled = buf.fill_from(r, len as usize);
                        r.get_mut().stop();
                        filled?;
                        Job { handle: req.handle, cmd: c, buf: Some(buf) }
                    }
                    Err(e) => {
                        self.skip(r, req.len)?;
                        self.answer(w, req.handle, Some(e))?;
                        continue;
                    }
                },
                Ok(c @ Command::Read { len, .. }) => match self.backend.buffer(len as usize) {
                    Ok(buf) => Job { handle: req.handle, cmd: c, buf: Some(buf) },
                    Err(e) => {
                        self.answer(w, req.handle, Some(e))?;
                        continue;
                    }
                },
                Ok(c) => Job { handle: req.handle, cmd: c, buf: None },
                Err(e) => {
                    if req.kind == proto::CMD_WRITE {
                        self.skip(r, req.len)?;
                    }
                    self.answer(w, req.handle, Some(e))?;
                    continue;
                }
            };
            if tx.send(job).is_err() {
                // Every worker stopped: the client stopped reading.
                return Ok(());
            }
        }
    }

    /// Runs one request and answers it.
    fn run(&self, job: Job<B::Buf>, w: &Writer) -> io::Result<()> {
        let b = &*self.backend;
        let mut buf = job.buf;
        let result = match (job.cmd, buf.as_mut()) {
            (Command::Read { len: 0, .. } | Command::Write { len: 0, .. }, _) => Ok(()),
            (Command::Read { offset, len }, Some(buf)) => {
                let r = b.read(offset, len, buf);
                if r.is_ok() {
                    self.stats.bytes_read.fetch_add(u64::from(len), Ordering::Relaxed);
                }
                r
            }
            (Command::Write { offset, len, fua }, Some(buf)) => {
                let r = b.write(offset, len, buf, fua);
                if r.is_ok() {
                    self.stats.bytes_written.fetch_add(u64::from(len), Ordering::Relaxed);
                }
                r
            }
            (Command::Flush, _) => b.flush(),
            (Command::Trim { len: 0, .. } | Command::WriteZeroes { len: 0, .. }, _) => Ok(()),
            (Command::Trim { offset, len }, _) => b.trim(offset, len),
            (Command::WriteZeroes { offset, len, may_punch, fua }, _) => b.write_zeroes(offset, len, may_punch, fua),
            // A read or write always carries a buffer; a disconnect never
            // reaches a worker.
            (Command::Read { .. } | Command::Write { .. } | Command::Disconnect, _) => Err(NbdError::Inval),
        };
        match (job.cmd, result, buf.as_ref()) {
            (Command::Read { len, .. }, Ok(()), Some(buf)) if len > 0 => {
                let mut w = w.lock().map_err(|_| io::Error::other("reply lock poisoned"))?;
                w.get_mut().start(self.cfg.stall_timeout);
                let sent = w
                    .write_all(&proto::encode_reply(job.handle, None))
                    .and_then(|_| buf.send_to(&mut *w, len as usize))
                    .and_then(|_| w.flush());
                w.get_mut().stop();
                sent
            }
            (_, r, _) => self.answer(w, job.handle, r.err()),
        }
    }

    /// Reads and drops a refused WRITE's payload (at most `MAX_PAYLOAD`),
    /// under the same deadline as one taken.
    fn skip(&self, r: &mut BufReader<Timed>, len: u32) -> io::Result<()> {
        r.get_mut().start(self.cfg.stall_timeout);
        let n = io::copy(&mut r.by_ref().take(u64::from(len)), &mut io::sink());
        r.get_mut().stop();
        if n? < u64::from(len) {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    fn answer(&self, w: &Writer, handle: u64, error: Option<NbdError>) -> io::Result<()> {
        if error.is_some() {
            self.stats.error_replies.fetch_add(1, Ordering::Relaxed);
        }
        let mut w = w.lock().map_err(|_| io::Error::other("reply lock poisoned"))?;
        w.get_mut().start(self.cfg.stall_timeout);
        let sent = w.write_all(&proto::encode_reply(handle, error)).and_then(|_| w.flush());
        w.get_mut().stop();
        sent
    }
}

/// A request as a client sends it (for tests and tools).
pub fn request(kind: u16, flags: u16, handle: u64, offset: u64, len: u32) -> [u8; proto::REQUEST_LEN] {
    proto::encode_request(&Request { flags, kind, handle, offset, len })
}
