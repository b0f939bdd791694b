"""The tiny-hires reference world built by scripts/build_reference.py: a LLaVA-NeXT (AnyRes)
target loadable by `from_pretrained` / `AutoProcessor`, >= 144 visual tokens per image, the six
task kinds with six samples per image, and the build's own encoding equal to the processor's."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoProcessor, LlavaNextForConditionalGeneration, LlavaNextProcessor

from spec_core.reference import TASKS
from spec_core.reference.hires import make_sample
from spec_core.reference.vlm.data import TaskPool, decode_png, encode_prompt, image_token_count
from spec_core.reference.vlm.evaluate import generate_turns
from spec_core.reference.vlm.model import PRESETS, image_inputs
from tests.scripts.test_build_reference import load_script
from tests.spec_core.decoding.conftest import prompt_inputs



@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world") / "tiny-hires"
    t0 = time.perf_counter()
    metrics = load_script().main(["--size", "tiny-hires", "--out", str(out)])
    print(f"tiny-hires built in {time.perf_counter() - t0:.1f} s")  # the bar: under 2 minutes
    return out, metrics


def test_the_target_is_llava_next_with_its_processor_and_at_least_144_visual_tokens(world):
    out, metrics = world
    model = LlavaNextForConditionalGeneration.from_pretrained(out / "target")
    proc = AutoProcessor.from_pretrained(out / "target")
    assert isinstance(proc, LlavaNextProcessor) and model.config.image_grid_pinpoints
    evals = pq.read_table(out / "data" / "eval.parquet").to_pylist()
    image = decode_png(evals[0]["image_png"])
    n = image_token_count(proc, image)
    assert n >= 144 and n == PRESETS["tiny-hires"].n_image_tokens
    views = proc.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    assert views.shape[1] == 1 + 9  # base view + 3x3 tiles
    assert "region_dependence" in metrics and "generator" not in metrics["stage_seconds"]
    assert "region_dependence" in (out / "report.md").read_text()


def test_the_data_holds_six_task_kinds_with_several_samples_per_image(world):
    out, _ = world
    for split in ("train", "eval"):
        rows = pq.read_table(out / "data" / f"{split}.parquet").to_pylist()
        assert {r["task"] for r in rows} == set(TASKS)
        per_image = Counter(r["image_sha256"] for r in rows)
        assert min(per_image.values()) == len(TASKS), split


def test_the_builds_encoding_and_batches_equal_the_processors(world):
    out, _ = world
    proc = AutoProcessor.from_pretrained(out / "target")
    s = make_sample(1, "multi_turn", 0, "eval")
    image = decode_png(s["image_png"])
    enc = prompt_inputs(proc, s)
    n = PRESETS["tiny-hires"].n_image_tokens
    assert enc["input_ids"][0].tolist() == encode_prompt(proc.tokenizer, s["conversation"][:1], n)
    fast = image_inputs(proc, [image])
    assert torch.equal(enc["pixel_values"], fast["pixel_values"]) and torch.equal(enc["image_sizes"], fast["image_sizes"])
    same_image = [make_sample(1, t, 0, "eval") for t in TASKS]
    pool = TaskPool.build(same_image, proc, n)
    assert pool.images["pixel_values"].shape[0] == 1  # one image row for six samples
    b = pool.batch("captioning", 2, np.random.default_rng(0))
    assert b["pixel_values"].shape == (2, 10, 3, 64, 64) and b["image_sizes"].tolist() == [[192, 192]] * 2
    model = LlavaNextForConditionalGeneration.from_pretrained(out / "target").eval()
    assert torch.isfinite(model(**b).loss)


def test_the_evaluation_answers_as_hf_generate_does(world):
    out, _ = world
    model = LlavaNextForConditionalGeneration.from_pretrained(out / "target").eval()
    proc = AutoProcessor.from_pretrained(out / "target")
    s = make_sample(2, "text_vqa", 0, "eval")
    enc = prompt_inputs(proc, s)
    out_ids = model.generate(**enc, max_new_tokens=8, do_sample=False)
    expected = proc.tokenizer.decode(out_ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    assert generate_turns(model, proc, [s])[0][0] == expected


def test_region_dependence_asks_only_questions_about_one_named_panels_sign():
    from spec_core.reference.hires import PANEL_NAMES, mosaic_from_json
    from spec_core.reference.vlm.evaluate import _reads_sign_word, _redrawn

    picked = 0
    for s in [make_sample(i, "text_vqa", 0, "eval") for i in range(60)]:
        mosaic, [[p]] = mosaic_from_json(s["scene_json"])
        named = f"{PANEL_NAMES[p]} panel" in s["conversation"][0]["content"]
        assert _reads_sign_word(s) == (named and mosaic.panels[p].sign.word in s["answers"][0])
        if _reads_sign_word(s):
            picked += 1  # the redrawn image differs in panel p only
            after = np.asarray(decode_png(_redrawn(s, lambda mo, q, rng: q)["image_png"]))
            diff = np.any(after != np.asarray(decode_png(s["image_png"])), axis=-1)
            r, c = divmod(p, 3)
            inside = diff[r * 64:(r + 1) * 64, c * 64:(c + 1) * 64]
            assert inside.any() and diff.sum() == inside.sum()
    assert 10 < picked < 60  # lookups ("which panel says X") and other sign questions are left out
