//! The CPU cost of the io server's block checksums (`dafne_io::sums`):
//! CRC32C of 4 KiB blocks, as a write-back computes and a fill verifies
//! them, over 1 GiB (a 64 MiB buffer 16 times, so the bytes come from
//! memory, not the page cache). Prints a table and writes
//! `target/crc_cost.json`.
//!
//! `cargo run --release -p dafne-io --example crc_cost`

use std::time::Instant;

fn main() {
    let buf: Vec<u8> = (0..64usize << 20).map(|i| (i * 31 + i / 4096) as u8).collect();
    let mut rows = Vec::new();
    for (name, block) in [("4 KiB blocks", 4096usize), ("64 KiB (one call)", 65536)] {
        let mut best = f64::MAX;
        let mut sink = 0u32;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..16 {
                for b in buf.chunks(block) {
                    sink ^= crc32c::crc32c(b);
                }
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        std::hint::black_box(sink);
        rows.push((name, best));
    }
    println!("| checksummed | CPU s per GiB | GiB/s |");
    println!("|---|---|---|");
    for (name, s) in &rows {
        println!("| {name} | {s:.3} | {:.1} |", 1.0 / s);
    }
    let json: Vec<String> = rows
        .iter()
        .map(|(n, s)| format!("{{\"what\":\"{n}\",\"cpu_s_per_gib\":{s:.4},\"gib_per_s\":{:.2}}}", 1.0 / s))
        .collect();
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/crc_cost.json");
    std::fs::write(&out, format!("[{}]\n", json.join(","))).expect("writing target/crc_cost.json");
    println!("(best of 3 runs over 1 GiB each; JSON in {})", out.display());
}
