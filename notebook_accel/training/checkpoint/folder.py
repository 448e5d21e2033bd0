"""save_state / load_state: accelerate's files, written whole or not at all.

Files (accelerate's names, so that each library loads the other's folders):

    model.safetensors, model_1.safetensors, ...   weights (unwrapped names)
    optimizer.bin, optimizer_1.bin, ...           optimizer state dicts
    scheduler.bin, ...                            LR scheduler state dicts
    custom_checkpoint_0.pkl, ...                  register_for_checkpointing objects
    scaler.pt                                     fp16's GradScaler
    random_states_<rank>.pkl                      each rank's step and RNG states
    dataloader.bin, ...                           ours: a loader's epoch and position
    notebook_accel.json                           ours: counts, processes, micro-step (last)

Who writes what, without any collective (so ``if accelerator.is_main_process:
accelerator.save_state(d)`` works; the other ranks' RNG files are then absent, and load_state
says so):

    writer (the main process; with save_on_each_node, each machine's local main process)
        stage everything into <parent>/.<name>.saving in its own folder
        <name> -> .<name>.old ; .<name>.saving -> <name> ; drop .<name>.old
        publish "done" for this save in the job's store
    every other rank
        wait for its writer's "done", then write random_states_<rank>.pkl into its folder
        (created if it is not there: a machine with its own disk writes what it holds)

A rank pairs its call with the writer's by the step, the folder's name and how many saves of
that name it made at that step, so a save made by the main process alone does not pair with a
later save by every rank (unless both are at the same step into a folder of the same name:
then the other ranks' random states of the second may be lost, and load_state says so).

Loading unpickles nothing but tensors and plain data (``weights_only=True`` for every file,
numpy's RNG globals allowed); a file that needs more is refused, naming it, unless the caller
trusts the folder (``trusted``: ``load_state(folder, load_kwargs={"weights_only": False})``).

A crash while writing leaves ``<name>`` untouched; should one fall between the two renames,
``load_state`` finds ``.<name>.old``. FSDP's sharded state is written by every rank into the
writer's staging folder (torch.distributed.checkpoint is collective), so that path keeps
barriers and needs every rank and one shared folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ... import env
from ...errors import CheckpointError, ConfigError
from ...private import torch as private_torch
from ..process import ProcessState
from . import files as io

__all__ = ["Stateful", "save_state", "load_state", "trusted", "META", "file_name"]

FORMAT = 2
META = "notebook_accel.json"
# Per kind: the file stem and extension accelerate uses ("loader" is ours: accelerate keeps no
# loader position).
_FILES = {
    "model": ("model", ".safetensors"),
    "optimizer": ("optimizer", ".bin"),
    "scheduler": ("scheduler", ".bin"),
    "loader": ("dataloader", ".bin"),
    "custom": ("custom_checkpoint", ".pkl"),
}
# Pairs save_state calls across ranks without a collective: the same launch, the same step,
# the same folder name (paths may differ: one disk per machine) and the same count of such
# saves so far in this launch (a process Ray reuses runs the ranks of several launches).
_SAVES: Counter[tuple[str | None, str | None, int, str]] = Counter()


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


def file_name(kind: str, index: int) -> str:
    """accelerate's name for the ``index``-th object of ``kind``: ``model_1.safetensors``."""
    stem, ext = _FILES[kind]
    if kind == "custom":
        return f"{stem}_{index}{ext}"
    return f"{stem}{ext}" if index == 0 else f"{stem}_{index}{ext}"


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _paths(directory: str | os.PathLike[str]) -> tuple[Path, Path, Path]:
    target = Path(directory).absolute()
    return (
        target,
        target.with_name(f".{target.name}.saving"),
        target.with_name(f".{target.name}.old"),
    )


def _store(state: ProcessState) -> Any:
    """The job's key-value store (the one the process group rendezvoused through); None
    where torch cannot say which (the ranks then pair their outcomes by a collective)."""
    return private_torch.default_store()


def _outcomes(outcome: str) -> list[str]:
    """Every rank's outcome of this save, by a collective: where there is no store to pair
    the ranks' calls by name, they pair in the order they call (no waiting notice)."""
    everyone: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, outcome)
    return [str(o) for o in everyone]


def _writer_rank(state: ProcessState, on_each_node: bool) -> int:
    # Ranks are numbered machine by machine, so a machine's local main is rank - local_rank.
    return state.rank - state.local_rank if on_each_node else 0


def _stage(
    staging: Path,
    objects: Stateful,
    weights: list[dict[str, Any]],
    meta: dict[str, Any],
    scaler: dict[str, Any] | None,
    rank: int,
    fresh: bool = True,
    safe: bool = True,
) -> None:
    """Write every file of the checkpoint into ``staging``; the metadata file last."""
    if fresh:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    for i, weight in enumerate(weights):
        name = file_name("model", i) if safe else _legacy_model_name(i)
        io.save_weights_file(weight, staging / name, safe=safe)
    for kind, items in objects.kinds().items():
        if kind != "model":
            for i, item in enumerate(items):
                io.save_object(item.state_dict(), staging / file_name(kind, i))
    if scaler is not None:
        io.save_object(scaler, staging / "scaler.pt")
    io.save_object(io.rng_file_state(meta["step"]), staging / f"random_states_{rank}.pkl")
    text = json.dumps(meta, indent=1)
    io.write_atomic(staging / META, lambda p: p.write_text(text, encoding="utf-8"))


def _swap(target: Path, staging: Path, old: Path) -> None:
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def save_state(
    directory: str | os.PathLike[str],
    state: ProcessState,
    objects: Stateful,
    weights: list[dict[str, Any]],
    progress: dict[str, int],
    scaler: dict[str, Any] | None = None,
    write_sharded: Callable[[Path], None] | None = None,
    on_each_node: bool = False,
    safe: bool = True,
) -> Path:
    """Write a checkpoint of ``objects`` atomically; see the module's docstring for who writes.

    Args:
        directory: the checkpoint folder (its parent is created if needed).
        state: this process's place in the job.
        objects: what to save; ``objects.model`` is ignored in favour of ``weights``.
        weights: the models' state dicts, written as ``model[_i].safetensors``.
        progress: ``{"step": ..., "micro_step": ...}``, restored by :func:`load_state`.
        scaler: the GradScaler's state dict, or None.
        write_sharded: called on every rank with the staging folder to add FSDP state
            (then every rank must call save_state).
        on_each_node: each machine's local main process writes a full copy.
        safe: weights as safetensors, else ``pytorch_model[_i].bin``.
    """
    target, staging, old = _paths(directory)
    # The launch (attempt): its store's port and the attempt, different for every one.
    launch = env.launch_attempt()
    counted = (*launch, int(progress["step"]), target.name)
    number = f"{progress['step']}/{target.name}/{_SAVES[counted]}"
    _SAVES[counted] += 1
    writer = state.rank == _writer_rank(state, on_each_node)
    counts = {kind: len(items) for kind, items in objects.kinds().items()}
    counts["model"] = len(weights)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "num_processes": state.world_size,
        "counts": counts,
        **progress,
    }
    if write_sharded is not None:
        return _save_collective(
            target, staging, old, state, objects, weights, meta, scaler, write_sharded
        )
    if not writer:
        _wait_for_writer(state, number, _writer_rank(state, on_each_node))
        target.mkdir(parents=True, exist_ok=True)
        rng = io.rng_file_state(meta["step"])
        io.save_object(rng, target / f"random_states_{state.rank}.pkl")
        return target
    outcome = "failed"
    try:
        _stage(staging, objects, weights, meta, scaler, state.rank, safe=safe)
        _swap(target, staging, old)
        outcome = "done"
    finally:
        if state.world_size > 1:
            store = _store(state)
            if store is None:
                _outcomes(outcome)
            else:
                store.set(f"notebook_accel/save_state/{number}/{state.rank}", outcome)
    return target


def _wait_for_writer(state: ProcessState, number: str, writer: int) -> None:
    key = f"notebook_accel/save_state/{number}/{writer}"
    store = _store(state)
    if store is None:
        if _outcomes("waiting")[writer] != "done":
            raise CheckpointError(f"rank {writer}", "failed to write its part of the checkpoint")
        return
    patience = env.save_wait_warning()
    try:
        store.wait([key], timedelta(seconds=patience))
    except RuntimeError:  # torch's DistStoreError: the writer has not finished this save yet
        _say_waiting(state, number, writer, patience)
        store.wait([key], timedelta(minutes=30))
    if store.get(key) != b"done":
        raise CheckpointError(f"rank {writer}", "failed to write its part of the checkpoint")


def _say_waiting(state: ProcessState, number: str, writer: int, patience: float) -> None:
    """Tell the user why this rank is still waiting (and say so in the store too)."""
    step, name, _ = number.split("/", 2)
    print(
        f"[notebook_accel] rank {state.rank} has waited {patience:g} s for rank {writer} to "
        f"write save_state('.../{name}') at step {step}. Every rank must call save_state with "
        "a folder of the same name (the name pairs the ranks' calls; a folder per rank is "
        "fine only if the names agree). Still waiting, 30 minutes in all.",
        file=sys.stderr,
        flush=True,
    )
    _store(state).set(f"notebook_accel/save_state/waiting/{state.rank}", number)


def _save_collective(
    target: Path,
    staging: Path,
    old: Path,
    state: ProcessState,
    objects: Stateful,
    weights: list[dict[str, Any]],
    meta: dict[str, Any],
    scaler: dict[str, Any] | None,
    write_sharded: Callable[[Path], None],
) -> Path:
    # FSDP: every rank writes its shards into rank 0's staging folder, so barriers order it.
    if state.rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    state.barrier()
    write_sharded(staging)
    if state.rank != 0:
        rng = io.rng_file_state(meta["step"])
        io.save_object(rng, staging / f"random_states_{state.rank}.pkl")
    state.barrier()
    if state.rank == 0:
        _stage(staging, objects, weights, meta, scaler, state.rank, fresh=False)
        _swap(target, staging, old)
    state.barrier()
    return target


# ---- loading ---------------------------------------------------------------------------------
def find(directory: str | os.PathLike[str]) -> Path:
    """The checkpoint folder ``directory`` names (or its copy left by a crash mid-rename).

    Raises:
        CheckpointError: there is none.
    """
    target, _, old = _paths(directory)
    if target.is_dir():
        return target
    if old.is_dir():  # a crash fell between save_state's two renames
        return old
    raise CheckpointError(target, "no such checkpoint folder")


def _read_meta(folder: Path) -> dict[str, Any] | None:
    path = folder / META
    if not path.is_file():
        return None  # a folder written by accelerate
    meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return meta


def _check_counts(folder: Path, meta: dict[str, Any] | None, objects: Stateful) -> None:
    for kind, items in objects.kinds().items():
        if meta is not None:
            saved = meta["counts"].get(kind, 0)
        elif kind == "custom":  # accelerate counts these files too
            saved = sum(1 for p in folder.glob("custom_checkpoint_*.pkl"))
        else:
            continue
        if saved != len(items):
            raise CheckpointError(
                folder / (META if meta is not None else file_name(kind, 0)),
                f"it holds {saved} {kind}(s) but {len(items)} were prepared/registered; "
                "prepare the same objects, in the same order, as when it was saved",
            )


def _legacy_model_name(index: int) -> str:
    # save_state(safe_serialization=False), ours and accelerate's
    return "pytorch_model.bin" if index == 0 else f"pytorch_model_{index}.bin"


def _model_file(folder: Path, index: int) -> Path:
    safe = folder / file_name("model", index)
    if safe.is_file():
        return safe
    legacy = folder / _legacy_model_name(index)
    return legacy if legacy.is_file() else safe


def _read(
    folder: Path, objects: Stateful, meta: dict[str, Any] | None, trusted: bool
) -> dict[str, Any]:
    """Every shared file this job's objects need, read into CPU memory (``weights_only``
    unless ``trusted``)."""
    _check_counts(folder, meta, objects)
    contents: dict[str, Any] = {"meta": meta}
    for kind, items in objects.kinds().items():
        if kind == "loader" and meta is None:
            contents[kind] = [None] * len(items)  # accelerate saves no loader position
            continue
        read = []
        for i in range(len(items)):
            if kind == "model":
                read.append(io.load_weights_file(_model_file(folder, i), trusted))
            else:
                read.append(io.load_object(folder / file_name(kind, i), trusted))
        contents[kind] = read
    scaler = folder / "scaler.pt"
    contents["scaler"] = io.load_object(scaler, trusted) if scaler.is_file() else None
    return contents


def _complete(folder: Path, objects: Stateful, meta: dict[str, Any] | None) -> bool:
    """Whether this rank's folder holds the shared files (it may hold only its RNG file)."""
    if meta is not None:
        return True
    # A folder accelerate wrote: every file this job's objects need, and something besides
    # random states (the folder of a rank that wrote only its own holds just that).
    needed = [_model_file(folder, i) for i in range(len(objects.model))]
    for kind in ("optimizer", "scheduler", "custom"):
        needed += [folder / file_name(kind, i) for i in range(len(objects.kinds()[kind]))]
    others = [p for p in folder.iterdir() if not p.name.startswith("random_states_")]
    return bool(others) and all(p.is_file() for p in needed)


def _shared_contents(
    folder: Path | None, state: ProcessState, objects: Stateful, trusted: bool
) -> dict[str, Any]:
    """The shared files' contents: from this rank's folder, or sent by rank 0 when some rank's
    folder has only its RNG file (machines with local disks, not saving on each node)."""
    meta = _read_meta(folder) if folder is not None else None
    have = folder is not None and _complete(folder, objects, meta)
    if state.world_size == 1 or state.backend == "xla":
        assert folder is not None  # load_state raised already
        return _read(folder, objects, meta, trusted)
    import torch.distributed as dist

    flags: list[Any] = [None] * state.world_size
    dist.all_gather_object(flags, have)
    if all(flags):
        assert folder is not None
        return _read(folder, objects, meta, trusted)
    if not flags[0]:
        raise CheckpointError(folder or "", "the main process's folder is not a checkpoint")
    box: list[Any] = [None]
    if state.rank == 0:  # the others unpickle what it read: members of the job only
        assert folder is not None  # flags[0]
        box[0] = _read(folder, objects, meta, trusted)
    dist.broadcast_object_list(box, src=0)
    contents: dict[str, Any] = box[0]
    return contents


def _apply(folder: Path, contents: dict[str, Any], objects: Stateful) -> None:
    for kind, items in objects.kinds().items():
        for i, item in enumerate(items):
            content = contents[kind][i]
            if content is None:
                continue
            name = folder / file_name(kind, i)
            if kind == "model":
                io.load_weights_into(_unwrap(item), content, name)
                continue
            try:
                item.load_state_dict(content)
            except (RuntimeError, ValueError, KeyError) as err:
                raise CheckpointError(name, f"does not match {kind} {i}: {err}") from err


def _restore_rng(
    folder: Path | None, state: ProcessState, meta: dict[str, Any] | None, trusted: bool
) -> int | None:
    """Restore this rank's RNG states; return the step its file holds (None: no file)."""
    path = (folder or Path()) / f"random_states_{state.rank}.pkl"
    if meta is None:
        why = "the checkpoint was saved by accelerate"
    else:
        why = (
            f"the checkpoint was saved by {meta['num_processes']} processes and this job has "
            f"{state.world_size}, or by the main process only"
        )
    if folder is None or not path.is_file():
        warnings.warn(
            f"{path.name} is not in {folder}: no random states for rank {state.rank} ({why}); "
            f"rank {state.rank} keeps its current random state, so the run does not repeat "
            "the saved one exactly.",
            stacklevel=3,
        )
        return None
    rng = io.load_rng_file(path, trusted)
    if meta is not None and rng.get("step") != meta["step"]:
        warnings.warn(
            f"{path} is from another save (step {rng.get('step')}, the checkpoint's is "
            f"{meta['step']}); rank {state.rank} keeps its current random state.",
            stacklevel=3,
        )
        return None
    io.restore_rng_file_state(rng)
    return int(rng["step"]) if "step" in rng else None


def trusted(load_kwargs: dict[str, Any] | None) -> bool:
    """Whether ``load_state``'s ``load_kwargs`` opt in to full unpickling (accelerate's
    ``{"weights_only": False}``).

    Raises:
        ConfigError: ``load_kwargs`` is not a dict, or its ``weights_only`` not a bool.

    Example:
        >>> trusted({"weights_only": False})
        True
    """
    accepted = "a dict such as {'weights_only': False} (to trust the folder), or None"
    if load_kwargs is None:
        return False
    if not isinstance(load_kwargs, dict):
        raise ConfigError("load_kwargs", load_kwargs, accepted)
    weights_only = load_kwargs.get("weights_only", True)
    if not isinstance(weights_only, bool):
        raise ConfigError("load_kwargs['weights_only']", weights_only, "True or False")
    return not weights_only


def load_state(
    directory: str | os.PathLike[str],
    state: ProcessState,
    objects: Stateful,
    read_sharded: Callable[[Path], None] | None = None,
    scaler: Any = None,
    trusted: bool = False,
) -> dict[str, int]:
    """Restore ``objects`` and this rank's RNG states; return ``{"step", "micro_step"}``.

    Reads folders written by :func:`save_state` or by accelerate's ``save_state``. A rank
    whose folder lacks the shared files (only its own RNG file, as a machine with a local disk
    has) gets them from rank 0. ``read_sharded(folder)`` restores FSDP state on every rank;
    ``scaler`` (fp16's GradScaler) gets ``scaler.pt``. Every file is read with
    ``weights_only=True``; ``trusted`` (the caller's opt-in) unpickles what that refuses.

    Raises:
        CheckpointError: a file is missing, does not match, or needs full unpickling and
            ``trusted`` is off (it names the file).
    """
    try:
        folder: Path | None = find(directory)
    except CheckpointError:
        if state.world_size == 1:
            raise
        folder = None  # a machine whose disk never got this checkpoint: rank 0 sends it
    contents = _shared_contents(folder, state, objects, trusted)
    meta = contents["meta"]
    where = folder or Path(directory).absolute()
    _apply(where, contents, objects)
    if contents["scaler"] is not None and scaler is not None:
        scaler.load_state_dict(contents["scaler"])
    if read_sharded is not None:
        read_sharded(where)
    rng_step = _restore_rng(folder, state, meta, trusted)
    state.barrier()
    if meta is not None:
        return {"step": int(meta["step"]), "micro_step": int(meta["micro_step"])}
    return {"step": rng_step or 0, "micro_step": 0}
