"""One small interface over a frozen HF VLM target: prefill returning what a drafter learns from.

A batch is a mapping with the HF processor's key names: `input_ids` (image placeholders already
expanded to one token per visual feature), optional `attention_mask` (left padding), and the
model's image inputs (`pixel_values`, plus `image_sizes` for LLaVA-NeXT or `image_grid_thw` and
optionally `mm_token_type_ids` for Qwen2.5-VL).

Positions for tree verification: `prefill` returns the positions the target ran with, and
`continuation_position_ids(prefill_positions, depth_BS)` gives those of draft-tree nodes at depth
d after the prompt (the same for every adapter: 1-D, or M-RoPE text positions on three axes).
RoPE decodes past the text config's max_position_embeddings without an error (and degrades):
`position_limit` reads that table's size and `position_overflow` is the reason every job gives
when it rejects a sample before decoding or prefilling beyond it.

Shapes: B batch, T positions, P visual tokens (most in any sample), D hidden, V vocabulary,
L layers, S new (tree) tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from spec_core.targets.entropy import MinEntropyLayer


@dataclass
class PrefillOutput:
    """What one prefill gives. Values at padding positions are unspecified unless said."""

    final_hidden_BTD: torch.Tensor       # after the final norm: the LM head's input
    position_ids: torch.Tensor           # what the model used: (B, T), or (3, B, T) for M-RoPE
    visual_BPD: torch.Tensor             # projected visual tokens of each sample, in sequence order
    visual_valid_BP: torch.Tensor        # bool; P varies per sample (LLaVA-NeXT any-resolution)
    visual_pos_BP: torch.Tensor          # index into T of each visual token; 0 where not valid
    logits_BTV: torch.Tensor | None = None            # when return_logits
    hidden_states: tuple[torch.Tensor, ...] | None = None  # HF's L+1 states, when asked
    entropy_layers: tuple[int, int] | None = None     # the searched range after clamping
    chosen_layer_BT: torch.Tensor | None = None       # min-entropy layer per token; -1 at padding
    intermediate_BTD: torch.Tensor | None = None      # hidden_states[chosen] per token; 0 at padding
    entropy_LBT: torch.Tensor | None = None           # per searched layer; +inf at padding


def position_limit(config: PreTrainedConfig) -> int | None:
    """How many positions the model's text decoder has: the text config's max_position_embeddings
    (LLaVA, LLaVA-NeXT, Qwen2.5-VL: text_config's; a text-only config's own); None if it names none."""
    limit = getattr(config.get_text_config(), "max_position_embeddings", None)
    return int(limit) if limit else None


def position_overflow(prompt_tokens: int, new_tokens: int, limit: int | None) -> str | None:
    """Why a prompt plus up to `new_tokens` generated ones does not fit a position table of `limit`
    (None if it does): the reject reason. Counted in tokens: Qwen2.5-VL's M-RoPE positions are
    never larger than the token index, so the count is a (safe) upper bound there."""
    if limit is None or prompt_tokens + new_tokens <= limit:
        return None
    new = f" + {new_tokens} new" if new_tokens else ""
    return f"beyond the position table: {prompt_tokens} tokens{new} > max_position_embeddings {limit}"


def text_position_ids(attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """1-D positions that start at 0 on each sample's first real token (left padding); 0 on pads."""
    return (attention_mask_BT.long().cumsum(-1) - 1).clamp_min(0) * attention_mask_BT.long()


def additive_mask(attend_BQK: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool "query sees key" (B, Q, K) -> the additive float mask HF attention takes (B, 1, Q, K)."""
    mask = torch.zeros(attend_BQK.shape, dtype=dtype, device=attend_BQK.device)
    return mask.masked_fill(~attend_BQK, torch.finfo(dtype).min)[:, None]


def pad_left(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad for batched generation -> (input_ids_BT, attention_mask_BT)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, width - len(s):] = torch.tensor(s)
        mask[b, width - len(s):] = 1
    return ids, mask


def pack_visual(image_mask_BT: torch.Tensor, features_ND: torch.Tensor | None, hidden: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample visual tokens from all images' features concatenated in sequence order (the
    order HF's masked_scatter fills placeholders): (visual_BPD, visual_valid_BP, visual_pos_BP)."""
    counts_B = image_mask_BT.sum(-1)
    n = 0 if features_ND is None else features_ND.shape[0]
    if n != int(counts_B.sum()):
        raise ValueError(f"{int(counts_B.sum())} image tokens in input_ids but {n} visual features")
    B, P = image_mask_BT.shape[0], int(counts_B.max()) if n else 0
    valid_BP = torch.arange(P, device=image_mask_BT.device)[None] < counts_B[:, None]
    visual_BPD = torch.zeros(B, P, hidden, dtype=dtype, device=image_mask_BT.device)
    pos_BP = torch.zeros(B, P, dtype=torch.long, device=image_mask_BT.device)
    if n:
        visual_BPD[valid_BP] = features_ND.to(visual_BPD)
        pos_BP[valid_BP] = image_mask_BT.nonzero()[:, 1]  # row-major, like the features
    return visual_BPD, valid_BP, pos_BP


class TargetAdapter(ABC):
    """A frozen HF VLM seen through what speculative decoding needs. Subclasses supply the image
    encoder call, the position ids and the default entropy range; the rest is shared."""

    default_entropy_layers: tuple[int, int] = (1, 10)  # FOVEA App. C; clamped per target

    def __init__(self, model: PreTrainedModel):
        self.model = model

    # --- what a drafter copies or shares -------------------------------------------------
    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.model.model.language_model.layers

    @property
    def decoder_layer_cls(self) -> type[nn.Module]:
        return type(self.decoder_layers[0])

    @property
    def text_config(self) -> PreTrainedConfig:
        return self.model.config.text_config

    @property
    def max_positions(self) -> int | None:
        """The text decoder's position table (`position_limit`): a prompt plus its answer must fit."""
        return position_limit(self.model.config)

    @property
    def image_token_id(self) -> int:
        return self.model.config.image_token_id

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    # --- model specific ---------------------------------------------------------------------
    @abstractmethod
    def image_features(self, batch: Mapping[str, torch.Tensor]):
        """The model's `get_image_features` output (pooler_output: one (N_i, D) per image) or
        None for a text-only batch; handed back to the model as `mm_encoder_outputs`."""

    @abstractmethod
    def position_ids(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Prefill positions the model is run with: (B, T), or (3, B, T) for M-RoPE."""

    # --- shared -------------------------------------------------------------------------------
    def continuation_position_ids(self, position_ids: torch.Tensor,
                                  depth_BS: torch.Tensor) -> torch.Tensor:
        """Positions of S new tokens after the prefill, e.g. draft-tree nodes for verification;
        depth 0 is the first token after the prompt. Text after an M-RoPE prefill continues one
        past the largest position on any axis, on all three axes (HF's rope_deltas)."""
        last_B = position_ids.amax(-1)
        if position_ids.dim() == 3:
            last_B = last_B.amax(0)  # (3, B) -> (B,)
        pos_BS = last_B[:, None] + 1 + depth_BS.to(last_B)
        return pos_BS.expand(3, -1, -1) if position_ids.dim() == 3 else pos_BS

    def _inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "input_ids" not in batch:
            raise ValueError("a target batch needs input_ids")
        device = self.model.device
        out = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
        if out.get("attention_mask") is None:
            out["attention_mask"] = torch.ones_like(out["input_ids"])
        if bool((out["input_ids"] == self.image_token_id).any()) and out.get("pixel_values") is None:
            raise ValueError("input_ids hold image tokens but the batch has no pixel_values")
        return out

    @torch.no_grad()
    def prefill(self, batch: Mapping[str, torch.Tensor],
                entropy_layers: tuple[int, int] | None = None, *, return_logits: bool = False,
                output_hidden_states: bool = False, query_chunk: int = 256, cache=None) -> PrefillOutput:
        """Run the target over a batch once. With `entropy_layers` (1-based, inclusive, clamped
        to 1..num_layers-1) also pick each token's minimum-attention-entropy layer. With `cache`
        (a transformers Cache, e.g. DynamicCache) the prompt's KV entries are kept there."""
        inputs = self._inputs(batch)
        input_ids_BT, attention_mask_BT = inputs["input_ids"], inputs["attention_mask"]
        position_ids = self.position_ids(inputs)
        image_outputs = self.image_features(inputs)
        features_ND = None if image_outputs is None else torch.cat(image_outputs.pooler_output)
        visual = pack_visual(input_ids_BT == self.image_token_id, features_ND,
                             self.text_config.hidden_size, self.embed_tokens.weight.dtype)

        kwargs = dict(input_ids=input_ids_BT, attention_mask=attention_mask_BT,
                      position_ids=position_ids, use_cache=cache is not None, cache=cache,
                      output_hidden_states=output_hidden_states)
        if image_outputs is not None:  # the vision tower runs once, not again inside forward
            kwargs["mm_encoder_outputs"] = {"image": image_outputs}
        probe = (MinEntropyLayer(self.decoder_layers, entropy_layers, attention_mask_BT, query_chunk)
                 if entropy_layers is not None else nullcontext())
        with probe:
            out = self.model.model(**kwargs)

        final_hidden_BTD = out.last_hidden_state
        result = PrefillOutput(final_hidden_BTD, position_ids, *visual,
                               logits_BTV=self.lm_head(final_hidden_BTD) if return_logits else None,
                               hidden_states=out.hidden_states if output_hidden_states else None)
        if entropy_layers is not None:
            choice = probe.result()
            result.entropy_layers = (probe.first, probe.last)
            result.chosen_layer_BT = choice.chosen_layer_BT
            result.intermediate_BTD = choice.intermediate_BTD
            result.entropy_LBT = choice.entropy_LBT
        return result

    @torch.no_grad()
    def decode(self, input_ids_BS: torch.Tensor, position_ids: torch.Tensor, attend_BSK: torch.Tensor | None,
               cache) -> torch.Tensor:
        """A cached text-only forward of S new tokens per row (decoding, tree verification):
        explicit positions ((B, S), or (3, B, S) for M-RoPE, as `continuation_position_ids` gives)
        and a bool mask over the K keys each query sees (cached + new). Returns the final
        hidden states (B, S, D). attend_BSK None: one new token per row that sees every key
        (autoregressive steps of rows of one length) - no mask, the attention kernel's fast path."""
        mask = None if attend_BSK is None else additive_mask(attend_BSK, self.embed_tokens.weight.dtype)
        out = self.model.model(input_ids=input_ids_BS, attention_mask=mask, position_ids=position_ids,
                               cache=cache, use_cache=True)
        return out.last_hidden_state
