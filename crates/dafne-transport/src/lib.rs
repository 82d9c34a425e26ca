//! dafne's transport: every message and every bulk byte dafne moves goes
//! through this crate, over UCX.
//!
//! # Shape
//! * A [`Runtime`] is one event-loop thread that owns one UCX worker
//!   (`UCS_THREAD_MODE_SINGLE`). Everything that touches the worker runs on
//!   that thread: UCX callbacks, the frame dispatcher, and the server's
//!   request handlers, which are `async` tasks on a small local executor.
//!   Other threads talk to it through a command channel plus an eventfd.
//! * A connection is two endpoints. The *control* endpoint is made from the
//!   server's socket address, with UCX peer-failure detection: it carries the
//!   handshake and keepalives and tells us when the peer dies. The *data*
//!   endpoints (one each way) are made from exchanged worker addresses; on one
//!   host with error handling off UCX gives them shared memory and cma, on a
//!   cluster RDMA. Because on one host the data endpoints cannot detect a dead
//!   peer, liveness comes from the control endpoint, keepalives, and a timeout
//!   on every call and every RMA.
//!   On one host, shared memory only after the client's login was verified
//!   and only with the same FIFO settings on both ends (`server` module
//!   docs, "Shared memory after the login"): UCX's shared memory trusts the
//!   peer.
//! * Requests carry a correlation id and consume a credit; replies return
//!   the credit. The server grants the credits (it decides how much work a
//!   client may have in flight), and refuses requests beyond them.
//! * Bulk data never travels in messages: the server drives RMA put/get
//!   against keys the client packed into its request ([`ConnHandle`]).
//! * After an application login, both ends hold per-direction frame keys
//!   ([`Client::login`], [`ConnHandle::set_frame_keys`]) and every frame is
//!   tagged and numbered (`frame` module docs, "Frame authentication").
//!
//! See `ARCHITECTURE.md` for the rules and the reasoning.

mod auth;
mod client;
mod error;
pub mod frame;
mod peer;
mod runtime;
mod server;
pub mod sockguard;
mod stats;
pub mod testsvc;
mod timer;

pub use client::Client;
pub use dafne_auth::{FrameKey, FrameKeys};
pub use dafne_ucx::{Access, Context, Local, Region, Registration, RemoteKey, Slab, SubRegion};
pub use error::TransportError;
/// A runtime's loop-thread state, as tasks on the loop receive it
/// (`Runtime::block_on_loop`): named so that code running there can keep
/// it in its own types (`Client::call_on_loop` takes it).
pub use runtime::Local as LoopLocal;
pub use runtime::{
    default_spin, fail_fast_on_panic, parse_ucx_overrides, spin_from_env, tls_has_shared_memory, with_shm_fifo,
    DataPath, Runtime, RuntimeOptions,
};
pub use server::{ConnHandle, Request, RmaSeg, Service};
pub use stats::{TransportStats, TransportStatsSnapshot};
pub use timer::sleep;

/// The shared-memory receive FIFO every dafne process asks UCX for
/// (`UCX_MM_FIFO_SIZE`, elements of 8 KiB; UCX's default is 64), with the
/// shared-memory transports (`posix`, `sysv`).
///
/// Why: RMA into memory a peer cannot map (an application's own buffer
/// registered by the client's registration cache, as the C library,
/// `LD_PRELOAD` and Python read into) travels through that FIFO in 8 KiB
/// pieces. With 64 elements, eight 128 KiB reads in flight overflow it, and
/// on a loaded machine (six busy loops beside it) both ends then burn their
/// CPU retrying: `dafne bench designs --quick --transports shm --threads 8
/// --ucx MM_FIFO_SIZE=64` measured Read-Write at 29 MiB/s and 9,272 + 7,778
/// µs of CPU per MiB (client + server), against 821 MiB/s and 178 + 159 µs
/// with 256 elements in the same minute (docs/BENCHMARKS.md, "NFS/RDMA
/// designs"). 256 elements cost 2 MiB
/// of shared memory per process and transport.
pub const SHM_FIFO: (&str, &str) = ("MM_FIFO_SIZE", "256");
