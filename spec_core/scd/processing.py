"""The verified distribution: the same processing for drafts and verification (SCD's exactness
needs p to be the final distribution after every logit transform).

Shapes: (..., V) logits or probabilities over the sampled vocabulary.
"""

from __future__ import annotations

import torch


def processed_probs(logits_cond: torch.Tensor, logits_uncond: torch.Tensor | None,
                    cfg_scale: float, temperature: float, top_k: int, top_p: float,
                    allowed_mask: torch.Tensor | None) -> torch.Tensor:
    """Raw logits (..., V) -> final sampling distribution (..., V): CFG uncond + s (cond - uncond)
    on raw logits, structural mask, temperature (<= 0: greedy one-hot), top-k, top-p."""
    logits = logits_cond.float()
    if logits_uncond is not None and cfg_scale != 1.0:
        u = logits_uncond.float()
        logits = u + cfg_scale * (logits - u)
    if allowed_mask is not None:
        logits = logits.masked_fill(~allowed_mask.to(logits.device), float("-inf"))
    if temperature <= 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False  # always keep the most likely token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def entropy_nats(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last axis, 0 log 0 = 0."""
    logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logp).sum(-1)
