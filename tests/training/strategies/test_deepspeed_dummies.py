"""DummyOptim/DummyScheduler: a DeepSpeed config's optimizer and scheduler sections through
``prepare`` (2 real processes, gloo, ZeRO-2), as deepspeed_with_config_support.py uses them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from notebook_accel import debug_launcher
from notebook_accel.errors import ConfigError

pytest.importorskip("deepspeed")

LR, DECAY, WARMUP = 0.01, 0.1, 4
SECTIONS = {
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
}


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    # the example's grouping: no weight decay on biases
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not n.endswith("bias")], "weight_decay": DECAY},
        {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0},
    ]


def _run(dummy: bool, scheduler: bool) -> dict[str, Any]:
    from notebook_accel import Accelerator, DeepSpeedPlugin
    from notebook_accel.utils import DummyOptim, DummyScheduler

    config: dict[str, Any] = {"optimizer": SECTIONS["optimizer"]} if dummy else {}
    if scheduler:
        config["scheduler"] = SECTIONS["scheduler"]
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, hf_ds_config=config))
    model = _model()
    # the example's test: a DummyOptim where the config has an optimizer section
    assert dummy == ("optimizer" in acc.state.deepspeed_plugin.deepspeed_config)
    if dummy:
        opt: Any = DummyOptim(_groups(model), lr=LR, weight_decay=DECAY)
    else:
        opt = torch.optim.AdamW(_groups(model), lr=LR, weight_decay=DECAY)
    objects: list[Any] = [model, opt]
    if scheduler:
        objects.append(DummyScheduler(opt, warmup_num_steps=WARMUP))
    prepared = acc.prepare(*objects)
    model, opt = prepared[0], prepared[1]
    g = torch.Generator().manual_seed(acc.process_index)
    lrs = []
    for _ in range(6):
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        acc.backward(F.mse_loss(model(x), y))
        opt.step()
        if scheduler:
            prepared[2].step()  # a no-op: the engine stepped it
            lrs.append(prepared[2].get_last_lr()[0])
        opt.zero_grad()
    weights = [t.float() for t in acc.get_state_dict(model).values()]
    return {
        "weights": weights,
        "lrs": lrs,
        "group_lr": opt.param_groups[0]["lr"],
        "kind": type(opt.optimizer).__name__,
    }


def _errors() -> dict[str, str]:
    from notebook_accel import Accelerator, DeepSpeedPlugin
    from notebook_accel.utils import DummyOptim, DummyScheduler

    found = {}
    cases: dict[str, tuple[dict[str, Any], bool, bool]] = {
        "dummy without a section": ({}, True, False),
        "torch optimizer with a section": ({"optimizer": SECTIONS["optimizer"]}, False, False),
        "dummy scheduler without a section": ({"optimizer": SECTIONS["optimizer"]}, True, True),
    }
    for name, (config, dummy, with_scheduler) in cases.items():
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, hf_ds_config=config))
        model = _model()
        opt: Any = DummyOptim(model.parameters()) if dummy else torch.optim.SGD(model.parameters())
        objects: list[Any] = [model, opt]
        if with_scheduler:
            objects.append(DummyScheduler(opt))
        try:
            acc.prepare(*objects)
            found[name] = "accepted"
        except ConfigError as err:
            found[name] = err.parameter
    return found


def _resume(folder: str) -> tuple[list[float], list[float]]:
    """Save after 3 steps, run 3 more, load, run them again: (losses+lrs) both times."""
    from notebook_accel import Accelerator, DeepSpeedPlugin
    from notebook_accel.utils import DummyOptim, DummyScheduler

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, hf_ds_config=SECTIONS))
    model = _model()
    opt = DummyOptim(_groups(model), lr=LR, weight_decay=DECAY)
    model, opt, sched = acc.prepare(model, opt, DummyScheduler(opt, warmup_num_steps=WARMUP))
    g = torch.Generator().manual_seed(acc.process_index)
    batches = [(torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)) for _ in range(6)]

    def run(part: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
        seen = []
        for x, y in part:
            loss = F.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            seen += [float(loss.detach()), sched.get_last_lr()[0]]
        return seen

    run(batches[:3])
    acc.save_state(folder)
    first = run(batches[3:])
    acc.load_state(folder)
    return first, run(batches[3:])


def _other_schedules() -> dict[str, Any]:
    """A scheduler from lr_scheduler_callable; WarmupDecayLR's total steps per process."""
    from notebook_accel import Accelerator, DeepSpeedPlugin
    from notebook_accel.utils import DummyOptim, DummyScheduler

    out: dict[str, Any] = {}
    plugin = DeepSpeedPlugin(zero_stage=2, hf_ds_config={"optimizer": SECTIONS["optimizer"]})
    acc = Accelerator(deepspeed_plugin=plugin)
    model = _model()
    opt = DummyOptim(model.parameters(), lr=LR)

    def halving(optimizer: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)

    model, opt, sched = acc.prepare(model, opt, DummyScheduler(opt, lr_scheduler_callable=halving))
    lrs = []
    for _ in range(3):
        acc.backward(model(torch.ones(2, 6)).sum())
        lrs.append(sched.get_last_lr()[0])
    out["callable"] = lrs
    decay = {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    }
    config = {"optimizer": SECTIONS["optimizer"], "scheduler": decay}
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, hf_ds_config=config))
    model = _model()
    opt = DummyOptim(model.parameters(), lr=LR)
    dummy = DummyScheduler(opt, total_num_steps=11, warmup_num_steps=2)
    model, opt, sched = acc.prepare(model, opt, dummy)
    out["decay"] = (sched.scheduler.total_num_steps, sched.scheduler.warmup_num_steps)
    return out


def _all(folder: str) -> dict[str, Any]:
    return {
        "torch": _run(dummy=False, scheduler=False),
        "dummy": _run(dummy=True, scheduler=False),
        "scheduled": _run(dummy=True, scheduler=True),
        "errors": _errors(),
        "resume": _resume(folder),
        "schedules": _other_schedules(),
    }


def test_config_sections_build_the_optimizer_and_scheduler_on_two_processes(
    tmp_path: Path,
) -> None:
    from deepspeed.runtime.lr_schedules import WarmupLR

    # the reference schedule: DeepSpeed's own WarmupLR over a plain optimizer, 6 steps
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    warmup = WarmupLR(reference, warmup_min_lr=0, warmup_max_lr=LR, warmup_num_steps=WARMUP)
    expected = []
    for _ in range(6):
        warmup.step()
        expected.append(warmup.get_last_lr()[0])
    for result in debug_launcher(_all, (str(tmp_path / "ckpt"),), num_processes=2):
        torch_run, dummy, scheduled = result["torch"], result["dummy"], result["scheduled"]
        assert dummy["kind"] == "AdamW" and dummy["group_lr"] == LR  # "auto" filled from it
        for ours, ref in zip(dummy["weights"], torch_run["weights"], strict=True):
            assert torch.equal(ours, ref)
        assert scheduled["lrs"] == pytest.approx(expected)
        assert scheduled["group_lr"] == pytest.approx(expected[-1])
        assert not all(
            torch.equal(a, b) for a, b in zip(scheduled["weights"], dummy["weights"], strict=True)
        )
        # the callable's StepLR halves at each engine step; 11 steps over 2 processes: 6 each
        assert result["schedules"]["callable"] == [LR / 2, LR / 4, LR / 8]
        assert result["schedules"]["decay"] == (6, 2)
        first, again = result["resume"]  # load_state restores weights, optimizer, schedule
        assert first == again
        assert result["errors"] == {
            "dummy without a section": "prepare(optimizer)",
            "torch optimizer with a section": "prepare(optimizer)",
            "dummy scheduler without a section": "prepare(scheduler)",
        }


def test_dummies_without_deepspeed_are_refused_before_anything_is_prepared() -> None:
    from notebook_accel import Accelerator
    from notebook_accel.utils import DummyOptim, DummyScheduler

    acc = Accelerator()
    model = torch.nn.Linear(2, 2)
    opt = DummyOptim(model.parameters())
    with pytest.raises(ConfigError, match=r"prepare\(\) argument 2") as err:
        acc.prepare(model, opt)
    assert "'optimizer' section" in err.value.accepted
    with pytest.raises(ConfigError, match=r"prepare\(\) argument 1"):
        acc.prepare(DummyScheduler(opt))
    assert acc._objects.model == []
