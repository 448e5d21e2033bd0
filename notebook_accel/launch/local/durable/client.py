"""A kernel's side of a durable session: start its supervisor, attach, ask, draw what it sends.

    Remote.start(name, options)                    Remote.attach(name)
      the folder made (0700; a live name: error)     the folder's status: a live supervisor
      Popen(supervisor, start_new_session)           "hello": ranks, jobs, deaths while away
      wait for b"ready" (EOF: its log in the error)  each job watched (RemoteJob): its kept
      "open": the options -> the session's workers     output replayed, then the live part
    ask(verb, ...): one proven connection (link.py) per request; the events it streams are
      drawn in the cell's Display (recorder.replay), then its outcome returned or raised
    a run's stop button: b"stop" on the connection; the supervisor interrupts the ranks

Nothing in this kernel belongs to the session: killing it leaves the supervisor, its workers
and their jobs as they were.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ....errors import ConfigError, SessionClosedError
from ...show import charts
from ...show.background import CellDisplay
from ...show.display import Display
from ...show.stall import Report
from ...wire.payload import code_origins, in_a_kernel
from ..awaited import Awaited
from . import place
from .journal import frames
from .link import Link, connect
from .recorder import replay, text_of

__all__ = ["Remote", "RemoteJob"]

_SUPERVISOR = "notebook_accel.launch.local.durable.supervisor"

Events = Callable[[Any], None]
Origins = tuple[tuple[tuple[str, str], ...], dict[str, list[str]]]
_SOURCE_LIMIT = 1 << 20  # bytes of one file's source sent along with a function
_TICK = 0.1  # seconds between a waiting display's ticks (its throttled updates drawn)


def _in_use(name: str) -> ConfigError:
    return ConfigError(
        "name",
        name,
        "a name no open durable session of this user has",
        f"The durable session {name!r} is running: Workers.attach({name!r}) takes it back, "
        "and its close() ends it.",
    )


class Remote:
    """A durable session's supervisor, as a kernel reaches it."""

    def __init__(self, name: str, folder: Path, info: dict[str, Any]) -> None:
        self.name = name
        self.folder = folder
        self.info = info
        self.jobs: list[RemoteJob] = []
        self._spare: Link | None = None  # a proven connection kept for the next request
        self._lock = threading.Lock()

    # -- reaching it --------------------------------------------------------------------------
    @classmethod
    def start(cls, name: str, options: dict[str, Any]) -> Remote:
        """Start the supervisor of a new durable session ``name`` and open its workers.

        Raises:
            ConfigError: ``name`` is in use by a running durable session of this user.
        """
        folder = place.session_folder(name)
        if folder.exists() and place.live_status(folder) is not None:
            raise _in_use(name)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            raise _in_use(name) from None
        _launch(folder)
        remote = cls(name, folder, {})
        notebook = in_a_kernel()
        remote.info = remote.ask("open", options, list(sys.path), os.getcwd(), notebook)
        return remote

    @classmethod
    def attach(cls, name: str) -> Remote:
        """The running durable session ``name`` of this user.

        Raises:
            ConfigError: no running durable session has that name (the names there are said).
        """
        folder = place.session_folder(name)
        status = place.live_status(folder) if folder.is_dir() else None
        if status is None:
            names = [info.name for info in place.listing()]
            raise ConfigError(
                "name", name, f"the name of one of this user's durable sessions: {names}"
            )
        remote = cls(name, folder, {})
        remote.info = remote.ask("hello")
        return remote

    def running(self) -> bool:
        """Whether the supervisor still serves (its socket is there: it removes its folder
        when the session ends, and sessions() the folder of one that was killed)."""
        return (self.folder / "socket").exists()

    def ask(
        self,
        verb: str,
        *args: Any,
        events: Events | None = None,
        idle: Callable[[], None] | None = None,
    ) -> Any:
        """Send one request; draw its events with ``events``; its outcome (or its error).
        ``idle`` is called every _TICK s while nothing arrives (a display's throttled
        updates). The stop button during a run interrupts its ranks (a second one stops
        waiting: the run goes on)."""
        link, answered, stopped = self._sent(verb, args), False, False
        try:
            while True:
                try:
                    message = _next(link, idle)
                except KeyboardInterrupt:
                    if stopped or verb != "call":
                        raise
                    stopped = True
                    self.ask("interrupt")  # on another connection: SIGINT to the ranks
                    continue
                if message[0] == "ok":
                    answered = True
                    return message[1]
                if message[0] == "error":
                    answered = True
                    error = message[1]
                    error.__cause__ = message[2]
                    raise error
                if events is not None:
                    for event in [message[1]] if message[0] == "event" else frames(message[1]):
                        events(event)
        finally:
            self._done_with(link, answered)

    def _sent(self, verb: str, args: tuple[Any, ...]) -> Link:
        """A connection with the request sent: the spare one (a ~1 ms proof saved), else new."""
        import cloudpickle  # a notebook's functions travel by value

        # The arguments apart, so that the supervisor first follows this kernel's sys.path
        # (a module put on it after the session opened), then loads them.
        request = (verb, tuple(sys.path), cloudpickle.dumps(args, protocol=5))
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            try:
                spare.send(request)
                return spare
            except OSError:
                spare.close()  # the supervisor ended or restarted: a new connection says so
        try:
            link = connect(self.folder / "socket")
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise SessionClosedError(f"the durable session {self.name!r} has ended") from exc
        link.send(request)
        return link

    def _done_with(self, link: Link, answered: bool) -> None:
        """Keep a connection whose request was answered whole as the spare; close others."""
        with self._lock:
            if answered and self._spare is None:
                self._spare = link
                return
        link.close()

    # -- the session's work -------------------------------------------------------------------
    def call(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        ranks: list[int] | None,
        timeout: float | None,
        display: Display,
        stop: threading.Event | None = None,
    ) -> list[Any]:
        """A run: its events drawn in ``display``; ``stop`` (the panel's Stop) once set
        interrupts it as the stop button does."""
        asked = threading.Event()

        def idle() -> None:
            display.tick()
            if stop is not None and stop.is_set() and not asked.is_set():
                asked.set()
                self.ask("interrupt")

        try:
            values: list[Any] = self.ask(
                "call",
                function,
                args,
                kwargs,
                ranks,
                timeout,
                _origins(function),
                events=_drawn(display),
                idle=idle,
            )
            return values
        finally:
            display.close()

    def submit(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        timeout: float | None,
        output: str,
    ) -> RemoteJob:
        number = self.ask("submit", function, args, kwargs, timeout, _origins(function))
        job = RemoteJob(self, number, _job_display(output))
        self.jobs.append(job)
        return job

    def watch_jobs(self, output: str) -> None:
        """After attaching: each job watched; a running one drawn in this cell (its kept
        output, then the live part), a finished one kept silently for its result."""
        for number, state in enumerate(self.info["jobs"]):
            shown = _job_display(output) if state == "running" else Display(output="none")
            self.jobs.append(RemoteJob(self, number, shown))

    def where(self, number: int | None = None) -> Report:
        return Report(str(self.ask("where", number)))

    def close(self) -> None:
        with contextlib.suppress(SessionClosedError):
            self.ask("close")
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()


def _origins(function: Callable[..., Any]) -> Origins:
    """Where ``function``'s code is from, with the source lines of those files this kernel
    knows (a notebook's cells are in its linecache only): the supervisor's tracebacks and
    stall reports name the cell and show its line, as a plain session's do."""
    origins = code_origins(function)
    sources = {}
    for _, filename in origins:
        lines = linecache.getlines(filename)
        if lines and sum(map(len, lines)) < _SOURCE_LIMIT:
            sources[filename] = lines
    return origins, sources


def _next(link: Link, idle: Callable[[], None] | None) -> Any:
    while idle is not None and not link.readable(_TICK):
        idle()
    return link.recv()


def _drawn(display: Display) -> Events:
    def draw(event: Any) -> None:
        replay(display, event)
        display.tick()

    return draw


def _job_display(output: str) -> Display:
    return CellDisplay(output) if charts.in_notebook() else Display(output=output)


def _launch(folder: Path) -> None:
    """Start the supervisor, detached: its own session (no signal of this kernel's terminal
    or process group reaches it), stdio to its log; return once it listens."""
    read, write = os.pipe()
    log = open(folder / "supervisor.log", "ab")  # noqa: SIM115  (the child keeps it)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", _SUPERVISOR, str(folder), str(write)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(write,),
            start_new_session=True,
            cwd=os.getcwd(),
        )
    finally:
        os.close(write)
        log.close()
    # Reaped by a thread of ours while this kernel lives (no zombie after close()).
    threading.Thread(target=process.wait, name="notebook-accel-durable", daemon=True).start()
    with os.fdopen(read, "rb") as ready:
        said = ready.read()  # EOF: it exited before listening
    if said != b"ready":
        text = (folder / "supervisor.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the durable session's supervisor did not start:\n{text}")


class RemoteJob(Awaited):
    """A job of a durable session (``Workers.submit``, or ``w.jobs`` after attaching): the
    same methods as a plain session's Job; its output comes from the supervisor's journal."""

    def __init__(self, remote: Remote, number: int, display: Display) -> None:
        super().__init__()
        self._remote = remote
        self.number = number
        self._display = display
        self._lines: list[str] = []
        self._thread = threading.Thread(
            target=self._watch, name="notebook-accel-durable-job", daemon=True
        )
        self._thread.start()

    def _take(self, event: Any) -> None:
        line = text_of(event)
        if line is not None:
            self._lines.append(line)
        replay(self._display, event)
        self._display.tick()

    def _watch(self) -> None:
        try:
            self._value = self._remote.ask(
                "watch", self.number, events=self._take, idle=self._display.tick
            )
        except BaseException as exc:  # noqa: BLE001  (the job's outcome, raised by result())
            self._error = exc
        finally:
            try:
                self._display.close()
                if isinstance(self._display, CellDisplay):
                    self._display.finish(f"[notebook_accel] job {self.number}: {self.ending()}")
            finally:
                self._done.set()

    def stop(self) -> None:
        """Interrupt every rank's code; returns once the job ended."""
        self._remote.ask("stop", self.number)
        self._done.wait()

    def where(self) -> Report:
        """Where every rank of the job is now (the job goes on)."""
        return self._remote.where(self.number)

    @property
    def output(self) -> str:
        """Every line the job's ranks printed that the supervisor kept (all of them, up to its
        bound of 64 MiB a job)."""
        return "\n".join(self._lines)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<Job {self.number} of durable session {self._remote.name!r}: {state}>"
