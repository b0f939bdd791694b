"""jobs/run_batches.py: two schedulers started together on a queue of three generate batches (S3)
run each batch exactly once; a scheduler killed mid-batch leaves the batch to the next run, which
finishes it without redoing the shards already committed; a bad request fails alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from jobs.lib.storage import Storage, join
from jobs.run_batches import RunBatchesConfig, main
from spec_core.reference.tasks import make_split
from spec_core.reference.vlm.build import build_target
from tests.procs import kill_session

REPO = Path(__file__).resolve().parents[2]
N_KILL = 48  # samples (one per shard) of the batch that is killed


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("rb")
    train = [s for t in ("general_vqa", "captioning") for s in make_split(t, 4, 0, "train")]
    build_target("tiny", str(root / "target"), samples=train)
    evals = make_split("captioning", 12, 0, "eval")
    rows = [{"id": f"{s['id']}-{k}", "source": "ref", "split": "eval", "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"], "conversation": s["conversation"]}
            for k in range(N_KILL // len(evals)) for s in evals]  # many 1-sample shards: killed part-way
    pq.write_table(pa.Table.from_pylist(rows), root / "eval.parquet")
    return root


def request(root: Path, limit: int, max_new: int = 8, **extra) -> str:
    return yaml.safe_dump({"job": "generate", **extra, "config": {
        "data": {"manifest": str(root / "eval.parquet"), "shard_size": 1, "limit_per_source": limit},
        "target": {"path": str(root / "target")}, "generation": {"max_new_tokens": max_new},
        "compute": {"batch_sizes": [1]}, "methods": {"ar": {"kind": "ar"}}, "compare": ["ar"]}})


def _cfg(queue: str, out: str, lease: float = 600) -> RunBatchesConfig:
    return RunBatchesConfig.model_validate({"run": {"output_uri": out}, "ray": {"num_cpus": 2},
                                            "queue": {"uri": queue, "lease_seconds": lease}})


def test_two_schedulers_run_each_batch_exactly_once(world, ray_local, s3_bucket):
    store = Storage()
    queue, out = f"{s3_bucket}/queue", f"{s3_bucket}/out"
    for i in range(3):
        base = {"config_file": str(REPO / "manifests/jobs/generate.yaml")} if i == 0 else {}  # run_id: null there
        store.write_text(join(queue, "pending", f"b{i}.yaml"), request(world, limit=2, **base))
    store.write_text(join(queue, "pending", "bad.yaml"), "job: generate_videos\n")
    results = []
    threads = [threading.Thread(target=lambda: results.append(main(_cfg(queue, out)))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [b for m in results for b in m["figures"]["batches"]]
    assert sorted(claimed) == ["b0: done", "b1: done", "b2: done", "bad: failed"]  # each once, over both
    assert store.list(join(queue, "pending")) == []
    for i in range(3):
        rec = json.loads(store.read_text(join(queue, "done", f"b{i}.json")))
        assert rec["attempt"] == 1 and rec["counts"]["samples"] == 2
        assert store.exists(join(out, "generate", f"b{i}", "responses.parquet"))
    bad = json.loads(store.read_text(join(queue, "failed", "bad.json")))
    assert "generate_videos" in bad["error"]


@pytest.mark.ray  # the killed scheduler is a subprocess with its own Ray
@pytest.mark.slow
def test_a_scheduler_killed_mid_batch_is_finished_by_the_next_run(world, tmp_path):
    queue, out = tmp_path / "queue", tmp_path / "out"
    Storage().write_text(str(queue / "pending" / "nightly.yaml"), request(world, limit=N_KILL, max_new=48))
    args = [sys.executable, str(REPO / "jobs/run_batches.py"), "--config", str(REPO / "manifests/jobs/run_batches.yaml"),
            "--set", f"queue.uri={queue}", "--set", f"run.output_uri={out}", "--set", "queue.lease_seconds=2",
            "--set", "ray.num_cpus=2"]
    env = {**os.environ, "SPEC_NO_PROGRESS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    markers = out / "generate" / "nightly" / "shards" / "_committed"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and len(list(markers.glob("*.json"))) < 1:
        time.sleep(0.1)
    kill_session(proc.pid)  # the scheduler, its job and their Ray, actors included: none commits later
    proc.wait()
    before = {p.name: p.read_bytes() for p in markers.glob("*.json")}
    assert 1 <= len(before) < N_KILL, "killed part-way"
    assert (queue / "pending" / "nightly.yaml").exists() and not (queue / "done").exists()
    time.sleep(2.1)  # the dead scheduler's lease expires
    m = main(_cfg(str(queue), str(out), lease=2))
    assert m["figures"]["batches"] == ["nightly: done"]
    rec = json.loads((queue / "done" / "nightly.json").read_text())
    assert rec["attempt"] == 2 and rec["counts"]["samples"] == N_KILL
    assert {p.name: p.read_bytes() for p in markers.glob("*.json") if p.name in before} == before  # not redone
    gen = json.loads((out / "generate" / "nightly" / "metrics.json").read_text())
    assert gen["stages"]["generate"]["items"] == N_KILL - len(before)


def test_a_generate_images_request_builds_its_config(tmp_path):
    from jobs.generate_images import GenerateImagesConfig
    from jobs.run_batches import batch_config

    req = {"job": "generate_images", "config_file": str(REPO / "manifests/jobs/generate_images.yaml"),
           "set": ["data.limit_per_kind=2", "windows.image=[8, 16]"]}
    job, cfg = batch_config(req, "night-1", _cfg(str(tmp_path / "q"), str(tmp_path / "out")))
    assert job == "generate_images" and isinstance(cfg, GenerateImagesConfig)
    assert cfg.run.run_id == "night-1" and cfg.run.output_uri == str(tmp_path / "out")
    assert cfg.data.limit_per_kind == 2 and cfg.windows.image == [8, 16]
