//! The reference service's request decoder on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| dafne_fuzz::testsvc_request(data));
