"""What a durable session's task shows, as events: recorded in the supervisor, drawn in a kernel.

    supervisor: the engine relays into a Recorder      kernel: replay(display, event)
    -------------------------------------------       ------------------------------
    a rank's whole line   -> ("line", rank, stream, bytes)  -> display.feed (prefix, filter)
    Progress, Displayed,  -> ("report", rank, message)      -> display.report (bars, rank
      Metrics                                                  displays, the live chart)
    a stall report        -> ("stall", text)                -> display.stall_report
                             Dropped (journal.py)           -> a line saying so

The Recorder is a Display whose drawing is replaced by the sink (a job's journal and its
watchers, or a run's connection); the kernel's own Display draws, as for a plain session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ....reporting.channel import Displayed, Metrics, Progress
from ...show.display import Display
from ...show.stall import Ranks, StallWatch
from .journal import Dropped

__all__ = ["Recorder", "replay", "text_of"]


class Recorder(Display):
    """A task's display in the supervisor: every event goes to ``sink`` (nothing is drawn)."""

    def __init__(self, sink: Callable[[tuple[Any, ...]], None]) -> None:
        super().__init__(output="all", bars="all")
        self._sink = sink
        self.last_line = ""
        self.begun = threading.Event()  # the task was sent to its ranks

    def watch_stalls(self, stall_time: float | None, ranks: Ranks | None) -> StallWatch | None:
        """A task's ranks are watched once it is sent to them: it has begun."""
        watch = super().watch_stalls(stall_time, ranks)
        if ranks is not None:
            self.begun.set()
        return watch

    def banner(self, text: str) -> None:
        """The kernel prints its own banner."""

    def _write(self, rank: int, stream: str, raw: bytes) -> None:
        self.last_line = f"[rank {rank}] " + raw.decode("utf-8", errors="replace")[-200:]
        self._sink(("line", rank, stream, raw))

    def progress(self, rank: int, message: Progress) -> None:
        self._sink(("report", rank, message))

    def displayed(self, rank: int, message: Displayed) -> None:
        self._sink(("report", rank, message))

    def metrics(self, rank: int, message: Metrics) -> None:
        self._sink(("report", rank, message))

    def stall_report(self, text: str) -> None:
        self._sink(("stall", text))


def replay(display: Display, event: Any) -> None:
    """Draw one recorded ``event`` in a kernel's ``display``."""
    if isinstance(event, Dropped):
        display.stdout.write(
            f"[notebook_accel] earlier output of this job was dropped ({event.segments} x 32 "
            "MiB): a job keeps its latest 64 MiB\n"
        )
        return
    kind = event[0]
    if kind == "line":
        display.feed(event[1], event[2], event[3] + b"\n")
    elif kind == "report":
        display.report(event[1], event[2])
    elif kind == "stall":
        display.stall_report(event[1])


def text_of(event: Any) -> str | None:
    """A line event's text as ``job.output`` holds it (``[rank N] ...``), else None."""
    if isinstance(event, tuple) and event[0] == "line":
        return f"[rank {event[1]}] " + event[3].decode("utf-8", errors="replace")
    return None
