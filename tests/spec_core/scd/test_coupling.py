"""Couplings checked numerically: marginals (each output ~ its own distribution) and coupling cost
(maximal = 1 - TV; Gumbel >= (1 - TV) / (1 + TV)); MRS outputs p; alpha-coupling keeps marginals."""

import torch

from spec_core.decoding import noise
from spec_core.scd.coupling import gumbel_argmax, mrs, sample_inverse_cdf, total_variation

N = 200_000


def _pair(seed: int, V: int = 6, sparse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(V, generator=g) ** 3
    q = torch.rand(V, generator=g) ** 3
    if sparse:  # disjoint-ish supports, like two top-k sets
        p[: V // 3] = 0
        q[-(V // 3):] = 0
    return p / p.sum(), q / q.sum()


def _freq(ids: torch.Tensor, V: int) -> torch.Tensor:
    return torch.bincount(ids, minlength=V).float() / len(ids)


def _draw(probs: torch.Tensor, stream: int) -> torch.Tensor:
    u = noise.uniform(11, torch.arange(N), stream)
    return sample_inverse_cdf(probs.expand(N, -1), u)


def test_inverse_cdf_samples_and_never_picks_zero_mass():
    p, _ = _pair(0, sparse=True)
    ids = _draw(p, 1)
    assert torch.allclose(_freq(ids, 6), p, atol=0.005)
    assert bool((p[ids] > 0).all())


def test_maximal_coupling_marginals_and_cost():
    for seed, sparse in ((0, False), (1, True), (2, False)):
        p, q = _pair(seed, sparse=sparse)
        x = _draw(q, 1)
        out = mrs(p.expand(N, -1), q.expand(N, -1), x, noise.uniform(1, torch.arange(N), 2),
                  noise.uniform(1, torch.arange(N), 3))
        assert torch.allclose(_freq(x, 6), q, atol=0.005)
        assert torch.allclose(_freq(out.ids_R, 6), p, atol=0.005)  # MRS turns x ~ q into y ~ p
        equal = float((out.ids_R == x).float().mean())
        assert abs(equal - (1 - float(total_variation(p, q)))) < 0.005
        # a rejection means p(x) < q(x), where the residual has no mass: accepted <=> equal
        assert torch.equal(out.accepted_R, out.ids_R == x)


def test_gumbel_coupling_marginals_and_cost_bound():
    for seed, sparse in ((0, False), (1, True), (3, False)):
        p, q = _pair(seed, sparse=sparse)
        g = noise.gumbel(5, torch.arange(N)[:, None], torch.arange(6))  # shared noise (N, V)
        x, y = gumbel_argmax(q.expand(N, -1), g), gumbel_argmax(p.expand(N, -1), g)
        assert torch.allclose(_freq(x, 6), q, atol=0.005)
        assert torch.allclose(_freq(y, 6), p, atol=0.005)
        tv = float(total_variation(p, q))
        equal = float((x == y).float().mean())
        assert equal >= (1 - tv) / (1 + tv) - 0.005
        assert equal <= 1 - tv + 0.005  # no coupling beats the maximal one


def test_independent_draws_collide_far_less_than_couplings():
    p, q = _pair(4, V=64)
    x, y = _draw(q, 1), _draw(p, 2)
    indep = float((x == y).float().mean())
    assert abs(indep - float((p * q).sum())) < 0.005
    assert indep < 1 - float(total_variation(p, q))


def test_alpha_coupling_keeps_marginals_and_interpolates_cost():
    p, q = _pair(5)
    x = _draw(q, 1)
    coupled = mrs(p.expand(N, -1), q.expand(N, -1), x, noise.uniform(2, torch.arange(N), 2),
                  noise.uniform(2, torch.arange(N), 3)).ids_R
    indep = _draw(p, 4)
    for alpha in (0.0, 0.5, 1.0):
        coin = noise.uniform(3, torch.arange(N), 5) < alpha
        y = torch.where(coin, coupled, indep)
        assert torch.allclose(_freq(y, 6), p, atol=0.005)
        want = alpha * (1 - float(total_variation(p, q))) + (1 - alpha) * float((p * q).sum())
        assert abs(float((y == x).float().mean()) - want) < 0.006
