"""Decoder pixels -> PIL images, the way HF's image processors post-process generated images.

Janus's and Emu3's VQ decoders output pixels in [-1, 1] (their released preprocessor configs
normalise with mean = std = 0.5). HF's `postprocess` undoes that normalisation ((x + 1) / 2),
rescales by 255, clips to [0, 255] and truncates to uint8; `to_pil` does the same arithmetic without
needing an image processor (Janus's default one needs torchvision). With `image_processor` given,
its own `postprocess` runs instead (any mean / std it was built with applies).

Shapes: B images, C channels (3), H x W pixels.
"""

from __future__ import annotations

import torch
from PIL import Image


def to_uint8(pixels_BCHW: torch.Tensor) -> torch.Tensor:
    """[-1, 1] floats -> uint8 (B, C, H, W), as HF's postprocess with mean = std = 0.5."""
    scaled = (pixels_BCHW.detach().float().cpu() + 1.0) / 2.0 * 255.0
    return scaled.clamp(0, 255).to(torch.uint8)  # truncates, like numpy's astype(uint8)


def to_pil(pixels_BCHW: torch.Tensor, image_processor=None) -> list[Image.Image]:
    """Decoder output (B, C, H, W) in [-1, 1] -> B RGB images of H x W pixels."""
    if image_processor is not None:
        out = image_processor.postprocess(list(pixels_BCHW.detach().float().cpu()),
                                          return_tensors="PIL.Image.Image")
        return list(out["pixel_values"])
    # each (C, H, W) -> (H, W, C) for PIL
    return [Image.fromarray(img.permute(1, 2, 0).numpy()) for img in to_uint8(pixels_BCHW)]
