"""docs/guide.md as a user runs it: every ```bash block, in the guide's order, on tiny random
models of exactly the classes it names, saved as local directories (LLaVA-1.5, LLaVA-NeXT,
Qwen2.5-VL: tests.spec_core.targets.saved_targets; Janus: tests.spec_core.scd.adapters.tiny_models),
and on data in the three formats of its dataset manifest.

The blocks read the variables the guide's first (shown-only) block exports; here MODEL, DATA, OUT
and GENERATOR are temporary directories and GPUS is 1. One `ray start --head` serves every block:
its RAY_ADDRESS is the GCS address, or the dashboard URL for the block under "On a Ray cluster".
The head declares one GPU, so that the guide's GPU lines schedule as written (a job's actor sees no
CUDA device and runs on the CPU). The pipeline (sections 1-5) runs on LLaVA-NeXT; the check without
a drafter on LLaVA-1.5, the submitted precompute on Qwen2.5-VL. ```sh blocks are not run, but
their job commands' --set lines are checked against the job configs."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import ray_head_cluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guide.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
HEADING = re.compile(r"^#+ (.+)$", re.M)


def blocks(kind: str) -> dict[str, str]:
    """{heading: the block} for the ```kind blocks of the guide (at most one per section)."""
    text, out = GUIDE.read_text(), {}
    for m in FENCE.finditer(text):
        if m.group(1) == kind:
            heading = HEADING.findall(text[:m.start()])[-1]
            out[heading] = out.get(heading, "") + m.group(2)
    return out


RUN = blocks("bash")


def test_every_bash_block_is_run_here():
    assert set(RUN) == {"1. Describe your data", "2. Check the model without a drafter",
                        "3. Precompute the target's states", "4. Train the drafter", "5. Generate with the drafter",
                        "Reading the outputs", "On a Ray cluster", "Image generators"}


def test_shown_only_commands_have_valid_settings(monkeypatch):
    """The --set lines of every job command in a ```sh block parse into that job's config."""
    from jobs.lib.config import cli
    from jobs.lib.job import job_entry

    monkeypatch.chdir(REPO)
    commands = [c for b in blocks("sh").values() for c in b.replace("\\\n", " ").splitlines() if "python jobs/" in c]
    assert commands
    for command in commands:
        args = shlex.split(re.sub(r"\$(\w+)", lambda m: "8" if m.group(1) == "GPUS" else "/x", command))
        job = Path(args[args.index("python") + 1]).stem
        cls, _ = job_entry(job)
        cli(cls, args[args.index("python") + 2:])  # a bad key or value: SystemExit(2)


def write_data(data: Path) -> None:
    """The guide's three sources: LLaVA-style JSONL with image files, Parquet with embedded images
    and a split column, a `save_to_disk` folder of multiple-choice questions."""
    import datasets

    from tests.spec_core.targets.saved_targets import WORDS, png

    rng = np.random.default_rng(0)
    words = lambda n: " ".join(rng.choice(WORDS[:22], n))  # noqa: E731
    (data / "images").mkdir(parents=True)
    lines = []
    for i in range(14):  # with vqa's 3: one update of the default 16 per device
        (data / "images" / f"{i}.png").write_bytes(png(32, 16, i))
        lines.append(json.dumps({"id": f"c{i}", "image": f"{i}.png", "conversations": [
            {"from": "human", "value": "<image>\n" + words(4)}, {"from": "gpt", "value": words(5)}]}))
    (data / "chat.jsonl").write_text("\n".join(lines) + "\n")
    pq.write_table(pa.Table.from_pylist([
        {"question_id": i, "image": {"bytes": png(40, 24, 10 + i), "path": None}, "question": words(4),
         "answer": words(2), "split": "test" if i < 2 else "train"} for i in range(5)]), data / "vqa.parquet")
    quiz = datasets.Dataset.from_list([
        {"image": {"bytes": png(32, 16, 20 + i), "path": None}, "question": words(4),
         "choices": [words(1), words(1)], "answer": i % 2} for i in range(2)])
    quiz.cast_column("image", datasets.Image()).save_to_disk(str(data / "quiz"))


def save_janus(directory: Path) -> Path:
    """The tiny Janus with a word-level tokenizer for the guide's prompt (ids below its BOI)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.spec_core.scd.adapters.tiny_models import build_janus

    model = build_janus()
    # a released checkpoint's generation_config.json is its own file, not derived from config.json:
    # one marked _from_model_config loads without its generation_kwargs (the BOI id)
    model.generation_config._from_model_config = False
    model.save_pretrained(directory)
    tok = Tokenizer(models.WordLevel({"<unk>": 3, "a": 10, "red": 11, "square": 12}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """The models, the data, one Ray head; run(heading, model, **env) runs that section's block."""
    from tests.spec_core.targets.saved_targets import save_llava, save_llava_next, save_qwen

    root = tmp_path_factory.mktemp("guide")
    with ray_head_cluster("--num-gpus=1") as (address, env, dashboard):
        models = {name: save(root / name) for name, save in
                  (("llava", save_llava), ("llava_next", save_llava_next), ("qwen", save_qwen))}
        write_data(root / "data")
        base = {**env, "DATA": str(root / "data"), "GPUS": "1", "GENERATOR": str(save_janus(root / "janus")),
                "SPEC_NO_PROGRESS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

        def run(heading: str, model: str, **extra: str) -> str:
            out = root / model / "runs"  # one output location per model, as a user would have
            address_env = address
            if heading == "On a Ray cluster":
                address_env = dashboard
                jobs_api_ready(dashboard)
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", RUN[heading]], cwd=REPO, timeout=600,
                               env={**base, "MODEL": str(models[model]), "OUT": str(out), "RAY_ADDRESS": address_env,
                                    **extra}, capture_output=True, text=True)
            assert r.returncode == 0, f"guide section '{heading}' on {model}:\n{(r.stdout + r.stderr)[-4000:]}"
            return r.stdout

        yield run, root


def jobs_api_ready(dashboard: str, seconds: float = 60) -> None:
    """Wait for the head's job API (the dashboard comes up after `ray start` returns)."""
    import time
    import urllib.request

    deadline = time.time() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"{dashboard}/api/jobs/", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.time() > deadline:
                raise
        time.sleep(1)


def metrics(root: Path, model: str, job: str, run_id: str) -> dict:
    return json.loads((root / model / "runs" / job / run_id / "metrics.json").read_text())


@pytest.fixture(scope="module")
def built(guide):
    """Section 1 once; every model's output location gets its manifests (they are model-free)."""
    run, root = guide
    run("1. Describe your data", "llava_next")
    for model in ("llava", "qwen"):
        shutil.copytree(root / "llava_next/runs/build_manifests", root / model / "runs/build_manifests")
    return root / "llava_next/runs/build_manifests/my_data"


def test_the_three_sources_become_train_and_eval_manifests(built):
    report = json.loads((built / "manifest_report.json").read_text())
    assert {s: (v["train"], v["eval"]) for s, v in report["sources"].items()} == \
        {"chat": (14, 0), "vqa": (3, 2), "quiz": (0, 2)}
    assert sorted(p.name for p in (built / "eval").iterdir()) == ["quiz.parquet", "vqa.parquet"]
    assert pq.read_table(built / "rejects.parquet").num_rows == 0


def test_pipeline_on_llava_next(guide, built):
    run, root = guide
    run("3. Precompute the target's states", "llava_next")
    f = metrics(root, "llava_next", "precompute", "my_model")["figures"]
    assert f["ray"] == "joined" and f["samples"] == 17 and f["rejects"] == {}

    run("4. Train the drafter", "llava_next")
    assert (root / "llava_next/runs/train_drafter/my_model/drafter/config.json").is_file()

    run("5. Generate with the drafter", "llava_next")
    f = metrics(root, "llava_next", "generate", "my_model")["figures"]
    assert f["fovea_mismatches"] == 0 and set(f["fovea_throughput_ratio"]) == {"1", "4", "16"}

    printed = run("Reading the outputs", "llava_next")
    assert "fovea_speedup_batch1" in printed and "'method': 'fovea'" in printed


def test_check_without_a_drafter_on_llava(guide, built):
    run, root = guide
    run("2. Check the model without a drafter", "llava")
    m = metrics(root, "llava", "generate", "check")
    assert m["figures"]["pld_mismatches"] == 0 and m["figures"]["recycling_mismatches"] == 0
    assert m["counts"]["samples"] == 4


def test_submitted_precompute_on_qwen(guide, built):
    run, root = guide
    printed = run("On a Ray cluster", "qwen")
    assert "succeeded" in printed
    f = metrics(root, "qwen", "precompute", "my_model")["figures"]
    assert f["ray"] == "joined" and f["samples"] == 17


def test_image_generator_on_janus(guide):
    run, root = guide
    printed = run("Image generators", "llava", OUT=str(root))
    nfe = [int(n) for n in re.findall(r"window \d+: (\d+) forwards for 16 tokens", printed)]
    assert len(nfe) == 2 and nfe[0] == 16 > nfe[1]  # AR: one forward per token (the prefill gives the first)
    assert (root / "janus.png").is_file()
