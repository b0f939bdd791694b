"""Janus / Janus-Pro image generation (`JanusForConditionalGeneration`) as a `VisualLM`.

Janus generates an image as `num_image_tokens` codes of its VQ codebook, row-major on a square
grid, with no structural tokens. The prompt is text (the language model's vocabulary) ending in the
begin-of-image token; each sampled code is fed back through `generation_embeddings` and
`generation_aligner` (not the text embeddings), and the next code's logits come from
`generation_head` on the language model's last hidden state (not `lm_head`). This is what HF's
`generate(generation_mode="image")` runs by hand; we call the same modules.

CFG in HF's generate: the unconditional row is the prompt with every token other than BOS and BOI
replaced by the pad token; the guided logits are uncond + s (cond - uncond) on raw logits.

Shapes: B rows, T prompt tokens, S new tokens, K keys, D hidden, V codebook size, N image tokens.
"""

from __future__ import annotations

import torch
from PIL import Image
from torch import nn

from spec_core.scd.adapters.base import ImageLayout, VisualLM
from spec_core.scd.adapters.pixels import to_pil
from spec_core.targets.base import additive_mask


def _first_set(*values):
    return next((v for v in values if v is not None), None)


class JanusAdapter(VisualLM):
    """Wraps a `JanusForConditionalGeneration`. Special ids default to the model's generation
    config (the released checkpoints set bos_token_id, pad_token_id and
    generation_kwargs["boi_token_id"] there; HF's generate reads them from the same place)."""

    def __init__(self, model: nn.Module, *, bos_token_id: int | None = None, pad_token_id: int | None = None,
                 boi_token_id: int | None = None):
        super().__init__()
        self.model = model
        gen, text = model.generation_config, model.config.text_config
        self.bos_token_id = _first_set(bos_token_id, gen.bos_token_id, text.bos_token_id)
        self.pad_token_id = _first_set(pad_token_id, gen.pad_token_id, text.pad_token_id)
        self.boi_token_id = _first_set(boi_token_id, (getattr(gen, "generation_kwargs", None) or {}).get("boi_token_id"))
        missing = [n for n in ("bos_token_id", "pad_token_id", "boi_token_id") if getattr(self, n) is None]
        if missing:
            raise ValueError(f"Janus image generation needs {missing}: pass them or set the generation config")
        # HF's generate emits vision_config.num_image_tokens codes; the VQ decoder reads them as a
        # num_patches x num_patches grid (JanusConfig sets num_patches = image_size // patch_size)
        self.grid = model.config.vq_config.num_patches
        self.num_image_tokens = model.config.vision_config.num_image_tokens
        if self.grid * self.grid != self.num_image_tokens:
            raise ValueError(f"num_image_tokens {self.num_image_tokens} is not the decoder's "
                             f"{self.grid} x {self.grid} grid")

    @property
    def num_layers(self) -> int:
        return self.model.config.text_config.num_hidden_layers

    @property
    def codebook_size(self) -> int:
        return self.model.config.vq_config.num_embeddings

    def embed_prompt(self, ids_BT: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids_BT)

    def embed_sampled(self, ids_BS: torch.Tensor) -> torch.Tensor:
        """Image codes -> generation_aligner(generation_embeddings(codes)) (B, S, D)."""
        return self.model.prepare_embeddings_for_image_generation(ids_BS)

    def logits(self, embeds_BSD, position_ids_BS, attend_BSK, cache, vocab_P=None, head=None) -> torch.Tensor:
        out = self.model.model.language_model(
            inputs_embeds=embeds_BSD, attention_mask=additive_mask(attend_BSK, embeds_BSD.dtype),
            position_ids=position_ids_BS, cache=cache, use_cache=True)
        logits = self.model.model.generation_head(out.last_hidden_state).float()
        return logits if vocab_P is None else logits[..., vocab_P]

    def layout(self) -> ImageLayout:
        """All `num_image_tokens` codes are free; any code is allowed; shape (grid, grid)."""
        return ImageLayout(forced_N=torch.full((self.num_image_tokens,), -1, dtype=torch.long),
                           allowed_V=None, shape=(self.grid, self.grid))

    def prompts(self, text_ids: list[int]) -> tuple[list[int], list[int]]:
        """Tokenised prompt (chat template applied, with or without a leading BOS) ->
        (cond, uncond): BOS + text + BOI as JanusProcessor(generation_mode="image") builds it, and
        the same with every token other than BOS and BOI replaced by pad, as HF's generate does."""
        text = list(text_ids)
        cond = (text if text[:1] == [self.bos_token_id] else [self.bos_token_id] + text) + [self.boi_token_id]
        keep = (self.bos_token_id, self.boi_token_id)
        uncond = [t if t in keep else self.pad_token_id for t in cond]
        return cond, uncond

    @torch.no_grad()
    def decode_pixels(self, tokens_BN: torch.Tensor) -> torch.Tensor:
        """Codes (B, N) -> pixels (B, 3, H, W) in [-1, 1] via the VQ decoder."""
        if tokens_BN.shape[-1] != self.num_image_tokens:
            raise ValueError(f"expected {self.num_image_tokens} codes per image, got {tokens_BN.shape[-1]}")
        pixels_BHWC = self.model.decode_image_tokens(tokens_BN.to(self.device))
        return pixels_BHWC.permute(0, 3, 1, 2)  # (B, H, W, C) -> (B, C, H, W)

    def decode(self, tokens_BN: torch.Tensor, image_processor=None) -> list[Image.Image]:
        """Codes (B, N) -> B PIL images (see pixels.to_pil for the [-1, 1] -> uint8 conversion)."""
        return to_pil(self.decode_pixels(tokens_BN), image_processor)
