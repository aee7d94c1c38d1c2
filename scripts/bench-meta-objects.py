#!/usr/bin/env python3
"""What S3 objects cost the masters (issue 39): RSS and data-directory growth per object, CPU
per PUT summed over the cluster's processes, and how long a master with them takes to serve
again after SIGKILL.

Run inside a directory where `cairn up` runs (it reads ./cairn-data/cluster.toml and
./cairn-data/admin.credentials), with the test venv's Python:

    target/py-venv/bin/python scripts/bench-meta-objects.py --objects 100000

It PUTs N 1-byte objects into a new bucket (T threads, one client each), measures, kills the
master (`cairn up` starts it again) and times until a GET of the last key answers, then deletes
every object and the bucket (the cluster is left as it was found, bar the masters' log and
snapshot files, which compact away). Each figure is printed with its ratio to the issue's
target (64 MiB of RSS and 300 bytes on disk per million objects and per object, 5 s to serve
again); to compare two builds, run it on a fresh `cairn up` of each.
"""
import argparse
import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib

import boto3
from botocore.config import Config

CLK = os.sysconf("SC_CLK_TCK")


def procs(name):
    """PIDs of this cluster's `cairn NAME` processes (`cairn up` started them here)."""
    here = os.getcwd()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        args = [c.decode(errors="replace") for c in cmd if c]
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if len(args) >= 2 and args[0].endswith("cairn") and args[1] == name and cwd == here:
            out.append(int(pid))
    return out


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12])
    return total / CLK


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def du_bytes(path):
    n = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                n += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=32)
    a = ap.parse_args()

    cluster = tomllib.load(open("cairn-data/cluster.toml", "rb"))
    endpoint = "http://" + cluster["s3"][0]["addr"]
    creds = dict(
        l.split("=", 1) for l in open("cairn-data/admin.credentials").read().splitlines() if "=" in l
    )
    creds = {k.strip(): v.strip() for k, v in creds.items()}
    local = threading.local()

    def s3():
        if not hasattr(local, "c"):
            local.c = boto3.client(
                "s3",
                endpoint_url=endpoint,
                aws_access_key_id=creds["aws_access_key_id"],
                aws_secret_access_key=creds["aws_secret_access_key"],
                region_name="us-east-1",
                config=Config(retries={"max_attempts": 10, "mode": "standard"}),
            )
        return local.c

    masters = procs("master")
    if len(masters) != 1:
        sys.exit(f"want one master of ./cairn-data, found {masters}")
    master = masters[0]
    margs = [c.decode() for c in open(f"/proc/{master}/cmdline", "rb").read().split(b"\0")]
    mdir = os.path.join(os.readlink(f"/proc/{master}/cwd"), margs[margs.index("--data-dir") + 1])
    everyone = procs("master") + procs("chunkserver") + procs("s3")
    bucket = f"meta-bench-{os.getpid()}"
    s3().create_bucket(Bucket=bucket)
    time.sleep(2)
    rss0, du0, cpu0 = rss_mib(master), du_bytes(mdir), cpu_seconds(everyone)
    t0 = time.monotonic()
    keys = [f"k/{i:09d}" for i in range(a.objects)]

    def put(k):
        s3().put_object(Bucket=bucket, Key=k, Body=b"x")

    with cf.ThreadPoolExecutor(a.threads) as ex:
        for i, _ in enumerate(ex.map(put, keys, chunksize=256)):
            if i and i % 50_000 == 0:
                print(f"  {i} PUTs, master RSS {rss_mib(master):.0f} MiB", flush=True)
    secs = time.monotonic() - t0
    cpu1 = cpu_seconds(everyone)
    time.sleep(3)
    rss1, du1 = rss_mib(master), du_bytes(mdir)
    n = a.objects
    print(f"objects: {n} in {secs:.0f} s ({n / secs:.0f} PUT/s, {a.threads} threads)")
    print(f"CPU per PUT (master+chunkservers+gateway): {(cpu1 - cpu0) / n * 1e6:.0f} us")
    print(
        f"master RSS: {rss0:.0f} -> {rss1:.0f} MiB: {(rss1 - rss0) / n * 1e6:.1f} MiB per million "
        f"objects (target 64: ratio {(rss1 - rss0) / n * 1e6 / 64:.2f})"
    )
    print(
        f"master data dir: {du0 / 2**20:.0f} -> {du1 / 2**20:.0f} MiB: {(du1 - du0) / n:.0f} bytes "
        f"per object (target 300: ratio {(du1 - du0) / n / 300:.2f})"
    )
    # Restart: SIGKILL; `cairn up` starts the master again.
    t0 = time.monotonic()
    os.kill(master, signal.SIGKILL)
    while True:
        try:
            s3().get_object(Bucket=bucket, Key=keys[-1])["Body"].read()
            break
        except Exception:
            if time.monotonic() - t0 > 300:
                sys.exit("the master did not serve again within 300 s")
            time.sleep(0.05)
    up = time.monotonic() - t0
    new = procs("master")
    print(f"restart: GET answered {up:.1f} s after SIGKILL (target 5 s: ratio {up / 5:.2f}); "
          f"new master RSS {rss_mib(new[0]) if new else 0:.0f} MiB")
    # Leave the cluster as it was.
    for i in range(0, n, 1000):
        s3().delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]}
        )
    s3().delete_bucket(Bucket=bucket)
    print("deleted the objects and the bucket")


if __name__ == "__main__":
    main()
