"""Artifact rows (as the precompute job stores them) decode and collate exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spec_core.fovea import collate, decode_sample
from spec_core.targets.artifacts import supervised_positions, to_16bit


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_round_trips_16bit_rows(dtype):
    g = torch.Generator().manual_seed(0)
    T, D, N = 7, 4, 3
    final, mid_full, visual = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g), torch.randn(N, D, generator=g)
    loss = np.array([0, 0, 0, 1, 1, 1, 0], bool)
    sup = supervised_positions(loss)
    row = {"input_ids": np.arange(T, dtype=np.int32), "loss_mask": loss,
           "final_hidden": to_16bit(final, dtype).tobytes(), "mid_pos": sup,
           "mid_layer": np.ones(len(sup), np.uint8), "mid_hidden": to_16bit(mid_full[sup], dtype).tobytes()}
    s = decode_sample(row, to_16bit(visual, dtype).tobytes(), N, D, dtype)
    torch_dtype = getattr(torch, dtype)
    assert torch.equal(s.final, final.to(torch_dtype).float())
    assert torch.equal(s.visual, visual.to(torch_dtype).float())
    assert s.mid_valid.tolist() == [False, False, True, True, True, True, False]
    assert torch.equal(s.mid[sup], mid_full[sup].to(torch_dtype).float()) and (s.mid[~s.mid_valid] == 0).all()
    with pytest.raises(ValueError, match="expected"):
        decode_sample(row, to_16bit(visual, dtype).tobytes(), N + 1, D, dtype)


def test_collate_right_pads():
    g = torch.Generator().manual_seed(0)
    rows = []
    for T, N in ((5, 2), (3, 0)):
        loss = np.zeros(T, bool)
        loss[-1] = True
        sup = supervised_positions(loss)
        rows.append(decode_sample(
            {"input_ids": np.arange(1, T + 1), "loss_mask": loss,
             "final_hidden": to_16bit(torch.randn(T, 2, generator=g), "float16").tobytes(),
             "mid_pos": sup, "mid_hidden": to_16bit(torch.randn(len(sup), 2, generator=g), "float16").tobytes()},
            to_16bit(torch.randn(N, 2, generator=g), "float16").tobytes(), N, 2))
    b = collate(rows)
    assert b.input_ids_BT.tolist() == [[1, 2, 3, 4, 5], [1, 2, 3, 0, 0]]
    assert b.attention_mask_BT.sum().item() == 8 == b.n_tokens
    assert b.visual_valid_BP.tolist() == [[True, True], [False, False]]
    assert torch.equal(b.final_BTD[1, :3], rows[1].final) and (b.final_BTD[1, 3:] == 0).all()
    assert b.to(dtype=torch.bfloat16).final_BTD.dtype == torch.bfloat16
    assert b.to(dtype=torch.bfloat16).input_ids_BT.dtype == torch.long
