"""Position limits (spec_core.targets.base): every supported target's table is its text config's
max_position_embeddings, and the reject reason names prompt, new tokens and the table."""

import pytest
from transformers import LlamaConfig

from spec_core.targets import adapter_for, position_limit, position_overflow
from tests.spec_core.targets.conftest import TEXT, build_llava, build_llava_next, build_qwen


@pytest.mark.parametrize("build", [build_llava, build_llava_next, build_qwen])
def test_every_target_reads_its_text_configs_table(build):
    model = build()
    assert position_limit(model.config) == TEXT["max_position_embeddings"] == 128
    assert adapter_for(model).max_positions == 128
    model.config.get_text_config().max_position_embeddings = 48  # the text config's, not another
    assert adapter_for(model).max_positions == 48


def test_a_text_only_config_and_the_reason():
    assert position_limit(LlamaConfig(max_position_embeddings=64)) == 64
    assert position_overflow(40, 24, 64) is None and position_overflow(64, 0, 64) is None
    assert position_overflow(40, 25, 64) == "beyond the position table: 40 tokens + 25 new > max_position_embeddings 64"
    assert position_overflow(65, 0, 64) == "beyond the position table: 65 tokens > max_position_embeddings 64"
    assert position_overflow(10**6, 10, None) is None  # a config naming no table limits nothing
