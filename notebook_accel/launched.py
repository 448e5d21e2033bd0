"""What a rank knows of its launch: its place (WorkerEnv) and the launch (Launch), set once.

    notebook: LaunchConfig + the plan's device type and backend -> Launch (frozen), in every
              rank's WorkerEnv (launch/plan.py; a cluster's template; the TPU entry), with
              where the rank sits (RANK, WORLD_SIZE, MASTER_ADDR...: WorkerEnv.variables)
    worker:   become_rank(launch): the per-process state that the callbacks registered with
              forget_when_a_rank_starts hold is forgotten (a fork of a caller that built an
              Accelerator inherits what it noted), then the launch is this process's
    training: current(), option(name): the Accelerator's defaults (training/choices.py), the
              device and backend (training/process.py); None outside a launch of ours
              (torchrun, a plain process): then the Accelerator's own defaults hold

The environment variables a worker gets from its launch (``Launch.variables``) are for user
code and accelerate's classes; the package reads this object, never them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import env

if TYPE_CHECKING:
    from .config import LaunchConfig

__all__ = [
    "Launch",
    "WorkerEnv",
    "become_rank",
    "current",
    "device_type",
    "forget_when_a_rank_starts",
    "option",
]


@dataclass(frozen=True)
class Launch:
    """One launch as its ranks see it: its options (the LaunchConfig, whole) and where the
    plan put them."""

    options: LaunchConfig
    device_type: str = "cpu"
    backend: str = "gloo"

    def variables(self) -> dict[str, str]:
        """The variables every rank of this launch gets (derived from the options)."""
        return {
            **env.launch_variables(
                launched="1", device_type=self.device_type, backend=self.backend
            ),
            **self.options.worker_variables(),
        }


@dataclass(frozen=True)
class WorkerEnv:
    """What one worker receives: its place in the job and its launch, from which its
    environment variables are derived."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    launch: Launch
    loopback: bool = True
    # Where the ranks meet and TORCHELASTIC_RESTART_COUNT, the same for every rank.
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def device_type(self) -> str:
        return self.launch.device_type

    @property
    def backend(self) -> str:
        return self.launch.backend

    def variables(self) -> dict[str, str]:
        """torch.distributed's variables of this rank, then its launch's (for user code)."""
        out = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            **self.launch.variables(),
        }
        # A store someone else hosts, as under torchrun's agent: no rank of a plain env://
        # (torch's own handler) hosts one at MASTER_ADDR:MASTER_PORT. On one machine or several
        # env:// meets in the launch's private store (launch/rank/worker_store.py); on Ray,
        # rank 0's task hosts the TCPStore beside the function (launch/cluster/ray/store.py).
        out["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        if self.loopback:
            # Keep gloo's and NCCL's bootstrap sockets on loopback for single-machine launches.
            out["GLOO_SOCKET_IFNAME"] = out["NCCL_SOCKET_IFNAME"] = env.loopback_interface()
        out.update(dict(self.extra))
        return out


_current: Launch | None = None
_lock = threading.Lock()
_forgetters: list[Callable[[], None]] = []


def forget_when_a_rank_starts(callback: Callable[[], None]) -> Callable[[], None]:
    """Have ``callback`` run when this process (or a fork of it) becomes a rank: the
    training side registers how its per-process state is forgotten (a decorator too)."""
    if callback not in _forgetters:
        _forgetters.append(callback)
    return callback


def become_rank(launch: Launch | None) -> None:
    """This process is a new rank of ``launch`` (None: of none, e.g. a Ray worker given back):
    what a caller or an earlier rank noted is forgotten first. Once per process for a launch:
    the device threads of one TPU process each call it with the same object."""
    global _current
    with _lock:
        if launch is not None and launch is _current:
            return
        for forget in _forgetters:
            forget()
        _current = launch


def current() -> Launch | None:
    """The launch this process is a rank of, or None."""
    return _current


def device_type() -> str | None:
    """The device type the launch's plan chose for this rank (None outside a launch)."""
    return None if _current is None else _current.device_type


def option(name: str) -> Any:
    """The launch's value of option ``name`` for the workers (``Option.worker``), or None
    outside a launch of ours.

    Example:
        >>> option("mixed_precision") is None  # not in a rank
        True
    """
    if _current is None:
        return None
    from .config import options  # the table (torch-free)

    spec = options(type(_current.options)).get(name)
    if spec is None or not spec.worker:
        raise KeyError(f"{name!r} is not an option the workers take")
    return getattr(_current.options, name)
