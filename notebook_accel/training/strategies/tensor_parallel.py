"""Tensor parallelism (torch's ``parallelize_module``), alone or with FSDP2 on a 2-D mesh,
or with HSDP (replicas of FSDP2 shards) on a 3-D mesh.

prepare(model)      -> rank 0's weights broadcast, then parallelize_module with the plan:
                       ParallelismConfig.tp_plan, else ``model.tp_plan``, else a
                       transformers model's ``config.base_model_tp_plan`` (applied to
                       ``model.base_model``); "colwise"/"rowwise" -> Colwise/RowwiseParallel
prepare(optimizer)  -> re-pointed at the DTensor parameters (matched by name)
                       then fully_shard over the data-parallel dimensions, if any
                       ("dp_shard", or ("dp_replicate", "dp_shard"): HSDP; a shard size of
                       1 there is plain replication, gradients all-reduced)
data                -> every TP rank reads the same batches (split by the data-parallel
                       rank only)
clipping            -> the DTensor norm made global, then clipped
state dict          -> whole tensors (``full_tensor``) on every rank
checkpoints         -> models and optimizers through DCP (any mesh can load them)
"""

from __future__ import annotations

import fnmatch
import os
import weakref
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from ...errors import ConfigError
from ...options.parallelism import TP_STYLES, ParallelismConfig
from ..checkpoint.folder import Stateful
from ..checkpoint.sharded import ShardedPart
from ..process import ProcessState
from . import sharder as fsdp2
from .base import CheckpointPart, Strategy

__all__ = ["TensorParallelStrategy"]


def _plan_of(model: torch.nn.Module, config: ParallelismConfig) -> tuple[torch.nn.Module, dict]:
    """(the module the plan's names are relative to, the plan)."""
    if config.tp_plan:
        return model, dict(config.tp_plan)
    # A transformers model's base_model_tp_plan first: its model-level tp_plan adds styles
    # (embeddings, gathered heads) that this strategy does not build.
    hf = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if isinstance(hf, dict) and hf:
        return getattr(model, "base_model", model), dict(hf)
    own = getattr(model, "tp_plan", None)
    if isinstance(own, dict) and own:
        return model, dict(own)
    raise ConfigError(
        "parallelism_config.tp_plan",
        None,
        'a plan: {"module.name": "colwise" | "rowwise"}, a model.tp_plan, or a transformers '
        "model whose config has base_model_tp_plan",
    )


def _style(name: str) -> ParallelStyle:
    if name == "rowwise":
        return RowwiseParallel()
    if name == "colwise":
        return ColwiseParallel()
    return ColwiseParallel(output_layouts=Replicate())  # gathered output


class TensorParallelStrategy(Strategy):
    """Split each planned Linear layer across the ``tp_size`` ranks.

    Raises:
        ConfigError: a plan entry matches no module (the mesh's fit to the job was checked
            before: options/rules.py, sized).
    """

    name = "tp"

    def __init__(self, state: ProcessState, config: ParallelismConfig) -> None:
        super().__init__(state)
        self.config = config
        self._mesh: DeviceMesh | None = None
        self._moved: dict[int, tuple[weakref.ref[torch.nn.Parameter], torch.nn.Parameter]] = {}

    @property
    def mesh(self) -> DeviceMesh:
        """The ``("dp_shard", "tp")`` mesh, ``("dp_replicate", "dp_shard", "tp")`` with
        replicas (built on first use: every rank); ranks that differ only in their TP
        coordinate are neighbours, so a TP group is contiguous."""
        if self._mesh is None:
            config = self.config
            shape: tuple[int, ...] = (config.dp_shard_size, config.tp_size)
            names: tuple[str, ...] = ("dp_shard", "tp")
            if config.dp_replicate_size > 1:
                shape, names = (config.dp_replicate_size, *shape), ("dp_replicate", *names)
            self._mesh = init_device_mesh(self.state.device.type, shape, mesh_dim_names=names)
        return self._mesh

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh of the ``parallelism_config`` (accelerate's ``torch_device_mesh``)."""
        return self.mesh

    @property
    def _dp_mesh(self) -> DeviceMesh:
        if self.config.dp_replicate_size > 1:
            return self.mesh["dp_replicate", "dp_shard"]
        return self.mesh["dp_shard"]

    def is_prepared(self, model: torch.nn.Module) -> bool:
        """Whether some parameter of ``model`` is already a DTensor."""
        return any(isinstance(p, DTensor) for p in model.parameters())

    @property
    def keeps_parameters(self) -> bool:
        """False: :meth:`prepare_optimizer` re-points optimizers by parameter name."""
        return False

    @property
    def shards_parameters(self) -> bool:
        """True: each rank holds a slice of the planned layers."""
        return True

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Broadcast rank 0's weights, then ``parallelize_module`` by the plan."""
        root, plan = _plan_of(model, self.config)
        names = [n for n, _ in root.named_modules() if n]
        styles: dict[str, Any] = {}
        for pattern, style in plan.items():
            if style not in TP_STYLES:  # a model's own plan may use styles not built here
                raise ConfigError(
                    f"tp_plan[{pattern!r}]",
                    style,
                    "one of " + ", ".join(map(repr, TP_STYLES)) + " (pass your own tp_plan)",
                )
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                raise ConfigError(
                    f"tp_plan[{pattern!r}]", style, "a pattern matching a submodule's name"
                )
            styles[pattern] = _style(style)
        old = {name: weakref.ref(p) for name, p in model.named_parameters()}
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        parallelize_module(root, self.mesh["tp"], styles)
        if self.data_size > 1:
            # The TP slices are then sharded across the data-parallel dimension (FSDP2), or
            # with replicas, sharded within and replicated across them (HSDP).
            from torch.distributed.fsdp import fully_shard

            fully_shard(model, mesh=self._dp_mesh)
        new = dict(model.named_parameters())
        for name, ref in old.items():
            param = ref()
            if param is not None and name in new and new[name] is not param:
                self._moved[id(param)] = (ref, new[name])
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point the optimizer's groups at the DTensor parameters."""
        for group in optimizer.param_groups:
            for i, param in enumerate(group["params"]):
                entry = self._moved.get(id(param))
                if entry is not None and entry[0]() is param:
                    group["params"][i] = entry[1]
        return optimizer

    def grad_norm(self, grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
        """The norm over every slice (DTensor partial norms reduced)."""
        return fsdp2.total_norm(grads, norm_type)

    def model_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """Whole tensors on every rank (each DTensor gathered: every rank calls)."""
        if self.data_size > 1:
            full = fsdp2.full_state_dict(model)  # gathered over both dimensions, on rank 0
            return full if self.state.rank == 0 else {}
        return {
            k: v.full_tensor() if isinstance(v, DTensor) else v
            for k, v in model.state_dict().items()
        }

    def checkpoint_parts(
        self, objects: Stateful, directory: str | os.PathLike[str] | None = None
    ) -> tuple[Stateful, CheckpointPart | None]:
        """Models and optimizers through DCP, loadable on another mesh."""
        rest = replace(objects, model=[], optimizer=[])
        return rest, ShardedPart(list(objects.model), list(objects.optimizer))

    @property
    def data_rank(self) -> int:
        """The rank along the data-parallel dimension (TP ranks share it, and their batches)."""
        return self.state.rank // self.config.tp_size

    @property
    def data_size(self) -> int:
        """``dp_replicate_size x dp_shard_size``: the data is split across data-parallel
        ranks only."""
        return self.config.dp_replicate_size * self.config.dp_shard_size

    def no_sync(self, model: torch.nn.Module) -> Any:
        """With a data-parallel dimension: FSDP's no-sync (no reduce-scatter)."""
        return fsdp2.no_sync(model)
