"""Where each panel's visual tokens sit among a hires image's placeholders, as LLaVA-NeXT packs
them: first the base view's side^2 patches, then the 3x3 tiles' patch grid row by row (a row of
the grid crosses three tiles), each row ending in one `image_newline` token. A panel's side^2
tokens are therefore not contiguous: they are `side` runs of `side`, one run per grid row.

Shapes: K visual tokens of one image.
"""

from __future__ import annotations

import numpy as np

from spec_core.reference.hires.mosaic import PANELS, mosaic_from_json


def tile_of_tokens(side: int) -> np.ndarray:
    """(K,) tile index (row-major, 0..PANELS^2 - 1) of every visual token; -1 for the base view
    and the newlines. `side`: patches per tile side."""
    if side < 1:
        raise ValueError(f"side must be >= 1, got {side}")
    grid = PANELS * side
    row = [(c // side) for c in range(grid)]
    tiles = [-1] * (side * side)
    for r in range(grid):
        tiles += [(r // side) * PANELS + c for c in row] + [-1]
    return np.array(tiles)


def region_tokens(regions: list[list[int]], side: int) -> list[np.ndarray | list[np.ndarray]]:
    """Per turn, the visual-token indices of the panels its answer reads (the sample's `regions`).
    A turn that reads every panel (a caption) instead gets one entry per sentence of its answer:
    nothing for the opening sentence, then panel p's tokens for the sentence about panel p (a
    caption describes the panels in reading order, `hires.tasks.caption`)."""
    tiles_K = tile_of_tokens(side)
    out: list[np.ndarray | list[np.ndarray]] = []
    for panels in regions:
        if len(set(panels)) >= PANELS * PANELS:
            out.append([np.zeros(0, dtype=np.int64)] + [np.flatnonzero(tiles_K == p) for p in range(PANELS * PANELS)])
        else:
            out.append(np.flatnonzero(np.isin(tiles_K, list(panels))))
    return out


def sample_region_tokens(sample: dict, side: int) -> list[np.ndarray]:
    """`region_tokens` of a hires sample (its `scene_json` lists the panels of every turn)."""
    return region_tokens(mosaic_from_json(sample["scene_json"])[1], side)
