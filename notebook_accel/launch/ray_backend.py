"""The Ray cluster backend: one Ray actor per rank, placed by a placement group.

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
      N rank actors, bundle i each (asked    ---->   each a Ray worker process; imports torch
        for at once, not after the group
        is ready)
      where() of every rank                  ---->   node id, node IP
      ranks ordered by node (rank 0's node
        first); rank 0's actor hosts the     ---->   TCPStore on its node's IP, port from the OS
        TCPStore
      run.remote(WorkerEnv, payload ref)     ---->   fds 1/2 -> pipes -> a batch (threads)
                                                     env.install, unpickle, run the function
      loop: take() of every running rank     <----   the batch so far (the relay thread)
              -> display
            ray.wait(run refs) -> outcomes           (outcome, rest of the batch): large
            watch (Stop), deadline                   buffers via the object store
      first failing rank's own exception (outcome.rebuild), WorkerDiedError for a dead actor
      finally: ray.kill every actor, remove the placement group: nothing stays reserved

The actors print into pipes that their own threads read, so the cell shows ``[rank N]`` whole
lines (display.py) and never Ray's ``(pid=..., ip=...)`` prefixes. An actor has two
concurrency groups, so ``take`` answers while ``run`` is busy: the function runs on the
actor's thread for its default group, not on the process's main thread (as in Ray Train).
There is no separate actor collecting the output: every actor is one more Ray worker process
to start, and on a small node that start is what a launch waits for (benchmarks/ray_phases.py).
Every machine of the cluster needs notebook_accel and torch installed, as it needs them for
Ray Train.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import env, hardware
from ..config import LaunchConfig
from ..errors import ConfigError, LaunchError, LaunchTimeoutError, WorkerDiedError
from .channel import Failure, Health, Metrics, Progress, Result, Sender
from .display import Display
from .payload import Payload
from .pickling import Outgoing
from .transport import Shipment, unpack

__all__ = ["RayBackend", "connect", "describe_cluster", "keep_warm"]

_TICK = 0.1  # seconds between two looks at the ranks' output and outcomes
_RELAY = "relay"  # the actors' concurrency group that hands over output while ``run`` is busy
_TAKE_WAIT = 1.0  # seconds a take waits in the actor for output before answering empty
_COLLATERAL_GRACE = 10.0  # seconds a communication error waits for its root cause to show
_READY_NOTE = 30.0  # seconds of waiting for the placement group before saying so
_KEEP_WARM = 600  # seconds the idle workers started for the next launch outlive Ray's own limit

Outcome = tuple[Any, ...]  # ("ok", Result) | ("failed", Failure) | ("died", error, time)


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
        # Our actors relay their own output; Ray's copy of it would only add prefixed lines.
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
    """Have each node start, for the next launch, as many idle workers as it had ranks.

    An actor's process ends with the actor, so without this every launch after the first
    boots fresh Ray workers (``import ray``, ~1.7 CPU s each) while the ranks wait; the first
    finds those Ray started when the notebook connected. Each node's raylet is asked directly
    (its PrestartWorkers call, the one Ray's own pool uses): idle workers of this job, fit for
    actors, kept ``_KEEP_WARM`` seconds even beyond Ray's idle limit, and ended with the job.
    They reserve no resources. Best effort, on a thread: an answer that never comes (a raylet
    that went away, a protocol that changed) leaves the next launch as it would have been.
    Not under Ray Client, whose notebook cannot reach the raylets, nor for a job with a
    ``runtime_env`` (its actors' workers are keyed by that environment).
    """
    from ray.util.client import ray as client

    context = ray.get_runtime_context()
    if client.is_connected() or context.runtime_env:
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
    try:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    except ImportError:  # another Ray layout: nothing to keep warm with
        return
    common: Any = common_pb2  # generated code: no stubs for mypy
    protos: Any = node_manager_pb2
    for address, count in asks:
        request = protos.PrestartWorkersRequest(
            language=common.Language.Value("PYTHON"),
            job_id=job,
            keep_alive_duration_secs=_KEEP_WARM,
            num_workers=count,
        )
        request.runtime_env_info.serialized_runtime_env = "{}"
        try:
            channel = init_grpc_channel(address)
            try:
                node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
                    request, timeout=5.0
                )
            finally:
                channel.close()
        except Exception:  # noqa: BLE001 - best effort; the next launch boots its own workers
            continue


# -- inside the cluster: the actors ------------------------------------------------------------
class _Relay:
    """In a rank's actor: fds 1 and 2 into pipes, read by threads into one batch.

    It also stands in for the worker's message pipe (``send_bytes``), so that the worker-side
    ``tqdm`` (progress.py) reports through the same batch, in order with the lines. The notebook
    takes the batch (``take``) on the actor's relay thread while ``run`` is busy; what is left
    at the end travels with the outcome. No mailbox actor: each actor is a Ray worker process
    to start (seconds of CPU on a small node), and the ranks wait for the slowest to start.
    A take waits a while for something to send, so a quiet rank costs the notebook about one
    request a second, not one a tick.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._finished = False
        self._batch: list[tuple[str, bytes]] = []
        self._readers: list[threading.Thread] = []

    def start(self) -> None:
        from .worker import line_buffered_stdio

        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            reader = threading.Thread(target=self._read, args=(read_end, stream), daemon=True)
            reader.start()
            self._readers.append(reader)
        line_buffered_stdio()

    def _read(self, fd: int, stream: str) -> None:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                break
            if not data:
                break
            self._add(stream, data)
        os.close(fd)

    def _add(self, kind: str, data: bytes) -> None:
        with self._lock:
            self._batch.append((kind, data))
            self._arrived.notify_all()

    def send_bytes(self, data: bytes) -> None:
        self._add("message", data)

    def take(self, wait: float = 0.0) -> list[tuple[str, bytes]]:
        """What was written since the last take; waits up to ``wait`` s for something."""
        with self._lock:
            if not self._batch and not self._finished:
                self._arrived.wait(wait)
            batch, self._batch = self._batch, []
        return batch

    def finish(self) -> list[tuple[str, bytes]]:
        """Every line written so far: the part the notebook has not taken yet."""
        from .worker import flush_all

        flush_all()
        # The pipes' write ends are fds 1 and 2 only: pointing those at /dev/null ends the
        # readers (unless a process the function started still holds a copy).
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        for reader in self._readers:
            reader.join(timeout=2.0)
        with self._lock:
            self._finished = True  # a take waiting now answers at once
            self._arrived.notify_all()
        return self.take()


class _RankActor:
    """One rank of a launch, in a Ray worker process of its placement group bundle."""

    def __init__(self) -> None:
        self._held = contextlib.ExitStack()
        self._relay = _Relay()
        # Every rank imports torch now, all at once, instead of rank 0 importing it to host
        # the store and then the others to run: one import's time less per launch.
        import torch.distributed  # noqa: F401

    def where(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def host_store(self, host: str, world_size: int) -> int:
        """Rank 0: host this attempt's TCPStore on its node; every rank joins it as a client."""
        from .rendezvous import hosted_store

        _store, port = self._held.enter_context(hosted_store(host, 0, world_size))
        return int(port)

    def take(self) -> list[tuple[str, bytes]]:
        """The output and progress written since the last take (on the relay thread)."""
        return self._relay.take(wait=_TAKE_WAIT)

    def run(
        self, worker: env.WorkerEnv, payload: Payload
    ) -> tuple[Outcome, list[tuple[str, bytes]]]:
        """Run the function; its outcome and the output the notebook has not taken yet."""
        from .. import live, progress
        from .worker import call, finish_distributed

        relay = self._relay
        relay.start()
        # The node's environment stays (Ray's CUDA_VISIBLE_DEVICES, paths); the notebook's
        # does not travel to other machines. The distributed variables are added.
        env.install(env.snapshot(), worker)
        sender = Sender(relay)  # type: ignore[arg-type]
        progress.attach(sender)
        live.start(sender)  # rank 0's Accelerator.log rows and every rank's health
        ending = call(payload)  # as a local worker runs it: seed=, sys.exit(0), tracebacks
        progress.detach()
        live.stop()  # the last logged rows go before the outcome
        outcome: Outcome
        if isinstance(ending, Failure):
            outcome = ("failed", ending)
        else:
            outcome = ("ok", ending)
            with contextlib.suppress(Exception):
                finish_distributed()
        return outcome, relay.finish()  # every line reaches the notebook before the outcome


# -- large buffers: Ray's object store at the transport seam -----------------------------------
def _as_array(out: Outgoing) -> Any:
    """A buffer as a uint8 numpy array: Ray stores those without pickling them."""
    import numpy as np

    if out.view is not None:
        return np.frombuffer(out.view.cast("B"), dtype=np.uint8)
    host = bytearray(out.nbytes)  # device memory: copied to the host first
    out.copy_into(memoryview(host))
    return np.frombuffer(host, dtype=np.uint8)


class RayShipment(Shipment):
    """The payload's large buffers as objects in Ray's store (transport.py's seam).

    The notebook puts each buffer once; every node fetches it once, and each rank maps it
    from the store and takes a private copy (the store's are read-only; a rank writing into
    a captured tensor changes nobody else's). A rank's result buffers come back inside its
    return value, which Ray keeps in the store under the notebook's ownership: objects a rank
    put itself would die with its actor, which the launch kills at the end.
    """

    def __init__(self, refs: list[Any]) -> None:
        self.refs = refs

    def views(self) -> list[memoryview]:
        import ray

        return [memoryview(bytearray(array)) for array in ray.get(self.refs)]

    def put(self, buffers: list[Outgoing]) -> Any:
        return [bytes(_as_array(out)) for out in buffers]

    def get(self, handle: Any) -> list[memoryview]:
        return [memoryview(bytearray(data)) for data in handle]

    def release(self) -> None:
        self.refs = []


def _value(shipment: Shipment | None, result: Result) -> Any:
    if shipment is None:
        return pickle.loads(result.value)
    return unpack(shipment, result)


# -- in the notebook: the driver ---------------------------------------------------------------
def _split_resources(resources: dict[str, float]) -> dict[str, Any]:
    """A bundle's resources as actor options (num_cpus, num_gpus, memory, resources)."""
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


def _rank_order(places: list[tuple[str, str]]) -> list[int]:
    """Bundle indices in rank order: bundle 0's node first, each node's ranks contiguous."""
    nodes: list[str] = []
    for node, _ in places:
        if node not in nodes:
            nodes.append(node)
    return sorted(range(len(places)), key=lambda i: (nodes.index(places[i][0]), i))


def _died(rank: int, error: BaseException) -> WorkerDiedError:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    # Ray's message names the node when the node died; else its first line about the death.
    reason = next((line for line in lines if "node" in line.lower()), "") or next(
        (line for line in lines if "died" in line), ""
    )
    died = WorkerDiedError(rank, -signal.SIGKILL)
    died.args = (
        f"rank {rank}'s Ray actor died without a Python exception (its process or its node "
        f"ended). Ray says: {reason or (lines[0] if lines else type(error).__name__)}",
    )
    return died


class RayBackend:
    """The ranks of a launch as Ray actors in a placement group (see the module docstring)."""

    name = "ray"

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
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
        self._ranks_per_node: dict[str, int] = {}  # this attempt's, for keep_warm

    # -- Backend ----------------------------------------------------------------------------
    def plan(self) -> hardware.Plan:
        """Hardware from the resources each rank requests; ranks bounded by the cluster's."""
        config, ray = self.config, self.ray
        gpu = self.resources.get("GPU", 0) > 0
        if config.hardware not in ("auto", "cpu", "cuda") or (config.hardware == "cpu" and gpu):
            raise ConfigError(
                "hardware",
                config.hardware,
                "'auto', 'cpu' or 'cuda' on a Ray cluster ('cuda' when GPU is requested)",
            )
        total = ray.cluster_resources()
        default = int(total.get("GPU", 0) // self.resources["GPU"]) if gpu else 2
        n = config.num_processes or max(1, default)  # one rank per GPU, else 2 (as locally)
        for key, amount in self.resources.items():
            if amount and amount * n > total.get(key, 0):
                fits = int(total.get(key, 0) // amount)
                raise ConfigError(
                    "num_processes",
                    n,
                    f"at most {fits} ranks of {self.resources} on this cluster "
                    f"({total.get(key, 0):g} {key} in all)",
                )
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

    def prepare(self, payload: Payload, buffers: list[Outgoing]) -> None:
        """Put the payload and each large buffer in the object store once, for every actor."""
        shipment = RayShipment([self.ray.put(_as_array(out)) for out in buffers])
        # The actors keep their node's environment; the notebook's (tokens included) stays.
        self._payload = dataclasses.replace(payload, environ={}, shipment=shipment)
        self._payload_ref = self.ray.put(self._payload)

    def close(self) -> None:
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
        """One attempt: a new placement group and actors, removed whatever the ending."""
        from ray.util.placement_group import placement_group, remove_placement_group

        assert self._plan is not None and self._payload is not None, "plan() and prepare() first"
        ray = self.ray
        deadline = None if timeout is None else time.monotonic() + timeout

        def check() -> None:
            if watch is not None:
                watch()
            if deadline is not None and time.monotonic() >= deadline:
                raise LaunchTimeoutError(timeout)  # type: ignore[arg-type]

        n = self._plan.num_processes
        self._ranks_per_node = {}
        group = placement_group(
            [dict(self.resources) for _ in range(n)], strategy=self.config.placement_strategy
        )
        actors: list[Any] = []
        try:
            # The actors are asked for at once: Ray starts each as soon as the group holds its
            # bundle, instead of after a round trip to learn that the group is ready.
            actors = self._start_actors(group, n)
            check = self._noting_waits(group, check, display)
            order, envs = self._rendezvous(actors, check, attempt)
            for rank in range(n):
                display.rank_state(rank, "running")
            ranks = [actors[index] for index in order]
            refs = {
                actor.run.remote(envs[rank], self._payload_ref): rank
                for rank, actor in enumerate(ranks)
            }
            outcomes = self._supervise(refs, ranks, display, check)
        finally:
            # Not waited for: Ray ends the processes and frees the bundles within moments.
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            with contextlib.suppress(Exception):
                remove_placement_group(group)
            with contextlib.suppress(Exception):
                keep_warm(ray, self._ranks_per_node)  # the next launch's workers, booted now
            for rank in range(n):
                display.end(rank, "stdout")
                display.end(rank, "stderr")
        return self._results(outcomes)

    # -- the steps of an attempt ------------------------------------------------------------
    def _noting_waits(
        self, group: Any, check: Callable[[], None], display: Display
    ) -> Callable[[], None]:
        """``check``, which also says once when the group has waited long for its resources."""
        ready = group.ready()  # a reply from Ray's control store, no worker involved
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

    def _start_actors(self, group: Any, n: int) -> list[Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = _split_resources(self.resources)
        # The relay group: the notebook takes a rank's output while ``run`` is busy. Marked
        # here, where ray is imported, and not per call (Ray Client refuses that option).
        self.ray.method(concurrency_group=_RELAY)(_RankActor.take)
        remote_rank = self.ray.remote(concurrency_groups={_RELAY: 1})(_RankActor)
        return [
            remote_rank.options(
                max_restarts=0,
                max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=i
                ),
                **options,
            ).remote()
            for i in range(n)
        ]

    def _wait(self, refs: list[Any], check: Callable[[], None]) -> list[Any]:
        while len(self.ray.wait(refs, num_returns=len(refs), timeout=_TICK)[0]) < len(refs):
            check()
        try:
            return list(self.ray.get(refs))
        except self.ray.exceptions.RayActorError as exc:
            raise LaunchError(f"a rank's Ray actor could not start: {exc}") from None

    def _rendezvous(
        self, actors: list[Any], check: Callable[[], None], attempt: int
    ) -> tuple[list[int], list[env.WorkerEnv]]:
        from .network import interface_for

        places = self._wait([a.where.remote() for a in actors], check)
        for node, _ in places:
            self._ranks_per_node[node] = self._ranks_per_node.get(node, 0) + 1
        order = _rank_order(places)
        master = places[order[0]][1]
        world = len(actors)
        (port,) = self._wait([actors[order[0]].host_store.remote(master, world)], check)
        loopback = master.startswith("127.")
        extra = [("TORCHELASTIC_RESTART_COUNT", str(attempt))]
        extra += env.launch_variables(**self.config.worker_options()).items()
        if not loopback and not env.get("GLOO_SOCKET_IFNAME"):
            # gloo binds to what the host name resolves to unless told the interface; the
            # driver's view of the interface is a guess for nodes that look like it.
            name = interface_for(master)
            if name:
                extra.append(("GLOO_SOCKET_IFNAME", name))
        nodes: list[str] = []
        for index in order:
            if places[index][0] not in nodes:
                nodes.append(places[index][0])
        envs = []
        for rank, index in enumerate(order):
            node = places[index][0]
            local = [i for i in order if places[i][0] == node]
            envs.append(
                env.WorkerEnv(
                    rank=rank,
                    local_rank=local.index(index),
                    world_size=world,
                    local_world_size=len(local),
                    node_rank=nodes.index(node),
                    master_addr=master,
                    master_port=port,
                    device_type=self._plan.device_type,  # type: ignore[union-attr]
                    backend=self._plan.backend,  # type: ignore[union-attr]
                    loopback=loopback,
                    extra=tuple(extra),
                )
            )
        return order, envs

    @staticmethod
    def _feed(display: Display, rank: int, batch: list[tuple[str, bytes]]) -> None:
        for kind, data in batch:
            if kind == "message":
                # (output marks, message), as on a local pipe; a batch keeps the worker's
                # order already, so the marks are not needed here.
                _, message = pickle.loads(data)
                if isinstance(message, Progress):
                    display.progress(rank, message)
                elif isinstance(message, Metrics):
                    display.metrics(rank, message)
                elif isinstance(message, Health):
                    display.health(rank, message)
            else:
                display.feed(rank, kind, data)

    def _collect(self, takes: dict[int, Any], display: Display, timeout: float) -> None:
        """Show the output of the takes back within ``timeout``; the others stay in flight."""
        if not takes:
            return
        refs = list(takes.values())
        ready = set(self.ray.wait(refs, num_returns=len(refs), timeout=timeout)[0])
        for rank, ref in list(takes.items()):
            if ref not in ready:
                continue
            del takes[rank]
            try:
                batch = self.ray.get(ref)
            except Exception:  # the actor died: its outcome says why
                continue
            self._feed(display, rank, batch)

    def _outcome(self, ref: Any) -> tuple[Outcome, list[tuple[str, bytes]]]:
        ray = self.ray
        try:
            outcome, rest = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return ("died", exc, time.time()), []
        except ray.exceptions.RayTaskError as exc:  # the actor method itself broke (a bug)
            cause = exc.as_instanceof_cause()
            return ("failed", Failure.from_exception(cause)), []
        return outcome, rest

    def _supervise(
        self,
        refs: dict[Any, int],
        ranks: list[Any],
        display: Display,
        check: Callable[[], None],
    ) -> dict[int, Outcome]:
        from .outcome import is_collateral

        ray = self.ray
        pending = dict(refs)
        takes: dict[int, Any] = {}  # rank -> its take in flight (one at a time keeps the order)
        outcomes: dict[int, Outcome] = {}
        collateral_since: float | None = None

        def take_all() -> None:
            for rank in set(pending.values()) - takes.keys():
                takes[rank] = ranks[rank].take.remote()

        while pending:
            check()
            take_all()
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_TICK)
            self._collect(takes, display, timeout=0)
            for ref in ready:
                rank = pending.pop(ref)
                # The rank's take in flight holds output older than what ``run`` returns.
                self._collect({rank: takes.pop(rank)} if rank in takes else {}, display, 5.0)
                outcome, rest = self._outcome(ref)
                self._feed(display, rank, rest)
                outcomes[rank] = outcome
                display.rank_state(rank, "finished" if outcome[0] == "ok" else "failed")
            problems = [o for o in outcomes.values() if o[0] != "ok"]
            if any(o[0] == "died" or not is_collateral(o[1]) for o in problems):
                break  # a root cause: stop the others now
            if problems:
                # A peer's communication error: its cause (a death, a failure elsewhere)
                # usually shows within moments; Ray notices a dead node after its health check.
                collateral_since = collateral_since or time.monotonic()
                if time.monotonic() - collateral_since > _COLLATERAL_GRACE:
                    break
        if pending:  # the ranks about to be stopped: what they wrote last
            take_all()
            self._collect(takes, display, timeout=1.0)
        for rank in pending.values():
            display.rank_state(rank, "stopped")
        return outcomes

    def _results(self, outcomes: dict[int, Outcome]) -> list[Any]:
        from .outcome import is_collateral, rebuild

        problems: list[tuple[bool, float, int]] = []
        for rank, outcome in outcomes.items():
            if outcome[0] == "failed":
                problems.append((is_collateral(outcome[1]), outcome[1].time, rank))
            elif outcome[0] == "died":
                problems.append((False, outcome[2], rank))
        if problems:
            _, _, rank = min(problems)
            outcome = outcomes[rank]
            world = self._plan.num_processes  # type: ignore[union-attr]
            if outcome[0] == "died":
                raise _died(rank, outcome[1])
            raise rebuild(rank, outcome[1], world, self._payload)  # type: ignore[arg-type]
        shipment = self._payload.shipment  # type: ignore[union-attr]
        return [_value(shipment, outcomes[rank][1]) for rank in sorted(outcomes)]
