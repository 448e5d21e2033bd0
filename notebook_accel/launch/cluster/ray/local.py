"""A stand-in Ray cluster on this machine: several Ray nodes, every address 127.0.0.1.

For trying ``cluster="ray"`` without a cluster (the example notebook, the tests, the
benchmark). Each node is a real raylet with its own logical CPUs, so placement groups spread
ranks across nodes as on a real cluster.

Ray gives a starting node 30 s to register with the head; on a small, busy machine that can
run out. A failed start is retried after killing the processes it left behind (this
process's new descendants, found in /proc).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any

from .... import env
from ....private import ray as private_ray

__all__ = ["local_cluster"]

_TRIES = 3


def _descendants() -> set[int]:
    """Every process below this one (Linux /proc)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    found.discard(os.getpid())
    return found


def local_cluster(
    num_nodes: int = 2, num_cpus: int = 2, system_config: dict[str, Any] | None = None
) -> Any:
    """Start ``num_nodes`` Ray nodes on 127.0.0.1 with ``num_cpus`` logical CPUs each.

    Returns a ``ray.cluster_utils.Cluster``: join it with ``ray.init(address=c.address)`` and
    end it with ``c.shutdown()``. No dashboard, no usage statistics.

    Example:
        >>> cluster = local_cluster(num_nodes=2, num_cpus=2)  # doctest: +SKIP
        >>> ray.init(address=cluster.address)  # doctest: +SKIP
    """
    # Ray's "local only" mode keeps every address on 127.0.0.1; without it Ray swaps in the
    # machine's interface address. The node processes read the variable when they start;
    # this process read it when it imported ray, so a ray imported already is told directly.
    env.set_var("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if not env.ray_usage_stats_set():
        env.set_var("RAY_USAGE_STATS_ENABLED", "0")
    if "ray" in sys.modules:
        private_ray.local_only()
    from ray.cluster_utils import Cluster

    for tries_left in reversed(range(_TRIES)):
        before = _descendants()
        cluster = Cluster(initialize_head=False)
        try:
            for index in range(num_nodes):
                head: dict[str, Any] = {
                    "include_dashboard": False,
                    "_system_config": system_config or {},
                }
                cluster.add_node(
                    num_cpus=num_cpus, node_ip_address="127.0.0.1", **(head if index == 0 else {})
                )
            cluster.wait_for_nodes()
            return cluster
        except Exception:
            with contextlib.suppress(Exception):
                cluster.shutdown()
            for pid in _descendants() - before:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if not tries_left:
                raise
    raise AssertionError("unreachable")
