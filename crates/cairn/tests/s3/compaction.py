"""Compaction test helper (crates/cairn/tests/s3.rs).

  compaction.py fill      PUT 300 objects of 4 KiB, then delete all but every tenth
  compaction.py verify    the 30 survivors read back whole; the deleted ones are gone
"""

import os
import random
import sys

import boto3
from botocore.config import Config

c = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], aws_access_key_id=os.environ["S3_A_KEY"],
                 aws_secret_access_key=os.environ["S3_A_SECRET"], region_name="us-east-1",
                 config=Config(s3={"addressing_style": "path"}))


def body(i):
    return random.Random(i).randbytes(4096)


if sys.argv[1] == "fill":
    c.create_bucket(Bucket="compact")
    for i in range(300):
        c.put_object(Bucket="compact", Key=f"o/{i:04d}", Body=body(i))
    dead = [{"Key": f"o/{i:04d}"} for i in range(300) if i % 10]
    c.delete_objects(Bucket="compact", Delete={"Objects": dead})
    print("filled")
else:
    keys = [o["Key"] for o in c.list_objects_v2(Bucket="compact")["Contents"]]
    assert keys == [f"o/{i:04d}" for i in range(0, 300, 10)], keys
    for i in range(0, 300, 10):
        assert c.get_object(Bucket="compact", Key=f"o/{i:04d}")["Body"].read() == body(i), i
    print("verified 30 survivors")
