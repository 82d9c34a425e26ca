//! `dafne credential`: per-client credentials (`dafne_auth`'s crate docs,
//! "Credentials"), issued and revoked by an admin where the cluster secret
//! is (the `dafne up` host).
//!
//! `issue` needs only the secret file: it derives the credential's key
//! and writes policy and key to a new private file (0600), never the
//! secret. `revoke` asks the running cluster's metadata server, as a
//! session proven with the secret itself, to refuse the name from now on.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use dafne_proto::{Credential, IdRange};

use crate::cluster::{self, ClusterInfo};

#[derive(Debug, clap::Subcommand)]
pub enum CredentialCmd {
    /// Issue a credential: which uids and gids a client may act as (root
    /// is squashed to nobody unless --root), written to a private file for
    /// `dafne mount --credential FILE` and `dafne cp --credential FILE`.
    Issue(IssueArgs),
    /// Revoke a credential by name: the metadata server refuses its logins
    /// from now on and ends its live sessions.
    Revoke(RevokeArgs),
}

#[derive(Debug, clap::Args)]
pub struct IssueArgs {
    /// The credential's name (what `revoke` takes; no spaces).
    pub name: String,
    /// A uid, or a range FIRST-LAST, the client may act as (repeat for more).
    #[arg(long = "uid", value_name = "UID|FIRST-LAST", value_parser = range)]
    pub uids: Vec<IdRange>,
    /// A gid, or a range FIRST-LAST, the client may act as (primary and
    /// supplementary; repeat for more).
    #[arg(long = "gid", value_name = "GID|FIRST-LAST", value_parser = range)]
    pub gids: Vec<IdRange>,
    /// Let uid 0 stay root (otherwise it acts as nobody/nogroup, 65534).
    #[arg(long)]
    pub root: bool,
    /// Where to write the credential (a new file; default NAME.cred here).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne): its secret,
    /// DIR/meta/cluster.secret, signs the credential.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The cluster secret file, if not the cluster directory's.
    #[arg(long, value_name = "FILE")]
    pub secret: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// The credential's name, as issued.
    pub name: String,
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne) of the
    /// running cluster.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

fn range(s: &str) -> Result<IdRange, String> {
    dafne_auth::parse_range(s)
}

pub fn run(cmd: CredentialCmd) -> Result<()> {
    match cmd {
        CredentialCmd::Issue(a) => issue(a),
        CredentialCmd::Revoke(a) => revoke(a),
    }
}

fn issue(a: IssueArgs) -> Result<()> {
    dafne_auth::check_name(&a.name).map_err(|e| anyhow::anyhow!("{e}"))?;
    if a.uids.is_empty() && !a.root {
        bail!("a credential needs at least one --uid UID or --uid FIRST-LAST (or --root): which users may it act as?");
    }
    if a.gids.is_empty() && !a.root {
        bail!("a credential needs at least one --gid GID or --gid FIRST-LAST (or --root): which groups may it act as?");
    }
    for (what, v) in [("--uid", &a.uids), ("--gid", &a.gids)] {
        if v.iter().any(|r| r.contains(0)) && !a.root {
            bail!("{what} includes 0 (root): pass --root to grant root, or start the range at 1");
        }
    }
    let secret_path = match &a.secret {
        Some(s) => s.clone(),
        None => cluster::resolve_dir(a.dir.as_deref())?.join("meta").join("cluster.secret"),
    };
    let secret = load_secret(&secret_path)?;
    let policy = Credential {
        name: a.name.clone(),
        uids: dafne_auth::normalize(a.uids),
        gids: dafne_auth::normalize(a.gids),
        root: a.root,
    };
    for (what, v) in [("uid", &policy.uids), ("gid", &policy.gids)] {
        if v.len() > dafne_proto::MAX_CREDENTIAL_RANGES {
            bail!(
                "{} separate {what} ranges: a credential holds at most {}; merge some",
                v.len(),
                dafne_proto::MAX_CREDENTIAL_RANGES
            );
        }
    }
    let file = dafne_auth::CredentialFile::issue(&secret, policy)?;
    let out = a.output.unwrap_or_else(|| PathBuf::from(format!("{}.cred", a.name)));
    file.write_new(&out)?;
    println!("issued credential {:?} to {} (mode 0600)", a.name, out.display());
    let c = &file.credential;
    println!("  uids: {}", show(&c.uids));
    println!("  gids: {}", show(&c.gids));
    println!("  root: {}", if c.root { "kept" } else { "squashed to nobody (65534)" });
    println!(
        "Give the file to the client host; it mounts with `dafne mount --dir CLUSTER_DIR --credential {} MOUNTPOINT` \
         (no cluster secret needed).",
        out.display()
    );
    Ok(())
}

fn show(v: &[IdRange]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    let one = |r: &IdRange| if r.first == r.last { r.first.to_string() } else { format!("{}-{}", r.first, r.last) };
    v.iter().map(one).collect::<Vec<_>>().join(", ")
}

fn load_secret(path: &Path) -> Result<dafne_auth::Secret> {
    dafne_auth::Secret::load(path).with_context(|| {
        format!(
            "issuing a credential needs the cluster secret {}: run this where the cluster was started (`dafne up`), \
             or name the secret with --secret FILE or the cluster with --dir DIR",
            path.display()
        )
    })
}

fn revoke(a: RevokeArgs) -> Result<()> {
    dafne_auth::check_name(&a.name).map_err(|e| anyhow::anyhow!("{e}"))?;
    let dir = cluster::resolve_dir(a.dir.as_deref())?;
    let info = ClusterInfo::load(&dir)?;
    let login = cluster::ClientLogin::load(&info, None)?;
    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "credential".into(),
        ucx_config: info.ucx.clone(),
        ..Default::default()
    })?;
    let meta = dafne_client::MetaSession::connect(&rt, info.meta, &login.key, "credential-revoke", 0, 0)
        .map_err(|e| cluster::explain_connect(&info, &login, e))
        .with_context(|| format!("connecting to the metadata server at {}", info.meta))?;
    meta.revoke_credential(&a.name)
        .map_err(|e| anyhow::anyhow!("the metadata server did not revoke credential {:?}: {e}", a.name))?;
    println!("revoked credential {:?}: the metadata server refuses its logins and ended its live sessions", a.name);
    Ok(())
}
