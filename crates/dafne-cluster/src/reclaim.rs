//! The reclaimer and the revocation relay, run by the supervisor where the
//! metadata server runs ([`crate::Supervisor::start_reclaimer`]).
//!
//! # Reclaiming deleted files' data
//! When a file's last link goes, the metadata server lists its data
//! object as an orphan; it cannot remove the data itself, as it does not
//! know the io servers' addresses. Once the cluster is up the supervisor
//! runs a reclaimer thread: every few seconds it asks the metadata server,
//! as uid 0, for orphans older than `[cluster] reclaim_after_s`, sends
//! `Remove` to each object's io servers (signing its own capability with
//! the cluster secret), and tells the metadata server to forget the ones
//! removed. The metadata server never lists an object some client still
//! holds open (POSIX keeps an unlinked file readable until its last
//! close), nor any in the first `[meta] open_grace_s` after it starts,
//! while its clients re-announce their open files (`dafne_meta::opens`).
//! Failures are logged and retried in the next round. The removal carries
//! the generation of the listing, which each io server keeps as the
//! object's tombstone: no capability of it is honoured afterwards
//! (`dafne_auth`'s module docs, "Revocation").
//!
//! # Relaying revocations
//! A thread per io server relays meta's revocation log to it every
//! [`RELAY_EVERY`] (one per server, so that a host that does not answer
//! delays nothing but its own servers): it asks meta (as uid 0) for the
//! entries after the last one each io server reports having applied, and
//! sends them on. Meta signs each batch; an io server checks the signature
//! and that the batch follows on from what it has, so the relay is trusted
//! with nothing but delivery. An io server that restarted, or a restarted
//! meta, gets a reset (every capability older than meta's current
//! generation revoked).
//!
//! With several hosts, these run beside the metadata server only, and
//! reach the other hosts' io servers at their addresses in the
//! configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Chain, Error};

/// How often the relay sends meta's revocations to the io servers (module
/// docs, "Relaying revocations"): the most a chmod, truncate or unlink
/// takes to reach them after meta committed it, plus two round trips.
/// Idle, it costs one request to meta and one to each io server per
/// period.
pub const RELAY_EVERY: Duration = Duration::from_millis(200);

/// What the reclaimer and the relay reach, and how old an orphan must be.
#[derive(Debug, Clone)]
pub struct ReclaimTarget {
    /// The metadata server.
    pub meta: SocketAddr,
    /// Every io server of the cluster (on any host); index = server id.
    pub io: Vec<SocketAddr>,
    /// The cluster secret's file (the reclaimer acts as a fully trusted
    /// client, uid 0).
    pub secret: PathBuf,
    /// The UCX settings of the cluster.
    pub ucx: Vec<(String, String)>,
    /// `[cluster] reclaim_after_s`: orphans younger than this stay.
    pub after_s: u32,
}

/// Why a round, or a connection of it, failed (printed, then retried).
#[derive(Debug, thiserror::Error)]
enum ReclaimError {
    #[error("reading the cluster secret {}", path.display())]
    Secret {
        path: PathBuf,
        #[source]
        source: dafne_auth::SecretError,
    },
    #[error("connecting to the metadata server")]
    ConnectMeta(#[source] dafne_client::ConnectError),
    #[error("connecting to io-{server} at {addr}")]
    ConnectIo {
        server: usize,
        addr: SocketAddr,
        #[source]
        source: dafne_client::ConnectError,
    },
    #[error("listing orphans")]
    List(#[source] dafne_client::Errno),
    #[error("forgetting reclaimed orphans")]
    Forget(#[source] dafne_client::Errno),
}

/// The reclaimer (module docs) and the revocation relay. One transport
/// runtime (one UCX context and worker) serves them for the supervisor's
/// whole life: a failed connection attempt drops its endpoints in that
/// worker (forced closed when the peer never answered) rather than a whole
/// runtime each time. Each io server has a connection of its own, made and
/// used by a relay thread of its own, so that a host that does not answer
/// (a connect or a call waiting out its timeout) holds up nothing but its
/// own servers: revocations still reach the others within [`RELAY_EVERY`]
/// or so.
pub(crate) struct Reclaimer {
    after_s: u32,
    shared: Arc<ReclaimShared>,
}

/// What the reclaimer's threads share: the runtime, the metadata session
/// (made by the reclaimer's thread) and one data connection per io server
/// (each made by that server's relay thread).
struct ReclaimShared {
    meta_addr: SocketAddr,
    io_addrs: Vec<SocketAddr>,
    secret_path: PathBuf,
    rt: dafne_transport::Runtime,
    meta: Mutex<Option<(dafne_client::MetaSession, dafne_auth::Secret)>>,
    /// Per io server, a client of that one server (its id there is 0).
    io: Vec<Mutex<Option<dafne_client::data::DataClient>>>,
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

impl ReclaimShared {
    fn meta(&self) -> Option<(dafne_client::MetaSession, dafne_auth::Secret)> {
        self.meta.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn secret(&self) -> Result<dafne_auth::Secret, ReclaimError> {
        dafne_auth::Secret::load(&self.secret_path)
            .map_err(|source| ReclaimError::Secret { path: self.secret_path.clone(), source })
    }

    /// The metadata session, made if there is none yet.
    fn meta_or_connect(&self) -> Result<(dafne_client::MetaSession, dafne_auth::Secret), ReclaimError> {
        if let Some(m) = self.meta() {
            return Ok(m);
        }
        let secret = self.secret()?;
        let meta = dafne_client::MetaSession::connect(&self.rt, self.meta_addr, &secret, "reclaimer", 0, 0)
            .map_err(ReclaimError::ConnectMeta)?;
        *self.meta.lock().unwrap_or_else(|p| p.into_inner()) = Some((meta.clone(), secret.clone()));
        Ok((meta, secret))
    }

    /// Io server `server`'s client, made if there is none yet (this
    /// blocks while that server does not answer: called by that server's
    /// relay thread and by the reclaimer's round, never by another relay
    /// thread).
    fn io_or_connect(&self, server: usize) -> Result<dafne_client::data::DataClient, ReclaimError> {
        if let Some(d) = self.io[server].lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(d);
        }
        let secret = self.secret()?;
        let addr = self.io_addrs[server];
        let d = dafne_client::data::DataClient::connect(&self.rt, &[addr], &secret)
            .map_err(|source| ReclaimError::ConnectIo { server, addr, source })?;
        *self.io[server].lock().unwrap_or_else(|p| p.into_inner()) = Some(d.clone());
        Ok(d)
    }
}

impl Reclaimer {
    pub(crate) fn new(target: &ReclaimTarget) -> Result<Reclaimer, Error> {
        let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
            name: "reclaimer".into(),
            ucx_config: target.ucx.clone(),
            ..Default::default()
        })
        .map_err(Error::Transport)?;
        Ok(Reclaimer {
            after_s: target.after_s,
            shared: Arc::new(ReclaimShared {
                meta_addr: target.meta,
                io_addrs: target.io.clone(),
                secret_path: target.secret.clone(),
                rt,
                meta: Mutex::new(None),
                io: target.io.iter().map(|_| Mutex::new(None)).collect(),
            }),
        })
    }

    fn every(&self) -> Duration {
        Duration::from_secs(u64::from(self.after_s / 2).clamp(1, 5))
    }

    /// A round every `reclaim_after_s / 2` seconds, between 1 and 5 (the
    /// first at once), until `stop`; and one relay thread per io server
    /// ([`Reclaimer::relay_thread`]). Returns when they all stopped.
    pub(crate) fn run(self, stop: &AtomicBool) {
        let every = self.every();
        std::thread::scope(|s| {
            for server in 0..self.shared.io_addrs.len() {
                let shared = &self.shared;
                let _ = std::thread::Builder::new()
                    .name(format!("relay-io-{server}"))
                    .spawn_scoped(s, move || Self::relay_thread(shared, server, every, stop));
            }
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(RELAY_EVERY);
                if Instant::now() < next {
                    continue;
                }
                // While the cluster stops, failures are expected, not errors
                // (`down` reports every `error:` line of this log).
                if let Err(e) = self.round(stop) {
                    if !stop.load(Ordering::Relaxed) {
                        println!(
                            "error: reclaiming deleted files' data: {} (retried in {}s)",
                            Chain(&e),
                            every.as_secs()
                        );
                    }
                }
                next = Instant::now() + every;
            }
        });
    }

    /// Relays revocations to io server `server` every [`RELAY_EVERY`]
    /// (module docs, "Relaying revocations"): the batch that follows what
    /// it reports having applied. A server that did not answer keeps its
    /// position and is tried again next time; its connection is made again
    /// at most every `every` while it cannot be.
    fn relay_thread(shared: &ReclaimShared, server: usize, every: Duration, stop: &AtomicBool) {
        // (meta instance, log sequence) last applied ((0, 0): not asked yet).
        let mut at = (0u64, 0u64);
        let mut next_connect = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(RELAY_EVERY);
            let Some((meta, secret)) = shared.meta() else { continue };
            if shared.io[server].lock().unwrap_or_else(|p| p.into_inner()).is_none() {
                if Instant::now() < next_connect {
                    continue;
                }
                next_connect = Instant::now() + every;
            }
            // Failures are the round's to report (a server that is down).
            let Ok(data) = shared.io_or_connect(server) else { continue };
            let Ok(batch) = meta.revocations(at.0, at.1) else { continue };
            let cap = dafne_client::data::object_capability(&secret, 0);
            if let Ok(now) = block_on(data.revoke(0, cap, batch)) {
                at = now;
            }
        }
    }

    /// One round: list, remove, forget. An object whose removal failed
    /// (one of its servers not connected yet, or failing) stays listed and
    /// is tried again next round.
    fn round(&self, stop: &AtomicBool) -> Result<(), ReclaimError> {
        let (meta, secret) = self.shared.meta_or_connect()?;
        let (orphans, generation) =
            meta.list_orphans_at(self.after_s, dafne_proto::MAX_ORPHANS as u32).map_err(ReclaimError::List)?;
        let mut removed = Vec::with_capacity(orphans.len());
        // Servers that could not be connected this round: their objects
        // wait for the next (one connection attempt per server and round).
        let mut unreachable = std::collections::BTreeMap::new();
        'objects: for o in orphans {
            let cap = dafne_client::data::removal_capability(&secret, o.object_id, generation);
            let mut servers = o.servers.clone();
            servers.sort_unstable();
            servers.dedup();
            for server in servers {
                if server as usize >= self.shared.io.len() || unreachable.contains_key(&server) {
                    continue 'objects;
                }
                let client = match self.shared.io_or_connect(server as usize) {
                    Ok(c) => c,
                    Err(e) => {
                        unreachable.insert(server, Chain(&e).to_string());
                        continue 'objects;
                    }
                };
                match block_on(client.remove_object(&[0], cap)) {
                    Ok(()) | Err(dafne_client::Errno::ENOENT) => {}
                    Err(_) if stop.load(Ordering::Relaxed) => return Ok(()),
                    Err(e) => {
                        println!(
                            "error: removing the data of deleted object {} from io-{server}: {e} (retried later)",
                            o.object_id
                        );
                        continue 'objects;
                    }
                }
            }
            removed.push(o.object_id);
        }
        for (server, e) in &unreachable {
            if !stop.load(Ordering::Relaxed) {
                println!("error: reclaiming deleted files' data on io-{server}: {e} (retried later)");
            }
        }
        if !removed.is_empty() {
            let n = removed.len();
            meta.forget_orphans(removed).map_err(ReclaimError::Forget)?;
            println!("reclaimed the data of {n} deleted file(s)");
        }
        Ok(())
    }
}
