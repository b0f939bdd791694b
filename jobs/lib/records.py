"""Parquet schemas of the project's tables and the Ray Data stages that fill them."""

from __future__ import annotations

import pyarrow as pa

TURN = pa.struct([("role", pa.string()), ("content", pa.string())])

# One row per multimodal sample: what the reference world writes and what manifests read.
SAMPLE_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("task", pa.string()),
    ("split", pa.string()),
    ("image_png", pa.binary()),
    ("image_sha256", pa.string()),
    ("conversation", pa.list_(TURN)),
    ("answers", pa.list_(pa.string())),
    ("scene_json", pa.string()),
])


def samples_table(rows: list[dict]) -> pa.Table:
    """Plain sample dicts (spec_core.reference.make_sample) -> a table with SAMPLE_SCHEMA."""
    return pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)


def generate_samples(batch: pa.Table, seed: int, world: str = "small") -> pa.Table:
    """Ray Data stage: rows (split, task, index) -> rendered samples of the small or the hires
    reference world (deterministic per row)."""
    from spec_core.reference import hires, make_sample

    if world == "hires":
        make_sample = hires.make_sample
    cols = batch.to_pydict()
    rows = [make_sample(int(i), t, seed, s) for s, t, i in zip(cols["split"], cols["task"], cols["index"])]
    return samples_table(rows)
