"""``accelerate.state``'s names, for code ported with only its imports changed.

``from accelerate.state import AcceleratorState`` becomes
``from notebook_accel.state import AcceleratorState``; ``accelerate.state.is_initialized()``
becomes ``notebook_accel.state.is_initialized()``. The classes live on the training side
(``training/accelerator_state.py``, ``processes.py``) and load on first use, so
this module imports no torch; accelerate's re-exports of ``accelerate.utils`` names resolve as
in :mod:`notebook_accel.utils` (provided or refused).
"""

from __future__ import annotations

from typing import Any

from .refusals import REFUSED, UTILS, shim_attribute

_ACCELERATOR_STATE = "notebook_accel.training.accelerator_state"
_FROM_UTILS = (
    "DistributedType DynamoBackend GradientAccumulationPlugin SageMakerDistributedType "
    "check_cuda_fp8_capability check_cuda_p2p_ib_support deepspeed_required "
    "get_cpu_distributed_information get_int_from_env is_datasets_available "
    "is_deepspeed_available is_fp8_available is_habana_gaudi1 is_hpu_available "
    "is_mlu_available is_mps_available is_musa_available is_neuron_available is_npu_available "
    "is_sdaa_available is_torch_xla_available is_xccl_available is_xpu_available "
    "parse_choice_from_env parse_flag_from_env set_numa_affinity"
).split()
# name -> module; __all__ is built from it
_EXPORTS = {
    "AcceleratorState": _ACCELERATOR_STATE,
    "is_initialized": _ACCELERATOR_STATE,
    "PartialState": "notebook_accel.training.processes",
    "GradientState": _ACCELERATOR_STATE,
    **dict.fromkeys(_FROM_UTILS, UTILS),
}
__all__ = sorted(_EXPORTS)  # and REFUSED[__name__]'s placeholders, in dir()


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted({*__all__, *REFUSED[__name__]})
