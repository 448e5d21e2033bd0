"""``accelerate.utils.memory``'s names, for code ported with only its imports changed.

``from accelerate.utils.memory import clear_device_cache`` becomes
``from notebook_accel.utils.memory import clear_device_cache``; the functions live on the
training side (``training/memory.py``) and load on first use; the ``is_*_available`` probes
accelerate re-exports here resolve as in :mod:`notebook_accel.utils` (provided or refused).
"""

from __future__ import annotations

from typing import Any

from notebook_accel.refusals import UTILS, shim_attribute

_MEMORY = "notebook_accel.training.memory"
_PROBES = "is_cuda is_hpu is_mlu is_mps is_musa is_neuron is_npu is_sdaa is_xpu".split()
# name -> module; __all__ is built from it
_EXPORTS = {
    **dict.fromkeys(
        ["clear_device_cache", "find_executable_batch_size", "release_memory"], _MEMORY
    ),
    "should_reduce_batch_size": _MEMORY,
    **{f"{probe}_available": UTILS for probe in _PROBES},
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return list(__all__)
