"""Throughput of dafne from Python beside `dafne cp`, on a fresh local cluster.

    python crates/dafne-py/bench.py [--mib 256] [--runs 3] [--json FILE]

Starts a cluster (`dafne up` with 4 io servers in a temporary directory,
the binary $DAFNE_BIN, else target/debug/dafne; build both it and the wheel
with --release for figures), then moves one file of --mib MiB each way:

* native: `dafne.File.write`/`read` in 8 MiB calls;
* fsspec put/get: `put_file`/`get_file` between a local file and dafne;
* fsspec buffered: `fs.open(...).write`/`read` in 1 MiB calls through
  fsspec's buffered file (8 MiB blocks, read-ahead cache);
* dafne cp: the command, as the in-process client without Python (its
  process start and connection are in its time).

Prints a table of the median of --runs runs and writes it as JSON. No
figure is asserted anywhere.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))

from cluster import Cluster, dafne_bin  # noqa: E402

import dafne  # noqa: E402

PIECE = 8 << 20


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="file size in MiB (at most 1024)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default="target/bench-python.json")
    a = ap.parse_args()
    if not 1 <= a.mib <= 1024:
        ap.error("--mib must be between 1 and 1024")
    import fsspec

    size = a.mib << 20
    data = os.urandom(size)
    c = Cluster(io_servers=4, cache_mib=64)
    scratch = tempfile.mkdtemp(prefix="dafne-py-bench-")
    local = os.path.join(scratch, "src")
    with open(local, "wb") as f:
        f.write(data)
    rows = {}
    try:
        c.up()
        client = dafne.Client(c.dir)
        fs = fsspec.filesystem("dafne", cluster=c.dir)

        def native_write():
            with client.open("/native", "wb") as f:
                for i in range(0, size, PIECE):
                    f.write(data[i : i + PIECE])

        def native_read():
            with client.open("/native") as f:
                n = 0
                while True:
                    b = f.read(PIECE)
                    if not b:
                        break
                    n += len(b)
            assert n == size

        def buffered_write():
            with fs.open("/buffered", "wb") as f:
                for i in range(0, size, 1 << 20):
                    f.write(data[i : i + (1 << 20)])

        def buffered_read():
            with fs.open("/buffered", "rb") as f:
                while f.read(1 << 20):
                    pass

        def cp(src, dst):
            subprocess.run([dafne_bin(), "cp", "--dir", c.dir, "--force", src, dst], check=True, capture_output=True)

        cases = [
            ("native write", native_write),
            ("native read", native_read),
            ("fsspec put_file", lambda: fs.put_file(local, "/put")),
            ("fsspec get_file", lambda: fs.get_file("/put", os.path.join(scratch, "got"))),
            ("fsspec buffered write", buffered_write),
            ("fsspec buffered read", buffered_read),
            ("dafne cp up", lambda: cp(local, "dafne:/cp")),
            ("dafne cp down", lambda: cp("dafne:/cp", os.path.join(scratch, "down"))),
        ]
        for name, f in cases:
            secs = [timed(f) for _ in range(a.runs)]
            rows[name] = statistics.median(secs)
        with open(os.path.join(scratch, "got"), "rb") as f:
            assert f.read() == data, "get_file brought back other bytes"
    finally:
        c.down()
        for n in ("src", "got", "down"):
            p = os.path.join(scratch, n)
            if os.path.exists(p):
                os.remove(p)
        os.rmdir(scratch)
    print("%-24s %10s %10s" % ("operation (%d MiB)" % a.mib, "seconds", "MiB/s"))
    out = []
    for name, s in rows.items():
        print("%-24s %10.3f %10.0f" % (name, s, a.mib / s))
        out.append({"operation": name, "mib": a.mib, "seconds": s, "mib_per_s": a.mib / s})
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"runs": a.runs, "rows": out}, f, indent=1)
    print("wrote", a.json)


if __name__ == "__main__":
    main()
