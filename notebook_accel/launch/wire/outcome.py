"""What a rank's ending means in the notebook, decided once for every backend.

    each backend collects, per rank, an Outcome:
      Result   the function returned (reporting/channel.py)
      Failure  it raised (type, message, traceback, the pickled exception)
      Died     it ended without a Python exception (a signal, os._exit, a lost Ray worker)
    root_cause(outcomes) -> the exception the notebook raises, or None when none failed:
      a communication error is usually the consequence of another rank's failure
      (is_collateral), so the root cause is the earliest ending that is not one (ties: the
      earliest); a Failure is raised as the rank's own exception with its traceback
      (rebuild), a death as the error the backend named for it

The local engine (local/engine.py), TPU (local/xla/engine.py) and the Ray backend
(cluster/ray/driver.py) each gather their ranks' outcomes their own way and ask this module.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...errors import RemoteTraceback, WorkerError
from ...reporting.channel import Failure, Result
from .payload import Payload, annotate_traceback

__all__ = ["Died", "Outcome", "is_collateral", "only_collateral", "rebuild", "root_cause"]

_COLLATERAL_WORDS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo",
    "NCCL",
    "ProcessGroup",
)


@dataclass(frozen=True)
class Died:
    """A rank that ended without a Python exception: when the launcher saw it, and the error
    that says so (a WorkerDiedError naming the rank and its signal, or Ray's words)."""

    time: float
    error: BaseException


Outcome = Result | Failure | Died


def is_collateral(failure: Failure) -> bool:
    """A communication error, typically the consequence of another rank's failure."""
    if failure.type_name.rsplit(".", 1)[-1] in ("DistBackendError", "DistNetworkError"):
        return True
    return failure.type_name.endswith("RuntimeError") and any(
        word in failure.message for word in _COLLATERAL_WORDS
    )


def only_collateral(outcomes: Iterable[Outcome]) -> bool:
    """Some rank failed, and every failure so far is a communication error (no death): its
    cause (a peer's death or failure) may still show, so a backend waits a moment for it."""
    problems = [o for o in outcomes if not isinstance(o, Result)]
    return bool(problems) and all(isinstance(o, Failure) and is_collateral(o) for o in problems)


def root_cause(
    outcomes: Mapping[int, Outcome], world_size: int, payload: Payload
) -> BaseException | None:
    """The exception a launch raises for these outcomes (rank -> outcome), or None when no
    rank failed or died: the earliest ending that is not collateral, else the earliest."""
    endings = [
        (isinstance(outcome, Failure) and is_collateral(outcome), outcome.time, rank)
        for rank, outcome in outcomes.items()
        if isinstance(outcome, Failure | Died)
    ]
    if not endings:
        return None
    *_, rank = min(endings)
    first = outcomes[rank]
    if isinstance(first, Died):
        return first.error
    assert isinstance(first, Failure)
    return rebuild(rank, first, world_size, payload)


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
