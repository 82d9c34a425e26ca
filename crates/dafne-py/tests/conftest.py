"""A real cluster for the Python tests: ``dafne up`` in a temporary
directory with free ports (the built ``dafne`` binary: $DAFNE_BIN, else
target/debug/dafne), and ``dafne down`` at the end even when tests fail."""

import os
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
IO_SERVERS = 2


def dafne_bin():
    path = os.environ.get("DAFNE_BIN") or os.path.join(REPO, "target", "debug", "dafne")
    if not os.access(path, os.X_OK):
        pytest.exit("no dafne binary at %s: run `cargo build -p dafne` or set DAFNE_BIN" % path, returncode=2)
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
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="dafne-py-test-")

    def up(self):
        last = ""
        for _ in range(3):
            meta, base = free_ports(IO_SERVERS)
            cmd = [dafne_bin(), "up", "--dir", self.dir, "--io-servers", str(IO_SERVERS), "--cache-mib", "8"]
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


@pytest.fixture(scope="session")
def cluster():
    """The cluster directory of a running cluster (one for the session)."""
    c = Cluster()
    try:
        c.up()
        yield c.dir
    finally:
        # Also after a failed `up`: a supervisor may be running.
        c.down()


@pytest.fixture
def fs(cluster):
    """The fsspec file system on the test cluster."""
    import fsspec

    return fsspec.filesystem("dafne", cluster=cluster)


@pytest.fixture
def client(cluster):
    import dafne

    return dafne.Client(cluster)


@pytest.fixture
def base(client):
    """A fresh directory for one test (its path)."""
    path = "/t-" + uuid.uuid4().hex[:12]
    client.mkdir(path)
    return path
