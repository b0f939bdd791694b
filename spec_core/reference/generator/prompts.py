"""Held-out prompt sets for the generator (the generate_images job's default manifest): prompts
with the colour their sample should show, so prompt following can be scored."""

from __future__ import annotations

import numpy as np

from spec_core.reference.generator.data import (SceneSpec, heldout_prompts, largest_object_colour,
                                                video_example)


def prompt_manifest(n_images: int, n_videos: int, seed: int = 0,
                    spec: SceneSpec | None = None) -> list[dict]:
    """Rows {id, kind, prompt, background, colour}: n_images image prompts (a unique largest
    object) then n_videos video prompts, from streams disjoint from training."""
    spec = spec or SceneSpec()
    rows = [{"id": f"img-{i:04d}", "kind": "image", "prompt": p, "background": s.background, "colour": c}
            for i, (p, s, c) in enumerate(heldout_prompts(seed, n_images, spec))]
    rng = np.random.default_rng([seed, 8_888_888])
    for i in range(n_videos):
        prompt, _, scenes = video_example(rng, spec)
        rows.append({"id": f"vid-{i:04d}", "kind": "video", "prompt": prompt,
                     "background": scenes[0].background, "colour": largest_object_colour(scenes[0])})
    return rows
