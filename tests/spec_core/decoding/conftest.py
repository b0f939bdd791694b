"""A tiny trained reference target with a briefly trained FOVEA drafter (so that drafts are often
accepted and every path of the acceptance logic runs), and one-sample processor inputs. The world
is parametrized: every test of `tiny_world` runs on the small world's LLaVA ('tiny', 16 visual
tokens) and on the hires world's LLaVA-NeXT ('tiny-hires', AnyRes, 172 visual tokens)."""

from __future__ import annotations

import io
import random

import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from spec_core.fovea import DraftSample, FoveaDrafter, collate, drafter_loss
from spec_core.reference.tasks import TASKS
from spec_core.reference.vlm.build import build_target, world_of
from spec_core.targets import load_target


def prompt_inputs(processor, sample: dict, turns: int = 1) -> dict:
    """What the target's processor returns for the conversation's first user turn(s)."""
    image = Image.open(io.BytesIO(sample["image_png"])).convert("RGB")
    text = processor.tokenizer.apply_chat_template(sample["conversation"][: 2 * turns - 1], tokenize=False,
                                                    add_generation_prompt=True)
    return dict(processor(text=text, images=image, add_special_tokens=False, return_tensors="pt"))


def hf_greedy(model, inputs, max_new_tokens):
    """HF `generate`'s greedy continuation (the oracle of every lossless test here)."""
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def self_distill_data(adapter, processor, samples: list[dict]) -> list[DraftSample]:
    """Artifacts of the target's own greedy answers (no mid states)."""
    data = []
    for s in samples:
        inputs = prompt_inputs(processor, s)
        seq = adapter.model.generate(**inputs, max_new_tokens=48, do_sample=False)
        T0 = inputs["input_ids"].shape[1]
        full = {**inputs, "input_ids": seq, "attention_mask": torch.ones_like(seq)}
        out = adapter.prefill(full)
        loss = torch.zeros(seq.shape[1], dtype=torch.bool)
        loss[T0:] = True
        data.append(DraftSample(seq[0], loss, out.final_hidden_BTD[0], torch.zeros_like(out.final_hidden_BTD[0]),
                                torch.zeros_like(loss), out.visual_BPD[0][out.visual_valid_BP[0]]))
    return data


def fit(model, loss_fn, data: list[DraftSample], steps: int, seed: int = 0):
    """`steps` AdamW updates on random batches of 8."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=3e-3)
    for _ in range(steps):
        out = loss_fn(model, collate(rng.sample(data, min(8, len(data)))))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return model.eval()


def train_drafter(adapter, data: list[DraftSample], steps: int, seed: int = 0, **cfg) -> FoveaDrafter:
    """`steps` AdamW updates on the target's own greedy answers (self-distillation)."""
    torch.manual_seed(seed)
    drafter = FoveaDrafter.from_target(adapter, **{"n_blocks": 1, "k_min": 2, "k_max": 8, **cfg})
    return fit(drafter, drafter_loss, data, steps, seed)


@pytest.fixture(scope="session", params=["tiny", "tiny-hires"])
def tiny_world(request, tmp_path_factory):
    """(adapter, processor, drafter, eval samples, training artifacts) on a tiny reference world."""
    root = tmp_path_factory.mktemp("decoding")
    make_split = world_of(request.param).make_split
    train = [s for t in TASKS for s in make_split(t, 6, 0, "train")]
    build_target(request.param, str(root / "target"), samples=train)
    adapter = load_target(root / "target")
    processor = AutoProcessor.from_pretrained(root / "target")
    data = self_distill_data(adapter, processor, train)
    # 100 updates: it already drafts every eval answer whole, with the same accept lengths, steps
    # and EOS-inside-a-path counts as after 250
    drafter = train_drafter(adapter, data, steps=100)
    evals = [s for t in TASKS for s in make_split(t, 4, 0, "eval")]
    return adapter, processor, drafter, evals, data


@pytest.fixture(params=["fixed", "goodput"])
def policy(request, monkeypatch) -> str:
    """The tree policy: every lossless test runs under both (goodput only changes tree sizes).
    Under goodput its learning is never held: on the tiny worlds, whose drafters cost about what
    the target does, the floor may rightly keep such a policy on AR from its third step, and these
    tests must verify its trees (explorations and probes of every size) against the target."""
    if request.param == "goodput":
        from spec_core.decoding.goodput import GoodputPolicy

        monkeypatch.setattr(GoodputPolicy, "_may_learn", lambda self, *args: True)
    return request.param


@pytest.fixture(scope="session")
def hf_refs(tiny_world):
    """hf_refs(max_new) -> {eval sample id: HF `generate`'s greedy answer}: computed once per length
    for every parametrization and module that compares against it."""
    adapter, processor, _, evals, _ = tiny_world
    cache: dict[int, dict] = {}

    def refs(max_new: int) -> dict:
        if max_new not in cache:
            cache[max_new] = {s["id"]: hf_greedy(adapter.model, prompt_inputs(processor, s), max_new) for s in evals}
        return cache[max_new]
    return refs
