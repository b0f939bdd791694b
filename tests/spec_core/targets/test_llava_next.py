"""LLaVA-NeXT adapter: two images of different sizes give 14 and 24 visual tokens; each equals
get_image_features' packed output at its image tokens; logits and entropies against HF."""

import pytest
import torch

from spec_core.targets import LlavaNextAdapter, adapter_for
from tests.spec_core.targets.conftest import IMAGE, assert_choice_matches_brute_force, llava_next_batch


def test_final_hidden_gives_the_models_logits(llava_next):
    batch = llava_next_batch()
    out = adapter_for(llava_next).prefill(batch)
    real_BT = batch["attention_mask"].bool()
    with torch.no_grad():
        expected_BTV = llava_next(**batch, position_ids=out.position_ids).logits
    assert torch.allclose(llava_next.lm_head(out.final_hidden_BTD)[real_BT], expected_BTV[real_BT], atol=1e-5)


def test_visual_token_count_varies_per_image(llava_next):
    batch = llava_next_batch()
    adapter = adapter_for(llava_next)
    assert isinstance(adapter, LlavaNextAdapter)
    out = adapter.prefill(batch, output_hidden_states=True)
    with torch.no_grad():
        per_image = llava_next.model.get_image_features(batch["pixel_values"],
                                                        batch["image_sizes"]).pooler_output
    assert [len(f) for f in per_image] == [14, 24]
    assert out.visual_valid_BP.sum(-1).tolist() == [14, 24] and out.visual_BPD.shape == (2, 24, 32)
    for b, n in enumerate([14, 24]):
        assert out.visual_pos_BP[b, :n].tolist() == (batch["input_ids"][b] == IMAGE).nonzero()[:, 0].tolist()
        assert torch.allclose(out.visual_BPD[b, :n], per_image[b], atol=1e-6)
        assert torch.allclose(out.hidden_states[0][b, out.visual_pos_BP[b, :n]], per_image[b], atol=1e-6)
    assert (out.visual_BPD[0, 14:] == 0).all() and not out.visual_valid_BP[0, 14:].any()


def test_min_entropy_layer_matches_eager_attentions(llava_next):
    batch = llava_next_batch()
    out = adapter_for(llava_next).prefill(batch, (1, 10))
    assert out.entropy_layers == (1, 3)
    assert_choice_matches_brute_force(llava_next, out, batch)


def test_pixels_without_image_sizes_are_refused(llava_next):
    batch = llava_next_batch()
    del batch["image_sizes"]
    with pytest.raises(ValueError, match="needs image_sizes"):
        adapter_for(llava_next).prefill(batch)
