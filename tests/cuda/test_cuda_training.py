"""Training on the GPUs through the Accelerator: bf16 and fp16 lower the loss, an fp16 overflow
is a skipped step that is reported, fp8 where the GPU has float8, FSDP and NCCL collectives
across two GPUs, fp16 under DeepSpeed (its loss scaling, no GradScaler of ours)."""

from __future__ import annotations

from typing import Any

import pytest

from notebook_accel import ConfigError, notebook_launcher


def _train(epochs: int, fsdp: Any = None) -> dict[str, Any]:
    import torch

    from notebook_accel import Accelerator

    acc = Accelerator(fsdp=fsdp)  # the precision (and DeepSpeed) come from the launch
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU()
    )
    model.append(torch.nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 64, generator=g)
    y = torch.sin(x[:, :8].sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses = []
    for _ in range(epochs * acc.num_processes):  # as many optimizer steps on 1 GPU as on 8
        for xb, yb in loader:
            out = model(xb)
            loss = torch.nn.functional.mse_loss(out, yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(acc.reduce(loss.detach(), "mean").item())
    return {
        "precision": acc.mixed_precision,
        "device": str(xb.device),
        "out_dtype": str(out.dtype),
        "first": sum(losses[:4]) / 4,
        "last": sum(losses[-4:]) / 4,
        "skipped": acc.optimizer_step_was_skipped,
        "our_scaler": acc.scaler is not None,
        "full_state": sorted(acc.get_state_dict(model)) if fsdp else [],
    }


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_lowers_the_loss(precision: str, gpu_count: int) -> None:
    results = notebook_launcher(_train, args=(8,), mixed_precision=precision)
    assert len(results) == gpu_count
    for r in results:
        assert r["precision"] == precision and r["device"].startswith("cuda:")
        assert r["out_dtype"] == "torch.float32"  # autocast outputs come back in float32
        assert r["last"] < 0.5 * r["first"], r
        assert not r["skipped"]


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_fp16_scales_its_own_loss(stage: int, gpu_count: int) -> None:
    pytest.importorskip("deepspeed")
    results = notebook_launcher(_train, args=(8,), mixed_precision="fp16", deepspeed=stage)
    assert len(results) == gpu_count
    for r in results:
        assert r["precision"] == "fp16" and r["device"].startswith("cuda:")
        assert not r["our_scaler"]  # DeepSpeed's fp16 config scales the loss
        assert r["last"] < 0.5 * r["first"], r


def _fp16_overflow() -> dict[str, Any]:
    import torch

    from notebook_accel import Accelerator

    acc = Accelerator()
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    x = torch.randn(8, 16, device=acc.device)
    before = [p.detach().clone() for p in model.parameters()]
    scale = acc.scaler.get_scale()
    acc.backward(model(x).float().sum() * float("inf"))  # gradients overflow
    opt.step()
    sched.step()
    opt.zero_grad()
    overflow = {
        "skipped": acc.optimizer_step_was_skipped,
        "unchanged": all(
            torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)
        ),
        "scale_lowered": acc.scaler.get_scale() < scale,
        "lr": opt.param_groups[0]["lr"],
    }
    acc.backward(model(x).float().pow(2).mean())
    opt.step()
    sched.step()
    return overflow | {
        "next_skipped": acc.optimizer_step_was_skipped,
        "lr_after": sched.get_last_lr()[0],
    }


def test_an_fp16_overflow_is_a_skipped_step_that_is_reported() -> None:
    results = notebook_launcher(_fp16_overflow, mixed_precision="fp16", num_processes=1)
    r = results[0]
    assert r["skipped"] and r["unchanged"] and r["scale_lowered"]
    assert r["lr"] == 0.1  # the scheduler did not step for the skipped step
    assert not r["next_skipped"] and r["lr_after"] == 0.05


def test_fp8_trains_where_the_gpu_has_float8(capability: tuple[int, int]) -> None:
    pytest.importorskip("torchao")
    if capability < (8, 9):
        pytest.skip(f"compute capability {capability}: no float8 tensor cores (needs >= 8.9)")

    def converted() -> int:
        import torch
        from torchao.float8.float8_linear import Float8Linear

        from notebook_accel import Accelerator

        acc = Accelerator()
        model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
        model = acc.prepare(model)
        return sum(isinstance(m, Float8Linear) for m in model.modules())

    r = notebook_launcher(_train, args=(8,), mixed_precision="fp8", num_processes=1)[0]
    assert r["precision"] == "fp8" and r["last"] < 0.5 * r["first"], r
    assert notebook_launcher(converted, mixed_precision="fp8", num_processes=1) == [2]


def test_fp8_is_refused_before_any_process_on_older_gpus(capability: tuple[int, int]) -> None:
    pytest.importorskip("torchao")
    if capability >= (8, 9):
        pytest.skip(f"compute capability {capability} has float8: see the test above")
    with pytest.raises(ConfigError, match="compute capability >= 8.9"):
        notebook_launcher(_train, args=(1,), mixed_precision="fp8")


def _collectives() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator

    acc = Accelerator()
    rank, world = acc.process_index, acc.num_processes
    t = torch.arange(3, device=acc.device) + 10 * rank
    gathered = acc.gather(t)
    total = acc.reduce(t.float(), "sum")
    source = torch.full((2,), float(rank), device=acc.device)
    dist.broadcast(source, src=world - 1)
    ragged = torch.ones(rank + 1, device=acc.device)
    padded = acc.pad_across_processes(ragged)
    return {
        "backend": dist.get_backend(),
        "gathered": gathered.tolist(),
        "total": total.tolist(),
        "broadcast": source.tolist(),
        "padded": padded.shape[0],
        "objects": acc.gather_object([f"r{rank}"]),
    }


def test_nccl_collectives_across_two_gpus(two_gpus: int) -> None:
    results = notebook_launcher(_collectives, num_processes=2)
    for r in results:
        assert r["backend"] == "nccl"
        assert r["gathered"] == [0, 1, 2, 10, 11, 12]
        assert r["total"] == [10.0, 12.0, 14.0]
        assert r["broadcast"] == [1.0, 1.0]
        assert r["padded"] == 2
        assert r["objects"] == ["r0", "r1"]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_fsdp_across_two_gpus_trains_and_gathers_the_full_state(
    two_gpus: int, precision: str, capability: tuple[int, int]
) -> None:
    if precision == "fp8":
        pytest.importorskip("torchao")
        if capability < (8, 9):
            pytest.skip(f"compute capability {capability}: no float8 tensor cores")
    results = notebook_launcher(
        _train, args=(6, "full"), num_processes=2, mixed_precision=precision
    )
    for r in results:
        assert r["last"] < 0.5 * r["first"], r
    assert results[0]["full_state"] == [
        "0.bias",
        "0.weight",
        "2.bias",
        "2.weight",
        "4.bias",
        "4.weight",
    ]
    assert results[1]["full_state"] == []  # gathered whole on the main process only
