"""Where in a hires image each word an answer reads is shown: the visual tokens of the patches an
object, a sign or a bar covers, for the object-level focus (`spec_core.reference.vlm.data.read_pairs`).

A region question's answer reads one detail inside a panel ("the cross at the top" -> its colour,
"bar F" -> its value, the sign -> its word), a second address within the panel's 16 tokens that
panel-level focus does not give: the taught heads spread over the whole tile (measured on the
first focus build: the panel is found, 0.94 region dependence, but exact match did not rise).
Here every readable word of a panel maps to the patches that show it:
- an object's colour and shape -> the patches holding its pixels (as drawn, later objects on top);
- a sign's word -> the patches its band overlaps;
- a bar's label, value (to the nearest ten, as answers say it) and the chart's colour -> the
  patches its column overlaps, from the plot's top to the label under it (a bar of 10 px may
  contain no patch centre at 16 px patches: overlap, not centres).

Shapes: K visual tokens of one image; P patches of a panel (side x side).
"""

from __future__ import annotations


import numpy as np

from spec_core.reference.drawing import OBJECT_REGION, paint
from spec_core.reference.geometry import chart_layout, sign_layout
from spec_core.reference.hires.layout import tile_of_tokens
from spec_core.reference.hires.mosaic import PANEL_PX, PANELS, Mosaic, mosaic_from_json
from spec_core.reference.questions import tens
from spec_core.reference.scenes import Scene

Box = tuple[float, float, float, float]  # (x0, y0, x1, y1) in a panel's pixels, half-open


def _patches(box: Box, side: int) -> np.ndarray:
    """(P,) bool: the patches of a side x side panel grid (row-major) that `box` overlaps."""
    edge = PANEL_PX / side
    lo = np.arange(side) * edge
    cols = (box[0] < lo + edge) & (box[2] > lo)
    rows = (box[1] < lo + edge) & (box[3] > lo)
    return (rows[:, None] & cols[None, :]).ravel()


def _patches_of(mask_HW: np.ndarray, side: int) -> np.ndarray:
    """(P,) bool: the patches holding any pixel of a panel's pixel mask."""
    edge = PANEL_PX // side
    return mask_HW.reshape(side, edge, side, edge).any(axis=(1, 3)).ravel()


def panel_reads(scene: Scene, side: int) -> dict[str, np.ndarray]:
    """word -> (P,) bool patches of one panel that show it."""
    out: dict[str, np.ndarray] = {}

    def add(word: str, m_P: np.ndarray) -> None:
        out[word] = out[word] | m_P if word in out else m_P

    _, regions_HW = paint(scene, PANEL_PX)  # the pixels each object was drawn on (later ones on top)
    for i, obj in enumerate(scene.objects):
        m_P = _patches_of(regions_HW == OBJECT_REGION + i, side)
        add(obj.colour, m_P)
        add(obj.shape, m_P)
    if scene.sign is not None:
        add(scene.sign.word, _patches(sign_layout(scene.sign, PANEL_PX).band, side))
    if scene.chart is not None:
        lay = chart_layout(scene.chart, PANEL_PX)
        for label, value, (x0, _, x1, _) in zip(scene.chart.labels, scene.chart.values, lay.bars):
            column = _patches((x0, lay.plot_top, x1, PANEL_PX), side)  # the bar, however low, and its label
            for word in (label, str(tens(value)), scene.chart.colour):
                add(word, column)
    return out


def read_tokens(mosaic: Mosaic, panels: list[int], side: int) -> dict[str, np.ndarray]:
    """word -> the visual-token indices (among the image's K placeholders) of the patches that
    show it in any of `panels`."""
    tiles_K = tile_of_tokens(side)
    out: dict[str, list[np.ndarray]] = {}
    for p in panels:
        tokens_P = np.flatnonzero(tiles_K == p)  # the tile's patches, row-major (grid rows in order)
        for word, m_P in panel_reads(mosaic.panels[p], side).items():
            out.setdefault(word, []).append(tokens_P[m_P])
    return {w: np.unique(np.concatenate(ks)) for w, ks in out.items()}


def sample_read_tokens(sample: dict, side: int) -> list[dict[str, np.ndarray] | list[dict[str, np.ndarray]]]:
    """Per turn of a hires sample, `read_tokens` of the panels it reads; a turn that reads every
    panel (a caption: a sentence per panel, `hires.tasks.caption`) gets one entry per sentence,
    as `layout.region_tokens` gives its panels: nothing for the opening sentence, then panel p's."""
    mosaic, regions = mosaic_from_json(sample["scene_json"])
    out: list = []
    for panels in regions:
        if len(set(panels)) >= PANELS * PANELS:
            out.append([{}] + [read_tokens(mosaic, [p], side) for p in range(PANELS * PANELS)])
        else:
            out.append(read_tokens(mosaic, panels, side))
    return out
