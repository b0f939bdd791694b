"""Models from object storage end to end: jobs/generate.py (target and drafter on s3://) and
jobs/precompute.py (target on s3://) write what they write from the same directories on local
paths; the actors download each model into the node-local cache (jobs.lib.model_cache);
jobs/train_drafter.py checks its artifacts against an s3:// target."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from jobs._generate.job import GenerateConfig
from jobs._generate.job import main as generate
from jobs.lib.artifact_store import read_kind
from jobs.lib.model_cache import MARKER, listing, listing_key, model_identity
from jobs.lib.storage import Storage, join
from jobs.precompute import PrecomputeConfig
from jobs.precompute import main as precompute
from jobs.train_drafter import TrainDrafterConfig
from jobs.train_drafter import main as train_drafter
from spec_core.fovea import FoveaDrafter
from spec_core.reference.tasks import TASKS, make_split
from spec_core.targets import load_target
from tests.jobs.lib.test_model_cache import untrained_target, upload
from tests.jobs.worlds import manifest_rows

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def world(s3_server, tmp_path_factory):
    """An untrained tiny target and drafter, locally and in a bucket; a 2-sample manifest. Name it
    before `ray_local` in a test's arguments: the workers inherit SPEC_MODEL_CACHE when Ray starts."""
    import boto3

    root = tmp_path_factory.mktemp("s3models")
    old = os.environ.get("SPEC_MODEL_CACHE")
    os.environ["SPEC_MODEL_CACHE"] = str(root / "cache")
    untrained_target(root / "target")
    torch.manual_seed(0)
    FoveaDrafter.from_target(load_target(root / "target"), n_blocks=1).save_pretrained(root / "drafter")
    pq.write_table(pa.Table.from_pylist(manifest_rows([make_split(t, 1, 0, "eval")[0] for t in TASKS[:2]])),
                   root / "manifest.parquet")
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="models-e2e")
    for name in ("target", "drafter"):
        upload(root / name, f"s3://models-e2e/{name}")
    yield root, "s3://models-e2e"
    if old is None:
        os.environ.pop("SPEC_MODEL_CACHE", None)
    else:
        os.environ["SPEC_MODEL_CACHE"] = old


def cached(root: Path, uri: str) -> bool:
    """Whether the node-local cache holds a finished copy of `uri`."""
    return (root / "cache" / listing_key(listing(Storage(), uri)) / MARKER).is_file()


def _generate_cfg(root: Path, out: Path, run_id: str, target: str, drafter: str) -> GenerateConfig:
    return GenerateConfig.model_validate({
        "run": {"output_uri": str(out), "run_id": run_id}, "ray": {"num_cpus": 2},
        "data": {"manifest": str(root / "manifest.parquet"), "max_length": 200},
        "target": {"path": target}, "generation": {"max_new_tokens": 6},
        "compute": {"num_actors": 1, "batch_sizes": [1]},
        "methods": {"ar": {"kind": "ar"}, "fovea": {"drafter": drafter, "tree": {"width": 2, "depth": 2, "budget": 4}}},
        "compare": ["ar", "fovea"]})


def test_generate_with_models_on_s3_equals_local_paths(world, ray_local, tmp_path):
    root, bucket = world
    runs = {}
    for run_id, target, drafter in (("local", str(root / "target"), str(root / "drafter")),
                                    ("s3", f"{bucket}/target", f"{bucket}/drafter")):
        m = generate(_generate_cfg(root, tmp_path, run_id, target, drafter))
        runs[run_id] = pq.read_table(Path(m["figures"]["run_dir"]) / "responses.parquet").to_pylist()
    ids = lambda rows: {(r["method"], r["id"], r["turn"]): r["response_ids"] for r in rows}  # noqa: E731
    assert ids(runs["s3"]) == ids(runs["local"]) and {k[0] for k in ids(runs["s3"])} == {"ar", "fovea"}
    assert {r["target_path"] for r in runs["s3"]} == {f"{bucket}/target"}  # the URI, not the cache
    assert {r["target_path"] for r in runs["local"]} == {str(root / "target")}
    assert cached(root, f"{bucket}/target") and cached(root, f"{bucket}/drafter")


def test_precompute_with_the_target_on_s3_equals_local_paths(world, ray_local, tmp_path):
    root, bucket = world
    store, arts = Storage(), {}
    for run_id, target in (("local", str(root / "target")), ("s3", f"{bucket}/target")):
        m = precompute(PrecomputeConfig.model_validate({
            "run": {"output_uri": str(tmp_path), "run_id": run_id}, "ray": {"num_cpus": 2},
            "data": {"manifest": str(root / "manifest.parquet"), "shard_size": 1},
            "target": {"path": target}, "compute": {"batch_size": 2}}))
        arts[run_id] = m["figures"]["artifacts_uri"]
    for kind in ("samples", "visual"):
        local, remote = (sorted(read_kind(store, arts[r], kind).to_pylist(), key=str) for r in ("local", "s3"))
        assert remote == local and local
    index = {r: json.loads(store.read_text(join(arts[r], "index.json"))) for r in arts}
    assert index["s3"]["target_path"] == f"{bucket}/target"
    same = ("target_config_sha256", "hidden_size", "vocab_size", "samples", "shards")
    assert {k: index["s3"][k] for k in same} == {k: index["local"][k] for k in same}
    assert cached(root, f"{bucket}/target")
    assert not list((root / "cache").glob(".tmp-*"))

    # train_drafter takes an s3:// target too: the driver checks the artifacts against its config.json
    from jobs._train_drafter.data import ArtifactError, check_target, open_artifacts

    check_target(open_artifacts(store, arts["s3"]), model_identity(store, f"{bucket}/target"))  # accepted
    other = json.loads((root / "target" / "config.json").read_text())
    other["text_config"]["hidden_size"] *= 2
    store.write_text(f"{bucket}/other/config.json", json.dumps(other))
    store.write_bytes(f"{bucket}/other/model.safetensors", b"")  # (weights are not read on the driver)
    with pytest.raises(ArtifactError, match=f"have hidden_size .* but target {bucket}/other has"):
        train_drafter(TrainDrafterConfig.model_validate({
            "run": {"output_uri": str(tmp_path)}, "ray": {"num_cpus": 2},
            "data": {"artifacts": arts["s3"]}, "target": {"path": f"{bucket}/other"}}))
