"""One vocabulary for prompt words, specials and image codes; the generator's sequence layout."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from spec_core.reference.vocab import (BACKGROUND_NAMES, CELL_NAMES, CELL_PHRASES, COLOUR_NAMES,
                                       MAX_BARS, MIN_BARS, ROW_NAMES, SHAPES, SIZES, WORDS)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
BOI, EOI, BOV, EOV, EOF = "<boi>", "<eoi>", "<bov>", "<eov>", "<eof>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS, UNK, BOI, EOI, BOV, EOV, EOF)
GENERATOR_CONFIG = "generator_config.json"
SAMPLE = -1  # in a generation template: "sample an image token here"

# Glue words of describe_for_generation / describe_motion (see scenes.py).
_GLUE = ("a and nothing with sign saying across the on background bar chart bars moving from "
         "right left up down")


def prompt_words() -> list[str]:
    """Every word/punctuation token a generation prompt can contain, sorted."""
    texts = list(COLOUR_NAMES) + list(BACKGROUND_NAMES) + list(SHAPES) + list(SIZES)
    texts += list(CELL_PHRASES) + list(CELL_NAMES) + list(ROW_NAMES) + list(WORDS) + [_GLUE]
    texts += [str(n) for n in range(MIN_BARS, MAX_BARS + 1)]
    return sorted({w for t in texts for w in t.split()} | {","})


def image_token(code: int) -> str:
    """Token string of image code `code`."""
    return f"<img_{code}>"


@dataclass(frozen=True)
class GeneratorLayout:
    """Token ids and image geometry shared by tokenizer, models, sampler and the SCD engine."""

    image_offset: int
    codebook_size: int
    grid_h: int
    grid_w: int
    n_frames: int
    frame_grid_h: int
    frame_grid_w: int
    pad: int
    bos: int
    eos: int
    unk: int
    boi: int
    eoi: int
    bov: int
    eov: int
    eof: int

    @property
    def vocab_size(self) -> int:
        """Total vocabulary (words + specials + image codes)."""
        return self.image_offset + self.codebook_size

    @property
    def image_token_range(self) -> tuple[int, int]:
        """Half-open id range [lo, hi) of image-code tokens."""
        return self.image_offset, self.image_offset + self.codebook_size

    @property
    def image_tokens(self) -> int:
        """Image tokens per image (grid_h * grid_w)."""
        return self.grid_h * self.grid_w

    @property
    def frame_tokens(self) -> int:
        """Image tokens per video frame."""
        return self.frame_grid_h * self.frame_grid_w

    def allowed_mask(self, vocab_size: int | None = None) -> torch.Tensor:
        """Bool mask_V, True exactly on image-code tokens (SCD's structural mask)."""
        v = self.vocab_size if vocab_size is None else vocab_size
        mask_V = torch.zeros(v, dtype=torch.bool)
        lo, hi = self.image_token_range
        mask_V[lo:hi] = True
        return mask_V

    def to_dict(self) -> dict[str, Any]:
        """Fields plus the derived vocab_size and image_token_range."""
        return asdict(self) | {"vocab_size": self.vocab_size,
                               "image_token_range": list(self.image_token_range)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GeneratorLayout":
        """Inverse of `to_dict` (extra keys ignored)."""
        return cls(**{f.name: int(d[f.name]) for f in fields(cls)})


def build_tokenizer(codebook_size: int) -> PreTrainedTokenizerFast:
    """WordLevel tokenizer: specials, prompt words, then image codes from a multiple of 8."""
    words = prompt_words()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab |= {w: len(SPECIALS) + i for i, w in enumerate(words)}
    offset = -(-len(vocab) // 8) * 8
    vocab |= {f"<unused_{i}>": i for i in range(len(vocab), offset)}
    vocab |= {image_token(c): offset + c for c in range(codebook_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_tokens([AddedToken(image_token(c), special=False, normalized=False)
                    for c in range(codebook_size)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK,
        extra_special_tokens=[BOI, EOI, BOV, EOV, EOF], padding_side="left")


def make_layout(tokenizer: PreTrainedTokenizerFast, codebook_size: int, grid_hw: tuple[int, int],
                n_frames: int, frame_grid_hw: tuple[int, int]) -> GeneratorLayout:
    """Layout read off a tokenizer built by `build_tokenizer`."""
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in SPECIALS}
    offset = tokenizer.convert_tokens_to_ids(image_token(0))
    last = tokenizer.convert_tokens_to_ids(image_token(codebook_size - 1))
    if last != offset + codebook_size - 1:
        raise ValueError("Image tokens are not contiguous in this tokenizer.")
    return GeneratorLayout(offset, codebook_size, grid_hw[0], grid_hw[1], n_frames,
                           frame_grid_hw[0], frame_grid_hw[1], ids[PAD], ids[BOS], ids[EOS],
                           ids[UNK], ids[BOI], ids[EOI], ids[BOV], ids[EOV], ids[EOF])


def encode_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """Prompt words -> ids (no specials); the empty prompt gives []."""
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else []


def image_prefix(layout: GeneratorLayout, prompt_ids: list[int]) -> list[int]:
    """<bos> prompt <boi>: the context an image is generated from."""
    return [layout.bos, *prompt_ids, layout.boi]


def video_prefix(layout: GeneratorLayout, prompt_ids: list[int]) -> list[int]:
    """<bos> prompt <bov>: the context a video is generated from."""
    return [layout.bos, *prompt_ids, layout.bov]


def image_template(layout: GeneratorLayout) -> list[int]:
    """What follows the image prefix: SAMPLE per image token, then forced <eoi> <eos>."""
    return [SAMPLE] * layout.image_tokens + [layout.eoi, layout.eos]


def video_template(layout: GeneratorLayout) -> list[int]:
    """What follows the video prefix: per frame SAMPLE x frame_tokens then <eof>; <eov> <eos>."""
    frame = [SAMPLE] * layout.frame_tokens + [layout.eof]
    return frame * layout.n_frames + [layout.eov, layout.eos]


def fill_template(template: list[int], codes: list[int], offset: int) -> list[int]:
    """Put image codes (0..K-1, in order) into the SAMPLE slots of a template."""
    it = iter(codes)
    out = [offset + next(it) if t == SAMPLE else t for t in template]
    if next(it, None) is not None:
        raise ValueError("More codes than SAMPLE slots in the template.")
    return out


def image_sequence(layout: GeneratorLayout, prompt_ids: list[int], codes: list[int]) -> list[int]:
    """Full training sequence <bos> prompt <boi> codes <eoi> <eos>."""
    return image_prefix(layout, prompt_ids) + fill_template(image_template(layout), codes,
                                                            layout.image_offset)


def video_sequence(layout: GeneratorLayout, prompt_ids: list[int],
                   frame_codes: list[list[int]]) -> list[int]:
    """Full sequence <bos> prompt <bov> f0 <eof> f1 <eof> ... <eov> <eos>."""
    flat = [c for f in frame_codes for c in f]
    return video_prefix(layout, prompt_ids) + fill_template(video_template(layout), flat,
                                                            layout.image_offset)


def save_generator_config(directory: str | Path, layout: GeneratorLayout,
                          extra: dict[str, Any]) -> None:
    """Write generator_config.json: layout fields at top level + extra (default_sampling...)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    data = layout.to_dict() | extra
    (d / GENERATOR_CONFIG).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_generator_config(directory: str | Path) -> tuple[GeneratorLayout, dict[str, Any]]:
    """Read generator_config.json -> (layout, the whole dict)."""
    data = json.loads((Path(directory) / GENERATOR_CONFIG).read_text())
    return GeneratorLayout.from_dict(data), data
