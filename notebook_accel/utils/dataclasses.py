"""``accelerate.utils.dataclasses``'s names, for code ported with only its imports changed.

``from accelerate.utils.dataclasses import GradientAccumulationPlugin`` becomes
``from notebook_accel.utils.dataclasses import GradientAccumulationPlugin``. Every name
accelerate also has in ``accelerate.utils`` resolves as in :mod:`notebook_accel.utils`
(provided, or a placeholder that says why not); this module's own refusals are in
``refusals.py``. (The package imports the standard library's ``dataclasses`` with absolute
imports, never this module.)
"""

from __future__ import annotations

from notebook_accel.paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
