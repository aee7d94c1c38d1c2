#!/usr/bin/env bash
# Space that separate one-line `cairn fs append`s use: N invocations (default 1000), each its
# own process and writer, append one line to one file of a fresh `cairn up` cluster; prints the
# chunks the file has and the bytes each chunkserver's store grew by (and the time per
# append). The floor is the bytes appended. The cluster (target/bench-append-data) is stopped
# and removed at the end.
#
#   scripts/bench-append-space.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}
ROOT=$PWD
DATA=$ROOT/target/bench-append-data
cargo build --release --locked --quiet
CAIRN=$ROOT/target/release/cairn
rm -rf "$DATA"
mkdir -p "$DATA"
"$CAIRN" up --data-dir "$DATA/cairn-data" --disk-size 1g --no-zero-fill --no-nbd --no-s3 \
    > "$DATA/up.log" 2>&1 &
UP=$!
cleanup() {
    "$CAIRN" down --data-dir "$DATA/cairn-data" >/dev/null 2>&1 || kill "$UP" 2>/dev/null || true
    wait "$UP" 2>/dev/null || true
    rm -rf "$DATA"
}
trap cleanup EXIT
for _ in $(seq 1 600); do
    grep -q "cairn up: ready" "$DATA/up.log" 2>/dev/null && break
    sleep 0.1
done
cd "$DATA"
used() {
    "$CAIRN" status --json | python3 -c 'import json,sys; print(" ".join(str(c["used_bytes"]) for c in sorted(json.load(sys.stdin)["chunkservers"], key=lambda c: c["id"])))'
}
sleep 2
BEFORE=$(used)
START=$(date +%s.%N)
for i in $(seq 1 "$N"); do
    echo "line $i of the append benchmark" | "$CAIRN" fs append /bench/log >/dev/null
done
END=$(date +%s.%N)
sleep 3
AFTER=$(used)
STAT=$("$CAIRN" fs stat --json /bench/log)
python3 - "$N" "$BEFORE" "$AFTER" "$STAT" "$START" "$END" <<'EOF'
import json, sys
n, before, after, stat, start, end = sys.argv[1:]
before = [int(x) for x in before.split()]
after = [int(x) for x in after.split()]
st = json.loads(stat)
grown = [a - b for a, b in zip(after, before)]
print(json.dumps({
    "appends": int(n),
    "file_bytes": st["length"],
    "chunks": st["chunks"],
    "grown_bytes_per_server": grown,
    "max_grown_mib": round(max(grown) / 2**20, 2),
    "ms_per_append": round((float(end) - float(start)) * 1000 / int(n), 1),
}))
EOF
