"""Where the ranks of a launch run, behind one interface.

    launcher.py: validate (LaunchConfig), pickle the payload (payload.build)
      config.cluster is None   -> this machine: local/engine.py (forkserver) or local/xla/
      config.cluster = "ray"   -> for_cluster(config) -> ray/driver.py's RayBackend
      run_with_restarts(backend, ...): banner, attempts, restarts, display closed at the end

A backend decides the plan from what it can reach (``plan``), takes the payload once
(``prepare``: a cluster puts it, and its large buffers, where every machine can read
them: its own transport at the seam of transport.py), runs one attempt of every
rank (``run``: output and progress into the display, results in rank order, the first failing
rank's own exception, nothing left running or reserved afterwards), and lets go of what it
holds between attempts (``close``). Another cluster engine (SLURM through submitit, say) is
one more module implementing ``Backend`` and one more case in ``for_cluster``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from ... import hardware
from ...config import LaunchConfig
from ...errors import ConfigError, LaunchTimeoutError
from ..show.display import Display
from ..wire.payload import Payload
from ..wire.pickling import Outgoing

__all__ = ["Backend", "for_cluster", "run_with_restarts"]

Watch = Callable[[], None] | None


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


def run_with_restarts(
    backend: Backend,
    config: LaunchConfig,
    payload: Payload,
    buffers: list[Outgoing],
    display: Display,
    watch: Watch,
) -> list[Any]:
    """The launcher's attempts on ``backend``: restart every rank up to ``max_restarts`` times."""
    plan = backend.plan()
    if config.fsdp is not None and plan.num_processes < 2:
        raise ConfigError("fsdp", config.fsdp.sharding_strategy, "FSDP with num_processes >= 2")
    backend.prepare(payload, buffers)
    try:
        note = config.file_note()
        display.banner(plan.describe() + (f"\n{note}" if note else ""))
        attempt = 0
        # timeout= bounds the whole launch, restarts included (as on this machine).
        deadline = None if config.timeout is None else time.monotonic() + config.timeout
        while True:
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                return backend.run(attempt, display, left, watch)
            except LaunchTimeoutError:
                raise LaunchTimeoutError(config.timeout) from None  # type: ignore[arg-type]
            except Exception as exc:  # not KeyboardInterrupt: the stop button is final
                if attempt >= config.max_restarts:
                    raise
                attempt += 1
                lines = str(exc).strip().splitlines()
                display.banner(
                    f"{type(exc).__name__}: {lines[0] if lines else ''} -- restarting every "
                    f"process (restart {attempt} of {config.max_restarts})"
                )
    finally:
        backend.close()
        display.close()
