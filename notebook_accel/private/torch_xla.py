"""torch_xla's private names: its process pool.

torch_xla's public ``xmp.spawn`` sets the topology up and cannot return each process's value;
its ``_internal.pjrt.run_multiprocess`` (what spawn calls) does both. It holds for torch_xla
2.1 to 2.8.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["run_multiprocess"]


def run_multiprocess(function: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """``function(*args)`` on every XLA device (a process per chip, a thread per device
    where a process holds several): each device's return value by ordinal.

    Relies on ``torch_xla._internal.pjrt.run_multiprocess``.
    """
    from torch_xla._internal import pjrt

    return dict(pjrt.run_multiprocess(function, *args))
