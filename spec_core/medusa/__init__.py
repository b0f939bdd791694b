"""Medusa heads (Cai et al. 2024, Medusa-1: frozen target): K extra decoding heads on the target's
last hidden state, head k guessing the token k + 1 places ahead; their top-k sets form a tree the
engine verifies like any other draft (`spec_core.decoding.medusa_draft`)."""

from spec_core.medusa.heads import MedusaConfig, MedusaHeads
from spec_core.medusa.loss import medusa_loss

__all__ = ["MedusaConfig", "MedusaHeads", "medusa_loss"]
