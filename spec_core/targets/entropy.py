"""Per-token choice of the intermediate target layer by minimum attention entropy (FOVEA, App. C).

Hidden state l is HF's `hidden_states[l]` (`hidden_states[0]` is the embeddings, state l the
output of the l-th decoder layer) and its attention entropy is that of the attention that READS
it: `layers[l].self_attn`, HF's `attentions[l]` - DREAM's pairing (its released data script takes
`hidden_states[l]` for the argmin over `attentions[l]`, l = 1..int(0.4 L) - 2, which gives the
paper's 1..10 for 32 layers and 1..9 for Qwen2.5-VL's 28), and FOVEA follows DREAM. The
attention entropy of token n is the mean over heads of -sum_j a[h, n, j] log a[h, n, j] over the
causal, padding-masked attention probabilities a.

The model keeps its own attention kernel (sdpa, flash, ...): a forward pre-hook on decoder layer l
keeps its input (state l), and a pre-hook on its `self_attn` takes the attention input and the
rotary cos/sin the model passes in (so Qwen2.5-VL's M-RoPE comes for free), recomputes q and k
with the layer's own projections, q/k norms if any and rotary function, repeats k for GQA,
softmaxes in query chunks and updates a running argmin, so memory is the (L, B, T) entropies,
one (B, T, D) state and one (B, N, C, T) chunk of scores.

Shapes: B batch, T positions, C query chunk, N heads, H head dim, D hidden, L searched layers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class LayerChoice:
    """The per-token layer choice. Padding positions get layer -1 and a zero state."""

    chosen_layer_BT: torch.Tensor   # long, in first..last (an index into HF hidden_states)
    intermediate_BTD: torch.Tensor  # hidden_states[chosen_layer_BT[b, t]][b, t]
    entropy_LBT: torch.Tensor       # float32; row i is layer first + i; +inf at padding


def searched_layers(requested: tuple[int, int], num_layers: int) -> tuple[int, int]:
    """Clamp an inclusive 1-based layer range to the layers 1..num_layers-1 that exist.

    State l is read by decoder layer l (0-based), so l <= num_layers - 1; HF's
    `hidden_states[num_layers]` is after the final norm anyway. The reference target has 10
    layers, so the paper's 1..10 becomes 1..9 there.
    """
    first, last = requested
    if first < 1 or last < first:
        raise ValueError(f"entropy layer range must be 1 <= first <= last, got {requested}")
    last = min(last, num_layers - 1)
    if last < first:
        raise ValueError(f"entropy layer range {requested} has no layer below the last of a "
                         f"{num_layers}-layer target")
    return first, last


def _rotary_fn(attn: nn.Module):
    """The `apply_rotary_pos_emb` of the attention's own modeling file (what its forward calls)."""
    fn = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
    if fn is None:
        raise ValueError(f"{type(attn).__name__}'s module has no apply_rotary_pos_emb to recompute "
                         "its attention with")
    return fn


def _heads(proj: nn.Linear, norm: nn.Module | None, hidden_BTD: torch.Tensor, head_dim: int):
    """Project and split into heads, applying a q/k norm per head (Qwen3) or on the whole
    projection (OLMo2) as the norm's size says. (B, T, D) -> (B, N, T, H)."""
    B, T, _ = hidden_BTD.shape
    x = proj(hidden_BTD)
    if norm is not None and norm.weight.numel() != head_dim:
        x = norm(x)
    x = x.view(B, T, -1, head_dim)  # (B, T, N*H) -> (B, T, N, H)
    if norm is not None and norm.weight.numel() == head_dim:
        x = norm(x)
    return x.transpose(1, 2)  # (B, T, N, H) -> (B, N, T, H)


def attention_entropy_BT(attn: nn.Module, hidden_BTD: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, valid_BT: torch.Tensor,
                         query_chunk: int = 256) -> torch.Tensor:
    """Mean-over-heads attention entropy per token of one attention module, recomputed from its
    input. Padding queries (no key to attend to) come out as 0; the caller masks them."""
    if getattr(attn, "sliding_window", None) is not None:
        raise ValueError("attention entropy of sliding-window layers is not supported")
    head_dim = attn.head_dim
    q_BNTH = _heads(attn.q_proj, getattr(attn, "q_norm", None), hidden_BTD, head_dim)
    k_BNTH = _heads(attn.k_proj, getattr(attn, "k_norm", None), hidden_BTD, head_dim)
    q_BNTH, k_BNTH = _rotary_fn(attn)(q_BNTH, k_BNTH, cos, sin)
    # GQA: query head i reads kv head i // groups, as HF's repeat_kv
    k_BNTH = k_BNTH.repeat_interleave(q_BNTH.shape[1] // k_BNTH.shape[1], dim=1)
    q_BNTH, k_BNTH = q_BNTH.float(), k_BNTH.float()

    T = hidden_BTD.shape[1]
    pos_T = torch.arange(T, device=hidden_BTD.device)
    chunks = []
    for start in range(0, T, query_chunk):
        end = min(start + query_chunk, T)  # causal: keys past the chunk's last query are unused
        scores_BNCK = q_BNTH[:, :, start:end] @ k_BNTH[:, :, :end].transpose(-1, -2) * attn.scaling
        # (B,N,C,H) x (B,N,H,K) -> (B,N,C,K)
        allowed_BCK = (pos_T[None, :end] <= pos_T[start:end, None])[None] & valid_BT[:, None, :end].bool()
        allowed_B1CK = allowed_BCK[:, None]  # (B, C, K) -> (B, 1, C, K), broadcast over heads
        logp_BNCK = scores_BNCK.masked_fill(~allowed_B1CK, float("-inf")).log_softmax(-1)
        plogp_BNCK = (logp_BNCK.exp() * logp_BNCK).masked_fill(~allowed_B1CK, 0.0)
        chunks.append(-plogp_BNCK.sum(-1).mean(1))  # (B, N, C, K) -> (B, N, C) -> (B, C)
    return torch.cat(chunks, dim=1)


class MinEntropyLayer:
    """Context manager: while open, hooks on decoder layers first..last (0-based: the layers that
    read hidden states first..last) track each token's minimum-entropy state; `result()` after
    the forward. Ties go to the lower layer."""

    def __init__(self, layers: nn.ModuleList, layer_range: tuple[int, int],
                 attention_mask_BT: torch.Tensor, query_chunk: int = 256):
        self.layers, self.query_chunk = layers, query_chunk
        self.first, self.last = searched_layers(layer_range, len(layers))
        self.valid_BT = attention_mask_BT.bool()
        self.entropies: dict[int, torch.Tensor] = {}
        self.inputs: dict[int, torch.Tensor] = {}
        self.best_BT = self.chosen_BT = self.state_BTD = None
        self.handles: list = []

    def __enter__(self) -> MinEntropyLayer:
        for state_no in range(self.first, self.last + 1):
            decoder_layer = self.layers[state_no]  # reads hidden_states[state_no]
            self.handles.append(decoder_layer.register_forward_pre_hook(
                self._input_hook(state_no), with_kwargs=True))
            self.handles.append(decoder_layer.self_attn.register_forward_pre_hook(
                self._attention_hook(state_no), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _input_hook(self, state_no: int):
        def hook(module, args, kwargs):
            self.inputs[state_no] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        return hook

    def _attention_hook(self, state_no: int):
        def hook(attn, args, kwargs):
            hidden_BTD = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            if kwargs.get("position_embeddings") is None:
                raise ValueError(f"{type(attn).__name__} gets no position_embeddings (cos, sin)")
            cos, sin = kwargs["position_embeddings"]
            entropy_BT = attention_entropy_BT(attn, hidden_BTD, cos, sin, self.valid_BT,
                                              self.query_chunk).masked_fill(~self.valid_BT, float("inf"))
            self.entropies[state_no] = entropy_BT
            self._update(state_no, entropy_BT, self.inputs.pop(state_no))
        return hook

    def _update(self, state_no: int, entropy_BT: torch.Tensor, state_BTD: torch.Tensor) -> None:
        if self.best_BT is None:
            self.best_BT = torch.full_like(entropy_BT, float("inf"))
            self.chosen_BT = torch.full(entropy_BT.shape, -1, dtype=torch.long, device=entropy_BT.device)
            self.state_BTD = torch.zeros_like(state_BTD)
        better_BT = entropy_BT < self.best_BT
        self.best_BT = torch.where(better_BT, entropy_BT, self.best_BT)
        self.chosen_BT = torch.where(better_BT, state_no, self.chosen_BT)
        self.state_BTD = torch.where(better_BT[..., None], state_BTD, self.state_BTD)

    def result(self) -> LayerChoice:
        assert self.chosen_BT is not None, "no forward ran through the searched layers"
        entropy_LBT = torch.stack([self.entropies[n] for n in range(self.first, self.last + 1)])
        return LayerChoice(self.chosen_BT, self.state_BTD, entropy_LBT)
