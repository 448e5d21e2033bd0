"""Warm workers kept busy between launches, so that Ray's idle-worker policy spares them.

Why: a finished rank's worker goes back to its node's pool with torch imported, and the next
launch's rank runs in it. But Ray ends a node's idle workers beyond its soft limit, the
node's *free* CPUs, once they have idled over ``idle_worker_killing_time_threshold_ms``
(1 s by default; its raylet looks every 200 ms). The next launch's placement group takes
those CPUs about 0.1 s before its ranks' requests reach the node (a request goes through the
notebook's node, and the rank's argument is fetched first): after a pause of over a second,
the warm workers looked surplus in that window and were ended (4 of 15 launches after 10 s
or 60 s here; raylet debug log: "Number of idle workers 2 is larger than the number of
desired workers 0 killing idle worker"), and those ranks booted fresh workers, seconds
instead of ~0.2 s. A worker that Ray prestarts with a keep-alive (keep_warm) is spared, but
it is a new process, and Ray hands ranks the workers that ran tasks before it.

So the workers do not wait idle. At a launch's end, each node whose ranks gave their workers
back gets as many ``hold`` tasks (0 CPUs, pinned to the node), which Ray runs in idle
workers of the job, the most recently returned first. They are asked for while the launch's
placement group still holds the nodes' CPUs: Ray's raylet boots extra workers for a backlog
of tasks up to the node's free CPUs, so none then. A worker running a task is not idle, and
Ray never ends it. The next launch waits until its placement group is reserved, then cancels
the holds (``ray.cancel``: a KeyboardInterrupt, which ``hold`` sees within ``_TICK``) and
asks for its ranks: the workers are idle again for a tenth of a second, under Ray's limit,
and the ranks run in them.

The holds reserve nothing (0 CPUs, no placement group): other jobs get every CPU. Their
processes are this job's workers, as the idle ones were, and Ray ends them with the job (the
notebook's ``ray.shutdown()`` or exit). Not under Ray Client (its ranks are actors) nor for
GPU ranks (Ray does not reuse their workers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

__all__ = ["hold", "park", "parked", "unpark"]

_TICK = 0.02  # seconds between a hold's looks at a cancel (Ray's cancel is seen between bytecodes)
_RELEASE_WAIT = 1.0  # seconds to wait for holds to run (parking) or to end (unparking)
_RECANCEL = 0.1  # seconds between two cancels of a hold that has not ended

_lock = threading.Lock()
_holds: dict[str, list[tuple[str, Any]]] = {}  # job id -> (node, hold task) of each parked worker


def hold() -> Iterator[int]:
    """A parked worker's task: yields its process's pid once running, then waits, busy,
    until cancelled."""
    yield os.getpid()
    # Ray's cancel simulates a SIGINT, which Python ignores where the process inherited SIGINT
    # ignored (a cluster started in the background, e.g. with nohup or &): the hold would
    # never end. Python's own handler while it holds; the worker's is put back after.
    restore = None
    with contextlib.suppress(ValueError):  # not the main thread: as it is
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            restore = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            time.sleep(_TICK)
    except KeyboardInterrupt:  # ray.cancel (not forced): the next launch wants this worker
        return
    finally:
        if restore is not None:
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGINT, restore)


def _job(ray: Any) -> str:
    return str(ray.get_runtime_context().get_job_id())


def park(ray: Any, workers_per_node: dict[str, int]) -> None:
    """Keep ``workers_per_node[node]`` of this job's idle workers on each node busy with a
    hold, and wait (a moment at most) until the holds run.

    Call it once the launch's workers are back in their nodes' pools, while its placement
    group still holds their CPUs (see the module's docstring).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    job = _job(ray)
    remote = ray.remote(num_cpus=0, max_retries=0, num_returns="streaming")(hold)
    asked = [
        (node, remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, False)))
        for node, count in workers_per_node.items()
        for _ in range(count)
    ]
    holds = [(node, task.remote()) for node, task in asked]
    with _lock:
        for other in [j for j in _holds if j != job]:  # an earlier connection's: gone with it
            del _holds[other]
        _holds.setdefault(job, []).extend(holds)
    streams = [stream for _, stream in holds]
    ray.wait(streams, num_returns=len(streams), timeout=_RELEASE_WAIT)


def parked(ray: Any) -> int:
    """How many of this job's workers are parked."""
    with _lock:
        return len(_holds.get(_job(ray), []))


def unpark(ray: Any) -> dict[str, int]:
    """Cancel this job's holds and wait (a moment at most) until they end: their workers are
    idle in their nodes' pools again. Returns how many were handed back on each node.

    A hold is cancelled once it runs: cancelled while Ray is still granting it a worker, that
    worker would stay leased to the notebook a moment longer, and a rank asking meanwhile
    would have Ray boot a fresh one.
    """
    with _lock:
        holds = _holds.pop(_job(ray), [])
    if not holds:
        return {}
    streams = [stream for _, stream in holds]
    with contextlib.suppress(Exception):
        ray.wait(streams, num_returns=len(streams), timeout=_RELEASE_WAIT)  # each running
    running = set()
    for index, stream in enumerate(streams):
        with contextlib.suppress(Exception):  # not running (yet), or its worker or node died
            ray.get(next(stream), timeout=0)
            running.add(index)
        with contextlib.suppress(Exception):
            ray.cancel(stream)
    # An interrupt that reaches the worker while Ray's own code runs (the hold's first item
    # being reported) is lost: cancel again until each hold has ended, then end its worker.
    ends = [stream.completed() for stream in streams]
    ended: list[Any] = []
    deadline = time.monotonic() + _RELEASE_WAIT
    while len(ended) < len(ends) and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            ended = ray.wait(ends, num_returns=len(ends), timeout=_RECANCEL)[0]
        for stream, end in zip(streams, ends, strict=True):
            if end not in ended:
                with contextlib.suppress(Exception):
                    ray.cancel(stream)
    back: Counter[str] = Counter()
    for index, (node, stream) in enumerate(holds):
        if ends[index] not in ended:  # still holding: its worker ends
            with contextlib.suppress(Exception):
                ray.cancel(stream, force=True)
        elif index in running:
            back[node] += 1
    return dict(back)
