"""accelerate.utils's ``is_*_available`` probes: what this machine and environment have.

Each answers truthfully and cheaply: a package probe looks for the installed distribution
without importing it; a device probe asks torch (``torch.xpu``, or ``torch.npu`` once
``torch_npu`` is importable). Reached as ``notebook_accel.utils.is_xpu_available`` etc.

Example:
    >>> from notebook_accel.utils import is_schedulefree_available
    >>> if is_schedulefree_available():  # doctest: +SKIP
    ...     import schedulefree
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from typing import Any

__all__ = [
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_mlflow_available",
    "is_mps_available",
    "is_npu_available",
    "is_schedulefree_available",
    "is_tensorboard_available",
    "is_torchao_available",
    "is_transformers_available",
    "is_wandb_available",
    "is_xpu_available",
]


def _installed(module: str, distribution: str | None = None) -> bool:
    """``module`` importable and its distribution installed (not a stray folder of that name)."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):
        return False
    try:
        importlib.metadata.distribution(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def is_schedulefree_available() -> bool:
    """Whether the ``schedulefree`` optimizers are installed."""
    return _installed("schedulefree")


def is_deepspeed_available() -> bool:
    """Whether DeepSpeed is installed."""
    return _installed("deepspeed")


def is_transformers_available() -> bool:
    """Whether transformers is installed."""
    return _installed("transformers")


def is_datasets_available() -> bool:
    """Whether datasets is installed."""
    return _installed("datasets")


def is_tensorboard_available() -> bool:
    """Whether TensorBoard (or tensorboardX) is installed."""
    return _installed("tensorboard") or _installed("tensorboardX")


def is_wandb_available() -> bool:
    """Whether Weights & Biases is installed."""
    return _installed("wandb")


def is_mlflow_available() -> bool:
    """Whether MLflow (or its skinny distribution) is installed."""
    return _installed("mlflow") or _installed("mlflow", "mlflow-skinny")


def is_torchao_available() -> bool:
    """Whether torchao is installed."""
    return _installed("torchao")


def is_cuda_available() -> bool:
    """Whether a CUDA device is usable (torch's NVML count: CUDA is not initialised)."""
    import torch

    return bool(torch.cuda.device_count() > 0)


def is_mps_available(min_version: str = "1.12") -> bool:
    """Whether Apple's MPS device is usable (``min_version``: accelerate's, torch has it)."""
    import torch

    return bool(torch.backends.mps.is_available())


def _usable(backend: Any, check_device: bool) -> bool:
    """A torch device module (``torch.xpu``, ``torch.npu``) that says it is available; with
    ``check_device`` its devices are counted too (a broken driver answers False)."""
    if backend is None:
        return False
    try:
        if check_device:
            backend.device_count()
        return bool(backend.is_available())
    except RuntimeError:
        return False


@functools.cache
def is_xpu_available(check_device: bool = False) -> bool:
    """Whether an Intel XPU is usable through torch's own ``torch.xpu``.

    ``check_device``: also count the devices (a broken driver answers False, not an error).
    """
    import torch

    return _usable(getattr(torch, "xpu", None), check_device)


@functools.cache
def is_npu_available(check_device: bool = False) -> bool:
    """Whether an Ascend NPU is usable: ``torch_npu`` installed and importable, a device seen.

    ``check_device``: also count the devices (no device answers False, not an error).
    """
    if not _installed("torch_npu", "torch-npu"):
        return False
    import torch

    try:
        importlib.import_module("torch_npu")  # registers torch.npu
    except Exception:  # a CPU-only image with torch_npu installed fails to import it
        return False
    return _usable(getattr(torch, "npu", None), check_device)
