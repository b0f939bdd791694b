"""What the Jacobi decoder needs from a visual-token generator, and the plain causal-LM adapter.

The decoder samples ids from the vocabulary of the adapter's logits (the "sampled vocabulary"):
for most models that is the whole LM vocabulary with image tokens allowed by a mask; for Janus it
is the separate image-generation codebook. Prompts are in the model's text vocabulary.

Shapes: B rows (CFG doubles them: conditional rows then unconditional rows), T prompt tokens,
S window tokens, K keys read from the cache, D hidden, V sampled vocabulary.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from torch import nn

from spec_core.targets.base import additive_mask


@dataclass(frozen=True)
class ImageLayout:
    """The token body a generator emits for one image or video.

    `forced_N[i]` is the id the model must emit at new position i (an end-of-line, end-of-frame or
    end-of-image token), or -1 where it samples freely among `allowed_V`. Positions are counted from
    the first new token. `shape` is what the adapter's `decode` needs (e.g. (frames, h, w))."""

    forced_N: torch.Tensor
    allowed_V: torch.Tensor | None = None
    shape: tuple[int, ...] = field(default_factory=tuple)

    @property
    def length(self) -> int:
        return int(self.forced_N.shape[0])


class VisualLM(nn.Module, ABC):
    """Adapter interface. Subclasses wrap an HF model without copying it."""

    @property
    @abstractmethod
    def num_layers(self) -> int:
        """Attention layers (the RaggedCache has one entry per layer)."""

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @abstractmethod
    def embed_prompt(self, ids_BT: torch.Tensor) -> torch.Tensor:
        """Prompt ids (text vocabulary) -> input embeddings (B, T, D)."""

    @abstractmethod
    def embed_sampled(self, ids_BS: torch.Tensor) -> torch.Tensor:
        """Sampled ids (the logits' vocabulary) -> input embeddings (B, S, D)."""

    @abstractmethod
    def logits(self, embeds_BSD: torch.Tensor, position_ids_BS: torch.Tensor,
               attend_BSK: torch.Tensor, cache, vocab_P: torch.Tensor | None = None, head=None) -> torch.Tensor:
        """One cached forward -> float logits over the sampled vocabulary (B, S, V), or only over
        the ids vocab_P (B, S, P). `attend_BSK` says which of the K cached + new keys each query
        sees; `cache` is a RaggedCache; `head`: what `head_rows(vocab_P)` gave (None: computed)."""

    def head_rows(self, vocab_P: torch.Tensor | None):
        """What `logits` needs to score the ids vocab_P alone, computed once per decoder run
        (eager: a compiled forward takes it as an argument); None where there is nothing to keep."""
        return None


class CausalLMAdapter(VisualLM):
    """Any HF causal LM (`LlamaForCausalLM`, Emu3's and Chameleon's text models, ...): one
    vocabulary for prompts and samples; the base model runs with an explicit 4-D mask."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @property
    def num_layers(self) -> int:
        cfg = self.model.config
        return getattr(cfg, "text_config", cfg).num_hidden_layers

    def embed_prompt(self, ids_BT: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids_BT)

    def embed_sampled(self, ids_BS: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids_BS)

    def base(self) -> nn.Module:
        """The decoder stack (returns last_hidden_state) under the LM head."""
        return self.model.model

    def head_rows(self, vocab_P: torch.Tensor | None):
        """The LM head's rows (weight, bias) of the ids vocab_P: an image-token head is a fraction
        of a big vocabulary."""
        if vocab_P is None:
            return None
        head = self.model.get_output_embeddings()
        return head.weight[vocab_P], None if getattr(head, "bias", None) is None else head.bias[vocab_P]

    def logits(self, embeds_BSD, position_ids_BS, attend_BSK, cache, vocab_P=None, head=None) -> torch.Tensor:
        out = self.base()(inputs_embeds=embeds_BSD, attention_mask=additive_mask(attend_BSK, embeds_BSD.dtype),
                          position_ids=position_ids_BS, cache=cache, use_cache=True)
        if vocab_P is None:
            return self.model.get_output_embeddings()(out.last_hidden_state).float()
        return nn.functional.linear(out.last_hidden_state, *(head or self.head_rows(vocab_P))).float()
