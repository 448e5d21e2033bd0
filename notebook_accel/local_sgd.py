"""``accelerate.local_sgd``'s name, for code ported with only its imports changed.

``from accelerate.local_sgd import LocalSGD`` becomes
``from notebook_accel.local_sgd import LocalSGD``; the class lives on the training side
(``training/local_sgd.py``) and is loaded on first use, so this module imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# kept as a tuple: a literal __all__ would name what only __getattr__ defines
_NAMES = ("LocalSGD",)
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name != "LocalSGD":
        raise AttributeError(f"module 'notebook_accel.local_sgd' has no attribute {name!r}")
    value = importlib.import_module("notebook_accel.training.local_sgd").LocalSGD
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
