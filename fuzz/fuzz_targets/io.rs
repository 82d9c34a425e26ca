//! The io protocol's decoders on arbitrary bytes: must not panic, must not
//! allocate beyond the input's size, what they accept must re-encode to the
//! same bytes (encodings are canonical) and decode to the same value, and
//! nothing decodes as both an io and a metadata message.
//!
//! The first byte chooses how the rest is used: as a whole message, or as
//! the body behind a valid io request and reply header for the op it names
//! (so the body decoders are reached without guessing a header).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| dafne_fuzz::io(data));
