#!/usr/bin/env python3
"""Round trips per small-file call through a dafne mount, from the servers'
metrics pages: N files of 16 KiB per phase; per phase, meta's requests by op,
its durable and lazy commits, the io servers' requests by op and storage
syncs, divided by N; background requests (watch, heartbeats, revocation
polls) left out. Works with any build (it reads the servers' metrics pages,
named in CLUSTERDIR/cluster.json). Creates and removes MOUNTDIR/t/f0..
Usage: small-file-round-trips.py MOUNTDIR CLUSTERDIR [N]
(docs/BENCHMARKS.md, "Round trips per small-file call".)"""
import json, os, re, sys, time, urllib.request
d, cdir = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
info = json.load(open(f"{cdir}/cluster.json"))
pages = [(m["server"], m["addr"]) for m in info["metrics"]]
data = os.urandom(16384)
os.makedirs(f"{d}/t", exist_ok=True)
skip = {"watch", "server_heartbeat", "members", "ping", "server_info", "recap", "reopen", "revoke", "revocations"}
def scrape():
    time.sleep(1.2)
    out = {}
    for server, addr in pages:
        side = "meta" if server == "meta" else "io"
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
        for l in text.splitlines():
            m = re.match(r'(dafne_(?:meta|io)_requests_total)\{.*op="([a-z_]+)".*\} (\d+)', l)
            if m and m.group(2) not in skip:
                k = f"{side}:{m.group(2)}"; out[k] = out.get(k, 0) + int(m.group(3))
            for name, key in [("dafne_meta_commits_total", "commits"), ("dafne_meta_lazy_commits_total", "lazy"),
                              ("dafne_io_storage_syncs_total", "io fdatasync")]:
                m = re.match(name + r'\{[^}]*\} (\d+)', l)
                if m:
                    out[key] = out.get(key, 0) + int(m.group(1))
    return out
def create(i): os.close(os.open(f"{d}/t/f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
def write(i):
    fd = os.open(f"{d}/t/f{i}", os.O_WRONLY); os.write(fd, data); os.close(fd)
def read(i):
    fd = os.open(f"{d}/t/f{i}", os.O_RDONLY); os.read(fd, 65536); os.close(fd)
prev = scrape()
for name, f in [("create+close", create), ("open+write 16K+close", write), ("open+read+close", read),
                ("stat", lambda i: os.stat(f"{d}/t/f{i}")), ("unlink", lambda i: os.unlink(f"{d}/t/f{i}"))]:
    for i in range(n):
        f(i)
    cur = scrape()
    parts = []
    tot = {"meta": 0.0, "io": 0.0}
    for k in sorted(cur):
        v = (cur[k] - prev.get(k, 0)) / n
        if v >= 0.005:
            parts.append(f"{k} {v:.2f}")
            if ":" in k:
                tot[k.split(":")[0]] += v
    print(f"{name:22s} meta {tot['meta']:.2f} io {tot['io']:.2f} | " + ", ".join(parts))
    prev = cur
os.rmdir(f"{d}/t")
