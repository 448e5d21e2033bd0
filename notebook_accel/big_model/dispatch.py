"""A model spread over devices by a device map: hooks where its blocks meet, weights lent.

    device_map entry       its weights                      its forward runs on
    GPU id / "cpu"         moved there once                 that device
    "cpu" (main is a GPU)  kept in a CPU state dict         the main device, lent per call
    "disk"                 the offload folder (offload.py)  the main device, lent per call

Every module with weights of an offloaded entry gets an ``AlignDevicesHook`` that lends
them for its own forward (so one leaf's weights are resident at a time); every entry's
module gets one that moves its inputs; the model's own hook brings the output back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from notebook_accel.big_model.forward_hooks import (
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
    default,
)
from notebook_accel.big_model.offload import (
    OffloadedWeights,
    PrefixedWeights,
    read_index,
    write_tensors,
)
from notebook_accel.big_model.tensors import (
    move_keeping_ties,
    named_module_tensors,
    set_module_tensor_to_device,
)
from notebook_accel.devices import normalize_device
from notebook_accel.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

DeviceMap = Mapping[str, Any]


def entry_of(name: str, device_map: DeviceMap) -> str | None:
    """The device map's entry that covers ``name`` (itself or its nearest parent)."""
    while True:
        if name in device_map:
            return name
        if not name:
            return None
        name = name.rsplit(".", 1)[0] if "." in name else ""


def check_device_map(model: nn.Module, device_map: DeviceMap) -> None:
    """Refuse a map that leaves a parameter or buffer of ``model`` without a device.

    Example:
        >>> check_device_map(model, {"": "cpu"})  # doctest: +SKIP
    """
    missing = [
        name
        for name, _ in named_module_tensors(model, recurse=True)
        if entry_of(name, device_map) is None
    ]
    if missing:
        raise ConfigError(
            "device_map", dict(device_map), f"entries covering every weight (missing: {missing})"
        )


def extract_submodules_state_dict(
    state_dict: Mapping[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` under the given modules (``""``: all of them).

    Example:
        >>> extract_submodules_state_dict(model.state_dict(), ["transformer.h.0"])
        ... # doctest: +SKIP
    """
    return {
        key: tensor.detach()
        for key, tensor in state_dict.items()
        if any(key == n or key.startswith(n + ".") or not n for n in submodule_names)
    }


def _state_of(model: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """The model's tensors under the given entries (a tied name is found under each)."""
    return extract_submodules_state_dict(model.state_dict(keep_vars=True), names)


def attach_hooks(
    model: nn.Module,
    device_map: DeviceMap,
    main: Any,
    weights: Mapping[str, torch.Tensor] | None,
    offloaded: set[Any],
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
) -> None:
    """Place the weights the map keeps on a device; hook what is lent and where blocks meet.

    An offloaded module of a ``preload_module_classes`` class borrows its whole subtree's
    weights for its own forward (its forward reads a child's weights without calling it).
    """
    preloaded: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p) for p in preloaded):
            continue  # inside a preloaded module: its hook lends these weights
        entry = entry_of(name, device_map)
        device = device_map[entry] if entry is not None else main
        whole = device in offloaded and type(module).__name__ in (preload_module_classes or [])
        if whole:
            preloaded.append(f"{name}." if name else "")
        tensors = named_module_tensors(module, recurse=whole)
        lends = device in offloaded and any(True for _ in tensors)
        runs_on = main if device in offloaded else device
        prefix = f"{name}." if name else ""
        if device not in offloaded:
            for tensor_name, tensor in named_module_tensors(module):
                # a tied name whose loaded twin is on disk is read from there
                full = prefix + tensor_name
                value = weights[full] if tensor.is_meta and weights and full in weights else None
                set_module_tensor_to_device(module, tensor_name, device, value=value)
        if not (lends or name == "" or name == entry):
            continue
        hook = AlignDevicesHook(
            execution_device=runs_on,
            offload=lends,
            io_same_device=name == "",
            weights_map=PrefixedWeights(weights, prefix) if lends and weights else None,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
        )
        add_hook_to_module(module, hook)


def dispatch_model(
    model: nn.Module,
    device_map: DeviceMap,
    main_device: Any = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Spread ``model`` by ``device_map``: its blocks on GPUs, the CPU or the disk.

    Args:
        model: a model whose weights are loaded, except those the map sends to ``"disk"``
            that ``offload_dir`` already holds (as ``load_checkpoint_in_model`` leaves it).
        device_map: module name -> GPU id, ``"cpu"``, ``"disk"`` (``infer_auto_device_map``).
        main_device: where offloaded blocks run; default: the map's first GPU, else the CPU.
        state_dict: the CPU-offloaded blocks' weights (default: read from the model).
        offload_dir: the folder of the disk blocks' weights (written here if it has none).
        offload_index: accepted for accelerate's signature: the folder's ``index.json`` is read.
        offload_buffers: lend buffers too, not only parameters.
        skip_keys: keyword inputs the hooks leave where they are.
        preload_module_classes: class names whose offloaded instances borrow all their
            submodules' weights for their own forward (for a forward that reads a child's
            weights without calling the child).
        force_hooks: hook even a map with a single device.

    Example:
        >>> model = dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir="offload")
        ... # doctest: +SKIP
    """
    check_device_map(model, device_map)
    devices = list(dict.fromkeys(device_map.values()))
    if len(devices) == 1 and devices[0] != "disk" and not force_hooks:
        move_keeping_ties(model, normalize_device(devices[0]))
        model.hf_device_map = dict(device_map)  # type: ignore[assignment]
        return model
    gpus = [device for device in devices if device not in ("cpu", "disk")]
    main = main_device if main_device is not None else gpus[0] if gpus else "cpu"
    offloaded = {"disk"} if str(main) in ("cpu", "mps") else {"cpu", "disk"}
    on_cpu = [name for name, device in device_map.items() if device == "cpu"]
    if "cpu" in offloaded and state_dict is None and on_cpu:
        state_dict = {k: v.to("cpu") for k, v in _state_of(model, on_cpu).items()}
    on_disk = [name for name, device in device_map.items() if device == "disk"]
    if on_disk and offload_dir is None:
        raise ConfigError("offload_dir", None, f"a folder for the blocks on disk: {on_disk}")
    if on_disk and not read_index(offload_dir or ""):
        write_tensors(offload_dir or "", _state_of(model, on_disk))
    weights = OffloadedWeights(state_dict, offload_dir if on_disk else None)
    attach_hooks(
        model,
        device_map,
        main,
        weights,
        offloaded,
        offload_buffers,
        skip_keys,
        preload_module_classes,
    )
    model.hf_device_map = dict(device_map)  # type: ignore[assignment]
    return model


def cpu_offload(
    model: nn.Module,
    execution_device: Any = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep every weight on the CPU; each module borrows its own on the execution device.

    Example:
        >>> model = cpu_offload(model, execution_device="cuda:0")  # doctest: +SKIP
    """
    main = execution_device if execution_device is not None else default()
    if state_dict is None:
        state_dict = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    weights = OffloadedWeights(state_dict)
    classes = preload_module_classes
    attach_hooks(model, {"": "cpu"}, main, weights, {"cpu"}, offload_buffers, None, classes)
    return model


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: Any = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep every weight in ``offload_dir``; each module reads its own for its forward.

    Example:
        >>> model = disk_offload(model, "offload", execution_device="cpu")  # doctest: +SKIP
    """
    if not read_index(offload_dir):
        write_tensors(offload_dir, model.state_dict())
    main = execution_device if execution_device is not None else default()
    weights = OffloadedWeights(folder=offload_dir)
    classes = preload_module_classes
    attach_hooks(model, {"": "disk"}, main, weights, {"disk"}, offload_buffers, None, classes)
    return model


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: Any = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on the CPU until called; it then stays on the device until
    ``hook.offload()`` (pipelines: the next model's call offloads this one).

    Example:
        >>> encoder, hook = cpu_offload_with_hook(encoder, "cuda:0")  # doctest: +SKIP
        >>> decoder, _ = cpu_offload_with_hook(decoder, "cuda:0", prev_module_hook=hook)
        ... # doctest: +SKIP
    """
    hook = CpuOffload(execution_device, prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)
