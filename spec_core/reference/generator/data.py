"""Seeded, on-the-fly examples for the generator: (prompt, textured image) and (prompt, video)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from spec_core.reference.drawing import render, render_video
from spec_core.reference.scenes import (Scene, describe_for_generation, describe_motion,
                                        move_objects, sample_motion_start, sample_scene)

_BACKGROUND_SUFFIX = " background"


def image_prompt(scene: Scene) -> str:
    """The generator's prompt: describe_for_generation with the background clause moved to the
    front ('a gray background with a large red circle in the top left and ...'), so the object
    phrases sit right before <boi>, where a small LM binds them most easily."""
    text = describe_for_generation(scene)
    head, sep, bg = text.rpartition(" on a ")
    if not sep or not bg.endswith(_BACKGROUND_SUFFIX):
        return text
    return f"a {bg} with {head}"


@dataclass(frozen=True)
class SceneSpec:
    """What scenes the generator is trained on and how they are rendered."""

    image_size: int = 32
    frame_size: int = 16
    n_frames: int = 8
    texture: float = 0.3
    chart_prob: float = 0.0
    sign_prob: float = 0.0
    n_objects: tuple[int, int] = (1, 2)


def sample_image_scene(rng: np.random.Generator, spec: SceneSpec) -> Scene:
    """One scene for image generation (objects or, with chart_prob, a bar chart)."""
    kind = "chart" if rng.random() < spec.chart_prob else "objects"
    return sample_scene(rng, kind, with_sign_prob=spec.sign_prob, n_objects=spec.n_objects)


def image_example(rng: np.random.Generator, spec: SceneSpec) -> tuple[str, Image.Image, Scene]:
    """(prompt, textured image, scene) drawn from `rng`."""
    scene = sample_image_scene(rng, spec)
    image = render(scene, spec.image_size, texture=spec.texture, rng=rng)
    return image_prompt(scene), image, scene


def image_example_draws(rng: np.random.Generator, spec: SceneSpec,
                        draws: int) -> tuple[str, list[Image.Image], Scene]:
    """(prompt, `draws` renders of one scene sharing jitter + pattern but with independent pixel
    noise, scene); draw 0 is the training image, all draws give its per-token target."""
    scene = sample_image_scene(rng, spec)
    if spec.texture <= 0 or draws <= 1:
        images = [render(scene, spec.image_size, spec.texture, rng)]
    else:
        still = [(0.0, 0.0)] * len(scene.objects)  # a still "video": same pattern, fresh noise
        images = render_video(scene, still, draws, spec.image_size, spec.texture, rng)
    return image_prompt(scene), images, scene


def video_example(rng: np.random.Generator,
                  spec: SceneSpec) -> tuple[str, list[Image.Image], list[Scene]]:
    """(prompt, textured frames, frame scenes) drawn from `rng`."""
    start, velocities = sample_motion_start(rng)
    frames = move_objects(start, velocities, spec.n_frames)
    images = render_video(start, velocities, spec.n_frames, spec.frame_size,
                          texture=spec.texture, rng=rng)
    return describe_motion(frames), images, frames


def largest_object_colour(scene: Scene) -> str | None:
    """Colour of the unique largest object named in the prompt (None if there is a tie)."""
    if scene.chart is not None:
        return scene.chart.colour
    large = [o for o in scene.objects if o.size == "large"]
    pool = large if large else list(scene.objects)
    return pool[0].colour if len(pool) == 1 else None


def heldout_prompts(seed: int, n: int, spec: SceneSpec) -> list[tuple[str, Scene, str]]:
    """n held-out (prompt, scene, target colour) with a unique largest object, from a seed
    stream disjoint from training."""
    rng = np.random.default_rng([seed, 7_777_777])
    out: list[tuple[str, Scene, str]] = []
    while len(out) < n:
        scene = sample_image_scene(rng, spec)
        colour = largest_object_colour(scene)
        if colour is not None:
            out.append((image_prompt(scene), scene, colour))
    return out
