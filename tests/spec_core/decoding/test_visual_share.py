"""The visual-attention share the engine measures equals an eager full forward's last-layer,
head-mean attention on image tokens; ViSkip changes how many tokens a step commits, never the
output (greedy equals HF `generate` with a drafter or a proposer, batched or not)."""

from __future__ import annotations

import pytest
import torch

from spec_core.decoding import DecodeEngine, Request, TreeConfig
from spec_core.decoding.proposers import SuffixAutomaton
from tests.spec_core.decoding.conftest import prompt_inputs

MAX_NEW = 24


def eager_share(adapter, inputs: dict, committed: list[int]) -> float:
    """Share of the last position's last-layer head-mean attention on image tokens, from a full
    eager forward over prompt + committed[:-1] (the position that produced committed[-1])."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([committed[:-1]], dtype=torch.long)], 1)
    full = {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    cfg = adapter.model.config
    old = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = adapter.model(**full, output_attentions=True)
    finally:
        cfg._attn_implementation = old
    attn_K = out.attentions[-1][0, :, -1].float().mean(0)  # (N, T, T) -> last query, head mean
    return float(attn_K[ids[0] == adapter.image_token_id].sum())


def test_shares_equal_an_eager_forward(tiny_world):
    adapter, processor, drafter, evals, _ = tiny_world
    for s in (evals[8], evals[16]):
        inputs = prompt_inputs(processor, s)
        engine = DecodeEngine(adapter, drafter, capacity=512, track_visual=True)
        (r,) = engine.generate([Request(inputs, 16, s["id"])])
        tokens = r.sequences[0].tolist()
        assert len(r.visual_shares) == len(r.accept_lengths) > 1
        done = 1  # the prefill committed the first token
        for share, k in zip(r.visual_shares, r.accept_lengths):
            assert share == pytest.approx(eager_share(adapter, inputs, tokens[:done]), abs=1e-4)
            done += k
        assert 0.0 < max(r.visual_shares) <= 1.0



@pytest.mark.parametrize("tau", [0.0, 0.2, 0.35, 1.01])
def test_viskip_never_changes_outputs(tiny_world, hf_refs, tau, policy):
    adapter, processor, drafter, evals, _ = tiny_world
    eos = adapter.model.generation_config.eos_token_id
    refs = hf_refs(MAX_NEW)
    for kw in (dict(drafter=drafter, tree=TreeConfig(policy=policy)),
               dict(proposer=SuffixAutomaton, tree=TreeConfig(budget=10, policy=policy))):
        for batch in (1, 3):
            engine = DecodeEngine(adapter, batch_size=batch, capacity=512, eos_token_ids=eos, viskip=tau, **kw)
            results = list(engine.generate(Request(prompt_inputs(processor, s), MAX_NEW, s["id"]) for s in evals))
            for r in results:
                assert r.sequences[0].tolist() == refs[r.key], (tau, batch, r.key)
                skipped = [k for v, k in zip(r.visual_shares, r.accept_lengths) if v >= tau]
                assert all(k == 1 for k in skipped)  # a skipped step decodes one token
            if tau == 0.0:
                assert all(k == 1 for r in results for k in r.accept_lengths)


@pytest.mark.slow
def test_viskip_with_a_drafter_skips_some_steps_and_drafts_others(tiny_world):
    adapter, processor, drafter, evals, _ = tiny_world
    engine = DecodeEngine(adapter, drafter, capacity=512, track_visual=True)
    shares = [v for s in evals
              for v in next(iter(engine.generate([Request(prompt_inputs(processor, s), MAX_NEW)]))).visual_shares]
    tau = sorted(shares)[len(shares) // 2]  # the median: about half the steps skip
    engine = DecodeEngine(adapter, drafter, capacity=512, viskip=tau)
    results = [next(iter(engine.generate([Request(prompt_inputs(processor, s), MAX_NEW)]))) for s in evals]
    flags = [v >= tau for r in results for v in r.visual_shares]
    assert 0 < sum(flags) < len(flags)
