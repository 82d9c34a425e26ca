//! The NBD server's decoders and a whole connection on arbitrary client
//! bytes (`dafne_fuzz::nbd`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| dafne_fuzz::nbd(data));
