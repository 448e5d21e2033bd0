"""Ordinals of the stand-in's device threads (torch_xla.runtime's names)."""

from __future__ import annotations

import os
import threading

_thread = threading.local()
_layout = {"processes": 1, "per_process": 1, "process_index": 0}


def topology() -> tuple[int, int]:
    """(processes, devices per process) from the variables the launcher sets."""
    if os.environ.get("PJRT_DEVICE") == "CPU":
        return 1, int(os.environ.get("CPU_NUM_DEVICES", "1"))
    devices = int(os.environ.get("TPU_NUM_DEVICES", "1"))
    per = int(os.environ.get("STANDIN_XLA_DEVICES_PER_PROCESS", "1"))
    return devices // per, per


def _ordinal() -> int:
    ordinal = getattr(_thread, "ordinal", None)
    if ordinal is None:
        raise RuntimeError("not a device thread of the torch_xla stand-in")
    return int(ordinal)


def global_ordinal() -> int:
    return _ordinal()


def local_ordinal() -> int:
    return _ordinal()  # one host


def world_size() -> int:
    return _layout["processes"] * _layout["per_process"]


def process_index() -> int:
    return _layout["process_index"]


def process_count() -> int:
    return _layout["processes"]


def addressable_device_count() -> int:
    return _layout["per_process"]


def local_device_count() -> int:
    return world_size()
