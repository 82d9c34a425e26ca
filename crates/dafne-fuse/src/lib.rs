//! The dafne FUSE mount: unmodified programs on a dafne cluster through the
//! kernel's FUSE.
//!
//! # Shape
//! Two layers, as in the design's "thin FUSE adapter over a core that needs
//! no kernel":
//!
//! * [`core::Core`] is the file system in dafne's own terms: inodes, [`Attr`],
//!   [`Errno`]. It holds the metadata session and the data client, the table
//!   of open files and the size rule (below). Every operation runs as the
//!   caller (`MetaSession::as_caller`, with the caller's groups when an answer may depend on them), so the metadata server, which owns the
//!   POSIX rules, decides; its errno travels back unchanged.
//! * [`fuse::FuseFs`] is the `fuser::Filesystem` adapter: it converts
//!   kernel arguments to core calls and core results to replies. The errno
//!   is chosen in one place ([`fuse::errno`]): the server's value, as is.
//!
//! # Why these choices
//! * **Permissions: the kernel's and the server's.** The mount uses
//!   `default_permissions`: the kernel checks every access against the
//!   attributes it holds, also when it answers from its caches (without
//!   it, a name cached for `entry_timeout` bypassed a directory's new
//!   mode). The metadata server still checks every request it gets, for
//!   the caller's uid, gid and supplementary groups ([`groups`]: read from
//!   `/proc`, since FUSE sends only uid, gid and pid, and only when an
//!   answer may depend on them: `fuse`'s `Lazy`). Mounts are
//!   `nosuid,nodev` unless [`MountOptions`] asks otherwise.
//! * **Sizes.** A file's size in meta may lag while the file is open for
//!   writing (the design's size rule); this mount therefore reports
//!   `max(meta size, end of this mount's own writes)` for files it has open,
//!   clamps reads to that size, and publishes the size (and mtime) to meta
//!   on `flush` (every `close(2)`), `fsync` and `release`, like
//!   `dafne_client::file::File::close`.
//! * **Large requests, no registration on the hot path.** `init` asks the
//!   kernel for 1 MiB writes and 1 MiB readahead, the size of the data
//!   client's pre-registered bounce buffers: a FUSE request's bytes are
//!   copied once into a buffer registered at warm-up, and the io servers
//!   move them by RMA from there; nothing is registered per request
//!   (tested from the UCX counters through the mount).
//! * **Caching.** Attributes and entries are cached by the kernel for the
//!   cluster's `attr_timeout_ms` / `entry_timeout_ms`; file data is not kept
//!   across opens (no `FOPEN_KEEP_CACHE`), so an open sees other clients'
//!   closed writes. Negative lookups are not cached.
//! * **Read-ahead.** With direct I/O (fio's `--direct=1`, databases) the
//!   kernel's readahead does nothing, and a sequential reader waits for one
//!   io server per request. Each handle therefore has a read-ahead stream
//!   of the client library (`dafne_client::readahead`): after two
//!   contiguous reads it keeps whole stripe units in flight on every
//!   server of the stripe, in a registered slab of `--readahead-mib`
//!   (registered at mount, bounded), and answers hits from there without a
//!   copy. This mount's writes and truncations of a file drop the units
//!   they overlap.
//! * **Threads.** The session runs several fuser worker threads (each
//!   blocks on its own request), so one slow operation (an fsync) does not
//!   stall the others.
//! * **FUSE over io_uring.** Where the kernel offers it ([`ring`]), the
//!   requests come through per-CPU ring entries, `threads` ring threads
//!   per CPU, and the classic workers serve what still comes through
//!   `/dev/fuse` (FORGET, INTERRUPT).

pub mod core;
pub mod fuse;
pub mod groups;
pub mod ring;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use dafne_client::{Attr, Errno, Ino};

/// Settings of one mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// How long the kernel may cache attributes.
    pub attr_ttl: Duration,
    /// How long the kernel may cache name lookups.
    pub entry_ttl: Duration,
    /// fuser worker threads.
    pub threads: usize,
    /// Honour setuid and setgid bits of programs run from the mount
    /// (`suid`); off by default (`nosuid`): a user who can chmod a file on
    /// any mount of the cluster must not gain a uid on this host.
    pub suid: bool,
    /// Honour device nodes (`dev`); off by default (`nodev`): a device node
    /// made on the cluster must not open this host's devices.
    pub dev: bool,
    /// FUSE over io_uring ([`ring`]).
    pub fuse_uring: ring::Uring,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            attr_ttl: Duration::from_secs(1),
            entry_ttl: Duration::from_secs(1),
            threads: 4,
            suid: false,
            dev: false,
            fuse_uring: ring::Uring::Auto,
        }
    }
}

/// Largest read and write request asked of the kernel: one bounce buffer.
pub const MAX_IO: u32 = dafne_client::data::BOUNCE_SIZE as u32;

/// Why a mount could not be made or served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    #[error("mounting {mountpoint}: {source}")]
    Mount { mountpoint: PathBuf, source: std::io::Error },
    #[error("serving the mount at {mountpoint}: {source}")]
    Serve { mountpoint: PathBuf, source: std::io::Error },
    /// `--fuse-uring on` and the ring cannot be used.
    #[error("--fuse-uring=on: {0} (or mount with --fuse-uring=auto or off)")]
    Uring(String),
}

/// A mounted file system whose requests are not served yet; [`Mounted::serve`]
/// serves them until the file system is unmounted.
pub struct Mounted {
    session: fuser::Session<fuse::FuseFs>,
    mountpoint: PathBuf,
    /// The ring threads, when the mount serves FUSE over io_uring.
    ring: Option<ring::RingThreads>,
    /// For the stats file's last write, at unmount.
    core: std::sync::Arc<core::Core>,
}

impl std::fmt::Debug for Mounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounted").field("mountpoint", &self.mountpoint).finish()
    }
}

/// Mounts `core` at `mountpoint` (the kernel's INIT is answered before this
/// returns, so the mount is live).
pub fn mount(core: core::Core, mountpoint: &Path, opts: &MountOptions) -> Result<Mounted, MountError> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("dafne".into()),
        fuser::MountOption::Subtype("dafne".into()),
        fuser::MountOption::RW,
        fuser::MountOption::Exec,
        if opts.suid { fuser::MountOption::Suid } else { fuser::MountOption::NoSuid },
        if opts.dev { fuser::MountOption::Dev } else { fuser::MountOption::NoDev },
        // The kernel checks every access against the attributes it holds
        // (mode, owner, group, and the caller's groups) before it uses a
        // cached name or attribute, so a cached lookup does not bypass a
        // directory's search permission; the metadata server still checks
        // every request that reaches it (README, "Security model").
        fuser::MountOption::DefaultPermissions,
    ];
    // allow_other: every user of the machine sees the mount; the kernel
    // (default_permissions) and the metadata server decide what each may do.
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(opts.threads.max(1));
    // Decided before the mount: once INIT agrees to the ring, the kernel
    // holds every request until a ring is registered.
    let want_ring = ring::decide(opts.fuse_uring).map_err(MountError::Uring)?;
    let mut fs = fuse::FuseFs::new(core, opts);
    let agreed = want_ring.then(|| fs.ask_uring());
    let notifier = fs.notifier_slot();
    let core = fs.core().clone();
    fs.start_watcher();
    let session = fuser::Session::new(fs, mountpoint, &config)
        .map_err(|source| MountError::Mount { mountpoint: mountpoint.to_path_buf(), source })?;
    let _ = notifier.set(session.notifier());
    let counters = ring::RequestCounters { ring: Default::default(), dev: session.dev_requests() };
    let ring_count = counters.ring.clone();
    core.set_request_counters(counters);
    core::Core::start_stats_writer(&core);
    if let Err(e) = raise_readahead(mountpoint, MAX_IO / 1024) {
        tracing::warn!("could not raise the readahead of {}: {e}", mountpoint.display());
    }
    let ring = match agreed {
        Some(agreed) => start_ring(&session, &agreed, opts, ring_count)?,
        None => None,
    };
    Ok(Mounted { session, mountpoint: mountpoint.to_path_buf(), ring, core })
}

/// Registers the ring entries of a mount whose INIT asked for the ring.
/// `Err` only for `--fuse-uring=on` (dropping the session unmounts).
fn start_ring(
    session: &fuser::Session<fuse::FuseFs>,
    agreed: &std::sync::atomic::AtomicBool,
    opts: &MountOptions,
    ring_count: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<Option<ring::RingThreads>, MountError> {
    use std::os::fd::AsFd;
    let fail = |why: String| {
        if opts.fuse_uring == ring::Uring::On {
            Err(MountError::Uring(why))
        } else {
            tracing::info!("serving the mount through /dev/fuse: {why}");
            Ok(None)
        }
    };
    if !agreed.load(std::sync::atomic::Ordering::SeqCst) {
        return fail("the kernel's INIT did not offer FUSE over io_uring".into());
    }
    // The kernel's max payload: max(8 KiB, max_write, max_pages × page).
    let (max_write, max_pages) = session.init_limits().unwrap_or((MAX_IO, 0));
    let payload = (max_write as usize).max(usize::from(max_pages) * ring::page_size());
    // Without a descriptor nothing can register the ring or turn it off,
    // and the kernel would hold every request: no mount.
    let dev =
        session.as_fd().try_clone_to_owned().map_err(|e| MountError::Uring(format!("duplicating /dev/fuse: {e}")))?;
    match ring::RingThreads::start(&dev, payload, ring::threads_per_queue(opts.threads, ring::queues()), ring_count) {
        (t, Ok(())) => {
            tracing::info!("serving the mount over FUSE io_uring ({} queues)", ring::queues());
            Ok(Some(t))
        }
        // The connection is back on /dev/fuse; the threads still serve
        // whatever reaches the entries that did register.
        (t, Err(why)) => fail(why).map(|none: Option<ring::RingThreads>| none.or(Some(t))),
    }
}

/// Sets the mount's readahead (its backing device info in sysfs) to `kib`.
///
/// The kernel starts a FUSE mount with the default readahead (128 KiB) and
/// lowers it to what INIT allows, never raises it, so sequential reads
/// arrive in 128 KiB requests however large `max_read` is. Root may raise
/// it in sysfs; 1 MiB lets a sequential read travel in one request per
/// bounce buffer (measured: about 3× the read bandwidth of 128 KiB). The
/// device is found in mountinfo rather than by `stat`, which would wait
/// for this very daemon to answer.
pub fn raise_readahead(mountpoint: &Path, kib: u32) -> std::io::Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mountpoint.as_os_str().to_string_lossy();
    let dev = info
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && unescape_mountinfo(f[4]) == want).then(|| f[2].to_string())
        })
        .ok_or_else(|| std::io::Error::other("not in /proc/self/mountinfo"))?;
    std::fs::write(format!("/sys/class/bdi/{dev}/read_ahead_kb"), kib.to_string())
}

/// Undoes mountinfo's escapes (space, tab, newline and backslash are
/// written as `\ooo`).
pub fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Mounted {
    /// Something that unmounts this file system from another thread (a
    /// signal handler's thread), which makes [`Mounted::serve`] return.
    pub fn unmounter(&mut self) -> fuser::SessionUnmounter {
        self.session.unmount_callable()
    }

    /// Serves requests until the file system is unmounted.
    pub fn serve(self) -> Result<(), MountError> {
        let Mounted { session, mountpoint, mut ring, core } = self;
        let r = session.run_with(|d| {
            if let Some(t) = ring.as_mut() {
                t.dispatch_with(&d);
            }
            Ok(())
        });
        if let Some(t) = ring {
            t.join();
        }
        core.write_stats();
        r.map_err(|source| MountError::Serve { mountpoint, source })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(super::unescape_mountinfo(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(super::unescape_mountinfo("/plain"), "/plain");
    }
}
