"""ProfileKwargs and the profiler behind ``Accelerator.profile()`` (accelerate's names).

Accelerator(kwargs_handlers=[ProfileKwargs(...)])
with accelerator.profile() as prof:      torch.profiler.profile(...) from the handler
    ... prof.step() ...                  (a schedule counts these steps)
                                         on exit, with output_trace_dir: each rank writes
                                         <dir>/profile_<rank>.json (Chrome trace), then
                                         all ranks wait for each other
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ConfigError
from .handlers import KwargsHandler

__all__ = ["PROFILE_PATTERN_NAME", "ProfileKwargs", "profiled"]

# accelerate's file name of a rank's trace, ``suffix`` being the rank
PROFILE_PATTERN_NAME = "profile_{suffix}.json"

_ACTIVITIES = ("cpu", "cuda", "xpu", "mtia", "hpu")
_SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")


def _usable(name: str) -> bool:
    """Whether this machine's torch can record activity ``name`` (cpu, cuda: always)."""
    if name in ("cpu", "cuda"):
        return True
    if not hasattr(torch.profiler.ProfilerActivity, name.upper()):
        return False
    device = getattr(torch, name, None)
    return device is not None and bool(device.is_available())


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """How :meth:`Accelerator.profile` builds its ``torch.profiler.profile``.

    Args:
        activities: what to record: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"mtia"``, ``"hpu"``
            (the last three where this machine has them); ``None``: torch's default.
        schedule_option: ``torch.profiler.schedule``'s arguments: ``wait``, ``warmup``,
            ``active``, ``repeat``, ``skip_first`` (``prof.step()`` counts the steps).
        on_trace_ready: called with the profiler each time a scheduled cycle is recorded.
        record_shapes, profile_memory, with_stack, with_flops, with_modules: as
            ``torch.profiler.profile``'s.
        output_trace_dir: where each rank writes its Chrome trace,
            ``profile_<rank>.json``; ``None``: no file.

    Example:
        >>> handler = ProfileKwargs(activities=["cpu"], record_shapes=True)
        >>> handler.to_kwargs()
        {'activities': ['cpu'], 'record_shapes': True}
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        if self.activities is not None:
            if isinstance(self.activities, str) or not all(
                a in _ACTIVITIES for a in self.activities
            ):
                raise ConfigError(
                    "ProfileKwargs(activities)",
                    self.activities,
                    "a list of " + ", ".join(repr(a) for a in _ACTIVITIES),
                )
        if self.schedule_option is not None and (
            not isinstance(self.schedule_option, dict)
            or not set(self.schedule_option) <= set(_SCHEDULE_KEYS)
        ):
            raise ConfigError(
                "ProfileKwargs(schedule_option)",
                self.schedule_option,
                "a dict with keys among " + ", ".join(_SCHEDULE_KEYS),
            )
        if self.on_trace_ready is not None and not callable(self.on_trace_ready):
            raise ConfigError("ProfileKwargs(on_trace_ready)", self.on_trace_ready, "a callable")

    def _activities(self) -> list[torch.profiler.ProfilerActivity] | None:
        if self.activities is None:
            return None
        missing = [a for a in self.activities if not _usable(a)]
        if missing:
            usable = [a for a in _ACTIVITIES if _usable(a)]
            raise ConfigError(
                "ProfileKwargs(activities)",
                self.activities,
                "activities this machine has: " + ", ".join(repr(a) for a in usable),
            )
        return [getattr(torch.profiler.ProfilerActivity, a.upper()) for a in self.activities]

    def build(self) -> torch.profiler.profile:
        """The ``torch.profiler.profile`` these options describe (not started)."""
        schedule = None
        if self.schedule_option is not None:
            schedule = torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=self._activities(),
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@contextlib.contextmanager
def profiled(
    handler: ProfileKwargs, rank: int, wait_for_everyone: Callable[[], None]
) -> Iterator[torch.profiler.profile]:
    """Profile the block; then, with ``output_trace_dir``, write this rank's trace and wait."""
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    folder = os.fspath(handler.output_trace_dir)
    os.makedirs(folder, exist_ok=True)
    profiler.export_chrome_trace(os.path.join(folder, PROFILE_PATTERN_NAME.format(suffix=rank)))
    wait_for_everyone()
