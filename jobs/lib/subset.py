"""Representative subsets: `limit` rows of a table as a seeded sample stratified by group.

Manifests are written grouped (the reference world's training pool holds its six tasks one after
the other), so "the first N rows" of a manifest is one task. Every job's `limit` takes this
sample instead: each group (task, source or kind) gets its share of N by largest remainder, at
least one row where N allows, and the rows are drawn without replacement with a seeded generator.
The chosen row indices come back in table order, so shards stay deterministic.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Hashable, Sequence


def stratified_rows(groups: Sequence[Hashable], limit: int | None, seed: int = 0) -> list[int]:
    """Indices (sorted) of a seeded sample of `limit` rows, stratified by `groups[i]`; all rows
    when limit is None or not below the row count."""
    n = len(groups)
    if limit is None or limit >= n:
        return list(range(n))
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    keys = sorted(members, key=str)
    quota = _allocate([len(members[k]) for k in keys], limit)
    rng = random.Random(seed)
    chosen = [i for k, q in zip(keys, quota) for i in rng.sample(members[k], q)]
    return sorted(chosen)


def _allocate(sizes: list[int], limit: int) -> list[int]:
    """Shares of `limit` proportional to `sizes` (largest remainder), >= 1 each while limit allows."""
    total = sum(sizes)
    floor = [min(s, max(1 if limit >= len(sizes) else 0, limit * s // total)) for s in sizes]
    rest = limit - sum(floor)
    if rest < 0:  # the minimum of one per group overshot: take back from the largest shares
        for i in sorted(range(len(sizes)), key=lambda i: -floor[i])[:-rest]:
            floor[i] -= 1
        return floor
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(limit * sizes[i] % total), i))
    while rest > 0:
        for i in by_remainder:
            if rest and floor[i] < sizes[i]:
                floor[i] += 1
                rest -= 1
    return floor


def whole_units(groups: Sequence[Hashable], units: Sequence[Hashable], limit: int | None, seed: int = 0) -> list[int]:
    """Indices (sorted) of about `limit` rows taken a whole unit at a time (a unit: the rows that
    share an image; None = a row alone), the units sampled as `stratified_rows` samples rows, by
    the sorted groups of their rows. Six questions per image stay together, so what is stored
    once per image (visual tokens, the shared prompt prefix) is shared by all of them."""
    n = len(groups)
    if limit is None or limit >= n:
        return list(range(n))
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, u in enumerate(units):
        members[("row", i) if u is None else ("unit", u)].append(i)
    keys = list(members)  # first-appearance order
    kind = [tuple(sorted({str(groups[i]) for i in members[k]})) for k in keys]
    take = max(1, round(limit * len(keys) / n))
    return sorted(i for j in stratified_rows(kind, take, seed) for i in members[keys[j]])
