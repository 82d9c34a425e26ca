//! Per-client credentials: the key a client proves, the file that holds
//! it, and the rule the metadata server applies to the identities its
//! requests state (crate docs, "Credentials").

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use dafne_proto::{Credential, Groups, IdRange, MAX_CLIENT_NAME, MAX_CREDENTIAL_RANGES};
use hmac::Mac;

use crate::{Secret, SECRET_LEN};

/// What a squashed root becomes: `nobody`/`nogroup`.
pub const NOBODY: u32 = 65534;

/// Largest credential file read (a policy with every range is far below).
const MAX_FILE_LEN: u64 = 64 << 10;

impl Secret {
    /// The key of the credential `policy`: `HMAC-SHA256(cluster secret,
    /// "dafne-credential-v1" ‖ canonical policy)`. Whoever holds it proves
    /// that policy, and nothing else: another policy has another key, and
    /// the cluster secret cannot be found from it.
    pub fn credential_key(&self, policy: &Credential) -> Secret {
        let mac = self.mac(&[b"dafne-credential-v1", &policy.encode()]).finalize().into_bytes();
        let mut k = [0u8; SECRET_LEN];
        k.copy_from_slice(&mac);
        Secret(k)
    }

    /// The key a login with `credential` must be proven with: the derived
    /// key, or this (the cluster) secret itself without a credential. A
    /// server verifies the login's MAC with it ([`Secret::verify_session`]).
    pub fn login_key(&self, credential: Option<&Credential>) -> Secret {
        match credential {
            Some(c) => self.credential_key(c),
            None => self.clone(),
        }
    }
}

/// What a client logs in with: the cluster secret (a fully trusted
/// client: servers' own tools, the local `dafne up` host), or a credential
/// and its key (which never is the cluster secret).
#[derive(Debug, Clone)]
pub enum LoginKey {
    Cluster(Secret),
    Credential { credential: Credential, key: Secret },
}

impl From<Secret> for LoginKey {
    fn from(s: Secret) -> LoginKey {
        LoginKey::Cluster(s)
    }
}

impl From<&Secret> for LoginKey {
    fn from(s: &Secret) -> LoginKey {
        LoginKey::Cluster(s.clone())
    }
}

impl From<&LoginKey> for LoginKey {
    fn from(k: &LoginKey) -> LoginKey {
        k.clone()
    }
}

impl From<CredentialFile> for LoginKey {
    fn from(f: CredentialFile) -> LoginKey {
        LoginKey::Credential { credential: f.credential, key: f.key }
    }
}

impl LoginKey {
    /// The key the login MAC is made with.
    pub fn key(&self) -> &Secret {
        match self {
            LoginKey::Cluster(s) => s,
            LoginKey::Credential { key, .. } => key,
        }
    }

    /// The credential a login presents (`None`: the cluster secret).
    pub fn credential(&self) -> Option<&Credential> {
        match self {
            LoginKey::Cluster(_) => None,
            LoginKey::Credential { credential, .. } => Some(credential),
        }
    }

    /// The cluster secret, for what only a fully trusted client does
    /// (sign capabilities of its own); `None` with a credential.
    pub fn cluster_secret(&self) -> Option<&Secret> {
        match self {
            LoginKey::Cluster(s) => Some(s),
            LoginKey::Credential { .. } => None,
        }
    }

    /// The MAC of a login (meta's `SessionOpen`, an io server's `Login`)
    /// on the connection `token`.
    pub fn session_mac(&self, token: u64, nonce: &[u8; 16], client_name: &str) -> [u8; 32] {
        self.key().session_mac(token, nonce, client_name)
    }
}

/// Why a request's stated identity is refused under a credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("the credential does not allow uid {0}")]
    Uid(u32),
    #[error("the credential does not allow gid {0}")]
    Gid(u32),
}

/// The identity a request of a credential session acts as (crate docs,
/// "Credentials"): uid 0 becomes [`NOBODY`]/[`NOBODY`] without
/// supplementary groups unless the credential grants root (then uid 0
/// acts as stated); any other uid must lie in the credential's uid ranges
/// and its gid in the gid ranges, else the request is refused (`EPERM`);
/// supplementary groups outside the gid ranges are dropped.
pub fn enforce(policy: &Credential, uid: u32, gid: u32, groups: &Groups) -> Result<(u32, u32, Groups), Denied> {
    if uid == 0 {
        return Ok(if policy.root { (0, gid, *groups) } else { (NOBODY, NOBODY, Groups::NONE) });
    }
    if !policy.allows_uid(uid) {
        return Err(Denied::Uid(uid));
    }
    if !policy.allows_gid(gid) {
        return Err(Denied::Gid(gid));
    }
    if groups.is_omitted() {
        // Not read: the server stays as careful as without the policy.
        return Ok((uid, gid, Groups::OMITTED));
    }
    let kept: Vec<u32> = groups.as_slice().iter().copied().filter(|g| policy.allows_gid(*g)).collect();
    Ok((uid, gid, Groups::new(&kept)))
}

/// A credential as its file holds it: the policy and its key.
#[derive(Debug, Clone)]
pub struct CredentialFile {
    pub credential: Credential,
    pub key: Secret,
}

/// Why a credential file or a policy could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read the credential {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// Group or other may read or write it: whoever reads it acts as its
    /// users on the cluster.
    #[error(
        "the credential {path} has mode {mode:04o}: group or other may read it, and whoever reads it acts as its \
         users on the cluster; run `chmod 600 {path}`"
    )]
    Mode { path: String, mode: u32 },
    #[error("the credential {path} is damaged, line {line}: {why} (issue a new one with `dafne credential issue`)")]
    Parse { path: String, line: usize, why: String },
    #[error("cannot write the credential {path}: {source}")]
    Create { path: String, source: std::io::Error },
    #[error("the credential {path} exists already: choose another file with -o, or remove it first")]
    Exists { path: String },
    #[error("{0}")]
    Policy(String),
}

/// The first line of every credential file.
const HEADER: &str = "# dafne credential: the key below proves this policy to the cluster; keep it private (mode 0600)";

/// `first-last` or one id.
pub fn parse_range(s: &str) -> Result<IdRange, String> {
    let id = |t: &str| t.trim().parse::<u32>().map_err(|_| format!("{t:?} is not an id (0 to 4294967295)"));
    let r = match s.split_once('-') {
        Some((a, b)) => IdRange { first: id(a)?, last: id(b)? },
        None => {
            let v = id(s)?;
            IdRange { first: v, last: v }
        }
    };
    if r.first > r.last {
        return Err(format!("the range {s:?} ends before it starts (write FIRST-LAST, FIRST ≤ LAST)"));
    }
    Ok(r)
}

fn show_ranges(v: &[IdRange]) -> String {
    let one = |r: &IdRange| if r.first == r.last { r.first.to_string() } else { format!("{}-{}", r.first, r.last) };
    v.iter().map(one).collect::<Vec<_>>().join(",")
}

fn parse_ranges(s: &str) -> Result<Vec<IdRange>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let v: Vec<IdRange> = s.split(',').map(parse_range).collect::<Result<_, _>>()?;
    if v.len() > MAX_CREDENTIAL_RANGES {
        return Err(format!("{} ranges, at most {MAX_CREDENTIAL_RANGES} are allowed", v.len()));
    }
    Ok(v)
}

/// Sorted, with overlapping and adjacent ranges merged.
pub fn normalize(mut v: Vec<IdRange>) -> Vec<IdRange> {
    v.sort();
    let mut out: Vec<IdRange> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(l) if r.first <= l.last.saturating_add(1) => l.last = l.last.max(r.last),
            _ => out.push(r),
        }
    }
    out
}

/// Whether `name` may name a credential: 1..=[`MAX_CLIENT_NAME`] bytes,
/// no whitespace, control characters or `/` (it is a word in the file and
/// in commands, and the default file name `NAME.cred`).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_CLIENT_NAME {
        return Err(format!("a credential name has 1 to {MAX_CLIENT_NAME} bytes, {name:?} has {}", name.len()));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/') {
        return Err(format!("a credential name has no spaces, control characters or '/': {name:?}"));
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; SECRET_LEN]> {
    let s = s.as_bytes();
    if s.len() != 2 * SECRET_LEN {
        return None;
    }
    let mut out = [0u8; SECRET_LEN];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = std::str::from_utf8(&s[2 * i..2 * i + 2]).ok()?;
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

impl CredentialFile {
    /// Issues the credential `policy` from the cluster `secret`.
    pub fn issue(secret: &Secret, policy: Credential) -> Result<CredentialFile, CredentialError> {
        check_name(&policy.name).map_err(CredentialError::Policy)?;
        for (what, v) in [("uid", &policy.uids), ("gid", &policy.gids)] {
            if v.len() > MAX_CREDENTIAL_RANGES {
                return Err(CredentialError::Policy(format!(
                    "{} {what} ranges, at most {MAX_CREDENTIAL_RANGES} are allowed",
                    v.len()
                )));
            }
        }
        let key = secret.credential_key(&policy);
        Ok(CredentialFile { credential: policy, key })
    }

    /// The file's text: the policy, one field a line, and the key in hex.
    pub fn to_text(&self) -> String {
        let c = &self.credential;
        format!(
            "{HEADER}\nname = {}\nuids = {}\ngids = {}\nroot = {}\nkey = {}\n",
            c.name,
            show_ranges(&c.uids),
            show_ranges(&c.gids),
            if c.root { "yes" } else { "no" },
            hex(&self.key.0)
        )
    }

    /// A credential from its text (`path` names it in errors).
    pub fn parse(text: &str, path: &str) -> Result<CredentialFile, CredentialError> {
        let bad = |line: usize, why: String| CredentialError::Parse { path: path.to_string(), line, why };
        let mut fields: [Option<(usize, &str)>; 5] = [None; 5];
        const KEYS: [&str; 5] = ["name", "uids", "gids", "root", "key"];
        for (i, l) in text.lines().enumerate() {
            let n = i + 1;
            let l = l.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (k, v) = l.split_once('=').ok_or_else(|| bad(n, format!("expected KEY = VALUE, found {l:?}")))?;
            let (k, v) = (k.trim(), v.trim());
            let slot = KEYS.iter().position(|x| *x == k).ok_or_else(|| bad(n, format!("unknown field {k:?}")))?;
            if fields[slot].is_some() {
                return Err(bad(n, format!("{k} given twice")));
            }
            fields[slot] = Some((n, v));
        }
        let get = |i: usize| fields[i].ok_or_else(|| bad(0, format!("no {} field", KEYS[i])));
        let (ln, name) = get(0)?;
        check_name(name).map_err(|w| bad(ln, w))?;
        let (lu, uids) = get(1)?;
        let uids = parse_ranges(uids).map_err(|w| bad(lu, w))?;
        let (lg, gids) = get(2)?;
        let gids = parse_ranges(gids).map_err(|w| bad(lg, w))?;
        let (lr, root) = get(3)?;
        let root = match root {
            "yes" => true,
            "no" => false,
            other => return Err(bad(lr, format!("root is yes or no, not {other:?}"))),
        };
        let (lk, key) = get(4)?;
        let key = unhex(key).ok_or_else(|| bad(lk, format!("the key is {} hex digits", 2 * SECRET_LEN)))?;
        Ok(CredentialFile { credential: Credential { name: name.to_string(), uids, gids, root }, key: Secret(key) })
    }

    /// Loads the credential at `path`, refused when group or other may
    /// read or write it (the mode of the open file, as for the secret).
    pub fn load(path: &Path) -> Result<CredentialFile, CredentialError> {
        let p = path.display().to_string();
        let read = |source| CredentialError::Read { path: p.clone(), source };
        let f = std::fs::File::open(path).map_err(read)?;
        let mode = f.metadata().map_err(read)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(CredentialError::Mode { path: p, mode: mode & 0o7777 });
        }
        let mut text = String::new();
        f.take(MAX_FILE_LEN).read_to_string(&mut text).map_err(read)?;
        Self::parse(&text, &p)
    }

    /// Writes the credential to a new file `path`, mode 0600 (never over
    /// an existing file).
    pub fn write_new(&self, path: &Path) -> Result<(), CredentialError> {
        let p = path.display().to_string();
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                CredentialError::Exists { path: p.clone() }
            } else {
                CredentialError::Create { path: p.clone(), source: e }
            }
        })?;
        f.write_all(self.to_text().as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|source| CredentialError::Create { path: p, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Credential {
        Credential {
            name: "alice".into(),
            uids: vec![IdRange { first: 1000, last: 1999 }],
            gids: vec![IdRange { first: 100, last: 100 }, IdRange { first: 1000, last: 1999 }],
            root: false,
        }
    }

    #[test]
    fn a_credential_key_proves_its_policy_and_no_other() {
        let s = Secret([7; SECRET_LEN]);
        let p = policy();
        let k = s.credential_key(&p);
        assert_eq!(k.0, s.credential_key(&p.clone()).0, "derivation is deterministic");
        assert_ne!(k.0, s.0, "the key is not the cluster secret");
        let mac = k.session_mac(9, &[1; 16], "fuse@h");
        assert!(s.login_key(Some(&p)).verify_session(9, &[1; 16], "fuse@h", &mac));
        // Any change of the policy, or of the cluster, changes the key.
        let mut wider = p.clone();
        wider.uids[0].last = u32::MAX;
        let mut rooted = p.clone();
        rooted.root = true;
        let mut renamed = p.clone();
        renamed.name = "bob".into();
        for other in [wider, rooted, renamed] {
            assert!(!s.login_key(Some(&other)).verify_session(9, &[1; 16], "fuse@h", &mac), "{other:?}");
        }
        assert!(!Secret([8; SECRET_LEN]).login_key(Some(&p)).verify_session(9, &[1; 16], "fuse@h", &mac));
        // Nor does the credential's key pass as the cluster secret.
        assert!(!s.login_key(None).verify_session(9, &[1; 16], "fuse@h", &mac));
    }

    #[test]
    fn root_is_squashed_ranges_hold_and_foreign_groups_are_dropped() {
        let p = policy();
        let g = Groups::new(&[100, 5, 1500, 0]);
        assert_eq!(enforce(&p, 0, 0, &g), Ok((NOBODY, NOBODY, Groups::NONE)));
        assert_eq!(enforce(&p, 1000, 1000, &g), Ok((1000, 1000, Groups::new(&[100, 1500]))));
        assert_eq!(enforce(&p, 1999, 100, &Groups::NONE), Ok((1999, 100, Groups::NONE)));
        // Groups not read stay so: the server stays as careful.
        assert_eq!(enforce(&p, 1000, 1000, &Groups::OMITTED), Ok((1000, 1000, Groups::OMITTED)));
        assert!(matches!(enforce(&p, 2000, 1000, &g), Err(Denied::Uid(2000))));
        assert!(matches!(enforce(&p, 999, 1000, &g), Err(Denied::Uid(999))));
        assert!(matches!(enforce(&p, 1000, 0, &g), Err(Denied::Gid(0))));
        assert!(matches!(enforce(&p, NOBODY, NOBODY, &g), Err(Denied::Uid(NOBODY))));
        let root = Credential { root: true, ..p };
        assert_eq!(enforce(&root, 0, 0, &g), Ok((0, 0, g)));
        assert!(matches!(enforce(&root, 5, 5, &g), Err(Denied::Uid(5))));
    }

    #[test]
    fn the_file_round_trips_and_says_what_is_wrong() {
        let s = Secret([7; SECRET_LEN]);
        let f = CredentialFile::issue(&s, policy()).unwrap();
        let text = f.to_text();
        assert!(text.contains("uids = 1000-1999\n") && text.contains("gids = 100,1000-1999\n"), "{text}");
        assert!(!text.contains(&hex(&s.0)));
        let back = CredentialFile::parse(&text, "f").unwrap();
        assert_eq!(back.credential, f.credential);
        assert_eq!(back.key.0, f.key.0);
        for (edit, want) in [
            (text.replace("root = no", "root = maybe"), "line 5: root is yes or no"),
            (text.replace("name = alice\n", ""), "line 0: no name field"),
            (text.replace("uids = 1000-1999", "uids = 1999-1000"), "line 3: the range"),
            (format!("{text}name = bob\n"), "line 7: name given twice"),
            (format!("{text}color = red\n"), "line 7: unknown field"),
            (text.replace("key = ", "key = 00"), "line 6: the key is 64 hex digits"),
        ] {
            let e = CredentialFile::parse(&edit, "f").unwrap_err().to_string();
            assert!(e.contains(want), "{e} (wanted {want:?})");
        }
    }

    #[test]
    fn credential_files_are_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.cred");
        let f = CredentialFile::issue(&Secret([1; SECRET_LEN]), policy()).unwrap();
        f.write_new(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(matches!(f.write_new(&p), Err(CredentialError::Exists { .. })));
        assert_eq!(CredentialFile::load(&p).unwrap().credential, policy());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = CredentialFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("mode 0640") && e.contains(&format!("chmod 600 {}", p.display())), "{e}");
    }

    #[test]
    fn ranges_parse_normalize_and_names_are_words() {
        assert_eq!(parse_range("7"), Ok(IdRange { first: 7, last: 7 }));
        assert_eq!(parse_range("2000-2999"), Ok(IdRange { first: 2000, last: 2999 }));
        assert!(parse_range("x").is_err() && parse_range("5-4").is_err() && parse_range("-1").is_err());
        let r = |first, last| IdRange { first, last };
        assert_eq!(normalize(vec![r(10, 20), r(1, 3), r(4, 4), r(15, 30)]), vec![r(1, 4), r(10, 30)]);
        assert!(check_name("alice@host-1").is_ok());
        assert!(check_name("").is_err() && check_name("a b").is_err() && check_name(&"a".repeat(257)).is_err());
        assert!(check_name("../a").is_err());
    }
}
