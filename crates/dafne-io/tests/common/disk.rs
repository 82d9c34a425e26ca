//! Real file systems for the storage-fault tests (`full_disk.rs`,
//! `power_cut.rs`, `failing_device.rs`): tmpfs of a chosen size and ext4
//! on a loop device, mounted for the life of a value. They need root
//! (mount, losetup, mkfs.ext4, fstrim); CI runs as root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs a command that must succeed; its standard output, trimmed.
pub fn sh(args: &[&str]) -> String {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?} failed (the storage tests need root, tmpfs, loop devices and mkfs.ext4): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Something mounted at a directory (and a loop device, when there is
/// one), undone when dropped (also after a failed check).
pub struct Mounted {
    pub dir: PathBuf,
    loop_dev: Option<String>,
}

impl Mounted {
    /// A tmpfs of `mib` MiB at `dir`.
    pub fn tmpfs(dir: &Path, mib: u64) -> Mounted {
        std::fs::create_dir_all(dir).unwrap();
        sh(&["mount", "-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs", dir.to_str().unwrap()]);
        Mounted { dir: dir.to_path_buf(), loop_dev: None }
    }

    /// The ext4 file system in `image`, on a loop device, at `dir`.
    pub fn ext4(image: &Path, dir: &Path) -> Mounted {
        std::fs::create_dir_all(dir).unwrap();
        let dev = sh(&["losetup", "--find", "--show", image.to_str().unwrap()]);
        let m = Mounted { dir: dir.to_path_buf(), loop_dev: Some(dev.clone()) };
        // errors=continue: a failed write must reach the io server as an
        // error, not turn the file system read-only under the test.
        sh(&["mount", "-t", "ext4", "-o", "errors=continue", &dev, dir.to_str().unwrap()]);
        m
    }

    /// A new ext4 file system of `mib` MiB in `image`, mounted at `dir`.
    pub fn new_ext4(image: &Path, dir: &Path, mib: u64) -> Mounted {
        std::fs::File::create(image).unwrap().set_len(mib << 20).unwrap();
        sh(&["mkfs.ext4", "-q", "-F", image.to_str().unwrap()]);
        Mounted::ext4(image, dir)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // Lazily: an io server killed a moment ago may still hold files.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

/// Free bytes of the file system holding `p`.
pub fn free_bytes(p: &Path) -> u64 {
    let out = sh(&["df", "--output=avail", "-B1", p.to_str().unwrap()]);
    out.lines().last().unwrap().trim().parse().unwrap()
}
