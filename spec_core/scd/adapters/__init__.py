"""Adapters between the Jacobi decoder and HF image generators, chosen by the model's config class.
The reference world's generator: spec_core.scd.adapters.reference.ReferenceGenerator (not imported
here: the reference world itself imports spec_core.scd)."""

from __future__ import annotations

from torch import nn
from transformers import ChameleonConfig, Emu3Config, JanusConfig

from spec_core.scd.adapters.base import CausalLMAdapter, ImageLayout, VisualLM
from spec_core.scd.adapters.chameleon import ChameleonAdapter
from spec_core.scd.adapters.emu3 import Emu3Adapter
from spec_core.scd.adapters.janus import JanusAdapter

# config class -> adapter; subclasses of a config class get its adapter (the MRO is searched)
ADAPTERS: dict[type, type[VisualLM]] = {
    JanusConfig: JanusAdapter,
    Emu3Config: Emu3Adapter,
    ChameleonConfig: ChameleonAdapter,
}


def adapter_for(model: nn.Module, **kwargs) -> VisualLM:
    """The adapter for an HF model, by its config class (never its name or path): Janus, Emu3,
    Chameleon, else `CausalLMAdapter` for any model with a causal-LM head over a `.model` stack.
    `kwargs` go to the adapter (e.g. JanusAdapter's special ids)."""
    config = getattr(model, "config", None)
    for cls in type(config).__mro__:
        if cls in ADAPTERS:
            return ADAPTERS[cls](model, **kwargs)
    has_head = hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None
    if has_head and isinstance(getattr(model, "model", None), nn.Module):
        return CausalLMAdapter(model, **kwargs)
    raise ValueError(f"no adapter for a model with config {type(config).__name__}: it is not Janus, "
                     "Emu3 or Chameleon and has no causal-LM head over a `.model` decoder")


__all__ = ["ADAPTERS", "CausalLMAdapter", "ChameleonAdapter", "Emu3Adapter", "ImageLayout", "JanusAdapter",
           "VisualLM", "adapter_for"]
