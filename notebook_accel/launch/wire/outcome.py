"""What a rank's ending means in the notebook, the same for every backend.

The local engine (engine.py), TPU (xla/engine.py) and cluster backends (ray/backend.py) each collect
their ranks' outcomes their own way, then decide alike: a communication error is usually the
consequence of another rank's failure (``is_collateral``), so the root cause is the earliest
failure that is not one; it is raised in the notebook as the rank's own exception with the
rank's traceback (``rebuild``).
"""

from __future__ import annotations

import contextlib
import pickle

from ...errors import RemoteTraceback, WorkerError
from ...reporting.channel import Failure
from .payload import Payload, annotate_traceback

__all__ = ["is_collateral", "rebuild"]

_COLLATERAL_WORDS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo",
    "NCCL",
    "ProcessGroup",
)


def is_collateral(failure: Failure) -> bool:
    """A communication error, typically the consequence of another rank's failure."""
    if failure.type_name.rsplit(".", 1)[-1] in ("DistBackendError", "DistNetworkError"):
        return True
    return failure.type_name.endswith("RuntimeError") and any(
        word in failure.message for word in _COLLATERAL_WORDS
    )


def rebuild(rank: int, failure: Failure, world_size: int, payload: Payload) -> BaseException:
    """The worker's exception as its own type, with the worker's traceback as the cause.

    The traceback gets the cell-defined functions' files and source lines back (payload.py).
    """
    exc: BaseException | None = None
    if failure.exception is not None:
        try:
            loaded = pickle.loads(failure.exception)
            exc = loaded if isinstance(loaded, BaseException) else None
        except Exception:
            exc = None
    if exc is None:
        exc = WorkerError(
            f"rank {rank} raised {failure.type_name}: {failure.message}", rank, failure.type_name
        )
    with contextlib.suppress(AttributeError, TypeError):
        exc.rank = rank  # type: ignore[attr-defined]
    exc.add_note(
        f"[notebook_accel] raised on rank {rank} of {world_size}; the worker's "
        "traceback is shown above."
    )
    text = annotate_traceback(failure.traceback, payload.code_origins)
    exc.__cause__ = RemoteTraceback(f"Traceback from rank {rank}:\n{text}")
    exc.__suppress_context__ = True
    return exc
