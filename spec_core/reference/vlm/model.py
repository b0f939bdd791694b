"""The reference target VLM: a `LlavaForConditionalGeneration` (CLIP vision tower, MLP projector,
Llama decoder) sized by a frozen dataclass, with its processor; or, for the hires world
(`anyres` > 0), a `LlavaNextForConditionalGeneration` with AnyRes tiling and its processor.

Shapes: B batch, T text positions, P image patches (= (image_size / patch)^2), V views of an
AnyRes image (base view + tiles), C=3 channels, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                          LlavaForConditionalGeneration, LlavaNextConfig, LlavaNextForConditionalGeneration,
                          LlavaNextProcessor, LlavaProcessor, PreTrainedTokenizerFast)
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

# OpenAI CLIP normalisation, as CLIPImageProcessor applies it.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VLMSize:
    """Architecture of the reference target (one field per knob, like nanoGPT's GPTConfig)."""

    image_size: int = 64        # square input images, pixels
    # CLIP patch size -> (64/16)^2 = 16 image tokens. Measured: with patch 8 (64 tokens) the
    # stage-1 tower is as good, but the decoder's answers on image words learn ~4x slower per
    # step and every step costs ~2x; 16 tokens (1-4 per grid cell) keep OCR (sign word 0.99).
    patch: int = 16
    vision_hidden: int = 128
    vision_layers: int = 2
    vision_heads: int = 4
    # On CPU a step is overhead-bound (~1 ms per layer): depth, not width, sets the target's cost
    # against a one-block drafter (h192: 10 layers ~6.9x, 8 layers ~5.1x), width sets training time.
    text_hidden: int = 192
    text_layers: int = 10
    text_heads: int = 4
    text_kv_heads: int = 4
    text_intermediate: int = 512
    max_positions: int = 768    # longest reasoning / multi-turn conversation + image tokens
    # AnyRes (LLaVA-NeXT) when > 0: grid pinpoints up to anyres x anyres views of image_size, so
    # a square image of anyres * image_size px is a base view (the whole image downscaled) plus
    # anyres^2 tiles; 0 = LLaVA-1.5, one view.
    anyres: int = 0

    @property
    def n_patches(self) -> int:
        """Visual tokens of one view."""
        return (self.image_size // self.patch) ** 2

    @property
    def n_image_tokens(self) -> int:
        """Visual tokens of one square image of the world (anyres * image_size px): the base view,
        then the tiles' patch grid with one newline token per row (LLaVA-NeXT's layout)."""
        side = self.anyres * (self.image_size // self.patch)
        return self.n_patches + side * (side + 1)

    @property
    def pinpoints(self) -> list[list[int]]:
        return [[a * self.image_size, b * self.image_size]
                for a in range(1, self.anyres + 1) for b in range(1, self.anyres + 1)]


PRESETS = {
    "tiny": VLMSize(vision_hidden=32, vision_layers=1, vision_heads=2, text_hidden=64,
                    text_layers=2, text_heads=2, text_kv_heads=2, text_intermediate=128),
    "small": VLMSize(),
    # 64 px views, patch 16, a 3x3 grid of tiles: 16 + 12 * 13 = 172 visual tokens per 192 px
    # image (the issue asks >= 144; patch 8 would give 4x more per view, and the small world
    # measured a 4x slower decoder per step on image words for 4x the tokens). 1024 positions
    # hold the longest caption / reasoning / multi-turn conversation with its 172 image tokens.
    "hires": VLMSize(anyres=3, max_positions=1024),
}
PRESETS["tiny-hires"] = VLMSize(**{**PRESETS["tiny"].__dict__, "anyres": 3, "max_positions": 1024})


def vlm_config(size: VLMSize, tok: PreTrainedTokenizerFast) -> LlavaConfig | LlavaNextConfig:
    vision = CLIPVisionConfig(
        hidden_size=size.vision_hidden, intermediate_size=4 * size.vision_hidden,
        num_hidden_layers=size.vision_layers, num_attention_heads=size.vision_heads,
        image_size=size.image_size, patch_size=size.patch, projection_dim=size.vision_hidden,
    )
    text = LlamaConfig(
        vocab_size=len(tok), hidden_size=size.text_hidden, intermediate_size=size.text_intermediate,
        num_hidden_layers=size.text_layers, num_attention_heads=size.text_heads,
        num_key_value_heads=size.text_kv_heads, max_position_embeddings=size.max_positions,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False, rope_theta=10000.0,
    )
    common = dict(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                  vision_feature_select_strategy="default", vision_feature_layer=-1,
                  projector_hidden_act="gelu", tie_word_embeddings=False)
    if size.anyres:
        return LlavaNextConfig(**common, image_grid_pinpoints=size.pinpoints, image_seq_length=size.n_patches)
    return LlavaConfig(**common, image_seq_length=size.n_patches)


def build_vlm(size: VLMSize, tok: PreTrainedTokenizerFast, seed: int = 0,
              ) -> LlavaForConditionalGeneration | LlavaNextForConditionalGeneration:
    """A freshly initialised reference VLM (seeded)."""
    torch.manual_seed(seed)
    cls = LlavaNextForConditionalGeneration if size.anyres else LlavaForConditionalGeneration
    model = cls(vlm_config(size, tok))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|end|>"), tok.eos_token_id]
    model.generation_config.bos_token_id = tok.bos_token_id
    return model


def build_processor(size: VLMSize, tok: PreTrainedTokenizerFast) -> LlavaProcessor | LlavaNextProcessor:
    """LlavaProcessor over a PIL-backed CLIP image processor (no torchvision needed); for AnyRes,
    LlavaNextProcessor over the PIL-backed LLaVA-NeXT image processor."""
    norm = dict(image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD), do_convert_rgb=True)
    if size.anyres:
        images = LlavaNextImageProcessorPil(
            size={"shortest_edge": size.image_size}, crop_size={"height": size.image_size, "width": size.image_size},
            image_grid_pinpoints=size.pinpoints, **norm)
        return LlavaNextProcessor(image_processor=images, tokenizer=tok, patch_size=size.patch,
                                  vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                  chat_template=tok.chat_template)
    images = CLIPImageProcessorPil(
        size={"shortest_edge": size.image_size},
        crop_size={"height": size.image_size, "width": size.image_size},
        **norm,
    )
    return LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=size.patch,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=tok.chat_template,
    )


def pixels(images: list[Image.Image]) -> torch.Tensor:
    """PIL images already at the model's size -> normalised pixel_values_BCHW (what the processor
    gives, without its per-image Python overhead; equality is tested)."""
    arr = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images])
    mean, std = np.asarray(CLIP_MEAN, np.float32), np.asarray(CLIP_STD, np.float32)
    return torch.from_numpy(((arr - mean) / std).transpose(0, 3, 1, 2).copy())  # (B,H,W,C) -> (B,C,H,W)


def image_inputs(processor: LlavaProcessor | LlavaNextProcessor, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    """The image side of a batch for the reference target: {pixel_values_BCHW} (LLaVA, through
    `pixels`) or {pixel_values_BVCHW, image_sizes_B2} (LLaVA-NeXT, through its image processor)."""
    if isinstance(processor, LlavaNextProcessor):
        out = processor.image_processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_sizes": out["image_sizes"]}
    return {"pixel_values": pixels(images)}
