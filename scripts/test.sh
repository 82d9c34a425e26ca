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
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== fuzz targets: compiled for cargo-fuzz (nightly), and run here on stable by a mutation sweep (DAFNE_FUZZ_SECONDS per target)"
cargo check --quiet --manifest-path fuzz/Cargo.toml --bins
DAFNE_FUZZ_SECONDS=${DAFNE_FUZZ_SECONDS:-10} cargo test --quiet --manifest-path fuzz/Cargo.toml
echo "== test tools: fsx and pjdfstest (crates.io), run against a real mount"
# Built once per machine, outside the clone (like cargo's own registry
# cache), so a clean clone does not compile them again; the version check
# below still installs the pinned one wherever the cache holds another.
TOOLS="${DAFNE_TOOLS_CACHE:-$HOME/.cache/dafne/tools}"
mkdir -p "$TOOLS"
export DAFNE_TOOLS_DIR="$TOOLS/bin"
# Pinned: a new release of a conformance tool must not change what CI tests.
for tv in fsx@0.3.2 pjdfstest@0.2.2; do
  t=${tv%@*}; v=${tv#*@}
  if ! [ -x "$TOOLS/bin/$t" ] || ! grep -q "\"$t $v " "$TOOLS/.crates.toml" 2>/dev/null; then
    cargo install --locked --quiet --force --root "$TOOLS" "$t" --version "$v"
  fi
done
# The mount tests must run them (no skipping when a tool is missing), and
# the O_DIRECT tests must run (the build directory is on a real disk here).
export DAFNE_REQUIRE_TOOLS=1
export DAFNE_REQUIRE_DIRECT=1
echo "== cargo test"
DAFNE_LOG=${DAFNE_LOG:-error} cargo test --workspace --no-fail-fast
echo "== Python package (crates/dafne-py): abi3 wheel by maturin, pytest against a real cluster (scripts/test-python.sh)"
bash scripts/test-python.sh
echo "== benchmark smoke run (shared memory, 64 KiB)"
cargo run --quiet -p dafne -- bench transport --quick --no-perftest --transports shm --sizes 64K --json target/bench-smoke.json
echo "== every seed experiment, the short pass (dafne bench seeds --quick; it includes the NBD block-vs-file run)"
cargo run --quiet -p dafne -- bench seeds --quick --out target/bench-seeds-smoke
