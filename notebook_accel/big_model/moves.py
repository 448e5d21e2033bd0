"""Inputs and outputs moved between devices: every tensor inside nested containers.

A hook moves a block's inputs to where the block runs and the model's output back to where
its input came from; what it moves may be a tensor, a tuple, a dict, a transformers
``ModelOutput`` or ``BatchEncoding`` (anything with ``.to``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from notebook_accel.devices import normalize_device


def send_to_device(
    tensor: Any,
    device: Any,
    non_blocking: bool = False,
    skip_keys: str | list[str] | None = None,
) -> Any:
    """Move the tensors of nested lists, tuples and mappings to ``device`` (accelerate.utils'
    and accelerate.hooks' ``send_to_device``; training/operations.py re-exports it).

    Anything with a ``.to`` method moves itself (a ``BatchEncoding``, a module); a mapping's
    values under ``skip_keys`` stay where they are; other objects come back unchanged.

    Example:
        >>> send_to_device({"x": torch.ones(2), "n": 3}, "cpu")  # doctest: +SKIP
        {'x': tensor([1., 1.]), 'n': 3}
    """
    if hasattr(tensor, "to") and not isinstance(tensor, type):
        device = normalize_device(device)  # an index is a TorchTPU chip, an XPU... off CUDA
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:  # a .to that takes no non_blocking
            return tensor.to(device)
    if isinstance(tensor, list | tuple):
        moved = [send_to_device(t, device, non_blocking, skip_keys) for t in tensor]
        if isinstance(tensor, tuple) and hasattr(tensor, "_fields"):  # a namedtuple
            return type(tensor)(*moved)
        return type(tensor)(moved)
    if isinstance(tensor, Mapping):
        skipped = [skip_keys] if isinstance(skip_keys, str) else (skip_keys or [])
        kind: Any = type(tensor)  # a dict, or a dict-like (transformers' BatchEncoding)
        return kind(
            {
                key: value
                if key in skipped
                else send_to_device(value, device, non_blocking, skip_keys)
                for key, value in tensor.items()
            }
        )
    return tensor


def find_device(data: Any) -> Any:
    """The device of the first tensor in ``data`` (``None`` where there is none).

    Example:
        >>> find_device({"x": torch.ones(1)})  # doctest: +SKIP
        device(type='cpu')
    """
    import torch

    if isinstance(data, torch.Tensor):
        return data.device
    items = data.values() if isinstance(data, Mapping) else data
    if isinstance(items, list | tuple) or isinstance(data, Mapping):
        for item in items:
            found = find_device(item)
            if found is not None:
                return found
    return None
