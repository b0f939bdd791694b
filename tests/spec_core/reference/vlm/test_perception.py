"""Stage-1 perception heads seed LLaVA's projector exactly (oracle: the heads' own logits)."""

import torch
import torch.nn.functional as F
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig
from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

from spec_core.reference.vlm.perception import (PATCH_HEADS, PROJECTOR_HEADS, PerceptionHeads, init_projector,
                                                object_patch_accuracy)


def _config(vision: int, text: int) -> LlavaConfig:
    return LlavaConfig(vision_config=CLIPVisionConfig(hidden_size=vision, num_attention_heads=2),
                       text_config=LlamaConfig(hidden_size=text, num_attention_heads=2, num_key_value_heads=2),
                       projector_hidden_act="gelu")


def test_projector_rows_are_the_head_logits_and_word_directions():
    torch.manual_seed(0)
    heads = PerceptionHeads(32)
    proj = LlavaMultiModalProjector(_config(32, 192))
    n = init_projector(proj, heads, out_std=1.0)
    assert n == sum(PATCH_HEADS[k] for k in PROJECTOR_HEADS) == 73
    feats_BPD = torch.randn(2, 5, 32)
    hidden_BPH = proj.linear_1(feats_BPD)
    logits = torch.cat([heads.patch[k](feats_BPD) for k in PROJECTOR_HEADS], -1)
    assert torch.allclose(hidden_BPH[..., :n], logits, atol=1e-5)
    # the remaining rows come in +/- pairs spanning the word head's row space
    k = min((192 - n) // 2, 32)  # no more directions than the word head's rank
    plus, minus = hidden_BPH[..., n: n + k], hidden_BPH[..., n + k: n + 2 * k]
    assert torch.allclose(plus, -minus, atol=1e-5) and not torch.allclose(plus, torch.zeros_like(plus))
    assert torch.count_nonzero(proj.linear_1.weight[n + 2 * k:]) == 0
    # the word logits are recoverable from the kept directions (32-dim features: all of them)
    basis = proj.linear_1.weight[n: n + k]
    recon = torch.linalg.lstsq(basis.T, heads.patch["word"].weight.T).solution.T @ basis
    assert torch.allclose(recon, heads.patch["word"].weight, atol=1e-4)
    assert abs(proj.linear_2.weight.std().item() - 1.0) < 0.05


def test_narrow_projector_takes_the_rows_that_fit():
    heads = PerceptionHeads(16)
    proj = LlavaMultiModalProjector(_config(16, 64))
    assert init_projector(proj, heads) == 64
    x = torch.randn(3, 16)
    assert torch.allclose(proj.linear_1(x), torch.cat([heads.patch[k](x) for k in PROJECTOR_HEADS], -1)[:, :64],
                          atol=1e-5)
    assert F.gelu(proj.linear_1(x)).shape == (3, 64)


def test_object_patch_accuracy_counts_object_patches_only():
    """Heads that read one-hot label features exactly; one object patch wrong, empties ignored."""
    dims = {k: PATCH_HEADS[k] for k in ("colour", "shape", "size")}
    heads = PerceptionHeads(sum(dims.values()))
    with torch.no_grad():
        off = 0
        for k, c in dims.items():
            heads.patch[k].weight.zero_()
            heads.patch[k].bias.zero_()
            heads.patch[k].weight[:, off: off + c] = torch.eye(c)
            off += c
    labels = {"colour": torch.tensor([[1, 2, 0, 0]]), "shape": torch.tensor([[3, 4, 0, 0]]),
              "size": torch.tensor([[1, 2, 0, 0]])}
    feats = torch.cat([F.one_hot(labels[k], c).float() for k, c in dims.items()], -1)
    feats[0, 1, dims["colour"] + 4] = 0.0  # patch 1 now reads as shape 0: one object patch wrong
    acc = object_patch_accuracy(heads, feats, labels)
    assert acc == {"colour_objects": 1.0, "shape_objects": 0.5, "size_objects": 1.0}


def test_hires_stage_one_frames_each_scene_as_a_panel_and_labels_every_patch_with_it():
    """With panels: the pixels are the scene framed as the labelled panel (oracle: frame_panel of
    the same scene), every patch carries that panel, and the panel head's rows come last in the
    projector."""
    import numpy as np

    from spec_core.reference.drawing import render
    from spec_core.reference.hires.mosaic import frame_panel
    from spec_core.reference.scenes import sample_scene
    from spec_core.reference.vlm.model import pixels
    from spec_core.reference.vlm.perception import PANEL_HEAD, scene_batch

    px, labels = scene_batch(np.random.default_rng(5), 12, 64, 16, panels=True)
    plain_px, plain = scene_batch(np.random.default_rng(5), 1, 64, 16)
    assert "panel" not in plain and set(labels) == set(plain) | {"panel"}
    assert (labels["panel"] == labels["panel"][:, :1]).all() and len(set(labels["panel"][:, 0].tolist())) > 3
    rng = np.random.default_rng(5)   # replay the sampler: scene, then its panel
    for i in range(12):
        scene = sample_scene(rng, "chart" if rng.random() < 0.25 else "objects", with_sign_prob=0.4)
        p = int(rng.integers(9))
        assert p == int(labels["panel"][i, 0])
        assert torch.equal(px[i], pixels([frame_panel(render(scene, 64), p)])[0])
    heads = PerceptionHeads(32, panels=True)
    proj = LlavaMultiModalProjector(_config(32, 192))
    n = init_projector(proj, heads)
    assert n == 73 + PANEL_HEAD["panel"]
    x = torch.randn(4, 32)
    assert torch.allclose(proj.linear_1(x)[:, 73:n], heads.patch["panel"](x), atol=1e-5)
