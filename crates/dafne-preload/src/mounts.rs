//! Which files are dafne's: the devices of the dafne mounts this process
//! sees, and where their cluster is.
//!
//! The kernel decides, not the path string: after the real `open` the
//! library compares the new descriptor's `st_dev` with the devices of the
//! cluster's FUSE mounts. So relative paths, `..`, symlinks into the mount
//! and `openat` with any directory descriptor are all recognised, and a
//! path that only looks like the mount's is not.
//!
//! The cluster directory is `$DAFNE_CLUSTER` (a directory or its
//! `cluster.json`), else `$DAFNE_HOME`, else `~/.dafne`, as the `dafne`
//! command finds it.
//!
//! # Which mounts are the cluster's
//! The library connects to that cluster, so it may serve a file only when
//! the file's mount is that cluster's: a file of another cluster's mount
//! served with this cluster's connection would read and write this
//! cluster's inode of the same number (another file's bytes). So a mount
//! is accepted only when a *live* mount daemon recorded it in this
//! cluster's `DIR/mounts/` (`dafne mount` writes one file per daemon, named
//! by its pid: its start time, then the mount point; a record whose daemon
//! is gone, or whose pid now names another process, is stale and
//! ignored) and `/proc/self/mountinfo` shows a dafne FUSE file system on
//! top at that mount point, which gives the device number without a
//! request to the mount. `$DAFNE_PRELOAD_MOUNT` (colon-separated mount
//! points) only narrows that set; a mount it names that the cluster did
//! not record is not added. Every other dafne FUSE mount the process sees
//! is remembered as foreign: its files stay on the FUSE path, counted as
//! fallback opens.

use std::path::{Path, PathBuf};

/// What discovery found: the cluster to connect to, its mounts' devices,
/// and the devices of the other dafne mounts (left to the kernel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounts {
    pub cluster: PathBuf,
    pub devs: Vec<u64>,
    pub foreign: Vec<u64>,
}

impl Mounts {
    pub fn contains(&self, dev: u64) -> bool {
        self.devs.contains(&dev)
    }

    /// A dafne mount that is not the connected cluster's (another
    /// cluster's, or one `$DAFNE_PRELOAD_MOUNT` left out).
    pub fn is_foreign(&self, dev: u64) -> bool {
        self.foreign.contains(&dev)
    }
}

/// The cluster directory or file from the environment, as `dafne` finds it.
pub fn cluster_path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(c) = env("DAFNE_CLUSTER").filter(|c| !c.is_empty()) {
        return Some(PathBuf::from(c));
    }
    if let Some(h) = env("DAFNE_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    env("HOME").filter(|h| !h.is_empty()).map(|h| Path::new(&h).join(".dafne"))
}

/// The cluster directory of a cluster path: a directory as it is, else
/// (a `cluster.json`, present or not) the directory holding it.
pub fn cluster_dir(cluster: &Path) -> PathBuf {
    if cluster.is_dir() {
        cluster.to_path_buf()
    } else {
        cluster.parent().unwrap_or(cluster).to_path_buf()
    }
}

/// One record of `DIR/mounts/`: the daemon's pid (the file's name), its
/// start time (0: unknown) and the mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub pid: u32,
    pub start: u64,
    pub mount_point: PathBuf,
}

/// Parses a record file (`name`: the pid; `bytes`: the start time, a
/// newline, the mount point); `None` for anything else.
pub fn parse_record(name: &std::ffi::OsStr, bytes: &[u8]) -> Option<Record> {
    use std::os::unix::ffi::OsStrExt;
    let pid: u32 = name.to_str()?.parse().ok()?;
    let nl = bytes.iter().position(|&b| b == b'\n')?;
    let start: u64 = std::str::from_utf8(&bytes[..nl]).ok()?.parse().ok()?;
    let mp = &bytes[nl + 1..];
    (!mp.is_empty()).then(|| Record { pid, start, mount_point: PathBuf::from(std::ffi::OsStr::from_bytes(mp)) })
}

/// A process's start time (field 22 of `/proc/PID/stat`).
fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the daemon of a record still runs: its pid names a process
/// that is not a zombie and started when the record says (as `dafne`'s
/// `ClusterInfo::live_mounts` decides).
pub fn record_alive(r: &Record) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", r.pid)) else { return false };
    let Some((_, rest)) = stat.rsplit_once(')') else { return false };
    if rest.trim_start().starts_with('Z') {
        return false;
    }
    r.start == 0 || start_time(r.pid) == Some(r.start)
}

/// The mount points recorded in a cluster directory by daemons that are
/// alive (stale records are skipped, not removed: that is `dafne`'s job).
pub fn recorded_mounts(cluster: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(cluster_dir(cluster).join("mounts")) else { return Vec::new() };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let Ok(bytes) = std::fs::read(e.path()) else { continue };
        if let Some(r) = parse_record(&name, &bytes).filter(record_alive) {
            out.push(r.mount_point);
        }
    }
    out
}

/// One line of `/proc/self/mountinfo`: (device, mount point, whether it
/// is a dafne FUSE mount: type `fuse.dafne`, or `fuse` with source
/// `dafne` as a mount without the subtype shows).
pub fn parse_mountinfo_line(line: &str) -> Option<(u64, PathBuf, bool)> {
    let fields: Vec<&str> = line.split(' ').collect();
    let dash = fields.iter().position(|f| *f == "-")?;
    if dash < 6 {
        return None;
    }
    let (major, minor) = fields[2].split_once(':')?;
    let dev = makedev(major.parse().ok()?, minor.parse().ok()?);
    let fstype = *fields.get(dash + 1)?;
    let source = fields.get(dash + 2).copied().unwrap_or("");
    let dafne = fstype == "fuse.dafne" || (fstype == "fuse" && source == "dafne");
    Some((dev, PathBuf::from(unescape(fields[4])), dafne))
}

/// `st_dev` as glibc encodes a device number.
pub fn makedev(major: u32, minor: u32) -> u64 {
    let (major, minor) = (major as u64, minor as u64);
    ((major & 0xfffff000) << 32) | ((major & 0xfff) << 8) | ((minor & 0xffffff00) << 12) | (minor & 0xff)
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The dafne mounts of a `/proc/self/mountinfo` text: (device, mount
/// point) of each mount point whose top mount (the last line naming it)
/// is a dafne FUSE file system.
pub fn dafne_mounts(mountinfo: &str) -> Vec<(u64, PathBuf)> {
    let mut top: Vec<(u64, PathBuf, bool)> = Vec::new();
    for (dev, mp, dafne) in mountinfo.lines().filter_map(parse_mountinfo_line) {
        top.retain(|(_, m, _)| *m != mp);
        top.push((dev, mp, dafne));
    }
    top.into_iter().filter(|(_, _, dafne)| *dafne).map(|(dev, mp, _)| (dev, mp)).collect()
}

/// Splits the dafne mounts into the cluster's (recorded, and named by
/// `narrow` when given) and the others; both sorted, without repeats.
pub fn select(dafne: &[(u64, PathBuf)], recorded: &[PathBuf], narrow: Option<&[PathBuf]>) -> (Vec<u64>, Vec<u64>) {
    let (mut ours, mut foreign) = (Vec::new(), Vec::new());
    for (dev, mp) in dafne {
        let accepted = recorded.contains(mp) && narrow.is_none_or(|n| n.contains(mp));
        if accepted {
            ours.push(*dev);
        } else {
            foreign.push(*dev);
        }
    }
    for v in [&mut ours, &mut foreign] {
        v.sort_unstable();
        v.dedup();
    }
    foreign.retain(|d| !ours.contains(d));
    (ours, foreign)
}

/// Discovery from the environment and the files above; `None` when the
/// process sees no dafne mount at all (then nothing is intercepted).
pub fn discover(env: impl Fn(&str) -> Option<String>) -> Option<Mounts> {
    let cluster = cluster_path(&env)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dafne = dafne_mounts(&info);
    if dafne.is_empty() {
        return None;
    }
    let recorded = recorded_mounts(&cluster);
    // As named, and as the kernel resolves the name (a record holds the
    // canonical mount point).
    let narrow: Option<Vec<PathBuf>> = env("DAFNE_PRELOAD_MOUNT").filter(|m| !m.is_empty()).map(|list| {
        list.split(':')
            .filter(|m| !m.is_empty())
            .flat_map(|m| [Some(PathBuf::from(m)), std::fs::canonicalize(m).ok()])
            .flatten()
            .collect()
    });
    let (devs, foreign) = select(&dafne, &recorded, narrow.as_deref());
    Some(Mounts { cluster, devs, foreign })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
97 22 0:52 / /tmp/d/mnt rw,nosuid,nodev,relatime shared:50 - fuse.dafne dafne rw,user_id=0,group_id=0
98 22 0:53 / /tmp/with\\040space rw,relatime shared:51 - fuse dafne rw
99 22 0:54 / /tmp/other rw,relatime shared:52 - fuse.sshfs host: rw
100 22 0:55 / /tmp/plain rw,relatime - fuse other rw
";

    #[test]
    fn only_recorded_dafne_mounts_count_and_escapes_are_decoded() {
        let dafne = dafne_mounts(INFO);
        assert_eq!(
            dafne,
            vec![(makedev(0, 52), PathBuf::from("/tmp/d/mnt")), (makedev(0, 53), PathBuf::from("/tmp/with space"))]
        );
        let all = [
            PathBuf::from("/tmp/d/mnt"),
            PathBuf::from("/tmp/with space"),
            PathBuf::from("/tmp/other"),
            PathBuf::from("/tmp/plain"),
        ];
        assert_eq!(select(&dafne, &all, None), (vec![makedev(0, 52), makedev(0, 53)], vec![]));
        // Not recorded by this cluster: foreign, whatever the environment
        // names.
        let one = [PathBuf::from("/tmp/d/mnt")];
        let named = [PathBuf::from("/tmp/with space")];
        assert_eq!(select(&dafne, &one, None), (vec![makedev(0, 52)], vec![makedev(0, 53)]));
        assert_eq!(select(&dafne, &one, Some(&named)), (vec![], vec![makedev(0, 52), makedev(0, 53)]));
        assert_eq!(select(&dafne, &all, Some(&named)), (vec![makedev(0, 53)], vec![makedev(0, 52)]));
        assert_eq!(select(&dafne, &[PathBuf::from("/tmp/d")], None).0, Vec::<u64>::new());
        // A dafne mount covered by another file system is not dafne's.
        let covered = format!("{INFO}101 97 0:56 / /tmp/d/mnt rw - ext4 /dev/vdb rw\n");
        assert_eq!(dafne_mounts(&covered), vec![(makedev(0, 53), PathBuf::from("/tmp/with space"))]);
        // A damaged line is skipped, not a panic.
        assert_eq!(parse_mountinfo_line("1 2 x / / - "), None);
        assert_eq!(parse_mountinfo_line(""), None);
        assert_eq!(unescape("a\\0"), "a\\0");
    }

    #[test]
    fn device_numbers_match_glibc() {
        assert_eq!(makedev(0, 52), libc::makedev(0, 52));
        assert_eq!(makedev(254, 1), libc::makedev(254, 1));
        assert_eq!(makedev(4095, 1 << 20), libc::makedev(4095, 1 << 20));
    }

    #[test]
    fn the_cluster_is_found_as_the_dafne_command_finds_it() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(cluster_path(env(&[("HOME", "/h")])), Some(PathBuf::from("/h/.dafne")));
        assert_eq!(cluster_path(env(&[("HOME", "/h"), ("DAFNE_HOME", "/c")])), Some(PathBuf::from("/c")));
        assert_eq!(
            cluster_path(env(&[("DAFNE_HOME", "/c"), ("DAFNE_CLUSTER", "/x/cluster.json")])),
            Some(PathBuf::from("/x/cluster.json"))
        );
        assert_eq!(cluster_path(env(&[])), None);
    }

    #[test]
    fn records_are_parsed_as_bytes_and_dead_daemons_are_stale() {
        use std::ffi::OsStr;
        let r = parse_record(OsStr::new("42"), b"123\n/mnt/d").unwrap();
        assert_eq!(r, Record { pid: 42, start: 123, mount_point: PathBuf::from("/mnt/d") });
        assert_eq!(parse_record(OsStr::new("42"), b"123"), None);
        assert_eq!(parse_record(OsStr::new("42"), b"x\n/mnt"), None);
        assert_eq!(parse_record(OsStr::new(".42.tmp"), b"1\n/mnt"), None);
        assert_eq!(parse_record(OsStr::new("42"), b"1\n"), None);

        let dir = std::env::temp_dir().join(format!("dafne-preload-records-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mounts")).unwrap();
        let me = std::process::id();
        let start = start_time(me).unwrap();
        let write = |name: String, body: String| std::fs::write(dir.join("mounts").join(name), body).unwrap();
        write(me.to_string(), format!("{start}\n/live"));
        // A pid past any pid_max (2^22): no such process.
        write("999999999".into(), "0\n/dead".into());
        // pid 1 is alive but did not start when this record says.
        write("1".into(), format!("{}\n/reused", start_time(1).unwrap_or(0) + 1));
        write(".7.tmp".into(), "0\n/partial".into());
        assert_eq!(recorded_mounts(&dir), vec![PathBuf::from("/live")]);
        // A cluster.json path (present or not) names its directory.
        assert_eq!(recorded_mounts(&dir.join("cluster.json")), vec![PathBuf::from("/live")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
