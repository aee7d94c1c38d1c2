#!/usr/bin/env bash
# Installs the NBD clients the block service's tests drive (crates/cairn/tests/block.rs), from
# Debian's packages: qemu-img and qemu-io (qemu-utils), nbdinfo and nbdcopy (libnbd-bin), fio
# (its nbd engine). Idempotent: nothing is done when they are all there.
set -euo pipefail
need=()
command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || need+=(qemu-utils)
command -v nbdinfo >/dev/null && command -v nbdcopy >/dev/null || need+=(libnbd-bin)
command -v fio >/dev/null || need+=(fio)
if (( ${#need[@]} )); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
