//! Opening the client library on a running cluster from its cluster file.
//!
//! Every access path that lives in an application's process (`dafne cp`,
//! the C library, the interception library, the NBD export, Python) starts
//! the same way: read the cluster file a cluster publishes
//! (`DIR/cluster.json`: the metadata server's and io servers' addresses,
//! the secret file and the UCX settings), log in with the cluster secret or
//! a per-client credential, and hold a metadata session and a data client
//! on one transport runtime. [`Cluster::open`] is that sequence, once, with
//! errors that name the file and the fix, so the access paths stay thin.
//!
//! Only the fields a client needs are read from the file; the rest (the
//! supervisor's process id, mount timeouts) belong to the CLI that runs a
//! local cluster.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use dafne_transport::{Runtime, RuntimeOptions};

use crate::data::DataClient;
use crate::{ConnectError, MetaSession};

/// What a client reads from a cluster file.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClusterFile {
    /// The metadata server.
    pub meta: SocketAddr,
    /// Io server addresses; index = server id in layouts.
    pub io: Vec<SocketAddr>,
    /// The cluster secret file (read only when no credential is given).
    pub secret: PathBuf,
    /// UCX settings every process of the cluster uses.
    #[serde(default)]
    pub ucx: Vec<(String, String)>,
}

/// Why the client library could not be opened on a cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error(
        "cannot read the cluster file {path}: {source} (is a cluster running? `dafne up` writes DIR/cluster.json)"
    )]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the cluster file {path} is damaged: {why} (restart the cluster with `dafne down` and `dafne up`)")]
    Parse { path: PathBuf, why: String },
    #[error(transparent)]
    Secret(#[from] dafne_auth::SecretError),
    #[error(transparent)]
    Credential(#[from] dafne_auth::CredentialError),
    #[error("connecting to the {what}: {source}")]
    Connect { what: &'static str, source: ConnectError },
}

impl ClusterError {
    /// The errno an access path that speaks errno (C, LD_PRELOAD, NBD)
    /// reports for this failure.
    pub fn errno(&self) -> crate::Errno {
        use crate::Errno;
        match self {
            ClusterError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Errno::ENOENT,
            ClusterError::Read { .. } | ClusterError::Secret(_) | ClusterError::Credential(_) => Errno::EACCES,
            ClusterError::Parse { .. } => Errno::EINVAL,
            ClusterError::Connect { source: ConnectError::Refused(e), .. } => *e,
            ClusterError::Connect { source: ConnectError::IoLogin { .. }, .. } => Errno::EACCES,
            _ => Errno::EIO,
        }
    }
}

impl ClusterFile {
    /// The cluster file at `path`, or `path/cluster.json` when `path` is a
    /// directory (a cluster directory as `dafne up --dir` takes).
    pub fn load(path: &Path) -> Result<ClusterFile, ClusterError> {
        let file = if path.is_dir() { path.join("cluster.json") } else { path.to_path_buf() };
        let text =
            std::fs::read_to_string(&file).map_err(|source| ClusterError::Read { path: file.clone(), source })?;
        serde_json::from_str(&text).map_err(|e| ClusterError::Parse { path: file, why: e.to_string() })
    }

    /// The login key: the credential file when given (the secret is then
    /// not read), else the cluster secret.
    pub fn login(&self, credential: Option<&Path>) -> Result<dafne_auth::LoginKey, ClusterError> {
        Ok(match credential {
            Some(f) => dafne_auth::CredentialFile::load(f)?.into(),
            None => dafne_auth::Secret::load(&self.secret)?.into(),
        })
    }
}

/// How to open the client library: which cluster, which identity, and the
/// name this client has in the servers' logs.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// A cluster file, or a cluster directory holding `cluster.json`.
    pub cluster: PathBuf,
    /// Log in with this credential instead of the cluster secret.
    pub credential: Option<PathBuf>,
    /// This client's name (transport logs, the metadata server's sessions).
    pub name: String,
    /// The user and group the session acts as (with the secret, any; with
    /// a credential, within its policy). Default: this process's.
    pub uid: u32,
    pub gid: u32,
    /// How long the client's event loop spins after activity before it
    /// sleeps; `None`: the runtime's default (`DAFNE_SPIN_US` or by the
    /// machine's cores). A benchmark that counts CPU asks for zero here
    /// rather than change its own environment while threads run.
    pub spin: Option<std::time::Duration>,
}

impl OpenOptions {
    /// This process's user and group, the cluster secret, the given name.
    pub fn new(cluster: impl Into<PathBuf>, name: &str) -> OpenOptions {
        OpenOptions {
            cluster: cluster.into(),
            credential: None,
            name: name.into(),
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            spin: None,
        }
    }
}

/// The client library connected to a cluster from this process: a
/// metadata session and the io servers, on a runtime of their own.
pub struct Cluster {
    pub meta: MetaSession,
    pub data: DataClient,
    // Dropped last: the sessions above run on it.
    rt: Runtime,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("io_servers", &self.data.server_count()).finish_non_exhaustive()
    }
}

impl Cluster {
    /// Reads the cluster file, logs in and connects (see the module docs).
    pub fn open(o: &OpenOptions) -> Result<Cluster, ClusterError> {
        let file = ClusterFile::load(&o.cluster)?;
        let key = file.login(o.credential.as_deref())?;
        Self::connect(&file, &key, o).map_err(|(what, source)| ClusterError::Connect { what, source })
    }

    /// Connects with a login key already loaded; a failure says which
    /// side refused ("metadata server" or "io servers").
    pub fn connect(
        file: &ClusterFile,
        key: &dafne_auth::LoginKey,
        o: &OpenOptions,
    ) -> Result<Cluster, (&'static str, ConnectError)> {
        let mut ro = RuntimeOptions { name: o.name.clone(), ucx_config: file.ucx.clone(), ..Default::default() };
        if let Some(spin) = o.spin {
            ro.spin = spin;
        }
        let rt = Runtime::new(ro).map_err(|e| ("transport", ConnectError::Transport(e)))?;
        let meta = MetaSession::connect(&rt, file.meta, key, &format!("dafne-{}", o.name), o.uid, o.gid)
            .map_err(|e| ("metadata server", e))?;
        let data = DataClient::connect(&rt, &file.io, key).map_err(|e| ("io servers", e))?;
        // Revoked capabilities of this session's opens are re-issued.
        data.attach_meta(meta.clone());
        Ok(Cluster { meta, data, rt })
    }

    /// The runtime the sessions run on (to post work on its executor).
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_damaged_cluster_file_names_itself_and_maps_to_an_errno() {
        let dir = std::env::temp_dir().join(format!("dafne-cluster-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = ClusterFile::load(&dir).unwrap_err();
        assert!(matches!(e, ClusterError::Read { .. }), "{e}");
        assert_eq!(e.errno(), crate::Errno::ENOENT);
        assert!(e.to_string().contains("cluster.json"), "{e}");
        std::fs::write(dir.join("cluster.json"), "{\"meta\": 5}").unwrap();
        let e = ClusterFile::load(&dir).unwrap_err();
        assert!(matches!(e, ClusterError::Parse { .. }), "{e}");
        assert_eq!(e.errno(), crate::Errno::EINVAL);
        let json = r#"{"dir": "/x", "meta": "127.0.0.1:1", "io": ["127.0.0.1:2"], "secret": "/x/secret",
            "ucx": [["UCX_TLS", "tcp"]], "supervisor_pid": 1}"#;
        std::fs::write(dir.join("cluster.json"), json).unwrap();
        let f = ClusterFile::load(&dir.join("cluster.json")).unwrap();
        assert_eq!(f.io.len(), 1);
        assert_eq!(f.ucx[0].0, "UCX_TLS");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
