"""Artifact helpers: supervised positions, exact 16-bit round trips, the naive-dump formula."""

import numpy as np
import pytest
import torch

from spec_core.targets.artifacts import from_16bit, naive_bytes, supervised_positions, to_16bit


def test_supervised_positions_are_the_mask_and_the_positions_that_predict_it():
    mask = np.array([0, 0, 1, 1, 0, 0, 1, 0], dtype=bool)
    assert supervised_positions(mask).tolist() == [1, 2, 3, 5, 6]
    assert supervised_positions(np.zeros(4, bool)).tolist() == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_round_trip_is_exact_on_16bit_values(dtype):
    x = torch.randn(5, 7).to(getattr(torch, dtype)).float()
    raw = to_16bit(x, dtype)
    assert raw.dtype == np.uint16 and raw.shape == (5, 7)
    assert torch.equal(from_16bit(np.frombuffer(raw.tobytes(), np.uint16).reshape(5, 7), dtype), x)


def test_float16_overflow_is_refused():
    with pytest.raises(ValueError, match="bfloat16"):
        to_16bit(torch.tensor([1e6]), "float16")


def test_naive_bytes():
    # fp16 final + intermediate per position, fp16 visual copy, int64 ids + mask
    assert naive_bytes(10, 4, 8) == 2 * 10 * 8 * 2 + 4 * 8 * 2 + 2 * 10 * 8
