#!/usr/bin/env bash
# Creates spread over four partitions against creates in one (issue 39; BENCHMARKS.md
# "Partitions"). One `cairn up` (one master, 3 chunkservers, no S3 or NBD) in a scratch
# directory; four empty subtrees /p1../p4 split into partitions 1..4 (each its own Raft group,
# log and store in the same master process). Each round runs `cairn bench create` at DEPTH for
# SECONDS three times, alternating: every writer in the root partition (/, as before
# partitions), every writer under /p1 (one partition), then writers spread over /p1,/p2,/p3,/p4
# (four); a 2 s warm-up first. CPU per create is summed over the cluster's
# processes (their /proc/PID/stat utime+stime) and the bench client (/usr/bin/time), and the
# master's own share apart (the issue's target is for the master). Prints CSV
# rows and the median ratios four / one. The cluster is stopped and its directory deleted.
# Usage: scripts/bench-partitions.sh [ROUNDS]   (CAIRN=path/to/release/cairn)
set -euo pipefail
ROUNDS=${1:-3}
BIN=$(readlink -f "${CAIRN:-target/release/cairn}")
DEPTH=${DEPTH:-64}
SECONDS_RUN=${SECONDS_RUN:-6}
SCRATCH=${SCRATCH:-/tmp/bench-partitions.$$}
mkdir -p "$SCRATCH/c"
UP_PID=
trap '[ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$SCRATCH"' EXIT
TICK=$(getconf CLK_TCK)

# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

(cd "$SCRATCH/c" && exec "$BIN" up --chunkservers 3 --disk-size 2g --no-s3 --no-nbd \
    >"$SCRATCH/up.log" 2>&1) &
UP_PID=$!
for _ in $(seq 1 300); do
    grep -q "ready" "$SCRATCH/up.log" 2>/dev/null && break
    sleep 0.2
done
grep -q "ready" "$SCRATCH/up.log" || { cat "$SCRATCH/up.log" >&2; exit 1; }
for p in 1 2 3 4; do
    (cd "$SCRATCH/c" && "$BIN" admin partition split "/p$p" >/dev/null)
done
(cd "$SCRATCH/c" && "$BIN" bench create --depth "$DEPTH" --seconds 2 --json \
    --under /p1,/p2,/p3,/p4 >/dev/null)

run() { # under -> "creates_per_sec cpu_us_per_create master_cpu_us_per_create"
    local c0 c1 m0 m1 out n
    c0=$(cluster_cpu); m0=$(master_cpu)
    out=$(cd "$SCRATCH/c" && /usr/bin/time -f "CPU %U %S" "$BIN" bench create --depth "$DEPTH" \
        --seconds "$SECONDS_RUN" --json --under "$1" 2>&1)
    c1=$(cluster_cpu); m1=$(master_cpu)
    n=$(echo "$out" | python3 -c "
import json, sys
print(json.loads([l for l in sys.stdin.read().splitlines() if l.startswith('{')][-1])['ops'])")
    echo "$(echo "$out" | creates_and_cpu "$c0" "$c1") $(python3 -c "print(round(($m1 - $m0) / max($n, 1) * 1e6))")"
}

echo "round,root_creates_per_sec,root_cpu_us_per_create,one_creates_per_sec,one_cpu_us_per_create,four_creates_per_sec,four_cpu_us_per_create,four_over_one_creates,four_over_one_cpu,one_over_root_creates,one_over_root_cpu,root_master_us,one_master_us,four_master_us"
rows=()
for r in $(seq 1 "$ROUNDS"); do
    read -r zc zu zm <<<"$(run /)"
    read -r oc ou om <<<"$(run /p1)"
    read -r fc fu fm <<<"$(run /p1,/p2,/p3,/p4)"
    row="$r,$zc,$zu,$oc,$ou,$fc,$fu,$(python3 -c "print(round($fc/max($oc,1),3), round($fu/max($ou,1),3), round($oc/max($zc,1),3), round($ou/max($zu,1),3), sep=',')"),$zm,$om,$fm"
    echo "$row"; rows+=("$row")
done
(cd "$SCRATCH/c" && "$BIN" status --json) | python3 -c '
import json, sys
s = json.load(sys.stdin)
print("partitions:", [(p["id"], p.get("subtree"), p["files"]) for p in s["partitions"]])'
printf '%s\n' "${rows[@]}" | python3 -c '
import sys, statistics
f = [l.strip().split(",") for l in sys.stdin]
m = lambda i: statistics.median(float(x[i]) for x in f)
print(f"medians over {len(f)} rounds: root {m(1):.0f} creates/s, {m(2):.0f} µs CPU/create; one partition {m(3):.0f}, {m(4):.0f}; four {m(5):.0f}, {m(6):.0f}")
print(f"median ratios: four / one partitions creates/s {m(7):.3f}, CPU per create {m(8):.3f}; one partition / root creates/s {m(9):.3f}, CPU per create {m(10):.3f}")
print(f"CPU of the master process per create (median): root {m(11):.0f} µs, one partition {m(12):.0f} µs, four {m(13):.0f} µs")'
