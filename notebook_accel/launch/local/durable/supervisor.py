"""A durable session's supervisor: the process that owns the workers instead of a kernel.

    kernel A: Workers(..., durable=True)                 python -m ...durable.supervisor DIR
    ------------------------------------                 ------------------------------------
    Popen(start_new_session=True; stdio -> DIR/supervisor.log)
                                                          Listener on DIR/socket (link.py)
                      <-- b"ready" on the ready pipe --   (then the pipe is closed)
    "open" (the options, sys.path, cwd)      ---------->  Workers(**options): workers forked
                                                          from this process's forkserver;
                                                          their lifeline is this process
    "call" / "submit" / "watch" / "where" /  ---------->  one task at a time (self.turn);
      "stop" / "restart" / "close"                        a job's events into its journal
                      <------ events, then the outcome    and to each watching kernel
    kernel A killed: nothing here notices (another session, no pipe of the kernel's)
    kernel B: Workers.attach(name) -> "hello", "watch" each job (replay, then live)
    every 0.5 s: status.json; a worker that died while idle (reported at the next "hello");
      idle (no task, no request) for idle_time -> close, as after "close"
    close: the workers leave and exit, the folder is removed, this process exits; killed,
      its workers follow it (their lifeline), and sessions() removes the folder it left

Being a fresh interpreter started with ``-m``, it holds none of the kernel's memory, and its
workers are forked by its own forkserver (a fork of this process: forkserver.py's script
case), never by the kernel's.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import pickle
import queue
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..session import Workers
from .client import Origins
from .journal import Journal
from .link import Link, Listener, reply_error
from .place import write_status
from .recorder import Recorder

__all__ = ["main"]

_TICK = 0.5
_OPEN_WITHIN = 120.0  # seconds the starting kernel has to send "open"
_UNLOADABLE = (
    "[notebook_accel] the durable session's supervisor could not load the request: what a "
    "function or its arguments refer to must be importable there (with the sys.path of the "
    "kernel that opened the session and the entries the requesting kernel's adds)."
)
_REPLY_WITHIN = 10.0  # seconds the requests under way get to answer once the session ended
_ASKED = "[notebook_accel] where each rank is (asked with where()):"


class _Job:
    """A submitted task: its journal, its watchers, its outcome."""

    def __init__(self, number: int, folder: Path) -> None:
        self.number = number
        self.journal = Journal(folder / str(number))
        self.watchers: list[queue.Queue[bytes | None]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ended = threading.Event()
        self.outcome: tuple[Any, ...] = ()
        self.recorder = Recorder(self.record)

    def record(self, event: tuple[Any, ...]) -> None:
        with self.lock:
            frame = self.journal.append(event)
            for watcher in self.watchers:
                watcher.put(frame)

    def end(self, outcome: tuple[Any, ...]) -> None:
        with self.lock:
            self.outcome = outcome
            self.ended.set()
            for watcher in self.watchers:
                watcher.put(None)
            self.watchers.clear()

    @property
    def state(self) -> str:
        if not self.ended.is_set():
            return "running"
        return "finished" if self.outcome[0] == "ok" else "failed"


class Supervisor:
    """Serves the kernels' requests over ``folder``'s socket until the session ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.jobs_folder = folder / "jobs"
        self.jobs_folder.mkdir(mode=0o700, exist_ok=True)
        self.workers: Workers | None = None
        self.idle_time = _OPEN_WITHIN
        self.options: dict[str, Any] = {}
        self.stop_call = threading.Event()  # the running call's stop event
        self.turn = threading.Lock()  # one task at a time, as a session's own lock
        self.jobs: list[_Job] = []
        self.deaths: list[str] = []
        self.started = time.time()
        self.active = 0  # requests being served
        self.last_request = time.monotonic()
        self.last_line = ""
        self.why = ""
        self.done = threading.Event()
        self._count = threading.Lock()
        self.listener = Listener(folder / "socket", self.serve)
        self._handlers: dict[str, Callable[..., None]] = {
            "open": self._open,
            "hello": self._hello,
            "call": self._call,
            "submit": self._submit,
            "watch": self._watch,
            "stop": self._stop,
            "interrupt": self._interrupt,
            "where": self._where,
            "restart": self._restart,
            "close": self._close,
        }

    # -- requests -----------------------------------------------------------------------------
    def serve(self, link: Link) -> None:
        """A kernel's connection: its requests one after another, until it closes."""
        while True:
            try:
                verb, path, data = link.recv()
            except (OSError, ConnectionError, EOFError):
                return  # the kernel closed it, or went away
            try:
                _follow(path)
                args = pickle.loads(data)  # noqa: S301  (a proven member's)
            except Exception as exc:  # noqa: BLE001  (read whole, but not loadable here)
                exc.add_note(_UNLOADABLE)
                with contextlib.suppress(OSError, ConnectionError):
                    reply_error(link, exc)
                continue
            with self._count:
                self.active += 1
            try:
                self._handlers[verb](link, *args)
            except (OSError, ConnectionError, EOFError):
                return  # the kernel went away mid-request: what it asked for goes on
            except BaseException as exc:  # noqa: BLE001  (the request's outcome, for the kernel)
                with contextlib.suppress(OSError, ConnectionError):
                    reply_error(link, exc)
            finally:
                with self._count:
                    self.active -= 1
                    self.last_request = time.monotonic()

    def _session(self) -> Workers:
        if self.workers is None:
            raise RuntimeError("the durable session was not opened")
        return self.workers

    def _open(
        self, link: Link, options: dict[str, Any], path: list[str], cwd: str, notebook: bool
    ) -> None:
        if self.workers is not None:
            raise RuntimeError("the durable session is open already")
        sys.path[:] = path  # the kernel's imports, for functions from its modules
        os.chdir(cwd)
        self.options = dict(options)  # an attaching kernel's config (its banner, its plan)
        self.idle_time = float(options.pop("idle_time"))
        try:
            self.workers = _held(notebook)(**options)
        except BaseException:
            self.end("its workers did not start")
            raise
        self._changed()
        link.send(("ok", self._info()))

    def _info(self) -> dict[str, Any]:
        workers = self._session()
        return {
            "ranks": workers.num_processes,
            "jobs": [job.state for job in self.jobs],
            "deaths": list(self.deaths),
            "closed": workers.closed,
            "why": self.why,
            "pid": os.getpid(),
            "options": self.options,
        }

    def _changed(self) -> None:
        """What sessions() says, before the reply (else it is the next tick's)."""
        write_status(self.folder, self.status())

    def _hello(self, link: Link) -> None:
        link.send(("ok", self._info()))

    def _call(
        self,
        link: Link,
        function: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        ranks: list[int] | None,
        timeout: float | None,
        origins: Origins,
    ) -> None:
        stop = self.stop_call = threading.Event()  # "interrupt" sets it: the stop button

        def send(event: tuple[Any, ...]) -> None:
            with contextlib.suppress(OSError):  # a kernel gone: the run goes on unseen
                link.send_raw(pickle.dumps(("event", event), protocol=pickle.HIGHEST_PROTOCOL))

        display = Recorder(send)
        with self.turn:
            values = self._session().call(
                function,
                args,
                kwargs,
                ranks=ranks,
                timeout=timeout,
                display=display,
                stop=stop,
                origins=_known(origins),
            )
            self.last_line = display.last_line or self.last_line
        link.send(("ok", values))

    def _submit(
        self,
        link: Link,
        function: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        timeout: float | None,
        origins: Origins,
    ) -> None:
        workers = self._session()
        job = _Job(len(self.jobs), self.jobs_folder)
        self.turn.acquire()  # taken now: a request after this one waits for the job
        try:
            self.jobs.append(job)
            thread = threading.Thread(
                target=self._run_job,
                args=(workers, job, function, args, kwargs, timeout, _known(origins)),
            )
            thread.daemon = True
            thread.start()
        except BaseException:
            self.turn.release()
            raise
        # Returned once the task was sent, as a plain session's submit; what fails before
        # (a worker that died while idle, a bad timeout) is raised by the submit itself.
        while not job.recorder.begun.wait(0.01):
            if job.ended.is_set():
                error = job.outcome[1]
                error.__cause__ = job.outcome[2]
                raise error
        self._changed()
        link.send(("ok", job.number))

    def _run_job(
        self,
        workers: Workers,
        job: _Job,
        function: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        timeout: float | None,
        origins: tuple[tuple[str, str], ...],
    ) -> None:
        outcome: tuple[Any, ...]
        try:
            values = workers.call(
                function,
                args,
                kwargs,
                timeout=timeout,
                display=job.recorder,
                stop=job.stop,
                origins=origins,
            )
            outcome = ("ok", values)
        except BaseException as exc:  # noqa: BLE001  (the job's outcome, for job.result())
            outcome = ("error", exc, exc.__cause__)
            self._note_death(exc)
            if not job.recorder.begun.is_set():  # never a job: submit raises the error
                self.jobs.remove(job)
        finally:
            self.turn.release()
        job.end(outcome)

    def _watch(self, link: Link, number: int) -> None:
        job = self.jobs[number]
        watcher: queue.Queue[bytes | None] = queue.Queue()
        with job.lock:
            kept = job.journal.read()
            if not job.ended.is_set():
                job.watchers.append(watcher)
            else:
                watcher.put(None)
        link.send_raw(pickle.dumps(("log", kept), protocol=pickle.HIGHEST_PROTOCOL))
        try:
            while (frame := watcher.get()) is not None:
                link.send_raw(pickle.dumps(("log", frame), protocol=pickle.HIGHEST_PROTOCOL))
        finally:
            with job.lock, contextlib.suppress(ValueError):
                job.watchers.remove(watcher)
        outcome = job.outcome
        if outcome[0] == "ok":
            link.send(outcome)
        else:
            error = outcome[1]
            error.__cause__ = outcome[2]
            reply_error(link, error)

    def _interrupt(self, link: Link) -> None:
        self.stop_call.set()
        link.send(("ok", None))

    def _stop(self, link: Link, number: int) -> None:
        job = self.jobs[number]
        job.stop.set()
        job.ended.wait()
        link.send(("ok", None))

    def _where(self, link: Link, number: int | None) -> None:
        running = [job for job in self.jobs if not job.ended.is_set()]
        job = (running[-1] if running else None) if number is None else self.jobs[number]
        stalls = None if job is None or job.ended.is_set() else job.recorder.stalls
        if stalls is not None:
            text = stalls.now(_ASKED)
        elif job is not None:
            text = f"{_ASKED}\nthe job has ended."
        else:
            text = str(self._session().where())
        link.send(("ok", text))

    def _restart(self, link: Link) -> None:
        self._session().restart()
        self.deaths.clear()
        self._changed()
        link.send(("ok", self._info()))

    def _close(self, link: Link) -> None:
        self.end("close() was called")
        link.send(("ok", None))

    # -- life ---------------------------------------------------------------------------------
    def end(self, why: str) -> None:
        """End the session: its jobs stopped, its workers closed, then this process."""
        self.why = why
        for job in self.jobs:
            job.stop.set()
        try:
            if self.workers is not None:
                self.workers.close()
        finally:  # whatever close() raised, this process ends (its workers with it)
            self.done.set()
            # Gone from sessions() before a kernel's close() returns; connections stay.
            shutil.rmtree(self.folder, ignore_errors=True)

    def _note_death(self, error: BaseException) -> None:
        if type(error).__name__ == "WorkerDiedError":
            self.deaths.append(str(error))

    def _watch_idle_workers(self) -> None:
        """A worker that died while no task ran: the session closed, the death kept."""
        workers = self.workers
        if workers is None or workers.closed or not self.turn.acquire(blocking=False):
            return
        try:
            problem = workers.idle_death()
        finally:
            self.turn.release()
        if problem is not None:
            self.deaths.append(str(problem))

    def status(self) -> dict[str, Any]:
        """What sessions() lists (status.json)."""
        workers = self.workers
        state = "starting"
        if workers is not None:
            state = "closed" if workers.closed else ("running" if self.turn.locked() else "open")
        running = [job for job in self.jobs if not job.ended.is_set()]
        line = running[-1].recorder.last_line if running else ""
        self.last_line = line or self.last_line
        return {
            "name": self.folder.name,
            "pid": os.getpid(),
            "state": state,
            "ranks": 0 if workers is None else workers.num_processes,
            "started": self.started,
            "last_line": self.last_line if not self.deaths else self.deaths[-1],
        }

    def _idle(self) -> bool:
        with self._count:
            quiet = self.active == 0 and time.monotonic() - self.last_request > self.idle_time
        return quiet and not self.turn.locked()

    def run(self) -> None:
        """Tick until the session ends: status, idle deaths, the idle time."""
        while not self.done.wait(_TICK):
            self._watch_idle_workers()
            with contextlib.suppress(OSError):  # the folder is gone once the session ended
                write_status(self.folder, self.status())
            if self._idle():
                self.end(f"nobody used it for {self.idle_time:g} s (idle_time)")
            elif not self.listener.path.exists():  # no kernel can reach it any more
                self.end("its socket was removed")
        deadline = time.monotonic() + _REPLY_WITHIN
        while self.active and time.monotonic() < deadline:
            time.sleep(0.01)  # the last replies (close's, the watchers' outcomes) go out first
        self.listener.close()


def _follow(path: tuple[str, ...]) -> None:
    """The requesting kernel's sys.path entries this process lacks, added (after its own):
    a function from a module the kernel put on its path later loads here, and in the
    workers, which get this process's sys.path with each task."""
    for entry in path:
        if entry not in sys.path:
            sys.path.append(entry)


def _known(origins: Origins) -> tuple[tuple[str, str], ...]:
    """The kernel's code origins, their files' lines put in this process's linecache (a
    notebook's cells exist nowhere else): a rank's traceback shows the cell's line."""
    names, sources = origins
    for filename, lines in sources.items():
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return names


def _held(notebook: bool) -> type[Workers]:
    """Workers whose ranks display as the opening kernel's would: a notebook's ranks send
    what they display (drawn in an attached cell), a script's print it."""

    class Held(Workers):
        def ranks_display(self) -> bool:
            return notebook

    return Held


def main() -> None:
    """``python -m notebook_accel.launch.local.durable.supervisor FOLDER READY_FD``."""
    folder, ready = Path(sys.argv[1]), int(sys.argv[2])
    supervisor = Supervisor(folder)
    signal.signal(
        signal.SIGTERM,
        lambda *_: threading.Thread(target=supervisor.end, args=("SIGTERM",), daemon=True).start(),
    )
    write_status(folder, supervisor.status())
    os.write(ready, b"ready")
    os.close(ready)
    try:
        supervisor.run()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
