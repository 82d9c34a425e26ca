//! Per-client credentials (issue 10, finding 4), end to end: a real
//! cluster (`dafne up`), credentials issued with `dafne credential issue`,
//! mounts and copies that use them without the cluster secret, and the
//! metadata server holding each request to the credential's uids and gids.
//!
//! Tests run one at a time (a lock), as in `mount.rs`: each cluster holds
//! registered memory and FUSE threads, and the machine is small.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use common::cluster::{p, Cluster};
use common::{dafne, pattern, text};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `dafne credential issue NAME ARGS -o DIR/NAME.cred`; the file.
fn issue(c: &Cluster, name: &str, args: &[&str]) -> PathBuf {
    let out = c.dir().join(format!("{name}.cred"));
    let o =
        dafne().args(["credential", "issue", name, "--dir", p(c.dir()), "-o", p(&out)]).args(args).output().unwrap();
    assert!(o.status.success(), "dafne credential issue failed:\n{}", text(&o));
    out
}

fn secret(c: &Cluster) -> PathBuf {
    c.dir().join("meta").join("cluster.secret")
}

/// The cluster secret moved away while it lives (this process is root, so
/// a mode would not keep it out): whatever runs meanwhile cannot read it.
/// Put back when dropped, before the cluster stops.
struct SecretHidden {
    path: PathBuf,
    away: PathBuf,
}

impl SecretHidden {
    fn new(c: &Cluster) -> SecretHidden {
        let path = secret(c);
        let away = c.dir().join("secret-hidden-by-test");
        std::fs::rename(&path, &away).unwrap();
        SecretHidden { path, away }
    }
}

impl Drop for SecretHidden {
    fn drop(&mut self) {
        let _ = std::fs::rename(&self.away, &self.path);
    }
}

/// `program args` as `uid`/`gid` without supplementary groups.
fn as_user(uid: u32, gid: u32, program: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", "120", "setpriv"])
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg(program)
        .args(args)
        .output()
        .unwrap()
}

fn owner(path: &Path) -> (u32, u32) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    (m.uid(), m.gid())
}

/// A directory everyone may write, made on a fully trusted mount (the
/// cluster secret's), for the credential mounts' users.
fn shared_dir(c: &Cluster) {
    let m = c.mount_at("trusted", &[]);
    std::fs::create_dir(m.path("shared")).unwrap();
    let o = Command::new("chmod").args(["1777", p(&m.path("shared"))]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn a_credential_mount_squashes_root_and_holds_users_to_their_ranges() {
    let _g = serial();
    let c = Cluster::start_sized(2, "");
    shared_dir(&c);
    let cred = issue(&c, "alice", &["--uid", "1000-1999", "--gid", "1000-1999"]);
    let mode = std::fs::metadata(&cred).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "the credential file is private");
    let file = std::fs::read_to_string(&cred).unwrap();
    let secret = std::fs::read(secret(&c)).unwrap();
    assert!(!file.contains(&hex(&secret)), "the credential file holds the cluster secret:\n{file}");

    // From here on nothing can read the cluster secret.
    let hidden = SecretHidden::new(&c);
    let m = c.mount_at("mnt", &["--credential", p(&cred)]);

    // Root on this mount is nobody.
    let by_root = m.path("shared/by-root");
    std::fs::write(&by_root, b"root").unwrap();
    assert_eq!(owner(&by_root), (65534, 65534), "root's file on a credential mount without --root");

    // A user inside the ranges is who they say.
    let by_1000 = m.path("shared/by-1000");
    let o = as_user(1000, 1000, "touch", &[p(&by_1000)]);
    assert!(o.status.success(), "uid 1000 cannot create: {}", text(&o));
    assert_eq!(owner(&by_1000), (1000, 1000));

    // A user outside them is refused, and so is a group outside them.
    for (uid, gid) in [(5000, 1000), (1000, 5000)] {
        let f = m.path(&format!("shared/by-{uid}-{gid}"));
        let o = as_user(uid, gid, "touch", &[p(&f)]);
        assert!(!o.status.success(), "uid {uid} gid {gid} created a file");
        let said = text(&o);
        assert!(
            said.contains("Operation not permitted") || said.contains("Permission denied"),
            "uid {uid} gid {gid}: {said}"
        );
    }

    // `dafne cp` with the credential: no secret either, and root squashed.
    let src = c.dir().join("src.bin");
    std::fs::write(&src, pattern(300_000, 5)).unwrap();
    let o = dafne()
        .args(["cp", "--dir", p(c.dir()), "--credential", p(&cred), p(&src), "dafne:/shared/copied"])
        .output()
        .unwrap();
    assert!(o.status.success(), "dafne cp --credential failed:\n{}", text(&o));
    assert_eq!(std::fs::read(m.path("shared/copied")).unwrap(), pattern(300_000, 5));
    assert_eq!(owner(&m.path("shared/copied")).0, 65534);

    // Without the secret and without a credential, a client says what is missing.
    let o = dafne().args(["cp", "--dir", p(c.dir()), p(&src), "dafne:/shared/nope"]).output().unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("cluster secret"), "{}", text(&o));

    // `dafne status` with the credential reaches meta and every io server.
    let o = dafne().args(["status", "--dir", p(c.dir()), "--json", "--credential", p(&cred)]).output().unwrap();
    assert!(o.status.success(), "dafne status --credential failed:\n{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(report["meta"]["reachable"].is_null(), "{report}");
    for io in report["io"].as_array().unwrap() {
        assert!(io["error"].is_null() && io["info"]["capacity_bytes"].as_u64() > Some(0), "{io}");
    }

    // statfs on the credential mount reports the io servers' space.
    let o = Command::new("df").args(["-k", "--output=size"]).arg(&m.mp).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let kib: u64 = String::from_utf8_lossy(&o.stdout).lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(kib > 0, "df on the credential mount: {}", text(&o));
    drop(m);
    drop(hidden);
}

#[test]
fn root_credentials_keep_root_and_edited_or_revoked_ones_are_refused() {
    let _g = serial();
    let c = Cluster::start_sized(2, "");
    shared_dir(&c);
    let admin = issue(&c, "admin", &["--uid", "1000", "--gid", "1000", "--root"]);
    let bob = issue(&c, "bob", &["--uid", "2000-2999", "--gid", "100"]);
    let hidden = SecretHidden::new(&c);

    // --root keeps root.
    let m = c.mount_at("mnt-admin", &["--credential", p(&admin)]);
    std::fs::write(m.path("shared/by-root"), b"root").unwrap();
    assert_eq!(owner(&m.path("shared/by-root")), (0, 0));
    drop(m);

    // A policy edited after issue (uids widened, key kept) is refused at login.
    let edited = c.dir().join("edited.cred");
    let text_of = std::fs::read_to_string(&bob).unwrap();
    let widened = text_of.replace("2000-2999", "0-4294967295");
    assert_ne!(widened, text_of, "the uid line was not found in\n{text_of}");
    std::fs::write(&edited, widened).unwrap();
    std::fs::set_permissions(&edited, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (_, o) = c.try_mount_at("mnt-edited", &["--credential", p(&edited)]);
    assert!(!o.status.success(), "a mount with an edited credential succeeded");
    let said = text(&o);
    assert!(said.contains("edited.cred") && said.contains("does not match"), "{said}");

    // Revoked: a live mount loses its session, a new one is refused.
    let live = c.mount_at("mnt-bob", &["--credential", p(&bob)]);
    assert!(std::fs::read_dir(live.path("shared")).is_ok());
    drop(hidden);
    let o = dafne().args(["credential", "revoke", "bob", "--dir", p(c.dir())]).output().unwrap();
    assert!(o.status.success(), "dafne credential revoke failed:\n{}", text(&o));
    assert!(text(&o).contains("bob"), "{}", text(&o));
    let o = as_user(2000, 100, "ls", &[p(&live.path("shared/"))]);
    assert!(!o.status.success(), "a revoked credential's mount still lists: {}", text(&o));
    drop(live);
    let (_, o) = c.try_mount_at("mnt-bob2", &["--credential", p(&bob)]);
    assert!(!o.status.success(), "a mount with a revoked credential succeeded");
    assert!(text(&o).contains("revoked"), "{}", text(&o));
    // Others are unaffected.
    let m = c.mount_at("mnt-admin2", &["--credential", p(&admin)]);
    assert!(std::fs::read_dir(m.path("shared")).is_ok());
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
