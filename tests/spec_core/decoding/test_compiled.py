"""The compiled engine (decoding.compiled) is lossless and compiles once: greedy equals HF
`generate` alone and batched for AR, a FOVEA drafter, Medusa heads and a training-free proposer
under both tree policies; sampling matches the exact distribution by enumeration; and a mixed run
of 200 requests (prompt lengths, images, batch fill, tree sizes) builds no graph after its warm-up."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from spec_core.decoding import DecodeEngine, Request, SamplingConfig, TreeConfig, ar_generate, speculative_generate
from spec_core.decoding.proposers import proposer_factory
from spec_core.medusa import MedusaHeads, medusa_loss
from spec_core.targets import adapter_for
from tests.spec_core.decoding.conftest import fit, prompt_inputs
from tests.spec_core.decoding.test_sampling import (IMAGE, NEW, chi_square_ok, exact_distribution, tiny_vocab_target,
                                                    trained_drafter)


@pytest.fixture(autouse=True)
def dynamo_on(monkeypatch):
    """The test environment disables dynamo for Ray workers (tests/conftest.py); these compile."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


def compile_stats(engine: DecodeEngine) -> dict:
    stats = engine.compile_stats()
    assert stats["graphs"] >= 0 and stats["recompiles"] == 0, stats
    return stats


def test_compiled_greedy_equals_hf_generate(tiny_world, hf_refs, policy):
    adapter, processor, drafter, evals, _ = tiny_world
    refs = hf_refs(40)
    for s in evals[::2]:
        inputs = prompt_inputs(processor, s)
        spec = speculative_generate(adapter.model, drafter, inputs, 40, policy=policy, compile=True)
        assert spec.sequences[0].tolist() == refs[s["id"]], s["id"]
        assert ar_generate(adapter.model, inputs, 40, compile=True).sequences[0].tolist() == refs[s["id"]]


@pytest.fixture(scope="module")
def medusa(tiny_world):
    adapter, _, _, _, data = tiny_world
    return fit(MedusaHeads.from_target(adapter), medusa_loss, data, 60)


@pytest.mark.parametrize("tiny_world", ["tiny"], indirect=True)  # (both worlds alone, above)
@pytest.mark.parametrize("policy", ["goodput"])  # (both policies alone, above): its trees take every size
@pytest.mark.parametrize("method", ["fovea", "ar", "medusa", "recycling"])
def test_compiled_batched_equals_hf(tiny_world, hf_refs, medusa, policy, method):
    adapter, processor, drafter, evals, _ = tiny_world
    refs = hf_refs(40)
    vocab = adapter.lm_head.weight.shape[0]
    kind = {"fovea": dict(drafter=drafter), "ar": {}, "medusa": dict(drafter=medusa),
            "recycling": dict(proposer=proposer_factory("recycling", vocab))}[method]
    tree = TreeConfig(width=8, depth=3, budget=30, policy=policy) if method == "medusa" else TreeConfig(policy=policy)
    engine = DecodeEngine(adapter, batch_size=3, capacity=512, tree=tree,
                          eos_token_ids=adapter.model.generation_config.eos_token_id, compile=True, **kind)
    results = list(engine.generate(Request(prompt_inputs(processor, s), 40, s["id"]) for s in evals))
    assert sorted(r.key for r in results) == sorted(refs)
    for r in results:
        assert r.sequences[0].tolist() == refs[r.key], (method, r.key)
    if method != "ar":
        assert sum(sum(r.accept_lengths) - r.steps for r in results) > 0  # drafts were accepted
    compile_stats(engine)


@pytest.mark.slow
def test_compiled_sampling_matches_the_exact_distribution():
    """The fixed tree (the goodput policy's shapes are run compiled by the greedy tests above, its
    sampling eagerly by test_sampling: here the compiled steps' sampling path, at fewer graphs)."""
    model = tiny_vocab_target()
    adapter = adapter_for(model)
    g = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.tensor([[1, 3, 4] + [IMAGE] * 4 + [5, 3]]),
              "attention_mask": torch.ones(1, 9, dtype=torch.long),
              "pixel_values": torch.randn(1, 3, 16, 16, generator=g)}
    sampling = SamplingConfig(do_sample=True, temperature=0.7, top_k=4, top_p=0.9)
    exact = exact_distribution(model, inputs, sampling)
    n = 1500
    engine = DecodeEngine(adapter, trained_drafter(adapter, inputs), batch_size=32, capacity=64, sampling=sampling,
                          tree=TreeConfig(width=2, depth=3, budget=5),
                          generator=torch.Generator().manual_seed(1), compile=True)
    results = list(engine.generate(Request(inputs, NEW) for _ in range(n)))
    counts = Counter(tuple(r.sequences[0].tolist()) for r in results)
    stat, critical = chi_square_ok(counts, exact, n)
    assert stat < critical, (stat, critical)
    assert 0.5 * sum(abs(counts[k] / n - p) for k, p in exact.items()) < 0.08
    assert sum(sum(r.accept_lengths) - r.steps for r in results) > 0
    compile_stats(engine)


@pytest.mark.parametrize("tiny_world", ["tiny-hires"], indirect=True)  # images of several sizes
def test_a_mixed_run_compiles_nothing_after_the_warm_up(tiny_world):
    """After `warm_up`, 200 requests of every task (prompt lengths, images), 2-12 new tokens each
    (the batch's fill changes every few steps), under the goodput policy (tree sizes, depths and
    widths change) build no graph and meet no new shape; the shapes stay within the set a CPU
    compiles (sizes 1 and >= 2 of each dynamic dimension): target S 1 or more, the KV move, the
    draft's root and depth each corrected or not and at width 1 or more, catch-up tokens 1 or more."""
    adapter, processor, drafter, evals, _ = tiny_world
    engine = DecodeEngine(adapter, drafter, batch_size=4, capacity=512, tree=TreeConfig(policy="goodput"),
                          eos_token_ids=adapter.model.generation_config.eos_token_id, compile=True)
    reqs = [Request(prompt_inputs(processor, evals[i % len(evals)]), 2 + i % 11, i) for i in range(200)]
    assert engine.warm_up(reqs[0]) > 0
    warm = compile_stats(engine)
    assert 0 < warm["shapes"] <= 2 + 1 + 2 + 4 + 2 and 0 < warm["graphs"] <= warm["shapes"], warm
    assert warm["warmup_s"] > 0
    assert len(list(engine.generate(reqs))) == 200
    assert compile_stats(engine) == warm
