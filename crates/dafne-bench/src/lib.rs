//! Benchmarks of dafne, as library functions that `dafne bench` runs and
//! prints. Each returns a report that serialises to JSON.

pub mod dafs;
pub mod designs;
pub mod io;
pub mod meta;
pub mod perftest;
pub mod plot;
pub mod posix;
pub mod registration;
pub mod seed;
pub mod transport;
pub mod writers;
