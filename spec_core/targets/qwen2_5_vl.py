"""`Qwen2_5_VLForConditionalGeneration`: native-resolution images merged 2x2 into visual tokens,
and 3-axis M-RoPE positions (temporal, height, width) from `get_rope_index`.

Batch: `pixel_values` (sum of t*h*w patches, C*temporal_patch*patch*patch) and `image_grid_thw`
(num_images, 3) as Qwen's processor makes them; `mm_token_type_ids` (B, T) (0 text, 1 image) is
derived from `input_ids` when absent. HF silently falls back to 1-D positions without it, so the
adapter always computes the 3-axis positions itself and passes them explicitly (which also keeps
the model's stateful `rope_deltas` out of the way). Videos are not supported yet.

Shapes: B batch, T positions.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spec_core.targets.base import TargetAdapter


class Qwen2_5_VLAdapter(TargetAdapter):
    """Qwen2.5-VL targets. The paper searches its entropy layer among hidden states 1..9."""

    default_entropy_layers = (1, 9)

    def _check(self, batch: Mapping[str, torch.Tensor]) -> None:
        if batch.get("pixel_values_videos") is not None:
            raise ValueError("the Qwen2.5-VL adapter does not support videos yet")
        if batch.get("pixel_values") is not None and batch.get("image_grid_thw") is None:
            raise ValueError("a Qwen2.5-VL batch with pixel_values needs image_grid_thw")

    def image_features(self, batch: Mapping[str, torch.Tensor]):
        self._check(batch)
        if batch.get("pixel_values") is None:
            return None
        return self.model.model.get_image_features(
            batch["pixel_values"], batch["image_grid_thw"], return_dict=True)

    def mm_token_type_ids(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if batch.get("mm_token_type_ids") is not None:
            return batch["mm_token_type_ids"]
        return (batch["input_ids"] == self.image_token_id).int()

    def position_ids(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(3, B, T) M-RoPE positions; text tokens have three equal axes, pads are 0."""
        self._check(batch)
        position_ids_3BT, _ = self.model.model.get_rope_index(
            batch["input_ids"], mm_token_type_ids=self.mm_token_type_ids(batch),
            image_grid_thw=batch.get("image_grid_thw"), attention_mask=batch.get("attention_mask"))
        return position_ids_3BT
