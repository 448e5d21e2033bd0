"""The interface every parallelism implements; the Accelerator only talks to this.

    Accelerator.prepare(model)      -> strategy.prepare_model (after device and precision)
    Accelerator.prepare(optimizer)  -> strategy.prepare_optimizer (re-point at new params)
                                       strategy.wrap_optimizer (DummyOptim: DeepSpeed's only)
    Accelerator.prepare(scheduler)  -> strategy.wrap_scheduler (DummyScheduler: DeepSpeed's)
    Accelerator.backward(loss)      -> strategy.backward
    Accelerator.no_sync / accumulate-> strategy.no_sync(model)
    Accelerator.clip_grad_norm_     -> strategy.clip_grad_norm_ / strategy.grad_norm
    Accelerator.unwrap_model        -> strategy.unwrap
    get_state_dict / save_model     -> strategy.model_state_dict (whole, on the main process)
    save_state / load_state         -> strategy.checkpoint_parts (what goes through DCP, etc.)
    prepare(loader)                 -> strategy.data_rank / data_size
    Accelerator.end_training        -> strategy.end (what the strategy set up for itself)

A strategy owns what is specific to one way of spreading a model over processes; the
Accelerator keeps the prepared objects, the precision and the accumulation counters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from ...errors import ConfigError
from ..checkpoint.folder import Stateful
from ..precision.modes import Precision
from ..precision.wrappers import AcceleratedOptimizer, AcceleratedScheduler
from ..process import DistributedType, GradientState, ProcessState
from .dummies import DummyOptim, DummyScheduler

__all__ = ["CheckpointPart", "Strategy"]


class CheckpointPart(Protocol):
    """Models and optimizers a strategy checkpoints its own way, inside our atomic save."""

    def save(self, folder: Path) -> None:
        """Write this part into the staging ``folder`` (called on every rank)."""

    def load(self, folder: Path, trusted: bool = False) -> None:
        """Read this part from the checkpoint ``folder`` (called on every rank); unpickle
        only tensors and plain data unless ``trusted`` (the user's opt-in)."""


class Strategy:
    """How prepared models are spread over the job's processes.

    Subclasses override the hooks they change; the defaults are a single process's
    behaviour (no wrapper, local gradients, the whole state dict).

    Attributes:
        name: the strategy's short name (``"ddp"``, ``"fsdp"``...).
        state: the job's process facts.
    """

    name = "single"

    def __init__(self, state: ProcessState) -> None:
        self.state = state

    # ---- models and optimizers -----------------------------------------------------------
    def is_prepared(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` is already this strategy's wrapped/sharded model."""
        return False

    @property
    def keeps_parameters(self) -> bool:
        """Whether the Accelerator must re-point optimizers at parameters that moving a
        model to its device replaced (False when the strategy re-points them itself)."""
        return True

    @property
    def shards_parameters(self) -> bool:
        """Whether prepared models hold only a shard of each parameter (fp8's conversion
        needs to know)."""
        return False

    @property
    def scales_loss(self) -> bool:
        """Whether :meth:`backward` divides the loss by the accumulation steps itself
        (otherwise the Accelerator does before calling it)."""
        return False

    def begin_prepare(self, objects: Iterable[Any]) -> None:
        """Called with every object of a ``prepare()`` call before any is prepared (for
        strategies that build a model and its optimizer together).

        Raises:
            ConfigError: a ``DummyOptim``/``DummyScheduler`` (only DeepSpeed builds them).
        """
        for i, obj in enumerate(objects):
            if isinstance(obj, DummyOptim | DummyScheduler):
                raise ConfigError(
                    f"prepare() argument {i + 1}",
                    type(obj).__name__,
                    "a torch object: a dummy needs a DeepSpeedPlugin whose config has a "
                    f"{'optimizer' if isinstance(obj, DummyOptim) else 'scheduler'!r} section",
                )

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap or shard ``model`` (already on its device, with its precision's forward)."""
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Make ``optimizer`` step the parameters this strategy's models hold."""
        return optimizer

    def wrap_optimizer(
        self, optimizer: torch.optim.Optimizer, precision: Precision, gradients: GradientState
    ) -> AcceleratedOptimizer:
        """The optimizer object ``prepare`` hands back (it steps on synchronising steps)."""
        return AcceleratedOptimizer(optimizer, precision, gradients)

    def wrap_scheduler(
        self, scheduler: Any, optimizers: list[AcceleratedOptimizer], **options: Any
    ) -> AcceleratedScheduler:
        """The LR scheduler ``prepare`` hands back (``options``: AcceleratedScheduler's)."""
        return AcceleratedScheduler(scheduler, optimizers, **options)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside this strategy's wrapper."""
        return model

    # ---- training step -------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, precision: Precision, **kwargs: Any) -> None:
        """Back-propagate ``loss`` (already divided for accumulation) through ``precision``."""
        precision.backward(loss, **kwargs)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Keep gradients local inside the block (accumulation's micro-batches)."""
        yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Synchronise gradients in the block's backward though its forward ran under
        :meth:`no_sync` (a no-op where the strategy has nothing to arm)."""
        yield

    def grad_norm(self, grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
        """The norm of ``grads`` over the whole model (the same on every rank)."""
        return torch.nn.utils.get_total_norm(grads, norm_type)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip the gradients of ``parameters`` to ``max_norm``; return their norm."""
        params = list(parameters)
        norm = self.grad_norm([p.grad for p in params if p.grad is not None], norm_type)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm

    # ---- state ----------------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The whole state dict of the user's module (of the wrapper with ``unwrap=False``),
        on the main process at least.

        A collective for strategies that gather shards: call it on every rank.
        """
        return (self.unwrap(model) if unwrap else model).state_dict()

    def checkpoint_parts(
        self, objects: Stateful, directory: str | os.PathLike[str] | None = None
    ) -> tuple[Stateful, CheckpointPart | None]:
        """Split ``objects`` into what ``checkpoint/folder.py`` writes as plain files and the part
        this strategy writes itself (``None``: everything is plain files).

        ``directory`` is the checkpoint about to be loaded (``None`` when saving). By
        default a checkpoint saved sharded (through DCP) is read through DCP too, so that
        a job without sharding loads what a sharded one saved.
        """
        from ..checkpoint import sharded as checkpoint_sharded

        return checkpoint_sharded.split(objects, directory)

    # ---- data -----------------------------------------------------------------------------
    @property
    def data_rank(self) -> int:
        """Which share of the data this process reads."""
        return self.state.rank

    @property
    def data_size(self) -> int:
        """Into how many shares the data is split."""
        return self.state.world_size

    def data_state(self) -> ProcessState:
        """The process facts a data loader shards by: the data-parallel rank and size in
        place of the global ones (ranks that share a data-parallel rank read the same
        batches)."""
        rank, size = self.data_rank, self.data_size
        if (rank, size) == (self.state.rank, self.state.world_size):
            return self.state
        return dataclasses.replace(self.state, rank=rank, world_size=size)

    @property
    def distributed_type(self) -> DistributedType:
        """What ``Accelerator.distributed_type`` reports (the process's kind here; FSDP and
        DeepSpeed report themselves, as accelerate's do)."""
        return self.state.distributed_type

    @property
    def device_mesh(self) -> Any:
        """The ``DeviceMesh`` a ``parallelism_config`` made (``torch_device_mesh``), else None."""
        return None

    # ---- end ------------------------------------------------------------------------------
    def end(self) -> None:
        """Release what the strategy set up for itself (``end_training``); nothing here."""
