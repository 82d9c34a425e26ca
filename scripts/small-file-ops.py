#!/usr/bin/env python3
"""Per-operation latency of the small-file calls PostMark makes, on any
directory (a dafne mount, a bindfs mount, tmpfs): N files of 16 KiB, each
call timed as a whole, one at a time. Usage: small-file-ops.py DIR [N].
Prints microseconds per call; creates and removes DIR/t/f0..f{N-1}.
(docs/BENCHMARKS.md, "What bounds PostMark".)"""
import os
import sys
import time

d = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 400
data = os.urandom(16384)
os.makedirs(f"{d}/t", exist_ok=True)


def timed(name, f):
    start = time.perf_counter()
    for i in range(n):
        f(i)
    print(f"{name:28s} {(time.perf_counter() - start) / n * 1e6:8.0f} us/op")


def create(i):
    os.close(os.open(f"{d}/t/f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))


def write(i):
    fd = os.open(f"{d}/t/f{i}", os.O_WRONLY)
    os.write(fd, data)
    os.close(fd)


def read(i):
    fd = os.open(f"{d}/t/f{i}", os.O_RDONLY)
    os.read(fd, 65536)
    os.close(fd)


for name, f in [
    ("create+close (empty)", create),
    ("open+write 16K+close", write),
    ("open+read+close", read),
    ("stat", lambda i: os.stat(f"{d}/t/f{i}")),
    ("unlink", lambda i: os.unlink(f"{d}/t/f{i}")),
]:
    timed(name, f)
os.rmdir(f"{d}/t")
