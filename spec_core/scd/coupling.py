"""Modified rejection sampling and the couplings of consecutive Jacobi iterations (SCD, Alg. 1/4/5).

Every function works row-wise on distributions (..., V) that sum to one and takes its randomness
as keyed uniforms / Gumbel noise (spec_core.decoding.noise), one value per row (or per row and id).

- `mrs(p, q, x, u_accept, u_residual)`: accept x ~ q with probability min(1, p(x)/q(x)), else draw
  from normalise(max(0, p - q)). Output ~ p. It is also the maximal coupling of (p, q): the pair
  (output, x) has marginals p and q and P[equal] = 1 - TV(p, q) (SCD Thm 4.4).
- `gumbel_argmax(p, g)`: argmax(log p + g). With g shared between two distributions it is the
  Gumbel coupling: each output has its own marginal, P[equal] >= (1 - TV) / (1 + TV) (Thm 4.5).
- alpha-coupling (Eq. 4 / Alg. 5) mixes a coupling with independence by a Bernoulli(alpha) coin.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def sample_inverse_cdf(probs_RV: torch.Tensor, u_R: torch.Tensor) -> torch.Tensor:
    """One categorical draw per row from one uniform per row (inverse CDF) -> ids (R,)."""
    cdf_RV = probs_RV.cumsum(-1)
    idx = torch.searchsorted(cdf_RV, (u_R * cdf_RV[..., -1]).unsqueeze(-1).contiguous()).squeeze(-1)
    idx = idx.clamp(max=probs_RV.shape[-1] - 1)
    # a zero-probability id can only be hit by float round-off at a flat CDF step: step back to
    # the last id with mass at or before it (never needed in exact arithmetic)
    bad = probs_RV.gather(-1, idx[..., None]).squeeze(-1) <= 0
    if bool(bad.any()):
        pos_V = torch.arange(probs_RV.shape[-1], device=probs_RV.device)
        has = (probs_RV > 0) & (pos_V <= idx[..., None])
        idx = torch.where(bad, (has * pos_V).amax(-1), idx)
    return idx


class MRSResult(NamedTuple):
    """Per row: the output id (~ p) and whether the draft was accepted."""

    ids_R: torch.Tensor
    accepted_R: torch.Tensor


def mrs(p_RV: torch.Tensor, q_RV: torch.Tensor, x_R: torch.Tensor, u_accept_R: torch.Tensor,
        u_residual_R: torch.Tensor) -> MRSResult:
    """Modified rejection sampling, vectorised over rows (SCD Alg. 1)."""
    px_R = p_RV.gather(-1, x_R[..., None]).squeeze(-1)
    qx_R = q_RV.gather(-1, x_R[..., None]).squeeze(-1)
    # accept iff u * q(x) <= p(x): min(1, p/q) without dividing (q(x) > 0 because x ~ q)
    accepted_R = u_accept_R * qx_R <= px_R
    residual_RV = (p_RV - q_RV).clamp_min(0)
    mass_R = residual_RV.sum(-1, keepdim=True)
    # where p <= q everywhere (p == q up to round-off) the residual is empty; then x is accepted
    # with probability 1 in exact arithmetic, so any fallback is unreachable; use p
    residual_RV = torch.where(mass_R > 0, residual_RV, p_RV)
    resampled_R = sample_inverse_cdf(residual_RV, u_residual_R)
    return MRSResult(torch.where(accepted_R, x_R, resampled_R), accepted_R)


def gumbel_argmax(p_RV: torch.Tensor, g_RV: torch.Tensor) -> torch.Tensor:
    """argmax(log p + g) per row (zero-probability ids never win) -> ids (R,)."""
    score_RV = torch.where(p_RV > 0, p_RV.log() + g_RV, torch.full_like(p_RV, float("-inf")))
    return score_RV.argmax(-1)


def total_variation(p_RV: torch.Tensor, q_RV: torch.Tensor) -> torch.Tensor:
    """TV distance per row: half the L1 distance."""
    return 0.5 * (p_RV - q_RV).abs().sum(-1)
