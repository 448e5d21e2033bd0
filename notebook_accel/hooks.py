"""``accelerate.hooks``'s names: hooks that move inputs and weights around a forward pass.

``from accelerate.hooks import remove_hook_from_module, AlignDevicesHook`` becomes
``from notebook_accel.hooks import ...``; the code lives in ``big_model/hooks.py`` and loads
on first use (no torch at import).

Example:
    >>> from notebook_accel.hooks import remove_hook_from_module  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from notebook_accel.refusals import REFUSED, UTILS, shim_attribute

_HOOKS = "notebook_accel.big_model.hooks"

# accelerate's re-exports of accelerate.utils names: as notebook_accel.utils resolves them
_FROM_UTILS = (
    "PrefixedDataset clear_device_cache is_mlu_available is_musa_available "
    "is_npu_available recursive_getattr"
).split()
# name -> defining module
_EXPORTS = {
    "ModelHook": _HOOKS,
    "SequentialHook": _HOOKS,
    "AlignDevicesHook": _HOOKS,
    "CpuOffload": _HOOKS,
    "UserCpuOffloadHook": _HOOKS,
    "add_hook_to_module": _HOOKS,
    "remove_hook_from_module": _HOOKS,
    "remove_hook_from_submodules": _HOOKS,
    "send_to_device": "notebook_accel.big_model.moves",
    "find_device": "notebook_accel.big_model.moves",
    "named_module_tensors": "notebook_accel.big_model.tensors",
    "set_module_tensor_to_device": "notebook_accel.big_model.tensors",
    "PartialState": "notebook_accel.training.processes",
    **dict.fromkeys(_FROM_UTILS, UTILS),
}

__all__ = sorted(_EXPORTS)  # and REFUSED[__name__]'s placeholders, in dir()


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted({*__all__, *REFUSED[__name__]})
