"""The saved generator: directory layout, saving, and `load_generator` (local directories only)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from spec_core.reference.generator.codec import CODEC_CONFIG, PatchCodec
from spec_core.reference.generator.layout import (GeneratorLayout, load_generator_config,
                                                  save_generator_config)

IMAGE_LM = "image_lm"
VIDEO_LM = "video_lm"


@dataclass(frozen=True)
class SamplingConfig:
    """How the verified distribution is built: CFG scale, temperature, top-k (0 = off), top-p."""

    temperature: float = 1.0
    top_k: int = 100
    top_p: float = 1.0
    cfg_scale: float = 3.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for generator_config.json)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingConfig:
        """Inverse of `to_dict`."""
        return cls(float(d["temperature"]), int(d["top_k"]), float(d["top_p"]),
                   float(d["cfg_scale"]))


@dataclass
class GeneratorBundle:
    """Everything needed to sample: tokenizer, layout, codec, image/video LMs, default sampling."""

    tokenizer: PreTrainedTokenizerFast
    layout: GeneratorLayout
    codec: PatchCodec
    image_lm: LlamaForCausalLM | None
    video_lm: LlamaForCausalLM | None
    default_sampling: SamplingConfig
    config: dict[str, Any] = field(default_factory=dict)


def save_assets(directory: str | Path, tokenizer: PreTrainedTokenizerFast, layout: GeneratorLayout,
                codec: PatchCodec, extra: dict[str, Any]) -> None:
    """Tokenizer files + generator_config.json + codec files into one directory."""
    tokenizer.save_pretrained(str(directory))
    save_generator_config(directory, layout, extra)
    codec.save_pretrained(directory)


def save_model_dir(directory: str | Path, model: LlamaForCausalLM,
                   tokenizer: PreTrainedTokenizerFast, layout: GeneratorLayout, codec: PatchCodec,
                   extra: dict[str, Any]) -> None:
    """A self-contained model directory: HF model + tokenizer + generator_config.json + codec."""
    model.save_pretrained(str(directory))
    save_assets(directory, tokenizer, layout, codec, extra)


def _load_lm(directory: Path) -> LlamaForCausalLM | None:
    """The LM saved in `directory`, or None if there is none."""
    if not (directory / "config.json").is_file():
        return None
    model = LlamaForCausalLM.from_pretrained(str(directory), local_files_only=True)
    return model.eval()


def load_generator(directory: str | Path) -> GeneratorBundle:
    """Load a generator from a build directory (with image_lm/ and/or video_lm/) or from one
    self-contained model directory (then used as image or video LM per its config)."""
    d = Path(directory)
    if not (d / CODEC_CONFIG).is_file():
        raise FileNotFoundError(f"{d} holds no generator (no {CODEC_CONFIG}).")
    layout, cfg = load_generator_config(d)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(d), local_files_only=True)
    codec = PatchCodec.from_pretrained(d)
    image_lm, video_lm = _load_lm(d / IMAGE_LM), _load_lm(d / VIDEO_LM)
    if image_lm is None and video_lm is None:
        own = _load_lm(d)
        if cfg.get("role") == "video":
            video_lm = own
        else:
            image_lm = own
    return GeneratorBundle(tokenizer, layout, codec, image_lm, video_lm,
                           SamplingConfig.from_dict(cfg["default_sampling"]), cfg)


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Pretty, sorted JSON file."""
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
