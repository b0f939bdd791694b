"""Runs keyed by what they compute, on the tiny world: `data.limit` is a stratified sample; a rerun
into an explicit run id with another config stops before any work (exit 2, one line naming the
fields) or, with run.on_mismatch=restart, starts afresh; the demo's chain run twice with two
settings into the same run ids (QUICK then full, and back) never mixes outputs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs._generate.job import GenerateConfig
from jobs._generate.job import main as generate
from jobs.lib.artifact_store import committed_shards, read_kind
from jobs.lib.run_key import RunMismatch
from jobs.lib.storage import Storage
from jobs.precompute import PrecomputeConfig
from jobs.precompute import main as precompute
from jobs.train_drafter import TrainDrafterConfig
from jobs.train_drafter import main as train_drafter
from spec_core.reference.tasks import TASKS, make_split
from spec_core.reference.vlm.build import build_target
from tests.jobs.worlds import manifest_rows

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target; a training pool of 8 samples per task written task after task (as the
    reference world's is); an eval manifest of 2 per task."""
    root = tmp_path_factory.mktemp("keys")
    train = [s for t in TASKS for s in make_split(t, 8, 0, "train")]
    build_target("tiny", str(root / "target"), samples=train)
    pq.write_table(pa.Table.from_pylist(manifest_rows(train, split="train")), root / "train.parquet")
    (root / "eval").mkdir()
    evals = [s for t in TASKS for s in make_split(t, 2, 0, "eval")]
    pq.write_table(pa.Table.from_pylist(manifest_rows(evals)), root / "eval" / "ref.parquet")
    return root


def _pre(root: Path, out: Path, on_mismatch: str = "fail", target: dict | None = None, **data) -> PrecomputeConfig:
    return PrecomputeConfig.model_validate({
        "run": {"output_uri": str(out), "run_id": "reference", "on_mismatch": on_mismatch}, "ray": {"num_cpus": 2},
        "data": {"manifest": str(root / "train.parquet"), "shard_size": 4, **data},
        "target": {"path": str(root / "target"), **(target or {})}, "compute": {"batch_size": 4}})


def _ids(art: str) -> list[str]:
    return read_kind(Storage(), art, "samples").column("id").to_pylist()


def test_limit_takes_a_sample_of_every_task(world, ray_local, tmp_path):
    m = precompute(_pre(world, tmp_path, limit=30))
    table = read_kind(Storage(), m["figures"]["artifacts_uri"], "samples").to_pylist()
    tasks = Counter(r["task"] for r in table)
    assert len(table) == 30 and len(tasks) >= 4, tasks
    assert max(tasks.values()) <= 6  # 30 of 6 x 8: five per task, not the first 30 rows (3.75 tasks)


def test_a_rerun_with_another_config_stops_before_any_work(world, ray_local, tmp_path):
    first = precompute(_pre(world, tmp_path, limit=5))
    art = first["figures"]["artifacts_uri"]
    run_dir = Path(art).parent
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    for change, field in (({"limit": 13}, "data.limit: 5 -> 13"), ({"limit": 5, "shard_size": 2}, "data.shard_size: 4 -> 2")):
        with pytest.raises(RunMismatch, match=field.replace(".", r"\.")):
            precompute(_pre(world, tmp_path, **change))
    with pytest.raises(RunMismatch, match="target.hidden_dtype: float16 -> bfloat16"):
        precompute(_pre(world, tmp_path, target={"hidden_dtype": "bfloat16"}, limit=5))
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before  # nothing written

    again = precompute(_pre(world, tmp_path, limit=5, shard_size=4))  # the same config resumes: nothing to do
    assert again["figures"]["shards_this_run"] == 0 and sorted(_ids(art)) == sorted(_ids(art))

    args = [sys.executable, str(REPO / "jobs/precompute.py"), "--config", str(REPO / "manifests/jobs/precompute.yaml"),
            "--set", f"run.output_uri={tmp_path}", "--set", "run.run_id=reference", "--set", "data.limit=13",
            "--set", f"data.manifest={world / 'train.parquet'}", "--set", f"target.path={world / 'target'}",
            "--set", "data.shard_size=4", "--set", "compute.batch_size=4"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "data.limit: 5 -> 13" in lines[0], r.stderr[-2000:]

    m = precompute(_pre(world, tmp_path, "restart", target={"hidden_dtype": "bfloat16"}, limit=13))
    ids = _ids(art)
    assert len(ids) == len(set(ids)) == 13 == m["figures"]["samples"]
    index = json.loads((Path(art) / "index.json").read_text())
    assert index["hidden_dtype"] == "bfloat16" and index["samples"] == 13
    assert {r["config_hash"] for r in committed_shards(Storage(), art).values()} == {index["config_hash"]}


def _train(root: Path, out: Path, art: str, epochs: int) -> TrainDrafterConfig:
    return TrainDrafterConfig.model_validate({
        "run": {"output_uri": str(out), "run_id": "reference", "on_mismatch": "restart"}, "ray": {"num_cpus": 2},
        "data": {"artifacts": art, "shuffle_buffer": 4}, "target": {"path": str(root / "target")},
        "drafter": {"k_min": 4, "k_max": 16, "correction_hidden": 32},
        "train": {"epochs": epochs, "per_device_batch": 2, "lr": 2e-3, "warmup_steps": 1, "log_every": 1},
        "compute": {"num_workers": 1, "cpus_per_worker": 1}})


def _gen(root: Path, out: Path, drafter: str, limit: int) -> GenerateConfig:
    return GenerateConfig.model_validate({
        "run": {"output_uri": str(out), "run_id": "reference", "on_mismatch": "restart"}, "ray": {"num_cpus": 2},
        "data": {"manifest": str(root / "eval"), "limit_per_source": limit, "shard_size": 4},
        "target": {"path": str(root / "target")}, "generation": {"max_new_tokens": 8},
        "compute": {"batch_sizes": [1]},
        "methods": {"ar": {"kind": "ar"}, "fovea": {"drafter": drafter, "tree": {"budget": 6}}},
        "compare": ["ar", "fovea"]})


def test_the_chain_twice_with_two_settings_never_mixes(world, ray_local, tmp_path):
    """As the full demo then `QUICK=1 bash scripts/demo.sh` into the same run ids: the smaller run
    must not pick up the larger one's shards, checkpoints or outputs."""
    for limit, epochs, per_task in ((12, 1, 2), (6, 1, 1)):
        pre = precompute(_pre(world, tmp_path, "restart", limit=limit))
        art = pre["figures"]["artifacts_uri"]
        assert pre["figures"]["samples"] == limit and len(set(_ids(art))) == limit
        tr = train_drafter(_train(world, tmp_path, art, epochs))
        steps = epochs * (limit // 2)
        assert tr["figures"]["steps"] == steps and tr["counts"]["samples"] == limit
        assert tr["figures"]["resumed_from_step"] is None  # never another setting's checkpoint
        log = [json.loads(line) for line in (tmp_path / "train_drafter/reference/train_log.jsonl").read_text().splitlines()]
        assert len(log) == steps
        g = generate(_gen(world, tmp_path, tr["figures"]["drafter_uri"], per_task * len(TASKS)))  # one file
        responses = pq.read_table(Path(g["figures"]["run_dir"]) / "responses.parquet").to_pylist()
        per = Counter(r["id"] for r in responses if r["method"] == "ar" and r["turn"] == 0)
        assert len(per) == per_task * len(TASKS) and set(per.values()) == {1}
        assert Counter(i.split("-")[1] for i in per) == {t: per_task for t in TASKS}  # stratified by task
        assert g["figures"]["fovea_mismatches"] == 0
    spec = importlib.util.spec_from_file_location("demo_summary", REPO / "scripts" / "demo_summary.py")
    demo_summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_summary)
    text = demo_summary.render(Storage(), str(tmp_path), "reference", None, quick=True)
    assert "outputs identical to AR, token for token: yes" in text and "say nothing about speculation" in text
    assert "{" not in text  # figures in words, not dict dumps
    assert "at the first update" in text and "(3 of 6: precompute, train_drafter, generate)" in text
