"""``accelerate.big_modeling``'s names: big models built empty, loaded in pieces, dispatched.

``from accelerate import init_empty_weights, load_checkpoint_and_dispatch`` becomes
``from notebook_accel.big_modeling import ...``; the code lives in ``big_model/`` and loads
on first use (no torch at import).

Example:
    >>> from notebook_accel.big_modeling import init_empty_weights  # doctest: +SKIP
"""

from __future__ import annotations

from .paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
