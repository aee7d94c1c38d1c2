"""A bucket whose objects are hashed over several partitions (crates/cairn/tests/s3.rs).

  placed.py create    make the empty bucket "placed"
  placed.py fill      PUT small, large and multipart objects; list them every way; start an
                      upload left open
  placed.py verify    every object reads back; listings are whole and ordered; then the bucket
                      is emptied and deleted (refused while it holds objects)

Prints "s3 placed: N passed" at the end: the test checks N, so an early exit cannot pass.
"""

import hashlib
import os
import random
import sys

import boto3
from botocore.config import Config

c = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], aws_access_key_id=os.environ["S3_A_KEY"],
                 aws_secret_access_key=os.environ["S3_A_SECRET"], region_name="us-east-1",
                 config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 10, "mode": "standard"}))
B = "placed"
passed = 0


def ok(cond, what):
    global passed
    assert cond, what
    passed += 1


def body(key, size):
    return random.Random(key).randbytes(size)


# 180 small objects under 6 "directories", 2 of 2 MiB (files of their own), one multipart.
SMALL = [f"d{i % 6}/o{i:03d}" for i in range(180)]
LARGE = ["big/a", "big/b"]
MULTI = "multi/m"
MB = 1 << 20


def expected():
    return sorted(SMALL + LARGE + [MULTI])


def list_all(**kw):
    """Every key and common prefix, page by page (MaxKeys small, so pages cross shards)."""
    keys, prefixes, token, pages = [], [], None, 0
    while True:
        args = dict(Bucket=B, MaxKeys=7, **kw)
        if token:
            args["ContinuationToken"] = token
        r = c.list_objects_v2(**args)
        pages += 1
        page = [o["Key"] for o in r.get("Contents", [])] + [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        assert len(page) <= 7, page
        keys += [o["Key"] for o in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r["IsTruncated"]:
            return keys, prefixes, pages
        token = r["NextContinuationToken"]


def check_listings():
    keys, prefixes, pages = list_all()
    ok(keys == expected(), f"a paginated listing is whole and ordered: {len(keys)} keys")
    ok(pages >= len(keys) // 7, f"{pages} pages of at most 7")
    keys, prefixes, _ = list_all(Delimiter="/")
    ok(keys == [] and prefixes == ["big/", "d0/", "d1/", "d2/", "d3/", "d4/", "d5/", "multi/"], prefixes)
    keys, prefixes, _ = list_all(Prefix="d3/")
    ok(keys == sorted(k for k in SMALL if k.startswith("d3/")), "a prefix's listing")
    r = c.list_objects_v2(Bucket=B, StartAfter="d4/o100", MaxKeys=3)
    after = [k for k in expected() if k > "d4/o100"][:3]
    ok([o["Key"] for o in r["Contents"]] == after, "StartAfter")


if sys.argv[1] == "create":
    c.create_bucket(Bucket=B)
    print("created")
elif sys.argv[1] == "fill":
    for k in SMALL:
        c.put_object(Bucket=B, Key=k, Body=body(k, 1000 + len(k)))
    for k in LARGE:
        c.put_object(Bucket=B, Key=k, Body=body(k, 2 * MB))
    up = c.create_multipart_upload(Bucket=B, Key=MULTI)["UploadId"]
    parts = []
    for n, size in [(1, 5 * MB), (2, 100)]:
        r = c.upload_part(Bucket=B, Key=MULTI, UploadId=up, PartNumber=n, Body=body(f"{MULTI}{n}", size))
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
    ok([p["PartNumber"] for p in c.list_parts(Bucket=B, Key=MULTI, UploadId=up)["Parts"]] == [1, 2], "parts listed")
    c.complete_multipart_upload(Bucket=B, Key=MULTI, UploadId=up, MultipartUpload={"Parts": parts})
    # Uploads left open in two keys (so in up to two shards): listed together, in order.
    for k in ["open/x", "open/y"]:
        c.create_multipart_upload(Bucket=B, Key=k)
    ups = c.list_multipart_uploads(Bucket=B)["Uploads"]
    ok([u["Key"] for u in ups] == ["open/x", "open/y"], f"open uploads: {ups}")
    check_listings()
    print(f"s3 placed: {passed} passed")
else:
    for k in SMALL:
        ok(c.get_object(Bucket=B, Key=k)["Body"].read() == body(k, 1000 + len(k)), k)
    for k in LARGE:
        ok(hashlib.md5(c.get_object(Bucket=B, Key=k)["Body"].read()).digest()
           == hashlib.md5(body(k, 2 * MB)).digest(), k)
    whole = c.get_object(Bucket=B, Key=MULTI)["Body"].read()
    ok(whole == body(f"{MULTI}1", 5 * MB) + body(f"{MULTI}2", 100), "the multipart object")
    check_listings()
    ok(c.head_bucket(Bucket=B)["ResponseMetadata"]["HTTPStatusCode"] == 200, "head bucket")
    ok(B in [b["Name"] for b in c.list_buckets()["Buckets"]], "listed among the buckets")
    try:
        c.delete_bucket(Bucket=B)
        ok(False, "a bucket holding objects was deleted")
    except c.exceptions.ClientError as e:
        ok(e.response["Error"]["Code"] == "BucketNotEmpty", e.response["Error"])
    # Still whole after the refused delete (its shards reopened).
    c.put_object(Bucket=B, Key="after-refusal", Body=b"x")
    ok(c.get_object(Bucket=B, Key="after-refusal")["Body"].read() == b"x", "writable again")
    keys = expected() + ["after-refusal"]
    for i in range(0, len(keys), 100):
        c.delete_objects(Bucket=B, Delete={"Objects": [{"Key": k} for k in keys[i:i + 100]]})
    ok(c.list_objects_v2(Bucket=B)["KeyCount"] == 0, "emptied")
    # The open uploads go with the bucket, as on AWS.
    c.delete_bucket(Bucket=B)
    try:
        c.head_bucket(Bucket=B)
        ok(False, "the deleted bucket is still there")
    except c.exceptions.ClientError as e:
        ok(e.response["Error"]["Code"] in ("404", "NoSuchBucket"), e.response["Error"])
    # The name can be taken again (by the root partition, as any new bucket).
    c.create_bucket(Bucket=B)
    c.put_object(Bucket=B, Key="k", Body=b"again")
    ok(c.get_object(Bucket=B, Key="k")["Body"].read() == b"again", "made again")
    print(f"s3 placed: {passed} passed")
