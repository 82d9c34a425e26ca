//! Copying a process's own output to a log file as well (a supervisor in
//! the foreground: its output to the service manager's journal and to
//! `DIR/logs/supervisor.log`, which `dafne down` follows).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::Error;

/// Copies this process's stdout and stderr to where they went and to a
/// log file, until [`Tee::finish`].
#[derive(Debug)]
pub struct Tee {
    saved: (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
    thread: std::thread::JoinHandle<()>,
}

impl Tee {
    /// Starts copying; `log` is created (truncated).
    pub fn start(log: &Path) -> Result<Tee, Error> {
        use std::io::Write as _;
        use std::os::fd::AsFd as _;
        let errno = |what: &'static str| move |e: rustix::io::Errno| Error::Io { what: what.into(), source: e.into() };
        let mut file = std::fs::File::create(log).map_err(Error::io(format!("creating {}", log.display())))?;
        let out = std::io::stdout().as_fd().try_clone_to_owned().map_err(Error::io("duplicating stdout"))?;
        let err = std::io::stderr().as_fd().try_clone_to_owned().map_err(Error::io("duplicating stderr"))?;
        let (mut reader, writer) = std::io::pipe().map_err(Error::io("creating a pipe"))?;
        let mut to = std::fs::File::from(out.try_clone().map_err(Error::io("duplicating stdout"))?);
        rustix::stdio::dup2_stdout(&writer).map_err(errno("redirecting stdout"))?;
        rustix::stdio::dup2_stderr(&writer).map_err(errno("redirecting stderr"))?;
        drop(writer);
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = std::io::Read::read(&mut reader, &mut buf) {
                if n == 0 {
                    break;
                }
                let _ = to.write_all(&buf[..n]);
                let _ = file.write_all(&buf[..n]);
            }
        });
        Ok(Tee { saved: (out, err), thread })
    }

    /// Puts stdout and stderr back and copies what is left.
    pub fn finish(self) {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let _ = rustix::stdio::dup2_stdout(&self.saved.0);
        let _ = rustix::stdio::dup2_stderr(&self.saved.1);
        // The pipe ends when the servers' inherited copies close too;
        // a server left running (it did not stop) would hold it open.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.thread.is_finished() {
            let _ = self.thread.join();
        }
    }
}
