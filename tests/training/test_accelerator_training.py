"""Equivalence tests on real processes (gloo): data parallelism, accumulation, precision.

Each launch groups several checks, since a launch costs about a second. The single-process
references run in the test process itself (no environment variables: world size 1).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher


def make_dataset(n: int = 48) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.randn(6, 2, generator=g) + 0.1 * torch.randn(n, 2, generator=g)
    return TensorDataset(x, y, torch.arange(n))


def make_model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def train(batch_size: int, epochs: int, accumulation: int = 1, probe: bool = False) -> dict:
    """Train with a shuffled loader; return weights, the global data order and probes."""
    from notebook_accel.seeding import set_seed
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(gradient_accumulation_steps=accumulation)
    set_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # A generator of its own: the same order on 1 and 2 processes. (Without one, accelerate's
    # order, which ours keeps, differs: one process draws the shuffle's seed at each epoch,
    # several draw it once at prepare.)
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(make_dataset(), batch_size=batch_size, shuffle=True, generator=generator)
    model, opt, loader = acc.prepare(model, opt, loader)
    hook_calls = [0]
    if probe:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # No annotations: DDP rejects any but the real GradBucket class, and this module's
        # ``from __future__ import annotations`` would turn that into a string.
        def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
            hook_calls[0] += 1
            return default_hooks.allreduce_hook(None, bucket)

        model.register_comm_hook(None, counting_hook)
    seen, grads_agree = [], []
    for _ in range(epochs):
        for x, y, idx in loader:
            with acc.accumulate(model):
                acc.backward(F.mse_loss(model(x), y))
                if probe:
                    grad = next(model.parameters()).grad.detach().clone()
                    both = acc.gather(grad[None])
                    grads_agree.append((acc.sync_gradients, bool(torch.equal(both[0], both[1]))))
                opt.step()
                opt.zero_grad()
            seen.append(acc.gather(idx).tolist())
    weights = [p.detach().clone() for p in acc.unwrap_model(model).parameters()]
    return {"weights": weights, "seen": seen, "hook_calls": hook_calls[0], "grads": grads_agree}


def _parallel_runs() -> dict:
    return {"ddp": train(4, 2), "accumulate": train(2, 2, accumulation=4, probe=True)}


def test_data_parallel_and_accumulation_equivalence() -> None:
    ranks = debug_launcher(_parallel_runs, num_processes=2)
    ref = train(8, 2)  # 1 process, batch 2b
    big = train(16, 2)  # 1 process, one batch of 4 micro-batches x 2 ranks x 2
    for result in ranks:
        # data parallel: 2 x batch 4 == 1 x batch 8, same samples at every step
        assert result["ddp"]["seen"] == ref["seen"]
        for mine, theirs in zip(result["ddp"]["weights"], ref["weights"], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
        # accumulation: 4 micro-batches (of 2 per rank) == one batch of 16
        for mine, theirs in zip(result["accumulate"]["weights"], big["weights"], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    acc = ranks[0]["accumulate"]
    syncs = [sync for sync, _ in acc["grads"]]
    assert syncs == [False, False, False, True] * 6
    # the all-reduce ran only on synchronising micro-steps (one bucket for this small model)...
    assert acc["hook_calls"] == 6
    # ...so ranks' gradients differ until the synchronising step, then agree.
    assert all(agree == sync for sync, agree in acc["grads"])
    # every sample once per epoch, the two ranks never sharing a batch
    epoch = [i for step in ranks[0]["ddp"]["seen"][:6] for i in step]
    assert sorted(epoch) == list(range(48))
    assert ranks[0]["ddp"]["seen"][:6] != ranks[0]["ddp"]["seen"][6:]  # reshuffled per epoch


def _precision_runs() -> dict:
    from notebook_accel.training.accelerator import Accelerator

    out: dict[str, Any] = {}
    for requested in (None, "fp16"):  # None: the launcher's choice (bf16 here)
        acc = Accelerator(mixed_precision=requested)
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        loader = DataLoader(make_dataset(), batch_size=4, shuffle=True)
        model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
        losses, dtypes = [], set()
        for _ in range(5):
            for x, y, _idx in loader:
                with acc.autocast():
                    dtypes.add((x @ x.T).dtype)
                out_ = model(x)
                loss = F.mse_loss(out_, y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
                losses.append(acc.reduce(loss.detach(), "mean").item())
        record = {
            "precision": acc.mixed_precision,
            "first": sum(losses[:6]) / 6,
            "last": sum(losses[-6:]) / 6,
            "autocast_dtypes": sorted(str(d) for d in dtypes),
            "output_dtype": str(out_.dtype),
            "has_scaler": acc.scaler is not None,
        }
        if acc.scaler is not None:
            # An overflowing step must be skipped, reported, and not move weights or the LR.
            before = [p.detach().clone() for p in model.parameters()]
            lr = sched.get_last_lr()
            x, y, _ = next(iter(loader))
            acc.backward(F.mse_loss(model(x), y) * float("inf"))
            opt.step()
            sched.step()
            opt.zero_grad()
            record["skipped"] = acc.optimizer_step_was_skipped
            record["unchanged"] = all(
                torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
            )
            record["lr_kept"] = sched.get_last_lr() == lr
        out[requested or "launcher"] = record
    return out


def test_mixed_precision_on_cpu() -> None:
    ranks = debug_launcher(_precision_runs, num_processes=2, mixed_precision="bf16")
    bf16, fp16 = ranks[0]["launcher"], ranks[0]["fp16"]
    assert bf16["precision"] == "bf16"  # the launcher's mixed_precision reached the workers
    assert bf16["autocast_dtypes"] == ["torch.bfloat16"]
    assert bf16["output_dtype"] == "torch.float32"  # outputs come back in float32
    assert bf16["last"] < 0.5 * bf16["first"]
    assert not bf16["has_scaler"]
    assert fp16["precision"] == "fp16" and fp16["has_scaler"]
    assert fp16["autocast_dtypes"] == ["torch.float16"]
    assert fp16["last"] < 0.5 * fp16["first"]
    assert fp16["skipped"] and fp16["unchanged"] and fp16["lr_kept"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_with_scaler_on_cuda() -> None:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(mixed_precision="fp16")
    assert acc.device.type == "cuda" and acc.scaler is not None
    torch.manual_seed(0)
    model = acc.prepare(make_model())
    opt = acc.prepare(torch.optim.Adam(model.parameters(), lr=1e-2))
    loader = acc.prepare(DataLoader(make_dataset(), batch_size=8, shuffle=True))
    losses = []
    for _ in range(10):
        for x, y, _idx in loader:
            assert x.device.type == "cuda"
            loss = F.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    assert sum(losses[-6:]) < 0.5 * sum(losses[:6])
