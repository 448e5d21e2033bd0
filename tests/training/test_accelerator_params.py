"""prepare() keeps optimizers on the model's parameters when moving the model replaces them.

On XLA, ``Module.to(device)`` makes new Parameter objects; on CPU torch's
``overwrite_module_params_on_conversion`` flag does the same, which lets this run anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from notebook_accel import Accelerator


@pytest.fixture
def params_replaced_on_move() -> Iterator[None]:
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)


def _step(acc: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    acc.backward(model(torch.ones(4, 3)).pow(2).sum())
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("together", [True, False], ids=["one-call", "optimizer-first"])
def test_optimizer_steps_the_parameters_the_model_has_after_prepare(
    params_replaced_on_move: None, together: bool
) -> None:
    torch.manual_seed(0)
    acc = Accelerator()
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    originals = list(model.parameters())
    before = [p.detach().clone() for p in originals]
    if together:
        model, opt = acc.prepare(model, opt)
    else:
        opt = acc.prepare(opt)
        model = acc.prepare(model)
    current = list(model.parameters())
    assert all(o is not c for o, c in zip(originals, current, strict=True))  # really replaced
    _step(acc, model, opt)
    _step(acc, model, opt)
    stepped = [p for group in opt.param_groups for p in group["params"]]
    assert all(any(p is c for c in current) for p in stepped)
    assert all(not torch.equal(b, c.detach()) for b, c in zip(before, current, strict=True))
    assert all(id(p) in {id(c) for c in current} for p in opt.optimizer.state)
