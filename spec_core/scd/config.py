"""What one Speculative Jacobi / Coupled Decoding run is configured by."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

COUPLINGS = ("none", "mc", "gs")
ALIASES = {"sjd": "none", "independent": "none", "maximal": "mc", "gumbel": "gs"}  # also accepted


@dataclass(frozen=True)
class ScdConfig:
    """Window, coupling and the verified distribution's processing.

    window: L, the forward holds the last committed token and L - 1 drafts; 1 is plain AR. "auto":
        L chosen per iteration in [1, max_window] for committed tokens per second (scd.window).
    max_window: the largest L of window "auto" (ignored for an integer window).
    coupling: how a draft is re-sampled between iterations: "none" (SJD, independent draws),
        "mc" (maximal coupling: the MRS step at every slot), "gs" (Gumbel coupling, shared noise).
    alpha: coupling strength (SCD Eq. 4): each re-sampled draft is coupled with probability alpha,
        independent otherwise; 1 is SCD, 0 is SJD.
    temperature (<= 0: greedy), top_k (0: off), top_p (1: off), cfg_scale (1: no guidance; else
        uncond + s (cond - uncond) on raw logits, both halves in one doubled batch)."""

    window: int | str = 32
    max_window: int = 32
    coupling: str = "mc"
    alpha: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    cfg_scale: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "coupling", ALIASES.get(self.coupling, self.coupling))
        w = self.window
        if not (w == "auto" or (isinstance(w, int) and not isinstance(w, bool) and w >= 1)):
            raise ValueError(f"window must be an integer >= 1 or 'auto', got {w!r}")
        if isinstance(self.max_window, bool) or not isinstance(self.max_window, int) or self.max_window < 1:
            raise ValueError(f"max_window must be an integer >= 1, got {self.max_window!r}")
        if self.coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {COUPLINGS} (or {sorted(ALIASES)}), got {self.coupling!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def auto(self) -> bool:
        return self.window == "auto"

    @property
    def slots(self) -> int:
        """The largest window a forward can hold (draft slots + 1)."""
        return self.max_window if self.auto else self.window

    @property
    def cfg(self) -> bool:
        return self.cfg_scale != 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
