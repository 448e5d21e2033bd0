"""Sharded checkpoints: models and optimizers through torch.distributed.checkpoint (DCP).

    save_state (every rank, inside checkpoint.save_state's staging folder)
        <staging>/sharded/   DCP: {"model_<i>": ..., "optimizer_<j>": ...}, each rank its shards
        the rest (schedulers, loaders, custom objects, RNG states, notebook_accel.json) as
        folder.py writes it for DDP; its counts say 0 models and 0 optimizers.
    load_state
        DCP reads the shards this job's layout needs from whatever layout wrote them: a
        checkpoint saved by 2 processes loads into 1 (or into another FSDP layout).

Keys are qualified parameter names (``get_model_state_dict``/``get_optimizer_state_dict``), so a
plain module and an FSDP module read and write the same checkpoint.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ...errors import CheckpointError
from ..strategies.sharder import is_sharded
from .folder import Stateful, find

__all__ = ["SHARDED_DIR", "ShardedPart", "split"]

SHARDED_DIR = "sharded"


def _module(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # a DDP wrapper in a mixed job


@dataclass
class ShardedPart:
    """The models and optimizers a checkpoint stores with DCP.

    Example:
        >>> rest, part = split(objects)  # doctest: +SKIP
        >>> part.save(staging_folder)  # doctest: +SKIP
    """

    models: list[torch.nn.Module]
    optimizers: list[Any]

    def _owner(self, index: int, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        # The optimizer's state is keyed by the names of the model that holds its parameters.
        first = next((p for g in optimizer.param_groups for p in g["params"]), None)
        for model in self.models:
            if any(p is first for p in _module(model).parameters()):
                return _module(model)
        raise CheckpointError(
            f"optimizer {index}",
            "its parameters belong to no prepared model; prepare the model it optimizes",
        )

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            f"model_{i}": get_model_state_dict(_module(m)) for i, m in enumerate(self.models)
        }
        for j, wrapped in enumerate(self.optimizers):
            raw = getattr(wrapped, "optimizer", wrapped)
            state[f"optimizer_{j}"] = get_optimizer_state_dict(self._owner(j, raw), raw)
        return state

    def save(self, folder: Path) -> None:
        """Every rank writes its shards into ``folder/sharded`` (a collective call)."""
        dcp.save(self._state(), checkpoint_id=folder / SHARDED_DIR)

    def load(self, folder: Path) -> None:
        """Every rank reads what its shards need from ``folder/sharded``.

        Raises:
            CheckpointError: the folder has no sharded part, or its keys do not match.
        """
        path = folder / SHARDED_DIR
        if not (path / ".metadata").is_file():
            raise CheckpointError(path, "missing: the checkpoint was not saved with FSDP")
        state = self._state()
        try:
            with warnings.catch_warnings():
                # One process without a group is the intended 2 -> 1 resharding load.
                warnings.filterwarnings("ignore", "torch.distributed is disabled")
                dcp.load(state, checkpoint_id=path)
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(
                path, f"does not match the prepared models/optimizers: {err}"
            ) from err
        for i, model in enumerate(self.models):
            set_model_state_dict(_module(model), state[f"model_{i}"])
        for j, wrapped in enumerate(self.optimizers):
            raw = getattr(wrapped, "optimizer", wrapped)
            set_optimizer_state_dict(self._owner(j, raw), raw, state[f"optimizer_{j}"])


def _saved_sharded(directory: str | os.PathLike[str]) -> bool | None:
    """Whether the checkpoint has a DCP part; None when there is no checkpoint at all."""
    try:
        return (find(directory) / SHARDED_DIR).is_dir()
    except CheckpointError:
        return None


def split(
    objects: Stateful, directory: str | os.PathLike[str] | None = None
) -> tuple[Stateful, ShardedPart | None]:
    """Separate the DCP part from what ``folder.py`` saves as plain files.

    The DCP part is used when a prepared model is sharded, or when ``directory`` (a
    checkpoint about to be loaded) was saved sharded. Otherwise the objects come back whole.
    """
    sharded = any(is_sharded(_module(m)) for m in objects.model)
    on_disk = None if directory is None else _saved_sharded(directory)
    if sharded and on_disk is False:
        raise CheckpointError(
            find(directory),  # type: ignore[arg-type]
            "was saved without FSDP (whole model.safetensors files) and cannot be loaded into "
            "sharded models; load it with fsdp off, then save_state to get a sharded one",
        )
    if not sharded and not on_disk:
        return objects, None
    rest = replace(objects, model=[], optimizer=[])
    return rest, ShardedPart(list(objects.model), list(objects.optimizer))
