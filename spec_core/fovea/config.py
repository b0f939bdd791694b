"""Configuration of the FOVEA drafter and of its training objective (paper Table 5 defaults)."""

from __future__ import annotations

from dataclasses import dataclass

RETRIEVAL_MODES = ("cumulative", "fixed", "dense")
# How the drafter's own context holds the image (FOVEA paper Table 3's interfaces; MMSpec's methods):
#   fused      - an image slot reads fc([projected visual token; target feature]), like a text slot
#   prefix     - an image slot reads the raw projected visual token (its own linear map, no target
#                feature): MSD-style decoupling of visual and text tokens
#   compressed - the first num_queries image slots hold learned-query summaries of the whole image,
#                the other image slots are masked out of the drafter's attention (ViSpec-style)
CONTEXT_MODES = ("fused", "prefix", "compressed")
# Which state of a corrected depth the next depth reads (the paper does not say; its Algorithm 1
# corrects "only the current scoring representation"): the drafter's own h (default) or h_hat.
FEEDBACK_MODES = ("uncorrected", "corrected")
# Which draft state L_hid aligns with the target state: Eq. 13 writes h_hat; Table 8 says "draft
# states are measured before visual correction" (h, the default: measured, it lifts tau on both
# reference worlds - docs/results.md); "both" averages the two.
HIDDEN_LOSS_STATES = ("corrected", "uncorrected", "both")


@dataclass(frozen=True)
class FoveaConfig:
    """Architecture of one drafter; the blocks copy the target's decoder-layer type and config.
    Also the `drafter` section of the train_drafter job (`__pydantic_config__`: pydantic, at the
    jobs' boundary, rejects unknown keys; this module never imports pydantic)."""

    __pydantic_config__ = {"extra": "forbid"}

    n_blocks: int = 2               # paper: 2 for 7B-class targets, 3 for 13B
    correction_depth: int = 1       # visual correction at draft depths <= this (paper: 1)
    retrieval: str = "cumulative"   # cumulative (Eq. 5-7) | fixed (top k_fixed) | dense (all valid)
    rho: float = 0.8                # cumulative-mass threshold
    k_min: int = 32
    k_max: int = 256
    k_fixed: int = 16               # the appendix's K_r for fixed mode
    visual_correction: bool = True  # ablation "w/o visual correction": an EAGLE-style drafter
    depth_embedding: bool = True    # ablation "w/o depth embedding"
    gate: bool = True               # ablation "w/o correction gate" (g = 1)
    correction_hidden: int = 512    # hidden width of the correction and gate MLPs
    max_depth: int = 16             # depth-embedding rows; deeper nodes share the last one
    train_depth: int = 3            # draft steps unrolled in training (training-time test)
    visual_context: str = "fused"   # CONTEXT_MODES
    num_queries: int = 2            # compressed: learned queries per sample (ViSpec num_q = 2)
    feedback: str = "uncorrected"   # FEEDBACK_MODES: the state a corrected depth feeds to the next

    def __post_init__(self):
        if self.feedback not in FEEDBACK_MODES:
            raise ValueError(f"feedback must be one of {FEEDBACK_MODES}, not {self.feedback!r}")
        if self.visual_context not in CONTEXT_MODES:
            raise ValueError(f"visual_context must be one of {CONTEXT_MODES}, not {self.visual_context!r}")
        if self.num_queries < 1:
            raise ValueError("num_queries must be >= 1")
        if self.retrieval not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval must be one of {RETRIEVAL_MODES}, not {self.retrieval!r}")
        if self.n_blocks < 1 or self.train_depth < 1 or self.max_depth < 0:
            raise ValueError("n_blocks and train_depth must be >= 1, max_depth >= 0")
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], not {self.rho}")
        if not 1 <= self.k_min <= self.k_max or self.k_fixed < 1:
            raise ValueError("need 1 <= k_min <= k_max and k_fixed >= 1")


@dataclass(frozen=True)
class LossConfig:
    """Eq. 10-19 weights, paper Table 5; k_c is the candidate width of the draft tree (6). The
    train_drafter job's `loss` section as it is."""

    __pydantic_config__ = {"extra": "forbid"}

    lambda_hid: float = 1.0
    lambda_kl: float = 0.2
    lambda_tok: float = 1.0
    beta_h: float = 1.0
    beta_mid: float = 0.1
    beta_ce: float = 1.5
    beta_cmp: float = 0.5
    margin: float = 0.5
    k_c: int = 6
    gamma_w: float = 1.0
    hidden_state: str = "uncorrected"  # HIDDEN_LOSS_STATES: the draft state L_hid aligns

    def __post_init__(self):
        if self.hidden_state not in HIDDEN_LOSS_STATES:
            raise ValueError(f"hidden_state must be one of {HIDDEN_LOSS_STATES}, not {self.hidden_state!r}")
