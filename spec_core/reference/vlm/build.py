"""Build the reference target VLM end to end: tokenizer, stage-1 perception, stage-2 tasks,
`save_pretrained` of model + processor; and its quality report, loaded back from disk."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from spec_core.reference.tasks import TASKS, all_words, corpus_texts, make_split
from spec_core.reference.vlm.data import TaskPool
from spec_core.reference.vlm.evaluate import call_cost, quality
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.perception import init_projector, train_perception
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vlm.train import TRAIN_PRESETS, train_vlm

TOKENIZER_VOCAB = 1024


def train_samples(preset: str, seed: int) -> list[dict]:
    n = TRAIN_PRESETS[preset].train_per_task
    return [s for task in TASKS for s in make_split(task, n, seed, "train")]


def build_target(preset: str, out_dir: str, seed: int = 0, samples: list[dict] | None = None,
                 log: Callable[[str], None] | None = None, progress: Callable | None = None) -> dict:
    """Train the reference VLM for a preset ('tiny' | 'small') and save it to out_dir."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}': choose one of {sorted(PRESETS)}")
    size, tcfg = PRESETS[preset], TRAIN_PRESETS[preset]
    t0 = time.perf_counter()
    samples = samples if samples is not None else train_samples(preset, seed)
    tok = train_tokenizer([*corpus_texts(samples), *sorted(all_words())], TOKENIZER_VOCAB)
    model = build_vlm(size, tok, seed)
    metrics: dict = {"target_params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                     "target_train_samples": len(samples)}
    acc, heads = train_perception(model.model.vision_tower, tcfg.vision_steps, tcfg.vision_batch,
                                  tcfg.vision_lr, seed, pool=tcfg.vision_pool, log=log, progress=progress)
    metrics.update(acc)
    init_projector(model.model.multi_modal_projector, heads)
    pool = TaskPool.build(samples, tok, size.n_patches)
    metrics.update(train_vlm(model, pool, tcfg, log=log, progress=progress))
    model.save_pretrained(out_dir)
    build_processor(size, tok).save_pretrained(out_dir)
    metrics["target_build_seconds"] = round(time.perf_counter() - t0, 1)
    return metrics


def load_target(path: str) -> tuple[LlavaForConditionalGeneration, AutoProcessor]:
    """The saved target and its processor, through `from_pretrained` of a local directory."""
    model = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(path)


def evaluate_target(path: str, samples: list[dict], batch: int = 16) -> dict:
    """Held-out quality and call cost of a saved target."""
    model, processor = load_target(path)
    m = quality(model, processor.tokenizer, samples, batch)
    m.update(call_cost(model))
    return m
