"""The FOVEA drafter: a feature-level drafter (EAGLE/DREAM family) with visual correction.

Input at position t: fc([embed(x_{t+1}); f_t]) where f_t is the target's final feature (or, deeper
in a draft, the drafter's own uncorrected state), then `n_blocks` decoder layers of the target's
own class and attention layout. Block 1's output is the intermediate draft state, the last block's
the draft state h; at depths <= correction_depth the LM head scores RMSNorm(h + g c) instead of h
(`VisualCorrection`), while h itself is what is fed back and what the KV cache holds.

The embedding table and LM head are frozen copies of the target's, saved with the drafter so that
a drafter directory loads on its own (its config records the target it belongs to).
Positions are the drafter's own sequence indices (1-D; M-RoPE layers get them on all three axes).

Shapes: B batch, T positions (queries), K keys (cached + new), D hidden, V vocabulary,
P memory entries, S draft states.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModel

from spec_core.fovea.config import FoveaConfig
from spec_core.fovea.correction import Correction, VisualCorrection, VisualMemory
from spec_core.fovea.visual_context import QueryCompressor, gather_ranks, image_slots
from spec_core.targets.base import additive_mask
from spec_core.targets.saved import load_state, read_acceptance, read_meta, save_acceptance, save_module

FORMAT = "fovea-drafter/1"


def text_model_classes(text_config) -> tuple[type[nn.Module], type[nn.Module]]:
    """(decoder layer class, rotary embedding class) of a text config's model, found by building
    that model on the meta device (no memory, no weights): the same classes the target runs."""
    with torch.device("meta"):
        model = AutoModel.from_config(text_config)
    return type(model.layers[0]), type(model.rotary_emb)


def _text_config_from_dict(d: dict):
    d = dict(d)
    return AutoConfig.for_model(d.pop("model_type"), **d)


class FoveaDrafter(nn.Module):
    def __init__(self, cfg: FoveaConfig, text_config, target: dict | None = None):
        super().__init__()
        self.cfg, self.target, self.text_config = cfg, dict(target or {}), text_config
        # top-1 agreement per draft step measured in training (None: untrained), saved with the
        # weights: the goodput policy's prior (`spec_core.decoding.goodput`)
        self.acceptance: tuple[float, ...] | None = None
        block_config = copy.deepcopy(text_config)
        block_config.num_hidden_layers = cfg.n_blocks
        block_config._attn_implementation = "sdpa"  # explicit 4-D masks (causal, unrolled, tree)
        layer_cls, rotary_cls = text_model_classes(block_config)
        D, V = text_config.hidden_size, text_config.vocab_size
        self.embed_tokens = nn.Embedding(V, D).requires_grad_(False)
        self.lm_head = nn.Linear(D, V, bias=False).requires_grad_(False)
        self.fc = nn.Linear(2 * D, D)
        self.layers = nn.ModuleList(layer_cls(block_config, layer_idx=i) for i in range(cfg.n_blocks))
        self.rotary = rotary_cls(config=block_config)
        self.correction = VisualCorrection(D, cfg, eps=getattr(text_config, "rms_norm_eps", 1e-6)) \
            if cfg.visual_correction else None
        # the image in the drafter's own context (visual_context.py)
        self.visual_in = nn.Linear(D, D) if cfg.visual_context == "prefix" else None
        self.compressor = QueryCompressor(D, cfg.num_queries) if cfg.visual_context == "compressed" else None

    # --- construction ---------------------------------------------------------------------------
    @classmethod
    def from_target(cls, target_model, cfg: FoveaConfig | None = None, identity: dict | None = None,
                    **config) -> FoveaDrafter:
        """A fresh (untrained) drafter for a target: an HF VLM or its `TargetAdapter`. Frozen
        copies of the target's embedding and LM head; `config` overrides FoveaConfig fields;
        `identity`: what to record of the target (e.g. `spec_core.targets.target_identity`)."""
        from spec_core.targets import TargetAdapter, adapter_for

        adapter = target_model if isinstance(target_model, TargetAdapter) else adapter_for(target_model)
        cfg = dataclasses.replace(cfg or FoveaConfig(), **config)
        text = adapter.text_config
        info = {"model_type": getattr(text, "model_type", None), "hidden_size": text.hidden_size,
                "vocab_size": text.vocab_size, "image_token_id": adapter.image_token_id, **(identity or {})}
        drafter = cls(cfg, text, info)
        drafter.embed_tokens.weight.data.copy_(adapter.embed_tokens.weight.detach().float())
        drafter.lm_head.weight.data.copy_(adapter.lm_head.weight.detach().float())
        return drafter.to(adapter.embed_tokens.weight.dtype)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def save_pretrained(self, directory: str | Path) -> None:
        """config.json + model.safetensors, self-contained: the frozen embedding and LM head
        copies are saved too, so a drafter loads without its target; acceptance.json with its
        `acceptance` figures where it has them."""
        save_module(self, directory, FORMAT, {"fovea": dataclasses.asdict(self.cfg), "target": self.target,
                                              "text_config": self.text_config.to_dict()})
        save_acceptance(directory, self.acceptance)

    @classmethod
    def from_pretrained(cls, directory: str | Path, target_model=None) -> FoveaDrafter:
        """Load a saved drafter (never unpickles). With `target_model` (HF VLM or adapter),
        check that it is a target of the sizes the drafter was trained for."""
        meta = read_meta(directory, FORMAT, "FOVEA drafter", target_model)
        drafter = cls(FoveaConfig(**meta["fovea"]), _text_config_from_dict(meta["text_config"]), meta["target"])
        drafter.acceptance = read_acceptance(directory)
        return load_state(drafter, directory, "fc.weight")

    # --- forward pieces --------------------------------------------------------------------------
    @property
    def image_token_id(self) -> int | None:
        return self.target.get("image_token_id")

    def input_states(self, input_ids_BT: torch.Tensor, feature_BTD: torch.Tensor,
                     visual_BPD: torch.Tensor | None = None, rank_BT: torch.Tensor | None = None,
                     visual_valid_BP: torch.Tensor | None = None) -> torch.Tensor:
        """fc([embed(token); feature]): the token is the one after the feature's position. Its
        embedding is the target's input embedding: the embedding row for text, and for an image
        placeholder the projected visual token it stands for (`visual_BPD[b, rank_BT[b, t]]`,
        rank = which of the sample's image tokens it is; -1 or no visual: the plain row). Image
        slots read what `cfg.visual_context` says (visual_context.py)."""
        e = self.embed_tokens(input_ids_BT).to(feature_BTD.dtype)
        slots_BT = image_slots(input_ids_BT, rank_BT, self.image_token_id) if visual_BPD is not None else None
        if slots_BT is None:
            return self.fc(torch.cat([e, feature_BTD], dim=-1))
        mode = self.cfg.visual_context
        v_BTD = gather_ranks(visual_BPD.to(e.dtype), rank_BT)
        if mode == "fused":
            e = torch.where(slots_BT[..., None], v_BTD, e)
        x = self.fc(torch.cat([e, feature_BTD], dim=-1))
        if mode == "prefix":
            return torch.where(slots_BT[..., None], self.visual_in(v_BTD), x)
        if mode == "compressed":
            summary_BTD = gather_ranks(self.compressor(visual_BPD, visual_valid_BP).to(x.dtype), rank_BT)
            return torch.where(slots_BT[..., None], summary_BTD, x)
        return x

    def context_keep(self, input_ids_BT: torch.Tensor, rank_BT: torch.Tensor) -> torch.Tensor | None:
        """(B, T) bool: positions later queries may attend to (None: all). Compressed context masks
        the image slots past the summaries."""
        if self.compressor is None:
            return None
        slots_BT = image_slots(input_ids_BT, rank_BT, self.image_token_id)
        if slots_BT is None:
            return None
        return ~(slots_BT & (rank_BT >= self.cfg.num_queries))

    def blocks(self, x_BTD: torch.Tensor, position_ids_BT: torch.Tensor, attend_BTK: torch.Tensor | None,
               cache=None, *, mask: torch.Tensor | None = None,
               pos_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the decoder blocks. attend_BTK (bool) says which of the K = cached + T keys each
        query sees. With a cache (a transformers Cache) the new keys/values are appended to it.
        A caller that runs many small forwards (drafting depth by depth) may pass what it built
        once instead: `mask`, the additive mask (B, 1, T, K) in place of attend_BTK, and
        `pos_emb`, the rotary (cos, sin) of position_ids_BT.
        Returns (last block output h, first block output)."""
        mask = additive_mask(attend_BTK, x_BTD.dtype) if mask is None else mask
        pos_emb = self.rotary(x_BTD, position_ids_BT) if pos_emb is None else pos_emb
        h, first = x_BTD, None
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=position_ids_BT, cache=cache,
                      use_cache=cache is not None, position_embeddings=pos_emb)
            first = h if first is None else first
        return h, first

    def memory(self, visual_BPD: torch.Tensor, valid_BP: torch.Tensor) -> VisualMemory | None:
        """The per-image visual memory (None without visual correction)."""
        if self.correction is None:
            return None
        return self.correction.memory(visual_BPD.to(self.fc.weight.dtype), valid_BP)

    def correct(self, h_BSD: torch.Tensor, depth_BS: torch.Tensor, mem: VisualMemory | None,
                correction_depth: int | None = None) -> Correction:
        """The state the LM head scores (corrected at depths <= correction_depth; None: the
        trained config's)."""
        if self.correction is None or mem is None:
            return Correction(h_BSD, torch.zeros_like(depth_BS), torch.ones_like(h_BSD[..., 0]))
        return self.correction(h_BSD, depth_BS, mem, correction_depth)

    def logits(self, hidden_BSD: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_BSD.to(self.lm_head.weight.dtype))
