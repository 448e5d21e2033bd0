"""Ray's private names: its key-value store, its raylets' gRPC, Ray Client's flag, the
local-only switch. They hold for Ray 2.9 to 2.60 (the versions CI runs).
"""

from __future__ import annotations

from typing import Any

__all__ = ["client_connected", "kv_del", "kv_get", "kv_put", "local_only", "prestart_workers"]


def kv_get(key: str, namespace: str) -> bytes | None:
    """The value of ``key`` in Ray's cluster-wide key-value store (None: not there yet).

    Relies on ``ray.experimental.internal_kv._internal_kv_get``.
    """
    from ray.experimental import internal_kv

    found: bytes | None = internal_kv._internal_kv_get(key, namespace=namespace)
    return found


def kv_put(key: str, value: str, namespace: str) -> None:
    """Set ``key`` in Ray's key-value store.

    Relies on ``ray.experimental.internal_kv._internal_kv_put``.
    """
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, namespace=namespace)


def kv_del(key: str, namespace: str) -> None:
    """Delete ``key`` from Ray's key-value store.

    Relies on ``ray.experimental.internal_kv._internal_kv_del``.
    """
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=namespace)


def client_connected() -> bool:
    """Whether this process is a Ray Client (``ray.init("ray://...")``), which has no
    streaming tasks and cannot reach the raylets.

    Relies on ``ray.util.client.ray.is_connected``.
    """
    from ray.util.client import ray as client

    return bool(client.is_connected())


def local_only() -> None:
    """Keep every address of a cluster started from this process on 127.0.0.1, in a Ray
    imported already (a fresh one reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER at import).

    Relies on ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``.
    """
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def prestart_workers(address: str, job: bytes, count: int, keep_alive: int) -> bool:
    """Ask the raylet at ``address`` to start ``count`` idle Python workers of ``job``, kept
    ``keep_alive`` seconds: whether the call could be made (False: another Ray layout).

    Relies on ``ray._private.grpc_utils.init_grpc_channel`` and the generated
    ``ray.core.generated`` protobufs' ``NodeManagerService.PrestartWorkers`` (the call Ray's
    own worker pool makes).
    """
    try:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    except ImportError:
        return False
    common: Any = common_pb2  # generated code: no stubs for mypy
    protos: Any = node_manager_pb2
    request = protos.PrestartWorkersRequest(
        language=common.Language.Value("PYTHON"),
        job_id=job,
        keep_alive_duration_secs=keep_alive,
        num_workers=count,
    )
    request.runtime_env_info.serialized_runtime_env = "{}"
    channel = init_grpc_channel(address)
    try:
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=5.0)
    finally:
        channel.close()
    return True
