//! The metadata benchmark: creates, stats and unlinks per second against a
//! real metadata server process, with 1 and with several concurrent clients
//! (each its own process-level connection and session, in its own thread).
//! Every create and unlink is durable (fsynced) before it is acknowledged;
//! concurrent clients share commits (group commit).
//!
//! Locks (issue 11): lock + unlock pairs per second, each pair two round
//! trips (the metadata server holds locks in memory: no commit). Free:
//! each client locks a file of its own. Contended: every client takes and
//! releases a write lock on the same bytes of one file, waiting for it
//! (`F_SETLKW`), so each pair also waits for the others' (the server
//! grants a waiter the moment the holder's unlock arrives).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use dafne_client::{LockKind, MetaSession, ROOT_INO};
use dafne_transport::{Runtime, RuntimeOptions};

use crate::transport::ServerCommand;

#[derive(Debug, Clone)]
pub struct Options {
    /// Client counts to measure (e.g. 1 and 4).
    pub clients: Vec<usize>,
    /// Files per client per phase.
    pub files: usize,
    pub server: ServerCommand,
    /// Where the server keeps its store (a fresh directory per run is made inside).
    pub scratch: PathBuf,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub clients: usize,
    pub files_per_client: usize,
    pub creates_per_s: f64,
    pub stats_per_s: f64,
    pub unlinks_per_s: f64,
    /// Lock + unlock pairs per second, each client on a file of its own.
    pub lock_pairs_per_s: f64,
    /// Lock + unlock pairs per second, every client on the same bytes.
    pub contended_lock_pairs_per_s: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub rows: Vec<Row>,
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ucx() -> Vec<(String, String)> {
    vec![("TLS".into(), "posix,sysv,self,tcp".into()), ("NET_DEVICES".into(), "lo".into())]
}

fn start(cmd: &ServerCommand, dir: &std::path::Path) -> Result<(Server, SocketAddr)> {
    let mut c = Command::new(&cmd.program);
    c.args(&cmd.prefix).args(["--data-dir", &dir.display().to_string(), "--listen", "127.0.0.1:0"]);
    for (k, v) in ucx() {
        c.arg("--ucx").arg(format!("{k}={v}"));
    }
    let mut child = c.stdout(Stdio::piped()).spawn().context("starting the metadata server")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?).read_line(&mut line)?;
    let s = Server(child);
    let addr =
        line.trim().strip_prefix("listening on ").ok_or_else(|| anyhow!("meta server did not start: {line:?}"))?;
    Ok((s, addr.parse()?))
}

/// Runs one phase in every client thread at once; returns ops/s overall.
fn phase(sessions: &[(MetaSession, u64)], files: usize, f: fn(&MetaSession, u64, usize) -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    std::thread::scope(|sc| {
        let hs: Vec<_> = sessions
            .iter()
            .map(|(s, dir)| {
                sc.spawn(move || -> Result<()> {
                    for i in 0..files {
                        f(s, *dir, i)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow!("client thread panicked"))??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok((files * sessions.len()) as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

fn name(i: usize) -> Vec<u8> {
    format!("file{i:08}").into_bytes()
}

pub fn run(o: &Options, mut progress: impl FnMut(&str)) -> Result<Report> {
    let mut rows = Vec::new();
    for &n in &o.clients {
        let dir = o.scratch.join(format!("meta-bench-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (_srv, addr) = start(&o.server, &dir)?;
        let secret = dafne_auth::Secret::load_or_create(&dir.join("cluster.secret"))?;
        let runtimes: Vec<Runtime> = (0..n)
            .map(|i| {
                Runtime::new(RuntimeOptions {
                    name: format!("bench-meta-{i}"),
                    ucx_config: ucx(),
                    spin: Duration::from_micros(50),
                    ..Default::default()
                })
            })
            .collect::<Result<_, _>>()?;
        let mut sessions = Vec::new();
        for (i, rt) in runtimes.iter().enumerate() {
            let s = MetaSession::connect(rt, addr, &secret, &format!("bench{i}"), 0, 0)?;
            let d = s.mkdir(ROOT_INO, format!("c{i}").as_bytes(), 0o755).map_err(|e| anyhow!("mkdir: {e}"))?;
            sessions.push((s, d.ino));
        }
        progress(&format!("{n} client(s): creates"));
        let creates = phase(&sessions, o.files, |s, d, i| {
            s.create(d, &name(i), 0o644, true).map(|_| ()).map_err(|e| anyhow!("create: {e}"))
        })?;
        progress(&format!("{n} client(s): stats"));
        let stats =
            phase(&sessions, o.files, |s, d, i| s.lookup(d, &name(i)).map(|_| ()).map_err(|e| anyhow!("lookup: {e}")))?;
        progress(&format!("{n} client(s): locks"));
        let mut files = Vec::new();
        for (s, d) in &sessions {
            let f = s.create(*d, b"lockfile", 0o644, true).map_err(|e| anyhow!("create: {e}"))?;
            files.push((s.clone(), f.ino));
        }
        let pair = |s: &MetaSession, f: u64, _i: usize| -> Result<()> {
            s.lock(f, 1, 1, 0, 0, LockKind::Write, true).map_err(|e| anyhow!("lock: {e}"))?;
            s.lock(f, 1, 1, 0, 0, LockKind::Unlock, false).map_err(|e| anyhow!("unlock: {e}"))
        };
        let lock_pairs = phase(&files, o.files, pair)?;
        let shared = files[0].1;
        let contended: Vec<(MetaSession, u64)> = files.iter().map(|(s, _)| (s.clone(), shared)).collect();
        progress(&format!("{n} client(s): contended locks"));
        let contended_pairs = phase(&contended, o.files, pair)?;
        progress(&format!("{n} client(s): unlinks"));
        let unlinks = phase(&sessions, o.files, |s, d, i| s.unlink(d, &name(i)).map_err(|e| anyhow!("unlink: {e}")))?;
        rows.push(Row {
            clients: n,
            files_per_client: o.files,
            creates_per_s: creates,
            stats_per_s: stats,
            unlinks_per_s: unlinks,
            lock_pairs_per_s: lock_pairs,
            contended_lock_pairs_per_s: contended_pairs,
        });
        drop(files);
        drop(contended);
        drop(sessions);
        drop(runtimes);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(Report { rows })
}

impl Report {
    pub fn to_markdown(&self) -> String {
        let mut s = String::from(
            "Metadata operations per second (durable: each create/unlink is fsynced before its reply)\n\n\
             | clients | files per client | creates/s | stats/s | unlinks/s | lock+unlock pairs/s (own file) | \
             lock+unlock pairs/s (same bytes, waiting) |\n|---|---|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
                r.clients,
                r.files_per_client,
                r.creates_per_s,
                r.stats_per_s,
                r.unlinks_per_s,
                r.lock_pairs_per_s,
                r.contended_lock_pairs_per_s
            ));
        }
        s
    }
}
