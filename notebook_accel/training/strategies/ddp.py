"""Data parallelism with torch's DistributedDataParallel (and a single process's no-op).

prepare(model)  -> DistributedDataParallel(model, **ddp_kwargs) when the job has more
                   than one process and the model trains; the handler's comm hook
no_sync         -> DDP's own no_sync (no all-reduce in the backward)
state dict      -> the wrapped module's, whole on every rank
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from ..handlers import DistributedDataParallelKwargs
from ..process import ProcessState
from .base import Strategy

__all__ = ["DdpStrategy"]


class DdpStrategy(Strategy):
    """Replicate each model; all-reduce gradients in the backward.

    Args:
        state: the job's process facts.
        ddp_kwargs: ``DistributedDataParallel``'s keyword arguments.
        handler: the user's ``DistributedDataParallelKwargs`` (for its communication hook).

    Example:
        >>> strategy = DdpStrategy(accelerator.state, {})  # doctest: +SKIP
        >>> model = strategy.prepare_model(model)  # doctest: +SKIP
    """

    name = "ddp"

    def __init__(
        self,
        state: ProcessState,
        ddp_kwargs: dict[str, Any],
        handler: DistributedDataParallelKwargs | None = None,
    ) -> None:
        super().__init__(state)
        self.ddp_kwargs = ddp_kwargs
        self.handler = handler

    def is_prepared(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is a DDP wrapper."""
        return isinstance(model, DistributedDataParallel)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap in DDP when a process group joins several ranks and some parameter trains.

        Without a group (XLA devices driven as threads of one process) there is no DDP: the
        optimizer step averages the gradients there.
        """
        if not self.state.has_group or not any(p.requires_grad for p in model.parameters()):
            return model
        device = self.state.device
        ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids, **self.ddp_kwargs)
        if self.handler is not None:
            self.handler.register_comm_hook(wrapped)
        return wrapped

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module inside a DDP wrapper."""
        return model.module if isinstance(model, DistributedDataParallel) else model

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """DDP's ``no_sync``; nothing for an unwrapped model."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        with model.no_sync():
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """All-reduce in the next backward though its forward ran under ``no_sync``."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved = (model.require_backward_grad_sync, model.require_forward_param_sync)
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        # A forward under no_sync skipped this: arm the reducer so the backward all-reduces.
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved
