"""Evaluation of a generator on held-out prompts: prompt following, entropy, NLL, PSNR, motion."""

# Shape legend: B batch, N sampled tokens per row, C/H/W image channels/pixels.

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch
from PIL import Image

from spec_core.reference.drawing import dominant_colour
from spec_core.reference.generator.bundle import GeneratorBundle, SamplingConfig
from spec_core.reference.generator.codec import pil_to_tensor, psnr
from spec_core.reference.generator.data import (SceneSpec, heldout_prompts, image_example,
                                                largest_object_colour, video_example)
from spec_core.reference.generator.sample import decode_images, decode_videos, sample_codes
from spec_core.reference.generator.train import heldout_nll, image_batch, video_batch
from spec_core.reference.vocab import BACKGROUNDS


def _heldout_rng(seed: int, part: int) -> np.random.Generator:
    """Held-out stream, disjoint from the build streams."""
    return np.random.default_rng([seed, 9_000_001, part])


def following_rate(images: list[Image.Image], backgrounds: list[str], targets: list[str]) -> float:
    """Fraction of images whose dominant palette colour equals the target colour."""
    hits = [dominant_colour(im, bg) == t for im, bg, t in zip(images, backgrounds, targets)]
    return float(np.mean(hits)) if hits else float("nan")


def eval_image_sampling(bundle: GeneratorBundle, spec: SceneSpec, seed: int, n_prompts: int,
                        sampling: SamplingConfig, tag: str) -> dict[str, float]:
    """Prompt following and mean step entropy of images sampled with `sampling`."""
    items = heldout_prompts(seed, n_prompts, spec)
    g = torch.Generator().manual_seed(seed + 17)
    out = sample_codes(bundle, [p for p, _, _ in items], 1, False, sampling, g, batch_size=50)
    images = decode_images(bundle, out.codes_BN)
    rate = following_rate(images, [s.background for _, s, _ in items], [c for _, _, c in items])
    return {f"image_prompt_following_{tag}": rate,
            f"image_entropy_{tag}": float(out.entropy_BN.mean())}


def object_centroids(frames: list[Image.Image], background: str) -> np.ndarray:
    """(F, 2) centroid (x, y, pixels) of non-background pixels per frame (nan if none)."""
    bg = np.array(BACKGROUNDS[background], dtype=np.float32)
    out = []
    for f in frames:
        arr = np.asarray(f.convert("RGB"), dtype=np.float32)
        ys, xs = np.nonzero(np.sqrt(((arr - bg) ** 2).sum(-1)) > 60.0)
        out.append([xs.mean(), ys.mean()] if xs.size else [np.nan, np.nan])
    return np.array(out)


def motion_stats(videos: list[list[Image.Image]], backgrounds: list[str]) -> dict[str, float]:
    """Mean |frame_t+1 - frame_t| (pixel units 0..1), fraction of differing consecutive pairs,
    mean centroid displacement (pixels) of non-background pixels."""
    diffs, differ, moves = [], [], []
    for frames, bg in zip(videos, backgrounds):
        x_FCHW = pil_to_tensor(frames)
        d = (x_FCHW[1:] - x_FCHW[:-1]).abs().flatten(1).mean(1)
        diffs += d.tolist()
        differ += (d > 0).tolist()
        c = object_centroids(frames, bg)
        step = np.sqrt(((c[1:] - c[:-1]) ** 2).sum(-1))
        moves += [float(s) for s in step if np.isfinite(s)]
    nan = float("nan")
    return {"frame_diff": float(np.mean(diffs)) if diffs else nan,
            "frac_frames_differ": float(np.mean(differ)) if differ else nan,
            "centroid_motion_px": float(np.mean(moves)) if moves else nan}


def eval_video(bundle: GeneratorBundle, spec: SceneSpec, seed: int,
               n_videos: int) -> dict[str, float]:
    """Sample videos for held-out motion prompts; frame counts/sizes, motion, entropy."""
    rng = _heldout_rng(seed, 2)
    examples = [video_example(rng, spec) for _ in range(n_videos)]
    g = torch.Generator().manual_seed(seed + 23)
    out = sample_codes(bundle, [e[0] for e in examples], 1, True, None, g, batch_size=25)
    videos = decode_videos(bundle, out.codes_BN)
    bgs = [e[2][0].background for e in examples]
    gen = motion_stats(videos, bgs)
    data = motion_stats([e[1] for e in examples], bgs)
    follow = following_rate([v[0] for v in videos], bgs,
                            [largest_object_colour(e[2][0]) or "" for e in examples])
    res = {f"video_{k}": v for k, v in gen.items()}
    res |= {f"data_video_{k}": v for k, v in data.items()}
    return res | {"video_frames": float(np.mean([len(v) for v in videos])),
                  "video_frame_px": float(videos[0][0].size[0]),
                  "video_entropy_default": float(out.entropy_BN.mean()),
                  "video_prompt_following_default": follow}


def eval_nll_psnr(bundle: GeneratorBundle, spec: SceneSpec, seed: int,
                  n: int) -> dict[str, float]:
    """Held-out NLL per image token (image and video LMs) and codec PSNR on held-out renders."""
    res: dict[str, float] = {}
    lay, tok, codec = bundle.layout, bundle.tokenizer, bundle.codec
    rng = _heldout_rng(seed, 3)
    if bundle.image_lm is not None:
        batches = [image_batch(rng, spec, codec, tok, lay, 25, 0.0) for _ in range(-(-n // 25))]
        res["image_nll_heldout"] = heldout_nll(bundle.image_lm, batches, lay)
    if bundle.video_lm is not None:
        m = max(2, n // 8)
        batches = [video_batch(rng, spec, codec, tok, lay, 10, 0.0) for _ in range(-(-m // 10))]
        res["video_nll_heldout"] = heldout_nll(bundle.video_lm, batches, lay)
    images = pil_to_tensor([image_example(rng, spec)[1] for _ in range(n)])
    frames = pil_to_tensor([f for _ in range(max(1, n // 8)) for f in video_example(rng, spec)[1]])
    return res | {"codec_psnr_image": psnr(codec, images), "codec_psnr_video": psnr(codec, frames)}


def _image_sampling_metrics(bundle: GeneratorBundle, spec: SceneSpec, seed: int, n_prompts: int,
                            cfg_scale: float) -> dict[str, float]:
    """Default sampling, then the same with CFG at cfg_scale and without CFG (reusing runs)."""
    default = bundle.default_sampling
    res = eval_image_sampling(bundle, spec, seed, n_prompts, default, "default")
    for tag, scale in (("cfg", cfg_scale), ("nocfg", 1.0)):
        if scale == default.cfg_scale:
            res |= {k.replace("_default", f"_{tag}"): v for k, v in res.items()
                    if k.endswith("_default")}
        else:
            res |= eval_image_sampling(bundle, spec, seed, n_prompts,
                                       replace(default, cfg_scale=scale), tag)
    return res


def evaluate_bundle(bundle: GeneratorBundle, spec: SceneSpec, seed: int, n_prompts: int,
                    n_videos: int, cfg_scale: float = 3.0) -> dict[str, float]:
    """All metrics as one flat dict of floats."""
    start = time.perf_counter()
    res = eval_nll_psnr(bundle, spec, seed, n_prompts)
    if bundle.image_lm is not None:
        res |= _image_sampling_metrics(bundle, spec, seed, n_prompts, cfg_scale)
    if bundle.video_lm is not None:
        res |= eval_video(bundle, spec, seed, n_videos)
    res["eval_cfg_scale"] = float(cfg_scale)
    res["eval_seconds"] = time.perf_counter() - start
    return res
