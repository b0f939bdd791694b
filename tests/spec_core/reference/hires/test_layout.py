"""Where a panel's visual tokens sit, against transformers' own LLaVA-NeXT packing."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import CLIPVisionConfig, LlavaNextConfig, LlamaConfig
from transformers.models.llava_next.modeling_llava_next import LlavaNextModel

from spec_core.reference.hires import make_sample
from spec_core.reference.hires.layout import region_tokens, sample_region_tokens, tile_of_tokens
from spec_core.reference.hires.mosaic import mosaic_from_json


@pytest.mark.parametrize("side", [2, 4])
def test_tile_of_every_token_is_where_llava_next_packs_that_tile(side):
    """Oracle: HF's pack_image_features on features whose value is their view's index (0 = base
    view, 1 + t = tile t in row-major order), with the newline at -1."""
    patch = 16
    vision = CLIPVisionConfig(image_size=side * patch, patch_size=patch, hidden_size=8, intermediate_size=8,
                              num_hidden_layers=1, num_attention_heads=1)
    px = side * patch
    text = LlamaConfig(hidden_size=8, num_attention_heads=1, num_key_value_heads=1)
    cfg = LlavaNextConfig(vision_config=vision, text_config=text,
                          image_grid_pinpoints=[[a * px, b * px] for a in (1, 2, 3) for b in (1, 2, 3)])
    views_VPD = torch.arange(10, dtype=torch.float32)[:, None, None].expand(10, side * side, 1).contiguous()
    packed, lens = LlavaNextModel.pack_image_features(
        SimpleNamespace(config=cfg), [views_VPD], torch.tensor([[3 * px, 3 * px]]), "full",
        image_newline=torch.tensor([-1.0]))
    value_K = (torch.cat(packed) if isinstance(packed, (list, tuple)) else packed)[:, 0]
    expected_K = torch.where(value_K <= 0, torch.tensor(-1.0), value_K - 1).long().numpy()
    assert lens[0] == len(tile_of_tokens(side))
    assert np.array_equal(tile_of_tokens(side), expected_K)


def test_region_tokens_are_the_named_panels_tokens_and_a_panel_per_sentence_for_a_whole_image_turn():
    tiles_K = tile_of_tokens(4)
    got = region_tokens([[2], [0, 8], list(range(9))], 4)
    assert set(tiles_K[got[0]]) == {2} and len(got[0]) == 16
    assert set(tiles_K[got[1]]) == {0, 8} and len(got[1]) == 32
    opening, *per_panel = got[2]  # a caption: nothing for its opening, then panel by panel
    assert len(opening) == 0 and len(per_panel) == 9
    assert all(set(tiles_K[k]) == {p} and len(k) == 16 for p, k in enumerate(per_panel))
    s = make_sample(4, "multi_turn", 0, "eval")
    regions = mosaic_from_json(s["scene_json"])[1]
    per_turn = sample_region_tokens(s, 4)
    assert len(per_turn) == len(regions) == len(s["answers"])
    for panels, k in zip(regions, per_turn):
        assert set(tiles_K[k]) == set(panels)
