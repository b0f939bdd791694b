"""spec_core.reference.vlm.read_probe: the ridge probe against known answers (separable classes:
1.0; labels independent of the features: near chance), and the read positions of a tiny-hires
model checked against the pool's own read pairs and its attention."""

from __future__ import annotations

import math

import torch

from spec_core.reference import hires
from spec_core.reference.tasks import corpus_texts
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.read_probe import probe_report, read_positions, ridge_probe
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.reference.vocab import COLOURS, SHAPES


def test_the_probe_reads_separable_classes_and_not_noise():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (400,), generator=g)
    centres = 4 * torch.randn(5, 16, generator=g)
    X = centres[y] + 0.3 * torch.randn(400, 16, generator=g)
    acc, chance = ridge_probe(X, y)
    assert acc == 1.0 and 0.15 < chance < 0.35
    noise, chance = ridge_probe(torch.randn(400, 16, generator=g), y)
    assert noise < chance + 0.15
    assert all(math.isnan(v) for v in ridge_probe(X[:5], y[:5]))  # too few to say


def test_read_positions_of_a_tiny_hires_model():
    samples = [hires.make_sample(i, "general_vqa", 0, "eval") for i in range(12)]
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], 1024)
    size = PRESETS["tiny-hires"]
    model = build_vlm(size, tok, 0).eval()
    impl = model.config._attn_implementation
    reads = read_positions(model, build_processor(size, tok), samples, preset="tiny-hires")
    P = len(reads["words"])
    L, H = size.text_layers, model.config.text_config.num_attention_heads
    shown = set(COLOURS) | set(SHAPES) | set(hires.all_words()) | {str(v) for v in range(0, 101, 10)}
    assert P > 0 and set(reads["words"]) <= shown
    assert reads["mass_PLH"].shape == (P, L, H) and bool(((reads["mass_PLH"] >= 0) & (reads["mass_PLH"] <= 1 + 1e-5)).all())
    assert reads["residual_LPD"].shape[:2] == (L + 1, P) and reads["patches_PD"].shape[0] == P
    assert model.config._attn_implementation == impl  # eager only while it measured
    report = probe_report(reads, {"read": frozenset(reads["words"])})
    assert report["read"]["positions"] == P and len(report["read"]["probe_residual"]) == L + 1
