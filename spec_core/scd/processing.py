"""The verified distribution of SCD (CFG, mask, temperature, top-k, top-p, greedy one-hot) and its
entropy: implemented once in `spec_core.sampling`, named here for the generator's callers."""

from spec_core.sampling import entropy_nats, processed_probs

__all__ = ["entropy_nats", "processed_probs"]
