"""RaggedCache against a plain per-slot oracle: loads, scattered and sliced writes, moves that
read every source before writing, dropped rows, growth past the first allocation (contents kept,
scratch finite), and the capacity bound."""

from __future__ import annotations

import pytest
import torch

from spec_core.decoding.cache import MIN_ALLOC, RaggedCache

B, H, HD, HV, LAYERS, CAP = 3, 2, 4, 5, 2, 300


def _oracle():
    return [[torch.zeros(B, H, CAP, HD), torch.zeros(B, H, CAP, HV)] for _ in range(LAYERS)]


def _check(cache: RaggedCache, truth, kv_len: int) -> None:
    for layer, (k, v) in zip(cache.layers, truth):
        assert layer.keys.shape[2] >= kv_len and torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all()
        torch.testing.assert_close(layer.keys[:, :, :kv_len], k[: layer.keys.shape[0], :, :kv_len], rtol=0, atol=0)
        torch.testing.assert_close(layer.values[:, :, :kv_len], v[: layer.values.shape[0], :, :kv_len], rtol=0, atol=0)


def _forward(cache: RaggedCache, truth, write_BS: torch.Tensor, kv_len: int, start: int | None = None):
    """What an attention layer does through the Cache hook, and the oracle's per-slot writes."""
    S = write_BS.shape[1]
    cache.plan(None if start is not None else write_BS, kv_len, start=start)
    for i, (k, v) in enumerate(truth):
        new_k, new_v = torch.randn(B, H, S, HD), torch.randn(B, H, S, HV)
        got_k, got_v = cache.update(new_k, new_v, i)
        for b in range(B):
            for s in range(S):
                k[b, :, write_BS[b, s]] = new_k[b, :, s]
                v[b, :, write_BS[b, s]] = new_v[b, :, s]
        assert got_k.shape[2] == kv_len == got_v.shape[2]
        torch.testing.assert_close(got_k, k[:, :, :kv_len], rtol=0, atol=0)


def test_writes_moves_and_growth_equal_a_per_slot_oracle():
    torch.manual_seed(0)
    cache, truth = RaggedCache(B, CAP, LAYERS), _oracle()
    lens = [7, 12, 3]
    for b, n in enumerate(lens):
        kv = [(torch.randn(1, H, n, HD), torch.randn(1, H, n, HV)) for _ in range(LAYERS)]
        cache.load(b, kv)
        for (k, v), (tk, tv) in zip(kv, truth):
            tk[b, :, :n], tv[b, :, :n] = k[0], v[0]
    assert cache.layers[0].keys.shape[2] == MIN_ALLOC  # not the capacity
    _check(cache, truth, max(lens))
    for step in range(40):  # ragged tree-like writes of 5 slots past each row's length, then moves
        write_BS = torch.tensor(lens)[:, None] + torch.arange(5)
        kv_len = max(lens) + 5
        _forward(cache, truth, write_BS, kv_len)
        a = [step % 4, (step + 1) % 3, 2]  # accepted per row: slots L+1.. <- some of L+1..L+4
        src = [[L] * 3 for L in lens]
        dst = [list(r) for r in src]
        for b, L in enumerate(lens):
            picks = sorted(torch.randperm(4)[: a[b]].tolist())
            src[b][: a[b]] = [L + 1 + p for p in picks]
            dst[b][: a[b]] = range(L + 1, L + 1 + a[b])
        before = [[t.clone() for t in pair] for pair in truth]
        cache.keep(torch.tensor(src), torch.tensor(dst))
        for (tk, tv), (bk, bv) in zip(truth, before):
            for b in range(B):
                for s_, d_ in zip(src[b], dst[b]):
                    tk[b, :, d_], tv[b, :, d_] = bk[b, :, s_], bv[b, :, s_]
        _check(cache, truth, kv_len)
        lens = [L + 1 + n for L, n in zip(lens, a)]
    assert MIN_ALLOC < max(lens) < CAP and cache.layers[0].keys.shape[2] >= max(lens)  # grew, contents kept
    same = min(lens)  # rows at one length write one slice
    lens_eq = torch.full((B, 1), same)
    _forward(cache, truth, lens_eq, max(lens) + 1, start=same)
    _check(cache, truth, max(lens) + 1)


def test_dropped_rows_and_the_capacity_bound():
    cache, truth = RaggedCache(B, CAP, LAYERS), _oracle()
    _forward(cache, truth, torch.tensor([[0, 1], [0, 1], [0, 1]]), 2, start=0)
    cache.select_rows(torch.tensor([2, 0]))
    for layer, (k, _) in zip(cache.layers, truth):
        torch.testing.assert_close(layer.keys[:, :, :2], k[[2, 0], :, :2], rtol=0, atol=0)
    assert cache.batch == 2 and cache.layers[0].keys.shape[0] == 2
    with pytest.raises(ValueError, match="capacity 300 exceeded"):
        cache.plan(torch.tensor([[CAP]]), None)
    with pytest.raises(ValueError, match="does not fit the cache capacity 300"):
        cache.load(0, [(torch.zeros(1, H, CAP + 1, HD), torch.zeros(1, H, CAP + 1, HV))])
