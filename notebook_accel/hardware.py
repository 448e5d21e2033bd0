"""What this machine has, found without initialising CUDA, and how "auto" resolves.

Each kind of hardware is a small class with one interface (availability, process bounds,
precisions, backend); ``resolve`` picks one and checks a LaunchConfig against it.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from . import env
from .config import LaunchConfig
from .errors import ConfigError

__all__ = ["Machine", "Plan", "detect", "resolve", "kinds", "HardwareKind"]


@dataclass(frozen=True)
class Machine:
    """A snapshot of the hardware visible to this process."""

    cpu_cores: int
    cuda_names: tuple[str, ...] = ()
    cuda_bf16: bool | None = None  # None: unknown without initialising CUDA
    mps: bool = False
    tpu_cores: int = 0
    tpu_type: str = ""
    place: str = "terminal"  # "colab", "kaggle", "jupyter" or "terminal"

    @property
    def cuda_count(self) -> int:
        return len(self.cuda_names)


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
        return machine.cuda_count

    def precisions(self, machine: Machine) -> tuple[str, ...]:
        if machine.cuda_bf16 is False:
            return ("no", "fp16")
        return ("no", "fp16", "bf16")

    def label(self, machine: Machine) -> str:
        return "CUDA" if machine.cuda_count == 1 else f"{machine.cuda_count} CUDA GPUs"

    def describe(self, machine: Machine) -> str:
        names = sorted(set(machine.cuda_names))
        short = names[0].replace("NVIDIA ", "") if len(names) == 1 else "GPUs"
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
        return f"TPU, {machine.tpu_cores} cores"


_KINDS: dict[str, HardwareKind] = {k.name: k for k in (_Tpu(), _Cuda(), _Mps(), _Cpu())}


def kinds(machine: Machine) -> list[HardwareKind]:
    """The hardware kinds this machine has, best first (TPU, CUDA, MPS, CPU)."""
    return [k for k in _KINDS.values() if k.available(machine)]


@functools.lru_cache(maxsize=1)
def _torch_cpu_fp16() -> bool:
    try:
        import torch

        torch.amp.GradScaler("cpu")
        return bool(torch.amp.autocast_mode.is_autocast_available("cpu"))
    except Exception:
        return False


def _visible() -> list[str] | None:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [v.strip() for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]


def _cuda_from_nvidia_smi() -> tuple[tuple[str, ...], bool | None]:
    """GPU names and bf16 support from nvidia-smi, filtered by CUDA_VISIBLE_DEVICES.

    nvidia-smi talks to the driver through NVML and never creates a CUDA context, so the
    notebook process stays free of CUDA state.
    """
    if shutil.which("nvidia-smi") is None:
        return (), None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid,name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return (), None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    visible = _visible()
    if visible is not None:
        by_key = {r[0]: r for r in rows} | {r[1]: r for r in rows}
        rows = [by_key[v] for v in visible if v in by_key]
    names = tuple(r[2] for r in rows)
    try:
        bf16 = all(float(r[3]) >= 8.0 for r in rows) if rows else None
    except (ValueError, IndexError):
        bf16 = None
    return names, bf16


def _tpu() -> tuple[int, str]:
    if importlib.util.find_spec("torch_xla") is None:
        return 0, ""
    accel_type = env.get("TPU_ACCELERATOR_TYPE") or env.get("ACCELERATOR_TYPE") or ""
    on_tpu_vm = bool(
        accel_type
        or env.get("COLAB_TPU_ADDR")
        or env.get("TPU_NAME")
        or env.get("PJRT_DEVICE") == "TPU"
        or glob.glob("/dev/accel*")
        or glob.glob("/dev/vfio/[0-9]*")
    )
    if not on_tpu_vm:
        return 0, ""
    match = re.search(r"-(\d+)$", accel_type)
    chips = len(glob.glob("/dev/accel*")) or len(glob.glob("/dev/vfio/[0-9]*"))
    cores = int(match.group(1)) if match else (chips or 8)
    return cores, accel_type


def _mps() -> bool:
    if sys.platform != "darwin":
        return False
    try:
        import torch

        return bool(torch.backends.mps.is_available())
    except Exception:
        return False


def _place() -> str:
    if env.get("COLAB_RELEASE_TAG") or "google.colab" in sys.modules:
        return "colab"
    if env.get("KAGGLE_KERNEL_RUN_TYPE"):
        return "kaggle"
    if "ipykernel" in sys.modules:
        return "jupyter"
    return "terminal"


def detect() -> Machine:
    """Look at the machine now (no CUDA context is created)."""
    names, bf16 = _cuda_from_nvidia_smi()
    tpu_cores, tpu_type = _tpu()
    return Machine(
        cpu_cores=os.cpu_count() or 1,
        cuda_names=names,
        cuda_bf16=bf16,
        mps=_mps(),
        tpu_cores=tpu_cores,
        tpu_type=tpu_type,
        place=_place(),
    )


def resolve(config: LaunchConfig, machine: Machine | None = None) -> Plan:
    """Turn "auto" into a concrete plan and check the config against the hardware."""
    machine = machine or detect()
    if config.hardware == "auto":
        kind = kinds(machine)[0]
    else:
        kind = _KINDS[config.hardware]
        if not kind.available(machine):
            have = ", ".join(repr(k.name) for k in kinds(machine))
            raise ConfigError("hardware", config.hardware, f"hardware this machine has ({have})")
    bound = kind.count(machine)
    n = config.num_processes or kind.default_processes(machine)
    if bound and n > bound:
        raise ConfigError("num_processes", n, f"an int in [1, {bound}] on {kind.describe(machine)}")
    precisions = ("no",) if config.mixed_precision == "no" else kind.precisions(machine)
    if config.mixed_precision not in precisions:
        raise ConfigError(
            "mixed_precision",
            config.mixed_precision,
            f"one of {', '.join(map(repr, precisions))} on {kind.describe(machine)}",
        )
    return Plan(
        hardware=kind.name,
        num_processes=n,
        backend=kind.backend,
        device_type=kind.device_type,
        label=kind.label(machine),
    )
