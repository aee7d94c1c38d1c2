#!/usr/bin/env bash
# The file service against its floors, same run (BENCHMARKS.md "File service"): a fresh
# `cairn up --mount` (1 master, 3 chunkservers, replicas:3, TLS) in target/bench-files, and
# the same work on this machine's own file system through bindfs (a FUSE passthrough: the
# FUSE floor) and directly, and on CephFS through ceph-fuse (scripts/ceph-lib.sh: 1 monitor,
# 3 BlueStore OSDs, 1 MDS, pools of 3 replicas; CEPHFS=0 leaves it out):
#   1. untar of Debian's linux-source tarball (decompressed once beforehand), then rm -rf;
#   2. small files: create + write 4 KiB + close, stat, unlink, at 16 threads
#      (scripts/bench-smallfiles.py), with the cluster's CPU per create (every process of
#      the `cairn up`: masters, chunkservers, the mount);
#   3. fio: 1 MiB sequential write and read, 4 jobs, against `cairn bench append|read` at
#      depth 4; 4 KiB random writes with fsync every 32 against the NBD figure (fio's nbd
#      engine, depth 32, fsync every 32, plain NBD on loopback) on the same cluster;
#   4. space: SPACE_FILES files of 4 KiB, and what the chunkservers hold for them.
#
#   scripts/bench-files.sh     ROUNDS=2 UNTAR_ROUNDS=$ROUNDS FILES=8000 SPACE_FILES=100000
#                              SECS=10 VOL_SIZE=1g CEPHFS=1 FIO_ROUNDS=$ROUNDS
#                              SPACE=1 UNTAR_MEMBER= (a path in the tarball: untar only it)
#                              DISK_SIZE=12g (each chunkserver's)
#
# Runs as root (bindfs and the mount). Installs bindfs and linux-source-6.1 (Debian) when
# missing. Everything it makes is removed at the end (the cluster, both mounts, the floor's
# files); the decompressed tarball stays in target/ for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CAIRN=${CAIRN:-$ROOT/target/release/cairn}
ROUNDS=${ROUNDS:-2}
FILES=${FILES:-8000}
SPACE_FILES=${SPACE_FILES:-100000}
SECS=${SECS:-10}
UNTAR_ROUNDS=${UNTAR_ROUNDS:-$ROUNDS}
VOL_SIZE=${VOL_SIZE:-1g}
CEPHFS=${CEPHFS:-1}
FIO_ROUNDS=${FIO_ROUNDS:-$ROUNDS}
SPACE=${SPACE:-1}
UNTAR_MEMBER=${UNTAR_MEMBER:-}
WORK=$ROOT/target/bench-files
MNT=$WORK/mnt
FLOOR=$WORK/floor
BIND=$WORK/bind
CEPHMNT=$WORK/cephfs
TAR=$ROOT/target/linux-source.tar
TICK=$(getconf CLK_TCK)
# shellcheck source=bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"
# shellcheck source=ceph-lib.sh
source "$ROOT/scripts/ceph-lib.sh"

[[ $(id -u) == 0 ]] || { echo "bench-files.sh needs root (bindfs, allow_other)" >&2; exit 2; }
need=()
command -v bindfs >/dev/null || need+=(bindfs)
[[ -f /usr/src/linux-source-6.1.tar.xz || -f $TAR ]] || need+=(linux-source-6.1)
command -v fio >/dev/null || need+=(fio)
if (( ${#need[@]} )); then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
[[ -f $TAR ]] || xz -dc /usr/src/linux-source-6.1.tar.xz >"$TAR"
if [[ "$CAIRN" == "$ROOT/target/release/cairn" ]]; then
    cargo build --release --locked --quiet -p cairn
fi

cleanup() {
    ceph_stop
    umount -l "$BIND" 2>/dev/null || true
    (cd "$WORK" 2>/dev/null && "$CAIRN" down >/dev/null 2>&1) || true
    umount -l "$MNT" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
cleanup
mkdir -p "$MNT" "$FLOOR" "$BIND"
cd "$WORK"
# 12 GiB a chunkserver (sparse: --no-zero-fill): fio's timed writes rewrite their files, and an
# overwritten segment's space comes back only after the collection's grace (300 s,
# docs/files.md "Segment collection"); 4 GiB filled up within two 8-second rounds.
"$CAIRN" up --disk-size ${DISK_SIZE:-12g} --no-zero-fill --no-s3 --nbd-insecure --mount "$MNT" >"$ROOT/target/bench-files-up.log" 2>&1 &
UP_PID=$!
wait_for_mount "$MNT" "$ROOT/target/bench-files-up.log"
bindfs "$FLOOR" "$BIND"
if [[ $CEPHFS == 1 ]]; then
    # 3 copies of the whole tree's 1.3 GB fit (2 GiB OSDs filled up at a third of it).
    export OSD_BYTES=${OSD_BYTES:-$((6 << 30))}
    ceph_start
    ceph_fs_mount "$CEPHMNT"
fi
ratio() { python3 -c "print(round($1 / max($2, 1e-9), 3))"; }
secs() { local s; s=$(date +%s.%N); "$@" >/dev/null; python3 -c "print(round($(date +%s.%N) - $s, 2))"; }
echo "machine: $(nproc) cores, $(uname -r); cairn: $("$CAIRN" --version 2>/dev/null || echo "$CAIRN")"

entries=$(tar -tf "$TAR" $UNTAR_MEMBER | wc -l)
field() { python3 -c "import json,sys; print([json.loads(l) for l in sys.stdin if '\"$1\"' in l][0]['ops_per_s'])"; }
# CephFS first, alone: its daemons are stopped before Cairn's rounds (an idle Ceph cluster
# takes CPU that Cairn's rounds on 2 cores would share; an idle `cairn up` takes next to none).
declare -a CE_UNTAR CE_RM CE_CPU CE_SF CE_SFCPU
for r in $(seq 1 "$UNTAR_ROUNDS"); do CE_UNTAR[r]=0 CE_RM[r]=0 CE_CPU[r]=0; done
for r in $(seq 1 "$ROUNDS"); do
    CE_SF[r]='{"phase": "create", "ops_per_s": 0}
{"phase": "stat", "ops_per_s": 0}
{"phase": "unlink", "ops_per_s": 0}'
    CE_SFCPU[r]=0
done
if [[ $CEPHFS == 1 ]]; then
    for r in $(seq 1 "$UNTAR_ROUNDS"); do
        mkdir -p "$CEPHMNT/u"
        k0=$(ceph_cpu)
        CE_UNTAR[r]=$(secs tar -xf "$TAR" -C "$CEPHMNT/u" $UNTAR_MEMBER)
        k1=$(ceph_cpu)
        CE_RM[r]=$(secs rm -rf "$CEPHMNT/u")
        CE_CPU[r]=$(python3 -c "print(round($k1 - $k0, 1))")
    done
    for r in $(seq 1 "$ROUNDS"); do
        k0=$(ceph_cpu)
        CE_SF[r]=$(python3 "$ROOT/scripts/bench-smallfiles.py" "$CEPHMNT/sf" "$FILES")
        k1=$(ceph_cpu)
        CE_SFCPU[r]=$(python3 -c "print(round(($k1 - $k0) / (3 * $FILES) * 1e6))")
    done
    ceph_stop
fi

echo "## untar of linux-source-6.1${UNTAR_MEMBER:+ (only $UNTAR_MEMBER)} ($entries entries, $(du -m "$TAR" | cut -f1) MiB tarball)"
echo "round,ext4_s,bindfs_s,cephfs_s,cairn_s,bindfs_rm_s,cephfs_rm_s,cairn_rm_s,cpu_s_cephfs,cpu_s_cairn,ratio_vs_bindfs,ratio_vs_cephfs"
for r in $(seq 1 "$UNTAR_ROUNDS"); do
    mkdir -p "$FLOOR/direct" "$BIND/u" "$MNT/u"
    e=$(secs tar -xf "$TAR" -C "$FLOOR/direct" $UNTAR_MEMBER); rm -rf "$FLOOR/direct"
    b=$(secs tar -xf "$TAR" -C "$BIND/u" $UNTAR_MEMBER)
    brm=$(secs rm -rf "$BIND/u")
    c0=$(cluster_cpu)
    c=$(secs tar -xf "$TAR" -C "$MNT/u" $UNTAR_MEMBER)
    c1=$(cluster_cpu)
    crm=$(secs rm -rf "$MNT/u")
    echo "$r,$e,$b,${CE_UNTAR[r]},$c,$brm,${CE_RM[r]},$crm,${CE_CPU[r]},$(python3 -c "print(round($c1 - $c0, 1))"),$(ratio "$b" "$c"),$(ratio "${CE_UNTAR[r]}" "$c")"
done
echo "(ratio: the floor's time over Cairn's — above 1, Cairn is faster; cpu: every process of each cluster, the FUSE client's included)"

echo "## small files: $FILES of 4 KiB at 16 threads"
echo "round,phase,ext4_per_s,bindfs_per_s,cephfs_per_s,cairn_per_s,ratio_vs_bindfs,ratio_vs_cephfs,cephfs_cpu_us_per_op,cairn_cpu_us_per_op"
for r in $(seq 1 "$ROUNDS"); do
    e=$(python3 "$ROOT/scripts/bench-smallfiles.py" "$FLOOR/sf" "$FILES")
    b=$(python3 "$ROOT/scripts/bench-smallfiles.py" "$BIND/sf" "$FILES")
    c0=$(cluster_cpu)
    c=$(python3 "$ROOT/scripts/bench-smallfiles.py" "$MNT/sf" "$FILES")
    c1=$(cluster_cpu)
    for phase in create stat unlink; do
        ev=$(field "$phase" <<<"$e"); bv=$(field "$phase" <<<"$b"); kv=$(field "$phase" <<<"${CE_SF[r]}"); cv=$(field "$phase" <<<"$c")
        cpu="" kcpu=""
        if [[ $phase == create ]]; then
            cpu=$(python3 -c "print(round(($c1 - $c0) / (3 * $FILES) * 1e6))")
            kcpu=${CE_SFCPU[r]}
        fi
        echo "$r,$phase,$ev,$bv,$kv,$cv,$(ratio "$cv" "$bv"),$(ratio "$cv" "$kv"),$kcpu,$cpu"
    done
done
echo "(cpu per op: each cluster's processes over the three phases, divided by 3 × files; CephFS's rounds ran before Cairn's, alone)"

if (( FIO_ROUNDS > 0 )); then
echo "## fio on the mount against the cluster's own floors"
echo "round,what,fio_ops_per_s,fio_mib_per_s,floor_ops_per_s,floor_mib_per_s,ratio"
fio_file() { # rw bs jobs extra... -> "iops MiB/s"
    local rw=$1 bs=$2 jobs=$3; shift 3
    fio --name=f --directory="$MNT" --rw="$rw" --bs="$bs" --numjobs="$jobs" --size=256m \
        --runtime="$SECS" --time_based --group_reporting --output-format=json "$@" 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; d=j["write"] if j["write"]["io_bytes"] else j["read"]; print(round(d["iops"]), round(d["bw"]/1024,1))'
}
bench() { # op size depth -> "ops/s MiB/s"
    "$CAIRN" bench "$1" --size "$2" --depth "$3" --seconds "$SECS" --json 2>/dev/null | head -1 |
        python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); print(round(j.get("ops_per_s", 0)), round(j.get("mib_per_s", 0),1))'
}
VOL=bench-files
"$CAIRN" volume create "$VOL" --size "$VOL_SIZE" >/dev/null
NBD_ADDR=$(grep -o 'nbds\?://[0-9.:]*' "$ROOT/target/bench-files-up.log" | head -1 | sed 's#nbds\?://##')
NBD_ADDR=${NBD_ADDR:-127.0.0.1:10809}
# Plain NBD (`--nbd-insecure`): fio's nbd engine refuses a URI naming certificate files.
URI="nbd://$NBD_ADDR/$VOL"
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1m --iodepth=8 --size="$VOL_SIZE" >/dev/null 2>&1
nbd_fio() {
    fio --name=b --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=32 --fsync=32 \
        --size="$VOL_SIZE" --runtime="$SECS" --time_based --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; t=sys.stdin.read(); d=json.loads(t[t.index("{"):])["jobs"][0]["write"]; print(round(d["iops"]), round(d["bw"]/1024,1))'
}
for r in $(seq 1 "$FIO_ROUNDS"); do
    f=$(bench append 1m 4); n=$(fio_file write 1m 4)
    echo "$r,1m-write-4jobs,${n% *},${n#* },${f% *},${f#* },$(ratio "${n#* }" "${f#* }")"
    rm -f "$MNT"/f.*
    # (fio lays its files out first, untimed.)
    f=$(bench read 1m 4); n=$(fio_file read 1m 4)
    echo "$r,1m-read-4jobs,${n% *},${n#* },${f% *},${f#* },$(ratio "${n#* }" "${f#* }")"
    rm -f "$MNT"/f.*
    f=$(nbd_fio); n=$(fio_file randwrite 4k 1 --fsync=32)
    echo "$r,4k-randwrite-fsync32-vs-nbd-d32,${n% *},${n#* },${f% *},${f#* },$(ratio "${n% *}" "${f% *}")"
    rm -f "$MNT"/f.*
done
"$CAIRN" volume delete "$VOL" >/dev/null
fi

if [[ $SPACE == 1 ]]; then
echo "## space: $SPACE_FILES files of 4 KiB"
used() { "$CAIRN" status --json | python3 -c 'import json,sys; print(sum(c["used_bytes"] for c in json.load(sys.stdin)["chunkservers"]))'; }
sleep 3
u0=$(used)
s=$(secs python3 "$ROOT/scripts/bench-smallfiles.py" "$MNT/space" "$SPACE_FILES" --keep)
sleep 5
u1=$(used)
python3 -c "
n=$SPACE_FILES; d=n*4096; u=$u1-$u0
print(f'files {n}, data {d/1e6:.0f} MB, chunkservers hold {u/1e6:.0f} MB more = {u/d:.2f}x the data ({u/(3*d):.2f}x of 3 replicas), in {$s} s')"
fi
