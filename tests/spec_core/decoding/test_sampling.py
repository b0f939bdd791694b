"""Sampling is lossless: on a tiny-vocabulary target, the empirical distribution of whole
continuations from speculative decoding matches the exact one, enumerated from the target."""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

from spec_core.decoding import DecodeEngine, Request, SamplingConfig, TreeConfig
from spec_core.fovea import DraftSample, FoveaDrafter, collate, drafter_loss
from spec_core.targets import adapter_for
from tests.hf_warpers import hf_warp

V, IMAGE, NEW = 7, 6, 3  # six text tokens, one image token; continuations of three tokens


def tiny_vocab_target() -> LlavaForConditionalGeneration:
    torch.manual_seed(5)
    text = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=16, patch_size=8, projection_dim=16)
    model = LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE,
                                                      image_seq_length=4, vision_feature_layer=-1))
    with torch.no_grad():
        model.lm_head.weight.mul_(60.0)  # peaked, uneven next-token distributions
    model.generation_config.eos_token_id = None
    return model.eval().requires_grad_(False)


def exact_distribution(model, inputs: dict, cfg: SamplingConfig) -> dict[tuple, float]:
    """P(y1..yNEW) = prod_t p(y_t | prompt, y_<t), by enumerating every prefix (each continued
    from a copy of the prompt's KV cache, as generation does: a sampled image token is then just
    a token)."""
    prompt = model(**inputs, use_cache=True)
    probs = {(): 1.0}
    for _ in range(NEW):
        nxt = {}
        for prefix, p in probs.items():
            if p == 0.0:
                continue
            if prefix:
                cache = copy.deepcopy(prompt.cache)
                logits = model(input_ids=torch.tensor([prefix]), cache=cache).logits[0, -1]
            else:
                logits = prompt.logits[0, -1]
            q = hf_warp(logits, cfg.temperature, cfg.top_k, cfg.top_p).softmax(-1).double()  # HF's warpers
            for y in range(V):
                nxt[prefix + (y,)] = p * float(q[y])
        probs = nxt
    return probs


def chi_square_ok(counts: Counter, exact: dict, n: int) -> tuple[float, float]:
    """Pearson chi-square over cells with expected count >= 5 (the rest pooled) and the p=1e-4
    critical value (Wilson-Hilferty); returns (statistic, critical)."""
    big = [k for k, p in exact.items() if p * n >= 5]
    rest_p = 1.0 - sum(exact[k] for k in big)
    cells = [(counts[k], exact[k] * n) for k in big]
    if rest_p * n >= 5:
        cells.append((n - sum(counts[k] for k in big), rest_p * n))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df, z = len(cells) - 1, 3.719  # z of p = 1e-4
    return stat, df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def trained_drafter(adapter, inputs: dict) -> FoveaDrafter:
    """A drafter fitted for a few seconds to the target's own sampled continuations, so that
    drafts are often accepted (an untrained one would only test the rejection path)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    batch = {k: v.expand(32, *v.shape[1:]) for k, v in inputs.items()}
    out = adapter.prefill(batch)
    ids = batch["input_ids"]
    for _ in range(6):  # sampled continuations, token by token (no cache: tiny)
        full = {**batch, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
        logits = adapter.lm_head(adapter.prefill(full).final_hidden_BTD[:, -1])
        logits[:, IMAGE] = float("-inf")  # training data only: an image token could not be prefilled
        ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=g)], 1)
    out = adapter.prefill({**batch, "input_ids": ids, "attention_mask": torch.ones_like(ids)})
    loss = torch.zeros(ids.shape[1], dtype=torch.bool)
    loss[inputs["input_ids"].shape[1]:] = True
    samples = [DraftSample(ids[b], loss, out.final_hidden_BTD[b], torch.zeros_like(out.final_hidden_BTD[b]),
                           torch.zeros_like(loss), out.visual_BPD[b]) for b in range(32)]
    drafter = FoveaDrafter.from_target(adapter, n_blocks=1, k_min=1, k_max=4)
    opt = torch.optim.AdamW(drafter.trainable_parameters(), lr=3e-3)
    for _ in range(150):
        loss_out = drafter_loss(drafter, collate(samples))
        opt.zero_grad()
        loss_out.loss.backward()
        opt.step()
    return drafter.eval()


@pytest.mark.parametrize("sampling,methods", [
    (SamplingConfig(do_sample=True, temperature=1.0), ("fovea", "ar")),
    (SamplingConfig(do_sample=True, temperature=0.7, top_k=4, top_p=0.9), ("fovea",))])
@pytest.mark.slow
def test_speculative_sampling_matches_the_exact_distribution(sampling, methods, policy):
    model = tiny_vocab_target()
    adapter = adapter_for(model)
    g = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.tensor([[1, 3, 4] + [IMAGE] * 4 + [5, 3]]),
              "attention_mask": torch.ones(1, 9, dtype=torch.long),
              "pixel_values": torch.randn(1, 3, 16, 16, generator=g)}
    exact = exact_distribution(model, inputs, sampling)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-6)  # float32 softmax rows
    n = 1500
    drafter = trained_drafter(adapter, inputs)
    for name, dr in (("fovea", drafter), ("ar", None)):
        if name not in methods:
            continue
        engine = DecodeEngine(adapter, dr, batch_size=32, capacity=64, sampling=sampling,
                              tree=TreeConfig(width=2, depth=3, budget=5, policy=policy),
                              generator=torch.Generator().manual_seed(1))
        results = list(engine.generate(Request(inputs, NEW) for _ in range(n)))
        counts = Counter(tuple(r.sequences[0].tolist()) for r in results)
        assert sum(counts.values()) == n and all(len(k) == NEW for k in counts)
        stat, critical = chi_square_ok(counts, exact, n)
        assert stat < critical, (name, stat, critical)
        tv = 0.5 * sum(abs(counts[k] / n - p) for k, p in exact.items())
        assert tv < 0.08, (name, tv)
        if dr is not None:  # drafts were accepted, so the tree walk's accept path was exercised
            assert sum(sum(r.accept_lengths) - r.steps for r in results) > (n // 2 if policy == "fixed" else 0)


@pytest.mark.slow
def test_a_seeded_request_samples_the_same_tokens_whatever_decodes_it(tiny_world):
    """Keyed draws: AR, speculative with either tree policy, alone or batched - the same sequence
    (the token at a position is the inverse CDF at a uniform keyed by the seed and position)."""
    from tests.spec_core.decoding.conftest import prompt_inputs

    adapter, processor, drafter, evals, _ = tiny_world
    sampling = SamplingConfig(do_sample=True, temperature=1.2, top_k=20)
    samples = evals[::3]

    def run(dr, batch, policy):
        engine = DecodeEngine(adapter, dr, batch_size=batch, capacity=512, sampling=sampling,
                              tree=TreeConfig(policy=policy))
        reqs = [Request(prompt_inputs(processor, s), 24, s["id"], seed=1000 + i) for i, s in enumerate(samples)]
        return {r.key: r.sequences[0].tolist() for r in engine.generate(reqs)}

    ar = run(None, 1, "fixed")
    assert run(None, 3, "fixed") == ar
    for policy in ("fixed", "goodput"):
        for batch in (1, 3):
            assert run(drafter, batch, policy) == ar, (policy, batch)
    other = DecodeEngine(adapter, None, capacity=512, sampling=sampling)
    assert [r.sequences[0].tolist() for r in other.generate(
        [Request(prompt_inputs(processor, samples[0]), 24, seed=1001)])] != [ar[samples[0]["id"]]]  # seeds matter
