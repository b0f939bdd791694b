"""Tiny drafters on tiny random LLaVA / Qwen2.5-VL targets, and synthetic artifact batches."""

from __future__ import annotations

import pytest
import torch

from spec_core.fovea import DraftSample, FoveaDrafter, collate
from spec_core.targets import adapter_for
from tests.spec_core.targets.conftest import build_llava, build_qwen

SMALL = dict(k_min=2, k_max=4, correction_hidden=16, max_depth=4)


@pytest.fixture(scope="module")
def llava_adapter():
    return adapter_for(build_llava())


@pytest.fixture(scope="module")
def qwen_adapter():
    return adapter_for(build_qwen())


def drafter_for(adapter, seed: int = 0, **overrides) -> FoveaDrafter:
    torch.manual_seed(seed)
    return FoveaDrafter.from_target(adapter, **{**SMALL, **overrides})


def synthetic_batch(hidden: int, lengths=(14, 10), answer: int = 5, n_visual=(6, 3), seed: int = 0):
    """Samples shaped like precompute artifacts: the last `answer` tokens are the assistant's."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for T, P in zip(lengths, n_visual):
        loss = torch.zeros(T, dtype=torch.bool)
        loss[T - answer:] = True
        mid_valid = loss.clone()
        mid_valid[:-1] |= loss[1:]
        samples.append(DraftSample(torch.randint(3, 90, (T,), generator=g), loss,
                                   torch.randn(T, hidden, generator=g),
                                   torch.randn(T, hidden, generator=g) * mid_valid[:, None], mid_valid,
                                   torch.randn(P, hidden, generator=g)))
    return collate(samples)
