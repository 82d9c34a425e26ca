//! The caller's supplementary groups, read from `/proc`.
//!
//! # Why
//! A FUSE request names only the caller's uid, gid and pid. The metadata
//! server checks permissions itself on every request (the kernel checks too,
//! `default_permissions`), and without the caller's other groups it refused
//! what Linux allows: a chown to a supplementary group, a lookup through a
//! directory searchable by one of them.
//!
//! # How
//! The daemon reads `/proc/<pid>/status` of the requesting thread (the
//! kernel's `pid` is the thread's id, and credentials are per thread):
//! its `Groups:` line, bounded to the first [`MAX_GROUPS`] (the line is
//! sorted ascending, so a caller in more groups loses its highest ones: it
//! may be refused something, never granted more), and only when the
//! thread's file-system uid and gid (the fourth field of `Uid:` and `Gid:`,
//! what the kernel put in the request) are the request's. So a process that
//! is gone (pid 0 for requests the kernel makes itself, or no such
//! process), or a pid reused by another user, contributes no groups.
//! At most [`READ_LIMIT`] bytes are read.
//!
//! Limits: the groups are read when the request is served, not when it was
//! made; a thread that changes its groups in between (setgroups) is
//! checked with its new groups. Where the daemon cannot read another
//! user's `/proc` entry (`/proc` mounted with `hidepid`), callers get no
//! supplementary groups: refused more, never granted more. The read costs
//! one small `/proc` file (~15% of the daemon's CPU per lookup), so it is
//! made only for a request whose answer may depend on the groups: after a
//! refusal without them, or first for the few that may succeed
//! differently (`crate::fuse`'s `Lazy`). Root's are never read.

use std::sync::atomic::{AtomicU64, Ordering};

use dafne_proto::{Groups, MAX_GROUPS};

/// Most bytes of `/proc/<pid>/status` read: the `Groups:` line follows
/// about 300 bytes of other lines, and 32 groups take at most 352 more.
pub const READ_LIMIT: u64 = 4096;

/// `/proc` reads made by [`of_process`] in this process (the mount's stats
/// file, `groups_reads`: the tests show a request that does not need the
/// groups reads none).
static READS: AtomicU64 = AtomicU64::new(0);

/// How many times [`of_process`] read a `/proc` file.
pub fn reads() -> u64 {
    READS.load(Ordering::Relaxed)
}

/// The supplementary groups of thread `pid`, if it runs as `uid`/`gid`
/// (file-system ids); none otherwise.
pub fn of_process(pid: u32, uid: u32, gid: u32) -> Groups {
    use std::io::Read;
    if pid == 0 {
        return Groups::NONE;
    }
    READS.fetch_add(1, Ordering::Relaxed);
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/status")) else { return Groups::NONE };
    let mut buf = Vec::with_capacity(READ_LIMIT as usize);
    if f.take(READ_LIMIT).read_to_end(&mut buf).is_err() {
        return Groups::NONE;
    }
    parse_status(&String::from_utf8_lossy(&buf), uid, gid)
}

/// The groups of a `/proc/<pid>/status` text (possibly cut short), if its
/// file-system uid and gid are `uid` and `gid`.
pub fn parse_status(status: &str, uid: u32, gid: u32) -> Groups {
    let field = |key: &str| status.lines().find_map(|l| l.strip_prefix(key));
    // "Uid:\treal\teffective\tsaved\tfs"
    let fs_id = |key: &str| field(key).and_then(|v| v.split_whitespace().nth(3)).and_then(|v| v.parse::<u32>().ok());
    if fs_id("Uid:") != Some(uid) || fs_id("Gid:") != Some(gid) {
        return Groups::NONE;
    }
    let Some(start) = status.find("\nGroups:") else { return Groups::NONE };
    let rest = &status[start + "\nGroups:".len()..];
    // A line cut short by the read limit: its last number may be partial.
    let (line, complete) = match rest.find('\n') {
        Some(end) => (&rest[..end], true),
        None => (rest, false),
    };
    let mut tokens: Vec<&str> = line.split_whitespace().collect();
    if !complete {
        tokens.pop();
    }
    let ids: Vec<u32> = tokens.iter().take(MAX_GROUPS).map_while(|t| t.parse().ok()).collect();
    Groups::new(&ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(uid: &str, gid: &str, groups: &str) -> String {
        format!("Name:\tcat\nUmask:\t0022\nState:\tR (running)\nTgid:\t7\nPid:\t7\nUid:\t{uid}\nGid:\t{gid}\nFDSize:\t64\nGroups:\t{groups}\nNStgid:\t7\n")
    }

    #[test]
    fn groups_of_the_caller_are_read_when_its_ids_match() {
        let s = status("1000\t1000\t1000\t1000", "100\t100\t100\t100", "4 24 27 100 ");
        assert_eq!(parse_status(&s, 1000, 100).as_slice(), &[4, 24, 27, 100]);
        // fsuid/fsgid are the fourth fields (setfsuid, or a setuid program).
        let s = status("1000\t0\t0\t1000", "100\t0\t0\t100", "5");
        assert_eq!(parse_status(&s, 1000, 100).as_slice(), &[5]);
        assert!(parse_status(&s, 0, 0).is_empty(), "another fs uid: a reused pid gets nothing");
        assert!(parse_status(&status("1000\t1000\t1000\t1000", "7\t7\t7\t7", "5"), 1000, 100).is_empty());
        assert!(parse_status(&status("0\t0\t0\t0", "0\t0\t0\t0", ""), 0, 0).is_empty());
        assert!(parse_status("", 0, 0).is_empty());
        assert!(parse_status("garbage\nUid:\tx\n", 0, 0).is_empty());
    }

    #[test]
    fn at_most_max_groups_and_a_cut_line_loses_only_its_partial_number() {
        let many: Vec<String> = (1000..1100).map(|g| g.to_string()).collect();
        let s = status("1\t1\t1\t1", "1\t1\t1\t1", &many.join(" "));
        let g = parse_status(&s, 1, 1);
        assert_eq!(g.as_slice(), &(1000..1000 + MAX_GROUPS as u32).collect::<Vec<_>>()[..]);
        // Cut inside "1002": 1000 and 1001 only.
        let cut = status("1\t1\t1\t1", "1\t1\t1\t1", "1000 1001 1002 1003");
        let cut = &cut[..cut.find("1002").unwrap() + 2];
        assert_eq!(parse_status(cut, 1, 1).as_slice(), &[1000, 1001]);
    }

    #[test]
    fn this_process_groups_are_found_and_a_missing_process_has_none() {
        let me = std::process::id();
        let own = std::fs::read_to_string(format!("/proc/{me}/status")).unwrap();
        let fs_id = |key: &str| -> u32 {
            let l = own.lines().find_map(|l| l.strip_prefix(key)).unwrap();
            l.split_whitespace().nth(3).unwrap().parse().unwrap()
        };
        let (uid, gid) = (fs_id("Uid:"), fs_id("Gid:"));
        let expected = parse_status(&own, uid, gid);
        assert_eq!(of_process(me, uid, gid), expected);
        assert!(of_process(0, uid, gid).is_empty());
        assert!(of_process(u32::MAX, uid, gid).is_empty());
    }
}
