"""Memory helpers with accelerate's names: release objects, and retry at a smaller batch size.

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, ...):        out of memory -> free caches, batch_size * 0.9, call again
        ...                            any other error -> raised as is

In a notebook an out-of-memory error usually means restarting the kernel; retrying in place at a
smaller size keeps the session. Under several processes every rank must fail at the same size
(they usually do, as they run the same shapes): a rank that carries on alone waits in its next
collective for the others.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .. import devices
from ..errors import ConfigError

__all__ = [
    "clear_device_cache",
    "release_memory",
    "should_reduce_batch_size",
    "find_executable_batch_size",
]

# What torch's allocators say when they run out (CUDA/HIP/XPU, cuDNN's workspace, the CPU).
_OUT_OF_MEMORY_MESSAGES = (
    " out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Return cached device memory to the driver (the accelerator torch has: CUDA, MPS, XPU,
    TorchTPU...); optionally run ``gc`` first."""
    if garbage_collection:
        gc.collect()
    devices.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop these references, collect garbage and empty the device cache; reassign the Nones.

    Example:
        >>> model, optimizer = release_memory(model, optimizer)  # doctest: +SKIP
    """
    released: list[None] = [None for _ in objects]
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether ``exception`` is an out-of-memory error that a smaller batch may avoid."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        message = str(exception.args[0])
        return any(text in message for text in _OUT_OF_MEMORY_MESSAGES)
    return False


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, ...)``, shrinking ``batch_size`` on out-of-memory.

    ``function`` takes the batch size as its first parameter; callers pass the other
    arguments only. After an out-of-memory error the caches are freed and the size becomes
    ``int(batch_size * 0.9)`` (or ``reduce_batch_size_fn()``); at zero a ``RuntimeError`` says
    that no size fits. The size reached is kept for later calls of the decorated function.

    Example:
        >>> @find_executable_batch_size(starting_batch_size=64)
        ... def train(batch_size: int, epochs: int) -> int:
        ...     return batch_size
        >>> train(3)
        64
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    if isinstance(starting_batch_size, bool) or not isinstance(starting_batch_size, int):
        raise ConfigError("starting_batch_size", starting_batch_size, "an int >= 1")
    if starting_batch_size < 1:
        raise ConfigError("starting_batch_size", starting_batch_size, "an int >= 1")
    size = [starting_batch_size]
    shrink = reduce_batch_size_fn or (lambda: int(size[0] * 0.9))
    signature = inspect.signature(function).parameters.values()
    fixed = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in signature)
    open_ended = any(p.kind is p.VAR_POSITIONAL for p in signature)

    @functools.wraps(function)
    def with_batch_size(*args: Any, **kwargs: Any) -> Any:
        if not open_ended and len(args) + 1 > fixed:
            raise TypeError(
                f"{function.__name__}() was called with the batch size as its first argument; "
                f"the decorator passes it: call {function.__name__}() with the other arguments."
            )
        clear_device_cache(garbage_collection=True)
        while True:
            if size[0] <= 0:
                raise RuntimeError("No executable batch size found: the batch size reached zero.")
            try:
                return function(size[0], *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            # Outside the except block: the failed call's frames (and tensors) are gone now.
            clear_device_cache(garbage_collection=True)
            size[0] = int(shrink())

    return with_batch_size
