"""A worker's side of the rendezvous: a bare ``init_process_group()`` meets in the launch's
private store, never in a TCPStore that anyone on the machine could reach.

    worker.main -> route()  (after env.install; the forkserver preloaded torch.distributed)
    dist.init_process_group(...)  with init_method env:// (the default; the Accelerator's too)
      -> torch's "env" rendezvous handler, replaced in this process by ours, which reads
         NOTEBOOK_ACCEL_STORE:
           file:///proc/<launcher pid>/fd/<n>  one machine: a FileStore on the launcher's
                                               memfd (only this user may open the path; no
                                               file exists, so nothing is left behind),
                                               waits looking every 0.2-5 ms (_PolledFile;
                                               torch's own FileStore on CUDA launches)
           table://<host>:<port>/<attempt>     several machines: KeyStore, a torch Store
                                               over a connection to machine 0's gate that
                                               proved NOTEBOOK_ACCEL_STORE_KEY (auth.py)
           unset (the function removed it)     torch's own handler: a TCPStore at MASTER_*
      -> each of this process's env:// groups meets under its own prefix (init/<n>/): a group
         made again after destroy_process_group reads fresh keys, not the last group's gloo
         addresses (torch restarts its group names at 0 after a destroy)
      (a torch whose handler table moved, private/torch.py: init_process_group itself is
       wrapped, where torch's modules bound it, and gives an env:// group that store)
    dist.destroy_process_group()
      -> the group leaves torch's world as before; a gloo group that met in the launch's
         store is kept (the last _KEPT_GROUPS) and torn down by the worker's exit: gloo's own
         teardown waits for a tick of its event loop (up to 10 ms) per rank of the world,
         160 ms at 16 ranks, on every launch that ends with destroy_process_group
         (end_training does); the worker leaves with os._exit, which closes those sockets
         without waiting (a torch whose group table moved: torch's own destroy)
"""

from __future__ import annotations

import collections
import datetime
import functools
import inspect
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist

from ... import env, launched
from ...private import torch as private_torch
from ..meet import auth
from ..meet.table import StoreTimeout, TableClient

__all__ = ["route", "open_store", "KeyStore"]

_DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
# torch holds a Python store by its C++ part only: when the Python object is collected, every
# call fails ("fn INTERNAL ASSERT FAILED ... Not implemented"). These stay for the process.
_ALIVE: list[KeyStore] = []
# Groups that left torch's world and wait for the worker's exit (see the module docstring);
# the oldest is torn down when a function makes and destroys more than this many.
_KEPT_GROUPS = 8
_kept: collections.deque[Any] = collections.deque(maxlen=_KEPT_GROUPS)
# The env:// rendezvous of this process so far: every rank makes its groups in the same order
# (as torch's own group names assume), so the n-th one meets under the same prefix everywhere.
_generation = itertools.count()


def _seconds(timeout: datetime.timedelta | float | None) -> float | None:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return timeout


class _PolledFile:
    """torch's FileStore, with waits that look at the file often.

    FileStore sleeps 10 ms between looks for a key that is not there yet, which a rendezvous
    pays on nearly every key (measured: group ready after 9-10 ms instead of a TCPStore's 5-7
    on 2 processes). Here a wait looks after 0.2 ms, then less often, up to every 5 ms.
    The same methods as a TableClient, so that KeyStore serves both.
    """

    def __init__(self, path: str, timeout: float) -> None:
        self.file = dist.FileStore(path, -1)  # -1: never delete the (memfd's) path
        self.timeout = timeout

    def __getattr__(self, name: str) -> Any:  # set, add, check, compare_set, ...: the file's
        return getattr(self.file, name)

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        limit = self.timeout if timeout is None else timeout
        deadline, pause = time.monotonic() + limit, 0.0002
        while not self.file.check(keys):
            if time.monotonic() > deadline:
                raise StoreTimeout(f"wait timeout after {limit:g} s for {', '.join(keys)}")
            time.sleep(pause)
            pause = min(pause * 1.5, 0.005)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self.wait([key], timeout)
        return bytes(self.file.get(key))


class KeyStore(dist.Store):
    """A torch Store over a launch's keys: machine 0's table (a TableClient, reached through
    a connection that proved the launch's worker key) or a _PolledFile.
    ``init_process_group(store=...)`` and gloo/NCCL use it as they would a TCPStore."""

    def __init__(self, client: TableClient | _PolledFile) -> None:
        super().__init__()
        self._client = client

    def set(self, key: str, value: bytes | str) -> None:
        self._client.set(key, value)

    def get(self, key: str) -> bytes:
        try:
            return self._client.get(key)
        except StoreTimeout as exc:
            raise dist.DistStoreError(str(exc)) from None

    def add(self, key: str, value: int) -> int:
        return self._client.add(key, value)

    def check(self, keys: list[str]) -> bool:
        return self._client.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        try:
            self._client.wait(keys, _seconds(timeout))
        except StoreTimeout as exc:
            raise dist.DistStoreError(str(exc)) from None

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self._client.compare_set(key, expected, desired)

    def delete_key(self, key: str) -> bool:
        return self._client.delete_key(key)

    def num_keys(self) -> int:
        return self._client.num_keys()

    # Through a PrefixStore (what init_process_group wraps it in), torch's trampoline looks
    # these two up by their C++ names ("Tried to call pure virtual function ...deleteKey").
    deleteKey = delete_key  # noqa: N815
    getNumKeys = num_keys  # noqa: N815

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._client.timeout = timeout.total_seconds()
        super().set_timeout(timeout)


def open_store(where: str, timeout: datetime.timedelta = _DEFAULT_TIMEOUT) -> Any:
    """The store ``NOTEBOOK_ACCEL_STORE`` names (see the module's docstring).

    Raises:
        ValueError: it names nothing this module knows.
    """
    place = urlparse(where)
    seconds = timeout.total_seconds()
    client: TableClient | _PolledFile
    if place.scheme == "file" and launched.device_type() == "cuda":
        # NCCL's watchdog threads call the store too: keep torch's own C++ FileStore there
        # (NCCL's setup takes far longer than the 10 ms looks cost).
        store: Any = dist.FileStore(place.path, -1)
        store.set_timeout(timeout)
        return store
    if place.scheme == "file":
        client = _PolledFile(place.path, seconds)
    elif place.scheme == "table":
        host, port = place.hostname or "", place.port or 0
        key = env.store_key()
        channel = auth.connect(host, port, auth.WORKER, key, min(seconds, 300), "MASTER_ADDR")
        channel.send(place.path.strip("/").encode())  # the attempt: its namespace
        client = TableClient.over(channel, seconds)
    else:
        raise ValueError(f"{env.STORE_VARIABLE}={where!r} names no store notebook_accel knows")
    keys = KeyStore(client)
    keys.set_timeout(timeout)
    _ALIVE.append(keys)
    return keys


def _meeting(
    url: str, timeout: datetime.timedelta, rank: int = -1, world_size: int = -1
) -> tuple[Any, int, int]:
    """This process's next env:// group: a fresh prefix of NOTEBOOK_ACCEL_STORE's store."""
    where = env.store_address()
    query = dict(parse_qsl(urlparse(url).query))
    if rank < 0:
        rank = int(query.get("rank") or env.read_distributed().rank)
    if world_size < 0:
        world_size = int(query.get("world_size") or env.read_distributed().world_size)
    store = dist.PrefixStore(f"init/{next(_generation)}", open_store(where, timeout))
    return store, rank, world_size


def route() -> None:
    """Make env:// in this process meet in ``NOTEBOOK_ACCEL_STORE`` (idempotent)."""
    handlers = private_torch.rendezvous_handlers()  # no public way to replace a scheme
    if handlers is None:  # a torch without the table: at init_process_group, public names
        routed = getattr(dist.init_process_group, "notebook_accel", False)
        if not routed and private_torch.replace_init_process_group(_meeting_at_init):
            _keep_destroyed_groups()
        return
    torch_env = handlers["env"]
    if getattr(torch_env, "notebook_accel", False):
        return

    def env_handler(
        url: str, timeout: datetime.timedelta = _DEFAULT_TIMEOUT, **kwargs: Any
    ) -> Iterator[tuple[Any, int, int]]:
        if not env.store_address():
            yield from torch_env(url, timeout=timeout, **kwargs)
            return
        yield _meeting(url, timeout)
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")  # as torch's

    env_handler.notebook_accel = True  # type: ignore[attr-defined]
    handlers["env"] = env_handler
    _keep_destroyed_groups()


def _meeting_at_init(init: Callable[..., None]) -> Callable[..., None]:
    """``init_process_group`` that gives an env:// group (no ``store``, no other
    ``init_method``) the store ``_meeting`` opens, as the env:// handler would."""
    if getattr(init, "notebook_accel", False):
        return init
    signature = inspect.signature(init)

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return init(*args, **kwargs)  # torch's own message
        given = bound.arguments
        method = given.get("init_method")
        if not env.store_address() or given.get("store") is not None:
            return init(*args, **kwargs)
        if method is not None and not str(method).startswith("env://"):
            return init(*args, **kwargs)
        timeout = given.get("timeout") or _DEFAULT_TIMEOUT
        store, rank, world_size = _meeting(
            str(method or "env://"), timeout, given.get("rank", -1), given.get("world_size", -1)
        )
        given.pop("init_method", None)
        given.update(store=store, rank=rank, world_size=world_size)
        return init(*bound.args, **bound.kwargs)

    init_process_group.notebook_accel = True  # type: ignore[attr-defined]
    return init_process_group


def _ours(store: Any) -> bool:
    """The store under every prefix is one this module opened."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return any(store is alive for alive in _ALIVE)


def _keep_destroyed_groups() -> None:
    """``destroy_process_group`` keeps the gloo groups it ends that met in our store."""

    def keeping(destroy: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(destroy)
        def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> None:
            members = private_torch.process_groups()
            if group is None or group is private_torch.world_group():
                ending = list(members)
            else:
                ending = [group] if group in members else []
            for pg in ending:
                backend, store = members[pg]
                if backend == "gloo" and _ours(store):
                    _kept.append(pg)
            destroy(group, *args, **kwargs)

        return destroy_process_group

    private_torch.replace_destroy_process_group(keeping)
