"""``accelerate.utils``'s names, for code ported with only its imports changed.

``from accelerate.utils import set_seed, InitProcessGroupKwargs`` becomes
``from notebook_accel.utils import set_seed, InitProcessGroupKwargs``: every public name of
:mod:`notebook_accel` is also reachable here (loaded on first use, like the package's own).

Example:
    >>> from notebook_accel.utils import find_executable_batch_size  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import notebook_accel


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(notebook_accel, name)
    except AttributeError:
        raise AttributeError(f"module 'notebook_accel.utils' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return list(notebook_accel.__all__)
