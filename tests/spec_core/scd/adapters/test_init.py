"""adapter_for: the adapter follows the model's config class, never its name or path."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

from spec_core.scd.adapters import CausalLMAdapter, adapter_for
from tests.spec_core.scd.adapters.tiny_models import TEXT

torch.set_num_threads(1)


def test_other_causal_lms_get_the_plain_adapter():
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, **TEXT))
    model.config._name_or_path = "deepseek-ai/Janus-Pro-7B"  # a misleading name changes nothing
    lm = adapter_for(model)
    assert type(lm) is CausalLMAdapter and lm.num_layers == TEXT["num_hidden_layers"]


def test_a_model_without_an_lm_head_is_refused():
    with pytest.raises(ValueError, match="no adapter"):
        adapter_for(LlamaModel(LlamaConfig(vocab_size=40, **TEXT)))
