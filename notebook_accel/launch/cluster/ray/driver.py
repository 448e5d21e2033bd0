"""The Ray cluster backend: one Ray task per rank, each in its bundle of a placement group.

    notebook (the Ray driver)                        the cluster
    -------------------------                        -----------
    connect: the cluster this process joined
      (ray.init by the user), else RAY_ADDRESS,
      else cluster="ray://HOST:PORT" (Ray Client)
    prepare: ray.put(payload) once, and     ---->    object store (each node fetches it once)
      each large buffer once (RayShipment,
      the transport seam of transport.py)
    each attempt:
      placement group, N bundles of                  N bundles reserved (PACK or SPREAD)
        resources_per_worker
      earlier ranks' workers parked? once the ---->  their holds end: the workers are idle
        group is reserved, cancel their holds        in their nodes' pools again
        (parking.py)
      N rank tasks (ranks.py), bundle i each, --->   each in an idle Ray worker of its node:
        streaming (asked for with the group          one that ran an earlier launch's rank
        when nothing was parked)                     (torch imported)
                                                     bundle 0 hosts the TCPStore on its node,
                                                     publishes its address (Ray's KV store);
                                                     every rank writes its node there and
                                                     works out its rank (rank_envs)
      loop: the next item of every stream    <----   Placed(rank, node), then Output(batch)
              -> display                             as fds 1/2 and tqdm write, then
            watch (Stop), deadline                   Ended(outcome, rest): large buffers
                                                     via the object store
            a quiet launch: the stall report  ---->  a question in Ray's KV store, answered
              (where.py)                      <----  in the rank's output (a Where)
      the root cause (wire/outcome.py): the first failing rank's own exception, a
        WorkerDiedError for a dead worker
      finally: cancel (kill) the ranks still running, let the finished ones give their
        workers back and park them (a 0-CPU hold task each, parking.py), remove the
        placement group, wait until Ray sees it free; keep_warm asks the nodes of killed
        ranks to start idle workers: nothing stays reserved

Why tasks and not actors: an actor's process ends with the actor, so with one actor per
rank every launch after the first booted fresh Ray workers (``import ray`` then torch, about
3 CPU s each) while the ranks waited. A task's worker goes back to the node's pool, and the
next launch's rank runs in it with torch already imported: a launch right after another is
about a tenth of a second, not seconds (benchmarks/ray_launch.py). The state a worker keeps
is what any Ray task leaves (imported modules); the rank gives back the environment, fds 1/2
and Python's streams, and every notebook_accel object is per launch (training/processes.py). GPU
ranks are never reused (Ray's rule for GPU tasks: a CUDA context stays with its process).
Between launches the workers do not wait idle: Ray ends a node's idle workers beyond its
free CPUs once they have waited over a second, and the next launch's placement group takes
those CPUs a moment before its ranks reach the node; after a pause, the warm workers were
ended in that moment in about one launch of four and its ranks booted fresh ones (seconds).
So each waits busy in a 0-CPU hold task, which the next launch cancels once its group is
reserved (parking.py), and a launch after 10 s or 60 s idle runs in the same processes as
one right after another. The holds reserve nothing, and Ray ends their processes with the
job.

Ray Client (cluster="ray://HOST:PORT") has no streaming tasks: there each rank's items come
from a ``RankHost`` actor that runs the same ``rank_task`` on a thread and hands them over when
asked (``take``); those processes end with the launch, as actors do.

The ranks print into pipes that their own threads read, so the cell shows ``[rank N]`` whole
lines (display.py) and never Ray's ``(pid=..., ip=...)`` prefixes. The function runs on a
thread of its task, not on the process's main thread, which yields the output (as in Ray
Train, whose functions run on an actor's thread). Every machine of the cluster needs
notebook_accel and torch installed, as it needs them for Ray Train.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from .... import hardware
from ....config import LaunchConfig
from ....errors import ConfigError, LaunchTimeoutError, WorkerDiedError
from ....launched import Launch, WorkerEnv
from ....options import rules
from ....private import ray as private_ray
from ....reporting.channel import Failure, Result
from ...meet.group import Group
from ...show.display import Display
from ...wire.outcome import Died, Outcome, only_collateral, root_cause
from ...wire.payload import Payload
from ...wire.pickling import Outgoing
from ...wire.transport import Shipment, unpack
from ...wire.where import RankView
from . import parking
from .ranks import KV_NAMESPACE, Ended, Item, Output, Placed, RankHost, rank_task
from .shipment import RayShipment, as_array
from .where import RayRanks

__all__ = ["RayBackend", "connect", "describe_cluster", "keep_warm"]

_TICK = 0.1  # seconds between two looks at the ranks' output and outcomes
_POLL = 0.01  # seconds between two looks at Ray's view of the cluster's resources
_RETURN_WAIT = 1.0  # seconds a launch's end waits for Ray to see its resources free again
_FINISH_WAIT = 5.0  # seconds a finished rank's task may take to give its worker back
_COLLATERAL_GRACE = 10.0  # seconds a communication error waits for its root cause to show
_READY_NOTE = 30.0  # seconds of waiting for the placement group before saying so
_KEEP_WARM = 600  # seconds the idle workers started for the next launch outlive Ray's own limit


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "cluster",
            "ray",
            "a cluster engine that is installed",
            "Install it with: pip install 'notebook_accel[ray]'",
        ) from exc
    return ray


def connect(cluster: str) -> Any:
    """The ``ray`` module, connected: to the cluster joined already, RAY_ADDRESS's, or ray://."""
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    # "auto": RAY_ADDRESS, else a cluster started on this machine (`ray start --head`); never
    # a new private cluster, which is what a bare ray.init() would start.
    address = cluster if cluster.startswith("ray://") else "auto"
    try:
        # Our ranks relay their own output; Ray's copy of it would only add prefixed lines.
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            "cluster",
            cluster,
            "a Ray cluster this process can reach",
            f"Connecting failed ({exc}). Join one first with ray.init(address=...), set "
            "RAY_ADDRESS, or pass cluster='ray://HOST:PORT' (Ray Client).",
        ) from exc
    return ray


def describe_cluster(ray: Any) -> str:
    """One line: the nodes alive and the resources they have, e.g. for the panel."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    parts = [f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"]
    parts += [f"{total[k]:g} {k}" for k in ("CPU", "GPU") if total.get(k)]
    return "Ray cluster: " + ", ".join(parts)


def keep_warm(ray: Any, ranks_per_node: dict[str, int]) -> None:
    """Have each node start, for the next launch, an idle worker per rank whose process ended.

    A rank stopped, killed with its node, or on a GPU leaves no worker in the pool, so the
    next launch would boot a fresh Ray worker there (``import ray``, ~1.7 CPU s) while the
    ranks wait. Each node's raylet is asked directly (its PrestartWorkers call, the one Ray's
    own pool uses): idle workers of this job, fit for any task, kept ``_KEEP_WARM`` seconds
    even beyond Ray's idle limit, and ended with the job.
    They reserve no resources. Best effort, on a thread: an answer that never comes (a raylet
    that went away, a protocol that changed) leaves the next launch as it would have been.
    Not under Ray Client, whose notebook cannot reach the raylets, nor for a job with a
    ``runtime_env`` (its workers are keyed by that environment).
    """
    context = ray.get_runtime_context()
    if private_ray.client_connected() or context.runtime_env:
        return
    job = bytes.fromhex(context.get_job_id())
    raylets = {
        node["NodeID"]: f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
        for node in ray.nodes()
        if node.get("Alive") and node["NodeID"] in ranks_per_node
    }
    asks = [(raylets[node], count) for node, count in ranks_per_node.items() if node in raylets]
    threading.Thread(target=_prestart, args=(job, asks), name="ray-keep-warm", daemon=True).start()


def _prestart(job: bytes, asks: list[tuple[str, int]]) -> None:
    for address, count in asks:
        try:
            if not private_ray.prestart_workers(address, job, count, _KEEP_WARM):
                return  # another Ray layout: nothing to keep warm with
        except Exception:  # noqa: BLE001 - best effort; the next launch boots its own workers
            continue


def _value(shipment: Shipment | None, result: Result) -> Any:
    if shipment is None:
        return pickle.loads(result.value)
    return unpack(shipment, result)


def _split_resources(resources: dict[str, float]) -> dict[str, Any]:
    """A bundle's resources as task options (num_cpus, num_gpus, memory, resources)."""
    options: dict[str, Any] = {
        "num_cpus": resources.get("CPU", 0),
        "num_gpus": resources.get("GPU", 0),
    }
    if "memory" in resources:
        options["memory"] = resources["memory"]
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
    if custom:
        options["resources"] = custom
    return options


def _died(rank: int, error: BaseException) -> WorkerDiedError:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # Ray's message names the node when the node died; else its first line about the death.
    reason = next((line for line in lines if "node" in line.lower()), "") or next(
        (line for line in lines if "died" in line), ""
    )
    died = WorkerDiedError(rank, -signal.SIGKILL)
    died.args = (
        f"rank {rank}'s Ray worker died without a Python exception (its process or its node "
        f"ended). Ray says: {reason or (lines[0] if lines else type(error).__name__)}",
    )
    return died


class RayBackend:
    """The ranks of a launch as Ray tasks in a placement group (see the module docstring)."""

    name = "ray"

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.group = Group(config, None)  # restarts: the cluster's ranks alone
        self.ray = connect(config.cluster or "ray")
        requested = dict(config.resources_per_worker or {})
        if config.hardware == "cuda" and not requested.get("GPU"):
            requested["GPU"] = 1
        if not requested.get("CPU") and not requested.get("GPU"):
            requested["CPU"] = 1
        self.resources: dict[str, float] = requested
        self._payload: Payload | None = None
        self._payload_ref: Any = None
        self._plan: hardware.Plan | None = None
        # this attempt's rank of each bundle as they meet, its node (keep_warm) and process
        self._placed: dict[int, Placed] = {}
        self._running: dict[int, Any] = {}  # bundle -> its stream, until its last item
        self._outcomes: dict[int, Outcome] = {}  # bundle -> how it ended
        self._takes: dict[int, Any] = {}  # Ray Client: each rank's take in flight
        self._client = private_ray.client_connected()  # no streaming tasks: actors (RankHost)

    # -- Backend ----------------------------------------------------------------------------
    def plan(self) -> hardware.Plan:
        """Hardware from the resources each rank requests; ranks bounded by the cluster's."""
        config, ray = self.config, self.ray
        gpu = self.resources.get("GPU", 0) > 0
        total = ray.cluster_resources()
        default = int(total.get("GPU", 0) // self.resources["GPU"]) if gpu else 2
        n = config.num_processes or max(1, default)  # one rank per GPU, else 2 (as locally)
        rules.on_cluster(n, hardware=config.hardware, resources=self.resources, total=total)
        # The local rules of precision, for the kind of device each rank gets.
        local = config.replace(
            hardware="cuda" if gpu else "cpu",
            num_processes=1,
            cluster=None,
            resources_per_worker=None,
            max_restarts=0,
        )
        machine = hardware.Machine(cpu_cores=1, cuda_names=("Ray GPU",) if gpu else ())
        plan = hardware.resolve(local, machine)
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        label = f"{'CUDA' if gpu else 'CPU'} on a Ray cluster of {nodes} node" + (
            "s" if nodes != 1 else ""
        )
        self._plan = dataclasses.replace(plan, num_processes=n, label=label)
        return self._plan

    def prepare(self, payload: Payload, buffers: list[Outgoing], display: Display) -> None:
        """Put the payload and each large buffer in the object store once, for every rank."""
        shipment = RayShipment([self.ray.put(as_array(out)) for out in buffers])
        # The ranks keep their node's environment; the notebook's (tokens included) stays.
        self._payload = dataclasses.replace(payload, environ={}, shipment=shipment)
        self._payload_ref = self.ray.put(self._payload)

    def close(self, display: Display) -> None:
        # The object store frees the payload and its buffers with their last references.
        if self._payload is not None and self._payload.shipment is not None:
            self._payload.shipment.release()
        self._payload_ref = None

    def run(
        self,
        attempt: int,
        display: Display,
        timeout: float | None,
        watch: Callable[[], None] | None,
    ) -> list[Any]:
        """One attempt: a new placement group and rank tasks, removed whatever the ending."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        assert self._plan is not None and self._payload is not None, "plan() and prepare() first"
        deadline = None if timeout is None else time.monotonic() + timeout

        def check() -> None:
            if watch is not None:
                watch()
            if deadline is not None and time.monotonic() >= deadline:
                raise LaunchTimeoutError(timeout)  # type: ignore[arg-type]

        n = self._plan.num_processes
        group = placement_group(
            [dict(self.resources) for _ in range(n)], strategy=self.config.placement_strategy
        )
        key = f"launch/{uuid.uuid4().hex}"
        template = self._template(attempt, n)
        streams: list[Any] = []
        self._placed, self._takes = {}, {}
        stalls = RayRanks(key, self._rank_states, self._payload.code_origins)
        outcomes: dict[int, Outcome] = {}
        released: dict[str, int] = {}  # parked workers handed back for this attempt, per node
        try:
            ready = group.ready()  # a reply from Ray's control store, no worker involved
            noting = self._noting_waits(ready, check, display)
            if not self._client and parking.parked(self.ray):
                # Earlier ranks' workers wait busy (parking.py) until the group is reserved:
                # idle meanwhile, Ray would count them against the node's free CPUs, which
                # the group takes, and end them. Handed back now, they are idle for a moment
                # only and the ranks asked for next run in them.
                self._until_reserved(ready, noting, display)
                released = parking.unpark(self.ray)
            # Else asked for with the group, not after it is ready: Ray grants each task its
            # bundle (and an idle worker of the node's pool) the moment it is reserved.
            remote = self._remote_rank()
            for bundle in range(n):
                placed = remote.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=bundle
                    )
                )
                args = (bundle, n, template, self._payload_ref, key)
                if self._client:
                    host = placed.remote()
                    host.start.remote(*args)
                    streams.append(host)
                else:
                    streams.append(placed.remote(*args))
            stall_watch = display.watch_stalls(self.config.stall_time, stalls)
            assert stall_watch is not None
            try:
                outcomes = self._supervise(streams, display, noting)
            except (LaunchTimeoutError, KeyboardInterrupt) as exc:
                # [stall report] where each rank was, into the error's notes
                stall_watch.note(exc, lambda seconds: self._step(display, seconds))
                raise
        finally:
            display.watch_stalls(None, None)
            returned = self._end(streams, outcomes)
            with contextlib.suppress(Exception):  # best effort: else the workers wait idle
                self._park(group, returned, released)
            with contextlib.suppress(Exception):
                held = self.ray.available_resources()
                remove_placement_group(group)
                self._until_returned(held, n)
            with contextlib.suppress(Exception):
                private_ray.kv_del(key, KV_NAMESPACE)
            with contextlib.suppress(Exception):
                stalls.close()
            for rank in range(n):
                display.end(rank, "stdout")
                display.end(rank, "stderr")
        return self._results({self._rank(b): o for b, o in outcomes.items()})

    # -- the steps of an attempt ------------------------------------------------------------
    def _noting_waits(
        self, ready: Any, check: Callable[[], None], display: Display
    ) -> Callable[[], None]:
        """``check``, which also says once when the group (``ready``: its reference that
        resolves once it is reserved) has waited long for its resources."""
        since = time.monotonic()
        noted = False

        def noting() -> None:
            nonlocal noted
            check()
            if noted or time.monotonic() - since < _READY_NOTE:
                return
            noted = True
            if not self.ray.wait([ready], timeout=0)[0]:
                display.banner(
                    f"waiting for the cluster to free {self._plan.num_processes} x "  # type: ignore[union-attr]
                    f"{self.resources} (other jobs hold them)"
                )

        return noting

    def _until_reserved(self, ready: Any, noting: Callable[[], None], display: Display) -> None:
        """Wait until the placement group is reserved, checking (stop, deadline) meanwhile."""
        while not self.ray.wait([ready], timeout=_TICK)[0]:
            noting()
            display.tick()

    def _park(self, group: Any, returned: dict[str, int], released: dict[str, int]) -> None:
        """Park the workers that are idle on each node now (parking.py): the ranks' that went
        back to the pool, and the parked ones handed back for this attempt that no rank took.

        Once the group's bundles are free again (the ranks' workers are back in the pool),
        while it still holds the nodes' CPUs (Ray then boots no extra worker for the holds).
        """
        ranks_on = Counter(p.node for p in self._placed.values())
        counts = Counter(returned)
        for node, count in released.items():
            counts[node] += max(0, count - ranks_on[node])
        if not +counts:
            return
        n = self._plan.num_processes  # type: ignore[union-attr]
        end = time.monotonic() + _RETURN_WAIT
        while time.monotonic() < end and not private_ray.group_free(
            self.ray.available_resources(), group.id.hex(), self.resources, n
        ):
            time.sleep(_POLL)
        parking.park(self.ray, dict(+counts))

    def _until_returned(self, held: dict[str, float], n: int) -> None:
        """Wait (a moment at most) until Ray's view of the cluster has the group's share back.

        Ray places a new group against that view: asked for too early, the next launch's group
        waits a second for a retry, and the warm workers left idle meanwhile may be ended.
        """
        end = time.monotonic() + _RETURN_WAIT
        while time.monotonic() < end:
            free = self.ray.available_resources()
            if all(free.get(k, 0) >= held.get(k, 0) + v * n for k, v in self.resources.items()):
                return
            time.sleep(_POLL)

    def _template(self, attempt: int, world: int) -> WorkerEnv:
        """The variables every rank shares; each rank fills in its own (rank_envs)."""
        plan = self._plan
        assert plan is not None, "plan() first"
        return WorkerEnv(
            rank=0,
            local_rank=0,
            world_size=world,
            local_world_size=1,
            node_rank=0,
            master_addr="",
            master_port=0,
            launch=Launch(self.config, plan.device_type, plan.backend),
            extra=(("TORCHELASTIC_RESTART_COUNT", str(attempt)),),
        )

    def _remote_rank(self) -> Any:
        options = _split_resources(self.resources)
        if self._client:
            return self.ray.remote(max_restarts=0, max_task_retries=0, **options)(RankHost)
        # Streaming: the notebook takes each item as the rank yields it. No retries: a rank
        # that dies is the launch's failure (or its restart), never a silent second run.
        return self.ray.remote(num_returns="streaming", max_retries=0, **options)(rank_task)

    @staticmethod
    def _feed(display: Display, rank: int, batch: list[tuple[str, bytes]]) -> None:
        for kind, data in batch:
            if kind == "message":
                # (output marks, message), as on a local pipe; a batch keeps the worker's
                # order already, so the marks are not needed here.
                _, message = pickle.loads(data)
                display.report(rank, message)
            else:
                display.feed(rank, kind, data)

    def _next(self, stream: Any) -> Item:
        """A rank's next item (Placed, Output or Ended)."""
        ray = self.ray
        try:
            item: Item = ray.get(next(stream))
            return item
        except StopIteration:  # ended without its last item: nothing more is coming
            return Ended(Died(time.time(), RuntimeError("the rank's task ended early")), [])
        except ray.exceptions.RayTaskError as exc:  # the rank's task itself broke (a bug)
            return Ended(Failure.from_exception(exc.as_instanceof_cause()), [])
        except ray.exceptions.RayError as exc:  # its worker process or its node died
            return Ended(Died(time.time(), exc), [])

    def _supervise(
        self, streams: list[Any], display: Display, check: Callable[[], None]
    ) -> dict[int, Outcome]:
        """Each bundle's outcome, showing the ranks' output as it comes."""
        self._running = dict(enumerate(streams))
        self._outcomes = {}
        collateral_since: float | None = None
        while self._running:
            check()
            display.tick()
            self._step(display, _TICK)
            ended = list(self._outcomes.values())
            if any(not isinstance(o, Result) for o in ended) and not only_collateral(ended):
                break  # a root cause: stop the others now
            if only_collateral(ended):
                # A peer's communication error: its cause (a death, a failure elsewhere)
                # usually shows within moments; Ray notices a dead node after its health check.
                collateral_since = collateral_since or time.monotonic()
                if time.monotonic() - collateral_since > _COLLATERAL_GRACE:
                    break
        # The ranks about to be stopped: what they wrote last (a second at most).
        end = time.monotonic() + 1.0
        while self._running and time.monotonic() < end:
            for bundle, item in self._items(self._running, 0.1):
                if isinstance(item, Output):
                    self._feed(display, self._rank(bundle), item.batch)
        for bundle in self._running:
            display.rank_state(self._rank(bundle), "stopped")
        return self._outcomes

    def _step(self, display: Display, timeout: float) -> None:
        """The ranks' items that come within ``timeout``: shown, and their endings kept."""
        for bundle, item in self._items(self._running, timeout):
            if isinstance(item, Placed):
                self._placed[bundle] = item
                display.rank_state(item.rank, "running")
            elif isinstance(item, Output):
                self._feed(display, self._rank(bundle), item.batch)
            else:
                rank = self._rank(bundle)
                self._feed(display, rank, item.rest)
                self._outcomes[bundle] = item.outcome
                del self._running[bundle]
                ok = isinstance(item.outcome, Result)
                display.rank_state(rank, "finished" if ok else "failed")

    def _rank(self, bundle: int) -> int:
        """The rank of ``bundle`` (the bundle's number until the ranks have met)."""
        placed = self._placed.get(bundle)
        return bundle if placed is None else placed.rank

    def _rank_states(self) -> list[RankView]:
        """What the stall report says of each rank before its answer (one that has not met
        the others yet: "starting", under its bundle's number)."""
        n = self._plan.num_processes  # type: ignore[union-attr]
        views = []
        for bundle in range(n):
            placed, outcome = self._placed.get(bundle), self._outcomes.get(bundle)
            if placed is None:
                views.append(RankView(bundle, state="starting"))
                continue
            state = "running"
            if outcome is not None:
                state = {Result: "finished", Failure: "failed"}.get(type(outcome), "died")
            where = f"on {placed.host}" if placed.host else ""
            views.append(RankView(placed.rank, state=state, pid=placed.pid, process=where))
        return sorted(views, key=lambda view: view.rank)

    def _items(self, running: dict[int, Any], timeout: float) -> list[tuple[int, Item]]:
        """The next item of each stream that has one within ``timeout``."""
        if self._client:
            return self._taken(running, timeout)
        streams = list(running.items())
        ready = self.ray.wait([s for _, s in streams], num_returns=len(streams), timeout=timeout)[0]
        return [
            (bundle, self._next(stream))
            for bundle, stream in streams
            if any(stream is other for other in ready)
        ]

    def _taken(self, running: dict[int, Any], timeout: float) -> list[tuple[int, Item]]:
        """Ray Client: the items each rank's host has, one take in flight per rank."""
        ray = self.ray
        for bundle, host in running.items():
            if bundle not in self._takes:
                self._takes[bundle] = host.take.remote()
        waiting = {b: ref for b, ref in self._takes.items() if b in running}
        ready = ray.wait(list(waiting.values()), num_returns=len(waiting), timeout=timeout)[0]
        found: list[tuple[int, Item]] = []
        for bundle, ref in waiting.items():
            if ref not in ready:  # equal ids (Ray Client answers with new ref objects)
                continue
            del self._takes[bundle]
            try:
                found += [(bundle, item) for item in ray.get(ref)]
            except ray.exceptions.RayError as exc:  # the actor or its node died
                found.append((bundle, Ended(Died(time.time(), exc), [])))
        return found

    def _end(self, streams: list[Any], outcomes: dict[int, Outcome]) -> dict[str, int]:
        """Stop the ranks still running; let the finished ones give their workers back.

        A finished rank's task has only its clean-up left and its worker returns to Ray's
        pool, warm (torch imported) for the next launch: how many did on each node is
        returned (to be parked). A stopped or dead rank's process is gone: keep_warm has its
        node start a replacement. So do GPU ranks, whose workers Ray never reuses (a CUDA
        context stays with its process).
        """
        ray = self.ray
        if self._client:  # actors: every process ends with the launch
            for host in streams:
                with contextlib.suppress(Exception):
                    ray.kill(host, no_restart=True)
            return {}
        gone = [b for b in range(len(streams)) if isinstance(outcomes.get(b), Died | None)]
        finishing = {b: streams[b].completed() for b in range(len(streams)) if b not in gone}
        if finishing:
            refs = list(finishing.values())
            returned: list[Any] = []
            with contextlib.suppress(Exception):
                returned = ray.wait(refs, num_returns=len(refs), timeout=_FINISH_WAIT)[0]
            gone += [b for b, ref in finishing.items() if ref not in returned]
        for bundle in gone:
            with contextlib.suppress(Exception):
                ray.cancel(streams[bundle], force=True)
        if self.resources.get("GPU"):
            gone = list(range(len(streams)))
        counts: dict[str, int] = {}
        for bundle in gone:
            if bundle in self._placed:
                node = self._placed[bundle].node
                counts[node] = counts.get(node, 0) + 1
        if counts:
            with contextlib.suppress(Exception):
                keep_warm(ray, counts)
        back = [b for b in range(len(streams)) if b not in gone and b in self._placed]
        return dict(Counter(self._placed[b].node for b in back))

    def _results(self, outcomes: dict[int, Outcome]) -> list[Any]:
        assert self._plan is not None and self._payload is not None
        # A death's error names the rank (Ray's words for why), as the local engine's does.
        named = {
            rank: Died(o.time, _died(rank, o.error)) if isinstance(o, Died) else o
            for rank, o in outcomes.items()
        }
        problem = root_cause(named, self._plan.num_processes, self._payload)
        if problem is not None:
            raise problem
        shipment = self._payload.shipment
        return [_value(shipment, named[rank]) for rank in sorted(named)]  # type: ignore[arg-type]
