"""The collectives notebook_accel calls, between the device threads of one process.

Devices in different processes of the stand-in cannot exchange anything (torch_xla would go
through the TPU interconnect); tests that need collectives use one process, several threads.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .. import runtime

REDUCE_SUM = "sum"
REDUCE_MAX = "max"

_slots: list[Any] = []
_barrier: threading.Barrier | None = None


def _exchange_for(per_process: int) -> None:
    global _barrier, _slots
    _barrier = threading.Barrier(per_process)
    _slots = [None] * per_process


def _exchange(value: Any) -> list[Any]:
    """Every device thread's value, in ordinal order (a two-phase barrier exchange)."""
    if runtime.process_count() > 1:
        raise RuntimeError("the stand-in has no collectives across processes")
    assert _barrier is not None
    _slots[runtime.global_ordinal()] = value
    _barrier.wait()
    out = list(_slots)
    _barrier.wait()  # nobody overwrites a slot before everyone has read
    return out


def rendezvous(tag: str, payload: bytes = b"", replicas: list[int] | None = None) -> list[bytes]:
    return [bytes(p) for p in _exchange(payload)]


def all_reduce(reduce_type: str, inputs: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    parts = _exchange(inputs.detach().clone())
    stacked = torch.stack(parts)
    out = stacked.sum(0) if reduce_type == REDUCE_SUM else stacked.max(0).values
    return out * scale


def all_gather(value: torch.Tensor, dim: int = 0) -> torch.Tensor:
    return torch.cat(_exchange(value.detach().clone()), dim=dim)


def reduce_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Average every gradient across the devices (torch_xla's own optimizer_step does this)."""
    world = runtime.world_size()
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                param.grad.copy_(all_reduce(REDUCE_SUM, param.grad, 1.0 / world))


def mark_step() -> None:
    """torch_xla's older name for sync()."""
