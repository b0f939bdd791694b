"""scripts/hires_proxy.py, in seconds: a stage-1 arm from scratch, then an arm that keeps its
tokenizer, tower and projector (where stage 2 starts) and trains a new decoder with a --set override; both write their
figures and a loadable LLaVA-NeXT model; scripts/hires_reads.py and hires_attention.py --which-panel
report on one; the linear probe of hires_attention.py --panel-probe against separable and random data."""

import json
import os
import subprocess
import sys

import torch

from scripts.hires_attention import probe_accuracy
from spec_core.reference.vlm.build import load_target
from tests.conftest import REPO

SMALL = ["--images", "3", "--steps", "3", "--eval", "2", "--set", "batch=2"]


def _run(*args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([sys.executable, "scripts/hires_proxy.py", *args], cwd=REPO, env=env, check=True,
                   capture_output=True, text=True)
    return json.loads(open(os.path.join(args[args.index("--out") + 1], "proxy.json")).read())


def test_two_arms_share_a_tower_and_report_their_figures(tmp_path):
    first = _run("--out", str(tmp_path / "a"), *SMALL, "--set", "vision_steps=5", "--set", "vision_pool=32",
                 "--set", "read_values_only=true")
    train = first["config"]["train"]  # the hires preset's: object-level focus, the read loss on sign words
    assert "vision_acc_panel" in first["stage1"] and (train["read_focus"], train["read_loss_words"]) == (True, "signs")
    assert train["read_values_only"] is True
    second = _run("--out", str(tmp_path / "b"), "--tower", str(tmp_path / "a"), *SMALL, "--set", "read_focus=false",
                  "--layers", "3", "--size-set", "tie_embeddings=true", "--panel-steps", "2")
    assert "stage1" not in second and second["config"]["train"]["read_focus"] is False
    assert second["panel_train"]["image_tokens"] == 36  # one 64 px scene: base view + one tile (16 + 4 x 5)
    assert "panel_train" not in first
    for fig in (first, second):
        assert {"exact_match_general_vqa", "exact_match_text_vqa", "region_dependence"} <= set(fig["quality"])
        assert any(k.startswith("general_vqa/") for k in fig["answer_tokens"])
    a, _ = load_target(str(tmp_path / "a"))
    b, _ = load_target(str(tmp_path / "b"))
    assert b.config.text_config.num_hidden_layers == 3 and b.config.tie_word_embeddings  # --size-set
    assert torch.equal(a.model.vision_tower.embeddings.patch_embedding.weight,  # kept (frozen in stage 2)
                       b.model.vision_tower.embeddings.patch_embedding.weight)
    reads = subprocess.run([sys.executable, "scripts/hires_reads.py", str(tmp_path / "b"), "--per-task", "4"],
                           cwd=REPO, capture_output=True, text=True, check=True)  # where reading fails, on arm b
    report = json.loads(reads.stdout.strip().splitlines()[-1])
    assert report["read_positions"] > 0 and len(report["mass_layer_head"]) == 3  # one row per layer
    search = subprocess.run([sys.executable, "scripts/hires_attention.py", str(tmp_path / "b"), "--which-panel",
                             "--per-task", "12"], cwd=REPO, capture_output=True, text=True, check=True)
    found = json.loads(search.stdout.strip().splitlines()[-1])  # the content search of sign-panel questions
    assert found["questions"] > 0 and 0 <= found["right"] <= found["questions"] and found["layer"] == 0
    probe = subprocess.run([sys.executable, "scripts/hires_attention.py", str(tmp_path / "b"), "--panel-probe",
                            "--per-task", "30"], cwd=REPO, capture_output=True, text=True, check=True)
    probed = json.loads(probe.stdout.strip().splitlines()[-1])  # what the focus heads' output says of the panel
    assert probed["questions"] > 0 and probed["chance"] == round(1 / 9, 3)
    assert set(probed["probe"]) == {"layer 0 head 0", "layer 0 head 1", "layer 1 head 0", "layer 1 head 1"}
    assert all(set(row) == {"output", "sign_tile_part", "tile_mean", "token"} and all(0 <= v <= 1 for v in row.values())
               for row in probed["probe"].values())
    bad = subprocess.run([sys.executable, "scripts/hires_proxy.py", "--out", str(tmp_path / "c"), "--set", "nope=1"],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode != 0 and "VLMTrainConfig field" in bad.stderr
    typo = subprocess.run([sys.executable, "scripts/hires_proxy.py", "--out", str(tmp_path / "d"), "--set",
                           "read_loss_words=sign"], cwd=REPO, capture_output=True, text=True)
    assert typo.returncode != 0 and "read_loss_words must be one of" in typo.stderr  # before any work
    assert not (tmp_path / "d").exists()


def test_the_panel_probe_scores_held_out_rows_against_an_oracle():
    gen = torch.Generator().manual_seed(0)
    y_N = torch.arange(450) % 9
    centres_CF = torch.randn(9, 16, generator=gen) * 4
    separable_NF = centres_CF[y_N] + torch.randn(450, 16, generator=gen) * 0.1  # the class is in the features
    assert probe_accuracy(separable_NF, y_N, seed=0) == 1.0
    noise_NF = torch.randn(450, 16, generator=gen)  # nothing to find: held-out accuracy near 1/9
    assert probe_accuracy(noise_NF, y_N, seed=0) < 0.3
