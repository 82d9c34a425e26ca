//! `dafne cp`: copies between local files and dafne through the client
//! library, without a mount: the DAFS way, from the application's own
//! process. Buffers are registered once (a few 8 MiB regions) and the io
//! servers move the bytes by RMA straight from and into them, several
//! stripes in parallel; progress is shown as it goes.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use dafne_client::data::DataClient;
use dafne_client::{Errno, FileType, MetaSession};
use dafne_proto::io::Stability;
use dafne_transport::{Access, Region};

use crate::cluster::ClusterInfo;

/// Bytes per registered buffer, and buffers in flight.
const CHUNK: usize = 8 << 20;
const DEPTH: usize = 4;

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// Source: a local file, or `dafne:/path` in the file system.
    pub src: String,
    /// Destination: a local file, or `dafne:/path` (one side must be dafne).
    pub dst: String,
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Replace an existing destination.
    #[arg(long, short)]
    pub force: bool,
    /// Log in with this per-client credential (`dafne credential issue`)
    /// instead of the cluster secret, which is then not read.
    #[arg(long, value_name = "FILE")]
    pub credential: Option<PathBuf>,
}

enum Side {
    Local(PathBuf),
    Dafne(String),
}

fn side(s: &str) -> Side {
    match s.strip_prefix("dafne:") {
        Some(p) => Side::Dafne(if p.starts_with('/') { p.to_string() } else { format!("/{p}") }),
        None => Side::Local(PathBuf::from(s)),
    }
}

struct Progress {
    start: Instant,
    last: Instant,
    total: u64,
    tty: bool,
}

impl Progress {
    fn new(total: u64) -> Progress {
        use std::io::IsTerminal as _;
        Progress { start: Instant::now(), last: Instant::now(), total, tty: std::io::stderr().is_terminal() }
    }

    fn update(&mut self, done: u64) {
        if self.last.elapsed().as_millis() < 500 {
            return;
        }
        self.last = Instant::now();
        let line = format!(
            "  {} / {} ({:.0}%)  {:.0} MiB/s",
            human(done),
            human(self.total),
            done as f64 * 100.0 / self.total.max(1) as f64,
            done as f64 / (1 << 20) as f64 / self.start.elapsed().as_secs_f64()
        );
        if self.tty {
            eprint!("\r{line}   ");
        } else {
            eprintln!("{line}");
        }
    }

    fn finish(&self, done: u64, what: &str) {
        let s = self.start.elapsed().as_secs_f64();
        if self.tty {
            eprint!("\r");
        }
        println!(
            "{what}: {} ({done} bytes) in {:.2} s, {:.0} MiB/s",
            human(done),
            s,
            done as f64 / (1 << 20) as f64 / s.max(1e-9)
        );
    }
}

fn human(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{b} B")
    }
}

pub(crate) fn errno(what: &str, path: &str, e: Errno) -> anyhow::Error {
    anyhow::anyhow!("{what} dafne:{path}: {e}")
}

/// Splits `/a/b/c` into the parent's inode and the last name.
pub(crate) fn parent_of(meta: &MetaSession, path: &str) -> Result<(u64, Vec<u8>)> {
    let trimmed = path.trim_end_matches('/');
    let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if name.is_empty() {
        bail!("dafne:{path}: name a file, not a directory");
    }
    let parent = meta.resolve(if dir.is_empty() { "/" } else { dir }).map_err(|e| errno("resolving", dir, e))?;
    if parent.kind != FileType::Directory {
        bail!("dafne:{dir} is not a directory");
    }
    Ok((parent.ino, name.as_bytes().to_vec()))
}

/// The client library connected to a running cluster from this process:
/// a metadata session as this process's user and the io servers. `dafne
/// cp` and the native rows of `dafne bench posix` use it.
pub(crate) type Session = dafne_client::cluster::Cluster;

/// Connects to the cluster of `dir` (which must be running: the CLI checks
/// its supervisor, for a better message than a connection timeout); `name`
/// names this client in the transport's logs and the metadata server's
/// sessions.
pub(crate) fn connect(dir: &Path, name: &str, credential: Option<&Path>) -> Result<Session> {
    connect_with(dir, name, credential, None)
}

/// [`connect`] with the client's event loop spin chosen (`None`: the
/// default).
pub(crate) fn connect_with(
    dir: &Path,
    name: &str,
    credential: Option<&Path>,
    spin: Option<std::time::Duration>,
) -> Result<Session> {
    let info = ClusterInfo::load(dir)?;
    let login = crate::cluster::ClientLogin::load(&info, credential)?;
    let file = dafne_client::cluster::ClusterFile {
        meta: info.meta,
        io: info.io.clone(),
        secret: info.secret.clone(),
        ucx: info.ucx.clone(),
    };
    let mut opts = dafne_client::cluster::OpenOptions::new(dir, name);
    opts.spin = spin;
    Session::connect(&file, &login.key, &opts).map_err(|(what, e)| {
        crate::cluster::explain_connect(&info, &login, e).context(format!("connecting to the {what}"))
    })
}

pub fn cp(a: CpArgs) -> Result<()> {
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    let (src, dst) = (side(&a.src), side(&a.dst));
    let s = connect(&dir, "cp", a.credential.as_deref())?;
    let (meta, data) = (&s.meta, &s.data);
    let mut regions = (0..DEPTH)
        .map(|_| data.allocate(CHUNK, Access::RemoteReadWrite))
        .collect::<Result<Vec<Region>, Errno>>()
        .map_err(|e| anyhow::anyhow!("registering copy buffers: {e}"))?;
    match (src, dst) {
        (Side::Local(from), Side::Dafne(to)) => upload(meta, data, &mut regions, &from, &to, a.force),
        (Side::Dafne(from), Side::Local(to)) => download(meta, data, &mut regions, &from, &to, a.force),
        _ => bail!("one side must be local and the other `dafne:/path` (e.g. `dafne cp big.bin dafne:/big.bin`)"),
    }
}

/// A file open in meta, closed there when dropped (also when a copy fails
/// half way): `cp` holds no file's data beyond its use of it.
struct Opened<'a> {
    meta: &'a MetaSession,
    file: dafne_client::OpenFile,
}

impl<'a> Opened<'a> {
    fn new(meta: &'a MetaSession, file: dafne_client::OpenFile) -> Opened<'a> {
        Opened { meta, file }
    }
}

impl std::ops::Deref for Opened<'_> {
    type Target = dafne_client::OpenFile;
    fn deref(&self) -> &dafne_client::OpenFile {
        &self.file
    }
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        // A failure (a lost connection) releases the open in meta anyway.
        let _ = self.meta.close(self.file.layout.object_id);
    }
}

fn upload(
    meta: &MetaSession,
    data: &DataClient,
    regions: &mut [Region],
    from: &Path,
    to: &str,
    force: bool,
) -> Result<()> {
    let mut src = File::open(from).with_context(|| format!("opening {}", from.display()))?;
    let total = src.metadata()?.len();
    let (parent, name) = parent_of(meta, to)?;
    let attr = match meta.create(parent, &name, 0o644, true) {
        Ok(a) => a,
        Err(Errno::EEXIST) if force => meta.lookup(parent, &name).map_err(|e| errno("looking up", to, e))?,
        Err(Errno::EEXIST) => bail!("dafne:{to} exists: pass --force to replace it"),
        Err(e) => return Err(errno("creating", to, e)),
    };
    let flags = dafne_proto::OPEN_WRITE | dafne_proto::OPEN_TRUNC;
    let f = Opened::new(meta, meta.open(attr.ino, flags).map_err(|e| errno("opening", to, e))?);
    futures::executor::block_on(data.truncate(&f, 0)).map_err(|e| errno("truncating", to, e))?;
    let mut p = Progress::new(total);
    let mut done = 0u64;
    loop {
        // Fill the buffers, then let the servers get them all in parallel.
        let mut batch = Vec::new();
        for r in regions.iter_mut() {
            let buf = r.as_mut_slice();
            let mut n = 0;
            while n < buf.len() {
                let k = src.read(&mut buf[n..]).with_context(|| format!("reading {}", from.display()))?;
                if k == 0 {
                    break;
                }
                n += k;
            }
            if n == 0 {
                break;
            }
            batch.push((done + batch.iter().map(|(_, n)| *n as u64).sum::<u64>(), n));
            if n < CHUNK {
                break;
            }
        }
        if batch.is_empty() {
            break;
        }
        let calls = batch
            .iter()
            .zip(regions.iter())
            .map(|(&(off, n), r)| data.write_region(&f, off, r, 0, n, Stability::Unstable));
        for r in futures::executor::block_on(futures::future::join_all(calls)) {
            r.map_err(|e| errno("writing", to, e))?;
        }
        done += batch.iter().map(|(_, n)| *n as u64).sum::<u64>();
        p.update(done);
    }
    // Durable, and the size exact in meta (the size rule of `close`/`fsync`).
    futures::executor::block_on(data.sync(&f)).map_err(|e| errno("syncing", to, e))?;
    meta.setattr(attr.ino, dafne_proto::SetAttr { size: Some(done), ..Default::default() })
        .map_err(|e| errno("setting the size of", to, e))?;
    p.finish(done, &format!("{} -> dafne:{to}", from.display()));
    Ok(())
}

fn download(
    meta: &MetaSession,
    data: &DataClient,
    regions: &mut [Region],
    from: &str,
    to: &Path,
    force: bool,
) -> Result<()> {
    let attr = meta.resolve(from).map_err(|e| errno("resolving", from, e))?;
    if attr.kind != FileType::Regular {
        bail!("dafne:{from} is not a regular file");
    }
    let f = Opened::new(meta, meta.open(attr.ino, dafne_proto::OPEN_READ).map_err(|e| errno("opening", from, e))?);
    let total = attr.size;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut dst = opts.open(to).with_context(|| {
        if to.exists() && !force {
            format!("{} exists: pass --force to replace it", to.display())
        } else {
            format!("creating {}", to.display())
        }
    })?;
    let mut p = Progress::new(total);
    let mut done = 0u64;
    while done < total {
        let mut batch = Vec::new();
        let mut off = done;
        for _ in 0..regions.len() {
            if off >= total {
                break;
            }
            let n = (total - off).min(CHUNK as u64) as usize;
            batch.push((off, n));
            off += n as u64;
        }
        let calls = batch.iter().zip(regions.iter()).map(|(&(o, n), r)| data.read_region(&f, o, r, 0, n));
        for r in futures::executor::block_on(futures::future::join_all(calls)) {
            r.map_err(|e| errno("reading", from, e))?;
        }
        for (&(o, n), r) in batch.iter().zip(regions.iter()) {
            dst.write_all_at(&r.as_slice()[..n], o).with_context(|| format!("writing {}", to.display()))?;
        }
        done = off;
        p.update(done);
    }
    dst.flush()?;
    p.finish(done, &format!("dafne:{from} -> {}", to.display()));
    Ok(())
}
