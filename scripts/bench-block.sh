#!/usr/bin/env bash
# The block service against its floors, in one run (BENCHMARKS.md, "Block volumes"): fio's nbd
# engine against `cairn nbd` next to `cairn bench append|read` of the same size and depth,
# alternating ROUNDS times. Needs a running `cairn up` in this directory (its NBD server and
# cluster) and fio. Usage: scripts/bench-block.sh [NBD_ADDR] [ROUNDS] [SECONDS]
set -euo pipefail
NBD=${1:-127.0.0.1:10809}
ROUNDS=${2:-3}
SECS=${3:-10}
CAIRN=${CAIRN:-cairn}
VOL=bench-$$
SIZE=${SIZE:-1g}
"$CAIRN" volume create "$VOL" --size "$SIZE" >/dev/null
trap '"$CAIRN" volume delete "$VOL" >/dev/null 2>&1 || true' EXIT
# `cairn up` serves NBD over TLS and makes the admin a client certificate in cairn-data/nbd-admin.
if [ -d cairn-data/nbd-admin ]; then
    URI="nbds://$NBD/$VOL?tls-certificates=$PWD/cairn-data/nbd-admin"
else
    URI="nbd://$NBD/$VOL"
fi
fio_iops() { # rw bs depth extra... -> "iops MiB/s"
    local rw=$1 bs=$2 depth=$3; shift 3
    fio --name=b --ioengine=nbd --uri="$URI" --rw="$rw" --bs="$bs" --iodepth="$depth" \
        --size="$SIZE" --runtime="$SECS" --time_based --output-format=json "$@" 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; d=j["write"] if j["write"]["io_bytes"] else j["read"]; print(round(d["iops"]), round(d["bw"]/1024,1))'
}
bench() { # op size depth -> "ops/s MiB/s"
    "$CAIRN" bench "$1" --size "$2" --depth "$3" --seconds "$SECS" --json 2>/dev/null | head -1 |
        python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); print(round(j.get("ops_per_s", 0)), round(j.get("mib_per_s", 0),1))'
}
# The volume written once end to end, so reads find data.
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1m --iodepth=8 --size="$SIZE" >/dev/null 2>&1
echo "round,what,fio_ops_per_sec,fio_mib_per_sec,floor_ops_per_sec,floor_mib_per_sec,ratio"
for r in $(seq 1 "$ROUNDS"); do
    f=$(bench append 4k 32); n=$(fio_iops randwrite 4k 32 --fsync=32)
    echo "$r,4k-randwrite-d32-flush32,${n% *},${n#* },${f% *},${f#* },$(python3 -c "print(round(${n% *}/max(${f% *},1),3))")"
    f=$(bench read 4k 32); n=$(fio_iops randread 4k 32)
    echo "$r,4k-randread-d32,${n% *},${n#* },${f% *},${f#* },$(python3 -c "print(round(${n% *}/max(${f% *},1),3))")"
    f=$(bench append 1m 8); n=$(fio_iops write 1m 8)
    echo "$r,1m-write-d8,${n% *},${n#* },${f% *},${f#* },$(python3 -c "print(round(${n#* }/max(${f#* },0.1),3))")"
    f=$(bench read 1m 8); n=$(fio_iops read 1m 8)
    echo "$r,1m-read-d8,${n% *},${n#* },${f% *},${f#* },$(python3 -c "print(round(${n#* }/max(${f#* },0.1),3))")"
done
