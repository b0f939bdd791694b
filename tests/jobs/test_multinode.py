"""Precompute and generate on a multi-node local cluster (`ray.cluster_utils.Cluster`: a head with
no CPUs and two worker nodes on this machine): their actors spread over both nodes, and removing
a worker node in the middle of a generate run still completes it with every sample exactly once."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs._generate.job import GenerateConfig
from jobs._generate.job import main as generate
from jobs.lib.artifact_store import committed_shards
from jobs.lib.storage import Storage
from jobs.precompute import PrecomputeConfig
from jobs.precompute import main as precompute
from spec_core.reference.tasks import make_split
from spec_core.reference.vlm.build import build_target

pytestmark = pytest.mark.ray  # a multi-node Ray cluster per module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 128 * 2**20})
    workers = [c.add_node(num_cpus=2, object_store_memory=128 * 2**20) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield c, workers
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("mn")
    samples = [s for t in ("general_vqa", "captioning") for s in make_split(t, 6, 0, "train")]
    build_target("tiny", str(root / "target"), samples=samples)
    rows = [{"id": s["id"], "source": "ref", "split": "eval", "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"], "conversation": s["conversation"]}
            for s in samples]
    pq.write_table(pa.Table.from_pylist(rows), root / "rows.parquet")
    # the node-loss run: 96 one-sample shards, so that much is left when both actors have begun
    many = [dict(r, id=f"{r['id']}-{k}") for k in range(8) for r in rows]
    pq.write_table(pa.Table.from_pylist(many), root / "many.parquet")
    return root, samples


def _generate_cfg(root: Path, out: Path, max_new: int = 8, manifest: str = "rows.parquet") -> GenerateConfig:
    return GenerateConfig.model_validate({
        "run": {"output_uri": str(out), "run_id": "mn"}, "data": {"manifest": str(root / manifest), "shard_size": 1},
        "target": {"path": str(root / "target")}, "generation": {"max_new_tokens": max_new},
        "compute": {"num_actors": 2, "batch_sizes": [1]}, "methods": {"ar": {"kind": "ar"}}, "compare": ["ar"]})


def test_precompute_and_generate_spread_over_nodes(cluster, world, tmp_path):
    _, workers = cluster
    root, samples = world
    nodes = {w.node_id for w in workers}
    m = precompute(PrecomputeConfig.model_validate({
        "run": {"output_uri": str(tmp_path)}, "data": {"manifest": str(root / "rows.parquet"), "shard_size": 2},
        "target": {"path": str(root / "target")}, "compute": {"num_actors": 2, "batch_size": 2}}))
    art = m["figures"]["artifacts_uri"]
    # Ray Data places its actors SPREAD but may feed every shard to the first one up: the work ran
    # on worker nodes (the head has no CPUs); ActorPool below hands each actor a shard at once
    assert {r["node"] for r in committed_shards(Storage(), art).values()} <= nodes
    generate(_generate_cfg(root, tmp_path))
    recs = committed_shards(Storage(), str(tmp_path / "generate" / "mn" / "shards"))
    assert len(recs) == len(samples) and {r["node"] for r in recs.values()} == nodes


def test_losing_a_node_mid_run_loses_and_doubles_nothing(cluster, world, tmp_path):
    c, workers = cluster
    root, samples = world
    out = tmp_path / "out"
    result, error = {}, []

    def run():
        try:
            result.update(generate(_generate_cfg(root, out, max_new=32, manifest="many.parquet")))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            error.append(err)

    t = threading.Thread(target=run)
    t.start()
    markers = out / "generate" / "mn" / "shards" / "_committed"
    deadline = time.time() + 240
    lost = workers[1]
    while time.time() < deadline and t.is_alive():  # until both nodes have committed a shard
        if {json.loads(p.read_text())["node"] for p in markers.glob("*.json")} == {w.node_id for w in workers}:
            break
        time.sleep(0.05)
    c.remove_node(lost)  # its actor dies with it; Ray restarts it on the other node
    at_removal = len(list(markers.glob("*.json")))
    t.join(timeout=600)
    assert at_removal < 8 * len(samples), "the node was removed mid-run"
    assert not error, error
    recs = committed_shards(Storage(), str(out / "generate" / "mn" / "shards"))
    n = 8 * len(samples)
    assert len(recs) == n
    assert any(r["node"] == lost.node_id for r in recs.values()), "the lost node had done some work"
    assert any(r["node"] != lost.node_id for r in recs.values())
    ids = pq.read_table(out / "generate" / "mn" / "responses.parquet").column("id").to_pylist()
    assert sorted(ids) == sorted(f"{s['id']}-{k}" for k in range(8) for s in samples)  # each once
