"""A preallocated KV cache where every batch row (slot) has its own length.

Speculative decoding at batch B > 1 commits a different number of tokens per sample per step, so
one shared cache length (HF's DynamicCache / StaticCache) does not fit. `RaggedCache` keeps
(B, H, L_max, hd) buffers per layer; before each forward the engine says where each row's new
tokens go (`plan`), the attention layers write there through the standard `Cache.update` hook and
read the buffers up to the longest row (a view, no copy); the engine's explicit 4-D mask says which
of those keys each query sees. After verification `keep` moves each row's accepted tree entries
next to its prefix; everything past a row's length is scratch, overwritten by later writes. Nothing
grows per step: memory is fixed at allocation.

Shapes: B slots, H kv heads, L capacity, hd head dim, S new tokens per row, K keys read.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class _Plan:
    """Where the next forward writes: write_BS (slot positions per row) and how many keys it reads;
    `start` when every row writes the same slots start, start + 1, ... (one slice, no scatter)."""

    def __init__(self):
        self.write_BS: torch.Tensor | None = None
        self.kv_len = 0
        self.start: int | None = None


class RaggedLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, batch: int, capacity: int, plan: _Plan):
        super().__init__()
        self.batch, self.capacity, self.plan = batch, capacity, plan

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, hd = key_states.shape
        if B != self.batch:
            raise ValueError(f"RaggedCache has {self.batch} rows, the forward has {B}")
        self.device = key_states.device
        self.keys = torch.zeros(B, H, self.capacity, hd, dtype=key_states.dtype, device=self.device)
        self.values = torch.zeros(B, H, self.capacity, value_states.shape[-1], dtype=value_states.dtype,
                                  device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        p = self.plan
        if p.start is not None:  # every row writes the same consecutive slots: a slice copy
            S = key_states.shape[2]
            self.keys[:, :, p.start: p.start + S] = key_states
            self.values[:, :, p.start: p.start + S] = value_states
        else:
            rows_B1 = torch.arange(self.batch, device=self.device)[:, None]
            self.keys[rows_B1, :, p.write_BS] = key_states.transpose(1, 2)      # (B, S, H, hd) into row slots
            self.values[rows_B1, :, p.write_BS] = value_states.transpose(1, 2)
        K = p.kv_len
        return self.keys[:, :, :K], self.values[:, :, :K]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.plan.kv_len, 0

    def get_seq_length(self) -> int:
        return self.plan.kv_len

    def get_max_length(self) -> int:
        return self.capacity


class RaggedCache(Cache):
    """KV buffers for `batch` rows of up to `capacity` tokens, `num_layers` attention layers."""

    def __init__(self, batch: int, capacity: int, num_layers: int):
        self._plan = _Plan()
        super().__init__(layers=[RaggedLayer(batch, capacity, self._plan) for _ in range(num_layers)])
        self.batch, self.capacity = batch, capacity

    def plan(self, write_BS: torch.Tensor | None, kv_len: int | None = None, start: int | None = None) -> None:
        """The next forward writes its S tokens of row b at slots write_BS[b] and reads keys
        [0, kv_len) (default: just past the furthest write). With `start`, every row writes slots
        start .. start + S - 1 (write_BS may then be None) and kv_len is required. Given kv_len,
        the writes must lie below it (callers know it on the host: no device read)."""
        if kv_len is None:
            kv_len = int(write_BS.max()) + 1
        if kv_len > self.capacity:
            raise ValueError(f"cache capacity {self.capacity} exceeded (write at {kv_len - 1})")
        self._plan.write_BS, self._plan.kv_len, self._plan.start = write_BS, kv_len, start

    def load(self, row: int, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put one sample's prefix KV (per layer (1, H, n, hd) pairs, e.g. from a DynamicCache after
        a batch-1 prefill) at slots [0, n) of `row`."""
        for layer, (k, v) in zip(self.layers, keys_values):
            if not layer.is_initialized:
                shape = (self.batch, k.shape[1], 1, k.shape[-1])
                layer.lazy_initialization(k.new_zeros(shape), v.new_zeros(shape[:-1] + (v.shape[-1],)))
            n = k.shape[-2]
            if n > self.capacity:
                raise ValueError(f"a prefix of {n} tokens does not fit the cache capacity {self.capacity}")
            layer.keys[row, :, :n] = k[0]
            layer.values[row, :, :n] = v[0]

    def keep(self, src_BA: torch.Tensor, dst_BA: torch.Tensor) -> None:
        """Per row, copy slots src_BA[b, i] to dst_BA[b, i] (all sources read before any write;
        rows pad with src == dst, so a step that accepted no draft anywhere need not call this)."""
        rows_B1 = torch.arange(self.batch, device=src_BA.device)[:, None]
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[rows_B1, :, dst_BA] = layer.keys[rows_B1, :, src_BA]
                layer.values[rows_B1, :, dst_BA] = layer.values[rows_B1, :, src_BA]

    def select_rows(self, rows_R: torch.Tensor) -> None:
        """Keep only rows `rows_R`, in that order (e.g. drop finished samples from a batch)."""
        for layer in self.layers:
            layer.batch = len(rows_R)
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[rows_R], layer.values[rows_R]
        self.batch = len(rows_R)

    def nbytes(self) -> int:
        """Bytes held by the allocated buffers (fixed once allocated)."""
        return sum(t.numel() * t.element_size() for layer in self.layers if layer.is_initialized
                   for t in (layer.keys, layer.values))

    def row_prefix(self, row: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Slots [0, n) of one row, per layer (for tests and inspection)."""
        return [(layer.keys[row, :, :n], layer.values[row, :, :n]) for layer in self.layers]


def dynamic_cache_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) of a transformers DynamicCache."""
    return [(layer.keys, layer.values) for layer in cache.layers]
