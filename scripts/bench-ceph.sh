#!/usr/bin/env bash
# Ceph's `rados bench` 4 KiB random reads at 32 in flight against a throwaway Ceph cluster on
# this machine — 1 monitor and 3 BlueStore OSDs on files under one directory, a pool of 3
# replicas, like `cairn up`'s 3 chunkservers — next to fio's nbd engine against a Cairn volume
# in the same run (BENCHMARKS.md, "Block volumes": the 10× Ceph target of issue 28). Installs
# Ceph from the distribution (apt: ceph-mon ceph-osd ceph-common) when it is missing. Needs a
# running `cairn up` in the current directory (its NBD server) and fio.
# Usage: scripts/bench-ceph.sh [NBD_ADDR] [ROUNDS] [SECONDS]
set -euo pipefail
NBD=${1:-127.0.0.1:10809}
ROUNDS=${2:-3}
SECS=${3:-10}
CAIRN=${CAIRN:-cairn}
OSD_BYTES=${OSD_BYTES:-$((2 << 30))}
if ! command -v ceph-osd >/dev/null || ! command -v rados >/dev/null; then
    sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
    $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ceph-mon ceph-osd ceph-common >/dev/null
fi
D=$(mktemp -d /tmp/bench-ceph.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 1
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$D"
    "$CAIRN" volume delete "bench-ceph-$$" >/dev/null 2>&1 || true
}
trap cleanup EXIT
FSID=$(cat /proc/sys/kernel/random/uuid)
PORT=$((20000 + RANDOM % 20000))
mkdir -p "$D"/{run,log,mon,osd}
cat >"$D/ceph.conf" <<EOF
[global]
fsid = $FSID
mon host = v1:127.0.0.1:$PORT
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 3
osd pool default min size = 2
osd crush chooseleaf type = 0
run dir = $D/run
log file = $D/log/\$name.log
admin socket = $D/run/\$name.asok
mon data = $D/mon/\$name
osd data = $D/osd/\$name
osd objectstore = bluestore
bluestore block create = true
bluestore block size = $OSD_BYTES
osd memory target = 1073741824
mon allow pool delete = true
ms bind ipv6 = false
EOF
C=(-c "$D/ceph.conf")
monmaptool --create --addv a "[v1:127.0.0.1:$PORT]" --fsid "$FSID" "$D/monmap" >/dev/null
ceph-mon "${C[@]}" --mkfs -i a --monmap "$D/monmap" >/dev/null
ceph-mon "${C[@]}" -i a -f >/dev/null 2>&1 &
PIDS+=($!)
for i in 0 1 2; do
    uuid=$(cat /proc/sys/kernel/random/uuid)
    id=$(timeout 60 ceph "${C[@]}" osd new "$uuid")
    mkdir -p "$D/osd/osd.$id"
    ceph-osd "${C[@]}" -i "$id" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1
    ceph-osd "${C[@]}" -i "$id" -f >/dev/null 2>&1 &
    PIDS+=($!)
done
timeout 60 ceph "${C[@]}" osd pool create bench 32 32 >/dev/null 2>&1
# Writes block until the pool's placement groups are active on 3 OSDs.
for _ in $(seq 1 120); do
    timeout 5 rados "${C[@]}" -p bench put probe "$D/monmap" 2>/dev/null && break
    sleep 1
done
timeout 5 rados "${C[@]}" -p bench put probe "$D/monmap"
echo "ceph $(ceph-osd --version | cut -d' ' -f3): 1 mon, 3 BlueStore OSDs on files in $D, pool size 3" >&2
# Ceph's objects to read: 4 KiB each, written for SECS seconds.
rados "${C[@]}" -p bench bench "$SECS" write -b 4096 -t 32 --no-cleanup >/dev/null 2>&1
VOL=bench-ceph-$$
"$CAIRN" volume create "$VOL" --size 1g >/dev/null
if [ -d cairn-data/nbd-admin ]; then
    URI="nbds://$NBD/$VOL?tls-certificates=$PWD/cairn-data/nbd-admin"
else
    URI="nbd://$NBD/$VOL"
fi
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1m --iodepth=8 --size=1g >/dev/null 2>&1
echo "round,ceph_rados_rand_4k_t32_ops_per_sec,cairn_nbd_randread_4k_d32_ops_per_sec,ratio"
for r in $(seq 1 "$ROUNDS"); do
    c=$(rados "${C[@]}" -p bench bench "$SECS" rand -t 32 2>/dev/null | awk '/^Average IOPS/ {print $3}')
    n=$(fio --name=b --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --iodepth=32 --size=1g \
        --runtime="$SECS" --time_based --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["read"]["iops"]))')
    echo "$r,$c,$n,$(python3 -c "print(round($n/max($c,1),2))")"
done
