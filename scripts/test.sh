#!/usr/bin/env bash
# The whole test suite: install, lint, build, unit and multi-process tests,
# and a short benchmark smoke run (no timing is asserted anywhere).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
DAFNE_LOG=${DAFNE_LOG:-error} cargo test --workspace --no-fail-fast
echo "== benchmark smoke run (shared memory, 64 KiB)"
cargo run --quiet -p dafne -- bench transport --quick --no-perftest --transports shm --sizes 64K --json target/bench-smoke.json
