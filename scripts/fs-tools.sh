#!/usr/bin/env bash
# Installs the file-system test tools the file service's tests drive (crates/cairn/tests/
# files.rs): fsx, the file-system exerciser (the `fsx` crate from crates.io, pinned), into
# target/tools; setfattr and getfattr (Debian's `attr`), the extended attribute tools.
# Idempotent: nothing is done when they are there.
set -euo pipefail
cd "$(dirname "$0")/.."
FSX_VERSION=0.2.0
if [[ ! -x target/tools/bin/fsx ]] || ! target/tools/bin/fsx --version 2>/dev/null | grep -q "$FSX_VERSION"; then
    cargo install --quiet --locked --root target/tools fsx --version "=$FSX_VERSION"
fi
if ! command -v setfattr >/dev/null || ! command -v getfattr >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends attr
fi
