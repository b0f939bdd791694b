"""Artifacts -> training rows: index checks (one-line errors), target checks, visual tokens found
in their owner shard (also when it is not the sample's own), rows decoded back to the states."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from jobs.lib.artifact_store import ARTIFACT_VERSION, commit_shard, marker_uri
from jobs._train_drafter.data import (ArtifactError, attach_visual, check_target, decode_rows, open_artifacts,
                                   sha_owners)
from jobs.lib.storage import Storage, join
from spec_core.targets.artifacts import from_16bit, supervised_positions, to_16bit

D = 8
IMAGES = {"img-a": 5, "img-b": 3}                   # sha -> visual tokens
SHARDS = {0: [("s0", "img-a"), ("s1", "img-a")],    # shard 0 owns img-a
          1: [("s2", "img-b"), ("s3", "img-a")],    # shard 1 owns img-b, uses img-a from shard 0
          2: [("s4", "img-b"), ("s5", "img-a")]}    # shard 2 owns nothing


def _sample(sid: str, sha: str, rng) -> tuple[dict, dict]:
    T = int(rng.integers(6, 12))
    mask = np.zeros(T, bool)
    mask[T // 2:] = True
    sup = supervised_positions(mask)
    final, mid = torch.randn(T, D), torch.randn(len(sup), D)
    row = {"id": sid, "source": "t", "task": "t", "image_sha256": sha, "n_tokens": T,
           "input_ids": rng.integers(0, 50, T).tolist(), "loss_mask": mask.tolist(),
           "final_hidden": to_16bit(final, "float16").tobytes(), "mid_pos": sup.tolist(),
           "mid_layer": [1] * len(sup), "mid_hidden": to_16bit(mid, "float16").tobytes()}
    return row, {"final": final, "mid": mid, "mid_pos": sup}


@pytest.fixture
def artifacts(tmp_path):
    """Three committed shards, index.json; returns (root, originals by id, visual tensors by sha)."""
    rng, store, root = np.random.default_rng(0), Storage(), str(tmp_path / "artifacts")
    visual = {sha: torch.randn(n, D) for sha, n in IMAGES.items()}
    owner: dict[str, int] = {}
    originals = {}
    for k, members in SHARDS.items():
        rows, vis = [], []
        for sid, sha in members:
            row, orig = _sample(sid, sha, rng)
            rows.append(row)
            originals[sid] = orig
            if owner.setdefault(sha, k) == k and sha not in {v["image_sha256"] for v in vis}:
                vis.append({"image_sha256": sha, "n_visual": IMAGES[sha],
                            "visual": to_16bit(visual[sha], "float16").tobytes()})
        commit_shard(store, root, k, {"samples": rows, "visual": vis, "rejects": []},
                     {"artifact_version": str(ARTIFACT_VERSION)}, {"samples": len(rows)})
    index = {"artifact_version": ARTIFACT_VERSION, "hidden_dtype": "float16", "hidden_size": D,
             "target_path": "/t", "target_config_sha256": "abc", "shards": [0, 1, 2], "samples": 6}
    store.write_text(join(root, "index.json"), json.dumps(index))
    return root, originals, visual


def test_rows_get_their_image_from_the_owner_shard(artifacts):
    root, originals, visual = artifacts
    store = Storage()
    art = open_artifacts(store, root)
    assert art.n_samples == 6 and art.shards == [0, 1, 2] and art.hidden_size == D
    owners = sha_owners(art, store)
    assert owners == {"img-a": 0, "img-b": 1}
    import pyarrow.parquet as pq

    table = pq.read_table(art.shard_uri("samples", 2))  # neither image lives in shard 2
    rows = attach_visual(table, root, owners, store.cfg).to_pylist()
    for r, s in zip(decode_rows(rows, D, "float16"), rows):
        o = originals[s["id"]]
        assert torch.equal(r.visual, from_16bit(to_16bit(visual[s["image_sha256"]], "float16"), "float16"))
        assert torch.equal(r.final, from_16bit(to_16bit(o["final"], "float16"), "float16"))
        assert torch.equal(r.mid[o["mid_pos"]], from_16bit(to_16bit(o["mid"], "float16"), "float16"))
        assert r.mid_valid.sum() == len(o["mid_pos"])


def test_missing_visual_tokens_are_an_error(artifacts):
    root, _, _ = artifacts
    store = Storage()
    art = open_artifacts(store, root)
    import pyarrow.parquet as pq

    table = pq.read_table(art.shard_uri("samples", 0))
    with pytest.raises(ArtifactError, match="no visual tokens for image img-a"):
        attach_visual(table, root, {"img-b": 1}, store.cfg)


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_unusable_artifacts_are_one_line_errors(artifacts, tmp_path):
    root, _, _ = artifacts
    store = Storage()
    with pytest.raises(ArtifactError) as e:
        open_artifacts(store, str(tmp_path / "nope"))
    assert _one_line(e).endswith("does not exist")
    store.delete(join(root, "index.json"))
    with pytest.raises(ArtifactError) as e:
        open_artifacts(store, root)
    assert "has no index.json" in _one_line(e)
    index = {"artifact_version": ARTIFACT_VERSION + 1, "hidden_dtype": "float16", "hidden_size": D,
             "target_config_sha256": "abc", "shards": [0, 1, 2]}
    store.write_text(join(root, "index.json"), json.dumps(index))
    with pytest.raises(ArtifactError) as e:
        open_artifacts(store, root)
    assert f"artifact_version {ARTIFACT_VERSION + 1}" in _one_line(e)
    store.write_text(join(root, "index.json"), json.dumps({**index, "artifact_version": ARTIFACT_VERSION}))
    store.delete(marker_uri(root, 1))
    with pytest.raises(ArtifactError) as e:
        open_artifacts(store, root)
    assert "not committed: [1]" in _one_line(e)


def test_artifacts_must_come_from_the_target(artifacts):
    root, _, _ = artifacts
    art = open_artifacts(Storage(), root)
    check_target(art, {"target_path": "/t", "target_config_sha256": "abc", "hidden_size": D})
    with pytest.raises(ArtifactError) as e:
        check_target(art, {"target_path": "/u", "target_config_sha256": "abc", "hidden_size": 2 * D})
    assert f"hidden_size {D} but target /u has {2 * D}" in _one_line(e)
    with pytest.raises(ArtifactError) as e:
        check_target(art, {"target_path": "/u", "target_config_sha256": "def", "hidden_size": D})
    assert "(config abc), not by /u (config def)" in _one_line(e)


def test_a_row_that_shares_its_images_prompt_prefix_decodes_to_all_its_states(tmp_path):
    """Six questions of one image share BOS .. image placeholders: the owner stores those states
    once; a row with prefix_len L holds positions L.. and decodes to every position."""
    rng, store, root = np.random.default_rng(1), Storage(), str(tmp_path / "artifacts")
    prefix_ids, L = [1, 4, 9, 9, 9], 5
    prefix = torch.randn(L, D)
    rows, originals = [], {}
    for sid, shared in (("q0", True), ("q1", True), ("q2", False)):
        row, orig = _sample(sid, "img-a", rng)
        if shared:
            row["input_ids"][:L] = prefix_ids
            orig["final"][:L] = prefix
            row["prefix_len"] = L
            row["final_hidden"] = to_16bit(orig["final"][L:], "float16").tobytes()
        rows.append(row)
        originals[sid] = orig
    vis = [{"image_sha256": "img-a", "n_visual": 5, "visual": to_16bit(torch.randn(5, D), "float16").tobytes(),
            "prefix_ids": prefix_ids, "prefix_hidden": to_16bit(prefix, "float16").tobytes()}]
    commit_shard(store, root, 0, {"samples": rows, "visual": vis, "rejects": []},
                 {"artifact_version": str(ARTIFACT_VERSION)}, {"samples": 3})
    import pyarrow.parquet as pq

    table = pq.read_table(join(root, "samples", "shard-00000.parquet"))
    got = attach_visual(table, root, {"img-a": 0}, store.cfg).to_pylist()
    assert [r["prefix_len"] or 0 for r in got] == [L, L, 0]
    for r, s in zip(decode_rows(got, D, "float16"), got):
        assert torch.equal(r.final, from_16bit(to_16bit(originals[s["id"]]["final"], "float16"), "float16"))
    got[0]["prefix_ids"] = [1, 4, 9, 9, 8]  # a prefix the row does not begin with
    with pytest.raises(ValueError, match="prefix of 5 tokens"):
        decode_rows(got[:1], D, "float16")


@pytest.mark.parametrize("damage", ["swapped", "truncated", "zeroed"])
def test_a_shard_unlike_its_marker_stops_the_read_or_is_quarantined(artifacts, damage):
    """Shard 0's samples file replaced by shard 1's (a valid file under another name), cut to
    half, or zeroed (same size): `fail` is one line naming the shard and what differs; `skip`
    trains on the rest, less the samples whose image only shard 0 held (s3, s5: img-a)."""
    import pyarrow.parquet as pq

    root, _, _ = artifacts
    store = Storage()
    path = join(root, "samples", "shard-00000.parquet")
    data = store.read_bytes(path)
    store.write_bytes(path, {"swapped": store.read_bytes(join(root, "samples", "shard-00001.parquet")),
                             "truncated": data[: len(data) // 2], "zeroed": bytes(len(data))}[damage])
    with pytest.raises(ArtifactError) as e:
        open_artifacts(store, root)
    line = _one_line(e)
    assert "shard 0 does not match its marker (samples/shard-00000.parquet " in line, line
    assert ("sha256 differs" if damage == "zeroed" else f"bytes, its marker says {len(data)}") in line, line
    art = open_artifacts(store, root, "skip")
    assert art.shards == [1, 2] and list(art.quarantined) == [0] and art.owners == {"img-b": 1}
    assert art.n_samples == 2 and art.lost_samples == 4
    rows = [r for k in art.shards for r in attach_visual(pq.read_table(art.shard_uri("samples", k)), root,
                                                          art.owners, store.cfg, drop_unowned=True).to_pylist()]
    assert sorted(r["id"] for r in rows) == ["s2", "s4"]
