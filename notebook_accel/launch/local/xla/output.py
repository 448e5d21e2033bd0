"""Output of torch_xla's processes, relayed into the notebook cell with rank prefixes.

    parent (notebook)                                torch_xla's process (spawned by its pool)
    -----------------                                -----------------------------------------
    Relay: unix socket in a private temp dir  <---   first device thread of the process:
                                                       connect twice (stdout, stderr), send a
                                                       header {pid, source, label}, then dup2
                                                       the sockets onto fd 1 / fd 2 (C writes too)
                                              <---   several devices in the process (v2/v3, the
                                                       CPU runtime): each device thread also
                                                       connects its own pair; Python's print in
                                                       that thread goes there (sys.stdout routes
                                                       by thread)
                                              <---   a device that fails: one more connection
                                                       (stream "failure") with its Failure, sent
                                                       before it returns to torch_xla's pool
    Relay.pump(): accept, read, Display.feed(source, stream, bytes) on the parent's main thread;
                  failure reports collect in Relay.failures

Why a listening socket and not pipes or FIFOs: torch_xla decides how many processes it starts
(one per TPU chip), its pool pickles our arguments where pipe fds cannot travel, and a FIFO's
open blocks until the other end opens (a process that dies while starting would hang the
parent). A socket accepts however many connections arrive, each says who it is, and the kernel
closes it when the process dies: the parent sees EOF instead of hanging. The directory is 0700,
so only this user can connect. The header's pid is what lets the parent stop the processes on
a timeout or an interrupt, since run_multiprocess keeps its pool to itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from ...show.display import Display

__all__ = ["Relay", "attach", "report_failure"]

_STREAMS = ("stdout", "stderr")
_FAILURE = "failure"  # a device's report that it failed, sent as it happens
_MAX_HEADER = 4096


@dataclass
class _Source:
    sock: socket.socket
    header: bytes = b""
    source: int | None = None
    stream: str = "stdout"
    body: bytes = b""  # a failure report's pickled Failure, complete at EOF


class Relay:
    """The parent's end: accepts the processes' connections and feeds the display.

    Example:
        >>> with Relay(Display()) as relay:  # doctest: +SKIP
        ...     start_processes(relay.address); relay.pump(0.25)
    """

    def __init__(self, display: Display) -> None:
        self.display = display
        self.pids: set[int] = set()
        # [stall report] each process's first rank and its label ("ranks 0-3"; "" for one)
        self.processes: dict[int, tuple[int, str]] = {}
        self._dir = tempfile.mkdtemp(prefix="notebook-accel-xla-")  # 0700: ours alone
        self.address = os.path.join(self._dir, "output.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.address)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._open: dict[socket.socket, _Source] = {}
        # (ordinal, Failure) as each device reports it, before torch_xla's pool returns.
        self.failures: list[tuple[int, Any]] = []

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds; accept connections and relay what arrived."""
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    conn, _ = self._listener.accept()
                    self._open[conn] = _Source(conn)
                    self._selector.register(conn, selectors.EVENT_READ, conn)
            else:
                self._read(self._open[key.data])

    def _read(self, src: _Source) -> None:
        try:
            data = src.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._finish(src)
            return
        if src.source is None:
            src.header += data
            if b"\n" not in src.header:
                if len(src.header) > _MAX_HEADER:
                    self._finish(src)  # not one of ours
                return
            line, data = src.header.split(b"\n", 1)
            self._introduce(src, json.loads(line))
        if data and src.source is not None:
            if src.stream == _FAILURE:
                src.body += data
            else:
                self.display.feed(src.source, src.stream, data)

    def _introduce(self, src: _Source, header: dict[str, Any]) -> None:
        pid = int(header["pid"])
        self.pids.add(pid)
        src.source = int(header["source"])
        src.stream = header["stream"]
        if header.get("label"):
            self.display.name_source(src.source, header["label"], bool(header["main"]))
            first = int(header["label"].split()[-1].split("-")[0])
            self.processes[pid] = (first, header["label"])
        elif src.stream != _FAILURE:
            self.processes.setdefault(pid, (src.source, ""))

    def _finish(self, src: _Source) -> None:
        self._selector.unregister(src.sock)
        del self._open[src.sock]
        src.sock.close()
        if src.source is not None and src.stream == _FAILURE:
            with contextlib.suppress(Exception):  # a report cut short by a kill says nothing
                self.failures.append((src.source, pickle.loads(src.body)))
        elif src.source is not None:
            self.display.end(src.source, src.stream)

    def drain(self, seconds: float) -> None:
        """Relay until every connection closed (its process ended) or ``seconds`` passed."""
        end = time.monotonic() + seconds
        while self._open and time.monotonic() < end:
            self.pump(max(0.0, min(0.1, end - time.monotonic())))

    def kill(self) -> None:
        """SIGKILL every process that connected; torch_xla's pool then breaks and returns."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """End every stream's last line and remove the socket and its directory."""
        for src in list(self._open.values()):
            self._finish(src)
        self._selector.close()
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# -- the process's end ------------------------------------------------------------------------


class _ByThread(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` that writes to the calling device thread's own stream.

    Threads that are not device threads (ones the user's function started) write to the
    process's stream, whose lines carry the process's label.
    """

    def __init__(self, default: TextIO, streams: threading.local, name: str) -> None:
        self._default = default
        self._streams = streams
        self._name = name

    def _target(self) -> TextIO:
        stream: TextIO | None = getattr(self._streams, self._name, None)
        return stream if stream is not None else self._default

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._default.fileno()


_lock = threading.Lock()
_process_attached = False
_thread_streams = threading.local()


def _connect(address: str, header: dict[str, Any]) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    sock.sendall(json.dumps(header).encode() + b"\n")
    return sock


def _attach_process(address: str, header: dict[str, Any]) -> None:
    from ...rank.worker import line_buffered_stdio

    for fd, stream in ((1, "stdout"), (2, "stderr")):
        sock = _connect(address, {**header, "stream": stream})
        os.dup2(sock.fileno(), fd)
        sock.close()
    line_buffered_stdio()


def attach(address: str) -> Callable[[], None]:
    """Send this device thread's output (and, once per process, fd 1/2) to the parent.

    Runs in torch_xla's device thread, after torch_xla set the thread's ordinal. Returns the
    function that flushes and closes this thread's streams at the end of the call.
    """
    import torch_xla.runtime as xr

    global _process_attached
    ordinal = xr.global_ordinal()
    per_process = xr.addressable_device_count()
    pid = os.getpid()
    with _lock:
        if not _process_attached:
            _process_attached = True
            if per_process == 1:
                header: dict[str, Any] = {"pid": pid, "source": ordinal, "label": None}
            else:
                # C code's writes cannot be told apart by thread: they carry every rank of
                # the process (negative source, so that it never collides with a rank).
                first = xr.process_index() * per_process
                header = {
                    "pid": pid,
                    "source": -1 - xr.process_index(),
                    "label": f"ranks {first}-{first + per_process - 1}",
                    "main": first == 0,
                }
            _attach_process(address, header)
            if per_process > 1:
                sys.stdout = _ByThread(sys.stdout, _thread_streams, "stdout")
                sys.stderr = _ByThread(sys.stderr, _thread_streams, "stderr")
    if per_process == 1:
        return _flush_c
    for stream in _STREAMS:
        sock = _connect(address, {"pid": pid, "source": ordinal, "label": None, "stream": stream})
        wrapper = io.TextIOWrapper(
            open(sock.detach(), "wb"),  # noqa: SIM115 - closed by the returned function
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        setattr(_thread_streams, stream, wrapper)

    def detach() -> None:
        for stream in _STREAMS:
            wrapper = getattr(_thread_streams, stream, None)
            setattr(_thread_streams, stream, None)
            if wrapper is not None:
                with contextlib.suppress(OSError, ValueError):
                    wrapper.close()
        _flush_c()

    return detach


def report_failure(address: str, failure: Any) -> None:
    """Tell the parent at once that this device failed, so that it stops the other devices.

    torch_xla's pool returns only when every process is done, and a peer blocked in a
    collective never is; the parent must not wait for the pool to learn of a failure.
    """
    import torch_xla.runtime as xr

    header = {"pid": os.getpid(), "source": xr.global_ordinal(), "label": None}
    with _connect(address, {**header, "stream": _FAILURE}) as sock:
        sock.sendall(pickle.dumps(failure))


def _flush_c() -> None:
    from ...rank.worker import flush_all

    flush_all()
