"""spec_core.sampling against HF's own warpers (TemperatureLogitsWarper -> TopKLogitsWarper ->
TopPLogitsWarper, the order `generate` applies them) on random logits with ties, and the image
generators' extras (CFG, structural mask, greedy one-hot) against their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from spec_core.sampling import entropy_nats, processed_probs, warp_logits
from tests.hf_warpers import hf_probs, hf_warp


def logits_with_ties(seed: int, B: int = 64, V: int = 50) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, V, generator=g) * 3
    return (x * 2).round() / 2  # many equal values: ties at the top-k and top-p boundaries


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("top_k", [0, 1, 5, 49, 50, 80])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.5, 0.05])
def test_warp_logits_equals_hfs_warpers(temperature, top_k, top_p):
    for seed in range(3):
        x = logits_with_ties(seed)
        ours, hf = warp_logits(x, temperature, top_k, top_p), hf_warp(x, temperature, top_k, top_p)
        assert torch.equal(torch.isinf(ours), torch.isinf(hf))
        assert torch.equal(ours[~torch.isinf(ours)], hf[~torch.isinf(hf)])
        assert torch.isfinite(ours).any(-1).all()  # at least one token always survives


def test_processed_probs_adds_cfg_the_mask_and_greedy_around_the_warpers():
    g = torch.Generator().manual_seed(3)
    cond, uncond = torch.randn(4, 12, generator=g), torch.randn(4, 12, generator=g)
    allowed = torch.ones(12, dtype=torch.bool)
    allowed[[0, 5, 7]] = False
    guided = uncond + 2.5 * (cond - uncond)
    want = hf_probs(cond, uncond, 2.5, 0.8, 6, 0.9, allowed)
    got = processed_probs(cond, uncond, 2.5, 0.8, 6, 0.9, allowed)
    torch.testing.assert_close(got, want)
    assert (got[:, ~allowed] == 0).all()
    greedy = processed_probs(cond, uncond, 2.5, 0.0, 0, 1.0, allowed)
    assert torch.equal(greedy.argmax(-1), guided.masked_fill(~allowed, -math.inf).argmax(-1))
    assert torch.equal(greedy.sum(-1), torch.ones(4)) and torch.equal((greedy > 0).sum(-1), torch.ones(4, dtype=torch.long))
    assert float(entropy_nats(torch.tensor([0.5, 0.5, 0.0]))) == pytest.approx(math.log(2))
