"""Decoding on CUDA against HF `generate` (model.generate per sample, the oracle): the engine's AR
and speculation with a random drafter under both tree policies, alone and continuously batched,
eager and compiled (CUDA graphs, decoding.compiled), plus HF's own left-padded batches. fp32:
token-identical. bf16: greedy may part where logits tie within rounding; the mismatch rate is
printed and every divergence must be such a tie."""

from __future__ import annotations

import pytest
import torch

from spec_core.decoding import DecodeEngine, TreeConfig
from spec_core.decoding.hf_engine import HFEngine
from spec_core.fovea import FoveaDrafter
from spec_core.targets import adapter_for
from tests.gpu import conftest as gpu

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CAPACITY = 128  # prompts of <= 16 tokens + 24 new + one step's scratch (6x6x40 tree, 64 with CUDA graphs' buckets)


@pytest.fixture(autouse=True)
def dynamo_on(monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_engine_ar_and_speculation_against_hf_generate(dtype, compile):
    model = gpu.tiny_llava(dtype)
    adapter = adapter_for(model)
    torch.manual_seed(0)
    drafter = FoveaDrafter.from_target(adapter, n_blocks=1, k_min=2, k_max=4).to(model.device).eval()
    reqs = gpu.requests(6, 24)
    ref = gpu.outputs(HFEngine(adapter, batch_size=1), reqs)
    assert all(len(r) == 24 for r in ref)
    mismatch, rates = gpu.bench_gpu().mismatch_rate, {}
    for b in (1, 3):
        sides = {"ar": DecodeEngine(adapter, None, batch_size=b, capacity=CAPACITY, compile=compile)}
        if b > 1:
            sides["hf"] = HFEngine(adapter, batch_size=b, compile=compile)
        for policy in ("fixed", "goodput"):
            sides[policy] = DecodeEngine(adapter, drafter, batch_size=b, capacity=CAPACITY, tree=TreeConfig(policy=policy),
                                         compile=compile)
        for name, engine in sides.items():
            out = gpu.outputs(engine, reqs)
            rates[f"{name}@{b}"] = mismatch(ref, out)
            if dtype == torch.float32:
                assert out == ref, (name, b)
            for r, a, o in zip(reqs, ref, out):
                if a != o:
                    gpu.assert_divergence_is_a_tie(model, r, a, o)
            if compile and hasattr(engine, "compile_stats"):
                assert engine.compile_stats()["recompiles"] == 0, (name, b, engine.compile_stats())
    print(f"\n{dtype} {'compiled' if compile else 'eager'} token mismatch vs HF generate: "
          + ", ".join(f"{k} {v:.1%}" for k, v in rates.items()))
    assert max(rates.values()) <= 0.9  # loose: every divergence above was checked to be a tie
