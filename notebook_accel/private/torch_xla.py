"""torch_xla's private names: its process pool.

torch_xla's public ``xmp.spawn`` sets the topology up but cannot return each process's value;
its ``_internal.pjrt.run_multiprocess`` (what spawn calls) does both. Read in torch_xla 2.8
and 2.9 (run: tests/launch/xla on the CPU runtime) and its master of 2026:
``run_multiprocess(fn, *args, start_method='spawn', **kwargs) -> {ordinal: value}``.

Where it is gone or takes other arguments: ``xmp.spawn`` itself, each device writing its
value to a file of a folder only this user can enter (made here, removed after), read back
by ordinal; the same launch, a pickle file per device more.
"""

from __future__ import annotations

import inspect
import os
import pickle
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["run_multiprocess"]


def _pool() -> Callable[..., Any] | None:
    """torch_xla's run_multiprocess, where it takes the function, then its arguments."""
    try:
        from torch_xla._internal import pjrt
    except ImportError:
        return None
    run = getattr(pjrt, "run_multiprocess", None)
    if not callable(run):
        return None
    try:
        kinds = [p.kind for p in inspect.signature(run).parameters.values()]
    except (TypeError, ValueError):
        return None
    if len(kinds) < 2 or kinds[1] is not inspect.Parameter.VAR_POSITIONAL:
        return None
    found: Callable[..., Any] = run
    return found


class _Saving:
    """``function(*args)`` as xmp.spawn calls it (the device's ordinal first), its value
    written to ``<folder>/<ordinal>.pickle``."""

    def __init__(self, function: Callable[..., Any], folder: str) -> None:
        self.function = function
        self.folder = folder

    def __call__(self, ordinal: int, *args: Any) -> None:
        value = self.function(*args)
        path = os.path.join(self.folder, f"{int(ordinal)}.pickle")
        part = f"{path}.{os.getpid()}.{threading.get_ident()}"  # threads of one process
        with open(part, "wb") as file:
            pickle.dump(value, file)
        os.replace(part, path)


def _spawned(function: Callable[..., Any], *args: Any) -> dict[int, Any]:
    import torch_xla.distributed.xla_multiprocessing as xmp

    folder = tempfile.mkdtemp(prefix="notebook-accel-xla-")  # 0700: only this user writes
    try:
        xmp.spawn(_Saving(function, folder), args=args)
        values = {}
        for name in os.listdir(folder):
            stem, dot, ext = name.partition(".")
            if stem.isdigit() and dot and ext == "pickle":
                with open(os.path.join(folder, name), "rb") as file:
                    values[int(stem)] = pickle.load(file)
        return dict(sorted(values.items()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_multiprocess(function: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """``function(*args)`` on every XLA device (a process per chip, a thread per device
    where a process holds several): each device's return value by ordinal.

    Relies on ``torch_xla._internal.pjrt.run_multiprocess(fn, *args)``; without it (or with
    other arguments), the public ``xmp.spawn`` and a file per device.
    """
    run = _pool()
    if run is None:
        return _spawned(function, *args)
    found = run(function, *args)
    if isinstance(found, Mapping):
        return dict(found)
    return dict(enumerate(found))  # a list in ordinal order
