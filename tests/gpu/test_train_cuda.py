"""Drafter training on one GPU: DeepSpeed ZeRO-2 set up by the training job's own
`jobs._train_drafter.loop.build_engine` over an nccl process group of one rank, bf16, trained for a
few updates (the loop of `run_epochs`, without Ray) on bf16 artifacts from a CUDA prefill."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import free_port
from tests.gpu import conftest as gpu
from tests.gpu.test_precompute_cuda import loss_masks
from tests.spec_core.targets.conftest import build_llava, llava_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BACKEND = "nccl"  # read at call time, like gpu.DEVICE


def cuda_artifact_samples(target_dir) -> list:
    """DraftSamples decoded from the bf16 artifacts of a bf16 prefill of the saved target on DEVICE,
    through the same functions the precompute and training jobs use."""
    from spec_core.fovea.data import decode_sample
    from spec_core.targets import load_target
    from spec_core.targets.artifacts import sample_artifacts

    adapter = load_target(target_dir, dtype=torch.bfloat16, device=gpu.DEVICE)
    batch = llava_batch()
    out = adapter.prefill(batch, (1, 3))
    samples = []
    for b, mask in enumerate(loss_masks(batch)):
        a = sample_artifacts(out, b, batch["input_ids"], batch["attention_mask"], mask, "bfloat16")
        row = {"input_ids": a.input_ids, "loss_mask": a.loss_mask, "mid_pos": a.mid_pos,
               "final_hidden": a.final_hidden.tobytes(), "mid_hidden": a.mid_hidden.tobytes()}
        samples.append(decode_sample(row, a.visual.tobytes(), len(a.visual), adapter.text_config.hidden_size, "bfloat16"))
    return samples


def test_deepspeed_zero2_updates_on_one_gpu_with_nccl(tmp_path, monkeypatch):
    import torch.distributed as dist

    from jobs._train_drafter.loop import build_engine, mean_over_ranks, plan_steps
    from jobs.train_drafter import TrainDrafterConfig
    from spec_core.fovea import drafter_loss
    from spec_core.fovea.data import collate

    target = tmp_path / "target"
    build_llava().save_pretrained(target)
    samples = cuda_artifact_samples(target)
    cfg = TrainDrafterConfig.model_validate({
        "run": {"output_uri": str(tmp_path / "runs")}, "target": {"path": str(target)},
        "drafter": {"k_min": 2, "k_max": 4, "correction_hidden": 16, "max_depth": 4},
        "train": {"per_device_batch": 2, "lr": 3e-3, "epochs": 6, "warmup_steps": 1}})
    t = cfg.train
    plan = plan_steps(len(samples), 1, t.per_device_batch, t.grad_accum, t.epochs, t.max_steps, t.warmup_steps)
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)  # what a launcher (Ray Train's TorchConfig) sets
    dist.init_process_group(BACKEND, rank=0, world_size=1)
    try:
        engine = build_engine(cfg, plan, "bf16")
        assert dist.get_backend() == BACKEND and engine.device.type == torch.device(gpu.DEVICE).type
        batch = collate(samples).to(engine.device, torch.bfloat16)
        loss_cfg, losses = cfg.loss, []
        engine.train()
        for _ in range(plan.total_steps):
            out = drafter_loss(engine.module, batch, loss_cfg, reduce_fn=mean_over_ranks)
            engine.backward(out.loss)
            engine.step()
            losses.append(float(out.loss.detach()))
        assert engine.global_steps == plan.total_steps == 6
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
        assert {p.dtype for p in engine.module.trainable_parameters()} == {torch.bfloat16}
        print(f"\nZeRO-2 on one GPU ({BACKEND}, bf16): loss {' '.join(f'{x:.3f}' for x in losses)}")
    finally:
        dist.destroy_process_group()
