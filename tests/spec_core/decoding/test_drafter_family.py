"""The trained drafter family on the engine - Medusa heads, the prefix (MSD-style) and compressed
(ViSpec-style) visual contexts of the feature drafter, and FOVEA feeding back its corrected state
(`feedback: corrected`): greedy output is token-identical
to HF `generate` on the tiny world's six tasks, alone and batched, with drafts accepted; a compressed
drafter's cache mask matches a fresh prefill's."""

from __future__ import annotations

import dataclasses

import pytest

from spec_core.decoding import DecodeEngine, Request, TreeConfig, load_drafter, speculative_generate
from spec_core.medusa import MedusaHeads, medusa_loss
from tests.spec_core.decoding.conftest import fit, prompt_inputs, train_drafter
from tests.spec_core.decoding.test_greedy import check_caches_against_fresh_prefills

MAX_NEW = 40
TREE = TreeConfig(width=8, depth=3, budget=30)  # MMSpec Table 6: depth 3, top-k 8, 30 tokens
pytestmark = pytest.mark.slow  # four drafters trained first


@pytest.fixture(scope="module")
def family(tiny_world, tmp_path_factory):
    adapter, _, _, _, data = tiny_world
    # 60 updates: every drafter already drafts the tiny world's answers whole (accept length 3 at
    # every step, as after 150)
    trained = {
        "prefix": train_drafter(adapter, data, 60, visual_correction=False, visual_context="prefix"),
        "compressed": train_drafter(adapter, data, 60, visual_correction=False, visual_context="compressed"),
        "feedback": train_drafter(adapter, data, 60, feedback="corrected"),  # the corrected state fed back
        "medusa": fit(MedusaHeads.from_target(adapter), medusa_loss, data, 60),
    }
    out = {}
    for name, model in trained.items():  # through the saved format, as the jobs load them
        model.save_pretrained(path := tmp_path_factory.mktemp(name))
        out[name] = load_drafter(path, adapter)
        assert type(out[name]) is type(model)
    return out



@pytest.mark.parametrize("name", ["prefix", "compressed", "feedback", "medusa"])
def test_greedy_equals_hf_generate_on_six_tasks_alone_and_batched(tiny_world, family, hf_refs, name, policy):
    adapter, processor, _, evals, _ = tiny_world
    tree = dataclasses.replace(TREE, policy=policy)
    drafter = family[name]
    eos = adapter.model.generation_config.eos_token_id
    refs = hf_refs(MAX_NEW)
    accepts = []
    for s in evals:
        spec = speculative_generate(adapter.model, drafter, prompt_inputs(processor, s), MAX_NEW,
                                    width=TREE.width, depth=TREE.depth, budget=TREE.budget, policy=policy)
        assert spec.sequences[0].tolist() == refs[s["id"]], (name, s["id"])
        accepts += spec.accept_lengths
    if policy == "fixed":  # multi-token paths exercised (a goodput policy per 3-token answer: its
        assert sum(accepts) / len(accepts) > 1.5, name  # two calibrating steps are most of it)
    engine = DecodeEngine(adapter, drafter, batch_size=3, capacity=512, tree=tree, eos_token_ids=eos)
    results = list(engine.generate(Request(prompt_inputs(processor, s), MAX_NEW, s["id"]) for s in evals))
    assert sorted(r.key for r in results) == sorted(refs)
    for r in results:
        assert r.sequences[0].tolist() == refs[r.key], (name, "batched", r.key)
    accepts = [a for r in results for a in r.accept_lengths]
    assert sum(accepts) / len(accepts) > 1.0, name  # one policy over every request: its trees accepted


def test_viskip_on_medusa_changes_steps_never_outputs(tiny_world, family):
    adapter, processor, _, evals, _ = tiny_world
    eos = adapter.model.generation_config.eos_token_id
    runs = {}
    for tau in (None, 0.0):  # 0: every step skips its draft
        engine = DecodeEngine(adapter, family["medusa"], batch_size=2, capacity=512, tree=TREE,
                              eos_token_ids=eos, viskip=tau)
        runs[tau] = {r.key: r for r in engine.generate(Request(prompt_inputs(processor, s), 24, s["id"])
                                                       for s in evals[::4])}
    for key, r in runs[0.0].items():
        assert r.sequences.tolist() == runs[None][key].sequences.tolist()
        assert set(r.accept_lengths) == {1}
    assert max(a for r in runs[None].values() for a in r.accept_lengths) > 1


@pytest.mark.parametrize("name", ["compressed", "medusa"])
def test_states_after_each_step_equal_a_fresh_prefill(tiny_world, family, name, policy):
    """Compressed: the drafter cache and its key mask; Medusa: the root state is the target's."""
    adapter, processor, _, evals, _ = tiny_world
    assert check_caches_against_fresh_prefills(adapter, processor, family[name], [evals[8], evals[16]], policy) >= 4
