"""jobs/lib/subset.py: a seeded sample stratified by group, against a direct count."""

from __future__ import annotations

from collections import Counter

import pytest

from jobs.lib.subset import stratified_rows

# a pool written grouped, as the reference world's training pool is: six tasks one after another
POOL = [t for t, n in (("general", 400), ("text", 400), ("caption", 400), ("chart", 400), ("reason", 20),
                       ("multi", 380)) for _ in range(n)]


def test_no_limit_or_a_large_one_keeps_every_row_in_order():
    assert stratified_rows(POOL, None) == list(range(len(POOL)))
    assert stratified_rows(POOL, len(POOL) + 5) == list(range(len(POOL)))


@pytest.mark.parametrize("limit", [6, 30, 100, 1200])
def test_every_group_gets_its_proportional_share(limit):
    rows = stratified_rows(POOL, limit, seed=3)
    assert len(rows) == len(set(rows)) == limit and rows == sorted(rows)
    got = Counter(POOL[i] for i in rows)
    assert set(got) == set(POOL)  # every task, even the small one
    sizes = Counter(POOL)
    for task, n in got.items():
        assert abs(n - limit * sizes[task] / len(POOL)) <= 1.0 or n == 1


def test_the_first_rows_are_not_what_is_taken():
    rows = stratified_rows(POOL, 30, seed=0)
    assert rows != list(range(30)) and Counter(POOL[i] for i in rows)["general"] < 30


def test_seeded_and_deterministic():
    assert stratified_rows(POOL, 50, seed=1) == stratified_rows(POOL, 50, seed=1)
    assert stratified_rows(POOL, 50, seed=1) != stratified_rows(POOL, 50, seed=2)


def test_fewer_rows_than_groups_takes_one_from_as_many_groups():
    rows = stratified_rows(POOL, 4, seed=0)
    assert len(rows) == 4 and len({POOL[i] for i in rows}) == 4


def test_whole_units_take_every_row_of_an_image_and_about_the_limit():
    from jobs.lib.subset import whole_units

    tasks = ["general", "text", "caption", "chart", "reason", "multi"]
    groups = [t for t in tasks for _ in range(100)]  # written grouped by task, image i asked once per task
    units = [f"img{i}" for _ in tasks for i in range(100)]
    rows = whole_units(groups, units, 120, seed=3)
    assert rows == sorted(rows) and len(rows) == 120  # 20 images x 6 questions
    chosen = {units[i] for i in rows}
    assert len(chosen) == 20 and all(sum(units[i] == u for i in rows) == 6 for u in chosen)
    assert whole_units(groups, units, 120, seed=3) == rows != whole_units(groups, units, 120, seed=4)
    assert whole_units(groups, units, None) == list(range(600))
    lone = whole_units(groups, [None] * 600, 30, seed=1)  # no shared images: rows, stratified by task
    assert len(lone) == 30 and Counter(groups[i] for i in lone) == Counter({t: 5 for t in tasks})
