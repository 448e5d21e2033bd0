"""The torch accelerator of this process, as accelerate 1.16 names it (no torch at import).

    get_torch_accelerator_backend()      ("cuda", torch.cuda), ("mps", torch.mps), ("tpu",
                                         torch.accelerator) under TorchTPU, ... or (None, None)
    get_distributed_backend("cuda")      the device's torch.distributed backend ("nccl"), or
                                         None (the CPU, MPS: no device backend)
    normalize_device(0)                  an index as the device's string where the device
                                         needs it ("tpu:0", "xpu:0"); CUDA's stay ints
    get_accelerator_free_memory(m, i)    free bytes of device ``i`` through its API module ``m``
    empty_cache()                        cached device memory back to the driver (CUDA only
                                         where this process initialised it)

torch says which accelerator it has (``torch.accelerator.current_accelerator()``): CUDA, MPS,
XPU, or a backend registered from outside torch (TorchTPU renames torch's PrivateUse1 device
to ``"tpu"`` and registers ``torch.tpu``). Device families with a native API module keep it
(``torch.cuda``...); the others are driven through ``torch.accelerator``, as accelerate does.
Reached as ``notebook_accel.utils.get_torch_accelerator_backend`` etc.

Example:
    >>> from notebook_accel.utils import get_torch_accelerator_backend
    >>> get_torch_accelerator_backend()  # doctest: +SKIP
    ('cuda', <module 'torch.cuda' ...>)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "NATIVE",
    "empty_cache",
    "get_accelerator_free_memory",
    "get_distributed_backend",
    "get_torch_accelerator_backend",
    "normalize_device",
]

# Device types driven through their own torch module (accelerate's list); any other
# accelerator (TorchTPU's "tpu") is driven through torch.accelerator.
NATIVE = frozenset({"cuda", "mps", "mlu", "sdaa", "musa", "npu", "hpu", "xpu", "neuron"})
# accelerate's table of device backends; a device outside it gets the backend torch was told
# of (torch.distributed.Backend.register_backend: TorchTPU registers "tpu_dist" for "tpu").
_BACKENDS = {
    "cuda": "nccl",
    "mlu": "cncl",
    "sdaa": "tccl",
    "musa": "mccl",
    "npu": "hccl",
    "hpu": "hccl",
    "xpu": "xccl",
    "neuron": "neuron",
}
_NO_DEVICE_BACKEND = frozenset({"cpu", "mps"})  # gloo runs there, but it is not theirs


def _available(device_type: str) -> bool:
    import torch

    if device_type == "cuda":
        return bool(torch.cuda.device_count() > 0)  # NVML's count: CUDA stays uninitialised
    if device_type == "mps":
        return bool(torch.backends.mps.is_available())
    module = torch.get_device_module(device_type) if device_type in NATIVE else None
    probe = getattr(module, "is_available", torch.accelerator.is_available)
    try:
        return bool(probe())
    except RuntimeError:  # a driver that fails to answer has no usable device
        return False


def get_torch_accelerator_backend(check_available: bool = True) -> tuple[str | None, Any]:
    """The accelerator's device type and its API module, or ``(None, None)`` without one.

    Args:
        check_available: also ask whether a device is usable (``False``: which backend torch
            has, without probing devices, e.g. before a fork).

    Example:
        >>> get_torch_accelerator_backend()  # on a CPU-only machine
        (None, None)
    """
    import torch

    try:
        device = torch.accelerator.current_accelerator()
    except RuntimeError:  # a CPU-only build of some torch releases raises instead
        device = None
    if device is None or (check_available and not _available(device.type)):
        return None, None
    if device.type in NATIVE:
        return device.type, torch.get_device_module(device.type)
    return device.type, torch.accelerator


def get_distributed_backend(device_type: str | None) -> str | None:
    """The device's default ``torch.distributed`` backend, or None where it has none.

    accelerate's table (``"nccl"`` for CUDA, ``"xccl"`` for XPU where torch has it...); a
    device outside that table gets the backend registered for it with torch, such as
    TorchTPU's ``"tpu_dist"`` (accelerate 1.16 answers None there: one TorchTPU process).

    Example:
        >>> get_distributed_backend("cuda"), get_distributed_backend("cpu")
        ('nccl', None)
    """
    if device_type is None or device_type in _NO_DEVICE_BACKEND:
        return None
    import torch.distributed as dist

    if device_type == "xpu":
        xccl = getattr(dist, "is_xccl_available", None)
        return "xccl" if xccl is not None and xccl() else None
    if device_type in _BACKENDS:
        return _BACKENDS[device_type]
    if not dist.is_available():
        return None
    registered: dict[str, str] = getattr(dist.Backend, "default_device_backend_map", {})
    return registered.get(device_type)


def normalize_device(device: Any) -> Any:
    """``device`` as ``.to()`` takes it on this accelerator: an int index becomes
    ``"<type>:<index>"`` off CUDA (``"hpu"`` on Gaudi), ``"npu"`` becomes ``"npu:0"``;
    anything else is returned as it is.

    Example:
        >>> normalize_device("cpu"), normalize_device(0)  # CPU-only machine: no accelerator
        ('cpu', 0)
    """
    if device == "npu":
        return "npu:0"  # torch_npu needs an index the first time a context is made
    if isinstance(device, int) and not isinstance(device, bool):
        # No availability probe: a device string needs none (and probes break torch.compile).
        device_type, _ = get_torch_accelerator_backend(check_available=False)
        if device_type == "hpu":
            return "hpu"
        if device_type not in (None, "cuda"):
            return f"{device_type}:{device}"
    return device


def get_accelerator_free_memory(device_module: Any, device_index: int) -> int:
    """Free memory, in bytes, of device ``device_index`` through ``device_module`` (the
    second item of :func:`get_torch_accelerator_backend`).

    TorchTPU reports no free memory: its chip's HBM less what torch allocated there.
    """
    import torch

    if device_module is not torch.accelerator:
        return int(device_module.mem_get_info(device_index)[0])
    memory_info = getattr(torch.accelerator, "get_memory_info", None)
    if memory_info is not None:
        return int(memory_info(device_index)[0])
    device = torch.accelerator.current_accelerator()
    native = torch.get_device_module(device)
    if device is not None and device.type == "tpu":
        properties = native.get_device_properties(device_index)
        total = getattr(properties, "hbm_bytes_per_device", None) or properties.total_memory
        return max(0, int(total) - int(torch.accelerator.memory_allocated(device_index)))
    return int(native.mem_get_info(device_index)[0])


def empty_cache() -> None:
    """Return the accelerator's cached memory to its driver (accelerate 1.16's
    ``clear_device_cache`` without the garbage collection): CUDA only where this process has
    initialised it (emptying would not initialise it, but probing costs nothing here); Gaudi
    keeps its memory reserved, as accelerate leaves it."""
    import torch

    device_type, module = get_torch_accelerator_backend()
    if device_type in (None, "hpu") or not hasattr(module, "empty_cache"):
        return
    if device_type == "cuda" and not torch.cuda.is_initialized():
        return
    module.empty_cache()
