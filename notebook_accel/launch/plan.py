"""What a launch is on this machine: its hardware plan, and where each rank sits.

    LaunchConfig -> plan_for -> hardware.Plan (hardware, processes, backend), the options
                                checked against the job's size
    LaunchConfig, Plan, attempt, store -> layout_for -> Layout: node, ranks, the launch
                                (launched.Launch: the options, whole), where they meet
    Layout.worker_env(local_rank, port) -> launched.WorkerEnv of one rank

The local engine, the TPU path and a session start their workers from a Layout; a cluster
backend (cluster/) makes its own plan from what the cluster offers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import env, hardware
from ..config import LaunchConfig
from ..launched import Launch, WorkerEnv
from ..options import rules
from .meet.network import network_env

__all__ = [
    "Layout",
    "Watch",
    "banner",
    "checked_size",
    "layout_for",
    "plan_for",
    "watch_for_stop",
    "watching",
]

# Called every tick while the ranks run (an Engine, a cluster's Backend); raising from it
# stops them (the stop button, another machine of the group restarting: meet/group.py).
Watch = Callable[[], None] | None


@dataclass(frozen=True)
class Layout:
    """Where this machine's ranks sit in the job, and the launch they are ranks of."""

    num_processes: int
    launch: Launch
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    extra_env: tuple[tuple[str, str], ...] = ()

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    @property
    def device_type(self) -> str:
        return self.launch.device_type

    def worker_env(self, local_rank: int, port: int) -> WorkerEnv:
        return WorkerEnv(
            rank=self.node_rank * self.num_processes + local_rank,
            local_rank=local_rank,
            world_size=self.world_size,
            local_world_size=self.num_processes,
            node_rank=self.node_rank,
            master_addr=self.master_addr,
            master_port=port,
            launch=self.launch,
            loopback=self.num_nodes == 1,
            extra=self.extra_env,
        )


def plan_for(config: LaunchConfig, machine: hardware.Machine | None = None) -> hardware.Plan:
    """The hardware plan, and the checks of the options against its number of processes."""
    plan = hardware.resolve(config, machine)
    checked_size(config, plan)
    return plan


def checked_size(config: LaunchConfig, plan: hardware.Plan) -> None:
    """Refuse options the job's size does not allow (options/rules.py: FSDP in one process,
    a mesh whose sizes do not multiply to the job's processes), on this machine's plan or a
    cluster's."""
    rules.sized(
        plan.num_processes * config.num_nodes,
        fsdp=None if config.fsdp is None else config.fsdp.sharding_strategy,
        mesh=config.parallelism_config,
    )


def banner(config: LaunchConfig, plan: hardware.Plan, kept: str = "") -> str:
    """The launch's first line (what runs where; ``kept``: a session's words), and which of
    its values came from the config file."""
    note = config.file_note()
    return plan.describe(config.num_nodes) + kept + (f"\n{note}" if note else "")


def layout_for(
    config: LaunchConfig,
    plan: hardware.Plan,
    attempt: int,
    store: Sequence[tuple[str, str]] = (),
) -> Layout:
    """Where this machine's ranks sit, and the variables every one of them gets (``store``:
    where they meet, rendezvous.py)."""
    extra = [("TORCHELASTIC_RESTART_COUNT", str(attempt)), *store]
    extra.extend(network_env(config))
    if config.fsdp is not None:  # a value the user set wins
        wanted = config.fsdp.worker_variables(plan.device_type).items()
        now = env.snapshot()
        extra.extend((name, value) for name, value in wanted if name not in now)
    return Layout(
        num_processes=plan.num_processes,
        launch=Launch(config, plan.device_type, plan.backend),
        node_rank=config.node_rank,
        num_nodes=config.num_nodes,
        master_addr="127.0.0.1" if config.num_nodes == 1 else config.master_addr,
        extra_env=tuple(extra),
    )


def watching(*watches: Watch) -> Watch:
    """One watch that calls each of ``watches`` in turn (None: none to call)."""
    present = [watch for watch in watches if watch is not None]
    if len(present) < 2:
        return present[0] if present else None

    def check() -> None:
        for watch in present:
            watch()

    return check


def watch_for_stop(stop: threading.Event | None, why: str) -> Watch:
    """[panel hook, faces/panel.py; Job.stop] A set ``stop`` ends the wait as an interrupt does
    (``KeyboardInterrupt(why)``)."""
    if stop is None:
        return None

    def check() -> None:
        if stop.is_set():
            raise KeyboardInterrupt(why)

    return check
