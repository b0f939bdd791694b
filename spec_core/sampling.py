"""The one sampling stack of spec_core: the target's next-token rule (`decoding/sampling.py`) and
the image generators' verified distribution (`scd/`, `reference/generator/`) both call it.

`warp_logits` is HF `generate`'s TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper,
op for op (tested against HF's own warpers on logits with ties), so sampled outputs follow the
distribution HF's sampling defines. `processed_probs` adds what image generation needs around
it: classifier-free guidance on raw logits and a structural mask before, and a one-hot on the
argmax when temperature <= 0 (SCD's exactness needs the draft and the verifier to share the final
distribution after every transform).

Shapes: `...` any leading dims, V vocabulary.
"""

from __future__ import annotations

import torch


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k (0: off), then top-p (1.0: off) on float logits (..., V); dropped
    entries are -inf."""
    z = logits.float() / temperature
    if top_k and top_k < z.shape[-1]:
        kth = z.topk(top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        # drop the lowest-probability tokens whose cumulative mass (ascending) <= 1 - top_p,
        # always keeping the most likely one
        sorted_z, idx = z.sort(dim=-1, descending=False)
        cum = sorted_z.softmax(-1).cumsum(-1)
        drop_sorted = cum <= 1.0 - top_p
        drop_sorted[..., -1] = False
        z = z.masked_fill(drop_sorted.scatter(-1, idx, drop_sorted), float("-inf"))
    return z


def processed_probs(logits_cond: torch.Tensor, logits_uncond: torch.Tensor | None,
                    cfg_scale: float, temperature: float, top_k: int, top_p: float,
                    allowed_mask: torch.Tensor | None) -> torch.Tensor:
    """Raw logits (..., V) -> final sampling distribution (..., V): CFG uncond + s (cond - uncond)
    on raw logits, structural mask, then `warp_logits` (temperature <= 0: greedy one-hot)."""
    logits = logits_cond.float()
    if logits_uncond is not None and cfg_scale != 1.0:
        u = logits_uncond.float()
        logits = u + cfg_scale * (logits - u)
    if allowed_mask is not None:
        logits = logits.masked_fill(~allowed_mask.to(logits.device), float("-inf"))
    if temperature <= 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return warp_logits(logits, temperature, top_k, top_p).softmax(-1)


def entropy_nats(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last axis, 0 log 0 = 0."""
    logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logp).sum(-1)
