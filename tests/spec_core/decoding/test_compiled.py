"""The compiled engine (decoding.compiled) is lossless: greedy equals HF `generate`, batched equals
batch 1, for AR and every drafter kind under both tree policies; and a mixed run compiles no graph
after its warm-up."""

from __future__ import annotations

import pytest

from spec_core.decoding import DecodeEngine, Request, TreeConfig, ar_generate, speculative_generate
from tests.spec_core.decoding.conftest import prompt_inputs


@pytest.fixture(autouse=True)
def dynamo_on(monkeypatch):
    """The test environment disables dynamo for Ray workers (tests/conftest.py); these compile."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


def test_compiled_greedy_equals_hf_generate(tiny_world, hf_refs, policy):
    adapter, processor, drafter, evals, _ = tiny_world
    refs = hf_refs(40)
    for s in evals[::2]:
        inputs = prompt_inputs(processor, s)
        spec = speculative_generate(adapter.model, drafter, inputs, 40, policy=policy, compile=True)
        assert spec.sequences[0].tolist() == refs[s["id"]], s["id"]
        assert ar_generate(adapter.model, inputs, 40, compile=True).sequences[0].tolist() == refs[s["id"]]


def test_compiled_batched_equals_hf(tiny_world, hf_refs, policy):
    adapter, processor, drafter, evals, _ = tiny_world
    refs = hf_refs(40)
    for d in (drafter, None):
        engine = DecodeEngine(adapter, d, batch_size=3, capacity=512, tree=TreeConfig(policy=policy),
                              eos_token_ids=adapter.model.generation_config.eos_token_id, compile=True)
        results = list(engine.generate(Request(prompt_inputs(processor, s), 40, s["id"]) for s in evals))
        for r in results:
            assert r.sequences[0].tolist() == refs[r.key], r.key
        assert engine._target_step.recompiles == 0
