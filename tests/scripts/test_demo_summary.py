"""scripts/demo_summary.py: which chain a world's demo runs."""

import importlib.util
import json

from jobs.lib.storage import Storage
from tests.conftest import REPO


def render(out, world):
    spec = importlib.util.spec_from_file_location("demo_summary", f"{REPO}/scripts/demo_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.render(Storage(), str(out), "reference", str(world), quick=True)


def test_a_hires_world_has_no_image_generation_job_to_wait_for(tmp_path):
    for size, jobs in (("tiny-hires", 5), ("hires", 5), ("tiny", 6), ("small", 6)):
        world = tmp_path / size
        world.mkdir()
        (world / "metrics.json").write_text(json.dumps({"size": size, "build_seconds": 6.0}))
        text = render(tmp_path / "runs", world)
        assert f"Every job ran: NO (0 of {jobs}: )" in text and f"reference world '{size}'" in text
