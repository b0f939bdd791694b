"""Frechet distance against closed forms; features of known images."""

import torch
from PIL import Image

from spec_core.scd.quality import frechet_distance, image_features, video_features


def test_frechet_of_gaussians_matches_closed_form():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, 3, generator=g, dtype=torch.float64)
    y = torch.randn(20000, 3, generator=g, dtype=torch.float64) * 2.0 + torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    # N(0, I) vs N(m, 4I): |m|^2 + 3 (1 + 4 - 2 * 2) = 1 + 3
    assert abs(frechet_distance(x, y) - 4.0) < 0.15
    assert abs(frechet_distance(x, x)) < 1e-6
    assert frechet_distance(x[:10000], x[10000:]) < 0.01


def test_features_see_where_the_colour_is():
    red_left = Image.new("RGB", (30, 30), (0, 0, 0))
    red_left.paste((255, 0, 0), (0, 0, 10, 30))
    f = image_features([red_left]).reshape(3, 3, 3)  # (channel, row, col)
    assert torch.allclose(f[0, :, 0], torch.ones(3)) and float(f[0, :, 1:].abs().max()) == 0.0
    assert video_features([[red_left, Image.new("RGB", (30, 30))]]).shape == (1, 54)
