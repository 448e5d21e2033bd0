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
from collections.abc import Callable
from typing import Any

from .. import env

__all__ = [
    "is_aim_available",
    "is_bf16_available",
    "is_boto3_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_dvclive_available",
    "is_fp16_available",
    "is_fp8_available",
    "is_lomo_available",
    "is_matplotlib_available",
    "is_pandas_available",
    "is_peft_available",
    "is_pynvml_available",
    "is_pytest_available",
    "is_rich_available",
    "is_swanlab_available",
    "is_timm_available",
    "is_torch_xla_available",
    "is_torchdata_available",
    "is_torchvision_available",
    "is_trackio_available",
    "is_triton_available",
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


def _package_probe(module: str, distribution: str | None = None) -> Callable[[], bool]:
    """An ``is_<name>_available`` probe: whether ``module``'s distribution is installed."""

    def probe() -> bool:
        return _installed(module, distribution)

    probe.__name__ = probe.__qualname__ = f"is_{module}_available"
    probe.__doc__ = f"Whether {distribution or module} is installed (accelerate's probe)."
    return probe


is_boto3_available = _package_probe("boto3")
is_clearml_available = _package_probe("clearml")
is_comet_ml_available = _package_probe("comet_ml")
is_dvclive_available = _package_probe("dvclive")
is_matplotlib_available = _package_probe("matplotlib")
is_pandas_available = _package_probe("pandas")
is_peft_available = _package_probe("peft")
is_pytest_available = _package_probe("pytest")
is_swanlab_available = _package_probe("swanlab")
is_timm_available = _package_probe("timm")
is_torchdata_available = _package_probe("torchdata")
is_torchvision_available = _package_probe("torchvision")
is_trackio_available = _package_probe("trackio")


def is_lomo_available() -> bool:
    """Whether the LOMO optimizers (``lomo_optim``) are installed."""
    return _installed("lomo_optim", "lomo-optim")


def is_pynvml_available() -> bool:
    """Whether NVML's Python bindings are installed (pynvml, or nvidia-ml-py)."""
    return _installed("pynvml") or _installed("pynvml", "nvidia-ml-py")


def is_triton_available() -> bool:
    """Whether Triton is installed (triton-xpu on an Intel XPU)."""
    return _installed("triton", "triton-xpu" if is_xpu_available() else None)


def is_aim_available() -> bool:
    """Whether Aim (before 4.0, as accelerate's tracker needs) is installed."""
    if not _installed("aim"):
        return False
    major = importlib.metadata.version("aim").split(".")[0]
    return major.isdigit() and int(major) < 4


def is_rich_available() -> bool:
    """Whether rich is installed and ``ACCELERATE_ENABLE_RICH`` turns it on (accelerate's)."""
    return _installed("rich") and env.enable_rich()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla is installed (``USE_TORCH_XLA=0`` turns it off, as accelerate's);
    with ``check_is_tpu`` / ``check_is_gpu``, whether its runtime drives that device.
    """
    if check_is_tpu and check_is_gpu:
        raise ValueError("check_is_tpu and check_is_gpu cannot both be true")
    if not env.use_torch_xla():
        return False
    if not _installed("torch_xla", "torch-xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    import torch_xla.runtime as xr

    kind = xr.device_type()
    return kind == "TPU" if check_is_tpu else kind in ("GPU", "CUDA")


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bf16 runs here: a TPU (unless ``ignore_tpu``), a CUDA device that supports it,
    an XPU that does, MPS on macOS 14 or later, else the CPU (which always does)."""
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    import torch

    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_xpu_available():
        return bool(torch.xpu.is_bf16_supported())
    if is_mps_available():
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return True


def is_fp16_available() -> bool:
    """Whether fp16 runs here: True (accelerate's answer off Gaudi 1, which this package does
    not run on)."""
    return True


def is_fp8_available() -> bool:
    """Whether fp8 training runs here: torchao installed (``mixed_precision="fp8"``'s route;
    accelerate also counts MS-AMP and Transformer Engine, which this package does not use)."""
    return is_torchao_available()
