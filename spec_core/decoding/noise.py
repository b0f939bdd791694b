"""Counter-based random numbers: every draw is a hash of its key, not a state to advance.

A draw keyed on (seed, sample, absolute position, iteration, stream) is the same whichever batch the
sample runs in and however often the job restarts, so batched and batch-1 decoding of a sample see
the same randomness, and Gumbel coupling can re-read a position's noise on every Jacobi iteration
(the paper's "generated online via hashing of the token's global index").

The mixer is Wellons' lowbias32 on int64 tensors holding 32-bit values. Multiplications are split
into 16-bit halves so no intermediate exceeds 2^63 (int64 overflow is undefined in C++).
"""

from __future__ import annotations

import torch

M32 = 0xFFFFFFFF

# Streams: independent families of draws for one (sample, position, iteration). TOKEN: the
# speculative-decoding engine's draw of the target's token at a sequence position.
ACCEPT, RESIDUAL, FRESH, DRAFT, COIN, GUMBEL, TOKEN = range(1, 8)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 0 <= x < 2^32 without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32: a bijective 32-bit integer hash with good avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_keys(*keys: torch.Tensor | int) -> torch.Tensor:
    """Hash a tuple of broadcastable integer keys (each reduced mod 2^32) to 32-bit values."""
    h = torch.tensor(0x9E3779B9, dtype=torch.long)
    for k in keys:
        k = torch.as_tensor(k, dtype=torch.long) & M32
        h = mix32(h.to(k.device) ^ k)
        h = mix32(h ^ 0x85EBCA6B)
    return h


def uniform(*keys: torch.Tensor | int) -> torch.Tensor:
    """Float32 uniforms in (0, 1) from 24 hashed bits, broadcast over the keys."""
    return ((hash_keys(*keys) >> 8).float() + 0.5) / float(1 << 24)


def gumbel(*keys: torch.Tensor | int) -> torch.Tensor:
    """Standard Gumbel(0, 1) noise keyed like `uniform`."""
    return -torch.log(-torch.log(uniform(*keys)))
