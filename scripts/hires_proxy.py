"""A small proxy of the hires target's decoder training, to measure a training change in ~15-25
minutes before a full `build_reference.py --size hires` (60-90 minutes): a decoder of a few layers
trained from scratch on a few region tasks, with the build's own pool and losses
(`build.task_pool`, `train_vlm`), then held-out exact match and answer tokens by kind (copied from
the question, read from the image: `answer_kinds`).

    # once: tokenizer + stage-1 tower (~7 min on 2 cores), saved with an untrained decoder
    python scripts/hires_proxy.py --out /tmp/proxy/stage1 --steps 0
    # then one arm per change, sharing that tower (two arms run side by side on 2 cores)
    python scripts/hires_proxy.py --out /tmp/proxy/base --tower /tmp/proxy/stage1
    python scripts/hires_proxy.py --out /tmp/proxy/read --tower /tmp/proxy/stage1 --set read_focus=true
    python scripts/hires_proxy.py --out /tmp/proxy/signs --tower /tmp/proxy/stage1 --set read_focus=true \
        --set read_weight=1 --set read_loss_words=signs     # the read loss on sign words only

`--panel-steps N` trains the new decoder N steps on single 64 px small-world scenes first (36
visual tokens: the base view and one tile), answers only, then `--steps` on the mosaics: whether
reading learnt where there is one scene to read carries over to finding it among nine.

`--tower` takes any saved hires target (a build's `target/` too): its tokenizer, processor, vision
tower, projector and `image_newline` are kept, the decoder is new. `--set` overrides fields of the
hires preset's `VLMTrainConfig` (values parsed as JSON where they parse: true, 0.5, 3).
Writes <out>/proxy.json (the config, training metrics, the figures) and the model + processor.

Measured with this setup before it was a script (2026-12-03, 4 layers, general + text VQA, 2000
images, 1500 steps): copy supervision took copied answer words 0.16 -> 1.00 (general VQA) and
0.13 -> 0.47 (text VQA); docs/results.md (the hires world).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spec_core.reference import hires  # noqa: E402
from spec_core.reference import tasks as small  # noqa: E402
from spec_core.reference.tasks import corpus_texts  # noqa: E402
from spec_core.reference.vlm.answer_kinds import answer_kind_accuracy, kind_table  # noqa: E402
from spec_core.reference.vlm.build import TOKENIZER_VOCAB, load_target, task_pool  # noqa: E402
from spec_core.reference.vlm.data import TaskPool, decode_png, image_token_count  # noqa: E402
from spec_core.reference.vlm.evaluate import quality  # noqa: E402
from spec_core.reference.vlm.model import PRESETS, VLMSize, build_processor, build_vlm  # noqa: E402
from spec_core.reference.vlm.perception import init_projector, train_perception  # noqa: E402
from spec_core.reference.vlm.tokenizer import train_tokenizer  # noqa: E402
from spec_core.reference.vlm.train import TRAIN_PRESETS, VLMTrainConfig, train_vlm  # noqa: E402


def overrides(pairs: list[str], cls: type = VLMTrainConfig) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in cls.__dataclass_fields__:
            raise SystemExit(f"{pair!r}: expected field=value with a {cls.__name__} field")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tower", help="a saved hires target whose tokenizer, tower and projector to keep")
    ap.add_argument("--images", type=int, default=2000, help="training images (one sample per task each)")
    ap.add_argument("--steps", type=int, default=1500, help="decoder steps (0: stage 1 only, then save)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers")
    ap.add_argument("--tasks", nargs="+", default=["general_vqa", "text_vqa"])
    ap.add_argument("--eval", type=int, default=60, help="held-out samples per task")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="FIELD=VALUE")
    ap.add_argument("--panel-steps", type=int, default=0,
                    help="decoder steps on single 64 px small-world scenes first (the same tasks, answers only: "
                         "16 tiles' worth of tokens fewer), then --steps on the mosaics")
    ap.add_argument("--size-set", action="append", default=[], dest="size_sets", metavar="FIELD=VALUE",
                    help="a field of the hires VLMSize (e.g. tie_embeddings=true)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    size = replace(PRESETS["hires"], text_layers=args.layers, **overrides(args.size_sets, VLMSize))
    tcfg = replace(TRAIN_PRESETS["hires"], train_per_task=args.images, steps=args.steps,
                   warmup=min(TRAIN_PRESETS["hires"].warmup, max(args.steps // 10, 1)),
                   task_weights={t: 1.0 for t in args.tasks}, seed=args.seed, **overrides(args.sets))
    samples = [s for t in args.tasks for s in hires.make_split(t, args.images, args.seed, "train")]
    figures: dict = {"config": {**vars(args), "train": {k: getattr(tcfg, k) for k in tcfg.__dataclass_fields__}}}
    if args.tower:
        base, processor = load_target(args.tower)
        model = build_vlm(size, processor.tokenizer, args.seed)
        for name in ("vision_tower", "multi_modal_projector"):
            getattr(model.model, name).load_state_dict(getattr(base.model, name).state_dict())
        model.model.image_newline.data.copy_(base.model.image_newline.data)
    else:
        tok = train_tokenizer([*corpus_texts(samples), *sorted(hires.all_words())], TOKENIZER_VOCAB)
        processor = build_processor(size, tok)
        model = build_vlm(size, tok, args.seed)
        acc, heads = train_perception(model.model.vision_tower, tcfg.vision_steps, tcfg.vision_batch, tcfg.vision_lr,
                                      args.seed, pool=tcfg.vision_pool, panels=True, log=print)
        init_projector(model.model.multi_modal_projector, heads)
        figures["stage1"] = acc
    if args.panel_steps > 0:  # a curriculum: read one scene (base view + one tile) before finding it among nine
        scenes = [s for t in args.tasks for s in small.make_split(t, args.images, args.seed, "train")]
        n = image_token_count(processor, decode_png(scenes[0]["image_png"]))
        first = replace(tcfg, steps=args.panel_steps, focus_weight=0.0, copy_weight=0.0, read_weight=0.0)
        figures["panel_train"] = {**train_vlm(model, TaskPool.build(scenes, processor, n), first, log=print),
                                  "image_tokens": n}
    if args.steps > 0:
        figures["train"] = train_vlm(model, task_pool(size, tcfg, samples, processor), tcfg, log=print)
        model.eval()
        held_out = [s for t in args.tasks for s in hires.make_split(t, args.eval, args.seed, "eval")]
        figures["quality"] = quality(model, processor, held_out)
        kinds = answer_kind_accuracy(model, processor, held_out)
        figures["answer_tokens"] = {f"{t}/{k}": v for (t, k), v in sorted(kinds.items())}
        print(json.dumps(figures["quality"], indent=1))
        print(kind_table(kinds, args.tasks))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    processor.save_pretrained(args.out)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    (Path(args.out) / "proxy.json").write_text(json.dumps(figures, indent=1, default=str))
    print(f"hires_proxy: {args.out} in {figures['seconds']:.0f} s")


if __name__ == "__main__":
    main()
