"""Pre-forked workers for the next launch, and the hand-over that gives one its launch.

    after a launch (a background thread)          the forkserver
    ------------------------------------          -------------
    IdlePool.fill: up to that launch's N  ------>  fork: wait_for_launch(control), in its
                                                   own process group, daemonic
    a launch: IdlePool.take, then hand_over:
      the number of fds                   ------>  recv
      the fds (SCM_RIGHTS)                ------>  recvfds: the list Passed indexes
      pickle of (name, entry, arguments)  ------>  loads (each fd a Passed), then entry(*args)
                                                   in this process: the launch's rank
    IdlePool.close, or this process's exit ----->  EOF on the control pipe: exit, nothing ran

Both ends of the hand-over are here: ``hand_over`` in the launcher,
``Passed``/``wait_for_launch`` in the pre-forked worker. Only where ``__main__`` has no file
(a notebook, ``python -c``): a forkserver start imports a script's ``__main__`` in its
workers, which would then run the caller's code before any launch asked for it.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ...private import cpython

__all__ = ["IdlePool", "Passed", "discard", "hand_over", "idle_pool", "main_has_file"]

_MAX_IDLE = 64  # pre-forked workers kept at most
_TAKE_WAIT = 60.0  # seconds a launch waits for a fill's next worker before forking its own


# -- the worker's end ---------------------------------------------------------------------

# The fds a pre-forked worker received with its launch, in the order the launcher listed them.
_received: list[int] = []


class Passed:
    """An fd inside the pickle a pre-forked worker receives (multiprocessing's DupFd role):
    its place in the list of fds that came with that pickle."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        return _received[self.index]


def wait_for_launch(control: Connection) -> None:
    """A pre-forked worker's wait for its launch; then that launch's entry, in this process.

    On ``control``: the number of fds, the fds (SCM_RIGHTS), then the pickle of (name, entry,
    arguments) that refers to them (``Passed``). EOF first: the pool was closed, nothing ran.
    """
    os.setpgrp()  # a terminal's Ctrl-C while idle does not reach it (the launcher decides)
    try:
        count = int(control.recv_bytes(16))
        with socket.socket(fileno=os.dup(control.fileno())) as sock:
            _received[:] = cpython.receive_fds(sock, count)
        name, entry, args = pickle.loads(control.recv_bytes())
    except (EOFError, OSError, ValueError):
        os._exit(0)
    control.close()
    me = multiprocessing.current_process()
    me.name = name
    me.daemon = False  # (daemonic while idle) the function may start processes of its own
    entry(*args)


# -- the launcher's end -------------------------------------------------------------------


def hand_over(
    control: Connection, name: str, entry: Callable[..., None], args: tuple[Any, ...]
) -> None:
    """Give a pre-forked worker its launch: the fds, then the pickle (wait_for_launch).

    The pickle names each fd by its place in the list sent beside it (Passed), as
    multiprocessing's forkserver start does with its own DupFd.
    """
    data, fds = cpython.dumps_with_fds((name, entry, args), Passed)
    control.send_bytes(str(len(fds)).encode())
    with socket.socket(fileno=os.dup(control.fileno())) as sock:
        cpython.send_fds(sock, fds)
    control.send_bytes(data)


class IdlePool:
    """Pre-forked workers for the next launch: fresh processes (each serves one launch only,
    then exits) that the forkserver forked while nothing was waiting for them.

    A launch takes what is there and forks the rest; after it, the pool is filled again from
    a background thread, up to that launch's number of processes. Only where the workers
    could not run anything of the caller's at start (``__main__`` without a file: a notebook,
    ``python -c``), as a forkserver start would import a script's ``__main__`` in them.
    Closed when this process exits (each one ends at the EOF on its control pipe, which the
    death of this process gives too).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: list[tuple[BaseProcess, Connection]] = []
        self._filling: threading.Thread | None = None
        self._starting: Connection | None = None  # the control pipe of a start under way
        self._exit_hook = False
        self._closed = False
        self._size = 0  # the last fill's size: a renewal fills that many again
        self._generation = 0  # bumped when the forkserver is renewed (renewed)
        self._changed = threading.Condition(self._lock)  # a worker is ready, or a fill ended
        self._fill_running = False

    def take(self) -> tuple[BaseProcess, Connection] | None:
        """A live idle worker and its control pipe, or None. While a fill is under way (a
        launch right after a renewal, or after the last launch), its next worker: the same
        fork the launch would ask for, not a second one beside it on the same cores."""
        deadline = time.monotonic() + _TAKE_WAIT
        with self._lock:
            while True:
                while self._ready:
                    process, control = self._ready.pop(0)
                    # An idle worker never writes: something to read is the EOF of its death.
                    if process.exitcode is None and not _readable(control):
                        return process, control
                    discard(process, control)
                left = deadline - time.monotonic()
                if not self._fill_running or left <= 0:
                    return None
                self._changed.wait(left)

    def fill(self, ctx: multiprocessing.context.BaseContext, size: int) -> None:
        """Fork idle workers up to ``size`` in the background (at most one filling at once).
        None where this Python's pickler cannot hand fds over (private/cpython.py): each
        launch's forkserver forks its workers then."""
        if ctx.get_start_method() != "forkserver" or main_has_file():
            return
        if not cpython.fd_hand_over_possible():
            return
        size = min(size, _MAX_IDLE)
        with self._lock:
            self._size = size
            if self._closed or (self._filling is not None and self._filling.is_alive()):
                return
            if not self._exit_hook:
                atexit.register(self.close)
                self._exit_hook = True
            self._filling = threading.Thread(
                target=self._fill, args=(ctx, size), name="notebook-accel-idle", daemon=True
            )
            self._fill_running = True
            self._filling.start()

    def _fill(self, ctx: multiprocessing.context.BaseContext, size: int) -> None:
        try:
            self._fill_up(ctx, size)
        finally:
            with self._lock:
                self._fill_running = False
                self._changed.notify_all()

    def _fill_up(self, ctx: multiprocessing.context.BaseContext, size: int) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._ready) >= size:
                    return
            theirs, ours = ctx.Pipe(duplex=True)
            with self._lock:
                self._starting = ours
                generation = self._generation
            # Daemonic while idle: an interpreter's exit ends it without waiting (a worker
            # that got a launch is an ordinary process again, wait_for_launch).
            process = ctx.Process(  # type: ignore[attr-defined]
                target=wait_for_launch,
                args=(theirs,),
                name="notebook-accel-idle",
                daemon=True,
            )
            try:
                process.start()
            except Exception:
                ours.close()
                return  # the next launch forks its own workers
            finally:
                theirs.close()
            with self._lock:
                self._starting = None
                if self._closed:  # this process is exiting: it ends at our EOF
                    ours.close()
                    return
                if generation != self._generation:  # forked by a server since replaced
                    ours.close()
                    continue
                self._ready.append((process, ours))
                self._changed.notify_all()

    def renewed(self, ctx: multiprocessing.context.BaseContext) -> None:
        """The forkserver was replaced (forkserver.renew): the idle workers of the old one
        end (EOF on their control pipe; never handed a launch), and as many are forked by
        the new one in the background."""
        with self._lock:
            self._generation += 1
            ready, self._ready = self._ready, []
            size = self._size
        for _, control in ready:
            control.close()  # each exits at this EOF; its server collects it
        if size:
            self.fill(ctx, size)

    def settle(self, timeout: float | None = None) -> None:
        """Wait until a fill under way has ended (tests count processes and fds)."""
        filling = self._filling
        if filling is not None:
            filling.join(timeout)

    def pids(self) -> set[int]:
        with self._lock:
            return {p.pid for p, _ in self._ready if p.pid is not None}

    def close(self) -> None:
        """End every idle worker (EOF on its control pipe) and wait for it. A fill under way
        gets half a second to finish the start it is in (a start cut off half-way would have the
        child print a traceback); then its control pipe is closed too, and the forkserver that
        has not answered it is stopped (still importing torch).

        Each idle worker holds this process's resource-tracker pipe (multiprocessing passes it
        to every child), and so does a start queued in the forkserver: Python 3.13 waits at
        exit until the tracker has seen that pipe close (3.14 waits 1 s, 3.11 not at all), so
        a worker left to the EOF of our exit would hold the exit forever."""
        with self._lock:
            self._closed = True
        self.settle(timeout=0.5)
        with self._lock:
            ready, self._ready = self._ready, []
            starting, self._starting = self._starting, None
        if starting is not None:
            starting.close()  # a worker forked for it ends at this EOF
            _stop_forkserver()  # the start queued in it goes with it
        for _, control in ready:
            control.close()
        for process, _ in ready:
            process.join(timeout=2.0)
            discard(process, None)


def discard(process: BaseProcess, control: Connection | None) -> None:
    if control is not None:
        control.close()
    if process.exitcode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
            os.kill(process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        process.join(timeout=2.0)
    with contextlib.suppress(ValueError):
        process.close()


def _stop_forkserver() -> None:
    """SIGKILL this process's forkserver (exiting): its listener and what is queued there go."""
    pid = cpython.forkserver_pid()
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _readable(control: Connection) -> bool:
    try:
        return control.poll(0)
    except OSError:
        return True


def main_has_file() -> bool:
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) is not None


idle_pool = IdlePool()
