"""jobs/generate_images.py on a tiny reference generator: every (prompt, method, window, seed) item
is committed with its media and record, bad prompts are rejected with a reason while the batch goes
on, greedy (top-k 1) output of every method equals AR's pixel for pixel (window auto too), a rerun
redoes exactly the missing items, the report holds every method and window, config mistakes fail
first; a committed item whose media does not match its record is redone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from jobs.generate_images import GenerateImagesConfig, main
from jobs.lib.config import ConfigError, load_config
from jobs.lib.run_key import RunMismatch
from spec_core.reference.generator import GeneratorBuildConfig, build_generator

IMAGES = ["a gray background with a large red circle in the center",
          "a navy background with a small green square at the top"]
VIDEO = "a small cyan square on the left moving left on a navy background"
BAD = [{"id": "empty", "kind": "image", "prompt": ""},
       {"id": "unknown", "kind": "image", "prompt": "a qwxz on a gray background"},
       {"id": "long", "kind": "image", "prompt": " ".join(["red"] * 400)},
       {"id": "audio", "kind": "audio", "prompt": IMAGES[0]}]
CONFIGS_PER_PROMPT = {"image": 1 + 3 * 2 + 1, "video": 1 + 3 * 1 + 1}  # ar, 3 methods x windows, ar extra seed
SCHEDULE = {"nfe", "committed", "mean_committed", "mean_window"}  # window auto: follows the measured time


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("genimg")
    build_generator(GeneratorBuildConfig.preset("tiny"), root / "generator", progress=False)
    rows = [{"id": f"img-{i}", "kind": "image", "prompt": p, "background": "gray", "colour": "red"}
            for i, p in enumerate(IMAGES)]
    # shards of 3: the images (one batch of 2), then the video, so that the two actors share the work
    rows += [BAD[0], {"id": "vid-0", "kind": "video", "prompt": VIDEO}] + BAD[1:]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _cfg(root: Path, out: Path, run_id: str = "t", **extra) -> GenerateImagesConfig:
    data = {"run": {"output_uri": str(out), "run_id": run_id}, "ray": {"num_cpus": 2},
            "data": {"prompts": str(root / "prompts.jsonl"), "shard_size": 3},
            "generator": {"path": str(root / "generator")},
            "windows": {"image": [4, "auto"], "video": [8], "auto_max": {"image": 16}},
            "compute": {"num_actors": 2, "batch_size": 2}}
    for k, v in extra.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and k in data else v
    return GenerateImagesConfig.model_validate(data)


@pytest.fixture(scope="module")
def run(world, ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    m = main(_cfg(world, out))
    return m, Path(m["figures"]["run_dir"])


def test_every_item_is_committed_with_media(run):
    m, run_dir = run
    items = [json.loads(p.read_text()) for p in (run_dir / "items").glob("*.json")]
    assert len(items) == 2 * CONFIGS_PER_PROMPT["image"] + CONFIGS_PER_PROMPT["video"] == m["counts"]["items"]
    for r in items:
        media = Image.open(run_dir / r["media"])
        if r["kind"] == "video":
            assert media.format == "GIF" and media.n_frames == 8 and media.size == (16, 16)
        else:
            assert media.format == "PNG" and media.size == (32, 32)
        assert sum(r["committed"]) == r["tokens"] and r["nfe"] == len(r["committed"])
        assert r["nfe"] == r["tokens"] if r["method"] == "ar" else r["nfe"] <= r["tokens"]
        assert len(r["features"]) == (54 if r["kind"] == "video" else 27)
    assert {r["follows"] is None for r in items if r["kind"] == "video"} == {True}


def test_bad_prompts_are_rejected_with_reasons(run):
    _, run_dir = run
    reasons = {p.stem: json.loads(p.read_text())["reason"] for p in (run_dir / "rejects").glob("*.json")}
    assert reasons["empty"] == "empty prompt"
    assert "unknown words ['qwxz']" in reasons["unknown"]
    assert "exceeds the limit" in reasons["long"]
    assert "unknown kind 'audio'" in reasons["audio"]


def test_report_has_every_method_and_window(run):
    m, run_dir = run
    report = (run_dir / "report.md").read_text()
    for line in ("| sjd | 4 |", "| scd_mc | 4 |", "| scd_gs | 8 |", "| scd_gs | auto (mean ",
                 "AR vs AR at another seed"):
        assert line in report
    assert m["figures"]["image_scd_mc_latency_accel"]["auto"] > 0
    assert 1 <= m["figures"]["image_sjd_auto_mean_window"] <= 16
    for f in ("nfe_vs_window.png", "acceptance.png", "grid_image.png", "grid_video.png", "items.parquet"):
        assert (run_dir / f).is_file()
    assert m["figures"]["image_scd_mc_nfe_accel"]["4"] > 0 and set(m["figures"]["video_sjd_latency_accel"]) == {"8"}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["details"]["quality"]["image"]["rows"]


def test_greedy_outputs_equal_ar_and_rerun_redoes_only_missing_items(world, ray_local, tmp_path):
    cfg = _cfg(world, tmp_path, run_id="greedy", sampling={"top_k": 1}, ar_extra_seeds=[], data={"limit_per_kind": 1})
    main(cfg)
    run_dir = Path(cfg.run_dir("generate_images"))
    items = {p.name: json.loads(p.read_text()) for p in (run_dir / "items").glob("*.json")}
    for r in items.values():  # lossless: with top-k 1 every method is greedy AR
        ar = next(a for a in items.values() if a["id"] == r["id"] and a["method"] == "ar")
        assert (run_dir / r["media"]).read_bytes() == (run_dir / ar["media"]).read_bytes(), r["media"]
    lost = sorted(items)[::3]
    for name in lost:
        (run_dir / "items" / name).unlink()
    # a committed item whose media file was truncated, and one whose media was swapped for another
    # valid file, are redone on resume (a checksum in each record), not trusted
    truncated, swapped = sorted(items)[1], sorted(items)[2]
    media = run_dir / items[truncated]["media"]
    media.write_bytes(media.read_bytes()[:-7])
    with Image.open(run_dir / items[swapped]["media"]) as im:  # another valid image in its place
        im.transpose(Image.Transpose.ROTATE_90).save(run_dir / items[swapped]["media"])
    with pytest.raises(RunMismatch, match=r"data\.limit_per_kind: 1 -> 2"):  # another config: stops, nothing mixed
        main(cfg.model_copy(update={"data": cfg.data.model_copy(update={"limit_per_kind": 2})}))
    assert len(list((run_dir / "items").glob("*.json"))) == len(items) - len(lost)
    m = main(cfg)
    assert m["stages"]["generate"]["items"] == len(lost) + 2
    again = {p.name: json.loads(p.read_text()) for p in (run_dir / "items").glob("*.json")}
    assert set(again) == set(items)
    where_and_when = {"latency_s", "e2e_s", "batch_size", "peak_bytes", "actor", "node"}
    for name in [*lost, truncated, swapped]:  # the same item again (its noise is keyed on the prompt, not the batch)
        skip = where_and_when | (SCHEDULE if items[name]["window"] == "auto" else set())
        assert {k: v for k, v in again[name].items() if k not in skip} == \
               {k: v for k, v in items[name].items() if k not in skip}


def test_config_mistakes_fail_first(world, tmp_path):
    with pytest.raises(ValueError, match="must include ar"):
        _cfg(world, tmp_path, methods=["sjd", "scd_mc"])
    with pytest.raises(ValueError, match="window 1 is AR"):
        _cfg(world, tmp_path, windows={"image": [1, 8]})
    with pytest.raises(ValueError):
        _cfg(world, tmp_path, windows={"image": [8, "automatic"]})
    with pytest.raises(ValueError):
        _cfg(world, tmp_path, methods=["ar", "scd_maximal"])
    with pytest.raises(FileNotFoundError, match="not a local generator"):
        main(_cfg(world, tmp_path, generator={"path": str(tmp_path / "none")}))
    bad = tmp_path / "dup.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(ValueError, match="ids repeat"):
        main(_cfg(world, tmp_path, data={"prompts": str(bad)}))
    y = tmp_path / "typo.yaml"
    y.write_text("windows:\n  imgae: [4]\n")
    with pytest.raises(ConfigError):
        load_config(GenerateImagesConfig, str(y))
