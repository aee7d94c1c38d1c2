#!/usr/bin/env bash
# Runs ceph/s3-tests (the S3 conformance suite Ceph RGW is held to) against a fresh `cairn up`
# and prints the pass count of the selection docs/object.md describes: test_s3.py and
# test_headers.py, less the tests marked fails_on_aws / fails_on_rgw and those of features
# Cairn does not have (ACLs, policies, versioning, SSE, lifecycle, tagging, object lock, …).
#
#   scripts/s3-tests.sh [PYTEST ARGS…]
#
# The suite is not vendored: S3TESTS_DIR names a checkout of github.com/ceph/s3-tests, or
# S3TESTS_REPO a git repository to clone it from (default: the upstream URL). Its Python
# dependencies go into target/s3tests-venv (pinned below). The cluster lives in
# target/s3tests-data and is stopped (`cairn down`) and removed at the end. Exit status 0 when
# the pass rate reaches S3TESTS_MIN_PCT (default 95).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SUITE=${S3TESTS_DIR:-$ROOT/target/s3-tests}
REPO=${S3TESTS_REPO:-https://github.com/ceph/s3-tests.git}
MIN_PCT=${S3TESTS_MIN_PCT:-95}
VENV=$ROOT/target/s3tests-venv
DATA=$ROOT/target/s3tests-data
WANT="boto3==1.43.11 botocore==1.43.127 munch==4.0.0 gevent==26.9.0 isodate==0.7.2 requests==2.34.2 pytz==2026.6 httplib2==0.32.1 lxml==6.1.3 pytest==9.2.0 PyYAML==6.0.4"

if [[ ! -f "$SUITE/s3tests/functional/test_s3.py" ]]; then
    rm -rf "$SUITE"
    git clone --quiet "$REPO" "$SUITE"
fi
if [[ ! -x "$VENV/bin/python" ]] || [[ "$(cat "$VENV/.cairn-pins" 2>/dev/null)" != "$WANT" ]]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install --quiet --disable-pip-version-check $WANT
    echo "$WANT" > "$VENV/.cairn-pins"
fi

cargo build --release --locked --quiet
CAIRN=$ROOT/target/release/cairn
rm -rf "$DATA"
mkdir -p "$DATA"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$CAIRN" up --data-dir "$DATA/cairn-data" --disk-size 1g --no-zero-fill --no-nbd \
    --s3-port "$PORT" > "$DATA/up.log" 2>&1 &
UP=$!
cleanup() {
    "$CAIRN" down --data-dir "$DATA/cairn-data" >/dev/null 2>&1 || kill "$UP" 2>/dev/null || true
    wait "$UP" 2>/dev/null || true
    rm -rf "$DATA"
}
trap cleanup EXIT
for _ in $(seq 1 600); do
    grep -q "cairn up: S3 at" "$DATA/up.log" 2>/dev/null && break
    kill -0 "$UP" 2>/dev/null || { cat "$DATA/up.log"; exit 1; }
    sleep 0.1
done
grep -q "cairn up: S3 at" "$DATA/up.log" || { echo "cairn up never served S3"; cat "$DATA/up.log"; exit 1; }

# Two users, as the suite wants ("main" and "alt"); the admin's credentials make them.
cd "$DATA"
user() {
    "$CAIRN" user create "$1" --json
}
MAIN=$(user s3tests-main)
ALT=$(user s3tests-alt)
TENANT=$(user s3tests-tenant)
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
cat > "$DATA/s3tests.conf" <<EOF
[DEFAULT]
host = 127.0.0.1
port = $PORT
is_secure = False
ssl_verify = False

[fixtures]
bucket prefix = cairn-{random}-

[s3 main]
display_name = s3tests-main
user_id = s3tests-main
email = main@example.com
api_name = default
access_key = $(field "$MAIN" access_key)
secret_key = $(field "$MAIN" secret_key)

[s3 alt]
display_name = s3tests-alt
user_id = s3tests-alt
email = alt@example.com
access_key = $(field "$ALT" access_key)
secret_key = $(field "$ALT" secret_key)

[s3 tenant]
display_name = s3tests-tenant
user_id = s3tests-tenant
email = tenant@example.com
tenant = tenant
access_key = $(field "$TENANT" access_key)
secret_key = $(field "$TENANT" secret_key)

[iam]
email = iam@example.com
user_id = s3tests-iam
access_key = $(field "$MAIN" access_key)
secret_key = $(field "$MAIN" secret_key)
display_name = s3tests-iam

[iam root]
access_key = $(field "$MAIN" access_key)
secret_key = $(field "$MAIN" secret_key)
user_id = s3tests-iam-root
email = iamroot@example.com

[iam alt root]
access_key = $(field "$ALT" access_key)
secret_key = $(field "$ALT" secret_key)
user_id = s3tests-iam-alt-root
email = iamaltroot@example.com
EOF

# Features Cairn does not have (docs/object.md, "Not supported"): by marker, and by name for
# the tests the suite does not mark: ACLs (canned ACLs, grants, public access, anonymous
# access through a public-read ACL: access_bucket_*, raw_get without x_amz_expires, anon_*,
# copy_not_owned, special_key_names, which sets ACLs; list_return_data reads an object ACL,
# list_multipart_upload_owner and 100_continue set bucket ACLs, block_public sets a public
# access block), POST object, ExpectedBucketOwner, conditional deletes (conditional PUTs and
# completions are supported and run; those on a versioned bucket's "current" version are not).
MARKERS="not fails_on_aws and not fails_on_rgw and not versioning and not bucket_policy \
and not bucket_encryption and not bucket_logging and not bucket_logging_cleanup \
and not encryption and not sse_s3 and not lifecycle and not lifecycle_expiration \
and not lifecycle_transition and not tagging and not object_lock and not object_ownership \
and not s3select and not s3website and not s3website_routing_rules \
and not s3website_redirect_location and not storage_class and not appendobject \
and not cloud_transition and not cloud_restore and not iam_account and not iam_cross_account \
and not iam_role and not iam_tenant and not iam_user and not user_policy and not role_policy \
and not group and not group_policy and not sns and not webidentity_test and not test_of_sts \
and not abac_test and not delete_marker and not auth_aws2 and not target_by_bucket \
and not fails_without_logging_rollover"
NAMES="not acl and not grant and not cors and not policy and not logging and not website \
and not versioning and not versioned and not torrent and not lifecycle and not encryption \
and not sse and not tagging and not tags and not object_lock and not ownership \
and not restore and not replication and not notification and not accelerate \
and not request_payment and not public_access and not public_block \
and not delete_marker and not anonymous and not anon_ and not mfa \
and not list_objects_anonymous and not bucket_recreate_new_acl and not location_constraint \
and not access_bucket and not post_object \
and not expected_bucket_owner and not copy_not_owned and not special_key_names \
and not return_data and not list_multipart_upload_owner and not 100_continue \
and not block_public and not (delete_object and if_match) and not (current and if_) \
and not (raw_get and not x_amz_expires)"
SELECT="$MARKERS"
cd "$SUITE"
set +e
S3TEST_CONF="$DATA/s3tests.conf" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    -m "$SELECT" -k "$NAMES" \
    s3tests/functional/test_s3.py s3tests/functional/test_headers.py \
    -o junit_family=xunit2 --junitxml="$ROOT/target/s3-tests.xml" "$@" \
    > "$ROOT/target/s3-tests.log" 2>&1
set -e
tail -40 "$ROOT/target/s3-tests.log" | grep -E "^(FAILED|ERROR)" || true
python3 - "$ROOT/target/s3-tests.xml" "$MIN_PCT" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
cases = root.iter("testcase")
passed = failed = errors = skipped = 0
for c in cases:
    kinds = {e.tag for e in c}
    if "skipped" in kinds:
        skipped += 1
    elif "error" in kinds:
        errors += 1
    elif "failure" in kinds:
        failed += 1
    else:
        passed += 1
ran = passed + failed + errors
pct = 100.0 * passed / ran if ran else 0.0
print(f"s3-tests: {passed} passed, {failed} failed, {errors} errors, {skipped} skipped: "
      f"{pct:.1f}% of {ran} selected (log: target/s3-tests.log)")
# A harness that ran nothing must not read as a pass.
sys.exit(0 if ran >= 100 and pct >= float(sys.argv[2]) else 1)
EOF
