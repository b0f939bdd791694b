"""Offline captioning / VQA batches with lossless speculative decoding, on a Ray actor pool.

    python jobs/generate.py --config manifests/jobs/generate.yaml [--set compute.num_actors=4]
    ray job submit --working-dir . -- python jobs/generate.py --config manifests/jobs/generate.yaml

evaluation manifest(s) (jobs/build_manifests.py: a Parquet file or a folder of them) -> shards ->
actor pool (one frozen target per actor with the drafters of the compared methods; num_gpus and
num_cpus per actor from the config, fractions allowed) -> per shard, every method in `compare`
decodes every sample turn by turn at batch 1 (latency), then the same prompts at each configured
batch size (throughput) -> committed under <run>/shards/ (responses, per-turn metrics, rejects,
a marker with throughput and memory). A rerun skips committed shards. At the end: metrics.json,
report.md (per task tau / MAT / speedup against the first method, throughput per batch size,
memory, lossless check) and latency_cdf.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python jobs/x.py` from anywhere

from jobs._generate.job import GenerateConfig, main  # noqa: E402, F401 - the entry's config and main
from jobs.lib.job import run_job  # noqa: E402


def summary(cfg: GenerateConfig, m: dict) -> list[str]:
    f = m["figures"]
    return [f"{name}: tau {f[f'{name}_tau']}, batch-1 speedup {f[f'{name}_speedup_batch1']}x, "
            f"throughput ratio per batch {f[f'{name}_throughput_ratio']}" for name in cfg.compare[1:]] + [
        f"{m['counts'].get('samples', 0)} samples, {m['counts'].get('rejects', 0)} rejects -> {f['run_dir']}"]


if __name__ == "__main__":  # an unreadable manifest, target or drafter, or unreachable storage: one line, exit 1
    run_job("generate", summary, FileNotFoundError, PermissionError, ConnectionError, ValueError)
