"""FOVEA's visual memory and gated hidden-state correction (Eq. 2-4, 7-9; App. C).

The memory is built once per image from the target's projected visual tokens; a draft state at
depth l queries it, reads out a state-dependent subset, and corrects only the representation the
LM head scores - never the drafter's token context or its KV cache.

Shapes: B batch, S draft states (tree nodes or unrolled positions), P memory entries, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from spec_core.fovea.config import FoveaConfig
from spec_core.fovea.retrieval import retrieval_weights


@dataclass
class VisualMemory:
    keys_BPD: torch.Tensor     # k_i = W_K LN(v_i)
    values_BPD: torch.Tensor   # u_i = W_U LN(v_i)
    valid_BP: torch.Tensor     # bool: real visual tokens (P varies per image)

    def index(self, rows: torch.Tensor) -> VisualMemory:
        """The memories of samples `rows` (e.g. the active slots of a batch)."""
        return VisualMemory(self.keys_BPD[rows], self.values_BPD[rows], self.valid_BP[rows])


@dataclass
class Correction:
    hidden_BSD: torch.Tensor   # h_hat, what the LM head scores
    k_BS: torch.Tensor         # entries read per state (0 where not corrected)
    gate_BS: torch.Tensor      # g_n (1 where not corrected)


def _mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    """Two biased linear layers with SiLU, no dropout (App. C)."""
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.SiLU(), nn.Linear(d_hidden, d_out))


class VisualCorrection(nn.Module):
    """Memory projections, depth-aware query, retrieval and the gated RMS-normalised correction."""

    def __init__(self, hidden: int, cfg: FoveaConfig, eps: float = 1e-6):
        super().__init__()
        self.cfg = cfg
        self.visual_norm = nn.LayerNorm(hidden)
        self.w_k = nn.Linear(hidden, hidden, bias=False)   # d_k = d_u = d_h
        self.w_u = nn.Linear(hidden, hidden, bias=False)
        self.query_norm = nn.LayerNorm(hidden)
        self.w_q = nn.Linear(hidden, hidden, bias=False)
        self.depth = nn.Embedding(cfg.max_depth + 1, hidden) if cfg.depth_embedding else None
        self.f = _mlp(2 * hidden, cfg.correction_hidden, hidden)
        self.g = _mlp(2 * hidden, cfg.correction_hidden, 1) if cfg.gate else None
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def memory(self, visual_BPD: torch.Tensor, valid_BP: torch.Tensor) -> VisualMemory:
        """Eq. 2-3, once per image."""
        v = self.visual_norm(visual_BPD)
        return VisualMemory(self.w_k(v), self.w_u(v), valid_BP.bool())

    def readout(self, h_BSD: torch.Tensor, depth_BS: torch.Tensor, mem: VisualMemory):
        """Eq. 4-7 -> (r_BSD, k_BS)."""
        _, weights_BSP, k_BS = self.attend(h_BSD, depth_BS, mem)
        return torch.einsum("bsp,bpd->bsd", weights_BSP.to(mem.values_BPD.dtype), mem.values_BPD), k_BS

    def attend(self, h_BSD: torch.Tensor, depth_BS: torch.Tensor, mem: VisualMemory):
        """Eq. 4-7's scores and retrieval -> (scores_BSP, weights_BSP, k_BS): what each state reads."""
        q = self.query_norm(h_BSD)
        if self.depth is not None:
            q = q + self.depth(depth_BS.clamp(0, self.cfg.max_depth))
        q = self.w_q(q)
        scores_BSP = torch.einsum("bsd,bpd->bsp", q, mem.keys_BPD) / q.shape[-1] ** 0.5
        valid_BSP = mem.valid_BP[:, None, :].expand_as(scores_BSP)
        c = self.cfg
        weights_BSP, k_BS = retrieval_weights(scores_BSP, valid_BSP, c.retrieval, rho=c.rho,
                                              k_min=c.k_min, k_max=c.k_max, k_fixed=c.k_fixed)
        return scores_BSP, weights_BSP, k_BS

    def forward(self, h_BSD: torch.Tensor, depth_BS: torch.Tensor, mem: VisualMemory,
                correction_depth: int | None = None) -> Correction:
        """Eq. 8-9 at every state whose depth <= correction_depth (default: the config's); others
        pass through unchanged."""
        on_BS = depth_BS <= (self.cfg.correction_depth if correction_depth is None else correction_depth)
        if not torch.compiler.is_compiling() and not bool(on_BS.any()):  # (a shortcut; traced, the where below)
            return Correction(h_BSD, torch.zeros_like(depth_BS), torch.ones_like(h_BSD[..., 0]))
        r_BSD, k_BS = self.readout(h_BSD, depth_BS, mem)
        hr = torch.cat([h_BSD, r_BSD], dim=-1)  # (B, S, 2D)
        gate_BS1 = torch.sigmoid(self.g(hr)) if self.g is not None else torch.ones_like(hr[..., :1])
        corrected = self.norm(h_BSD + gate_BS1 * self.f(hr))
        hidden = torch.where(on_BS[..., None], corrected, h_BSD)
        return Correction(hidden, torch.where(on_BS, k_BS, 0),
                          torch.where(on_BS, gate_BS1[..., 0], torch.ones_like(gate_BS1[..., 0])))
