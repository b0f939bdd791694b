"""FOVEA: a feature-level drafter with a per-image visual memory, state-dependent retrieval and a
gated correction of the hidden state that scores shallow draft nodes (../shared/papers/fovea.txt)."""

from spec_core.fovea.config import FoveaConfig, LossConfig
from spec_core.fovea.correction import Correction, VisualCorrection, VisualMemory
from spec_core.fovea.data import DraftBatch, DraftSample, collate, decode_sample
from spec_core.fovea.drafter import FoveaDrafter
from spec_core.fovea.losses import LossOutput, drafter_loss
from spec_core.fovea.retrieval import cumulative_mass_weights

__all__ = ["Correction", "DraftBatch", "DraftSample", "FoveaConfig", "FoveaDrafter", "LossConfig",
           "LossOutput", "VisualCorrection", "VisualMemory", "collate", "cumulative_mass_weights",
           "decode_sample", "drafter_loss"]
