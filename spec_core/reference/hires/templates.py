"""Every literal English fragment of the hires world's tasks (beyond the small world's templates,
which its panel questions reuse). `tasks.all_words` reads this module."""

from __future__ import annotations

QUESTIONS: dict[str, tuple[str, ...]] = {
    # a small-world question asked about one panel ({q}: that question, first letter lowered)
    "in_panel": ("In the {panel} panel, {q}", "Look at the {panel} panel. {Q}"),
    "sign_panel": ("Which panel has the sign that says {word}?", "Where is the sign that says {word}?",
                   "In which panel can you read the word {word}?"),
    "r_objects": ("How many objects are in the {a} and {b} panels together?",
                  "Count the objects in the {a} panel and in the {b} panel. How many are there in all?"),
    "r_charts": ("What is bar {x} of the {a} chart plus bar {y} of the {b} chart?",
                 "Add bar {x} in the {a} panel to bar {y} in the {b} panel. What do you get?"),
}

ANSWERS: dict[str, str] = {
    "sign_panel": "The sign that says {word} is in the {panel} panel.",
}

CAPTION: dict[str, str] = {
    "open": "The image has nine panels, two of them bar charts.",
    "chart": "{Panel}: a chart of {n} {colour} bars.",
    "objects": "{Panel}: {objs}.",
    "sign_objects": "{Panel}: a sign that says {word}, and {objs}.",
}

REASONING: dict[str, str] = {
    "panel_objects": "The {panel} panel shows {objs}, which makes {n}.",
    "panel_objects_one": "The {panel} panel shows {objs}, which makes 1.",
    "together": "Together, {a} plus {b} is {c}.",
    "panel_bar": "In the {panel} panel, bar {x} is about {v}.",
    "sum": "Adding them, {a} plus {b} is {c}.",
}

# Words the templates join or substitute: "the image" reads "the panel" inside a panel question.
GLUE: tuple[str, ...] = ("panel", "panels", "a", "and", "look", "at")
