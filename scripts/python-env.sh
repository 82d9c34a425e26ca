#!/usr/bin/env bash
# The Python test environment (idempotent): a venv in target/pyenv with the
# pinned packages of crates/dafne-py/requirements-test.txt. It is made
# again only when that file changes (its hash is kept in the venv).
# Prints the venv's python on stdout's last line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv
req=crates/dafne-py/requirements-test.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  py=${PYTHON:-python3}
  if ! "$py" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "error: the Python tests need Python >= 3.11 as \`$py\` (set PYTHON=/path/to/python3.11)" >&2
    exit 1
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$venv/.requirements.sha256"
fi
echo "$PWD/$venv/bin/python"
