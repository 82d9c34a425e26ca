#!/usr/bin/env bash
# The Python package's tests: builds the `dafne` command (the tests start a
# cluster with it) and the package's wheel (maturin, a debug build sharing
# the workspace's cargo cache), installs the wheel into the test venv
# (scripts/python-env.sh) and runs pytest on crates/dafne-py/tests against
# real clusters. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
py=$(bash scripts/python-env.sh | tail -n 1)
venv=$(dirname "$(dirname "$py")")
cargo build --quiet -p dafne --bin dafne
rm -rf target/wheels
"$venv/bin/maturin" build --quiet -m crates/dafne-py/Cargo.toml -i "$py" -o target/wheels
"$py" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps target/wheels/dafne-*.whl
export DAFNE_BIN="$PWD/target/debug/dafne"
cd crates/dafne-py
exec "$py" -m pytest -q -p no:cacheprovider tests "$@"
