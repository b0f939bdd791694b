"""cumulative_mass_weights and the fixed / dense modes against a brute-force loop over rows."""

from __future__ import annotations

import math

import pytest
import torch

from spec_core.fovea.retrieval import (cumulative_mass_weights, dense_weights, fixed_k_weights,
                                       retrieval_weights)


def brute_force(scores: list[float], valid: list[bool], rho: float, k_min: int, k_max: int):
    """Eq. 5-7 on one row, in plain Python; ties go to the lower index."""
    idx = [i for i in range(len(scores)) if valid[i]]
    if not idx:
        return [0.0] * len(scores), 0
    top = max(scores[i] for i in idx)
    z = sum(math.exp(scores[i] - top) for i in idx)
    order = sorted(idx, key=lambda i: (-scores[i], i))
    mass, k_raw = 0.0, len(idx)
    for n, i in enumerate(order, start=1):
        mass += math.exp(scores[i] - top) / z
        if mass >= rho - 1e-9:
            k_raw = n
            break
    k = min(max(k_raw, k_min), k_max, len(idx))
    chosen = order[:k]
    zc = sum(math.exp(scores[i] - top) for i in chosen)
    w = [math.exp(scores[i] - top) / zc if i in chosen else 0.0 for i in range(len(scores))]
    return w, k


def check_rows(scores, valid, rho, k_min, k_max):
    w, k = cumulative_mass_weights(scores, valid, rho, k_min, k_max)
    for r in range(scores.shape[0]):
        bw, bk = brute_force(scores[r].tolist(), valid[r].tolist(), rho, k_min, k_max)
        assert int(k[r]) == bk, (r, scores[r], valid[r])
        torch.testing.assert_close(w[r], torch.tensor(bw, dtype=w.dtype), atol=1e-6, rtol=1e-5)


def test_hand_example():
    probs = torch.tensor([[0.1, 0.5, 0.1, 0.3]])
    w, k = cumulative_mass_weights(probs.log(), torch.ones_like(probs, dtype=torch.bool), 0.8, 1, 8)
    assert k.tolist() == [2]  # 0.5 + 0.3 reaches 0.8
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.625, 0.0, 0.375]]))


@pytest.mark.parametrize("rho,k_min,k_max", [(0.8, 1, 64), (0.5, 1, 3), (0.95, 4, 6), (0.3, 5, 9), (1.0, 1, 64)])
def test_random_rows_match_brute_force(rho, k_min, k_max):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 12, generator=g, dtype=torch.float64) * 2.0
    valid = torch.rand(64, 12, generator=g) < 0.8
    check_rows(scores, valid, rho, k_min, k_max)


def test_ties_go_to_the_lower_index():
    scores = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]], dtype=torch.float64)
    valid = torch.ones_like(scores, dtype=torch.bool)
    check_rows(scores, valid, 0.5, 1, 8)
    w, k = cumulative_mass_weights(scores, valid, 0.5, 2, 2)
    assert k.tolist() == [2] and w[0, 1] > 0 and w[0, 2] > 0 and w[0, 3] == 0


def test_all_invalid_rows_give_zero_weights_and_k_zero():
    scores = torch.randn(3, 5, dtype=torch.float64)
    valid = torch.tensor([[False] * 5, [True, False, False, False, False], [False] * 5])
    w, k = cumulative_mass_weights(scores, valid, 0.8, 2, 4)
    assert k.tolist() == [0, 1, 0]
    assert not w.isnan().any() and w[0].abs().sum() == 0 and w[1, 0] == 1.0
    check_rows(scores, valid, 0.8, 2, 4)


def test_fewer_valid_entries_than_k_min_take_them_all():
    scores = torch.randn(4, 10, dtype=torch.float64)
    valid = torch.zeros(4, 10, dtype=torch.bool)
    valid[:, :3] = True
    w, k = cumulative_mass_weights(scores, valid, 0.1, 32, 256)
    assert k.tolist() == [3] * 4
    torch.testing.assert_close(w.sum(-1), torch.ones(4, dtype=torch.float64))
    check_rows(scores, valid, 0.1, 32, 256)


def test_k_max_clamps_a_flat_distribution():
    scores = torch.zeros(2, 50, dtype=torch.float64)  # uniform: k_raw = 40 at rho 0.8
    valid = torch.ones(2, 50, dtype=torch.bool)
    w, k = cumulative_mass_weights(scores, valid, 0.8, 1, 7)
    assert k.tolist() == [7, 7]
    torch.testing.assert_close(w[0, :7], torch.full((7,), 1 / 7, dtype=torch.float64))
    assert cumulative_mass_weights(scores, valid, 0.8, 1, 256)[1].tolist() == [40, 40]


def test_leading_dims_and_gradients_reach_only_selected_scores():
    scores = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(2, 3, 6, dtype=torch.bool)
    w, k = cumulative_mass_weights(scores, valid, 0.6, 1, 3)
    assert w.shape == (2, 3, 6) and k.shape == (2, 3)
    (w * torch.randn_like(w)).sum().backward()
    assert (scores.grad[w == 0] == 0).all()


def test_fixed_and_dense_modes():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(16, 9, generator=g, dtype=torch.float64)
    valid = torch.rand(16, 9, generator=g) < 0.7
    w, k = fixed_k_weights(scores, valid, 4)
    for r in range(16):  # fixed K = cumulative with k_min = k_max = K
        bw, bk = brute_force(scores[r].tolist(), valid[r].tolist(), 1.0, 4, 4)
        assert int(k[r]) == bk
        torch.testing.assert_close(w[r], torch.tensor(bw, dtype=w.dtype))
    w, k = dense_weights(scores, valid)
    assert k.tolist() == valid.sum(-1).tolist()
    expect = torch.softmax(scores.masked_fill(~valid, float("-inf")), -1).nan_to_num(0.0)
    torch.testing.assert_close(w, expect)
    with pytest.raises(ValueError, match="unknown retrieval mode"):
        retrieval_weights(scores, valid, "sparse")
