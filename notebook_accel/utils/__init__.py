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

# Names accelerate keeps in accelerate.utils only (not at its top level) -> defining module.
_UTILS_ONLY = {
    "DummyOptim": _DUMMIES,
    "DummyScheduler": _DUMMIES,
    "is_cuda_available": _PROBES,
    "is_datasets_available": _PROBES,
    "is_deepspeed_available": _PROBES,
    "is_mlflow_available": _PROBES,
    "is_mps_available": _PROBES,
    "is_npu_available": _PROBES,
    "is_schedulefree_available": _PROBES,
    "is_tensorboard_available": _PROBES,
    "is_torchao_available": _PROBES,
    "is_transformers_available": _PROBES,
    "is_wandb_available": _PROBES,
    "is_xpu_available": _PROBES,
}
# ... and more of them, module -> names (issue 30: the names a census of scripts uses)
_MORE = {
    _PROBES: "is_aim_available is_bf16_available is_boto3_available is_clearml_available "
    "is_comet_ml_available is_dvclive_available is_fp16_available is_fp8_available "
    "is_lomo_available is_matplotlib_available "
    "is_pandas_available is_peft_available is_pynvml_available is_pytest_available "
    "is_swanlab_available is_timm_available is_torch_xla_available is_torchdata_available "
    "is_torchvision_available is_trackio_available is_triton_available",
    "notebook_accel.training.operations": "broadcast broadcast_object_list gather "
    "gather_object reduce "
    "pad_across_processes send_to_device wait_for_everyone extract_model_from_parallel",
    "notebook_accel.training.memory": "clear_device_cache should_reduce_batch_size",
    "notebook_accel.training.handlers": "GradientAccumulationPlugin",
    "notebook_accel.training.data.rng": "RNGType synchronize_rng_state",
    "notebook_accel.training.tracking": "LoggerType",
    "notebook_accel.training.profiling": "PROFILE_PATTERN_NAME",
    "notebook_accel.training.checkpoint.sharded": "merge_fsdp_weights",
    "notebook_accel.training.checkpoint.files": "MODEL_NAME OPTIMIZER_NAME RNG_STATE_NAME "
    "SAFE_MODEL_NAME SAFE_WEIGHTS_INDEX_NAME SAFE_WEIGHTS_NAME SAFE_WEIGHTS_PATTERN_NAME "
    "SAMPLER_NAME SCALER_NAME SCHEDULER_NAME WEIGHTS_INDEX_NAME WEIGHTS_NAME "
    "WEIGHTS_PATTERN_NAME",
    "notebook_accel.config": "PrecisionType write_basic_config",
    "notebook_accel.env": "patch_environment str_to_bool parse_flag_from_env "
    "parse_choice_from_env get_int_from_env",
    "notebook_accel.big_model.tensors": "compute_module_sizes convert_file_size_to_int "
    "dtype_byte_size find_tied_parameters named_module_tensors retie_parameters "
    "set_module_tensor_to_device",
    "notebook_accel.big_model.memory": "get_max_memory get_balanced_memory",
    "notebook_accel.big_model.device_map": "infer_auto_device_map get_max_layer_size",
    "notebook_accel.big_model.loading": "load_checkpoint_in_model",
    "notebook_accel.big_model.dispatch": "check_device_map extract_submodules_state_dict",
    "notebook_accel.big_model.offload": "offload_state_dict",
}
_UTILS_ONLY.update({name: module for module, names in _MORE.items() for name in names.split()})

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
