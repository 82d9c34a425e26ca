#!/usr/bin/env bash
# pjdfstest against a fresh dafne mount: a measurement, not a gate (the
# test suite's gate is crates/dafne/tests/mount.rs, which fails when the
# failures exceed what docs/CONFORMANCE.md documents).
#
#   scripts/pjdfstest.sh [PATTERN...]     e.g. scripts/pjdfstest.sh chmod rename
#
# Builds dafne, installs pjdfstest into target/tools if absent, starts a
# cluster in a temporary directory (ports from DAFNE_PJD_META_PORT /
# DAFNE_PJD_IO_BASE_PORT, default 7800/7810), mounts it, runs pjdfstest as
# root (it switches to the users nobody and daemon), prints pass/fail/skip
# per group and every failure, and stops everything again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(id -u)" != 0 ]; then
  echo "pjdfstest needs root (it changes owners and switches users)" >&2
  exit 2
fi
TOOLS="$PWD/target/tools"
# The same pinned release as CI (scripts/test.sh).
[ -x "$TOOLS/bin/pjdfstest" ] || cargo install --locked --quiet --root "$TOOLS" pjdfstest --version 0.2.2
cargo build --quiet -p dafne
DAFNE="$PWD/target/debug/dafne"
WORK=$(mktemp -d /tmp/dafne-pjdfstest-XXXXXX)
# The unprivileged users pjdfstest switches to must reach the mount point.
chmod 755 "$WORK"
cleanup() {
  "$DAFNE" umount "$WORK/mnt" --dir "$WORK/cluster" >/dev/null 2>&1 || true
  "$DAFNE" down --dir "$WORK/cluster" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/cluster" "$WORK/mnt"
"$DAFNE" up --dir "$WORK/cluster" --cache-mib 8 \
  --meta-port "${DAFNE_PJD_META_PORT:-7800}" --io-base-port "${DAFNE_PJD_IO_BASE_PORT:-7810}" >/dev/null
"$DAFNE" mount "$WORK/mnt" --dir "$WORK/cluster" >/dev/null
mkdir "$WORK/mnt/pjd"
cd "$WORK/mnt/pjd"
set +e
PATH="$OLDPWD/scripts/pjdfstest-bin:$PATH" "$TOOLS/bin/pjdfstest" -c "$OLDPWD/scripts/pjdfstest.toml" -p "$WORK/mnt/pjd" "$@" >"$WORK/out.txt" 2>&1
# The EROFS tests in a process of their own (scripts/pjdfstest.toml says why).
if [ "$#" -eq 0 ]; then
  sed 's/^allow_remount = false/allow_remount = true/' "$OLDPWD/scripts/pjdfstest.toml" >"$WORK/remount.toml"
  PATH="$OLDPWD/scripts/pjdfstest-bin:$PATH" "$TOOLS/bin/pjdfstest" -c "$WORK/remount.toml" -p "$WORK/mnt/pjd" erofs \
    >"$WORK/out-erofs.txt" 2>&1
  # Their lines replace the first run's "skipped" ones.
  grep -v -E '::erofs[a-z_0-9]* +skipped$' "$WORK/out.txt" >"$WORK/out-rest.txt"
  cat "$WORK/out-rest.txt" "$WORK/out-erofs.txt" >"$WORK/out.txt"
fi
set -e
cd "$OLDPWD"
echo "| group | passed | failed | skipped |"
echo "|---|---:|---:|---:|"
grep -E '^[a-z_0-9]+::[a-z_0-9:]+ +(ok|FAILED|skipped)$' "$WORK/out.txt" | awk '
  { split($1, a, "::"); g = a[1]; r = $NF; n[g " " r]++; seen[g] = 1 }
  END { for (g in seen) printf "| %s | %d | %d | %d |\n", g, n[g " ok"], n[g " FAILED"], n[g " skipped"] }' | sort
echo
grep '^Summary:' "$WORK/out.txt" || { echo "pjdfstest printed no summary:"; tail -40 "$WORK/out.txt"; exit 1; }
echo
echo "Failures (test, then the first line of its message):"
awk '/ FAILED$/ { name = $1; getline msg; sub(/^[ \t]+/, "", msg); printf "  %s: %s\n", name, msg }' "$WORK/out.txt"
