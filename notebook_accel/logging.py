"""``accelerate.logging``'s names, for code ported with only its imports changed.

``from accelerate.logging import get_logger`` becomes
``from notebook_accel.logging import get_logger``; the logger lives on the training side
(``training/logs.py``) and is loaded on first use, so this module imports no torch. (The
package's own modules import the standard library's ``logging`` with absolute imports, never
this one.)
"""

from __future__ import annotations

from .paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
