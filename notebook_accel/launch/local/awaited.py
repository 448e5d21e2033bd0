"""What a background job's handle shares, wherever the job runs (a session's Job, a durable
session's RemoteJob): its ending awaited, its outcome, the line that says how it ended."""

from __future__ import annotations

import threading
import time
from typing import Any

from ...errors import UserFrames

__all__ = ["Awaited"]


class Awaited:
    """A job's outcome, set once by the thread that follows the job (``_settle``)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: list[Any] | None = None
        self._error: BaseException | None = None
        self._started = time.monotonic()

    def done(self) -> bool:
        """Whether the job has ended (finished, failed or stopped)."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list[Any]:
        """Wait for the job (up to ``timeout`` s): every rank's value, or its exception.

        Raises:
            TimeoutError: still running after ``timeout`` (the job goes on).
            Exception: what the run raised (a rank's own exception, KeyboardInterrupt if it
                was stopped, ...), with the session's state in a note.
        """
        with UserFrames(TimeoutError):
            if not self._done.wait(timeout):
                raise TimeoutError(
                    f"the job is still running after {timeout:g} s; it goes on (job.stop() ends it)"
                )
            if self._error is not None:
                raise self._error
            assert self._value is not None
            return self._value

    def ending(self) -> str:
        """How the job ended, in a line: its display's last."""
        seconds = time.monotonic() - self._started
        error = self._error
        if error is None:
            return f"finished in {seconds:.1f} s (job.result() has every rank's value)"
        if isinstance(error, KeyboardInterrupt):
            return f"stopped after {seconds:.1f} s"
        text = str(error).strip().splitlines()
        return (
            f"failed after {seconds:.1f} s: {type(error).__name__}: {text[0] if text else ''}"
            " (job.result() raises it)"
        )
