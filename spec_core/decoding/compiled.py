"""Compiled decode steps: functions of device tensors over a small set of shapes.

A step (the target's forward over [root, nodes], a drafter's depth, its catch-up) takes its
positions, lengths, write slots and tree structure as tensors and builds its mask inside, so
`torch.compile(fullgraph=True)` traces it without a graph break and nothing in it reads the host.
Its shapes: B, the engine's slots (inactive ones run too; nothing they produce is kept); S, tokens
per row (a tree's nodes, a draft's width, a catch-up's tokens); K, keys read. S and K are dynamic
dimensions, marked so on the first call (`mark_dynamic`, `mark_keys`), so on a CPU one graph
serves every size - S = 1 (an AR step, a chain) is specialised, so two graphs per step function
and engine.
On CUDA the same functions compile with mode="reduce-overhead": each distinct shape is then a
CUDA graph recorded on its first call, so sizes are rounded up to a few (`Buckets`): S to a
power of two (a tree padded with pads, `tree.pad_tree`, never accepted), K to a power of two
>= 64 - as SGLang pads a batch to its next captured size. Caches are `RaggedCache(static=True)`,
their buffers marked static addresses. With compile off, the same functions run eagerly
(debugging; the lossless tests run both).

`Step` wraps one such function and counts, per caller (an engine), what compiling cost: graphs
built (dynamo's counter read around every call) and the seconds of each shape's first call
(compile, or a CUDA graph's recording). A graph built for a shape the caller ran before is a
recompile - the metrics report it and a test fails on it.

Shapes: B slots, S tokens per row, K keys read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from spec_core.decoding.tree import prefix_and_new_mask

TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # tokens per row of a CUDA-graph step
MIN_KEYS = 64  # the smallest key bucket of a CUDA-graph step
RECOMPILE_LIMIT = 64  # graphs per step; past it fullgraph raises


@dataclass(frozen=True)
class Buckets:
    """Sizes a compiled step runs at. graphs (CUDA graphs: one replay per shape): S and K rounded
    up to a power of two (K >= MIN_KEYS); else (a CPU, or eager) the sizes themselves."""

    graphs: bool = False

    def tokens(self, n: int) -> int:
        """Tokens per row a step of n runs (n <= TOKEN_BUCKETS[-1] with graphs)."""
        if not self.graphs:
            return n
        for b in TOKEN_BUCKETS:
            if n <= b:
                return b
        raise ValueError(f"{n} tokens per row in one step: more than the largest CUDA-graph bucket {TOKEN_BUCKETS[-1]}")

    def keys(self, n: int, capacity: int) -> int:
        """Keys a step reads when n are needed (at most `capacity`)."""
        if not self.graphs:
            return n
        return min(capacity, max(MIN_KEYS, 1 << max(n - 1, 0).bit_length()))

    def shape(self, kind: str, *sizes: int) -> tuple:
        """What names a step's compiled shape: with graphs each size (a replay each), else only
        whether each is 1 (dynamo specialises sizes 0 and 1; the rest share one graph)."""
        return (kind, *(sizes if self.graphs else (min(n, 2) for n in sizes)))


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


class Step:
    """`fn` eager or compiled; each call names its shape `key` (hashable) for the accounting.

    compile: torch.compile(fn, fullgraph=True), with mode="reduce-overhead" on CUDA, as a region of
    its own (isolate_recompiles: each engine's steps compile their own graphs; inductor's on-disk
    cache makes a graph compiled before cheap to build again) without guards on the modules."""

    def __init__(self, fn: Callable, compile: bool, device: torch.device):
        self.compiled = compile
        self.device = device
        if compile:
            # guards: dynamo checks ~1,000 guards on the modules' parameters and attributes before every
            # call - measured 1.1-1.4 ms a call on the `small` world's target (2 cores), ~40% of an AR
            # step. The modules a step runs are the engine's for its life and never change, so their
            # guards go; each Step compiles a region of its own (no other engine's graph can match it)
            fn = torch.compile(fn, fullgraph=True, mode="reduce-overhead" if device.type == "cuda" else None,
                               recompile_limit=RECOMPILE_LIMIT, isolate_recompiles=True,
                               options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
                                        # a CPU step's kernels called from C++, not Python (CUDA: graph
                                        # replays do that): measured on the small world, batch 1, 24
                                        # prompts, AR 3.03 -> 2.04 s, FOVEA's CPU tree 3.03 -> 2.28 s; its
                                        # graphs take longer to build (cold 141 s against ~110 s at batch 2)
                                        **({"cpp_wrapper": True} if device.type == "cpu" else {})})
        self.fn = fn
        self._by: dict[int, dict] = {}  # per caller (an engine): its shapes' first-call seconds, graphs, recompiles

    def __call__(self, key: Hashable, *args, caller: object = None):
        """fn(*args) at shape `key`, accounted to `caller` (an engine sharing this step with others:
        a shape another engine met first is a first call for this one)."""
        acc = self._by.setdefault(id(caller), {"warmup_s": {}, "graphs": 0, "recompiles": 0})
        first = key not in acc["warmup_s"]
        g0 = _graphs()
        t0 = time.perf_counter() if first else 0.0
        out = self.fn(*args)
        built = _graphs() - g0
        acc["graphs"] += built
        if first:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            acc["warmup_s"][key] = time.perf_counter() - t0
        elif built:  # a graph for a shape this caller ran before: a recompile
            acc["recompiles"] += built
        return out

    def stats(self, caller: object = None) -> dict:
        """graphs built on `caller`'s calls, recompiles among them, its shapes and their first-call seconds."""
        acc = self._by.get(id(caller), {"warmup_s": {}, "graphs": 0, "recompiles": 0})
        return {"graphs": acc["graphs"], "recompiles": acc["recompiles"], "shapes": len(acc["warmup_s"]),
                "warmup_s": round(sum(acc["warmup_s"].values()), 3)}


def shared_step(owner: torch.nn.Module, fn: Callable, compile: bool, device: torch.device, *sizes: int) -> Step:
    """The Step running `fn` over `owner` (the module it runs: the target, a drafter) at `sizes`
    (batch, cache capacity): one per module, function and sizes, kept on the module (as HF keeps
    its compiled forward), so the engines that run a module at those sizes compile once."""
    steps = owner.__dict__.setdefault("_spec_core_steps", {})
    key = (fn.__name__, compile, device.type, *sizes)
    if key not in steps:
        steps[key] = Step(fn, compile, device)
    return steps[key]


def mark_keys(keys_K: torch.Tensor) -> torch.Tensor:
    """A view of the key-index range whose length is the step's K, marked dynamic so that one
    graph serves every K."""
    torch._dynamo.mark_dynamic(keys_K, 0)
    return keys_K


def mark_dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """t as a step input: not a view, with the standard strides of its shape (dynamo guards a
    view's base and every stride, and a size-1 dimension keeps whatever stride a view gave it: a
    step fed a view on one call and a fresh tensor on the next would build two graphs), its dims
    >= 2 of `dims` marked dynamic (dynamo specialises 0 and 1): a step's first call then builds
    the graph every later size shares, not a static one and then a dynamic one."""
    want, acc = [], 1
    for n in reversed(t.shape):
        want.append(acc)
        acc *= n
    if t._base is not None or t.stride() != tuple(reversed(want)):
        t = t.clone(memory_format=torch.contiguous_format)
    for d in dims:
        if t.shape[d] >= 2:
            torch._dynamo.mark_dynamic(t, d)
    return t


def target_forward(adapter, cache, ids_BS: torch.Tensor, depth_BS: torch.Tensor, tpos_B: torch.Tensor,
                   len_B: torch.Tensor, anc_BSS: torch.Tensor, keys_K: torch.Tensor,
                   mrope: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's cached forward over S tokens per row (the root, then tree nodes or pads):
    row b's token s sits at cache slot len[b] + s and position tpos[b] + depth[b, s], and sees its
    row's committed prefix plus its own ancestry (anc). -> (final hidden (B, S, D), logits (B, S, V))."""
    S, K = ids_BS.shape[1], keys_K.shape[0]
    cache.plan_step(len_B[:, None] + torch.arange(S, device=ids_BS.device), K)
    attend_BSK = prefix_and_new_mask(len_B, anc_BSS, K)
    pos_BS = tpos_B[:, None] + depth_BS
    hidden_BSD = adapter.decode(ids_BS, pos_BS.expand(3, -1, -1) if mrope else pos_BS, attend_BSK, cache)
    cache.end_step()
    return hidden_BSD, adapter.lm_head(hidden_BSD)


def keep_entries(cache, src_BA: torch.Tensor, dst_BA: torch.Tensor) -> None:
    """The commit's KV move (`RaggedCache.keep`: accepted tree entries next to each row's prefix)
    as a compiled step: one call for every layer's keys and values."""
    cache.keep(src_BA, dst_BA)
