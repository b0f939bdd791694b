"""The Ray Train side of jobs/train_drafter.py: the trainer, and its worker running DeepSpeed
ZeRO-2 over the drafter (the FOVEA feature-drafter family, or Medusa heads).

    make_trainer(cfg, plan, artifacts, store, run_dir)   # TorchTrainer(train_worker, datasets={"train": ...})

Each worker builds the drafter from the frozen target (seeded: identical on every rank; DeepSpeed
broadcasts rank 0's weights anyway), hands only its trainable parameters to
`deepspeed.initialize` (ZeRO stage 2, WarmupDecayLR, gradient clipping, bf16 or fp32), and streams
its share of the artifacts with `ray.train.get_dataset_shard`.

Optimizer: a client `torch.optim.AdamW` (betas 0.9/0.95, no weight decay) by default. ZeRO-2
partitions its state like any optimizer (`zero_allow_untested_optimizer` only acknowledges that
it is not one of DeepSpeed's own); the update is the same AdamW as DeepSpeed's FusedAdam, and it
needs no JIT-compiled op (DeepSpeed's costs ~50 s and ~6 GB RAM to build on a CPU machine).
`train.optimizer: deepspeed` selects DeepSpeed's own AdamW instead.

Steps: every worker runs exactly `plan.micro_per_epoch` micro-batches per epoch (Ray Data's
equal split, batches of `per_device_batch`, last partial batch dropped), so all ranks step
together. A checkpoint (every `checkpoint_every` optimizer steps and at the end) holds DeepSpeed's
state (`ds/`: weights, ZeRO optimizer partitions, scheduler, step) and `state.json` (step, epoch,
micro-batches done in the epoch, the logged history); at the end also the exported drafter
(`drafter/`). A rerun restores it (`ray.train.get_checkpoint`) and skips the epoch's batches it
had already consumed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DS_TAG = "ds"


@dataclass(frozen=True)
class Plan:
    """Step counts, decided once on the driver from the sample count."""

    n_samples: int
    world: int
    micro_per_epoch: int      # micro-batches per worker per epoch (a multiple of grad_accum)
    steps_per_epoch: int      # optimizer updates per epoch
    total_steps: int          # over all epochs, capped by train.max_steps
    warmup_steps: int


def plan_steps(n_samples: int, world: int, per_device: int, accum: int, epochs: int,
               max_steps: int | None, warmup_steps: int | None) -> Plan:
    """Micro-batches and optimizer updates per epoch; raises ValueError when the data do not fill
    one update."""
    micro = (n_samples // world) // per_device
    micro -= micro % accum
    steps = micro // accum
    if steps == 0:
        raise ValueError(f"{n_samples} samples do not fill one optimizer update of "
                         f"{world} workers x {per_device} per device x {accum} accumulation")
    total = epochs * steps if max_steps is None else min(epochs * steps, max_steps)
    warmup = math.ceil(0.1 * total) if warmup_steps is None else min(warmup_steps, total)
    return Plan(n_samples, world, micro, steps, total, warmup)


def make_trainer(cfg, plan: Plan, art, store, run_dir: str):
    """TorchTrainer over jobs._train_drafter.loop.train_worker; checkpoints in <run>/checkpoints."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from jobs._train_drafter.data import training_dataset
    from jobs.lib.storage import join

    ray.data.DataContext.get_current().enable_progress_bars = False  # progress: the workers' step lines
    c = cfg.compute
    fs, path = store.arrow_fs(join(run_dir, "checkpoints"))
    gpu = c.gpus_per_worker > 0
    ds = training_dataset(art, store, cfg.train.seed, cfg.data.cpus_per_task)
    return TorchTrainer(
        train_worker,
        train_loop_config={"cfg": cfg, "plan": plan.__dict__,
                           "artifacts": {"hidden_size": art.hidden_size, "hidden_dtype": art.hidden_dtype}},
        scaling_config=ScalingConfig(num_workers=c.num_workers, use_gpu=gpu, resources_per_worker={
            "CPU": c.cpus_per_worker, **({"GPU": c.gpus_per_worker} if gpu else {})}),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        run_config=RunConfig(name=Path(path).name, storage_path=str(Path(path).parent), storage_filesystem=fs,
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
                             failure_config=FailureConfig(max_failures=c.max_failures)),
        datasets={"train": ds.materialize() if cfg.data.cache else ds})


def resolve_precision(precision: str) -> str:
    """auto: bf16 on a CUDA device that supports it, else fp32."""
    import torch

    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def deepspeed_config(cfg, plan: Plan, precision: str) -> dict:
    """The DeepSpeed config of one run (paper App. C: ZeRO-2, clip 0.5, WarmupDecayLR)."""
    t = cfg.train
    ds = {
        "train_micro_batch_size_per_gpu": t.per_device_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "train_batch_size": t.per_device_batch * t.grad_accum * plan.world,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": False},
        "bf16": {"enabled": precision == "bf16"},
        "scheduler": {"type": "WarmupDecayLR", "params": {
            # DeepSpeed divides by warmup_num_steps: no warmup is one step that starts at the peak
            "total_num_steps": plan.total_steps, "warmup_num_steps": max(plan.warmup_steps, 1),
            "warmup_min_lr": 0.0 if plan.warmup_steps else t.lr, "warmup_max_lr": t.lr,
            "warmup_type": t.warmup_type}},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if t.optimizer == "deepspeed":
        ds["optimizer"] = {"type": "AdamW", "params": {"lr": t.lr, "betas": list(t.betas), "eps": 1e-8,
                                                       "weight_decay": t.weight_decay}}
    return ds


def build_engine(cfg, plan: Plan, precision: str):
    """Drafter from the frozen target -> DeepSpeed engine (only trainable parameters optimized)."""
    import deepspeed
    import torch

    from spec_core.fovea import FoveaDrafter
    from spec_core.medusa import MedusaHeads
    from jobs.lib.model_cache import local_model_dir
    from spec_core.targets import load_target, target_identity

    torch.manual_seed(cfg.train.seed)
    load_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    path = local_model_dir(cfg.target.path, cfg.storage)  # s3://: downloaded once per node
    adapter = load_target(path, dtype=load_dtype)
    identity = {**target_identity(path), "target_path": cfg.target.path}  # the drafter names the URI
    if cfg.drafter.kind == "medusa":
        drafter = MedusaHeads.from_target(adapter, cfg.drafter.medusa_config(), identity=identity)
    else:
        drafter = FoveaDrafter.from_target(adapter, cfg.drafter.fovea_config(), identity=identity)
    del adapter  # the drafter keeps its own frozen copies of the embedding and LM head
    drafter = drafter.float() if precision == "fp32" else drafter
    params = drafter.trainable_parameters()
    optimizer = None
    if cfg.train.optimizer == "torch":
        optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, betas=tuple(cfg.train.betas), eps=1e-8,
                                      weight_decay=cfg.train.weight_decay)
    engine, _, _, _ = deepspeed.initialize(model=drafter, model_parameters=params, optimizer=optimizer,
                                           config=deepspeed_config(cfg, plan, precision))
    return engine


class Window:
    """Sums over one logging window on this rank, kept on the device (no sync per micro-batch);
    `reduce` adds them over all ranks into one record."""

    def __init__(self, depth: int):
        self.depth = depth
        self.reset()

    def reset(self) -> None:
        self.names, self.sums, self.per_step = None, None, None
        self.micro = self.tokens = self.samples = self.steps = 0
        self.data_s, self.t0 = 0.0, time.perf_counter()

    def add(self, out, n_tokens: int, n_samples: int) -> None:
        import torch

        if self.names is None:
            self.names = ["loss", *sorted(out.terms)]
        terms = torch.stack([out.loss.detach().float(), *(out.terms[k].float() for k in self.names[1:])])
        count = out.count.float()
        per_step = torch.stack([out.top1.float() * count, out.k_mean.float() * count, count])  # (3, depth)
        self.sums = terms if self.sums is None else self.sums + terms
        self.per_step = per_step if self.per_step is None else self.per_step + per_step
        self.micro, self.tokens, self.samples = self.micro + 1, self.tokens + n_tokens, self.samples + n_samples

    def reduce(self) -> dict:
        """One record over all ranks (a collective: every rank calls it, after >= 1 `add`)."""
        import torch
        import torch.distributed as dist

        counts = torch.tensor([self.micro, self.tokens, self.samples], dtype=torch.float64, device=self.sums.device)
        vec = torch.cat([self.sums.double(), self.per_step.double().flatten(), counts])
        if dist.is_initialized():
            dist.all_reduce(vec)
        v, n, d = vec.cpu().tolist(), len(self.names), self.depth
        hits, k_read, count = v[n: n + d], v[n + d: n + 2 * d], v[n + 2 * d: n + 3 * d]
        micro, tokens, samples = v[n + 3 * d:]
        wall = time.perf_counter() - self.t0
        rec = {name: round(x / max(micro, 1), 6) for name, x in zip(self.names, v[:n])}
        rec["top1"] = [round(h / c, 4) if c else None for h, c in zip(hits, count)]
        rec["k_read"] = [round(x / c, 2) if c else None for x, c in zip(k_read, count)]
        rec.update(updates=self.steps, tokens=int(tokens), seconds=round(wall, 4), tokens_per_s=round(tokens / wall, 1),
                   samples_per_s=round(samples / wall, 2), seconds_per_step=round(wall / max(self.steps, 1), 4),
                   data_wait_fraction=round(self.data_s / wall, 3))
        return rec


BOOKKEEPING = {"step", "epoch", "lr", "loss", "top1", "k_read", "updates", "tokens", "seconds", "tokens_per_s",
               "samples_per_s", "seconds_per_step", "data_wait_fraction"}


def summarize(history: list[dict]) -> dict:
    """Headline figures of a step log: loss first and last, each loss term and the top-1
    agreement per draft step averaged over the last 10% of records, and steady-state speed (all
    records but the first, which holds start-up)."""
    if not history:
        return {}
    tail = history[-max(1, len(history) // 10):]
    steady = history[1:] or history

    def mean(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return round(sum(values) / len(values), 4) if values else None

    terms = sorted(set(history[-1]) - BOOKKEEPING)
    depth = len(history[-1]["top1"])
    seconds = sum(r["seconds"] for r in steady)
    return {"first_loss": history[0]["loss"], "final_loss": mean([r["loss"] for r in tail]),
            "final_terms": {k: mean([r[k] for r in tail]) for k in terms},
            "top1_per_depth": [mean([r["top1"][i] for r in tail]) for i in range(depth)],
            "k_read_per_depth": [mean([r["k_read"][i] for r in tail]) for i in range(depth)],
            "tokens_per_s": round(sum(r["tokens"] for r in steady) / seconds, 1),
            "seconds_per_step": round(seconds / sum(r["updates"] for r in steady), 4)}


def acceptance_figures(history: list[dict]) -> list[float] | None:
    """The top-1 agreement per draft step that a trained drafter carries (`summarize`'s, over the
    last 10% of the step log), up to the first step never supervised; None without any."""
    figures = []
    for a in summarize(history).get("top1_per_depth", []):
        if a is None:
            break
        figures.append(a)
    return figures or None


def read_state(directory: str | None) -> dict:
    """state.json of a restored checkpoint directory (the fresh state without one)."""
    if directory is None:
        return {"step": 0, "epoch": 0, "micro_in_epoch": 0, "history": [], "resumed_from": []}
    state = json.loads((Path(directory) / "state.json").read_text())
    state["resumed_from"] = [*state.get("resumed_from", []), state["step"]]
    return state


def save_checkpoint(engine, state: dict, rank: int, final: bool) -> None:
    """Every rank writes its DeepSpeed shard; rank 0 adds state.json (and the drafter at the end);
    Ray Train merges the workers' directories into one checkpoint in storage."""
    import ray.train

    with tempfile.TemporaryDirectory() as d:
        engine.save_checkpoint(d, tag=DS_TAG, save_latest=False)
        if rank == 0:
            (Path(d) / "state.json").write_text(json.dumps(state))
            if final:  # with its top-1 per draft step over the last records: the goodput policy's prior
                engine.module.acceptance = acceptance_figures(state["history"])
                engine.module.save_pretrained(Path(d) / "drafter")
        last = state["history"][-1] if state["history"] else {}
        ray.train.report({"step": state["step"], "loss": last.get("loss")},
                         checkpoint=ray.train.Checkpoint.from_directory(d),
                         checkpoint_dir_name=f"step-{state['step']:08d}")


def train_worker(config: dict) -> None:
    """Ray Train worker entry: config = {"cfg": TrainDrafterConfig, "plan": Plan fields,
    "artifacts": {"hidden_size", "hidden_dtype"}}."""
    import deepspeed
    import ray.train
    import torch

    cfg, plan = config["cfg"], Plan(**config["plan"])
    torch.set_num_threads(max(1, int(cfg.compute.cpus_per_worker)))
    deepspeed.utils.logger.setLevel(logging.WARNING)
    rank = ray.train.get_context().get_world_rank()
    checkpoint = ray.train.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as restored:
        state = read_state(restored)
        if state.setdefault("world", plan.world) != plan.world:  # ZeRO-2 optimizer state is partitioned per rank
            raise ValueError(f"the checkpoint at step {state['step']} was written by {state['world']} workers: "
                             f"resume with compute.num_workers={state['world']}")
        if state["step"] >= plan.total_steps:
            return  # a finished run, rerun: its final checkpoint already holds everything
        precision = resolve_precision(cfg.train.precision)
        engine = build_engine(cfg, plan, precision)
        if restored is not None:
            engine.load_checkpoint(restored, tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=True)
            assert engine.global_steps == state["step"], (engine.global_steps, state["step"])
    if rank == 0:
        say(f"train_drafter: {'resuming at step ' + str(state['step']) if restored else 'starting'}"
            f" / {plan.total_steps} ({plan.steps_per_epoch} per epoch, {plan.world} workers, {precision})")
    run_epochs(engine, cfg, plan, state, rank, config["artifacts"], precision)
    state.update(epoch=cfg.train.epochs, micro_in_epoch=0)
    save_checkpoint(engine, state, rank, final=True)


def run_epochs(engine, cfg, plan: Plan, state: dict, rank: int, art: dict, precision: str) -> None:
    """The training loop from `state` on; updates `state` (step, data position, history) and
    checkpoints every `checkpoint_every` updates."""
    import ray.train
    import torch

    from jobs._train_drafter.data import decode_rows
    from spec_core.fovea import drafter_loss
    from spec_core.fovea.data import collate
    from spec_core.medusa import medusa_loss

    t = cfg.train
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    loss_cfg = cfg.loss
    shard = ray.train.get_dataset_shard("train")
    window = Window(cfg.drafter.steps_logged)
    if cfg.drafter.kind == "medusa":
        loss_fn = lambda model, batch: medusa_loss(model, batch, reduce_fn=mean_over_ranks)  # noqa: E731
    else:
        loss_fn = lambda model, batch: drafter_loss(model, batch, loss_cfg, reduce_fn=mean_over_ranks)  # noqa: E731
    engine.train()
    for epoch in range(state["epoch"], t.epochs):
        skip = state["micro_in_epoch"] if epoch == state["epoch"] else 0
        batches = shard.iter_batches(batch_size=t.per_device_batch, batch_format="pyarrow", drop_last=True,
                                     local_shuffle_buffer_size=cfg.data.shuffle_buffer or None,
                                     local_shuffle_seed=t.seed + 1000 * epoch + rank)
        micro, t_data = 0, time.perf_counter()
        for table in batches:
            if micro >= plan.micro_per_epoch or state["step"] >= plan.total_steps:
                break
            micro += 1
            if micro <= skip:  # consumed before the checkpoint this run resumed from
                t_data = time.perf_counter()
                continue
            batch = collate(decode_rows(table.to_pylist(), art["hidden_size"], art["hidden_dtype"]))
            n_tokens, n_samples = batch.n_tokens, table.num_rows  # counted on the host: no device sync
            batch = batch.to(engine.device, dtype)
            window.data_s += time.perf_counter() - t_data
            out = loss_fn(engine.module, batch)
            engine.backward(out.loss)
            engine.step()  # an optimizer update (and scheduler step) every grad_accum micro-batches
            window.add(out, n_tokens, n_samples)
            if micro % t.grad_accum == 0:
                step = state["step"] = state["step"] + 1
                window.steps += 1
                if step == 1 or step % t.log_every == 0 or step == plan.total_steps:  # first and last too
                    rec = {"step": step, "epoch": epoch, "lr": engine.get_lr()[0], **window.reduce()}
                    state["history"].append(rec)
                    window.reset()
                    if rank == 0:
                        say(format_record(rec, plan.total_steps))
                if t.checkpoint_every and step % t.checkpoint_every == 0 and step < plan.total_steps:
                    done = micro >= plan.micro_per_epoch  # the data position to resume from
                    state.update(epoch=epoch + done, micro_in_epoch=0 if done else micro)
                    save_checkpoint(engine, state, rank, final=False)
            t_data = time.perf_counter()
        if state["step"] >= plan.total_steps:
            break


def mean_over_ranks(x):
    """drafter_loss's reduce_fn: the mean of a tensor over all ranks (gloo has no AVG op)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return x
    x = x.detach().clone()
    dist.all_reduce(x)
    return x / dist.get_world_size()


def say(line: str) -> None:
    """One progress line to the driver. Ray Train patches `print` and would emit it twice."""
    print(line, file=sys.__stdout__, flush=True)


def format_record(rec: dict, total: int) -> str:
    top1 = ", ".join("-" if a is None else f"{a:.2f}" for a in rec["top1"])
    return (f"step {rec['step']}/{total} loss {rec['loss']:.4f} top1 [{top1}] lr {rec['lr']:.2e} "
            f"{rec['tokens_per_s']:.0f} tok/s {rec['seconds_per_step']:.3f} s/step")

