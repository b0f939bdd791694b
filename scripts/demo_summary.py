"""Print a summary table of the job runs under an output URI (newest run per job)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.lib.storage import Storage  # noqa: E402


def latest_runs(store: Storage, out: str) -> list[dict]:
    runs: dict[str, dict] = {}
    for uri in store.walk_files(out):
        if uri.endswith("metrics.json"):
            m = json.loads(store.read_text(uri))
            if m["job"] not in runs or m["started_utc"] > runs[m["job"]]["started_utc"]:
                runs[m["job"]] = m
    return sorted(runs.values(), key=lambda m: m["started_utc"])


def main(out: str) -> None:
    runs = latest_runs(Storage(), out)
    if not runs:
        raise SystemExit(f"no runs under {out}")
    rows = [("job", "wall s", "outputs", "headline figures")]
    for m in runs:
        figs = ", ".join(f"{k}={v}" for k, v in m["figures"].items() if not str(k).endswith("_uri"))
        rows.append((m["job"], f"{m['wall_seconds']:.1f}", m["run_dir"], figs))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3])
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * 16)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo")
