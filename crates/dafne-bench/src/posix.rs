//! The workloads of `dafne bench posix` (issue 9, item 8): fio and PostMark
//! rows as unmodified programs run them, and what is measured around them.
//!
//! # Why a ceiling and CPU per GB
//! A FUSE file system cannot be faster than FUSE itself on the same machine.
//! `bindfs --multithreaded` over a tmpfs directory is a FUSE daemon whose
//! storage costs nearly nothing, so the same row on it is the ceiling the
//! kernel's FUSE path allows here; dafne's figure divided by it says how much
//! of that path dafne uses, whatever the machine's speed. Bandwidth alone
//! hides what a figure costs: the CPU seconds the serving processes spend per
//! GB moved (utime + stime from `/proc/PID/stat`, before and after a row) say
//! how much of the machine each system needs for it, and on a shared 2-core
//! machine they are the steadier number.
//!
//! # What lives here
//! Only what knows the tools and `/proc`: the rows and their exact fio
//! arguments, the PostMark configuration, parsers for fio's JSON and
//! PostMark's text (tested on trimmed real outputs in `testdata/`), CPU
//! time of a process, medians, and the report with its table. Starting the
//! cluster, the mounts and the processes is the `dafne` binary's job
//! (`crates/dafne/src/benchposix.rs`).

use std::path::Path;

use serde::Serialize;

/// Why a part of the benchmark could not measure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PosixError {
    /// A program a row runs is not installed.
    #[error(
        "`{program}` is not installed: install the Debian package `{package}` \
         (scripts/install-deps.sh installs it with the rest)"
    )]
    ToolMissing { program: &'static str, package: &'static str },
    /// fio's output is not the JSON report it prints with `--output-format=json`.
    #[error("fio's output is not its JSON report ({reason}); it began: {start:?}")]
    FioOutput { reason: String, start: String },
    /// fio ran but a job reported an error.
    #[error("fio job {job:?} failed with error {code}")]
    FioJob { job: String, code: i64 },
    /// PostMark's output lacks a figure the report needs.
    #[error("PostMark's output has no {what}; it said:\n{output}")]
    PostmarkOutput { what: &'static str, output: String },
    /// `/proc/PID/stat` could not be read (the process is gone?).
    #[error("reading /proc/{pid}/stat")]
    ProcStat {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    /// `/proc/PID/stat` is not in the kernel's format.
    #[error("/proc/{pid}/stat is not in the expected format: {text:?}")]
    ProcStatFormat { pid: u32, text: String },
}

/// A program the benchmark runs, with the Debian package that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Fio,
    Postmark,
    Bindfs,
}

impl Tool {
    pub fn program(self) -> &'static str {
        match self {
            Tool::Fio => "fio",
            Tool::Postmark => "postmark",
            Tool::Bindfs => "bindfs",
        }
    }

    pub fn package(self) -> &'static str {
        // The packages have the programs' names on Debian 12.
        self.program()
    }

    /// Whether the program is on `PATH`; else the error that says what to install.
    pub fn check(self) -> Result<(), PosixError> {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| is_executable(&d.join(self.program()))))
            .unwrap_or(false);
        if found {
            Ok(())
        } else {
            Err(PosixError::ToolMissing { program: self.program(), package: self.package() })
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// One row of the table: a workload every system runs the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Row {
    SeqWrite1,
    SeqWrite4,
    SeqRead1,
    SeqRead4,
    RandRead1Qd16,
    RandRead4,
    Postmark,
}

/// What a row's figure counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Unit {
    /// 2^20 bytes per second (fio's `bw_bytes`).
    MibPerS,
    /// Operations per second (fio's `iops`).
    Iops,
    /// PostMark transactions per second of the whole run (creation,
    /// transactions and deletion), timed by this benchmark's clock.
    TxPerS,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Unit::MibPerS => "MiB/s",
            Unit::Iops => "IOPS",
            Unit::TxPerS => "tx/s",
        }
    }
}

impl Row {
    pub const ALL: [Row; 7] = [
        Row::SeqWrite1,
        Row::SeqWrite4,
        Row::SeqRead1,
        Row::SeqRead4,
        Row::RandRead1Qd16,
        Row::RandRead4,
        Row::Postmark,
    ];

    /// The name `--rows` takes and the JSON uses.
    pub fn id(self) -> &'static str {
        match self {
            Row::SeqWrite1 => "seq-write-1",
            Row::SeqWrite4 => "seq-write-4",
            Row::SeqRead1 => "seq-read-1",
            Row::SeqRead4 => "seq-read-4",
            Row::RandRead1Qd16 => "randread-qd16",
            Row::RandRead4 => "randread-4",
            Row::Postmark => "postmark",
        }
    }

    pub fn parse(s: &str) -> Option<Row> {
        Row::ALL.into_iter().find(|r| r.id() == s)
    }

    /// What the table's first column says.
    pub fn label(self) -> &'static str {
        match self {
            Row::SeqWrite1 => "seq write 128 KiB, 1 job (psync)",
            Row::SeqWrite4 => "seq write 128 KiB, 4 jobs (psync)",
            Row::SeqRead1 => "seq read 128 KiB, 1 job (psync)",
            Row::SeqRead4 => "seq read 128 KiB, 4 jobs (psync)",
            Row::RandRead1Qd16 => "rand read 4 KiB, 1 job, libaio qd16",
            Row::RandRead4 => "rand read 4 KiB, 4 jobs (psync)",
            Row::Postmark => "PostMark",
        }
    }

    pub fn unit(self) -> Unit {
        match self {
            Row::SeqWrite1 | Row::SeqWrite4 | Row::SeqRead1 | Row::SeqRead4 => Unit::MibPerS,
            Row::RandRead1Qd16 | Row::RandRead4 => Unit::Iops,
            Row::Postmark => Unit::TxPerS,
        }
    }

    /// fio jobs (each its own file of `--size`); 0 for PostMark.
    pub fn jobs(self) -> usize {
        match self {
            Row::SeqWrite1 | Row::SeqRead1 | Row::RandRead1Qd16 => 1,
            Row::SeqWrite4 | Row::SeqRead4 | Row::RandRead4 => 4,
            Row::Postmark => 0,
        }
    }

    /// Whether the interception library (`LD_PRELOAD`) runs this row too:
    /// every fio row whose engine calls the C library's read and write
    /// (psync); libaio submits through `io_submit`, which no preload
    /// library sees, and PostMark is left to the mount.
    pub fn has_preload(self) -> bool {
        !matches!(self, Row::RandRead1Qd16 | Row::Postmark)
    }

    /// Whether the native client (no kernel) runs this row too: sequential
    /// 128 KiB one at a time, as fio's one psync job does.
    pub fn has_native(self) -> bool {
        matches!(self, Row::SeqWrite1 | Row::SeqRead1)
    }

    /// The fio command line of this row in `dir` (None for PostMark). Each
    /// job `N` uses the file `f.N`, which `layout_args` wrote beforehand,
    /// so reads never include fio's own layout and writes overwrite the
    /// same files on every system.
    pub fn fio_args(self, dir: &Path, size: u64, runtime_s: u64) -> Option<Vec<String>> {
        let (rw, bs, engine, depth) = match self {
            Row::SeqWrite1 | Row::SeqWrite4 => ("write", "128k", "psync", 1),
            Row::SeqRead1 | Row::SeqRead4 => ("read", "128k", "psync", 1),
            Row::RandRead1Qd16 => ("randread", "4k", "libaio", 16),
            Row::RandRead4 => ("randread", "4k", "psync", 1),
            Row::Postmark => return None,
        };
        let mut args = common_fio_args(self.id(), dir, size, self.jobs());
        args.extend([
            format!("--rw={rw}"),
            format!("--bs={bs}"),
            format!("--ioengine={engine}"),
            format!("--iodepth={depth}"),
            // A row stops at --size or after this long, whichever is first
            // (4 KiB random reads of 4 GiB would take minutes on a FUSE mount).
            format!("--runtime={runtime_s}"),
        ]);
        Some(args)
    }
}

fn common_fio_args(name: &str, dir: &Path, size: u64, jobs: usize) -> Vec<String> {
    vec![
        format!("--name={name}"),
        format!("--directory={}", dir.display()),
        "--filename_format=f.$jobnum".into(),
        format!("--size={size}"),
        format!("--numjobs={jobs}"),
        "--direct=1".into(),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ]
}

/// fio arguments that write the files `f.0` .. `f.{jobs-1}` of `size` in
/// `dir` (1 MiB direct writes), before any row is measured.
pub fn layout_args(dir: &Path, size: u64, jobs: usize) -> Vec<String> {
    let mut args = common_fio_args("layout", dir, size, jobs);
    args.extend(["--rw=write".into(), "--bs=1m".into(), "--ioengine=psync".into()]);
    args
}

/// What one fio run reported, summed over its jobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FioResult {
    pub version: String,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Bandwidth, bytes per second (read + write).
    pub bw_bytes: f64,
    /// Operations per second (read + write).
    pub iops: f64,
    /// The longest job group's run time, milliseconds.
    pub runtime_ms: u64,
}

impl FioResult {
    pub fn bytes(&self) -> u64 {
        self.read_bytes + self.write_bytes
    }
}

/// Parses fio's `--output-format=json` report. fio prints notes (e.g.
/// "note: both iodepth >= 1 and synchronous I/O engine are selected") on
/// stdout before the JSON; they are skipped.
pub fn parse_fio(text: &str) -> Result<FioResult, PosixError> {
    let bad = |reason: String| PosixError::FioOutput { reason, start: text.chars().take(200).collect() };
    let start = text
        .match_indices('{')
        .map(|(i, _)| i)
        .find(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n')
        .ok_or_else(|| bad("no line starts with `{`".into()))?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).map_err(|e| bad(e.to_string()))?;
    let version = v["fio version"].as_str().unwrap_or("").to_string();
    let jobs = v["jobs"].as_array().filter(|j| !j.is_empty()).ok_or_else(|| bad("no `jobs`".into()))?;
    let mut r = FioResult { version, read_bytes: 0, write_bytes: 0, bw_bytes: 0.0, iops: 0.0, runtime_ms: 0 };
    for job in jobs {
        let name = job["jobname"].as_str().unwrap_or("?").to_string();
        let code = job["error"].as_i64().ok_or_else(|| bad(format!("job {name:?} has no `error`")))?;
        if code != 0 {
            return Err(PosixError::FioJob { job: name, code });
        }
        for (dir, bytes) in [("read", &mut r.read_bytes), ("write", &mut r.write_bytes)] {
            let d = &job[dir];
            let field = |k: &str| d[k].as_f64().ok_or_else(|| bad(format!("job {name:?} has no {dir}.{k}")));
            *bytes += field("io_bytes")? as u64;
            r.bw_bytes += field("bw_bytes")?;
            r.iops += field("iops")?;
            r.runtime_ms = r.runtime_ms.max(field("runtime")? as u64);
        }
    }
    Ok(r)
}

/// PostMark's settings (issue 9: 1000 files of 4–64 KiB, 20,000
/// transactions, 10 subdirectories; read and write sizes stay PostMark's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PostmarkSettings {
    pub files: u32,
    pub min_size: u32,
    pub max_size: u32,
    pub transactions: u32,
    pub subdirectories: u32,
}

impl PostmarkSettings {
    pub fn issue9(transactions: u32) -> PostmarkSettings {
        PostmarkSettings { files: 1000, min_size: 4096, max_size: 65536, transactions, subdirectories: 10 }
    }

    /// The configuration file PostMark reads (`postmark FILE`).
    pub fn config(&self, location: &Path) -> String {
        format!(
            "set location {}\nset number {}\nset size {} {}\nset transactions {}\nset subdirectories {}\nrun\nquit\n",
            location.display(),
            self.files,
            self.min_size,
            self.max_size,
            self.transactions,
            self.subdirectories
        )
    }
}

/// What PostMark printed. Its clock counts whole seconds, so the rate in
/// the table comes from this benchmark's clock; these are kept in the JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PostmarkResult {
    pub seconds_total: u64,
    pub seconds_transactions: u64,
    /// PostMark's own transactions per second (0 when it ran under a second).
    pub transactions_per_s: u64,
    pub files_created: u64,
    /// PostMark's "megabytes" are 2^20 bytes (checked against the
    /// process's `rchar`/`wchar`).
    pub read_bytes: u64,
    pub written_bytes: u64,
}

impl PostmarkResult {
    pub fn bytes(&self) -> u64 {
        self.read_bytes + self.written_bytes
    }
}

/// Parses PostMark's report (the lines after "Time:").
pub fn parse_postmark(text: &str) -> Result<PostmarkResult, PosixError> {
    let missing = |what| PosixError::PostmarkOutput { what, output: text.to_string() };
    // The first number on the first line that contains `key`.
    let first_number = |key: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.contains(key))?;
        line.split_whitespace().next()?.parse().ok()
    };
    // The number inside "(N per second)" on that line.
    let per_second = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.contains(key))?;
        line.split_once('(')?.1.split_whitespace().next()?.parse().ok()
    };
    let mib =
        |key, what| first_number(key).map(|m| (m * (1u64 << 20) as f64).round() as u64).ok_or_else(|| missing(what));
    Ok(PostmarkResult {
        seconds_total: first_number("seconds total").ok_or_else(|| missing("\"seconds total\""))? as u64,
        seconds_transactions: first_number("seconds of transactions")
            .ok_or_else(|| missing("\"seconds of transactions\""))? as u64,
        transactions_per_s: per_second("seconds of transactions").unwrap_or(0),
        files_created: first_number(" created (").ok_or_else(|| missing("files created"))? as u64,
        read_bytes: mib("megabytes read", "\"megabytes read\"")?,
        written_bytes: mib("megabytes written", "\"megabytes written\"")?,
    })
}

/// CPU seconds (user + system, all threads) a process has used so far.
pub fn process_cpu_seconds(pid: u32) -> Result<f64, PosixError> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|source| PosixError::ProcStat { pid, source })?;
    let ticks = stat_cpu_ticks(&text).ok_or(PosixError::ProcStatFormat { pid, text })?;
    Ok(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

/// utime + stime (fields 14 and 15 of `/proc/PID/stat`, in clock ticks).
/// The command name (field 2) is in parentheses and may hold spaces and
/// parentheses itself, so the fields are counted after the last `)`.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    // After the name: state (3), ppid, pgrp, session, tty_nr, tpgid, flags,
    // minflt, cminflt, majflt, cmajflt (13), utime (14), stime (15).
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The median (the mean of the middle two for an even count); NaN if empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One run of one row on one system.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// The row's figure in its unit.
    pub value: f64,
    /// Bytes the workload read plus wrote.
    pub bytes: u64,
    pub seconds: f64,
    /// CPU seconds of the counted processes during the run.
    pub cpu_seconds: f64,
    /// fio's report (fio rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fio: Option<FioResult>,
    /// PostMark's report (the PostMark row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postmark: Option<PostmarkResult>,
}

impl Sample {
    /// CPU seconds per 10^9 bytes moved.
    pub fn cpu_s_per_gb(&self) -> f64 {
        if self.bytes == 0 {
            f64::NAN
        } else {
            self.cpu_seconds / (self.bytes as f64 / 1e9)
        }
    }
}

/// Every run of one row on one system, and their medians.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Series {
    pub samples: Vec<Sample>,
    pub median: f64,
    pub median_cpu_s_per_gb: f64,
}

impl Series {
    pub fn push(&mut self, s: Sample) {
        self.samples.push(s);
        self.median = median(&self.samples.iter().map(|s| s.value).collect::<Vec<_>>());
        self.median_cpu_s_per_gb = median(&self.samples.iter().map(Sample::cpu_s_per_gb).collect::<Vec<_>>());
    }
}

/// A row's results on every system.
#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    pub row: Row,
    pub label: &'static str,
    pub unit: Unit,
    pub dafne: Series,
    pub ceiling: Series,
    pub native: Option<Series>,
    /// The same fio row under the interception library, on the mount.
    pub preload: Option<Series>,
}

impl RowResult {
    pub fn new(row: Row) -> RowResult {
        RowResult {
            row,
            label: row.label(),
            unit: row.unit(),
            dafne: Series::default(),
            ceiling: Series::default(),
            native: row.has_native().then(Series::default),
            preload: None,
        }
    }

    /// dafne's median over the ceiling's.
    pub fn ratio(&self) -> f64 {
        self.dafne.median / self.ceiling.median
    }
}

/// What `dafne bench posix` prints and writes as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub machine: String,
    pub runs: usize,
    pub quick: bool,
    /// Bytes per fio job (each job its own file).
    pub size: u64,
    pub fio_runtime_s: u64,
    pub postmark: PostmarkSettings,
    pub fio_version: String,
    /// Extra arguments the dafne mount was given (`--mount-args`).
    #[serde(default)]
    pub mount_args: Vec<String>,
    /// Which processes' CPU time each system's column counts.
    pub cpu_counted: Vec<(String, String)>,
    pub rows: Vec<RowResult>,
}

fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.0}")
    }
}

fn fmt_cpu(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.2}")
    }
}

impl Report {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "machine: {}\nmedian of {} run(s){}; fio jobs of {} MiB (stop at --size or {} s); PostMark {} files of {}-{} KiB, {} transactions, {} subdirectories\n\n",
            self.machine,
            self.runs,
            if self.quick { " (--quick)" } else { "" },
            self.size >> 20,
            self.fio_runtime_s,
            self.postmark.files,
            self.postmark.min_size >> 10,
            self.postmark.max_size >> 10,
            self.postmark.transactions,
            self.postmark.subdirectories,
        );
        s.push_str(
            "| row | unit | dafne mount | bindfs ceiling | dafne / ceiling | dafne preload | preload / ceiling | dafne native | CPU s/GB dafne | CPU s/GB bindfs | CPU s/GB preload | CPU s/GB native |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let cells = |x: &Option<Series>| match x {
            Some(n) if !n.samples.is_empty() => (fmt_value(n.median), fmt_cpu(n.median_cpu_s_per_gb)),
            _ => ("-".to_string(), "-".to_string()),
        };
        for r in &self.rows {
            let (nv, nc) = cells(&r.native);
            let (pv, pc) = cells(&r.preload);
            let pr = match &r.preload {
                Some(p) if !p.samples.is_empty() => format!("{:.0}%", p.median / r.ceiling.median * 100.0),
                _ => "-".into(),
            };
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.0}% | {} | {} | {} | {} | {} | {} | {} |\n",
                r.label,
                r.unit.label(),
                fmt_value(r.dafne.median),
                fmt_value(r.ceiling.median),
                r.ratio() * 100.0,
                pv,
                pr,
                nv,
                fmt_cpu(r.dafne.median_cpu_s_per_gb),
                fmt_cpu(r.ceiling.median_cpu_s_per_gb),
                pc,
                nc,
            ));
        }
        s.push_str("\nCPU time counted (utime + stime from /proc/PID/stat, before and after each run of a row):\n");
        for (who, what) in &self.cpu_counted {
            s.push_str(&format!("- {who}: {what}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fio_report_of_four_psync_jobs_is_summed_from_real_output() {
        let r = parse_fio(include_str!("../testdata/fio-seq-read-4jobs.json")).unwrap();
        assert_eq!(r.version, "fio-3.33");
        assert_eq!(r.read_bytes, 4 * (64 << 20));
        assert_eq!(r.write_bytes, 0);
        assert_eq!(r.bytes(), 268435456);
        assert!(r.bw_bytes > 0.0 && r.iops > 0.0 && r.runtime_ms > 0);
    }

    #[test]
    fn fio_random_read_reports_iops() {
        let r = parse_fio(include_str!("../testdata/fio-randread-libaio.json")).unwrap();
        assert_eq!(r.read_bytes, 67108864);
        assert!((r.iops - 230760.56338).abs() < 1e-6);
        assert_eq!(r.runtime_ms, 71);
    }

    #[test]
    fn fio_notes_before_the_json_are_skipped() {
        let text = include_str!("../testdata/fio-seq-write-with-note.json");
        assert!(text.starts_with("note: both iodepth"));
        let r = parse_fio(text).unwrap();
        assert_eq!((r.read_bytes, r.write_bytes), (0, 64 << 20));
    }

    #[test]
    fn fio_errors_are_reported_not_parsed_as_zero() {
        assert!(matches!(parse_fio(""), Err(PosixError::FioOutput { .. })));
        assert!(matches!(parse_fio("fio: /nonexistent is not a directory\n"), Err(PosixError::FioOutput { .. })));
        let failed = include_str!("../testdata/fio-seq-read-4jobs.json").replace("\"error\": 0", "\"error\": 5");
        assert!(matches!(parse_fio(&failed), Err(PosixError::FioJob { code: 5, .. })));
        let truncated = &include_str!("../testdata/fio-seq-read-4jobs.json")[..300];
        assert!(matches!(parse_fio(truncated), Err(PosixError::FioOutput { .. })));
    }

    #[test]
    fn postmark_report_is_parsed_from_real_output() {
        let r = parse_postmark(include_str!("../testdata/postmark.txt")).unwrap();
        assert_eq!(r.seconds_total, 2);
        assert_eq!(r.seconds_transactions, 2);
        assert_eq!(r.transactions_per_s, 10000);
        assert_eq!(r.files_created, 11013);
        assert_eq!(r.read_bytes, (420.69 * 1048576.0f64).round() as u64);
        assert_eq!(r.written_bytes, (465.81 * 1048576.0f64).round() as u64);
    }

    #[test]
    fn postmark_output_without_figures_is_an_error() {
        let e = parse_postmark("PostMark v1.51 : 8/14/01\nError: unable to create subdirectory\n").unwrap_err();
        assert!(matches!(e, PosixError::PostmarkOutput { .. }));
        assert!(e.to_string().contains("unable to create"));
    }

    #[test]
    fn postmark_config_says_the_issue_settings() {
        let c = PostmarkSettings::issue9(20_000).config(Path::new("/m/pm"));
        assert_eq!(
            c,
            "set location /m/pm\nset number 1000\nset size 4096 65536\nset transactions 20000\nset subdirectories 10\nrun\nquit\n"
        );
    }

    #[test]
    fn cpu_ticks_are_fields_14_and_15_even_with_odd_command_names() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 17 0 0 20 0 4 0 99 0 0";
        assert_eq!(stat_cpu_ticks(stat), Some(267));
        assert_eq!(stat_cpu_ticks("12 (x) S 1 2"), None);
        // This process: readable, and not negative.
        assert!(process_cpu_seconds(std::process::id()).unwrap() >= 0.0);
    }

    #[test]
    fn fio_rows_say_the_issue_parameters() {
        let a = Row::RandRead1Qd16.fio_args(Path::new("/d"), 1 << 30, 30).unwrap();
        for want in ["--rw=randread", "--bs=4k", "--ioengine=libaio", "--iodepth=16", "--direct=1", "--numjobs=1"] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert!(a.iter().any(|x| x == "--size=1073741824"));
        let a = Row::SeqRead4.fio_args(Path::new("/d"), 1 << 30, 30).unwrap();
        for want in ["--rw=read", "--bs=128k", "--ioengine=psync", "--numjobs=4"] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert!(Row::Postmark.fio_args(Path::new("/d"), 1, 1).is_none());
        assert!(Row::ALL.iter().all(|r| Row::parse(r.id()) == Some(*r)));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn missing_tool_names_the_package_and_the_script() {
        let e = PosixError::ToolMissing { program: "postmark", package: "postmark" }.to_string();
        assert!(e.contains("postmark") && e.contains("scripts/install-deps.sh"), "{e}");
    }
}
