"""Qwen2.5-VL adapter: 3-axis M-RoPE positions equal get_rope_index with mm_token_type_ids (which
HF needs, else it silently uses 1-D positions); logits, visual tokens and entropies against HF;
continuation positions against HF's rope_deltas."""

import pytest
import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLDecoderLayer

from spec_core.targets import Qwen2_5_VLAdapter, adapter_for
from tests.spec_core.targets.conftest import IMAGE, assert_choice_matches_brute_force, qwen_batch


def _with_types(batch: dict) -> dict:
    return dict(batch, mm_token_type_ids=(batch["input_ids"] == IMAGE).int())


def test_interface(qwen):
    adapter = adapter_for(qwen)
    assert isinstance(adapter, Qwen2_5_VLAdapter) and adapter.default_entropy_layers == (1, 9)
    assert adapter.decoder_layer_cls is Qwen2_5_VLDecoderLayer and adapter.lm_head is qwen.lm_head


def test_positions_are_three_axis_rope_index(qwen):
    batch = qwen_batch()
    adapter = adapter_for(qwen)
    position_ids = adapter.position_ids(batch)
    expected_3BT, _ = qwen.model.get_rope_index(**{k: v for k, v in _with_types(batch).items()
                                                   if k != "pixel_values"})
    assert position_ids.shape == (3, *batch["input_ids"].shape) and torch.equal(position_ids, expected_3BT)
    image_BT = batch["input_ids"] == IMAGE
    assert not torch.equal(position_ids[1][image_BT], position_ids[2][image_BT])  # really 3-axis
    assert torch.equal(adapter.prefill(_with_types(batch)).position_ids, expected_3BT)
    # a given mm_token_type_ids is used as is: all-text types give 1-D positions on three axes
    text_only = dict(batch, mm_token_type_ids=torch.zeros_like(batch["input_ids"]))
    flat_3BT = adapter.position_ids(text_only)
    assert torch.equal(flat_3BT[0], flat_3BT[1]) and not torch.equal(flat_3BT, expected_3BT)


def test_final_hidden_gives_the_models_logits(qwen):
    batch = qwen_batch()
    out = adapter_for(qwen).prefill(batch, return_logits=True)
    real_BT = batch["attention_mask"].bool()
    with torch.no_grad():
        expected_BTV = qwen(**_with_types(batch)).logits  # HF computes its own 3-axis positions
        one_axis_BTV = qwen(**batch).logits               # the silent 1-D fallback
    assert torch.allclose(out.logits_BTV[real_BT], expected_BTV[real_BT], atol=1e-5)
    assert not torch.allclose(out.logits_BTV[real_BT], one_axis_BTV[real_BT], atol=1e-3)
    assert torch.equal(out.logits_BTV, qwen.lm_head(out.final_hidden_BTD))


def test_visual_tokens_are_the_merger_output_at_the_image_tokens(qwen):
    batch = qwen_batch()
    out = adapter_for(qwen).prefill(batch)
    with torch.no_grad():
        per_image = qwen.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"]).pooler_output
    assert out.visual_valid_BP.sum(-1).tolist() == [4, 6]
    for b, n in enumerate([4, 6]):
        assert out.visual_pos_BP[b, :n].tolist() == (batch["input_ids"][b] == IMAGE).nonzero()[:, 0].tolist()
        assert torch.allclose(out.visual_BPD[b, :n], per_image[b], atol=1e-6)


def test_min_entropy_layer_matches_eager_attentions(qwen):
    batch = qwen_batch()
    adapter = adapter_for(qwen)
    out = adapter.prefill(batch, adapter.default_entropy_layers)
    assert out.entropy_layers == (1, 3)  # 1..9 clamped below the last of 4 layers
    assert_choice_matches_brute_force(qwen, out, _with_types(batch))


def test_continuation_positions_follow_rope_deltas(qwen):
    batch = qwen_batch()
    adapter = adapter_for(qwen)
    out = adapter.prefill(batch)
    _, deltas_B1 = qwen.model.get_rope_index(batch["input_ids"], _with_types(batch)["mm_token_type_ids"],
                                             batch["image_grid_thw"], attention_mask=batch["attention_mask"])
    depth_BS = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 3]])
    # HF during generation: text position (count of real tokens so far) + rope_deltas, on 3 axes
    expected_BS = batch["attention_mask"].sum(-1, keepdim=True) + depth_BS + deltas_B1
    got_3BS = adapter.continuation_position_ids(out.position_ids, depth_BS)
    assert got_3BS.shape == (3, 2, 4) and all(torch.equal(axis, expected_BS) for axis in got_3BS)


def test_videos_are_refused(qwen):
    batch = dict(qwen_batch(), pixel_values_videos=torch.zeros(1))
    with pytest.raises(ValueError, match="videos"):
        adapter_for(qwen).prefill(batch)
