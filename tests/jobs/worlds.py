"""Shared test-world helpers for the job tests."""

from __future__ import annotations


def manifest_rows(samples: list[dict], source: str = "ref", split: str = "eval", suffix: str = "") -> list[dict]:
    """Reference-world samples as evaluation-manifest rows (images inline)."""
    return [{"id": s["id"] + suffix, "source": source, "split": split, "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"], "conversation": s["conversation"]}
            for s in samples]
