"""``accelerate.state``'s names, for code ported with only its imports changed.

``from accelerate.state import AcceleratorState`` becomes
``from notebook_accel.state import AcceleratorState``; ``accelerate.state.is_initialized()``
becomes ``notebook_accel.state.is_initialized()``. The classes live on the training side
(``training/accelerator_state.py``, ``processes.py``) and load on first use, so
this module imports no torch; accelerate's re-exports of ``accelerate.utils`` names resolve as
in :mod:`notebook_accel.utils` (provided or refused).
"""

from __future__ import annotations

from .paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
