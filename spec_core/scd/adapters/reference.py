"""The reference world's image / video generator (a LlamaForCausalLM over words + image codes,
with a k-means patch codec) behind the Jacobi decoder."""

from __future__ import annotations

import torch
from PIL import Image

from spec_core.reference.generator.bundle import GeneratorBundle
from spec_core.reference.generator.layout import (SAMPLE, encode_prompt, image_template,
                                                  video_template)
from spec_core.reference.generator.sample import decode_images, decode_videos, prefix_rows
from spec_core.scd.adapters.base import CausalLMAdapter, ImageLayout
from spec_core.targets.base import position_limit


class ReferenceGenerator(CausalLMAdapter):
    """One of the bundle's LMs (image or video). Row starts are forced tokens; only image codes
    are sampled; the body ends at the last code (the closing tokens need no sampling)."""

    def __init__(self, bundle: GeneratorBundle, video: bool = False):
        model = bundle.video_lm if video else bundle.image_lm
        if model is None:
            raise ValueError(f"this generator has no {'video' if video else 'image'} model")
        super().__init__(model)
        self.bundle, self.video = bundle, video
        template = video_template(bundle.layout) if video else image_template(bundle.layout)
        last = max(i for i, t in enumerate(template) if t == SAMPLE)
        self.template = template[:last + 1]
        self.code_mask_N = torch.tensor([t == SAMPLE for t in self.template])

    def layout(self) -> ImageLayout:
        lay = self.bundle.layout
        forced_N = torch.tensor(self.template, dtype=torch.long)  # SAMPLE is -1: free
        V = self.model.get_output_embeddings().weight.shape[0]
        shape = ((lay.n_frames, lay.frame_grid_h, lay.frame_grid_w) if self.video
                 else (lay.grid_h, lay.grid_w))
        return ImageLayout(forced_N, lay.allowed_mask(V), shape)

    def max_prompt_words(self) -> int:
        """Longest prompt (in tokens) that fits the position table with <bos>, <boi> and the body."""
        return position_limit(self.model.config) - len(self.template) - 2

    def check_prompt(self, text: str) -> str | None:
        """Why a prompt cannot be generated from (None if it can)."""
        if not text or not text.strip():
            return "empty prompt"
        ids = encode_prompt(self.bundle.tokenizer, text)
        if self.bundle.layout.unk in ids:
            unknown = [w for w in text.split()
                       if self.bundle.layout.unk in encode_prompt(self.bundle.tokenizer, w)]
            return f"unknown words {unknown[:5]} (not in the generator's vocabulary)"
        if len(ids) > self.max_prompt_words():
            return (f"prompt of {len(ids)} tokens exceeds the limit of {self.max_prompt_words()} (a position table "
                    f"of {position_limit(self.model.config)} less <bos>, <boi> and {len(self.template)} body tokens)")
        return None

    def prompts(self, texts: list[str], cfg: bool) -> tuple[list[list[int]], list[list[int]] | None]:
        """Conditional prefixes and (with CFG) the empty-prompt unconditional ones."""
        rows = prefix_rows(self.bundle.tokenizer, self.bundle.layout, texts, self.video, cfg)
        n = len(texts)
        return rows[:n], (rows[n:] if cfg else None)

    def codes(self, tokens_BN: torch.Tensor) -> torch.Tensor:
        """Body tokens -> image codes (B, codes) 0..K-1."""
        return tokens_BN[:, self.code_mask_N] - self.bundle.layout.image_offset

    def decode(self, tokens_BN: torch.Tensor) -> list[Image.Image] | list[list[Image.Image]]:
        """Body tokens -> PIL images, or lists of frames for video."""
        codes = self.codes(tokens_BN)
        return decode_videos(self.bundle, codes) if self.video else decode_images(self.bundle, codes)
