//! Makes the `dafne` executable's `accept` the descriptor gate of
//! `dafne_ucx::acceptgate` (its module docs say why): UCX calls `accept`
//! from libucs, and the dynamic linker binds that call to the executable's
//! definition first. Only this executable gets it; the libraries built
//! from the same code (dafne-c, dafne-preload, dafne-py) do not define
//! `accept`, so they never change an application's. Nor can a library
//! give it to another executable (a build script's link arguments reach
//! only its own package's targets): `dafne-cluster`'s module docs say what
//! a deployment's own server program adds to its build script.

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--defsym=accept=dafne_gated_accept");
}
