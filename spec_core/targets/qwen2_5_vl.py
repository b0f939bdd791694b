"""`Qwen2_5_VLForConditionalGeneration`: native-resolution images merged 2x2 into visual tokens,
and 3-axis M-RoPE positions (temporal, height, width) from `get_rope_index`.

Batch: `pixel_values` (sum of t*h*w patches, C*temporal_patch*patch*patch) and `image_grid_thw`
(num_images, 3) as Qwen's processor makes them; `mm_token_type_ids` (B, T) (0 text, 1 image) is
derived from `input_ids` when absent. HF silently falls back to 1-D positions without it, so the
adapter always computes the 3-axis positions itself and passes them explicitly (which also keeps
the model's stateful `rope_deltas` out of the way). Videos are not supported yet.

`Qwen2_5_VLImageEncoder` builds those inputs on CPU without `Qwen2_5_VLProcessor`, which cannot
be built without torchvision (its video half): the saved image processor (AutoImageProcessor
picks the PIL backend) gives pixel_values and image_grid_thw, and each image takes t*h*w / merge^2
`<|image_pad|>` tokens between vision start / end, as the processor would expand it.

Shapes: B batch, T positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import PreTrainedConfig

from spec_core.targets.base import TargetAdapter
from spec_core.targets.encode import ImageInputs


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


class Qwen2_5_VLImageEncoder:
    """Images -> Qwen2.5-VL image inputs and placeholder counts, from a saved target directory
    (tokenizer + preprocessor_config.json); the `encode.ImageEncoder` of Qwen2.5-VL targets."""

    def __init__(self, directory: str | Path, config: PreTrainedConfig):
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.image_processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True)
        self.image_token_id = config.image_token_id
        self.merge = config.vision_config.spatial_merge_size
        vision = config.vision_config
        saved = (self.image_processor.patch_size, self.image_processor.merge_size,
                 self.image_processor.temporal_patch_size)
        tower = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
        if saved != tower:
            raise ValueError(f"{directory}: image processor patch/merge/temporal sizes {saved} differ from the "
                             f"vision tower's {tower}")
        # one image in a turn, as Qwen's chat template renders an image item
        self.image_text = "".join(self.tokenizer.convert_ids_to_tokens(
            [config.vision_start_token_id, config.image_token_id, config.vision_end_token_id]))

    def __call__(self, images: list) -> ImageInputs:
        arrays = self.image_processor(images, return_tensors="np")
        grid_thw = arrays["image_grid_thw"]  # (images, 3) patches before the merge
        counts = (grid_thw.prod(-1) // self.merge**2).tolist()
        return ImageInputs({"pixel_values": arrays["pixel_values"], "image_grid_thw": grid_thw}, counts)

    def token_inputs(self, input_ids_BT: torch.Tensor) -> dict[str, torch.Tensor]:
        """`generate` needs mm_token_type_ids for 3-axis positions (else HF silently uses 1-D)."""
        return {"mm_token_type_ids": (input_ids_BT == self.image_token_id).int()}
