#!/usr/bin/env bash
# The control plane over TLS against plain TCP (issue 38 §4 target: creates/s ≥ 0.95 of plain;
# BENCHMARKS.md "Control plane over TLS"). Each round starts a fresh `cairn up` twice in
# scratch directories — once with the default (masters serve TLS, every client checks them
# with the cluster CA), once with --no-tls — and runs `cairn bench create` at DEPTH for SECONDS
# after a 2 s warm-up. CPU per create is summed over the cluster's processes (their
# /proc/PID/stat utime+stime) and the bench client (/usr/bin/time). Prints CSV rows and the
# median ratio TLS / plain. Each cluster is stopped and its directory deleted after its run.
# Usage: scripts/bench-control-tls.sh [ROUNDS]   (CAIRN=path/to/release/cairn)
# With CAIRN_B=path/to/another/cairn the A/B is two builds instead, both on their default
# (TLS): A = CAIRN (reported in the "tls" columns), B = CAIRN_B (in the "plain" columns).
set -euo pipefail
ROUNDS=${1:-3}
CAIRN=$(readlink -f "${CAIRN:-target/release/cairn}")
CAIRN_B=${CAIRN_B:+$(readlink -f "$CAIRN_B")}
BIN=$CAIRN
DEPTH=${DEPTH:-16}
SECONDS_RUN=${SECONDS_RUN:-6}
SCRATCH=${SCRATCH:-/tmp/bench-control-tls.$$}
mkdir -p "$SCRATCH"
UP_PID=
trap '[ -n "$UP_PID" ] && kill "$UP_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$SCRATCH"' EXIT
TICK=$(getconf CLK_TCK)

# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"

run() { # flags -> "creates_per_sec cpu_us_per_create"
    local dir="$SCRATCH/c" out
    rm -rf "$dir"; mkdir -p "$dir"
    (cd "$dir" && exec "$BIN" up --chunkservers 3 --disk-size 2g --no-s3 --no-nbd "$@" \
        >"$SCRATCH/up.log" 2>&1) &
    UP_PID=$!
    for _ in $(seq 1 300); do
        grep -q "ready" "$SCRATCH/up.log" 2>/dev/null && break
        sleep 0.2
    done
    grep -q "ready" "$SCRATCH/up.log" || { cat "$SCRATCH/up.log" >&2; exit 1; }
    (cd "$dir" && "$BIN" bench create --depth "$DEPTH" --seconds 2 --json >/dev/null)
    local c0 c1
    c0=$(cluster_cpu)
    out=$(cd "$dir" && /usr/bin/time -f "CPU %U %S" "$BIN" bench create --depth "$DEPTH" \
        --seconds "$SECONDS_RUN" --json 2>&1)
    c1=$(cluster_cpu)
    kill "$UP_PID"; wait "$UP_PID" 2>/dev/null || true; UP_PID=
    echo "$out" | creates_and_cpu "$c0" "$c1"
}

echo "round,tls_creates_per_sec,tls_cpu_us_per_create,plain_creates_per_sec,plain_cpu_us_per_create,ratio_creates,ratio_cpu"
rows=()
for r in $(seq 1 "$ROUNDS"); do
    BIN=$CAIRN; t=$(run)
    if [ -n "$CAIRN_B" ]; then BIN=$CAIRN_B; p=$(run); else p=$(run --no-tls); fi
    row="$r,${t% *},${t#* },${p% *},${p#* },$(python3 -c "print(round(${t% *}/max(${p% *},1),3), round(${t#* }/max(${p#* },1),3), sep=',')")"
    echo "$row"; rows+=("$row")
done
printf '%s\n' "${rows[@]}" | python3 -c '
import sys, statistics
f = [l.strip().split(",") for l in sys.stdin]
print(f"median ratio A/B (TLS/plain, or CAIRN/CAIRN_B) creates/s: {statistics.median(float(x[5]) for x in f):.3f}, CPU per create: {statistics.median(float(x[6]) for x in f):.3f} over {len(f)} rounds")'
