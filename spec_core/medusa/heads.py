"""Medusa heads: head k = (ResBlock^num_layers, then its own LM head initialised from the
target's) on the target's LM-head input h_t, predicting x_{t+k+1} (the target's own head predicts
x_{t+1}). ResBlock: x + SiLU(W x + b) with W and b zero-initialised, so an untrained head starts as the
target's head. A frozen copy of the target's LM head is kept for the training labels.

Shapes: B batch, S states, K heads, D hidden, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from spec_core.targets.saved import load_state, read_acceptance, read_meta, save_acceptance, save_module

FORMAT = "medusa-heads/1"


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int = 3      # MMSpec Table 6: depth 3
    num_layers: int = 1     # ResBlocks per head (Medusa's default)

    def __post_init__(self):
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError("num_heads must be >= 1 and num_layers >= 0")


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, cfg: MedusaConfig, hidden: int, vocab: int, target: dict | None = None):
        super().__init__()
        self.cfg, self.target = cfg, dict(target or {})
        self.acceptance: tuple[float, ...] | None = None  # top-1 per head in training (None: untrained)
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(hidden) for _ in range(cfg.num_layers)))
                                    for _ in range(cfg.num_heads))
        self.heads = nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(cfg.num_heads))
        self.lm_head = nn.Linear(hidden, vocab, bias=False).requires_grad_(False)

    @classmethod
    def from_target(cls, target_model, cfg: MedusaConfig | None = None, identity: dict | None = None,
                    **config) -> MedusaHeads:
        """Fresh heads for a target (HF VLM or `TargetAdapter`): every head and the frozen
        label head start as copies of the target's LM head."""
        from spec_core.targets import TargetAdapter, adapter_for

        adapter = target_model if isinstance(target_model, TargetAdapter) else adapter_for(target_model)
        cfg = dataclasses.replace(cfg or MedusaConfig(), **config)
        text = adapter.text_config
        info = {"model_type": getattr(text, "model_type", None), "hidden_size": text.hidden_size,
                "vocab_size": text.vocab_size, **(identity or {})}
        heads = cls(cfg, text.hidden_size, text.vocab_size, info)
        w = adapter.lm_head.weight.detach().float()
        for head in [*heads.heads, heads.lm_head]:
            head.weight.data.copy_(w)
        return heads.to(adapter.embed_tokens.weight.dtype)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def save_pretrained(self, directory: str | Path) -> None:
        save_module(self, directory, FORMAT, {"medusa": dataclasses.asdict(self.cfg), "target": self.target})
        save_acceptance(directory, self.acceptance)

    @classmethod
    def from_pretrained(cls, directory: str | Path, target_model=None) -> MedusaHeads:
        meta = read_meta(directory, FORMAT, "Medusa heads", target_model)
        t = meta["target"]
        heads = cls(MedusaConfig(**meta["medusa"]), t["hidden_size"], t["vocab_size"], t)
        heads.acceptance = read_acceptance(directory)
        return load_state(heads, directory, "lm_head.weight")

    def forward(self, hidden_SD: torch.Tensor) -> torch.Tensor:
        """(..., D) target LM-head inputs -> (..., K, V) logits of the K heads."""
        h = hidden_SD.to(self.lm_head.weight.dtype)
        return torch.stack([head(block(h)) for block, head in zip(self.blocks, self.heads)], dim=-2)
