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


@pytest.mark.parametrize("policy_name", ["fixed", "goodput"])
def test_recycling_learns_every_verified_position_of_every_slot(tiny_world, policy_name):
    """After every step, the engine's Token Recycling matrix equals the oracle's: per step, each
    active slot in slot order writing the target's top-k at its root and its real (not padded) tree
    nodes (`TokenRecycling.update`), AR steps included; with the goodput policy's truncated trees too.
    The matrix starts with random rows, half of them unknown, so that the slots' trees know
    different numbers of nodes and the full template's are padded."""
    adapter, processor, _, evals, _ = tiny_world
    vocab = adapter.model.config.text_config.vocab_size
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, vocab, (vocab, 8), generator=g)
    start[torch.rand(vocab, generator=g) < 0.5] = -1
    shared = start.clone()
    engine = DecodeEngine(adapter, batch_size=3, capacity=512, tree=TreeConfig(budget=80, policy=policy_name),
                          eos_token_ids=(), proposer=lambda: TokenRecycling(vocab, adj_VK=shared))
    verify, steps, pads = engine._verify, [], 0

    def recording(tree):
        nonlocal pads
        hidden_BMD, logits_BMV = verify(tree)
        real_BN = tree.parent_BN != torch.arange(1, tree.size + 1)
        pads += sum(int((~real_BN[b]).sum()) for b, slot in enumerate(engine.slots) if slot is not None)
        rows = [(torch.cat([torch.tensor([slot.tokens[-1]]), tree.tokens_BN[b][real_BN[b]]]),
                 torch.cat([logits_BMV[b, :1], logits_BMV[b, 1:][real_BN[b]]]))
                for b, slot in enumerate(engine.slots) if slot is not None]
        steps.append((shared.clone(), rows))  # the matrix before this step's writes
        return hidden_BMD, logits_BMV

    engine._verify = recording
    list(engine.generate(Request(prompt_inputs(processor, s), 24 + 8 * (i % 3), s["id"]) for i, s in enumerate(evals[::3])))
    steps.append((shared.clone(), []))
    assert any(len(t) > 1 for _, rows in steps for t, _ in rows)  # trees were verified, not only AR steps
    assert pads or policy_name == "goodput"  # padded ones (the policy's truncated trees may hold none)
    oracle = TokenRecycling(vocab, adj_VK=start)
    for before, rows in steps:
        assert torch.equal(before, oracle.adj_VK)
        for tokens_T, logits_TV in rows:
            oracle.update(tokens_T, logits_TV)
