"""Drive an adapter the way the Jacobi decoder does (right-padded rows in a RaggedCache, explicit
positions and bool masks), one token at a time: the prefill, single steps and a greedy image loop.

Shapes: G rows, T prompt tokens, K keys, V sampled vocabulary, N new tokens.
"""

from __future__ import annotations

import torch

from spec_core.decoding.cache import RaggedCache
from spec_core.scd.adapters.base import ImageLayout, VisualLM


def prefill(lm: VisualLM, rows: list[list[int]], capacity: int) -> tuple[RaggedCache, torch.Tensor, torch.Tensor]:
    """All rows in one forward, row g at slots [0, T_g) -> (cache, logits (G, T, V), lengths (G,))."""
    T_G = torch.tensor([len(r) for r in rows])
    G, T = len(rows), int(T_G.max())
    ids_GT = torch.zeros(G, T, dtype=torch.long)
    for g, r in enumerate(rows):
        ids_GT[g, :len(r)] = torch.tensor(r)
    pos_GT = torch.arange(T).expand(G, T)
    attend_GTT = torch.ones(T, T, dtype=torch.bool).tril()[None] & (pos_GT < T_G[:, None])[:, None, :]
    cache = RaggedCache(G, capacity, lm.num_layers)
    cache.plan(pos_GT, T)
    return cache, lm.logits(lm.embed_prompt(ids_GT), pos_GT, attend_GTT, cache), T_G


def step(lm: VisualLM, cache: RaggedCache, len_G: torch.Tensor, ids_G: torch.Tensor) -> torch.Tensor:
    """One sampled id per row at slot len_G[g] (which is also its position) -> logits (G, V)."""
    kv = int(len_G.max()) + 1
    attend_G1K = (torch.arange(kv)[None, None, :] <= len_G[:, None, None])  # prefix and itself
    cache.plan(len_G[:, None], kv)
    return lm.logits(lm.embed_sampled(ids_G[:, None]), len_G[:, None], attend_G1K, cache)[:, 0]


def pick(logits_V: torch.Tensor, layout: ImageLayout, i: int) -> int:
    """Greedy choice at new position i: the forced id, else the best allowed id."""
    forced = int(layout.forced_N[i])
    if forced >= 0:
        return forced
    if layout.allowed_V is not None:
        logits_V = logits_V.masked_fill(~layout.allowed_V[:logits_V.shape[-1]], float("-inf"))
    return int(logits_V.argmax())


@torch.no_grad()
def greedy_image(lm: VisualLM, layout: ImageLayout, cond: list[int], uncond: list[int] | None = None,
                 scale: float = 1.0) -> list[int]:
    """Plain AR greedy decoding of one image body with the adapter; with `uncond`, CFG on raw
    logits (uncond + scale (cond - uncond)), both rows fed the chosen token."""
    rows = [cond] if uncond is None else [cond, uncond]
    cache, logits_GTV, len_G = prefill(lm, rows, max(map(len, rows)) + layout.length + 1)
    logits_GV = logits_GTV[torch.arange(len(rows)), len_G - 1]
    out = []
    for i in range(layout.length):
        guided_V = logits_GV[0] if uncond is None else logits_GV[1] + scale * (logits_GV[0] - logits_GV[1])
        out.append(pick(guided_V, layout, i))
        logits_GV = step(lm, cache, len_G, torch.full((len(rows),), out[-1]))
        len_G = len_G + 1
    return out
