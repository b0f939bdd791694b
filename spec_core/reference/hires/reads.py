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
  contain no patch centre at 16 px patches: overlap, not centres);
- and where an answer says more of a sign than its word (`answer_reads`): the panel that holds it
  ("which panel has the sign that says X"), its first letter, its length, its row.

Shapes: K visual tokens of one image; P patches of a panel (side x side).
"""

from __future__ import annotations

import re

import numpy as np

from spec_core.reference.drawing import OBJECT_REGION, paint
from spec_core.reference.geometry import chart_layout, sign_layout
from spec_core.reference.hires.layout import tile_of_tokens
from spec_core.reference.hires import templates as T
from spec_core.reference.hires.mosaic import PANEL_NAMES, PANEL_PX, PANELS, Mosaic, mosaic_from_json
from spec_core.reference.hires.tasks import panel_words
from spec_core.reference.questions import tens
from spec_core.reference.scenes import Scene
from spec_core.reference.templates import ANSWERS

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


def answer_pattern(template: str) -> re.Pattern:
    """The answers an answer template writes, each {slot} a named group (fullmatch)."""
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile("".join(re.escape(x) if i % 2 == 0 else f"(?P<{x}>.+?)" for i, x in enumerate(parts)))


# answers that say more of a sign than its word (the small world's as a panel question phrases them)
SIGN_ANSWERS: dict[str, re.Pattern] = {
    "sign_panel": answer_pattern(T.ANSWERS["sign_panel"]),
    **{k: answer_pattern(panel_words(ANSWERS[k])) for k in ("sign_first", "sign_length", "sign_where")}}


def answer_reads(mosaic: Mosaic, p: int, answer: str, side: int) -> dict[str, np.ndarray]:
    """word -> (P,) bool patches of panel p that show what an answer about p's sign says beyond
    the sign's word (nothing for other answers):
    - "The sign that says X is in the bottom middle panel." -> each word of the panel's name, the
      whole tile: a tile's patches show where it sits (the frame on its border sides, `mosaic`),
      and stage 1 teaches the tower the panel of every patch;
    - "... starts with the letter f." -> the letter, the first letter's slot;
    - "... has 5 letters." -> the number, and "... across the bottom of the panel." -> the row:
      the sign's band.
    Why: trained on the answers, the hires target's focus heads put 0.61 of their attention on the
    panel of "which panel has the sign that says X" and its answers still named the wrong panel
    (6 of 46 in training, 1 of 31 held out): what a head attends to is not in its output until a
    read loss asks for it, as for the sign's word. Taught with `read_loss_words="text"`
    (`vlm.train`; measured there: a found tile's name now comes out, and the tile is found less
    often)."""
    sign = mosaic.panels[p].sign
    if sign is None:
        return {}
    m = {k: pat.fullmatch(answer) for k, pat in SIGN_ANSWERS.items()}
    if m["sign_panel"] and m["sign_panel"]["panel"] == PANEL_NAMES[p] and m["sign_panel"]["word"] == sign.word:
        return {w: np.ones(side * side, dtype=bool) for w in PANEL_NAMES[p].split()}
    lay = sign_layout(sign, PANEL_PX)
    if m["sign_first"] and m["sign_first"]["word"] == sign.word:
        return {m["sign_first"]["letter"]: _patches(lay.slots[0], side)}
    hit = m["sign_length"] or m["sign_where"]
    if hit and hit.groupdict().get("word", sign.word) == sign.word:
        return {hit["n"] if m["sign_length"] else hit["row"]: _patches(lay.band, side)}
    return {}


def read_tokens(mosaic: Mosaic, panels: list[int], side: int, answer: str | None = None) -> dict[str, np.ndarray]:
    """word -> the visual-token indices (among the image's K placeholders) of the patches that
    show it in any of `panels` (with `answer`, a one-panel turn's, what it says of the panel's
    sign too: `answer_reads`)."""
    tiles_K = tile_of_tokens(side)
    out: dict[str, list[np.ndarray]] = {}
    for p in panels:
        tokens_P = np.flatnonzero(tiles_K == p)  # the tile's patches, row-major (grid rows in order)
        reads = panel_reads(mosaic.panels[p], side)
        if answer is not None and len(panels) == 1:
            for word, m_P in answer_reads(mosaic, p, answer, side).items():
                reads[word] = reads[word] | m_P if word in reads else m_P
        for word, m_P in reads.items():
            out.setdefault(word, []).append(tokens_P[m_P])
    return {w: np.unique(np.concatenate(ks)) for w, ks in out.items()}


def sample_read_tokens(sample: dict, side: int, answers: bool = False,
                       ) -> list[dict[str, np.ndarray] | list[dict[str, np.ndarray]]]:
    """Per turn of a hires sample, `read_tokens` of the panels it reads (with `answers`, what a
    one-panel turn's answer says of the panel's sign too: `answer_reads`); a turn that reads every
    panel (a caption: a sentence per panel, `hires.tasks.caption`) gets one entry per sentence,
    as `layout.region_tokens` gives its panels: nothing for the opening sentence, then panel p's."""
    mosaic, regions = mosaic_from_json(sample["scene_json"])
    said = [turn["content"] if answers else None for turn in sample["conversation"][1::2]]
    out: list = []
    for panels, answer in zip(regions, said, strict=True):
        if len(set(panels)) >= PANELS * PANELS:
            out.append([{}] + [read_tokens(mosaic, [p], side) for p in range(PANELS * PANELS)])
        else:
            out.append(read_tokens(mosaic, panels, side, answer))
    return out
