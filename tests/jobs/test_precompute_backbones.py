"""jobs/precompute.py on tiny random LLaVA-NeXT and Qwen2.5-VL saved as model directories (the
job's CPU stage builds Qwen's image inputs without its processor): artifact schema and shapes with
a visual token count per image, loss masks on exactly the assistant tokens, the chosen layer and
the stored states against a brute-force eager recomputation, a corrupt image in rejects."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from jobs.lib.artifact_store import SAMPLES_SCHEMA, VISUAL_SCHEMA, read_kind
from jobs.lib.storage import Storage
from jobs.precompute import PrecomputeConfig, main
from spec_core.fovea.data import decode_sample
from spec_core.targets import load_target
from spec_core.targets import load_image_encoder
from spec_core.targets.artifacts import from_16bit
from spec_core.targets.encode import assistant_spans
from tests.spec_core.targets.conftest import IMAGE, brute_force_entropy
from tests.spec_core.targets.saved_targets import (END, IM_END, conversation, png, save_llava_next, save_qwen,
                                                    word_ids)

# two aspect ratios each: LLaVA-NeXT 32x16 -> 14 visual tokens, 20x20 -> 24; Qwen 40x24 -> 15, 32x16 -> 8
BACKBONES = {"llava_next": (save_llava_next, [(32, 16), (20, 20)], END),
             "qwen": (save_qwen, [(40, 24), (32, 16)], IM_END)}


def _manifest(path, sizes) -> list[dict]:
    """8 samples over 4 images (2 per size; one and two assistant turns) + a corrupt image."""
    rng = np.random.default_rng(0)
    images = [png(*sizes[k % 2], seed=k) for k in range(4)]
    rows = [{"id": f"s{i}", "source": "tiny", "split": "train", "task": "t", "image_uri": None,
             "image_bytes": images[i % 4], "image_sha256": f"img{i % 4}", "conversation": conversation(rng, 1 + i % 2)}
            for i in range(8)]
    rows.append(dict(rows[0], id="corrupt", image_bytes=b"\x89PNG not really", image_sha256="bad"))
    pq.write_table(pa.Table.from_pylist(rows), path)
    return rows


@pytest.fixture(scope="module", params=sorted(BACKBONES))
def run(request, ray_local, tmp_path_factory):
    """One precompute run per backbone (module scope: shared by the checks below)."""
    save, sizes, end = BACKBONES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    target = save(root / "target")
    rows = _manifest(root / "train.parquet", sizes)
    cfg = PrecomputeConfig.model_validate({
        "run": {"output_uri": str(root / "out")}, "ray": {"num_cpus": 2},
        "data": {"manifest": str(root / "train.parquet"), "shard_size": 3},
        "target": {"path": str(target)}, "compute": {"batch_size": 3}})
    m = main(cfg)
    art = m["figures"]["artifacts_uri"]
    store = Storage()
    return {"name": request.param, "target": target, "rows": {r["id"]: r for r in rows}, "end": end, "metrics": m,
            "art": art, "samples": read_kind(store, art, "samples"), "visual": read_kind(store, art, "visual"),
            "rejects": read_kind(store, art, "rejects").to_pylist(), "sizes": sizes,
            "index": json.loads(store.read_text(f"{art}/index.json"))}


def test_schema_and_shapes(run):
    D = load_target(run["target"]).text_config.hidden_size
    samples, visual = run["samples"], run["visual"]
    assert samples.schema.remove_metadata() == SAMPLES_SCHEMA and visual.schema.remove_metadata() == VISUAL_SCHEMA
    meta = {k.decode(): v.decode() for k, v in samples.schema.metadata.items()}
    assert meta["response_source"] == "dataset" and meta["hidden_size"] == str(D)
    assert run["index"]["samples"] == 8 and run["index"]["target_config_sha256"] == meta["target_config_sha256"]
    assert sorted(samples.column("id").to_pylist()) == [f"s{i}" for i in range(8)]
    n_visual = {v["image_sha256"]: v["n_visual"] for v in visual.to_pylist()}
    assert sorted(n_visual) == ["img0", "img1", "img2", "img3"]  # once per image
    expected = {"llava_next": [14, 24], "qwen": [15, 8]}[run["name"]]
    assert [n_visual["img0"], n_visual["img1"]] == expected  # N varies with the image's size
    prefix = {v["image_sha256"]: v["prefix_ids"] for v in visual.to_pylist()}
    for v in visual.to_pylist():
        assert len(v["visual"]) == v["n_visual"] * D * 2 and len(v["prefix_hidden"]) == len(v["prefix_ids"]) * D * 2
    for r in samples.to_pylist():
        T, S = r["n_tokens"], len(r["mid_pos"])
        assert len(r["input_ids"]) == len(r["loss_mask"]) == T and len(r["mid_layer"]) == S
        assert len(r["final_hidden"]) == (T - r["prefix_len"]) * D * 2 and len(r["mid_hidden"]) == S * D * 2
        assert r["input_ids"].count(IMAGE) == n_visual[r["image_sha256"]]
        # the prompt prefix through the image is stored with the image for the samples of its owner
        # shard (a sample whose image another shard owns keeps all its states)
        assert r["prefix_len"] in (0, len(prefix[r["image_sha256"]]))
        assert r["input_ids"][:r["prefix_len"]] == prefix[r["image_sha256"]][:r["prefix_len"]]
    assert sum(r["prefix_len"] > 0 for r in samples.to_pylist()) >= len(prefix)
    for sha, ids in prefix.items():
        assert ids[-1] == IMAGE and ids.count(IMAGE) == n_visual[sha]  # it ends with the image
    f = run["metrics"]["figures"]
    assert f["samples"] == 8 and len(f["actor_busy_fraction_per_actor"]) == 1
    assert 0 < next(iter(f["actor_busy_fraction_per_actor"].values())) <= 1


def test_loss_mask_is_exactly_the_assistant_tokens(run):
    """One token per word: each masked run is an answer's words plus the end-of-turn token."""
    for r in run["samples"].to_pylist():
        answers = [t["content"] for t in run["rows"][r["id"]]["conversation"] if t["role"] == "assistant"]
        runs = [r["input_ids"][a:b] for a, b in assistant_spans(r["loss_mask"])]
        assert runs == [word_ids(a) + [run["end"]] for a in answers]


def test_chosen_layer_and_states_equal_brute_force(run):
    adapter = load_target(run["target"])
    encoder = load_image_encoder(run["target"])
    D = adapter.text_config.hidden_size
    first, last = 1, adapter.num_layers - 1  # the default range, clamped below the last layer
    visual = {v["image_sha256"]: v for v in run["visual"].to_pylist()}
    clear = 0
    for r in run["samples"].to_pylist()[:3]:
        image = Image.open(io.BytesIO(run["rows"][r["id"]]["image_bytes"])).convert("RGB")
        arrays = encoder([image]).arrays
        ids_1T = torch.tensor([r["input_ids"]])
        inputs = {"input_ids": ids_1T, "attention_mask": torch.ones_like(ids_1T),
                  **{k: torch.from_numpy(v) for k, v in arrays.items()}, **encoder.token_inputs(ids_1T)}
        ent_LBT, hidden = brute_force_entropy(adapter.model, inputs, first, last)
        pos = torch.tensor(r["mid_pos"])
        two_LS = ent_LBT[:, 0, pos].topk(2, dim=0, largest=False).values
        ok_S = two_LS[1] - two_LS[0] > 1e-3  # skip near-ties
        expected_S = first + ent_LBT[:, 0, pos].argmin(0)
        assert torch.equal(torch.tensor(r["mid_layer"]).long()[ok_S], expected_S[ok_S])
        clear += int(ok_S.sum())
        mid_SD = from_16bit(np.frombuffer(r["mid_hidden"], np.uint16).reshape(-1, D), "float16")
        chosen_SD = torch.stack([hidden[layer][0, p] for layer, p in zip(r["mid_layer"], r["mid_pos"])])
        assert torch.allclose(mid_SD, chosen_SD, atol=2e-3, rtol=2e-3)
        v = visual[r["image_sha256"]]
        final_TD = decode_sample(r, v["visual"], v["n_visual"], D, "float16", v["prefix_ids"], v["prefix_hidden"]).final
        assert torch.allclose(final_TD, hidden[-1][0], atol=2e-3, rtol=2e-3)
        image_pos = (ids_1T[0] == IMAGE).nonzero()[:, 0]
        vis_ND = from_16bit(np.frombuffer(v["visual"], np.uint16).reshape(v["n_visual"], D), "float16")
        assert torch.allclose(vis_ND, hidden[0][0, image_pos], atol=2e-3, rtol=2e-3)  # projector output in place
    assert clear >= 10


def test_corrupt_image_is_rejected(run):
    assert [(r["id"], r["stage"]) for r in run["rejects"]] == [("corrupt", "encode")]
    assert run["rejects"][0]["reason"].startswith("image unreadable")
    assert run["metrics"]["counts"]["rejects"] == 1
