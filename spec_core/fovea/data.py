"""Precomputed target artifacts -> drafter training batches.

A sample row is what `jobs/precompute.py` stores (see `spec_core.targets.artifacts`): input ids,
the assistant loss mask, 16-bit final states at every position, 16-bit intermediate states at the
supervised positions only, and the image's projected visual tokens (stored once per image).

Shapes: B batch, T positions (right padding), P visual tokens, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from spec_core.targets.artifacts import from_16bit


@dataclass
class DraftSample:
    input_ids: torch.Tensor    # (T,) long
    loss_mask: torch.Tensor    # (T,) bool: assistant tokens
    final: torch.Tensor        # (T, D) target LM-head input
    mid: torch.Tensor          # (T, D) target intermediate state; zero where not stored
    mid_valid: torch.Tensor    # (T,) bool
    visual: torch.Tensor       # (N, D) projected visual tokens (N may be 0)


@dataclass
class DraftBatch:
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor   # bool: real tokens
    loss_mask_BT: torch.Tensor
    final_BTD: torch.Tensor
    mid_BTD: torch.Tensor
    mid_valid_BT: torch.Tensor
    visual_BPD: torch.Tensor
    visual_valid_BP: torch.Tensor

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask_BT.sum())

    def to(self, device=None, dtype: torch.dtype | None = None) -> DraftBatch:
        """Move to a device; float tensors to `dtype` when given."""
        out = {}
        for f in fields(self):
            t = getattr(self, f.name)
            out[f.name] = t.to(device, dtype) if (dtype is not None and t.is_floating_point()) else t.to(device)
        return DraftBatch(**out)


def _rows(raw, n_rows: int, hidden: int, dtype: str) -> torch.Tensor:
    flat = np.frombuffer(raw, dtype=np.uint16) if raw is not None else np.zeros(0, np.uint16)
    if flat.size != n_rows * hidden:
        raise ValueError(f"artifact blob holds {flat.size} values, expected {n_rows} x {hidden}")
    return from_16bit(flat.reshape(n_rows, hidden), dtype)


def decode_sample(row: dict, visual_raw: bytes | None, n_visual: int, hidden: int,
                  dtype: str = "float16", prefix_ids: list[int] | None = None,
                  prefix_raw: bytes | None = None) -> DraftSample:
    """One SAMPLES_SCHEMA row plus its image's VISUAL_SCHEMA blobs -> float32 tensors. A row with
    prefix_len L > 0 holds the final states of positions L.. only; positions 0..L-1 are the image's
    shared prefix (`prefix_ids`, `prefix_raw`), which its ids must begin with."""
    ids = torch.as_tensor(np.asarray(row["input_ids"], dtype=np.int64))
    T, L = ids.shape[0], int(row.get("prefix_len") or 0)
    final = _rows(row["final_hidden"], T - L, hidden, dtype)
    if L:
        if prefix_ids is None or len(prefix_ids) < L or list(prefix_ids[:L]) != ids[:L].tolist():
            raise ValueError(f"sample {row.get('id')} begins with a prefix of {L} tokens its image's prefix does not hold")
        final = torch.cat([_rows(prefix_raw, len(prefix_ids), hidden, dtype)[:L], final])
    mid_pos = torch.as_tensor(np.asarray(row["mid_pos"], dtype=np.int64))
    mid = torch.zeros(T, hidden)
    mid[mid_pos] = _rows(row["mid_hidden"], len(mid_pos), hidden, dtype)
    mid_valid = torch.zeros(T, dtype=torch.bool)
    mid_valid[mid_pos] = True
    return DraftSample(ids, torch.as_tensor(np.asarray(row["loss_mask"], dtype=bool)),
                       final, mid, mid_valid,
                       _rows(visual_raw, n_visual, hidden, dtype))


def collate(samples: list[DraftSample]) -> DraftBatch:
    """Right-pad a list of samples into one batch."""
    B, D = len(samples), samples[0].final.shape[-1]
    T = max(s.input_ids.shape[0] for s in samples)
    P = max(s.visual.shape[0] for s in samples)
    ids = torch.zeros(B, T, dtype=torch.long)
    attn, loss, mid_valid = (torch.zeros(B, T, dtype=torch.bool) for _ in range(3))
    final, mid = torch.zeros(B, T, D), torch.zeros(B, T, D)
    visual, visual_valid = torch.zeros(B, P, D), torch.zeros(B, P, dtype=torch.bool)
    for b, s in enumerate(samples):
        n, p = s.input_ids.shape[0], s.visual.shape[0]
        ids[b, :n], attn[b, :n], loss[b, :n] = s.input_ids, True, s.loss_mask
        final[b, :n], mid[b, :n], mid_valid[b, :n] = s.final, s.mid, s.mid_valid
        visual[b, :p], visual_valid[b, :p] = s.visual, True
    return DraftBatch(ids, attn, loss, final, mid, mid_valid, visual, visual_valid)
