"""The Jacobi decoder drives every adapter: greedy SJD / SCD (with CFG) equals the plain greedy
loop on tiny Janus, Emu3 and Chameleon models, and sampled bodies respect forced and allowed ids."""

from __future__ import annotations

import pytest
import torch

from spec_core.scd import JacobiDecoder, ScdConfig
from spec_core.scd.adapters import ChameleonAdapter, Emu3Adapter, JanusAdapter
from tests.spec_core.scd.adapters.ragged_loop import greedy_image
from tests.spec_core.scd.adapters.tiny_models import (build_chameleon, build_emu3, build_janus,
                                                      chameleon_vocabulary, emu3_vocabulary)

torch.set_num_threads(1)
TEXT = [5, 9, 17, 33, 4, 21]  # Janus text ids


def _janus():
    lm = JanusAdapter(build_janus())
    return lm, lm.layout(), lm.prompts(TEXT)


def _emu3():
    lm = Emu3Adapter(build_emu3())
    vocab = emu3_vocabulary()
    return lm, lm.layout(3, 3), lm.prompts([vocab[c] for c in "abcdeab"], 3, 3)


def _chameleon():
    lm = ChameleonAdapter(build_chameleon())
    vocab = chameleon_vocabulary()
    return lm, lm.layout(12), lm.prompts([vocab[f"w{i}"] for i in (3, 7, 1, 12, 5)])


@pytest.fixture(scope="module", params=["janus", "emu3", "chameleon"])
def setup(request):
    return {"janus": _janus, "emu3": _emu3, "chameleon": _chameleon}[request.param]()


@pytest.mark.parametrize("coupling", ["none", "mc", "gs"])
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_greedy_jacobi_equals_the_greedy_loop(setup, coupling, scale):
    lm, layout, (cond, uncond) = setup
    want = greedy_image(lm, layout, cond, uncond if scale != 1.0 else None, scale)
    cfg = ScdConfig(window=4, coupling=coupling, temperature=0.0, cfg_scale=scale)
    res = JacobiDecoder(lm, layout, cfg).run([cond], [uncond] if scale != 1.0 else None)
    assert res.tokens_BN[0].tolist() == want
    assert int(res.nfe_B[0]) <= layout.length


def test_sampled_bodies_respect_the_layout(setup):
    lm, layout, (cond, uncond) = setup
    cfg = ScdConfig(window=6, coupling="mc", temperature=1.0, cfg_scale=2.0)
    res = JacobiDecoder(lm, layout, cfg).run([cond] * 3, [uncond] * 3, seed=4)
    forced = layout.forced_N >= 0
    tokens = res.tokens_BN
    assert torch.equal(tokens[:, forced], layout.forced_N[forced].expand(3, -1))
    if layout.allowed_V is not None:
        assert bool(layout.allowed_V[tokens[:, ~forced]].all())
    assert [sum(c) for c in res.committed] == [layout.length] * 3
