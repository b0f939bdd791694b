"""Sample-quality yardsticks for lossless checks on small generators: a Frechet distance between
feature distributions (FID's formula on cheap, domain-fitting features) and its noise floor.

The reference world's scenes put objects on a 3 x 3 grid over a flat background, so the features
are the mean colour of each grid cell (27 values per image; a video: its first and last frames).
A lossless method gives a distance to AR samples as small as AR's distance to itself at another
seed. Shapes: N samples, C channels, H/W pixels, F frames, D features.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


def _cells(image: Image.Image) -> torch.Tensor:
    x_CHW = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
    return torch.nn.functional.adaptive_avg_pool2d(x_CHW, 3).flatten()  # (3, 3, 3) -> (27,)


def image_features(images: list[Image.Image]) -> torch.Tensor:
    """(N, 27) mean colour per 3 x 3 cell."""
    return torch.stack([_cells(im) for im in images])


def video_features(videos: list[list[Image.Image]]) -> torch.Tensor:
    """(N, 54): the cells of the first and the last frame (where the objects started and went)."""
    return torch.stack([torch.cat([_cells(v[0]), _cells(v[-1])]) for v in videos])


def _sqrtm_psd(a_DD: torch.Tensor) -> torch.Tensor:
    w, v = torch.linalg.eigh(a_DD)
    return (v * w.clamp_min(0).sqrt()) @ v.T


def frechet_distance(x_ND: torch.Tensor, y_ND: torch.Tensor) -> float:
    """||mu_x - mu_y||^2 + tr(S_x + S_y - 2 (S_x^1/2 S_y S_x^1/2)^1/2) in float64."""
    x, y = x_ND.double(), y_ND.double()
    if len(x) < 2 or len(y) < 2:
        raise ValueError("a Frechet distance needs at least two samples on each side")
    mu = (x.mean(0) - y.mean(0)).square().sum()
    sx, sy = torch.cov(x.T), torch.cov(y.T)
    root = _sqrtm_psd(sx)
    cross = _sqrtm_psd(root @ sy @ root)
    return float(mu + torch.trace(sx) + torch.trace(sy) - 2 * torch.trace(cross))
