"""Target adapters: one small interface over a frozen HF VLM (see `base.TargetAdapter`), chosen by
the model's class, and loading a target from a local model directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers import (AutoConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaNextConfig,
                          LlavaNextForConditionalGeneration, PreTrainedModel, Qwen2_5_VLConfig,
                          Qwen2_5_VLForConditionalGeneration)

from spec_core.targets.base import (PrefillOutput, TargetAdapter, pack_visual, position_limit, position_overflow,
                                    text_position_ids)
from spec_core.targets.encode import ImageEncoder, ProcessorImageEncoder
from spec_core.targets.entropy import LayerChoice, MinEntropyLayer, searched_layers
from spec_core.targets.llava import LlavaAdapter
from spec_core.targets.llava_next import LlavaNextAdapter
from spec_core.targets.qwen2_5_vl import Qwen2_5_VLAdapter, Qwen2_5_VLImageEncoder

# config class -> (model class, adapter class)
TARGETS = {
    LlavaConfig: (LlavaForConditionalGeneration, LlavaAdapter),
    LlavaNextConfig: (LlavaNextForConditionalGeneration, LlavaNextAdapter),
    Qwen2_5_VLConfig: (Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLAdapter),
}
# config class -> image encoder (images -> model inputs without the model, `encode.ImageEncoder`)
ENCODERS = {LlavaConfig: ProcessorImageEncoder, LlavaNextConfig: ProcessorImageEncoder,
            Qwen2_5_VLConfig: Qwen2_5_VLImageEncoder}


def adapter_for(model: PreTrainedModel) -> TargetAdapter:
    """The adapter for a supported target model (exact class, not a subclass or a base model)."""
    for model_cls, adapter_cls in TARGETS.values():
        if type(model) is model_cls:
            return adapter_cls(model)
    supported = ", ".join(m.__name__ for m, _ in TARGETS.values())
    raise ValueError(f"no target adapter for {type(model).__name__}; supported: {supported}")


def target_identity(path: str | Path) -> dict:
    """What artifacts and drafters record of the target they belong to: its directory, a hash of
    its config.json, and the text model's hidden and vocabulary sizes."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"target path {str(path)!r} is not a local model directory (no config.json)")
    text = json.loads(cfg.read_text()).get("text_config", {})
    return {"target_path": str(path), "target_config_sha256": hashlib.sha256(cfg.read_bytes()).hexdigest()[:16],
            "hidden_size": text.get("hidden_size"), "vocab_size": text.get("vocab_size")}


def target_config(path: str | Path, name: str | None = None):
    """The checked config of a saved target: config.json valid JSON, naming a supported VLM class.
    ValueError (one line, naming `name`, default the directory) otherwise."""
    directory, name = Path(path), name or str(path)
    try:
        json.loads((directory / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{name}: config.json is not valid JSON ({err})") from None
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
    except (ValueError, KeyError) as err:
        raise ValueError(f"{name}: config.json names no model class transformers knows "
                         f"({(str(err).splitlines() or [''])[0]})") from None
    if type(config) not in TARGETS:
        supported = ", ".join(c.model_type for c in TARGETS)
        raise ValueError(f"{name} holds a {config.model_type!r} model, not a supported VLM target; supported: {supported}")
    return config


def load_image_encoder(directory: str | Path) -> ImageEncoder:
    """The image encoder of a saved target, chosen by its config class (never by its name)."""
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if type(config) not in ENCODERS:
        raise ValueError(f"{directory} holds a {config.model_type!r} model; no image encoder for it")
    return ENCODERS[type(config)](directory, config)


def load_target(path: str | Path, dtype: torch.dtype | None = None,
                device: str | torch.device | None = None) -> TargetAdapter:
    """Load a saved target from a local directory (never a hub id), frozen in eval mode."""
    directory = Path(path)
    if not (directory.is_dir() and (directory / "config.json").is_file()):
        raise ValueError(f"load_target needs an existing local model directory with a config.json, "
                         f"got {str(path)!r} (hub ids are not resolved)")
    config = target_config(directory)
    model_cls, adapter_cls = TARGETS[type(config)]
    model = model_cls.from_pretrained(directory, config=config, local_files_only=True, dtype=dtype)
    if device is not None:
        model = model.to(device)
    model.eval().requires_grad_(False)
    return adapter_cls(model)


__all__ = ["LayerChoice", "LlavaAdapter", "LlavaNextAdapter", "MinEntropyLayer", "PrefillOutput",
           "Qwen2_5_VLAdapter", "TARGETS", "TargetAdapter", "adapter_for", "load_image_encoder", "load_target",
           "pack_visual", "position_limit", "position_overflow", "searched_layers", "target_config", "target_identity",
           "text_position_ids"]
