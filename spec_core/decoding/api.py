"""One-sample entry points with HF-like arguments (the public API external checks use).

    speculative_generate(target_model, drafter, inputs, max_new_tokens, **options)
    ar_generate(target_model, inputs, max_new_tokens, **options)
    load_drafter(directory, target_model)      # FoveaDrafter or MedusaHeads, by the saved format

`inputs` is what the target's HF processor returns for one sample. Options: do_sample,
temperature, top_k, top_p (HF semantics), eos_token_id (default: the target's generation config),
seed or generator, and for the tree width / depth / budget (EAGLE-2 defaults 6 / 6 / 40) and
step_tokens (a cap on tokens verified per step, `TreeConfig.for_batch`); visual_correction and
correction_depth (None: as the drafter was trained) for how drafts are scored; compile (True:
fixed-shape steps under torch.compile, `decoding.compiled`; the output is the same).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from spec_core.decoding.engine import DecodeEngine, Request, step_scratch
from spec_core.decoding.sampling import SamplingConfig
from spec_core.decoding.tree import TreeConfig


@dataclass
class GenerateOutput:
    sequences: torch.Tensor                      # (1, n) new tokens only, through EOS
    accept_lengths: list[int] = field(default_factory=list)


def load_drafter(directory, target_model=None):
    """A saved drafter directory, by its format: a FOVEA-family feature drafter or Medusa heads
    (with `target_model`, checked against the target's sizes)."""
    from spec_core.fovea import FoveaDrafter
    from spec_core.medusa import MedusaHeads
    from spec_core.medusa.heads import FORMAT as MEDUSA
    from spec_core.targets.saved import saved_format

    cls = MedusaHeads if saved_format(directory) == MEDUSA else FoveaDrafter
    return cls.from_pretrained(directory, target_model)


def _eos_ids(model, eos_token_id) -> list[int]:
    eos = eos_token_id if eos_token_id is not None else model.generation_config.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _take(opts: dict, config: type) -> dict:
    """The options that are fields of the dataclass `config`, popped from `opts`."""
    return {f.name: opts.pop(f.name) for f in dataclasses.fields(config) if f.name in opts}


def _engine(target_model, drafter, inputs, max_new_tokens, options) -> DecodeEngine:
    from spec_core.targets import TargetAdapter, adapter_for

    adapter = target_model if isinstance(target_model, TargetAdapter) else adapter_for(target_model)
    opts = dict(options)
    sampling = SamplingConfig(**_take(opts, SamplingConfig))
    tree = TreeConfig(**_take(opts, TreeConfig))
    drafting = {k: opts.pop(k) for k in ("visual_correction", "correction_depth") if k in opts}
    compile = bool(opts.pop("compile", False))
    eos = _eos_ids(adapter.model, opts.pop("eos_token_id", None))
    gen = opts.pop("generator", None)
    if "seed" in opts:
        gen = torch.Generator(device=adapter.model.device).manual_seed(int(opts.pop("seed")))
    if opts:
        raise ValueError(f"unknown generate options: {sorted(opts)}")
    T = torch.as_tensor(inputs["input_ids"]).shape[-1]
    graphs = compile and adapter.model.device.type == "cuda"
    capacity = T + max_new_tokens + step_scratch(tree, drafter is not None, graphs) + 1
    if compile:  # a power of two: calls of similar lengths share the compiled steps (`compiled.shared_step`)
        capacity = 1 << (capacity - 1).bit_length()
    return DecodeEngine(adapter, drafter, batch_size=1, capacity=capacity, tree=tree, sampling=sampling,
                        eos_token_ids=eos, generator=gen, compile=compile, **drafting)


def speculative_generate(target_model, drafter, inputs, max_new_tokens: int, **options) -> GenerateOutput:
    """Lossless speculative decoding of one sample (greedy = the target's greedy output)."""
    engine = _engine(target_model, drafter, inputs, max_new_tokens, options)
    (result,) = engine.generate([Request(inputs, max_new_tokens)])
    return GenerateOutput(result.sequences, result.accept_lengths)


def ar_generate(target_model, inputs, max_new_tokens: int, **options) -> GenerateOutput:
    """Autoregressive decoding of one sample on the same engine (no drafter)."""
    engine = _engine(target_model, None, inputs, max_new_tokens, options)
    (result,) = engine.generate([Request(inputs, max_new_tokens)])
    return GenerateOutput(result.sequences, result.accept_lengths)
