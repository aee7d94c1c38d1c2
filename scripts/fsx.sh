#!/usr/bin/env bash
# The file service's long exerciser runs (docs/files.md "Conformance"), on a fresh
# `cairn up --mount`:
#   - fsx (the `fsx` crate, scripts/fs-tools.sh): FSX_OPS operations (default 100000) with
#     mmap and as many without, every read checked against its model of the file;
#   - when XFSTESTS_DIR names a checkout of github.com/kdave/xfstests (built with
#     `make configure && ./configure && make -C lib && make -C ltp fsx fsstress`; Debian's
#     xfslibs-dev, libacl1-dev, libaio-dev, liburing-dev, libtool-bin): its C fsx with and
#     without mmap (FSX_OPS each), and fsstress with FSSTRESS_PROCS processes (default 4) of
#     FSSTRESS_OPS operations (default 10000) each.
#
#   scripts/fsx.sh
#
# Runs as root (the mount uses allow_other). The cluster (DISK_SIZE per chunkserver, default
# 2g, allocated up front) lives in target/fsx-data and is stopped and removed at the end.
# Nothing reclaims overwritten bytes yet (docs/files.md): one 100 000-operation fsx run leaves
# over a gigabyte of them, three copies each, so the default disks hold one such run; the
# others then fail with ENOSPC (session 49) — give the runs DISK_SIZE=6g where the disk has
# room, or fewer FSX_OPS. Exit status 0 when every run passed; each prints one line.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OPS=${FSX_OPS:-100000}
PROCS=${FSSTRESS_PROCS:-4}
SOPS=${FSSTRESS_OPS:-10000}
DATA=$ROOT/target/fsx-data
MNT=$ROOT/target/fsx-mnt
CAIRN=${CAIRN:-$ROOT/target/release/cairn}

[[ $(id -u) == 0 ]] || { echo "fsx.sh needs root (the mount is allow_other)" >&2; exit 2; }
./scripts/fs-tools.sh
FSX=$ROOT/target/tools/bin/fsx
if [[ "$CAIRN" == "$ROOT/target/release/cairn" ]]; then
    cargo build --release --locked --quiet -p cairn
fi

cleanup() {
    "$CAIRN" down --data-dir "$DATA" >/dev/null 2>&1 || true
    umount -l "$MNT" 2>/dev/null || true
    rm -rf "$DATA"
}
trap cleanup EXIT
cleanup
mkdir -p "$MNT"
"$CAIRN" up --data-dir "$DATA" --disk-size "${DISK_SIZE:-2g}" --no-zero-fill --no-s3 --no-nbd --mount "$MNT" \
    >"$ROOT/target/fsx-up.log" 2>&1 &
# shellcheck source=bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"
wait_for_mount "$MNT" "$ROOT/target/fsx-up.log"

failed=0
# One run: its name, then the command; prints "NAME: ok|FAILED in S s" (the log is kept in
# target/fsx-NAME.log).
step() {
    local name=$1; shift
    local log=$ROOT/target/fsx-$name.log start=$(date +%s) ok=FAILED
    if "$@" >"$log" 2>&1; then ok=ok; fi
    [[ $ok == ok ]] || failed=1
    echo "$name: $ok in $(( $(date +%s) - start )) s ($log)"
}
config() {
    local map=$1
    cat <<CFG
flen = 1048576
[weights]
close_open = 2
read = 10
write = 10
mapread = $map
mapwrite = $map
invalidate = $(( map > 0 ? 1 : 0 ))
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 1
punch_hole = 1
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
CFG
}
config 10 >"$ROOT/target/fsx-mmap.toml"
config 0 >"$ROOT/target/fsx-nommap.toml"
step fsx-rs-mmap "$FSX" -f "$ROOT/target/fsx-mmap.toml" -N "$OPS" -S 1 -P "$ROOT/target" "$MNT/fsx-rs-mmap"
step fsx-rs-nommap "$FSX" -f "$ROOT/target/fsx-nommap.toml" -N "$OPS" -S 2 -P "$ROOT/target" "$MNT/fsx-rs-nommap"
if [[ -n "${XFSTESTS_DIR:-}" ]]; then
    step xfstests-fsx-mmap "$XFSTESTS_DIR/ltp/fsx" -N "$OPS" -S 3 -P "$ROOT/target" "$MNT/fsx-c-mmap"
    step xfstests-fsx-nommap "$XFSTESTS_DIR/ltp/fsx" -N "$OPS" -S 4 -R -W -P "$ROOT/target" "$MNT/fsx-c-nommap"
    mkdir -p "$MNT/fsstress"
    step fsstress "$XFSTESTS_DIR/ltp/fsstress" -d "$MNT/fsstress" -p "$PROCS" -n "$SOPS" -s 5
else
    echo "xfstests' fsx and fsstress: not run (XFSTESTS_DIR unset)"
fi
exit $failed
