"""The reference target VLM on the tiny preset: formats, processor equivalence, generate."""

import numpy as np
import pytest
import torch
from transformers import AutoProcessor, AutoTokenizer, LlavaForConditionalGeneration

from spec_core.reference import make_sample
from spec_core.reference.vlm.build import build_target, evaluate_target
from spec_core.reference.vlm.data import IGNORE, TaskPool, decode_png, encode_conversation, encode_prompt
from spec_core.reference.vlm.model import PRESETS, pixels
from spec_core.reference.vlm.evaluate import caption_grounding, generate_turns

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    out = tmp_path_factory.mktemp("target")
    metrics = build_target("tiny", str(out), seed=0)
    return str(out), metrics


def test_saved_formats_load_through_from_pretrained(tiny_target):
    path, metrics = tiny_target
    model = LlavaForConditionalGeneration.from_pretrained(path)
    proc = AutoProcessor.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.image_seq_length == PRESETS["tiny"].n_patches
    assert tok.chat_template and proc.tokenizer.convert_tokens_to_ids("<image>") == model.config.image_token_index
    assert metrics["target_build_seconds"] > 0 and "vision_acc_cell" in metrics


def test_processor_matches_fast_path(tiny_target):
    path, _ = tiny_target
    proc = AutoProcessor.from_pretrained(path)
    s = make_sample(0, "general_vqa", 0, "eval")
    image = decode_png(s["image_png"])
    text = proc.apply_chat_template(s["conversation"][:1], add_generation_prompt=True, tokenize=False)
    enc = proc(images=image, text=text, return_tensors="pt", add_special_tokens=False)
    n = PRESETS["tiny"].n_patches
    assert enc["input_ids"][0].tolist() == encode_prompt(proc.tokenizer, s["conversation"][:1], n)
    assert torch.allclose(enc["pixel_values"], pixels([image]), atol=1e-5)


def test_labels_cover_exactly_the_assistant_answers(tiny_target):
    proc = AutoProcessor.from_pretrained(tiny_target[0])
    tok = proc.tokenizer
    s = make_sample(3, "multi_turn", 0, "train")
    ids, labels = encode_conversation(tok, s["conversation"], 4)
    assert ids.count(tok.convert_tokens_to_ids("<image>")) == 4
    answer = tok.decode([t for t in labels if t != IGNORE])
    assert answer == "".join(a + "<|end|>" for a in s["answers"])
    pool = TaskPool.build([s], proc, 4)
    b = pool.batch("multi_turn", 2, np.random.default_rng(0))
    assert b["input_ids"].shape == b["labels"].shape and b["pixel_values"].shape[0] == 2


def test_target_answers_a_vqa_item_through_generate(tiny_target):
    path, _ = tiny_target
    model = LlavaForConditionalGeneration.from_pretrained(path).eval()
    proc = AutoProcessor.from_pretrained(path)
    s = make_sample(1, "text_vqa", 0, "eval")
    text = proc.apply_chat_template(s["conversation"][:1], add_generation_prompt=True, tokenize=False)
    enc = proc(images=decode_png(s["image_png"]), text=text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1]
    # the batched evaluation path gives the same greedy answer
    via_eval = generate_turns(model, proc, [s])[0][0]
    assert via_eval == proc.tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def test_quality_report_runs(tiny_target):
    samples = [make_sample(i, t, 0, "eval") for t in ("general_vqa", "captioning") for i in range(2)]
    m = evaluate_target(tiny_target[0], samples, batch=4)
    assert 0 <= m["exact_match_general_vqa"] <= 1 and "caption_grounded" in m
    assert m["target_step_ms"] > 0 and m["drafter_1block_step_ms"] > 0


def test_caption_grounding_parser():
    scene = {"objects": [{"size": "large", "colour": "red", "shape": "circle"}]}
    assert caption_grounding("In the center there is a large red circle.", scene) == (1, 1, 1)
    assert caption_grounding("There is a small blue star and a large red circle.", scene) == (2, 1, 1)
