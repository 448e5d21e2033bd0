"""Ways of spreading a model over the job's processes, behind one interface.

    base.py   Strategy: prepare model/optimizer, backward, no_sync, clipping, state dict,
              checkpoint parts, the data-parallel rank and size
    ddp.py    DdpStrategy: DistributedDataParallel (a single process: no wrapper)
    fsdp.py   FsdpStrategy: FSDP2 over ``fsdp.Sharder``, DCP checkpoints

The Accelerator builds one with :func:`select` and delegates to it.
"""

from __future__ import annotations

from typing import Any

from ..fsdp_config import FsdpConfig
from ..handlers import DistributedDataParallelKwargs
from ..state import ProcessState
from .base import CheckpointPart, Strategy

__all__ = ["CheckpointPart", "Strategy", "select"]


def select(
    state: ProcessState,
    *,
    fsdp: FsdpConfig | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
    ddp_handler: DistributedDataParallelKwargs | None = None,
) -> Strategy:
    """The strategy for an Accelerator's options (validated already): FSDP when ``fsdp`` is
    set, else DDP (which leaves a single process's models unwrapped).

    Raises:
        ConfigError: the strategy refuses this job (e.g. FSDP on one process).
    """
    if fsdp:
        from .fsdp import FsdpStrategy

        return FsdpStrategy(state, fsdp)
    from .ddp import DdpStrategy

    return DdpStrategy(state, dict(ddp_kwargs or {}), ddp_handler)
