"""``accelerate.local_sgd``'s name, for code ported with only its imports changed.

``from accelerate.local_sgd import LocalSGD`` becomes
``from notebook_accel.local_sgd import LocalSGD``; the class lives on the training side
(``training/local_sgd.py``) and is loaded on first use, so this module imports no torch.
"""

from __future__ import annotations

from typing import Any

from .refusals import shim_attribute

# name -> module; __all__ is built from it (a literal __all__ would name what only
# __getattr__ defines)
_EXPORTS = {
    "LocalSGD": "notebook_accel.training.local_sgd",
    # accelerate's imports there, kept for code that takes them from this module
    "Accelerator": "notebook_accel.training.accelerator",
    "DistributedType": "notebook_accel.training.state",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return list(__all__)
