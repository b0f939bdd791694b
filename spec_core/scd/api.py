"""`generate`: SJD / SCD on any HF causal LM that emits discrete tokens (the public entry point)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from spec_core.scd.adapters.base import CausalLMAdapter, ImageLayout, VisualLM
from spec_core.scd.config import ScdConfig
from spec_core.scd.jacobi import JacobiDecoder, ScdResult


@dataclass
class GenerateOutput:
    """sequences (B, max_new_tokens): new tokens only; nfe: forward calls of the batch (prefill
    included, a CFG pair counted once); nfe_per_sample (B,); result: the full ScdResult."""

    sequences: torch.Tensor
    nfe: int
    nfe_per_sample: torch.Tensor
    result: ScdResult


def _rows(ids: torch.Tensor | list, mask: torch.Tensor | None) -> list[list[int]]:
    """(B, T) ids (left padding removed by the attention mask, if given) -> id lists."""
    ids_BT = torch.as_tensor(ids)
    if ids_BT.dim() == 1:
        ids_BT = ids_BT[None]
    if mask is None:
        return [r.tolist() for r in ids_BT]
    return [r[m.bool()].tolist() for r, m in zip(ids_BT, torch.as_tensor(mask))]


def generate(model: nn.Module | VisualLM, input_ids, max_new_tokens: int, *, window: int | str,
             coupling: str, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, seed: int = 0, **options) -> GenerateOutput:
    """Sample max_new_tokens after each prompt row with Speculative Jacobi Decoding (coupling
    "none") or Speculative Coupled Decoding ("mc" maximal, "gs" Gumbel); window=1 is plain AR,
    window="auto" picks L per iteration up to max_window for committed tokens per second.
    Lossless: the output is distributed as the model's own sampling with the same processing.

    options: alpha (coupling strength, default 1), cfg_scale with uncond_input_ids (and
    uncond_attention_mask), attention_mask (left padding), allowed_mask (V,) bool or allowed_ids,
    forced (length max_new_tokens, -1 = free, else the id forced there), sample_keys (per row noise
    stream names; default 0..B-1); with window "auto": max_window (default 32) and window_chooser
    (a scd.window.WindowChooser to reuse across calls, so its cost fit and acceptance counts carry
    over; else each call explores afresh); compile (True: the window forward as a compiled step,
    decoding.compiled; the output is the same)."""
    known = {"alpha", "cfg_scale", "uncond_input_ids", "uncond_attention_mask", "attention_mask",
             "allowed_mask", "allowed_ids", "forced", "sample_keys", "max_window", "window_chooser", "compile"}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"unknown options {sorted(unknown)}; expected some of {sorted(known)}")
    cfg = ScdConfig(window=window, coupling=coupling, alpha=float(options.get("alpha", 1.0)),
                    max_window=options.get("max_window", 32),
                    temperature=temperature, top_k=int(top_k or 0),
                    top_p=1.0 if top_p is None else float(top_p),
                    cfg_scale=float(options.get("cfg_scale", 1.0)))
    lm = model if isinstance(model, VisualLM) else CausalLMAdapter(model)
    allowed = options.get("allowed_mask")
    if allowed is None and options.get("allowed_ids") is not None:
        vocab = lm.model.get_output_embeddings().weight.shape[0] if isinstance(lm, CausalLMAdapter) \
            else int(max(options["allowed_ids"])) + 1
        allowed = torch.zeros(vocab, dtype=torch.bool)
        allowed[torch.as_tensor(options["allowed_ids"])] = True
    forced = options.get("forced")
    forced_N = torch.full((max_new_tokens,), -1, dtype=torch.long) if forced is None \
        else torch.as_tensor(forced, dtype=torch.long)
    if forced_N.shape != (max_new_tokens,):
        raise ValueError(f"forced must have max_new_tokens = {max_new_tokens} entries")
    layout = ImageLayout(forced_N, allowed)
    prompts = _rows(input_ids, options.get("attention_mask"))
    uncond = None
    if cfg.cfg:
        if options.get("uncond_input_ids") is None:
            raise ValueError("cfg_scale != 1 needs uncond_input_ids")
        uncond = _rows(options["uncond_input_ids"], options.get("uncond_attention_mask"))
    decoder = JacobiDecoder(lm, layout, cfg, options.get("window_chooser"), compile=bool(options.get("compile", False)))
    res = decoder.run(prompts, uncond, seed, options.get("sample_keys"))
    return GenerateOutput(res.tokens_BN, int(res.nfe_B.max()), res.nfe_B, res)
