//! `dafne bench dafs` end to end, tiny: a real cluster and FUSE mount
//! (as `mount.rs`, it needs `/dev/fuse`; CI has it and runs as root), the
//! user-level client and the kernel path. Nothing here is about speed: it
//! checks that both paths moved the same bytes (each path's file read back
//! through the other equals the pattern written) and that the PostMark-like
//! workload made exactly the same operations on both paths and left no
//! file behind, and that the benchmark cleans up after itself.

mod common;

use common::{dafne, text};

#[test]
fn both_paths_move_the_same_bytes_and_run_the_same_postmark() {
    let scratch = tempfile::Builder::new().prefix("dafne-bench-dafs-test-").tempdir().unwrap();
    let json = scratch.path().join("dafs.json");
    let work = scratch.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let o = dafne()
        .args(["bench", "dafs", "--quick", "--blocks", "4K,64K", "--file-size", "256K", "--cell-seconds", "0.05"])
        .args(["--rounds", "1", "--files", "20", "--transactions", "60", "--postmark-rounds", "2"])
        .arg("--scratch")
        .arg(&work)
        .arg("--json")
        .arg(&json)
        .env_remove("DAFNE_SPIN_US")
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "dafne bench dafs failed:\n{out}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // CPU was measured with no event loop spinning.
    let counted = r["cpu_counted"].as_str().unwrap();
    assert!(counted.contains("DAFNE_SPIN_US=0"), "{counted}");

    // Every cell moved bytes, on all three clients, both directions.
    let cells = r["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2 * 2 * 3, "{cells:?}");
    for c in cells {
        assert!(c["bytes"].as_u64().unwrap() >= c["block"].as_u64().unwrap(), "{c}");
        assert_eq!(c["bytes"].as_u64().unwrap(), c["requests"].as_u64().unwrap() * c["block"].as_u64().unwrap());
    }
    for path in ["user_level", "user_inline", "kernel"] {
        assert!(cells.iter().any(|c| c["path"] == path && c["op"] == "write"), "no {path} write in {cells:?}");
    }

    // Each path's file, read back through the other, is what was written.
    let checks = r["cross_checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2, "{checks:?}");
    for c in checks {
        assert_ne!(c["written_by"], c["read_by"]);
        assert_eq!(c["bytes"].as_u64(), Some(256 << 10), "{c}");
        assert_eq!(c["equal"], true, "{c}\n{out}");
    }

    // PostMark: the same operations and bytes on both paths, nothing left.
    let runs = r["postmark_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{runs:?}");
    let first = &runs[0]["counts"];
    assert!(first["creates"].as_u64().unwrap() >= 20, "{first}");
    assert_eq!(first["creates"], first["deletes"]);
    assert_eq!(first["reads"].as_u64().unwrap() + first["appends"].as_u64().unwrap(), 60);
    assert!(first["bytes_read"].as_u64().unwrap() > 0, "{first}");
    for run in runs {
        assert_eq!(&run["counts"], first, "{runs:?}");
        assert_eq!(run["counts"]["entries_left"], 0);
    }
    for path in ["user_level", "kernel"] {
        assert_eq!(runs.iter().filter(|r| r["path"] == path).count(), 2, "{runs:?}");
    }
    assert!(out.contains("| read | 4 KiB | user level |"), "{out}");

    // The cluster, its mount and its directory are gone.
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "left behind in {}", work.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&work.display().to_string()), "{mounts}");
}

#[test]
fn bad_sizes_are_refused_before_anything_starts() {
    for (args, want) in [
        (vec!["--blocks", "1000"], "multiple of 4 KiB"),
        (vec!["--blocks", "64K", "--file-size", "96K"], "multiple of the largest block"),
        (vec!["--rounds", "0"], "at least 1"),
        (vec!["--cell-seconds", "0"], "more than 0"),
    ] {
        let o = dafne()
            .args(["bench", "dafs", "--quick", "--scratch", "/nonexistent-dafs-scratch"])
            .args(&args)
            .output()
            .unwrap();
        let t = text(&o);
        assert!(!o.status.success() && t.contains(want), "{args:?}: {t}");
        assert!(!t.contains("panicked"), "{t}");
    }
}
