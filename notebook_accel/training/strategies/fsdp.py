"""Fully sharded data parallelism (FSDP2) as a strategy, over ``fsdp.Sharder``.

prepare(model)      -> Sharder.shard (fully_shard bottom-up, then the root)
prepare(optimizer)  -> Sharder.repoint (param_groups point at the DTensor shards)
no_sync             -> no reduce-scatter, no reshard after backward
clipping            -> the DTensor norm made global, then clipped
state dict          -> gathered whole on the main process (a collective)
checkpoints         -> models and optimizers through DCP (``checkpoint_sharded``)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from ...options.fsdp import FsdpConfig
from ..process import DistributedType, ProcessState
from . import sharder as fsdp2
from .base import Strategy

__all__ = ["FsdpStrategy"]


class FsdpStrategy(Strategy):
    """Shard each model's parameters, gradients and optimizer state across the processes.

    Raises:
        ConfigError: a single process, or a hybrid mesh the job's size does not allow.

    Example:
        >>> strategy = FsdpStrategy(accelerator.state, FsdpConfig())  # doctest: +SKIP
    """

    name = "fsdp"

    def __init__(self, state: ProcessState, config: FsdpConfig) -> None:
        super().__init__(state)
        self.config = config
        self.sharder = fsdp2.Sharder(config, state)

    def is_prepared(self, model: torch.nn.Module) -> bool:
        """Whether ``model`` went through ``fully_shard``."""
        return fsdp2.is_sharded(model)

    @property
    def keeps_parameters(self) -> bool:
        """False: :meth:`prepare_optimizer` re-points optimizers by parameter name."""
        return False

    @property
    def shards_parameters(self) -> bool:
        """True: each rank holds a shard of every parameter."""
        return True

    @property
    def distributed_type(self) -> DistributedType:
        """FSDP, as accelerate's Accelerator reports it."""
        return DistributedType.FSDP

    @property
    def device_mesh(self) -> DeviceMesh:
        """The sharding mesh (``("dp_shard",)``, or ``("dp_replicate", "dp_shard")`` for
        HSDP: accelerate's names)."""
        return self.sharder.mesh

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``fully_shard`` the model (its submodules first, by the config's wrap policy)."""
        return self.sharder.shard(model)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point the optimizer at the sharded parameters (their state cut to the shard)."""
        self.sharder.repoint(optimizer)
        return optimizer

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Accumulate locally: no reduce-scatter, gathered weights kept."""
        with fsdp2.no_sync(model):
            yield

    def grad_norm(self, grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
        """The norm over every shard (DTensor partial norms reduced)."""
        return fsdp2.total_norm(grads, norm_type)

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The unsharded state dict on the main process (``{}`` elsewhere); every rank calls."""
        if fsdp2.is_sharded(model):
            return fsdp2.full_state_dict(model)
        return super().model_state_dict(model, unwrap)
