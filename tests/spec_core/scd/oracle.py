"""Test oracles for SCD: a tiny peaked Llama, exact enumeration of its continuations (full
forwards, no cache), and a chi-square goodness-of-fit p-value."""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.hf_warpers import hf_probs


def tiny_lm(vocab: int = 4, seed: int = 0, sharpen: float = 4.0, layers: int = 2) -> LlamaForCausalLM:
    """A random tiny Llama whose next-token distributions are far from uniform (so drafts are
    accepted and rejected often) and depend on the context."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen * 32 ** 0.5)
    return model


@torch.no_grad()
def exact_distribution(model, prompt: list[int], n_new: int, uncond: list[int] | None = None,
                       cfg_scale: float = 1.0, temperature: float = 1.0, top_k: int = 0,
                       top_p: float = 1.0, allowed=None, forced=None) -> dict[tuple, float]:
    """P(continuation) for every continuation of n_new tokens, by full forwards of all prefixes."""
    V = model.config.vocab_size
    probs: dict[tuple, float] = {(): 1.0}
    for i in range(n_new):
        nxt = {}
        for prefix, pr in probs.items():
            if pr == 0.0:
                continue
            logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
            lu = model(torch.tensor([uncond + list(prefix)])).logits[0, -1] if uncond else None
            p = hf_probs(logits, lu, cfg_scale, temperature, top_k, top_p, allowed)
            if forced is not None and forced[i] >= 0:
                p = torch.zeros(V)
                p[forced[i]] = 1.0
            for v in range(V):
                nxt[prefix + (v,)] = pr * float(p[v])
        probs = nxt
    return probs


def chi_square_pvalue(samples: torch.Tensor, exact: dict[tuple, float], min_expected: float = 5.0) -> float:
    """Goodness of fit of sample rows to `exact`; outcomes expected < min_expected times are
    pooled into one cell, and an outcome of probability 0 that occurs gives p = 0."""
    n = samples.shape[0]
    counts = Counter(tuple(r) for r in samples.tolist())
    if any(exact.get(k, 0.0) == 0.0 for k in counts):
        return 0.0
    stat, df, pool_obs, pool_exp = 0.0, -1, 0.0, 0.0
    for k, p in exact.items():
        e, o = n * p, counts.get(k, 0)
        if e < min_expected:
            pool_obs, pool_exp = pool_obs + o, pool_exp + e
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        df += 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def all_sequences(V: int, n: int):
    return itertools.product(range(V), repeat=n)
