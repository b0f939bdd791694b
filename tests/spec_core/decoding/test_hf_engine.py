"""HFEngine: HF `generate` behind the engine's interface. Its greedy output equals the engine's AR
(and HF `generate` per sample) token for token, alone and in left-padded batches; it stops at EOS
and at max_new_tokens like the engine; pad_batch builds what the processor would for a batch."""

from __future__ import annotations

import torch

from spec_core.decoding import DecodeEngine, Request, SamplingConfig
from spec_core.decoding.hf_engine import HFEngine
from spec_core.decoding.padding import pad_batch
from tests.spec_core.decoding.conftest import prompt_inputs


def _requests(processor, samples, max_new, short: int | None = None):
    """One request per sample; with `short`, every other one stops after that many tokens."""
    return [Request(prompt_inputs(processor, s), short if short and i % 2 else max_new, key=s["id"])
            for i, s in enumerate(samples)]


def _eos(adapter) -> list[int]:
    eos = adapter.model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def test_greedy_equals_the_engines_ar_alone_and_padded(tiny_world):
    adapter, processor, _, evals, _ = tiny_world
    samples = evals[::2]  # prompts of different lengths (padding), every task
    eos = _eos(adapter)
    ar = {r.key: r for r in DecodeEngine(adapter, None, batch_size=1, capacity=512, eos_token_ids=eos)
          .generate(_requests(processor, samples, 40, short=2))}
    for batch in (1, 3):
        hf = {r.key: r for r in HFEngine(adapter, batch_size=batch, eos_token_ids=eos)
              .generate(_requests(processor, samples, 40, short=2))}
        assert hf.keys() == ar.keys()
        for key, r in ar.items():
            assert hf[key].sequences.tolist() == r.sequences.tolist(), (batch, key)
            assert hf[key].finished_by == r.finished_by and hf[key].steps == r.steps
    assert any(r.finished_by == "eos" for r in ar.values()) and any(r.finished_by == "length" for r in ar.values())


def test_max_new_tokens_per_request_in_one_batch(tiny_world):
    adapter, processor, _, evals, _ = tiny_world
    reqs = [Request(prompt_inputs(processor, s), n, key=n) for s, n in zip(evals[:3], (2, 5, 9))]
    out = {r.key: r for r in HFEngine(adapter, batch_size=3).generate(reqs)}
    assert {k: r.sequences.shape[1] for k, r in out.items()} == {2: 2, 5: 5, 9: 9}  # EOS off: each its own length


def test_sampling_is_seeded_by_the_engines_generator(tiny_world):
    adapter, processor, _, evals, _ = tiny_world
    sampling = SamplingConfig(do_sample=True, temperature=1.5)
    runs = []
    for seed in (0, 0, 1):
        engine = HFEngine(adapter, sampling=sampling, generator=torch.Generator().manual_seed(seed))
        runs.append([r.sequences.tolist() for r in engine.generate(_requests(processor, evals[:4], 20))])
    assert runs[0] == runs[1] != runs[2]


def test_pad_batch_left_pads_tokens_and_stacks_images():
    a = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
         "pixel_values": torch.zeros(1, 3, 4, 4)}
    b = {"input_ids": torch.tensor([[8]]), "attention_mask": torch.ones(1, 1, dtype=torch.long),
         "pixel_values": torch.ones(1, 3, 4, 4)}
    out = pad_batch([a, b], pad_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert out["pixel_values"].shape == (2, 3, 4, 4) and out["pixel_values"][1].eq(1).all()
