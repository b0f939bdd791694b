"""Chameleon / Lumina-mGPT image-token generation (`ChameleonForConditionalGeneration`).

Chameleon's image tokens live in its LM vocabulary under names `IMGIMG<digits as letters A-J>Z`
(HF's `ChameleonImageVocabularyMapping`). HF's forward sets the logits of every image token to the
dtype's minimum (HF supports text generation only), so the adapter runs the base `ChameleonModel`
and `lm_head` itself (`CausalLMAdapter.logits`: `model.model` is the decoder stack with the final
norm, `get_output_embeddings()` is `lm_head`). HF ships the VQ encoder only, so `decode` returns
codebook indices and makes pixels only with a decoder the caller supplies.

The prompt is BOS + text + BOI (`<racm3:break>`, ChameleonProcessor's image start); the
unconditional row is BOS + BOI. The body is `n_tokens` image tokens with no structural tokens
(Chameleon's 32 x 32 = 1024 codes per 512 px image).

Shapes: B rows, N image tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from spec_core.scd.adapters.base import CausalLMAdapter, ImageLayout

BOI, EOI = "<racm3:break>", "<eoss>"


class ChameleonAdapter(CausalLMAdapter):
    """Wraps a `ChameleonForConditionalGeneration`; image ids from `config.vocabulary_map`."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        vocab = model.config.vocabulary_map or {}
        if BOI not in vocab:
            raise ValueError(f"Chameleon vocabulary_map lacks the begin-of-image token {BOI!r}")
        self.bos_token_id = model.config.bos_token_id
        self.boi_token_id, self.eoi_token_id = vocab[BOI], vocab.get(EOI)
        mapping = model.model.vocabulary_mapping
        if not mapping.image_tokens:
            raise ValueError("Chameleon vocabulary_map has no 'IMGIMG...' image tokens")
        self.image_token_ids = torch.tensor(mapping.image_tokens, dtype=torch.long)  # sorted BPE ids
        # BPE id -> codebook index, -1 for every non-image id
        self._bpe2img_V = torch.full((self.vocab_size,), -1, dtype=torch.long)
        for bpe, code in mapping.bpe2img.items():
            self._bpe2img_V[bpe] = code

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().out_features

    def layout(self, n_tokens: int) -> ImageLayout:
        """`n_tokens` free positions, image tokens allowed; shape (n_tokens,)."""
        if n_tokens < 1:
            raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
        allowed_V = torch.zeros(self.vocab_size, dtype=torch.bool)
        allowed_V[self.image_token_ids] = True
        return ImageLayout(forced_N=torch.full((n_tokens,), -1, dtype=torch.long), allowed_V=allowed_V,
                           shape=(n_tokens,))

    def prompts(self, text_ids: list[int]) -> tuple[list[int], list[int]]:
        """Tokenised prompt (a leading BOS is kept, not doubled) -> (BOS + text + BOI, BOS + BOI)."""
        text = list(text_ids)
        if text[:1] == [self.bos_token_id]:
            text = text[1:]
        return [self.bos_token_id] + text + [self.boi_token_id], [self.bos_token_id, self.boi_token_id]

    def codes(self, tokens_BN: torch.Tensor) -> torch.Tensor:
        """Image-token BPE ids (B, N) -> VQ codebook indices (B, N)."""
        table = self._bpe2img_V.to(tokens_BN.device)
        if bool(((tokens_BN < 0) | (tokens_BN >= len(table))).any()):
            raise ValueError("token ids outside the vocabulary")
        codes_BN = table[tokens_BN]
        if bool((codes_BN < 0).any()):
            raise ValueError("decode got ids that are not image tokens")
        return codes_BN

    def decode(self, tokens_BN: torch.Tensor, decoder: Callable[[torch.Tensor], object] | None = None):
        """Image tokens (B, N) -> codebook indices (B, N), or `decoder(indices)` when given (e.g. a
        VQ-GAN decoder returning pixels or images)."""
        codes_BN = self.codes(tokens_BN)
        return codes_BN if decoder is None else decoder(codes_BN)
