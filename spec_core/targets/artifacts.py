"""What a drafter learns from, cut out of one target prefill: per-sample arrays, 16-bit.

Per sample (the drafter's context is the whole prefill, image positions included, as in the
EAGLE/DREAM family FOVEA follows):
- `input_ids` (T,) int32 and `loss_mask` (T,) bool (assistant tokens);
- `final_hidden` (T, D): the target's LM-head input at every real position (logits are
  recomputed from it with the frozen head, never stored);
- `mid_hidden` (S, D) + `mid_layer` (S,) uint8 + `mid_pos` (S,) int32: the per-token
  minimum-attention-entropy state only at the supervised positions S = {t : mask[t] or
  mask[t+1]} (the state that predicts an assistant token, and the assistant token's own);
- the projected visual tokens (N, D) once per image, stored apart and referenced by hash;
- `image_prefix_len`: where the prompt prefix that samples of one image share ends (through the
  first image's placeholders): the job stores those final states once per image.

`naive_bytes` is what an EAGLE-style dump of the same sample costs: fp16 states at every position
(final and intermediate, as DREAM stores them), a per-sample copy of the visual tokens, int64 ids
and mask.

Shapes: B batch, T positions, D hidden, N visual tokens, S supervised positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from spec_core.targets.base import PrefillOutput

HIDDEN_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class SampleArtifacts:
    input_ids: np.ndarray      # (T,) int32
    loss_mask: np.ndarray      # (T,) bool
    final_hidden: np.ndarray   # (T, D) raw 16-bit values (uint16 view of float16 / bfloat16)
    mid_hidden: np.ndarray     # (S, D) same
    mid_layer: np.ndarray      # (S,) uint8, an index into HF hidden_states
    mid_pos: np.ndarray        # (S,) int32 positions of the mid rows
    visual: np.ndarray         # (N, D) same 16-bit view; the caller stores it once per image


def supervised_positions(loss_mask_T: np.ndarray) -> np.ndarray:
    """Positions t with mask[t] or mask[t + 1], ascending."""
    m = loss_mask_T.astype(bool)
    s = m.copy()
    s[:-1] |= m[1:]
    return np.flatnonzero(s).astype(np.int32)


def image_prefix_len(input_ids_T, image_token_id: int) -> int:
    """Length of the prompt prefix through the first block of image placeholders (0 if none):
    everything before and including the image, identical for every question asked of it under
    one chat template."""
    ids = np.asarray(input_ids_T)
    hits = np.flatnonzero(ids == image_token_id)
    if hits.size == 0:
        return 0
    gaps = np.flatnonzero(np.diff(hits) != 1)
    return int(hits[gaps[0]] if gaps.size else hits[-1]) + 1


def to_16bit(x: torch.Tensor, dtype: str) -> np.ndarray:
    """Float tensor -> its 16-bit values as a uint16 array (numpy has no bfloat16)."""
    y = x.detach().to("cpu", HIDDEN_DTYPES[dtype])
    if dtype == "float16" and not torch.isfinite(y).all():
        raise ValueError("hidden state outside the float16 range: use hidden_dtype bfloat16")
    return y.view(torch.int16).numpy().view(np.uint16)


def from_16bit(raw: np.ndarray, dtype: str) -> torch.Tensor:
    """Inverse of to_16bit (float32 out)."""
    return torch.from_numpy(np.array(raw, dtype=np.uint16).view(np.int16)).view(HIDDEN_DTYPES[dtype]).float()


def sample_artifacts(out: PrefillOutput, b: int, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                     loss_mask_T: np.ndarray, dtype: str = "float16") -> SampleArtifacts:
    """Row b of a left-padded prefill (with an entropy range) -> that sample's artifacts."""
    if out.chosen_layer_BT is None:
        raise ValueError("prefill ran without entropy_layers: no intermediate states")
    real_T = attention_mask_BT[b].bool().cpu()
    ids_T = input_ids_BT[b].cpu()[real_T].numpy().astype(np.int32)
    if len(loss_mask_T) != int(real_T.sum()):
        raise ValueError(f"loss mask has {len(loss_mask_T)} entries for {int(real_T.sum())} tokens")
    sup_S = supervised_positions(loss_mask_T)
    dev_T = real_T.to(out.final_hidden_BTD.device)
    final_TD = out.final_hidden_BTD[b, dev_T]
    mid_TD = out.intermediate_BTD[b, dev_T]
    layer_T = out.chosen_layer_BT[b, dev_T]
    idx = torch.from_numpy(sup_S).long().to(mid_TD.device)
    return SampleArtifacts(
        input_ids=ids_T, loss_mask=np.asarray(loss_mask_T, dtype=bool),
        final_hidden=to_16bit(final_TD, dtype), mid_hidden=to_16bit(mid_TD[idx], dtype),
        mid_layer=layer_T[idx].cpu().numpy().astype(np.uint8), mid_pos=sup_S,
        visual=to_16bit(out.visual_BPD[b, out.visual_valid_BP[b]], dtype))


def naive_bytes(n_tokens: int, n_visual: int, hidden: int) -> int:
    """An EAGLE/DREAM-style dump: fp16 final + intermediate states at every position, a copy of
    the visual tokens, int64 input ids and loss mask."""
    return 2 * n_tokens * hidden * 2 + n_visual * hidden * 2 + 2 * n_tokens * 8
