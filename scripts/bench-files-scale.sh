#!/usr/bin/env bash
# A million files in one mount (issue 40's target: the masters' memory within issue 39's
# bound, 64 MiB of RSS per million files with the default cache): a fresh `cairn up --mount`
# (1 master, 3 chunkservers, TLS) in target/bench-files-scale; FILES files of SIZE bytes made
# through the mount at 16 threads (scripts/bench-smallfiles.py, 16 directories), then the
# master's RSS and data directory, a listing of one directory and a stat of every file, then
# a restart of the master and the time until the mount answers again. Removes the cluster
# at the end.
#
#   scripts/bench-files-scale.sh      FILES=1000000 SIZE=100
#
# Runs as root (the mount).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CAIRN=${CAIRN:-$ROOT/target/release/cairn}
FILES=${FILES:-1000000}
SIZE=${SIZE:-100}
WORK=$ROOT/target/bench-files-scale
MNT=$WORK/mnt
TICK=$(getconf CLK_TCK)
# shellcheck source=bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"
[[ $(id -u) == 0 ]] || { echo "bench-files-scale.sh needs root (the mount)" >&2; exit 2; }
if [[ "$CAIRN" == "$ROOT/target/release/cairn" ]]; then
    cargo build --release --locked --quiet -p cairn
fi
cleanup() {
    (cd "$WORK" 2>/dev/null && "$CAIRN" down >/dev/null 2>&1) || true
    umount -l "$MNT" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
cleanup
mkdir -p "$MNT"
cd "$WORK"
"$CAIRN" up --disk-size ${DISK_SIZE:-4g} --no-s3 --no-nbd --mount "$MNT" >"$WORK/up.log" 2>&1 &
UP_PID=$!
wait_for_mount "$MNT" "$WORK/up.log"
master_pid() { master_pids | head -1; }
rss_mib() { awk '/^VmRSS:/ {print $2 / 1024}' "/proc/$(master_pid)/status"; }
du_mib() { du -sm "$WORK"/cairn-data/master-* | awk '{s += $1} END {print s}'; }
echo "machine: $(nproc) cores, $(uname -r); cairn: $("$CAIRN" --version 2>/dev/null || echo "$CAIRN")"
r0=$(rss_mib); d0=$(du_mib); c0=$(cluster_cpu)
out=$(python3 "$ROOT/scripts/bench-smallfiles.py" "$MNT/m" "$FILES" --size "$SIZE" --keep)
c1=$(cluster_cpu)
sleep 5
r1=$(rss_mib); d1=$(du_mib)
echo "$out"
python3 -c "
n=$FILES
print(f'{n} files of $SIZE B through the mount: master RSS {$r0:.0f} -> {$r1:.0f} MiB = {($r1-$r0)/n*1e6:.1f} MiB per million (target 64: ratio {($r1-$r0)/n*1e6/64:.2f}); master data {$d0} -> {$d1} MiB = {($d1-$d0)*2**20/n:.0f} B per file; cluster CPU {($c1-$c0)/n*1e6:.0f} us per create')"
s=$(date +%s.%N)
n=$(ls -f "$MNT/m/t0" | wc -l)
echo "ls -f of one directory ($n entries): $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s"
# The master restarts (`cairn up` brings it back); the mount answers again.
kill -9 "$(master_pid)"
s=$(date +%s.%N)
until stat "$MNT/m/t0/f1" >/dev/null 2>&1; do sleep 0.1; done
echo "master killed: the mount answered again after $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s"
r2=$(rss_mib)
echo "restarted master RSS: $r2 MiB"
