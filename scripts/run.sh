#!/usr/bin/env bash
# The main job: install, build, and run dafne's transport benchmark over
# tcp, shared memory and cma beside ucx_perftest (later issues turn this into
# a local cluster, mounted and exercised).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
echo "== building (release)"
cargo build --release --workspace --quiet
echo "== dafne bench transport"
./target/release/dafne bench transport "$@"
cat <<'TXT'

Next:
  ./target/release/dafne bench transport --help     options (transports, sizes, window, duration)
  ./target/release/dafne bench meta                 metadata creates/stats/unlinks per second
  ./target/release/dafne bench io                   io serving modes (normal, mmap, unifier), re-read, aggregate
  ./target/release/dafne serve meta --help          run a metadata server; `serve io --help` for an io server
  bench-results/*.json                              the figures as JSON
  ARCHITECTURE.md, docs/BENCHMARKS.md               how dafne works and what was measured
TXT
