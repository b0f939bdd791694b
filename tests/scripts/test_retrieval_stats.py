"""scripts/retrieval_stats.py end to end on an untrained tiny-hires target and a random drafter:
the figures exist for every corrected depth and every region task, and lie where they must."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from spec_core.fovea import FoveaDrafter
from spec_core.reference import hires
from spec_core.reference.tasks import TASKS, corpus_texts
from spec_core.reference.vlm.build import TOKENIZER_VOCAB
from spec_core.reference.vlm.model import PRESETS, build_processor, build_vlm
from spec_core.reference.vlm.tokenizer import train_tokenizer
from spec_core.targets import load_target
from tests.conftest import REPO


def test_figures_per_depth_and_region_task(tmp_path):
    samples = [s for t in TASKS for s in hires.make_split(t, 3, 0, "train")]
    tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], TOKENIZER_VOCAB)
    size = PRESETS["tiny-hires"]
    build_vlm(size, tok).save_pretrained(tmp_path / "target")
    build_processor(size, tok).save_pretrained(tmp_path / "target")
    drafter = FoveaDrafter.from_target(load_target(tmp_path / "target"), n_blocks=1, k_min=2, k_max=8)
    drafter.save_pretrained(tmp_path / "drafter")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "scripts/retrieval_stats.py", "--target", str(tmp_path / "target"),
                          "--drafter", f"d={tmp_path / 'drafter'}", "--per-task", "2", "--out", str(tmp_path / "stats.json")],
                         cwd=REPO, env=env, check=True, capture_output=True, text=True)
    assert "weight on the named panels" in run.stdout
    depths = json.loads((tmp_path / "stats.json").read_text())["d"]
    assert sorted(depths) == ["0", "1"]
    for fig in depths.values():
        assert 2 <= fig["k"] <= 8 and 0 < fig["mass"] <= 1
        assert sum(fig["k_hist"].values()) > 0
        for task in ("general_vqa", "chart_vqa", "text_vqa", "reasoning", "multi_turn"):
            assert 0 <= fig[f"share/{task}"] <= 1 and 0 <= fig[f"top1/{task}"] <= 1
            assert 0 < fig[f"chance/{task}"] < 0.3  # one or two panels of nine
        assert not any(k.endswith("/captioning") for k in fig)  # a caption names every panel
