"""Medusa-1 training on precomputed target states (self-distillation, frozen target):

    L = (1/Z) sum_k sum_t lambda^(k-1) CE(head_k(h_t), y_{t+k}),   y_s = argmax W_LM h_s

h_t the target's LM-head input at t, y_{t+k} the target's own greedy token at t+k+1 (labels from
its frozen head, as at inference the target decides), supervised where x_{t+k+1} is an assistant
token; Z = sum of the weights over every supervised (state, head), lambda = 0.8 (Medusa's decay).

Shapes: B batch, T positions, K heads, N supervised states, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from spec_core.fovea.data import DraftBatch
from spec_core.fovea.losses import LossOutput
from spec_core.medusa.heads import MedusaHeads

DECAY = 0.8


def medusa_loss(heads: MedusaHeads, batch: DraftBatch, decay: float = DECAY,
                reduce_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> LossOutput:
    """`reduce_fn`: the mean over ranks of a tensor (as in `fovea.drafter_loss`)."""
    K, dev = heads.cfg.num_heads, batch.final_BTD.device
    B, T = batch.input_ids_BT.shape
    h_BTD = batch.final_BTD.to(heads.lm_head.weight.dtype)
    logits_BTKV = heads(h_BTD)
    with torch.no_grad():
        y_BT = heads.lm_head(h_BTD).argmax(-1)   # y[t]: the target's token for x_{t+1}
    total = torch.zeros((), device=dev)
    z_local = torch.zeros((), device=dev)
    top1, count = torch.zeros(K, device=dev), torch.zeros(K, device=dev)
    for k in range(1, K + 1):
        if T <= k + 1:
            continue
        sup_BT = torch.zeros(B, T, dtype=torch.bool, device=dev)
        sup_BT[:, : T - k - 1] = batch.loss_mask_BT[:, k + 1:]   # x_{t+k+1} is an assistant token
        logits_NV, y_N = logits_BTKV[:, : T - k, k - 1][sup_BT[:, : T - k]], y_BT[:, k:][sup_BT[:, : T - k]]
        w = decay ** (k - 1)
        total = total + w * F.cross_entropy(logits_NV.float(), y_N, reduction="sum")
        z_local = z_local + w * len(y_N)
        count[k - 1] = len(y_N)
        top1[k - 1] = (logits_NV.detach().argmax(-1) == y_N).float().mean() if len(y_N) else 0.0
    z = reduce_fn(z_local) if reduce_fn is not None else z_local
    ce = total / z.clamp_min(1e-12)
    loss = ce if count.sum() else ce + sum(p.sum() for p in heads.trainable_parameters()) * 0.0
    return LossOutput(loss, {"ce": ce.detach()}, top1, count, torch.zeros(K, device=dev))
