"""The engine's autoregressive decoding against HF `generate`, same target, same prompts, one process.

    python scripts/bench_batch.py --target runs/reference/small/target --batch 1 --batch 8 --reps 7

Greedy, a fixed number of new tokens (EOS off on both sides), the same dtype and torch threads.
HF decodes each batch as one left-padded `generate` call (spec_core.decoding.hf_engine); the
engine runs the same prompts as a request stream on `batch` slots. Sides are interleaved per repetition and the minimum of each is
compared (a shared machine is noisy). Also prints the engine's time per phase and its overhead:
step time not spent inside the target's forward. Outputs are checked token-identical.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import AutoProcessor  # noqa: E402

from spec_core.decoding import DecodeEngine, Request  # noqa: E402
from spec_core.decoding.hf_engine import HFEngine  # noqa: E402
from spec_core.reference.tasks import TASKS, make_split  # noqa: E402
from spec_core.targets import load_target  # noqa: E402


def prompts(n: int) -> list[tuple[str, Image.Image]]:
    samples = [s for t in TASKS for s in make_split(t, -(-n // len(TASKS)), 0, "eval")][:n]
    return [(s["conversation"][:1], Image.open(io.BytesIO(s["image_png"])).convert("RGB")) for s in samples]


class ForwardTimer:
    """Seconds spent inside the target's language-model forwards (hooks on the decoder)."""

    def __init__(self, module: torch.nn.Module):
        self.seconds, self._t0 = 0.0, 0.0
        self._h = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop)]

    def _start(self, *_):
        self._t0 = time.perf_counter()

    def _stop(self, *_):
        self.seconds += time.perf_counter() - self._t0

    def close(self):
        for h in self._h:
            h.remove()


def requests(processor, batch, max_new: int) -> list[Request]:
    out = []
    for i, (conv, im) in enumerate(batch):
        text = processor.tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        out.append(Request(dict(processor(text=text, images=im, add_special_tokens=False, return_tensors="pt")),
                           max_new, key=i))
    return out


def decode(engine, adapter, reqs: list[Request]) -> tuple[list[list[int]], float, dict]:
    """Outputs in request order, wall seconds, and the engine's phases plus the seconds spent
    inside the target's language-model forwards."""
    timer = ForwardTimer(adapter.model.model.language_model)
    t0 = time.perf_counter()
    results = sorted(engine.generate(reqs), key=lambda r: r.key)
    dt = time.perf_counter() - t0
    timer.close()
    return [r.sequences[0].tolist() for r in results], dt, {**engine.phase_s, "forward": timer.seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="runs/reference/small/target")
    ap.add_argument("--batch", action="append", type=int, default=[])
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    adapter = load_target(args.target)
    processor = AutoProcessor.from_pretrained(args.target)
    for b in args.batch or [1, 8]:
        reqs = requests(processor, prompts(b), args.max_new)
        sides = {"hf": lambda: HFEngine(adapter, batch_size=b),  # EOS off on both sides
                 "engine": lambda: DecodeEngine(adapter, None, batch_size=b, capacity=512 + args.max_new)}
        seconds: dict[str, list[float]] = {k: [] for k in sides}
        outs, phases = {}, []
        for rep in range(args.reps + 1):  # the first repetition is a warm-up
            for name, make in sides.items():
                engine = make()
                outs[name], dt, ph = decode(engine, adapter, reqs)
                if rep:
                    seconds[name].append(dt)
                    if name == "engine":
                        phases.append((dt, ph))
        tokens = b * args.max_new
        hf, eng = min(seconds["hf"]), min(seconds["engine"])
        dt, ph = min(phases, key=lambda x: x[0])
        print(f"batch {b}: HF generate {1e3 * hf / tokens:.2f} ms/token, engine AR {1e3 * eng / tokens:.2f} ms/token, "
              f"engine/HF time {eng / hf:.3f} (min of {args.reps}); outputs identical: {outs['hf'] == outs['engine']}")
        print("  engine phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items())
              + f"; overhead (step time outside target forwards) {1 - ph['forward'] / dt:.1%}")


if __name__ == "__main__":
    main()
