"""A local cluster for the Python tests and the benchmark: ``dafne up`` in
a temporary directory with free ports (the built ``dafne`` binary:
$DAFNE_BIN, else target/debug/dafne), and ``dafne down``."""

import os
import shutil
import socket
import subprocess
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def dafne_bin():
    path = os.environ.get("DAFNE_BIN") or os.path.join(REPO, "target", "debug", "dafne")
    if not os.access(path, os.X_OK):
        raise RuntimeError("no dafne binary at %s: run `cargo build -p dafne` or set DAFNE_BIN" % path)
    return path


def free_ports(n):
    """A free port for meta and a base with n free ports after it."""
    for _ in range(200):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            b.bind(("127.0.0.1", 0))
            meta, base = a.getsockname()[1], b.getsockname()[1]
        if base + n > 65535 or base <= meta < base + n:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return meta, base
    raise RuntimeError("no %d consecutive free ports" % n)


class Cluster:
    """A cluster of ``io_servers`` io servers in a fresh directory."""

    def __init__(self, io_servers=2, cache_mib=8):
        self.dir = tempfile.mkdtemp(prefix="dafne-py-test-")
        self.io_servers = io_servers
        self.cache_mib = cache_mib

    def up(self):
        last = ""
        for _ in range(3):
            meta, base = free_ports(self.io_servers)
            cmd = [dafne_bin(), "up", "--dir", self.dir, "--io-servers", str(self.io_servers)]
            cmd += ["--cache-mib", str(self.cache_mib)]
            cmd += ["--meta-port", str(meta), "--io-base-port", str(base)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                return
            last = r.stdout + r.stderr
            if "already in use" not in last:
                break
        raise RuntimeError("dafne up failed:\n" + last)

    def down(self):
        r = subprocess.run([dafne_bin(), "down", "--dir", self.dir], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            print("dafne down:", r.stdout, r.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)
