//! Starting one server process and waiting until it listens; what the
//! server process does first ([`server_entry`]).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::Error;

/// How long a server may take to print its address.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

/// The variable that tells a server the pid of the supervisor it stops
/// with ([`crate::Plan::stop_with_supervisor`], [`server_entry`]).
const SUPERVISOR_ENV: &str = "DAFNE_STOP_WITH_SUPERVISOR";

/// A server that listens: its process, address and metrics address.
pub(crate) struct Spawned {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics: Option<SocketAddr>,
}

/// The last `n` lines of a file (for error messages), each as `  | LINE`.
pub fn tail(path: &Path, n: usize) -> String {
    let text = String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|l| format!("  | {l}\n")).collect()
}

static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The executable the servers run: the supervisor's own, as it was when it
/// was first asked (a rebuild or upgrade replaces the file under a running
/// supervisor; restarts keep using a path that exists).
pub(crate) fn server_exe() -> Result<PathBuf, Error> {
    if let Some(p) = EXE.get() {
        return Ok(p.clone());
    }
    let p = std::env::current_exe().map_err(Error::io("locating the dafne executable"))?;
    Ok(EXE.get_or_init(|| p).clone())
}

/// Whether the calling thread is the process's main thread (its thread id
/// is the process id), whose end is the process's: the one thread from
/// which a server told to stop with its supervisor (`PR_SET_PDEATHSIG`,
/// [`server_entry`]) may be started, as the kernel signals the server when
/// the thread that forked it ends. True when /proc cannot tell.
pub(crate) fn on_main_thread() -> bool {
    let Ok(link) = std::fs::read_link("/proc/thread-self") else { return true };
    // `PID/task/TID`.
    link.to_str().and_then(|l| l.split_once("/task/")).is_none_or(|(pid, tid)| pid == tid)
}

/// What a server process started by a supervisor calls first (`dafne
/// serve` does): when started by a supervisor that stops its servers with
/// it ([`crate::Plan::stop_with_supervisor`]), asks the kernel for SIGTERM
/// at the supervisor's death (`PR_SET_PDEATHSIG`; such a supervisor spawns
/// servers from its main thread only, whose end is the process's:
/// [`crate::Error::NotMainThread`]), and fails at once if it died already.
/// Otherwise it does nothing. Call it before the process starts any
/// thread: it removes the supervisor's marker from the environment
/// (`std::env::remove_var`, sound only while one thread runs).
pub fn server_entry() -> Result<(), Error> {
    let Ok(pid) = std::env::var(SUPERVISOR_ENV) else { return Ok(()) };
    // Not for the server's own children (called first, before it starts
    // threads).
    std::env::remove_var(SUPERVISOR_ENV);
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .map_err(|e| Error::Io { what: "asking to be stopped with the supervisor".into(), source: e.into() })?;
    let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get().to_string());
    if parent.as_deref() != Some(pid.as_str()) {
        return Err(Error::SupervisorGone { pid });
    }
    Ok(())
}

/// Starts the server executable with `args`, waits for `listening on
/// ADDR` (after it, `metrics on ADDR` when it serves metrics); output goes
/// to `log` (stdout's banner lines are read here first). With
/// `stop_with_me`, the server is told to stop when this process dies.
pub(crate) fn spawn_server(args: &[String], log: &Path, stop_with_me: bool) -> Result<Spawned, Error> {
    if stop_with_me && !on_main_thread() {
        return Err(Error::NotMainThread);
    }
    let exe = server_exe()?;
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(Error::io(format!("opening {}", log.display())))?;
    let stderr = logf.try_clone().map_err(Error::io(format!("opening {}", log.display())))?;
    let mut child = Command::new(exe)
        .args(args)
        // A server restarted on its port must not wait out the TIME_WAIT of
        // its predecessor's connections (a UCT setting, so not in `--ucx`).
        .env("UCX_TCP_CM_REUSEADDR", "y")
        // The metadata server's test hook that drops replies must never
        // reach a cluster from a variable left set in the user's shell.
        .env_remove(dafne_meta::service::FAULT_DROP_REPLY)
        .env_remove(SUPERVISOR_ENV)
        .envs(stop_with_me.then(|| (SUPERVISOR_ENV, std::process::id().to_string())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(Error::io("starting a server process"))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Write as _;
        let mut r = BufReader::new(stdout);
        let mut logf = logf;
        let mut metrics = None;
        // UCX logs to stdout: pass its lines to the log until the banner.
        let banner = loop {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) => break Ok(String::new()),
                Ok(_) if line.starts_with("listening on ") => break Ok(line),
                Ok(_) if line.starts_with("metrics on ") => metrics = Some(line),
                Ok(_) => {
                    let _ = logf.write_all(line.as_bytes());
                }
                Err(e) => break Err(e),
            }
        };
        let _ = tx.send(banner.map(|b| (b, metrics)));
        // Keep draining stdout into the log so the server never blocks on it.
        let _ = std::io::copy(&mut r, &mut logf);
    });
    match rx.recv_timeout(LISTEN_TIMEOUT) {
        Ok(Ok((line, metrics))) if line.starts_with("listening on ") => {
            let addr = line.trim()["listening on ".len()..]
                .parse()
                .map_err(|source| Error::Address { what: "parsing the server's address", source })?;
            let metrics = match metrics {
                Some(m) => Some(
                    m.trim()["metrics on ".len()..]
                        .parse()
                        .map_err(|source| Error::Address { what: "parsing the metrics address", source })?,
                ),
                None => None,
            };
            Ok(Spawned { child, addr, metrics })
        }
        other => {
            let _ = child.kill();
            let status = child.wait().ok();
            let why = match other {
                Ok(Ok((l, _))) if l.is_empty() => {
                    format!("it exited ({})", status.map(|s| s.to_string()).unwrap_or_default())
                }
                Ok(Ok((l, _))) => format!("unexpected first line {l:?}"),
                Ok(Err(e)) => format!("reading its output: {e}"),
                Err(_) => format!("it did not listen within {}s", LISTEN_TIMEOUT.as_secs()),
            };
            Err(Error::NotListening { why, log: log.to_path_buf(), tail: tail(log, 20) })
        }
    }
}
