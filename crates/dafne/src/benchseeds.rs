//! `dafne bench seeds`: every headline experiment of the five seed papers,
//! run on this machine, printed beside the paper's figure as the same
//! ratio, with one plot per figure.
//!
//! # Why one command
//! Each seed argues for one idea with one experiment (the Unifier's cached
//! bandwidth, ORFA's server under many writers, MXBD's block access,
//! FRRWP's registration model, DAFS's user-level client, NFS/RDMA's
//! Read-Write design). dafne builds every one of those ideas, so it can
//! rerun every one of those experiments; doing so in one command keeps the
//! comparison honest (same build, same machine, same minute) and makes it
//! cheap to see which idea still pays off on today's hardware and which
//! does not. The experiments themselves live with the benchmarks they
//! belong to (`dafne_bench::io`, `benchnbd`, …); this file picks the
//! settings (a full pass and `--quick`), runs them one by one, keeps going
//! past a failed one (and fails at the end), and writes:
//!
//! * a table on stdout: experiment, quantity, ours, the paper's, why;
//! * `OUT/<figure>.svg`, one plot per figure;
//! * `OUT/seeds.json`, every report in full;
//! * with `--markdown FILE`, the table and the plots as Markdown
//!   (`docs/SEEDS.md` is made this way, with a sentence per row on why
//!   ours differs).
//!
//! No figure is asserted anywhere: this is a benchmark, not a test.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dafne_bench::seed::{Figure, Headline, Series};
use serde::Serialize;

/// Every experiment, in the order they run.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        id: "unifier-cached",
        seed: "Unifier (PVFS over InfiniBand)",
        what: "cached read and write bandwidth vs access size, normal / mmap / unifier",
        paper: "unifier 1.94× normal, 1.26× mmap at peak (figures 5–6)",
        run: unifier_cached,
    },
    Experiment {
        id: "unifier-reread",
        seed: "Unifier (PVFS over InfiniBand)",
        what: "effective cache size: re-read of a file the size of the cache",
        paper: "unifier holds more of the file than normal (figure 7)",
        run: unifier_reread,
    },
    Experiment {
        id: "unifier-aggregate",
        seed: "Unifier (PVFS over InfiniBand)",
        what: "aggregate read, 1–4 clients × 4 io servers",
        paper: "unifier 1.7× normal, 1.3× mmap at peak (figure 8)",
        run: unifier_aggregate,
    },
    Experiment {
        id: "orfa-writers",
        seed: "ORFA/ORFS/MXBD over Myrinet MX",
        what: "one server's write throughput as client processes multiply, 64 KiB writes",
        paper: "233 MB/s with 92 clients falls to 163 MB/s with 184 (figure 9)",
        run: writers,
    },
    Experiment {
        id: "block-file",
        seed: "ORFA/ORFS/MXBD over Myrinet MX",
        what: "block access (NBD) vs file access (client library), same sizes and depth",
        paper: "block about 2× file (figure 15)",
        run: block_file,
    },
    Experiment {
        id: "frrwp",
        seed: "FRRWP (fast RDMA read/write process)",
        what: "registration cost T = a·pages + b, and FRRWP (keys following the request) vs registering first",
        paper: "a = 0.77 µs/page, b = 7.42 µs; FRRWP saves T_r = 0.77·p + 7.42 µs per request",
        run: registration,
    },
    Experiment {
        id: "dafs",
        seed: "DAFS (user-level file system)",
        what: "bandwidth and client CPU vs block size, and PostMark: user-level client vs the kernel path (FUSE mount)",
        paper: "user level 2–3× at small blocks with lower CPU (figures 3–4); PostMark more than 2× (figure 6)",
        run: dafs,
    },
    Experiment {
        id: "nfs-rdma-designs",
        seed: "NFS over RDMA (OpenSolaris)",
        what: "multi-threaded 128 KiB reads: Read-Read vs Read-Write, and the registration cache on and off",
        paper: "RW slightly better than RR with less CPU; registration cache 350 → 700 MB/s",
        run: designs,
    },
];

/// One experiment of the table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Experiment {
    pub id: &'static str,
    pub seed: &'static str,
    pub what: &'static str,
    /// The paper's figure, in words.
    pub paper: &'static str,
    #[serde(skip)]
    pub run: fn(&Experiment, &SeedsBench, Instant) -> Result<Run>,
}

#[derive(Debug, clap::Args)]
pub struct SeedsBench {
    /// A short pass of every experiment (a few minutes in all).
    #[arg(long)]
    pub quick: bool,
    /// Run only these experiments (comma-separated ids; `--list` names them).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// List the experiments and exit.
    #[arg(long)]
    pub list: bool,
    /// Where the plots (one SVG per figure) and `seeds.json` go.
    #[arg(long, default_value = "bench-results/seeds")]
    pub out: PathBuf,
    /// Also write the table and the plots as Markdown to this file (the
    /// plots are linked relative to it, so put `--out` beside it, e.g.
    /// `--markdown docs/SEEDS.md --out docs/seeds`).
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Scratch directory for the experiments with io servers alone (their
    /// chunk files; the re-read test needs a file system with a page cache
    /// it can drop, not tmpfs).
    #[arg(long, default_value = "/tmp")]
    pub scratch: PathBuf,
    /// Scratch directory for the experiments that start a whole cluster
    /// (tmpfs measures the data path rather than a disk).
    #[arg(long, default_value = "/dev/shm")]
    pub cluster_scratch: PathBuf,
}

/// What one experiment gave.
#[derive(Debug, Serialize)]
struct Outcome {
    experiment: Experiment,
    seconds: f64,
    figures: Vec<Figure>,
    headlines: Vec<Headline>,
    /// The experiment's own report, in full.
    report: serde_json::Value,
    /// Why it gave nothing, if it failed.
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct SeedsReport {
    machine: String,
    /// `release` or `debug`: debug builds move small requests several
    /// times slower, so a page says which made it.
    build: &'static str,
    quick: bool,
    outcomes: Vec<Outcome>,
}

/// The build profile of this executable.
fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// An experiment's figures, headlines and full report.
pub type Run = (Vec<Figure>, Vec<Headline>, serde_json::Value);

fn io_options(a: &SeedsBench, tables: dafne_bench::io::Tables) -> Result<dafne_bench::io::Options> {
    let q = a.quick;
    let k = 1usize << 10;
    Ok(dafne_bench::io::Options {
        modes: vec![
            dafne_io::server::ServingMode::Normal,
            dafne_io::server::ServingMode::Mmap,
            dafne_io::server::ServingMode::Unifier,
        ],
        sizes: if q { vec![4 * k, 64 * k, 1024 * k] } else { vec![4 * k, 16 * k, 64 * k, 128 * k, 256 * k, 1024 * k] },
        window: 8,
        duration: Duration::from_secs_f64(if q { 0.1 } else { 0.5 }),
        file_size: 8 << 20,
        cache_mib: 64,
        reread_cache_mib: if q { 8 } else { 32 },
        reread_ratios: vec![0.5, 1.0, 2.0],
        reread_size: 128 << 10,
        servers: vec![4],
        scaling_cache_mib: 48,
        clients: vec![1, 2, 4],
        scaling_duration: Duration::from_secs_f64(if q { 0.1 } else { 0.3 }),
        scaling_file: 8 << 20,
        program: std::env::current_exe().context("locating the dafne executable")?,
        scratch: a.scratch.clone(),
        storage: dafne_io::chunk::StorageMode::Auto,
        tables,
    })
}

fn progress(id: &str, started: Instant) -> impl FnMut(&str) + '_ {
    move |what: &str| eprintln!("[{:>6.1}s] {id}: {what}", started.elapsed().as_secs_f64())
}

fn unifier(
    e: &Experiment,
    a: &SeedsBench,
    started: Instant,
    tables: dafne_bench::io::Tables,
) -> Result<dafne_bench::io::Report> {
    dafne_bench::io::run(&io_options(a, tables)?, progress(e.id, started))
}

fn unifier_cached(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    use dafne_bench::io::{seed as u, Tables};
    let r = unifier(e, a, started, Tables { cached: true, cpu: true, ..Tables::NONE })?;
    Ok((u::cached_figures(&r), u::cached_headlines(&r), serde_json::to_value(&r)?))
}

fn unifier_reread(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    use dafne_bench::io::{seed as u, Tables};
    let r = unifier(e, a, started, Tables { reread: true, ..Tables::NONE })?;
    Ok((u::reread_figures(&r), u::reread_headlines(&r), serde_json::to_value(&r)?))
}

fn unifier_aggregate(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    use dafne_bench::io::{seed as u, Tables};
    let r = unifier(e, a, started, Tables { scaling: true, ..Tables::NONE })?;
    Ok((u::scaling_figures(&r), u::scaling_headlines(&r), serde_json::to_value(&r)?))
}

fn block_file(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    let nbd = crate::benchnbd::NbdBench {
        sizes: if a.quick { vec!["4K".into(), "1M".into()] } else { vec!["4K".into(), "64K".into(), "1M".into()] },
        depth: 8,
        seconds: 2.0,
        file_size: "256M".into(),
        quick: a.quick,
        scratch: a.cluster_scratch.clone(),
        json: PathBuf::new(),
    };
    let mut p = progress(e.id, started);
    let r = crate::benchnbd::measure(&nbd, crate::parse_size, |line| p(line))?;
    Ok((block_file_figures(&r), block_file_headlines(&r), serde_json::to_value(&r)?))
}

fn writers(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    let mut o = if a.quick {
        dafne_bench::writers::Options { duration: Duration::from_secs(1), ..dafne_bench::writers::Options::quick() }
    } else {
        dafne_bench::writers::Options::default()
    };
    o.scratch = a.scratch.clone();
    let r = dafne_bench::writers::run(&o, progress(e.id, started))?;
    Ok((vec![r.figure()], r.headlines(), serde_json::to_value(&r)?))
}

fn registration(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    let mut o = if a.quick {
        dafne_bench::registration::Options::quick()
    } else {
        dafne_bench::registration::Options::default()
    };
    o.scratch = a.scratch.clone();
    let r = dafne_bench::registration::run(&o, progress(e.id, started))?;
    Ok((r.figures(), r.headlines(), serde_json::to_value(&r)?))
}

fn dafs(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    let mut o = if a.quick { crate::benchdafs::Options::quick() } else { crate::benchdafs::Options::full() };
    o.scratch = a.cluster_scratch.clone();
    let p = std::cell::RefCell::new(progress(e.id, started));
    let r = crate::benchdafs::run(&o, &|what| (p.borrow_mut())(what))?;
    Ok((r.figures(), r.headlines(), serde_json::to_value(&r)?))
}

fn designs(e: &Experiment, a: &SeedsBench, started: Instant) -> Result<Run> {
    let o = if a.quick { dafne_bench::designs::Options::quick() } else { dafne_bench::designs::Options::default() };
    let r = dafne_bench::designs::run(&o, progress(e.id, started))?;
    Ok((r.figures(), r.headlines(), serde_json::to_value(&r)?))
}

fn block_file_figures(r: &crate::benchnbd::Report) -> Vec<Figure> {
    ["read", "write"]
        .into_iter()
        .map(|op| {
            let rows: Vec<_> = r.rows.iter().filter(|row| row.op == op).collect();
            Figure {
                id: format!("block-file-{op}"),
                title: format!("Random {op}s, {} in flight: block (NBD) vs file (client library)", r.depth),
                x_label: "access size (bytes)".into(),
                y_label: "MiB/s".into(),
                log_x: true,
                // 4 KiB and 1 MiB requests differ by two decades.
                log_y: true,
                series: vec![
                    Series {
                        name: "block (NBD)".into(),
                        points: rows.iter().map(|x| (x.size as f64, x.block.mib_s)).collect(),
                    },
                    Series {
                        name: "file".into(),
                        points: rows.iter().map(|x| (x.size as f64, x.file.mib_s)).collect(),
                    },
                ],
            }
        })
        .collect()
}

/// Block over file access at the smallest and the largest size measured.
/// The paper compares MXBD with ORFS, both in the kernel, file access
/// going through the page cache; here block access is NBD over TCP to a
/// separate process and file access the zero-copy client library, so the
/// why says which side won and what each side is.
fn block_file_headlines(r: &crate::benchnbd::Report) -> Vec<Headline> {
    let sizes: Vec<usize> = {
        let mut v: Vec<usize> = r.rows.iter().map(|x| x.size).collect();
        v.sort_unstable();
        v.dedup();
        match (v.first(), v.last()) {
            (Some(&a), Some(&b)) if a != b => vec![a, b],
            (Some(&a), _) => vec![a],
            _ => Vec::new(),
        }
    };
    r.rows
        .iter()
        .filter(|x| sizes.contains(&x.size))
        .map(|x| {
            // One run per cell, no rounds: within 10% is called a tie.
            let side = if (x.ratio - 1.0).abs() <= 0.1 {
                format!(
                    "the two were within 10% of each other ({:.0} vs {:.0} MiB/s), which one run on this machine \
                     does not tell apart",
                    x.block.mib_s, x.file.mib_s
                )
            } else if x.ratio > 1.0 {
                format!(
                    "NBD was faster at this size ({:.0} vs {:.0} MiB/s); these figures do not show why",
                    x.block.mib_s, x.file.mib_s
                )
            } else {
                format!(
                    "the library was faster ({:.0} vs {:.0} MiB/s); the NBD server process spent {:.0} µs of CPU \
                     per request on top of the same io path",
                    x.file.mib_s, x.block.mib_s, x.server_cpu_us_per_op
                )
            };
            Headline {
                paper_text: Some("about 2× (\"twice the throughput\")".into()),
                quantity: format!("block / file, {} random {}s, {} in flight", human(x.size), x.op, r.depth),
                ours: x.ratio,
                paper: 2.0,
                unit: "×".into(),
                why: format!(
                    "The paper's file access went through ORFS and the kernel's page cache, its block access through \
                     MXBD's pipelined block layer; here file access is dafne's client library, already asynchronous \
                     and zero-copy, and block access goes through NBD over TCP to a separate server process that \
                     uses the same library: {side}."
                ),
            }
        })
        .collect()
}

fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// A number as the table shows it.
fn num(v: f64) -> String {
    if v.is_nan() {
        // A headline whose paper gives no number for it.
        "—".into()
    } else if !v.is_finite() {
        "∞".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v == 0.0 || v.abs() >= 0.1 {
        format!("{v:.2}")
    } else {
        // Three significant digits for small constants (µs per page).
        let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
        format!("{v:.digits$}")
    }
}

fn with_unit(v: f64, unit: &str) -> String {
    if v.is_nan() {
        num(v)
    } else if unit == "×" {
        format!("{}×", num(v))
    } else {
        format!("{} {unit}", num(v))
    }
}

/// The paper's figure as the table shows it: its words where it gave
/// words, else the number.
fn paper_shown(h: &Headline) -> String {
    match &h.paper_text {
        Some(t) => t.clone(),
        None => with_unit(h.paper, &h.unit),
    }
}

fn selected(a: &SeedsBench) -> Result<Vec<&'static Experiment>> {
    if a.only.is_empty() {
        return Ok(EXPERIMENTS.iter().collect());
    }
    let mut ids: Vec<&str> = Vec::new();
    for id in &a.only {
        if !ids.contains(&id.trim()) {
            ids.push(id.trim());
        }
    }
    ids.into_iter()
        .map(|id| {
            let id = id.trim();
            EXPERIMENTS.iter().find(|e| e.id == id).with_context(|| {
                let ids: Vec<&str> = EXPERIMENTS.iter().map(|e| e.id).collect();
                format!("--only: no experiment {id:?}; the experiments are {}", ids.join(", "))
            })
        })
        .collect()
}

/// The table and the plots as Markdown; plots linked relative to `doc`.
fn markdown(r: &SeedsReport, out: &Path, doc: &Path) -> String {
    let rel = relative(out, doc.parent().unwrap_or(Path::new(".")));
    let only: Vec<&str> = r.outcomes.iter().map(|o| o.experiment.id).collect();
    let command = format!(
        "dafne bench seeds{}{} --out {} --markdown {}",
        if r.quick { " --quick" } else { "" },
        if only.len() == EXPERIMENTS.len() { String::new() } else { format!(" --only {}", only.join(",")) },
        out.display(),
        doc.display()
    );
    let mut s = format!(
        "# The seeds' experiments on dafne\n\n\
         Each seed paper argues for its idea with one experiment. dafne builds those ideas, so it reruns those \
         experiments: this file is written by `{command}` (run from the repository root), which measures each \
         one on this machine and sets ours beside the paper's figure as the same quantity. No number here is \
         typed by hand; the plots are drawn from the same run. Every server, client and tool of a run shares the \
         machine's cores, and the machine is shared with other work, so each figure is one run's and moves from \
         run to run (the experiments' own sections in docs/BENCHMARKS.md give spreads over several runs); the \
         reports in full are in `{}/seeds.json` when the command ran. Where the paper states a figure in words \
         (\"2–3×\", \"slightly better\"), the table quotes the words.\n\n\
         Machine: {}. Build: {}. Pass: {}.\n\n\
         | experiment (seed) | quantity | ours | the paper's | why they differ |\n|---|---|---|---|---|\n",
        out.display(),
        r.machine,
        r.build,
        if r.quick { "`--quick` (short cells)" } else { "full" }
    );
    for o in &r.outcomes {
        let e = &o.experiment;
        if let Some(err) = &o.error {
            s.push_str(&format!("| {} ({}) | — | failed: {} | {} | |\n", e.id, e.seed, err.replace('|', "/"), e.paper));
            continue;
        }
        let mut last_why = None;
        for h in &o.headlines {
            let why = if last_why == Some(&h.why) { "as above" } else { h.why.as_str() };
            last_why = Some(&h.why);
            s.push_str(&format!(
                "| {} ({}) | {} | {} | {} | {} |\n",
                e.id,
                e.seed,
                h.quantity,
                with_unit(h.ours, &h.unit),
                paper_shown(h),
                why
            ));
        }
    }
    s.push('\n');
    for o in &r.outcomes {
        let e = &o.experiment;
        s.push_str(&format!(
            "### {}: {}\n\nSeed: {}. The paper: {}. Took {:.0} s.\n\n",
            e.id, e.what, e.seed, e.paper, o.seconds
        ));
        for f in &o.figures {
            s.push_str(&format!("![{}]({})\n", f.title, rel.join(format!("{}.svg", f.id)).display()));
        }
        s.push('\n');
    }
    s
}

/// `target` relative to `base` when it lies under it, else as given.
fn relative(target: &Path, base: &Path) -> PathBuf {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (t, b) = (abs(target), abs(base));
    t.strip_prefix(&b).map(Path::to_path_buf).unwrap_or(t)
}

pub fn run(a: SeedsBench) -> Result<()> {
    if a.list {
        for e in EXPERIMENTS {
            println!("{:<20} {} — {} (the paper: {})", e.id, e.seed, e.what, e.paper);
        }
        return Ok(());
    }
    let chosen = selected(&a)?;
    // Mistakes that would only show after minutes of measuring, first.
    for (flag, dir) in [("--scratch", &a.scratch), ("--cluster-scratch", &a.cluster_scratch)] {
        if !dir.is_dir() {
            bail!("{flag} {}: no such directory (give an existing one; it is only written inside)", dir.display());
        }
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    if let Some(doc) = &a.markdown {
        // Opened to append, so an existing page stays whole until the run
        // has its replacement.
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(doc)
            .with_context(|| format!("--markdown {}: cannot write there", doc.display()))?;
    }
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for e in chosen {
        eprintln!("[{:>6.1}s] {}: {} ({})", started.elapsed().as_secs_f64(), e.id, e.what, e.seed);
        let t = Instant::now();
        let (figures, headlines, report, error) = match (e.run)(e, &a, started) {
            Ok((f, h, r)) => (f, h, r, None),
            Err(err) => {
                eprintln!("[{:>6.1}s] {}: failed: {err:#}", started.elapsed().as_secs_f64(), e.id);
                (Vec::new(), Vec::new(), serde_json::Value::Null, Some(format!("{err:#}")))
            }
        };
        for f in &figures {
            let path = a.out.join(format!("{}.svg", f.id));
            std::fs::write(&path, dafne_bench::plot::svg(f)).with_context(|| format!("writing {}", path.display()))?;
        }
        outcomes.push(Outcome {
            experiment: *e,
            seconds: t.elapsed().as_secs_f64(),
            figures,
            headlines,
            report,
            error,
        });
    }
    let report =
        SeedsReport { machine: dafne_bench::transport::machine(), build: build_profile(), quick: a.quick, outcomes };

    println!("machine: {} ({} build)", report.machine, report.build);
    let width =
        report.outcomes.iter().flat_map(|o| &o.headlines).map(|h| h.quantity.chars().count()).max().unwrap_or(8);
    println!("\n{:<18} | {:<width$} | {:>12} | paper", "experiment", "quantity", "ours");
    println!("{}", "-".repeat(18 + width + 12 + 20));
    for o in &report.outcomes {
        if let Some(err) = &o.error {
            println!("{:<18} | FAILED: {err}", o.experiment.id);
        }
        for h in &o.headlines {
            println!(
                "{:<18} | {:<width$} | {:>12} | {}",
                o.experiment.id,
                h.quantity,
                with_unit(h.ours, &h.unit),
                paper_shown(h)
            );
        }
        if o.error.is_none() && o.headlines.is_empty() {
            println!("{:<18} | (no headline: the run gave too few points)", o.experiment.id);
        }
    }
    let json = a.out.join("seeds.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    println!("\nplots and JSON in {} ({:.0} s in all)", a.out.display(), started.elapsed().as_secs_f64());
    if let Some(doc) = &a.markdown {
        std::fs::write(doc, markdown(&report, &a.out, doc)).with_context(|| format!("writing {}", doc.display()))?;
        println!("Markdown: {}", doc.display());
    }
    let failed: Vec<&str> = report.outcomes.iter().filter(|o| o.error.is_some()).map(|o| o.experiment.id).collect();
    if !failed.is_empty() {
        bail!("{} experiment(s) failed: {} (their errors are above)", failed.len(), failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(only: &[&str]) -> SeedsBench {
        SeedsBench {
            quick: true,
            only: only.iter().map(|s| s.to_string()).collect(),
            list: false,
            out: PathBuf::from("o"),
            markdown: None,
            scratch: PathBuf::from("/tmp"),
            cluster_scratch: PathBuf::from("/dev/shm"),
        }
    }

    #[test]
    fn only_names_known_experiments_and_says_which_exist() {
        assert_eq!(selected(&args(&[])).unwrap().len(), EXPERIMENTS.len());
        assert_eq!(selected(&args(&["block-file"])).unwrap()[0].id, "block-file");
        let e = selected(&args(&["nope"])).unwrap_err().to_string();
        assert!(e.contains("\"nope\"") && e.contains("unifier-cached"), "{e}");
    }

    #[test]
    fn numbers_keep_three_significant_digits_when_small() {
        assert_eq!(num(0.0038), "0.00380");
        assert_eq!(num(0.77), "0.77");
        assert_eq!(num(7.42), "7.42");
        assert_eq!(num(233.4), "233");
        assert_eq!(num(0.0), "0.00");
        assert_eq!(num(f64::NAN), "—");
        assert_eq!(with_unit(1.5, "×"), "1.50×");
    }

    #[test]
    fn a_repeated_id_runs_once_and_a_missing_scratch_is_refused_before_anything_runs() {
        let chosen = selected(&args(&["block-file", " block-file"])).unwrap();
        assert_eq!(chosen.len(), 1);
        let mut a = args(&["block-file"]);
        a.scratch = PathBuf::from("/nonexistent-dafne-seeds-test");
        let e = run(a).unwrap_err().to_string();
        assert!(e.contains("--scratch") && e.contains("no such directory"), "{e}");
        assert!(!Path::new("/nonexistent-dafne-seeds-test").exists());
    }

    fn nbd_row(size: usize, op: &'static str, block: f64, file: f64) -> crate::benchnbd::Row {
        use crate::benchnbd::{Cell, Row};
        Row {
            size,
            op,
            block: Cell { mib_s: block, iops: 0.0 },
            file: Cell { mib_s: file, iops: 0.0 },
            server_cpu_us_per_op: 10.0,
            ratio: block / file,
        }
    }

    #[test]
    fn block_file_rows_are_the_smallest_and_largest_sizes_and_say_who_won() {
        let r = crate::benchnbd::Report {
            machine: "m".into(),
            io_servers: 4,
            file_size: 1 << 30,
            depth: 8,
            seconds: 1.0,
            rows: vec![
                nbd_row(4096, "read", 160.0, 100.0),
                nbd_row(65536, "read", 1.0, 1.0),
                nbd_row(1 << 20, "read", 100.0, 250.0),
            ],
        };
        let h = block_file_headlines(&r);
        assert_eq!(h.len(), 2, "{h:?}");
        assert!((h[0].ours - 1.6).abs() < 1e-9 && h[0].why.contains("NBD was faster"), "{:?}", h[0]);
        assert!((h[1].ours - 0.4).abs() < 1e-9 && h[1].why.contains("the library was faster"), "{:?}", h[1]);
        let tie = crate::benchnbd::Report { rows: vec![nbd_row(4096, "write", 98.0, 100.0)], ..r };
        assert!(block_file_headlines(&tie)[0].why.contains("within 10%"), "{:?}", block_file_headlines(&tie));
        assert_eq!(paper_shown(&h[0]), "about 2× (\"twice the throughput\")");
    }

    #[test]
    fn experiment_ids_are_unique() {
        let mut ids: Vec<&str> = EXPERIMENTS.iter().map(|e| e.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), EXPERIMENTS.len());
    }

    #[test]
    fn markdown_has_a_row_per_headline_and_links_the_plots_beside_the_doc() {
        let r = SeedsReport {
            machine: "m".into(),
            build: "debug",
            quick: true,
            outcomes: vec![Outcome {
                experiment: EXPERIMENTS[0],
                seconds: 1.0,
                figures: vec![Figure {
                    id: "fig".into(),
                    title: "t".into(),
                    x_label: "x".into(),
                    y_label: "y".into(),
                    log_x: false,
                    log_y: false,
                    series: vec![],
                }],
                headlines: vec![Headline {
                    paper_text: None,
                    quantity: "q".into(),
                    ours: 1.5,
                    paper: 1.94,
                    unit: "×".into(),
                    why: "because".into(),
                }],
                report: serde_json::Value::Null,
                error: None,
            }],
        };
        let md = markdown(&r, Path::new("docs/seeds"), Path::new("docs/SEEDS.md"));
        assert!(md.contains("| 1.50× | 1.94× | because |"), "{md}");
        assert!(md.contains("](seeds/fig.svg)"), "{md}");
        let beside = markdown(&r, Path::new("docs"), Path::new("docs/SEEDS.md"));
        assert!(beside.contains("](fig.svg)"), "{beside}");
    }
}
