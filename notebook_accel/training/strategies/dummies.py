"""DummyOptim and DummyScheduler (accelerate's names): stand-ins for the optimizer and LR
scheduler a DeepSpeed config's ``"optimizer"``/``"scheduler"`` sections describe.

    optimizer = DummyOptim(model.parameters(), lr=3e-4, weight_decay=0.01)
    scheduler = DummyScheduler(optimizer, total_num_steps=1000, warmup_num_steps=100)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        -> deepspeed.initialize(model, model_parameters=the dummy's params, config with the
           sections' "auto" values filled from the dummies)  (strategies/deepspeed.py)
        <- the engine's optimizer and scheduler, wrapped (their step() is the engine's)

Outside DeepSpeed, preparing one is a ConfigError (there is nothing to build it from).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

__all__ = ["DummyOptim", "DummyScheduler", "parameters_of"]


class DummyOptim:
    """The optimizer of a DeepSpeed config's ``"optimizer"`` section, before ``prepare``.

    Args:
        params: the parameters (or parameter groups, dicts with ``"params"``) to optimize.
        lr: fills the section's ``params.lr`` where it is ``"auto"``.
        weight_decay: fills the section's ``params.weight_decay`` where it is ``"auto"``.
        **kwargs: kept, unused (accelerate's signature).

    Example:
        >>> opt = DummyOptim(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
        >>> opt.lr
        0.001
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.001,
        weight_decay: float = 0,
        **kwargs: Any,
    ) -> None:
        self.params = list(params)  # a generator must survive being read twice
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """The LR scheduler of a DeepSpeed config's ``"scheduler"`` section, before ``prepare``.

    Args:
        optimizer: the :class:`DummyOptim` it schedules.
        total_num_steps: fills ``params.total_num_steps`` where ``"auto"`` (divided by the
            processes unless ``split_batches``, as accelerate does).
        warmup_num_steps: fills ``params.warmup_num_steps`` where ``"auto"``.
        lr_scheduler_callable: without a ``"scheduler"`` section, builds the scheduler from
            DeepSpeed's optimizer (``callable(optimizer)``).
        **kwargs: kept, unused (accelerate's signature).
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[torch.optim.Optimizer], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


def parameters_of(optimizer: Any) -> Iterator[torch.Tensor]:
    """The tensors a torch optimizer or a :class:`DummyOptim` would step."""
    groups = optimizer.params if isinstance(optimizer, DummyOptim) else optimizer.param_groups
    for group in groups:
        if isinstance(group, dict):
            yield from group["params"]
        else:
            yield group
