"""Quality of the reference VLM on held-out samples: greedy `generate` exact match per task,
caption grounding, image dependence (swap the image, does the answer change?), for the hires
world region dependence (redraw only the panel a question reads: does the answer change? redraw
another panel: does it stay?), answer lengths, and the per-call cost of the target against a
one-block drafter step.

Shapes: B batch, T positions, D hidden, V vocabulary.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from collections import defaultdict

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlavaForConditionalGeneration

from spec_core.reference.hires.mosaic import PANEL_NAMES, alter_panel, mosaic_from_json, render_mosaic
from spec_core.reference.tasks import png_bytes
from spec_core.reference.vlm.data import decode_png, encode_prompt, image_token_count
from spec_core.reference.vlm.model import image_inputs
from spec_core.reference.vocab import COLOURS, SHAPES, SIZES
from spec_core.targets.base import pad_left

MAX_NEW = {"captioning": 360, "reasoning": 260}  # the hires world's captions name nine panels
# tasks whose correct answer differs between two random scenes almost surely
SWAP_TASKS = ("captioning", "text_vqa")
_MENTION = re.compile(rf"\b({'|'.join(SIZES)}) ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})\b")


@torch.no_grad()
def generate_turns(model: LlavaForConditionalGeneration, processor, samples: list[dict], batch: int = 16,
                   swap: int = 0) -> list[list[str]]:
    """Greedy answer of every assistant turn (history = the reference turns before it).
    swap=k feeds each sample the image of the sample k places later (image dependence). Every
    image of `samples` has the size of the first (one reference world)."""
    tok = processor.tokenizer
    pils = [decode_png(s["image_png"]) for s in samples]
    n_tokens = image_token_count(processor, pils[0])
    jobs = []  # (sample index, turn index, prompt ids, task)
    for i, s in enumerate(samples):
        conv = list(s["conversation"])
        for t in range(len(conv) // 2):
            jobs.append((i, t, encode_prompt(tok, conv[: 2 * t + 1], n_tokens), s["task"]))
    images = image_inputs(processor, pils)
    out: list[list[str]] = [[""] * (len(s["conversation"]) // 2) for s in samples]
    jobs.sort(key=lambda j: (MAX_NEW.get(j[3], 48), len(j[2])))
    for b in range(0, len(jobs), batch):
        chunk = jobs[b: b + batch]
        ids_BT, mask_BT = pad_left([j[2] for j in chunk], tok.pad_token_id)
        img = torch.tensor([(j[0] + swap) % len(samples) for j in chunk])
        gen = model.generate(input_ids=ids_BT, attention_mask=mask_BT, **{k: v[img] for k, v in images.items()},
                             max_new_tokens=max(MAX_NEW.get(j[3], 48) for j in chunk), do_sample=False)
        for j, row in zip(chunk, gen[:, ids_BT.shape[1]:]):
            out[j[0]][j[1]] = tok.decode(row, skip_special_tokens=True).strip()
    return out


def scene_objects(scene: dict) -> list[dict]:
    """The objects of a scene dict, or of every panel of a hires mosaic."""
    return [o for p in scene.get("panels", [scene]) for o in p["objects"]]


def caption_grounding(caption: str, scene: dict) -> tuple[int, int, int]:
    """(mentions, grounded mentions, scene objects mentioned) for one caption."""
    present = {(o["size"], o["colour"], o["shape"]) for o in scene_objects(scene)}
    mentions = _MENTION.findall(caption)
    grounded = sum(m in present for m in mentions)
    return len(mentions), grounded, len(present & set(mentions))


def quality(model: LlavaForConditionalGeneration, processor, samples: list[dict], batch: int = 16) -> dict[str, float]:
    """Exact match per task, caption grounding, image dependence and answer lengths."""
    tok = processor.tokenizer
    by_task = defaultdict(list)
    for s in samples:
        by_task[s["task"]].append(s)
    m: dict[str, float] = {}
    for task, group in sorted(by_task.items()):
        answers = generate_turns(model, processor, group, batch)
        refs = [list(s["answers"]) for s in group]
        pairs = [(a, r) for aa, rr in zip(answers, refs) for a, r in zip(aa, rr)]
        m[f"exact_match_{task}"] = round(sum(a == r for a, r in pairs) / len(pairs), 4)
        lengths = [len(tok(a, add_special_tokens=False)["input_ids"]) for a, _ in pairs]
        m[f"answer_tokens_{task}"] = round(sum(lengths) / len(lengths), 1)
        if task == "captioning":
            g = [caption_grounding(a[0], json.loads(s["scene_json"])) for a, s in zip(answers, group)]
            m["caption_grounded"] = round(sum(x[1] for x in g) / max(sum(x[0] for x in g), 1), 4)
            m["caption_recall"] = round(sum(x[2] for x in g) / max(
                sum(len({(o["size"], o["colour"], o["shape"]) for o in scene_objects(json.loads(s["scene_json"]))})
                    for s in group), 1), 4)
        if len(group) > 1:
            swapped = generate_turns(model, processor, group, batch, swap=1)
            first = [(a[0], b[0]) for a, b in zip(answers, swapped)]
            m[f"image_dependence_{task}"] = round(sum(a != b for a, b in first) / len(first), 4)
        if task == "text_vqa" and "panels" in json.loads(group[0]["scene_json"]):
            m.update(region_dependence(model, processor, group, [a[0] for a in answers], batch))
    dep = [m[f"image_dependence_{t}"] for t in SWAP_TASKS if f"image_dependence_{t}" in m]
    if dep:
        m["image_dependence"] = round(sum(dep) / len(dep), 4)
    return m


def _redrawn(sample: dict, panel_of) -> dict:
    """The sample with one panel of its mosaic redrawn (panel_of(mosaic, region, rng) picks it)."""
    mosaic, regions = mosaic_from_json(sample["scene_json"])
    rng = np.random.default_rng(zlib.crc32(sample["id"].encode()))
    altered = alter_panel(mosaic, panel_of(mosaic, regions[0][0], rng), rng)
    return {**sample, "image_png": png_bytes(render_mosaic(altered))}


def _reads_sign_word(sample: dict) -> bool:
    """A question about one named panel whose answer names the word of that panel's sign (not
    'which panel says X': with X redrawn away that question has no right answer left)."""
    mosaic, regions = mosaic_from_json(sample["scene_json"])
    p = regions[0][0]
    sign = mosaic.panels[p].sign
    return (len(regions[0]) == 1 and sign is not None and sign.word in sample["answers"][0]
            and f"{PANEL_NAMES[p]} panel" in sample["conversation"][0]["content"])


def region_dependence(model, processor, samples: list[dict], answers: list[str], batch: int = 16) -> dict:
    """On hires text questions about one panel's sign (the answer names its word): the share of
    answers that change when only that panel is redrawn (another word), and the share that stay
    when one other panel is redrawn instead."""
    asked = [(s, a) for s, a in zip(samples, answers) if _reads_sign_word(s)]
    if not asked:
        return {}
    group, before = [s for s, _ in asked], [a for _, a in asked]
    same = [_redrawn(s, lambda mo, p, rng: p) for s in group]
    other = [_redrawn(s, lambda mo, p, rng: int(rng.choice([q for q in range(len(mo.panels)) if q != p])))
             for s in group]
    after_same = [a[0] for a in generate_turns(model, processor, same, batch)]
    after_other = [a[0] for a in generate_turns(model, processor, other, batch)]
    n = len(group)
    return {"region_dependence": round(sum(a != b for a, b in zip(before, after_same)) / n, 4),
            "region_specificity": round(sum(a == b for a, b in zip(before, after_other)) / n, 4),
            "region_questions": n}


def _steps_ms(fns: list, reps: int, rounds: int = 5) -> list[float]:
    """Milliseconds per call of each function: rounds of `reps` calls, the functions interleaved
    round by round, the fastest round of each (a busy machine slows some rounds, not the cost)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / reps * 1e3)
    return best


@torch.no_grad()
def call_cost(model: LlavaForConditionalGeneration, prompt_len: int = 120, reps: int = 30) -> dict:
    """Per-call latency of a cached one-token target step vs a one-block drafter-like step
    (fc over [embedding; feature] + one decoder layer of the target's type + the LM head)."""
    text: LlamaConfig = model.config.text_config
    lm = model.model.language_model
    ids_BT = torch.randint(0, text.vocab_size, (1, prompt_len))
    past = lm(input_ids=ids_BT, use_cache=True).past_key_values
    nxt = torch.randint(0, text.vocab_size, (1, 1))

    def target_step():
        h = lm(input_ids=nxt, cache=past, use_cache=True)
        model.lm_head(h.last_hidden_state)
        past.crop(-1)  # drop the step just appended

    dcfg = LlamaConfig(**{**text.to_dict(), "num_hidden_layers": 1})
    drafter = LlamaForCausalLM(dcfg).eval()
    fc = torch.nn.Linear(2 * text.hidden_size, text.hidden_size)
    feats_BTD = torch.randn(1, prompt_len, text.hidden_size)
    emb = model.get_input_embeddings()
    dpast = drafter(inputs_embeds=fc(torch.cat([emb(ids_BT), feats_BTD], -1)), use_cache=True).past_key_values
    feat_B1D = torch.randn(1, 1, text.hidden_size)

    def drafter_step():
        x = fc(torch.cat([emb(nxt), feat_B1D], -1))  # (B,1,2D) -> (B,1,D)
        h = drafter.model(inputs_embeds=x, cache=dpast, use_cache=True).last_hidden_state
        model.lm_head(h)
        dpast.crop(-1)  # drop the step just appended

    t_ms, d_ms = _steps_ms([target_step, drafter_step], reps)
    return {"target_step_ms": round(t_ms, 3), "drafter_1block_step_ms": round(d_ms, 3),
            "target_over_drafter": round(t_ms / d_ms, 2)}
