"""Tiny random targets of exactly the three supported classes, left-padded batches for them, and
the brute-force entropy oracle (eager attention, output_attentions=True)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                          LlavaNextConfig, LlavaNextForConditionalGeneration, Qwen2_5_VLConfig,
                          Qwen2_5_VLForConditionalGeneration)

from spec_core.targets.base import pad_left

PAD, BOS, IMAGE = 0, 1, 99
TEXT = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=PAD, bos_token_id=BOS,
            eos_token_id=2, max_position_embeddings=128)
CLIP = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            image_size=16, patch_size=8, projection_dim=16)


def _frozen(model):
    """Eval mode, no grads, and q/k weights large enough that attention is far from uniform
    (at HF's init std 0.02 every layer attends uniformly and all entropies tie at log n)."""
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            layer.self_attn.q_proj.weight.normal_(0.0, 0.5)
            layer.self_attn.k_proj.weight.normal_(0.0, 0.5)
    return model.eval().requires_grad_(False)


def build_llava() -> LlavaForConditionalGeneration:
    torch.manual_seed(0)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**CLIP), text_config=LlamaConfig(**TEXT),
                         image_token_index=IMAGE, image_seq_length=4, vision_feature_layer=-1,
                         vision_feature_select_strategy="default")
    return _frozen(LlavaForConditionalGeneration(config))


def build_llava_next() -> LlavaNextForConditionalGeneration:
    torch.manual_seed(1)
    config = LlavaNextConfig(vision_config=CLIPVisionConfig(**CLIP), text_config=LlamaConfig(**TEXT),
                             image_token_index=IMAGE, vision_feature_layer=-1,
                             image_grid_pinpoints=[[16, 32], [32, 16], [32, 32]])
    return _frozen(LlavaNextForConditionalGeneration(config))


def build_qwen() -> Qwen2_5_VLForConditionalGeneration:
    torch.manual_seed(2)
    text = dict(TEXT, rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                           mrope_section=[1, 1, 2]))  # sums to head_dim / 2
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32, window_size=8,
                  fullatt_block_indexes=[0])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=IMAGE,
                              video_token_id=98, vision_start_token_id=97, vision_end_token_id=96)
    return _frozen(Qwen2_5_VLForConditionalGeneration(config))


def sample(gen: torch.Generator, before: int, n_image: int, after: int,
           around: tuple[list[int], list[int]] = ([], [])) -> list[int]:
    words = lambda n: torch.randint(3, 90, (n,), generator=gen).tolist()  # noqa: E731
    return [BOS] + words(before) + around[0] + [IMAGE] * n_image + around[1] + words(after)


def llava_batch() -> dict:
    """Two samples, one 4-token image each, the first left-padded by 3."""
    gen = torch.Generator().manual_seed(0)
    ids, mask = pad_left([sample(gen, 2, 4, 3), sample(gen, 4, 4, 4)], PAD)
    return dict(input_ids=ids, attention_mask=mask,
                pixel_values=torch.randn(2, 3, 16, 16, generator=gen))


def llava_next_batch() -> dict:
    """Two images of different sizes: 16x32 -> 14 visual tokens, 20x20 -> 24 (base view + grid +
    one newline per row); the first sample is left-padded."""
    gen = torch.Generator().manual_seed(1)
    ids, mask = pad_left([sample(gen, 2, 14, 3), sample(gen, 3, 24, 2)], PAD)
    return dict(input_ids=ids, attention_mask=mask, image_sizes=torch.tensor([[16, 32], [20, 20]]),
                pixel_values=torch.randn(2, 5, 3, 16, 16, generator=gen))  # 3 and 5 views


def qwen_batch() -> dict:
    """Grids (1,4,4) -> 4 tokens and (1,4,6) -> 6 tokens after the 2x2 merge; first left-padded."""
    gen = torch.Generator().manual_seed(2)
    around = ([97], [96])  # vision start / end
    ids, mask = pad_left([sample(gen, 2, 4, 3, around), sample(gen, 4, 6, 4, around)], PAD)
    grid = torch.tensor([[1, 4, 4], [1, 4, 6]])
    return dict(input_ids=ids, attention_mask=mask, image_grid_thw=grid,
                pixel_values=torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 4 * 4, generator=gen))


def brute_force_entropy(model, inputs: dict, first: int, last: int):
    """Per-layer entropies (L, B, T) from the model's own eager attention probabilities, and HF's
    hidden states, from one forward of a copy switched to eager attention."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    assert eager.config.text_config._attn_implementation == "eager"
    with torch.no_grad():
        out = eager(**inputs, output_attentions=True, output_hidden_states=True)
    # hidden state l is paired with the attention that reads it, attentions[l] (DREAM's pairing)
    ent_LBT = torch.stack([torch.special.entr(out.attentions[i].float()).sum(-1).mean(1)
                           for i in range(first, last + 1)])  # (B,N,T,T) -> (B,T)
    return ent_LBT, out.hidden_states


@pytest.fixture(scope="module")
def llava():
    return build_llava()


@pytest.fixture(scope="module")
def llava_next():
    return build_llava_next()


@pytest.fixture(scope="module")
def qwen():
    return build_qwen()


def assert_choice_matches_brute_force(model, out, inputs: dict) -> None:
    """The adapter's per-token layer choice, entropies and intermediate states against HF's
    eager attentions and hidden states for the same inputs."""
    first, last = out.entropy_layers
    ent_LBT, hidden = brute_force_entropy(model, inputs, first, last)
    real_BT = inputs["attention_mask"].bool()
    assert torch.allclose(out.entropy_LBT[:, real_BT], ent_LBT[:, real_BT], atol=1e-4)
    assert torch.isinf(out.entropy_LBT[:, ~real_BT]).all()
    assert (out.chosen_layer_BT[~real_BT] == -1).all() and (out.intermediate_BTD[~real_BT] == 0).all()

    two_LBT = ent_LBT.topk(2, dim=0, largest=False).values
    clear_BT = real_BT & (two_LBT[1] - two_LBT[0] > 1e-3)  # skip near-ties (and first tokens)
    assert clear_BT.sum() > 0.8 * (real_BT.sum() - real_BT.shape[0])
    expected_BT = first + ent_LBT.argmin(0)
    assert torch.equal(out.chosen_layer_BT[clear_BT], expected_BT[clear_BT])
    assert len(out.chosen_layer_BT[real_BT].unique()) > 1  # the choice really varies per token

    stacked_LBTD = torch.stack(hidden)
    chosen_1BTD = out.chosen_layer_BT.clamp_min(0)[None, ..., None].expand(1, *stacked_LBTD.shape[1:])
    expected_BTD = stacked_LBTD.gather(0, chosen_1BTD)[0]  # hidden_states[chosen[b, t]][b, t]
    assert torch.allclose(out.intermediate_BTD[real_BT], expected_BTD[real_BT], atol=1e-5)
