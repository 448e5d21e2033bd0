"""Where the ranks of a launch run when it is not this machine, behind one interface.

    launcher.py: validate (LaunchConfig), pickle the payload (payload.build)
      config.cluster is None   -> this machine: local/engine.py (forkserver) or local/xla/
      config.cluster = "ray"   -> for_cluster(config) -> ray/driver.py's RayBackend
      then, as on this machine: the banner, attempts and restarts (launcher._attempts)

A backend decides the plan from what it can reach (``plan``), takes the payload once
(``prepare``: a cluster puts it, and its large buffers, where every machine can read
them: its own transport at the seam of transport.py), runs one attempt of every
rank (``run``: output and progress into the display, results in rank order, the first failing
rank's own exception, nothing left running or reserved afterwards), and lets go of what it
holds between attempts (``close``). Another cluster engine (SLURM through submitit, say) is
one more module implementing ``Backend`` and one more case in ``for_cluster``.
"""

from __future__ import annotations

from typing import Any, Protocol

from ... import hardware
from ...config import LaunchConfig
from ...errors import ConfigError
from ..plan import Watch
from ..show.display import Display
from ..wire.payload import Payload
from ..wire.pickling import Outgoing

__all__ = ["Backend", "for_cluster"]


class Backend(Protocol):
    """What the launcher needs from a place where ranks run."""

    name: str

    def plan(self) -> hardware.Plan:
        """Hardware, number of ranks and backend, from what the place offers."""
        ...

    def prepare(self, payload: Payload, buffers: list[Outgoing]) -> None:
        """Take the payload and its large buffers once, for every attempt and every rank."""
        ...

    def run(self, attempt: int, display: Display, timeout: float | None, watch: Watch) -> list[Any]:
        """Run every rank once; results in rank order, or raise the root cause."""
        ...

    def close(self) -> None:
        """Release what ``prepare`` holds."""
        ...


def for_cluster(config: LaunchConfig) -> Backend:
    """The backend that ``config.cluster`` names (imports its engine only now)."""
    cluster = config.cluster or ""
    if cluster == "ray" or cluster.startswith("ray://"):
        from .ray.driver import RayBackend

        return RayBackend(config)
    raise ConfigError("cluster", cluster, "None, 'ray' or 'ray://HOST:PORT'")
