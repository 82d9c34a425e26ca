//! A safe, single-threaded-worker wrapper over UCX's UCP layer.
//!
//! # Ownership and threading
//! * [`Context`] is `Send + Sync` and shared by `Arc`: memory registration and
//!   key packing are context-level operations, so any thread may register
//!   memory ([`Region`]). The context is created with `mt_workers_shared`, so
//!   UCX serialises those calls itself.
//! * [`Worker`], [`Endpoint`], [`RemoteKey`], [`Op`] are `!Send`: a worker is
//!   created in `UCS_THREAD_MODE_SINGLE` and is driven by exactly one thread
//!   (dafne's transport runs one event loop thread per worker). Other threads
//!   hand work to that thread; they never call into the worker.
//! * Release order is enforced by reference counting, not by convention: a
//!   [`RemoteKey`] holds its endpoint, an endpoint holds its worker, a worker
//!   holds its context. Dropping handles in any order therefore destroys keys
//!   before endpoints, endpoints before the worker, the worker before the
//!   context, as UCX requires.
//! * Workers of one process share UCS's table of async handlers, keyed by
//!   descriptor number: handler removals (endpoint closes, connection
//!   rejections, listener destructions) happen only in
//!   [`Worker::progress`] or a worker's destruction, and registrations wait
//!   for those to finish (`handler_ids` says why: a UCX 1.13 abort).
//! * UCX forbids calling `ucp_worker_progress` from a callback. Callbacks here
//!   only record results (a status in an [`Op`], an event for the caller);
//!   endpoint closes and AM data releases requested from inside callbacks are
//!   deferred to the next [`Worker::progress`].
//!
//! # In-flight memory
//! Every operation that lets UCX read or write local memory keeps that memory
//! alive (it takes a keep-alive object, e.g. an `Arc<Region>`, an
//! `Arc<SubRegion>` or a `Vec`)
//! until UCX reports completion. If the caller abandons an [`Op`] (for
//! example because the peer died and the operation will never complete), the
//! memory is leaked rather than freed under UCX's feet.

pub mod acceptgate;
mod context;
mod endpoint;
mod error;
mod handler_ids;
pub mod memevents;
mod memory;
mod request;
mod slab;
pub mod sockets;
mod stats;
mod worker;

pub use context::{Context, ContextOptions};
pub use endpoint::{Endpoint, ErrMode, Local};
pub use error::{Error, Result, Status};
pub use memory::MAX_PACKED_KEY;
pub use memory::{Access, Region, Registration, RemoteKey};
pub use request::Op;
pub use slab::{Slab, SubRegion};
pub use stats::{Stats, StatsSnapshot};
pub use worker::{
    AmPayload, AmRecv, AmVerdict, ConnRequest, Listener, RndvDesc, Worker, ASYNC_MAX_EVENTS, MAX_WORKER_ADDRESS_BYTES,
};

/// Largest active-message id dafne registers handlers for.
pub const MAX_AM_ID: u16 = 64;
