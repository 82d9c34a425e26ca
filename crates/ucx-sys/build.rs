//! Generates the UCP bindings from the system's `ucp/api/ucp.h` (Debian
//! `libucx-dev`), plus `ucm/api/ucm.h` (UCX's memory-event hooks, used to
//! learn when memory is unmapped so cached registrations can be dropped).
//! Only the `ucp_*` / `ucs_*` / `ucm_*` names are kept; enums become plain
//! integer constants because UCX uses them as bit flags.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=ucp");
    println!("cargo:rustc-link-lib=ucs");
    println!("cargo:rustc-link-lib=ucm");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*|ucs_.*|ucm_set_event_handler|ucm_unset_event_handler")
        .allowlist_type("ucp_.*|ucs_.*|ucm_event_.*")
        .allowlist_var("UCP_.*|UCS_.*|UCM_EVENT_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen could not process ucp/api/ucp.h and ucm/api/ucm.h: install libucx-dev and libclang-dev");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("write bindings.rs");
}
