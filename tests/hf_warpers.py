"""An oracle for sampling tests that does not use the code under test: HF's own warpers in the
order `generate` applies them, and the image generators' CFG and mask written out."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def hf_warp(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Warped logits (..., V): HF's Temperature -> TopK -> TopP logits warpers."""
    z = logits.float().reshape(-1, logits.shape[-1])
    if temperature != 1.0:
        z = TemperatureLogitsWarper(temperature)(None, z)
    if top_k:
        z = TopKLogitsWarper(top_k)(None, z)
    if top_p < 1.0:
        z = TopPLogitsWarper(top_p)(None, z)
    return z.reshape(logits.shape)


def hf_probs(cond: torch.Tensor, uncond: torch.Tensor | None = None, cfg_scale: float = 1.0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The image generators' distribution: uncond + s (cond - uncond), masked, warped by HF (a
    one-hot on the argmax when temperature <= 0)."""
    x = cond.float()
    if uncond is not None and cfg_scale != 1.0:
        x = uncond.float() + cfg_scale * (x - uncond.float())
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    if temperature <= 0:
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).float()
    return hf_warp(x, temperature, top_k, top_p).softmax(-1)
