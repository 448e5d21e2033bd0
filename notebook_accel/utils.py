"""``accelerate.utils``'s names, for code ported with only its imports changed.

``from accelerate.utils import set_seed, InitProcessGroupKwargs`` becomes
``from notebook_accel.utils import set_seed, InitProcessGroupKwargs``: every public name of
:mod:`notebook_accel` is also reachable here (loaded on first use, like the package's own).

Example:
    >>> from notebook_accel.utils import find_executable_batch_size  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import notebook_accel
from notebook_accel import _lazy_attribute

_PROBES = "notebook_accel.hardware.available"
_DUMMIES = "notebook_accel.training.strategies.dummies"
_BIG = "notebook_accel.big_model"

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
    "compute_module_sizes": f"{_BIG}.tensors",
    "convert_file_size_to_int": f"{_BIG}.tensors",
    "dtype_byte_size": f"{_BIG}.tensors",
    "find_tied_parameters": f"{_BIG}.tensors",
    "named_module_tensors": f"{_BIG}.tensors",
    "retie_parameters": f"{_BIG}.tensors",
    "set_module_tensor_to_device": f"{_BIG}.tensors",
    "get_max_memory": f"{_BIG}.memory",
    "get_balanced_memory": f"{_BIG}.memory",
    "infer_auto_device_map": f"{_BIG}.device_map",
    "get_max_layer_size": f"{_BIG}.device_map",
    "load_checkpoint_in_model": f"{_BIG}.loading",
    "check_device_map": f"{_BIG}.dispatch",
    "offload_state_dict": f"{_BIG}.offload",
    "extract_submodules_state_dict": f"{_BIG}.dispatch",
}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name in _UTILS_ONLY:
        return _lazy_attribute(globals(), _UTILS_ONLY, name)
    try:
        return getattr(notebook_accel, name)
    except AttributeError:
        raise AttributeError(f"module 'notebook_accel.utils' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted([*notebook_accel.__all__, *_UTILS_ONLY])
