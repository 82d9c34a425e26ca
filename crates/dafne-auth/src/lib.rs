//! The cluster secret, session authentication, and capabilities: one crate
//! shared by the metadata server (issues capabilities), io servers (verify
//! them) and clients (open sessions).
//!
//! * A session opens with `HMAC-SHA256(secret, "dafne-session-v2" ‖
//!   connection token ‖ nonce ‖ client name)`: proof that the client holds
//!   the cluster secret, without sending it. The token is the transport
//!   connection's random id, so a captured login cannot be replayed on
//!   another connection.
//! * On open, meta issues a capability: `HMAC-SHA256(secret,
//!   "dafne-cap-v1" ‖ object id ‖ rights ‖ expiry)`. An io server holding the
//!   same secret verifies it alone, without asking meta (DESIGN, "Security").

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dafne_proto::Capability;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Length of the cluster secret in bytes.
pub const SECRET_LEN: usize = 32;

/// How long a capability stays valid.
pub const CAP_LIFETIME: Duration = Duration::from_secs(3600);

/// The cluster secret.
#[derive(Clone)]
pub struct Secret([u8; SECRET_LEN]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// Why a secret file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the cluster secret {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("cannot create the cluster secret {path}: {source}")]
    Create { path: String, source: std::io::Error },
    #[error("the cluster secret {path} must hold {SECRET_LEN} bytes, it holds {len} (delete it to make a new one)")]
    Length { path: String, len: usize },
    #[error("no randomness available: {0}")]
    Random(std::io::Error),
}

impl Secret {
    pub fn from_bytes(b: [u8; SECRET_LEN]) -> Secret {
        Secret(b)
    }

    /// Loads an existing secret (io servers and clients: the metadata server
    /// creates it).
    pub fn load(path: &Path) -> Result<Secret, SecretError> {
        let p = path.display().to_string();
        let b = std::fs::read(path).map_err(|source| SecretError::Read { path: p.clone(), source })?;
        let arr: [u8; SECRET_LEN] =
            b.as_slice().try_into().map_err(|_| SecretError::Length { path: p, len: b.len() })?;
        Ok(Secret(arr))
    }

    /// Loads the secret at `path`, creating it (mode 0600, random) if absent.
    pub fn load_or_create(path: &Path) -> Result<Secret, SecretError> {
        let p = path.display().to_string();
        match std::fs::read(path) {
            Ok(b) => {
                let arr: [u8; SECRET_LEN] =
                    b.as_slice().try_into().map_err(|_| SecretError::Length { path: p, len: b.len() })?;
                Ok(Secret(arr))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut b = [0u8; SECRET_LEN];
                let mut f = std::fs::File::open("/dev/urandom").map_err(SecretError::Random)?;
                std::io::Read::read_exact(&mut f, &mut b).map_err(SecretError::Random)?;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(|source| SecretError::Create { path: p.clone(), source })?;
                }
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode_0600()
                    .open(path)
                    .map_err(|source| SecretError::Create { path: p.clone(), source })?;
                out.write_all(&b)
                    .and_then(|_| out.sync_all())
                    .map_err(|source| SecretError::Create { path: p, source })?;
                Ok(Secret(b))
            }
            Err(source) => Err(SecretError::Read { path: p, source }),
        }
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        for p in parts {
            m.update(p);
        }
        m
    }

    /// The MAC a client sends to open a session on the connection `token`.
    pub fn session_mac(&self, token: u64, nonce: &[u8; 16], client_name: &str) -> [u8; 32] {
        self.mac(&[b"dafne-session-v2", &token.to_le_bytes(), nonce, client_name.as_bytes()])
            .finalize()
            .into_bytes()
            .into()
    }

    /// Constant-time check of a session MAC for the connection `token`.
    pub fn verify_session(&self, token: u64, nonce: &[u8; 16], client_name: &str, mac: &[u8; 32]) -> bool {
        self.mac(&[b"dafne-session-v2", &token.to_le_bytes(), nonce, client_name.as_bytes()]).verify_slice(mac).is_ok()
    }

    /// Fills in expiry and MAC of a capability.
    pub fn sign(&self, cap: &mut Capability, now: SystemTime) {
        cap.expiry_unix_ns = (now + CAP_LIFETIME).duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        cap.mac = self.mac(&[b"dafne-cap-v1", &cap.signed_bytes()]).finalize().into_bytes().into();
    }

    /// Whether `cap` is authentic, unexpired at `now`, and grants `rights`.
    pub fn verify_cap(&self, cap: &Capability, object_id: u64, rights: u8, now: SystemTime) -> bool {
        let now_ns = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        cap.object_id == object_id
            && cap.rights & rights == rights
            && cap.expiry_unix_ns > now_ns
            && self.mac(&[b"dafne-cap-v1", &cap.signed_bytes()]).verify_slice(&cap.mac).is_ok()
    }
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}
impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_and_capabilities_verify_only_when_genuine() {
        let s = Secret([7; SECRET_LEN]);
        let other = Secret([8; SECRET_LEN]);
        let nonce = [1u8; 16];
        let mac = s.session_mac(77, &nonce, "client-a");
        assert!(s.verify_session(77, &nonce, "client-a", &mac));
        assert!(!s.verify_session(77, &nonce, "client-b", &mac));
        assert!(!s.verify_session(78, &nonce, "client-a", &mac), "replayed on another connection");
        assert!(!other.verify_session(77, &nonce, "client-a", &mac));

        let now = SystemTime::now();
        let mut cap = Capability { object_id: 42, rights: dafne_proto::RIGHT_READ, expiry_unix_ns: 0, mac: [0; 32] };
        s.sign(&mut cap, now);
        assert!(s.verify_cap(&cap, 42, dafne_proto::RIGHT_READ, now));
        assert!(!s.verify_cap(&cap, 43, dafne_proto::RIGHT_READ, now), "another object");
        assert!(!s.verify_cap(&cap, 42, dafne_proto::RIGHT_WRITE, now), "a read capability used for a write");
        assert!(!s.verify_cap(&cap, 42, dafne_proto::RIGHT_READ, now + CAP_LIFETIME * 2), "expired");
        assert!(!other.verify_cap(&cap, 42, dafne_proto::RIGHT_READ, now), "another cluster");
        let mut forged = cap;
        forged.rights |= dafne_proto::RIGHT_WRITE;
        assert!(!s.verify_cap(&forged, 42, dafne_proto::RIGHT_WRITE, now), "rights upgraded without the secret");
    }

    #[test]
    fn secret_file_is_created_once_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/secret");
        let a = Secret::load_or_create(&p).unwrap();
        let b = Secret::load_or_create(&p).unwrap();
        assert_eq!(a.0, b.0);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&p, b"short").unwrap();
        assert!(matches!(Secret::load_or_create(&p), Err(SecretError::Length { len: 5, .. })));
    }
}
