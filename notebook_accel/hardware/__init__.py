"""What this machine has, found without initialising CUDA, and how "auto" resolves.

Each kind of hardware is a small class with one interface (availability, process bounds,
precisions, backend); ``resolve`` picks one and checks a LaunchConfig against it. CUDA devices
come from NVML (``gpu.py``), TPU devices per host from the accelerator type
(``tpu.py``) for torch_xla, or TorchTPU's chips from the PCI bus (``torchtpu.py``); each answer
keeps a sentence on how it was found (``notebook-accel env``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass

from .. import env
from ..config import LaunchConfig
from ..errors import ConfigError
from ..options import rules
from . import gpu as hardware_gpu
from . import torchtpu
from . import tpu as hardware_tpu

__all__ = ["Machine", "Plan", "detect", "resolve", "kinds", "HardwareKind", "usable_cores"]


@dataclass(frozen=True)
class Machine:
    """A snapshot of the hardware visible to this process.

    ``cuda_names`` are the devices CUDA would enumerate (MIG devices where a GPU is in MIG
    mode); ``cuda_capability`` is the lowest compute capability among them (``None``:
    unknown). ``tpu_cores`` counts the XLA devices on this host (TensorCores on v2/v3, chips
    on v4 and later). The ``*_method`` fields say how each was found.
    """

    cpu_cores: int
    cuda_names: tuple[str, ...] = ()
    cuda_bf16: bool | None = None  # None: unknown without initialising CUDA
    mps: bool = False
    tpu_cores: int = 0
    tpu_type: str = ""
    place: str = "terminal"  # "colab", "kaggle", "jupyter" or "terminal"
    cuda_capability: tuple[int, int] | None = None
    cuda_mig: bool = False
    cuda_method: str = ""
    tpu_method: str = ""
    torchtpu_chips: int = 0  # TorchTPU's chips (torch_xla absent, torch_tpu installed)
    torchtpu_type: str = ""

    @property
    def cuda_count(self) -> int:
        return len(self.cuda_names)

    @property
    def cuda_fp8(self) -> bool:
        """Float8 tensor cores on every visible GPU (compute capability >= 8.9), as far as known."""
        return self.cuda_capability is not None and self.cuda_capability >= (8, 9)


@dataclass(frozen=True)
class Plan:
    """A resolved launch: which hardware, how many processes, which backend."""

    hardware: str
    num_processes: int
    backend: str
    device_type: str
    label: str

    def describe(self, num_nodes: int = 1) -> str:
        noun = "process" if self.num_processes == 1 else "processes"
        where = f" on each of {num_nodes} machines" if num_nodes > 1 else ""
        return f"Launching {self.num_processes} {noun} on {self.label} ({self.backend}){where}"


class HardwareKind:
    """Shared interface of the hardware kinds."""

    name = ""
    backend = ""
    device_type = ""

    def available(self, machine: Machine) -> bool:
        raise NotImplementedError

    def count(self, machine: Machine) -> int:
        """How many devices a launch may use; 0 means no fixed bound (CPU)."""
        raise NotImplementedError

    def default_processes(self, machine: Machine) -> int:
        return self.count(machine)

    def precisions(self, machine: Machine) -> tuple[str, ...]:
        return ("no", "bf16")

    def label(self, machine: Machine) -> str:
        return self.name.upper()

    def describe(self, machine: Machine) -> str:
        """For menus: ``"CUDA, 8 × H100"``."""
        return self.label(machine)


class _Cpu(HardwareKind):
    name, backend, device_type = "cpu", "gloo", "cpu"

    def available(self, machine: Machine) -> bool:
        return True

    def count(self, machine: Machine) -> int:
        return 0

    def default_processes(self, machine: Machine) -> int:
        # Two processes show data parallelism without starving each of threads.
        return 2

    def precisions(self, machine: Machine) -> tuple[str, ...]:
        return ("no", "bf16", "fp16") if _torch_cpu_fp16() else ("no", "bf16")

    def describe(self, machine: Machine) -> str:
        return f"CPU, {machine.cpu_cores} cores"


class _Cuda(HardwareKind):
    name, backend, device_type = "cuda", "nccl", "cuda"

    def available(self, machine: Machine) -> bool:
        return machine.cuda_count > 0

    def count(self, machine: Machine) -> int:
        # One CUDA process enumerates one MIG device, and NCCL does not run across MIG
        # devices: a launch on MIG is one process.
        return 1 if machine.cuda_mig else machine.cuda_count

    def precisions(self, machine: Machine) -> tuple[str, ...]:
        found = ("no", "fp16") if machine.cuda_bf16 is False else ("no", "fp16", "bf16")
        return found + ("fp8",) if machine.cuda_fp8 else found

    def label(self, machine: Machine) -> str:
        if machine.cuda_mig:
            return "a CUDA MIG device"
        return "CUDA" if machine.cuda_count == 1 else f"{machine.cuda_count} CUDA GPUs"

    def describe(self, machine: Machine) -> str:
        names = sorted(set(machine.cuda_names))
        short = names[0].replace("NVIDIA ", "") if len(names) == 1 else "GPUs"
        if machine.cuda_mig:
            return f"CUDA MIG, {machine.cuda_count} × {short} (a process sees one MIG device)"
        return f"CUDA, {machine.cuda_count} × {short}"


class _Mps(HardwareKind):
    name, backend, device_type = "mps", "gloo", "mps"

    def available(self, machine: Machine) -> bool:
        return machine.mps

    def count(self, machine: Machine) -> int:
        return 1

    def precisions(self, machine: Machine) -> tuple[str, ...]:
        return ("no", "fp16", "bf16")

    def describe(self, machine: Machine) -> str:
        return "Apple MPS, 1 device"


class _Tpu(HardwareKind):
    name, backend, device_type = "tpu", "xla", "xla"

    def available(self, machine: Machine) -> bool:
        return machine.tpu_cores > 0

    def count(self, machine: Machine) -> int:
        return machine.tpu_cores

    def precisions(self, machine: Machine) -> tuple[str, ...]:
        return ("no", "bf16")

    def label(self, machine: Machine) -> str:
        return f"TPU {machine.tpu_type}".strip()

    def describe(self, machine: Machine) -> str:
        return f"{self.label(machine)}, {machine.tpu_cores} devices on this host"


class _TorchTpu(HardwareKind):
    """TPU chips through TorchTPU: this machine's workers, one per chip, ``tpu_dist`` groups;
    one process unless the parent set TorchTPU's launch variables (torchtpu.py)."""

    name, backend, device_type = "tpu", "tpu_dist", "tpu"

    def available(self, machine: Machine) -> bool:
        return machine.torchtpu_chips > 0

    def count(self, machine: Machine) -> int:
        return machine.torchtpu_chips if torchtpu.launch_env() else 1

    def precisions(self, machine: Machine) -> tuple[str, ...]:
        return ("no", "bf16")  # no GradScaler op on TorchTPU: no fp16 (nor in accelerate)

    def label(self, machine: Machine) -> str:
        return f"TPU {machine.torchtpu_type} (TorchTPU)".replace("  ", " ")

    def describe(self, machine: Machine) -> str:
        chips = f"{machine.torchtpu_chips} chips on this host"
        if torchtpu.launch_env():
            return f"{self.label(machine)}, {chips}"
        return (
            f"{self.label(machine)}, {chips}; one process until TorchTPU's launch variables "
            "are set: call torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=N) in "
            "the notebook first"
        )


_ALL_KINDS = (_Tpu(), _TorchTpu(), _Cuda(), _Mps(), _Cpu())
_KINDS: dict[str, HardwareKind] = {}
for _kind in _ALL_KINDS:
    _KINDS.setdefault(_kind.name, _kind)


def kinds(machine: Machine) -> list[HardwareKind]:
    """The hardware kinds this machine has, best first (TPU, CUDA, MPS, CPU); a TPU is
    torch_xla's where it is installed, else TorchTPU's."""
    found: list[HardwareKind] = []
    for kind in _ALL_KINDS:
        if kind.available(machine) and all(k.name != kind.name for k in found):
            found.append(kind)
    return found


@functools.lru_cache(maxsize=1)
def _torch_cpu_fp16() -> bool:
    try:
        import torch

        torch.amp.GradScaler("cpu")
        return bool(torch.amp.autocast_mode.is_autocast_available("cpu"))
    except Exception:
        return False


def _torchtpu() -> tuple[int, str]:
    """TorchTPU's chips, where torch_tpu is installed and torch_xla (which takes TPUs
    otherwise) is not."""
    if importlib.util.find_spec("torch_xla") is not None:
        return 0, ""
    if importlib.util.find_spec("torch_tpu") is None:
        return 0, ""
    return torchtpu.chips()


def _tpu() -> tuple[int, str, str]:
    if importlib.util.find_spec("torch_xla") is None:
        return 0, "", ""
    accel_type = env.tpu_accelerator_type()
    found = hardware_tpu.from_accelerator_type(accel_type) if accel_type else None
    if found is None:
        found = hardware_tpu.from_device_files()
    if found is None:
        return 0, accel_type, ""
    return found.devices, accel_type, found.method


def _mps() -> bool:
    if sys.platform != "darwin":
        return False
    try:
        import torch

        return bool(torch.backends.mps.is_available())
    except Exception:
        return False


def _place() -> str:
    place = env.notebook_place()
    if place is not None or "google.colab" in sys.modules:
        return place or "colab"
    if "ipykernel" in sys.modules:
        return "jupyter"
    return "terminal"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or ``taskset``'s
    limit), where the platform has one, else every core."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def detect() -> Machine:
    """Look at the machine now (no CUDA context is created)."""
    cuda = hardware_gpu.probe()
    known = [d.capability for d in cuda.devices if d.capability is not None]
    lowest = min(known) if known and len(known) == len(cuda.devices) else None
    tpu_cores, tpu_type, tpu_method = _tpu()
    torchtpu_chips, torchtpu_type = _torchtpu()
    return Machine(
        cpu_cores=usable_cores(),
        cuda_names=tuple(d.name for d in cuda.devices),
        cuda_bf16=None if lowest is None else lowest >= (8, 0),
        mps=_mps(),
        tpu_cores=tpu_cores,
        tpu_type=tpu_type,
        place=_place(),
        cuda_capability=lowest,
        cuda_mig=any(d.mig for d in cuda.devices),
        cuda_method=cuda.method,
        tpu_method=tpu_method,
        torchtpu_chips=torchtpu_chips,
        torchtpu_type=torchtpu_type,
    )


def resolve(config: LaunchConfig, machine: Machine | None = None) -> Plan:
    """Turn "auto" into a concrete plan and check the config against the hardware."""
    machine = machine or detect()
    if config.hardware == "auto":
        kind = kinds(machine)[0]
    else:
        present = {k.name: k for k in kinds(machine)}
        kind = present.get(config.hardware, _KINDS[config.hardware])
        if not kind.available(machine):
            have = ", ".join(repr(name) for name in present)
            raise ConfigError("hardware", config.hardware, f"hardware this machine has ({have})")
    bound = kind.count(machine)
    n = config.num_processes or kind.default_processes(machine)
    if bound and n > bound:
        raise ConfigError("num_processes", n, f"an int in [1, {bound}] on {kind.describe(machine)}")
    if config.mixed_precision != "no":  # (CPU's precisions import torch to find fp16)
        known = kind.name != "cuda" or machine.cuda_capability is not None
        rules.precision_on(
            config.mixed_precision,
            kind.precisions(machine),
            kind.describe(machine),
            capability_unknown="" if known else hardware_gpu.INSTALL_HINT,
        )
    if config.deepspeed is not None:
        rules.deepspeed_precision(config.mixed_precision, kind.device_type)
    return Plan(
        hardware=kind.name,
        num_processes=n,
        backend=kind.backend,
        device_type=kind.device_type,
        label=kind.label(machine),
    )
