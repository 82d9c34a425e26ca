//! The metadata server of dafne.
//!
//! * [`store`]: the [`MetaStore`] trait — execute batches of namespace
//!   operations atomically and durably — and [`RedbStore`], its
//!   implementation on the embedded ACID store redb.
//! * [`posix`]: permission and name rules, pure functions.
//! * [`opens`]: the files clients hold open, so that the data of an
//!   unlinked open file is not reclaimed before its last close.
//! * [`changes`]: the log of namespace changes that `Watch` serves, so a
//!   mount drops what its kernel cached when another client changes it.
//! * [`locks`]: byte-range locks across clients, with leases, fairness,
//!   deadlock detection and reclaim after a restart.
//! * [`members`]: which io servers are alive, from their heartbeats.
//! * [`chains`]: the chain table (which io servers hold the stripes of
//!   each chain; replication's step 1).
//! * Authentication and capabilities come from `dafne-auth`.
//! * [`service`]: the server on dafne's transport: sessions, decoding,
//!   group commit of concurrent writes, compounds.
//! * [`server`]: starting one (store + secret + runtime + service).
//! * [`metrics`]: its counters as a Prometheus page (`--metrics-listen`).

pub mod chains;
pub mod changes;
pub mod locks;
pub mod members;
pub mod metrics;
pub mod opens;
pub mod posix;
pub mod server;
pub mod service;
pub mod store;

pub use store::{Cred, LayoutPolicy, MetaStore, RedbStore, StoreError};
