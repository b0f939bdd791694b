"""HF `generate` behind the DecodeEngine interface: the baseline users know, on the same prompts.

`HFEngine(adapter, batch_size=b).generate(requests)` decodes the requests b at a time as one
left-padded `model.generate` call each (HF's static batching: a batch ends when its longest
answer does), with the same sampling rule and end-of-sequence ids as the engine. Results carry
the same fields as `DecodeEngine`'s (one target step per new token after the first; prefill and
decode are not separated inside `generate`, so all time is `decode_s`). Greedy output equals the
engine's AR token for token (tested), so every run with an `hf` method re-checks the lossless
contract against HF itself.

`compile=True` is HF's own fast path, the fastest baseline a user of `generate` has: a static
cache sized per call (`cache_implementation="static"`) and the decoding forward compiled
(`CompileConfig`: mode "reduce-overhead", CUDA graphs on a GPU), as `generate` does by itself on
CUDA with a static cache; on a CPU the same path is switched on explicitly (the config's
`_compile_all_devices`, the flag HF's own tests use). The prefill stays eager, as in HF.

Shapes: B batch, T prompt tokens (left-padded to the longest).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch

from spec_core.decoding.engine import Request, Result
from spec_core.decoding.padding import pad_batch, pad_id_for
from spec_core.decoding.sampling import SamplingConfig


class HFEngine:
    """`model.generate` on `batch_size` requests at a time (see the module docstring)."""

    def __init__(self, adapter, *, batch_size: int = 1, sampling: SamplingConfig | None = None,
                 eos_token_ids: Iterable[int] = (), generator: torch.Generator | None = None,
                 compile: bool = False):
        self.adapter, self.B = adapter, batch_size
        self.compile = compile
        self.sampling = sampling or SamplingConfig()
        self.eos = [int(e) for e in eos_token_ids]
        self.gen = generator or torch.Generator(device=adapter.model.device)
        self.pad_id = pad_id_for(adapter)
        self.phase_s = {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "commit": 0.0}
        self._compiled = {"graphs": 0, "recompiles": 0, "shapes": 0, "warmup_s": 0.0}  # (compile_stats)
        self._sync = torch.cuda.synchronize if adapter.model.device.type == "cuda" else (lambda: None)

    def state_bytes(self) -> int:
        return 0  # HF's DynamicCache lives only inside a generate call

    def close(self) -> None:
        pass

    def warm_up(self, request: Request) -> float:
        """Decode `request` untimed, alone and as a full batch; compiled, at two new-token counts
        each: the static cache is sized per call, so a second size makes dynamo build the graph
        every later size shares (first a static one, then a dynamic one). Returns the seconds."""
        t0 = time.perf_counter()
        news = (request.max_new_tokens, request.max_new_tokens + 1) if self.compile else (request.max_new_tokens,)
        for n in sorted({1, self.B}):
            for new in news:
                list(self.generate([Request(request.inputs, new, request.key)] * n))
        return time.perf_counter() - t0

    def compile_stats(self) -> dict:
        """What compiling cost (compile=True): graphs dynamo built during this engine's calls and
        the seconds of its first call (shapes: 1 once run; HF decides its recompiles)."""
        return dict(self._compiled)

    def _config(self, max_new: int):
        """The checkpoint's generation config with the engine's rule: its EOS ids only (none: no
        stop), raw logits (no repetition penalty), greedy argmax or our sampling warpers."""
        import copy

        s, cfg = self.sampling, copy.deepcopy(self.adapter.model.generation_config)
        # no EOS: an id no token has, the vocabulary size (None would fall back to the checkpoint's EOS)
        cfg.update(max_new_tokens=max_new, min_new_tokens=0, do_sample=s.do_sample,
                   eos_token_id=self.eos or [self.adapter.lm_head.weight.shape[0]],
                   pad_token_id=self.pad_id, repetition_penalty=1.0, no_repeat_ngram_size=0, num_beams=1,
                   temperature=s.temperature if s.do_sample else None,
                   top_k=(s.top_k or None) if s.do_sample else None, top_p=s.top_p if s.do_sample else None)
        if self.compile:
            from transformers import CompileConfig

            compile_config = CompileConfig()
            compile_config._compile_all_devices = True  # on a CPU too (CUDA: what generate does anyway)
            cfg.update(cache_implementation="static", compile_config=compile_config)
        return cfg

    @torch.no_grad()
    def generate(self, requests: Iterable[Request]) -> Iterator[Result]:
        reqs = list(requests)
        for i in range(0, len(reqs), self.B):
            chunk = reqs[i: i + self.B]
            batch = pad_batch([dict(r.inputs) for r in chunk], self.pad_id)
            batch = {k: v.to(self.adapter.model.device) for k, v in batch.items()}
            max_new = max(r.max_new_tokens for r in chunk)
            if self.sampling.do_sample:  # generate draws from the global RNG: seed it from ours
                torch.manual_seed(int(torch.randint(2**62, (1,), generator=self.gen, device=self.gen.device)))
            t0, g0 = time.perf_counter(), torch._dynamo.utils.counters["stats"]["unique_graphs"]
            out = self.adapter.model.generate(**batch, generation_config=self._config(max_new))
            self._sync()
            dt = time.perf_counter() - t0
            if self.compile:
                c = self._compiled
                c["graphs"] += torch._dynamo.utils.counters["stats"]["unique_graphs"] - g0
                if not c["shapes"]:
                    c["shapes"], c["warmup_s"] = 1, round(dt, 3)
            self.phase_s["verify"] += dt
            new_BN = out[:, batch["input_ids"].shape[1]:].tolist()
            for r, row in zip(chunk, new_BN):
                yield self._result(r, row, dt)

    def _result(self, request: Request, row: list[int], seconds: float) -> Result:
        tokens = row[: request.max_new_tokens]
        end = next((j for j, t in enumerate(tokens) if t in self.eos), None)
        tokens = tokens if end is None else tokens[: end + 1]
        return Result(request.key, torch.tensor([tokens]), [1] * max(len(tokens) - 1, 0), 0.0, seconds,
                      "eos" if end is not None else "length")
