//! What a client sees when an io server process crashes and is restarted
//! on its data (as the supervisor does): the connection heals, and
//! unstable writes the crashed process had acknowledged but not made
//! stable are reported by the next `sync`, not silently dropped.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{start_meta, IoProc};

use dafne_client::data::{info_capability, DataClient};
use dafne_client::{Errno, MetaSession, OpenFile, ROOT_INO};
use dafne_proto::io::Stability;
use dafne_proto::LayoutHint;

/// A port free now, for a server that must come back on the same address
/// (the client's link reconnects to the address it knows).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `dafne-io` listening on `listen` (a fixed address). As the
/// supervisor does, it lets UCX reuse the address: connections of the
/// killed server may still hold the port (TIME_WAIT).
fn spawn_io(dir: &Path, secret: &Path, listen: &str) -> IoProc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dafne-io"))
        .args(["--data-dir", dir.to_str().unwrap(), "--secret", secret.to_str().unwrap(), "--listen", listen])
        .args(["--cache-mib", "8", "--storage", &common::storage()])
        .args(common::ucx_args().into_iter().flat_map(|kv| ["--ucx".to_string(), kv]))
        .env("UCX_TCP_CM_REUSEADDR", "y")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dafne-io");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("banner {line:?}")).parse().unwrap();
    IoProc { child, addr, dir: dir.to_path_buf(), storage: common::storage() }
}

/// One io server on a fixed port, with a metadata server and clients.
struct Setup {
    io: IoProc,
    secret: dafne_auth::Secret,
    secret_path: std::path::PathBuf,
    listen: String,
    _meta: dafne_meta::server::MetaServer,
    m: MetaSession,
    d: DataClient,
    _rt: dafne_transport::Runtime,
    _root: tempfile::TempDir,
}

fn setup(name: &str) -> Setup {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret_path) = start_meta(root.path(), 1, 64 << 10, 1);
    let listen = format!("127.0.0.1:{}", free_port());
    let io = spawn_io(&root.path().join("io0"), &secret_path, &listen);
    let rt = common::runtime(name);
    let secret = dafne_auth::Secret::load(&secret_path).unwrap();
    let m = MetaSession::connect(&rt, meta.addr, &secret, name, 0, 0).unwrap();
    let d = DataClient::connect(&rt, &[io.addr], &secret).unwrap();
    Setup { io, secret, secret_path, listen, _meta: meta, m, d, _rt: rt, _root: root }
}

impl Setup {
    fn open_new(&self, name: &str) -> OpenFile {
        let hint = Some(LayoutHint { stripe_unit: 64 << 10, stripe_count: 1 });
        let a = self.m.create_with(ROOT_INO, name.as_bytes(), 0o644, true, hint).unwrap();
        self.m.open(a.ino, dafne_proto::OPEN_READ | dafne_proto::OPEN_WRITE).unwrap()
    }

    /// kill -9 of the io server, then a new one on the same data and address.
    fn crash_and_restart(&mut self) {
        self.io.child.kill().unwrap();
        self.io.child.wait().unwrap();
        let dir = self.io.dir.clone();
        self.io = spawn_io(&dir, &self.secret_path, &self.listen);
    }

    /// Calls that touch no file until the connection has healed: calls in
    /// flight at the loss fail with `EIO`, later ones reconnect.
    fn wait_for_healed_connection(&self) {
        let t = Instant::now();
        while let Err(e) = futures::executor::block_on(self.d.server_info(0, info_capability(&self.secret))) {
            assert_eq!(e, Errno::EIO);
            assert!(t.elapsed() < Duration::from_secs(30), "the io connection did not heal");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(self.d.reconnects() >= 1);
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(seed) % 251) as u8).collect()
}

#[test]
fn sync_fails_when_the_server_that_acknowledged_unstable_writes_crashed() {
    let mut s = setup("recovery-lost");
    let f = s.open_new("unstable");
    let data = pattern(300 << 10, 7);
    futures::executor::block_on(s.d.write_at(&f, 0, &data, Stability::Unstable)).unwrap();
    s.crash_and_restart();
    s.wait_for_healed_connection();
    // The connection works again; the new server has nothing dirty for
    // the file, and a sync that said so would hide the loss.
    assert_eq!(
        futures::executor::block_on(s.d.sync(&f)),
        Err(Errno::EIO),
        "fsync succeeded after the server that acknowledged unstable writes was replaced"
    );
    // Reported once; the file is usable again.
    assert_eq!(futures::executor::block_on(s.d.sync(&f)), Ok(()));
    futures::executor::block_on(s.d.write_at(&f, 0, &data, Stability::Unstable)).unwrap();
    assert_eq!(futures::executor::block_on(s.d.stored_size(&f)), Ok(data.len() as u64));
}

#[test]
fn synced_writes_survive_a_crash_and_the_next_sync_succeeds() {
    let mut s = setup("recovery-synced");
    let f = s.open_new("synced");
    let data = pattern(300 << 10, 13);
    futures::executor::block_on(s.d.write_at(&f, 0, &data, Stability::Unstable)).unwrap();
    futures::executor::block_on(s.d.sync(&f)).unwrap();
    s.crash_and_restart();
    s.wait_for_healed_connection();
    assert_eq!(futures::executor::block_on(s.d.sync(&f)), Ok(()));
    let mut back = vec![0u8; data.len()];
    futures::executor::block_on(s.d.read_at(&f, 0, &mut back)).unwrap();
    assert!(back == data, "synced data changed across kill -9 of the io server");
}

#[test]
fn a_loss_a_close_reported_is_reported_again_by_the_next_sync() {
    let mut s = setup("recovery-stat");
    let f = s.open_new("closed");
    let data = pattern(300 << 10, 11);
    futures::executor::block_on(s.d.write_at(&f, 0, &data, Stability::Unstable)).unwrap();
    s.crash_and_restart();
    s.wait_for_healed_connection();
    // A close (the FUSE daemon publishes the size with a Stat of the
    // servers it wrote to: `stored_size_of_writes`) reports the loss; its
    // error may be discarded, so the writer's fsync must see it too.
    assert_eq!(futures::executor::block_on(s.d.stored_size_of_writes(&f)), Err(Errno::EIO));
    assert_eq!(
        futures::executor::block_on(s.d.sync(&f)),
        Err(Errno::EIO),
        "fsync succeeded after a close had reported the loss"
    );
    assert_eq!(futures::executor::block_on(s.d.sync(&f)), Ok(()), "the loss is reported once by fsync");
}
