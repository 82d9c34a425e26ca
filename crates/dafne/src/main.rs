//! `dafne`: the one command of the project. Thin: parsing, progress and
//! printing here; the work lives in the library crates.

mod advise;
mod benchdafs;
mod benchmount;
mod benchnbd;
mod benchposix;
mod benchseeds;
mod cluster;
mod copy;
mod credential;
mod local;
mod mount;
mod nbd;
mod scrub;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use dafne_bench::transport::{Options, ServerCommand, Transport};
use dafne_transport::RuntimeOptions;

#[derive(Parser)]
#[command(name = "dafne", version, about = "dafne: a user-level, RDMA-native parallel file system on UCX")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster's servers on this machine (1 metadata server and N
    /// io servers as separate processes, supervised) with the embedded
    /// defaults or a configuration file; with a [[hosts]] list, this
    /// host's servers (--host NAME) or none (--client). Returns once
    /// every server listens.
    Up(local::UpArgs),
    /// Stop this machine's servers of the cluster: unmount its mounts,
    /// write back the io servers' caches, stop every server. Data stays
    /// in the directory.
    Down(local::DirArgs),
    /// The cluster's servers, capacity, cache and registration counters,
    /// credits in use, and mounts.
    Status(local::StatusArgs),
    /// Issue or revoke per-client credentials (run where the cluster
    /// secret is): which uids and gids a mount or `cp` may act as.
    #[command(subcommand)]
    Credential(credential::CredentialCmd),
    /// Copy a file into or out of dafne through the client library, without
    /// a mount (`dafne cp big.bin dafne:/big.bin`), with progress.
    Cp(copy::CpArgs),
    /// Give a file or directory cache advice for the io servers (unit size
    /// 4k–64k, replacement policy lru or clock), or show it: `dafne advise
    /// dafne:/data --unit 16k --policy clock`.
    Advise(advise::AdviseArgs),
    /// Read every stored block on every io server and verify it against
    /// its checksum; print what was checked and every bad block (exit
    /// status non-zero if any). Needs the cluster secret.
    Scrub(scrub::ScrubArgs),
    /// Print a commented example configuration (the embedded defaults).
    Config,
    /// The supervisor `dafne up` starts.
    #[command(hide = true)]
    Supervise(local::DirArgs),
    /// Mount the cluster with FUSE at an existing directory; returns once
    /// the mount is live (a daemon serves it).
    Mount(mount::MountArgs),
    /// Unmount a dafne mount and wait for its daemon to exit.
    Umount(mount::UmountArgs),
    /// Run a benchmark and print its table (and write JSON).
    #[command(subcommand)]
    Bench(Bench),
    /// Export a dafne file as a Network Block Device (`dafne nbd serve --file /disk.raw --size 1G`).
    #[command(subcommand)]
    Nbd(nbd::NbdCmd),
    /// Run one dafne server in the foreground.
    #[command(subcommand)]
    Serve(Serve),
    /// Serve the transport's reference service (used by `dafne bench transport`).
    #[command(hide = true)]
    TransportPeer(PeerArgs),
}

#[derive(Subcommand)]
enum Serve {
    /// The metadata server: namespace, layouts, capabilities (prints `listening on ADDR`).
    Meta(dafne_meta::server::MetaArgs),
    /// An io server: chunk files behind the Unifier cache (prints `listening on ADDR`).
    Io(dafne_io::server::IoCommand),
}

#[derive(Subcommand)]
enum Bench {
    /// Server-driven put/get bandwidth and request/reply latency over tcp,
    /// shared memory and cma, beside ucx_perftest.
    Transport(TransportBench),
    /// Metadata creates, stats and unlinks per second, 1 and several clients.
    Meta(MetaBench),
    /// The io server's serving modes (normal, mmap, unifier): cached read and
    /// write bandwidth vs access size, the re-read test, aggregate bandwidth
    /// over io servers × clients, CPU per MiB.
    Io(IoBench),
    /// Through a FUSE mount of a fresh local cluster: sequential and 4 KiB
    /// random I/O, metadata operations, and `dafne cp` beside it.
    Mount(benchmount::MountBench),
    /// fio and PostMark on a fresh dafne mount beside the FUSE ceiling
    /// (bindfs over tmpfs) and the native client, with CPU time per GB.
    Posix(benchposix::PosixBench),
    /// Block access through `dafne nbd serve` (NBD over TCP) against file
    /// access through the client library, same sizes and requests in flight.
    Nbd(benchnbd::NbdBench),
    /// Every seed paper's headline experiment on this machine, beside the
    /// paper's figure as the same ratio, with a plot per figure
    /// (`--quick` for a short pass, `--only ID,...` for some, `--list`).
    Seeds(benchseeds::SeedsBench),
    /// NFS/RDMA designs (issue 14): multi-threaded read bandwidth and CPU
    /// of Read-Read vs Read-Write, with and without the client's
    /// registration cache, through a real server process.
    Designs(DesignsBench),
    /// The DAFS paper's experiments: the client library (user level)
    /// against the FUSE mount (kernel path): bandwidth and client CPU vs
    /// block size, and a PostMark-like workload on both.
    Dafs(benchdafs::DafsBench),
    /// One io server's write throughput as client processes multiply (1 to
    /// 64, each writing 64 KiB requests one at a time): the ORFA/MX paper's
    /// figure 9.
    Writers(WritersBench),
    /// A client process of `dafne bench writers` (its job on stdin).
    #[command(hide = true)]
    WritersClient,
    /// Memory registration cost (ucp_mem_map + key pack + unmap) vs pages,
    /// fitted to T = a·pages + b, and request latency through an io server
    /// with FRRWP (keys following the request) vs registering first.
    Registration(RegistrationBench),
}

#[derive(Args)]
struct DesignsBench {
    /// About 15 s: one round of 0.3 s per cell.
    #[arg(long)]
    quick: bool,
    /// Transport sets (comma-separated: shm = the io servers' set
    /// posix,sysv,cma,self,tcp; tcp; cma).
    #[arg(long, default_value = "shm,tcp", value_delimiter = ',')]
    transports: Vec<String>,
    /// Designs (comma-separated: rr, rw, rw-nocache, rr-nocache).
    #[arg(long, default_value = "rr,rw,rw-nocache,rr-nocache", value_delimiter = ',')]
    designs: Vec<String>,
    /// Reads in flight ("threads"), comma-separated.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    threads: Vec<usize>,
    /// Record size (K and M suffixes allowed; at most 1M).
    #[arg(long, default_value = "128K")]
    record: String,
    /// Seconds per cell per round (ignored with --quick).
    #[arg(long, default_value_t = 0.6)]
    seconds: f64,
    /// Rounds (the designs in turn each round; ignored with --quick).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Busy-poll window of both ends in µs (0: CPU time is work, not spinning).
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
    /// Fill, poison and check every record's bytes.
    #[arg(long)]
    verify: bool,
    /// UCX setting added to each transport's, in both processes
    /// (repeatable), e.g. MM_FIFO_SIZE=64 (UCX's default; dafne asks for 256).
    #[arg(long = "ucx", value_name = "KEY=VALUE")]
    ucx: Vec<String>,
    #[arg(long, default_value = "bench-results/designs.json")]
    json: PathBuf,
}

#[derive(Args)]
struct RegistrationBench {
    /// Region sizes of the cost model, in pages (comma-separated).
    #[arg(long, default_value = "1,2,4,8,16,32,64,128,256", value_delimiter = ',')]
    pages: Vec<usize>,
    /// Repetitions per size of the cost model (median reported).
    #[arg(long, default_value_t = 2000)]
    reps: usize,
    /// Request sizes of the latency comparison (comma-separated; K and M
    /// suffixes; `none` skips it).
    #[arg(long, default_value = "4K,16K,64K,128K,256K,1M", value_delimiter = ',')]
    sizes: Vec<String>,
    /// Requests per size and way (median reported).
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// A short run (a few seconds in all).
    #[arg(long)]
    quick: bool,
    /// Scratch directory for the io server's data (a fresh directory inside).
    #[arg(long, default_value = "/tmp")]
    scratch: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/registration.json")]
    json: PathBuf,
}

#[derive(Args)]
struct WritersBench {
    /// Client process counts (comma-separated).
    #[arg(long, default_value = "1,2,4,8,16,32,64", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Seconds each client writes per count.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Bytes per write request (K and M suffixes).
    #[arg(long, default_value = "64K")]
    size: String,
    /// Each client's file; its writes cycle through it (all the files
    /// together must fit in an eighth of the cache, half what the io server
    /// holds dirty before writing back: the writes hit the cache).
    #[arg(long, default_value = "128K")]
    file_size: String,
    /// The io server's cache, in MiB.
    #[arg(long, default_value_t = 64)]
    cache_mib: usize,
    /// Do not read the files back to check what every client reported.
    #[arg(long)]
    no_verify: bool,
    /// Nice value of the client processes (-20 to 19; 10 lets the io
    /// server's thread run first when the clients outnumber the cores).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    client_nice: i32,
    /// A short run (1, 2, 4, 8, 16 clients, 2 s each; about 15 s; --clients
    /// and --seconds are then ignored).
    #[arg(long)]
    quick: bool,
    /// Scratch directory for the servers' data (a fresh directory inside).
    #[arg(long, default_value = "/tmp")]
    scratch: PathBuf,
    /// The io server's storage path: auto, direct or buffered.
    #[arg(long, value_enum, default_value_t = dafne_io::chunk::StorageMode::Auto)]
    storage: dafne_io::chunk::StorageMode,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/writers.json")]
    json: PathBuf,
}

#[derive(Args)]
struct IoBench {
    /// Serving modes to compare (comma-separated: normal, mmap, unifier).
    #[arg(long, default_value = "normal,mmap,unifier", value_delimiter = ',')]
    modes: Vec<String>,
    /// Access sizes of the cached-bandwidth table (comma-separated; K and M suffixes).
    #[arg(long, default_value = "4K,16K,64K,128K,256K,1M", value_delimiter = ',')]
    sizes: Vec<String>,
    /// Requests in flight per client.
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Seconds per cached-bandwidth measurement.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Size of the cached-bandwidth file (fits in --cache-mib).
    #[arg(long, default_value = "8M")]
    file_size: String,
    /// Cache of the io servers of the bandwidth tables, in MiB.
    #[arg(long, default_value_t = 64)]
    cache_mib: usize,
    /// Cache C of the re-read test, in MiB (files of 0.5, 1 and 2 × C).
    #[arg(long, default_value_t = 32)]
    reread_cache_mib: usize,
    /// Io server counts of the aggregate table (comma-separated).
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    servers: Vec<usize>,
    /// Client counts of the aggregate table (comma-separated).
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Cache of each io server of the aggregate table, in MiB. The Unifier
    /// registers its cache in slabs of up to 8 MiB, each one UCX allocation
    /// (one SysV segment on one host): 4 servers × 48 MiB = 24 segments, far
    /// below the usual kernel limit of 4096 (`ipcs -l`), which now allows
    /// about 32 GiB of cache per machine.
    #[arg(long, default_value_t = 48)]
    scaling_cache_mib: usize,
    /// Seconds per aggregate measurement.
    #[arg(long, default_value_t = 0.3)]
    scaling_seconds: f64,
    /// A short run (0.1 s per cell, an 8 MiB re-read cache) for smoke checks.
    #[arg(long)]
    quick: bool,
    /// Scratch directory for the servers' data (a fresh directory inside).
    #[arg(long, default_value = "/tmp")]
    scratch: PathBuf,
    /// The unifier-mode io servers' storage path: auto (O_DIRECT via
    /// io_uring where the scratch directory allows it), direct, or
    /// buffered (normal and mmap always use the page cache).
    #[arg(long, value_enum, default_value_t = dafne_io::chunk::StorageMode::Auto)]
    storage: dafne_io::chunk::StorageMode,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/io.json")]
    json: PathBuf,
}

#[derive(Args)]
struct MetaBench {
    /// Client counts to measure (comma-separated).
    #[arg(long, default_value = "1,4", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Files each client creates, stats and unlinks.
    #[arg(long, default_value_t = 2000)]
    files: usize,
    /// Scratch directory for the server's store.
    #[arg(long, default_value = "/tmp")]
    scratch: PathBuf,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/meta.json")]
    json: PathBuf,
}

#[derive(Args)]
struct TransportBench {
    /// Transports to measure (comma-separated: tcp, shm, cma).
    #[arg(long, default_value = "tcp,shm,cma", value_delimiter = ',')]
    transports: Vec<String>,
    /// Transfer sizes in bytes (comma-separated; K and M suffixes allowed).
    #[arg(long, default_value = "4K,64K,1M,4M", value_delimiter = ',')]
    sizes: Vec<String>,
    /// Requests in flight.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Seconds per bandwidth measurement.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 20_000)]
    latency_iters: usize,
    /// Skip the ucx_perftest reference runs.
    #[arg(long)]
    no_perftest: bool,
    /// A short run (0.2 s per cell, 2000 round trips) for smoke checks.
    #[arg(long)]
    quick: bool,
    /// Echo sizes of the frame authentication comparison: the same echoes
    /// on a connection with frame keys (every frame tagged with
    /// keyed BLAKE3, 128 bits, and numbered, both ways) and on one without, to one
    /// server in one run (comma-separated; empty to skip).
    #[arg(long, default_value = "8,4K,64K", value_delimiter = ',')]
    auth_sizes: Vec<String>,
    /// Measure only the frame authentication comparison.
    #[arg(long)]
    auth_only: bool,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench-results/transport.json")]
    json: PathBuf,
}

#[derive(Args)]
struct PeerArgs {
    #[arg(long = "ucx", value_name = "KEY=VALUE")]
    ucx: Vec<String>,
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    #[command(subcommand)]
    cmd: PeerCmd,
}

#[derive(Subcommand)]
enum PeerCmd {
    Serve {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
}

fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num
        .parse()
        .with_context(|| format!("size {s:?}: expected a number with an optional K/M/G suffix, e.g. 64K"))?;
    if n == 0 {
        bail!("size {s:?} must be positive");
    }
    Ok(n * mult)
}

fn bench_transport(a: TransportBench) -> Result<()> {
    let transports = a.transports.iter().map(|t| Transport::parse(t.trim())).collect::<Result<Vec<_>>>()?;
    let sizes = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<Vec<_>>>()?;
    if let Some(&s) = sizes.iter().find(|&&s| s > dafne_transport::testsvc::SLOT_SIZE) {
        bail!("size {s} is larger than one request may move ({} bytes)", dafne_transport::testsvc::SLOT_SIZE);
    }
    if a.window == 0 || a.window > 64 {
        bail!("--window {} must be between 1 and 64 (the server grants 64 credits)", a.window);
    }
    let (seconds, iters) = if a.quick { (0.2, 2000) } else { (a.seconds, a.latency_iters) };
    let auth_sizes =
        a.auth_sizes.iter().filter(|s| !s.trim().is_empty()).map(|s| parse_size(s)).collect::<Result<Vec<_>>>()?;
    if let Some(&s) = auth_sizes.iter().find(|&&s| s >= 1 << 20) {
        bail!("--auth-sizes: {s} bytes is more than a request may carry (under 1 MiB)");
    }
    let opts = Options {
        auth_sizes,
        auth_only: a.auth_only,
        transports,
        sizes,
        window: a.window,
        duration: Duration::from_secs_f64(seconds),
        latency_iters: iters.max(10),
        with_perftest: !a.no_perftest,
        server: ServerCommand {
            program: std::env::current_exe().context("locating the dafne executable")?,
            prefix: vec!["transport-peer".into()],
        },
    };
    let report = dafne_bench::transport::run(&opts, measuring())?;
    println!("{}", report.to_markdown());
    if let Some(dir) = a.json.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", a.json.display()))?;
    eprintln!("JSON report written to {}", a.json.display());
    Ok(())
}

fn bench_designs(a: DesignsBench) -> Result<()> {
    use dafne_bench::designs;
    let transports = a.transports.iter().map(|t| Transport::parse(t.trim())).collect::<Result<Vec<_>>>()?;
    let base = if a.quick { designs::Options::quick() } else { designs::Options::default() };
    let seconds_ok = a.seconds > 0.0 && a.seconds <= 600.0;
    if !a.quick && !seconds_ok {
        bail!("--seconds {} must be above 0 and at most 600", a.seconds);
    }
    let opts = designs::Options {
        transports,
        designs: a.designs.iter().map(|d| designs::Design::parse(d.trim())).collect::<Result<Vec<_>>>()?,
        threads: a.threads,
        record: parse_size(&a.record)?,
        duration: if a.quick { base.duration } else { Duration::from_secs_f64(a.seconds) },
        rounds: if a.quick { base.rounds } else { a.rounds },
        spin_us: a.spin_us,
        verify: a.verify,
        extra_ucx: dafne_transport::parse_ucx_overrides(&a.ucx).map_err(anyhow::Error::msg)?,
        server: ServerCommand {
            program: std::env::current_exe().context("locating the dafne executable")?,
            prefix: vec!["transport-peer".into()],
        },
    };
    let report = designs::run(&opts, measuring())?;
    println!("{}", report.to_markdown());
    write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}

fn bench_meta(a: MetaBench) -> Result<()> {
    if a.clients.is_empty() || a.clients.iter().any(|&c| c == 0 || c > 64) {
        bail!("--clients: each count must be between 1 and 64");
    }
    if a.files == 0 {
        bail!("--files must be at least 1");
    }
    let opts = dafne_bench::meta::Options {
        clients: a.clients,
        files: a.files,
        server: ServerCommand {
            program: std::env::current_exe().context("locating the dafne executable")?,
            prefix: vec!["serve".into(), "meta".into()],
        },
        scratch: a.scratch,
    };
    let report = dafne_bench::meta::run(&opts, measuring())?;
    println!("{}", report.to_markdown());
    write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}

fn bench_io(a: IoBench) -> Result<()> {
    let modes = a
        .modes
        .iter()
        .map(|m| {
            dafne_io::server::ServingMode::parse(m.trim())
                .with_context(|| format!("unknown mode {m:?}: choose among normal, mmap, unifier"))
        })
        .collect::<Result<Vec<_>>>()?;
    let sizes = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<Vec<_>>>()?;
    let file_size = parse_size(&a.file_size)?;
    if a.window == 0 || a.window > 64 {
        bail!("--window {} must be between 1 and 64 (the server grants 64 credits)", a.window);
    }
    if a.servers.iter().chain(&a.clients).any(|&n| n == 0 || n > 16) {
        bail!("--servers and --clients: each count must be between 1 and 16");
    }
    if a.scaling_cache_mib
        < 8 * a.clients.iter().max().copied().unwrap_or(1) / a.servers.iter().min().copied().unwrap_or(1) + 4
    {
        bail!("--scaling-cache-mib must hold every client's 8 MiB file on the fewest servers, plus 4 MiB");
    }
    if a.cache_mib == 0 || file_size > a.cache_mib << 20 {
        bail!("--file-size must fit in --cache-mib (the bandwidth tables measure cached I/O)");
    }
    let (seconds, scaling_seconds, reread_cache_mib) = if a.quick {
        (0.1, 0.1, a.reread_cache_mib.min(8))
    } else {
        (a.seconds, a.scaling_seconds, a.reread_cache_mib)
    };
    if reread_cache_mib < 8 {
        bail!("--reread-cache-mib must be at least 8 (normal and mmap hold a 4 MiB registered pool)");
    }
    let opts = dafne_bench::io::Options {
        modes,
        sizes,
        window: a.window,
        duration: Duration::from_secs_f64(seconds),
        file_size,
        cache_mib: a.cache_mib,
        reread_cache_mib,
        reread_ratios: vec![0.5, 1.0, 2.0],
        reread_size: 128 << 10,
        servers: a.servers,
        scaling_cache_mib: a.scaling_cache_mib,
        clients: a.clients,
        scaling_duration: Duration::from_secs_f64(scaling_seconds),
        scaling_file: 8 << 20,
        program: std::env::current_exe().context("locating the dafne executable")?,
        scratch: a.scratch,
        storage: a.storage,
        tables: dafne_bench::io::Tables::ALL,
    };
    let report = dafne_bench::io::run(&opts, measuring())?;
    println!("{}", report.to_markdown());
    write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}

fn bench_registration(a: RegistrationBench) -> Result<()> {
    let mut o = if a.quick { dafne_bench::registration::Options::quick() } else { Default::default() };
    if !a.quick {
        o.pages = a.pages;
        o.reps = a.reps;
        o.latency_reps = a.requests;
        o.latency_sizes = if a.sizes.iter().any(|s| s.trim() == "none") {
            Vec::new()
        } else {
            a.sizes.iter().map(|s| parse_size(s)).collect::<Result<Vec<_>>>()?
        };
    }
    if o.pages.iter().any(|&p| p == 0 || p > 1 << 16) {
        bail!("--pages: each size must be between 1 and 65536");
    }
    if o.reps == 0 || o.latency_reps == 0 {
        bail!("--reps and --requests must be at least 1");
    }
    if o.latency_sizes.iter().any(|&s| s == 0 || s > 16 << 20) {
        bail!("--sizes: each size must be between 1 byte and 16 MiB");
    }
    o.program = std::env::current_exe().context("locating the dafne executable")?;
    o.scratch = a.scratch;
    let report = dafne_bench::registration::run(&o, measuring())?;
    println!("{}", report.to_markdown());
    write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}

fn bench_writers(a: WritersBench) -> Result<()> {
    let mut opts = if a.quick { dafne_bench::writers::Options::quick() } else { Default::default() };
    if !a.quick {
        opts.clients = a.clients;
        if !(a.seconds > 0.0 && a.seconds <= 600.0) {
            bail!("--seconds {} must be above 0 and at most 600", a.seconds);
        }
        opts.duration = Duration::from_secs_f64(a.seconds);
    }
    if opts.clients.is_empty() || opts.clients.iter().any(|&c| c == 0 || c > 256) {
        bail!("--clients: each count must be between 1 and 256");
    }
    opts.size = parse_size(&a.size)?;
    opts.file_size = parse_size(&a.file_size)?;
    if !opts.file_size.is_multiple_of(opts.size) {
        bail!("--size {} must divide --file-size {}", a.size, a.file_size);
    }
    if a.cache_mib == 0 {
        bail!("--cache-mib must be at least 1");
    }
    opts.cache_mib = a.cache_mib;
    opts.verify = !a.no_verify;
    if !(-20..=19).contains(&a.client_nice) {
        bail!("--client-nice {} must be between -20 and 19", a.client_nice);
    }
    opts.client_nice = a.client_nice;
    opts.program = std::env::current_exe().context("locating the dafne executable")?;
    opts.scratch = a.scratch;
    opts.storage = a.storage;
    let report = dafne_bench::writers::run(&opts, measuring())?;
    println!("{}", report.to_markdown());
    write_json(&a.json, &serde_json::to_string_pretty(&report)?)
}

/// A benchmark's progress printer: `[  12.3s] measuring WHAT` on stderr,
/// seconds since it was made.
fn measuring() -> impl FnMut(&str) {
    let started = std::time::Instant::now();
    move |what: &str| eprintln!("[{:>6.1}s] measuring {what}", started.elapsed().as_secs_f64())
}

fn write_json(path: &std::path::Path, body: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("JSON report written to {}", path.display());
    Ok(())
}

fn main() -> std::process::ExitCode {
    quiet_on_a_closed_pipe();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The chain of contexts, without a backtrace: these are the
            // user's mistakes and the system's refusals, said plainly.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `dafne status | head`: Rust ignores SIGPIPE, so a `println!` to a
/// reader that went away panics ("failed printing to stdout"). That is
/// no error of the command's: it ends quietly, as a C program killed by
/// SIGPIPE would (status 141). Every other panic reports as before.
fn quiet_on_a_closed_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info)
    }));
}

fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DAFNE_LOG")
                // The storage's and the mount's choices (O_DIRECT, FUSE
                // over io_uring or /dev/fuse) are one info line each.
                .unwrap_or_else(|_| "warn,dafne_io::storage=info,dafne_fuse=info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: the supervisor writes servers' output
        // to log files, which must stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Up(a) => local::up(a),
        Cmd::Down(a) => local::down(a),
        Cmd::Status(a) => local::status(a),
        Cmd::Cp(a) => copy::cp(a),
        Cmd::Advise(a) => advise::advise(a),
        Cmd::Scrub(a) => scrub::scrub(a),
        Cmd::Credential(c) => credential::run(c),
        Cmd::Config => {
            print!("{}", cluster::EXAMPLE);
            Ok(())
        }
        Cmd::Supervise(a) => local::supervise(a),
        Cmd::Mount(a) => mount::mount(a),
        Cmd::Umount(a) => mount::umount(a),
        Cmd::Bench(Bench::Transport(a)) => bench_transport(a),
        Cmd::Bench(Bench::Seeds(a)) => benchseeds::run(a),
        Cmd::Bench(Bench::Meta(a)) => bench_meta(a),
        Cmd::Bench(Bench::Io(a)) => bench_io(a),
        Cmd::Bench(Bench::Mount(a)) => benchmount::run(a, parse_size),
        Cmd::Bench(Bench::Posix(a)) => benchposix::run(a, parse_size),
        Cmd::Bench(Bench::Nbd(a)) => benchnbd::run(a, parse_size),
        Cmd::Bench(Bench::Designs(a)) => bench_designs(a),
        Cmd::Bench(Bench::Dafs(a)) => benchdafs::cli(a, parse_size),
        Cmd::Bench(Bench::Writers(a)) => bench_writers(a),
        Cmd::Bench(Bench::WritersClient) => dafne_bench::writers::client_main(),
        Cmd::Bench(Bench::Registration(a)) => bench_registration(a),
        Cmd::Nbd(c) => nbd::run(c, parse_size),
        Cmd::Serve(Serve::Meta(a)) => {
            dafne_cluster::server_entry()?;
            a.serve()
        }
        Cmd::Serve(Serve::Io(a)) => {
            dafne_cluster::server_entry()?;
            dafne_io::server::serve_forever(&a)
        }
        Cmd::TransportPeer(p) => {
            let ucx = dafne_transport::parse_ucx_overrides(&p.ucx).map_err(anyhow::Error::msg)?;
            let opts = RuntimeOptions {
                name: "bench-server".into(),
                ucx_config: ucx,
                spin: Duration::from_micros(p.spin_us),
                // The benchmark's clients measure shared memory without
                // logging in (`RuntimeOptions::shm_before_login`).
                shm_before_login: true,
                ..Default::default()
            };
            match p.cmd {
                PeerCmd::Serve { listen } => Ok(dafne_transport::testsvc::serve_forever(opts, listen)?),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_suffixes_and_refuse_nonsense() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("4Q").is_err());
    }
}
