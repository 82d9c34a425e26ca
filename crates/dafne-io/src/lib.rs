//! The io server of dafne.
//!
//! * [`chunk`]: each object's bytes, stored sparsely at their file offsets in
//!   one file per object under the data directory (an io server holds only
//!   the stripes the layout gives it; the rest are holes).
//! * [`service`]: requests checked against their capability (verified with
//!   the cluster secret, without asking meta), served through the Unifier:
//!   a read fills units on a miss and **puts** from them straight into the
//!   client's segments; a write **gets** from the client's segments straight
//!   into units. Small I/O travels inline.
//! * [`modes`]: the comparison serving modes `normal` (copy through a
//!   registered pool) and `mmap` (register a mapping per read), as in the
//!   Unifier paper's micro-benchmarks; the mode is chosen at start
//!   ([`server::ServingMode`]).
//! * [`allocate`]: `fallocate` of an object's part of a file range
//!   (reserve, punch a hole, zero), in the cache and the chunk file.
//! * [`server`]: starting one.
//! * [`heartbeat`]: joining the cluster (`--meta`): a heartbeat to the
//!   metadata server every second, so that it knows who is up.
//! * [`lease`]: what those heartbeats earn: a server cut off from meta
//!   refuses data requests once its lease lapsed.
//! * [`chaincheck`]: the chain version a data request carries, checked
//!   against the one meta's heartbeat answers gave the server.
//! * [`metrics`]: its counters as a Prometheus page (`--metrics-listen`).

pub mod allocate;
pub mod chaincheck;
pub mod chunk;
pub mod forward;
pub mod heartbeat;
pub mod lease;
pub mod metrics;
pub mod modes;
pub mod server;
pub mod service;
pub mod sums;
