"""The stall report: when no rank makes progress for ``stall_time`` s, where every rank is.

    the display (display.py) tells the watch of every sign of progress:
      output bytes (any rank's, shown or not), a bar or chart message, a step counted
      (Health.steps moved)
    the display's tick (every backend calls it while it waits):
      quiet for stall_time / 2  -> a first look: the backend asks its ranks (Ranks.ask)
      quiet for stall_time      -> a second look; a rank whose collectives issued moved
                                   between the looks made progress (a quiet training loop
                                   still all-reduces): quiet again from now; else the report,
                                   shown once (until progress, then a new quiet period)
    answers come back as Where messages (Display.report -> answer), at least _CPU_WINDOW s
    are given (each rank's CPU share is measured over them) and at most Ranks.patience s
    now(): the same look at once, for a timeout's or the stop button's note, Job.where()

Progress costs the display one clock read per output chunk or message; the ranks pay
nothing until a look (launch/rank/where.py), and a look happens only in a quiet launch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...errors import LaunchTimeoutError
from ...reporting.channel import Where

__all__ = ["Ranks", "Report", "StallWatch", "headline"]

_CPU_WINDOW = 0.3  # seconds a look lasts at least: each rank's CPU share is measured over it
_EXTRAS = 4.4  # seconds from a stall's last look to its report at most (py-spy's frames)
_NOTE = "[notebook_accel]"


class Ranks(Protocol):
    """What a backend does for the report: ask its ranks, then say what it knows of each."""

    patience: float  # seconds to wait for the ranks' answers

    def ask(self) -> set[int] | None:
        """Ask every running rank where it is; the ranks whose answer will come as a Where
        message (through Display.report). None: a rank is still starting (it cannot be asked
        yet), so nothing is asked."""
        ...

    def report(self, answers: dict[int, Where], head: str, native: float | None) -> str:
        """The report's text from the answers (the ranks that gave none: what can be read
        from outside); ``native``: py-spy's frames too, where allowed, if they come by
        then (time.monotonic()); None: none."""
        ...


@dataclass(frozen=True)
class Report:
    """Where every rank was (``Workers.where()``, ``Job.where()``): its text, shown as is."""

    text: str

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: object, cycle: bool) -> None:
        printer.text(self.text)  # type: ignore[attr-defined]


def headline(what: str, stall_time: float | None = None) -> str:
    """The report's first line: ``what`` happened (where each rank was then); for a stall
    (``stall_time``), where each rank is, and that the launch goes on."""
    if stall_time is None:
        return f"{_NOTE} {what}; where each rank was:"
    return (
        f"{_NOTE} {what}; where each rank is (the launch goes on; this report is information, "
        f"shown once: a long first compile can be quiet this long; stall_time=None turns it off):"
    )


class _Look:
    """One question to the ranks, and their answers as they come (it takes answers before
    the question is out: a thread relaying for a job may bring one at once)."""

    def __init__(self, patience: float) -> None:
        self.asked: set[int] = set()
        self.answers: dict[int, Where] = {}
        self.started = time.monotonic()
        self.patience = patience

    def done(self) -> bool:
        waited = time.monotonic() - self.started
        if waited < _CPU_WINDOW:
            return False
        return waited >= self.patience or self.asked <= set(self.answers)

    def counts(self) -> dict[int, int | None]:
        return {rank: where.collectives for rank, where in self.answers.items()}


class StallWatch:
    """Watches a launch (or a session's task) for a stall; ``show`` writes the report.

    Args:
        stall_time: seconds without progress before the report (None: no report by itself;
            ``now`` and ``note`` still look).
        ranks: the backend's side (ask, report).
        show: where the report goes (the display's ``stall_report``).
    """

    def __init__(self, stall_time: float | None, ranks: Ranks, show: Callable[[str], None]) -> None:
        self.stall_time = stall_time
        self.ranks = ranks
        self.show = show
        self.shown = 0  # reports shown so far
        self._lock = threading.Lock()  # answers come on the pumping thread, now() elsewhere
        self._since: float | None = None  # the last progress (None: not waiting yet)
        self._first: dict[int, int | None] | None = None  # the first look's counts
        self._look: _Look | None = None  # the stall's look in progress
        self._looks: list[_Look] = []  # every look in progress (now()'s too)
        self._reported = False

    # -- from the display ---------------------------------------------------------------------
    def progress(self) -> None:
        """A sign of progress: a new quiet period starts."""
        self._since = time.monotonic()
        if self._first is not None or self._look is not None or self._reported:
            if self._look is not None:
                self._close(self._look)
            self._first, self._look, self._reported = None, None, False

    def answer(self, rank: int, where: Where) -> None:
        with self._lock:
            for look in self._looks:
                look.answers[rank] = where

    def tick(self) -> None:
        """Look at the ranks when the launch has been quiet long enough; report a stall."""
        if self._reported or self.stall_time is None:
            return
        if self._since is None:  # the backend waits from now: starting processes is not quiet
            self._since = time.monotonic()
        quiet = time.monotonic() - self._since
        look = self._look
        if look is None:
            wanted = self.stall_time if self._first is not None else self.stall_time / 2
            if quiet >= wanted:
                self._ask()
            return
        if not look.done():
            return
        self._look = None
        self._close(look)
        if self._first is None:
            self._first = look.counts()
            return
        if _moved(self._first, look.counts()):
            self._since, self._first = time.monotonic(), None  # collectives went on: progress
            return
        self._reported = True
        self.shown += 1
        head = headline(f"no rank has made progress for {quiet:.0f} s", self.stall_time)
        # (quiet: since the last progress, the looks included)
        # The report comes within stall_time + 5 s of the last progress: py-spy's frames
        # (slow to read on a loaded machine) only if they come by then.
        self.show(self.ranks.report(look.answers, head, native=look.started + _EXTRAS))

    def _ask(self) -> None:
        look = self._open()
        asked = self.ranks.ask()
        if asked is None:  # a rank is still starting: that is not a stall
            self._close(look)
            self._since, self._first = time.monotonic(), None
            return
        look.asked = asked
        self._look = look

    def _open(self) -> _Look:
        look = _Look(self.ranks.patience)
        with self._lock:
            self._looks.append(look)
        return look

    def _close(self, look: _Look) -> None:
        with self._lock:
            if look in self._looks:
                self._looks.remove(look)

    # -- at once ------------------------------------------------------------------------------
    def now(self, head: str, pump: Callable[[float], None] | None = None) -> str:
        """Where every rank is now: the report's text under its first line ``head``.

        ``pump(seconds)`` relays what the ranks send (the backend's loop); without it another
        thread relays (a background job's) and this one waits.
        """
        look = self._open()
        look.asked = self.ranks.ask() or set()
        try:
            while not look.done():
                if pump is not None:
                    pump(0.05)
                else:
                    time.sleep(0.05)
        except KeyboardInterrupt:
            pass  # the stop button again: what has come so far
        finally:
            self._close(look)
        return self.ranks.report(dict(look.answers), head, native=None)

    def note(self, exc: BaseException, pump: Callable[[float], None] | None = None) -> None:
        """A timeout's or the stop button's error gets where each rank was, as a note (the
        saved notebook keeps it); other errors are left as they are."""
        if isinstance(exc, LaunchTimeoutError):
            what = "its timeout ran out"
        elif isinstance(exc, KeyboardInterrupt):
            what = "stopped"
        else:
            return
        exc.add_note(self.now(headline(what), pump))


def _moved(first: dict[int, int | None], second: dict[int, int | None]) -> bool:
    """Whether a rank issued collectives (or made or left its process group) between the
    two looks; a rank that answered one look only says nothing."""
    return any(rank in first and count != first[rank] for rank, count in second.items())
