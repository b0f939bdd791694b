"""The Jacobi loop is lossless: exact enumeration of a tiny-vocabulary model's continuations vs
empirical frequencies for SJD and both SCD couplings (plain and with CFG, top-k, temperature,
forced and masked ids), at fixed windows, under window "auto" and under scripted window schedules
(forwards that leave drafts out), eager and compiled; top-k 1 equals greedy AR; batched equals
batch 1 per sample (eager and compiled); NFE."""

from types import SimpleNamespace

import pytest
import torch

from spec_core.scd import WindowChooser, generate
from tests.spec_core.scd.oracle import chi_square_pvalue, exact_distribution, tiny_lm

PROMPT, UNCOND = [1, 2, 3], [0]
N_SAMPLES = 12_000


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_lm(vocab=4, seed=0)


@pytest.fixture(scope="module")
def exact_plain(model):
    return exact_distribution(model, PROMPT, 4)


PROCESSED = dict(cfg_scale=2.0, temperature=0.8, top_k=3)
ALLOWED = torch.tensor([True, True, True, False])
FORCED = [-1, -1, 2, -1]


@pytest.fixture(scope="module")
def exact_processed(model):
    return exact_distribution(model, PROMPT, 4, uncond=UNCOND, allowed=ALLOWED, forced=FORCED,
                              **PROCESSED)


class Scripted(WindowChooser):
    """Window "auto" with a schedule fixed in advance (cycled, capped like the real one)."""

    def __init__(self, max_window: int, script: list[int]):
        super().__init__(max_window)
        self.script = script

    def begin(self, rows: int) -> int:
        super().begin(rows)
        return self.max_window  # the request's draft slots: every scripted window fits

    def choose(self, rows: int, cap: int | None = None) -> int:
        L = min(self.script[len(self.chosen) % len(self.script)], cap or self.max_window)
        self.chosen.append(L)
        return L


# schedules over the 3 iterations after the prefill: windows that leave kept drafts behind
SCRIPTS = ([1, 3, 1], [2, 1, 4], [4, 1, 2], [1, 1, 3])


def _sample(model, window, coupling, processed=False, seed=0, alpha=1.0, n=N_SAMPLES, **extra):
    if window == "scripted":  # one chunk per schedule, each with its own noise streams
        m = n // len(SCRIPTS)
        outs = [_sample(model, "auto", coupling, processed, seed, alpha, m, max_window=4,
                        window_chooser=Scripted(4, s), sample_keys=list(range(i * m, (i + 1) * m)))
                for i, s in enumerate(SCRIPTS)]
        assert all(w <= x for s, o in zip(SCRIPTS, outs) for w, x in zip(o.result.windows, s))  # capped at the end
        return SimpleNamespace(sequences=torch.cat([o.sequences for o in outs]),
                               nfe_per_sample=torch.cat([o.nfe_per_sample for o in outs]))
    ids = torch.tensor([PROMPT] * n)
    kw = dict(window=window, coupling=coupling, seed=seed, alpha=alpha) | extra
    if processed:
        kw |= dict(cfg_scale=PROCESSED["cfg_scale"], temperature=PROCESSED["temperature"],
                   top_k=PROCESSED["top_k"], uncond_input_ids=torch.tensor([UNCOND] * n),
                   allowed_mask=ALLOWED, forced=FORCED)
    return generate(model, ids, 4, **kw)


@pytest.mark.parametrize("coupling", ["none", "mc", "gs"])
@pytest.mark.parametrize("window", [3, 6, "auto", "scripted"])
def test_lossless_by_exact_enumeration(model, exact_plain, coupling, window):
    # auto: the real chooser (one window per request, 6 first while it explores); scripted: a
    # window changing every iteration, leaving kept drafts behind
    extra = dict(window_chooser=WindowChooser(6)) if window == "auto" else {}
    out = _sample(model, window, coupling, max_window=6, **extra)
    assert chi_square_pvalue(out.sequences, exact_plain) > 1e-5
    assert float(out.nfe_per_sample.float().mean()) < 3.9  # drafts were accepted: AR needs 4


@pytest.mark.parametrize("coupling", ["none", "mc", "gs"])
@pytest.mark.parametrize("window", [4, "scripted"])
def test_lossless_with_cfg_topk_temperature_mask_and_forced(model, exact_processed, coupling, window):
    out = _sample(model, window, coupling, processed=True)
    assert chi_square_pvalue(out.sequences, exact_processed) > 1e-5
    assert bool((out.sequences[:, 2] == 2).all()) and bool((out.sequences != 3).all())


def test_alpha_coupling_is_lossless(model, exact_plain):
    out = _sample(model, 4, "gs", alpha=0.5)
    assert chi_square_pvalue(out.sequences, exact_plain) > 1e-5


def test_the_fit_test_rejects_a_wrong_distribution(model, exact_plain):
    """The oracle has power: AR sampling at temperature 1.3 is told apart from temperature 1."""
    ids = torch.tensor([PROMPT] * N_SAMPLES)
    hot = generate(model, ids, 4, window=1, coupling="none", temperature=1.3)
    assert chi_square_pvalue(hot.sequences, exact_plain) < 1e-9


def test_top_k_1_equals_greedy_ar():
    model = tiny_lm(vocab=16, seed=1, sharpen=1.0, layers=2)
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    ref = model.generate(ids, max_new_tokens=20, do_sample=False, pad_token_id=0)[:, 4:]
    for window, max_window in ((1, 32), (2, 32), (8, 32), (32, 32), ("auto", 8), ("auto", 32)):
        for coupling in ("none", "mc", "gs"):
            out = generate(model, ids, 20, window=window, coupling=coupling, top_k=1, seed=max_window,
                           max_window=max_window)
            assert torch.equal(out.sequences, ref), (window, coupling)


@pytest.fixture
def dynamo_on(monkeypatch):
    """The test environment disables dynamo for Ray workers (tests/conftest.py); compiled runs need it."""
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)


@pytest.mark.parametrize("coupling,window,processed", [("mc", "scripted", True), ("gs", "auto", False)])
def test_compiled_window_is_lossless(model, exact_plain, exact_processed, dynamo_on, coupling, window, processed):
    extra = dict(window_chooser=WindowChooser(6), max_window=6) if window == "auto" else {}
    out = _sample(model, window, coupling, processed=processed, compile=True, **extra)
    assert chi_square_pvalue(out.sequences, exact_processed if processed else exact_plain) > 1e-5
    assert float(out.nfe_per_sample.float().mean()) < 3.9


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_batch_matches_batch_one_per_sample(dynamo_on, compile):
    """Rows of different prompt lengths, each advancing by its own accepted count (and retired
    when done), give exactly their batch-1 outputs and NFE: the noise is keyed per sample."""
    model = tiny_lm(vocab=8, seed=2, sharpen=2.0)
    prompts = [[1, 2], [3, 4, 5, 6, 7], [2], [7, 6, 5]]
    lens = [len(p) for p in prompts]
    ids = torch.zeros(4, max(lens), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, -len(p):], mask[i, -len(p):] = torch.tensor(p), 1
    # a scripted window schedule (the same alone and batched: "auto" proper depends on timing)
    # leaves drafts out of some forwards; those must not tie a sample to its batch either
    script = [3, 1, 5, 2, 2, 4, 1, 5]
    for coupling, window in (("none", 5), ("mc", 5), ("gs", 5), ("mc", "scripted"), ("gs", "scripted")):
        kw = dict(window=window, coupling=coupling, seed=9, cfg_scale=1.5)
        if window == "scripted":
            kw |= dict(window="auto", max_window=5)
        chooser = (lambda: dict(window_chooser=Scripted(5, script))) if window == "scripted" else dict
        kw["compile"] = compile
        batch = generate(model, ids, 24, attention_mask=mask, uncond_input_ids=torch.zeros(4, 1, dtype=torch.long),
                         sample_keys=[10, 11, 12, 13], **kw, **chooser())
        assert len(set(batch.nfe_per_sample.tolist())) > 1 or coupling == "none"
        for i, p in enumerate(prompts):
            one = generate(model, torch.tensor([p]), 24, uncond_input_ids=torch.zeros(1, 1, dtype=torch.long),
                           sample_keys=[10 + i], **kw, **chooser())
            assert torch.equal(one.sequences[0], batch.sequences[i]), (coupling, i)
            assert int(one.nfe_per_sample[0]) == int(batch.nfe_per_sample[i])
            assert one.result.committed[0] == batch.result.committed[i]


def test_nfe_and_commit_bookkeeping(model):
    out = generate(model, torch.tensor([PROMPT] * 3), 30, window=1, coupling="none")
    assert out.nfe == 30 and out.result.committed[0] == [1] * 30  # AR: one forward per token
    out = generate(model, torch.tensor([PROMPT] * 3), 30, window=8, coupling="mc")
    for b in range(3):
        c = out.result.committed[b]
        assert sum(c) == 30 and len(c) == int(out.nfe_per_sample[b])
        assert all(1 <= k <= 8 for k in c[1:])
    # the window, or the tokens the furthest-behind sample still needs (rows past it are scratch)
    n = [[sum(c[:t + 1]) for t in range(len(c))] for c in out.result.committed]
    behind = [min(n_b[t] for n_b in n if t < len(n_b) - 1) for t in range(len(out.result.windows))]
    assert out.result.windows == [min(8, 30 - m) for m in behind] and out.result.windows[0] == 8
    out = generate(model, torch.tensor([PROMPT] * 3), 30, window="auto", max_window=8, coupling="mc")
    windows = out.result.windows
    assert windows[:3] == [8, 8, 8] and all(1 <= w <= 8 for w in windows)  # exploration: largest first
    for b in range(3):
        c = out.result.committed[b]
        assert sum(c) == 30 and len(c) == int(out.nfe_per_sample[b])
        assert all(1 <= k <= w for k, w in zip(c[1:], windows))  # at most the window's tokens


def test_coupling_aliases(model):
    ids = torch.tensor([PROMPT] * 3)
    for alias, name in (("sjd", "none"), ("maximal", "mc"), ("gumbel", "gs")):
        a = generate(model, ids, 6, window=4, coupling=alias, seed=1)
        b = generate(model, ids, 6, window=4, coupling=name, seed=1)
        assert torch.equal(a.sequences, b.sequences)


def test_config_mistakes_fail_first(model):
    ids = torch.tensor([PROMPT])
    with pytest.raises(ValueError, match="coupling"):
        generate(model, ids, 4, window=4, coupling="coupled")
    with pytest.raises(ValueError, match="window"):
        generate(model, ids, 4, window=0, coupling="mc")
    with pytest.raises(ValueError, match="'auto'"):
        generate(model, ids, 4, window="automatic", coupling="mc")
    with pytest.raises(ValueError, match="max_window"):
        generate(model, ids, 4, window="auto", max_window=0, coupling="mc")
    with pytest.raises(ValueError, match="chooser"):
        generate(model, ids, 4, window=4, coupling="mc", window_chooser=WindowChooser(4))
    with pytest.raises(ValueError, match="uncond"):
        generate(model, ids, 4, window=4, coupling="mc", cfg_scale=2.0)
    with pytest.raises(TypeError, match="unknown options"):
        generate(model, ids, 4, window=4, coupling="mc", guidance=2.0)


def test_auto_runs_the_chosen_window_as_the_fixed_window_does():
    """A request under "auto" at window L is the fixed-L decoder (L - 1 draft slots, not
    max_window - 1): the same draws, tokens and commits as window L, for every coupling."""
    model = tiny_lm(vocab=8, seed=3, sharpen=1.5)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for coupling in ("none", "mc", "gs"):
        fixed = generate(model, ids, 21, window=4, coupling=coupling, seed=5)
        chooser = WindowChooser(16)
        chooser.locked = 4
        auto = generate(model, ids, 21, window="auto", max_window=16, coupling=coupling, seed=5,
                        window_chooser=chooser)
        assert torch.equal(auto.sequences, fixed.sequences), coupling
        assert auto.result.committed == fixed.result.committed
        assert set(auto.result.windows) <= {1, 2, 3, 4} and 4 in auto.result.windows
