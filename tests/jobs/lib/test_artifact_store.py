"""Shard commits: tables first, marker last; only marked shards are read; reruns overwrite."""

import json

from jobs.lib.artifact_store import commit_shard, committed_shards, marker_uri, read_kind
from jobs.lib.storage import Storage, join


def _rows(n, tag):
    return {"samples": [], "visual": [], "rejects": [
        {"id": f"{tag}{i}", "source": "s", "stage": "encode", "reason": "r"} for i in range(n)]}


def test_only_committed_shards_count(tmp_path):
    store, root = Storage(), str(tmp_path / "art")
    rec = commit_shard(store, root, 0, _rows(2, "a"), {"v": "1"}, {"samples": 0})
    assert rec["shard"] == 0 and json.loads(store.read_text(marker_uri(root, 0)))["shard"] == 0
    commit_shard(store, root, 1, _rows(1, "b"), {}, {"samples": 0})
    store.delete(marker_uri(root, 1))  # a shard killed between its tables and its marker
    assert sorted(committed_shards(store, root)) == [0]
    assert read_kind(store, root, "rejects").column("id").to_pylist() == ["a0", "a1"]
    commit_shard(store, root, 1, _rows(3, "c"), {}, {"samples": 0})  # the rerun overwrites it
    assert read_kind(store, root, "rejects").column("id").to_pylist() == ["a0", "a1", "c0", "c1", "c2"]
    assert store.exists(join(root, "samples", "shard-00001.parquet"))
