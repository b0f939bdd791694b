"""TreeConfig.for_batch: the per-step tree under a cap on verified tokens."""

from __future__ import annotations

import pytest

from spec_core.decoding import TreeConfig


def test_for_batch_caps_tokens_per_step():
    cfg = TreeConfig(width=6, depth=6, budget=40, step_tokens=48)
    assert cfg.for_batch(1) == TreeConfig(6, 6, 40)                 # 47 allowed, the budget caps
    assert cfg.for_batch(4) == TreeConfig(6, 6, 11)                 # 4 x (1 + 11) = 48
    assert cfg.for_batch(16) == TreeConfig(2, 2, 2)                 # 16 x 3 = 48; no wider/deeper than 2 nodes
    assert cfg.for_batch(64) == TreeConfig(1, 1, 1)                 # never below one draft node
    for n in (1, 3, 4, 7, 16):
        t = cfg.for_batch(n)
        assert n * (1 + t.budget) <= 48 or t.budget == 1
    assert TreeConfig().for_batch(16) == TreeConfig()               # no cap: the tree as configured


def test_bad_values_are_refused():
    with pytest.raises(ValueError):
        TreeConfig(step_tokens=-1)
    with pytest.raises(ValueError):
        TreeConfig(budget=0)
