"""Every way to launch is a backend: the one interface the launcher runs its attempts over.

    launcher.py: validate (LaunchConfig), pickle the payload (payload.build), pick a backend:
      config.cluster is None  -> local/backend.py: this machine's workers (local/engine.py,
                                 forkserver), or TPU cores (local/xla/backend.py)
      config.cluster = "ray"  -> cluster/backend.py -> cluster/ray/driver.py's RayBackend
    then, the same for each:
      plan()                      hardware, number of ranks and backend, from what it reaches
      (launcher: the options against the job's size, the banner)
      prepare(payload, buffers)   the payload and its large buffers taken once (shared
                                  memory, Ray's object store), where the ranks meet
      run(attempt, ...)           every rank once: output and reports into the display,
                                  results in rank order, or the root cause raised
                                  (wire/outcome.py); nothing left running afterwards
      group                       the machines that restart together (meet/group.py; one
                                  machine, or a cluster: a group of one)
      close()                     what prepare holds, let go

Another engine (SLURM through submitit, say) is one more class implementing ``Backend``.
"""

from __future__ import annotations

from typing import Any, Protocol

from .. import hardware
from .meet.group import Group
from .plan import Watch
from .show.display import Display
from .wire.payload import Payload
from .wire.pickling import Outgoing

__all__ = ["Backend"]


class Backend(Protocol):
    """What the launcher needs from a place where ranks run."""

    name: str
    group: Group  # set by prepare()

    def plan(self) -> hardware.Plan:
        """Hardware, number of ranks and backend, from what the place offers; a bad choice
        is a ConfigError here, before any process starts."""
        ...

    def prepare(self, payload: Payload, buffers: list[Outgoing], display: Display) -> None:
        """Take the payload and its large buffers once, for every attempt and every rank."""
        ...

    def run(self, attempt: int, display: Display, timeout: float | None, watch: Watch) -> list[Any]:
        """Run every rank once; results in rank order, or raise the root cause."""
        ...

    def close(self, display: Display) -> None:
        """Release what ``prepare`` holds."""
        ...
