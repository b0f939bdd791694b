"""spec_core.reference.report: bars checked for the small world, the reasons of moved bars shown."""

from __future__ import annotations

from spec_core.reference.report import BAR_REASONS, BARS, HIRES_BARS, render_report


def _row(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if f"(`{key}`)" in line)


def test_a_default_small_build_meets_its_bars_and_says_why_they_sit_there():
    m = {"size": "small", "seed": 0, "exact_match_general_vqa": 0.66, "image_prompt_following_cfg": 0.48,
         "image_dependence": 0.85, "image_entropy_default": 1.45}
    text = render_report(m)
    assert _row(text, "exact_match_general_vqa").endswith("| yes |")
    assert _row(text, "image_prompt_following_cfg").endswith("| yes |")
    assert _row(text, "image_entropy_default").endswith("| yes |")  # the 2026-12-02 build's figure
    assert _row(text, "image_dependence").endswith("| NO |")  # below its bar: said so
    assert "Why these bars:" in text and all(f"- `{k}`: " in text for k in BAR_REASONS)
    assert set(BAR_REASONS) <= set(BARS)


def test_tiny_is_not_held_to_the_bars():
    text = render_report({"size": "tiny", "seed": 0, "exact_match_general_vqa": 0.1})
    assert "bars apply to the `small` and `hires` worlds; `tiny` only checks" in text


def test_the_hires_world_is_held_to_its_own_bars_region_dependence_among_them():
    m = {"size": "hires", "seed": 0, "exact_match_text_vqa": 0.98, "region_dependence": 0.93,
         "caption_grounded": 0.8, "image_prompt_following_cfg": 0.1}
    text = render_report(m)
    assert _row(text, "exact_match_text_vqa").endswith("| >= 1.0 | NO |")  # the small world's 1.0
    assert _row(text, "region_dependence").endswith("| yes |")
    assert _row(text, "caption_grounded").endswith("| >= 0.85 | NO |")
    assert "image_prompt_following_cfg" not in HIRES_BARS and "| image_prompt_following_cfg | 0.1 |" in text
    assert "bars apply to" not in text
