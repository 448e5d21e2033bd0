"""``accelerate.logging``'s names, for code ported with only its imports changed.

``from accelerate.logging import get_logger`` becomes
``from notebook_accel.logging import get_logger``; the logger lives on the training side
(``training/logs.py``) and is loaded on first use, so this module imports no torch. (The
package's own modules import the standard library's ``logging`` with absolute imports, never
this one.)
"""

from __future__ import annotations

import importlib
from typing import Any

# the names, kept as a tuple: a literal __all__ would name what only __getattr__ defines
_NAMES = ("MultiProcessAdapter", "get_logger")
__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'notebook_accel.logging' has no attribute {name!r}")
    value = getattr(importlib.import_module("notebook_accel.training.logs"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
