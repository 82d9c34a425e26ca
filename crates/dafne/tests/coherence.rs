//! Coherence between mounts (issue 11, item 3): with the kernel's caches
//! set to a minute, a second mount of the same cluster still sees another
//! mount's chmod, new size and bytes, rename and unlink within seconds,
//! because the metadata server tells it (`Watch`) and it has its kernel
//! drop what it cached. Without that word each check below would wait
//! for the minute to pass (`wait_for` gives up after 30 s).

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use common::cluster::Cluster;
use common::wait_for;

const LONG_CACHES: &str = "[mount]\nattr_timeout_ms = 60000\nentry_timeout_ms = 60000\n";

fn mode(p: &std::path::Path) -> Option<u32> {
    std::fs::metadata(p).ok().map(|m| m.permissions().mode() & 0o7777)
}

#[test]
fn a_second_mount_sees_changes_long_before_its_caches_expire() {
    let c = Cluster::start_with_config(LONG_CACHES);
    let (a, b) = (c.mount_at("a", &[]), c.mount_at("b", &[]));
    std::fs::write(a.path("f"), b"hello").unwrap();
    // The other mount looks, and so caches the name and the attributes.
    assert_eq!(std::fs::read(b.path("f")).unwrap(), b"hello");
    assert_eq!(mode(&b.path("f")), mode(&a.path("f")));

    std::fs::set_permissions(a.path("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    wait_for("the chmod to show on the other mount", || mode(&b.path("f")) == Some(0o600));

    let mut f = std::fs::OpenOptions::new().append(true).open(a.path("f")).unwrap();
    f.write_all(b" world").unwrap();
    drop(f);
    wait_for("the new size to show on the other mount", || std::fs::metadata(b.path("f")).is_ok_and(|m| m.len() == 11));
    assert_eq!(std::fs::read(b.path("f")).unwrap(), b"hello world");

    std::fs::rename(a.path("f"), a.path("g")).unwrap();
    wait_for("the rename to show on the other mount", || !b.path("f").exists() && b.path("g").exists());
    std::fs::remove_file(a.path("g")).unwrap();
    wait_for("the unlink to show on the other mount", || !b.path("g").exists());

    std::fs::create_dir(a.path("d")).unwrap();
    std::fs::write(a.path("d/x"), b"1").unwrap();
    assert!(b.path("d/x").exists());
    std::fs::remove_file(a.path("d/x")).unwrap();
    std::fs::remove_dir(a.path("d")).unwrap();
    wait_for("the removed directory to go on the other mount", || !b.path("d").exists());
}
