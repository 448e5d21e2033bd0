"""``accelerate.tracking``'s names, for code ported with only its imports changed.

``from accelerate.tracking import WandBTracker`` becomes
``from notebook_accel.tracking import WandBTracker``; the trackers live on the training side
(``training/trackers.py``) and load on first use, so this module imports no torch;
accelerate's re-exports of ``accelerate.utils`` names resolve as in
:mod:`notebook_accel.utils` (provided or refused).
"""

from __future__ import annotations

from .paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
