"""`LlavaNextForConditionalGeneration`: any-resolution images, so the number of visual tokens
(base view + unpadded high-resolution grid + one newline token per row) varies per image.

Batch: `pixel_values` (num_images, max_views, C, H, W) as the processor pads them, and
`image_sizes` (num_images, 2) as (height, width); views past an image's count are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spec_core.targets.llava import LlavaAdapter


class LlavaNextAdapter(LlavaAdapter):
    """LLaVA-NeXT (1.6) targets; positions and layers as LLaVA."""

    def image_features(self, batch: Mapping[str, torch.Tensor]):
        if batch.get("pixel_values") is None:
            return None
        if batch.get("image_sizes") is None:
            raise ValueError("a LLaVA-NeXT batch with pixel_values needs image_sizes")
        tower = self.model.model.vision_tower
        return self.model.model.get_image_features(
            pixel_values=batch["pixel_values"].to(tower.dtype), image_sizes=batch["image_sizes"],
            return_dict=True)
