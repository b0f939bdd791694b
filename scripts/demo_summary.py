"""Print the demo's summary table: the reference world's headline figures and the newest run of
each job under an output URI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.lib.storage import Storage, join  # noqa: E402

WORLD_FIGURES = ("exact_match_general_vqa", "exact_match_text_vqa", "exact_match_chart_vqa",
                 "caption_grounded", "image_dependence", "target_over_drafter",
                 "image_prompt_following_cfg", "image_entropy_default")


def latest_runs(store: Storage, out: str) -> list[dict]:
    runs: dict[str, dict] = {}
    for uri in store.walk_files(out):
        if uri.endswith("metrics.json"):
            m = json.loads(store.read_text(uri))
            if "job" in m and (m["job"] not in runs or m["started_utc"] > runs[m["job"]]["started_utc"]):
                runs[m["job"]] = m
    return sorted(runs.values(), key=lambda m: m["started_utc"])


def rows_for(store: Storage, out: str, world: str | None) -> list[tuple[str, str, str, str]]:
    rows = []
    if world and store.exists(join(world, "metrics.json")):
        w = json.loads(store.read_text(join(world, "metrics.json")))
        figs = ", ".join(f"{k}={w[k]}" for k in WORLD_FIGURES if k in w)
        rows.append((f"reference world ({w['size']})", f"{w.get('build_seconds', 0):.1f}", world, figs))
    for m in latest_runs(store, out):
        figs = ", ".join(f"{k}={v}" for k, v in m["figures"].items() if not str(k).endswith("_uri"))
        rows.append((m["job"], f"{m['wall_seconds']:.1f}", m["run_dir"], figs))
    return rows


def main(out: str, world: str | None = None) -> None:
    rows = rows_for(Storage(), out, world)
    if not rows:
        raise SystemExit(f"no runs under {out}")
    rows.insert(0, ("what ran", "wall s", "outputs", "headline figures"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * 16)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo", sys.argv[2] if len(sys.argv) > 2 else None)
