"""save_state / load_state: whole checkpoints or none.

    every rank                          rank 0
    ----------                          ------
                                        remove a stale <parent>/.<name>.saving, create it
    barrier
    random_states_<rank>.pt  --------->  model_i.pt, optimizer_i.pt, scheduler_i.pt,
                                         loader_i.pt, custom_i.pt
    barrier
                                        meta.pt (counts, step, scaler; written last)
                                        <name> -> .<name>.old ; .saving -> <name> ; drop .old
    barrier

A crash while writing leaves ``<name>`` untouched. The two renames at the end are each atomic;
should a crash fall between them, ``load_state`` finds ``.<name>.old`` and uses it. The folder
must be visible to every rank (one machine, or a shared file system), as with accelerate.
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError
from .state import ProcessState
from .utils_seed import restore_rng_state, rng_state

__all__ = ["Stateful", "save_state", "load_state", "save_weights"]

FORMAT = 1
# Kinds whose state may hold arbitrary Python objects (a scheduler's lambda object, a user's
# registered object): loaded with weights_only=True first, full unpickling only if needed.
_UNRESTRICTED = ("scheduler", "custom")


@dataclass
class Stateful:
    """The objects a checkpoint covers, by kind, in the order they were prepared."""

    model: list[torch.nn.Module] = field(default_factory=list)
    optimizer: list[Any] = field(default_factory=list)
    scheduler: list[Any] = field(default_factory=list)
    loader: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)

    def kinds(self) -> dict[str, list[Any]]:
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "loader": self.loader,
            "custom": self.custom,
        }


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _paths(directory: str | os.PathLike[str]) -> tuple[Path, Path, Path]:
    target = Path(directory).absolute()
    return (
        target,
        target.with_name(f".{target.name}.saving"),
        target.with_name(f".{target.name}.old"),
    )


def save_state(
    directory: str | os.PathLike[str],
    state: ProcessState,
    objects: Stateful,
    extra: dict[str, Any],
    write_sharded: Callable[[Path], None] | None = None,
) -> Path:
    """Write a checkpoint of ``objects`` (and ``extra``: step counters, precision) atomically.

    ``write_sharded(staging)`` is called on every rank to add sharded (FSDP) state.
    """
    target, staging, old = _paths(directory)
    if state.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    state.barrier()
    torch.save(rng_state(), staging / f"random_states_{state.rank}.pt")
    if write_sharded is not None:
        write_sharded(staging)
    if state.is_main_process:
        for kind, items in objects.kinds().items():
            for i, item in enumerate(items):
                item = _unwrap(item) if kind == "model" else item
                torch.save(item.state_dict(), staging / f"{kind}_{i}.pt")
    state.barrier()
    if state.is_main_process:
        counts = {kind: len(items) for kind, items in objects.kinds().items()}
        meta = {"format": FORMAT, "num_processes": state.world_size, "counts": counts}
        torch.save({**meta, "extra": extra}, staging / "meta.pt")
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    state.barrier()
    return target


def _load(path: Path, unrestricted: bool = False) -> Any:
    if not path.is_file():
        raise CheckpointError(path, "file missing; the folder is not a complete checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not unrestricted:
            raise
        return torch.load(path, map_location="cpu", weights_only=False)


def _find(directory: str | os.PathLike[str]) -> Path:
    target, _, old = _paths(directory)
    if target.is_dir():
        return target
    if old.is_dir():  # a crash fell between save_state's two renames
        return old
    raise CheckpointError(target, "no such checkpoint folder")


def load_state(
    directory: str | os.PathLike[str],
    state: ProcessState,
    objects: Stateful,
    read_sharded: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Restore ``objects`` and this rank's RNG states; return the saved ``extra`` dict.

    ``read_sharded(folder)`` is called on every rank to restore sharded (FSDP) state.
    """
    folder = _find(directory)
    meta = _load(folder / "meta.pt")
    for kind, items in objects.kinds().items():
        saved = meta["counts"].get(kind, 0)
        if saved != len(items):
            raise CheckpointError(
                folder / "meta.pt",
                f"it holds {saved} {kind}(s) but {len(items)} were prepared/registered; "
                "prepare the same objects, in the same order, as when it was saved",
            )
    for kind, items in objects.kinds().items():
        for i, item in enumerate(items):
            path = folder / f"{kind}_{i}.pt"
            content = _load(path, unrestricted=kind in _UNRESTRICTED)
            try:
                (_unwrap(item) if kind == "model" else item).load_state_dict(content)
            except (RuntimeError, ValueError, KeyError) as err:
                raise CheckpointError(path, f"does not match {kind} {i}: {err}") from err
    if read_sharded is not None:
        read_sharded(folder)
    rng_path = folder / f"random_states_{state.rank}.pt"
    if rng_path.is_file():
        restore_rng_state(_load(rng_path))
    elif meta["num_processes"] != state.world_size:
        # Resuming on more processes than saved: weights and optimizer state load (sharded
        # state is resharded), but this rank has no saved random stream to continue.
        warnings.warn(
            f"{rng_path.name} is not in {folder}: it was saved by {meta['num_processes']} "
            f"processes and this job has {state.world_size}; rank {state.rank} keeps its "
            "current random state, so the run does not repeat the saved one exactly.",
            stacklevel=2,
        )
    else:
        raise CheckpointError(rng_path, "missing: the checkpoint is incomplete")
    state.barrier()
    return dict(meta["extra"])


def save_weights(
    weights: dict[str, Any], directory: str | os.PathLike[str], state: ProcessState
) -> Path:
    """Write ``weights`` to ``directory/pytorch_model.bin`` from the main process, atomically."""
    path = Path(directory) / "pytorch_model.bin"
    if state.is_main_process:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        torch.save(weights, partial)
        os.replace(partial, path)
    state.barrier()
    return path
