"""Training the image / video LMs (LlamaForCausalLM from scratch) on on-the-fly seeded data."""

# Shape legend: B batch, L sequence length (right-padded), V vocab.

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,
                          get_cosine_schedule_with_warmup)
from transformers.utils.logging import tqdm

from spec_core.reference.generator.codec import PatchCodec, pil_to_tensor
from spec_core.reference.generator.data import SceneSpec, image_example, video_example
from spec_core.reference.generator.layout import (GeneratorLayout, encode_prompt, image_sequence,
                                                  video_sequence)

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LMSpec:
    """Model size and training schedule of one LM."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    intermediate: int = 704
    steps: int = 300
    batch_size: int = 16
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.05
    prompt_dropout: float = 0.12
    bf16_autocast: bool = True  # CPU autocast: ~1.5x faster with AMX/avx512_bf16, fp32 weights


def make_llama_config(layout: GeneratorLayout, spec: LMSpec, max_positions: int) -> LlamaConfig:
    """A LlamaConfig over the shared vocabulary."""
    return LlamaConfig(
        vocab_size=layout.vocab_size, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads, max_position_embeddings=max_positions,
        bos_token_id=layout.bos, eos_token_id=layout.eos, pad_token_id=layout.pad,
        tie_word_embeddings=False, rope_theta=10000.0)


def new_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """A freshly initialised LM; init draws from a forked RNG seeded with `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def collate(seqs: list[list[int]], layout: GeneratorLayout) -> Batch:
    """Right-pad sequences; labels are the image-code tokens only (-100 elsewhere)."""
    width = max(len(s) for s in seqs)
    ids_BL = torch.full((len(seqs), width), layout.pad, dtype=torch.long)
    mask_BL = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids_BL[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask_BL[i, :len(s)] = 1
    lo, hi = layout.image_token_range
    labels_BL = torch.where((ids_BL >= lo) & (ids_BL < hi), ids_BL, torch.full_like(ids_BL, -100))
    return {"input_ids": ids_BL, "attention_mask": mask_BL, "labels": labels_BL}


def _prompt(tokenizer: PreTrainedTokenizerFast, prompt: str, rng: np.random.Generator,
            dropout: float) -> list[int]:
    return [] if rng.random() < dropout else encode_prompt(tokenizer, prompt)


def image_batch(rng: np.random.Generator, spec: SceneSpec, codec: PatchCodec,
                tokenizer: PreTrainedTokenizerFast, layout: GeneratorLayout, batch_size: int,
                prompt_dropout: float) -> Batch:
    """A batch of image sequences (prompt dropped to empty with prob prompt_dropout)."""
    examples = [image_example(rng, spec) for _ in range(batch_size)]
    codes_BT = codec.encode(pil_to_tensor([e[1] for e in examples]))
    seqs = [image_sequence(layout, _prompt(tokenizer, e[0], rng, prompt_dropout), c.tolist())
            for e, c in zip(examples, codes_BT)]
    return collate(seqs, layout)


def video_batch(rng: np.random.Generator, spec: SceneSpec, codec: PatchCodec,
                tokenizer: PreTrainedTokenizerFast, layout: GeneratorLayout, batch_size: int,
                prompt_dropout: float) -> Batch:
    """A batch of video sequences (frames encoded separately, <eof> after each frame)."""
    examples = [video_example(rng, spec) for _ in range(batch_size)]
    frames = [f for e in examples for f in e[1]]
    codes_FT = codec.encode(pil_to_tensor(frames)).view(batch_size, spec.n_frames, -1)
    seqs = [video_sequence(layout, _prompt(tokenizer, e[0], rng, prompt_dropout), c.tolist())
            for e, c in zip(examples, codes_FT)]
    return collate(seqs, layout)


def lm_loss(model: LlamaForCausalLM, batch: Batch) -> torch.Tensor:
    """Mean next-token cross-entropy over image-code targets."""
    return model(**batch).loss


def train_lm(model: LlamaForCausalLM, batch_fn: Callable[[], Batch], spec: LMSpec,
             progress: bool = True, desc: str = "train") -> dict[str, float]:
    """AdamW + warmup/cosine for spec.steps on batches from batch_fn; returns train stats."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec.lr, betas=(0.9, 0.95))
    sched = get_cosine_schedule_with_warmup(opt, min(spec.warmup, spec.steps), spec.steps)
    model.train()
    start, ema, data_s = time.perf_counter(), math.nan, 0.0
    bar = tqdm(range(spec.steps), desc=desc, disable=not progress, mininterval=2.0)
    for _ in bar:
        t0 = time.perf_counter()
        batch = batch_fn()
        data_s += time.perf_counter() - t0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.bf16_autocast):
            loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        val = float(loss.detach())
        ema = val if math.isnan(ema) else 0.95 * ema + 0.05 * val
        bar.set_postfix(loss=f"{ema:.3f}", refresh=False)
    model.eval()
    return {"train_seconds": time.perf_counter() - start, "data_seconds": data_s,
            "final_loss_ema": ema, "steps": float(spec.steps),
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


@torch.no_grad()
def heldout_nll(model: LlamaForCausalLM, batches: list[Batch], layout: GeneratorLayout) -> float:
    """Mean NLL (nats) per image-code token under the structurally masked distribution."""
    lo, hi = layout.image_token_range
    total, count = 0.0, 0
    model.eval()
    for b in batches:
        logits_BLV = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        logp_BLK = torch.log_softmax(logits_BLV[:, :-1, lo:hi].float(), dim=-1)
        tgt_BL = b["labels"][:, 1:]
        valid = tgt_BL != -100
        picked = logp_BLK.gather(-1, (tgt_BL.clamp(min=lo) - lo)[..., None]).squeeze(-1)
        total += float(-(picked[valid]).sum())
        count += int(valid.sum())
    return total / max(count, 1)
