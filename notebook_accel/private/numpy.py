"""numpy's private names: what numpy's pickles name.

numpy 2 moved ``numpy.core`` to ``numpy._core`` (a pickle made by numpy 1 names the old path,
which numpy 2 still maps). Nothing here names either path: the reconstructor is taken from
an array's own ``__reduce__`` (the pickle protocol, public), so it is whatever this numpy's
pickles name, in numpy 1.x, 2.0-2.5 and a numpy that renames ``_core`` again.
"""

from __future__ import annotations

from typing import Any

__all__ = ["array_reconstructor"]


def array_reconstructor() -> Any:
    """The function a pickled ndarray is rebuilt with (allowed when loading numpy states
    with ``weights_only``): today ``numpy._core.multiarray._reconstruct``.

    Relies on nothing private: ``ndarray.__reduce__()`` names it.
    """
    import numpy as np

    return np.zeros(0).__reduce__()[0]
