//! `libdafne` from C: the C test program (`crates/dafne-c/tests/c/
//! api_test.c`) and the example of `docs/C-API.md`, compiled with `cc`
//! against the header in the repository and the library this build made
//! (`libdafne.so` for the test program, `libdafne.a` for the example), run
//! against a real cluster started with `dafne up`.
//!
//! The library is a dev-dependency of this crate, so `cargo test` builds it
//! (all its crate types: cargo compiles a library's every type, also as a
//! dependency) with the `dafne` binary before this test runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::cluster::{p, Cluster};
use common::text;

/// The directory of this build's artifacts (`target/debug`): where the
/// `dafne` binary is.
fn artifacts() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_dafne")).parent().unwrap().to_path_buf()
}

/// Where cargo puts the library it built as this crate's dev-dependency:
/// `target/debug/deps/libdafne.{so,a}` (the copies in `target/debug` are
/// made only by building `dafne-c` itself, and may be older).
fn library(name: &str) -> PathBuf {
    let lib = artifacts().join("deps").join(name);
    assert!(
        lib.is_file(),
        "{} is missing: `cargo test -p dafne` builds it (dafne-c is a dev-dependency)",
        lib.display()
    );
    lib
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compiles `source` into `out` with warnings as errors, linked as `link`
/// says; panics with the compiler's output.
fn compile(source: &Path, out: &Path, link: &[String]) {
    let include = repo().join("crates/dafne-c/include");
    let o = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-I"])
        .arg(&include)
        .arg(source)
        .args(link)
        .arg("-o")
        .arg(out)
        .output()
        .expect("running cc (install a C compiler: scripts/install-deps.sh)");
    assert!(o.status.success(), "cc {} failed:\n{}", source.display(), text(&o));
}

/// Runs a compiled program with the cluster directory as its argument and
/// asserts it succeeded; its output.
fn run(program: &Path, c: &Cluster) -> String {
    // cargo's LD_LIBRARY_PATH names target/debug, whose libdafne.so may be
    // older than this build's: the program finds the library by its rpath.
    let o =
        Command::new("timeout").env_remove("LD_LIBRARY_PATH").arg("300").arg(program).arg(c.dir()).output().unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{} failed ({}):\n{out}", program.display(), o.status);
    out
}

#[test]
fn the_c_test_program_passes_against_a_cluster() {
    let c = Cluster::start_with_config("[meta]\nstripe_unit = 65536\n");
    let so = library("libdafne.so");
    let bin = c.scratch("capi").join("api_test");
    let dir = so.parent().unwrap();
    let link = vec![format!("-L{}", dir.display()), "-ldafne".into(), format!("-Wl,-rpath,{}", dir.display())];
    compile(&repo().join("crates/dafne-c/tests/c/api_test.c"), &bin, &link);
    let out = run(&bin, &c);
    assert!(out.contains("checks passed"), "{out}");
    // The test program linked this build's library, not another one.
    let ldd = Command::new("ldd").env_remove("LD_LIBRARY_PATH").arg(&bin).output().unwrap();
    assert!(text(&ldd).contains(p(&so)), "{}", text(&ldd));
}

/// The example of docs/C-API.md: the first ```c block holding a `main`.
fn doc_example() -> String {
    let doc = std::fs::read_to_string(repo().join("docs/C-API.md")).unwrap();
    doc.split("```c\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains("int main"))
        .expect("docs/C-API.md has a ```c block with a main")
        .to_string()
}

#[test]
fn the_documented_example_compiles_statically_and_runs() {
    let c = Cluster::start();
    let scratch = c.scratch("capi-doc");
    let src = scratch.join("example.c");
    std::fs::write(&src, doc_example()).unwrap();
    let bin = scratch.join("example");
    // The static library and the system libraries it needs (what
    // `--print native-static-libs` lists), as docs/C-API.md says.
    let mut link = vec![library("libdafne.a").display().to_string()];
    link.extend(["-lucp", "-lucs", "-lucm", "-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl"].map(String::from));
    compile(&src, &bin, &link);
    let out = run(&bin, &c);
    assert!(out.contains("read back 13 bytes: hello, dafne!"), "{out}");
}

#[test]
fn the_throughput_example_runs_and_copies_only_on_the_plain_path() {
    let c = Cluster::start();
    let scratch = c.scratch("capi-throughput");
    let bin = scratch.join("throughput");
    let so = library("libdafne.so");
    let dir = so.parent().unwrap();
    let link = vec![format!("-L{}", dir.display()), "-ldafne".into(), format!("-Wl,-rpath,{}", dir.display())];
    compile(&repo().join("crates/dafne-c/examples/throughput.c"), &bin, &link);
    let json = scratch.join("throughput.json");
    let o = Command::new("timeout")
        .env_remove("LD_LIBRARY_PATH")
        .arg("300")
        .arg(&bin)
        .arg(c.dir())
        .args(["8", "1024"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(o.status.success(), "throughput failed:\n{}", text(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{v}");
    for r in rows {
        let copied = r["client_bytes_copied"].as_u64().unwrap();
        // On one host the io servers cannot reach malloc'd memory: the
        // plain path copies every byte once, the others none.
        let want = if r["way"] == "plain" { 8 << 20 } else { 0 };
        assert_eq!(copied, want, "{r}");
    }
}
