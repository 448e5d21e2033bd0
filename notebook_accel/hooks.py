"""``accelerate.hooks``'s names: hooks that move inputs and weights around a forward pass.

``from accelerate.hooks import remove_hook_from_module, AlignDevicesHook`` becomes
``from notebook_accel.hooks import ...``; the code lives in ``big_model/forward_hooks.py`` and loads
on first use (no torch at import).

Example:
    >>> from notebook_accel.hooks import remove_hook_from_module  # doctest: +SKIP
"""

from __future__ import annotations

from .paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
