//! `dafne advise`: per-file cache advice (the Unifier paper's "semantic
//! information": cache unit size and replacement policy).
//!
//! # Why
//! A file read in small random pieces wants small cache units (less
//! read-modify-write, finer sharing), a streamed one large units (fewer
//! storage calls and RMA segments); a file scanned once wants CLOCK, whose
//! hits cost less, a re-read working set LRU. Only the application knows,
//! so it says so here, or with `setfattr -n user.dafne.cache -v
//! "unit=16k,policy=clock"` on a mount: both set the file's (or
//! directory's) `user.dafne.cache` attribute. Meta puts the advice in every
//! capability it issues for the file (at open), so it reaches each io
//! server of the stripe with every request, and the server gives it to its
//! Unifier. A directory's advice is copied to what is created in it later.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dafne_proto::{CacheAdvice, Errno, CACHE_ADVICE_XATTR};

#[derive(Debug, clap::Args)]
pub struct AdviseArgs {
    /// The file or directory: `dafne:/path`.
    pub path: String,
    /// Cache unit for the file's data on the io servers: 4k, 8k, 16k, 32k
    /// or 64k.
    #[arg(long)]
    pub unit: Option<String>,
    /// Replacement policy for the file's cached units: lru or clock.
    #[arg(long)]
    pub policy: Option<String>,
    /// Remove the advice (the io servers' defaults apply at the next open).
    #[arg(long, conflicts_with_all = ["unit", "policy"])]
    pub clear: bool,
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Log in with this per-client credential instead of the cluster secret.
    #[arg(long, value_name = "FILE")]
    pub credential: Option<PathBuf>,
}

/// The advice `--unit`/`--policy` ask for, checked before connecting.
fn wanted(a: &AdviseArgs) -> Result<Option<CacheAdvice>> {
    if a.unit.is_none() && a.policy.is_none() {
        return Ok(None);
    }
    for (flag, v) in [("--unit", &a.unit), ("--policy", &a.policy)] {
        if let Some(v) = v.as_deref().filter(|v| v.contains([',', '='])) {
            bail!("{flag} {v:?}: give one value (e.g. `--unit 16k --policy clock`), not advice text");
        }
    }
    let mut text = Vec::new();
    if let Some(u) = &a.unit {
        text.push(format!("unit={u}"));
    }
    if let Some(p) = &a.policy {
        text.push(format!("policy={p}"));
    }
    let advice = CacheAdvice::parse(text.join(",").as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Some(advice))
}

pub fn advise(a: AdviseArgs) -> Result<()> {
    let Some(path) = a.path.strip_prefix("dafne:") else {
        bail!("{}: give the file as dafne:/path (e.g. `dafne advise dafne:/data --unit 16k`)", a.path);
    };
    let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    let want = wanted(&a)?;
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    let s = crate::copy::connect(&dir, "advise", a.credential.as_deref())?;
    let attr = s.meta.resolve(&path).map_err(|e| anyhow::anyhow!("dafne:{path}: {e}"))?;
    let shown = format!("dafne:{path}");
    if a.clear {
        match futures::executor::block_on(s.meta.removexattr_async(attr.ino, CACHE_ADVICE_XATTR)) {
            Ok(()) | Err(Errno::ENODATA) => {
                println!("{shown}: no advice (the io servers' defaults, from the next open)")
            }
            Err(e) => return Err(anyhow::anyhow!("{e}")).context(format!("{shown}: removing the advice")),
        }
        return Ok(());
    }
    match want {
        Some(mut advice) => {
            // A flag not given keeps what the file has (review finding:
            // `--unit 4k` on a file advised `policy=clock` dropped the
            // policy).
            let current = futures::executor::block_on(s.meta.getxattr_async(attr.ino, CACHE_ADVICE_XATTR))
                .ok()
                .and_then(|v| CacheAdvice::parse(&v).ok());
            if let Some(cur) = current {
                if a.unit.is_none() {
                    advice.unit_kib = cur.unit_kib;
                }
                if a.policy.is_none() {
                    advice.policy = cur.policy;
                }
            }
            futures::executor::block_on(s.meta.setxattr_async(
                attr.ino,
                CACHE_ADVICE_XATTR,
                advice.to_string().as_bytes(),
                0,
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("{shown}: setting the advice (the owner or root may)"))?;
            let scope = if attr.kind == dafne_proto::FileType::Directory {
                "files and directories created in it from now on"
            } else {
                "opens from now on"
            };
            println!("{shown}: {advice} (applies to {scope})");
        }
        None => match futures::executor::block_on(s.meta.getxattr_async(attr.ino, CACHE_ADVICE_XATTR)) {
            Ok(v) => println!("{shown}: {}", String::from_utf8_lossy(&v)),
            Err(Errno::ENODATA) => println!("{shown}: no advice (the io servers' defaults)"),
            Err(e) => return Err(anyhow::anyhow!("{e}")).context(format!("{shown}: reading the advice")),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(unit: Option<&str>, policy: Option<&str>) -> AdviseArgs {
        AdviseArgs {
            path: "dafne:/f".into(),
            unit: unit.map(Into::into),
            policy: policy.map(Into::into),
            clear: false,
            dir: None,
            credential: None,
        }
    }

    #[test]
    fn flags_become_the_attributes_text_or_say_what_is_wrong() {
        let a = wanted(&args(Some("16K"), Some("CLOCK"))).unwrap().unwrap();
        assert_eq!(a.to_string(), "unit=16k,policy=clock");
        assert_eq!(wanted(&args(Some("65536"), None)).unwrap().unwrap().to_string(), "unit=64k");
        assert!(wanted(&args(None, None)).unwrap().is_none());
        let e = wanted(&args(Some("12k"), None)).unwrap_err().to_string();
        assert!(e.contains("unit `12k`") && e.contains("4k, 8k, 16k, 32k or 64k"), "{e}");
        let e = wanted(&args(None, Some("mru"))).unwrap_err().to_string();
        assert!(e.contains("policy `mru`"), "{e}");
        let e = wanted(&args(Some("4k,policy=lru"), None)).unwrap_err().to_string();
        assert!(e.contains("--unit") && e.contains("one value"), "{e}");
    }
}
