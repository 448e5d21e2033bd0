"""Helpers for the stall report's tests: a display that keeps the reports and stops the
launch at the first one, the line of a hang, and the hang of mismatched collectives."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

from notebook_accel.launch.show.display import Display


def mismatched() -> None:
    """A hang: rank 0 all-reduces while rank 1 broadcasts (each line marked)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(4)
    print("ready", flush=True)
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)  # <- rank 0
    else:
        dist.broadcast(tensor, 0)  # <- rank 1


def line_of(function: Any, marker: str) -> int:
    """The line of ``function`` that holds ``marker`` (a comment on the hanging line)."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, text in enumerate(lines) if marker in text)


class Recorder(Display):
    """A launch's display that keeps the stall reports, and stops the launch at the first
    (``stop``: the event the launch's ``stop=`` hook watches, as the panel's Stop button)."""

    def __init__(self, output: str = "all") -> None:
        super().__init__(output=output)
        self.stop = threading.Event()
        self.reports: list[str] = []
        self.last_output = time.monotonic()
        self.waited: float | None = None  # seconds from the last output to the report

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        self.last_output = time.monotonic()
        super().feed(rank, stream, data)

    def stall_report(self, text: str) -> None:
        if self.waited is None:
            self.waited = time.monotonic() - self.last_output
        self.reports.append(text)
        self.stop.set()


def times_out_with_a_note(config: Any) -> None:
    """Launch ``mismatched`` with ``config`` (a timeout, stall_time=None) until it times out:
    no report by itself, and the error's note says where each rank was."""
    import pytest

    from notebook_accel import LaunchTimeoutError
    from notebook_accel.launch import launch

    display = Recorder()
    with pytest.raises(LaunchTimeoutError) as raised:
        launch(mismatched, (), None, config, display=display)
    assert display.reports == []  # stall_time=None: no report by itself
    note = note_of(raised.value)
    assert note.startswith("[notebook_accel] its timeout ran out; where each rank was:"), note
    assert "the ranks wait in different collectives." in note


def note_of(error: BaseException) -> str:
    """The one note of ``error`` that says where each rank was."""
    notes = [n for n in getattr(error, "__notes__", []) if "where each rank was" in n]
    assert len(notes) == 1, getattr(error, "__notes__", None)
    return notes[0]
