"""Visual memory, retrieval readout and the gated correction against Eq. 2-9 written out."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from spec_core.fovea import FoveaConfig, VisualCorrection

D = 8


def module(**kw) -> VisualCorrection:
    torch.manual_seed(0)
    return VisualCorrection(D, FoveaConfig(**{"k_min": 2, "k_max": 3, "correction_hidden": 5, "max_depth": 3, **kw}))


@torch.no_grad()
def by_hand(m: VisualCorrection, h, depth, visual, valid, rho=0.8, k_min=2, k_max=3):
    v = F.layer_norm(visual, (D,), m.visual_norm.weight, m.visual_norm.bias)
    keys, vals = v @ m.w_k.weight.T, v @ m.w_u.weight.T
    q = F.layer_norm(h, (D,), m.query_norm.weight, m.query_norm.bias) + m.depth.weight[depth]
    q = q @ m.w_q.weight.T
    s = [float(q @ keys[i]) / math.sqrt(D) if valid[i] else None for i in range(len(valid))]
    idx = sorted([i for i in range(len(s)) if s[i] is not None], key=lambda i: -s[i])
    p = torch.softmax(torch.tensor([s[i] for i in idx]), 0)
    k = next(n for n in range(1, len(idx) + 1) if p[:n].sum() >= rho)
    k = min(max(k, k_min), k_max, len(idx))
    a = torch.softmax(torch.tensor([s[i] for i in idx[:k]]), 0)
    r = sum(a[j] * vals[idx[j]] for j in range(k))
    hr = torch.cat([h, r])
    c = m.f[2](F.silu(m.f[0](hr)))
    g = torch.sigmoid(m.g[2](F.silu(m.g[0](hr))))
    x = h + g * c
    return x / torch.sqrt(x.pow(2).mean() + m.norm.eps) * m.norm.weight, k


def test_correction_matches_the_equations():
    m = module()
    g = torch.Generator().manual_seed(1)
    visual = torch.randn(1, 6, D, generator=g)
    valid = torch.tensor([[True, True, True, True, False, True]])
    h = torch.randn(1, 2, D, generator=g)
    depth = torch.tensor([[0, 1]])
    out = m(h, depth, m.memory(visual, valid))
    for s in range(2):
        expect, k = by_hand(m, h[0, s], int(depth[0, s]), visual[0], valid[0].tolist())
        torch.testing.assert_close(out.hidden_BSD[0, s], expect, atol=1e-5, rtol=1e-5)
        assert int(out.k_BS[0, s]) == k


def test_deep_states_pass_through_and_switches():
    m = module(correction_depth=0)
    visual, valid = torch.randn(2, 4, D), torch.ones(2, 4, dtype=torch.bool)
    h = torch.randn(2, 3, D)
    depth = torch.tensor([[0, 1, 2], [2, 0, 5]])
    out = m(h, depth, m.memory(visual, valid))
    deep = depth > 0
    assert torch.equal(out.hidden_BSD[deep], h[deep]) and (out.k_BS[deep] == 0).all()
    assert not torch.allclose(out.hidden_BSD[~deep], h[~deep])
    deeper = m(h, depth, m.memory(visual, valid), correction_depth=2)  # an inference-time override
    trained = module(correction_depth=2)
    torch.testing.assert_close(deeper.hidden_BSD, trained(h, depth, trained.memory(visual, valid)).hidden_BSD)
    assert torch.equal(deeper.hidden_BSD[depth > 2], h[depth > 2])
    no_gate = module(gate=False)
    assert (no_gate(h, depth, no_gate.memory(visual, valid)).gate_BS == 1).all()
    flat = module(depth_embedding=False, correction_depth=5)
    a = flat(h, torch.zeros_like(depth), flat.memory(visual, valid)).hidden_BSD
    b = flat(h, torch.full_like(depth, 3), flat.memory(visual, valid)).hidden_BSD
    torch.testing.assert_close(a, b)


def test_an_image_free_sample_reads_nothing():
    m = module()
    out = m(torch.randn(1, 2, D), torch.zeros(1, 2, dtype=torch.long),
            m.memory(torch.zeros(1, 3, D), torch.zeros(1, 3, dtype=torch.bool)))
    assert (out.k_BS == 0).all() and torch.isfinite(out.hidden_BSD).all()
