//! Shared harness of the io tests: UCX settings, an in-process metadata
//! server, and io server processes (`dafne-io`).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use dafne_transport::{Runtime, RuntimeOptions};

pub mod disk;

pub fn ucx() -> Vec<(String, String)> {
    vec![("TLS".into(), "posix,sysv,cma,self,tcp".into()), ("NET_DEVICES".into(), "lo".into())]
}

pub fn ucx_args() -> Vec<String> {
    ucx().iter().map(|(k, v)| format!("{k}={v}")).collect()
}

thread_local! {
    static DATA_PATH: std::cell::Cell<&'static str> = const { std::cell::Cell::new("auto") };
}

/// `DAFNE_DATA_PATH` for the io servers this thread starts next (`auto`
/// unless [`as_if_across_hosts`]).
fn data_path() -> &'static str {
    DATA_PATH.with(|d| d.get())
}

/// The io servers this thread starts from now on, and its runtimes, treat
/// each other as on different hosts (`DAFNE_DATA_PATH=peer`: UCX over TCP
/// with peer failure detection, where servers accept keys to registered
/// memory; on one host they refuse them, `EREMOTEIO`).
pub fn as_if_across_hosts() {
    DATA_PATH.with(|d| d.set("peer"));
}

/// A runtime on this host's terms whatever [`as_if_across_hosts`] said
/// (for the in-process metadata server's clients: it serves this host).
pub fn runtime_on_this_host(name: &str) -> Runtime {
    runtime_with(name, dafne_transport::DataPath::Auto)
}

/// A client runtime as this thread's io servers expect ([`as_if_across_hosts`]).
pub fn runtime(name: &str) -> Runtime {
    let across = data_path() == "peer";
    runtime_with(
        name,
        if across { dafne_transport::DataPath::PeerErrorHandling } else { dafne_transport::DataPath::Auto },
    )
}

fn runtime_with(name: &str, data_path: dafne_transport::DataPath) -> Runtime {
    Runtime::new(RuntimeOptions { name: name.into(), ucx_config: ucx(), data_path, ..Default::default() }).unwrap()
}

/// Starts a metadata server in this process, storing under `dir/meta`;
/// returns it and the path of the cluster secret it created.
pub fn start_meta(
    dir: &Path,
    servers: u32,
    stripe_unit: u32,
    stripe_count: u32,
) -> (dafne_meta::server::MetaServer, PathBuf) {
    let meta_dir = dir.join("meta");
    let meta = dafne_meta::server::start(&dafne_meta::server::ServeOptions {
        data_dir: meta_dir.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        secret: None,
        policy: dafne_meta::LayoutPolicy {
            servers: (0..servers).collect(),
            default_stripe_unit: stripe_unit,
            default_stripe_count: stripe_count,
            ..Default::default()
        },
        ucx: ucx(),
        open_grace: dafne_meta::opens::DEFAULT_GRACE,
    })
    .unwrap();
    (meta, meta_dir.join("cluster.secret"))
}

/// An io server process; killed when dropped.
pub struct IoProc {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    /// Its `--storage` (auto, direct, buffered).
    pub storage: String,
}

impl Drop for IoProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `--storage` of io servers whose test does not choose one:
/// `DAFNE_TEST_STORAGE` (auto, direct or buffered; default auto), so that
/// the whole suite can be run on either storage path.
pub fn storage() -> String {
    std::env::var("DAFNE_TEST_STORAGE").unwrap_or_else(|_| "auto".into())
}

/// [`storage`] as the in-process servers' `IoArgs::storage`.
pub fn storage_mode() -> dafne_io::chunk::StorageMode {
    <dafne_io::chunk::StorageMode as clap::ValueEnum>::from_str(&storage(), true)
        .unwrap_or_else(|e| panic!("DAFNE_TEST_STORAGE: {e}"))
}

/// Starts `dafne-io` (`--storage` from [`storage`]) and waits for its address.
pub fn spawn_io(dir: &Path, secret: &Path, cache_mib: usize, listen: &str) -> IoProc {
    spawn_io_storage(dir, secret, cache_mib, listen, &storage())
}

/// Starts `dafne-io` with `--storage storage` and waits for its address
/// (a server that cannot serve that way exits, and this panics).
pub fn spawn_io_storage(dir: &Path, secret: &Path, cache_mib: usize, listen: &str, storage: &str) -> IoProc {
    spawn_io_env(dir, secret, cache_mib, listen, storage, &[])
}

/// [`spawn_io_storage`] with extra environment variables (fault injection).
#[allow(dead_code)]
pub fn spawn_io_env(
    dir: &Path,
    secret: &Path,
    cache_mib: usize,
    listen: &str,
    storage: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> IoProc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dafne-io"))
        .env("DAFNE_DATA_PATH", data_path())
        .envs(env.iter().copied())
        .args(["--data-dir", dir.to_str().unwrap(), "--secret", secret.to_str().unwrap(), "--listen", listen])
        .args(["--cache-mib", &cache_mib.to_string(), "--storage", storage])
        .args(ucx_args().into_iter().flat_map(|kv| ["--ucx".to_string(), kv]))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dafne-io");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("banner {line:?}")).parse().unwrap();
    IoProc { child, addr, dir: dir.to_path_buf(), storage: storage.to_string() }
}

/// One metadata server (in this process) and four io server processes.
pub struct Cluster {
    pub _meta: dafne_meta::server::MetaServer,
    pub meta_addr: SocketAddr,
    pub ios: Vec<IoProc>,
    pub secret: PathBuf,
    pub _root: tempfile::TempDir,
}

pub fn cluster(cache_mib: usize) -> Cluster {
    cluster_with(cache_mib, &storage())
}

/// Four io servers with `--storage storage`, their data under the target
/// directory (the build's disk: /tmp may be a tmpfs).
pub fn cluster_with(cache_mib: usize, storage: &str) -> Cluster {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&base).unwrap();
    let root = tempfile::tempdir_in(base).unwrap();
    let (meta, secret) = start_meta(root.path(), 4, 64 << 10, 4);
    let ios = (0..4)
        .map(|i| spawn_io_storage(&root.path().join(format!("io{i}")), &secret, cache_mib, "127.0.0.1:0", storage))
        .collect();
    Cluster { meta_addr: meta.addr, _meta: meta, ios, secret, _root: root }
}

/// A small deterministic generator (xorshift) for workloads.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `len` bytes of a deterministic pattern (xorshift) that differs by seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
