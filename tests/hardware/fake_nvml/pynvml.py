"""A stand-in for nvidia-ml-py's ``pynvml``: the driver's answers come from ``$FAKE_NVML``.

Put this folder first on ``sys.path`` (or ``PYTHONPATH`` for a subprocess) and set
``FAKE_NVML`` to JSON such as::

    {"driver": "550.54.15",
     "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-1111...", "cc": [8, 0],
               "mig": [{"uuid": "MIG-aaaa...", "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                        "gi": 1, "ci": 0}]}]}

``"mig"`` absent: a GPU that is not MIG-capable; ``[]``: MIG mode on, no instance made.
``{"fail": "init"}`` plays a machine whose driver is missing, ``{"fail": "uuid", "gpus": [...]}``
a driver that starts and then fails a query. Only the calls that
notebook_accel makes are here, with the real binding's names and error behaviour.
"""

from __future__ import annotations

import json
import os
from typing import Any

NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


def _spec() -> dict[str, Any]:
    return json.loads(os.environ.get("FAKE_NVML", '{"gpus": []}'))


_started = 0


def nvmlInit() -> None:
    global _started
    if _spec().get("fail") == "init":
        raise NVMLError("NVML Shared Library Not Found")
    _started += 1


def nvmlShutdown() -> None:
    global _started
    _started -= 1


def _check() -> None:
    if _started <= 0:
        raise NVMLError("Uninitialized")


def nvmlSystemGetDriverVersion() -> str:
    _check()
    return str(_spec().get("driver", "550.54.15"))


def nvmlDeviceGetCount() -> int:
    _check()
    return len(_spec()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> tuple[int, int | None]:
    _check()
    if index >= len(_spec()["gpus"]):
        raise NVMLError("Invalid Argument")
    return (index, None)


def _gpu(handle: tuple[int, int | None]) -> dict[str, Any]:
    return dict(_spec()["gpus"][handle[0]])


def _mig(handle: tuple[int, int | None]) -> dict[str, Any]:
    assert handle[1] is not None
    return dict(_gpu(handle)["mig"][handle[1]])


def nvmlDeviceGetName(handle: tuple[int, int | None]) -> str:
    return str((_gpu(handle) if handle[1] is None else _mig(handle))["name"])


def nvmlDeviceGetUUID(handle: tuple[int, int | None]) -> str:
    if _spec().get("fail") == "uuid":
        raise NVMLError("Unknown Error")
    return str((_gpu(handle) if handle[1] is None else _mig(handle))["uuid"])


def nvmlDeviceGetCudaComputeCapability(handle: tuple[int, int | None]) -> tuple[int, int]:
    cc = _gpu(handle).get("cc")
    if cc is None:
        raise NVMLError_NotSupported("Not Supported")
    return int(cc[0]), int(cc[1])


def nvmlDeviceGetMigMode(handle: tuple[int, int | None]) -> tuple[int, int]:
    gpu = _gpu(handle)
    if "mig" not in gpu:
        raise NVMLError_NotSupported("Not Supported")
    mode = NVML_DEVICE_MIG_ENABLE if gpu["mig"] is not None else NVML_DEVICE_MIG_DISABLE
    return mode, mode


def nvmlDeviceGetMaxMigDeviceCount(handle: tuple[int, int | None]) -> int:
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(
    handle: tuple[int, int | None], index: int
) -> tuple[int, int | None]:
    migs = _gpu(handle).get("mig") or []
    if index >= len(migs):
        raise NVMLError_NotFound("Not Found")
    return (handle[0], index)


def nvmlDeviceGetGpuInstanceId(handle: tuple[int, int | None]) -> int:
    return int(_mig(handle)["gi"])


def nvmlDeviceGetComputeInstanceId(handle: tuple[int, int | None]) -> int:
    return int(_mig(handle)["ci"])
