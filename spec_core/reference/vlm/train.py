"""Stage 2 of the reference VLM, LLaVA-style: the perception-trained tower stays frozen, the
projector and the Llama decoder learn the six tasks (loss on assistant tokens only)."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlavaForConditionalGeneration

from spec_core.reference.vlm.data import IGNORE, TaskPool
from spec_core.reference.vocab import WORDS

# the words whose read positions the read loss teaches: a sign's word only (why: the "hires"
# preset's note); the read focus still narrows for every read word
READ_WORDS: frozenset[str] = frozenset(WORDS)


@dataclass(frozen=True)
class VLMTrainConfig:
    """Both training stages of the reference VLM."""

    # stage 1, measured on held-out object patches (2 threads): 2000 steps over a pool of 8192
    # scenes -> shape 0.49 (colour 0.97); 6000 steps over 32768 scenes -> shape 0.997 (175 s)
    vision_steps: int = 6000
    vision_batch: int = 32
    vision_lr: float = 2e-3
    vision_pool: int = 32768             # distinct stage-1 scenes
    # small, measured (2 threads, 50 held-out items per task): with the 2000-step stage 1,
    # 1800 steps -> general VQA 0.32, chart 0.38, text 0.68; 3600 steps -> 0.42, 0.62, 0.94,
    # captions grounded 0.09 (shapes wrong); with the 6000-step stage 1, 3600 steps (30 min) ->
    # 0.50, 0.70, 1.0, grounded 0.89 (relations and "is there a ..." questions still weak)
    steps: int = 3600
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 100
    train_per_task: int = 2000          # distinct training samples per task
    # sampling weight per task: long answers teach many tokens per sample, short ones few
    task_weights: dict = field(default_factory=lambda: {
        "general_vqa": 2.0, "text_vqa": 1.5, "chart_vqa": 1.5, "captioning": 1.0,
        "reasoning": 1.0, "multi_turn": 1.5})
    freeze_tower: bool = True
    seed: int = 0
    # hires: the answer's attention, in `focus_heads` heads of the middle `focus_layers` layers,
    # is taught to land on the panels the answer reads (loss weight; 0 = off; see `focus_loss`)
    focus_weight: float = 0.0
    focus_layers: int = 2
    focus_heads: int = 2
    # hires: an answer word that repeats a content word of its question (a shape, a colour, a sign
    # word) is taught to read it there: one head (the one after the focus heads) of the layer
    # before the focus layers, so the reads of the panel that follow know what they look for
    # (weight; 0 = off; see `copy_pairs`)
    copy_weight: float = 0.0
    # hires, with focus: an answer word the image shows (an object's colour or shape, a sign's word,
    # a bar's label or value) is focused on the patches that show it instead of the whole panel
    # (`hires.reads`, `data.read_pairs`): the second address, inside the panel, that the copy and
    # focus builds did not learn (words read from the image 0.18 / 0.00 of general / text VQA)
    read_focus: bool = False
    # hires, with read_focus: at a position predicting a word read from the image, what the focus
    # heads add to the residual (their share of o_proj's output, summed over the focus layers) is
    # itself decoded (final norm, lm_head) and taught that word (weight; 0 = off; `read_loss`):
    # object-level focus alone put 5x the attention on the word's patches and read no better -
    # the heads' outputs did not carry what they attended to (scripts/hires_reads.py (git, 008eb7f))
    read_weight: float = 0.0


TRAIN_PRESETS = {
    "tiny": VLMTrainConfig(vision_steps=20, vision_batch=8, vision_pool=160, steps=30, batch=4, warmup=5,
                           train_per_task=12),
    "small": VLMTrainConfig(),
    # six samples per image, so n per task are n images. Trained on the answers alone the decoder
    # never learnt where a panel is (its answers' attention on the named tile 0.10-0.12 in all 10
    # layers, uniform 0.11) and memorised its 2000 images; so two heads of the middle layers are
    # taught to read the panels each answer reads (`focus_loss`). Measured on a 4-layer proxy on
    # sign questions (1000 images, 1500 steps): held-out exact match 0.08 -> 0.28, the held-out
    # answers' attention on their panel 0.08 -> 0.63 (0.998 in training: with 1000 images the
    # routing memorises too, hence 8000 images, each (image, question) seen ~1.2 times).
    # And the first focus build never learnt to copy a content word from the question ("the colour
    # of the cross" -> "The square ..."; 0.08-0.16 of them, train split too): at the answer its
    # heads gave the question's word 0.00-0.02 of their attention, the image tokens 0.3-1.0 (the
    # small target: 0.4-0.5 in one head of each of layers 1-4). So one head is taught to copy
    # (`copy_weight`). Measured on a 4-layer proxy from scratch (general + text VQA, 2000 images,
    # 1500 steps): copied words 0.16 -> 1.00 (general), 0.13 -> 0.47 (text, sign words); the same
    # loss on the trained 10-layer target for 400 more steps: no change (0.21), the head's output
    # never carried the word - it has to be there from the start.
    # And the words read from the image stayed unread (signs 0.13-0.17, colours 0.39 teacher-forced):
    # object-level focus with the read loss on sign words only (`READ_WORDS`), measured on the
    # proxy (seed 1; general + text + chart VQA, 2000 images, 1500 steps, against focus + copy):
    # sign words read 0.17 -> 0.70, text VQA exact match 0.08 -> 0.32, colours 0.39 -> 0.39,
    # copied words 1.00 -> 0.94, chart 0.12 -> 0.10 (the loss on every read word: signs 0.40,
    # colours 0.24, copied 0.78, chart 0.03; at weight 0.3: 0.60, 0.23, 0.80, 0.07)
    # Packing an image's general, text and chart questions into one conversation (its full build
    # read general VQA 0.28 -> 0.16) and tied embeddings (no change) did not help (git, fc50ae9).
    "hires": VLMTrainConfig(train_per_task=8000, focus_weight=1.0, copy_weight=1.0, read_focus=True,
                            read_weight=1.0, steps=5400),
}
# tiny-hires stays untaught: 30 steps of focus made its answers end at once, and the decoding tests
# on it need multi-token drafts and answers that run to their length (the focus path is tested
# in tests/spec_core/reference/vlm/test_focus.py, the build's too)
TRAIN_PRESETS["tiny-hires"] = TRAIN_PRESETS["tiny"]


def cosine_lr(step: int, total: int, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(total - warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))


def answer_token_accuracy(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> float:
    """Teacher-forced next-token accuracy on labelled positions."""
    pred_BT = logits_BTV[:, :-1].argmax(-1)
    gold_BT = labels_BT[:, 1:]
    valid = gold_BT != IGNORE
    return ((pred_BT == gold_BT) & valid).sum().item() / max(valid.sum().item(), 1)


def focus_layers(n_layers: int, k: int) -> list[int]:
    """The k middle layers of an n-layer decoder (where a read feeds the layers after it)."""
    k = min(k, n_layers)
    first = (n_layers - k) // 2
    return list(range(first, first + k))


def copy_layer(n_layers: int, focus_k: int) -> int:
    """The layer before the `focus_layers` (the first layer if they start there)."""
    return max(focus_layers(n_layers, focus_k)[0] - 1, 0)


def focus_loss(attentions: tuple[torch.Tensor, ...], focus_BTT: torch.Tensor, heads: int,
               first: int = 0) -> torch.Tensor:
    """-log of the attention mass that each focused query position gives its keys, averaged over
    those positions, heads `first` .. `first + heads - 1` and the supervised layers (attentions:
    per supervised layer (B, H, T, T)).

    Why: a hires answer is read from one or two of nine tiles whose tokens are scattered over 172
    placeholders (`spec_core.reference.hires.layout`), and trained on the answer tokens alone a
    10-layer decoder spread its attention evenly over the tiles (measured: the named tile's share
    0.10-0.12 in every layer, uniform 0.11) and memorised its training images instead. Telling a
    few heads where to read is the dense supervision stage 1 gives the tower, one level up."""
    q_BT = focus_BTT.any(-1)
    n = q_BT.sum()
    if n == 0:
        return attentions[0].new_zeros(())
    total = attentions[0].new_zeros(())
    for attn_BHTT in attentions:
        mass_BHT = (attn_BHTT[:, first: first + heads] * focus_BTT[:, None]).sum(-1)
        total = total - (mass_BHT.clamp_min(1e-6).log() * q_BT[:, None]).sum() / (n * mass_BHT.shape[1])
    return total / len(attentions)


@contextmanager
def attention_weights_of(model: LlavaForConditionalGeneration, layers: list[int]) -> Iterator[None]:
    """Within the block, the decoder's `layers` run eager attention - the one implementation that
    returns its weights (`output_attentions` then yields those layers' only) - and every other
    attention keeps its own (SDPA): eager in all layers made a hires training step 0.70 -> 1.09 s.
    The model is set to eager, so the masks are built as float additive masks, which SDPA takes
    as well, and every other attention module gets a copy of its config with its own
    implementation back. Restored on exit."""
    top = model.config._attn_implementation
    keep = {id(model.model.language_model.layers[i].self_attn) for i in layers}
    mods = [(m, m.config, m.config._attn_implementation) for m in model.modules()
            if type(m).__name__.endswith("Attention") and hasattr(m, "config")]
    model.set_attn_implementation("eager")
    try:
        for m, cfg, impl in mods:
            if id(m) not in keep:
                m.config = copy.copy(cfg)
                m.config._attn_implementation = impl
        yield
    finally:
        for m, cfg, _ in mods:
            m.config = cfg
        model.set_attn_implementation(top)


class HeadOutputs:
    """Within the block, the input of `o_proj` (the heads' outputs side by side, (B, T, H x d)) of
    each of `layers`, as captured by forward pre-hooks."""

    def __init__(self, model, layers: list[int]):
        self.model, self.layers, self.inputs = model, layers, {}
        self._hooks = []

    def __enter__(self):
        for i in self.layers:
            attn = self.model.model.language_model.layers[i].self_attn
            self._hooks.append(attn.o_proj.register_forward_pre_hook(
                lambda _m, args, i=i: self.inputs.__setitem__(i, args[0])))
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def read_loss(model, inputs: dict[int, torch.Tensor], read_BT: torch.Tensor, labels_BT: torch.Tensor,
              heads: int) -> torch.Tensor:
    """Cross-entropy of the word each read position (`read_BT`, bool) predicts (labels at t + 1),
    decoded from what the first `heads` heads of the captured layers add to the residual there:
    their slice of `o_proj`, summed over the layers, through the final norm and `lm_head` (the
    heads' direct contribution to the logits, as the logit lens reads a layer)."""
    if not bool(read_BT[:, :-1].any()):
        return model.lm_head.weight.new_zeros(())
    cfg = model.config.text_config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    lm = model.model.language_model
    q_B, q_T = read_BT[:, :-1].nonzero(as_tuple=True)
    cols = slice(0, heads * hd)
    added_PD = sum(x_BTF[q_B, q_T, cols] @ lm.layers[i].self_attn.o_proj.weight[:, cols].T
                   for i, x_BTF in inputs.items())
    logits_PV = model.lm_head(lm.norm(added_PD))
    target_P = labels_BT[q_B, q_T + 1]
    loss = F.cross_entropy(logits_PV, target_P, ignore_index=IGNORE, reduction="sum")
    return loss / max(int((target_P != IGNORE).sum()), 1)


def train_vlm(model: LlavaForConditionalGeneration, pool: TaskPool, cfg: VLMTrainConfig,
              log: Callable[[str], None] | None = None, progress: Callable | None = None) -> dict:
    """Train projector + decoder in place on the pool; returns training figures."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng([cfg.seed, 303])
    tower = model.model.vision_tower
    tower.requires_grad_(not cfg.freeze_tower)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, cfg.steps, cfg.warmup))
    tasks = sorted(pool.examples)
    weights = np.array([cfg.task_weights.get(t, 1.0) for t in tasks])
    weights = weights / weights.sum()
    model.train()
    if cfg.freeze_tower:
        tower.eval()
    n_layers = model.config.text_config.num_hidden_layers
    focus = cfg.focus_weight > 0 and pool.focus is not None
    copying = cfg.copy_weight > 0 and pool.copy is not None
    f_layers = focus_layers(n_layers, cfg.focus_layers) if focus else []
    c_layers = [copy_layer(n_layers, cfg.focus_layers)] if copying else []
    c_head = min(cfg.focus_heads, model.config.text_config.num_attention_heads - 1)
    layers = sorted(set(f_layers) | set(c_layers))  # `out.attentions` holds these, in this order
    reading = focus and cfg.read_weight > 0 and pool.read is not None
    recent_read: list[float] = []
    t0 = time.perf_counter()
    recent: list[float] = []
    recent_focus: list[float] = []
    recent_copy: list[float] = []
    it = progress(range(cfg.steps), total=cfg.steps, desc="vlm stage 2") if progress else range(cfg.steps)
    # the supervised layers' attention weights; the saved model keeps its own attention
    with attention_weights_of(model, layers) if layers else nullcontext(), \
            HeadOutputs(model, f_layers if reading else []) as heads_out:
        for step in it:
            task = tasks[rng.choice(len(tasks), p=weights)]
            batch = pool.batch(task, cfg.batch, rng)
            focus_BTT = batch.pop("focus_BTT", None)
            copy_BTT = batch.pop("copy_BTT", None)
            read_BT = batch.pop("read_BT", None)
            out = model(**batch, output_attentions=bool(layers))
            loss = out.loss
            if focus:
                f = focus_loss([out.attentions[layers.index(i)] for i in f_layers], focus_BTT, cfg.focus_heads)
                loss = loss + cfg.focus_weight * f
                recent_focus = (recent_focus + [f.item()])[-50:]
            if copying:
                c = focus_loss([out.attentions[layers.index(i)] for i in c_layers], copy_BTT, 1, first=c_head)
                loss = loss + cfg.copy_weight * c
                recent_copy = (recent_copy + [c.item()])[-50:]
            if reading:
                r = read_loss(model, heads_out.inputs, read_BT, batch["labels"], cfg.focus_heads)
                loss = loss + cfg.read_weight * r
                recent_read = (recent_read + [r.item()])[-50:]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            recent = (recent + [out.loss.item()])[-50:]
            if log and (step % 100 == 0 or step == cfg.steps - 1):
                acc = answer_token_accuracy(out.logits.detach(), batch["labels"])
                extra = f" focus {np.mean(recent_focus):.3f}" if recent_focus else ""
                extra += f" copy {np.mean(recent_copy):.3f}" if recent_copy else ""
                extra += f" read {np.mean(recent_read):.3f}" if recent_read else ""
                log(f"vlm step {step} task {task} loss {np.mean(recent):.3f} answer-token acc {acc:.3f}{extra}")
    model.eval()
    out = {"vlm_train_seconds": round(time.perf_counter() - t0, 1),
           "vlm_final_loss": round(float(np.mean(recent)), 4)}
    if recent_focus:
        out["vlm_final_focus_loss"] = round(float(np.mean(recent_focus)), 4)
    if recent_copy:
        out["vlm_final_copy_loss"] = round(float(np.mean(recent_copy)), 4)
    if recent_read:
        out["vlm_final_read_loss"] = round(float(np.mean(recent_read)), 4)
    return out
