"""``accelerate.big_modeling``'s names: big models built empty, loaded in pieces, dispatched.

``from accelerate import init_empty_weights, load_checkpoint_and_dispatch`` becomes
``from notebook_accel.big_modeling import ...``; the code lives in ``big_model/`` and loads
on first use (no torch at import).

Example:
    >>> from notebook_accel.big_modeling import init_empty_weights  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from notebook_accel import _lazy_attribute

_PART = "notebook_accel.big_model"

# name -> defining module
_EXPORTS = {
    "init_empty_weights": f"{_PART}.empty",
    "init_on_device": f"{_PART}.empty",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return _lazy_attribute(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return __all__
