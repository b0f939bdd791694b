"""scripts/build_reference.py on the tiny world: layout, formats, generation, cache, determinism."""

import hashlib
import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from jobs.lib.storage import Storage, join
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def load_script():
    spec = importlib.util.spec_from_file_location("build_reference", Path(REPO) / "scripts" / "build_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    out = tmp_path_factory.mktemp("world") / "tiny"
    metrics = load_script().main(["--size", "tiny", "--out", str(out)])
    return out, metrics


def digests(store: Storage, out: str) -> dict[str, str]:
    files = json.loads(store.read_text(join(out, "BUILD.json")))["files"]
    keep = [f for f in files if f.endswith((".safetensors", ".parquet", "tokenizer.json"))]
    return {f: hashlib.sha256(store.read_bytes(join(out, f))).hexdigest() for f in keep}


def test_layout_and_formats(tiny_world):
    out, metrics = tiny_world
    for rel in ("BUILD.json", "metrics.json", "report.md", "data/train.parquet", "data/eval.parquet",
                "target/config.json", "target/model.safetensors", "target/processor_config.json"):
        assert (out / rel).is_file(), rel
    model = LlavaForConditionalGeneration.from_pretrained(out / "target")
    proc = AutoProcessor.from_pretrained(out / "target")
    assert model.config.model_type == "llava" and proc.tokenizer.chat_template
    evals = pq.read_table(out / "data" / "eval.parquet")
    assert set(evals["task"].to_pylist()) == {"general_vqa", "text_vqa", "captioning", "chart_vqa",
                                              "reasoning", "multi_turn"}
    assert "exact_match_general_vqa" in metrics and "target_over_drafter" in metrics
    assert "| figure | value |" in (out / "report.md").read_text()


def test_generator_produces_decodable_images_and_videos(tiny_world):
    from spec_core.reference.generator import load_generator
    from spec_core.reference.generator.sample import generate_images, generate_video

    bundle = load_generator(tiny_world[0] / "generator")
    g = torch.Generator().manual_seed(0)
    images = generate_images(bundle, ["a large red circle at the center on a gray background"], 2,
                             bundle.default_sampling, g)
    assert len(images) == 2 and images[0].size == (bundle.layout.grid_w * bundle.codec.patch,) * 2
    videos = generate_video(bundle, ["a large red circle at the center moving right"], 1,
                            bundle.default_sampling, g)
    assert len(videos[0]) == bundle.layout.n_frames


def test_second_build_is_a_cache_hit(tiny_world, capsys):
    out, _ = tiny_world
    before = (out / "BUILD.json").stat().st_mtime_ns
    load_script().main(["--size", "tiny", "--out", str(out)])
    assert "up to date" in capsys.readouterr().out
    assert (out / "BUILD.json").stat().st_mtime_ns == before


def test_build_is_deterministic_and_writes_to_s3(tiny_world, s3_bucket):
    out, _ = tiny_world
    again = s3_bucket + "/worlds/tiny"
    load_script().main(["--size", "tiny", "--out", again, "--force"])
    store = Storage()
    assert digests(store, str(out)) == digests(store, again)


def test_an_interrupted_build_resumes_at_its_first_unfinished_stage(tiny_world, tmp_path, monkeypatch):
    import spec_core.reference.generator.build as generator_build
    import spec_core.reference.vlm.build as vlm_build

    out = tmp_path / "tiny"
    script = load_script()

    def killed(*_, **__):
        raise RuntimeError("killed while building the generator")

    monkeypatch.setattr(generator_build, "build_generator", killed)
    with pytest.raises(RuntimeError, match="killed"):
        script.main(["--size", "tiny", "--out", str(out)])
    [stage] = tmp_path.glob(".tiny.build-*")
    assert sorted(p.stem for p in (stage / ".done").iterdir()) == ["data", "target"]
    assert not (out / "BUILD.json").exists()
    monkeypatch.undo()

    def forbidden(*_, **__):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setattr(vlm_build, "build_target", forbidden)
    metrics = script.main(["--size", "tiny", "--out", str(out)])
    assert set(metrics["stage_seconds"]) == {"data", "target", "generator", "evaluate"}
    assert not stage.exists() and not any(p.name == ".done" for p in out.rglob("*"))
    store = Storage()
    assert digests(store, str(out)) == digests(store, str(tiny_world[0]))  # the same world as one call's
