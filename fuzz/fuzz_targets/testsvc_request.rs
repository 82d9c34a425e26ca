//! The reference service's request decoder on arbitrary bytes.
#![no_main]
use dafne_transport::testsvc::{decode_rma, encode_rma};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((flags, seed, segs)) = decode_rma(data) {
        let again = encode_rma(0, flags, seed, &segs);
        assert_eq!(&again[1..], data);
    }
});
