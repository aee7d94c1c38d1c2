#!/usr/bin/env bash
# Runs pjdfstest (the POSIX file-system suite FreeBSD, ZFS and ext4 are held to) on a Cairn
# mount and, as the floor, on a directory of this machine's own file system, and prints how
# many of the tests that pass there pass on the mount (docs/files.md "Conformance").
#
#   scripts/pjdfstest.sh [TEST DIR…]        e.g. scripts/pjdfstest.sh chmod rename
#
# The suite is not vendored: PJDFSTEST_DIR names a checkout of github.com/pjd/pjdfstest, or
# PJDFSTEST_REPO a git repository to clone it from (default: the upstream URL); it is built
# with its own autotools (Debian's autoconf and automake, installed when missing). Runs as
# root (the suite changes owners and switches users). The cluster lives in
# target/pjdfstest-data and is stopped (`cairn down`) and removed at the end. Writes
# target/pjdfstest-report.txt: every test that passes on the floor and fails on the mount.
# Exit status 0 when the share reaches PJDFSTEST_MIN_PCT (default 95).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SUITE=${PJDFSTEST_DIR:-$ROOT/target/pjdfstest}
REPO=${PJDFSTEST_REPO:-https://github.com/pjd/pjdfstest.git}
MIN_PCT=${PJDFSTEST_MIN_PCT:-95}
DATA=$ROOT/target/pjdfstest-data
MNT=$ROOT/target/pjdfstest-mnt
FLOOR=$ROOT/target/pjdfstest-floor
CAIRN=${CAIRN:-$ROOT/target/release/cairn}

[[ $(id -u) == 0 ]] || { echo "pjdfstest needs root (it changes owners and users)" >&2; exit 2; }
if ! command -v autoreconf >/dev/null || ! command -v automake >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends autoconf automake
fi
if [[ ! -f "$SUITE/pjdfstest.c" ]]; then
    rm -rf "$SUITE"
    git clone --quiet "$REPO" "$SUITE"
fi
if [[ ! -x "$SUITE/pjdfstest" ]]; then
    (cd "$SUITE" && autoreconf -ifs && ./configure && make pjdfstest) >"$ROOT/target/pjdfstest-build.log" 2>&1
fi
if [[ "$CAIRN" == "$ROOT/target/release/cairn" ]]; then
    cargo build --release --locked --quiet -p cairn
fi

dirs=("$@")
[[ ${#dirs[@]} -gt 0 ]] || dirs=($(cd "$SUITE/tests" && ls -d */ | tr -d /))

cleanup() {
    "$CAIRN" down --data-dir "$DATA" >/dev/null 2>&1 || true
    umount -l "$MNT" 2>/dev/null || true
    rm -rf "$DATA" "$FLOOR"
}
trap cleanup EXIT
cleanup
mkdir -p "$MNT" "$FLOOR"
"$CAIRN" up --data-dir "$DATA" --disk-size 768m --no-zero-fill --no-s3 --no-nbd --mount "$MNT" \
    >"$ROOT/target/pjdfstest-up.log" 2>&1 &
# shellcheck source=bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"
wait_for_mount "$MNT" "$ROOT/target/pjdfstest-up.log"

# One run of the selected test files in DIR: "file number ok|not" lines.
run() {
    local dir=$1 out=$2
    : >"$out"
    for d in "${dirs[@]}"; do
        for t in "$SUITE"/tests/"$d"/*.t; do
            local name=${t#"$SUITE"/tests/}
            (cd "$dir" && timeout 300 prove -v "$t" 2>/dev/null || true) |
                awk -v n="$name" '/^1\.\.[0-9]+$/ {sub(/^1\.\./, ""); print n, $0, "plan"}
                    /^ok [0-9]+/ {print n, $2, "ok"} /^not ok [0-9]+/ {print n, $3, "not"}' >>"$out"
        done
    done
}
start=$(date +%s)
run "$FLOOR" "$ROOT/target/pjdfstest-floor.txt"
floor_s=$(( $(date +%s) - start ))
start=$(date +%s)
run "$MNT" "$ROOT/target/pjdfstest-mount.txt"
mount_s=$(( $(date +%s) - start ))

python3 - "$ROOT/target/pjdfstest-floor.txt" "$ROOT/target/pjdfstest-mount.txt" \
    "$ROOT/target/pjdfstest-report.txt" "$MIN_PCT" "$floor_s" "$mount_s" <<'EOF'
import sys
floor, mount, report, min_pct, fs, ms = sys.argv[1:]
plans = {}
def load(p):
    r, plan = {}, {}
    for line in open(p):
        f, n, v = line.split()
        if v == "plan":
            plan[f] = int(n)
        else:
            r[(f, int(n))] = v == "ok"
    plans[p] = plan
    return r
a, b = load(floor), load(mount)
# A file the suite skips on this file system (`require`: "1..1", one ok) where the floor runs
# it: counted as failed below (the strict share), and named.
skipped = sorted(f for f, n in plans[mount].items() if n == 1 and plans[floor].get(f, 1) > 1)
passing = {k for k, v in a.items() if v}
both = {k for k in passing if b.get(k)}
lost = sorted(passing - both)
with open(report, "w") as out:
    for f, n in lost:
        out.write(f"{f} {n}\n")
files = {}
for f, n in lost:
    files[f] = files.get(f, 0) + 1
pct = 100.0 * len(both) / max(1, len(passing))
print(f"pjdfstest: {len(a)} tests; {len(passing)} pass on the floor ({fs} s), "
      f"{len(both)} of them on the mount ({ms} s): {pct:.1f} %")
for f, c in sorted(files.items(), key=lambda x: -x[1])[:30]:
    why = " (skipped by the suite on this file-system type)" if f in skipped else ""
    print(f"  {f}: {c} fail on the mount{why}")
if not a:
    print("no test ran: the harness is broken"); sys.exit(1)
sys.exit(0 if pct >= float(min_pct) else 1)
EOF
