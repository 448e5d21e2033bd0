"""Start, supervise and stop the workers of one launch.

parent (notebook kernel)                         forkserver (imported torch once)
------------------------                         ---------------------------------
the launch's private store     <--- every rank's env:// (rendezvous.py, worker_store.py)
per rank: message pipe, stdout pipe, stderr pipe, lifeline pipe
a pre-forked idle worker: its fds + pickle ->   (forked after the last launch) worker.idle
                                                 -> worker.main(rank ...)
or Process(target=worker.main).start()  ----->   fork -> worker.main(rank ...)
loop over selectors:
  stdout/stderr bytes   -> display.feed      (lines, rank-prefixed)
  Progress, Displayed,  -> display.report: bars, what a rank displays (show/rich.py),
    Metrics, Health        the live chart, the panel's rows
  Result                -> results[rank] (large buffers mapped from shared memory)
  Failure               -> stop the others, re-raise the earliest failure
  a worker's sentinel   -> died without a message? WorkerDiedError
  deadline              -> LaunchTimeoutError
  KeyboardInterrupt     -> stop everyone, re-raise
finally: SIGTERM -> grace -> SIGKILL to each worker's process group; close every fd and
         the store, so nothing outlives the call; then (a background thread) idle workers
         forked for the next launch (idle.py).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ...errors import LaunchTimeoutError, WorkerDiedError
from ...reporting.channel import Failure, Result, receive
from ..plan import Layout, Watch
from ..rank import worker as worker_module
from ..show.display import Display
from ..wire.outcome import Died, only_collateral, root_cause
from ..wire.payload import Payload
from ..wire.transport import unpack
from .forkserver import context, main_hidden, starting
from .idle import discard, hand_over, idle_pool

__all__ = ["Engine", "Rank"]

_TICK = 0.25  # seconds between checks when nothing arrives
_DRAIN = 1.0  # seconds to wait for output after a worker ended
# A collective's error on one rank is often the echo of a peer's death that the parent has not
# seen yet (a loaded machine); this long it waits for the cause before stopping the others.
_CAUSE_WAIT = 3.0
_EXIT_GRACE = 5.0  # seconds a worker that returned its result gets to exit by itself


@dataclass
class Rank:
    """One worker of the engine: its process, pipes, and what it said."""

    rank: int
    process: BaseProcess
    messages: Connection
    stdout: Connection
    stderr: Connection
    lifeline: Connection
    result: Result | None = None
    failure: Failure | None = None
    exited: bool = False
    died_at: float | None = None  # when the parent saw it end without a message
    open_streams: set[str] = field(default_factory=lambda: {"stdout", "stderr"})
    # [ordering] output bytes relayed so far, and bytes read but held back until a message
    # that came before them in the worker is shown (see _catch_up).
    relayed: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    held: dict[str, bytes] = field(default_factory=lambda: {"stdout": b"", "stderr": b""})

    def pipe(self, stream: str) -> Connection:
        return self.stdout if stream == "stdout" else self.stderr


def _signal_group(proc: BaseProcess, sig: int) -> None:
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, sig)  # the worker made itself a group leader: children go too
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)  # not yet a group leader (just forked)


class Engine:
    """One launch on this machine: ``run()`` returns every local rank's result, in order.

    A session (session.py) drives the same workers through the rest of the public surface:
    ``start``, ``await_answers``, ``first_problem``, ``interrupt``, ``wait_answered``,
    ``ended``, ``flush_output``, ``forget_answers``, ``stop``, ``close``; its workers run
    ``entry`` (rank/serve.py's loop) with a commands pipe each (``commands``).

    Args:
        layout: where this machine's ranks sit.
        payload: what every rank gets at its start (a launch's call).
        display: where output, bars and rank states go (``display`` may be changed between
            a session's tasks, as may ``watch`` and ``payload``).
        port: the workers' MASTER_PORT.
        start_method: ``"auto"``, ``"forkserver"`` or ``"spawn"``.
        watch: called every tick while waiting; what it raises stops the wait.
        entry: what each worker process runs (rank/worker.py's ``main``).
        commands: give each worker a commands pipe (its parent end in ``commands[rank]``).
    """

    def __init__(
        self,
        layout: Layout,
        payload: Payload,
        display: Display,
        port: int,
        start_method: str = "auto",
        watch: Watch = None,
        entry: Callable[..., None] = worker_module.main,
        commands: bool = False,
    ) -> None:
        self.layout = layout
        self.watch = watch
        self.payload = payload
        self.display = display
        self.port = port
        self.entry = entry
        self.ctx = context(start_method)
        self.ranks: list[Rank] = []
        self.commands: dict[int, Connection] = {}
        self._with_commands = commands
        self._stopping_since: float | None = None
        self.selector = selectors.DefaultSelector()
        # [stall report] called with what ends run() before the workers are stopped (a
        # timeout, the stop button: where each rank was goes into the error's notes).
        self.before_stop: Callable[[BaseException], None] | None = None

    # -- starting ---------------------------------------------------------------------------
    def _start_one(self, local_rank: int) -> Rank:
        """Start one worker with its pipes (the child ends passed to it, then closed here)."""
        pipe = self.ctx.Pipe
        msg_r, msg_w = pipe(duplex=False)
        out_r, out_w = pipe(duplex=False)
        err_r, err_w = pipe(duplex=False)
        life_r, life_w = pipe(duplex=False)
        extra: tuple[Connection, ...] = ()
        commands: Connection | None = None
        if self._with_commands:
            theirs, commands = pipe(duplex=False)
            extra = (theirs,)
        worker_env = self.layout.worker_env(local_rank, self.port)
        args = (worker_env, self.payload, msg_w, out_w, err_w, life_r, *extra)
        name = f"notebook-accel-rank-{worker_env.rank}"
        try:
            proc = self._pre_forked(name, args)
            if proc is None:
                proc = self.ctx.Process(  # type: ignore[attr-defined]
                    target=self.entry, args=args, name=name, daemon=False
                )
                proc.start()
        finally:
            for end in (msg_w, out_w, err_w, life_r, *extra):
                end.close()  # the child has its copies; ours would hide EOF
        rank = Rank(worker_env.rank, proc, msg_r, out_r, err_r, life_w)
        if commands is not None:
            self.commands[rank.rank] = commands
        self.selector.register(msg_r, selectors.EVENT_READ, (rank, "messages"))
        self.selector.register(out_r, selectors.EVENT_READ, (rank, "stdout"))
        self.selector.register(err_r, selectors.EVENT_READ, (rank, "stderr"))
        self.selector.register(proc.sentinel, selectors.EVENT_READ, (rank, "sentinel"))
        return rank

    def _pooled(self) -> bool:
        return self.entry is worker_module.main and self.ctx.get_start_method() == "forkserver"

    def _pre_forked(self, name: str, args: tuple[Any, ...]) -> BaseProcess | None:
        """An idle worker given this rank (its fds and arguments), or None: fork one."""
        while self._pooled():
            taken = idle_pool.take()
            if taken is None:
                return None
            process, control = taken
            try:
                hand_over(control, name, self.entry, args)
            except OSError:
                discard(process, control)  # it died a moment ago: the next one
                continue
            control.close()
            process.name = name
            return process
        return None

    def start(self) -> None:
        # The forkserver is not renewed while the ranks are handed to workers (forkserver.py).
        with starting(), main_hidden():
            for local_rank in range(self.layout.num_processes):
                self.ranks.append(self._start_one(local_rank))
                self.display.rank_state(self.ranks[-1].rank, "running")

    # -- supervising ------------------------------------------------------------------------
    def _handle(self, rank: Rank, what: str) -> None:
        if what in ("stdout", "stderr"):
            # Bars the worker sent before printing these bytes go first (their marks pull in
            # the output that preceded them).
            self._read_messages(rank)
            if what not in rank.open_streams:
                return
            conn = rank.pipe(what)
            data = _read(conn) if conn.poll(0) else None
            self._relay(rank, what, len(rank.held[what]) + len(data or b""), data)
            if data == b"":
                self._unregister(conn)
                rank.open_streams.discard(what)
                self.display.end(rank.rank, what)
        elif what == "messages":
            self._read_messages(rank)
        elif what == "sentinel":
            self._unregister(rank.process.sentinel)
            rank.exited = True
            self._read_messages(rank)  # whatever it sent before dying
            if rank.result is None and rank.failure is None:
                rank.died_at = time.time()
                stopped = self._stopping_since is not None
                self.display.rank_state(rank.rank, "stopped" if stopped else "failed")

    def _read_messages(self, rank: Rank) -> None:
        conn = rank.messages
        if conn.closed:
            return
        try:
            while conn.poll(0):
                marks, message = receive(conn)
                if marks is not None:
                    self._catch_up(rank, marks)
                self._dispatch(rank, message)
        except (EOFError, OSError):
            self._unregister(conn)
            conn.close()

    # -- [ordering] a rank's lines and bars in the order the worker produced them ----------
    def _relay(self, rank: Rank, stream: str, count: int, data: bytes | None = None) -> None:
        """Feed the display ``count`` bytes of held (then new) output; hold the rest."""
        buffered = rank.held[stream] + (data or b"")
        out, rank.held[stream] = buffered[:count], buffered[count:]
        if out:
            rank.relayed[stream] += len(out)
            self.display.feed(rank.rank, stream, out)

    def _catch_up(self, rank: Rank, marks: tuple[int, int]) -> None:
        """Show the output the worker wrote before this message, and nothing after it.

        The worker flushed those bytes before sending the message, so they are in the pipe;
        C code's unflushed writes are not counted and may come a little later.
        """
        for stream, mark in zip(("stdout", "stderr"), marks, strict=True):
            wanted = mark - rank.relayed[stream]
            deadline = time.monotonic() + 0.2
            conn = rank.pipe(stream)
            while (
                len(rank.held[stream]) < wanted
                and stream in rank.open_streams
                and conn.poll(max(0.0, deadline - time.monotonic()))
            ):
                data = _read(conn)
                if not data:
                    break  # the end of the stream: _handle sees it next
                rank.held[stream] += data
            if wanted > 0:
                self._relay(rank, stream, wanted)

    def _dispatch(self, rank: Rank, message: Any) -> None:
        if isinstance(message, Result):
            rank.result = message
            self.display.rank_state(rank.rank, "finished")
        elif isinstance(message, Failure):
            rank.failure = message
            self.display.rank_state(rank.rank, "failed")
        else:
            self.display.report(rank.rank, message)

    def _unregister(self, fileobj: Any) -> None:
        if isinstance(fileobj, Connection) and fileobj.closed:
            return  # closed connections were unregistered when they closed
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selector.unregister(fileobj)

    def poll(self, timeout: float) -> None:
        """Handle what arrives within ``timeout`` seconds (output, messages, deaths)."""
        for key, _ in self.selector.select(timeout):
            rank, what = key.data
            self._handle(rank, what)

    def first_problem(self) -> BaseException | None:
        """The root cause among the failures and deaths seen so far.

        A rank whose peer died often fails a moment later inside a collective ("Connection
        closed by peer"); such a failure is collateral and yields to the death or failure
        that caused it. Ranks that ended after the launcher began stopping them do not count.
        """
        return root_cause(self._endings(), self.layout.world_size, self.payload)

    def _endings(self) -> dict[int, Failure | Died]:
        """The ranks that failed or died so far (not those the launcher was stopping)."""
        endings: dict[int, Failure | Died] = {}
        for rank in self.ranks:
            if rank.failure is not None:
                endings[rank.rank] = rank.failure
            elif rank.died_at is not None and (
                self._stopping_since is None or rank.died_at < self._stopping_since
            ):
                code = rank.process.exitcode
                died = WorkerDiedError(rank.rank, code if code is not None else -signal.SIGKILL)
                endings[rank.rank] = Died(rank.died_at, died)
        return endings

    def _awaiting_cause(self) -> bool:
        """Only collateral failures so far, the first of them under ``_CAUSE_WAIT`` s ago."""
        endings = self._endings().values()
        if not only_collateral(endings):
            return False
        return time.time() - min(ending.time for ending in endings) < _CAUSE_WAIT

    def await_answers(
        self, ranks: list[Rank], deadline: float | None, timeout: float | None
    ) -> BaseException | None:
        """Relay output until each of ``ranks`` has sent its Result: ``None`` then.

        Returns the root cause as soon as a rank failed or died (nothing is stopped here);
        raises LaunchTimeoutError (``timeout``, the user's figure) at ``deadline``, and
        whatever ``watch`` raises.
        """
        while True:
            problem = self.first_problem()
            if problem is not None and self._awaiting_cause():
                self.poll(0.05)
                continue
            if problem is not None:
                return problem
            if all(r.result is not None for r in ranks):
                return None
            if self.watch is not None:
                self.watch()
            self.display.tick()
            wait = _TICK
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LaunchTimeoutError(timeout)  # type: ignore[arg-type]
                wait = min(wait, left)
            self.poll(wait)

    def supervise(self, timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        problem = self.await_answers(self.ranks, deadline, timeout)
        if problem is not None:
            self.stop(grace=2.0)
            # A failure seen later may be the consequence of an earlier one elsewhere.
            raise self.first_problem() or problem
        # Every rank has answered: let them finish exiting, then relay their last lines.
        self.wait_for_exits(_EXIT_GRACE)
        self._drain(time.monotonic() + _DRAIN)
        return [self._value(r.result) for r in self.ranks]  # type: ignore[arg-type]

    def wait_for_exits(self, seconds: float) -> None:
        """Relay until every worker has exited, ``seconds`` at most."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not all(r.exited for r in self.ranks):
            self.poll(0.05)

    # -- [session] the same workers, task after task (session.py) ---------------------------
    def retarget(
        self, display: Display, watch: Watch = None, payload: Payload | None = None
    ) -> None:
        """The next task's output goes to ``display``, its waits call ``watch``, and its
        results unpack against ``payload`` (its shipment); a closing session's: no watch."""
        self.display, self.watch = display, watch
        if payload is not None:
            self.payload = payload

    def send(self, rank: int, data: bytes) -> None:
        """A command to ``rank``'s worker (rank/serve.py: a pickled task; ``b""``: leave).

        Raises:
            OSError: the worker is gone.
        """
        self.commands[rank].send_bytes(data)

    def ask_to_leave(self) -> None:
        """Every worker still there is asked to leave its process group and exit."""
        for rank in self.commands:
            with contextlib.suppress(OSError):
                self.send(rank, b"")

    def answered(self, ranks: list[Rank]) -> bool:
        """Whether each of ``ranks`` has sent its Result or Failure."""
        return all(r.result is not None or r.failure is not None for r in ranks)

    def wait_answered(self, ranks: list[Rank], seconds: float) -> bool:
        """Relay until every one of ``ranks`` answered (True), or a death or ``seconds``."""
        end = time.monotonic() + seconds
        while not self.ended():
            if self.answered(ranks):
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.poll(min(left, 0.05))
        return False

    def ended(self) -> bool:
        """Whether a worker ended (seen now: a sentinel is ready even while idle)."""
        self.poll(0)
        return any(r.died_at is not None or r.exited for r in self.ranks)

    def interrupt(self, ranks: list[Rank]) -> None:
        """SIGINT to each of ``ranks`` still at work: a KeyboardInterrupt in its code."""
        for rank in ranks:
            pid = rank.process.pid
            if rank.result is None and rank.failure is None and pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)

    def flush_output(self) -> None:
        """Relay what the workers wrote before they answered, partial last lines too."""
        for rank in self.ranks:
            for stream in ("stdout", "stderr"):
                conn = rank.pipe(stream)
                while stream in rank.open_streams and conn.poll(0):
                    self._handle(rank, stream)
                self._relay(rank, stream, len(rank.held[stream]))
                self.display.end(rank.rank, stream)

    def forget_answers(self) -> None:
        """A task is over: a later ending of a rank without an answer is a death."""
        for rank in self.ranks:
            rank.result = rank.failure = None

    def _value(self, result: Result) -> Any:
        if self.payload.shipment is None:
            return pickle.loads(result.value)
        return unpack(self.payload.shipment, result)

    def _drain(self, until: float) -> None:
        """Relay the output the workers wrote before they ended."""
        while any(r.open_streams for r in self.ranks) and time.monotonic() < until:
            self.poll(max(0.0, min(_TICK, until - time.monotonic())))

    # -- stopping ---------------------------------------------------------------------------
    def stop(self, grace: float) -> None:
        """SIGTERM every worker's process group, SIGKILL what is left after ``grace``."""
        if self._stopping_since is None:
            self._stopping_since = time.time()
        alive = [r for r in self.ranks if r.process.exitcode is None]
        for rank in alive:
            _signal_group(rank.process, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(r.process.exitcode is None for r in alive):
            self.poll(0.05)
        for rank in self.ranks:
            _signal_group(rank.process, signal.SIGKILL)
        for rank in self.ranks:
            rank.process.join(timeout=2.0)
            if rank.process.exitcode is not None:
                rank.exited = True
        self._drain(time.monotonic() + 0.3)

    def close(self) -> None:
        """Release every pipe, and stop whatever a worker started and left behind."""
        for rank in self.ranks:
            if rank.process.exitcode is None:
                _signal_group(rank.process, signal.SIGKILL)
                rank.process.join(timeout=2.0)
            # A worker's group outlives it while something it started (a DataLoader worker,
            # a subprocess) still runs; the group id stays reserved until then.
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
                os.killpg(rank.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
            for conn in (rank.messages, rank.stdout, rank.stderr, rank.lifeline):
                self._unregister(conn)
                conn.close()
            self._unregister(rank.process.sentinel)
            with contextlib.suppress(ValueError, AttributeError):
                rank.process.close()
            for stream in ("stdout", "stderr"):
                self._relay(rank, stream, len(rank.held[stream]))
            self.display.end(rank.rank, "stdout")
            self.display.end(rank.rank, "stderr")
        for conn in self.commands.values():
            conn.close()
        self.selector.close()

    def run(self, timeout: float | None) -> list[Any]:
        try:
            self.start()
            return self.supervise(timeout)
        except BaseException as exc:
            if self.before_stop is not None:
                self.before_stop(exc)
            # KeyboardInterrupt included: every worker stops within the grace, then SIGKILL.
            self.stop(grace=1.0)
            raise
        finally:
            self.close()
            if self._pooled():
                idle_pool.fill(self.ctx, self.layout.num_processes)  # for the next launch


def _read(conn: Connection) -> bytes:
    try:
        return os.read(conn.fileno(), 1 << 16)
    except OSError:
        return b""
