"""The reference world: a seeded synthetic multimodal world (scenes, renders, six VQA-style tasks)
for training tiny VLMs and image/video generators from scratch."""

from spec_core.reference.drawing import (dominant_colour, patch_labels, render, render_video,
                                         scene_dominant_colour)
from spec_core.reference.scenes import (Chart, Obj, Scene, Sign, describe_for_generation,
                                        describe_motion, move_objects, sample_motion,
                                        sample_motion_start, sample_scene,
                                        sample_velocities, scene_from_json, scene_to_json)
from spec_core.reference.tasks import (IMAGE_TOKEN, TASKS, all_words, captioning, chart_vqa,
                                       corpus_texts, general_vqa, make_sample, make_split,
                                       multi_turn, png_bytes, reasoning, text_vqa, words_of)
from spec_core.reference.vocab import (BACKGROUNDS, BAR_LABELS, CELL_NAMES, COLOURS, SHAPES,
                                       SIZES, WORDS)

__all__ = [
    "BACKGROUNDS", "BAR_LABELS", "CELL_NAMES", "COLOURS", "Chart", "IMAGE_TOKEN", "Obj", "SHAPES",
    "SIZES", "Scene", "Sign", "TASKS", "WORDS", "all_words", "captioning", "chart_vqa",
    "corpus_texts", "describe_for_generation", "describe_motion", "dominant_colour",
    "general_vqa", "make_sample", "make_split", "move_objects", "multi_turn", "patch_labels",
    "png_bytes", "reasoning", "render", "render_video", "sample_motion", "sample_motion_start",
    "sample_scene",
    "sample_velocities", "scene_dominant_colour", "scene_from_json", "scene_to_json", "text_vqa",
    "words_of",
]
