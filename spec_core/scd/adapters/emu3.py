"""Emu3 image generation (`Emu3ForConditionalGeneration`) as a `CausalLMAdapter`.

Emu3 samples its whole LM vocabulary; an image of height x width visual tokens is the body

    row 0: w visual tokens, EOL  ...  row h-1: w visual tokens, EOL,  EOF, EOI, EOS

(EOL `<|extra_200|>`, EOF `<|extra_201|>`, EOI `<|image end|>`, EOS the text EOS), exactly what the
`prefix_allowed_tokens_fn` of HF's Emu3 docs forces; `Emu3Model.decode_image_tokens` drops the last
three tokens and the EOL column of that body. The prompt is what `Emu3Processor(...,
return_for_image_generation=True)` builds: BOS + text + BOI + "{h}*{w}" + `<|image token|>`.
HF's Emu3 forward masks no logits; we run the text model and `lm_head` ourselves anyway.

Sizes are in visual tokens (pixels / 8 for the released VQ model): Emu3Processor's default
(ratio 1:1, image_area 518400) is 90 x 90.

Shapes: B rows, T prompt tokens, N body tokens, V vocabulary, h x w visual tokens.
"""

from __future__ import annotations

import torch
from PIL import Image
from torch import nn

from spec_core.scd.adapters.base import CausalLMAdapter, ImageLayout
from spec_core.scd.adapters.pixels import to_pil

EOL, EOF, IMAGE_WRAPPER = "<|extra_200|>", "<|extra_201|>", "<|image token|>"
BOI, EOI = "<|image start|>", "<|image end|>"


class Emu3Adapter(CausalLMAdapter):
    """Wraps an `Emu3ForConditionalGeneration`; special ids come from `config.vocabulary_map`
    (the tokenizer's vocabulary) and the text config's BOS / EOS."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.vocab: dict[str, int] = model.config.vocabulary_map or {}
        missing = [name for name in (EOL, EOF, BOI, EOI, IMAGE_WRAPPER) if name not in self.vocab]
        if missing:
            raise ValueError(f"Emu3 vocabulary_map lacks {missing}")
        text = model.config.text_config
        self.bos_token_id, self.eos_token_id = text.bos_token_id, text.eos_token_id
        if isinstance(self.eos_token_id, (list, tuple)):
            self.eos_token_id = self.eos_token_id[0]
        self.eol_token_id, self.eof_token_id = self.vocab[EOL], self.vocab[EOF]
        self.boi_token_id, self.eoi_token_id = self.vocab[BOI], self.vocab[EOI]
        self.image_wrapper_token_id = self.vocab[IMAGE_WRAPPER]
        self.visual_token_ids = torch.tensor(model.vocabulary_mapping.image_tokens, dtype=torch.long)
        if len(self.visual_token_ids) == 0:
            raise ValueError("Emu3 vocabulary_map has no '<|visual token...|>' entries")

    def base(self) -> nn.Module:
        return self.model.model.text_model

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().out_features

    def body_length(self, height: int, width: int) -> int:
        return height * (width + 1) + 3

    def layout(self, height: int, width: int) -> ImageLayout:
        """The body of an h x w image: EOL after each row, then EOF, EOI, EOS forced; visual tokens
        allowed elsewhere."""
        if height < 1 or width < 1:
            raise ValueError(f"an image needs at least one token per side, got {height} x {width}")
        n = self.body_length(height, width)
        forced_N = torch.full((n,), -1, dtype=torch.long)
        forced_N[width:height * (width + 1):width + 1] = self.eol_token_id  # last slot of each row
        forced_N[-3:] = torch.tensor([self.eof_token_id, self.eoi_token_id, self.eos_token_id])
        allowed_V = torch.zeros(self.vocab_size, dtype=torch.bool)
        allowed_V[self.visual_token_ids] = True
        return ImageLayout(forced_N=forced_N, allowed_V=allowed_V, shape=(height, width))

    def header_ids(self, height: int, width: int) -> list[int]:
        """BOI + "{h}*{w}" + image wrapper. The size text is looked up one character per token,
        which is how Emu3's tokenizer splits digits and '*' (pass a tokenizer's ids to `prompts`'
        `header` to override)."""
        size = f"{height}*{width}"
        unknown = sorted({c for c in size if c not in self.vocab})
        if unknown:
            raise ValueError(f"Emu3 vocabulary_map has no single-character tokens for {unknown}")
        return [self.boi_token_id] + [self.vocab[c] for c in size] + [self.image_wrapper_token_id]

    def prompts(self, text_ids: list[int], height: int, width: int, negative_ids: list[int] = (),
                header: list[int] | None = None) -> tuple[list[int], list[int]]:
        """Tokenised prompt (no special tokens needed; a leading BOS is kept, not doubled) ->
        (cond, uncond): BOS + text + header, and BOS + negative prompt + the same header. (HF's
        docs pass the negative prompt without the header; BAAI's original code, processor
        mode='G', adds it to both - we follow the original.)"""
        header = self.header_ids(height, width) if header is None else list(header)

        def with_bos(ids):
            ids = list(ids)
            return ids if ids[:1] == [self.bos_token_id] else [self.bos_token_id] + ids

        return with_bos(text_ids) + header, with_bos(negative_ids) + header

    def _body(self, tokens_BN: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """A full body (B, h (w + 1) + 3), or just the h * w visual tokens which are then laid out."""
        n, free = self.body_length(height, width), height * width
        if tokens_BN.shape[-1] == n:
            return tokens_BN
        if tokens_BN.shape[-1] != free:
            raise ValueError(f"expected {n} body tokens or {free} visual tokens, got {tokens_BN.shape[-1]}")
        forced_N = self.layout(height, width).forced_N.to(tokens_BN.device)
        body_BN = forced_N.expand(tokens_BN.shape[0], n).clone()
        body_BN[:, forced_N < 0] = tokens_BN
        return body_BN

    @torch.no_grad()
    def decode_pixels(self, tokens_BN: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Body or visual tokens -> pixels (B, 3, H, W) in [-1, 1] via Emu3's VQ decoder."""
        body_BN = self._body(tokens_BN.to(self.device), height, width)
        return self.model.model.decode_image_tokens(body_BN, height=height, width=width)

    def decode(self, tokens_BN: torch.Tensor, height: int, width: int, image_processor=None) -> list[Image.Image]:
        """Body or visual tokens -> B PIL images (see pixels.to_pil)."""
        return to_pil(self.decode_pixels(tokens_BN, height, width), image_processor)
