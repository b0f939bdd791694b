"""Speculative Jacobi Decoding and Speculative Coupled Decoding for AR image / video generators:
couplings, the batched Jacobi loop, and adapters for HF generators."""

from spec_core.scd.api import GenerateOutput, generate
from spec_core.scd.config import COUPLINGS, ScdConfig
from spec_core.scd.coupling import gumbel_argmax, mrs, sample_inverse_cdf, total_variation
from spec_core.scd.jacobi import JacobiDecoder, ScdResult
from spec_core.sampling import entropy_nats, processed_probs
from spec_core.scd.window import WindowChooser, calibrate

__all__ = ["COUPLINGS", "GenerateOutput", "JacobiDecoder", "ScdConfig", "ScdResult", "entropy_nats",
           "generate", "gumbel_argmax", "mrs", "processed_probs", "sample_inverse_cdf",
           "total_variation", "WindowChooser", "calibrate"]
