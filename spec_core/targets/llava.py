"""`LlavaForConditionalGeneration` (the reference target): a fixed number of visual tokens per
image, 1-D RoPE.

Shapes: B batch, T positions.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spec_core.targets.base import TargetAdapter, text_position_ids


class LlavaAdapter(TargetAdapter):
    """LLaVA-1.5 style targets. The reference target has 10 layers, so the default 1..10
    entropy range is searched as 1..9 there (the last layer's HF state is post-norm)."""

    def image_features(self, batch: Mapping[str, torch.Tensor]):
        if batch.get("pixel_values") is None:
            return None
        tower = self.model.model.vision_tower
        kwargs = {"image_sizes": batch["image_sizes"]} if batch.get("image_sizes") is not None else {}
        # the projector output per image; layer and CLS strategy come from the config
        return self.model.model.get_image_features(
            pixel_values=batch["pixel_values"].to(tower.dtype), return_dict=True, **kwargs)

    def position_ids(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return text_position_ids(batch["attention_mask"])
