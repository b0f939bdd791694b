"""The reference target VLM: a `LlavaForConditionalGeneration` (CLIP vision tower, MLP projector,
Llama decoder) sized by a frozen dataclass, with its processor.

Shapes: B batch, T text positions, P image patches (= (image_size / patch)^2), C=3 channels,
D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers import (CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                          LlavaForConditionalGeneration, LlavaProcessor, PreTrainedTokenizerFast)

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

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch) ** 2


PRESETS = {
    "tiny": VLMSize(vision_hidden=32, vision_layers=1, vision_heads=2, text_hidden=64,
                    text_layers=2, text_heads=2, text_kv_heads=2, text_intermediate=128),
    "small": VLMSize(),
}


def vlm_config(size: VLMSize, tok: PreTrainedTokenizerFast) -> LlavaConfig:
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
    return LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_seq_length=size.n_patches, vision_feature_select_strategy="default",
        vision_feature_layer=-1, projector_hidden_act="gelu", tie_word_embeddings=False,
    )


def build_vlm(size: VLMSize, tok: PreTrainedTokenizerFast, seed: int = 0) -> LlavaForConditionalGeneration:
    """A freshly initialised reference VLM (seeded)."""
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(vlm_config(size, tok))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|end|>"), tok.eos_token_id]
    model.generation_config.bos_token_id = tok.bos_token_id
    return model


def build_processor(size: VLMSize, tok: PreTrainedTokenizerFast) -> LlavaProcessor:
    """LlavaProcessor over a PIL-backed CLIP image processor (no torchvision needed)."""
    images = CLIPImageProcessorPil(
        size={"shortest_edge": size.image_size},
        crop_size={"height": size.image_size, "width": size.image_size},
        image_mean=list(CLIP_MEAN), image_std=list(CLIP_STD), do_convert_rgb=True,
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
