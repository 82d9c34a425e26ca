#!/usr/bin/env bash
# The main job: install, build, start a local dafne cluster with the
# embedded defaults (`dafne up`), mount it, run a sample workload on the
# mount (write, read back and verify files of several sizes, a copy through
# the client library, a short benchmark) and say what to do next. The
# cluster and the mount stay up until `dafne down`.
#
#   DAFNE_HOME   cluster directory (default ~/.dafne)
#   DAFNE_MOUNT  mount point (default /tmp/dafne)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

echo "== building (release)"
cargo build --release --workspace --quiet
DAFNE="$PWD/target/release/dafne"
MNT="${DAFNE_MOUNT:-/tmp/dafne}"

echo "== dafne up"
"$DAFNE" up

echo "== dafne mount $MNT"
mkdir -p "$MNT"
if mountpoint -q "$MNT"; then
  echo "$MNT is mounted already"
else
  "$DAFNE" mount "$MNT"
fi

echo "== sample workload on $MNT"
work="$MNT/sample-$$"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$work"
printf '| file | bytes | write (dd, fsync) | read back (O_DIRECT) | verified |\n|---|---|---|---|---|\n'
for spec in tiny:0 small:4097 medium:1048583 large:67108864 huge:268435456; do
  name="${spec%%:*}"; size="${spec##*:}"
  head -c "$size" /dev/urandom > "$scratch/$name"
  t0=$(date +%s.%N)
  dd if="$scratch/$name" of="$work/$name" bs=1M conv=fsync status=none
  t1=$(date +%s.%N)
  # Read back bypassing the kernel's page cache for the mount.
  dd if="$work/$name" of="$scratch/$name.back" bs=1M iflag=direct status=none 2>/dev/null \
    || cat "$work/$name" > "$scratch/$name.back"
  t2=$(date +%s.%N)
  if cmp -s "$scratch/$name" "$scratch/$name.back"; then ok=yes; else ok=NO; fi
  awk -v n="$name" -v s="$size" -v a="$t0" -v b="$t1" -v c="$t2" -v ok="$ok" 'BEGIN {
    mib = s / 1048576; w = b - a; r = c - b;
    if (mib >= 1) printf "| %s | %d | %.0f ms, %.0f MiB/s | %.0f ms, %.0f MiB/s | %s |\n", n, s, w * 1000, mib / w, r * 1000, mib / r, ok;
    else printf "| %s | %d | %.1f ms | %.1f ms | %s |\n", n, s, w * 1000, r * 1000, ok }'
  [ "$ok" = yes ] || { echo "error: $work/$name does not read back as written" >&2; exit 1; }
  rm -f "$scratch/$name.back"
done

echo
echo "== a directory tree: tar in, list, checksum"
mkdir -p "$scratch/tree"
for i in $(seq 1 200); do
  mkdir -p "$scratch/tree/d$((i % 10))"
  head -c $((i * 97)) /dev/urandom > "$scratch/tree/d$((i % 10))/f$i"
done
tar -C "$scratch" -cf - tree | tar -C "$work" -xf -
diff -r "$scratch/tree" "$work/tree" && echo "200 files in 10 directories: identical ($(find "$work/tree" -type f | wc -l) found on the mount)"

echo
echo "== dafne cp: the client library without the mount (registered buffers, RMA by the servers)"
"$DAFNE" cp -f "$scratch/huge" "dafne:/sample-$$-copy"
"$DAFNE" cp -f "dafne:/sample-$$-copy" "$scratch/huge.back"
cmp "$scratch/huge" "$scratch/huge.back" && echo "verified"

echo
echo "== dafne status"
"$DAFNE" status

rm -rf "$work" "$MNT/sample-$$-copy"
cat <<TXT

dafne is up and mounted on $MNT (it stays up until \`dafne down\`).
Next:
  ls -l $MNT; cp some-file $MNT/                 use it like any directory
  $DAFNE status                  servers, capacity, cache and registration counters
  $DAFNE cp FILE dafne:/FILE     copy through the client library, with progress
  $DAFNE bench io --quick        the io serving modes (normal, mmap, unifier); also bench transport, bench meta
  $DAFNE umount $MNT; $DAFNE down     unmount; stop the cluster (data stays in ~/.dafne)
  $DAFNE config                  a commented configuration (dafne up --config FILE)
  ARCHITECTURE.md, docs/BENCHMARKS.md, docs/CONFORMANCE.md
TXT
