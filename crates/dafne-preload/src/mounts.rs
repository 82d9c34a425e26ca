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
//! command finds it. Its mounts are the ones `dafne mount` recorded in
//! `DIR/mounts/` (one file per daemon: its start time, then the mount
//! point), or the mount points listed in `$DAFNE_PRELOAD_MOUNT`
//! (colon-separated); each must appear in `/proc/self/mountinfo` as a
//! dafne FUSE file system, which gives its device number without a
//! request to the mount.

use std::path::{Path, PathBuf};

/// What discovery found: the cluster to connect to and its mounts'
/// devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounts {
    pub cluster: PathBuf,
    pub devs: Vec<u64>,
}

impl Mounts {
    pub fn contains(&self, dev: u64) -> bool {
        self.devs.contains(&dev)
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

/// The mount points recorded in a cluster directory (`DIR/mounts/PID`:
/// the daemon's start time on the first line, the mount point after it).
pub fn recorded_mounts(cluster: &Path) -> Vec<PathBuf> {
    let dir = if cluster.is_file() { cluster.parent().unwrap_or(cluster).to_path_buf() } else { cluster.to_path_buf() };
    let Ok(rd) = std::fs::read_dir(dir.join("mounts")) else { return Vec::new() };
    let mut out = Vec::new();
    for e in rd.flatten() {
        if e.file_name().as_encoded_bytes().starts_with(b".") {
            continue;
        }
        if let Ok(bytes) = std::fs::read(e.path()) {
            if let Some(mp) = record_mount_point(&bytes) {
                out.push(mp);
            }
        }
    }
    out
}

/// The mount point of one record (the bytes after the first line).
pub fn record_mount_point(record: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let nl = record.iter().position(|&b| b == b'\n')?;
    let mp = &record[nl + 1..];
    (!mp.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(mp)))
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

/// The devices of the dafne mounts among `mount_points`, from the
/// text of `/proc/self/mountinfo`.
pub fn dafne_devices(mountinfo: &str, mount_points: &[PathBuf]) -> Vec<u64> {
    let mut devs: Vec<u64> = mountinfo
        .lines()
        .filter_map(parse_mountinfo_line)
        .filter(|(_, mp, dafne)| *dafne && mount_points.iter().any(|m| m == mp))
        .map(|(dev, _, _)| dev)
        .collect();
    devs.sort_unstable();
    devs.dedup();
    devs
}

/// Discovery from the environment and the files above; `None` when no
/// dafne mount of the cluster is visible (then nothing is intercepted).
pub fn discover(env: impl Fn(&str) -> Option<String>) -> Option<Mounts> {
    let cluster = cluster_path(&env)?;
    let mount_points: Vec<PathBuf> = match env("DAFNE_PRELOAD_MOUNT").filter(|m| !m.is_empty()) {
        Some(list) => list.split(':').filter(|m| !m.is_empty()).map(PathBuf::from).collect(),
        None => recorded_mounts(&cluster),
    };
    if mount_points.is_empty() {
        return None;
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let devs = dafne_devices(&info, &mount_points);
    (!devs.is_empty()).then_some(Mounts { cluster, devs })
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
        let mps = [
            PathBuf::from("/tmp/d/mnt"),
            PathBuf::from("/tmp/with space"),
            PathBuf::from("/tmp/other"),
            PathBuf::from("/tmp/plain"),
        ];
        assert_eq!(dafne_devices(INFO, &mps), vec![makedev(0, 52), makedev(0, 53)]);
        assert_eq!(dafne_devices(INFO, &[PathBuf::from("/tmp/d")]), Vec::<u64>::new());
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
        assert_eq!(record_mount_point(b"123\n/mnt/d"), Some(PathBuf::from("/mnt/d")));
        assert_eq!(record_mount_point(b"123"), None);
    }
}
