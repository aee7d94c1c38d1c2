#!/usr/bin/env bash
# The test command (README.md). Runs every test of the workspace; CAIRN_SOAK=1 runs the long
# property-test soak as well.
set -euo pipefail
cd "$(dirname "$0")/.."
# Real S3 clients for the object service's end-to-end tests (crates/cairn/tests/s3.rs): boto3
# and the aws CLI, pinned, in a virtualenv of the project's own (nothing installed by hand).
./scripts/python-env.sh
export CAIRN_TEST_PYTHON="$PWD/target/py-venv/bin/python"
# Real NBD clients for the block service's end-to-end tests (crates/cairn/tests/block.rs):
# qemu-img, qemu-io, nbdinfo, nbdcopy, fio, from the distribution's packages.
./scripts/block-tools.sh
# fsx, the file-system exerciser, for the file service's tests (crates/cairn/tests/files.rs).
./scripts/fs-tools.sh
cargo test --workspace --locked
# The fuzz targets are their own workspace (cargo-fuzz runs them on nightly): keep them
# compiling against today's APIs.
cargo check --locked --manifest-path fuzz/Cargo.toml --bins
if [[ "${CAIRN_SOAK:-0}" == "1" ]]; then
    PROPTEST_CASES="${PROPTEST_CASES:-5000}" cargo test --locked -p cairn-chunkstore --test model store_matches_model_across_crashes
fi
