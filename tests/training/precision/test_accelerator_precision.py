"""Mixed precision objects: copies of prepared models, fp16 with several optimizers, options.

bf16 runs on the CPU through torch's CPU autocast, fp16 through its CPU GradScaler; the DDP
cases run on 2 real gloo processes.
"""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import torch

from notebook_accel import GradScalerKwargs, debug_launcher


def _bf16_reference(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What a Linear computes under CPU bf16 autocast, back in float32."""
    w, b = model.weight, model.bias
    return torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16()).float()


def _copies_of_a_prepared_model() -> dict[str, Any]:
    """Deep copies and pickles of a bf16-prepared Linear (DDP-wrapped on several processes)."""
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    r: dict[str, Any] = {"wrapper": type(model).__name__}

    ema = copy.deepcopy(model)  # an EMA copy, then set to zero weights
    with torch.no_grad():
        for p in ema.parameters():
            p.zero_()
    r["ema_out"], r["model_out"] = ema(x), model(x)

    def reloaded(obj: torch.nn.Module) -> torch.nn.Module:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)  # type: ignore[no-any-return]

    inner = acc.unwrap_model(model)
    for name, made in (
        ("pickled", pickle.loads(pickle.dumps(model))),
        ("saved", reloaded(model)),
        ("saved_inner", reloaded(inner)),
        ("copied_inner", copy.deepcopy(inner)),
    ):
        out = made(x)
        r[name] = (out.dtype, torch.equal(out, _bf16_reference(acc.unwrap_model(made), x)))
        with torch.no_grad():  # the copy has its own weights: changing them changes its output
            for p in made.parameters():
                p.add_(1.0)
        r[name + "_own"] = not torch.equal(made(x), model(x))
    r["reference"] = torch.equal(r["model_out"], _bf16_reference(inner, x))

    # Stripping the autocast forward still works, and only on the object it is asked of.
    twin = copy.deepcopy(inner)
    plain = acc.unwrap_model(twin, keep_fp32_wrapper=False)
    r["plain_dtype"] = plain(x).dtype
    with acc.autocast():
        r["plain_autocast_dtype"] = plain(x).dtype
    r["inner_still_wrapped"] = inner(x).dtype == torch.float32 and torch.equal(
        inner(x), _bf16_reference(inner, x)
    )
    return r


def _check_copies(r: dict[str, Any]) -> None:
    assert torch.count_nonzero(r["ema_out"]) == 0  # the copy ran its own (zero) weights
    assert torch.count_nonzero(r["model_out"]) > 0 and r["reference"]
    for name in ("pickled", "saved", "saved_inner", "copied_inner"):
        assert r[name] == (torch.float32, True), name  # still under autocast, float32 out
        assert r[name + "_own"], name
    assert r["plain_dtype"] == torch.float32  # no autocast: plain float32 arithmetic
    assert r["plain_autocast_dtype"] == torch.bfloat16
    assert r["inner_still_wrapped"]


def test_copies_of_a_prepared_bf16_model_run_themselves() -> None:
    r = _copies_of_a_prepared_model()
    assert r["wrapper"] == "Linear"
    _check_copies(r)


def test_copies_of_a_ddp_wrapped_bf16_model_run_themselves() -> None:
    for r in debug_launcher(_copies_of_a_prepared_model, num_processes=2):
        assert r["wrapper"] == "DistributedDataParallel"
        _check_copies(r)


def test_fp16_two_optimizers_with_clipping_unscale_each_once() -> None:
    from notebook_accel.training.accelerator import Accelerator

    # growth_interval=1: the scale doubles at every update(), so it counts the updates.
    handler = GradScalerKwargs(init_scale=16.0, growth_interval=1)
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[handler])
    assert acc.scaler is not None and acc.scaler.get_scale() == 16.0
    a, b = acc.prepare(torch.nn.Linear(3, 1), torch.nn.Linear(3, 1))
    opt_a = acc.prepare(torch.optim.SGD(a.parameters(), lr=1.0))
    opt_b = acc.prepare(torch.optim.SGD(b.parameters(), lr=1.0))
    x = torch.ones(1, 3)
    scales, grads = [], []
    for _ in range(3):
        acc.backward(a(x).sum() + b(x).sum())
        acc.clip_grad_norm_([*a.parameters(), *b.parameters()], max_norm=1e9)
        opt_a.step()
        opt_b.step()
        # d(sum)/d(weight) is x (ones): the gradients the optimizers used, once unscaled.
        grads.append((a.weight.grad.tolist(), b.weight.grad.tolist()))  # type: ignore[union-attr]
        opt_a.zero_grad()
        opt_b.zero_grad()
        scales.append(acc.scaler.get_scale())
    assert grads == [([[1.0] * 3], [[1.0] * 3])] * 3
    assert scales == [32.0, 64.0, 128.0]  # one update per iteration, not per optimizer
    assert not acc.optimizer_step_was_skipped

    # Alternating updates (a GAN's pattern): b steps every other iteration only.
    for i in range(4):
        acc.backward(a(x).sum() + b(x).sum())
        acc.clip_grad_norm_([*a.parameters(), *b.parameters()], max_norm=1e9)
        opt_a.step()
        if i % 2:
            opt_b.step()
            assert b.weight.grad.tolist() == [[1.0] * 3]  # type: ignore[union-attr]
        assert a.weight.grad.tolist() == [[1.0] * 3]  # type: ignore[union-attr]
        opt_a.zero_grad()
        opt_b.zero_grad()
    assert acc.scaler.get_scale() == 2 ** (7 + 4)

    # unscale_gradients takes a list too (accelerate's signature); twice is still once.
    acc.backward(a(x).sum() + b(x).sum())
    acc.unscale_gradients([opt_a, opt_b])
    acc.unscale_gradients(opt_b)
    assert a.weight.grad.tolist() == b.weight.grad.tolist() == [[1.0] * 3]  # type: ignore[union-attr]


def test_fp16_overflow_is_reported_per_optimizer() -> None:
    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=8.0)])
    a, b = acc.prepare(torch.nn.Linear(2, 1), torch.nn.Linear(2, 1))
    opt_a = acc.prepare(torch.optim.SGD(a.parameters(), lr=1.0))
    opt_b = acc.prepare(torch.optim.SGD(b.parameters(), lr=1.0))
    acc.backward(a(torch.ones(1, 2)).sum() * float("inf") + b(torch.ones(1, 2)).sum())
    before = b.weight.detach().clone()
    opt_a.step()
    opt_b.step()
    assert opt_a.step_was_skipped and not opt_b.step_was_skipped
    assert not torch.equal(b.weight, before)
    assert acc.optimizer_step_was_skipped and acc.scaler is not None
    assert acc.scaler.get_scale() == 4.0  # one overflow: backed off once


def test_a_prepared_model_is_freed_without_the_garbage_collector() -> None:
    import gc
    import weakref

    from notebook_accel.training.accelerator import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare_model(torch.nn.Linear(2, 2))
    probe = weakref.ref(model)
    gc.disable()
    try:
        model = acc.free_memory(model)[0]
        assert probe() is None  # no module <-> forward cycle keeps its memory
    finally:
        gc.enable()
