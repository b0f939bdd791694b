"""Training-time unroll of the drafter over precomputed target states ("training-time test").

Draft step k = 1..train_depth (tree depth l = k - 1) at sequence index t:
- step 1 reads [embed(x_{t+1}); f^T_t] (embed: the target's input embedding, the projected
  visual token at image placeholders) (target features, as the drafter's prefix does at
  inference) and predicts the target state at t+1, i.e. scores x_{t+2}; image slots read what
  the drafter's visual_context says, and its masked slots are keys no step attends to;
- step k >= 2 reads [embed(x_{t+k}); h^{(k-1)}_t], the drafter's own uncorrected state (its
  corrected h_hat^{(k-1)}_t where `feedback: corrected` and depth k - 2 <= correction_depth), and
  predicts the target state at t+k. Its queries see the step-1 keys at positions <= t (the cached
  prefix, up to the root) plus the keys of steps 2..k at the same t (its own draft chain) - exactly
  what a depth-l tree node sees at inference - at position t + k - 1.
Step k is supervised at index t when x_{t+k+1} is an assistant token; its draft state h^{(k)}_t
(corrected when l <= correction_depth) is compared with the target states at t + k.

Shapes: B batch, T positions, S supervised states per sample at one step, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from spec_core.fovea.data import DraftBatch
from spec_core.fovea.drafter import FoveaDrafter


@dataclass
class StepStates:
    """One draft step's supervised states, flattened over (b, t) in Omega_k."""

    step: int                 # k (1-based); tree depth k - 1
    draft_ND: torch.Tensor    # h_hat: what the LM head scores
    raw_ND: torch.Tensor      # h: the last block's output before correction (== h_hat past the correction depth)
    draft_mid_ND: torch.Tensor
    target_ND: torch.Tensor
    target_mid_ND: torch.Tensor
    mid_valid_N: torch.Tensor
    k_N: torch.Tensor         # memory entries read (0 where not corrected)
    row_N: torch.Tensor       # the state's sample in the batch
    pos_N: torch.Tensor       # its index t (it scores the token at t + step + 1)


def _shift(x_BT: torch.Tensor, k: int, fill=0) -> torch.Tensor:
    """out[:, t] = x[:, t + k] (fill past the end)."""
    out = torch.full_like(x_BT, fill)
    if k < x_BT.shape[1]:
        out[:, : x_BT.shape[1] - k] = x_BT[:, k:]
    return out


def image_ranks(input_ids_BT: torch.Tensor, image_token_id: int | None) -> torch.Tensor:
    """Which of its sample's image tokens each position holds (0, 1, ...), -1 elsewhere."""
    if image_token_id is None:
        return torch.full_like(input_ids_BT, -1)
    is_image = input_ids_BT == image_token_id
    return torch.where(is_image, is_image.long().cumsum(-1) - 1, -1)


def _gather(x_BTD: torch.Tensor, idx_BS: torch.Tensor) -> torch.Tensor:
    return x_BTD.gather(1, idx_BS[..., None].expand(-1, -1, x_BTD.shape[-1]))


def unroll(drafter: FoveaDrafter, batch: DraftBatch, depth: int) -> list[StepStates]:
    """Run `depth` draft steps over a batch; returns the supervised states of each step."""
    B, T = batch.input_ids_BT.shape
    dev, dtype = batch.final_BTD.device, drafter.fc.weight.dtype
    valid_BT = batch.attention_mask_BT
    arange_T = torch.arange(T, device=dev)
    causal_BTT = (arange_T[None, :, None] >= arange_T[None, None, :]) & valid_BT[:, None, :]
    diag_BTT = torch.eye(T, dtype=torch.bool, device=dev).expand(B, T, T)
    mem = drafter.memory(batch.visual_BPD, batch.visual_valid_BP)
    cache, feature = DynamicCache(), batch.final_BTD.to(dtype)
    rank_BT = image_ranks(batch.input_ids_BT, drafter.image_token_id)
    feed_corrected = drafter.cfg.feedback == "corrected" and mem is not None
    out = []
    for k in range(1, depth + 1):
        tokens_BT, step_rank_BT = _shift(batch.input_ids_BT, k), _shift(rank_BT, k, -1)
        x = drafter.input_states(tokens_BT, feature, batch.visual_BPD, step_rank_BT, batch.visual_valid_BP)
        if k == 1 and (keep_BT := drafter.context_keep(tokens_BT, step_rank_BT)) is not None:
            causal_BTT = causal_BTT & keep_BT[:, None, :]  # the prefix keys every step reads
        attend = torch.cat([causal_BTT] + [diag_BTT] * (k - 1), dim=-1)  # (B, T, k*T)
        h_BTD, first_BTD = drafter.blocks(x, (arange_T + k - 1).expand(B, T), attend, cache)
        full = None
        if feed_corrected and k < depth:  # the next step reads h_hat: correct every position
            full = drafter.correct(h_BTD, torch.full((B, T), k - 1, dtype=torch.long, device=dev), mem)
        feature = h_BTD if full is None else full.hidden_BSD

        sup_BT = _shift(batch.loss_mask_BT, k + 1, False)  # x_{t+k+1} is an assistant token
        n_B = sup_BT.sum(-1)
        S = int(n_B.max())
        if S == 0:
            continue
        order = torch.sort(sup_BT.long(), dim=-1, descending=True, stable=True).indices[:, :S]
        live_BS = torch.arange(S, device=dev)[None] < n_B[:, None]  # (B, S) real entries
        idx_BS = torch.where(live_BS, order, 0)
        raw_BSD = _gather(h_BTD, idx_BS)
        if full is None:
            corr = drafter.correct(raw_BSD, torch.full_like(idx_BS, k - 1), mem)
            hat_BSD, k_BS = corr.hidden_BSD, corr.k_BS
        else:  # corrected at every position already
            hat_BSD, k_BS = _gather(full.hidden_BSD, idx_BS), full.k_BS.gather(1, idx_BS)
        tgt_idx = (idx_BS + k).clamp_max(T - 1)
        out.append(StepStates(
            k, hat_BSD[live_BS], raw_BSD[live_BS], _gather(first_BTD, idx_BS)[live_BS],
            _gather(batch.final_BTD, tgt_idx)[live_BS].to(dtype),
            _gather(batch.mid_BTD, tgt_idx)[live_BS].to(dtype),
            batch.mid_valid_BT.gather(1, tgt_idx)[live_BS], k_BS[live_BS],
            torch.arange(B, device=dev)[:, None].expand(B, S)[live_BS], idx_BS[live_BS]))
    return out
