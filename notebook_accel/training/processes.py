"""PartialState: accelerate's process-level helpers, over one ``ProcessState``, no singleton.

    PartialState(cpu=..., **InitProcessGroupKwargs(...).to_kwargs())
        -> ProcessState.from_environment(...)   (joins the process group, or reuses it)
    its facts by accelerate's names: ProcessView's (process_index, is_main_process, ...)

accelerate's ``PartialState`` is a Borg: every instance shares one global dict. Here each
instance reads the environment itself (the process group is the only shared thing, and torch
already keeps it), so code that builds ``PartialState()`` anywhere sees the same facts without
a global this package would have to reset between launches.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch.distributed as dist

from ..errors import ConfigError
from . import collectives
from .process import ProcessState, ProcessView

__all__ = ["PartialState"]

F = TypeVar("F", bound=Callable[..., Any])


def _do_nothing(*args: Any, **kwargs: Any) -> None:
    """What a decorated function becomes on the processes that must not run it."""
    return None


class PartialState(ProcessView):
    """Where this process sits in the job, and the helpers that depend on it.

    Args:
        cpu: use the CPU even where a GPU exists.
        **kwargs: ``backend``, ``init_method`` and ``timeout`` for the process group, as
            ``InitProcessGroupKwargs(...).to_kwargs()`` gives them (used only when this call
            creates the group).

    Example:
        >>> state = PartialState()
        >>> state.process_index, state.num_processes
        (0, 1)
        >>> @state.on_main_process
        ... def report() -> str:
        ...     return "rank 0 only"
    """

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self._process = ProcessState.from_environment(cpu=cpu, group_options=kwargs)

    # accelerate's names for the process's facts: ProcessView's (device, process_index, ...)
    @property
    def backend(self) -> str | None:
        """The torch.distributed backend; ``None`` in a single process (as accelerate has it)."""
        return self._process.backend if self.use_distributed else None

    @property
    def initialized(self) -> bool:
        """Always True: a PartialState is built complete."""
        return True

    # ---- synchronisation -------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Barrier across all processes (a no-op in one process)."""
        self._process.barrier()

    @contextlib.contextmanager
    def _goes_first(self, first: bool) -> Iterator[None]:
        if not first:
            self.wait_for_everyone()
        yield
        if first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on the main process first (e.g. a download), then on the others."""
        return self._goes_first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Run the block on each machine's local main process first, then on the others."""
        return self._goes_first(self.is_local_main_process)

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        """This process's share of ``inputs`` (see :func:`collectives.split_between_processes`)."""
        return collectives.split_between_processes(inputs, apply_padding=apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each machine's local main process only (as accelerate does)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self) -> None:
        """Leave the default process group, if there is one."""
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    # ---- decorators: run on some processes only (``None`` elsewhere) -----------------------
    def _only(self, function: F | None, chosen: bool, name: str) -> F:
        if function is None:
            raise ConfigError("function", None, f"a function to decorate with {name}")
        # One process: every such function runs, as under accelerate.
        return function if chosen or not self.use_distributed else _do_nothing  # type: ignore[return-value]

    def on_main_process(self, function: F | None = None) -> F:
        """Decorator: run ``function`` on the main process only."""
        return self._only(function, self.is_main_process, "on_main_process")

    def on_local_main_process(self, function: F | None = None) -> F:
        """Decorator: run ``function`` on each machine's local main process only."""
        return self._only(function, self.is_local_main_process, "on_local_main_process")

    def on_last_process(self, function: F | None = None) -> F:
        """Decorator: run ``function`` on the last process only."""
        return self._only(function, self.is_last_process, "on_last_process")

    def on_process(self, function: F | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on global rank ``process_index`` only.

        Both ``@state.on_process(process_index=1)`` and ``state.on_process(f, 1)`` work.
        """
        if function is None:
            _check_index("process_index", process_index)
            return functools.partial(self.on_process, process_index=process_index)
        _check_index("process_index", process_index)
        return self._only(function, self.process_index == process_index, "on_process")

    def on_local_process(
        self, function: F | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` on local rank ``local_process_index`` of each machine."""
        if function is None:
            _check_index("local_process_index", local_process_index)
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        _check_index("local_process_index", local_process_index)
        chosen = self.local_process_index == local_process_index
        return self._only(function, chosen, "on_local_process")

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}"
            f"{'  Backend: ' + self.backend if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )


def _check_index(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(name, value, "an int >= 0")
