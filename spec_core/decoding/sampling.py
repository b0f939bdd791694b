"""The target's next-token rule, identical for AR and speculative decoding.

Logits are processed by HF `generate`'s warpers - temperature, then top-k, then top-p, the
one implementation in `spec_core.sampling` - so that sampled outputs follow the distribution HF's
sampling defines; greedy (do_sample False) is the argmax of the raw logits.
Shapes: `...` any leading dims, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spec_core.decoding import noise
from spec_core.sampling import warp_logits


@dataclass(frozen=True)
class SamplingConfig:
    """The target's next-token rule; also the rule's fields of the generate job's `generation`
    section (pydantic, at the jobs' boundary, rejects unknown keys; this module never imports it)."""

    __pydantic_config__ = {"extra": "forbid"}

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0          # 0: off
    top_p: float = 1.0      # 1.0: off

    def __post_init__(self):
        if self.do_sample and self.temperature <= 0:
            raise ValueError("temperature must be > 0 when sampling")
        if not 0.0 < self.top_p <= 1.0 or self.top_k < 0:
            raise ValueError("need 0 < top_p <= 1 and top_k >= 0")


def processed_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, top-k, top-p (HF's warpers, `spec_core.sampling`); masked entries are -inf."""
    return warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)


def choose_tokens(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
                  keys: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One target token per row of `logits` (..., V) -> (...): argmax, or a draw. With `keys`
    ((seed, sequence position), broadcastable to the rows) the draw is the inverse CDF at a
    uniform hashed from the key (`noise`): a sample's token at a position is then the same
    whichever step, tree or batch resolves it, so speculative output equals AR's draw for draw."""
    if not cfg.do_sample:
        return logits.argmax(-1)
    probs = processed_logits(logits, cfg).softmax(-1)
    if keys is not None:
        seed, pos = keys
        u = noise.uniform(seed, pos, noise.TOKEN).to(probs.device, torch.float64)
        cdf = probs.double().cumsum(-1)
        return torch.searchsorted(cdf, (u * cdf[..., -1])[..., None].contiguous()).squeeze(-1).clamp_max(probs.shape[-1] - 1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
