#!/usr/bin/env bash
# Garbage collection's write amplification (BENCHMARKS.md, "Block volumes: GC"): a volume of
# SIZE is written end to end, then half of its blocks are overwritten once each at random in
# 4 KiB writes (fio's random map) and verified; the collector compacts segments under
# GC_PCT % live. Reports the bytes clients wrote, the bytes the collector copied, write
# amplification (client + collector bytes over client bytes, for the whole run and for the
# overwrite alone) and the bytes the volume's files hold. Needs a running `cairn up` in this
# directory (its masters and cluster secret) and fio; starts its own `cairn nbd` (metrics on).
# Usage: SIZE=4g POLICY=replicas:2 SEGMENT=128m GC_PCT=50 scripts/bench-gc.sh
set -euo pipefail
CAIRN=${CAIRN:-cairn}
SIZE=${SIZE:-4g}
POLICY=${POLICY:-}
GC_PCT=${GC_PCT:-50}
DATA=${DATA:-cairn-data}
VOL=gc-$$
MASTERS=$(python3 -c 'import re,sys; t=open(sys.argv[1]).read(); print(",".join(re.findall(r"\"([^\"]+:[0-9]+)\"", t.split("masters",1)[1].split("]",1)[0])))' "$DATA/cluster.toml")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
MPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$CAIRN" volume create "$VOL" --size "$SIZE" ${POLICY:+--policy "$POLICY"} >/dev/null
"$CAIRN" nbd --listen "127.0.0.1:$PORT" --nbd-insecure --masters "$MASTERS" --cluster-secret-file "$DATA/cluster.secret" \
    --metrics-listen "127.0.0.1:$MPORT" --gc-every-ms 2000 --gc-live-pct "$GC_PCT" --gc-rate 256m \
    --segment-bytes "${SEGMENT:-128m}" >/tmp/bench-gc-nbd.$$ 2>&1 &
NBD_PID=$!
trap 'kill $NBD_PID 2>/dev/null || true; sleep 1; "$CAIRN" volume delete "$VOL" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 50); do grep -q "listening on" /tmp/bench-gc-nbd.$$ && break; sleep 0.2; done
URI="nbd://127.0.0.1:$PORT/$VOL"
metric() { # a counter's value (0 before it is counted), whatever its labels
    local v
    v=$(curl -s "http://127.0.0.1:$MPORT/metrics" |
        awk -v m="$1" '{ n = $1; sub(/\{.*/, "", n) } n == m { print $2 }' | tail -1)
    echo "${v:-0}"
}
started=$(date +%s)
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1m --iodepth=8 --size="$SIZE" >/dev/null
fill=$(metric cairn_block_written_bytes_total)
# Half of the blocks, each once (fio's random map), verified after.
fio --name=over --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=32 --size="$SIZE" \
    --io_size=$(python3 -c "
s='$SIZE'.lower(); u={'k':1<<10,'m':1<<20,'g':1<<30}
print(int(float(s[:-1])*u[s[-1]]) // 2 if s[-1] in u else int(s)//2)") \
    --fsync=32 --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse >/dev/null
written=$(metric cairn_block_written_bytes_total)
# The collector settles: no bytes copied over three passes.
last=-1
for _ in $(seq 1 120); do
    gc=$(metric cairn_block_gc_bytes_total)
    [ "$gc" = "$last" ] && break
    last=$gc; sleep 6
done
stored=$("$CAIRN" volume info "$VOL" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["stored_bytes"])')
segs=$(metric cairn_block_gc_segments_total)
python3 - "$fill" "$written" "$gc" "$stored" "${segs:-0}" "$SIZE" "$(( $(date +%s) - started ))" <<'PY'
import sys
fill, written, gc, stored, segs = (float(x) for x in sys.argv[1:6])
over = written - fill
print("size,client_bytes,overwrite_bytes,gc_bytes,gc_segments_deleted,wa_total,wa_overwrite,stored_bytes,stored_over_size,seconds")
size = {'k':1<<10,'m':1<<20,'g':1<<30}[sys.argv[6][-1].lower()] * float(sys.argv[6][:-1])
print(f"{sys.argv[6]},{int(written)},{int(over)},{int(gc)},{int(segs)},{(written+gc)/written:.3f},{(over+gc)/max(over,1):.3f},{int(stored)},{stored/size:.3f},{sys.argv[7]}")
PY
