"""Plain AR sampling: KV cache (DynamicCache), CFG in one doubled batch, mask, top-k/top-p."""

# Shape legend: B rows (prompts x samples), G = 2B with CFG (cond rows then uncond rows) else B,
# L prefix length (left-padded), V vocab, N sampled image tokens per row, F frames.

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from PIL import Image
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerFast

from spec_core.reference.generator.bundle import GeneratorBundle, SamplingConfig
from spec_core.reference.generator.layout import (SAMPLE, GeneratorLayout, encode_prompt,
                                                  image_prefix, image_template, video_prefix,
                                                  video_template)
from spec_core.sampling import entropy_nats, processed_probs
from spec_core.targets.base import pad_left, text_position_ids


def prefix_rows(tokenizer: PreTrainedTokenizerFast, layout: GeneratorLayout, prompts: list[str],
                video: bool, cfg: bool) -> list[list[int]]:
    """Prefix ids per row: conditional rows, then (with cfg) the empty-prompt rows."""
    make = video_prefix if video else image_prefix
    rows = [make(layout, encode_prompt(tokenizer, p)) for p in prompts]
    return rows + [make(layout, []) for _ in prompts] if cfg else rows


@dataclass
class SampleOutput:
    """Sampled image codes (0..K-1) per row and the entropy of each step's distribution."""

    codes_BN: torch.Tensor
    entropy_BN: torch.Tensor = field(default_factory=lambda: torch.empty(0))


def _step_probs(logits_GV: torch.Tensor, n: int, sampling: SamplingConfig,
                allowed_V: torch.Tensor) -> torch.Tensor:
    """processed_probs for one step of a (possibly CFG-doubled) batch of n conditional rows."""
    cfg = sampling.cfg_scale != 1.0
    uncond = logits_GV[n:] if cfg else None
    return processed_probs(logits_GV[:n], uncond, sampling.cfg_scale, sampling.temperature,
                           sampling.top_k, sampling.top_p, allowed_V)


@torch.no_grad()
def sample_tokens(model: PreTrainedModel, rows: list[list[int]], template: list[int],
                  layout: GeneratorLayout, sampling: SamplingConfig,
                  generator: torch.Generator) -> SampleOutput:
    """AR-sample the SAMPLE slots of `template` after each prefix row with a DynamicCache; every
    other slot (<row_r>, <eof>, ...) is a structural token, fed as is in every row and never
    sampled, so codes and entropies cover the code slots only (layout's code_positions).
    With cfg_scale != 1, `rows` holds B conditional then B unconditional prefixes."""
    cfg = sampling.cfg_scale != 1.0
    n = len(rows) // 2 if cfg else len(rows)
    ids_GL, mask_GL = pad_left(rows, layout.pad)
    pos_G1 = text_position_ids(mask_GL)[:, -1:]
    cache = DynamicCache()
    out = model(input_ids=ids_GL, attention_mask=mask_GL, position_ids=text_position_ids(mask_GL),
                cache=cache, use_cache=True, logits_to_keep=1)
    allowed_V = layout.allowed_mask(out.logits.shape[-1])
    last_sample = max(i for i, t in enumerate(template) if t == SAMPLE)
    codes, ents = [], []
    for i, slot in enumerate(template[:last_sample + 1]):
        if slot == SAMPLE:
            probs_BV = _step_probs(out.logits[:, -1], n, sampling, allowed_V)
            tok_B = torch.multinomial(probs_BV, 1, generator=generator).squeeze(1)
            codes.append(tok_B - layout.image_offset)
            ents.append(entropy_nats(probs_BV))
        else:
            tok_B = torch.full((n,), slot, dtype=torch.long)
        if i == last_sample:
            break
        tok_G1 = (torch.cat([tok_B, tok_B]) if cfg else tok_B)[:, None]
        mask_GL = torch.cat([mask_GL, torch.ones_like(tok_G1)], dim=1)
        pos_G1 = pos_G1 + 1
        out = model(input_ids=tok_G1, attention_mask=mask_GL, position_ids=pos_G1,
                    cache=cache, use_cache=True)
    return SampleOutput(torch.stack(codes, 1), torch.stack(ents, 1))


def _resolve(bundle: GeneratorBundle, sampling: SamplingConfig | dict | None,
             generator: torch.Generator | None) -> tuple[SamplingConfig, torch.Generator]:
    """Sampling (None: bundle default; dict: overrides of it) and generator (None: seed 0)."""
    if sampling is None:
        sampling = bundle.default_sampling
    elif isinstance(sampling, dict):
        sampling = SamplingConfig.from_dict(bundle.default_sampling.to_dict() | sampling)
    return sampling, generator if generator is not None else torch.Generator().manual_seed(0)


def sample_codes(bundle: GeneratorBundle, prompts: list[str], n: int = 1, video: bool = False,
                 sampling: SamplingConfig | dict | None = None,
                 generator: torch.Generator | None = None, batch_size: int = 16) -> SampleOutput:
    """Codes (and step entropies) for n samples per prompt, prompt-major order."""
    sampling, g = _resolve(bundle, sampling, generator)
    model = bundle.video_lm if video else bundle.image_lm
    if model is None:
        raise ValueError(f"This bundle has no {'video' if video else 'image'} model.")
    template = video_template(bundle.layout) if video else image_template(bundle.layout)
    flat = [p for p in prompts for _ in range(n)]
    outs = []
    for s in range(0, len(flat), batch_size):
        chunk = flat[s:s + batch_size]
        rows = prefix_rows(bundle.tokenizer, bundle.layout, chunk, video, sampling.cfg_scale != 1.0)
        outs.append(sample_tokens(model, rows, template, bundle.layout, sampling, g))
    return SampleOutput(torch.cat([o.codes_BN for o in outs]),
                        torch.cat([o.entropy_BN for o in outs]))


def decode_images(bundle: GeneratorBundle, codes_BN: torch.Tensor) -> list[Image.Image]:
    """Image codes -> PIL images."""
    lay = bundle.layout
    return bundle.codec.decode_pil(codes_BN, (lay.grid_h, lay.grid_w))


def decode_videos(bundle: GeneratorBundle, codes_BN: torch.Tensor) -> list[list[Image.Image]]:
    """Video codes (frames concatenated) -> frames per video."""
    lay = bundle.layout
    per_frame = codes_BN.reshape(-1, lay.frame_tokens)
    frames = bundle.codec.decode_pil(per_frame, (lay.frame_grid_h, lay.frame_grid_w))
    return [frames[i:i + lay.n_frames] for i in range(0, len(frames), lay.n_frames)]


def generate_images(bundle: GeneratorBundle, prompts: list[str], n: int = 1,
                    sampling: SamplingConfig | dict | None = None,
                    generator: torch.Generator | None = None,
                    batch_size: int = 16) -> list[Image.Image]:
    """n images per prompt (prompt-major), sampled with `sampling` (default: the bundle's)."""
    out = sample_codes(bundle, prompts, n, False, sampling, generator, batch_size)
    return decode_images(bundle, out.codes_BN)


def generate_video(bundle: GeneratorBundle, prompts: list[str], n: int = 1,
                   sampling: SamplingConfig | dict | None = None,
                   generator: torch.Generator | None = None,
                   batch_size: int = 8) -> list[list[Image.Image]]:
    """n videos per prompt (prompt-major), each a list of n_frames PIL frames."""
    out = sample_codes(bundle, prompts, n, True, sampling, generator, batch_size)
    return decode_videos(bundle, out.codes_BN)
