//! `dafne._native`: the client library as a Python extension module.
//!
//! A Python process reaches dafne the way `dafne cp` does, without a mount:
//! [`Client`] opens the client library on a cluster from its cluster file
//! ([`dafne_client::cluster::Cluster::open`]) and offers the namespace by
//! path (`stat`, `listdir`, `scandir`, `mkdir`, `rmdir`, `unlink`,
//! `rename`, `truncate`) and `open`, which gives a [`File`] with positional
//! and streaming I/O. The fsspec file system (`python/dafne/fs.py`) is
//! written in Python on top of these two classes.
//!
//! # Why this shape
//! * **One file layer.** A [`File`] is a [`dafne_client::file::File`], so
//!   the size rule is the one the rest of the client uses: reads never go
//!   past the size the handle knows (meta's at open, grown by its own
//!   writes), and meta's size becomes exact at `fsync` and `close`. Another
//!   open sees a writer's bytes once it closed or synced.
//! * **The GIL is released for every call that waits on the network**
//!   (`py.allow_threads`): Python threads then overlap their I/O, and the
//!   transport's own thread never needs the GIL. A `File`'s state sits
//!   behind a mutex taken only with the GIL released, so two threads on one
//!   file serialise instead of deadlocking.
//! * **Errors are `OSError`s with an errno**, built as `OSError(errno,
//!   strerror, path)`, which Python turns into the matching subclass
//!   (`FileNotFoundError` for `ENOENT`, `FileExistsError`, `IsADirectoryError`,
//!   `PermissionError`...), so callers catch what they would for a local
//!   file. Failing to open the cluster is an `OSError` whose message names
//!   the cluster file and the fix.
//! * **Bounded calls.** Reads and writes move at most [`PIECE`] bytes per
//!   call into the data client (whose bounce buffers are 1 MiB pieces): a
//!   `read()` of a whole large file does not ask for all its bounce buffers
//!   at once.
//!
//! Paths are absolute within the file system (`/a/b`; a path without the
//! leading `/` is taken from the root). The last component of a path is
//! not followed when it is a symbolic link (`stat` is `lstat`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use dafne_client::cluster::{Cluster, OpenOptions};
use dafne_client::file::{File as DFile, Fs};
use dafne_client::{Attr, Errno, FileType, Ino, MetaSession, SetAttr, TimeSet};
use dafne_proto::io::Stability;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

/// The most bytes one call into the data client moves (module docs).
const PIECE: usize = 8 << 20;

/// `OSError(errno, strerror, path)`: Python picks the subclass by errno.
fn os_error(e: Errno, path: &str) -> PyErr {
    let desc = e.description().map_or_else(|| e.to_string(), str::to_string);
    PyOSError::new_err((e.0, desc, path.to_string()))
}

/// A path's components: `/a//b/` is `["a", "b"]`.
fn components(path: &str) -> Vec<&str> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".").collect()
}

/// The parent directory's inode and the last name of `path`; `EINVAL` for
/// the root (it has no name), `..` as a last name is refused the same way.
fn parent_of(meta: &MetaSession, path: &str) -> Result<(Ino, Vec<u8>), Errno> {
    let comps = components(path);
    let Some((name, dirs)) = comps.split_last() else { return Err(Errno::EINVAL) };
    if *name == ".." {
        return Err(Errno::EINVAL);
    }
    let parent = meta.resolve(&format!("/{}", dirs.join("/")))?;
    if parent.kind != FileType::Directory {
        return Err(Errno::ENOTDIR);
    }
    Ok((parent.ino, name.as_bytes().to_vec()))
}

/// A kind's name in `Stat.type`.
fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::Regular => "file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        _ => "other",
    }
}

/// A file's attributes, named as `os.stat_result`'s (`st_mode` has the
/// type bits), plus `type`: `"file"`, `"directory"`, `"symlink"` or
/// `"other"`.
#[pyclass(module = "dafne._native", frozen, get_all)]
#[derive(Debug, Clone)]
struct Stat {
    st_ino: u64,
    st_mode: u32,
    st_nlink: u32,
    st_uid: u32,
    st_gid: u32,
    st_size: u64,
    st_blocks: u64,
    st_atime: f64,
    st_mtime: f64,
    st_ctime: f64,
    r#type: &'static str,
}

impl From<&Attr> for Stat {
    fn from(a: &Attr) -> Stat {
        let secs = |t: &dafne_proto::Timespec| t.sec as f64 + f64::from(t.nsec) / 1e9;
        Stat {
            st_ino: a.ino,
            st_mode: a.kind.mode_bits() | a.mode,
            st_nlink: a.nlink,
            st_uid: a.uid,
            st_gid: a.gid,
            st_size: a.size,
            st_blocks: a.blocks,
            st_atime: secs(&a.atime),
            st_mtime: secs(&a.mtime),
            st_ctime: secs(&a.ctime),
            r#type: kind_name(a.kind),
        }
    }
}

#[pymethods]
impl Stat {
    fn __repr__(&self) -> String {
        format!(
            "dafne.Stat(type={:?}, st_size={}, st_mode=0o{:o}, st_ino={})",
            self.r#type, self.st_size, self.st_mode, self.st_ino
        )
    }
}

/// The client library on one cluster: `Client(cluster=None,
/// credential=None, name="python")`. `cluster` is a cluster directory (as
/// `dafne up --dir` takes) or its `cluster.json`; by default
/// `$DAFNE_HOME`, else `~/.dafne`. `credential` logs in with a per-client
/// credential file (`dafne credential issue`) instead of the cluster
/// secret.
#[pyclass(module = "dafne._native", frozen)]
struct Client {
    cluster: Arc<Cluster>,
    fs: Fs,
}

/// The cluster directory when none is given: `$DAFNE_HOME`, else
/// `~/.dafne` (as the `dafne` command).
fn default_cluster() -> PyResult<PathBuf> {
    if let Some(d) = std::env::var_os("DAFNE_HOME") {
        return Ok(PathBuf::from(d));
    }
    match std::env::var_os("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".dafne")),
        None => Err(PyValueError::new_err(
            "no cluster given and neither $DAFNE_HOME nor $HOME is set: pass Client(cluster=\"DIR\")",
        )),
    }
}

impl Client {
    fn meta(&self) -> &MetaSession {
        &self.fs.meta
    }

    /// Runs `f` on this client's namespace with the GIL released; an errno
    /// becomes an `OSError` naming `path`.
    fn ns<T: Send>(
        &self,
        py: Python<'_>,
        path: &str,
        f: impl FnOnce(&MetaSession) -> Result<T, Errno> + Send,
    ) -> PyResult<T> {
        let meta = self.meta();
        py.allow_threads(|| f(meta)).map_err(|e| os_error(e, path))
    }
}

/// What an `open` mode asks for.
#[derive(Debug, Clone, Copy)]
struct Mode {
    read: bool,
    write: bool,
    /// `None`: the file must exist; `Some(exclusive)`: create it.
    create: Option<bool>,
    truncate: bool,
    append: bool,
}

/// Python's binary modes: `r`, `w`, `x`, `a`, each with `b` and an
/// optional `+`.
fn parse_mode(mode: &str) -> Result<Mode, String> {
    let (mut base, mut plus, mut binary, mut other) = (None, false, false, false);
    for c in mode.chars() {
        match c {
            'r' | 'w' | 'x' | 'a' if base.is_none() => base = Some(c),
            '+' if !plus => plus = true,
            'b' if !binary => binary = true,
            _ => other = true,
        }
    }
    let base = match (base, binary, other) {
        (Some(b), true, false) => b,
        _ => {
            return Err(format!(
                "invalid mode {mode:?}: dafne files are binary: one of r, w, x, a with b and an optional + (rb, wb, \
                 r+b...); wrap the file in io.TextIOWrapper for text"
            ))
        }
    };
    Ok(match base {
        'r' => Mode { read: true, write: plus, create: None, truncate: false, append: false },
        'w' => Mode { read: plus, write: true, create: Some(false), truncate: true, append: false },
        'x' => Mode { read: plus, write: true, create: Some(true), truncate: false, append: false },
        _ => Mode { read: plus, write: true, create: Some(false), truncate: false, append: true },
    })
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (cluster=None, credential=None, name="python"))]
    fn new(py: Python<'_>, cluster: Option<PathBuf>, credential: Option<PathBuf>, name: &str) -> PyResult<Client> {
        let mut o = OpenOptions::new(cluster.map_or_else(default_cluster, Ok)?, name);
        o.credential = credential;
        let c = py.allow_threads(|| Cluster::open(&o)).map_err(|e| {
            let desc = e.to_string();
            PyOSError::new_err((e.errno().0, desc, o.cluster.display().to_string()))
        })?;
        let fs = Fs { meta: c.meta.clone(), data: c.data.clone() };
        Ok(Client { cluster: Arc::new(c), fs })
    }

    /// Attributes of `path` (not following a symbolic link at its end).
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<Stat> {
        self.ns(py, path, |m| m.resolve(path)).map(|a| Stat::from(&a))
    }

    /// Whether `path` names anything.
    fn exists(&self, py: Python<'_>, path: &str) -> PyResult<bool> {
        match py.allow_threads(|| self.meta().resolve(path)) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => Ok(false),
            Err(e) => Err(os_error(e, path)),
        }
    }

    /// The names in a directory (without `.` and `..`), in the server's
    /// order.
    fn listdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<String>> {
        let entries = self.ns(py, path, |m| {
            let d = m.resolve(path)?;
            if d.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            m.readdir(d.ino)
        })?;
        Ok(entries.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect())
    }

    /// `(name, Stat)` for every entry of a directory; the attributes are
    /// asked for all at once (one round trip's wait, not one per entry).
    /// An entry removed meanwhile is left out.
    fn scandir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, Stat)>> {
        self.ns(py, path, |m| {
            let d = m.resolve(path)?;
            if d.kind != FileType::Directory {
                return Err(Errno::ENOTDIR);
            }
            let entries = m.readdir(d.ino)?;
            let attrs = futures::executor::block_on(futures::future::join_all(
                entries.iter().map(|e| m.lookup_async(d.ino, &e.name)),
            ));
            let mut out = Vec::with_capacity(entries.len());
            for (e, a) in entries.iter().zip(attrs) {
                match a {
                    Ok(a) => out.push((String::from_utf8_lossy(&e.name).into_owned(), Stat::from(&a))),
                    Err(Errno::ENOENT) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
    }

    /// Makes a directory (`mode` & ~umask is not applied: the server takes
    /// the bits as given).
    #[pyo3(signature = (path, mode=0o755))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        self.ns(py, path, |m| {
            let (parent, name) = parent_of(m, path)?;
            m.mkdir(parent, &name, mode & 0o7777).map(drop)
        })
    }

    /// Removes an empty directory.
    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.ns(py, path, |m| {
            let (parent, name) = parent_of(m, path)?;
            m.rmdir(parent, &name)
        })
    }

    /// Removes a name that is not a directory (its data goes once no open
    /// holds it).
    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.ns(py, path, |m| {
            let (parent, name) = parent_of(m, path)?;
            m.unlink(parent, &name)
        })
    }

    /// Atomic rename, replacing an existing destination (as `os.replace`).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        self.ns(py, src, |m| {
            let (sp, sn) = parent_of(m, src)?;
            let (dp, dn) = parent_of(m, dst)?;
            m.rename(sp, &sn, dp, &dn)
        })
    }

    /// Sets a file's size (cutting or extending with zeros).
    fn truncate(&self, py: Python<'_>, path: &str, size: u64) -> PyResult<()> {
        let fs = &self.fs;
        py.allow_threads(|| {
            let a = fs.meta.resolve(path)?;
            fs.open(a.ino, dafne_proto::OPEN_WRITE)?.truncate(size)
        })
        .map_err(|e| os_error(e, path))
    }

    /// Sets the access and modification times to now (as `touch`).
    fn utime(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.ns(py, path, |m| {
            let a = m.resolve(path)?;
            let now = SetAttr { atime: Some(TimeSet::Now), mtime: Some(TimeSet::Now), ..Default::default() };
            m.setattr(a.ino, now).map(drop)
        })
    }

    /// Opens a file: `mode` is a binary mode (`rb`, `wb`, `xb`, `ab`, with
    /// `+` to read and write); a file made here gets `perm`.
    #[pyo3(signature = (path, mode="rb", perm=0o644))]
    fn open(&self, py: Python<'_>, path: &str, mode: &str, perm: u32) -> PyResult<File> {
        let m = parse_mode(mode).map_err(PyValueError::new_err)?;
        let fs = &self.fs;
        let f = py
            .allow_threads(|| {
                let mut flags = 0;
                if m.read {
                    flags |= dafne_proto::OPEN_READ;
                }
                if m.write {
                    flags |= dafne_proto::OPEN_WRITE;
                }
                if m.truncate {
                    flags |= dafne_proto::OPEN_TRUNC;
                }
                let attr = match m.create {
                    None => fs.meta.resolve(path)?,
                    Some(exclusive) => {
                        let (parent, name) = parent_of(&fs.meta, path)?;
                        fs.meta.create(parent, &name, perm & 0o7777, exclusive)?
                    }
                };
                match attr.kind {
                    FileType::Regular => fs.open(attr.ino, flags),
                    FileType::Directory => Err(Errno::EISDIR),
                    _ => Err(Errno::EINVAL),
                }
            })
            .map_err(|e| os_error(e, path))?;
        let pos = if m.append { f.size() } else { 0 };
        Ok(File {
            _cluster: self.cluster.clone(),
            name: path.to_string(),
            mode: mode.to_string(),
            readable: m.read,
            writable: m.write,
            append: m.append,
            state: Mutex::new(State { file: Some(f), pos }),
        })
    }

    fn __repr__(&self) -> String {
        format!("dafne.Client({} io servers)", self.fs.data.server_count())
    }
}

/// An open file's changing part.
#[derive(Debug)]
struct State {
    /// `None` once closed.
    file: Option<DFile>,
    pos: u64,
}

/// An open file of `Client.open`: `read`, `write`, `seek`, `tell` move a
/// position; `pread` and `pwrite` do not. `close` (or leaving a `with`
/// block) publishes the size; a file collected without `close` publishes
/// it too, best effort (an error there has no one to go to), and closes.
#[pyclass(module = "dafne._native", frozen)]
struct File {
    // The runtime the sessions run on stays while a file is open.
    _cluster: Arc<Cluster>,
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    mode: String,
    readable: bool,
    writable: bool,
    append: bool,
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding it cannot leave the state half-changed (each
    // change is one store), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a call on a file failed before reaching the servers, or the errno.
enum FileErr {
    Closed,
    NotReadable,
    NotWritable,
    Errno(Errno),
}

impl From<Errno> for FileErr {
    fn from(e: Errno) -> FileErr {
        FileErr::Errno(e)
    }
}

/// Reads up to `n` bytes at `offset` (fewer only at the end of the file);
/// `ENOMEM` when the buffer cannot be had (a `read()` of a huge sparse
/// file), rather than aborting the interpreter.
fn read_full(f: &DFile, offset: u64, n: usize) -> Result<Vec<u8>, Errno> {
    let n = n.min(usize::try_from(f.size().saturating_sub(offset)).unwrap_or(usize::MAX));
    let mut buf = Vec::new();
    buf.try_reserve_exact(n).map_err(|_| Errno::ENOMEM)?;
    buf.resize(n, 0);
    let mut done = 0;
    while done < n {
        let k = f.read_at(offset + done as u64, &mut buf[done..(done + PIECE).min(n)])?;
        if k == 0 {
            break;
        }
        done += k;
    }
    buf.truncate(done);
    Ok(buf)
}

fn write_all(f: &DFile, offset: u64, data: &[u8]) -> Result<(), Errno> {
    for (i, piece) in data.chunks(PIECE).enumerate() {
        f.write_at(offset + (i * PIECE) as u64, piece, Stability::Unstable)?;
    }
    Ok(())
}

/// Bytes of any object with the buffer protocol: `bytes` and `bytearray`
/// directly, anything else (`memoryview`, arrays) through `bytes(obj)`.
fn bytes_of(data: &Bound<'_, PyAny>) -> PyResult<PyBackedBytes> {
    match data.extract::<PyBackedBytes>() {
        Ok(b) => Ok(b),
        Err(_) => data.py().get_type::<PyBytes>().call1((data,))?.extract(),
    }
}

impl File {
    /// Runs `f` on the open file with the GIL released.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        need: Option<bool>,
        f: impl FnOnce(&DFile, &mut u64) -> Result<T, FileErr> + Send,
    ) -> PyResult<T> {
        let r = py.allow_threads(|| {
            let mut s = lock(&self.state);
            let State { file, pos } = &mut *s;
            let file = file.as_ref().ok_or(FileErr::Closed)?;
            match need {
                Some(false) if !self.readable => return Err(FileErr::NotReadable),
                Some(true) if !self.writable => return Err(FileErr::NotWritable),
                _ => {}
            }
            f(file, pos)
        });
        r.map_err(|e| match e {
            FileErr::Closed => PyValueError::new_err("I/O operation on closed file"),
            FileErr::NotReadable => pyo3::exceptions::PyIOError::new_err(format!(
                "{}: not open for reading (mode {:?})",
                self.name, self.mode
            )),
            FileErr::NotWritable => pyo3::exceptions::PyIOError::new_err(format!(
                "{}: not open for writing (mode {:?})",
                self.name, self.mode
            )),
            FileErr::Errno(e) => os_error(e, &self.name),
        })
    }
}

#[pymethods]
impl File {
    /// Up to `size` bytes from the position (all to the end when `size`
    /// is negative or None); `b""` at the end.
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        let size = size.filter(|s| *s >= 0).map(|s| s as usize);
        let buf = self.with(py, Some(false), |f, pos| {
            let n = size.unwrap_or_else(|| f.size().saturating_sub(*pos) as usize);
            let buf = read_full(f, *pos, n)?;
            *pos += buf.len() as u64;
            Ok(buf)
        })?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Up to `size` bytes at `offset`; the position does not move.
    fn pread<'py>(&self, py: Python<'py>, size: usize, offset: u64) -> PyResult<Bound<'py, PyBytes>> {
        let buf = self.with(py, Some(false), |f, _| Ok(read_full(f, offset, size)?))?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Writes all of `data` at the position (at the end in append mode)
    /// and returns its length.
    ///
    /// In append mode the end is learnt from meta before the write and the
    /// size published after it, so appends through several handles, one
    /// after another, all land (two round trips to meta more per write).
    /// Appends at the same moment through several handles are not atomic
    /// (as on NFS): both may take the same end and one overwrite the other.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let data = bytes_of(data)?;
        let append = self.append;
        self.with(py, Some(true), |f, pos| {
            if append {
                *pos = f.refresh_size()?;
            }
            write_all(f, *pos, &data)?;
            *pos += data.len() as u64;
            if append {
                f.publish()?;
            }
            Ok(data.len())
        })
    }

    /// Writes all of `data` at `offset`; the position does not move.
    fn pwrite(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let data = bytes_of(data)?;
        self.with(py, Some(true), |f, _| {
            write_all(f, offset, &data)?;
            Ok(data.len())
        })
    }

    /// Moves the position (`whence`: 0 from the start, 1 from here, 2 from
    /// the end as this handle knows it) and returns it.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        if !(0..=2).contains(&whence) {
            return Err(PyValueError::new_err(format!("invalid whence ({whence}, should be 0, 1 or 2)")));
        }
        self.with(py, None, |f, pos| {
            let base = match whence {
                0 => 0,
                1 => *pos as i64,
                _ => f.size() as i64,
            };
            let at = base.checked_add(offset).filter(|a| *a >= 0).ok_or(Errno::EINVAL)?;
            *pos = at as u64;
            Ok(*pos)
        })
    }

    fn tell(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, None, |_, pos| Ok(*pos))
    }

    /// Sets the size (default: the position) and returns it.
    #[pyo3(signature = (size=None))]
    fn truncate(&self, py: Python<'_>, size: Option<u64>) -> PyResult<u64> {
        self.with(py, Some(true), |f, pos| {
            let size = size.unwrap_or(*pos);
            f.truncate(size)?;
            Ok(size)
        })
    }

    /// Makes the data durable and the size exact in meta.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, None, |f, _| Ok(f.fsync()?))
    }

    /// Nothing is buffered here (each write reached the io servers); kept
    /// for the file protocol. `fsync` makes the data durable.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, None, |_, _| Ok(()))
    }

    /// Publishes the size and closes; closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let r = py.allow_threads(|| lock(&self.state).file.take().map(DFile::close));
        match r {
            Some(Err(e)) => Err(os_error(e, &self.name)),
            _ => Ok(()),
        }
    }

    /// The size as this handle knows it (module docs, "one file layer").
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, None, |f, _| Ok(f.size()))
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.allow_threads(|| lock(&self.state).file.is_none())
    }

    fn readable(&self) -> bool {
        self.readable
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn seekable(&self) -> bool {
        true
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let closed = if self.closed(py) { " closed" } else { "" };
        format!("<dafne.File {:?} mode={:?}{closed}>", self.name, self.mode)
    }
}

impl Drop for File {
    /// A file collected without `close` publishes its size as `close`
    /// would (a program that forgets `close` keeps its bytes), best effort:
    /// there is no caller to raise to. The GIL is held here (the object is
    /// being deallocated), so other Python threads wait for this round trip.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = state.file.take() {
            // Closes in meta whatever the publishing's outcome.
            let _ = f.close();
        }
    }
}

/// The module: `Client`, `File`, `Stat`.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<File>()?;
    m.add_class::<Stat>()?;
    Ok(())
}
