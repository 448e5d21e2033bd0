"""TPU cores through torch_xla, with the same cloudpickle payload as the CPU/CUDA engine.

    parent (notebook)                               torch_xla's processes (spawned)
    -----------------                               -------------------------------
    xla.run(layout, payload, display, timeout)
      limit the devices to layout.num_processes
      torch_xla._internal.pjrt.run_multiprocess  -> one process per chip (TPU), one thread
        (torch_xla's own topology setup)             per device: _entry(payload, options)
                                                      launch options -> NOTEBOOK_ACCEL_*
                                                      unpickle the call (cell code by value)
                                                      ("ok", cloudpickled value)
                                                      or ("failed", channel.Failure)
      {ordinal: outcome}  -> first failure re-raised as the engine does (original type,
                             worker traceback as __cause__), else results in ordinal order

torch_xla sets up the TPU topology (TPU_VISIBLE_CHIPS, process bounds, ports) for each
process itself; repeating that here would break with each libtpu release, so this module
hands the processes to torch_xla and keeps only the payload, the results and the errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import cloudpickle

from .. import env
from ..errors import LaunchError
from .channel import Failure
from .display import Display
from .engine import Layout
from .payload import Payload, load

__all__ = ["run"]

Outcome = tuple[str, Any]  # ("ok", cloudpickled value) or ("failed", Failure)


def _entry(payload: Payload, options: dict[str, str]) -> Outcome:
    """One XLA device's share of the launch (runs in torch_xla's process or thread)."""
    try:
        for name, value in options.items():
            # Per process, not per device: threads of one process share the environment.
            env.set_var(name, value)
        function, args, kwargs = load(payload)
        return ("ok", cloudpickle.dumps(function(*args, **kwargs)))
    except BaseException as exc:  # the parent re-raises it as the engine does
        return ("failed", Failure.from_exception(exc))


@contextmanager
def _device_limit(layout: Layout) -> Iterator[None]:
    """Use ``num_processes`` devices: torch_xla reads the count from these variables."""
    pjrt = env.get("PJRT_DEVICE") or "TPU"
    values: dict[str, str | None] = {"PJRT_DEVICE": pjrt}
    if pjrt == "CPU":
        values["CPU_NUM_DEVICES"] = str(layout.num_processes)
    elif env.get("TPU_NUM_DEVICES") is None and env.get("TPU_PROCESS_BOUNDS") is None:
        values["TPU_NUM_DEVICES"] = str(layout.num_processes)
    with env.overridden(values):
        yield


def _outcomes(layout: Layout, payload: Payload) -> dict[int, Outcome]:
    from torch_xla._internal import pjrt

    options = env.launch_variables(
        launched="1", device_type="xla", backend="xla", mixed_precision=layout.mixed_precision
    )
    options.update(dict(layout.extra_env))
    with _device_limit(layout):
        try:
            return dict(pjrt.run_multiprocess(_entry, payload, options))
        except RuntimeError as exc:
            if "already initialized" in str(exc):
                raise LaunchError(
                    "the XLA device was used in this process before the launch; torch_xla "
                    "cannot start TPU workers after that. Restart the kernel and launch "
                    "before touching torch_xla in the notebook."
                ) from exc
            raise
        except Exception as exc:  # BrokenProcessPool: a process died without an answer
            raise LaunchError(f"a TPU worker process died: {type(exc).__name__}: {exc}") from exc


def run(layout: Layout, payload: Payload, display: Display, timeout: float | None) -> list[Any]:
    """Run the payload on every XLA device; results in ordinal order, errors as the engine's.

    ``timeout`` is not enforced here: torch_xla's process pool cannot be stopped midway.

    Example:
        >>> run(Layout(num_processes=8, device_type="xla", backend="xla"),
        ...     payload, Display(), None)  # doctest: +SKIP
        [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    """
    from .engine import _rebuild

    outcomes = _outcomes(layout, payload)
    ordinals = sorted(outcomes)
    failures = [(outcomes[o][1], o) for o in ordinals if outcomes[o][0] == "failed"]
    if failures:
        failure, ordinal = min(failures, key=lambda f: f[0].time)
        raise _rebuild(ordinal, failure, len(ordinals), failure.traceback)
    return [cloudpickle.loads(outcomes[o][1]) for o in ordinals]
