"""The budgets a device map fills: what each device may hold, and a balanced split.

Keys are GPU ids (ints), ``"mps"``, ``"cpu"`` and ``"disk"``, always in that order: the
map fills GPUs first, then the CPU, then the disk.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from notebook_accel import devices
from notebook_accel.big_model.tensors import compute_module_sizes, convert_file_size_to_int
from notebook_accel.errors import ConfigError
from notebook_accel.memory_probe import available_memory

if TYPE_CHECKING:
    import torch
    from torch import nn

Budgets = dict[int | str, int]

_log = logging.getLogger(__name__)

_PLACES = ("mps", "cpu", "disk")


def get_max_memory(max_memory: dict[int | str, int | str] | None = None) -> Budgets:
    """Bytes each device may hold, GPUs first: ``max_memory`` read, or what is free now.

    Args:
        max_memory: device -> bytes or a size string (``{0: "10GiB", "cpu": "30GB"}``).
            ``None``: the free memory of every visible GPU and the available memory (the
            container's, where its cgroup limit leaves less than the machine has).

    Example:
        >>> get_max_memory({"cpu": "1GB", 0: 100})
        {0: 100, 'cpu': 1000000000}
    """
    import torch

    if max_memory is None:
        found: Budgets = {}
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                found[index] = torch.cuda.mem_get_info(index)[0]
        elif devices.get_torch_accelerator_backend()[0] == "tpu":
            # TorchTPU: a process drives one chip, its own (accelerate 1.16's budget)
            index = torch.accelerator.current_device_index()
            found[index] = devices.get_accelerator_free_memory(torch.accelerator, index)
        if torch.backends.mps.is_available():
            found["mps"] = available_memory()  # MPS shares the host's RAM: no second budget
        else:
            found["cpu"] = available_memory()  # the container's limit where it is lower
        return found
    budgets = {key: convert_file_size_to_int(value) for key, value in max_memory.items()}
    unknown = [key for key in budgets if not isinstance(key, int) and key not in _PLACES]
    if unknown:
        raise ConfigError("max_memory", unknown[0], "GPU ids (ints), 'mps', 'cpu' or 'disk'")
    visible = torch.cuda.device_count() or torch.accelerator.device_count()
    gpus = sorted(key for key in budgets if isinstance(key, int))
    for index in gpus:
        if not 0 <= index < visible:
            _log.warning("max_memory names GPU %s; %s visible", index, visible)
    order: list[int | str] = [*gpus, *(place for place in _PLACES if place in budgets)]
    return {key: budgets[key] for key in order}


def _uses_mps(key: int | str) -> bool:
    import torch

    return key == "mps" and torch.backends.mps.is_available()


def _leaves(names: list[str]) -> list[str]:
    """Names no other name extends by one level (parents are counted from dotted names)."""
    parents = {name.rsplit(".", 1)[0] for name in names if "." in name}
    return [name for name in names if name and name not in parents]


def _no_split_size(model: nn.Module, sizes: dict[str, int], classes: list[str]) -> int:
    """The size of the first module of each no-split class, the largest of them."""
    first: dict[str, int] = {}
    modules = dict(model.named_modules())
    for name, size in sizes.items():
        kind = type(modules.get(name)).__name__ if name in modules else ""
        if name and kind in classes and kind not in first:
            first[kind] = size
            if len(first) == len(set(classes)):
                break
    return max(first.values(), default=0)


def get_balanced_memory(
    model: nn.Module,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | str | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    low_zero: bool = False,
) -> dict[int | str, int | float]:
    """Budgets that spread ``model`` evenly over the GPUs of ``max_memory``.

    Each GPU but the last gets the model's size over the GPU count plus a margin (1.25 x
    the largest no-split block or the mean final module); the last keeps its budget.
    ``low_zero`` keeps GPU 0 as empty as the others allow (for ``generate``'s own work).

    Example:
        >>> budgets = get_balanced_memory(model, {0: "10GiB", 1: "10GiB", "cpu": "30GiB"})
        ... # doctest: +SKIP
    """
    budgets: dict[int | str, int | float] = dict(get_max_memory(max_memory))
    gpus = sorted(k for k, v in budgets.items() if isinstance(k, int) and v > 0)
    count = len(gpus) + sum(1 for k, v in budgets.items() if _uses_mps(k) and v > 0)
    if count == 0:
        return budgets
    if count == 1:
        low_zero = False
        if max_memory is None and gpus:
            budgets[gpus[0]] *= 0.9  # a tenth kept free: what is measured is not all usable
    if isinstance(no_split_module_classes, str):
        no_split_module_classes = [no_split_module_classes]
    classes = list(no_split_module_classes or [])
    sizes = dict(compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes))
    share = sizes[""] // (count - 1 if low_zero else count)
    block = _no_split_size(model, sizes, classes) if classes else 0
    tensors = set(_leaves(list(sizes)))
    modules = {name: size for name, size in sizes.items() if name not in tensors}
    finals = _leaves(list(modules))
    mean = int(sum(modules[name] for name in finals) / max(len(finals), 1))
    share += int(1.25 * max(block, mean))
    for index in gpus[:-1]:
        budgets[index] = min(budgets[0] if low_zero and index == 0 else share, budgets[index])
    if low_zero:
        # the other GPUs by their ids, which need not be 1 .. count-1 (accelerate 1.16's fix)
        rest = sum(budgets[index] for index in gpus[1:])
        budgets[0] = min(max(0, sizes[""] - rest), budgets[0])
    return budgets
