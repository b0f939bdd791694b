"""One entry point: build (codec + image LM + video LM), evaluate and load the tiny generator."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spec_core.reference.generator.bundle import (IMAGE_LM, VIDEO_LM, GeneratorBundle, SamplingConfig,
                                                  load_generator, save_assets, save_model_dir,
                                                  write_json)
from spec_core.reference.generator.codec import PatchCodec, fit_codec, pil_to_tensor, psnr
from spec_core.reference.generator.data import SceneSpec, image_example, video_example
from spec_core.reference.generator.evaluate import evaluate_bundle
from spec_core.reference.generator.layout import (GeneratorLayout, build_tokenizer, image_template,
                                                  make_layout, video_template)
from spec_core.reference.generator.train import (Batch, LMSpec, image_batch,
                                                 init_code_embeddings, make_llama_config,
                                                 new_model, train_lm, video_batch)

__all__ = ["GeneratorBuildConfig", "build_generator", "evaluate_generator", "load_generator"]


@dataclass(frozen=True)
class GeneratorBuildConfig:
    """Everything a generator build depends on; `preset("tiny" | "small")`."""

    name: str = "small"
    seed: int = 0
    scene: SceneSpec = field(default_factory=SceneSpec)
    codebook_size: int = 512
    patch: int = 2
    codec_images: int = 400
    codec_iters: int = 10
    codec_max_patches: int = 65536
    image_lm: LMSpec = field(default_factory=LMSpec)
    video_lm: LMSpec | None = field(default_factory=LMSpec)
    default_sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval_prompts: int = 100
    eval_videos: int = 25
    eval_cfg_scale: float = 3.0

    @classmethod
    def preset(cls, name: str) -> GeneratorBuildConfig:
        """'tiny': seconds, formats only; 'small': ~15 CPU-minutes, the quality bars."""
        if name == "tiny":
            lm = LMSpec(hidden=32, layers=1, heads=2, intermediate=64, steps=3, batch_size=2,
                        warmup=1)
            return cls(name="tiny", codec_images=16, codec_iters=2, codec_max_patches=4096,
                       image_lm=lm, video_lm=lm, eval_prompts=4, eval_videos=2)
        if name == "small":
            # Object codes weigh 50x for the first half, then 4x: with the plain loss the
            # background texture drowns the few prompt-dependent tokens (object colours never
            # bind to the prompt), see LMSpec.object_weight.
            image = LMSpec(hidden=128, layers=2, heads=2, intermediate=352, steps=3600,
                           batch_size=8, lr=3e-3, warmup=50, object_weight=50.0,
                           object_weight_until=0.5, object_weight_final=4.0)
            video = LMSpec(hidden=128, layers=2, heads=2, intermediate=352, steps=1000,
                           batch_size=4, lr=3e-3, warmup=30)
            # top-k 200 of 512 codes: with guidance at 3, k = 100 cuts the texture tail to a
            # mean entropy just under 1.5 nats (measured 1.50 vs 1.53).
            return cls(name="small", image_lm=image, video_lm=video,
                       default_sampling=SamplingConfig(top_k=200))
        raise ValueError(f"Unknown preset {name!r}; expected 'tiny' or 'small'.")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


def _rng(cfg: GeneratorBuildConfig, part: int) -> np.random.Generator:
    """Seeded stream of one build part (1 codec, 2 image LM, 3 video LM)."""
    return np.random.default_rng([cfg.seed, part])


def build_codec(cfg: GeneratorBuildConfig) -> tuple[PatchCodec, dict[str, float]]:
    """Fit the patch codebook on textured images and video frames (about 3 : 1 in patches)."""
    start = time.perf_counter()
    rng = _rng(cfg, 1)
    images = pil_to_tensor([image_example(rng, cfg.scene)[1] for _ in range(cfg.codec_images)])
    n_videos = max(1, cfg.codec_images // (3 * cfg.scene.n_frames) * 4)
    frames = pil_to_tensor([f for _ in range(n_videos) for f in video_example(rng, cfg.scene)[1]])
    g = torch.Generator().manual_seed(cfg.seed)
    codec = fit_codec([images, frames], cfg.codebook_size, cfg.patch, cfg.codec_iters,
                      cfg.codec_max_patches, g)
    return codec, {"codec_seconds": time.perf_counter() - start,
                   "codec_psnr_train_image": psnr(codec, images),
                   "codec_psnr_train_video": psnr(codec, frames)}


def _max_positions(layout: GeneratorLayout, video: bool) -> int:
    """Power-of-two position budget: longest prompt + specials + image/video body."""
    body = len(video_template(layout) if video else image_template(layout))
    return 1 << (body + 96 - 1).bit_length()  # prompt (<= ~60 words) + specials, power of two


def _config_extra(cfg: GeneratorBuildConfig, role: str) -> dict[str, Any]:
    """generator_config.json fields beyond the layout."""
    s = cfg.scene
    return {"default_sampling": cfg.default_sampling.to_dict(), "role": role,
            "image_size": s.image_size, "frame_size": s.frame_size, "patch": cfg.patch,
            "texture": s.texture, "build": cfg.to_dict()}


def build_lm(cfg: GeneratorBuildConfig, video: bool, codec: PatchCodec, tokenizer: Any,
             layout: GeneratorLayout, progress: bool) -> tuple[Any, dict[str, float]]:
    """Train one LM (image or video) from scratch on its on-the-fly data stream."""
    spec = cfg.video_lm if video else cfg.image_lm
    assert spec is not None
    part = 3 if video else 2
    model = new_model(make_llama_config(layout, spec, _max_positions(layout, video)),
                      cfg.seed + part)
    if spec.code_embedding_init:
        init_code_embeddings(model, codec, layout, tokenizer, cfg.seed + part)
    rng = _rng(cfg, part)

    def batch_fn(step: int) -> Batch:
        """Next training batch (the step is unused: data are an infinite seeded stream)."""
        if video:
            return video_batch(rng, cfg.scene, codec, tokenizer, layout, spec.batch_size,
                               spec.prompt_dropout)
        return image_batch(rng, cfg.scene, codec, tokenizer, layout, spec.batch_size,
                           spec.prompt_dropout, spec.noise_draws)

    stats = train_lm(model, batch_fn, spec, layout, progress, "video_lm" if video else "image_lm")
    tag = "video_lm" if video else "image_lm"
    return model, {f"{tag}_{k}": v for k, v in stats.items()}


def build_generator(cfg: GeneratorBuildConfig, out_dir: str | Path,
                    progress: bool = True) -> dict[str, float]:
    """Train codec, image LM and video LM; save everything under out_dir; return metrics."""
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    codec, metrics = build_codec(cfg)
    tokenizer = build_tokenizer(cfg.codebook_size)
    s = cfg.scene
    layout = make_layout(tokenizer, cfg.codebook_size, codec.grid_hw(s.image_size, s.image_size),
                         s.n_frames, codec.grid_hw(s.frame_size, s.frame_size))
    save_assets(out, tokenizer, layout, codec, _config_extra(cfg, "build"))
    image_lm, m = build_lm(cfg, False, codec, tokenizer, layout, progress)
    metrics |= m
    save_model_dir(out / IMAGE_LM, image_lm, tokenizer, layout, codec, _config_extra(cfg, "image"))
    if cfg.video_lm is not None:
        video_lm, m = build_lm(cfg, True, codec, tokenizer, layout, progress)
        metrics |= m
        save_model_dir(out / VIDEO_LM, video_lm, tokenizer, layout, codec,
                       _config_extra(cfg, "video"))
    metrics["total_seconds"] = time.perf_counter() - start
    metrics["vocab_size"] = float(layout.vocab_size)
    write_json(out / "build_metrics.json", metrics)
    return metrics


def evaluate_generator(out_dir: str | Path, cfg: GeneratorBuildConfig) -> dict[str, float]:
    """Load from out_dir and evaluate on held-out prompts (flat dict of floats)."""
    bundle: GeneratorBundle = load_generator(out_dir)
    metrics = evaluate_bundle(bundle, cfg.scene, cfg.seed, cfg.eval_prompts, cfg.eval_videos,
                              cfg.eval_cfg_scale)
    write_json(Path(out_dir) / "eval_metrics.json", metrics)
    return metrics
