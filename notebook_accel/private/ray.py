"""Ray's private names: its key-value store, its raylets' gRPC, Ray Client's flag, the
local-only switch. Read in Ray 2.9.3, 2.30, 2.45, 2.59 and 2.60 (2.60 runs the tests):

    function          relies on                              where it differs
    kv_get/put/del    ray.experimental.internal_kv's         a named actor of the namespace
                      _internal_kv_get/put/del(key, *,       (num_cpus=0) holding the keys;
                      namespace=...)                          gone with the last key
    client_connected  ray.util.client.ray.is_connected()     True: the ranks as actors (the
                                                              Ray Client way, slower; works
                                                              on any driver)
    local_only        ray._private.ray_constants.            nothing: a Ray imported before
                      ENABLE_RAY_CLUSTER                      local_cluster() binds its
                                                              nodes to the machine's address
    prestart_workers  init_grpc_channel (_private.grpc_utils  False: no idle worker kept
                      in 2.59, _private.utils to 2.45),       warm (the next launch boots
                      NodeManagerService.PrestartWorkers      its own)
                      protos (in 2.45, not in 2.30)
    group_free        a placement group's bundles as resources   True: not waited for
                      named "<resource>_group_<group id hex>"
                      in available_resources() (the sum of its
                      bundles')
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from typing import Any

__all__ = [
    "client_connected",
    "group_free",
    "kv_del",
    "kv_get",
    "kv_put",
    "local_only",
    "prestart_workers",
]


def _internal_kv() -> Any:
    """Ray's internal_kv module, where its three calls take ``namespace`` (else None)."""
    try:
        from ray.experimental import internal_kv
    except ImportError:
        return None
    for name in ("_internal_kv_get", "_internal_kv_put", "_internal_kv_del"):
        call = getattr(internal_kv, name, None)
        try:
            if "namespace" not in inspect.signature(call).parameters:  # type: ignore[arg-type]
                return None
        except (TypeError, ValueError):
            return None
    return internal_kv


# -- the board: where the keys are without Ray's internal store -----------------------------
_BOARD = "notebook_accel_keys"


class _Board:
    """A Ray actor holding a namespace's keys (where ``internal_kv`` is not there); it ends
    itself when its last key is deleted, so a launch leaves none behind."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def delete(self, key: str) -> bool:
        self.values.pop(key, None)
        if self.values:
            return False
        import ray

        ray.actor.exit_actor()  # the calls queued after this one fail: kv_put makes another
        return True


def _board(namespace: str, create: bool) -> Any:
    import ray

    with contextlib.suppress(ValueError):  # none yet
        return ray.get_actor(_BOARD, namespace=namespace)
    if not create:
        return None
    options = {"name": _BOARD, "namespace": namespace, "lifetime": "detached"}
    return _remote_board().options(get_if_exists=True, **options).remote()


@functools.cache
def _remote_board() -> Any:
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(_Board)


def kv_get(key: str, namespace: str) -> bytes | None:
    """The value of ``key`` in Ray's cluster-wide key-value store (None: not there yet).

    Relies on ``ray.experimental.internal_kv._internal_kv_get``; without it, the board.
    """
    internal = _internal_kv()
    if internal is not None:
        found: bytes | None = internal._internal_kv_get(key, namespace=namespace)
        return found
    import ray

    board = _board(namespace, create=False)
    if board is None:
        return None
    try:
        value: bytes | None = ray.get(board.get.remote(key))
    except ray.exceptions.RayActorError:  # it ended a moment ago: not there yet
        return None
    return value


def kv_put(key: str, value: str, namespace: str) -> None:
    """Set ``key`` in Ray's key-value store.

    Relies on ``ray.experimental.internal_kv._internal_kv_put``; without it, the board.
    """
    internal = _internal_kv()
    if internal is not None:
        internal._internal_kv_put(key, value, namespace=namespace)
        return
    import ray

    for last in (False, False, True):
        try:
            ray.get(_board(namespace, create=True).put.remote(key, value.encode()))
            return
        except ray.exceptions.RayActorError:  # the board ended with its last key: again
            if last:
                raise


def kv_del(key: str, namespace: str) -> None:
    """Delete ``key`` from Ray's key-value store.

    Relies on ``ray.experimental.internal_kv._internal_kv_del``; without it, the board.
    """
    internal = _internal_kv()
    if internal is not None:
        internal._internal_kv_del(key, namespace=namespace)
        return
    import ray

    board = _board(namespace, create=False)
    if board is not None:
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(board.delete.remote(key))


def client_connected() -> bool:
    """Whether this process is a Ray Client (``ray.init("ray://...")``), which has no
    streaming tasks and cannot reach the raylets.

    Relies on ``ray.util.client.ray.is_connected``; where it is not there: True, the way
    that works from any driver (actors, no keep-warm).
    """
    try:
        from ray.util.client import ray as client
    except ImportError:
        return True
    connected = getattr(client, "is_connected", None)
    return bool(connected()) if callable(connected) else True


def local_only() -> None:
    """Keep every address of a cluster started from this process on 127.0.0.1, in a Ray
    imported already (a fresh one reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at import);
    where the switch is not there, nothing (the nodes, started afresh, read the variable).

    Relies on ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``.
    """
    try:
        from ray._private import ray_constants
    except ImportError:
        return
    if isinstance(getattr(ray_constants, "ENABLE_RAY_CLUSTER", None), bool):
        ray_constants.ENABLE_RAY_CLUSTER = False


def _grpc_channel() -> Any:
    for name in ("ray._private.grpc_utils", "ray._private.utils"):  # Ray 2.59; 2.9-2.45
        with contextlib.suppress(ImportError):
            found = getattr(importlib.import_module(name), "init_grpc_channel", None)
            if callable(found):
                return found
    return None


def prestart_workers(address: str, job: bytes, count: int, keep_alive: int) -> bool:
    """Ask the raylet at ``address`` to start ``count`` idle Python workers of ``job``, kept
    ``keep_alive`` seconds: whether the call could be made (False: another Ray layout).

    Relies on ``ray._private.grpc_utils.init_grpc_channel`` (``ray._private.utils``'s before
    Ray 2.59) and the generated ``ray.core.generated`` protobufs'
    ``NodeManagerService.PrestartWorkers`` (the call Ray's own worker pool makes).
    """
    init_grpc_channel = _grpc_channel()
    try:
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    except ImportError:
        return False
    common: Any = common_pb2  # generated code: no stubs for mypy
    protos: Any = node_manager_pb2
    stubs: Any = node_manager_pb2_grpc
    if init_grpc_channel is None or not hasattr(protos, "PrestartWorkersRequest"):
        return False
    try:
        request = protos.PrestartWorkersRequest(
            language=common.Language.Value("PYTHON"),
            job_id=job,
            keep_alive_duration_secs=keep_alive,
            num_workers=count,
        )
        request.runtime_env_info.serialized_runtime_env = "{}"
        stub_class = stubs.NodeManagerServiceStub
    except (AttributeError, ValueError, TypeError):  # fields renamed: another layout
        return False
    channel = init_grpc_channel(address)
    try:
        stub_class(channel).PrestartWorkers(request, timeout=5.0)
    finally:
        channel.close()
    return True


def group_free(
    available: dict[str, float], group: str, bundle: dict[str, float], count: int
) -> bool:
    """Whether none of the ``count`` bundles (each ``bundle``) of the placement group whose id
    is ``group`` (hex) is in use any more, in ``available`` (``ray.available_resources()``).

    Relies on Ray's names for a group's reserved resources, ``<resource>_group_<id hex>`` (a
    resource wholly in use is left out, but the group's ``bundle_group_<id hex>`` shows);
    where no name ends so: True (another layout: nothing to wait for).
    """
    suffix = f"_group_{group}"
    if not any(key.endswith(suffix) for key in available):
        return True
    return all(available.get(f"{key}{suffix}", 0) >= value * count for key, value in bundle.items())
