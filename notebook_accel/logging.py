"""``accelerate.logging``'s names, for code ported with only its imports changed.

``from accelerate.logging import get_logger`` becomes
``from notebook_accel.logging import get_logger``; the logger lives on the training side
(``training/logs.py``) and is loaded on first use, so this module imports no torch. (The
package's own modules import the standard library's ``logging`` with absolute imports, never
this one.)
"""

from __future__ import annotations

from typing import Any

from .refusals import shim_attribute

_LOGS = "notebook_accel.training.logs"
# name -> module; __all__ is built from it (a literal __all__ would name what only
# __getattr__ defines)
_EXPORTS = {
    "MultiProcessAdapter": _LOGS,
    "get_logger": _LOGS,
    "PartialState": "notebook_accel.training.processes",  # accelerate's import, kept there
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    return shim_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return list(__all__)
