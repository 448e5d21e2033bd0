"""TPU cores as a backend: this machine's launch, each attempt handed to torch_xla's pool.

What differs from the local workers (local/backend.py): no forkserver (torch_xla spawns its
processes), and an attempt is ``engine.run`` here (one process per chip, a thread per device)
instead of the local Engine. The payload's shared memory, the rendezvous of several machines
and their group are the same.
"""

from __future__ import annotations

from typing import Any

from ...plan import Watch, layout_for
from ...show.display import Display
from ..backend import LocalBackend
from .engine import run

__all__ = ["XlaBackend"]


class XlaBackend(LocalBackend):
    """A launch's ranks as this machine's TPU devices, through torch_xla."""

    name = "xla"

    def _warm_up(self) -> None:
        """torch_xla spawns its own processes: no forkserver to start."""

    def _attempt(
        self, attempt: int, display: Display, timeout: float | None, watch: Watch
    ) -> list[Any]:
        assert self._payload is not None, "prepare() first"
        layout = layout_for(self.config, self._plan, attempt)
        return run(layout, self._payload, display, timeout, watch)
