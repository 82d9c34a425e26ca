//! Every transport decoder on arbitrary bytes: must not panic, must not
//! allocate beyond the input's size, must round-trip what it accepts.
#![no_main]
use dafne_transport::frame::{FrameHeader, Hello, Welcome};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (claimed, rest) = data.split_at(data.len().min(4));
    let mut n = [0u8; 4];
    n[..claimed.len()].copy_from_slice(claimed);
    let actual = u32::from_le_bytes(n) as usize;
    if let Ok(h) = FrameHeader::decode(rest, actual, 1 << 20) {
        assert_eq!(FrameHeader::decode(&h.encode(), actual, 1 << 20), Ok(h));
    }
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }
    if let Ok(w) = Welcome::decode(data) {
        assert_eq!(Welcome::decode(&w.encode()), Ok(w));
    }
});
