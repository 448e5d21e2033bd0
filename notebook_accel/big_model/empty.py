"""Models built without memory: parameters made on the meta device (or any other device).

A module's constructor makes each parameter on the CPU and registers it; inside these
context managers the registration moves it to the chosen device at once, so a 100 GB model
is built in no time and in no memory. The CPU tensor torch made first was never written
(``torch.empty``), so it never took pages either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from notebook_accel import env

_TRUE = {"1", "true", "yes", "on", "y"}


def _include_buffers(include_buffers: bool | None) -> bool:
    if include_buffers is not None:
        return include_buffers
    return env.init_include_buffers()


@contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Build models with every parameter on the meta device: no memory, no time.

    Args:
        include_buffers: put buffers on the meta device too (every tensor made inside,
            through torch's device context). ``None``: the ``ACCELERATE_INIT_INCLUDE_BUFFERS``
            variable, else ``False`` (buffers stay on the CPU), as accelerate.

    Example:
        >>> import torch.nn as nn
        >>> from notebook_accel.big_modeling import init_empty_weights
        >>> with init_empty_weights():
        ...     model = nn.Sequential(*[nn.Linear(10_000, 10_000) for _ in range(1000)])
        >>> model[0].weight.device
        device(type='meta')
    """
    with init_on_device("meta", include_buffers=include_buffers):
        yield


@contextmanager
def init_on_device(device: Any, include_buffers: bool | None = None) -> Iterator[None]:
    """Build models with every parameter made on ``device``.

    Args:
        device: a ``torch.device`` or what it accepts (``"meta"``, ``"cuda:0"``, ``0``).
        include_buffers: buffers (and every tensor made inside) go there too.

    Example:
        >>> import torch.nn as nn
        >>> from notebook_accel.big_modeling import init_on_device
        >>> with init_on_device("meta"):
        ...     layer = nn.Linear(4, 4)
    """
    import torch
    from torch import nn

    target = torch.device(device)
    if _include_buffers(include_buffers):
        with target:
            yield
        return
    original = nn.Module.register_parameter

    def register_on_device(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        if param is None:
            return
        made = self._parameters[name]
        assert made is not None
        extras = dict(made.__dict__)  # subclasses (bitsandbytes, transformers) keep fields
        flags = {key: extras.pop(key) for key in ("_is_hf_initialized",) if key in extras}
        moved = type(made)(made.to(target), requires_grad=param.requires_grad, **extras)
        for key, value in flags.items():
            setattr(moved, key, value)
        self._parameters[name] = moved

    nn.Module.register_parameter = register_on_device  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
