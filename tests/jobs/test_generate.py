"""jobs/generate.py on a tiny reference target with untrained drafters: outputs equal the target's
own HF `generate` (turn by turn, the conversation so far holding the earlier answers), every method
equals the AR baseline token for token at every batch size, bad samples are recorded with a reason,
a rerun skips committed shards, the report has every task and the throughput table."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from jobs._generate.job import GenerateConfig, MethodSection, main
from jobs.lib.artifact_store import committed_shards, marker_uri
from jobs.lib.config import ConfigError, load_config
from jobs.lib.storage import Storage
from spec_core.decoding import SamplingConfig, TreeConfig
from spec_core.decoding.proposers import DEFAULT_BUDGET
from spec_core.fovea import FoveaDrafter
from spec_core.reference.tasks import TASKS, make_split
from spec_core.reference.vlm.build import build_target
from spec_core.targets import load_target
from tests.jobs.worlds import manifest_rows

MAX_NEW = 24


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target, two untrained drafters (with and without visual correction), and an eval
    manifest folder: two files, one holding a corrupt image and an over-long question."""
    root = tmp_path_factory.mktemp("gen")
    train = [s for t in TASKS for s in make_split(t, 4, 0, "train")]
    build_target("tiny", str(root / "target"), samples=train)
    adapter = load_target(root / "target")
    torch.manual_seed(0)
    FoveaDrafter.from_target(adapter, n_blocks=1).save_pretrained(root / "drafter")
    FoveaDrafter.from_target(adapter, n_blocks=1, visual_correction=False).save_pretrained(root / "drafter_nc")
    evals = [s for t in TASKS for s in make_split(t, 2, 0, "eval")]
    rows = manifest_rows(evals)
    (root / "eval").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), root / "eval" / "ref.parquet")
    long_q = [{"role": "user", "content": "<image>\n" + "Describe the picture once more. " * 60},
              {"role": "assistant", "content": "Fine."}]
    bad = [dict(rows[0], id="corrupt", source="bad", image_bytes=b"\x89PNG not really", image_sha256="x"),
           dict(rows[1], id="too-long", source="bad", conversation=long_q)]
    pq.write_table(pa.Table.from_pylist(bad), root / "eval" / "bad.parquet")
    return root, evals


def _cfg(root: Path, out: Path, **extra) -> GenerateConfig:
    data = {"run": {"output_uri": str(out), "run_id": "t"}, "ray": {"num_cpus": 2},
            "data": {"manifest": str(root / "eval"), "shard_size": 4, "max_length": 200},
            "target": {"path": str(root / "target")}, "generation": {"max_new_tokens": MAX_NEW},
            "compute": {"num_actors": 2, "batch_sizes": [1, 3]},
            "methods": {"ar": {"kind": "ar"}, "fovea": {"drafter": str(root / "drafter"), "tree": {"budget": 12},
                                                      "correction_depth": 6},
                        "control": {"drafter": str(root / "drafter_nc"),
                                    "tree": {"width": 3, "depth": 4, "budget": 8}},
                        "hf": {"kind": "hf"}},  # HF generate itself, on the same prompts
            "compare": ["ar", "fovea", "control", "hf"]}
    for k, v in extra.items():
        data[k] = {**data.get(k, {}), **v}
    return GenerateConfig.model_validate(data)


@pytest.fixture(scope="module")
def run(world, ray_local, tmp_path_factory):
    root, evals = world
    out = tmp_path_factory.mktemp("out")
    m = main(_cfg(root, out))
    run_dir = Path(m["figures"]["run_dir"])
    tables = {k: pq.read_table(run_dir / f"{k}.parquet").to_pylist() for k in ("responses", "metrics", "rejects")}
    return root, evals, out, m, run_dir, tables


def _hf_generate(model, processor, sample: dict, turns: list[dict]) -> list[int]:
    """The target's own greedy continuation of `turns` (ending with a user turn)."""
    image = Image.open(io.BytesIO(sample["image_png"])).convert("RGB")
    text = processor.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    inputs = processor(text=text, images=image, add_special_tokens=False, return_tensors="pt")
    seq = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    return seq[0, inputs["input_ids"].shape[1]:].tolist()


def test_every_turn_equals_the_targets_own_generate(run):
    root, evals, _, _, _, tables = run
    adapter = load_target(root / "target")
    processor = AutoProcessor.from_pretrained(root / "target")
    eos = adapter.model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    ar = {(r["id"], r["turn"]): r for r in tables["responses"] if r["method"] == "ar"}
    checked_later_turn = False
    for s in evals[::3] + [e for e in evals if e["task"] == "multi_turn"]:
        turns = []
        n_turns = len(s["conversation"]) // 2
        for t in range(n_turns):
            turns.append(s["conversation"][2 * t])
            want = _hf_generate(adapter.model, processor, s, turns)
            want = want[: want.index(eos) + 1] if eos in want else want
            got = ar[(s["id"], t)]
            assert got["response_ids"] == want, (s["id"], t)
            assert got["finished_by"] == ("eos" if want[-1] in eos else "length")
            turns.append({"role": "assistant", "content": got["response"]})  # the conversation so far
            checked_later_turn |= t > 0
    assert checked_later_turn


def test_methods_are_lossless_at_every_batch_size(run):
    _, evals, _, m, _, tables = run
    by = {}
    for r in tables["responses"]:
        by.setdefault(r["method"], {})[(r["id"], r["turn"])] = r["response_ids"]
    n_turns = sum(len(s["conversation"]) // 2 for s in evals)
    assert len(by["ar"]) == n_turns
    assert by["fovea"] == by["ar"] and by["control"] == by["ar"] and by["hf"] == by["ar"]
    f = m["figures"]
    assert f["fovea_mismatches"] == 0 and f["control_mismatches"] == 0  # includes the batch-3 streams
    assert f["hf_mismatches"] == 0  # HF's own padded batch of 3 too
    fastest = f["fastest_baseline"]  # of ar and hf, the one of least batch-1 latency
    assert fastest in ("ar", "hf") and f["fovea_speedup_batch1_vs_fastest"] > 0
    other = "hf" if fastest == "ar" else "ar"
    assert set(f[f"{other}_throughput_ratio_vs_fastest"]) == {"1", "3"}
    assert ("## Against `hf`" in (run[4] / "report.md").read_text()) == (fastest == "hf")
    thr = m["details"]["throughput"]
    for method in ("ar", "fovea", "control", "hf"):
        assert set(thr[method]) == {"1", "3"}
        assert thr[method]["3"]["tokens"] == thr["ar"]["1"]["tokens"] > 0
        for t in thr[method].values():  # the phases are laps inside the timed wall
            assert 0 < sum(t["phases"].values()) <= t["seconds"] * 1.01 + 0.01
    for r in tables["metrics"]:
        if r["method"] == "ar" and r["steps"]:
            assert r["tau"] == 1.0 and r["steps"] == r["new_tokens"] - 1
        if r["steps"]:
            assert 1.0 <= r["tau"] <= 1 + 6 and r["mat"] == pytest.approx(r["tau"] - 1)


def test_bad_samples_are_recorded_and_the_rest_decoded(run):
    _, evals, _, m, _, tables = run
    reasons = {r["id"]: r["reason"] for r in tables["rejects"]}
    assert set(reasons) == {"corrupt", "too-long"}
    assert "image unreadable" in reasons["corrupt"]
    assert "too long" in reasons["too-long"] and "max_length 200" in reasons["too-long"]
    assert m["counts"]["samples"] == len(evals) + 1  # the over-long one encodes, then fails per turn
    assert {r["id"] for r in tables["responses"]} == {s["id"] for s in evals}


def test_report_has_every_task_throughput_and_memory(run):
    _, _, _, m, run_dir, _ = run
    report = (run_dir / "report.md").read_text()
    for task in TASKS:
        assert f"| {task} |" in report
    assert "| 3 |" in report and "overtakes" in report or "ahead of" in report
    png = (run_dir / "latency_cdf.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    mem = m["details"]["memory"]
    assert mem["ar"]["state_delta_mib"] == 0 and mem["fovea"]["state_delta_mib"] > 0
    per = m["details"]["per_task"]
    assert set(per) == set(TASKS) | {"all"}
    assert per["all"]["ar"]["speedup"] == pytest.approx(1.0)
    assert json.loads((run_dir / "metrics.json").read_text())["figures"]["baseline"] == "ar"


def test_a_rerun_redoes_only_uncommitted_shards(run, ray_local):
    root, _, out, _, run_dir, tables = run
    store = Storage()
    shards = run_dir / "shards"
    before = committed_shards(store, str(shards))
    Path(marker_uri(str(shards), 1)).unlink()  # as if the job died before shard 1's commit
    responses0 = shards / "responses" / "shard-00000.parquet"
    responses0.write_bytes(responses0.read_bytes()[:-64])  # and shard 0's file lost its tail: redone too
    m = main(_cfg(root, out))
    assert m["stages"]["generate"]["items"] == 2
    assert committed_shards(store, str(shards)).keys() == before.keys()
    again = pq.read_table(run_dir / "responses.parquet").to_pylist()
    key = lambda r: (r["method"], r["id"], r["turn"])  # noqa: E731
    assert sorted(map(key, again)) == sorted(map(key, tables["responses"]))  # nothing lost or doubled
    assert {key(r): r["response_ids"] for r in again} == {key(r): r["response_ids"] for r in tables["responses"]}
    m = main(_cfg(root, out))
    assert m["stages"]["generate"].get("items", 0) == 0


def test_config_mistakes_fail_before_any_work(world, tmp_path):
    root, _ = world
    base = _cfg(root, tmp_path).model_dump(mode="json")
    with pytest.raises(Exception, match="not in methods"):
        GenerateConfig.model_validate({**base, "compare": ["ar", "foveaa"]})
    with pytest.raises(Exception, match="needs a drafter"):
        GenerateConfig.model_validate({**base, "methods": {"ar": {"kind": "ar"}, "x": {"kind": "fovea"}}})
    with pytest.raises(ConfigError, match="unknown field 'compute.batch_size'"):
        load_config(GenerateConfig, None, ["compute.batch_size=4"])
    with pytest.raises(FileNotFoundError, match="not a local drafter directory"):
        main(_cfg(root, tmp_path, methods={"fovea": {"drafter": str(tmp_path / "nope")}}))
    # a FOVEA drafter as Medusa heads
    with pytest.raises(ValueError, match="is not a medusa drafter directory .*expected 'medusa-heads/1'"):
        main(_cfg(root, tmp_path, methods={"ar": {"kind": "ar"}, "fovea": {"kind": "medusa", "drafter": str(root / "drafter")}}))
    with pytest.raises(FileNotFoundError, match="no manifest"):
        main(_cfg(root, tmp_path, data={"manifest": str(tmp_path / "empty")}))


def test_the_tree_and_generation_sections_are_spec_cores_configs():
    """Declared once: a method's tree is spec_core's TreeConfig and generation takes SamplingConfig's
    fields and defaults; the dataclasses' own checks are config errors naming the section, like a
    misspelt key; a training-free method drafts its own size unless the config sets a budget."""
    cfg = GenerateConfig()
    assert cfg.methods["fovea"].tree == TreeConfig() and cfg.generation.sampling_config() == SamplingConfig()
    fovea = "methods.fovea.drafter=d"
    for overrides, message in (([fovea, "methods.fovea.tree.budget=0"], "invalid value 'methods.fovea.tree'.*budget must be"),
                               ([fovea, "methods.fovea.tree.policy=best"], "invalid value 'methods.fovea.tree'.*policy must be"),
                               ([fovea, "methods.fovea.tree.widht=3"], "unknown field 'methods.fovea.tree.widht'"),
                               (["generation.do_sample=true", "generation.temperature=0"],
                                "invalid value 'generation'.*temperature must be > 0 when sampling"),
                               (["generation.top_p=0"], "invalid value 'generation'.*top_p"),
                               (["generation.tempreature=1"], "unknown field 'generation.tempreature'")):
        with pytest.raises(ConfigError, match=message):
            load_config(GenerateConfig, None, overrides)
    assert MethodSection(kind="pld").drafted_tree() == TreeConfig(budget=DEFAULT_BUDGET["pld"])
    assert MethodSection(kind="pld", tree={"width": 2, "budget": 40}).drafted_tree() == TreeConfig(width=2)


def test_a_manifest_whose_every_row_is_rejected_is_not_a_success(world, ray_local, tmp_path):
    root, _ = world
    with pytest.raises(ValueError, match=r"^no usable row: all 2 rows were rejected \(commonest: .*image unreadable"):
        main(_cfg(root, tmp_path, data={"manifest": str(root / "eval" / "bad.parquet")},
                  compute={"num_actors": 1, "batch_sizes": [1]}))


def test_sampling_runs_are_reproducible(world, ray_local, tmp_path):
    """do_sample: each (sample, turn) draws from its own seeded generator, so a rerun in a new run
    directory gives the same tokens; a different seed gives other tokens."""
    root, _ = world
    runs = []
    for run_id, seed in (("s1", 0), ("s2", 0), ("s3", 1)):
        cfg = _cfg(root, tmp_path, run={"run_id": run_id}, generation={"do_sample": True, "temperature": 1.5, "seed": seed},
                   data={"limit_per_source": 2}, compute={"num_actors": 1, "batch_sizes": [1]})
        cfg = cfg.model_copy(update={"compare": ["ar", "fovea"]})
        run_dir = Path(main(cfg)["figures"]["run_dir"])
        rows = pq.read_table(run_dir / "responses.parquet").to_pylist()
        runs.append({(r["method"], r["id"], r["turn"]): r["response_ids"] for r in rows})
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert len(runs[0]) == 2 * 2  # 2 rows of ref.parquet (one turn each) x 2 methods; bad.parquet's are rejected


def test_training_free_methods_and_viskip_are_lossless(world, ray_local, tmp_path):
    """MMSpec's training-free methods and ViSkip as generate methods: every output equals AR's at
    batch 1 and in the batch-3 stream."""
    root, _ = world
    methods = {"ar": {"kind": "ar"}, "pld": {"kind": "pld"}, "lookahead": {"kind": "lookahead", "params": {"branch_length": 6}},
               "recycling": {"kind": "recycling"}, "sam_viskip": {"kind": "sam", "viskip": 0.35},
               "fovea_viskip": {"drafter": str(root / "drafter"), "viskip": 0.35, "tree": {"budget": 12}}}
    base = _cfg(root, tmp_path, run={"run_id": "tf"}, data={"limit_per_source": 6}, compute={"num_actors": 1})
    cfg = GenerateConfig.model_validate({**base.model_dump(mode="json"), "methods": methods, "compare": list(methods)})
    m = main(cfg)
    rows = pq.read_table(Path(m["figures"]["run_dir"]) / "responses.parquet").to_pylist()
    by: dict = {}
    for r in rows:
        by.setdefault(r["method"], {})[(r["id"], r["turn"])] = r["response_ids"]
    assert len(by["ar"]) > 0
    for name in methods:
        assert by[name] == by["ar"], name
        if name != "ar":
            assert m["figures"][f"{name}_mismatches"] == 0
    with pytest.raises(Exception, match="takes no drafter"):
        GenerateConfig.model_validate({**cfg.model_dump(mode="json"),
                                       "methods": {"ar": {"kind": "ar"}, "p": {"kind": "pld", "drafter": "x"}},
                                       "compare": ["ar", "p"]})


def _mmspec_manifest(tmp_path: Path) -> tuple[str, list[dict]]:
    """An MMSpec-format benchmark (jsonl of {id, image, turns: [user prompt, ...], category}; no
    answers, no image placeholder) with 1-, 2- and 3-turn rows, through build_manifests -> the
    eval manifest folder and the source records."""
    from jobs.build_manifests import BuildManifestsConfig
    from jobs.build_manifests import main as build_main

    samples = make_split("multi_turn", 3, 0, "eval")
    asked = [t["content"].replace("<image>\n", "") for s in samples for t in s["conversation"] if t["role"] == "user"]
    (tmp_path / "images").mkdir()
    recs = []
    for k, s in enumerate(samples):
        (tmp_path / "images" / f"{k}.png").write_bytes(s["image_png"])
        recs.append({"id": str(k), "image": f"{k}.png", "turns": asked[k: k + k + 1], "category": "multi_turn"})
    (tmp_path / "mmspec.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "mmspec.yaml").write_text(
        "name: mmspec_like\nsources:\n  - name: mmspec\n    format: jsonl\n"
        f"    uri: {tmp_path / 'mmspec.jsonl'}\n    id_prefix: 'mmspec/'\n"
        f"    image: {{field: image, root: '{tmp_path / 'images'}'}}\n"
        "    conversation: {kind: prompts, field: turns}\n    task_field: category\n    split: {policy: eval_only}\n")
    built = build_main(BuildManifestsConfig.model_validate(
        {"run": {"output_uri": str(tmp_path / "runs")}, "data": {"manifests": [str(tmp_path / "mmspec.yaml")],
                                                                  "io_workers": 1}}))
    return str(Path(built["figures"]["manifest_uri"]) / "eval"), recs


def test_mmspec_prompts_only_rows_are_answered_turn_by_turn_by_every_method(world, ray_local, tmp_path):
    """Consecutive user turns (MMSpec `turns`) are answered one by one, each answer in the next
    turn's context: no rejects, every turn answered, AR equals the target's own HF `generate` on
    the conversation so far, and every method (FOVEA, PLD, SAM, Lookahead, Recycling) equals AR
    token for token at batch 1 and in the batch-3 stream."""
    root, _ = world
    manifest, recs = _mmspec_manifest(tmp_path)
    assert sorted(len(r["turns"]) for r in recs) == [1, 2, 3]
    rows = pq.read_table(Path(manifest) / "mmspec.parquet").to_pylist()
    assert {r["id"]: [t["role"] for t in r["conversation"]] for r in rows} == {
        f"mmspec/{r['id']}": ["user"] * len(r["turns"]) for r in recs}  # consecutive user turns, no answers
    methods = {"ar": {"kind": "ar"}, "fovea": {"drafter": str(root / "drafter"), "tree": {"budget": 12}},
               "pld": {"kind": "pld"}, "sam": {"kind": "sam"},
               "lookahead": {"kind": "lookahead", "params": {"branch_length": 6}},
               "recycling": {"kind": "recycling"}}
    base = _cfg(root, tmp_path, run={"run_id": "mmspec"}, data={"manifest": manifest}, compute={"num_actors": 1})
    m = main(GenerateConfig.model_validate({**base.model_dump(mode="json"), "methods": methods,
                                            "compare": list(methods)}))
    run_dir = Path(m["figures"]["run_dir"])
    assert pq.read_table(run_dir / "rejects.parquet").num_rows == 0 and m["counts"]["rejects"] == 0
    by: dict = {}
    for r in pq.read_table(run_dir / "responses.parquet").to_pylist():
        by.setdefault(r["method"], {})[(r["id"], r["turn"])] = r
    want_turns = {(f"mmspec/{r['id']}", t) for r in recs for t in range(len(r["turns"]))}
    for name in methods:
        assert set(by[name]) == want_turns, name
        ids = {k: r["response_ids"] for k, r in by[name].items()}
        assert ids == {k: r["response_ids"] for k, r in by["ar"].items()}, name
        if name != "ar":
            assert m["figures"][f"{name}_mismatches"] == 0, name

    adapter = load_target(root / "target")  # the oracle: HF generate with AR's earlier answers
    processor = AutoProcessor.from_pretrained(root / "target")
    eos = adapter.model.generation_config.eos_token_id
    for r in rows:
        turns, image = [], {"image_png": Path(r["image_uri"]).read_bytes()}
        for t, user in enumerate(r["conversation"]):
            turns.append(user)
            want = _hf_generate(adapter.model, processor, image, turns)
            want = want[: want.index(eos) + 1] if eos in want else want
            got = by["ar"][(r["id"], t)]
            assert got["response_ids"] == want, (r["id"], t)
            turns.append({"role": "assistant", "content": got["response"]})


def test_turns_beyond_the_position_table_are_rejected_and_the_rest_decoded(world, ray_local, tmp_path):
    """A target whose position table holds every first prompt plus max_new_tokens, no more: the
    3-turn conversation's turn 0 is answered, its turn 1 (with that answer in it) rejected with
    the reason, not decoded past the table; the over-long question is rejected at turn 0; the
    other samples of the same shard are decoded, each within the table. max_length is far away:
    only the table bites."""
    from jobs._precompute.stages import encode_row
    from spec_core.targets import load_image_encoder
    from spec_core.targets.encode import assistant_spans
    from tests.jobs.worlds import short_table_target

    root, _ = world
    rows = pq.read_table(root / "eval" / "ref.parquet").to_pylist()
    multi = next(r for r in rows if r["task"] == "multi_turn" and len(r["conversation"]) == 6)
    short = [r for r in rows if r["task"] in ("general_vqa", "chart_vqa")][:2]
    long_row = pq.read_table(root / "eval" / "bad.parquet").to_pylist()[1]
    encoder = load_image_encoder(root / "target")
    spans = {r["id"]: assistant_spans(encode_row(r, encoder, Storage(), None)["loss_mask"])
             for r in (multi, *short, long_row)}
    limit = max(spans[r["id"]][0][0] for r in (multi, *short)) + MAX_NEW  # every first prompt fits
    (start0, end0), (start1, _), _ = spans[multi["id"]]
    assert start1 - (end0 - start0) + 1 + MAX_NEW > limit  # turn 1 does not, whatever turn 0's answer
    assert spans[long_row["id"]][0][0] + MAX_NEW > limit
    target = short_table_target(root / "target", tmp_path / "target", limit)
    pq.write_table(pa.Table.from_pylist([long_row, multi, *short]), tmp_path / "rows.parquet")
    base = _cfg(root, tmp_path, run={"run_id": "table"},
                data={"manifest": str(tmp_path / "rows.parquet"), "max_length": 2048},
                target={"path": target}, compute={"num_actors": 1, "batch_sizes": [1]})
    methods = {"ar": {"kind": "ar"}, "pld": {"kind": "pld"}}
    m = main(GenerateConfig.model_validate({**base.model_dump(mode="json"), "methods": methods,
                                            "compare": list(methods)}))
    run_dir = Path(m["figures"]["run_dir"])
    rejects = pq.read_table(run_dir / "rejects.parquet").to_pylist()
    got = {(r["id"], r["method"], r["turn"]): r["reason"] for r in rejects}
    assert set(got) == {(i, meth, t) for meth in methods for i, t in ((long_row["id"], 0), (multi["id"], 1))}
    for reason in got.values():
        assert reason.startswith("beyond the position table: ")
        assert reason.endswith(f" tokens + {MAX_NEW} new > max_position_embeddings {limit}")
    metrics = pq.read_table(run_dir / "metrics.parquet").to_pylist()
    decoded = {(r["id"], r["method"], r["turn"]) for r in metrics}
    assert decoded == {(r["id"], meth, 0) for meth in methods for r in (multi, *short)}
    assert all(r["prompt_tokens"] + MAX_NEW <= limit for r in metrics)


def test_a_goodput_policy_lives_as_long_as_the_actor_and_reports_per_shard(world, tmp_path):
    """The worker (no Ray: the actor's class itself) keeps one goodput policy per (method, batch
    size) across its shards and across an engine rebuilt after a failure; each shard's record
    holds its own share of the policy's counts, which add up to the policy's."""
    from jobs._generate.worker import GenerateWorker, MethodPlan
    from jobs.lib.storage import StorageConfig
    from spec_core.decoding.tree import TreeConfig

    root, _ = world
    plans = [MethodPlan("ar", None),
             MethodPlan("fovea", str(root / "drafter"), tree=TreeConfig(budget=8, policy="goodput"))]
    worker = GenerateWorker(str(root / "target"), {}, plans, StorageConfig(), str(tmp_path / "shards"),
                            max_length=200, max_new_tokens=8, batch_sizes=(1, 2))
    manifest = str(root / "eval" / "ref.parquet")
    first = worker({"shard": 0, "manifest": manifest, "rows": [0, 1]})
    policies = dict(worker.policies)
    assert set(policies) == {("fovea", 1), ("fovea", 2)}
    del worker.engines[("fovea", 1)]  # as after a failed request: a fresh engine, the same policy
    second = worker({"shard": 1, "manifest": manifest, "rows": [2, 3]})
    assert worker.policies == policies and worker.engines[("fovea", 1)].policy is policies[("fovea", 1)]
    for batch in ("1", "2"):
        per_shard = [r["throughput"]["fovea"][batch]["policy"] for r in (first, second)]
        total = policies[("fovea", int(batch))].stats()
        assert all(p["steps"] > 0 for p in per_shard)
        for key in ("steps", "ar_steps", "explorations", "probes", "nodes"):
            assert sum(p[key] for p in per_shard) == total[key], (batch, key)
