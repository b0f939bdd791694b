"""How much the target's current decoding state looks at the image: the last layer's attention,
averaged over heads, summed over image-token keys (MMSpec's visual-attention ratio; ViSkip skips
drafting when it is >= tau, default 0.35; `reduce="max"` gives the paper's Eq. 2 instead, the
largest head-mean weight on one image token).

The model keeps its own attention kernel (sdpa, flash, ...). A forward hook on the last decoder
layer's `self_attn` runs that module once more with the eager kernel on the same inputs, which
returns the attention probabilities: in a cached decode step with a `RaggedCache` the re-run
writes the same keys to the same slots (idempotent) and reads the whole prefix; any other cache is
left alone (the re-run then sees only this forward's keys, which is all of them for a prefill
from an empty cache, as `DecodeEngine` runs it).

Shapes: B rows, N heads, S queries, K keys.
"""

from __future__ import annotations

import torch
from torch import nn

from spec_core.decoding.cache import RaggedCache


class VisualShareProbe:
    """Armed with `arm()`, records the head-mean last-layer attention (B, S, K) of each forward."""

    def __init__(self, attn: nn.Module):
        self.attn = attn
        self.armed = False
        self.attn_BSK: torch.Tensor | None = None
        self._handle = attn.register_forward_hook(self._hook, with_kwargs=True)

    def close(self) -> None:
        self._handle.remove()

    def _hook(self, module: nn.Module, args, kwargs, output) -> None:
        if not self.armed:
            return
        kw = dict(kwargs)
        for name in ("cache", "past_key_values", "past_key_value"):
            if name in kw and not isinstance(kw[name], RaggedCache):
                kw[name] = None
        cfg = module.config
        old = cfg._attn_implementation
        cfg._attn_implementation = "eager"
        try:
            _, weights_BNSK = module.forward(*args, **kw)
        finally:
            cfg._attn_implementation = old
        self.attn_BSK = weights_BNSK.float().mean(1)  # (B, N, S, K) -> (B, S, K)


def visual_share(attn_BSK: torch.Tensor, image_BK: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    """(B, S) share of each query's attention on image keys (image_BK: bool over keys; padded or
    truncated to K). `reduce`: "sum" (the ratio) or "max" (the largest single image token)."""
    K = attn_BSK.shape[-1]
    img = torch.zeros(attn_BSK.shape[0], K, dtype=torch.bool, device=attn_BSK.device)
    n = min(K, image_BK.shape[-1])
    img[:, :n] = image_BK[:, :n].to(attn_BSK.device)
    masked = attn_BSK * img[:, None, :]
    return masked.sum(-1) if reduce == "sum" else masked.amax(-1)
