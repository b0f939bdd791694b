"""A KV cache where every batch row (slot) has its own length.

Speculative decoding at batch B > 1 commits a different number of tokens per sample per step, so
one shared cache length (HF's DynamicCache / StaticCache) does not fit. `RaggedCache` keeps
(B, H, L, hd) buffers per layer; before each forward the engine says where each row's new
tokens go (`plan`), the attention layers write there through the standard `Cache.update` hook and
read the buffers up to the longest row (a view, no copy); the engine's explicit 4-D mask says which
of those keys each query sees. After verification `keep` moves each row's accepted tree entries
next to its prefix; everything past a row's length is scratch, overwritten by later writes.

Writes and moves go through one flat row index per forward (`index_copy_` on a (B*H*L, hd) view,
built once and shared by every layer) rather than an advanced-index scatter per layer. The
buffers start at what the first forward needs and double when a plan reads past them, up to
`capacity` (an engine sized for long answers does not zero-fill memory short ones never use).
A `static` cache (compiled steps, `decoding.compiled`) allocates the whole capacity at once and
marks its buffers as static addresses (their address never changes, so CUDA graphs replay them);
inside a compiled step `plan_step` takes the write slots as a device tensor and the keys read as
a bucket, with no host check.

Shapes: B slots, H kv heads, L allocated slots (<= capacity), hd head dim, S new tokens per row,
K keys read, A moved entries per row.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

MIN_ALLOC = 64  # slots per row allocated at first


def flat_rows(slots_BS: torch.Tensor, heads: int, length: int) -> torch.Tensor:
    """Row indices into a (B*H*L, hd) view of a (B, H, L, hd) buffer for entries (b, h, slots[b, s]),
    ordered like a (B, H, S, hd) tensor reshaped to (B*H*S, hd): (B*H*S,) long."""
    B = slots_BS.shape[0]
    dev = slots_BS.device
    base_BH1 = (torch.arange(B, device=dev)[:, None, None] * heads + torch.arange(heads, device=dev)[None, :, None]) * length
    return (base_BH1 + slots_BS[:, None, :]).reshape(-1)


class _Plan:
    """Where the next forward writes: write_BS (slot positions per row) and how many keys it reads;
    `start` when every row writes the same slots start, start + 1, ... (one slice, no index).
    `alloc`: slots per row allocated in every layer; `flat`: the write index for (heads, alloc),
    built by the first layer that writes and reused by the others."""

    def __init__(self, static: bool = False):
        self.static = static
        self.write_BS: torch.Tensor | None = None
        self.kv_len = 0
        self.start: int | None = None
        self.alloc = 0
        self.flat: tuple[tuple[int, int], torch.Tensor] | None = None

    def flat_index(self, heads: int, length: int) -> torch.Tensor:
        if self.flat is None or self.flat[0] != (heads, length):
            self.flat = ((heads, length), flat_rows(self.write_BS, heads, length))
        return self.flat[1]


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
        L = max(self.plan.alloc, 1)
        self.keys = torch.zeros(B, H, L, hd, dtype=key_states.dtype, device=self.device)
        self.values = torch.zeros(B, H, L, value_states.shape[-1], dtype=value_states.dtype, device=self.device)
        if self.plan.static:  # compiled steps mutate these in place: one address for the cache's life
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def grow(self, length: int) -> None:
        """Reallocate to `length` slots per row, keeping what is there (zeros past it: the
        masked-out keys and values of scratch slots must be finite)."""
        if not self.is_initialized or self.keys.shape[2] >= length:
            return
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], old.shape[1], length, old.shape[3])
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        p = self.plan  # RaggedCache.plan grew every allocated layer to p.alloc already
        if p.start is not None:  # every row writes the same consecutive slots: a slice copy
            S = key_states.shape[2]
            self.keys[:, :, p.start: p.start + S] = key_states
            self.values[:, :, p.start: p.start + S] = value_states
        else:
            B, H, L, hd = self.keys.shape
            idx = p.flat_index(H, L)
            self.keys.view(-1, hd).index_copy_(0, idx, key_states.reshape(-1, hd))
            self.values.view(-1, self.values.shape[-1]).index_copy_(0, idx, value_states.reshape(-1, value_states.shape[-1]))
        K = p.kv_len
        return self.keys[:, :, :K], self.values[:, :, :K]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.plan.kv_len, 0

    def get_seq_length(self) -> int:
        return self.plan.kv_len

    def get_max_length(self) -> int:
        return self.capacity


class RaggedCache(Cache):
    """KV buffers for `batch` rows of up to `capacity` tokens, `num_layers` attention layers;
    `static`: the whole capacity allocated at the first write, at one address (compiled steps)."""

    def __init__(self, batch: int, capacity: int, num_layers: int, static: bool = False):
        self._plan = _Plan(static)
        super().__init__(layers=[RaggedLayer(batch, capacity, self._plan) for _ in range(num_layers)])
        self.batch, self.capacity = batch, capacity
        if static:
            self._plan.alloc = capacity

    def reserve(self, n: int) -> None:
        """At least n slots per row allocated (doubling, at most capacity)."""
        p = self._plan
        if n > p.alloc:
            p.alloc = min(self.capacity, max(n, 2 * p.alloc, MIN_ALLOC))
            for layer in self.layers:
                layer.grow(p.alloc)

    def plan(self, write_BS: torch.Tensor | None, kv_len: int | None = None, start: int | None = None) -> None:
        """The next forward writes its S tokens of row b at slots write_BS[b] and reads keys
        [0, kv_len) (default: just past the furthest write). With `start`, every row writes slots
        start .. start + S - 1 (write_BS may then be None) and kv_len is required. Given kv_len,
        the writes must lie below it (callers know it on the host: no device read)."""
        if kv_len is None:
            kv_len = int(write_BS.max()) + 1
        if kv_len > self.capacity:
            raise ValueError(f"cache capacity {self.capacity} exceeded (write at {kv_len - 1})")
        self.reserve(kv_len)
        self._plan.write_BS, self._plan.kv_len, self._plan.start, self._plan.flat = write_BS, kv_len, start, None

    def plan_step(self, write_BS: torch.Tensor, kv_len) -> None:
        """Inside a compiled step: the forward writes row b's S tokens at slots write_BS[b] (a
        device tensor) and reads keys [0, kv_len) (possibly symbolic). No check and no host read:
        the caller sized kv_len on the host and reserved it (`reserve`; a static cache holds its
        capacity)."""
        p = self._plan
        p.write_BS, p.kv_len, p.start, p.flat = write_BS, kv_len, None, None

    def end_step(self) -> None:
        """After a compiled step's forward: drop the plan's tensors, so that the cache a step sees
        is alike before every call (dynamo guards what a call finds, and a plan left by the last
        call - or by none yet - would make the next call's graph another)."""
        p = self._plan
        p.write_BS, p.flat = None, None

    def load(self, row: int, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put one sample's prefix KV (per layer (1, H, n, hd) pairs, e.g. from a DynamicCache after
        a batch-1 prefill) at slots [0, n) of `row`."""
        n = keys_values[0][0].shape[-2] if keys_values else 0
        if n > self.capacity:
            raise ValueError(f"a prefix of {n} tokens does not fit the cache capacity {self.capacity}")
        self.reserve(n)
        for layer, (k, v) in zip(self.layers, keys_values):
            if not layer.is_initialized:
                shape = (self.batch, k.shape[1], 1, k.shape[-1])
                layer.lazy_initialization(k.new_zeros(shape), v.new_zeros(shape[:-1] + (v.shape[-1],)))
            layer.keys[row, :, :n] = k[0]
            layer.values[row, :, :n] = v[0]

    def keep(self, src_BA: torch.Tensor, dst_BA: torch.Tensor) -> None:
        """Per row, copy slots src_BA[b, i] to dst_BA[b, i] (all sources read before any write;
        rows pad with src == dst, so a step that accepted no draft anywhere need not call this)."""
        index = None
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            B, H, L, _ = layer.keys.shape
            if index is None or index[0] != (H, L):
                index = ((H, L), flat_rows(src_BA, H, L), flat_rows(dst_BA, H, L))
            _, src, dst = index
            for buf in (layer.keys, layer.values):
                flat = buf.view(-1, buf.shape[-1])
                flat.index_copy_(0, dst, flat.index_select(0, src))

    def select_rows(self, rows_R: torch.Tensor) -> None:
        """Keep only rows `rows_R`, in that order (e.g. drop finished samples from a batch)."""
        for layer in self.layers:
            layer.batch = len(rows_R)
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[rows_R], layer.values[rows_R]
        self.batch = len(rows_R)

    def nbytes(self) -> int:
        """Bytes held by the allocated buffers (they grow by doubling, up to capacity)."""
        return sum(t.numel() * t.element_size() for layer in self.layers if layer.is_initialized
                   for t in (layer.keys, layer.values))

    def row_prefix(self, row: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Slots [0, n) of one row, per layer (for tests and inspection)."""
        return [(layer.keys[row, :, :n], layer.values[row, :, :n]) for layer in self.layers]


def dynamic_cache_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer (keys, values) of a transformers DynamicCache."""
    return [(layer.keys, layer.values) for layer in cache.layers]
