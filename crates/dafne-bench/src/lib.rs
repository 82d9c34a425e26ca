//! Benchmarks of dafne, as library functions that `dafne bench` runs and
//! prints. Each returns a report that serialises to JSON.

pub mod io;
pub mod meta;
pub mod perftest;
pub mod posix;
pub mod registration;
pub mod seed;
pub mod transport;
