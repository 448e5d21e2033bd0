"""numpy's private names: what numpy's pickles name.

numpy 2 moved ``numpy.core`` to ``numpy._core`` (a pickle made by numpy 1 names the old path,
which numpy 2 still maps).
"""

from __future__ import annotations

from typing import Any

__all__ = ["array_reconstructor"]


def array_reconstructor() -> Any:
    """The function a pickled ndarray is rebuilt with (allowed when loading numpy states
    with ``weights_only``).

    Relies on ``numpy._core.multiarray._reconstruct`` (numpy >= 2).
    """
    import numpy as np

    return np._core.multiarray._reconstruct  # type: ignore[attr-defined]
