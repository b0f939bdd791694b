"""Shard commits: tables first, marker last; only marked shards are read; reruns overwrite."""

import json

from jobs.lib.artifact_store import commit_shard, committed_shards, marker_uri, read_kind, verified_shards, verify_shard
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


def test_resume_redoes_a_shard_whose_files_do_not_match_its_marker(tmp_path):
    """A committed file copied over by another shard's, or truncated, is found by its size and
    sha256: said in one line, its marker removed (the run redoes it); intact shards stay."""
    store, root = Storage(), str(tmp_path / "art")
    for k in range(4):
        commit_shard(store, root, k, _rows(k + 1, f"r{k}"), {}, {"samples": 0})
    rec = committed_shards(store, root)[0]
    assert rec["files"]["rejects"]["rows"] == 1 and verify_shard(store, root, 0, rec) is None
    rejects = lambda k: join(root, "rejects", f"shard-0000{k}.parquet")  # noqa: E731
    store.write_bytes(rejects(1), store.read_bytes(rejects(2)))  # a valid shard under another name
    store.write_bytes(rejects(3), store.read_bytes(rejects(3))[:100])
    orphan = tmp_path / "art" / "rejects" / f"shard-00004.parquet.tmp-{'0a' * 16}"  # a writer killed mid-write
    orphan.write_bytes(b"half")
    said = []
    good = verified_shards(store, root, committed_shards(store, root), said.append)
    assert sorted(good) == [0, 2] and sorted(committed_shards(store, root)) == [0, 2] and not orphan.exists()
    assert said[0] == "removed 1 temp files a killed run left"
    assert len(said) == 3 and said[1].startswith("shard 1 does not match its marker (rejects/shard-00001.parquet has")
    assert "shard 3" in said[2] and "its marker says" in said[2] and said[2].endswith("redoing it")
