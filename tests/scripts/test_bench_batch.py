"""scripts/bench_batch.py's prompts follow the target: hires mosaics for a LLaVA-NeXT target, the
small world's scenes for a LLaVA one."""

from transformers import LlavaConfig, LlavaNextConfig

from scripts.bench_batch import prompts, world_of_target
from spec_core.reference.hires.mosaic import PANELS


def test_prompts_come_from_the_targets_world(tmp_path):
    LlavaNextConfig().save_pretrained(tmp_path / "next")
    LlavaConfig().save_pretrained(tmp_path / "llava")
    sizes = {}
    for name in ("next", "llava"):
        batch = prompts(6, world_of_target(str(tmp_path / name)))
        assert len(batch) == 6
        assert all(conv[0]["role"] == "user" for conv, _ in batch)
        sizes[name] = {im.size for _, im in batch}
    small_px = next(iter(sizes["llava"]))[0]
    assert sizes == {"next": {(PANELS * small_px, PANELS * small_px)}, "llava": {(small_px, small_px)}}
