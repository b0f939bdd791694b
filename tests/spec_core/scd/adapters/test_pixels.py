"""[-1, 1] decoder pixels -> uint8 / PIL as HF's postprocess does with mean = std = 0.5."""

from __future__ import annotations

import numpy as np
import torch
from transformers import Emu3ImageProcessor

from spec_core.scd.adapters.pixels import to_pil, to_uint8


def test_to_uint8_clips_and_truncates():
    x = torch.tensor([-2.0, -1.0, 0.0, 0.999, 1.0, 3.0]).view(1, 1, 1, 6)
    assert to_uint8(x).flatten().tolist() == [0, 0, 127, 254, 255, 255]


def test_to_pil_matches_hf_postprocess():
    x = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(0)) * 2.4 - 1.2
    processor = Emu3ImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)
    hf = processor.postprocess(list(x), return_tensors="PIL.Image.Image")["pixel_values"]
    ours = to_pil(x)
    assert [im.size for im in ours] == [(7, 5), (7, 5)]
    for a, b, c in zip(ours, to_pil(x, processor), hf):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
        np.testing.assert_array_equal(np.asarray(b), np.asarray(c))
