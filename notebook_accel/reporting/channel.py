"""Typed messages from a worker to the parent, over one ``multiprocessing`` pipe per worker.

    worker                                   parent
    ------                                   ------
    Progress(bar, n, total, desc, ...)  -->  display: draw/update a bar
    Displayed(data, metadata, display_id, -->  display: the rank's display(), update_display,
              update, clear, wait)               clear_output (show/rich.py), in the cell
    Metrics(rows)   (rank 0's log() calls,  -->  display: the live chart (launch/show/charts.py)
                     batched, ~4/s at most)
    Health(rss, gpu, steps)  (~1/s)         -->  the panel's rank rows
    Result(value, handle)               -->  collect, in rank order (large buffers
                                             through shared memory, transport.py)
    Failure(type, message, traceback,   -->  stop the other ranks, re-raise in the cell
            exception, time)
    Where(threads, collectives, ...)    -->  the stall report (launch/show/stall.py): where
      (asked: launch/rank/where.py)           each rank is, when the launcher asks

Output lines do not travel here: each worker's stdout/stderr file descriptors are pipes read by
the parent (so that C code's writes are relayed too). Progress, Displayed and Metrics carry the
worker's output marks (bytes Python had written to stdout and stderr when it sent them), so the
parent shows a rank's lines, bars and displays in the order the worker produced them. Messages
are small frozen dataclasses, pickled with the standard library; values and exceptions inside
them are cloudpickled bytes; a display's mimebundle is JSON text (plain data whatever the
objects that made it).
"""

from __future__ import annotations

import json
import pickle
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

__all__ = [
    "Progress",
    "Displayed",
    "Metrics",
    "Health",
    "Result",
    "Failure",
    "Stack",
    "Where",
    "Message",
    "Sender",
    "receive",
]


@dataclass(frozen=True)
class Progress:
    """A progress bar's state; ``closed`` marks its end."""

    bar: int
    n: float
    total: float | None = None
    desc: str = ""
    unit: str = "it"
    closed: bool = False
    options: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Displayed:
    """What a rank displayed (reporting/shell.py): Jupyter's display_data, update_display_data
    or clear_output, as IPython's display publisher would have sent it from a kernel.

    ``data`` and ``metadata`` are the mimebundle and its metadata as JSON text (binary data
    base64-encoded, as a kernel sends it); ``display_id`` is the rank's own id (``None``: an
    anonymous display); ``update`` replaces what that id shows; ``clear`` asks to clear the
    rank's displays, at once or (``wait``) when its next display comes.
    """

    data: str = "{}"
    metadata: str = "{}"
    display_id: str | None = None
    update: bool = False
    clear: bool = False
    wait: bool = False

    def bundle(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The mimebundle and its metadata, as dicts."""
        data, metadata = json.loads(self.data), json.loads(self.metadata)
        if not isinstance(data, dict) or not isinstance(metadata, dict):
            raise TypeError("a display's data and metadata are JSON objects")
        return data, metadata


# ---- live metrics and rank health (reporting/live.py sends them) ---------------------------
@dataclass(frozen=True)
class Metrics:
    """Rows logged by ``Accelerator.log`` since the last message: ``(step, {name: value})``."""

    rows: tuple[tuple[int, dict[str, float]], ...]


@dataclass(frozen=True)
class Health:
    """A rank's vital signs: resident memory, GPU memory (or None), steps taken so far."""

    rss: int  # bytes
    gpu: int | None  # bytes allocated by torch on the rank's GPU
    steps: int | None  # Accelerator.backward() calls, None without an Accelerator
    time: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Result:
    value: bytes  # the pickled return value (pickling.py), large buffers out of band
    handle: Any = None  # where the transport put those buffers (transport.py); None: none


@dataclass(frozen=True)
class Failure:
    type_name: str
    message: str
    traceback: str
    exception: bytes | None  # cloudpickled exception, or None where it does not pickle
    time: float = field(default_factory=time.time)

    @classmethod
    def from_exception(cls, exc: BaseException) -> Failure:
        kind = type(exc)
        blob: bytes | None
        try:
            blob = cloudpickle.dumps(exc)
            pickle.loads(blob)  # an exception that pickles but cannot be rebuilt is no use
        except Exception:
            blob = None
        text = "".join(traceback.format_exception(exc))
        return cls(f"{kind.__module__}.{kind.__qualname__}", str(exc), text, blob)


# ---- where a rank is, when the launcher asks (launch/rank/where.py) ----------------------
Frame = tuple[str, int, str]  # (file, line, function)


@dataclass(frozen=True)
class Stack:
    """One Python thread of a rank: its frames, outermost first (as a traceback lists them)."""

    thread: int  # threading.get_ident()
    name: str
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class Where:
    """Where a rank is: each Python thread's stack, and what can be known besides.

    Sent by the rank when asked (``by="python"``); or read by the parent from what
    ``faulthandler`` wrote from a signal handler: ``"signal"`` when the rank's Python could
    not answer (a thread holds the GIL inside C code), ``"dump"`` for a process that has no
    message pipe to answer on (a TPU process).
    """

    threads: tuple[Stack, ...]
    collectives: int | None = None  # collectives issued so far, over every process group
    tensors: str = ""  # the tensors of the collective the rank's function waits in
    recorder: tuple[str, ...] = ()  # the flight recorder's last collectives, when it is on
    cpu: float | None = None  # CPU seconds the process has used (os.times)
    busy: float | None = None  # its CPU share just before (percent of one core), if measured
    by: str = "python"
    time: float = field(default_factory=time.time)


Message = Progress | Displayed | Metrics | Health | Result | Failure | Where


class Sender:
    """The worker's end: send typed messages; never raises once the parent is gone."""

    def __init__(
        self, conn: Connection, marks: Callable[[], tuple[int, int]] | None = None
    ) -> None:
        self._conn = conn
        self._marks = marks
        # The health thread sends too: one message's bytes must not interleave with another's.
        self._lock = threading.Lock()

    def send(self, message: Message) -> bool:
        # Bars, displays and charts sit among the output lines: say how much output came
        # before them.
        marks = None
        if self._marks is not None and isinstance(message, Progress | Displayed | Metrics):
            marks = self._marks()
        data = pickle.dumps((marks, message), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._lock:
                self._conn.send_bytes(data)
        except (OSError, ValueError):
            return False
        return True


Marks = tuple[int, int] | None


def receive(conn: Connection) -> tuple[Marks, Message]:
    """The parent's end: read one message and its output marks (EOFError: the worker closed)."""
    marks, message = pickle.loads(conn.recv_bytes())
    if not isinstance(message, Progress | Displayed | Metrics | Health | Result | Failure | Where):
        raise TypeError(f"unexpected message from a worker: {type(message).__name__}")
    return marks, message
