#!/usr/bin/env bash
# Ceph's `rados bench` 4 KiB random reads at 32 in flight against a throwaway Ceph cluster on
# this machine — 1 monitor and 3 BlueStore OSDs on files under one directory, a pool of 3
# replicas, like `cairn up`'s 3 chunkservers — next to fio's nbd engine against a Cairn volume
# in the same run (BENCHMARKS.md, "Block volumes": the 10× Ceph target of issue 28). The Ceph
# cluster is scripts/ceph-lib.sh's (which installs Ceph from the distribution when it is
# missing). Needs a running `cairn up` in the current directory (its NBD server) and fio.
# Usage: scripts/bench-ceph.sh [NBD_ADDR] [ROUNDS] [SECONDS]
set -euo pipefail
NBD=${1:-127.0.0.1:10809}
ROUNDS=${2:-3}
SECS=${3:-10}
CAIRN=${CAIRN:-cairn}
# shellcheck source=ceph-lib.sh
source "$(dirname "$0")/ceph-lib.sh"
cleanup() {
    ceph_stop
    "$CAIRN" volume delete "bench-ceph-$$" >/dev/null 2>&1 || true
}
trap cleanup EXIT
ceph_start
C=(-c "$CEPH_CONF")
timeout 60 ceph "${C[@]}" osd pool create bench 32 32 >/dev/null 2>&1
ceph_pool_ready bench
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
