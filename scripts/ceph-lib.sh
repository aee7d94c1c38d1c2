# A throwaway Ceph cluster on this machine, for the benchmarks that compare Cairn with Ceph
# (scripts/bench-ceph.sh: RADOS; scripts/bench-files.sh: CephFS through ceph-fuse): 1
# monitor and 3 BlueStore OSDs on files under one directory, pools of 3 replicas (min 2), as
# `cairn up`'s 3 chunkservers keep 3 copies; no authentication. Sourced, not run.
#
#   ceph_start            installs Ceph from the distribution when missing, starts the
#                         cluster in a new directory $CEPH_DIR; $CEPH_CONF is its config
#   ceph_fs_mount MNT     adds a file system (a metadata and a data pool of 3 replicas, one
#                         MDS) and mounts it at MNT with ceph-fuse
#   ceph_stop             unmounts, stops every Ceph process it started, removes $CEPH_DIR
#
# OSD_BYTES sets each OSD's block file (2 GiB).

CEPH_PIDS=()
CEPH_DIR=
CEPH_CONF=
CEPH_MNT=

ceph_start() {
    local need=()
    command -v ceph-osd >/dev/null || need+=(ceph-osd)
    command -v ceph-mon >/dev/null || need+=(ceph-mon)
    command -v rados >/dev/null || need+=(ceph-common)
    command -v ceph-mds >/dev/null || need+=(ceph-mds)
    command -v ceph-fuse >/dev/null || need+=(ceph-fuse)
    if (( ${#need[@]} )); then
        local sudo_=""
        [ "$(id -u)" = 0 ] || sudo_=sudo
        $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${need[@]}" >/dev/null
    fi
    CEPH_DIR=$(mktemp -d /tmp/cairn-ceph.XXXXXX)
    CEPH_CONF=$CEPH_DIR/ceph.conf
    local fsid port
    fsid=$(cat /proc/sys/kernel/random/uuid)
    port=$((20000 + RANDOM % 20000))
    mkdir -p "$CEPH_DIR"/{run,log,mon,osd,mds}
    cat >"$CEPH_CONF" <<EOF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$port
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 3
osd pool default min size = 2
osd crush chooseleaf type = 0
run dir = $CEPH_DIR/run
log file = $CEPH_DIR/log/\$name.log
admin socket = $CEPH_DIR/run/\$name.asok
mon data = $CEPH_DIR/mon/\$name
osd data = $CEPH_DIR/osd/\$name
mds data = $CEPH_DIR/mds/\$name
osd objectstore = bluestore
bluestore block create = true
bluestore block size = ${OSD_BYTES:-$((2 << 30))}
osd memory target = 1073741824
mon allow pool delete = true
mon allow multiple fs = true
ms bind ipv6 = false
EOF
    local C=(-c "$CEPH_CONF")
    monmaptool --create --addv a "[v1:127.0.0.1:$port]" --fsid "$fsid" "$CEPH_DIR/monmap" >/dev/null
    ceph-mon "${C[@]}" --mkfs -i a --monmap "$CEPH_DIR/monmap" >/dev/null
    ceph-mon "${C[@]}" -i a -f >/dev/null 2>&1 &
    CEPH_PIDS+=($!)
    disown $!
    local i uuid id
    for i in 0 1 2; do
        uuid=$(cat /proc/sys/kernel/random/uuid)
        id=$(timeout 60 ceph "${C[@]}" osd new "$uuid")
        mkdir -p "$CEPH_DIR/osd/osd.$id"
        ceph-osd "${C[@]}" -i "$id" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1
        ceph-osd "${C[@]}" -i "$id" -f >/dev/null 2>&1 &
        CEPH_PIDS+=($!)
        disown $!
    done
    echo "ceph $(ceph-osd --version | cut -d' ' -f3): 1 mon, 3 BlueStore OSDs on files in $CEPH_DIR, pools of 3 replicas" >&2
}

# Waits until a write to POOL goes through (its placement groups active on 3 OSDs).
ceph_pool_ready() {
    local pool=$1
    for _ in $(seq 1 120); do
        timeout 5 rados -c "$CEPH_CONF" -p "$pool" put probe "$CEPH_DIR/monmap" 2>/dev/null && break
        sleep 1
    done
    timeout 5 rados -c "$CEPH_CONF" -p "$pool" put probe "$CEPH_DIR/monmap"
    rados -c "$CEPH_CONF" -p "$pool" rm probe
}

ceph_fs_mount() {
    local mnt=$1 C=(-c "$CEPH_CONF")
    timeout 60 ceph "${C[@]}" osd pool create cephfs_meta 16 16 >/dev/null 2>&1
    timeout 60 ceph "${C[@]}" osd pool create cephfs_data 32 32 >/dev/null 2>&1
    timeout 60 ceph "${C[@]}" fs new cephfs cephfs_meta cephfs_data >/dev/null 2>&1
    ceph_pool_ready cephfs_data
    mkdir -p "$CEPH_DIR/mds/mds.a"
    ceph-mds "${C[@]}" -i a -f >/dev/null 2>&1 &
    CEPH_PIDS+=($!)
    disown $!
    for _ in $(seq 1 120); do
        timeout 5 ceph "${C[@]}" mds stat 2>/dev/null | grep -q "up:active" && break
        sleep 1
    done
    timeout 5 ceph "${C[@]}" mds stat | grep -q "up:active" || {
        echo "the Ceph MDS never became active" >&2
        return 1
    }
    mkdir -p "$mnt"
    ceph-fuse "${C[@]}" --id admin "$mnt" >/dev/null 2>&1
    CEPH_MNT=$mnt
    echo "cephfs: 1 MDS, ceph-fuse at $mnt" >&2
}

ceph_stop() {
    if [[ -n $CEPH_MNT ]]; then
        fusermount3 -u "$CEPH_MNT" 2>/dev/null || umount -l "$CEPH_MNT" 2>/dev/null || true
        CEPH_MNT=
    fi
    # The client outlives its unmount (it waits for the monitors stopped below).
    [[ -n $CEPH_DIR ]] && pkill -f "ceph-fuse -c $CEPH_DIR/" 2>/dev/null || true
    local p
    for p in "${CEPH_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 1
    for p in "${CEPH_PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    CEPH_PIDS=()
    [[ -n $CEPH_DIR ]] && rm -rf "$CEPH_DIR"
    CEPH_DIR=
}

# Seconds of CPU of every Ceph process started here (the OSDs, the monitor, the MDS) and of
# the ceph-fuse client.
ceph_cpu() {
    local t=0 p
    for p in "${CEPH_PIDS[@]}" $(pgrep -x ceph-fuse); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    python3 -c "print($t / $(getconf CLK_TCK))"
}
