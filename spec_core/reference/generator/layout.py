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
MAX_ROWS = 32  # row-start tokens <row_0> ... <row_31>: grids up to 32 rows (64 px at patch 2)
ROWS: tuple[str, ...] = tuple(f"<row_{r}>" for r in range(MAX_ROWS))
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS, UNK, BOI, EOI, BOV, EOV, EOF, *ROWS)
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
    row0: int  # id of <row_0>; <row_r> = row0 + r starts row r of every image / frame

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

    def row_token(self, r: int) -> int:
        """Id of <row_r>, the forced token in front of row r of codes."""
        if not 0 <= r < MAX_ROWS:
            raise ValueError(f"Row {r} outside the {MAX_ROWS} row-start tokens.")
        return self.row0 + r

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
    def from_dict(cls, d: dict[str, Any]) -> GeneratorLayout:
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
        extra_special_tokens=[BOI, EOI, BOV, EOV, EOF, *ROWS], padding_side="left")


def make_layout(tokenizer: PreTrainedTokenizerFast, codebook_size: int, grid_hw: tuple[int, int],
                n_frames: int, frame_grid_hw: tuple[int, int]) -> GeneratorLayout:
    """Layout read off a tokenizer built by `build_tokenizer`."""
    if max(grid_hw[0], frame_grid_hw[0]) > MAX_ROWS:
        raise ValueError(f"Grids have at most {MAX_ROWS} rows, got {grid_hw} / {frame_grid_hw}.")
    ids = {s: tokenizer.convert_tokens_to_ids(s) for s in SPECIALS}
    if [ids[r] for r in ROWS] != list(range(ids[ROWS[0]], ids[ROWS[0]] + MAX_ROWS)):
        raise ValueError("Row-start tokens are not contiguous in this tokenizer.")
    offset = tokenizer.convert_tokens_to_ids(image_token(0))
    last = tokenizer.convert_tokens_to_ids(image_token(codebook_size - 1))
    if last != offset + codebook_size - 1:
        raise ValueError("Image tokens are not contiguous in this tokenizer.")
    return GeneratorLayout(offset, codebook_size, grid_hw[0], grid_hw[1], n_frames,
                           frame_grid_hw[0], frame_grid_hw[1], ids[PAD], ids[BOS], ids[EOS],
                           ids[UNK], ids[BOI], ids[EOI], ids[BOV], ids[EOV], ids[EOF],
                           ids[ROWS[0]])


def encode_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """Prompt words -> ids (no specials); the empty prompt gives []."""
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else []


def image_prefix(layout: GeneratorLayout, prompt_ids: list[int]) -> list[int]:
    """<bos> prompt <boi>: the context an image is generated from."""
    return [layout.bos, *prompt_ids, layout.boi]


def video_prefix(layout: GeneratorLayout, prompt_ids: list[int]) -> list[int]:
    """<bos> prompt <bov>: the context a video is generated from."""
    return [layout.bos, *prompt_ids, layout.bov]


def _grid_template(layout: GeneratorLayout, rows: int, cols: int) -> list[int]:
    """<row_0> SAMPLE x cols <row_1> SAMPLE x cols ...: one grid of codes with row starts (the
    row token tells the model which row it is in, the distance to it which column)."""
    return [t for r in range(rows) for t in [layout.row_token(r)] + [SAMPLE] * cols]


def image_template(layout: GeneratorLayout) -> list[int]:
    """What follows the image prefix: the grid (forced row starts, SAMPLE per image token), then
    forced <eoi> <eos>."""
    return _grid_template(layout, layout.grid_h, layout.grid_w) + [layout.eoi, layout.eos]


def video_template(layout: GeneratorLayout) -> list[int]:
    """What follows the video prefix: per frame the grid of frame codes then <eof>; <eov> <eos>."""
    frame = _grid_template(layout, layout.frame_grid_h, layout.frame_grid_w) + [layout.eof]
    return frame * layout.n_frames + [layout.eov, layout.eos]


def code_positions(template: list[int]) -> list[int]:
    """Indices of the SAMPLE slots of a template (where image codes go; every other slot is a
    structural token that is forced, never sampled)."""
    return [i for i, t in enumerate(template) if t == SAMPLE]


def fill_template(template: list[int], codes: list[int], offset: int) -> list[int]:
    """Put image codes (0..K-1, in order) into the SAMPLE slots of a template."""
    it = iter(codes)
    out = [offset + next(it) if t == SAMPLE else t for t in template]
    if next(it, None) is not None:
        raise ValueError("More codes than SAMPLE slots in the template.")
    return out


def image_sequence(layout: GeneratorLayout, prompt_ids: list[int], codes: list[int]) -> list[int]:
    """Full training sequence <bos> prompt <boi> (<row_r> codes of row r)... <eoi> <eos>."""
    return image_prefix(layout, prompt_ids) + fill_template(image_template(layout), codes,
                                                            layout.image_offset)


def video_sequence(layout: GeneratorLayout, prompt_ids: list[int],
                   frame_codes: list[list[int]]) -> list[int]:
    """Full sequence <bos> prompt <bov> f0 <eof> f1 <eof> ... <eov> <eos> (frames: row starts
    + codes, as in images)."""
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
