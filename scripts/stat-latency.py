#!/usr/bin/env python3
"""Latency of one metadata round trip through a mount: stat(2) of N
distinct names that do not exist (each a FUSE LOOKUP the kernel cannot
answer from its cache: one request to meta, nothing to commit), each
call timed alone. Usage: stat-latency.py DIR [N]. Prints p10, p50, p90
and the mean in microseconds. (docs/BENCHMARKS.md, "Spinning while a
reply is due".)"""
import os, sys, time, statistics
d = sys.argv[1]; n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
tag = f"{os.getpid()}-{time.time_ns()}"
ts = []
for i in range(n):
    p = f"{d}/nx-{tag}-{i}"
    t = time.perf_counter_ns()
    try:
        os.stat(p)
    except FileNotFoundError:
        pass
    ts.append((time.perf_counter_ns() - t) / 1000)
ts.sort()
q = lambda f: ts[int(f * (len(ts) - 1))]
print(f"{d}: missing-name stat n={n} p10 {q(.1):.0f} p50 {q(.5):.0f} p90 {q(.9):.0f} mean {statistics.mean(ts):.0f} us")
