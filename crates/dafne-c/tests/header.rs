//! The committed `include/dafne.h` is what cbindgen makes of `src/` now:
//! a function or struct changed without refreshing the header fails here.
//! Refresh with `DAFNE_BLESS=1 cargo test -p dafne-c --test header`.

use std::path::Path;

fn generate() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("reading cbindgen.toml");
    // The modules are read where lib.rs declares them.
    let b = cbindgen::Builder::new().with_config(config).with_src(dir.join("src/lib.rs"));
    let mut out = Vec::new();
    b.generate().expect("cbindgen could not read src/").write(&mut out);
    String::from_utf8(out).expect("cbindgen wrote UTF-8")
}

#[test]
fn the_committed_header_is_generated_from_the_source() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/dafne.h");
    let now = generate();
    if std::env::var_os("DAFNE_BLESS").is_some() {
        std::fs::write(&path, &now).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == now,
        "{} differs from what cbindgen generates from src/: refresh it with\n  \
         DAFNE_BLESS=1 cargo test -p dafne-c --test header\nand commit it",
        path.display()
    );
}
