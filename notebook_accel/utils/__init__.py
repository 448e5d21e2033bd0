"""``accelerate.utils``'s names, for code ported with only its imports changed.

``from accelerate.utils import set_seed, InitProcessGroupKwargs`` becomes
``from notebook_accel.utils import set_seed, InitProcessGroupKwargs``: every public name of
:mod:`notebook_accel` is also reachable here, with the names accelerate keeps in
``accelerate.utils`` only (loaded on first use, like the package's own). The names accelerate
has here that notebook_accel does not provide import as placeholders that say why and what to
use instead (``refusals.py``). ``notebook_accel.utils.memory`` and
``notebook_accel.utils.dataclasses`` are accelerate's submodules of the same names.

Example:
    >>> from notebook_accel.utils import find_executable_batch_size  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

import notebook_accel
from notebook_accel import _lazy_attribute
from notebook_accel.refusals import REFUSED, refused

_PROBES = "notebook_accel.hardware.available"
_DUMMIES = "notebook_accel.training.strategies.dummies"
_OPERATIONS = "notebook_accel.training.operations"
_MEMORY = "notebook_accel.training.memory"
_HANDLERS = "notebook_accel.training.handlers"

# Names accelerate keeps in accelerate.utils only (not at its top level) -> defining module.
_UTILS_ONLY = {
    "DummyOptim": _DUMMIES,
    "DummyScheduler": _DUMMIES,
    "broadcast": _OPERATIONS,
    "broadcast_object_list": _OPERATIONS,
    "extract_model_from_parallel": _OPERATIONS,
    "gather": _OPERATIONS,
    "pad_across_processes": _OPERATIONS,
    "reduce": _OPERATIONS,
    "send_to_device": _OPERATIONS,
    "wait_for_everyone": _OPERATIONS,
    "clear_device_cache": _MEMORY,
    "should_reduce_batch_size": _MEMORY,
    "GradientAccumulationPlugin": _HANDLERS,
    "RNGType": "notebook_accel.training.data.rng",
    "LoggerType": "notebook_accel.training.tracking",
    "PrecisionType": "notebook_accel.config",
    "write_basic_config": "notebook_accel.config",
    "patch_environment": "notebook_accel.env",
    "merge_fsdp_weights": "notebook_accel.training.checkpoint.sharded",
    **dict.fromkeys(
        [
            "MODEL_NAME",
            "OPTIMIZER_NAME",
            "RNG_STATE_NAME",
            "SAFE_MODEL_NAME",
            "SAFE_WEIGHTS_INDEX_NAME",
            "SAFE_WEIGHTS_NAME",
            "SAFE_WEIGHTS_PATTERN_NAME",
            "SAMPLER_NAME",
            "SCALER_NAME",
            "SCHEDULER_NAME",
            "WEIGHTS_INDEX_NAME",
            "WEIGHTS_NAME",
            "WEIGHTS_PATTERN_NAME",
        ],
        "notebook_accel.training.checkpoint.files",
    ),
    "PROFILE_PATTERN_NAME": "notebook_accel.training.profiling",
    **dict.fromkeys(
        [
            "is_aim_available",
            "is_bf16_available",
            "is_boto3_available",
            "is_clearml_available",
            "is_comet_ml_available",
            "is_cuda_available",
            "is_datasets_available",
            "is_deepspeed_available",
            "is_dvclive_available",
            "is_lomo_available",
            "is_matplotlib_available",
            "is_mlflow_available",
            "is_mps_available",
            "is_npu_available",
            "is_pandas_available",
            "is_peft_available",
            "is_pynvml_available",
            "is_pytest_available",
            "is_schedulefree_available",
            "is_swanlab_available",
            "is_tensorboard_available",
            "is_timm_available",
            "is_torch_xla_available",
            "is_torchao_available",
            "is_torchdata_available",
            "is_torchvision_available",
            "is_trackio_available",
            "is_transformers_available",
            "is_triton_available",
            "is_wandb_available",
            "is_xpu_available",
        ],
        _PROBES,
    ),
}

# accelerate's submodules that scripts import from (``from accelerate.utils.memory import``)
_SUBMODULES = ("memory", "dataclasses")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name in _UTILS_ONLY:
        return _lazy_attribute(globals(), _UTILS_ONLY, name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    try:
        return getattr(notebook_accel, name)
    except AttributeError:
        return refused(globals(), name)


def __dir__() -> list[str]:
    return sorted({*notebook_accel.__all__, *_UTILS_ONLY, *REFUSED[__name__]})
