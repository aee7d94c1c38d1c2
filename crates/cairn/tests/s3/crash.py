"""Writers and verifiers for the S3 crash tests (crates/cairn/tests/s3.rs).

  crash.py write SECONDS ACKS_FILE RETRIES   PUT objects for SECONDS (4 threads), appending
                                             every acknowledged key to ACKS_FILE; stops at
                                             the first failure unless RETRIES > 1
  crash.py verify ACKS_FILE                  every acknowledged key reads back whole, and every
                                             key the bucket lists holds exactly its bytes

An object's bytes follow from its key, so a verifier knows what any listed object must hold:
an object PUT when the gateway died may be there or not, but never partly.
"""

import hashlib
import os
import random
import sys
import threading
import time

import boto3
import botocore
from botocore.config import Config

ENDPOINT = os.environ["S3_ENDPOINT"]
BUCKET = "crash"


def client(retries):
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        aws_access_key_id=os.environ["S3_A_KEY"],
        aws_secret_access_key=os.environ["S3_A_SECRET"],
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": retries, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        ),
    )


def body(key):
    n = int(key.split("/")[1])
    # Mostly small objects (packed), every 100th one past the gateway's 1 MiB pack limit (a
    # file of its own, which takes two 1 MiB extents on each of three chunkservers: the test
    # clusters' 256 MiB disks hold about a hundred).
    size = (1 << 20) + 1 + n % 1000 if n % 100 == 0 else 100 + (n * 7919) % 20000
    return random.Random(key).randbytes(size)


def write(seconds, acks_path, retries):
    c = client(retries)
    try:
        c.create_bucket(Bucket=BUCKET)
    except botocore.exceptions.ClientError as e:
        if e.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
            raise
    lock = threading.Lock()
    counter = [0]
    failures = []
    deadline = time.time() + seconds
    acks = open(acks_path, "a")

    def worker(t):
        while time.time() < deadline and not failures:
            with lock:
                n = counter[0]
                counter[0] += 1
            key = f"obj/{n:07d}"
            data = body(key)
            try:
                r = c.put_object(Bucket=BUCKET, Key=key, Body=data)
            except Exception as e:  # the gateway died, or a fault outlasted the retries
                failures.append(f"{key}: {e}")
                return
            if r["ETag"] != '"%s"' % hashlib.md5(data).hexdigest():
                failures.append(f"{key}: wrong ETag {r['ETag']}")
                return
            # A GET of something written earlier, to read while faults happen.
            if n > 10:
                old = f"obj/{random.randrange(n - 10):07d}"
                try:
                    got = c.get_object(Bucket=BUCKET, Key=old)["Body"].read()
                    if got != body(old):
                        failures.append(f"{old}: read back wrong bytes")
                        return
                except botocore.exceptions.ClientError as e:
                    if e.response["Error"]["Code"] != "NoSuchKey":  # not acknowledged yet
                        failures.append(f"GET {old}: {e}")
                        return
                except Exception as e:
                    failures.append(f"GET {old}: {e}")
                    return
            with lock:
                acks.write(key + "\n")
                acks.flush()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acks.close()
    done = sum(1 for _ in open(acks_path))
    print(f"write: {done} acknowledged, {len(failures)} failed: {failures[:3]}")
    return failures


def verify(acks_path):
    c = client(5)
    acked = [k.strip() for k in open(acks_path) if k.strip()]
    bad = []
    for key in acked:
        try:
            o = c.get_object(Bucket=BUCKET, Key=key)
            data = o["Body"].read()
            want = body(key)
            if data != want or o["ETag"] != '"%s"' % hashlib.md5(want).hexdigest():
                bad.append(f"{key}: wrong bytes or ETag")
        except Exception as e:
            bad.append(f"{key}: {e}")
    listed = [o["Key"] for p in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET) for o in p.get("Contents", [])]
    missing = set(acked) - set(listed)
    extra = [k for k in listed if k not in set(acked)]
    for key in extra:
        if c.get_object(Bucket=BUCKET, Key=key)["Body"].read() != body(key):
            bad.append(f"{key}: listed but partial")
    print(f"verify: {len(acked)} acknowledged, {len(listed)} listed, {len(extra)} unacknowledged but whole, "
          f"{len(missing)} missing from the listing, {len(bad)} bad: {bad[:3]}")
    return bad or [f"missing from listing: {k}" for k in sorted(missing)[:3]]


if __name__ == "__main__":
    if sys.argv[1] == "write":
        failures = write(float(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        sys.exit(1 if failures and int(sys.argv[4]) > 1 else 0)
    else:
        sys.exit(1 if verify(sys.argv[2]) else 0)
