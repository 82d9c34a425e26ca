//! `dafne nbd serve`: a dafne file exported as a Network Block Device (the
//! MXBD idea of seed 002: a block device whose blocks are striped over the
//! io servers). The protocol and serving loop live in `dafne_nbd`; this is
//! its backend over the client library and the command around it.
//!
//! # Data path and copies
//! Every READ and WRITE travels through buffers registered once with UCX
//! (a pool of 1 MiB regions from [`DataClient::allocate`], at most
//! `--buffer-mib` of them for all connections together): a WRITE's payload
//! is read from the socket straight into them and the io servers get it by
//! RMA; a READ's data is put there by the io servers' RMA and sent to the
//! socket from them. So the one copy left on each side is the socket's (the
//! kernel copies between the TCP or Unix socket and these buffers), which
//! NBD's byte stream makes unavoidable. A request of up to 32 MiB takes
//! `len / 1 MiB` regions, moved in parallel (each stripe-aligned piece to
//! its server).
//!
//! # Mapping
//! READ/WRITE → `read_region`/`write_region` (FUA → a `DataSync` write);
//! FLUSH → `Sync` on every io server of the file (their caches written back
//! and fsynced), which covers writes from every connection, so the export
//! offers `CAN_MULTI_CONN`; TRIM → `fallocate` punch hole; WRITE_ZEROES →
//! punch hole, or zero range when the client says `NO_HOLE`. The size is
//! the file's size when serving starts; it is fixed while served.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dafne_client::data::DataClient;
use dafne_client::{Errno, FileType, OpenFile};
use dafne_nbd::{Backend, Buffer, ExportConfig, Listener, NbdError, Server};
use dafne_proto::io::{AllocateMode, Stability};
use dafne_transport::{Access, Region};

use crate::copy::{errno, parent_of, Session};

/// Bytes per registered buffer of the pool.
pub const UNIT: usize = 1 << 20;

#[derive(Debug, clap::Subcommand)]
pub enum NbdCmd {
    /// Export a dafne file as an NBD block device (fixed newstyle; for
    /// qemu, nbdcopy, nbdinfo, nbdsh, fio's nbd engine, the kernel's
    /// nbd-client). Prints the URI and serves until SIGINT or SIGTERM.
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Log in with this per-client credential instead of the cluster secret.
    #[arg(long, value_name = "FILE")]
    pub credential: Option<PathBuf>,
    /// The file in dafne to export (e.g. /images/disk.raw).
    #[arg(long)]
    pub file: String,
    /// Create the file with this size when it does not exist (K/M/G/T
    /// suffixes; sparse: nothing is stored until written).
    #[arg(long)]
    pub size: Option<String>,
    /// TCP address to listen on (port 0: any free port, printed).
    #[arg(long, default_value = "127.0.0.1:10809", conflicts_with = "socket")]
    pub listen: SocketAddr,
    /// Listen on a Unix socket at this path instead of TCP.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The export's name (clients asking for "" get it too).
    #[arg(long, default_value = "dafne")]
    pub export_name: String,
    /// Refuse writes, trims and zeroing (the file is opened read-only).
    #[arg(long)]
    pub read_only: bool,
    /// Registered memory for requests in flight, all clients together, in
    /// MiB (at least 32: one request may move 32 MiB; at most half of the
    /// machine's MemAvailable).
    #[arg(long, default_value_t = 64)]
    pub buffer_mib: usize,
    /// Requests one connection runs at once.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
}

/// The registered buffers of an export: at most `max` regions of [`UNIT`]
/// bytes, allocated as first needed and kept. A request takes all the
/// regions it needs at once or waits (so two large requests never hold
/// half each). A region whose request failed may still be the target of a
/// late RMA from a server: it is held aside, unused, for the data client's
/// `failed_request_hold` before it is freed.
struct Pool {
    data: DataClient,
    state: Mutex<PoolState>,
    freed: Condvar,
    max: usize,
}

struct PoolState {
    free: Vec<Region>,
    /// Regions in existence (free, lent, or held aside).
    count: usize,
    held: VecDeque<(Instant, Region)>,
}

impl Pool {
    fn take(self: &Arc<Pool>, len: usize) -> Result<DafneBuf, NbdError> {
        let n = len.div_ceil(UNIT).max(1);
        if n > self.max {
            return Err(NbdError::Overflow);
        }
        let hold = self.data.failed_request_hold();
        let mut st = self.state.lock().map_err(|_| NbdError::Io)?;
        loop {
            while st.held.front().is_some_and(|(t, _)| t.elapsed() >= hold) {
                st.held.pop_front();
                st.count -= 1;
            }
            let can_make = self.max - st.count;
            if st.free.len() + can_make >= n {
                let from_free = n.min(st.free.len());
                let at = st.free.len() - from_free;
                let mut regions: Vec<Region> = st.free.drain(at..).collect();
                while regions.len() < n {
                    let r = self.data.allocate(UNIT, Access::RemoteReadWrite).map_err(|e| {
                        tracing::warn!("nbd: registering a request buffer: {e}");
                        NbdError::NoMem
                    });
                    match r {
                        Ok(r) => {
                            st.count += 1;
                            regions.push(r);
                        }
                        Err(e) => {
                            st.free.extend(regions);
                            return Err(e);
                        }
                    }
                }
                return Ok(DafneBuf { regions, pool: self.clone(), failed: false });
            }
            // Held regions free themselves with time: wake up for them.
            let wait = st.held.front().map(|(t, _)| hold.saturating_sub(t.elapsed()));
            st = match wait {
                Some(d) => self.freed.wait_timeout(st, d).map_err(|_| NbdError::Io)?.0,
                None => self.freed.wait(st).map_err(|_| NbdError::Io)?,
            };
        }
    }

    fn give_back(&self, regions: Vec<Region>, failed: bool) {
        let Ok(mut st) = self.state.lock() else { return };
        if failed {
            let now = Instant::now();
            st.held.extend(regions.into_iter().map(|r| (now, r)));
        } else {
            st.free.extend(regions);
        }
        self.freed.notify_all();
    }
}

/// A request's memory: one or more registered regions, in order.
pub struct DafneBuf {
    regions: Vec<Region>,
    pool: Arc<Pool>,
    /// A request through it failed: the servers may still reach it.
    failed: bool,
}

impl Drop for DafneBuf {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.regions), self.failed);
    }
}

impl Buffer for DafneBuf {
    fn fill_from(&mut self, r: &mut dyn Read, len: usize) -> std::io::Result<()> {
        let mut left = len;
        for region in &mut self.regions {
            let n = left.min(UNIT);
            r.read_exact(&mut region.as_mut_slice()[..n])?;
            left -= n;
        }
        Ok(())
    }

    fn send_to(&self, w: &mut dyn Write, len: usize) -> std::io::Result<()> {
        let mut left = len;
        for region in &self.regions {
            let n = left.min(UNIT);
            w.write_all(&region.as_slice()[..n])?;
            left -= n;
        }
        Ok(())
    }
}

/// The NBD error a client library errno becomes.
fn nbd_error(e: Errno) -> NbdError {
    match e {
        Errno::EPERM | Errno::EACCES | Errno::EROFS => NbdError::Perm,
        Errno::ENOSPC | Errno::EDQUOT => NbdError::NoSpc,
        Errno::ENOMEM => NbdError::NoMem,
        Errno::EINVAL => NbdError::Inval,
        Errno::EFBIG | Errno::EOVERFLOW => NbdError::Overflow,
        Errno::EOPNOTSUPP => NbdError::NotSup,
        _ => NbdError::Io,
    }
}

/// A dafne file as an export.
pub struct DafneExport {
    session: Session,
    file: OpenFile,
    size: u64,
    read_only: bool,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for DafneExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DafneExport").field("size", &self.size).field("read_only", &self.read_only).finish()
    }
}

impl Drop for DafneExport {
    fn drop(&mut self) {
        let _ = self.session.meta.close(self.file.layout.object_id);
    }
}

impl DafneExport {
    /// Opens (or, with `create_size`, creates) `path` in dafne for export.
    pub fn open(
        session: Session,
        path: &str,
        create_size: Option<u64>,
        read_only: bool,
        buffer_mib: usize,
    ) -> Result<DafneExport> {
        let meta = &session.meta;
        let flags = if read_only { dafne_proto::OPEN_READ } else { dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE };
        let (file, size) = match meta.resolve(path) {
            Ok(attr) => {
                if attr.kind != FileType::Regular {
                    bail!("dafne:{path} is not a regular file: export a file (e.g. --file /disk.raw --size 1G)");
                }
                if let Some(s) = create_size.filter(|&s| s != attr.size) {
                    bail!("dafne:{path} exists with {} bytes, not {s}: drop --size to export it as it is", attr.size);
                }
                if attr.size == 0 {
                    bail!("dafne:{path} is empty: a block device needs a size (remove it and pass --size, e.g. 1G)");
                }
                (meta.open(attr.ino, flags).map_err(|e| errno("opening", path, e))?, attr.size)
            }
            Err(Errno::ENOENT) => {
                let Some(size) = create_size else {
                    bail!("dafne:{path} does not exist: pass --size (e.g. --size 1G) to create it");
                };
                if read_only {
                    bail!("dafne:{path} does not exist, and --read-only cannot create it");
                }
                let (parent, name) = parent_of(meta, path)?;
                let attr = meta.create(parent, &name, 0o644, true).map_err(|e| errno("creating", path, e))?;
                let f = meta.open(attr.ino, flags).map_err(|e| errno("opening", path, e))?;
                futures::executor::block_on(session.data.truncate(&f, size)).map_err(|e| errno("sizing", path, e))?;
                meta.setattr(attr.ino, dafne_proto::SetAttr { size: Some(size), ..Default::default() })
                    .map_err(|e| errno("setting the size of", path, e))?;
                (f, size)
            }
            Err(e) => return Err(errno("resolving", path, e)),
        };
        let max = buffer_mib.max(dafne_nbd::proto::MAX_PAYLOAD as usize / UNIT);
        let pool = Arc::new(Pool {
            data: session.data.clone(),
            state: Mutex::new(PoolState { free: Vec::new(), count: 0, held: VecDeque::new() }),
            freed: Condvar::new(),
            max,
        });
        Ok(DafneExport { session, file, size, read_only, pool })
    }

    /// Releases the file's open in meta now (at exit, where `Drop` does
    /// not run).
    fn close(&self) {
        let _ = self.session.meta.close(self.file.layout.object_id);
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = Result<T, Errno>>) -> Result<T, NbdError> {
        futures::executor::block_on(f).map_err(nbd_error)
    }

    /// Reads (`write` None) or writes each region's share of
    /// `[offset, offset + len)`, all at once.
    fn each_region(&self, offset: u64, len: u32, buf: &mut DafneBuf, write: Option<Stability>) -> Result<(), NbdError> {
        let (data, f, len) = (&self.session.data, &self.file, len as usize);
        let calls = buf.regions.iter().enumerate().take_while(|(i, _)| i * UNIT < len).map(|(i, r)| {
            let (at, n) = (offset + (i * UNIT) as u64, (len - i * UNIT).min(UNIT));
            async move {
                match write {
                    None => data.read_region(f, at, r, 0, n).await,
                    Some(stability) => data.write_region(f, at, r, 0, n, stability).await,
                }
            }
        });
        let results = futures::executor::block_on(futures::future::join_all(calls));
        if let Some(e) = results.into_iter().find_map(|r| r.err()) {
            buf.failed = true;
            return Err(nbd_error(e));
        }
        Ok(())
    }
}

impl Backend for DafneExport {
    type Buf = DafneBuf;

    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn buffer(&self, len: usize) -> Result<DafneBuf, NbdError> {
        self.pool.take(len)
    }

    fn read(&self, offset: u64, len: u32, buf: &mut DafneBuf) -> Result<(), NbdError> {
        self.each_region(offset, len, buf, None)
    }

    fn write(&self, offset: u64, len: u32, buf: &mut DafneBuf, fua: bool) -> Result<(), NbdError> {
        let stability = if fua { Stability::DataSync } else { Stability::Unstable };
        self.each_region(offset, len, buf, Some(stability))
    }

    fn flush(&self) -> Result<(), NbdError> {
        self.block_on(self.session.data.sync(&self.file))
    }

    fn trim(&self, offset: u64, len: u32) -> Result<(), NbdError> {
        self.block_on(self.session.data.fallocate(&self.file, offset, u64::from(len), AllocateMode::PunchHole))
    }

    fn write_zeroes(&self, offset: u64, len: u32, may_punch: bool, fua: bool) -> Result<(), NbdError> {
        let mode = if may_punch { AllocateMode::PunchHole } else { AllocateMode::ZeroRangeKeepSize };
        self.block_on(self.session.data.fallocate(&self.file, offset, u64::from(len), mode))?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }
}

/// Where `serve` listens, made ready before anything is printed.
fn listen(a: &ServeArgs) -> Result<(Listener, String)> {
    let name = &a.export_name;
    if let Some(path) = &a.socket {
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is in use by a running server: pass another --socket", path.display());
            }
            // A socket left by a server that died: nobody listens on it.
            std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        let l = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("listening on {}: pass another --socket", path.display()))?;
        return Ok((Listener::Unix(l), format!("nbd+unix:///{name}?socket={}", path.display())));
    }
    let l = std::net::TcpListener::bind(a.listen).map_err(|e| {
        anyhow::anyhow!(
            "listening on {}: {e} (pass --listen with a free port, or port 0 for any, e.g. --listen 127.0.0.1:0)",
            a.listen
        )
    })?;
    let at = l.local_addr()?;
    Ok((Listener::Tcp(l), format!("nbd://{at}/{name}")))
}

pub fn run(cmd: NbdCmd, parse_size: impl Fn(&str) -> Result<usize>) -> Result<()> {
    let NbdCmd::Serve(a) = cmd;
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    if !a.file.starts_with('/') {
        bail!("--file {:?}: give the path in dafne from its root, e.g. --file /{}", a.file, a.file);
    }
    let size = a.size.as_deref().map(|s| parse_size(s).map(|n| n as u64)).transpose()?;
    if a.workers == 0 || a.workers > 256 {
        bail!("--workers {} must be between 1 and 256", a.workers);
    }
    if a.buffer_mib < 32 {
        bail!("--buffer-mib {} is below 32: one NBD request may move 32 MiB", a.buffer_mib);
    }
    // Registered memory comes from /dev/shm on one host: a pool larger
    // than the machine can give would fill it and wake the OOM killer.
    if let Some(avail) = crate::cluster::mem_available_mib() {
        if a.buffer_mib as u64 > avail / 2 {
            bail!(
                "--buffer-mib {} is more than half of the memory available ({avail} MiB, MemAvailable in \
                 /proc/meminfo): give at most {}",
                a.buffer_mib,
                avail / 2
            );
        }
    }
    let (listener, uri) = listen(&a)?;
    let session = crate::copy::connect(&dir, "nbd", a.credential.as_deref())?;
    let export = Arc::new(DafneExport::open(session, &a.file, size, a.read_only, a.buffer_mib)?);
    let cfg = ExportConfig {
        name: a.export_name.clone(),
        description: format!("dafne:{}", a.file),
        workers: a.workers,
        ..Default::default()
    };
    let server = Server::new(export.clone(), cfg);
    println!(
        "serving dafne:{} ({} bytes{}) at {uri}",
        a.file,
        export.size,
        if a.read_only { ", read-only" } else { "" }
    );
    std::io::stdout().flush()?;
    let signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .context("installing signal handlers")?;
    let s = server.clone();
    std::thread::Builder::new().name("nbd-accept".into()).spawn(move || {
        if let Err(e) = s.serve(listener) {
            eprintln!("error: nbd server stopped: {e}");
            std::process::exit(1);
        }
    })?;
    let mut signals = signals;
    let sig = signals.forever().next();
    // Connections still open are cut; what they had written reaches the
    // disks here (and the io servers write back their caches anyway).
    let flushed = if export.read_only { Ok(()) } else { export.flush() };
    if let Some(p) = &a.socket {
        let _ = std::fs::remove_file(p);
    }
    let st = server.stats();
    use std::sync::atomic::Ordering::Relaxed;
    // Whoever started the server may have stopped reading its output.
    let _ = writeln!(
        std::io::stdout(),
        "stopped (signal {}): {} connections, {} requests, {} bytes read, {} written, {} error replies, {} closed for protocol errors",
        sig.unwrap_or(0),
        st.connections.load(Relaxed),
        st.requests.load(Relaxed),
        st.bytes_read.load(Relaxed),
        st.bytes_written.load(Relaxed),
        st.error_replies.load(Relaxed),
        st.protocol_errors.load(Relaxed)
    );
    export.close();
    flushed.map_err(|e| anyhow::anyhow!("flushing dafne:{} at exit: NBD error {e:?}", a.file))?;
    // Threads still serving hold the export; leave without waiting for them.
    std::process::exit(0)
}
