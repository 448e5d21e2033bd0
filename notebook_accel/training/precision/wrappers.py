"""What a prepared optimizer and scheduler are wrapped in: each steps through the precision
object (scaled steps; a skipped step does not advance the scheduler).
"""

from __future__ import annotations

from typing import Any

import torch

from ...private import torch as private_torch
from ..process import GradientState
from .modes import Precision

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler"]


class AcceleratedOptimizer(torch.optim.Optimizer):
    """An optimizer that steps and zeroes only on synchronising steps, through the precision.

    Attribute access falls through to the wrapped optimizer, so ``param_groups``, ``state``
    and ``state_dict()`` behave as the user's optimizer does.

    Example:
        >>> opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))  # doctest: +SKIP
        >>> opt.step_was_skipped  # doctest: +SKIP
        False
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, precision: Precision, gradients: GradientState
    ) -> None:
        # Deliberately no super().__init__: this object is a view over ``optimizer``.
        self.optimizer = optimizer
        self.precision = precision
        self.gradients = gradients
        self.step_was_skipped = False
        precision.track(optimizer)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks; guard against lookups before __init__.
        if name.startswith("__") or "optimizer" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["optimizer"], name)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Step on synchronising steps only; records ``step_was_skipped`` (fp16 overflow)."""
        if not self.gradients.sync_gradients:
            return
        self.step_was_skipped = not self.precision.step(self.optimizer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero gradients, except in the middle of an accumulation cycle."""
        if self.gradients.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def train(self) -> None:
        """The optimizer's train mode (schedule-free optimizers); a no-op for the others."""
        self._switch("train")

    def eval(self) -> None:
        """The optimizer's eval mode (schedule-free optimizers); a no-op for the others."""
        self._switch("eval")

    def _switch(self, mode: str) -> None:
        """Call the optimizer's ``mode()``; an optimizer an engine wrapped again (DeepSpeed's)
        is looked through once."""
        for target in (self.optimizer, getattr(self.optimizer, "optimizer", None)):
            switch = getattr(target, mode, None)
            if callable(switch):
                switch()
                return

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """An LR scheduler that steps with its optimizer(s), as accelerate's does.

    On a step where the optimizer really stepped, the schedule advances ``num_processes``
    times when each process has its own batches (the global batch is ``num_processes`` times
    the loader's, so a schedule sized from the unprepared loader ends on time) and once with
    ``split_batches``. Nothing happens mid-accumulation or when fp16 skipped the step. With
    ``step_with_optimizer=False`` each call steps the schedule once, unconditionally.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: list[AcceleratedOptimizer],
        num_processes: int = 1,
        split_batches: bool = False,
        step_with_optimizer: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.gradients = (
            optimizers[0].gradients if optimizers else GradientState(accumulation_steps=1)
        )
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule for one optimizer step (see the class docstring)."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradients.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        for _ in range(1 if self.split_batches else self.num_processes):
            total = getattr(self.scheduler, "total_steps", None)
            # OneCycleLR raises past its total_steps; a short last epoch can get there.
            if total is not None and private_torch.scheduler_step_count(self.scheduler) > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The learning rates of the last step."""
        return list(self.scheduler.get_last_lr())

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this wrapper lacks; guard against lookups before __init__.
        if name.startswith("__") or "scheduler" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["scheduler"], name)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
