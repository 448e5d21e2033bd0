"""``accelerate.local_sgd``'s name, for code ported with only its imports changed.

``from accelerate.local_sgd import LocalSGD`` becomes
``from notebook_accel.local_sgd import LocalSGD``; the class lives on the training side
(``training/averaging.py``) and is loaded on first use, so this module imports no torch.
"""

from __future__ import annotations

from .paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
