#!/usr/bin/env bash
# NBD over TLS against plain NBD, same run (issue 38 targets; BENCHMARKS.md "NBD over TLS"):
# the running `cairn up`'s NBD server (TLS 1.3, the admin's client certificate in
# cairn-data/nbd-admin) next to a second `cairn nbd --nbd-insecure` this script starts on the
# same cluster, each serving a volume of its own, nbdcopy (libnbd; fio's nbd engine refuses
# `tls-certificates=` in a URI) alternating between them ROUNDS times: random data from memory
# onto the volume in 4 KiB writes at depth 32 (SMALL bytes) and in 1 MiB writes at depth 8
# (LARGE bytes), flushed at the end. Offsets are sequential; on a log-structured volume a
# random write costs what a sequential one does. Prints CSV rows and the median ratio TLS /
# plain of each. Deletes its volumes and files at the end.
# Usage (in the directory of a running `cairn up`): scripts/bench-nbd-tls.sh [ROUNDS]
set -euo pipefail
ROUNDS=${1:-5}
CAIRN=${CAIRN:-cairn}
SMALL=${SMALL:-64}   # MiB written in 4 KiB requests
LARGE=${LARGE:-512}  # MiB written in 1 MiB requests
SIZE=${SIZE:-1g}
DATA=${DATA:-cairn-data}
CERTS=$PWD/$DATA/nbd-admin
[ -d "$CERTS" ] || { echo "no $CERTS: run in the directory of a running \`cairn up\`" >&2; exit 1; }
TLS_ADDR=$(python3 -c 'import re,sys; t=open(sys.argv[1]).read(); s=t.split("[[nbd]]",1)[1]; print(re.search(r"addr = \"([^\"]+)\"", s).group(1))' "$DATA/cluster.toml")
MASTERS=$(python3 -c 'import re,sys; t=open(sys.argv[1]).read(); print(",".join(re.findall(r"\"([^\"]+:[0-9]+)\"", t.split("masters",1)[1].split("]",1)[0])))' "$DATA/cluster.toml")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
VT=tls-$$; VP=plain-$$
"$CAIRN" volume create "$VT" --size "$SIZE" >/dev/null
"$CAIRN" volume create "$VP" --size "$SIZE" >/dev/null
"$CAIRN" nbd --listen "127.0.0.1:$PORT" --nbd-insecure --masters "$MASTERS" \
    --cluster-secret-file "$DATA/cluster.secret" >/tmp/bench-nbd-tls.$$ 2>&1 &
NBD_PID=$!
SRC=/dev/shm/bench-nbd-tls.$$
trap 'kill $NBD_PID 2>/dev/null || true; sleep 2; "$CAIRN" volume delete "$VT" >/dev/null 2>&1 || true; "$CAIRN" volume delete "$VP" >/dev/null 2>&1 || true; rm -f /tmp/bench-nbd-tls.$$ "$SRC".*' EXIT
head -c "${SMALL}M" /dev/urandom > "$SRC.small"
head -c "${LARGE}M" /dev/urandom > "$SRC.large"
for _ in $(seq 1 50); do grep -q "listening on" /tmp/bench-nbd-tls.$$ && break; sleep 0.2; done
URI_TLS="nbds://$TLS_ADDR/$VT?tls-certificates=$CERTS"
URI_PLAIN="nbd://127.0.0.1:$PORT/$VP"
copy() { # uri src request-size depth -> "ops/s MiB/s"
    local t0 t1 bytes
    bytes=$(stat -c %s "$2")
    t0=$(date +%s.%N)
    nbdcopy --connections=1 --request-size="$3" --requests="$4" --flush "$2" "$1"
    t1=$(date +%s.%N)
    python3 -c "d=$t1-$t0; print(round($bytes/$3/d), round($bytes/d/1048576,1))"
}
echo "round,what,tls_ops_per_sec,tls_mib_per_sec,plain_ops_per_sec,plain_mib_per_sec,ratio"
rows=()
for r in $(seq 1 "$ROUNDS"); do
    for w in "small 4096 32" "large 1048576 8"; do
        set -- $w
        p=$(copy "$URI_PLAIN" "$SRC.$1" "$2" "$3"); t=$(copy "$URI_TLS" "$SRC.$1" "$2" "$3")
        ratio=$(python3 -c "print(round(${t% *}/max(${p% *},1),3))")
        row="$r,write-$2-d$3,${t% *},${t#* },${p% *},${p#* },$ratio"
        echo "$row"; rows+=("$row")
    done
done
printf '%s\n' "${rows[@]}" | python3 -c '
import sys, statistics
by = {}
for l in sys.stdin:
    f = l.strip().split(",")
    by.setdefault(f[1], []).append(float(f[6]))
for k, v in by.items():
    print(f"median ratio TLS/plain {k}: {statistics.median(v):.3f} over {len(v)} rounds")'
