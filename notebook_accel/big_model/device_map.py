"""infer_auto_device_map: which device holds each block of a model, GPUs first.

The model's direct children (and direct tensors) are taken in order and put on the current
device while they fit; one that does not fit is split into its children, unless it has none
or its class may not be split (a residual block), and then the next device is tried:

    GPU 0, GPU 1, ...  ->  "cpu"  ->  "disk" (no limit)

The main devices (the first GPU and the CPU, or the CPU alone) keep room for the largest
block still to come: an offloaded block is brought there to run. Tied parameters go with
the module that holds their first name. The same walk as accelerate 1.16, so the same map.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from notebook_accel.big_model.memory import get_max_memory
from notebook_accel.big_model.tensors import compute_module_sizes, find_tied_parameters

if TYPE_CHECKING:
    import torch
    from torch import nn

Entry = tuple[str, Any]  # (name, a module or a tensor)
Device = int | str


def _children(item: Any) -> list[tuple[str, Any]]:
    from torch import nn

    return list(item.named_children()) if isinstance(item, nn.Module) else []


def _splittable(item: Any, no_split: Sequence[str]) -> bool:
    return bool(_children(item)) and type(item).__name__ not in no_split


def _split(name: str, item: Any) -> list[Entry]:
    """A module's direct parameters, then its children, under its name."""
    parts = [*item.named_parameters(recurse=False), *item.named_children()]
    return [(f"{name}.{child}", value) for child, value in parts]


def get_max_layer_size(
    modules: list[Entry], module_sizes: dict[str, int], no_split_module_classes: Sequence[str]
) -> tuple[int, list[str]]:
    """The largest layer among ``modules`` (a module without children, or one of a no-split
    class; their children are looked into), and the names of the layers of that size.

    Example:
        >>> get_max_layer_size([("0", nn.Linear(2, 2))], {"0": 24}, [])  # doctest: +SKIP
        (24, ['0'])
    """
    largest, names = 0, []
    waiting = list(modules)
    while waiting:
        name, item = waiting.pop(0)
        if _splittable(item, no_split_module_classes):
            waiting = [(f"{name}.{n}", child) for n, child in _children(item)] + waiting
            continue
        size = module_sizes[name]
        if size > largest:
            largest, names = size, [name]
        elif size == largest:
            names.append(name)
    return largest, names


def clean_device_map(device_map: dict[str, Device], module_name: str = "") -> dict[str, Device]:
    """Entries under one module that all name one device become one entry for the module.

    Example:
        >>> clean_device_map({"a.x": 0, "a.y": 0, "b": "cpu"})
        {'b': 'cpu', 'a': 0}
    """
    prefix = f"{module_name}." if module_name else ""
    under = [key for key in device_map if key.startswith(prefix)]
    values = {device_map[key] for key in under}
    if len(values) == 1 and len(under) > 1:
        for key in under:
            del device_map[key]
        device_map[module_name] = values.pop()
    depth = len(module_name.split(".")) + 1 if module_name else 1
    below = {
        ".".join(key.split(".")[:depth])
        for key in device_map
        if key.startswith(prefix) and len(key) > len(module_name)
    }
    for child in below:
        clean_device_map(device_map, child)
    return device_map


def _inside(name: str, param: str) -> bool:
    return f"{name}." in f"{param}."


@dataclass
class _Walk:
    """The state of one walk: the entries left, the device reached, what each holds."""

    budgets: dict[Device, int]
    devices: list[Device]
    main: list[Device]
    sizes: dict[str, int]
    ties: list[list[str]]
    no_split: list[str]
    waiting: list[Entry]
    index: int = 0
    used: dict[Device, int] = field(default_factory=dict)
    placed: dict[str, Device] = field(default_factory=dict)
    largest: int = 0
    largest_names: list[str] = field(default_factory=list)
    allow_fallback: bool = False

    def measure_largest(self, entries: list[Entry] | None = None) -> None:
        from torch import nn

        if entries is None:
            entries = [(n, m) for n, m in self.waiting if isinstance(m, nn.Module)]
        self.largest, self.largest_names = get_max_layer_size(entries, self.sizes, self.no_split)

    def tied_outside(self, name: str) -> list[str]:
        """Parameters tied to one inside ``name`` that are not inside it themselves."""
        groups = [
            group
            for group in self.ties
            if any(_inside(name, p) for p in group) and not all(_inside(name, p) for p in group)
        ]
        return [p for group in groups for p in group if not _inside(name, p)]

    def with_ties(
        self, size: int, tied: list[str], among: list[Entry] | None = None
    ) -> tuple[int, list[Entry]]:
        """The size of a module with the waiting modules its tied parameters live in."""
        holders: list[Entry] = []
        for param in tied:
            entries = self.waiting if among is None else among
            # the entry may be the tied parameter itself (accelerate 1.16: ``== n`` too)
            holder = next(
                (e for e in entries if param == e[0] or param.startswith(e[0] + ".")), None
            )
            if holder is None:
                continue
            holders.append(holder)
            size += self.sizes.get(holder[0], 0) - self.sizes.get(param, 0)
        return size, holders

    def place(self, name: str, device: Device, size: int, holders: list[Entry]) -> None:
        self.used[device] = self.used.get(device, 0) + size
        self.placed[name] = device
        for holder_name, _ in holders:
            self.waiting = [e for e in self.waiting if e[0] != holder_name]
            self.placed[holder_name] = device

    def split_a_holder(self, entry: Entry, holders: list[Entry]) -> bool:
        """Split the first tied holder that may be split, and take ``entry`` again."""
        for holder_name, holder in holders:
            if not _splittable(holder, self.no_split):
                continue
            at = next(i for i, e in enumerate(self.waiting) if e[0] == holder_name)
            self.waiting = [
                entry,
                *self.waiting[:at],
                *_split(holder_name, holder),
                *self.waiting[at + 1 :],
            ]
            self.measure_largest()
            return True
        return False

    def fallback(self, entry: Entry, limit: int) -> bool:
        """Put first the first waiting module (its children looked into before what follows)
        that fits in ``limit``, then ``entry`` again: accelerate's fallback_allocation, for a
        device that would otherwise stay empty."""
        queue = list(self.waiting)
        while queue:
            name, item = queue.pop(0)
            size, _ = self.with_ties(self.sizes.get(name, 0), self.tied_outside(name), queue)
            if size <= limit:
                break
            if _splittable(item, self.no_split):
                queue = _split(name, item) + queue
        else:
            return False
        for at in [i for i, char in enumerate(name) if char == "."]:
            parent = next((i for i, e in enumerate(self.waiting) if e[0] == name[:at]), None)
            if parent is not None:
                self.waiting[parent : parent + 1] = _split(name[:at], self.waiting[parent][1])
        found = self.waiting.pop(next(i for i, e in enumerate(self.waiting) if e[0] == name))
        self.waiting[:0] = [found, entry]
        return True

    def step(self) -> None:
        entry = self.waiting.pop(0)
        name, item = entry
        self.largest_names = [
            n for n in self.largest_names if n != name and not n.startswith(name + ".")
        ]
        if not self.largest_names:
            self.measure_largest()
        size = self.sizes.get(name, 0)
        tied = self.tied_outside(name)
        device = self.devices[self.index]
        reserved = self.largest if device in self.main else 0
        limit = None if device == "disk" else self.budgets[device] - reserved
        used = self.used.get(device, 0)
        total, holders = self.with_ties(size, tied)
        if limit is None or used + total <= limit:
            self.place(name, device, total, holders)
            return
        if tied and used + size <= limit and self.split_a_holder(entry, holders):
            return
        if used + size >= limit and _splittable(item, self.no_split):
            self.waiting = _split(name, item) + self.waiting
            self.measure_largest()
            return
        room = self.budgets[device] - max(self.largest, total)
        if self.allow_fallback and used == 0 and self.fallback(entry, room):
            return
        self.used[device] = used + reserved
        self.index += 1
        self.waiting.insert(0, entry)


def infer_auto_device_map(
    model: nn.Module,
    max_memory: dict[int | str, int | str] | None = None,
    no_split_module_classes: list[str] | str | None = None,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, Device]:
    """A device for each block of ``model``: GPUs in order, then ``"cpu"``, then ``"disk"``.

    Sizes come from shapes and dtypes: the model may be empty (``init_empty_weights``).

    Args:
        model: the model to place.
        max_memory: device -> bytes or a size string; ``None``: what is free now.
        no_split_module_classes: class names whose instances stay whole on one device
            (transformers models list theirs in ``model._no_split_modules``).
        dtype: the dtype the weights will be loaded in (floating tensors are counted so).
        special_dtypes: parameter name -> dtype, overriding ``dtype`` for those.
        verbose: accepted for accelerate's signature; nothing is printed.
        clean_result: entries under one module on one device become one entry.
        offload_buffers: accepted for accelerate's signature (it only changes a warning).
        fallback_allocation: when the next block does not fit a device that holds nothing
            yet, put there the first later module that fits.

    Example:
        >>> from notebook_accel.big_modeling import init_empty_weights
        >>> from notebook_accel.utils import infer_auto_device_map
        >>> import torch.nn as nn
        >>> with init_empty_weights():
        ...     model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(4)])
        >>> infer_auto_device_map(model, max_memory={0: 90_000, "cpu": 90_000})
        {'0': 0, '1': 'cpu', '2': 'disk', '3': 'disk'}
    """
    budgets = get_max_memory(max_memory)
    devices: list[Device] = [*budgets, *([] if "disk" in budgets else ["disk"])]
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    main: list[Device] = ["mps"] if "mps" in gpus else [gpus[0], "cpu"] if gpus else ["cpu"]
    if isinstance(no_split_module_classes, str):
        no_split_module_classes = [no_split_module_classes]
    waiting: list[Entry] = [
        *model.named_parameters(recurse=False),
        *model.named_children(),
        *model.named_buffers(recurse=False),
    ]
    walk = _Walk(
        budgets=budgets,
        devices=devices,
        main=main,
        sizes=compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes),
        ties=find_tied_parameters(model),
        no_split=list(no_split_module_classes or []),
        waiting=waiting,
        allow_fallback=fallback_allocation,
    )
    walk.measure_largest(list(waiting))
    while walk.waiting:
        walk.step()
    return clean_device_map(walk.placed) if clean_result else walk.placed
