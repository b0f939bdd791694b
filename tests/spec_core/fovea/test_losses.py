"""Each loss term against a hand computation; Eq. 10's per-step weights and the reduction."""

from __future__ import annotations

import math

import pytest
import torch

from spec_core.fovea import LossConfig, drafter_loss
from spec_core.fovea.losses import (candidate_margin, hard_cross_entropy, hidden_mse,
                                    kl_teacher_draft, step_weight)
from spec_core.fovea.unroll import unroll
from tests.spec_core.fovea.conftest import drafter_for, synthetic_batch


def test_hidden_mse_is_squared_distance_over_d():
    pred = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    target = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    torch.testing.assert_close(hidden_mse(pred, target), torch.tensor([2.5, 2.0]))


def test_kl_is_teacher_to_draft():
    teacher = torch.tensor([[0.5, 0.25, 0.25]]).log() + 3.0  # logits: any shift
    draft = torch.tensor([[0.25, 0.5, 0.25]]).log()
    expect = 0.5 * math.log(2.0) + 0.25 * math.log(0.5)
    torch.testing.assert_close(kl_teacher_draft(teacher, draft), torch.tensor([expect]))
    torch.testing.assert_close(kl_teacher_draft(draft, draft), torch.tensor([0.0]))


def test_cross_entropy_to_the_teacher_token():
    draft = torch.tensor([[0.7, 0.2, 0.1]]).log()
    torch.testing.assert_close(hard_cross_entropy(draft, torch.tensor([1])), torch.tensor([-math.log(0.2)]))


def test_candidate_margin_uses_the_kc_th_competing_logit():
    z = torch.tensor([[3.0, 1.0, 2.0, 0.5, 2.5]])
    # competitors of y=0 sorted: 2.5, 2.0, 1.0, 0.5 -> the 2nd is 2.0, gap 1.0
    torch.testing.assert_close(candidate_margin(z, torch.tensor([0]), 2, 0.5),
                               torch.tensor([math.log1p(math.exp(-0.5))]))
    # y=3 (the smallest): 3rd competitor 2.0, gap -1.5
    torch.testing.assert_close(candidate_margin(z, torch.tensor([3]), 3, 0.5),
                               torch.tensor([math.log1p(math.exp(2.0))]))


def test_step_weights_decay_per_draft_step():
    assert step_weight(1, 1.0) == 1.0
    assert math.isclose(step_weight(3, 1.0), math.exp(-2.0))
    assert math.isclose(step_weight(2, 2.0), math.exp(-0.5))


def test_drafter_loss_combines_the_terms_as_eq_19(llava_adapter):
    drafter = drafter_for(llava_adapter)
    batch = synthetic_batch(32)
    cfg = LossConfig(lambda_hid=0.7, lambda_kl=0.3, lambda_tok=1.3, beta_h=1.1, beta_mid=0.2,
                     beta_ce=1.4, beta_cmp=0.6, margin=0.4, k_c=3, gamma_w=2.0)
    out = drafter_loss(drafter, batch, cfg, depth=3)
    # by hand from the unrolled states
    num = {"hid": 0.0, "kl": 0.0, "tok": 0.0}
    z = 0.0
    for s in unroll(drafter, batch, 3):
        w = math.exp(-(s.step - 1) / 2.0)
        zd, zt = drafter.logits(s.draft_ND), drafter.logits(s.target_ND)
        y = zt.argmax(-1)
        for n in range(len(y)):
            hf = ((s.raw_ND[n] - s.target_ND[n]) ** 2).sum() / 32  # the default: h before correction
            hm = ((s.draft_mid_ND[n] - s.target_mid_ND[n]) ** 2).sum() / 32
            pt, ld = torch.softmax(zt[n], -1), torch.log_softmax(zd[n], -1)
            kl = (pt * (pt.log() - ld)).sum()
            ce = -ld[y[n]]
            comp = torch.cat([zd[n, : y[n]], zd[n, y[n] + 1:]]).sort(descending=True).values
            margin = torch.log1p(torch.exp(0.4 - (zd[n, y[n]] - comp[2])))
            num["hid"] += w * (1.1 * hf + 0.2 * hm)
            num["kl"] += w * kl
            num["tok"] += w * (1.4 * ce + 0.6 * margin)
            z += w
    expect = (0.7 * num["hid"] + 0.3 * num["kl"] + 1.3 * num["tok"]) / z
    torch.testing.assert_close(out.loss, expect.detach() if hasattr(expect, "detach") else expect,
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.terms["kl"], num["kl"].detach() / z, rtol=1e-4, atol=1e-6)
    assert out.count.tolist() == [10.0, 10.0, 10.0]  # 5 answer tokens x 2 samples per step


def test_reduce_fn_divides_by_the_rank_mean_normaliser(llava_adapter):
    drafter = drafter_for(llava_adapter)
    batch = synthetic_batch(32)
    alone = drafter_loss(drafter, batch)
    shared = drafter_loss(drafter, batch, reduce_fn=lambda z: 2.0 * z)  # the other rank has 3x Z
    torch.testing.assert_close(shared.loss, alone.loss / 2.0)


def test_hidden_alignment_reads_the_state_the_config_names(llava_adapter):
    drafter = drafter_for(llava_adapter, correction_depth=1)
    batch = synthetic_batch(32)
    steps = unroll(drafter, batch, 3)
    z = sum(math.exp(-(s.step - 1)) * len(s.draft_ND) for s in steps)

    def by_hand(state_of):
        return sum(math.exp(-(s.step - 1)) * float(hidden_mse(state_of(s), s.target_ND).sum()) for s in steps) / z

    corrected, raw = by_hand(lambda s: s.draft_ND), by_hand(lambda s: s.raw_ND)
    assert abs(corrected - raw) > 1e-3  # the correction moves the shallow states
    for mode, expect in (("corrected", corrected), ("uncorrected", raw), ("both", 0.5 * (corrected + raw))):
        out = drafter_loss(drafter, batch, LossConfig(hidden_state=mode), depth=3)
        assert math.isclose(float(out.terms["hid_final"]), expect, rel_tol=1e-4)
    with pytest.raises(ValueError, match="hidden_state"):
        LossConfig(hidden_state="h_hat")
