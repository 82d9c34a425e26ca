//! A dafne cluster's lifecycle on one host: starting its server processes,
//! supervising them (restarts within a budget, `servers.json`), reclaiming
//! deleted files' data and relaying revocations, and stopping them in the
//! order that keeps data (mounts, then io servers, then meta).
//!
//! # Why a library
//! The `dafne` command's `up` (and its hidden `supervise`) used to hold
//! this machinery inside the executable. A deployment of several hosts
//! with its own service binary, and tests that want a supervisor without
//! the command line around it, need the same behaviour: the same restart
//! budget, the same files in the cluster directory, the same stop order.
//! Kept here, there is one implementation; the command is a caller that
//! turns its configuration into a [`Plan`] and prints.
//!
//! # What the caller decides, what this crate does
//! The caller chooses the servers (a [`ServerSpec`] each: name, address,
//! the arguments its process is started with) and the [`RestartPolicy`],
//! and owns everything about the configuration file and `cluster.json`
//! (the rendezvous clients read, whose contents are the command's). This
//! crate:
//! * starts each server as a child process of the supervisor's own
//!   executable with the spec's arguments, its output in
//!   `DIR/logs/NAME.log`, and waits for its `listening on ADDR` line
//!   (after it, optionally, `metrics on ADDR`) ([`Supervisor::start_all`]);
//! * records every server's pid, state and restarts in `DIR/servers.json`
//!   ([`ServerState`], [`load_states`]);
//! * watches them every [`SUPERVISOR_TICK`] and restarts one that exits, on
//!   the same address, up to `max_restarts` times within
//!   `restart_window_s` ([`Supervisor::supervise`]); every decision is a
//!   line on stdout, which the command sends to `DIR/logs/supervisor.log`;
//! * where the metadata server runs, the reclaimer and the revocation relay
//!   ([`Supervisor::start_reclaimer`], [`reclaim`]);
//! * stops everything: the cluster's FUSE mounts (recorded under
//!   `DIR/mounts/`, [`mounts`]), then io servers (SIGTERM: they write back
//!   their caches, [`IO_STOP_GRACE`]), then meta ([`Supervisor::stop_all`]).
//!
//! Lines this crate prints start with `progress: ` (what `dafne up` and
//! `dafne down` show while they follow the log, [`progress`]) or `error: `
//! (what `dafne down` counts as an unclean stop); tests read some of the
//! others (`restarting io-0 (1/1 within 5s; 1 in all)`), so they are kept
//! word for word.
//!
//! Why a separate supervisor process rather than the servers detaching
//! themselves: someone has to notice a crash and restart it, and the
//! servers must not fork after UCX starts (UCX does not survive fork).
//!
//! # A server's own process
//! A server started by a supervisor calls [`server_entry`] first: with a
//! supervisor that stops its servers with it ([`Plan::stop_with_supervisor`],
//! `dafne up --foreground` under a service manager), it asks the kernel
//! for SIGTERM at the supervisor's death.
//!
//! The descriptor gate (`dafne_ucx::acceptgate`: a reserve of descriptors
//! a flood on a server's listener cannot take) is not installed by this
//! library: it works by the *executable* defining the C symbol `accept`
//! (a `--defsym` link argument), so that the dynamic linker binds libucs's
//! `accept` calls to it, and a library's build script cannot add a link
//! argument to the executables that use it (Cargo passes a build script's
//! `rustc-link-arg*` to its own package's targets only). The `dafne`
//! executable does it in `crates/dafne/build.rs`; a deployment's own server
//! binary gets the gate with the same line in its build script:
//!
//! ```text
//! println!("cargo:rustc-link-arg-bins=-Wl,--defsym=accept=dafne_gated_accept");
//! ```
//!
//! and can check it at start with [`accept_gate_in_effect`]. Without it a
//! server still runs, with its soft descriptor limit raised to the hard
//! one, as in test binaries (the gate's module docs say what that costs
//! under a flood).

pub mod mounts;
pub mod procs;
pub mod reclaim;
mod spawn;
mod states;
mod supervisor;
mod tee;

use std::path::PathBuf;

pub use reclaim::{ReclaimTarget, RELAY_EVERY};
pub use spawn::{server_entry, tail};
pub use states::{load_states, ServerState};
pub use supervisor::{
    stop_on_signals, Plan, RestartPolicy, ServerSpec, Supervisor, IO_STOP_GRACE, STOP_GRACE, SUPERVISOR_TICK,
};
pub use tee::Tee;

/// The directory of the servers' and the supervisor's logs.
pub fn logs_dir(dir: &std::path::Path) -> PathBuf {
    dir.join("logs")
}

/// A `progress: ` line on stdout: what `dafne up` and `dafne down` print
/// while they follow the supervisor's log.
pub fn progress(msg: impl std::fmt::Display) {
    println!("progress: {msg}");
}

/// Whether this executable has the accept gate (module docs, "A server's
/// own process").
pub fn accept_gate_in_effect() -> bool {
    dafne_ucx::acceptgate::in_effect()
}

/// What went wrong, with what was being done. `Display` says the step;
/// the cause is its `source()` (print the chain, as `anyhow`'s `{:#}` does,
/// for the whole story).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file, pipe, signal or process operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A server printed an address that does not parse.
    #[error("{what}")]
    Address {
        what: &'static str,
        #[source]
        source: std::net::AddrParseError,
    },
    /// A server did not come to listen: it exited, printed something else
    /// first, or took longer than its start may; with its log's last lines.
    #[error("{why}. Its log, {}:\n{tail}", log.display())]
    NotListening { why: String, log: PathBuf, tail: String },
    /// A server of the plan did not start, so the supervisor stopped the
    /// others (the `error:` line it printed says which and why).
    #[error("the cluster did not start")]
    DidNotStart { server: String },
    /// A supervisor whose servers stop with it
    /// ([`Plan::stop_with_supervisor`]) was asked to start one from a
    /// thread other than the process's main thread: the kernel signals a
    /// server when the *thread* that started it ends, so such a server
    /// would be stopped when that thread ends, not with the supervisor.
    #[error(
        "a supervisor whose servers stop with it (stop_with_supervisor) starts them from the process's main \
         thread only: the kernel stops a server when the thread that started it ends (call start_all and \
         supervise from main, or set stop_with_supervisor to false)"
    )]
    NotMainThread,
    /// [`server_entry`]: the supervisor that was to stop this server with
    /// it died before the server could ask for that.
    #[error("the supervisor (pid {pid}) that started this server is gone")]
    SupervisorGone { pid: String },
    /// The reclaimer's transport (a UCX context) did not start.
    #[error("starting the reclaimer's transport")]
    Transport(#[source] dafne_transport::TransportError),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// An error with its chain of causes, `: `-separated (what `anyhow` prints
/// for `{:#}`), for the lines this crate prints itself.
pub(crate) struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module docs: the gate is the executable's, so linking this
    /// library (as this test binary does) does not bring it along.
    #[test]
    fn linking_the_library_does_not_bring_the_accept_gate() {
        assert!(!accept_gate_in_effect());
    }

    #[test]
    fn an_error_prints_its_step_then_its_causes() {
        let e = Error::io("opening /x/io-0.log")(std::io::Error::from_raw_os_error(2));
        assert_eq!(e.to_string(), "opening /x/io-0.log");
        assert_eq!(Chain(&e).to_string(), "opening /x/io-0.log: No such file or directory (os error 2)");
    }
}
