"""scripts/hires_answer_kinds.py: every one-line answer the hires world writes is filed under the
template that wrote it (most literal text first), on answers made by the world's own generators."""

from scripts.hires_answer_kinds import TEMPLATES, by_template, template_of
from spec_core.reference import hires


def test_answers_are_filed_under_the_template_that_wrote_them():
    assert template_of("The large cyan cross is directly above the purple diamond.") == "relation"
    assert template_of("The small cyan star in the top left is red.") == "colour_at"
    assert template_of("No, bar F is shorter than bar E.") == "taller_no"
    assert template_of("The sign that says chalk is in the bottom middle panel.") == "sign_panel"
    assert template_of("The word chalk has 5 letters.") == "sign_length"
    assert template_of("Bar C is about 60.") == "bar_value"
    assert template_of("The image has nine panels, two of them bar charts. Top left: ...") == "other"
    assert "sign_panel" in TEMPLATES and "the image" not in TEMPLATES["sign_where"]  # phrased for a panel


def test_every_vqa_answer_of_the_world_follows_a_template():
    samples = [s for t in ("general_vqa", "text_vqa", "chart_vqa") for s in hires.make_split(t, 40, 0, "eval")]
    report = by_template(samples, [s["answers"] for s in samples])  # answered as the reference: all right
    assert "other" not in report
    assert sum(r["answers"] for r in report.values()) == sum(len(s["answers"]) for s in samples)
    assert all(r["right"] == r["answers"] and not r["misses"] for r in report.values())
    wrong = by_template(samples[:5], [["nope"] * len(s["answers"]) for s in samples[:5]], examples=1)
    assert all(r["right"] == 0 and len(r["misses"]) == 1 for r in wrong.values())
