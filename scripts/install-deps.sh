#!/usr/bin/env bash
# Installs what dafne needs on Debian 12 (idempotent: safe to run again).
# UCX 1.13 headers and tools, libclang for bindgen, FUSE for the mount, the
# ordinary tools the mount tests and the sample workload run (setfattr and
# getfattr from attr, python3 for renameat2 through ctypes; and the
# loop-device ext4 of the power-cut test; python3-venv and pip for the
# Python package's test venv, scripts/python-env.sh), and the
# workloads of `dafne bench posix` (fio 3.33, PostMark 1.53, and bindfs for
# its FUSE ceiling); the NBD clients the `dafne nbd serve` tests and
# `dafne bench nbd` drive (libnbd's nbdinfo/nbdcopy, nbdsh from
# python3-libnbd, qemu-img from qemu-utils; fio's nbd engine is in fio);
# gcc (cc) to build the C API's test programs (crates/dafne/tests/capi.rs);
# and iproute2 (ip, ss) for the multi-host test's network namespaces
# (crates/dafne/tests/multihost.rs).
set -euo pipefail

pkgs=(libucx-dev ucx-utils libclang-dev clang pkg-config fuse3 libfuse3-dev
      git rsync sqlite3 tar coreutils findutils jq e2fsprogs mount util-linux
      fio postmark bindfs attr python3 libnbd-bin python3-libnbd qemu-utils gcc python3-venv python3-pip iproute2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo (Rust >= 1.90) is not installed; install it with rustup (https://rustup.rs) and run this again" >&2
  exit 1
fi
# The workspace's rust-version (Cargo.toml): redb needs 1.90, the vendored
# fuser edition 2024.
rust_minor=$(rustc --version 2>/dev/null | sed -n 's/^rustc 1\.\([0-9]*\).*/\1/p')
if [ -z "$rust_minor" ] || [ "$rust_minor" -lt 90 ]; then
  echo "error: Rust >= 1.90 is needed ($(rustc --version 2>/dev/null || echo 'no rustc')); update it: rustup update stable" >&2
  exit 1
fi
for c in clippy rustfmt; do
  if ! cargo "$c" --version >/dev/null 2>&1; then
    rustup component add "$c" >/dev/null 2>&1 || { echo "error: cargo $c is missing: rustup component add $c" >&2; exit 1; }
  fi
done
