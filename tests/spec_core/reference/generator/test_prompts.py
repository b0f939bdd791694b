"""The generate_images job's default prompt manifest is what prompt_manifest builds, and every
prompt is in the generator's vocabulary."""

import json
from pathlib import Path

from spec_core.reference.generator.layout import UNK, build_tokenizer, encode_prompt
from spec_core.reference.generator.prompts import prompt_manifest

MANIFEST = Path(__file__).resolve().parents[4] / "manifests" / "prompts" / "reference.jsonl"


def test_committed_manifest_is_up_to_date():
    rows = [json.loads(line) for line in MANIFEST.read_text().splitlines()]
    assert rows == prompt_manifest(48, 16), "regenerate manifests/prompts/reference.jsonl with prompt_manifest(48, 16)"


def test_prompts_are_in_the_vocabulary_and_name_their_colour():
    tok = build_tokenizer(512)
    unk = tok.convert_tokens_to_ids(UNK)
    rows = prompt_manifest(10, 10, seed=3)
    assert [r["kind"] for r in rows] == ["image"] * 10 + ["video"] * 10
    assert len({r["id"] for r in rows}) == 20
    for r in rows:
        assert unk not in encode_prompt(tok, r["prompt"])
        assert r["colour"] is None or r["colour"] in r["prompt"]
