"""A rank of a Ray launch: the task (or, under Ray Client, the actor) that runs the function.

    bundle b's task (rank_task), in an idle Ray worker of its node
      bundle 0: hosts the launch's TCPStore on its node (store.py), its address into
        Ray's key-value store; every rank writes its node there and reads the others'
        -> its rank and variables (rank_envs: bundle 0's node first, each node contiguous)
      yield Placed(rank, node)
      fds 1/2 -> pipes -> threads -> one batch (_Relay, which also carries tqdm's and
        the chart's messages); the function on a thread of the task (worker.call)
      yield Output(batch) ... as the function writes, about once a second when quiet;
        between two, the stall report's question read (Asked, every half second at most):
        the answer (a Where) goes into the next batch
      yield Ended(outcome, rest): the rank's Result or Failure (wire/outcome.py)
      the worker process stays Ray's: the environment, fds 1/2 and Python's streams are
      given back as they were

Ray Client has no streaming tasks: ``RankHost`` runs the same items on a thread of an actor,
and the notebook takes them (``take``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .... import env, launched
from ....launched import WorkerEnv
from ....private import ray as private_ray
from ....reporting.channel import Failure, Result, Sender, Where
from ...wire.outcome import Outcome
from ...wire.payload import Payload

__all__ = [
    "KV_NAMESPACE",
    "Ended",
    "Item",
    "Output",
    "Asked",
    "Placed",
    "RankHost",
    "rank_envs",
    "question_key",
    "rank_task",
]

_TAKE_WAIT = 1.0  # seconds a rank waits for output before sending an empty batch
KV_NAMESPACE = "notebook_accel"  # Ray's key-value store: where rank 0 publishes its port
_POLL = 0.01  # seconds between two looks at the port (or, for rank 0, at the ranks through)
_THROUGH = "notebook_accel/through"  # the store's count of ranks done with it
_PLACE = "notebook_accel/place/"  # the store's key of each bundle's "node IP"
_STORE_WAIT = datetime.timedelta(minutes=30)  # a rank waits this long for its peers to start
_EVERY = 0.5  # seconds between two reads of the stall report's question by a rank


def question_key(launch: str) -> str:
    """The key of the stall report's question (cluster/ray/where.py) for the launch ``launch``."""
    return f"{launch}/where"


@dataclass(frozen=True)
class Placed:
    """The ranks met: this bundle's rank, the node it runs on (its id and address), and
    the rank's process."""

    rank: int
    node: str
    host: str = ""
    pid: int | None = None


@dataclass(frozen=True)
class Output:
    """What the rank wrote (and reported) since the last item: (kind, bytes), in order."""

    batch: list[tuple[str, bytes]]


@dataclass(frozen=True)
class Ended:
    """The rank's outcome (the driver adds Died for a task that broke), and its last output."""

    outcome: Outcome
    rest: list[tuple[str, bytes]]


Item = Placed | Output | Ended


class _Waiting:
    """Items added by some threads, taken all at once by another, which may wait for one."""

    def __init__(self) -> None:
        self._arrived = threading.Condition()
        self._items: list[Any] = []
        self._closed = False

    def add(self, item: Any) -> None:
        with self._arrived:
            self._items.append(item)
            self._arrived.notify_all()

    def take(self, wait: float = 0.0) -> list[Any]:
        """What was added since the last take; waits up to ``wait`` s for something."""
        with self._arrived:
            if not self._items and not self._closed:
                self._arrived.wait(wait)
            items, self._items = self._items, []
        return items

    def close(self) -> None:
        """Nothing more comes: a take waiting now answers at once."""
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()


class _Relay:
    """In a rank's Ray worker: fds 1 and 2 into pipes, read by threads into one batch.

    It also stands in for the worker's message pipe (``send_bytes``), so that the worker-side
    ``tqdm`` (reporting/progress.py) reports through the same batch, in order with the lines.
    The rank's task yields each batch to the notebook as it comes (waiting up to
    ``_TAKE_WAIT`` for one, so a quiet rank sends about one item a second, not one a tick). The
    worker process outlives the launch (Ray reuses it), so ``finish`` gives it back its own fds
    and streams.
    """

    def __init__(self) -> None:
        self._batch = _Waiting()  # (kind, data): "stdout", "stderr" or "message"
        self._readers: list[threading.Thread] = []
        self._saved: list[int] = []
        self._streams = (sys.stdout, sys.stderr)

    def start(self) -> None:
        from ...rank.worker import line_buffered_stdio

        for fd, stream in ((1, "stdout"), (2, "stderr")):
            self._saved.append(os.dup(fd))
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
            self._batch.add((stream, data))
        os.close(fd)

    def send_bytes(self, data: bytes) -> None:
        self._batch.add(("message", data))

    def take(self, wait: float = 0.0) -> list[tuple[str, bytes]]:
        """What was written since the last take; waits up to ``wait`` s for something."""
        return self._batch.take(wait)

    def finish(self) -> list[tuple[str, bytes]]:
        """Every line written so far that was not taken; the process's own fds back."""
        from ...rank.worker import flush_all

        flush_all()
        # The pipes' write ends are fds 1 and 2 only: putting the saved fds back ends the
        # readers (unless a process the function started still holds a copy).
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        sys.stdout, sys.stderr = self._streams
        for reader in self._readers:
            reader.join(timeout=2.0)
        self._batch.close()
        return self.take()


class Asked:
    """In a rank's task: whether the notebook asked where this rank is since the last read
    (read at most every ``_EVERY`` s: cluster/ray/where.py), and the answer."""

    def __init__(self, key: str) -> None:
        self.key = question_key(key)
        # The driver asks only once every rank has met (Placed), and the key is this
        # launch's: any count found is a question for this rank.
        self._seen: bytes | None = None
        self._read = time.monotonic()
        self._cpu = sum(os.times()[:2])

    def answer(self) -> Where | None:
        """Where this rank is, when a new question came since the last read; else None."""
        now = time.monotonic()
        if now - self._read < _EVERY:
            return None
        question = private_ray.kv_get(self.key, KV_NAMESPACE)
        cpu = sum(os.times()[:2])
        busy = 100.0 * (cpu - self._cpu) / max(now - self._read, 1e-6)
        self._read, self._cpu = now, cpu
        if question is None or question == self._seen:
            return None
        self._seen = question
        from ...rank.where import snapshot

        return snapshot(busy=busy)


def _store_address(key: str) -> tuple[str, int]:
    """Where rank 0 hosts the launch's store (see _rank), once it has published it."""
    while True:
        found = private_ray.kv_get(key, KV_NAMESPACE)
        if found is not None:
            host, port = found.decode().rsplit(":", 1)
            return host, int(port)
        time.sleep(_POLL)


def _through(worker: WorkerEnv, store: Any, ok: bool) -> None:
    """Mark the launch's store: this rank is done with it. Rank 0, when ok, waits for all."""
    store.add(_THROUGH, 1)
    if worker.rank == 0 and ok:
        while store.add(_THROUGH, 0) < worker.world_size:
            time.sleep(_POLL)


def rank_envs(
    places: list[tuple[str, str]], port: int, template: WorkerEnv
) -> tuple[list[int], list[WorkerEnv]]:
    """Bundles in rank order, and each rank's variables, from each bundle's (node, IP).

    Bundle 0's node comes first and each node's ranks are contiguous (_rank_order), so
    bundle 0 is rank 0, whose node hosts the store.
    """
    order = _rank_order(places)
    nodes = _nodes(places)
    master = places[order[0]][1]
    envs = []
    for rank, index in enumerate(order):
        node = places[index][0]
        local = [i for i in order if places[i][0] == node]
        envs.append(
            dataclasses.replace(
                template,
                rank=rank,
                local_rank=local.index(index),
                world_size=len(places),
                local_world_size=len(local),
                node_rank=nodes.index(node),
                master_addr=master,
                master_port=port,
                loopback=master.startswith("127."),
            )
        )
    return order, envs


def _join(bundle: int, world: int, key: str, held: contextlib.ExitStack) -> tuple[Any, Any]:
    """This bundle's rank: rank 0 hosts the store, every rank tells it where it runs."""
    import ray
    import torch.distributed as dist

    from .store import hosted_store

    node, ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
    if bundle == 0:
        store, port = held.enter_context(hosted_store(ip, 0, world))
        private_ray.kv_put(key, f"{ip}:{port}", KV_NAMESPACE)
    else:
        host, port = _store_address(key)
        store = dist.TCPStore(host, port, is_master=False, timeout=_STORE_WAIT)
    store.set(f"{_PLACE}{bundle}", f"{node} {ip}")
    keys = [f"{_PLACE}{i}" for i in range(world)]
    store.wait(keys)
    places = [tuple(store.get(k).decode().split(" ", 1)) for k in keys]
    return store, (places, port, node)


def _run(payload: Payload, relay: _Relay) -> Result | Failure:
    """The rank's function, as a local worker runs it (seed=, sys.exit(0), tracebacks)."""
    from ....reporting import live, progress
    from ...rank.worker import call, finish_distributed

    sender = Sender(relay)  # type: ignore[arg-type]
    progress.attach(sender)
    live.start(sender)  # rank 0's Accelerator.log rows and every rank's health
    try:
        ending = call(payload)
    finally:
        progress.detach()
        live.stop()  # the last logged rows go before the outcome
    if isinstance(ending, Result):
        with contextlib.suppress(Exception):
            finish_distributed()
    return ending


def rank_task(
    bundle: int, world: int, template: WorkerEnv, payload: Payload, key: str
) -> Iterator[Item]:
    """One rank of a launch: a Ray task in bundle ``bundle``, streaming what the notebook shows.

    Yields ``Placed`` once the ranks have met, ``Output`` while the function runs (on a
    thread of this task), then ``Ended``. Bundle 0 is
    rank 0: it hosts the launch's TCPStore on its node and publishes the address in Ray's
    key-value store under ``key``; every rank then writes its node there and reads the
    others', so each works out its own rank as the notebook would (rank_envs). Every rank marks
    the store when it is through with it, and rank 0 keeps it until all have (a peer may still
    be leaving its process group). Ray keeps this worker process for later tasks: the
    environment, fds 1 and 2 and Python's streams are given back as they were.
    """
    from ...meet.network import interface_for
    from ...rank.worker import settle

    saved = env.snapshot()
    with contextlib.ExitStack() as held:
        store, (places, port, node) = _join(bundle, world, key, held)
        order, envs = rank_envs(places, port, template)
        worker = envs[order.index(bundle)]
        if not worker.loopback and not env.gloo_interface():
            # gloo binds to what the host name resolves to unless told the interface.
            name = interface_for(worker.master_addr)
            if name:
                worker = dataclasses.replace(
                    worker, extra=(*worker.extra, ("GLOO_SOCKET_IFNAME", name))
                )
        yield Placed(worker.rank, node, places[bundle][1], os.getpid())
        relay = _Relay()
        relay.start()
        done: list[tuple[Result | Failure, list[tuple[str, bytes]]]] = []

        def body() -> None:
            outcome: Result | Failure = Failure.from_exception(RuntimeError("not run"))
            try:
                outcome = _run(payload, relay)
            finally:
                done.append((outcome, relay.finish()))

        try:
            # The node's environment stays (Ray's CUDA_VISIBLE_DEVICES, paths); the notebook's
            # does not travel to other machines. The distributed variables are added.
            settle(saved, worker)
            thread = threading.Thread(target=body, name="notebook-accel-rank", daemon=True)
            thread.start()
            asked, answers = Asked(key), Sender(relay)  # type: ignore[arg-type]
            while not done:
                batch = relay.take(wait=_TAKE_WAIT)
                if batch:
                    yield Output(batch)
                where = asked.answer()
                if where is not None:  # the stall report's question (cluster/ray/where.py)
                    answers.send(where)
            thread.join()
        finally:
            env.restore(saved)
            launched.become_rank(None)  # Ray keeps the process: no launch's rank now
        outcome, rest = done[0]
        with contextlib.suppress(Exception):  # a store gone: the notebook is stopping everyone
            _through(worker, store, isinstance(outcome, Result))
        yield Ended(outcome, rest)


class RankHost:
    """A rank under Ray Client, which has no streaming tasks: an actor runs ``_rank``.

    ``start`` runs the rank's items on a thread of the actor and returns at once; the notebook
    takes what has come (``take`` waits up to ``_TAKE_WAIT`` s for something). The actor's
    process ends with the launch, so nothing is reused between launches on this path.
    """

    def __init__(self) -> None:
        self._items = _Waiting()

    def start(self, *args: Any) -> None:
        threading.Thread(
            target=self._pump, args=args, name="notebook-accel-rank", daemon=True
        ).start()

    def _pump(self, *args: Any) -> None:
        try:
            for item in rank_task(*args):
                self._items.add(item)
        except BaseException as exc:  # noqa: BLE001 - the notebook gets it as the outcome
            self._items.add(Ended(Failure.from_exception(exc), []))
        finally:
            self._items.close()

    def take(self) -> list[Item]:
        return self._items.take(_TAKE_WAIT)


def _nodes(places: list[tuple[str, str]]) -> list[str]:
    """The bundles' nodes in node-rank order: as they first appear, bundle 0's first."""
    return list(dict.fromkeys(node for node, _ in places))


def _rank_order(places: list[tuple[str, str]]) -> list[int]:
    """Bundle indices in rank order: bundle 0's node first, each node's ranks contiguous."""
    nodes = _nodes(places)
    return sorted(range(len(places)), key=lambda i: (nodes.index(places[i][0]), i))
