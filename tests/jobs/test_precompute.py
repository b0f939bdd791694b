"""jobs/precompute.py on a tiny reference target: artifacts equal a direct prefill of each
sample, loss masks equal the reference encoder's, rejects are recorded, and a killed run rerun
gives every sample exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoProcessor

from jobs.lib.artifact_store import committed_shards, read_kind
from jobs.lib.storage import Storage
from jobs.precompute import PrecomputeConfig, main
from spec_core.reference.tasks import TASKS, make_split
from spec_core.reference.vlm.build import build_target
from spec_core.reference.vlm.data import IGNORE, decode_png, encode_conversation
from spec_core.reference.vlm.model import pixels
from spec_core.targets import load_target
from spec_core.fovea.data import decode_sample
from spec_core.targets.artifacts import from_16bit, image_prefix_len, supervised_positions

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target (seconds to train) and a manifest-shaped table of its samples."""
    root = tmp_path_factory.mktemp("pc")
    samples = [s for t in TASKS for s in make_split(t, 4, 0, "train")]
    build_target("tiny", str(root / "target"), samples=samples)
    rows = [{"id": s["id"], "source": s["task"], "split": "train", "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"],
             "conversation": s["conversation"]} for s in samples]
    manifest = root / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), manifest)
    return root, samples, manifest


def _cfg(root: Path, manifest: Path, out: Path, **data) -> PrecomputeConfig:
    return PrecomputeConfig.model_validate({
        "run": {"output_uri": str(out)}, "ray": {"num_cpus": 2},
        "data": {"manifest": str(manifest), "shard_size": 5, **data},
        "target": {"path": str(root / "target")}, "compute": {"batch_size": 3}})


def test_artifacts_equal_a_direct_prefill(world, ray_local, tmp_path):
    root, samples, manifest = world
    m = main(_cfg(root, manifest, tmp_path))
    store, art = Storage(), m["figures"]["artifacts_uri"]
    table = read_kind(store, art, "samples").to_pylist()
    assert sorted(r["id"] for r in table) == sorted(s["id"] for s in samples)
    assert m["figures"]["samples"] == len(samples) and 0 < m["figures"]["naive_bytes_ratio"] < 1
    cost = m["cost"]["stages"]["precompute"]  # the target actor's measured busy time, 1 CPU, no price
    assert cost["device_kind"] == "cpu" and 0 < cost["device_seconds"] <= cost["allocated_device_seconds"]
    assert cost["per_1k_samples"] > 0 and cost["per_million_tokens"] > 0 and "cost" not in cost
    assert "## Cost" in store.read_text(m["run_dir"] + "/report.md")
    visual = {r["image_sha256"]: r for r in read_kind(store, art, "visual").to_pylist()}
    assert len(visual) == len({s["image_sha256"] for s in samples})  # once per image

    adapter = load_target(root / "target")
    tokenizer = AutoProcessor.from_pretrained(root / "target").tokenizer
    by_id = {s["id"]: s for s in samples}
    D = adapter.text_config.hidden_size
    for r in table[::7]:
        s = by_id[r["id"]]
        ids, labels = encode_conversation(tokenizer, list(s["conversation"]), adapter.model.config.image_seq_length)
        assert r["input_ids"] == ids and r["loss_mask"] == [lab != IGNORE for lab in labels]
        out = adapter.prefill({"input_ids": torch.tensor([ids]), "pixel_values": pixels([decode_png(s["image_png"])])},
                              adapter.default_entropy_layers)
        v = visual[r["image_sha256"]]  # a sample of an image its shard owns: its prefix is the image's
        assert r["prefix_len"] == image_prefix_len(ids, adapter.image_token_id) == len(v["prefix_ids"])
        final = decode_sample(r, v["visual"], v["n_visual"], D, "float16", v["prefix_ids"], v["prefix_hidden"]).final
        assert torch.allclose(final, out.final_hidden_BTD[0], atol=2e-3, rtol=2e-3)
        sup = supervised_positions(np.array(r["loss_mask"]))
        assert r["mid_pos"] == sup.tolist()
        assert r["mid_layer"] == out.chosen_layer_BT[0, sup].tolist()
        mid = from_16bit(np.frombuffer(r["mid_hidden"], np.uint16).reshape(-1, D), "float16")
        assert torch.allclose(mid, out.intermediate_BTD[0, sup], atol=2e-3, rtol=2e-3)
        vis = from_16bit(np.frombuffer(v["visual"], np.uint16).reshape(v["n_visual"], D), "float16")
        assert torch.allclose(vis, out.visual_BPD[0], atol=2e-3, rtol=2e-3)


def test_the_questions_of_one_image_store_its_prompt_prefix_once(ray_local, tmp_path):
    """The tiny-hires world asks six questions per image: the image's 176-token prompt prefix
    (BOS, user header, 172 placeholders, newline) is stored once, every sample decodes to a direct
    prefill, and the bytes per sample fall well below a naive dump's."""
    from spec_core.reference import hires

    samples = [s for t in TASKS for s in hires.make_split(t, 3, 0, "train")]  # 3 images x 6 questions
    samples.sort(key=lambda s: s["task"])  # the manifest interleaves images; the plan groups them
    build_target("tiny-hires", str(tmp_path / "target"), samples=samples)
    rows = [{"id": s["id"], "source": s["task"], "split": "train", "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"], "conversation": s["conversation"]}
            for s in samples]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    m = main(_cfg(tmp_path, tmp_path / "train.parquet", tmp_path / "out", shard_size=6))
    store, art = Storage(), m["figures"]["artifacts_uri"]
    table = read_kind(store, art, "samples").to_pylist()
    visual = {r["image_sha256"]: r for r in read_kind(store, art, "visual").to_pylist()}
    assert len(table) == 18 and len(visual) == 3
    adapter = load_target(tmp_path / "target")
    processor = AutoProcessor.from_pretrained(tmp_path / "target")
    D, by_id = adapter.text_config.hidden_size, {s["id"]: s for s in samples}
    for r in table:
        v = visual[r["image_sha256"]]
        assert r["prefix_len"] == len(v["prefix_ids"]) > 172  # every question shares its image's prefix
        assert len(r["final_hidden"]) == (r["n_tokens"] - r["prefix_len"]) * D * 2  # and stores only the rest
        s = by_id[r["id"]]
        text = processor.tokenizer.apply_chat_template(s["conversation"], tokenize=False)
        enc = processor(text=text, images=decode_png(s["image_png"]), add_special_tokens=False, return_tensors="pt")
        assert enc["input_ids"][0].tolist() == r["input_ids"]
        out = adapter.prefill(dict(enc))
        final = decode_sample(r, v["visual"], v["n_visual"], D, "float16", v["prefix_ids"], v["prefix_hidden"]).final
        assert torch.allclose(final, out.final_hidden_BTD[0], atol=2e-3, rtol=2e-3)
    assert m["figures"]["naive_bytes_ratio"] < 0.3  # measured 0.26 (the tiny world: 0.7)


def test_bad_rows_are_rejected_with_reasons(world, ray_local, tmp_path):
    root, samples, manifest = world
    rows = pq.read_table(manifest).slice(0, 6).to_pylist()
    rows[1]["image_bytes"] = b"not a png"
    rows[2]["conversation"] = []
    rows[3]["conversation"] = rows[3]["conversation"][:1]  # no assistant turn
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), bad)
    m = main(_cfg(root, bad, tmp_path / "out", max_length=40))  # the long captions are too long
    rejects = read_kind(Storage(), m["figures"]["artifacts_uri"], "rejects").to_pylist()
    reasons = {r["id"]: r["reason"] for r in rejects}
    assert reasons[rows[1]["id"]].startswith("image unreadable")
    assert reasons[rows[2]["id"]] == "empty conversation"
    assert "does not end with an assistant" in reasons[rows[3]["id"]]
    kept = read_kind(Storage(), m["figures"]["artifacts_uri"], "samples").column("id").to_pylist()
    assert set(kept) | set(reasons) == {r["id"] for r in rows} and not set(kept) & set(reasons)
    assert any(v.startswith("too long") for v in reasons.values())
    assert m["counts"]["rejects"] == len(rejects)


def test_an_image_whose_owner_sample_is_rejected_still_gets_its_visual_tokens(world, ray_local, tmp_path):
    """The image's owner shard (the first that uses it) has only a rejected sample; a later
    shard's sample of the same image must still find the image's visual tokens."""
    root, samples, manifest = world
    first, second = pq.read_table(manifest).slice(0, 2).to_pylist()
    second = {**second, "image_bytes": first["image_bytes"], "image_sha256": first["image_sha256"]}
    first = {**first, "conversation": first["conversation"] * 30}  # far over max_length
    shared = tmp_path / "shared.parquet"
    pq.write_table(pa.Table.from_pylist([first, second]), shared)
    m = main(_cfg(root, shared, tmp_path / "out", shard_size=1, max_length=300))
    art = m["figures"]["artifacts_uri"]
    assert read_kind(Storage(), art, "rejects").column("id").to_pylist() == [first["id"]]
    assert read_kind(Storage(), art, "samples").column("id").to_pylist() == [second["id"]]
    visual = read_kind(Storage(), art, "visual").to_pylist()
    assert [v["image_sha256"] for v in visual] == [first["image_sha256"]]
    adapter = load_target(root / "target")
    expect = adapter.prefill({"input_ids": torch.tensor([[adapter.image_token_id] * visual[0]["n_visual"]]),
                              "pixel_values": pixels([decode_png(first["image_bytes"])])}).visual_BPD[0]
    got = from_16bit(np.frombuffer(visual[0]["visual"], np.uint16).reshape(visual[0]["n_visual"], -1), "float16")
    torch.testing.assert_close(got, expect.half().float())


@pytest.mark.ray  # the killed run is a subprocess with its own Ray
@pytest.mark.slow
def test_a_killed_run_reruns_to_exactly_once(world, tmp_path):
    """Killed part-way, one committed shard's file then replaced by another's: the rerun redoes
    the unfinished shards and the damaged one (said in one line), 0 lost, 0 duplicated."""
    root, samples, manifest = world
    out = tmp_path / "out"
    args = [sys.executable, str(REPO / "jobs/precompute.py"), "--config", str(REPO / "manifests/jobs/precompute.yaml"),
            "--set", f"run.output_uri={out}", "--set", f"data.manifest={manifest}", "--set", "data.shard_size=2",
            "--set", f"target.path={root / 'target'}", "--set", "ray.num_cpus=2", "--set", "compute.batch_size=1"]
    env = {**os.environ, "SPEC_NO_PROGRESS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    art = None
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        found = list(out.glob("precompute/*/artifacts/_committed/*.json"))
        if len(found) >= 2:
            art = found[0].parents[1]
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert art is not None, "the job committed no shard before the deadline"
    n_shards = -(-len(samples) // 2)
    committed = sorted(committed_shards(Storage(), str(art)))
    assert len(committed) < n_shards  # killed part-way
    a, b = committed[:2]  # a committed file copied over by another shard's: the marker is not trusted
    (art / "samples" / f"shard-{b:05d}.parquet").write_bytes((art / "samples" / f"shard-{a:05d}.parquet").read_bytes())
    r = subprocess.run(args, env=env, check=True, capture_output=True, text=True, timeout=300)
    assert f"precompute: shard {b} does not match its marker (samples/shard-{b:05d}.parquet " in r.stdout, r.stdout
    ids = read_kind(Storage(), str(art), "samples").column("id").to_pylist()
    assert len(ids) == len(set(ids)) == len(samples)  # 0 lost, 0 duplicated
    assert sorted(ids) == sorted(s["id"] for s in samples)


def test_missing_manifest_is_one_line_and_commits_nothing(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "jobs/precompute.py"), "--config",
                        str(REPO / "manifests/jobs/precompute.yaml"), "--set", f"run.output_uri={tmp_path}",
                        "--set", f"data.manifest={tmp_path / 'nope.parquet'}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"precompute: FileNotFoundError: manifest {tmp_path / 'nope.parquet'} does not exist"]
    assert not list(tmp_path.rglob("_committed"))


def test_samples_beyond_the_position_table_are_rejected(world, ray_local, tmp_path):
    """A target with a short position table (max_length far away): with the dataset's answers, a
    sample is rejected with the reason exactly when prompt + answers is longer than the table; with
    response_source target, a conversation whose turn-1 prompt plus max_new_tokens is beyond it is
    rejected at that turn before generating it. The other samples of the shard are written."""
    from jobs._precompute.stages import encode_row
    from spec_core.targets import load_image_encoder
    from spec_core.targets.encode import assistant_spans
    from tests.jobs.worlds import short_table_target

    root, samples, manifest = world
    rows = pq.read_table(manifest).to_pylist()
    multi = next(r for r in rows if r["task"] == "multi_turn" and len(r["conversation"]) >= 4)
    picked = [multi] + [next(r for r in rows if r["task"] == t) for t in ("general_vqa", "chart_vqa", "captioning")]
    encoder = load_image_encoder(root / "target")
    enc = {r["id"]: encode_row(r, encoder, Storage(), None) for r in picked}
    max_new = 4
    (start0, end0), (start1, _), *_ = assistant_spans(enc[multi["id"]]["loss_mask"])
    first = min(assistant_spans(e["loss_mask"])[0][0] for i, e in enc.items() if i != multi["id"])
    pq.write_table(pa.Table.from_pylist(picked), tmp_path / "rows.parquet")

    def run(limit: int, **data) -> tuple[dict, set]:
        target = short_table_target(root / "target", tmp_path / f"target{limit}", limit)
        cfg = _cfg(root, tmp_path / "rows.parquet", tmp_path / f"out{limit}", **data).model_dump(mode="json")
        m = main(PrecomputeConfig.model_validate({**cfg, "target": {"path": target}}))
        art = m["figures"]["artifacts_uri"]
        rejects = {r["id"]: r["reason"] for r in read_kind(Storage(), art, "rejects").to_pylist()}
        kept = read_kind(Storage(), art, "samples").to_pylist()
        assert {r["id"] for r in kept} | set(rejects) == set(enc) and not {r["id"] for r in kept} & set(rejects)
        assert all(r["n_tokens"] <= limit for r in kept) and kept  # the rest of the shard is written
        return rejects, {r["id"] for r in kept}

    limit = min(len(e["input_ids"]) for e in enc.values())  # the shortest sample just fits
    rejects, _ = run(limit)
    assert rejects == {i: f"beyond the position table: {len(e['input_ids'])} tokens > max_position_embeddings {limit}"
                       for i, e in enc.items() if len(e["input_ids"]) > limit}
    assert multi["id"] in rejects

    # every first turn fits (the answer closed by the template's newline); the multi-turn
    # sample's second cannot, whatever its first answer
    limit = max(start0, first) + max_new + 2
    assert start1 - (end0 - start0) + 1 + max_new > limit
    rejects, _ = run(limit, response_source="target", response_max_new_tokens=max_new)
    assert rejects[multi["id"]].startswith("turn 1: beyond the position table: ")
    assert rejects[multi["id"]].endswith(f" tokens + {max_new} new > max_position_embeddings {limit}")
    assert all("beyond the position table" in r for r in rejects.values())


def test_the_plan_keeps_an_images_questions_together_in_a_shard(tmp_path):
    """Six questions per image, written one task after another: the plan brings an image's rows
    together (one owner shard, so they share its prefix), and `limit_unit: images` samples whole images."""
    from jobs.precompute import plan_shards

    tasks = ["general", "text", "caption", "chart", "reason", "multi"]
    rows = [{"image_sha256": f"img{i}", "source": t, "task": t} for t in tasks for i in range(10)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    plan = plan_shards(Storage(), str(tmp_path / "m.parquet"), None, 6)
    for s in plan:  # every shard holds exactly one image's six questions, and owns it
        assert len({rows[r]["image_sha256"] for r in s["rows"]}) == 1 == len(s["owners"].split(","))
    sub = plan_shards(Storage(), str(tmp_path / "m.parquet"), 18, 6, seed=1, limit_unit="images")
    assert sum(len(s["rows"]) for s in sub) == 18
    assert all(len({rows[r]["image_sha256"] for r in s["rows"]}) == 1 for s in sub)
    by_rows = plan_shards(Storage(), str(tmp_path / "m.parquet"), 18, 6, seed=1)  # rows: questions of many images
    assert len({rows[r]["image_sha256"] for s in by_rows for r in s["rows"]}) > 3
