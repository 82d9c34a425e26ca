//! Every transport decoder on arbitrary bytes: must not panic, must not
//! allocate beyond the input's size, must round-trip what it accepts.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| dafne_fuzz::frame(data));
