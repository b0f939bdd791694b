"""Lossless tree speculative decoding (batched, continuous batching) and its AR baseline."""

from spec_core.decoding.api import GenerateOutput, ar_generate, load_drafter, speculative_generate
from spec_core.decoding.cache import RaggedCache
from spec_core.decoding.engine import DecodeEngine, Request, Result
from spec_core.decoding.sampling import SamplingConfig
from spec_core.decoding.tree import DraftTree, TreeConfig

__all__ = ["DecodeEngine", "DraftTree", "GenerateOutput", "RaggedCache", "Request", "Result",
           "SamplingConfig", "TreeConfig", "ar_generate", "load_drafter",
           "speculative_generate"]
