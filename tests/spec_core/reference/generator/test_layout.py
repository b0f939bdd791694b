"""Token layout: ids, tokenizer round trip, sequences, structural mask, config save/load."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

from spec_core.reference.generator.data import SceneSpec, image_example, video_example
from spec_core.reference.generator.layout import (MAX_ROWS, SAMPLE, GeneratorLayout,
                                                  build_tokenizer, code_positions, encode_prompt,
                                                  image_sequence, image_template, image_token,
                                                  load_generator_config, make_layout,
                                                  save_generator_config, video_sequence,
                                                  video_template)


def _layout(k: int = 512) -> tuple[PreTrainedTokenizerFast, GeneratorLayout]:
    tok = build_tokenizer(k)
    return tok, make_layout(tok, k, (16, 16), 8, (8, 8))


def test_ids_are_consistent():
    tok, lay = _layout()
    assert lay.vocab_size == len(tok)
    specials = [lay.pad, lay.bos, lay.eos, lay.unk, lay.boi, lay.eoi, lay.bov, lay.eov, lay.eof]
    rows = [lay.row_token(r) for r in range(MAX_ROWS)]
    assert len(set(specials + rows)) == 9 + MAX_ROWS and max(specials + rows) < lay.image_offset
    assert tok.convert_ids_to_tokens(rows[:2]) == ["<row_0>", "<row_1>"]
    with pytest.raises(ValueError):
        lay.row_token(MAX_ROWS)
    assert tok.pad_token_id == lay.pad and tok.bos_token_id == lay.bos
    assert tok.eos_token_id == lay.eos
    lo, hi = lay.image_token_range
    assert (lo, hi - lo) == (lay.image_offset, 512) and lo % 8 == 0
    assert tok.convert_tokens_to_ids(image_token(7)) == lo + 7
    mask = lay.allowed_mask()
    assert mask.shape == (lay.vocab_size,) and int(mask.sum()) == 512
    assert bool(mask[lo]) and bool(mask[hi - 1]) and not bool(mask[lo - 1])


def test_every_prompt_word_is_known_and_round_trips():
    tok, lay = _layout()
    rng = np.random.default_rng(0)
    spec = SceneSpec(chart_prob=0.3, sign_prob=0.5, n_objects=(1, 5))
    prompts = [image_example(rng, spec)[0] for _ in range(200)]
    prompts += [video_example(rng, spec)[0] for _ in range(50)]
    for p in prompts:
        ids = encode_prompt(tok, p)
        assert tok.unk_token_id not in ids, p
        assert tok.decode(ids) == p.replace(",", " ,")
    assert encode_prompt(tok, "") == []
    text = "<boi> <img_3> <img_511> <eoi>"
    assert tok(text, add_special_tokens=False)["input_ids"] == [
        tok.convert_tokens_to_ids("<boi>"), lay.image_offset + 3, lay.image_offset + 511, tok.convert_tokens_to_ids("<eoi>")]


def test_sequences_follow_the_layout():
    tok, lay = _layout()
    words = encode_prompt(tok, "a large red circle in the center on a gray background")
    seq = image_sequence(lay, words, list(range(256)))
    start = len(words) + 2  # after <bos> prompt <boi>
    assert seq[0] == lay.bos and seq[start - 1] == lay.boi
    assert seq[-2:] == [lay.eoi, lay.eos] and len(seq) == start + 16 * (1 + 16) + 2
    for r in range(16):  # <row_r> then the 16 codes of row r, row-major
        row = seq[start + 17 * r:start + 17 * (r + 1)]
        assert row == [lay.row_token(r)] + [lay.image_offset + 16 * r + c for c in range(16)]
    frames = [[f] * 64 for f in range(8)]
    vseq = video_sequence(lay, [], frames)
    assert vseq[:2] == [lay.bos, lay.bov] and vseq[-2:] == [lay.eov, lay.eos]
    frame_len = 8 * (1 + 8) + 1
    assert vseq.count(lay.eof) == 8 and len(vseq) == 2 + 8 * frame_len + 2
    assert vseq[2] == lay.row_token(0) and vseq[2 + 9] == lay.row_token(1)
    assert vseq[2 + frame_len - 1] == lay.eof and vseq[2 + frame_len + 1] == lay.image_offset + 1
    for template, n in ((image_template(lay), 256), (video_template(lay), 512)):
        pos = code_positions(template)
        assert len(pos) == template.count(SAMPLE) == n
        assert all(template[i] == SAMPLE for i in pos)
        assert all(t in (lay.eoi, lay.eos, lay.eov, lay.eof) or lay.row0 <= t < lay.row0 + MAX_ROWS
                   for i, t in enumerate(template) if i not in set(pos))


def test_make_layout_rejects_too_many_rows():
    tok = build_tokenizer(64)
    with pytest.raises(ValueError):
        make_layout(tok, 64, (MAX_ROWS + 1, 4), 8, (8, 8))


def test_tokenizer_and_config_save_load(tmp_path):
    tok, lay = _layout()
    tok.save_pretrained(str(tmp_path))
    save_generator_config(tmp_path, lay, {"default_sampling": {"top_k": 100}})
    tok2 = PreTrainedTokenizerFast.from_pretrained(str(tmp_path), local_files_only=True)
    lay2, data = load_generator_config(tmp_path)
    assert lay2 == lay and data["default_sampling"] == {"top_k": 100}
    assert data["image_token_range"] == list(lay.image_token_range)
    p = "a small blue star at the top on a navy background"
    assert encode_prompt(tok2, p) == encode_prompt(tok, p)
    assert make_layout(tok2, 512, (16, 16), 8, (8, 8)) == lay
