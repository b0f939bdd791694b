"""Greedy speculative and AR decoding are token-identical to HF `generate`, batched or not."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from spec_core.decoding import DecodeEngine, Request, TreeConfig, ar_generate, speculative_generate
from spec_core.decoding.cache import dynamic_cache_kv
from spec_core.fovea import FoveaDrafter
from spec_core.fovea.unroll import image_ranks
from spec_core.medusa import MedusaHeads
from tests.spec_core.decoding.conftest import hf_greedy, prompt_inputs
from tests.spec_core.targets.conftest import build_llava_next, build_qwen, llava_next_batch, qwen_batch


def test_speculative_and_ar_equal_hf_generate_on_the_tiny_world(tiny_world, policy):
    adapter, processor, drafter, evals, _ = tiny_world
    accepts, eos_inside = [], 0
    eos = set(adapter.model.generation_config.eos_token_id)
    for s in evals:
        inputs = prompt_inputs(processor, s)
        ref = hf_greedy(adapter.model, inputs, 40)
        spec = speculative_generate(adapter.model, drafter, inputs, 40, policy=policy)
        assert spec.sequences[0].tolist() == ref, s["id"]
        assert ar_generate(adapter.model, inputs, 40).sequences[0].tolist() == ref, s["id"]
        for scoring in ({"correction_depth": 6}, {"visual_correction": False}):  # other draft scorings
            assert speculative_generate(adapter.model, drafter, inputs, 40, policy=policy,
                                        **scoring).sequences[0].tolist() == ref
        assert sum(spec.accept_lengths) + 1 == len(ref)  # the first token comes from the prefill
        accepts += spec.accept_lengths
        eos_inside += ref[-1] in eos and spec.accept_lengths[-1] > 1
    assert sum(accepts) / len(accepts) > (1.5 if policy == "fixed" else 1.0)  # multi-token paths are tested
    assert eos_inside > 0 or policy == "goodput"  # EOS reached inside an accepted path


def test_max_new_tokens_reached_mid_path(tiny_world, policy):
    adapter, processor, drafter, evals, _ = tiny_world
    for s in evals[:6]:
        inputs = prompt_inputs(processor, s)
        for n in (1, 2, 3, 5, 8):
            spec = speculative_generate(adapter.model, drafter, inputs, n, policy=policy)
            assert spec.sequences[0].tolist() == hf_greedy(adapter.model, inputs, n)


@pytest.mark.parametrize("tree", [TreeConfig(), TreeConfig(width=2, depth=3, budget=4), TreeConfig(width=1, depth=1, budget=1),
                                  TreeConfig(step_tokens=8)])  # trees shrink while 3 samples share a step
def test_batched_decoding_gives_each_sample_its_batch1_output(tiny_world, tree, policy):
    tree = dataclasses.replace(tree, policy=policy)
    adapter, processor, drafter, evals, _ = tiny_world
    samples = evals[::3]  # prompts of different lengths, over all tasks
    alone = {s["id"]: speculative_generate(adapter.model, drafter, prompt_inputs(processor, s), 30,
                                           width=tree.width, depth=tree.depth, budget=tree.budget,
                                           step_tokens=tree.step_tokens, policy=policy).sequences[0].tolist()
             for s in samples}
    for spec_drafter in (drafter, None):
        engine = DecodeEngine(adapter, spec_drafter, batch_size=3, capacity=512, tree=tree,
                              eos_token_ids=adapter.model.generation_config.eos_token_id)
        results = list(engine.generate(Request(prompt_inputs(processor, s), 30, s["id"]) for s in samples))
        assert sorted(r.key for r in results) == sorted(alone)  # every request once (continuous batching)
        for r in results:
            assert r.sequences[0].tolist() == alone[r.key], r.key


def _fresh_kv(adapter, drafter, inputs, committed):
    """Target and drafter KV of a fresh prefill of prompt + committed[:-1] (the root is not cached),
    and the root state (Medusa heads: the target's last state)."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([committed[:-1]], dtype=torch.long)], 1)
    full = {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    cache = DynamicCache()
    out = adapter.prefill(full, cache=cache)
    if isinstance(drafter, MedusaHeads):
        return dynamic_cache_kv(cache), [], out.final_hidden_BTD[0, -1]
    T = ids.shape[1]
    dcache = DynamicCache()
    tokens = torch.cat([ids[:, 1:], torch.tensor([[committed[-1]]])], 1)
    ranks = torch.cat([image_ranks(ids, drafter.image_token_id)[:, 1:], torch.tensor([[-1]])], 1)
    x = drafter.input_states(tokens, out.final_hidden_BTD, out.visual_BPD, ranks, out.visual_valid_BP)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    if (keep := drafter.context_keep(tokens, ranks)) is not None:
        causal = causal & keep[:, None, :]
    h, _ = drafter.blocks(x, torch.arange(T)[None], causal, dcache)
    return dynamic_cache_kv(cache), dynamic_cache_kv(dcache), h[0, -1]


def check_caches_against_fresh_prefills(adapter, processor, drafter, samples, policy: str = "fixed") -> int:
    """Decode two samples step by step; after each step the caches and root states equal those of a
    fresh prefill of the committed sequence. Returns the number of (step, sample) checks."""
    engine = DecodeEngine(adapter, drafter, batch_size=2, capacity=512,  # no EOS: several steps each
                          tree=TreeConfig(policy=policy))
    # both prompts in one left-padded prefill: each row's cache must equal its own prefill's
    assert engine._admit([(b, Request(prompt_inputs(processor, s), 24, s["id"])) for b, s in enumerate(samples)]) == []
    if engine.mem is not None:  # ... and each row's visual memory its own prompt's
        for b, s in enumerate(samples):
            out = adapter.prefill(prompt_inputs(processor, s), cache=DynamicCache())
            mem = drafter.memory(out.visual_BPD, out.visual_valid_BP)
            P = mem.keys_BPD.shape[1]
            torch.testing.assert_close(engine.mem.keys_BPD[b, :P], mem.keys_BPD[0], atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(engine.mem.values_BPD[b, :P], mem.values_BPD[0], atol=2e-5, rtol=1e-4)
            assert engine.mem.valid_BP[b, :P].equal(mem.valid_BP[0]) and not engine.mem.valid_BP[b, P:].any()
    checked = deferred = 0
    while any(slot is not None for slot in engine.slots):
        engine.step()
        for b, s in enumerate(samples):
            slot = engine.slots[b]
            if slot is None:
                continue
            n = int(engine.len_B[b])
            target_kv, drafter_kv, root_h = _fresh_kv(adapter, drafter, prompt_inputs(processor, s), slot.tokens)
            for (k, v), (rk, rv) in zip(target_kv, engine.tcache.row_prefix(b, n)):
                assert k.shape[-2] == n
                torch.testing.assert_close(rk, k[0], atol=2e-5, rtol=1e-4)
                torch.testing.assert_close(rv, v[0], atol=2e-5, rtol=1e-4)
            # goodput's AR steps defer the drafter: its cache holds the first dlen entries and the
            # rest wait in the pending buffer (fed at the next drafting step)
            dn = engine.dlen_host[b] if drafter_kv else n  # Medusa: no drafter cache
            assert not drafter_kv or dn + engine.pend_host[b] == n == int(engine.dlen_B[b] + engine.pend_B[b])
            for (k, _), (rk, _) in zip(drafter_kv, engine.dcache.row_prefix(b, dn) if drafter_kv else []):
                torch.testing.assert_close(rk, k[0, :, :dn], atol=2e-5, rtol=1e-4)
            if dn == n:
                torch.testing.assert_close(engine.root_h_BD[b], root_h, atol=2e-5, rtol=1e-4)
            checked += 1
            deferred += dn < n
    assert deferred < checked  # the drafter's full state is checked at some steps
    # goodput defers at least at its exploration step of 0 nodes; a fixed tree never defers
    assert (deferred > 0) == (policy == "goodput" and not isinstance(drafter, MedusaHeads))
    return checked


def test_caches_after_each_step_equal_a_fresh_prefill(tiny_world, policy):
    adapter, processor, drafter, evals, _ = tiny_world
    # a caption and a reasoning answer: long
    assert check_caches_against_fresh_prefills(adapter, processor, drafter, [evals[8], evals[16]], policy) >= 4


@pytest.mark.parametrize("build,batch", [(build_llava_next, llava_next_batch), (build_qwen, qwen_batch)])
def test_random_llava_next_and_qwen_targets(build, batch, policy):
    model = build()
    model.generation_config.eos_token_id = None  # random weights: decode the full length
    drafter = FoveaDrafter.from_target(model, n_blocks=1, k_min=2, k_max=4).eval()
    full = batch()
    for row in range(2):  # one sample at a time, without its padding
        real = full["attention_mask"][row].bool()
        inputs = {"input_ids": full["input_ids"][row][real][None],
                  "attention_mask": torch.ones(1, int(real.sum()), dtype=torch.long)}
        if "image_sizes" in full:
            inputs |= {"pixel_values": full["pixel_values"][row: row + 1], "image_sizes": full["image_sizes"][row: row + 1]}
        else:
            grid = full["image_grid_thw"]
            start = int(grid[:row].prod(-1).sum())
            inputs |= {"pixel_values": full["pixel_values"][start: start + int(grid[row].prod())],
                       "image_grid_thw": grid[row: row + 1],
                       "mm_token_type_ids": (inputs["input_ids"] == model.config.image_token_id).long()}
        ref = hf_greedy(model, inputs, 12)
        assert len(ref) == 12
        assert speculative_generate(model, drafter, inputs, 12, policy=policy).sequences[0].tolist() == ref
        assert ar_generate(model, inputs, 12).sequences[0].tolist() == ref
