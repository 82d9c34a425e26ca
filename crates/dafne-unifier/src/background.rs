//! Background write-back: a thread that writes dirty units to storage while
//! the event loop goes on serving.
//!
//! # Why
//! Bounded write-behind used to write the oldest dirty units synchronously
//! on the event loop as soon as a writer would pass `max_dirty_bytes`: with
//! several writers on one server, every request then waited for storage,
//! and so did every other connection on the loop (O_DIRECT makes each such
//! write a device round trip). Here, once dirty bytes pass a low watermark
//! (half the bound), the oldest dirty units are handed in batches to this
//! thread, which writes them (through the storage's own
//! [`crate::storage::BackgroundStorage`], e.g. one io_uring submission per
//! batch) while the loop serves. A writer that would pass the bound itself
//! waits (a future: the loop keeps running) for a batch to complete.
//!
//! # Soundness: who may touch a unit being written back
//! A unit handed to the thread is *pinned* (`pins`) until its completion is
//! processed on the loop: pins keep writers out (`can_exclusive`), keep the
//! unit from being evicted, re-carved or freed (`pinned`, `free_if_idle`),
//! so its bytes cannot change and its memory cannot be reused while the
//! thread reads them. Readers may still share it (both sides only read).
//! The job holds a clone of the unit's `Arc<SubRegion>` (its view of the slab); the thread drops it
//! *before* it reports completion, so that when the pin goes, the cache's
//! `Arc` is unique again and a writer can take the unit (otherwise it would
//! look like memory held by an abandoned RMA operation and be retired).
//!
//! Truncate, remove and flush of an object first wait for its write-backs in
//! flight ([`crate::Unifier::quiesce`]): a late write must not re-extend a
//! truncated file or recreate a removed one, and a sync must follow them.
//!
//! # Completions
//! The thread sends completions over a channel and wakes every future that
//! registered for them. The Unifier processes them ("reaps") on the loop at
//! the start of its operations and in every future that waits (for a unit,
//! for room, for an object's write-backs), so no extra task is needed.

use std::io;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::thread::JoinHandle;

use dafne_ucx::SubRegion;

use crate::storage::{BackgroundStorage, BackgroundWrite};

/// Units handed to the thread per batch (one storage submission).
pub(crate) const BATCH_UNITS: usize = 16;
/// Units in flight at most: 4 batches, ≤ 4 × 16 × 64 KiB = 4 MiB pinned.
pub(crate) const MAX_IN_FLIGHT: usize = 4 * BATCH_UNITS;

/// One unit's dirty range to write.
pub(crate) struct Job {
    pub(crate) slot: u32,
    pub(crate) gen: u64,
    pub(crate) object: u64,
    /// Object offset of byte `lo` of the unit.
    pub(crate) offset: u64,
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    pub(crate) mem: Arc<SubRegion>,
}

/// A job's outcome (without its memory, dropped by then).
pub(crate) struct Done {
    pub(crate) slot: u32,
    pub(crate) gen: u64,
    pub(crate) object: u64,
    pub(crate) offset: u64,
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    pub(crate) result: io::Result<()>,
}

/// The loop's side of the write-back thread.
pub(crate) struct Background {
    jobs: Option<Sender<Vec<Job>>>,
    done: Receiver<Vec<Done>>,
    wakers: Arc<Mutex<Vec<Waker>>>,
    thread: Option<JoinHandle<()>>,
}

impl Background {
    /// Starts the thread that writes through `storage`.
    pub(crate) fn start(mut storage: Box<dyn BackgroundStorage>) -> io::Result<Background> {
        let (jobs_tx, jobs_rx) = channel::<Vec<Job>>();
        let (done_tx, done_rx) = channel::<Vec<Done>>();
        let wakers: Arc<Mutex<Vec<Waker>>> = Arc::default();
        let w = wakers.clone();
        let thread = std::thread::Builder::new().name("unifier-wb".into()).spawn(move || {
            while let Ok(batch) = jobs_rx.recv() {
                let results = {
                    let writes: Vec<BackgroundWrite<'_>> = batch
                        .iter()
                        .map(|j| BackgroundWrite {
                            object: j.object,
                            offset: j.offset,
                            buf: &j.mem.as_slice()[j.lo..j.hi],
                        })
                        .collect();
                    storage.write_batch(&writes)
                };
                debug_assert_eq!(results.len(), batch.len());
                // The memory goes before the completion is reported.
                let done: Vec<Done> = batch
                    .into_iter()
                    .zip(results)
                    .map(|(j, result)| Done {
                        slot: j.slot,
                        gen: j.gen,
                        object: j.object,
                        offset: j.offset,
                        lo: j.lo,
                        hi: j.hi,
                        result,
                    })
                    .collect();
                if done_tx.send(done).is_err() {
                    return;
                }
                let wake: Vec<Waker> = std::mem::take(&mut *w.lock().unwrap_or_else(|e| e.into_inner()));
                wake.into_iter().for_each(Waker::wake);
            }
        })?;
        Ok(Background { jobs: Some(jobs_tx), done: done_rx, wakers, thread: Some(thread) })
    }

    /// Hands a batch to the thread.
    pub(crate) fn submit(&self, batch: Vec<Job>) {
        self.jobs.as_ref().expect("thread running").send(batch).expect("the write-back thread does not exit first");
    }

    /// Completions so far (none if nothing finished).
    pub(crate) fn completions(&self) -> Vec<Done> {
        let mut out = Vec::new();
        loop {
            match self.done.try_recv() {
                Ok(mut d) => out.append(&mut d),
                Err(TryRecvError::Empty) => return out,
                Err(TryRecvError::Disconnected) => panic!("the unifier's write-back thread died"),
            }
        }
    }

    /// Wakes `waker` at the next completion. Register before checking for
    /// completions, so that none can slip between the check and the wait.
    pub(crate) fn notify(&self, waker: &Waker) {
        let mut w = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        if !w.iter().any(|k| k.will_wake(waker)) {
            w.push(waker.clone());
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Closing the channel ends the thread after the batches it has;
        // joining means no job's memory outlives the cache.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
