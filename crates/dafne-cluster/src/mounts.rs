//! The cluster's FUSE mounts, as `DIR/mounts/PID` records (one per mount
//! daemon: its start time, then the mount point), so that stopping the
//! cluster can unmount them first ([`unmount_all`]).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{pid_alive, same_process_alive, start_time};
use crate::{progress, Error, STOP_GRACE};

/// Where the records are.
pub fn mounts_dir(dir: &Path) -> PathBuf {
    dir.join("mounts")
}

/// Records a live mount (by the pid of its daemon), so `down` can
/// unmount it.
pub fn record_mount(dir: &Path, pid: u32, mountpoint: &Path) -> Result<(), Error> {
    let d = mounts_dir(dir);
    std::fs::create_dir_all(&d).map_err(Error::io(format!("creating {}", d.display())))?;
    // The daemon's start time on the first line, so that a reused pid
    // is not taken for the daemon.
    let mut record = format!("{}\n", start_time(pid).unwrap_or(0)).into_bytes();
    record.extend_from_slice(mountpoint.as_os_str().as_encoded_bytes());
    // Written whole then renamed, so a reader never sees half of it.
    let tmp = d.join(format!(".{pid}.tmp"));
    std::fs::write(&tmp, record)
        .and_then(|()| std::fs::rename(&tmp, d.join(pid.to_string())))
        .map_err(Error::io(format!("recording the mount in {}", d.display())))
}

/// Removes the record of the mount whose daemon is `pid`.
pub fn forget_mount(dir: &Path, pid: u32) {
    let _ = std::fs::remove_file(mounts_dir(dir).join(pid.to_string()));
}

/// Recorded mounts whose daemon still runs: (pid, mount point). Records
/// of daemons that are gone are removed.
pub fn live_mounts(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(mounts_dir(dir)) else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // Bytes, not UTF-8: a mount point may have any name.
        let record = std::fs::read(e.path()).unwrap_or_default();
        let parsed = record.iter().position(|&b| b == b'\n').and_then(|nl| {
            let start: u64 = std::str::from_utf8(&record[..nl]).ok()?.parse().ok()?;
            let mp = std::ffi::OsStr::from_bytes(&record[nl + 1..]);
            Some((start, PathBuf::from(mp)))
        });
        match parsed {
            Some((start, mp)) if same_process_alive(pid, start) => out.push((pid, mp)),
            // Only the record of a daemon that is gone is removed.
            _ if pid_alive(pid) && parsed.is_none() => {}
            _ => {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    out
}

/// Unmounts the cluster's recorded mounts (a busy one lazily) and waits a
/// little for each daemon to exit.
pub fn unmount_all(dir: &Path) {
    for (pid, mp) in live_mounts(dir) {
        progress(format_args!("unmounting {}", mp.display()));
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(&mp)
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        let mut grace = STOP_GRACE;
        if !ok {
            // Busy (a process has files open there): detach it lazily; the
            // daemon exits when the last of them is closed, and meanwhile
            // answers EIO, its servers being gone.
            let lazy = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&mp)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if lazy {
                progress(format_args!("{} is busy (files open there): detached it lazily", mp.display()));
            } else {
                println!("error: could not unmount {} (busy, and a lazy unmount failed)", mp.display());
            }
            grace = Duration::from_secs(2);
        }
        let t = Instant::now();
        while pid_alive(pid) && t.elapsed() < grace {
            std::thread::sleep(Duration::from_millis(50));
        }
        forget_mount(dir, pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_lives_as_long_as_its_daemon() {
        let d = tempfile::tempdir().unwrap();
        // This process stands for a live daemon; a name of any bytes.
        let mp = PathBuf::from(std::ffi::OsStr::from_bytes(b"/mnt/d\xffafne"));
        record_mount(d.path(), std::process::id(), &mp).unwrap();
        assert_eq!(live_mounts(d.path()), vec![(std::process::id(), mp)]);
        // A daemon that is gone (a pid no process has): its record goes.
        std::fs::write(mounts_dir(d.path()).join((u32::MAX - 1).to_string()), "1\n/mnt/x").unwrap();
        assert_eq!(live_mounts(d.path()).len(), 1);
        assert!(!mounts_dir(d.path()).join((u32::MAX - 1).to_string()).exists());
        forget_mount(d.path(), std::process::id());
        assert!(live_mounts(d.path()).is_empty());
    }
}
