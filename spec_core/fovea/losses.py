"""FOVEA's training objective, Eq. 10-19 (paper Table 5 defaults in `LossConfig`).

    L = lambda_hid L_hid + lambda_KL L_KL + lambda_tok L_tok, each (1/Z) sum_n w_n (...)
    L_hid : beta_h ||h_hat - h^T||^2 / d_h + beta_mid ||h_mid - h_mid^T||^2 / d_h
            (`hidden_state`: the uncorrected h as Table 8 says - the default -, h_hat as Eq. 13
            writes, or the mean of both)
    L_KL  : KL(p^T || p^D), p^T = softmax(W_LM h^T) with the same frozen head
    L_tok : beta_CE CE(y, p^D) + beta_cmp softplus(m - (z_y - zbar_(K_c))), y = argmax z^T,
            zbar_(K_c) the K_c-th largest competing draft logit (the candidate-set boundary)

Reading of Eq. 10 (w_n = exp(-(n-1)/gamma_w)): taken as an absolute sequence position, n makes
the weights underflow (exp(-2000)) and Z vanish, so n must index something short. We read it as
the draft step: the drafter is unrolled for `train_depth` steps on its own fed-back states
(`unroll.py`, like EAGLE-3's training-time test), so that the depth embedding and every corrected
depth are trained, and step n's supervised states all carry w_n. Z_Omega = sum of w over every
supervised (state, step).

Distributed: `reduce_fn` is the MEAN of a tensor over ranks (all-reduce AVG). The loss is the local
numerator over the rank-mean Z, so after gradient averaging (DDP, DeepSpeed) the gradient is that
of the global weighted mean; summing every rank's reported terms and dividing by the number of
ranks gives the global values. Shapes: N supervised states, D hidden, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from spec_core.fovea.config import LossConfig
from spec_core.fovea.data import DraftBatch
from spec_core.fovea.drafter import FoveaDrafter
from spec_core.fovea.unroll import StepStates, unroll


def step_weight(step: int, gamma_w: float) -> float:
    """Eq. 10 with n = the draft step (1-based)."""
    return math.exp(-(step - 1) / gamma_w)


def hidden_mse(pred_ND: torch.Tensor, target_ND: torch.Tensor) -> torch.Tensor:
    """||pred - target||^2 / d_h per state -> (N,)."""
    return (pred_ND.float() - target_ND.float()).pow(2).sum(-1) / pred_ND.shape[-1]


def kl_teacher_draft(teacher_logits_NV: torch.Tensor, draft_logits_NV: torch.Tensor) -> torch.Tensor:
    """KL(softmax(teacher) || softmax(draft)) per state -> (N,)."""
    log_t = F.log_softmax(teacher_logits_NV.float(), -1)
    log_d = F.log_softmax(draft_logits_NV.float(), -1)
    return (log_t.exp() * (log_t - log_d)).sum(-1)


def hard_cross_entropy(draft_logits_NV: torch.Tensor, y_N: torch.Tensor) -> torch.Tensor:
    """-log p^D(y) per state -> (N,)."""
    return F.cross_entropy(draft_logits_NV.float(), y_N, reduction="none")


def candidate_margin(draft_logits_NV: torch.Tensor, y_N: torch.Tensor, k_c: int, margin: float) -> torch.Tensor:
    """softplus(m - (z_y - K_c-th largest competing logit)) per state -> (N,) (Eq. 15-18)."""
    z = draft_logits_NV.float()
    competing = z.scatter(-1, y_N[:, None], float("-inf"))
    boundary = competing.topk(min(k_c, z.shape[-1] - 1), dim=-1).values[:, -1]
    gap = z.gather(-1, y_N[:, None])[:, 0] - boundary
    return F.softplus(margin - gap)


def aligned_mse(s: StepStates, hidden_state: str) -> torch.Tensor:
    """Eq. 13's final-state term on the draft state(s) `hidden_state` names -> (N,)."""
    if hidden_state == "corrected":
        return hidden_mse(s.draft_ND, s.target_ND)
    raw = hidden_mse(s.raw_ND, s.target_ND)
    return raw if hidden_state == "uncorrected" else 0.5 * (raw + hidden_mse(s.draft_ND, s.target_ND))


@dataclass
class LossOutput:
    loss: torch.Tensor            # scalar to backpropagate
    terms: dict[str, torch.Tensor]  # hid, hid_final, hid_mid, kl, tok, ce, margin (detached, weighted means)
    top1: torch.Tensor            # (depth,) draft argmax == target argmax, per step (local)
    count: torch.Tensor           # (depth,) supervised states per step (local)
    k_mean: torch.Tensor          # (depth,) mean memory entries read per state


def drafter_loss(drafter: FoveaDrafter, batch: DraftBatch, cfg: LossConfig | None = None,
                 depth: int | None = None, reduce_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> LossOutput:
    """Unroll `depth` (default: the drafter's train_depth) steps and compute Eq. 19."""
    cfg = cfg or LossConfig()
    depth = depth or drafter.cfg.train_depth
    steps = unroll(drafter, batch, depth)
    dev = batch.final_BTD.device
    names = ("hid_final", "hid_mid", "kl", "ce", "margin")
    sums = {n: torch.zeros((), device=dev) for n in names}
    top1, count, k_mean = (torch.zeros(depth, device=dev) for _ in range(3))
    z_local = torch.zeros((), device=dev)
    for s in steps:
        w = step_weight(s.step, cfg.gamma_w)
        z_draft = drafter.logits(s.draft_ND).float()
        with torch.no_grad():
            z_teacher = drafter.logits(s.target_ND).float()
            y = z_teacher.argmax(-1)
        sums["hid_final"] = sums["hid_final"] + w * aligned_mse(s, cfg.hidden_state).sum()
        sums["hid_mid"] = sums["hid_mid"] + w * (hidden_mse(s.draft_mid_ND, s.target_mid_ND) * s.mid_valid_N).sum()
        sums["kl"] = sums["kl"] + w * kl_teacher_draft(z_teacher, z_draft).sum()
        sums["ce"] = sums["ce"] + w * hard_cross_entropy(z_draft, y).sum()
        sums["margin"] = sums["margin"] + w * candidate_margin(z_draft, y, cfg.k_c, cfg.margin).sum()
        z_local = z_local + w * len(y)
        i = s.step - 1
        count[i] = len(y)
        top1[i] = (z_draft.detach().argmax(-1) == y).float().mean() if len(y) else 0.0
        k_mean[i] = s.k_N.float().mean() if len(y) else 0.0
    z = reduce_fn(z_local) if reduce_fn is not None else z_local
    t = {n: v / z.clamp_min(1e-12) for n, v in sums.items()}
    t["hid"] = cfg.beta_h * t["hid_final"] + cfg.beta_mid * t["hid_mid"]
    t["tok"] = cfg.beta_ce * t["ce"] + cfg.beta_cmp * t["margin"]
    loss = cfg.lambda_hid * t["hid"] + cfg.lambda_kl * t["kl"] + cfg.lambda_tok * t["tok"]
    if not steps:  # nothing supervised: a zero that still reaches every trainable parameter
        loss = loss + sum(p.sum() for p in drafter.trainable_parameters()) * 0.0
    return LossOutput(loss, {n: v.detach() for n, v in t.items()}, top1, count, k_mean)
