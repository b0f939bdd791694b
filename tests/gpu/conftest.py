"""Helpers of the CUDA tests: the tiny random LLaVA of tests/spec_core/targets on the device in a
given dtype, one-image requests for it, and the oracle check for bf16 outputs that differ from HF
(the divergence must sit where the exact logits tie within the bf16 forward's own error)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

from spec_core.decoding import Request
from tests.spec_core.targets.conftest import build_llava, sample

DEVICE = "cuda"  # read at call time: the helpers can be dry-run on "cpu"


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 means fp32: no TF32 in matmuls or cuDNN convolutions (the vision tower's patch
    embedding), whose rounding would differ between HF's padded batches and the engine's rows."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def bench_gpu():
    """scripts/bench_gpu.py as a module (its mismatch_rate is the one the benchmark reports)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_llava(dtype: torch.dtype):
    """The tiny random LLaVA (seeded, eval, frozen) on DEVICE, EOS off (random weights)."""
    model = build_llava().to(DEVICE, dtype)
    model.generation_config.eos_token_id = None
    return model


def requests(n: int, max_new: int, seed: int = 0) -> list[Request]:
    """n unpadded one-image prompts of different lengths (HF left-pads them when batched)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = sample(gen, 2 + i % 3, 4, 3 + (2 * i) % 5)
        out.append(Request({"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                            "pixel_values": torch.randn(1, 3, 16, 16, generator=gen)}, max_new, key=i))
    return out


def outputs(engine, reqs: list[Request]) -> list[list[int]]:
    return [r.sequences[0].tolist() for r in sorted(engine.generate(reqs), key=lambda r: r.key)]


@torch.no_grad()
def assert_divergence_is_a_tie(model, request: Request, ref: list[int], out: list[int], slack: float = 4.0) -> None:
    """At the first position where `out` leaves `ref`, the two tokens' logits under the exact
    (fp32) model differ by at most `slack` x the largest logit error of a plain forward in the
    model's own dtype: greedy picked between near-equal logits, not a wrong token."""
    j = next(i for i, (a, b) in enumerate(zip(ref, out)) if a != b)
    ids = torch.cat([request.inputs["input_ids"], torch.tensor([ref[:j]], dtype=torch.long)], 1).to(model.device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "pixel_values": request.inputs["pixel_values"].to(model.device)}
    low_V = model(**inputs).logits[0, -1].float()
    exact_V = copy.deepcopy(model).float()(**inputs).logits[0, -1]
    gap, noise = (exact_V[ref[j]] - exact_V[out[j]]).abs().item(), (low_V - exact_V).abs().max().item()
    assert gap <= slack * noise + 1e-6, (f"request {request.key} position {j}: tokens {ref[j]} vs {out[j]}, "
                                         f"exact logit gap {gap:.4g} > {slack} x the {model.dtype} error {noise:.4g}")
