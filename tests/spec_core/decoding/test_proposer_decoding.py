"""Training-free methods (PLD, SAM-Decoding, Lookahead, Token Recycling) on the decoding engine:
greedy output is token-identical to HF `generate` on the tiny world's six tasks, batched or not;
drafts are accepted (multi-token steps happen); sampling stays reproducible per seed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spec_core.decoding import DecodeEngine, Request, TreeConfig
from spec_core.decoding.proposers import LookaheadTrie, PromptLookup, SuffixAutomaton, TokenRecycling
from tests.spec_core.decoding.conftest import prompt_inputs

MAX_NEW = 40


def _methods(vocab: int) -> dict:
    shared = torch.full((vocab, 8), -1, dtype=torch.long)  # Token Recycling keeps its matrix across requests
    return {"pld": (PromptLookup, TreeConfig(budget=10)),
            "sam": (SuffixAutomaton, TreeConfig(budget=10)),
            "lookahead": (LookaheadTrie, TreeConfig(budget=64)),
            "recycling": (lambda: TokenRecycling(vocab, adj_VK=shared), TreeConfig(budget=80))}


def _run(adapter, processor, samples, batch, tree, eos, factory=None, max_new=MAX_NEW) -> dict:
    engine = DecodeEngine(adapter, batch_size=batch, capacity=512, tree=tree, eos_token_ids=eos, proposer=factory)
    results = list(engine.generate(Request(prompt_inputs(processor, s), max_new, s["id"]) for s in samples))
    assert sorted(r.key for r in results) == sorted(s["id"] for s in samples)  # every request once
    return {r.key: r for r in results}



@pytest.mark.parametrize("name", ["pld", "sam", "lookahead", "recycling"])
def test_greedy_equals_hf_generate_batched_and_alone(tiny_world, hf_refs, name, policy):
    adapter, processor, _, evals, _ = tiny_world
    factory, tree = _methods(adapter.model.config.text_config.vocab_size)[name]
    tree = dataclasses.replace(tree, policy=policy)
    eos = adapter.model.generation_config.eos_token_id
    refs = hf_refs(MAX_NEW)  # six tasks
    for batch in (1, 3):
        for key, r in _run(adapter, processor, evals, batch, tree, eos, factory).items():
            assert r.sequences[0].tolist() == refs[key], (name, batch, key)


@pytest.mark.parametrize("name", ["pld", "sam", "lookahead", "recycling"])
def test_long_outputs_accept_drafts_and_equal_ar(tiny_world, name):
    """Past its EOS the tiny target loops, which history-based drafts catch: multi-token steps,
    still token-identical to AR on the same engine (itself equal to HF generate)."""
    adapter, processor, _, evals, _ = tiny_world
    factory, tree = _methods(adapter.model.config.text_config.vocab_size)[name]
    samples = evals[::4]
    ar = _run(adapter, processor, samples, 2, TreeConfig(), (), None, 96)
    spec = _run(adapter, processor, samples, 2, tree, (), factory, 96)
    for key, r in spec.items():
        assert r.sequences[0].tolist() == ar[key].sequences[0].tolist(), (name, key)
    steps = [a for r in spec.values() for a in r.accept_lengths]
    assert sum(steps) / len(steps) > 1.2, name  # drafts accepted: fewer forwards than tokens


def test_a_drafter_and_a_proposer_are_exclusive(tiny_world):
    adapter, _, drafter, _, _ = tiny_world
    with pytest.raises(ValueError, match="not both"):
        DecodeEngine(adapter, drafter, proposer=PromptLookup)


def test_sampling_with_a_proposer_is_reproducible(tiny_world):
    from spec_core.decoding import SamplingConfig

    adapter, processor, _, evals, _ = tiny_world
    outs = []
    for _ in range(2):
        engine = DecodeEngine(adapter, batch_size=2, capacity=512, tree=TreeConfig(budget=10), proposer=SuffixAutomaton,
                              sampling=SamplingConfig(do_sample=True, temperature=0.8),
                              generator=torch.Generator().manual_seed(5))
        outs.append({r.key: r.sequences[0].tolist() for r in engine.generate(
            Request(prompt_inputs(processor, s), 24, s["id"]) for s in evals[:4])})
    assert outs[0] == outs[1]
