"""Compile an engine's steps before its first timed request: every shape class a step can take.

`torch.compile` builds a graph the first time a step meets a shape class (on a CPU: each dynamic
dimension at 1 and at >= 2; with CUDA graphs each bucket is also recorded on first use). Left to
the first requests, that cost lands inside their latency: measured in the `generate` job on the
`small` world, a batch-1 pass whose engines compiled on first use read 0.15-0.89x AR for the same
methods that decode faster than AR once warm. `warm_up` pays it at engine start instead: with one
prompt prefilled in slot 0, it calls the target step over the root alone and over a full tree,
the commit's KV move (a slot copied onto itself), a feature drafter's draft at full width and as
a chain (its root and every depth, corrected or not), and its catch-up over one token and several
(feeding nothing: no state moves), then frees the slot.

Shapes: B slots, S tokens per row, A catch-up tokens.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from spec_core.decoding.compiled import mark_dynamic
from spec_core.decoding.tree import empty_tree, pad_tree


@torch.no_grad()
def warm_up(engine, request) -> float:
    """Run every compiled shape class of `engine` once (an idle engine; `request` is prefilled
    into slot 0 and dropped). Returns the seconds it took."""
    if any(s is not None for s in engine.slots):
        raise ValueError("warm up an idle engine")
    t0 = time.perf_counter()
    engine._admit([(0, dataclasses.replace(request, max_new_tokens=max(request.max_new_tokens, 2)))])
    active = [b == 0 for b in range(engine.B)]
    speculative = engine.drafter is not None or engine.new_proposer is not None
    nodes = [0] + ([engine.buckets.tokens(1 + engine.tree_cfg.budget) - 1] if speculative else [])
    for n in nodes:  # the target over the root alone, and over a full tree of pads
        engine._verify(pad_tree(empty_tree(engine.B, engine.device), n))
    if speculative:  # the commit's KV move, copying each row's root slot onto itself
        A = engine.buckets.tokens(2)
        src_BA = torch.tensor([[L] * A for L in engine.len_host], device=engine.device)
        engine._keep_step(engine.buckets.shape("keep", engine.B, A), engine.tcache, mark_dynamic(src_BA, 1),
                          mark_dynamic(src_BA.clone(), 1), caller=engine)
    if engine.dcache is not None:  # a feature drafter: full width and a chain, every depth
        cfg = engine.tree_cfg
        for width in sorted({cfg.width, 1}):
            engine._draft_features(dataclasses.replace(cfg, width=width, budget=min(cfg.budget, width)), active)
        D = engine.root_h_BD.shape[-1]
        zero_B = torch.zeros(engine.B, dtype=torch.long, device=engine.device)
        for A in (1, 2):
            feats = torch.zeros(engine.B, A, D, dtype=engine.root_h_BD.dtype, device=engine.device)
            engine._drafter_catch_up(torch.zeros(engine.B, A, dtype=torch.long, device=engine.device), feats,
                                     zero_B, [0] * engine.B)
    engine.slots[0] = None
    engine.proposers[0] = None
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - t0
