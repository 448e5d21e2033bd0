"""``accelerate.utils``'s names, for code ported with only its imports changed.

``from accelerate.utils import set_seed, InitProcessGroupKwargs`` becomes
``from notebook_accel.utils import set_seed, InitProcessGroupKwargs``: every public name of
:mod:`notebook_accel` is also reachable here, with the names accelerate keeps in
``accelerate.utils`` only (loaded on first use, like the package's own). The names accelerate
has here that notebook_accel does not provide import as placeholders that say why and what to
use instead (``refusals.py``). ``notebook_accel.utils.memory`` and
``notebook_accel.utils.dataclasses`` are accelerate's submodules of the same names.

Example:
    >>> from notebook_accel.utils import find_executable_batch_size  # doctest: +SKIP
"""

from __future__ import annotations

from notebook_accel.paths import shim

__all__, __getattr__, __dir__ = shim(__name__)
