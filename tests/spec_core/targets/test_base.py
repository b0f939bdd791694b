"""Shared adapter pieces: left-padding positions, per-sample visual packing in masked_scatter
order, continuation positions (Qwen's rope_deltas oracle is in test_qwen2_5_vl.py)."""

import pytest
import torch

from spec_core.targets import adapter_for
from spec_core.targets.base import pack_visual, text_position_ids


def test_text_positions_start_at_each_samples_first_real_token():
    mask_BT = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert text_position_ids(mask_BT).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_visual_tokens_fill_placeholders_in_masked_scatter_order():
    image_mask_BT = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 1, 0, 1]]).bool()
    features_ND = torch.arange(6 * 3, dtype=torch.float32).view(6, 3)
    # oracle: HF's own placement
    scattered_BTD = torch.zeros(2, 5, 3).masked_scatter(image_mask_BT[..., None], features_ND)
    visual_BPD, valid_BP, pos_BP = pack_visual(image_mask_BT, features_ND, 3, torch.float32)
    assert valid_BP.tolist() == [[True, True, False, False], [True] * 4]
    assert pos_BP.tolist() == [[1, 2, 0, 0], [0, 1, 2, 4]]
    for b in range(2):
        n = int(valid_BP[b].sum())
        assert torch.equal(visual_BPD[b, :n], scattered_BTD[b, pos_BP[b, :n]])
        assert (visual_BPD[b, n:] == 0).all()
    with pytest.raises(ValueError, match="6 image tokens in input_ids but 5"):
        pack_visual(image_mask_BT, features_ND[:5], 3, torch.float32)
    empty = pack_visual(torch.zeros(2, 5, dtype=torch.bool), None, 3, torch.float32)
    assert [t.shape for t in empty] == [(2, 0, 3), (2, 0), (2, 0)]


def test_continuation_positions(llava):
    adapter = adapter_for(llava)
    depth_BS = torch.tensor([[0, 1, 1, 2], [0, 1, 2, 2]])
    pos_BT = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    assert adapter.continuation_position_ids(pos_BT, depth_BS).tolist() == [[3, 4, 4, 5], [5, 6, 7, 7]]
    # M-RoPE ending on an image: continue past the largest position on any axis, on all axes
    pos_3BT = torch.tensor([[[0, 1, 1, 1, 1]], [[0, 1, 1, 2, 2]], [[0, 1, 2, 1, 2]]])
    out_3BS = adapter.continuation_position_ids(pos_3BT, torch.tensor([[0, 1]]))
    assert out_3BS.shape == (3, 1, 2) and out_3BS[:, 0].tolist() == [[3, 4]] * 3


def test_a_batch_without_input_ids_or_pixels_is_refused(llava):
    adapter = adapter_for(llava)
    with pytest.raises(ValueError, match="needs input_ids"):
        adapter.prefill({"pixel_values": torch.zeros(1, 3, 16, 16)})
    with pytest.raises(ValueError, match="no pixel_values"):
        adapter.prefill({"input_ids": torch.tensor([[1, 99, 99, 99, 99, 5]])})


def test_text_only_prefill_has_no_visual_tokens(llava):
    out = adapter_for(llava).prefill({"input_ids": torch.tensor([[1, 5, 6, 7]])}, return_logits=True)
    assert out.visual_BPD.shape == (1, 0, 32) and out.logits_BTV.shape == (1, 4, 100)
    assert torch.allclose(out.logits_BTV, llava(input_ids=torch.tensor([[1, 5, 6, 7]])).logits, atol=1e-5)
