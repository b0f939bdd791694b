"""Self-contained model directories of modules trained for a target (drafters, Medusa heads):
config.json (format tag, the module's own config, the target's identity) + model.safetensors,
and where training measured them acceptance.json: the drafter's top-1 agreement with the target
per draft step (`save_acceptance`; the goodput policy's prior, `spec_core.decoding.goodput`).
Loading never unpickles, and checks the target's sizes when a target is given.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn


def save_module(module: nn.Module, directory: str | Path, fmt: str, meta: dict) -> None:
    """Write `module`'s full state (frozen copies included) and {"format": fmt, **meta}."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": fmt})
    (out / "config.json").write_text(json.dumps({"format": fmt, **meta}, indent=2, default=str))


ACCEPTANCE = "acceptance.json"


def save_acceptance(directory: str | Path, top1_D: Sequence[float] | None) -> None:
    """Write a drafter's top-1 agreement per draft step (depth 1, 2, ...) as measured in training;
    none where there are none (an untrained drafter: an earlier save's figures go too)."""
    path = Path(directory) / ACCEPTANCE
    if not top1_D:
        path.unlink(missing_ok=True)
        return
    figures = [float(a) for a in top1_D]
    if not all(0.0 <= a <= 1.0 for a in figures):
        raise ValueError(f"top-1 agreement must lie in [0, 1], got {figures}")
    path.write_text(json.dumps({"top1_per_depth": figures}, indent=2))


def read_acceptance(directory: str | Path) -> tuple[float, ...] | None:
    """A saved drafter's top-1 agreement per draft step (None: the directory has none, as every
    directory saved before the figures were, or an untrained drafter's)."""
    path = Path(directory) / ACCEPTANCE
    if not path.exists():
        return None
    figures = json.loads(path.read_text()).get("top1_per_depth") or None
    return None if figures is None else tuple(float(a) for a in figures)


def saved_format(directory: str | Path) -> str | None:
    """The format tag of a saved directory (None when it has none)."""
    return json.loads((Path(directory) / "config.json").read_text()).get("format")


def read_meta(directory: str | Path, fmt: str, what: str, target_model=None) -> dict:
    """config.json of a directory of format `fmt` (`what`: its name in errors); with `target_model` (HF VLM or adapter), check
    that it has the hidden and vocabulary sizes recorded under "target"."""
    src = Path(directory)
    meta = json.loads((src / "config.json").read_text())
    mine = None
    if target_model is not None:
        text = getattr(target_model, "text_config", None) or target_model.config.text_config
        mine = {"hidden_size": text.hidden_size, "vocab_size": text.vocab_size}
    return check_meta(meta, fmt, what, str(src), mine)


def check_meta(meta: dict, fmt: str, what: str, where: str, target_sizes: dict | None = None) -> dict:
    """A saved directory's config.json (read from `where`, a path or URI) is of format `fmt` and,
    with `target_sizes` ({"hidden_size", "vocab_size"} of the target), was trained for them."""
    if meta.get("format") != fmt:
        raise ValueError(f"{where} is not a {what} directory (format {meta.get('format')!r}, expected {fmt!r})")
    if target_sizes is not None:
        recorded = {k: meta.get("target", {}).get(k) for k in target_sizes}
        if recorded != target_sizes:
            raise ValueError(f"{what} {where} was trained for a target with {recorded}, this target has {target_sizes}")
    return meta


def load_state(module: nn.Module, directory: str | Path, dtype_key: str) -> nn.Module:
    """Load model.safetensors strictly (a mismatch raises, naming the keys); cast the module to
    the dtype of tensor `dtype_key`."""
    state = load_file(str(Path(directory) / "model.safetensors"))
    module.load_state_dict(state, strict=True)
    return module.to(state[dtype_key].dtype)
