"""How a feature drafter's own context holds the image (`FoveaConfig.visual_context`).

An "image slot" is a drafter position whose input token is an image placeholder (the drafter at
position t reads token x_{t+1}). The three interfaces of the FOVEA paper's Table 3 / MMSpec's
vision-aware methods differ only in what such a slot reads and whether later positions attend to it:

- fused: fc([v; f]) like any text slot (v the projected visual token, f the target feature);
- prefix (MSD-style): `visual_in(v)`, the raw visual token through its own linear map;
- compressed (ViSpec-style): slot r < Q reads summary r of `QueryCompressor` (Q learned queries
  attending over all the sample's visual tokens); slots r >= Q are masked out as keys.

Shapes: B batch, T positions, P visual tokens, Q queries, D hidden.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class QueryCompressor(nn.Module):
    """Q learned queries, one attention read each over a sample's visual tokens -> (B, Q, D)."""

    def __init__(self, hidden: int, num_queries: int):
        super().__init__()
        self.queries_QD = nn.Parameter(torch.randn(num_queries, hidden) / math.sqrt(hidden))
        self.norm = nn.LayerNorm(hidden)
        self.key = nn.Linear(hidden, hidden, bias=False)
        self.value = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, visual_BPD: torch.Tensor, valid_BP: torch.Tensor | None = None) -> torch.Tensor:
        v = self.norm(visual_BPD.to(self.key.weight.dtype))
        score_BQP = torch.einsum("qd,bpd->bqp", self.queries_QD, self.key(v)) / math.sqrt(v.shape[-1])
        if valid_BP is not None:
            score_BQP = score_BQP.masked_fill(~valid_BP[:, None, :], torch.finfo(score_BQP.dtype).min)
        return self.out(torch.softmax(score_BQP, dim=-1) @ self.value(v))


def image_slots(input_ids_BT: torch.Tensor, rank_BT: torch.Tensor | None, image_token_id: int | None
                ) -> torch.Tensor | None:
    """(B, T) bool: positions reading an image placeholder with a known rank (None: no image)."""
    if rank_BT is None or image_token_id is None:
        return None
    slots_BT = (input_ids_BT == image_token_id) & (rank_BT >= 0)
    return slots_BT if bool(slots_BT.any()) else None


def gather_ranks(x_BPD: torch.Tensor, rank_BT: torch.Tensor) -> torch.Tensor:
    """x[b, rank[b, t]] -> (B, T, D) (ranks clamped into range; callers mask the rest)."""
    idx = rank_BT.clamp(0, x_BPD.shape[1] - 1)[..., None].expand(-1, -1, x_BPD.shape[-1])
    return x_BPD.gather(1, idx)
