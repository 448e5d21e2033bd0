"""Typed messages from a worker to the parent, over one ``multiprocessing`` pipe per worker.

    worker                                   parent
    ------                                   ------
    Progress(bar, n, total, desc, ...)  -->  display: draw/update a bar
    Result(value, handle)               -->  collect, in rank order (large buffers
                                             through shared memory, transport.py)
    Failure(type, message, traceback,   -->  stop the other ranks, re-raise in the cell
            exception, time)

Output lines do not travel here: each worker's stdout/stderr file descriptors are pipes read by
the parent (so that C code's writes are relayed too). Messages are small frozen dataclasses,
pickled with the standard library; values and exceptions inside them are cloudpickled bytes.
"""

from __future__ import annotations

import pickle
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

__all__ = ["Progress", "Result", "Failure", "Message", "Sender", "receive"]


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


Message = Progress | Result | Failure


class Sender:
    """The worker's end: send typed messages; never raises once the parent is gone."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, message: Message) -> bool:
        try:
            self._conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, ValueError):
            return False
        return True


def receive(conn: Connection) -> Message:
    """The parent's end: read one message (raises EOFError when the worker closed it)."""
    message = pickle.loads(conn.recv_bytes())
    if not isinstance(message, Progress | Result | Failure):
        raise TypeError(f"unexpected message from a worker: {type(message).__name__}")
    return message
