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
  Progress              -> display.progress
  Metrics, Health       -> display.metrics (live chart), display.health (panel rows)
  Result                -> results[rank] (large buffers mapped from shared memory)
  Failure               -> stop the others, re-raise the earliest failure
  a worker's sentinel   -> died without a message? WorkerDiedError
  deadline              -> LaunchTimeoutError
  KeyboardInterrupt     -> stop everyone, re-raise
finally: SIGTERM -> grace -> SIGKILL to each worker's process group; close every fd and
         the store, so nothing outlives the call; then (a background thread) idle workers
         forked for the next launch (IdlePool).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import inspect
import multiprocessing
import os
import pickle
import selectors
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.context import set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

from .. import env
from ..errors import LaunchTimeoutError, WorkerDiedError
from ..reporting.channel import Failure, Health, Metrics, Progress, Result, receive
from . import worker as worker_module
from .display import Display
from .outcome import is_collateral, rebuild
from .payload import Payload
from .transport import unpack

__all__ = ["Engine", "IdlePool", "Layout", "context", "idle_pool", "warm_up", "warm_up_early"]

_PRELOAD = [
    "torch",
    "torch.distributed",
    "notebook_accel.launch.worker",
    "notebook_accel.launch.serve",  # a session's workers (launch/session.py)
    "notebook_accel.launch.worker_store",
    "notebook_accel.reporting.progress",
    "notebook_accel.seeding",
    "notebook_accel.reporting.live",
    "numpy.random",  # imported lazily by numpy: each worker seeds it (fresh_seeds)
    # What a training function imports first: ~70 ms per worker per launch otherwise (it
    # starts no thread and touches no device; the first launch pays it once, in the server).
    "notebook_accel.training.accelerator",
]
_TICK = 0.25  # seconds between checks when nothing arrives
_DRAIN = 1.0  # seconds to wait for output after a worker ended
# A collective's error on one rank is often the echo of a peer's death that the parent has not
# seen yet (a loaded machine); this long it waits for the cause before stopping the others.
_CAUSE_WAIT = 3.0
_EXIT_GRACE = 5.0  # seconds a worker that returned its result gets to exit by itself
_MAX_IDLE = 64  # pre-forked workers kept at most


def context(method: str = "auto") -> multiprocessing.context.BaseContext:
    """A forkserver context that imported torch once; spawn where there is no forkserver."""
    if method == "auto":
        method = (
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else ("spawn")
        )
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def warm_up(method: str = "auto") -> None:
    """Start the forkserver now, so that it imports torch while the parent prepares."""
    ctx = context(method)
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


_early: threading.Thread | None = None
_early_lock = threading.Lock()


def warm_up_early() -> threading.Thread | None:
    """Get the forkserver ready before the first launch, once: the launcher was just imported.

    Where this process imported torch already and has not initialised CUDA (nor torch_xla),
    and runs on the main thread of a notebook (``__main__`` without a file) on Linux, the
    forkserver is a zygote: a fork of this process (``_start_zygote``: torch is there at
    once). Elsewhere, or with CUDA in use here (a fork could not use it), it is a fresh
    interpreter started from a background thread, which imports torch and the worker's
    modules (the 2-4 s a first launch would otherwise wait for) while the notebook goes on.
    Either way two idle workers follow (IdlePool); nothing is printed, and they all end
    with this process (their pipes close). Not in a worker (a function that imports the
    launcher), and not with ``NOTEBOOK_ACCEL_NO_WARMUP=1``. Returns the background thread
    (None when nothing was started).
    """
    global _early
    if env.warmup_disabled() or env.get("RANK") is not None:
        return None
    with _early_lock:
        if _early is not None:
            return _early
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return None
        if _zygote_allowed():
            with contextlib.suppress(OSError):
                _start_zygote()

        def start() -> None:
            with contextlib.suppress(Exception):  # the first launch starts it (and says why)
                warm_up("forkserver")
                # Workers for a first launch of the default size (2 CPU processes): forked
                # once the server has imported torch, if the launch has not come first.
                idle_pool.fill(context("forkserver"), 2)

        _early = threading.Thread(target=start, name="notebook-accel-warm-up", daemon=True)
        _early.start()
        return _early


def _cuda_initialised() -> bool:
    """CUDA (or torch_xla) in use in this process: its forks could not use the device."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    in_use = bool(cuda is not None and cuda.is_initialized())
    return in_use or "torch_xla" in sys.modules


def _zygote_allowed() -> bool:
    return (
        sys.platform.startswith("linux")
        and "torch" in sys.modules
        and not _cuda_initialised()
        and not _main_has_file()
        and threading.current_thread() is threading.main_thread()
    )


def _start_zygote() -> None:
    """Fork this process as the forkserver (multiprocessing's, its bookkeeping as its own
    start would leave it): it has torch imported already, so it serves at once."""
    from multiprocessing import connection, forkserver, resource_tracker, util

    server: Any = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            return
        # Python 3.14: a connection to the forkserver proves a key that its main() reads from
        # a pipe at start (authkey_r); a forkserver without that argument: the fresh one.
        keyed = hasattr(server, "_forkserver_authkey")
        if keyed and "authkey_r" not in inspect.signature(forkserver.main).parameters:
            return
        resource_tracker.ensure_running()
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener = socket.socket(socket.AF_UNIX)
        key = os.urandom(getattr(forkserver, "_AUTHKEY_LEN", 32)) if keyed else None
        key_r = None
        try:
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            if key is not None:
                key_r, key_w = os.pipe()
                os.write(key_w, key)  # a pipe's buffer holds it: the zygote reads it later
                os.close(key_w)
            alive_r, alive_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                _zygote(listener.fileno(), alive_r, alive_w, key_r)
            os.close(alive_r)
        finally:
            listener.close()
            if key_r is not None:
                os.close(key_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
        if key is not None:
            server._forkserver_authkey = key


def _as_a_fresh_interpreter() -> None:
    """Undo in the zygote what a kernel installed in its interpreter, so that its workers
    start as a fresh forkserver's do: the hooks, the running event loop, IPython's shell."""
    sys.displayhook = sys.__displayhook__  # a session cell's last value goes through it
    sys.excepthook = sys.__excepthook__
    sys.breakpointhook = sys.__breakpointhook__
    sys.unraisablehook = sys.__unraisablehook__
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:  # the kernel's event loop is running this cell: not here
        asyncio.events._set_running_loop(None)
        asyncio.set_event_loop_policy(None)
    if "IPython" in sys.modules:  # get_ipython() is None in a worker (tqdm.auto, ...)
        import builtins

        with contextlib.suppress(Exception):
            from IPython.core.interactiveshell import InteractiveShell

            InteractiveShell.clear_instance()
        for name in ("get_ipython", "display", "__IPYTHON__"):
            builtins.__dict__.pop(name, None)


def _zygote(listener: int, alive_r: int, alive_w: int, key_r: int | None) -> NoReturn:
    """The forked child: nothing of the notebook's but its memory, then forkserver.main."""
    try:
        # The notebook's objects are never collected here: a socket's finalizer would close
        # an fd number that is someone else's now.
        gc.freeze()
        os.close(alive_w)
        keep = {0, 1, 2, listener, alive_r, key_r}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))  # the kernel's sockets, pipes and files
        # The notebook's streams relay through threads that do not exist here.
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _as_a_fresh_interpreter()
        from multiprocessing import forkserver

        keyword: dict[str, Any] = {} if key_r is None else {"authkey_r": key_r}
        forkserver.main(listener, alive_r, _PRELOAD, **keyword)
    finally:
        os._exit(0)


class _Handover:
    """Collects the fds a pickle refers to, as multiprocessing's forkserver start does (its
    DupFd role): they travel beside the pickle, which names each by its place (Passed)."""

    DupFd = worker_module.Passed

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1


def _hand_over(
    control: Connection, name: str, entry: Callable[..., None], args: tuple[Any, ...]
) -> None:
    """Give a pre-forked worker its launch: the fds, then the pickle (worker.idle)."""
    handover = _Handover()
    set_spawning_popen(handover)  # type: ignore[arg-type]  # its DupFd role only
    try:
        data = reduction.ForkingPickler.dumps((name, entry, args))
    finally:
        set_spawning_popen(None)
    control.send_bytes(str(len(handover.fds)).encode())
    with socket.socket(fileno=os.dup(control.fileno())) as sock:
        reduction.sendfds(sock, handover.fds)
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

    def take(self) -> tuple[BaseProcess, Connection] | None:
        """A live idle worker and its control pipe, or None."""
        with self._lock:
            while self._ready:
                process, control = self._ready.pop(0)
                # An idle worker never writes: something to read is the EOF of its death.
                if process.exitcode is None and not _readable(control):
                    return process, control
                _discard(process, control)
        return None

    def fill(self, ctx: multiprocessing.context.BaseContext, size: int) -> None:
        """Fork idle workers up to ``size`` in the background (at most one filling at once)."""
        if ctx.get_start_method() != "forkserver" or _main_has_file():
            return
        size = min(size, _MAX_IDLE)
        with self._lock:
            if self._closed or (self._filling is not None and self._filling.is_alive()):
                return
            if not self._exit_hook:
                atexit.register(self.close)
                self._exit_hook = True
            self._filling = threading.Thread(
                target=self._fill, args=(ctx, size), name="notebook-accel-idle", daemon=True
            )
            self._filling.start()

    def _fill(self, ctx: multiprocessing.context.BaseContext, size: int) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._ready) >= size:
                    return
            theirs, ours = ctx.Pipe(duplex=True)
            with self._lock:
                self._starting = ours
            # Daemonic while idle: an interpreter's exit ends it without waiting (a worker
            # that got a launch is an ordinary process again, worker.idle).
            process = ctx.Process(  # type: ignore[attr-defined]
                target=worker_module.idle,
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
                self._ready.append((process, ours))

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
            _discard(process, None)


def _discard(process: BaseProcess, control: Connection | None) -> None:
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
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _readable(control: Connection) -> bool:
    try:
        return control.poll(0)
    except OSError:
        return True


def _main_has_file() -> bool:
    main = sys.modules.get("__main__")
    return getattr(main, "__file__", None) is not None


idle_pool = IdlePool()


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Start processes without multiprocessing re-running the caller's script in each worker.

    The function travels by value (cloudpickle), so workers never need ``__main__``; without
    this, ``python train.py`` would have every worker execute train.py again as ``__mp_main__``.
    """
    real = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if real is not None:
            sys.modules["__main__"] = real


@dataclass(frozen=True)
class Layout:
    """Where this machine's ranks sit in the job."""

    num_processes: int
    node_rank: int = 0
    num_nodes: int = 1
    device_type: str = "cpu"
    backend: str = "gloo"
    master_addr: str = "127.0.0.1"
    extra_env: tuple[tuple[str, str], ...] = ()

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes

    def worker_env(self, local_rank: int, port: int) -> env.WorkerEnv:
        return env.WorkerEnv(
            rank=self.node_rank * self.num_processes + local_rank,
            local_rank=local_rank,
            world_size=self.world_size,
            local_world_size=self.num_processes,
            node_rank=self.node_rank,
            master_addr=self.master_addr,
            master_port=port,
            device_type=self.device_type,
            backend=self.backend,
            loopback=self.num_nodes == 1,
            extra=self.extra_env,
        )


@dataclass
class _Rank:
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
    """One launch on this machine: ``run()`` returns every local rank's result, in order."""

    # What each worker process runs; a session's workers run launch/serve.py's loop instead.
    entry: Callable[..., None] = staticmethod(worker_module.main)

    def __init__(
        self,
        layout: Layout,
        payload: Payload,
        display: Display,
        port: int,
        start_method: str = "auto",
        watch: Callable[[], None] | None = None,
    ) -> None:
        self.layout = layout
        # Called every tick while waiting; raising from it stops the launch (another machine
        # of the group restarted or failed, see group.py).
        self.watch = watch
        self.payload = payload
        self.display = display
        self.port = port
        self.ctx = context(start_method)
        self.ranks: list[_Rank] = []
        self._stopping_since: float | None = None
        self.selector = selectors.DefaultSelector()

    # -- starting ---------------------------------------------------------------------------
    def _start_one(self, local_rank: int, *extra: Connection) -> _Rank:
        """Start one worker; ``extra`` are more child ends for the entry (passed, then closed)."""
        pipe = self.ctx.Pipe
        msg_r, msg_w = pipe(duplex=False)
        out_r, out_w = pipe(duplex=False)
        err_r, err_w = pipe(duplex=False)
        life_r, life_w = pipe(duplex=False)
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
        rank = _Rank(worker_env.rank, proc, msg_r, out_r, err_r, life_w)
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
                _hand_over(control, name, self.entry, args)
            except OSError:
                _discard(process, control)  # it died a moment ago: the next one
                continue
            control.close()
            process.name = name
            return process
        return None

    def start(self) -> None:
        with _main_hidden():
            for local_rank in range(self.layout.num_processes):
                self.ranks.append(self._start_one(local_rank))
                self.display.rank_state(self.ranks[-1].rank, "running")

    # -- supervising ------------------------------------------------------------------------
    def _handle(self, rank: _Rank, what: str) -> None:
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

    def _read_messages(self, rank: _Rank) -> None:
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
    def _relay(self, rank: _Rank, stream: str, count: int, data: bytes | None = None) -> None:
        """Feed the display ``count`` bytes of held (then new) output; hold the rest."""
        buffered = rank.held[stream] + (data or b"")
        out, rank.held[stream] = buffered[:count], buffered[count:]
        if out:
            rank.relayed[stream] += len(out)
            self.display.feed(rank.rank, stream, out)

    def _catch_up(self, rank: _Rank, marks: tuple[int, int]) -> None:
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

    def _dispatch(self, rank: _Rank, message: Any) -> None:
        if isinstance(message, Result):
            rank.result = message
            self.display.rank_state(rank.rank, "finished")
        elif isinstance(message, Failure):
            rank.failure = message
            self.display.rank_state(rank.rank, "failed")
        elif isinstance(message, Progress):
            self.display.progress(rank.rank, message)
        elif isinstance(message, Metrics):
            self.display.metrics(rank.rank, message)
        elif isinstance(message, Health):
            self.display.health(rank.rank, message)

    def _unregister(self, fileobj: Any) -> None:
        if isinstance(fileobj, Connection) and fileobj.closed:
            return  # closed connections were unregistered when they closed
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selector.unregister(fileobj)

    def _poll(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            rank, what = key.data
            self._handle(rank, what)

    def _first_problem(self) -> BaseException | None:
        """The root cause among the failures and deaths seen so far.

        A rank whose peer died often fails a moment later inside a collective ("Connection
        closed by peer"); such a failure is collateral and yields to the death or failure
        that caused it. Ranks that ended after the launcher began stopping them do not count.
        """
        candidates: list[tuple[bool, float, _Rank]] = []
        for rank in self.ranks:
            if rank.failure is not None:
                candidates.append((is_collateral(rank.failure), rank.failure.time, rank))
            elif rank.died_at is not None and (
                self._stopping_since is None or rank.died_at < self._stopping_since
            ):
                candidates.append((False, rank.died_at, rank))
        if not candidates:
            return None
        _, _, first = min(candidates, key=lambda c: (c[0], c[1]))
        if first.failure is not None:
            return rebuild(first.rank, first.failure, self.layout.world_size, self.payload)
        code = first.process.exitcode
        return WorkerDiedError(first.rank, code if code is not None else -signal.SIGKILL)

    def _awaiting_cause(self) -> bool:
        """Only collateral failures so far, the first of them under ``_CAUSE_WAIT`` s ago."""
        failures = [r.failure for r in self.ranks if r.failure is not None]
        if not failures or any(r.died_at is not None for r in self.ranks):
            return False
        if not all(is_collateral(failure) for failure in failures):
            return False
        return time.time() - min(failure.time for failure in failures) < _CAUSE_WAIT

    def await_answers(
        self, ranks: list[_Rank], deadline: float | None, timeout: float | None
    ) -> BaseException | None:
        """Relay output until each of ``ranks`` has sent its Result: ``None`` then.

        Returns the root cause as soon as a rank failed or died (nothing is stopped here);
        raises LaunchTimeoutError (``timeout``, the user's figure) at ``deadline``, and
        whatever ``watch`` raises.
        """
        while True:
            problem = self._first_problem()
            if problem is not None and self._awaiting_cause():
                self._poll(0.05)
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
            self._poll(wait)

    def supervise(self, timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        problem = self.await_answers(self.ranks, deadline, timeout)
        if problem is not None:
            self.stop(grace=2.0)
            # A failure seen later may be the consequence of an earlier one elsewhere.
            raise self._first_problem() or problem
        # Every rank has answered: let them finish exiting, then relay their last lines.
        end = time.monotonic() + _EXIT_GRACE
        while time.monotonic() < end and not all(r.exited for r in self.ranks):
            self._poll(0.05)
        self._drain(time.monotonic() + _DRAIN)
        return [self._value(r.result) for r in self.ranks]  # type: ignore[arg-type]

    def _value(self, result: Result) -> Any:
        if self.payload.shipment is None:
            return pickle.loads(result.value)
        return unpack(self.payload.shipment, result)

    def _drain(self, until: float) -> None:
        """Relay the output the workers wrote before they ended."""
        while any(r.open_streams for r in self.ranks) and time.monotonic() < until:
            self._poll(max(0.0, min(_TICK, until - time.monotonic())))

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
            self._poll(0.05)
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
        self.selector.close()

    def run(self, timeout: float | None) -> list[Any]:
        try:
            self.start()
            return self.supervise(timeout)
        except BaseException:
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
