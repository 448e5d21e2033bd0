"""Checkpoints loaded into a (meta) model one tensor at a time, each where its map says.

    checkpoint: a file (.safetensors; .bin/.pt read with weights_only), an index
    (model.safetensors.index.json, as save_pretrained writes with max_shard_size), or a
    folder holding one of them
      -> for each shard, for each tensor: its entry in the device map
           GPU id / "cpu"  -> set into the model there (cast to ``dtype``)
           "disk"          -> written to the offload folder; the model keeps a meta tensor
      -> tied parameters made one again (or indexed together on disk)

Tensors are read one by one (``pread`` into a fresh tensor, no file mapping), and those
bound for disk are written at the end of each shard or every 64 MiB, so the process holds
the blocks kept in memory plus at most 64 MiB, never a whole 5 GB shard.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from notebook_accel import refusals
from notebook_accel.big_model.device_map import infer_auto_device_map
from notebook_accel.big_model.dispatch import dispatch_model, entry_of
from notebook_accel.big_model.memory import get_balanced_memory
from notebook_accel.big_model.offload import SafetensorsFile, alias, read_index, write_tensors
from notebook_accel.big_model.tensors import (
    as_dtype,
    find_tied_parameters,
    set_module_tensor_to_device,
)
from notebook_accel.errors import ConfigError
from notebook_accel.private import torch as private_torch

if TYPE_CHECKING:
    import torch
    from torch import nn

_log = logging.getLogger(__name__)

_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_SINGLE = ("model.safetensors", "pytorch_model.bin")
DISK_BATCH = 64 * 2**20  # bytes bound for disk held before they are written (one file)


def checkpoint_files(checkpoint: str | os.PathLike[str]) -> list[Path]:
    """The weight files of a checkpoint: a file, an index json, or a folder of either.

    Example:
        >>> checkpoint_files("gpt2-local/")  # doctest: +SKIP
        [PosixPath('gpt2-local/model-00001-of-00002.safetensors'), ...]
    """
    path = Path(checkpoint)
    accepted = "a weights file, an index .json, or a folder with one of them"
    if path.is_dir():
        single = [path / name for name in _SINGLE if (path / name).is_file()]
        indexes = sorted(path.glob("*.index.json"))
        if single:
            return single[:1]
        if len(indexes) != 1:
            raise ConfigError("checkpoint", str(checkpoint), accepted, f"found {indexes}")
        path = indexes[0]
    if not path.is_file():
        raise ConfigError("checkpoint", str(checkpoint), accepted)
    if path.suffix != ".json":
        return [path]
    index = json.loads(path.read_text())
    files = sorted(set(index.get("weight_map", index).values()))
    return [path.parent / name for name in files]


def _tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """One file's tensors, one at a time (safetensors; else torch's weights-only loader)."""
    if path.suffix == ".safetensors":
        file = SafetensorsFile(path)  # read into anonymous memory: no mapped file pages
        for key in file.header:
            yield key, file.read(key)
        return
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    yield from state.items()


def _flush(
    tensors: dict[str, torch.Tensor], folder: str | os.PathLike[str] | None, above: int
) -> None:
    """Write the tensors bound for disk once they take more than ``above`` bytes."""
    if not tensors or sum(t.numel() * t.element_size() for t in tensors.values()) <= above:
        return
    if folder is None:
        raise ConfigError("offload_folder", None, "a folder for the blocks on disk")
    write_tensors(folder, tensors)
    tensors.clear()


def _target_dtype(
    name: str, tensor: torch.Tensor, dtype: torch.dtype | None, keep_fp32: list[str]
) -> torch.dtype | None:
    import torch

    if dtype is None or not torch.is_floating_point(tensor):
        return None
    if dtype == torch.float16 and any(f"{k}." in name or k == name for k in keep_fp32):
        return torch.float32
    return dtype


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: dict[str, Any] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load ``checkpoint`` into ``model``, each tensor on its device (``"disk"``: the folder).

    Args:
        model: the model, usually built under ``init_empty_weights``.
        checkpoint: a weights file, an index json, or a folder with one of them.
        device_map: module name -> device; ``None``: every tensor where the model has it
            (the CPU for meta tensors).
        offload_folder: where the ``"disk"`` entries' weights are written.
        dtype: floating weights are loaded in this dtype.
        offload_state_dict: accepted for accelerate's signature: tensors are read one at a
            time, so the CPU part never waits beside a whole shard.
        offload_buffers: write the disk entries' buffers to the folder too.
        keep_in_fp32_modules: module names kept in float32 when ``dtype`` is float16.
        offload_8bit_bnb: bitsandbytes' 8-bit offload; refused (no bitsandbytes here).
        strict: refuse checkpoint names the model does not have.
        full_state_dict: without a ``device_map``, a model whose parameters are sharded
            (DTensors: FSDP2, tensor parallel) takes the file as a full state dict (``True``)
            or as its shards (``False``), through torch's ``set_model_state_dict``.
        broadcast_from_rank0: without a ``device_map``, only rank 0 reads the file and the
            others receive its tensors (a process group is needed), as accelerate's.

    Example:
        >>> load_checkpoint_in_model(model, "ckpt/model.safetensors.index.json")
        ... # doctest: +SKIP
    """
    refusals.refuse_given("load_checkpoint_in_model", offload_8bit_bnb=offload_8bit_bnb)
    if device_map is None and (broadcast_from_rank0 or _has_dtensors(model)):
        _load_distributed(model, checkpoint, strict, full_state_dict, broadcast_from_rank0)
        return
    cast = as_dtype(dtype)
    ties = find_tied_parameters(model)
    state = model.state_dict(keep_vars=True)
    buffers = {name for name, _ in model.named_buffers()}
    unexpected: list[str] = []
    to_disk: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(checkpoint):
        for name, tensor in _tensors(path):
            if name not in state:
                unexpected.append(name)
                continue
            entry = entry_of(name, device_map) if device_map is not None else None
            if device_map is not None and entry is None:
                raise ConfigError("device_map", device_map, f"an entry covering {name}")
            device = device_map[entry] if device_map is not None and entry is not None else None
            if device is None:
                device = "cpu" if state[name].is_meta else state[name].device
            new_dtype = _target_dtype(name, tensor, cast, keep_in_fp32_modules or [])
            if device == "disk" and (offload_buffers or name not in buffers):
                to_disk[name] = tensor.to(new_dtype) if new_dtype is not None else tensor
                set_module_tensor_to_device(model, name, "meta", dtype=new_dtype)
                _flush(to_disk, offload_folder, DISK_BATCH)
                continue
            device = "cpu" if device == "disk" else device
            set_module_tensor_to_device(model, name, device, value=tensor, dtype=new_dtype)
        _flush(to_disk, offload_folder, 0)  # a shard's at its end
    if strict and unexpected:
        raise ConfigError("checkpoint", str(checkpoint), "only the model's names", f"{unexpected}")
    if unexpected:
        _log.warning("%s: names the model does not have: %s", checkpoint, unexpected)
    _retie(model, ties, device_map, offload_folder)


def _has_dtensors(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def _load_distributed(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    strict: bool,
    full_state_dict: bool,
    broadcast_from_rank0: bool,
) -> None:
    """The file through torch's ``set_model_state_dict``: into sharded parameters, and with
    ``broadcast_from_rank0`` read by rank 0 alone (accelerate's path without a device map)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if broadcast_from_rank0 and not dist.is_initialized():
        raise ConfigError(
            "broadcast_from_rank0", True, "False outside a process group (one process reads)"
        )
    reads = not broadcast_from_rank0 or dist.get_rank() == 0
    loaded: dict[str, Any] = {
        name: tensor
        for path in (checkpoint_files(checkpoint) if reads else [])
        for name, tensor in _tensors(path)
    }
    options = StateDictOptions(
        full_state_dict=full_state_dict, strict=strict, broadcast_from_rank0=broadcast_from_rank0
    )
    set_model_state_dict(model, loaded, options=options)


def _retie(
    model: nn.Module,
    ties: list[list[str]],
    device_map: dict[str, Any] | None,
    folder: str | os.PathLike[str] | None,
) -> None:
    """Each tied group one parameter again: a name on disk indexed with (or written beside)
    the loaded one, a name elsewhere given the loaded parameter (or indexed, for dispatch to
    read: its group's loaded name is on disk)."""
    index = read_index(folder) if folder is not None else {}
    params = dict(model.named_parameters(remove_duplicate=False))
    for group in ties:
        loaded = next((name for name in group if not params[name].is_meta), None)
        on_disk = next((name for name in group if name in index), None)
        for name in group:
            if name in (loaded, on_disk):
                continue
            entry = entry_of(name, device_map) if device_map is not None else None
            to_disk = device_map is not None and entry is not None and device_map[entry] == "disk"
            if folder is not None and on_disk is not None and (to_disk or loaded is None):
                alias(folder, name, on_disk)
            elif folder is not None and to_disk and loaded is not None:
                write_tensors(folder, {name: params[loaded].detach()})
            elif loaded is not None:
                owner, leaf = _split(model, name)
                private_torch.set_parameter(owner, leaf, params[loaded])


def _split(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load a checkpoint into an empty model and spread it over GPUs, the CPU and the disk.

    Args:
        model: the model, built under ``init_empty_weights``.
        checkpoint: a weights file, an index json, or a folder with one of them.
        device_map: ``"auto"``/``"balanced"`` (budgets balanced over the GPUs),
            ``"balanced_low_0"``, ``"sequential"`` (each device filled in turn), or a dict.
            ``None``: loaded, not dispatched.
        max_memory: device -> bytes or a size string (``{0: "10GiB", "cpu": "30GiB"}``).
        no_split_module_classes: class names kept whole on one device.
        offload_folder: where the blocks the map sends to disk are kept.
        offload_buffers: offload buffers with the parameters.
        dtype: floating weights are loaded in this dtype.
        offload_state_dict, skip_keys, preload_module_classes, force_hooks, strict,
            full_state_dict, broadcast_from_rank0: as in ``load_checkpoint_in_model`` and
            ``dispatch_model``.

    Example:
        >>> from notebook_accel.big_modeling import init_empty_weights
        >>> with init_empty_weights():
        ...     model = GPT2LMHeadModel(config)  # doctest: +SKIP
        >>> model = load_checkpoint_and_dispatch(
        ...     model, "gpt2-local", device_map="auto", max_memory={"cpu": "2GB"},
        ...     offload_folder="offload", no_split_module_classes=["GPT2Block"],
        ... )  # doctest: +SKIP
    """
    if isinstance(device_map, str):
        if device_map not in _MAPS:
            raise ConfigError("device_map", device_map, f"one of {_MAPS} or a dict")
        if device_map != "sequential":
            max_memory = get_balanced_memory(  # type: ignore[assignment]
                model,
                max_memory,
                no_split_module_classes,
                dtype=dtype,
                low_zero=device_map == "balanced_low_0",
            )
        device_map = infer_auto_device_map(
            model, max_memory, no_split_module_classes, dtype=dtype, offload_buffers=offload_buffers
        )
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )
