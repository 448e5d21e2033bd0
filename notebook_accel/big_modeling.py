"""``accelerate.big_modeling``'s names: big models built empty, loaded in pieces, dispatched.

``from accelerate import init_empty_weights, load_checkpoint_and_dispatch`` becomes
``from notebook_accel.big_modeling import ...``; the code lives in ``big_model/`` and loads
on first use (no torch at import).

Example:
    >>> from notebook_accel.big_modeling import init_empty_weights  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from notebook_accel.refusals import REFUSED, UTILS, shim_attribute

_PART = "notebook_accel.big_model"

# accelerate's re-exports of accelerate.utils names: as notebook_accel.utils resolves them
_FROM_UTILS = (
    "OffloadedWeightsLoader check_cuda_p2p_ib_support is_bnb_available is_mlu_available "
    "is_musa_available is_neuron_available is_npu_available is_sdaa_available "
    "is_xpu_available parse_flag_from_env recursive_getattr"
).split()
# name -> defining module
_EXPORTS = {
    "init_empty_weights": f"{_PART}.empty",
    "init_on_device": f"{_PART}.empty",
    "dispatch_model": f"{_PART}.dispatch",
    "cpu_offload": f"{_PART}.dispatch",
    "cpu_offload_with_hook": f"{_PART}.dispatch",
    "disk_offload": f"{_PART}.dispatch",
    "load_checkpoint_and_dispatch": f"{_PART}.loading",
    "infer_auto_device_map": f"{_PART}.device_map",
    "get_balanced_memory": f"{_PART}.memory",
    "load_checkpoint_in_model": f"{_PART}.loading",
    "find_tied_parameters": f"{_PART}.tensors",
    "retie_parameters": f"{_PART}.tensors",
    "offload_state_dict": f"{_PART}.offload",
    "extract_submodules_state_dict": f"{_PART}.dispatch",
    "check_device_map": f"{_PART}.dispatch",
    "add_hook_to_module": f"{_PART}.hooks",
    "AlignDevicesHook": f"{_PART}.hooks",
    "CpuOffload": f"{_PART}.hooks",
    "UserCpuOffloadHook": f"{_PART}.hooks",
    **dict.fromkeys(_FROM_UTILS, UTILS),
}

__all__ = sorted(_EXPORTS)  # and REFUSED[__name__]'s placeholders, in dir()


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted({*__all__, *REFUSED[__name__]})
