//! `dafne nbd serve` against a real cluster and real NBD clients from
//! Debian: libnbd's `nbdinfo`, `nbdcopy` and `nbdsh` (packages
//! `libnbd-bin`, `python3-libnbd`), `qemu-img` (`qemu-utils`) and fio's
//! `nbd` engine, plus hostile bytes on the port. The kernel of the CI
//! machine has no NBD client module, so every client here is a user-space
//! one.
//!
//! External tools: a test whose tool is missing says so and passes only
//! when `DAFNE_REQUIRE_TOOLS` is unset; CI sets it (scripts/install-deps.sh
//! installs them all).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::cluster::{p, Cluster};
use common::{dafne, pattern, text};

/// A tool in PATH, or `None` after saying why the test skips.
fn require(name: &str, package: &str) -> Option<PathBuf> {
    let found =
        std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join(name)).find(|f| f.is_file());
    match found {
        Some(t) => Some(t),
        None if std::env::var_os("DAFNE_REQUIRE_TOOLS").is_some() => {
            panic!("{name} is not installed and DAFNE_REQUIRE_TOOLS is set (apt-get install {package})")
        }
        None => {
            eprintln!("SKIPPED: {name} is not installed (apt-get install {package}); set DAFNE_REQUIRE_TOOLS=1 to make this an error");
            None
        }
    }
}

/// A running `dafne nbd serve`; stopped with SIGTERM when dropped.
struct Serve {
    child: Child,
    uri: String,
    lines: mpsc::Receiver<String>,
}

impl Serve {
    fn start(c: &Cluster, extra: &[&str]) -> Serve {
        let log = std::fs::File::create(c.dir().join("nbd-serve.err")).unwrap();
        let mut child = dafne()
            .args(["nbd", "serve", "--dir", p(c.dir()), "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let first = lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "dafne nbd serve printed nothing: {}",
                std::fs::read_to_string(c.dir().join("nbd-serve.err")).unwrap()
            )
        });
        let uri = first.rsplit(" at ").next().unwrap().to_string();
        assert!(uri.starts_with("nbd://127.0.0.1:"), "{first}");
        Serve { child, uri, lines }
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.uri.trim_start_matches("nbd://").split('/').next().unwrap().parse().unwrap()
    }

    /// SIGTERM; the line the server printed as it stopped.
    fn stop(mut self) -> String {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "dafne nbd serve exited {status}");
        self.lines.recv_timeout(Duration::from_secs(10)).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let _ = self.child.wait();
        }
    }
}

/// Runs a tool with a deadline; its output, or a panic with it.
fn run(what: &str, cmd: &mut Command) -> String {
    let o = cmd.stdin(Stdio::null()).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{what} failed ({}):\n{t}", o.status);
    t
}

fn timeout(secs: u32, tool: &Path) -> Command {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string()).arg(tool);
    c
}

const SIZE: usize = 64 << 20;

#[test]
fn nbdinfo_shows_the_export_and_nbdcopy_moves_a_pattern_byte_exact_over_several_connections() {
    let (Some(nbdinfo), Some(nbdcopy)) = (require("nbdinfo", "libnbd-bin"), require("nbdcopy", "libnbd-bin")) else {
        return;
    };
    let c = Cluster::start_sized(2, "");
    let s = Serve::start(&c, &["--file", "/disk.raw", "--size", "64M", "--export-name", "disk"]);
    let info = run("nbdinfo", timeout(60, &nbdinfo).arg(&s.uri));
    assert!(info.contains(&format!("export-size: {SIZE}")), "{info}");
    for flag in ["can_flush: true", "can_fua: true", "can_trim: true", "can_zero: true", "can_multi_conn: true"] {
        assert!(info.contains(flag), "{flag} missing in:\n{info}");
    }
    let list = run("nbdinfo --list", timeout(60, &nbdinfo).args(["--list", &s.uri]));
    assert!(list.contains("export=\"disk\"") && list.contains("dafne:/disk.raw"), "{list}");

    // The whole device, in pieces of 256 KiB, 16 requests in flight on
    // each of 4 connections (the export offers multi-conn).
    let scratch = c.scratch("nbdcopy");
    let src = scratch.join("pattern.bin");
    let data = pattern(SIZE, 12);
    std::fs::write(&src, &data).unwrap();
    let copy = |from: &str, to: &str| {
        run(
            "nbdcopy",
            timeout(120, &nbdcopy).args(["--connections=4", "--requests=16", "--request-size=262144", from, to]),
        )
    };
    copy(p(&src), &s.uri);
    let back = scratch.join("back.bin");
    copy(&s.uri, p(&back));
    assert!(std::fs::read(&back).unwrap() == data, "the device read back differs from what nbdcopy wrote");
    // The bytes are the dafne file's: the client library reads them too.
    let via_cp = scratch.join("cp.bin");
    run("dafne cp", dafne().args(["cp", "--dir", p(c.dir()), "dafne:/disk.raw", p(&via_cp)]));
    assert!(std::fs::read(&via_cp).unwrap() == data, "dafne cp of the exported file differs");
    let stopped = s.stop();
    assert!(stopped.contains("0 closed for protocol errors"), "{stopped}");
}

#[test]
fn nbdsh_writes_flushes_trims_and_zeroes_and_a_read_only_export_refuses_writes() {
    let (Some(_), Some(nbdsh)) = (require("nbdinfo", "libnbd-bin"), require("nbdsh", "python3-libnbd")) else {
        return;
    };
    let c = Cluster::start_sized(2, "");
    let s = Serve::start(&c, &["--file", "/disk.raw", "--size", "16M"]);
    // Across a stripe boundary (1 MiB units) so two io servers take part.
    let script = r#"
import os
size = h.get_size()
assert size == 16 << 20, size
data = os.urandom(3 << 20)
h.pwrite(data, (1 << 20) - 4096)
h.flush()
assert h.pread(len(data), (1 << 20) - 4096) == data
h.trim(1 << 20, 1 << 20)
back = h.pread(len(data), (1 << 20) - 4096)
assert back[:4096] == data[:4096], "bytes before the trim"
assert back[4096:4096 + (1 << 20)] == bytes(1 << 20), "a trimmed range must read zero"
assert back[4096 + (1 << 20):] == data[4096 + (1 << 20):], "bytes after the trim"
h.zero(8192, (2 << 20) + 100)
assert h.pread(8192, (2 << 20) + 100) == bytes(8192)
h.pwrite(b"fua", 12345, nbd.CMD_FLAG_FUA)
assert h.pread(3, 12345) == b"fua"
try:
    h.pread(2, size - 1)
    raise SystemExit("a read past the end must fail")
except nbd.Error as e:
    pass
print("nbdsh checks passed")
"#;
    // nbdsh runs the system's python3, where python3-libnbd lives.
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let out = run("nbdsh", timeout(120, &nbdsh).env("PATH", &path).args(["-u", &s.uri, "-c", script]));
    assert!(out.contains("nbdsh checks passed"), "{out}");
    drop(s);

    let ro = Serve::start(&c, &["--file", "/disk.raw", "--read-only"]);
    let script = r#"
assert h.is_read_only()
try:
    h.pwrite(b"x", 0)
    raise SystemExit("a write to a read-only export must fail")
except nbd.Error:
    pass
assert h.pread(3, 12345) == b"fua"
print("read-only checks passed")
"#;
    let out = run("nbdsh", timeout(60, &nbdsh).env("PATH", &path).args(["-u", &ro.uri, "-c", script]));
    assert!(out.contains("read-only checks passed"), "{out}");
}

#[test]
fn qemu_img_converts_a_qcow2_onto_the_export_and_checks_a_qcow2_made_on_it() {
    let Some(qemu_img) = require("qemu-img", "qemu-utils") else { return };
    let c = Cluster::start_sized(2, "");
    let s = Serve::start(&c, &["--file", "/vm.raw", "--size", "64M"]);
    let scratch = c.scratch("qemu");
    let raw = scratch.join("src.raw");
    // Data in the first and last 8 MiB, a hole between.
    let mut bytes = vec![0u8; SIZE];
    bytes[..8 << 20].copy_from_slice(&pattern(8 << 20, 3));
    bytes[SIZE - (8 << 20)..].copy_from_slice(&pattern(8 << 20, 4));
    std::fs::write(&raw, &bytes).unwrap();
    let qcow = scratch.join("src.qcow2");
    run(
        "qemu-img convert to qcow2",
        timeout(60, &qemu_img).args(["convert", "-f", "raw", "-O", "qcow2", p(&raw), p(&qcow)]),
    );
    run(
        "qemu-img convert onto the export",
        timeout(120, &qemu_img).args(["convert", "-n", "-f", "qcow2", "-O", "raw", p(&qcow), &s.uri]),
    );
    let cmp = run(
        "qemu-img compare",
        timeout(120, &qemu_img).args(["compare", "-f", "qcow2", "-F", "raw", p(&qcow), &s.uri]),
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");
    // A qcow2 image made on the block device, written through qemu, checked.
    run("qemu-img create", timeout(60, &qemu_img).args(["create", "-f", "qcow2", &s.uri, "32M"]));
    let raw32 = scratch.join("src32.raw");
    std::fs::write(&raw32, &bytes[..32 << 20]).unwrap();
    run(
        "qemu-img convert into it",
        timeout(120, &qemu_img).args(["convert", "-n", "-f", "raw", "-O", "qcow2", p(&raw32), &s.uri]),
    );
    let cmp = run(
        "qemu-img compare",
        timeout(120, &qemu_img).args(["compare", "-f", "raw", "-F", "qcow2", p(&raw32), &s.uri]),
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");
    let check = run("qemu-img check", timeout(60, &qemu_img).args(["check", "-f", "qcow2", &s.uri]));
    assert!(check.contains("No errors were found"), "{check}");
}

#[test]
fn fio_nbd_engine_verifies_random_writes_with_many_in_flight() {
    let Some(fio) = require("fio", "fio") else { return };
    let engines = run("fio --enghelp", Command::new(&fio).arg("--enghelp"));
    if !engines.lines().any(|l| l.trim() == "nbd") {
        // Debian's fio 3.33 has it; another build may not. CI (which sets
        // DAFNE_REQUIRE_TOOLS) installs Debian's, so there it is an error.
        assert!(
            std::env::var_os("DAFNE_REQUIRE_TOOLS").is_none(),
            "this fio ({}) was built without the nbd engine and DAFNE_REQUIRE_TOOLS is set (apt-get install fio)",
            fio.display()
        );
        eprintln!("SKIPPED: this fio ({}) was built without the nbd engine", fio.display());
        return;
    }
    let c = Cluster::start_sized(2, "");
    let s = Serve::start(&c, &["--file", "/fio.raw", "--size", "32M"]);
    // fio writes its verify state files into its working directory.
    let scratch = c.scratch("fio");
    let out = run(
        "fio",
        timeout(300, &fio).current_dir(&scratch).args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", s.uri),
            "--rw=randwrite",
            "--bs=4k,64k",
            "--bsrange=4k-256k",
            "--size=32M",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ]),
    );
    assert!(out.contains("err= 0"), "{out}");
}

#[test]
fn garbage_on_the_port_does_not_harm_the_server_and_an_honest_client_still_works() {
    let c = Cluster::start_sized(2, "");
    let s = Serve::start(&c, &["--file", "/disk.raw", "--size", "4M"]);
    let addr = s.addr();
    let drain = |mut t: TcpStream| {
        t.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut rest = Vec::new();
        // The server closes: read to the end (or a reset).
        let _ = t.read_to_end(&mut rest);
    };
    // Not NBD at all.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(b"GET / HTTP/1.1\r\nHost: dafne\r\n\r\n").unwrap();
    drain(t);
    // Random bytes after a correct client flag.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(&1u32.to_be_bytes()).unwrap();
    t.write_all(&pattern(4096, 9)).unwrap();
    drain(t);
    // An option claiming 4 GiB.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(&1u32.to_be_bytes()).unwrap();
    t.write_all(b"IHAVEOPT\0\0\0\x07\xff\xff\xff\xff").unwrap();
    drain(t);
    // A good handshake, then garbage requests; then a write above 32 MiB.
    use dafne_nbd::client::Client;
    use dafne_nbd::proto;
    for bad in
        [pattern(proto::REQUEST_LEN, 5), dafne_nbd::server::request(proto::CMD_WRITE, 0, 1, 0, u32::MAX).to_vec()]
    {
        let t = TcpStream::connect(addr).unwrap();
        let mut cl = Client::handshake(dafne_nbd::Stream::Tcp(t.try_clone().unwrap()), "dafne").unwrap();
        (&t).write_all(&bad).unwrap();
        assert!(cl.complete(&mut Vec::new()).is_err(), "the server must close a stream that makes no sense");
    }
    // Requests the server answers with errors and keeps the connection.
    let mut cl = Client::connect_tcp(addr, "").unwrap();
    assert_eq!(cl.read(4 << 20, 1).unwrap(), Err(22), "a read past the end is EINVAL");
    assert_eq!(cl.call(proto::CMD_WRITE, 0, (4 << 20) - 1, &[1, 2], 2).unwrap(), 28, "ENOSPC");
    assert_eq!(cl.call(77, 0, 0, &[], 0).unwrap(), 22, "an unknown command is EINVAL");
    // A client that disconnects with requests in flight (on the second
    // half of the device: requests already taken still run).
    let mut quitter = Client::connect_tcp(addr, "dafne").unwrap();
    for i in 0..32 {
        quitter.submit_write((2 << 20) + i * 65536, &[7u8; 65536], false).unwrap();
    }
    quitter.send().unwrap();
    drop(quitter);
    // The honest client still works, with data.
    let data = pattern(1 << 20, 77);
    assert_eq!(cl.call(proto::CMD_WRITE, 0, 65536, &data, data.len() as u32).unwrap(), 0);
    assert_eq!(cl.call(proto::CMD_FLUSH, 0, 0, &[], 0).unwrap(), 0);
    assert!(cl.read(65536, 1 << 20).unwrap().unwrap() == data, "the honest client's data read back differs");
    cl.disconnect().unwrap();
    if let Some(nbdinfo) = require("nbdinfo", "libnbd-bin") {
        let info = run("nbdinfo", timeout(60, &nbdinfo).arg(&s.uri));
        assert!(info.contains("export-size: 4194304"), "{info}");
    }
    let stopped = s.stop();
    assert!(stopped.contains("5 closed for protocol errors"), "{stopped}");
}

#[test]
fn a_unix_socket_export_serves_nbdinfo_and_replaces_a_stale_socket_file() {
    let Some(nbdinfo) = require("nbdinfo", "libnbd-bin") else { return };
    let c = Cluster::start_sized(1, "");
    let sock = c.dir().join("nbd.sock");
    // A socket file nobody listens on any more (a server that died).
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let log = std::fs::File::create(c.dir().join("nbd-unix.err")).unwrap();
    let mut child = dafne()
        .args(["nbd", "serve", "--dir", p(c.dir()), "--file", "/u.raw", "--size", "1M", "--socket", p(&sock)])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let uri = first.trim().rsplit(" at ").next().unwrap().to_string();
    assert_eq!(uri, format!("nbd+unix:///dafne?socket={}", sock.display()), "{first}");
    let info = run("nbdinfo", timeout(60, &nbdinfo).arg(&uri));
    assert!(info.contains("export-size: 1048576"), "{info}");
    // A second server on the same socket is refused, naming the fix.
    let o =
        dafne().args(["nbd", "serve", "--dir", p(c.dir()), "--file", "/u.raw", "--socket", p(&sock)]).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("pass another --socket"), "{}", text(&o));
    rustix::process::kill_process(rustix::process::Pid::from_child(&child), rustix::process::Signal::TERM).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!sock.exists(), "the server removes its socket when it stops");
}

#[test]
fn nbd_serve_mistakes_say_how_to_fix_them() {
    let c = Cluster::start_sized(1, "");
    let o = dafne()
        .args(["nbd", "serve", "--dir", p(c.dir()), "--listen", "127.0.0.1:0", "--file", "/nope"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("pass --size"), "{}", text(&o));
    let o = dafne().args(["nbd", "serve", "--dir", p(c.dir()), "--file", "rel.raw", "--size", "1M"]).output().unwrap();
    assert!(text(&o).contains("--file /rel.raw"), "{}", text(&o));
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = busy.local_addr().unwrap().to_string();
    let o = dafne()
        .args(["nbd", "serve", "--dir", p(c.dir()), "--listen", &at, "--file", "/x", "--size", "1M"])
        .output()
        .unwrap();
    assert!(text(&o).contains("pass --listen with a free port"), "{}", text(&o));
    // A pool larger than the machine could give is refused before any
    // memory is taken (it would fill /dev/shm).
    let o = dafne()
        .args(["nbd", "serve", "--dir", p(c.dir()), "--file", "/x", "--size", "1M"])
        .args(["--listen", "127.0.0.1:0", "--buffer-mib", "18446744073709551"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("more than half of the memory available"), "{}", text(&o));
}
