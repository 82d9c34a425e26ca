//! `dafne scrub`: every io server of a running cluster reads every block it
//! stores from its device and verifies it against its checksum (io op
//! `Scrub`, in bounded slices so the servers keep serving), and this
//! prints, per server, what was checked and every bad block.
//!
//! Why only report: a bad block can be repaired only from another copy,
//! and replication (a second replica per stripe) is not built; so each bad
//! block is named with "no replica to repair from", and the exit status
//! is non-zero. Needs the cluster secret (a credential may not scrub).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct ScrubArgs {
    /// Cluster directory (default $DAFNE_HOME, else ~/.dafne).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// What one server's scrub found.
#[derive(Debug, Default)]
struct ServerScrub {
    objects: u64,
    unverified: u64,
    bytes: u64,
    bad: Vec<(u64, u64)>,
    more_bad: u64,
}

pub fn scrub(a: ScrubArgs) -> Result<()> {
    let dir = crate::cluster::resolve_dir(a.dir.as_deref())?;
    let info = crate::cluster::ClusterInfo::load(&dir)?;
    let rt = dafne_transport::Runtime::new(dafne_transport::RuntimeOptions {
        name: "scrub".into(),
        ucx_config: info.ucx.clone(),
        ..Default::default()
    })?;
    let login = crate::cluster::ClientLogin::load(&info, None)?;
    let (mut bad, mut failed) = (0u64, 0usize);
    for (i, addr) in info.io.iter().enumerate() {
        let name = format!("io-{i}");
        let r = dafne_client::data::DataClient::connect(&rt, &[*addr], &login.key)
            .map_err(|e| format!("{:#}", crate::cluster::explain_connect(&info, &login, e)))
            .and_then(|d| scrub_server(&d).map_err(|e| format!("scrub: {e}")));
        match r {
            Ok(s) => {
                let n = s.bad.len() as u64 + s.more_bad;
                bad += n;
                let unverified = match s.unverified {
                    0 => String::new(),
                    u => format!(" ({u} without checksums: written before the server had them, read unverified)"),
                };
                println!(
                    "{name} ({addr}): {} objects{unverified}, {} bytes checked, {n} bad blocks",
                    s.objects, s.bytes
                );
                for (o, off) in &s.bad {
                    match *off {
                        u64::MAX => println!(
                            "  object {o:016x}: its checksum sidecar is missing (lost): read unverified, no replica to \
                             repair from"
                        ),
                        off => println!("  bad block: object {o:016x} offset {off}: no replica to repair from"),
                    }
                }
                if s.more_bad > 0 {
                    println!("  and {} more bad blocks (see the server's log)", s.more_bad);
                }
            }
            Err(e) => {
                failed += 1;
                println!("{name} ({addr}): not scrubbed: {e}");
            }
        }
    }
    if bad > 0 {
        bail!(
            "{bad} bad blocks: reads of them answer EIO; repair needs a second replica, which dafne does not keep yet \
             (restore the files from a copy)"
        );
    }
    if failed > 0 {
        bail!("{failed} io servers could not be scrubbed");
    }
    Ok(())
}

/// Asks one server (the client's only one) for slices until it is done.
fn scrub_server(d: &dafne_client::data::DataClient) -> Result<ServerScrub, dafne_proto::Errno> {
    let mut s = ServerScrub::default();
    let mut at = (0u64, 0u64);
    loop {
        let slice = futures::executor::block_on(d.scrub_slice(0, at.0, at.1))?;
        s.objects += slice.objects;
        s.unverified += slice.unverified;
        s.bytes += slice.bytes;
        s.bad.extend(slice.bad);
        s.more_bad += slice.more_bad;
        match slice.next {
            Some(next) if next > at => at = next,
            Some(_) => return Err(dafne_proto::Errno::EPROTO), // no progress: a broken server
            None => return Ok(s),
        }
    }
}
