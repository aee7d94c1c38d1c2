#!/usr/bin/env python3
"""Small-file metadata benchmark (scripts/bench-files.sh): THREADS threads each create, write
SIZE bytes to and close FILES/THREADS files in a directory of their own under DIR, then stat
them all, then unlink them all (`--keep`: no unlink). One JSON line per phase:
{"phase": ..., "ops": N, "secs": S, "ops_per_s": R}. Standard library only.

    bench-smallfiles.py DIR FILES [--threads 16] [--size 4096] [--keep]
"""
import argparse
import json
import os
import threading
import time


def run(phase, threads, work):
    errors = []

    def worker(t):
        try:
            work(t)
        except OSError as e:  # reported, and the run fails
            errors.append(f"thread {t}: {e}")

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    start = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    secs = time.monotonic() - start
    if errors:
        raise SystemExit(f"{phase}: {errors[0]} ({len(errors)} threads failed)")
    return secs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("files", type=int)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()
    per = a.files // a.threads
    data = os.urandom(a.size)
    dirs = [os.path.join(a.dir, f"t{t}") for t in range(a.threads)]
    for d in dirs:
        os.makedirs(d, exist_ok=True)

    def create(t):
        for i in range(per):
            fd = os.open(os.path.join(dirs[t], f"f{i}"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def stat(t):
        for i in range(per):
            st = os.stat(os.path.join(dirs[t], f"f{i}"))
            if st.st_size != a.size:
                raise OSError(f"f{i}: {st.st_size} bytes, wrote {a.size}")

    def unlink(t):
        for i in range(per):
            os.unlink(os.path.join(dirs[t], f"f{i}"))

    phases = [("create", create), ("stat", stat)] + ([] if a.keep else [("unlink", unlink)])
    for name, work in phases:
        secs = run(name, a.threads, work)
        n = per * a.threads
        print(json.dumps({"phase": name, "ops": n, "secs": round(secs, 3),
                          "ops_per_s": round(n / secs, 1)}), flush=True)
    if not a.keep:
        for d in dirs:
            os.rmdir(d)


if __name__ == "__main__":
    main()
