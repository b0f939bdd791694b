"""Build the reference target VLM end to end: tokenizer, stage-1 perception, stage-2 tasks,
`save_pretrained` of model + processor; and its quality report, loaded back from disk.

Presets: 'tiny' / 'small' (LLaVA on the small world's 64 px scenes), 'tiny-hires' / 'hires'
(LLaVA-NeXT AnyRes on the hires world's 192 px mosaics, `spec_core.reference.hires`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch
from transformers import AutoConfig, AutoProcessor, LlavaForConditionalGeneration, LlavaNextForConditionalGeneration

from spec_core.reference import hires
from spec_core.reference import tasks as small
from spec_core.reference.hires.layout import sample_region_tokens
from spec_core.reference.hires.reads import sample_read_tokens
from spec_core.reference.tasks import TASKS, corpus_texts
from spec_core.reference.vocab import CONTENT_WORDS
from spec_core.reference.vlm.data import TaskPool
from spec_core.reference.vlm.evaluate import call_cost, quality
from spec_core.reference.vlm.model import PRESETS, VLMSize, build_processor, build_vlm
from spec_core.reference.vlm.perception import init_projector, train_perception
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vlm.train import READ_WORDS, TRAIN_PRESETS, VLMTrainConfig, train_vlm

TOKENIZER_VOCAB = 1024


def world_of(preset: str):
    """The task module of a preset's world (make_split, all_words): hires or small."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}': choose one of {sorted(PRESETS)}")
    return hires if PRESETS[preset].anyres else small


def train_samples(preset: str, seed: int) -> list[dict]:
    n = TRAIN_PRESETS[preset].train_per_task
    return [s for task in TASKS for s in world_of(preset).make_split(task, n, seed, "train")]


def task_pool(size: VLMSize, tcfg: VLMTrainConfig, samples: list[dict], processor) -> TaskPool:
    """Stage 2's encoded samples, with what the hires losses teach where the config asks."""
    focus = reads = None
    if size.anyres and tcfg.focus_weight > 0:  # hires: each answer's panels, for `focus_loss`
        focus = partial(sample_region_tokens, side=size.image_size // size.patch)
        if tcfg.read_focus:  # ... narrowed to what shows each word the answer reads
            reads = partial(sample_read_tokens, side=size.image_size // size.patch)
    copy_words = CONTENT_WORDS if tcfg.copy_weight > 0 else None  # hires: for the copy loss
    return TaskPool.build(samples, processor, size.n_image_tokens, focus=focus, copy_words=copy_words, reads=reads,
                          read_words=READ_WORDS)


def build_target(preset: str, out_dir: str, seed: int = 0, samples: list[dict] | None = None,
                 log: Callable[[str], None] | None = None, progress: Callable | None = None) -> dict:
    """Train the reference VLM for a preset (see the module doc) and save it to out_dir."""
    world = world_of(preset)
    size, tcfg = PRESETS[preset], TRAIN_PRESETS[preset]
    t0 = time.perf_counter()
    samples = samples if samples is not None else train_samples(preset, seed)
    tok = train_tokenizer([*corpus_texts(samples), *sorted(world.all_words())], TOKENIZER_VOCAB)
    model = build_vlm(size, tok, seed)
    metrics: dict = {"target_params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                     "target_train_samples": len(samples)}
    acc, heads = train_perception(model.model.vision_tower, tcfg.vision_steps, tcfg.vision_batch,
                                  tcfg.vision_lr, seed, pool=tcfg.vision_pool, log=log, progress=progress,
                                  panels=bool(size.anyres))
    metrics.update(acc)
    init_projector(model.model.multi_modal_projector, heads)
    processor = build_processor(size, tok)
    pool = task_pool(size, tcfg, samples, processor)
    metrics.update(train_vlm(model, pool, tcfg, log=log, progress=progress))
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    metrics["target_build_seconds"] = round(time.perf_counter() - t0, 1)
    return metrics


def load_target(path: str) -> tuple[LlavaForConditionalGeneration | LlavaNextForConditionalGeneration, AutoProcessor]:
    """The saved target and its processor, through `from_pretrained` of a local directory."""
    anyres = AutoConfig.from_pretrained(path).model_type == "llava_next"
    cls = LlavaNextForConditionalGeneration if anyres else LlavaForConditionalGeneration
    model = cls.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(path)


def evaluate_target(path: str, samples: list[dict], batch: int = 16) -> dict:
    """Held-out quality and call cost of a saved target."""
    model, processor = load_target(path)
    m = quality(model, processor, samples, batch)
    m.update(call_cost(model))
    return m
