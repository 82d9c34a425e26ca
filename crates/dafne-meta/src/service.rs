//! The metadata server on dafne's transport.
//!
//! Requests are decoded on the loop thread (hostile bytes get `EPROTO`),
//! checked against the connection's session, and handed to one store
//! thread that executes whatever has queued up as a single batch: one
//! commit, one fsync, for all concurrent clients (group commit). Read-only
//! batches are executed without a commit.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::SystemTime;

use crossbeam_channel::{Receiver, Sender};
use dafne_auth::Secret;
use dafne_proto::{decode_request, encode_reply, CompoundOp, Errno, Op, Request, RequestHeader, Response, ROOT_INO};
use dafne_transport::{Request as TRequest, Service};
use futures::channel::oneshot;

use crate::store::{Cred, Job, JobResult, MetaStore};

/// Largest number of client requests executed in one commit.
pub const MAX_BATCH: usize = 256;

type Work = (Job, oneshot::Sender<Result<JobResult, String>>);

/// Starts the store thread; returns the queue feeding it.
fn start_store_thread(store: Arc<dyn MetaStore>) -> Sender<Work> {
    let (tx, rx): (Sender<Work>, Receiver<Work>) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("meta-store".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(w) => batch.push(w),
                        Err(_) => break,
                    }
                }
                let jobs: Vec<Job> = batch.iter().map(|(j, _)| j.clone()).collect();
                match store.execute(&jobs) {
                    Ok(results) => {
                        for ((_, tx), r) in batch.into_iter().zip(results) {
                            let _ = tx.send(Ok(r));
                        }
                    }
                    Err(e) if batch.len() > 1 => {
                        // One bad job must not fail its neighbours: run each
                        // alone, so only the failing one gets EIO.
                        tracing::warn!("metadata batch of {} failed ({e}): retrying one by one", batch.len());
                        for (job, tx) in batch {
                            let r = store.execute(std::slice::from_ref(&job)).map_err(|e| e.to_string());
                            let _ = tx.send(r.map(|mut v| v.pop().unwrap_or_default()));
                        }
                    }
                    Err(e) => {
                        tracing::error!("metadata store failure: {e}");
                        for (_, tx) in batch {
                            let _ = tx.send(Err(e.to_string()));
                        }
                    }
                }
            }
        })
        .expect("spawning the metadata store thread");
    tx
}

/// The metadata service (one per meta server runtime).
pub struct MetaService {
    secret: Secret,
    work: Sender<Work>,
    sessions: RefCell<HashSet<u32>>,
    next_session: Cell<u64>,
}

impl std::fmt::Debug for MetaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaService").field("sessions", &self.sessions.borrow().len()).finish()
    }
}

impl MetaService {
    pub fn new(store: Arc<dyn MetaStore>, secret: Secret) -> MetaService {
        MetaService {
            secret,
            work: start_store_thread(store),
            sessions: RefCell::new(HashSet::new()),
            next_session: Cell::new(1),
        }
    }
}

/// `Service` for an `Rc<MetaService>`.
#[derive(Debug, Clone)]
pub struct MetaHandler(pub Rc<MetaService>);

impl Service for MetaHandler {
    fn call(&self, req: TRequest) -> Pin<Box<dyn Future<Output = Vec<u8>>>> {
        let svc = self.0.clone();
        Box::pin(async move { svc.handle(req).await })
    }

    fn disconnected(&self, conn_id: u32) {
        self.0.sessions.borrow_mut().remove(&conn_id);
    }
}

impl MetaService {
    async fn handle(self: Rc<Self>, req: TRequest) -> Vec<u8> {
        let (env, request) = match decode_request(&req.payload) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("undecodable metadata request from connection {}: {e}", req.conn.id());
                // Echo the tag and op when at least the header made sense.
                let (tag, op) = match RequestHeader::decode(&req.payload) {
                    Ok(h) => (h.tag, h.op),
                    Err(_) => (0, Op::Statfs),
                };
                return encode_reply(tag, op, &Err(Errno::EPROTO));
            }
        };
        let op = request.op();
        let conn = req.conn.id();
        let result = match request {
            Request::SessionOpen { client_name, nonce, mac } => {
                if self.secret.verify_session(req.conn.token(), &nonce, &client_name, &mac) {
                    req.conn.authenticated();
                    self.sessions.borrow_mut().insert(conn);
                    let id = self.next_session.get();
                    self.next_session.set(id + 1);
                    tracing::info!("session {id} opened by {client_name:?} on connection {conn}");
                    Ok(Response::Session { session_id: id, root: ROOT_INO })
                } else {
                    tracing::warn!("session refused for {client_name:?}: wrong cluster secret");
                    Err(Errno::EACCES)
                }
            }
            _ if !self.sessions.borrow().contains(&conn) => Err(Errno::EACCES),
            Request::Compound { ops } => {
                let cred = Cred::new(env.uid, env.gid);
                self.run(Job { cred, ops }).await.map(|results| Response::Compound { results })
            }
            single => {
                let cred = Cred::new(env.uid, env.gid);
                let job = Job { cred, ops: vec![CompoundOp { chain: false, req: single }] };
                match self.run(job).await {
                    Ok(mut results) => results.pop().unwrap_or(Err(Errno::EIO)),
                    Err(e) => Err(e),
                }
            }
        };
        encode_reply(env.tag, op, &result)
    }

    async fn run(&self, job: Job) -> Result<JobResult, Errno> {
        let (tx, rx) = oneshot::channel();
        if self.work.send((job, tx)).is_err() {
            return Err(Errno::EIO);
        }
        let mut results = match rx.await {
            Ok(Ok(r)) => r,
            _ => return Err(Errno::EIO),
        };
        let now = SystemTime::now();
        for r in results.iter_mut() {
            if let Ok(Response::Opened { cap, .. }) = r {
                self.secret.sign(cap, now);
            }
        }
        Ok(results)
    }
}
