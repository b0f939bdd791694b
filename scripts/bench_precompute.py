"""Benchmark: the precompute job on Ray Data vs a bare single-process loop over the same samples
(the same stage code called directly, writing the same shards), and peak actor memory at n and
10n samples (memory must follow the streaming window, not the dataset).

    python scripts/bench_precompute.py --reference runs/reference/small --n 600
    python scripts/bench_precompute.py --reference runs/reference/hires --n 300 --limit-unit images --no-10n

Prints samples/s of both sides and their ratio (goal: Ray >= 0.9x the bare loop per actor), bytes
per sample against a naive EAGLE-style dump, and peak RSS per actor at n and 10n (`--no-10n`: n
only). With `--limit-unit images` the sample takes an image's questions together, as a whole
dataset has them (the hires world has six per image): what is stored once per image - the visual
tokens, the prompt prefix's states - is then shared as it would be in the full run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("SPEC_NO_PROGRESS", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def bare_loop(manifest: str, target: str, n: int, out: str, shard_size: int, batch: int, unit: str = "rows") -> float:
    """samples/s of the stages called in one process, no Ray (the job's own shard plan)."""
    from jobs._precompute.stages import EncodeShard, TargetStage
    from jobs.lib.storage import Storage
    from jobs.precompute import plan_shards

    shards = plan_shards(Storage(), manifest, n, shard_size, limit_unit=unit)
    enc = EncodeShard(manifest, target, {}, 2048)
    stage = TargetStage(target, "auto", None, "float16", batch, out, {}, {}, cpu_threads=1)
    t0 = time.perf_counter()
    for s in shards:
        row = enc(dict(s))
        stage({k: [v] for k, v in row.items()})
    return sum(len(s["rows"]) for s in shards) / (time.perf_counter() - t0)


def ray_run(manifest: str, target: str, n: int, out: str, shard_size: int, batch: int, unit: str = "rows") -> dict:
    """The job's figures plus its steady-state samples/s: shards committed after the first one,
    over the time between the first and the last commit (start-up excluded, as in bare_loop)."""
    from jobs.lib.artifact_store import committed_shards
    from jobs.lib.storage import Storage
    from jobs.precompute import PrecomputeConfig, main

    cfg = PrecomputeConfig.model_validate({
        "run": {"output_uri": out}, "data": {"manifest": manifest, "limit": n, "limit_unit": unit,
                                                "shard_size": shard_size},
        "target": {"path": target}, "compute": {"batch_size": batch}, "ray": {"num_cpus": os.cpu_count()}})
    fig = main(cfg)["figures"]
    recs = sorted(committed_shards(Storage(), fig["artifacts_uri"]).values(), key=lambda r: r["finished_unix"])
    span = recs[-1]["finished_unix"] - recs[0]["finished_unix"]
    fig["steady_samples_per_s"] = sum(r["samples"] for r in recs[1:]) / max(span, 1e-9)
    return fig


def shuffled_manifest(manifest: str, out: str) -> str:
    """The manifest's rows in a seeded random order, so that the first n and the first 10n
    samples have the same length mix (the reference manifest is ordered by task)."""
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(manifest)
    pq.write_table(table.take(np.random.default_rng(0).permutation(table.num_rows)), out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", default="runs/reference/small")
    p.add_argument("--n", type=int, default=600)
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    p.add_argument("--limit-unit", choices=["rows", "images"], default="rows",
                   help="images: an image's questions sampled together (what a whole dataset shares)")
    p.add_argument("--no-10n", action="store_true", help="skip the 10n run (the memory check)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import subprocess

    tmp = Path(tempfile.mkdtemp(prefix="bench-precompute-"))
    subprocess.run([sys.executable, "jobs/build_manifests.py", "--config", "manifests/jobs/build_manifests.yaml",
                    "--set", f"run.output_uri={tmp}", "--set", "run.run_id=m",
                    "--set", f"data.vars.REF={args.reference}"], check=True, stdout=subprocess.DEVNULL)
    manifest = shuffled_manifest(str(tmp / "build_manifests/m/train.parquet"), str(tmp / "shuffled.parquet"))
    target = str(Path(args.reference, "target").resolve())
    run = (args.shard_size, args.batch, args.limit_unit)
    bare = bare_loop(manifest, target, args.n, str(tmp / "bare"), *run)
    small = ray_run(manifest, target, args.n, str(tmp / "ray_n"), *run)
    big = None if args.no_10n else ray_run(manifest, target, 10 * args.n, str(tmp / "ray_10n"), *run)
    print(f"samples                       {small['samples']} (limit {args.n}, by {args.limit_unit})")
    print(f"bare loop (1 process)         {bare:8.2f} samples/s")
    for tag, fig in ((f"{args.n}", small), (f"{10 * args.n}", big))[: 1 if big is None else 2]:
        print(f"Ray Data, 1 actor, {tag:>6}     {fig['steady_samples_per_s']:8.2f} samples/s steady "
              f"(ratio to bare {fig['steady_samples_per_s'] / bare:.2f}x, goal >= 0.9); end to end "
              f"{fig['samples_per_s']:.2f} with start-up, actor busy {fig['actor_busy_fraction']}")
    print(f"bytes per sample              {small['bytes_per_sample']} ({small['naive_bytes_ratio']}x a naive dump)")
    for key, what in (("peak_private_mb_per_actor", "private (anon) RSS"), ("peak_rss_mb_per_actor", "RSS incl. shared store")):
        if big is None:
            print(f"peak actor {what:22} n: {small[key]} MB")
            continue
        print(f"peak actor {what:22} n / 10n: {small[key]} / {big[key]} MB ({big[key] / small[key]:.2f}x; goal <= 1.2x)")


if __name__ == "__main__":
    main()
