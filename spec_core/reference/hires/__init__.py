"""The hires reference world: 192 px mosaics of nine small-world panels, region questions of the
six task kinds, several samples per image; its target is a LLaVA-NeXT (AnyRes) model."""

from spec_core.reference.hires.mosaic import (IMAGE_PX, PANEL_NAMES, PANEL_PX, Mosaic, mosaic_from_json,
                                              render_mosaic, sample_mosaic)
from spec_core.reference.hires.tasks import all_words, caption, make_sample, make_split

__all__ = ["IMAGE_PX", "Mosaic", "PANEL_NAMES", "PANEL_PX", "all_words", "caption", "make_sample", "make_split",
           "mosaic_from_json", "render_mosaic", "sample_mosaic"]
