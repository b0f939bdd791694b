"""Precompute FOVEA drafter-training artifacts from a frozen target VLM, with Ray Data.

    python jobs/precompute.py --config manifests/jobs/precompute.yaml [--set compute.num_actors=4]
    ray job submit --working-dir . -- python jobs/precompute.py --config manifests/jobs/precompute.yaml

manifest (Parquet from jobs/build_manifests.py) -> CPU tasks: decode images, chat template,
assistant loss mask, processor -> actor pool, one frozen target per actor (num_gpus per actor
from the config; bf16 on GPU, fp32 on CPU): final hidden states, per-token minimum-attention-
entropy states at the supervised positions, projected visual tokens once per image -> shards
committed atomically under <run>/artifacts/ (layout: jobs.lib.artifact_store). A rerun of the
same config redoes only uncommitted shards: a killed job loses and duplicates nothing.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python jobs/x.py` from anywhere

from pydantic import Field  # noqa: E402

from jobs.lib.artifact_store import ARTIFACT_VERSION, committed_shards  # noqa: E402
from jobs.lib.config import Strict, cli  # noqa: E402
from jobs.lib.job import JobConfig  # noqa: E402
from jobs.lib.metrics import RunRecorder  # noqa: E402
from jobs.lib.ray_setup import init_ray  # noqa: E402
from jobs.lib.storage import Storage, join, scheme_of  # noqa: E402


class DataSection(Strict):
    manifest: str = Field("runs/build_manifests/reference/train.parquet",
                          description="a manifest table (jobs/build_manifests.py output), any URI")
    limit: int | None = Field(None, ge=1, description="first N manifest rows only")
    max_length: int = Field(2048, ge=8, description="longer samples are rejected")
    shard_size: int = Field(64, ge=1, description="samples per committed shard")


class TargetSection(Strict):
    path: str = Field("runs/reference/small/target", description="a local model directory")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    entropy_layers: tuple[int, int] | None = None   # None: the adapter's (FOVEA: 1..10; Qwen 1..9)
    hidden_dtype: Literal["float16", "bfloat16"] = "float16"


class ComputeSection(Strict):
    num_actors: int = Field(1, ge=1, description="target replicas (actor pool size)")
    num_gpus_per_actor: float = Field(0.0, ge=0)
    num_cpus_per_actor: float = Field(1.0, gt=0)
    batch_size: int = Field(8, ge=1, description="samples per target forward")


class PrecomputeConfig(JobConfig):
    data: DataSection = DataSection()
    target: TargetSection = TargetSection()
    compute: ComputeSection = ComputeSection()


def plan_shards(store: Storage, manifest: str, limit: int | None, shard_size: int) -> list[dict]:
    """Deterministic shards over the manifest's row order; each image's visual tokens belong to
    the first shard that uses it."""
    import pyarrow.parquet as pq

    fs, path = store.arrow_fs(manifest)
    shas = pq.read_table(path, filesystem=fs, columns=["image_sha256"]).column(0).to_pylist()  # one column only
    shas = shas[:limit] if limit else shas
    owner: dict[str, int] = {}
    for i, sha in enumerate(shas):
        owner.setdefault(sha, i // shard_size)
    shards = []
    for k, start in enumerate(range(0, len(shas), shard_size)):
        mine = sorted({s for s in shas[start: start + shard_size] if s and owner[s] == k})
        shards.append({"shard": k, "start": start, "stop": min(start + shard_size, len(shas)),
                       "owners": ",".join(mine)})
    return shards


def main(cfg: PrecomputeConfig) -> dict:
    import ray

    store = Storage(cfg.storage)
    run_dir = cfg.run_dir("precompute")
    root = join(run_dir, "artifacts")
    try:
        found = store.exists(cfg.data.manifest)
    except Exception as err:  # noqa: BLE001 - storage clients raise their own types
        raise ConnectionError(f"cannot reach the manifest's storage: {err}") from err
    if not found:
        raise FileNotFoundError(f"manifest {cfg.data.manifest} does not exist")
    from spec_core.targets import target_identity

    ident = target_identity(cfg.target.path)
    rec = RunRecorder("precompute", cfg, run_dir, store)
    shards = plan_shards(store, cfg.data.manifest, cfg.data.limit, cfg.data.shard_size)
    done = committed_shards(store, root)
    pending = [s for s in shards if s["shard"] not in done]
    rec.figure("ray", init_ray(cfg.ray)["mode"])
    metadata = {"artifact_version": ARTIFACT_VERSION, "hidden_dtype": cfg.target.hidden_dtype,
                "entropy_layers": cfg.target.entropy_layers, "config_hash": rec.hash, **ident}
    storage = cfg.storage.model_dump(mode="json")
    with rec.stage("precompute") as st:
        if pending:
            from jobs.lib.precompute_stages import EncodeShard, TargetStage

            target_path = str(Path(cfg.target.path).resolve()) if scheme_of(cfg.target.path) == "file" else cfg.target.path
            ds = ray.data.from_items(pending, override_num_blocks=len(pending))
            ds = ds.map(EncodeShard, fn_constructor_kwargs=dict(
                manifest_uri=cfg.data.manifest, target_path=target_path, storage=storage,
                max_length=cfg.data.max_length), compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1)
            ds = ds.map_batches(TargetStage, batch_size=1, compute=ray.data.ActorPoolStrategy(size=cfg.compute.num_actors),
                                num_gpus=cfg.compute.num_gpus_per_actor, num_cpus=cfg.compute.num_cpus_per_actor,
                                fn_constructor_kwargs=dict(
                                    target_path=target_path, dtype=cfg.target.dtype,
                                    entropy_layers=cfg.target.entropy_layers, hidden_dtype=cfg.target.hidden_dtype,
                                    batch_size=cfg.compute.batch_size, artifacts_uri=root, storage=storage,
                                    metadata=metadata, cpu_threads=max(1, int(cfg.compute.num_cpus_per_actor))))
            for _ in rec.progress(ds.iter_rows(), total=len(pending), desc="shards"):
                pass  # each row is one committed shard; its record is the marker, read below
        st["items"] = len(pending)
    done = committed_shards(store, root)
    missing = [s["shard"] for s in shards if s["shard"] not in done]
    if missing:
        raise RuntimeError(f"{len(missing)} shards not committed: {missing[:10]}")
    return finish(rec, store, root, shards, done, metadata, {s["shard"] for s in pending})


def finish(rec: RunRecorder, store: Storage, root: str, shards: list[dict], done: dict, metadata: dict,
           ran: set[int]) -> dict:
    """index.json, metrics: totals over all committed shards, speed over the shards this run did."""
    recs = [done[s["shard"]] for s in shards]
    this = [done[k] for k in sorted(ran)]
    n = sum(r["samples"] for r in recs)
    written = sum(r["bytes"] for r in recs)
    naive = sum(r["naive_bytes"] for r in recs)
    busy = sum(r["busy_seconds"] for r in this)
    reasons = Counter(reason.split(":")[0] for r in recs for reason in r["reject_reasons"])
    index = {**metadata, "shards": [s["shard"] for s in shards], "samples": n,
             "layout": "samples/ visual/ rejects/ _committed/ (jobs.lib.artifact_store)"}
    store.write_text(join(root, "index.json"), json.dumps(index, indent=2, default=str))
    wall = rec.stages["precompute"]["seconds"]
    rec.count("samples", n)
    rec.count("rejects", sum(r["rejects"] for r in recs))
    rec.figure("samples", n)
    rec.figure("rejects", dict(reasons))
    rec.figure("shards_this_run", len(this))
    rec.figure("encode_seconds", round(sum(r["encode_seconds"] for r in this), 1))
    rec.figure("target_seconds", round(busy, 1))
    rec.figure("tokens_per_s", round(sum(r["tokens"] for r in this) / max(wall, 1e-9), 1))
    rec.figure("samples_per_s", round(sum(r["samples"] for r in this) / max(wall, 1e-9), 2))
    rec.figure("bytes_written", written)
    rec.figure("bytes_per_sample", round(written / max(n, 1)))
    rec.figure("naive_bytes_ratio", round(written / max(naive, 1), 3))
    actors = Counter(r["actor"] for r in this)
    rec.figure("actor_busy_fraction", round(busy / max(wall * max(len(actors), 1), 1e-9), 3))
    rec.figure("peak_rss_mb_per_actor", round(max((r["peak_rss_mb"] for r in this), default=0), 1))
    rec.figure("peak_private_mb_per_actor", round(max((r.get("peak_private_mb", 0) for r in this), default=0), 1))
    rec.figure("artifacts_uri", root)
    return rec.finish()


if __name__ == "__main__":
    cfg = cli(PrecomputeConfig, description=__doc__)
    try:  # an unreadable manifest or target, or unreachable storage: one line, exit 1, nothing committed
        m = main(cfg)
    except (FileNotFoundError, PermissionError, ConnectionError) as err:
        print(f"precompute: {type(err).__name__}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    f = m["figures"]
    print(f"precompute: {f['samples']} samples, rejects {f['rejects']}, {f['bytes_per_sample']} B/sample "
          f"({f['naive_bytes_ratio']}x a naive dump) -> {f['artifacts_uri']}")
