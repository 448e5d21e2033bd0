"""Third-party lines that no user can act on, kept out of the cell.

Each is dropped by a narrow logging filter (the exact message), never by raising a level, so
the same library's other warnings are shown as usual. Installed by every worker at start
(the user's function may import the library itself) and by notebook_accel before it imports
the library in the notebook.
"""

from __future__ import annotations

import logging

from .private.torch import PYTREE_LOGGER

__all__ = ["quiet_torchao"]


def _cuda_libraries(record: logging.LogRecord) -> bool:
    """False for torchao's lines about CUDA libraries a CPU build of torch cannot load.

    Two lines per process on import; float8 training uses torch's own _scaled_mm (or its
    emulation), not those libraries.
    """
    message = record.getMessage()
    return not (message.startswith("Failed to load") and ".so" in message)


def _enum_deprecation(record: logging.LogRecord) -> bool:
    """False for torch's deprecation notice about an enum torchao registers (torchao's to fix)."""
    return "is an Enum subclass and is now natively supported" not in record.getMessage()


_quieted = False


def quiet_torchao() -> None:
    """Keep torchao's import-time noise out of the cell (idempotent, cheap).

    Called before notebook_accel imports torchao and at every worker's start (the user's
    function may import torchao itself). Only those lines are dropped; torchao's other
    warnings, and its CUDA library failures on a CUDA build of torch, are shown as usual.
    """
    global _quieted
    if _quieted:
        return
    _quieted = True
    logging.getLogger(PYTREE_LOGGER).addFilter(_enum_deprecation)
    if not _cuda_build():
        logging.getLogger("torchao").addFilter(_cuda_libraries)


def _cuda_build() -> bool:
    import torch  # imported already wherever torchao can be

    return torch.version.cuda is not None
