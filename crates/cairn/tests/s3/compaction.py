"""Compaction test helper (crates/cairn/tests/s3.rs).

  compaction.py fill      PUT 300 objects of 4 KiB, then delete all but every tenth
  compaction.py verify    the 30 survivors read back whole; the deleted ones are gone
  compaction.py retire-1  PUT one small object and delete it: its pack holds no live object
  compaction.py retire-2  PUT another small object (retried by boto3 on 503)
  compaction.py retire-3  it reads back whole
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
elif sys.argv[1] == "retire-1":
    c.create_bucket(Bucket="retire")
    c.put_object(Bucket="retire", Key="k1", Body=body(1))
    c.delete_object(Bucket="retire", Key="k1")
    print("pack dead")
elif sys.argv[1] == "retire-2":
    c.put_object(Bucket="retire", Key="k2", Body=body(2))
    print("put k2")
elif sys.argv[1] == "retire-3":
    assert c.get_object(Bucket="retire", Key="k2")["Body"].read() == body(2)
    print("k2 read back")
elif sys.argv[1] == "verify":
    keys = [o["Key"] for o in c.list_objects_v2(Bucket="compact")["Contents"]]
    assert keys == [f"o/{i:04d}" for i in range(0, 300, 10)], keys
    for i in range(0, 300, 10):
        assert c.get_object(Bucket="compact", Key=f"o/{i:04d}")["Body"].read() == body(i), i
    print("verified 30 survivors")
else:
    sys.exit(f"unknown mode {sys.argv[1]}")
