"""Shared test-world helpers for the job tests."""

from __future__ import annotations


def manifest_rows(samples: list[dict], source: str = "ref", split: str = "eval", suffix: str = "") -> list[dict]:
    """Reference-world samples as evaluation-manifest rows (images inline)."""
    return [{"id": s["id"] + suffix, "source": source, "split": split, "task": s["task"], "image_uri": None,
             "image_bytes": s["image_png"], "image_sha256": s["image_sha256"], "conversation": s["conversation"]}
            for s in samples]


def short_table_target(src, dst, positions: int) -> str:
    """A copy of a saved target whose text config has only `positions` positions (RoPE: no
    weights change, only the table the jobs check against)."""
    import json
    import shutil
    from pathlib import Path

    shutil.copytree(src, dst)
    cfg = json.loads((Path(dst) / "config.json").read_text())
    cfg["text_config"]["max_position_embeddings"] = positions
    (Path(dst) / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(dst)
