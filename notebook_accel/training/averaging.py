"""LocalSGD (accelerate's ``accelerate.local_sgd.LocalSGD``): train apart, average every K steps.

    with LocalSGD(accelerator, model, local_sgd_steps=K) as local_sgd:   no_sync(model) entered
        for batch in loader:
            ... backward, optimizer.step() ...                           gradients stay local
            local_sgd.step()            every K-th call: all ranks average their parameters
                                                                         on exit: once more

Reached as ``notebook_accel.local_sgd.LocalSGD`` (the ported import's path).
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError
from . import collectives
from .process import DistributedType

if TYPE_CHECKING:
    from .accelerator import Accelerator

__all__ = ["LocalSGD"]


class LocalSGD:
    """Run ``local_sgd_steps`` optimizer steps on each process alone, then average the weights.

    Inside the block the model's gradients are not all-reduced (the model's ``no_sync``);
    each :meth:`step` counts one update, and every ``local_sgd_steps``-th one replaces every
    parameter with its mean over the processes. Leaving the block averages once more, so the
    ranks leave it with equal weights. In one process it does nothing.

    Args:
        accelerator: the job's :class:`~notebook_accel.Accelerator`.
        model: the prepared model whose parameters are averaged.
        local_sgd_steps: updates between two averagings (an int >= 1; unused when disabled).
        enabled: ``False`` makes the block and :meth:`step` do nothing.

    Raises:
        NotImplementedError: the model is sharded (FSDP, tensor parallel) or trained with
            DeepSpeed, as accelerate refuses (only data-parallel replicas can be averaged).

    Example:
        >>> with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:  # doctest: +SKIP
        ...     for x, y in loader:
        ...         accelerator.backward(loss_fn(model(x), y))
        ...         optimizer.step()
        ...         optimizer.zero_grad()
        ...         local_sgd.step()
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
    ) -> None:
        from .accelerator import shards_parameters

        if accelerator.deepspeed_plugin is not None or shards_parameters(accelerator):
            raise NotImplementedError(
                "LocalSGD is supported only for data-parallel replicas on CPUs and GPUs "
                "(no DeepSpeed, FSDP or tensor parallelism)"
            )
        self.enabled = bool(enabled) and accelerator.distributed_type != DistributedType.NO
        if self.enabled and (
            isinstance(local_sgd_steps, bool)
            or not isinstance(local_sgd_steps, int)
            or local_sgd_steps < 1
        ):
            raise ConfigError("local_sgd_steps", local_sgd_steps, "an int >= 1")
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync = contextlib.ExitStack()

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self.enabled:
            return
        try:
            if kind is None:  # after an error the other ranks may never reach the average
                self._average()
        finally:
            self._no_sync.close()

    def step(self) -> None:
        """Count one update; average the parameters across processes every K-th call."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    @torch.no_grad()
    def _average(self) -> None:
        """Every parameter := its mean over the processes (in place: optimizers keep it)."""
        self.accelerator.wait_for_everyone()
        for param in self.model.parameters():
            param.copy_(collectives.reduce(param.detach(), reduction="mean"))
