"""Which visual-memory entries a draft state reads, and with what weights (FOVEA Eq. 5-7).

Every valid key is scored; the modes differ only in how many of the best entries are aggregated:
- cumulative: the global softmax over valid keys (Eq. 5), the smallest k whose top-k mass reaches
  rho (Eq. 6), clamped to [k_min, k_max] and to |V|, then renormalised over the chosen set (Eq. 7);
- fixed: the top min(K, |V|) entries (the appendix's K_r = 16);
- dense: every valid entry (the "Dense Retrieval" control).
Ties in score are broken towards the lower index (a stable descending sort).

Shapes: `...` any leading dims, N memory entries.
"""

from __future__ import annotations

import torch


def _sorted(scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The valid scores in descending order (invalid: -inf, last) and where each entry came from."""
    return torch.sort(scores.masked_fill(~valid, float("-inf")), dim=-1, descending=True, stable=True)


def _first_k(order: torch.Tensor, valid: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Bool mask of the entries at the first k places of `order` per row (k broadcast over `...`)."""
    place = torch.arange(order.shape[-1], device=order.device)
    return torch.zeros_like(valid).scatter_(-1, order, place < k.unsqueeze(-1)) & valid


def _renormalised(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """softmax over the chosen entries, zero elsewhere and on rows with nothing chosen."""
    logits = scores.masked_fill(~chosen, float("-inf"))
    any_ = chosen.any(-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(~any_, 0.0), dim=-1)
    return weights * chosen


def cumulative_mass_weights(scores: torch.Tensor, valid: torch.Tensor, rho: float, k_min: int,
                            k_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5-7. scores, valid: (..., N) -> (weights (..., N), k (...) long). Weights sum to 1 over
    the selected set and are zero outside it and at invalid entries; an all-invalid row gives zero
    weights and k = 0. Gradients flow to the scores of the selected entries."""
    valid = valid.bool()
    n_valid = valid.sum(-1)
    with torch.no_grad():
        # one sort serves both: the softmax of the sorted scores is the sorted softmax. In float64
        # with a 1e-9 slack, so that a mass of exactly rho (e.g. a flat row) counts as reached, as
        # in exact arithmetic
        sorted_s, order = _sorted(scores, valid)
        mass = torch.softmax(sorted_s.double(), dim=-1).nan_to_num(0.0).cumsum(-1)
        # smallest k with mass_k >= rho is 1 + #{k : mass_k < rho}; never past |V|
        k_raw = (mass < rho - 1e-9).sum(-1) + 1
        k = torch.minimum(k_raw.clamp(k_min, k_max), n_valid)
    return _renormalised(scores, _first_k(order, valid, k)), k


def fixed_k_weights(scores: torch.Tensor, valid: torch.Tensor, k_fixed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top min(k_fixed, |V|) valid entries, renormalised."""
    valid = valid.bool()
    k = valid.sum(-1).clamp_max(k_fixed)
    with torch.no_grad():
        order = _sorted(scores, valid).indices
    return _renormalised(scores, _first_k(order, valid, k)), k


def dense_weights(scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over every valid entry."""
    valid = valid.bool()
    return _renormalised(scores, valid), valid.sum(-1)


def retrieval_weights(scores: torch.Tensor, valid: torch.Tensor, mode: str, *, rho: float = 0.8,
                      k_min: int = 32, k_max: int = 256, k_fixed: int = 16):
    """Dispatch on a FoveaConfig.retrieval mode."""
    if mode == "cumulative":
        return cumulative_mass_weights(scores, valid, rho, k_min, k_max)
    if mode == "fixed":
        return fixed_k_weights(scores, valid, k_fixed)
    if mode == "dense":
        return dense_weights(scores, valid)
    raise ValueError(f"unknown retrieval mode {mode!r}")
