"""Drafter training throughput: Ray Train + DeepSpeed ZeRO-2 (1 worker) vs a bare torch loop.

    python scripts/bench_train_drafter.py --artifacts runs/precompute/reference/artifacts \
        --target runs/reference/small/target --steps 60 --batch 4

Both train the same drafter (same config, seed, batch size, fp32 on CPU) on the same artifacts
with the same objective for the same number of optimizer updates, with the same torch threads.
The job runs end to end (jobs/train_drafter.py: Ray Data stream, TorchTrainer, deepspeed.initialize,
a final checkpoint); the bare loop reads every row into memory once, then decodes, collates and
steps a torch AdamW with gradient clipping in one process. Steady-state tokens/s leaves out the
first logging window of each (start-up, first batches); end-to-end counts everything. The bare
loop runs before and after the job, and the job is compared with their mean.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LOG_EVERY = 5


def bare_loop(artifacts: str, target: str, steps: int, batch: int, threads: int, seed: int) -> dict:
    """The same training without Ray or DeepSpeed: tokens/s (steady, end to end)."""
    import torch

    from jobs.lib.config import load_config
    from jobs._train_drafter.data import attach_visual, decode_rows, open_artifacts, sha_owners
    from jobs.lib.storage import Storage
    from jobs.train_drafter import TrainDrafterConfig
    from spec_core.fovea import FoveaDrafter, drafter_loss
    from spec_core.fovea.data import collate
    from spec_core.targets import load_target, target_identity

    t_start = time.perf_counter()
    torch.set_num_threads(threads)
    # the job's own manifest: the drafter users train
    cfg = load_config(TrainDrafterConfig, Path(__file__).resolve().parents[1] / "manifests/jobs/train_drafter.yaml")
    store = Storage()
    art = open_artifacts(store, artifacts)
    owners = sha_owners(art, store)
    import pyarrow.parquet as pq

    rows = []
    for k in art.shards:
        fs, path = store.arrow_fs(art.shard_uri("samples", k))
        rows += attach_visual(pq.read_table(path, filesystem=fs), art.root, owners, store.cfg).to_pylist()
    torch.manual_seed(seed)
    drafter = FoveaDrafter.from_target(load_target(target, dtype=torch.float32),
                                       cfg.drafter.fovea_config(), identity=target_identity(target)).float()
    params = drafter.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, betas=cfg.train.betas, weight_decay=0.0)
    loss_cfg, rng = cfg.loss, random.Random(seed)
    windows, order, t0, tokens = [], [], time.perf_counter(), 0
    for step in range(1, steps + 1):
        if len(order) < batch:
            order += rng.sample(range(len(rows)), len(rows))
        picked, order = order[:batch], order[batch:]
        b = collate(decode_rows([rows[i] for i in picked], art.hidden_size, art.hidden_dtype))
        out = drafter_loss(drafter, b, loss_cfg)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
        opt.step()
        tokens += b.n_tokens
        if step % LOG_EVERY == 0:
            windows.append((tokens, time.perf_counter() - t0))
            tokens, t0 = 0, time.perf_counter()
    return rates(windows, time.perf_counter() - t_start)


def ray_deepspeed(artifacts: str, target: str, steps: int, batch: int, threads: int, seed: int,
                  cache: bool = False) -> dict:
    """jobs/train_drafter.py with one worker: tokens/s from its step log."""
    from jobs.lib.storage import Storage, join
    from jobs.train_drafter import TrainDrafterConfig, main

    out = tempfile.mkdtemp(prefix="bench-train-")
    cfg = TrainDrafterConfig.model_validate({
        "run": {"output_uri": out}, "ray": {"num_cpus": threads + 1},  # + 1 logical CPU for the Ray Data tasks
        "data": {"artifacts": artifacts, "cache": cache}, "target": {"path": target},
        "train": {"epochs": 1000, "max_steps": steps, "per_device_batch": batch, "seed": seed, "precision": "fp32",
                  "log_every": LOG_EVERY, "checkpoint_every": 0},
        "compute": {"num_workers": 1, "cpus_per_worker": threads}})
    t0 = time.perf_counter()
    main(cfg)
    wall = time.perf_counter() - t0
    log_uri = join(cfg.run_dir("train_drafter"), "train_log.jsonl")
    log = [json.loads(line) for line in Storage().read_text(log_uri).splitlines()]
    return rates([(r["tokens"], r["seconds"]) for r in log], wall)


def rates(windows: list[tuple[float, float]], wall: float) -> dict:
    """(tokens, seconds) per logging window -> steady (all windows but the first: their total, and
    the median window, robust to a busy machine and to epoch starts) and end-to-end tokens/s."""
    steady = windows[1:] or windows
    per_window = sorted(t / s for t, s in steady)
    return {"steady_tokens_per_s": sum(t for t, _ in steady) / sum(s for _, s in steady),
            "median_window_tokens_per_s": per_window[len(per_window) // 2],
            "end_to_end_tokens_per_s": sum(t for t, _ in windows) / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifacts", default="runs/precompute/reference/artifacts")
    p.add_argument("--target", default="runs/reference/small/target")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--cache", action="store_true", help="the job reads the artifacts once (data.cache)")
    a = p.parse_args()
    os.environ.setdefault("SPEC_NO_PROGRESS", "1")
    args = (a.artifacts, str(Path(a.target).resolve()), a.steps, a.batch, a.threads, a.seed)
    # bare, job, bare: the job is compared with the mean of the runs around it (a shared machine drifts)
    before, job, after = bare_loop(*args), ray_deepspeed(*args, cache=a.cache), bare_loop(*args)
    bare = {k: (before[k] + after[k]) / 2 for k in before}
    print(f"\n{a.steps} updates of {a.batch} samples, {a.threads} torch threads each")
    keys = ("steady_tokens_per_s", "median_window_tokens_per_s", "end_to_end_tokens_per_s")
    print("| tokens/s | steady | median window | end to end |\n|---|---|---|---|")
    runs = (("bare torch loop, before", before), ("Ray Train + DeepSpeed ZeRO-2", job), ("bare torch loop, after", after))
    for name, r in runs:
        print(f"| {name} | " + " | ".join(f"{r[k]:.0f}" for k in keys) + " |")
    print("| job / bare mean | " + " | ".join(f"{job[k] / bare[k]:.2f}x" for k in keys) + " |")


if __name__ == "__main__":
    main()
