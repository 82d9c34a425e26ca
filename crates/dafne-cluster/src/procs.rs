//! Processes by pid, without mistaking a reused pid for the one meant: a
//! process is named by its pid and its start time.

/// When a process started (clock ticks since boot, field 22 of
/// /proc/PID/stat): with the pid, it names one process, even after the pid
/// is reused.
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    // After the name: state is field 3, so starttime (22) is the 20th here.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process `pid` that started at `start` still runs (`start`
/// 0: unknown, the pid alone decides).
pub fn same_process_alive(pid: u32, start: u64) -> bool {
    pid_alive(pid) && (start == 0 || start_time(pid) == Some(start))
}

/// Whether a process exists (and is not a zombie).
///
/// A process whose main thread has exited shows that thread as a zombie
/// while its other threads are still exiting, and those still hold the
/// process's files (the metadata store's lock, its ports): it is gone only
/// when the zombie leader is its last task. (Seen in CI: `down` returned,
/// and the next `up`'s meta found the store still locked.)
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(s) => match s.rsplit_once(')') {
            Some((_, rest)) if rest.trim_start().starts_with('Z') => {
                std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count() > 1).unwrap_or(false)
            }
            Some(_) => true,
            None => false,
        },
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_of_processes() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(u32::MAX - 1));
        let me = std::process::id();
        let t = start_time(me).unwrap();
        assert!(same_process_alive(me, t) && same_process_alive(me, 0));
        assert!(!same_process_alive(me, t + 1), "another process that had this pid");
    }
}
