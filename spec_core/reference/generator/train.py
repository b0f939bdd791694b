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
from spec_core.reference.generator.data import SceneSpec, image_example_draws, video_example
from spec_core.reference.generator.layout import (GeneratorLayout, encode_prompt, image_sequence,
                                                  video_sequence)
from spec_core.reference.vocab import BACKGROUNDS, COLOURS

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
    rope_theta: float = 10000.0
    # CPU bf16 autocast (fp32 weights): ~1.5x faster where the CPU computes bf16 natively (AMX,
    # avx512_bf16), emulated and 4-5x slower elsewhere (measured on an AVX2 EPYC: 3.8 vs 0.8 s
    # per step of the small image LM); None: on exactly where it is native
    bf16_autocast: bool | None = None
    code_embedding_init: bool = True  # see init_code_embeddings
    noise_draws: int = 1  # images only; > 1: targets = code histogram over pixel-noise draws
    object_weight: float = 1.0  # images only: loss weight of object (non-background) codes ...
    object_weight_until: float = 0.0  # ... during this first fraction of the steps, then ...
    object_weight_final: float = 1.0  # ... this one (1: the plain maximum-likelihood loss; > 1
    # keeps the prompt binding but biases the model towards object codes: larger objects)


def make_llama_config(layout: GeneratorLayout, spec: LMSpec, max_positions: int) -> LlamaConfig:
    """A LlamaConfig over the shared vocabulary."""
    return LlamaConfig(
        vocab_size=layout.vocab_size, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads, max_position_embeddings=max_positions,
        bos_token_id=layout.bos, eos_token_id=layout.eos, pad_token_id=layout.pad,
        tie_word_embeddings=False, rope_theta=spec.rope_theta)


def new_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """A freshly initialised LM; init draws from a forked RNG seeded with `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def _patch_features(patches_KD: torch.Tensor, ref_KD: torch.Tensor) -> torch.Tensor:
    """[pixels, squared norm] of patches, standardised with the statistics of ref (codebook)."""
    def raw(x: torch.Tensor) -> torch.Tensor:
        """Pixels + squared norm."""
        return torch.cat([x, (x * x).sum(1, keepdim=True)], dim=1)
    ref = raw(ref_KD)
    return (raw(patches_KD) - ref.mean(0)) / ref.std(0).clamp(min=1e-6)


@torch.no_grad()
def init_code_embeddings(model: LlamaForCausalLM, codec: PatchCodec, layout: GeneratorLayout,
                         tokenizer: PreTrainedTokenizerFast, seed: int,
                         scale: float = 0.02, noise: float = 0.02) -> None:
    """Init only (the model stays a plain LlamaForCausalLM): image-code rows of the input
    embedding and lm_head = one shared random projection of codeword features, so similar
    patches start similar and "next code like this one" is the initial prior; colour and
    background words start at the projection of a flat patch of their colour."""
    c_KD = codec.codebook_KD.float()
    g = torch.Generator().manual_seed(seed)
    h = model.get_input_embeddings().weight.shape[1]
    f_KF = _patch_features(c_KD, c_KD)
    proj_FH = torch.randn(f_KF.shape[1], h, generator=g) / f_KF.shape[1] ** 0.5
    lo, hi = layout.image_token_range
    for weight_VH in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        noise_KH = torch.randn(hi - lo, h, generator=g) * noise
        weight_VH[lo:hi] = scale * (f_KF @ proj_FH + noise_KH)
    names = {**COLOURS, **BACKGROUNDS}
    pp = c_KD.shape[1] // 3  # channel-major patch: p*p reds, p*p greens, p*p blues
    flat_WD = torch.tensor(list(names.values()), dtype=torch.float32).repeat_interleave(pp, 1)
    ids = tokenizer.convert_tokens_to_ids(list(names))
    model.get_input_embeddings().weight[ids] = scale * (_patch_features(flat_WD / 255.0, c_KD)
                                                        @ proj_FH)


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
    """Prompt ids, or [] (the unconditional prompt) with probability `dropout`."""
    return [] if rng.random() < dropout else encode_prompt(tokenizer, prompt)


def object_codes(codec: PatchCodec, codes_BT: torch.Tensor, backgrounds: list[str],
                 threshold: float = 40.0) -> torch.Tensor:
    """Bool object_BT: codes whose mean colour is farther than `threshold` (0..255 RGB units)
    from the scene's background colour (object, edge and text patches)."""
    mean_KC = codec.codebook_KD.view(codec.codebook_size, 3, -1).mean(-1) * 255.0
    bg_BC = torch.tensor([BACKGROUNDS[b] for b in backgrounds], dtype=torch.float32)
    return (mean_KC[codes_BT] - bg_BC[:, None]).norm(dim=-1) > threshold  # (B, T, C) -> (B, T)


def image_batch(rng: np.random.Generator, spec: SceneSpec, codec: PatchCodec,
                tokenizer: PreTrainedTokenizerFast, layout: GeneratorLayout, batch_size: int,
                prompt_dropout: float, noise_draws: int = 1) -> Batch:
    """A batch of image sequences (prompt dropped to empty with prob prompt_dropout) with
    "object_BL" (labels that are object codes, see object_codes); with noise_draws > 1 also
    "draw_codes_BTR": the codes of R renders differing only in pixel noise."""
    examples = [image_example_draws(rng, spec, noise_draws) for _ in range(batch_size)]
    r = len(examples[0][1])
    codes_BRT = codec.encode(pil_to_tensor([im for e in examples for im in e[1]]))
    codes_BRT = codes_BRT.view(batch_size, r, -1)
    seqs = [image_sequence(layout, _prompt(tokenizer, e[0], rng, prompt_dropout),
                           c[0].tolist()) for e, c in zip(examples, codes_BRT)]
    batch = collate(seqs, layout)
    obj_BT = object_codes(codec, codes_BRT[:, 0], [e[2].background for e in examples])
    batch["object_BL"] = torch.zeros_like(batch["labels"], dtype=torch.bool)
    batch["object_BL"][batch["labels"] != -100] = obj_BT.flatten()  # row-major, in order
    if r > 1:
        batch["draw_codes_BTR"] = codes_BRT.transpose(1, 2).contiguous()
    return batch


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


def lm_loss(model: LlamaForCausalLM, batch: Batch, layout: GeneratorLayout,
            object_weight: float = 1.0) -> torch.Tensor:
    """Mean next-token cross-entropy over image-code targets. With "draw_codes_BTR" the target
    is the code histogram over noise draws of the same scene (Rao-Blackwellised: the same
    expected gradient as the one-hot code of draw 0, less variance). object_weight != 1: a
    weighted mean, object codes ("object_BL") weighing object_weight."""
    draws = batch.get("draw_codes_BTR")
    if object_weight != 1.0:
        assert draws is None, "object_weight and noise draws do not combine"
        logits_BLV = model(input_ids=batch["input_ids"],
                           attention_mask=batch["attention_mask"]).logits
        labels_BL = batch["labels"][:, 1:]
        ce_BL = torch.nn.functional.cross_entropy(logits_BLV[:, :-1].float().transpose(1, 2),
                                                  labels_BL, reduction="none")  # -100 -> 0
        w_BL = (labels_BL != -100) * (1.0 + (object_weight - 1.0) * batch["object_BL"][:, 1:])
        return (w_BL * ce_BL).sum() / w_BL.sum()
    if draws is None:
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     labels=batch["labels"]).loss
    logits_BLV = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    valid_BL = batch["labels"][:, 1:] != -100  # row-major: exactly the image tokens, in order
    logp_NV = torch.log_softmax(logits_BLV[:, :-1][valid_BL].float(), dim=-1)
    lo, hi = layout.image_token_range
    codes_NR = draws.reshape(-1, draws.shape[-1])
    q_NK = torch.zeros(codes_NR.shape[0], hi - lo).scatter_add_(
        1, codes_NR, torch.full(codes_NR.shape, 1.0 / codes_NR.shape[1]))
    return -(q_NK * logp_NV[:, lo:hi]).sum(1).mean()


def native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AMX tiles or avx512_bf16)."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def train_lm(model: LlamaForCausalLM, batch_fn: Callable[[int], Batch], spec: LMSpec,
             layout: GeneratorLayout, progress: bool = True,
             desc: str = "train") -> dict[str, float]:
    """AdamW + warmup/cosine for spec.steps on batches batch_fn(step); returns train stats."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=spec.lr, betas=(0.9, 0.95))
    sched = get_cosine_schedule_with_warmup(opt, min(spec.warmup, spec.steps), spec.steps)
    model.train()
    autocast = native_bf16() if spec.bf16_autocast is None else spec.bf16_autocast
    start, ema, data_s = time.perf_counter(), math.nan, 0.0
    bar = tqdm(range(spec.steps), desc=desc, disable=not progress, mininterval=2.0)
    for step in bar:
        t0 = time.perf_counter()
        batch = batch_fn(step)
        data_s += time.perf_counter() - t0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            early = step < spec.object_weight_until * spec.steps
            weight = spec.object_weight if early else spec.object_weight_final
            loss = lm_loss(model, batch, layout, weight)
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
