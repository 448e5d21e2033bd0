"""Inputs and outputs moved between devices: every tensor inside nested containers.

A hook moves a block's inputs to where the block runs and the model's output back to where
its input came from; what it moves may be a tensor, a tuple, a dict, a transformers
``ModelOutput`` or ``BatchEncoding`` (anything with ``.to``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast


def send_to_device(data: Any, device: Any, skip_keys: str | list[str] | None = None) -> Any:
    """``data`` with every tensor inside (lists, tuples, dicts, their subclasses) on ``device``.

    Example:
        >>> send_to_device({"x": torch.ones(1)}, "cpu")  # doctest: +SKIP
    """
    import torch

    skip = [skip_keys] if isinstance(skip_keys, str) else list(skip_keys or [])
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a named tuple
        return type(data)(*(send_to_device(item, device) for item in data))
    if isinstance(data, list | tuple):
        return type(data)(send_to_device(item, device) for item in data)
    if isinstance(data, Mapping):
        moved = {k: v if k in skip else send_to_device(v, device) for k, v in data.items()}
        try:
            return cast(Any, type(data))(moved)
        except TypeError:
            return moved
    if hasattr(data, "to") and not isinstance(data, type):
        return data.to(device)
    return data


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
