#!/usr/bin/env bash
# Makes target/py-venv with the S3 clients the tests drive (boto3, the aws CLI), pinned.
# Idempotent: an existing venv with the right versions is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/py-venv
WANT="boto3==1.43.11 awscli==1.45.11"
if [[ -x "$VENV/bin/python" ]] && [[ "$(cat "$VENV/.cairn-pins" 2>/dev/null)" == "$WANT" ]]; then
    exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    # Debian's python3 ships venv separately.
    apt-get update -qq && apt-get install -y -qq python3-venv
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet --disable-pip-version-check $WANT
echo "$WANT" > "$VENV/.cairn-pins"
