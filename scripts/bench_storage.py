"""The retry policy's cost on a healthy store: small writes and reads against a moto S3 server
(its own process, on 127.0.0.1), interleaved, on three sides:

    policy   Storage.write_bytes / read_bytes: botocore standard-mode retries + the retry loop
    no_loop  the same s3fs filesystem (Storage.fs) called directly: the botocore config only
    bare     an s3fs filesystem configured as before the policy, called directly

    python scripts/bench_storage.py [--ops 50] [--reps 25] [--size 1024]

Each repetition times `ops` writes then `ops` reads of `size`-byte objects on each side, the
order rotating. Printed for wall time and this process's CPU time (the client only: the server
is another process): the ratio of the minima and the median of the per-repetition ratios with a
95% bootstrap interval (on a shared machine the minima scatter by several per cent between two
identical sides; the paired median is the steadier figure); and the loop's own cost per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fsspec  # noqa: E402

from jobs.lib.storage import Storage, StorageConfig, retry_call  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loop(write, read, bucket: str, side: str, ops: int, data: bytes) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for `ops` writes then `ops` reads."""
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(ops):
        write(f"{bucket}/{side}/{i:05d}", data)
    for i in range(ops):
        assert read(f"{bucket}/{side}/{i:05d}") == data
    return time.perf_counter() - t0, time.process_time() - c0


def ratios(a: list[float], b: list[float]) -> str:
    """Ratio of the minima, and the median of the per-repetition ratios (the two sides of one
    repetition ran back to back) with a 95% bootstrap interval."""
    import random

    paired = [x / y for x, y in zip(a, b)]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(paired, k=len(paired))) for _ in range(2000))
    lo = min(a) / min(b)
    return (f"min {min(a):.3f} s vs {min(b):.3f} s -> {lo:.4f} ({100 * (lo - 1):+.2f}%); paired median "
            f"{statistics.median(paired):.4f} [{boot[50]:.4f}, {boot[1949]:.4f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=50)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()

    import subprocess

    import boto3

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                           "AWS_DEFAULT_REGION": "us-east-1"})
        for _ in range(100):
            try:
                boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
                break
            except Exception:  # noqa: BLE001 - the server is starting
                time.sleep(0.2)
        run(endpoint, args)
    finally:
        server.terminate()
        server.wait()


def run(endpoint: str, args) -> None:
    store = Storage(StorageConfig(endpoint_url=endpoint))
    fs, _ = store.fs("s3://bench")
    bare = fsspec.filesystem("s3", anon=False, endpoint_url=endpoint, key="bench", secret="bench",
                             use_listings_cache=False, skip_instance_cache=True,
                             client_kwargs={"region_name": "us-east-1"})  # the kwargs before the policy
    sides = {
        "policy": (store.write_bytes, store.read_bytes),
        "no_loop": (lambda u, d: fs.pipe_file(u[len("s3://"):], d), lambda u: fs.cat_file(u[len("s3://"):])),
        "bare": (lambda u, d: bare.pipe_file(u[len("s3://"):], d), lambda u: bare.cat_file(u[len("s3://"):])),
    }
    data = os.urandom(args.size)
    for name, (w, r) in sides.items():  # warm-up: clients, connections
        loop(w, r, "s3://bench", name, 20, data)
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for rep in range(args.reps):
        for name in names[rep % 3:] + names[: rep % 3]:
            w, c = loop(*sides[name], "s3://bench", name, args.ops, data)
            wall[name].append(w)
            cpu[name].append(c)
        print(f"rep {rep}: wall " + ", ".join(f"{n} {wall[n][-1]:.3f}" for n in names), flush=True)

    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        retry_call(int, "read", "s3://bench/k", 90)
    loop_us = (time.perf_counter() - t0) / n * 1e6
    calls = 2 * args.ops
    print(f"{calls} calls per repetition, {args.reps} repetitions, {args.size} B objects")
    for a, b in (("policy", "bare"), ("policy", "no_loop"), ("no_loop", "bare")):
        print(f"{a} vs {b}: wall {ratios(wall[a], wall[b])}")
        print(f"{' ' * len(a + b)}      cpu  {ratios(cpu[a], cpu[b])}")
    print(f"the retry loop alone: {loop_us:.2f} us per call = "
          f"{100 * loop_us * 1e-6 * calls / min(wall['bare']):.3f}% of the fastest bare repetition's wall time")


if __name__ == "__main__":
    main()
