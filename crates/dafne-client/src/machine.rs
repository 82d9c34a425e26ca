//! What the machine has to spare, for sizing what a process registers:
//! the io servers' default caches (`dafne up`), the bound on `libdafne`'s
//! `dafne_mem_alloc` and on `dafne nbd serve`'s buffers. Registered memory
//! is pinned (or a shared-memory segment in /dev/shm): asking for more than
//! the machine has wakes the OOM killer, which takes every dafne process on
//! the machine with it (seen in review), so callers bound requests by it.

/// The kernel's estimate of memory available without swapping
/// (`MemAvailable` in `/proc/meminfo`), in bytes; `None` where it cannot be
/// read.
pub fn available_bytes() -> Option<u64> {
    parse_available_bytes(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn parse_available_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   22720512 kB\n";
        assert_eq!(parse_available_bytes(meminfo), Some(22720512 * 1024));
        assert_eq!(parse_available_bytes("MemFree: 1 kB\n"), None);
        assert_eq!(parse_available_bytes("MemAvailable: lots kB\n"), None);
    }
}
