"""Workers that stay: N worker processes kept across cells, running one task after another.

notebook (Workers)                                   each worker (launch/rank/serve.py)
------------------                                   -----------------------------
LaunchConfig and plan as a launch's; banner once
a private store (a memfd, rendezvous.py), a results segment (shm.py),
the engine's workers (forkserver, pipes, lifeline) -> start, seed once   <- ready
run / submit / push / pull / run_cell, one at a time (a second one waits for the first):
  payload.build; large buffers into shared memory   -> the task on the commands pipe
    (kept: a worker may keep them in its namespace)
  engine's relay into the task's display:           <- lines, bars, chart, health
    the running cell (run), or handles made in
    the submitting cell (submit: background.py)
  every rank of the task answered                   <- Result / Failure
    -> the output sent before the answers, then the values (large ones mapped)
a rank failed, the stop button, job.stop(), timeout -> SIGINT to the ranks still running
  all back within _GRACE s and the process group answers a probe (an all-reduce):
    usable, namespace kept;  else torn down as a launch is (SIGTERM, SIGKILL): closed
a worker died (now, or while idle)                  -> the others stopped: closed
close(): an empty command to each                   -> leave the group together, exit
  (SIGTERM then SIGKILL after the grace); fds, store and results segment released
a killed kernel: each worker's lifeline ends it (worker.py)

States (State): OPEN (idle) -> RUNNING (a task; _begin) -> OPEN (every rank answered, or came
back sound after a fault; _finish) or CLOSED. Every ending goes through ``_end(why)``: the
workers stopped (asked to leave first by close()), then the engine, store and results segment
released by one finalizer, which is also what a garbage-collected session runs. The session
holds its Engine (engine.py) and drives it through the engine's methods (retarget, send,
ask_to_leave, await_answers, ...).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import enum
import itertools
import multiprocessing.util  # noqa: F401  (its exit handler must be registered before ours)
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from ... import env
from ...config import DEFAULT, LaunchConfig, document, given
from ...errors import (
    ConfigError,
    LaunchTimeoutError,
    SessionClosedError,
    UserFrames,
    WorkerDiedError,
)
from ...options import rules
from ..meet.rendezvous import Meeting
from ..plan import banner, layout_for, plan_for, watch_for_stop
from ..rank import serve
from ..show import charts
from ..show.background import CellDisplay
from ..show.display import Display
from ..show.stall import Report
from ..wire.payload import Payload, build, in_a_kernel
from ..wire.shm import shipped, transport
from ..wire.transport import Paired, Shipment, unpack
from .awaited import Awaited
from .durable.client import Remote, RemoteJob
from .engine import Engine, Rank
from .forkserver import warm_up
from .where import Processes, engine_ranks

__all__ = ["Job", "Report", "State", "Workers", "latest"]

_GRACE = 5.0  # seconds interrupted ranks get to come back, and the probe to answer
_CLOSE_GRACE = 5.0  # seconds the workers get to leave the group and exit by themselves
_USABLE = (
    "[notebook_accel] every rank came back: the session is still usable, its namespace as "
    "the ranks left it."
)
_CLOSED = (
    "[notebook_accel] the session's workers were stopped and it is closed ({why}); its "
    "namespace is gone: restart() starts fresh workers."
)
_ASKED = "[notebook_accel] where each rank is (asked with where()):"


class State(enum.Enum):
    """Where a session is: each move between them is one line of this module."""

    OPEN = "open"  # the workers are idle: the next task may start
    RUNNING = "running"  # a task's ranks are at work (or being brought back)
    CLOSED = "closed"  # the workers are gone (Workers._why says why)


@dataclass
class _Task:
    """One piece of work on some of the session's ranks."""

    ranks: list[Rank]
    payload: Payload
    inputs: Shipment
    display: Display
    timeout: float | None
    deadline: float | None


class Workers:
    """N worker processes started once and kept, with their memory and process group.

    Each rank keeps one namespace for the session's life: ``push`` puts values in it, a
    ``%%distributed`` cell (``%load_ext notebook_accel``) runs in it, and a function given to
    ``run`` or ``submit`` sees it: a global name the workers have is the workers' object (the
    model a cell built, a prepared Accelerator), a name they lack comes from the notebook.
    One piece of work runs at a time; a second call waits for the first to end.

    The options are ``notebook_launcher``'s (the config file fills what is not given), but
    ``timeout`` is each run's default, and ``seed`` seeds every rank once, at the start and at
    each ``restart()`` (later runs go on with the same random streams; ``Accelerator()`` seeds
    with it again when created, as in a launch). ``cluster``, ``num_nodes`` and
    ``max_restarts`` are not for a session (a ConfigError names them).

    With ``durable=True`` (and a ``name``) the workers belong to a supervisor process instead
    of this kernel: they outlive it, and ``Workers.attach(name)`` in any later kernel of the
    same user takes them back, with their namespace and jobs (``w.jobs``).

    Args:
        {options}

    Example:
        >>> w = Workers(num_processes=2)  # doctest: +SKIP
        Launching 2 processes on CPU (gloo), kept for this session (close() ends them)
        >>> w.push(scale=10)  # doctest: +SKIP
        >>> w.run(lambda x: x * scale, 2)  # doctest: +SKIP
        [20, 20]
        >>> w.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        num_processes: int | None = None,
        mixed_precision: str | None = None,
        *,
        hardware: str | None = None,
        output: str | None = None,
        timeout: float | None = None,
        stall_time: float | None = DEFAULT,
        gradient_accumulation_steps: int | None = None,
        seed: int | bool | None = None,
        start_method: str | None = None,
        fsdp: Any = None,
        deepspeed: Any = None,
        parallelism_config: Any = None,
        dynamo_backend: str | None = None,
        cluster: str | None = None,
        num_nodes: int | None = None,
        max_restarts: int | None = None,
        durable: bool = False,
        name: str | None = None,
        idle_time: float | None = None,
    ) -> None:
        with UserFrames():
            rules.for_session(cluster=cluster, num_nodes=num_nodes, max_restarts=max_restarts)
            options = given(locals(), session=True)
            self.config = LaunchConfig.from_defaults(**options, num_nodes=1, max_restarts=0)
            self.plan = plan_for(self.config)
            rules.for_session(backend=self.plan.backend, hardware=self.plan.hardware)
            rules.for_durable(durable=self.config.durable, name=self.config.name)
            self._lock = threading.Lock()  # one task at a time
            self._engine: Engine | None = None  # its workers, while not CLOSED
            self._results: Shipment | None = None
            # Releases the engine, the store and the results segment (killing what is left):
            # called by _end, and by the garbage collector for a session nobody holds.
            self._release: weakref.finalize[Any, Any] | None = None
            self._state = State.CLOSED
            self._why = "not started"  # why it is CLOSED
            self._job: Job | None = None
            self._jobs: list[Job | RemoteJob] = []
            self._cells = itertools.count(1)
            # A durable session's supervisor (durable/client.py): it holds the workers.
            self._remote: Remote | None = None
            if self.config.durable:
                assert self.config.name is not None
                self._open_durable(self.config.name, options)
            else:
                self._start()
            _sessions.append(weakref.ref(self))

    # -- a durable session (durable/): the same methods, its supervisor's workers -------------
    def _open_durable(self, name: str, options: dict[str, Any]) -> None:
        options = {
            k: v for k, v in options.items() if k not in ("durable", "name") and v is not DEFAULT
        }
        options["idle_time"] = self.config.idle_time
        self._remote = Remote.start(name, options)
        self._state = State.OPEN
        kept = f", kept by the durable session {name!r} (close() ends it; attach from any kernel)"
        Display(output=self.config.output).banner(banner(self.config, self.plan, kept))

    @classmethod
    def attach(cls, name: str) -> Workers:
        """The durable session ``name`` (``Workers(..., name=name, durable=True)``), from any
        kernel of the same user on this machine: its workers, namespace and jobs as they are.

        Each running job's output so far is shown in this cell, then its live lines, bars and
        chart; ``w.jobs`` holds every job. A worker that died while no kernel was attached is
        said here (its rank and signal).

        Raises:
            ConfigError: no durable session of this user has that name.

        Example:
            >>> w = Workers.attach("exp1")  # doctest: +SKIP
            >>> w.jobs[-1].result()  # doctest: +SKIP
        """
        with UserFrames():
            rules.for_durable(durable=True, name=name)
            remote = Remote.attach(name)
            self = cls.__new__(cls)
            options = {k: v for k, v in remote.info["options"].items() if k != "idle_time"}
            self.config = LaunchConfig.from_defaults(**options, durable=True, name=name)
            self.plan = plan_for(self.config)
            self._lock = threading.Lock()
            self._engine, self._results, self._release = None, None, None
            self._job, self._jobs, self._cells = None, [], itertools.count(1)
            self._remote = remote
            self._state = State.CLOSED if remote.info["closed"] else State.OPEN
            self._why = remote.info["why"] or "a worker died"
            for death in remote.info["deaths"]:
                sys.stderr.write(
                    f"[notebook_accel] while no kernel was attached to {name!r}: {death}\n"
                )
            remote.watch_jobs(self.config.output)
            self._jobs.extend(remote.jobs)
            _sessions.append(weakref.ref(self))
            return self

    @property
    def jobs(self) -> list[Job | RemoteJob]:
        """The session's jobs (``submit``), in submission order; after ``attach``, every job
        of the durable session."""
        return list(self._jobs)

    def idle_death(self) -> BaseException | None:
        """A worker that died while no task ran: the session closed and the death returned
        (None: every worker lives, or the session is closed already). A durable session's
        supervisor asks it every half second."""
        with self._turn():
            engine = self._engine
            if engine is None or not engine.ended():
                return None
            return self._closing(engine.first_problem() or WorkerDiedError(-1, -signal.SIGKILL))

    # -- life ---------------------------------------------------------------------------------
    def _start(self) -> None:
        config, plan = self.config, self.plan
        warm_up(config.start_method)
        display = Display(output=config.output)
        display.banner(banner(config, plan, ", kept for this session (close() ends them)"))
        stack = contextlib.ExitStack()
        try:
            # The session's workers meet once, privately (rendezvous.py: a memfd FileStore).
            port, store = stack.enter_context(Meeting(config).attempt(0))
            results = stack.enter_context(shipped([]))  # a results segment, no data
            payload = Payload(
                b"",
                tuple(sys.path),
                os.getcwd(),
                env.snapshot(),
                shipment=results,
                displays=self.ranks_display(),
            )
            layout = layout_for(config, plan, 0, store)
            engine = Engine(
                layout,
                payload,
                display,
                port,
                config.start_method,
                entry=serve.main,
                commands=True,
            )
            stack.callback(engine.close)
            engine.start()
            problem = engine.await_answers(engine.ranks, None, None)  # each rank: ready
            if problem is not None:
                raise problem
        except BaseException:
            stack.close()
            raise
        engine.forget_answers()
        self._engine, self._results = engine, results
        self._state = State.OPEN
        self._release = weakref.finalize(self, stack.close)

    def ranks_display(self) -> bool:
        """Whether the ranks' displays are sent as a notebook's (a kernel holds the session;
        a durable session's supervisor says what the kernel that opened it was)."""
        return in_a_kernel()

    def _end(self, why: str, leave: bool = False) -> None:
        """The one way a session ends: its workers stopped (with ``leave``, first asked to
        leave their process group and exit), then everything it holds released."""
        engine = self._engine
        try:
            if engine is not None and leave:
                engine.retarget(Display(output=self.config.output))  # the closing cell's
                engine.ask_to_leave()  # serve.main: leave the group, exit
                engine.wait_for_exits(_CLOSE_GRACE)
        finally:
            try:
                if engine is not None:
                    engine.stop(grace=1.0)  # whoever did not leave by itself
            finally:
                self._engine = None
                self._state, self._why = State.CLOSED, why
                if self._release is not None:
                    self._release()

    def close(self) -> None:
        """End the workers: they leave their process group and exit (killed if they do not).

        A background job still running is stopped first.
        """
        with UserFrames():
            if self._remote is not None:
                self._remote.close()
                self._state, self._why = State.CLOSED, "close() was called"
                return
            job = self._job
            if job is not None:
                job.stop()
            with self._turn():
                if self._state is not State.CLOSED:
                    self._end("close() was called", leave=True)

    def restart(self) -> None:
        """Close the workers (if open) and start fresh ones: a new namespace, seeded again."""
        with UserFrames():
            if self._remote is not None:
                self._remote.info = self._remote.ask("restart")
                self._state = State.OPEN
                return
            self.close()
            with self._turn():
                self._start()

    @property
    def closed(self) -> bool:
        """Whether the workers are gone (``restart()`` starts fresh ones). A durable session
        closed from another kernel, or ended by its idle time, is closed here too."""
        if self._remote is not None and not self._remote.running():
            self._state, self._why = State.CLOSED, "its supervisor has ended"
        return self._state is State.CLOSED

    @property
    def num_processes(self) -> int:
        """How many workers (ranks) the session has."""
        return self.plan.num_processes

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"closed: {self._why}" if self.closed else "open"
        return f"<Workers: {self.plan.num_processes} on {self.plan.label}, {state}>"

    # -- work ---------------------------------------------------------------------------------
    def _acquire(self) -> None:
        try:
            self._lock.acquire()  # one task at a time: wait for the running one
        except KeyboardInterrupt as exc:
            exc.add_note("[notebook_accel] the running job goes on; job.stop() ends it.")
            raise

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            self._lock.release()

    def _open_engine(self) -> Engine:
        if self._engine is None:
            raise SessionClosedError(self._why)
        return self._engine

    def _ranks(self, ranks: list[int] | None) -> list[Rank]:
        engine = self._open_engine()
        if ranks is None:
            return list(engine.ranks)
        n = len(engine.ranks)
        if not ranks or any(
            isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n for r in ranks
        ):
            raise ConfigError("ranks", ranks, f"a list of ranks in [0, {n - 1}], or None (all)")
        return [engine.ranks[r] for r in sorted(set(ranks))]

    def _begin(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        ranks: list[int] | None,
        display: Display,
        timeout: float | None,
        stop: threading.Event | None,
        origins: tuple[tuple[str, str], ...] | None = None,
    ) -> _Task:
        chosen = self._ranks(ranks)
        engine = self._open_engine()
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ConfigError("timeout", timeout, "a number of seconds > 0, or None")
        payload, buffers = build(function, args, kwargs, {})
        if origins is not None:  # the code came through a durable session's supervisor
            payload = dataclasses.replace(payload, code_origins=origins)
        watch = watch_for_stop(stop, "the job was stopped")
        engine.retarget(display, watch)
        if engine.ended():  # while idle: its output and its end go to this task's display
            self._died()
        inputs = transport().ship(buffers, results=False, kept=True)
        payload = dataclasses.replace(payload, shipment=inputs)
        engine.retarget(display, watch, payload)
        self._watch_stalls(display, engine, payload)
        timeout = self.config.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        self._state = State.RUNNING
        try:
            for rank in chosen:
                display.rank_state(rank.rank, "running")
            for rank in chosen:  # each rank its own pickle (its own copies of the fds)
                engine.send(rank.rank, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            inputs.release()
            engine.wait_answered(chosen, 1.0)  # the worker's end shows
            self._died()
        return _Task(chosen, payload, inputs, display, timeout, deadline)

    def _watch_stalls(self, display: Display, engine: Engine, payload: Payload) -> None:
        """[stall report] ``display`` looks for a stall of the session's ranks."""
        ranks = Processes(engine_ranks(engine), payload.code_origins)
        display.watch_stalls(self.config.stall_time, ranks)

    def _died(self) -> NoReturn:
        engine = self._open_engine()
        raise self._closing(engine.first_problem() or WorkerDiedError(-1, -signal.SIGKILL))

    def _closing(self, root: BaseException, why: str = "a worker died") -> BaseException:
        """End the session (``why``); ``root``, with a note that says so."""
        self._end(why)
        root.add_note(_CLOSED.format(why=why))
        return root

    def _values(self, task: _Task) -> list[Any]:
        assert self._results is not None
        shipment = Paired(task.inputs, self._results)
        return [unpack(shipment, r.result) for r in task.ranks if r.result is not None]

    def _finish(self, task: _Task) -> list[Any]:
        """Every rank's value; or the root cause, the session kept usable or closed."""
        engine = self._open_engine()
        try:
            problem = self._wait(engine, task)
            if problem is not None and task.display.stalls is not None:
                # A timeout or the stop button: where each rank was, before the interrupt.
                task.display.stalls.note(problem, engine.poll)
            if problem is not None:
                problem = self._recover(task, problem)
            if self._state is State.RUNNING:
                self._state = State.OPEN  # every rank answered: free for the next task
            if problem is not None:
                raise problem
            return self._values(task)
        except BaseException:
            if self._state is State.RUNNING:
                self._end("its relay failed")  # ranks may still be busy: no next task
            raise
        finally:
            self._end_task(task)

    @staticmethod
    def _wait(engine: Engine, task: _Task) -> BaseException | None:
        """Relay until every rank of ``task`` answered (None), or what went wrong."""
        try:
            return engine.await_answers(task.ranks, task.deadline, task.timeout)
        except LaunchTimeoutError:
            assert task.timeout is not None
            return LaunchTimeoutError(task.timeout, "the run", "its ranks were interrupted")
        except KeyboardInterrupt as exc:
            return exc

    def _recover(self, task: _Task, cause: BaseException) -> BaseException:
        """After a failure, a stop or a timeout: interrupt, wait, keep or end the session.

        Returns the root cause with a note on the session's state (CLOSED unless every rank
        came back and the process group answers a probe).
        """
        engine = self._open_engine()
        if isinstance(cause, WorkerDiedError) or engine.ended():
            return self._closing(engine.first_problem() or cause)
        engine.interrupt(task.ranks)
        try:
            back = engine.wait_answered(task.ranks, _GRACE)
            failure = not isinstance(cause, KeyboardInterrupt | LaunchTimeoutError)
            root = (engine.first_problem() or cause) if failure else cause
            sound = back and self._sound(task)
        except BaseException:  # the stop button again: no more waiting
            self._end("stopped again while its ranks were being interrupted")
            raise
        if sound:
            root.add_note(_USABLE)
            return root
        why = (
            f"not every rank came back within {_GRACE:g} s of its KeyboardInterrupt"
            if not back
            else "its process group no longer answered"
        )
        return self._closing(root, why)

    def _sound(self, task: _Task) -> bool:
        """Every rank answers a probe of the process group in time (serve.probe)."""
        engine = self._open_engine()
        engine.forget_answers()
        probe = self._begin(serve.probe, (_GRACE,), None, None, task.display, _GRACE + 2, None)
        try:
            problem = engine.await_answers(probe.ranks, probe.deadline, probe.timeout)
            return problem is None and all(self._values(probe))
        except LaunchTimeoutError:
            return False
        finally:
            probe.inputs.release()

    def _end_task(self, task: _Task) -> None:
        engine = self._engine
        if engine is not None:
            engine.flush_output()
            engine.forget_answers()
            engine.retarget(task.display)  # no watch between tasks
        task.display.watch_stalls(None, None)
        task.display.close()
        task.inputs.release()

    def call(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        ranks: list[int] | None = None,
        timeout: float | None = None,
        display: Display | None = None,
        stop: threading.Event | None = None,
        origins: tuple[tuple[str, str], ...] | None = None,
    ) -> list[Any]:
        """``run`` with the arguments as a tuple and a dict, on some ``ranks`` (default all).

        ``display`` and ``stop`` are the launch panel's hooks (faces/panel.py): its own
        display, and an event that, once set, interrupts the run as the stop button does.
        ``origins``: where the function's code came from (a durable session's supervisor
        passes the kernel's, which cloudpickle's copy no longer says), for tracebacks and
        stall reports.
        """
        with UserFrames():
            if self._remote is not None:
                shown = display or Display(output=self.config.output)
                return self._remote.call(function, args, kwargs, ranks, timeout, shown, stop)
            with self._turn():
                shown = display or Display(output=self.config.output)
                task = self._begin(function, args, kwargs, ranks, shown, timeout, stop, origins)
                return self._finish(task)

    def run(
        self,
        function: Callable[..., Any],
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """``function(*args, **kwargs)`` on every worker: the list of each rank's result.

        Output, bars and the live chart appear in the cell as in a launch; a rank's exception
        is raised here as its own type with its traceback. When every rank came back from it
        (they are interrupted if they do not), the session stays usable.

        Args:
            function: a function from the notebook (it sees the workers' namespace) or from
                an importable module.
            timeout: seconds after which the run is interrupted (LaunchTimeoutError);
                default: the session's ``timeout``. ``timeout`` is the session's keyword:
                pass a function's own ``timeout`` through ``functools.partial``.

        Raises:
            SessionClosedError: the session is closed (``restart()`` opens it again).
            WorkerDiedError: a worker died: the others are stopped and the session closed.
            KeyboardInterrupt: the stop button; the ranks got one too.

        Example:
            >>> w.run(lambda: model.weight.sum().item())  # doctest: +SKIP
            [0.25, 0.25]
        """
        with UserFrames():
            return self.call(function, args, kwargs, timeout=timeout)

    def submit(
        self,
        function: Callable[..., Any],
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Job | RemoteJob:
        """Start ``function(*args, **kwargs)`` on every worker and return at once.

        Its lines, bars and chart appear in this cell while later cells run; ``job.result()``
        waits for the values. A run, push or pull started meanwhile waits for the job.

        Example:
            >>> job = w.submit(train, 100)  # doctest: +SKIP
            >>> job.done(), job.result(timeout=600)  # doctest: +SKIP
        """
        with UserFrames():
            if self._remote is not None:
                remote_job = self._remote.submit(
                    function, args, kwargs, timeout, self.config.output
                )
                self._jobs.append(remote_job)
                return remote_job
            self._acquire()  # the job's thread gives the turn back when the job ends
            try:
                display = (
                    CellDisplay(self.config.output)
                    if charts.in_notebook()
                    else Display(output=self.config.output)
                )
                job = Job(display)
                task = self._begin(function, args, kwargs, None, display, timeout, job._stop)
                self._job = job
                self._jobs.append(job)
                thread = threading.Thread(
                    target=self._background,
                    args=(job, task),
                    name="notebook-accel-job",
                    daemon=True,
                )
                thread.start()
            except BaseException:
                self._lock.release()
                raise
            return job

    def _background(self, job: Job, task: _Task) -> None:
        try:
            job._value = self._finish(task)
        except BaseException as exc:  # noqa: BLE001  (the job's outcome, raised by result())
            job._error = exc
        finally:
            self._job = None
            try:
                job._ended()
            finally:  # a display that failed never keeps the session's turn
                self._lock.release()

    def push(self, **values: Any) -> None:
        """Put each value in every worker's namespace under its name (large buffers through
        shared memory: one copy, mapped by every worker).

        Example:
            >>> w.push(X=X_train, cfg={"lr": 1e-3})  # doctest: +SKIP
        """
        with UserFrames():
            self.call(serve.push_values, (values,))

    def pull(self, name: str, rank: int | None = None) -> Any:
        """The value of ``name`` in every worker's namespace (a list), or in one ``rank``'s.

        Example:
            >>> w.pull("history", rank=0)[-1]  # doctest: +SKIP
            {'step': 99, 'loss': 0.12}
        """
        with UserFrames():
            if rank is None:
                return self.call(serve.pull_value, (name,))
            return self.call(serve.pull_value, (name,), ranks=[rank])[0]

    def run_cell(
        self, code: str, ranks: list[int] | None = None, timeout: float | None = None
    ) -> None:
        """Run a cell's code on the workers, in their namespace (what ``%%distributed`` does).

        Its last expression's value is printed by each rank, as IPython shows it. The code is
        plain Python (no magics); a syntax error is raised here, before any worker runs it.
        """
        with UserFrames(SyntaxError):
            filename = f"<distributed cell {next(self._cells)}>"
            compile(code, filename, "exec")
            self.call(serve.Cell(code, filename), ranks=ranks, timeout=timeout)

    def where(self) -> Report:
        """Where every rank is now: the stack of the thread running each rank's task (or
        that it is idle), with what the ranks' places mean together, as a stall report
        shows it. A background job's ranks while it runs (``Job.where()``).

        Example:
            >>> w.where()  # doctest: +SKIP
            [notebook_accel] where each rank is (asked with where()):
            rank 0 (pid 4242, 0% CPU): idle, waiting for the next task
            rank 1 (pid 4243, 0% CPU): idle, waiting for the next task
        """
        with UserFrames():
            if self._remote is not None:
                return self._remote.where()
            job = self._job
            if job is not None and not job.done():
                return job.where()
            with self._turn():
                engine = self._open_engine()
                shown = engine.display
                display = Display(output="none")
                engine.retarget(display)
                try:
                    self._watch_stalls(display, engine, engine.payload)
                    assert display.stalls is not None
                    return Report(display.stalls.now(_ASKED, engine.poll))
                finally:
                    engine.retarget(shown)


Workers.__doc__ = document(Workers.__doc__, session=True)


class Job(Awaited):
    """A run in the background on a session's workers (``Workers.submit``): ``done()``,
    ``result(timeout)``, ``stop()``, ``output``, ``where()``."""

    def __init__(self, display: Display) -> None:
        super().__init__()
        self._display = display
        self._stop = threading.Event()

    def where(self) -> Report:
        """Where every rank of the job is now (the job goes on): the stack of the thread
        running each rank's task, with what the ranks' places mean together, as a stall
        report shows it.

        Example:
            >>> job.where()  # doctest: +SKIP
            [notebook_accel] where each rank is (asked with where()):
            rank 0 (pid 4242, 100% CPU): running its function at Cell In[7], line 3 ...
        """
        stalls = self._display.stalls
        if stalls is None:  # the job has ended
            return Report(f"{_ASKED}\nthe job has ended ({self!r}).")
        return Report(stalls.now(_ASKED))  # the job's thread relays the answers

    def stop(self) -> None:
        """Interrupt every rank's code, as the stop button does; returns once the job ended.

        The session stays usable when every rank came back within a few seconds.
        """
        self._stop.set()
        self._done.wait()

    @property
    def output(self) -> str:
        """Every line the job's ranks printed (the cell shows the latest ones)."""
        return self._display.output_text if isinstance(self._display, CellDisplay) else ""

    def _ended(self) -> None:
        try:
            if isinstance(self._display, CellDisplay):
                self._display.finish(f"[notebook_accel] {self.ending()}")
        finally:
            self._done.set()

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<Job: {state}>"


_sessions: list[weakref.ref[Workers]] = []


def latest() -> Workers | None:
    """The session opened last and still open (what a bare ``%%distributed`` runs on)."""
    for ref in reversed(_sessions):
        session = ref()
        if session is not None and not session.closed:
            return session
    return None


def _close_all() -> None:
    """At exit: end every open session's workers now.

    Registered after multiprocessing's own exit handler, so it runs first: that one would wait
    forever for the idle workers of a session (they are not daemons, so that a DataLoader in a
    worker may have worker processes of its own).
    """
    for ref in _sessions:
        session = ref()
        if session is not None and not session.closed:
            session._end("the interpreter exited")


atexit.register(_close_all)
