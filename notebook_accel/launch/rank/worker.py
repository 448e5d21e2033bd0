"""The worker's entry point (an importable module, so the forkserver can preload it).

forkserver child
  -> own process group (the parent stops the worker and anything it started at once)
  -> fd 1 and fd 2 -> the parent's output pipes (C code's writes are relayed too)
  -> lifeline thread: the parent died -> kill our process group
  -> environment := parent's environment + RANK/WORLD_SIZE/... (env.install)
  -> env:// meets in the launch's private store, NOTEBOOK_ACCEL_STORE (worker_store.route)
  -> random generators: fresh entropy, or the launch's seed
  -> where.arm: answers the launcher's "where are you" (signals; nothing runs until asked)
  -> a launch from a notebook: IPython's display machinery is the rank's own
     (reporting/shell.py: displays, library bars)
  -> live.start: the health thread; Accelerator.log rows batched to the parent
  -> map the payload's shared memory (copy-on-write), unpickle the call, run it
  -> Result(value; large buffers through shared memory) or Failure(exception)
  -> unlink the semaphores it created, os._exit

``start`` is everything before the call (a session's worker, serve.py, does it once and then
serves tasks), ``run_call`` the call itself, ``leave`` the exit.

A pre-forked worker (local/idle.py) waits first for the one launch it will serve (its fds,
then the pickled entry and arguments, from the launcher); then it is that launch's rank as
above.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import gc
import io
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from ... import env, launched
from ...errors import SharedMemoryError
from ...hardware import usable_cores
from ...launched import WorkerEnv
from ...private import accelerate as private_accelerate
from ...private import cpython
from ...quiet import quiet_torchao
from ...reporting import shell
from ...reporting.channel import Failure, Result, Sender
from ..wire.payload import Payload, load
from ..wire.pickling import dumps
from ..wire.transport import Shipment, pack
from .where import arm as answer_where

__all__ = [
    "call",
    "finish_distributed",
    "flush_all",
    "leave",
    "line_buffered_stdio",
    "main",
    "random_state",
    "run_call",
    "settle",
    "share_cpu_threads",
    "start",
    "wind_down",
]


def _redirect(conn: Connection, fd: int) -> None:
    os.dup2(conn.fileno(), fd)
    conn.close()


class _Counted(io.FileIO):
    """fd 1 or 2, counting the bytes Python writes: where a bar's message sits in the output."""

    written = 0

    def write(self, data: Any) -> int:
        n = super().write(data)
        self.written += n or 0
        return n or 0


def line_buffered_stdio() -> Callable[[], tuple[int, int]]:
    """Python and C streams flush each line, so the parent relays lines as they happen.

    Returns the output marks: flush Python's streams, then the bytes written so far to
    (stdout, stderr). A bar's or chart's message carries them, so that the parent shows the
    lines printed before it above the bar and the later ones below (launch/local/engine.py).
    """
    counted = (_Counted(1, "wb", closefd=False), _Counted(2, "wb", closefd=False))
    streams = tuple(
        io.TextIOWrapper(
            io.BufferedWriter(raw),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        for raw in counted
    )
    sys.stdout, sys.stderr = streams

    def marks() -> tuple[int, int]:
        for stream in streams:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        return counted[0].written, counted[1].written

    try:
        libc = ctypes.CDLL(None)
        for name in ("stdout", "stderr"):
            stream = ctypes.c_void_p.in_dll(libc, name)
            libc.setvbuf(stream, None, 1, 0)  # _IOLBF
    except (OSError, ValueError, AttributeError):
        pass  # not glibc: C output is relayed when its buffer fills or at exit
    return marks


def flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _watch_lifeline(lifeline: Connection) -> None:
    def watch() -> None:
        try:
            lifeline.recv_bytes()
        except (EOFError, OSError):
            pass
        # The parent is gone (or asked us to stop): take our children with us.
        os.killpg(os.getpgrp(), signal.SIGKILL)

    # A bare thread: threading's start() waits until the new thread runs (a few ms on a busy
    # machine, on every launch's path); this one needs no handshake.
    _thread.start_new_thread(watch, ())


def share_cpu_threads(worker: WorkerEnv, environ: dict[str, str]) -> None:
    """Share the cores between the workers instead of each one using all of them.

    ``OMP_NUM_THREADS`` as it is at launch time wins. OpenMP reads the variable once, when the
    forkserver loaded torch, so a value set in a later cell is applied here by hand instead of
    restarting the forkserver (which would cost every later launch its warm start).
    """
    import torch

    wanted = environ.get("OMP_NUM_THREADS", "").strip()
    if wanted.isdigit() and int(wanted) > 0:
        torch.set_num_threads(int(wanted))
        return
    if worker.device_type != "cpu" or wanted:
        return
    torch.set_num_threads(max(1, usable_cores() // worker.local_world_size))


def random_state() -> None:
    """Fresh generators for each worker of each launch; the launch's seed when one was given.

    Forked workers would all start from the forkserver's generator states (the same dropout
    masks on every rank, and a re-run cell repeating the last one exactly).
    """
    from ...seeding import fresh_seeds, set_seed

    seed = launched.option("seed")
    if seed is not None:
        set_seed(seed)  # the same on every rank, as Accelerator() does with it
    else:
        fresh_seeds()


def finish_distributed() -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        # Leave together: init_process_group can return on one rank while a peer is still
        # completing its gloo handshakes, and a rank that exits then closes its sockets under
        # that peer ("Gloo connectFullMesh failed ... Connection closed by peer").
        dist.barrier()
        dist.destroy_process_group()


def _plain_start_method() -> None:
    """Give the function the start method a plain process (or torchrun's) has: fork on Linux.

    A forkserver child inherits "forkserver" as its default, so a DataLoader with workers
    would pickle its dataset (a cell-defined class does not pickle by reference) and start
    yet another forkserver; and its queues' named semaphores would outlive a killed worker
    (fork unlinks them at once, so a kill leaks nothing).
    """
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)


def _release_semaphores() -> None:
    """Unlink the named semaphores this worker created, as a normal interpreter exit would.

    The worker leaves with ``os._exit``, which skips multiprocessing's finalizers; a semaphore
    still referenced then (tqdm keeps a multiprocessing lock on its class) stays registered with
    the resource tracker, which prints "leaked semaphore objects" when the notebook exits.
    Only semaphore finalizers run here: others (pools, queues) could block the exit.
    """
    for finalizer in cpython.semaphore_finalizers():
        with contextlib.suppress(Exception):
            finalizer()


def _pack(shipment: Shipment | None, value: object) -> Result:
    if shipment is None:  # no transport: everything inside the pickle
        return Result(dumps(value, placement="same", limit=sys.maxsize).data)
    return pack(shipment, value)


def call(payload: Payload, setup: Callable[[], None] | None = None) -> Result | Failure:
    """Run the launch's function in this rank: its packed result, or how it failed.

    The rank's side of every backend (this module's ``main``, a cluster's rank tasks): ``setup``
    first, the generators seeded (random_state), then ``run_call``.
    """

    def before() -> None:
        if setup is not None:
            setup()
        random_state()

    return run_call(payload, before)


def run_call(
    payload: Payload,
    before: Callable[[], None] | None = None,
    bind: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    shipment: Shipment | None = None,
) -> Result | Failure:
    """``before()``, the call unpickled, ``bind(function)`` run, its value packed.

    ``bind`` gives a session's function its namespace (launch/rank/serve.py); the value goes
    through ``shipment`` (default: the payload's). ``sys.exit(0)`` (a ported script's ending)
    is a clean finish returning None; every other exception, KeyboardInterrupt too, is the
    rank's failure with its traceback starting at the user's frame.
    """
    try:
        if before is not None:
            before()
        function, args, kwargs = load(payload)
        if bind is not None:
            function = bind(function)
        with shell.cell():  # IPython's cell events (matplotlib shows what is left open)
            value = function(*args, **kwargs)
        try:
            return _pack(shipment or payload.shipment, value)
        except SharedMemoryError:
            raise
        except Exception as exc:
            raise TypeError(
                f"the function returned {type(value).__qualname__}, which cannot be pickled "
                f"back to the notebook ({exc}); return plain data (numbers, lists, tensors)."
            ) from exc
    except SystemExit as exc:
        if exc.code in (None, 0):
            return Result(pickle.dumps(None))
        return Failure.from_exception(exc)
    except BaseException as exc:  # KeyboardInterrupt too: the parent decides what it means
        if exc.__traceback__ is not None and exc.__traceback__.tb_next is not None:
            exc = exc.with_traceback(exc.__traceback__.tb_next)  # start at the user's frame
        return Failure.from_exception(exc)


def settle(environ: dict[str, str], worker: WorkerEnv) -> None:
    """This process becomes ``worker``'s rank: what a caller it was forked from noted is
    forgotten (accelerate's process-wide state; ours, through launched.py's callbacks), the
    launch is this process's, its environment ``environ`` plus the rank's variables."""
    # A fork of a caller that built an Accelerator (ours or accelerate's) inherits what it
    # noted: this is a new process, in a new job.
    private_accelerate.forget_state()
    launched.become_rank(worker.launch)
    env.install(environ, worker.variables())


def start(
    worker: WorkerEnv,
    payload: Payload,
    conn: Connection,
    out_w: Connection,
    err_w: Connection,
    lifeline: Connection,
) -> Sender:
    """What a rank sets up before it runs anything; returns its end of the message pipe."""
    # Everything inherited from the forkserver (torch and its modules) lives for the worker's
    # whole life: take it out of the cyclic collector's view. Otherwise the first full
    # collection after the fork walks that whole heap (~100 ms on every launch, measured) and
    # writes to its object headers, copying shared pages.
    gc.freeze()
    os.setpgrp()
    _redirect(out_w, 1)
    _redirect(err_w, 2)
    marks = line_buffered_stdio()
    _watch_lifeline(lifeline)
    _plain_start_method()
    settle(payload.environ, worker)
    from .worker_store import route  # imports torch.distributed: not in the notebook

    route()
    quiet_torchao()
    sender = Sender(conn, marks)
    answer_where(sender)  # [stall report] where this rank is, when the launcher asks
    from ...reporting import live, progress

    progress.attach(sender)
    if payload.displays:  # a notebook's launch: what the rank displays goes to its cell
        shell.install(sender)
    live.start(sender)  # [metrics] rank 0's log() rows and every rank's health, to the parent
    return sender


def leave(conn: Connection, failed: bool) -> NoReturn:
    """Close the message pipe, unlink leftover semaphores, and exit at once."""
    conn.close()
    with contextlib.suppress(Exception):
        _release_semaphores()
    # Leave now. multiprocessing's own exit would wait for any non-daemon thread the function
    # left running (a hang) and join its child processes; the parent stops this process
    # group, so whatever the function started goes with it.
    os._exit(1 if failed else 0)


def wind_down(failed: bool) -> None:
    """The end of a rank's work: reporting stops (the last logged rows leave first), the
    process group is left together unless the rank failed, and the output is flushed."""
    from ...reporting import live, progress

    progress.detach()
    live.stop()
    if not failed:
        with contextlib.suppress(Exception):
            finish_distributed()
    flush_all()


def main(worker: WorkerEnv, payload: Payload, *pipes: Connection) -> None:
    """Run one rank of a launch. Called by ``multiprocessing`` in the child process.

    ``pipes``: the child ends ``start`` takes (messages, stdout, stderr, lifeline).
    """
    sender = start(worker, payload, *pipes)
    outcome = call(payload, setup=lambda: share_cpu_threads(worker, payload.environ))
    failed = isinstance(outcome, Failure)
    if failed:
        sender.send(outcome)  # at once: the parent stops the other ranks
    wind_down(failed)
    if not failed:
        # The result goes last, after every line this rank printed has reached its pipe.
        sender.send(outcome)
    leave(pipes[0], failed)
