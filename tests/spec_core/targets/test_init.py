"""spec_core/targets/__init__.py: adapter dispatch on the model class, and load_target from a
local directory only (round trip through save_pretrained)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spec_core.targets import (LlavaAdapter, LlavaNextAdapter, Qwen2_5_VLAdapter, adapter_for,
                               load_target)
from tests.spec_core.targets.conftest import (build_llava, build_llava_next, build_qwen, llava_batch,
                                              llava_next_batch, qwen_batch)

CASES = {"llava": (build_llava, llava_batch, LlavaAdapter),
         "llava_next": (build_llava_next, llava_next_batch, LlavaNextAdapter),
         "qwen2_5_vl": (build_qwen, qwen_batch, Qwen2_5_VLAdapter)}


def _tiny_llama() -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2))


@pytest.mark.parametrize("name", list(CASES))
def test_load_target_round_trip(name, tmp_path):
    build, make_batch, adapter_cls = CASES[name]
    model = build()
    model.save_pretrained(tmp_path)
    loaded = load_target(tmp_path)
    assert type(loaded) is adapter_cls and type(adapter_for(model)) is adapter_cls
    assert not loaded.model.training and not any(p.requires_grad for p in loaded.model.parameters())
    batch = make_batch()
    want, got = adapter_for(model).prefill(batch, (1, 3)), loaded.prefill(batch, (1, 3))
    assert torch.equal(got.final_hidden_BTD, want.final_hidden_BTD)
    assert torch.equal(got.chosen_layer_BT, want.chosen_layer_BT)
    # a bf16 target takes the processor's float32 pixels
    half = load_target(tmp_path, dtype=torch.bfloat16).prefill(batch, (1, 3))
    assert half.final_hidden_BTD.dtype == torch.bfloat16 and half.visual_BPD.dtype == torch.bfloat16
    assert torch.isfinite(half.intermediate_BTD).all()


def test_load_target_refuses_anything_but_a_local_model_directory(tmp_path):
    for bad in ["llava-hf/llava-1.5-7b-hf", tmp_path / "missing", tmp_path]:
        with pytest.raises(ValueError, match="existing local model directory"):
            load_target(bad)
    _tiny_llama().save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="holds a 'llama' model, not a supported VLM target; "
                                         "supported: llava, llava_next, qwen2_5_vl"):
        load_target(tmp_path / "llama")


def test_adapter_for_an_unsupported_class_says_which_are():
    with pytest.raises(ValueError, match="no target adapter for LlamaForCausalLM; supported: "
                                         "LlavaForConditionalGeneration"):
        adapter_for(_tiny_llama())
