"""Keyed noise: uniform, independent across keys and streams, reproducible, overflow-free."""

import torch

from spec_core.decoding import noise


def test_mul32_matches_python_modular_product():
    x = torch.randint(0, 2**32, (1000,), dtype=torch.long)
    for c in (0x7FEB352D, 0x846CA68B, 0xFFFFFFFF):
        want = torch.tensor([(int(v) * c) % 2**32 for v in x])
        assert torch.equal(noise._mul32(x, c), want)


def test_uniforms_are_uniform_and_reproducible():
    pos = torch.arange(200_000)
    u = noise.uniform(7, 3, pos, 5, noise.ACCEPT)
    assert torch.equal(u, noise.uniform(7, 3, pos, 5, noise.ACCEPT))
    assert 0 < float(u.min()) and float(u.max()) < 1
    hist = torch.histc(u, bins=20, min=0, max=1)
    expected = len(u) / 20
    chi2 = float(((hist - expected) ** 2 / expected).sum())
    assert chi2 < 60  # df 19: p < 1e-6 beyond ~60
    # Kolmogorov distance to U(0, 1)
    s = u.sort().values
    assert float((s - (torch.arange(len(s)) + 0.5) / len(s)).abs().max()) < 0.01


def test_keys_and_streams_decorrelate():
    pos = torch.arange(100_000)
    a = noise.uniform(0, 0, pos, 1, noise.ACCEPT)
    for other in (noise.uniform(0, 0, pos, 1, noise.RESIDUAL), noise.uniform(0, 1, pos, 1, noise.ACCEPT),
                  noise.uniform(0, 0, pos, 2, noise.ACCEPT), noise.uniform(1, 0, pos, 1, noise.ACCEPT),
                  noise.uniform(0, 0, pos + 1, 1, noise.ACCEPT)):
        assert abs(float(torch.corrcoef(torch.stack([a, other]))[0, 1])) < 0.02
        assert float((a == other).float().mean()) < 0.001


def test_gumbel_max_samples_the_distribution():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    g = noise.gumbel(0, torch.arange(100_000)[:, None], torch.arange(4))  # (100000, 4)
    ids = (p.log() + g).argmax(-1)
    freq = torch.bincount(ids, minlength=4).float() / len(ids)
    assert torch.allclose(freq, p, atol=0.006)
