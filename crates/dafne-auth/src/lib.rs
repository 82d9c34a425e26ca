//! The cluster secret, session authentication, and capabilities: one crate
//! shared by the metadata server (issues capabilities), io servers (verify
//! them) and clients (open sessions).
//!
//! * A session opens with `HMAC-SHA256(secret, "dafne-session-v2" ‖
//!   connection token ‖ nonce ‖ client name)`: proof that the client holds
//!   the cluster secret, without sending it. The token is the transport
//!   connection's random id, so a captured login cannot be replayed on
//!   another connection.
//! * A verified login (a metadata session, or an io server's `Login`,
//!   made alike) keys its connection's frames: [`Secret::frame_keys`]
//!   derives one key per direction, `HMAC-SHA256(secret, "dafne-frame-v2" ‖
//!   direction ‖ token ‖ nonce)`, with which the transport tags (keyed
//!   BLAKE3) and checks every later frame ([`FrameKey`]; `dafne_transport`
//!   frame docs).
//! * On open, meta issues a capability: `HMAC-SHA256(secret,
//!   "dafne-cap-v2" ‖ object id ‖ ino ‖ rights ‖ generation ‖ expiry)`. An
//!   io server holding the same secret verifies it alone, without asking
//!   meta (DESIGN, "Security"), and checks its generation against what it
//!   knows of revocations ([`CapFloors`], below).
//!
//! # Revocation
//! A capability is a bearer token: whoever holds it may use it until it
//! expires, unless it is revoked. Revocation works by generation:
//!
//! * Meta keeps one cluster-wide *capability generation* `G`, persisted in
//!   its store and never going back. Every capability carries the `G` of
//!   its issue.
//! * An event that must take rights away from capabilities already issued
//!   for an object bumps `G` in the same transaction and records the
//!   revocation `(object, floor = new G)` in meta's revocation log: a chmod
//!   or chown (mode, uid or gid changed), a size change (truncate, also at
//!   an `O_TRUNC` open), the unlink of a file's last link, and the listing
//!   of an orphan for reclaiming. Only capabilities issued before the event
//!   have a generation below the floor.
//! * Io servers keep, per object, the floor they know ([`CapFloors`]) and
//!   refuse a capability whose generation is below it with `ESTALE`. They
//!   learn floors only from meta's log, in batches MAC'd by meta
//!   (`Revocations`, verified with [`Secret::verify_revocations`]): the
//!   supervisor's relay carries them (it holds connections to meta and to
//!   every io server) but cannot make or change one without the secret.
//!   Each server applies a batch only if it continues the last one it
//!   applied (same meta instance, next sequence number); anything else
//!   (a restarted io server, a restarted meta, a log that has moved on) is
//!   answered by a *reset*: every floor raised to meta's current `G`, which
//!   revokes every older capability (clients re-obtain them, below).
//! * A reclaimed object gets a *tombstone*: the reclaimer's `Remove`
//!   marks the object removed before it deletes its data, and from then on
//!   no capability at all reads, writes, truncates or re-creates it (a
//!   repeated `Remove` is answered as done).
//!
//! POSIX says a file descriptor opened before a chmod or unlink keeps
//! working, so a revoked capability can be re-obtained (`Recap`) by a
//! session that holds an open of the object: meta checks that the old
//! capability is genuine (its MAC; its generation and expiry do not
//! matter), that the session's open table holds the object from an open it
//! made itself (or re-announced while meta could check it: during meta's
//! start-up grace or while the object lingered from the session's previous
//! connection), and that the object is still the file's (the ino in the
//! capability names it) or an unlinked file's whose data is not reclaimed
//! yet. Then it issues the same object, file and rights at the current
//! generation. The client library does this by itself when an io server
//! answers `ESTALE`. A capability obtained before a chmod that took the
//! caller's rights away is thus worthless to a client that does not hold
//! an open taken before the chmod, and every capability of a reclaimed
//! object is worthless to everyone.
//!
//! What this does not cover: revocation is not synchronous. A chmod is
//! acknowledged when meta has committed it; io servers refuse the old
//! capabilities once the relay's next round (every 200 ms) has reached
//! them, and an io server that restarted accepts old capabilities until
//! its first batch (a reset) arrives. A truncate revokes whole objects,
//! not byte ranges. And a holder of the cluster secret can sign any
//! capability it likes (including generation [`TRUSTED_GENERATION`], which
//! no floor stops): only fully trusted clients hold it (below).
//!
//! # Credentials
//! A holder of the cluster secret may state any uid in its requests, root
//! included. Every other client logs in with a *per-client credential*
//! (module `credential`): a policy ([`dafne_proto::Credential`]: a name,
//! the uid ranges and gid ranges its requests may state, and whether uid 0
//! stays root) and its key, `HMAC-SHA256(secret, "dafne-credential-v1" ‖
//! canonical policy)` ([`Secret::credential_key`]), which an admin issues
//! where the secret is (`dafne credential issue`) into a private file
//! ([`CredentialFile`]) that never holds the secret.
//!
//! * **Login.** The client sends the policy with its login (meta's
//!   `SessionOpen`, an io server's `Login`) and proves the key with the
//!   same MAC as a session (`"dafne-session-v2"`, connection token, nonce,
//!   client name). The server derives the key from the secret and the
//!   policy presented ([`Secret::login_key`]) and verifies the MAC with
//!   it: a policy edited after issue has another key, so its login fails.
//!   No state is needed, so io servers verify logins as meta does. A login
//!   without a policy must be proven with the secret itself.
//! * **Enforcement** (meta, every request of a credential session,
//!   [`enforce`]): uid 0 is squashed to [`NOBODY`]/[`NOBODY`] (nobody,
//!   nogroup) with no supplementary groups unless the credential grants
//!   root, in which case uid 0 acts as stated; any other uid must lie in
//!   the uid ranges and the primary gid in the gid ranges, else the
//!   request fails with `EPERM`; supplementary groups outside the gid
//!   ranges are dropped. Capabilities meta issues to such a session are
//!   for what that identity may open, so io servers need no policy.
//! * **Revocation.** `dafne credential revoke NAME` (meta's
//!   `RevokeCredential`, sent by a session proven with the secret) records
//!   the name in meta's store; meta refuses the name's logins from then on
//!   and ends its live sessions (their requests fail with `EACCES`). Io
//!   servers do not learn of it: a revoked credential can still log in to
//!   an io server (which lets it hold a connection and ask `ServerInfo`),
//!   but gets no new capability from meta; capabilities it already holds
//!   last until they expire or are revoked (above).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::collections::HashMap;

use dafne_proto::{Capability, Revocations};

mod credential;
pub use credential::{
    check_name, enforce, normalize, parse_range, CredentialError, CredentialFile, Denied, LoginKey, NOBODY,
};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Length of the cluster secret in bytes.
pub const SECRET_LEN: usize = 32;

/// How long a capability stays valid.
pub const CAP_LIFETIME: Duration = Duration::from_secs(3600);

/// The generation of a capability signed by a holder of the cluster secret
/// rather than issued by meta (the reclaimer, `dafne status`): above every
/// floor, stopped only by a tombstone.
pub const TRUSTED_GENERATION: u64 = u64::MAX;

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
    /// (`error` is not a `#[source]`: the message holds it, and a chain
    /// printed with `{:#}` would say it twice.)
    #[error("cannot read the cluster secret {path}: {error}{}", read_hint(error))]
    Read { path: String, error: std::io::Error },
    #[error("cannot create the cluster secret {path}: {error}")]
    Create { path: String, error: std::io::Error },
    #[error("the cluster secret {path} must hold {SECRET_LEN} bytes, it holds {len} (delete it to make a new one)")]
    Length { path: String, len: usize },
    /// Group or other may read or write the file: anyone who can read it
    /// can sign capabilities and open sessions as any user.
    #[error(
        "the cluster secret {path} has mode {mode:04o}: group or other may read it, and whoever reads it is \
         root on every mount of the cluster; run `chmod 600 {path}`"
    )]
    Mode { path: String, mode: u32 },
    #[error("no randomness available: {0}")]
    Random(std::io::Error),
}

/// How to get past a secret file this user may not read.
fn read_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            " (it is readable by its owner only, the user who ran `dafne up`: run this as that user; whoever \
             holds the secret is trusted with any identity, README \"Security model\")"
        }
        std::io::ErrorKind::NotFound => " (the metadata server creates it when it first starts, as in `dafne up`)",
        _ => "",
    }
}

impl Secret {
    pub fn from_bytes(b: [u8; SECRET_LEN]) -> Secret {
        Secret(b)
    }

    /// Loads an existing secret (io servers and clients: the metadata server
    /// creates it).
    pub fn load(path: &Path) -> Result<Secret, SecretError> {
        let p = path.display().to_string();
        let f = std::fs::File::open(path).map_err(|source| SecretError::Read { path: p.clone(), error: source })?;
        Self::read_private(f, p)
    }

    /// The secret in `f` (opened from `path`), refused when group or other
    /// may read or write it. The mode is the open file's (`fstat`), so the
    /// file checked is the file read.
    fn read_private(mut f: std::fs::File, path: String) -> Result<Secret, SecretError> {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        let mode = f
            .metadata()
            .map_err(|source| SecretError::Read { path: path.clone(), error: source })?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(SecretError::Mode { path, mode: mode & 0o7777 });
        }
        let mut b = Vec::with_capacity(SECRET_LEN);
        // One byte more than a secret, to tell a longer file from a secret.
        (&mut f)
            .take(SECRET_LEN as u64 + 1)
            .read_to_end(&mut b)
            .map_err(|source| SecretError::Read { path: path.clone(), error: source })?;
        let len =
            if b.len() > SECRET_LEN { f.metadata().map(|m| m.len() as usize).unwrap_or(b.len()) } else { b.len() };
        let arr: [u8; SECRET_LEN] = b.as_slice().try_into().map_err(|_| SecretError::Length { path, len })?;
        Ok(Secret(arr))
    }

    /// Loads the secret at `path`, creating it (mode 0600, random) if absent.
    pub fn load_or_create(path: &Path) -> Result<Secret, SecretError> {
        let p = path.display().to_string();
        match std::fs::File::open(path) {
            Ok(f) => Self::read_private(f, p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut b = [0u8; SECRET_LEN];
                let mut f = std::fs::File::open("/dev/urandom").map_err(SecretError::Random)?;
                std::io::Read::read_exact(&mut f, &mut b).map_err(SecretError::Random)?;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(|source| SecretError::Create { path: p.clone(), error: source })?;
                }
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode_0600()
                    .open(path)
                    .map_err(|source| SecretError::Create { path: p.clone(), error: source })?;
                out.write_all(&b)
                    .and_then(|_| out.sync_all())
                    .map_err(|source| SecretError::Create { path: p, error: source })?;
                Ok(Secret(b))
            }
            Err(source) => Err(SecretError::Read { path: p, error: source }),
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

    /// The per-direction frame keys of the connection `token` on which a
    /// login with `nonce` was verified with this secret (client and server
    /// derive them alike; [`FrameKeys`]). Called on the `Secret` the login
    /// was checked with, so whatever key verifies a login also keys its
    /// connection's frames.
    pub fn frame_keys(&self, token: u64, nonce: &[u8; 16]) -> FrameKeys {
        let key = |direction: &[u8]| {
            let k: [u8; 32] =
                self.mac(&[b"dafne-frame-v2", direction, &token.to_le_bytes(), nonce]).finalize().into_bytes().into();
            FrameKey(blake3::Hasher::new_keyed(&k))
        };
        FrameKeys { to_server: key(b"client->server"), to_client: key(b"server->client") }
    }

    /// Fills in expiry and MAC of a capability (object, ino, rights and
    /// generation are the caller's).
    pub fn sign(&self, cap: &mut Capability, now: SystemTime) {
        cap.expiry_unix_ns = (now + CAP_LIFETIME).duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        cap.mac = self.mac(&[b"dafne-cap-v2", &cap.signed_bytes()]).finalize().into_bytes().into();
    }

    /// Whether `cap` is authentic, unexpired at `now`, and grants `rights`
    /// (its generation is the io server's to check, [`CapFloors`]).
    pub fn verify_cap(&self, cap: &Capability, object_id: u64, rights: u8, now: SystemTime) -> bool {
        let now_ns = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        cap.object_id == object_id && cap.rights & rights == rights && cap.expiry_unix_ns > now_ns && self.genuine(cap)
    }

    /// Whether `cap` was signed with this secret, whatever its expiry
    /// (meta's check before it re-issues one, module docs "Revocation").
    pub fn genuine(&self, cap: &Capability) -> bool {
        self.mac(&[b"dafne-cap-v2", &cap.signed_bytes()]).verify_slice(&cap.mac).is_ok()
    }

    /// Fills in the MAC of a batch of meta's revocation log.
    pub fn sign_revocations(&self, batch: &mut Revocations) {
        batch.mac = self.mac(&[b"dafne-revoke-v1", &batch.signed_bytes()]).finalize().into_bytes().into();
    }

    /// Whether a batch of revocations was signed with this secret.
    pub fn verify_revocations(&self, batch: &Revocations) -> bool {
        self.mac(&[b"dafne-revoke-v1", &batch.signed_bytes()]).verify_slice(&batch.mac).is_ok()
    }
}

/// Length of a frame tag: the first 16 bytes of a keyed BLAKE3 hash
/// (128 bits, as IPsec's HMAC-SHA-256-128 or AES-GCM's tag).
pub const FRAME_TAG_LEN: usize = 16;

/// The key of one direction of a connection's frames: BLAKE3 in its keyed
/// mode, which is a MAC (a PRF under a 256-bit key; its output may be
/// truncated). Why not HMAC-SHA256, which frames used first: a frame's
/// tag covers its payload, and inline writes and replies carry up to
/// 64 KiB; HMAC-SHA256 cost ~7 µs per 4 KiB frame on this machine
/// (sender and receiver each), which halved the rate of 4 KiB calls
/// (docs/BENCHMARKS.md, "Frame authentication"); BLAKE3 uses the CPU's
/// vector units and runs several times faster. Session and capability
/// MACs stay HMAC-SHA256 (few, small).
#[derive(Clone)]
pub struct FrameKey(blake3::Hasher);

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(…)")
    }
}

impl FrameKey {
    /// The tag of a frame: `BLAKE3-keyed(key, payload ‖ header)`, first
    /// [`FRAME_TAG_LEN`] bytes. `header` is the part of the header the tag
    /// covers (every field but the tag; its length is fixed, so the split
    /// between payload and header is unambiguous). Payload first: BLAKE3
    /// hashes whole 1 KiB chunks in parallel (SIMD) only from a chunk
    /// boundary on, and a 48-byte header in front would make it hash a
    /// 4 KiB payload one chunk at a time (measured: no faster than
    /// HMAC-SHA256 at 4 KiB).
    pub fn tag(&self, header: &[u8], payload: &[u8]) -> [u8; FRAME_TAG_LEN] {
        let mut m = self.0.clone();
        m.update(payload);
        m.update(header);
        let full = m.finalize();
        let mut t = [0u8; FRAME_TAG_LEN];
        t.copy_from_slice(&full.as_bytes()[..FRAME_TAG_LEN]);
        t
    }

    /// Check of a frame's tag in constant time (every byte is compared,
    /// whatever differs first).
    pub fn verify(&self, header: &[u8], payload: &[u8], tag: &[u8; FRAME_TAG_LEN]) -> bool {
        let expected = self.tag(header, payload);
        expected.iter().zip(tag).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }
}

/// The two keys of one logged-in connection ([`Secret::frame_keys`]): the
/// client tags what it sends with `to_server`, the server with `to_client`.
/// Separate keys per direction, so that a frame cannot be reflected back
/// to its sender as if the peer had sent it.
#[derive(Debug, Clone)]
pub struct FrameKeys {
    pub to_server: FrameKey,
    pub to_client: FrameKey,
}

/// Most objects an io server keeps a floor or tombstone for. An entry is
/// an object id (8 B) and a [`Floor`] (16 B with padding) in a hash table
/// with a control byte per slot, at most 7/8 full and at least 7/16 full
/// after it doubles: ≤ 25 × 16 / 7 ≈ 57 B per entry, so 2¹⁸ entries take
/// at most ≈ 15 MiB. Past the bound the table is emptied into the global
/// floor ([`CapFloors`]).
pub const MAX_FLOORS: usize = 1 << 18;

/// What an io server knows of one object's revocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Floor {
    /// Capabilities of a generation below this are refused.
    generation: u64,
    /// Reclaimed: every capability is refused, whatever its generation.
    removed: bool,
}

/// Why an io server refuses a genuine, unexpired capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("capability of object {object} at generation {generation} revoked (floor {floor})")]
    Revoked { object: u64, generation: u64, floor: u64 },
    #[error("object {object} was reclaimed")]
    Removed { object: u64 },
}

/// An io server's revocation state (module docs, "Revocation"): a floor
/// and tombstone per object, bounded by `max` entries; a global floor that
/// holds for every object; and the last batch of meta's log applied.
///
/// When the table is full it is emptied and the global floor raised to the
/// highest floor it held: every capability it revoked stays revoked (its
/// generation is below that), tombstones included (no capability of a
/// reclaimed object is issued after its listing, whose generation is its
/// floor), at the price of revoking valid capabilities too, which their
/// holders re-obtain. One sweep per `max` insertions.
#[derive(Debug)]
pub struct CapFloors {
    floors: HashMap<u64, Floor>,
    global: u64,
    max: usize,
    /// (meta instance, log sequence) of the last batch applied; (0, 0)
    /// before the first.
    applied: (u64, u64),
}

impl Default for CapFloors {
    fn default() -> Self {
        CapFloors::new(MAX_FLOORS)
    }
}

impl CapFloors {
    /// An empty table of at most `max` entries (at least 1).
    pub fn new(max: usize) -> CapFloors {
        CapFloors { floors: HashMap::new(), global: 0, max: max.max(1), applied: (0, 0) }
    }

    /// Whether `cap` (already verified genuine) is still valid here.
    pub fn check(&self, cap: &Capability) -> Result<(), Refusal> {
        let object = cap.object_id;
        let (floor, removed) = match self.floors.get(&object) {
            Some(f) => (f.generation.max(self.global), f.removed),
            None => (self.global, false),
        };
        if removed {
            return Err(Refusal::Removed { object });
        }
        if cap.generation < floor {
            return Err(Refusal::Revoked { object, generation: cap.generation, floor });
        }
        Ok(())
    }

    /// Whether `object` has a tombstone.
    pub fn is_removed(&self, object: u64) -> bool {
        self.floors.get(&object).is_some_and(|f| f.removed)
    }

    /// Capabilities of `object` below generation `floor` are refused from
    /// now on (floors never go down).
    pub fn raise(&mut self, object: u64, floor: u64) {
        self.set(object, floor, false);
    }

    /// `object` is reclaimed: no capability of it is valid any more. `floor`
    /// is the generation of its listing for reclaiming (what the global
    /// floor becomes if the tombstone has to make room).
    pub fn remove(&mut self, object: u64, floor: u64) {
        self.set(object, floor, true);
    }

    fn set(&mut self, object: u64, floor: u64, removed: bool) {
        if !self.floors.contains_key(&object) && self.floors.len() >= self.max {
            self.make_room();
        }
        let f = self.floors.entry(object).or_insert(Floor { generation: 0, removed: false });
        f.generation = f.generation.max(floor);
        f.removed |= removed;
    }

    /// Empties the table into the global floor (type docs).
    fn make_room(&mut self) {
        let highest = self.floors.values().map(|f| f.generation).max().unwrap_or(0);
        self.global = self.global.max(highest);
        self.floors.clear();
    }

    /// Applies a batch of meta's log, already verified genuine: a reset
    /// always, otherwise only if it continues the last batch applied.
    /// Returns whether it was applied; [`CapFloors::applied`] says where
    /// this server stands either way.
    pub fn apply(&mut self, batch: &Revocations) -> bool {
        if batch.reset_floor == 0 && (batch.instance, batch.from_seq) != self.applied {
            return false;
        }
        self.global = self.global.max(batch.reset_floor);
        for e in &batch.entries {
            self.raise(e.object_id, e.floor);
        }
        self.applied = (batch.instance, batch.to_seq);
        true
    }

    /// (meta instance, log sequence) of the last batch applied.
    pub fn applied(&self) -> (u64, u64) {
        self.applied
    }

    /// Objects with an entry (at most `max`).
    pub fn len(&self) -> usize {
        self.floors.len()
    }

    /// Whether no object has an entry.
    pub fn is_empty(&self) -> bool {
        self.floors.is_empty()
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

    /// `dafne status` as a user who may not read the secret printed
    /// "Permission denied (os error 13): Permission denied (os error 13)"
    /// and no way out (review): the io error was both in the message and
    /// its source.
    #[test]
    fn an_unreadable_secret_is_named_once_with_the_way_out() {
        let e = SecretError::Read {
            path: "/x/cluster.secret".into(),
            error: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert!(std::error::Error::source(&e).is_none(), "the io error is printed twice in a chain");
        let t = e.to_string();
        assert!(t.contains("/x/cluster.secret") && t.contains("run this as that user"), "{t}");
        let d = tempfile::tempdir().unwrap();
        let t = Secret::load(&d.path().join("missing")).unwrap_err().to_string();
        assert!(t.contains("dafne up"), "{t}");
    }

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
        let mut cap = Capability {
            object_id: 42,
            ino: 7,
            rights: dafne_proto::RIGHT_READ,
            generation: 3,
            expiry_unix_ns: 0,
            advice: dafne_proto::CacheAdvice::NONE,
            mac: [0; 32],
        };
        s.sign(&mut cap, now);
        assert!(s.verify_cap(&cap, 42, dafne_proto::RIGHT_READ, now));
        assert!(!s.verify_cap(&cap, 43, dafne_proto::RIGHT_READ, now), "another object");
        assert!(!s.verify_cap(&cap, 42, dafne_proto::RIGHT_WRITE, now), "a read capability used for a write");
        assert!(!s.verify_cap(&cap, 42, dafne_proto::RIGHT_READ, now + CAP_LIFETIME * 2), "expired");
        assert!(!other.verify_cap(&cap, 42, dafne_proto::RIGHT_READ, now), "another cluster");
        let mut forged = cap;
        forged.rights |= dafne_proto::RIGHT_WRITE;
        assert!(!s.verify_cap(&forged, 42, dafne_proto::RIGHT_WRITE, now), "rights upgraded without the secret");
        let mut forged = cap;
        forged.generation += 1;
        assert!(!s.verify_cap(&forged, 42, dafne_proto::RIGHT_READ, now), "generation raised past a revocation");
        let mut forged = cap;
        forged.ino += 1;
        assert!(!s.genuine(&forged), "another file named");
        assert!(s.genuine(&cap));
        let mut old = cap;
        s.sign(&mut old, now - CAP_LIFETIME * 2);
        assert!(s.genuine(&old), "an expired capability is still genuine (for Recap)");
        assert!(!s.verify_cap(&old, 42, dafne_proto::RIGHT_READ, now), "but not valid");
    }

    fn cap_at(object_id: u64, generation: u64) -> Capability {
        Capability {
            object_id,
            ino: 1,
            rights: 3,
            generation,
            expiry_unix_ns: 0,
            advice: dafne_proto::CacheAdvice::NONE,
            mac: [0; 32],
        }
    }

    #[test]
    fn frame_keys_depend_on_secret_token_nonce_and_direction() {
        let s = Secret([7; SECRET_LEN]);
        let k = s.frame_keys(77, &[1; 16]);
        let (h, p) = (&[5u8; 48][..], &b"payload"[..]);
        let t = k.to_server.tag(h, p);
        assert!(k.to_server.verify(h, p, &t));
        assert!(s.frame_keys(77, &[1; 16]).to_server.verify(h, p, &t), "both ends derive the same key");
        assert!(!k.to_client.verify(h, p, &t), "reflected to its sender");
        assert!(!s.frame_keys(78, &[1; 16]).to_server.verify(h, p, &t), "another connection");
        assert!(!s.frame_keys(77, &[2; 16]).to_server.verify(h, p, &t), "another login");
        assert!(!Secret([8; SECRET_LEN]).frame_keys(77, &[1; 16]).to_server.verify(h, p, &t), "another secret");
        assert!(!k.to_server.verify(h, b"payloaD", &t), "payload changed");
        let mut h2 = [5u8; 48];
        h2[40] ^= 1;
        assert!(!k.to_server.verify(&h2, p, &t), "header changed");
        let mut t2 = t;
        t2[15] ^= 0x80;
        assert!(!k.to_server.verify(h, p, &t2), "tag changed");
    }

    #[test]
    fn floors_revoke_older_generations_and_tombstones_everything() {
        let mut f = CapFloors::new(16);
        assert_eq!(f.check(&cap_at(7, 0)), Ok(()));
        f.raise(7, 5);
        assert_eq!(f.check(&cap_at(7, 4)), Err(Refusal::Revoked { object: 7, generation: 4, floor: 5 }));
        assert_eq!(f.check(&cap_at(7, 5)), Ok(()), "issued at the revocation's generation: after it");
        assert_eq!(f.check(&cap_at(8, 0)), Ok(()), "another object is untouched");
        f.raise(7, 2);
        assert!(f.check(&cap_at(7, 4)).is_err(), "floors never go down");
        f.remove(7, 9);
        assert!(f.is_removed(7));
        for g in [0, 9, 10, TRUSTED_GENERATION] {
            assert_eq!(f.check(&cap_at(7, g)), Err(Refusal::Removed { object: 7 }), "generation {g}");
        }
        f.raise(7, 20);
        assert!(f.is_removed(7), "a later floor does not undo a tombstone");
        assert_eq!(f.check(&cap_at(8, TRUSTED_GENERATION)), Ok(()));
    }

    #[test]
    fn a_full_table_folds_into_the_global_floor_and_stays_bounded() {
        let mut f = CapFloors::new(4);
        f.remove(1, 10);
        f.raise(2, 3);
        f.raise(3, 4);
        f.raise(4, 5);
        assert_eq!(f.len(), 4);
        f.raise(5, 6);
        assert_eq!(f.len(), 1, "emptied, then the new entry");
        // What was revoked stays revoked, the reclaimed object included.
        assert!(f.check(&cap_at(1, 9)).is_err(), "a capability issued before the reclaim's listing");
        assert!(f.check(&cap_at(2, 2)).is_err());
        assert!(f.check(&cap_at(5, 5)).is_err());
        // Fresh capabilities pass; older ones of other objects must be re-obtained.
        assert_eq!(f.check(&cap_at(9, 10)), Ok(()));
        assert!(f.check(&cap_at(9, 9)).is_err());
        for o in 100..10_000u64 {
            f.raise(o, o);
            assert!(f.len() <= 4);
        }
    }

    fn batch(instance: u64, from_seq: u64, reset_floor: u64, entries: &[(u64, u64)]) -> Revocations {
        Revocations {
            instance,
            from_seq,
            to_seq: from_seq + entries.len() as u64,
            reset_floor,
            entries: entries.iter().map(|&(object_id, floor)| dafne_proto::Revocation { object_id, floor }).collect(),
            mac: [0; 32],
        }
    }

    #[test]
    fn batches_apply_in_sequence_and_a_reset_revokes_everything_older() {
        let mut f = CapFloors::new(16);
        assert!(!f.apply(&batch(5, 3, 0, &[(7, 4)])), "a first batch that is not a reset");
        assert_eq!(f.applied(), (0, 0));
        assert!(f.apply(&batch(5, 3, 2, &[(7, 4)])), "a reset");
        assert_eq!(f.applied(), (5, 4));
        assert!(f.check(&cap_at(8, 1)).is_err(), "below the reset floor");
        assert!(f.check(&cap_at(7, 3)).is_err());
        assert_eq!(f.check(&cap_at(7, 4)), Ok(()));
        assert!(!f.apply(&batch(5, 5, 0, &[(9, 9)])), "a gap");
        assert!(!f.apply(&batch(6, 4, 0, &[(9, 9)])), "another meta instance");
        assert!(f.check(&cap_at(9, 1)).is_err(), "below the reset floor still");
        assert_eq!(f.check(&cap_at(9, 8)), Ok(()), "nothing of the refused batches was applied");
        assert!(f.apply(&batch(5, 4, 0, &[(9, 9), (7, 6)])));
        assert_eq!(f.applied(), (5, 6));
        assert!(f.check(&cap_at(9, 8)).is_err());
        assert!(f.check(&cap_at(7, 5)).is_err());
        // A replayed old reset moves nothing back but the cursor.
        assert!(f.apply(&batch(5, 3, 2, &[])));
        assert!(f.check(&cap_at(9, 8)).is_err());
    }

    #[test]
    fn revocation_batches_verify_only_when_genuine() {
        let s = Secret([7; SECRET_LEN]);
        let mut b = batch(1, 2, 0, &[(3, 4)]);
        s.sign_revocations(&mut b);
        assert!(s.verify_revocations(&b));
        assert!(!Secret([8; SECRET_LEN]).verify_revocations(&b), "another cluster");
        let mut forged = b.clone();
        forged.entries[0].floor = u64::MAX;
        assert!(!s.verify_revocations(&forged), "a floor changed by the relay");
        let mut forged = b.clone();
        forged.reset_floor = u64::MAX;
        assert!(!s.verify_revocations(&forged), "a reset made up by the relay");
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

    #[test]
    fn a_secret_file_others_may_read_is_refused_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        let good = Secret::load_or_create(&p).unwrap();
        for mode in [0o640, 0o604, 0o620, 0o644] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            for r in [Secret::load(&p), Secret::load_or_create(&p)] {
                let e = r.unwrap_err();
                assert!(matches!(e, SecretError::Mode { mode: m, .. } if m == mode), "{mode:o}: {e}");
                let msg = e.to_string();
                let want = format!("chmod 600 {}", p.display());
                assert!(msg.contains(&format!("{mode:04o}")) && msg.contains(&want), "{msg}");
            }
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(Secret::load(&p).unwrap().0, good.0, "owner-only modes are fine");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&p, [0u8; SECRET_LEN + 7]).unwrap();
        assert!(matches!(Secret::load(&p), Err(SecretError::Length { len, .. }) if len == SECRET_LEN + 7));
    }
}
