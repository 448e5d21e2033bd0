"""``accelerate.utils.memory``'s names, for code ported with only its imports changed.

``from accelerate.utils.memory import clear_device_cache`` becomes
``from notebook_accel.utils.memory import clear_device_cache``; the functions live on the
training side (``training/memory.py``) and load on first use; the ``is_*_available`` probes
accelerate re-exports here resolve as in :mod:`notebook_accel.utils` (provided or refused).
"""

from __future__ import annotations

from notebook_accel.paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
