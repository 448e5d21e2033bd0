"""CUDA GPUs as NVML reports them, filtered as CUDA would filter them, without touching CUDA.

    NVML (nvidia-ml-py's ``pynvml``)       every physical GPU: name, UUID, compute capability,
       |                                   MIG mode and its MIG devices (UUID, GI/CI ids)
       v
    visible(gpus, CUDA_VISIBLE_DEVICES)    CUDA's rules: indices, GPU-UUIDs (whole or a unique
       |                                   prefix), MIG-UUIDs and MIG-GPU-<uuid>/<gi>/<ci>;
       |                                   the first invalid entry ends the list, a repeated
       |                                   one leaves nothing; a GPU in MIG mode is its MIG
       v                                   devices
    CudaFound(devices, method)             what a process would enumerate, and how we know

Without the binding, torch's own NVML-based count (``torch.cuda._device_count_nvml``, the one
``torch.cuda.device_count()`` uses before CUDA is initialised) gives the number, with names and
compute capability unknown. NVML talks to the driver and never creates a CUDA context, so the
notebook stays free of CUDA state either way; nothing here parses ``nvidia-smi`` text.
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from typing import Any

from .. import env
from ..private import torch as private_torch

__all__ = ["Gpu", "MigDevice", "CudaDevice", "CudaFound", "probe", "visible", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'notebook_accel[gpu]' (nvidia-ml-py)"


@dataclass(frozen=True)
class MigDevice:
    """A MIG device (one compute instance of one GPU instance) of a GPU in MIG mode."""

    uuid: str
    name: str
    gpu_instance: int
    compute_instance: int


@dataclass(frozen=True)
class Gpu:
    """A physical GPU as NVML lists it (index in NVML's order, as nvidia-smi shows it)."""

    index: int
    uuid: str
    name: str
    capability: tuple[int, int] | None
    mig: tuple[MigDevice, ...] | None = None  # None: MIG mode off


@dataclass(frozen=True)
class CudaDevice:
    """A device that CUDA would enumerate in a process started now."""

    name: str
    uuid: str
    capability: tuple[int, int] | None
    mig: bool = False


@dataclass(frozen=True)
class CudaFound:
    """The visible CUDA devices, and a sentence on how they were found."""

    devices: tuple[CudaDevice, ...]
    method: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mig_devices(nvml: Any, handle: Any) -> tuple[MigDevice, ...] | None:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return None  # not MIG-capable (NOT_SUPPORTED) or not answering: a plain GPU
    if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    found = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:
            continue  # an empty slot (NOT_FOUND)
        found.append(
            MigDevice(
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                name=_text(nvml.nvmlDeviceGetName(mig)),
                gpu_instance=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
            )
        )
    return tuple(found)


def _capability(nvml: Any, handle: Any) -> tuple[int, int] | None:
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    except nvml.NVMLError:
        return None
    return int(major), int(minor)


class _NoDriver(Exception):
    """NVML did not start: no NVIDIA driver on this machine (or it is not loaded)."""


def _gpus_from_pynvml(nvml: Any) -> tuple[list[Gpu], str]:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise _NoDriver(_text(exc)) from exc
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    capability=_capability(nvml, handle),
                    mig=_mig_devices(nvml, handle),
                )
            )
    finally:
        nvml.nvmlShutdown()
    return gpus, f"NVML through nvidia-ml-py, driver {driver}"


def _nvml_library() -> bool:
    """Whether the driver's NVML library loads (cheap; creates no CUDA context)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _count_from_torch() -> int:
    """torch's NVML-based count (CUDA_VISIBLE_DEVICES applied); negative when it cannot tell."""
    return private_torch.nvml_device_count()


def probe() -> CudaFound:
    """The CUDA devices a process started now would see, found through NVML."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        nvml = None
    failed = ""
    if nvml is not None:
        try:
            gpus, method = _gpus_from_pynvml(nvml)
        except _NoDriver as exc:
            # LIBRARY_NOT_FOUND / DRIVER_NOT_LOADED: a machine without NVIDIA GPUs.
            return CudaFound((), f"none: NVML did not start ({exc})")
        except nvml.NVMLError as exc:  # started, then a query failed: count another way
            failed = f"nvidia-ml-py failed ({_text(exc)}), so "
        else:
            devices = visible(gpus, env.cuda_visible_devices())
            return CudaFound(tuple(devices), method + _filter_note())
    if not _nvml_library():
        return CudaFound((), "none: no NVIDIA driver (libnvidia-ml.so.1 not found)")
    return _torch_count(failed)


def _torch_count(failed: str) -> CudaFound:
    count = _count_from_torch()
    advice = "" if failed else f"; for names and compute capability, {INSTALL_HINT}"
    if count < 0:
        return CudaFound(
            (),
            f"unknown: {failed}torch's NVML count could not tell (MIG device UUIDs, or NVML "
            f"failed): no GPU is counted{advice}",
        )
    unknown = CudaDevice(name="CUDA GPU", uuid="", capability=None)
    return CudaFound(
        (unknown,) * count,
        f"{failed}NVML through torch (torch.cuda._device_count_nvml): names and compute "
        f"capability unknown{advice}" + _filter_note(),
    )


def _filter_note() -> str:
    value = env.cuda_visible_devices()
    return "" if value is None else f"; CUDA_VISIBLE_DEVICES={value!r}"


# -- CUDA_VISIBLE_DEVICES -------------------------------------------------------------------
_Unit = tuple[Gpu, MigDevice | None]


def _unique(candidates: list[_Unit]) -> _Unit | None:
    return candidates[0] if len(candidates) == 1 else None  # none, or an ambiguous prefix


def _lookup(token: str, gpus: list[Gpu]) -> _Unit | None:
    """The GPU or MIG device that one entry names, or None if the entry is invalid."""
    if token.isdigit():
        index = int(token)
        return (gpus[index], None) if index < len(gpus) else None
    if token.startswith("GPU-"):
        return _unique([(g, None) for g in gpus if g.uuid.startswith(token)])
    if token.startswith("MIG-GPU-"):  # the older form: MIG-GPU-<uuid>/<gi>/<ci>
        parts = token[4:].split("/")
        if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
            return None
        gi, ci = int(parts[1]), int(parts[2])
        return _unique(
            [
                (g, m)
                for g in gpus
                if g.uuid == parts[0]
                for m in g.mig or ()
                if (m.gpu_instance, m.compute_instance) == (gi, ci)
            ]
        )
    if token.startswith("MIG-"):
        return _unique([(g, m) for g in gpus for m in g.mig or () if m.uuid.startswith(token)])
    return None


def _expand(unit: _Unit) -> list[CudaDevice]:
    gpu, mig = unit
    if mig is not None:
        return [CudaDevice(mig.name, mig.uuid, gpu.capability, mig=True)]
    if gpu.mig is not None:  # a GPU in MIG mode is seen through its MIG devices only
        return [CudaDevice(m.name, m.uuid, gpu.capability, mig=True) for m in gpu.mig]
    return [CudaDevice(gpu.name, gpu.uuid, gpu.capability)]


def visible(gpus: list[Gpu], variable: str | None) -> list[CudaDevice]:
    """The devices CUDA enumerates given ``CUDA_VISIBLE_DEVICES`` (``None``: not set).

    Example:
        >>> gpu = Gpu(0, "GPU-8932f937-d72c", "NVIDIA H100", (9, 0))
        >>> [d.name for d in visible([gpu], "GPU-8932")]
        ['NVIDIA H100']
    """
    if variable is None:
        return [d for g in gpus for d in _expand((g, None))]
    units: list[_Unit] = []
    for token in (t.strip() for t in variable.split(",")):
        unit = _lookup(token, gpus)
        if unit is None:
            break  # CUDA ignores the rest of the list after an invalid entry
        if any(u[0] is unit[0] and u[1] is unit[1] for u in units):
            return []  # a device named twice: CUDA enumerates nothing
        units.append(unit)
    return [d for u in units for d in _expand(u)]
