"""How this machine's workers start: multiprocessing's forkserver, a fork of the caller.

    the launcher imported (warm_up_early)       a notebook (``__main__`` without a file):
                                                  the main thread, Linux, torch imported,
                                                  CUDA not in use here: the zygote, a fork
                                                  of this process (its fds closed, its heap
                                                  frozen) running multiprocessing's
                                                  forkserver loop
                                                  else a daemon thread: warm_up(), a fresh
                                                  interpreter importing _PRELOAD
                                                  then two idle workers (idle.py)
                                                a script: nothing yet (its launch forks it)
    a cell's end (IPython's post_run_cell)      renew(): the zygote forked again where this
    a launch (warm_up, context)                 process has imported modules it lacks
                                                (``stale``); the old one retired, its idle
                                                workers dropped; at a launch, the forkserver
                                                started if it is off or died (a zygote where
                                                one is allowed); spawn where there is none

A zygote is renewed, not taught: a fork of the caller has every module it imported (a
library's import costs seconds, a fork of the caller tens of milliseconds) and its workers
start as accelerate's forked ones would, without the caller's threads, fds, CUDA, OpenMP
thread pool (the fork is made by a thread that never ran a parallel region) or mappings of
the launches' shared memory (wire/shm.unmap_inherited). Modules
of the standard library, the launcher's own and a kernel's machinery are not counted (cheap
to import where used, or never used by a worker). A retired server lives while it has
children (a session's workers, a launch running in the background): their exit statuses
come through it.

Workers never need the caller's ``__main__`` (the function travels by value):
``main_hidden`` keeps multiprocessing from running a script again in each of them.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import multiprocessing
import os
import signal
import socket
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from ... import env
from ...private import cpython
from ...reporting import shell as rank_shell
from ..wire.payload import in_a_kernel
from . import own_data
from .idle import idle_pool, main_has_file

__all__ = ["context", "main_hidden", "renew", "stale", "starting", "warm_up", "warm_up_early"]

_PRELOAD = [
    "torch",
    "torch.distributed",
    "notebook_accel.launch.rank.worker",
    "notebook_accel.launch.rank.serve",  # a session's workers (local/session.py)
    "notebook_accel.launch.rank.worker_store",
    "notebook_accel.launch.local.idle",  # a pre-forked worker's wait (idle.py)
    "notebook_accel.reporting.progress",
    "notebook_accel.seeding",
    "notebook_accel.reporting.live",
    "numpy.random",  # imported lazily by numpy: each worker seeds it (fresh_seeds)
    # What a training function imports first: ~70 ms per worker per launch otherwise (it
    # starts no thread and touches no device; the first launch pays it once, in the server).
    "notebook_accel.training.accelerator",
]
# A notebook's ranks get a display shell (reporting/shell.py) and tqdm's notebook bar made to
# report (~250 ms of imports per worker otherwise): a fresh server imports them once.
_NOTEBOOK_PRELOAD = ["IPython.core.interactiveshell", "IPython.display", "tqdm.notebook"]


def context(method: str = "auto") -> multiprocessing.context.BaseContext:
    """A forkserver context that imported torch once; spawn where there is no forkserver."""
    if method == "auto":
        method = (
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else ("spawn")
        )
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD + (_NOTEBOOK_PRELOAD if in_a_kernel() else []))
    return ctx


def warm_up(method: str = "auto") -> None:
    """A launch's forkserver: a zygote of this process where one is allowed and the current
    server lacks modules imported here (``renew``), else multiprocessing's own, started if it
    is off or died (a fresh interpreter that imports torch while the parent prepares)."""
    ctx = context(method)
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        global _known
        renew(wait=True)
        before = cpython.forkserver_pid()
        forkserver.ensure_running()
        if cpython.forkserver_pid() != before:
            _known = frozenset()  # a fresh one: a zygote replaces it once one is allowed


# -- the zygote follows the caller's imports ----------------------------------------------

# Top-level packages whose modules do not make a zygote stale: the launcher's own, and a
# kernel's machinery (its workers never use them); the standard library's are added below.
_NOT_COUNTED = frozenset(
    {
        "notebook_accel", "IPython", "ipykernel", "ipywidgets", "jupyter_client",
        "jupyter_core", "zmq", "tornado", "traitlets", "comm", "jedi", "parso", "debugpy",
        "prompt_toolkit", "pygments", "matplotlib_inline", "pydevd", "_pydevd_bundle",
        "_pydev_bundle", "google", "colab_kernel_launcher", "nbclient", "nbformat",
    }
)  # fmt: skip
_counted_roots: dict[str, bool] = {}

# The module names this process had when its current forkserver was made (a zygote: all of
# them are there; a fresh one: it imported torch and _PRELOAD only); None: none made here.
_known: frozenset[str] | None = None
# Replaced servers that still have children: (pid, write end of their alive pipe).
_retired: list[tuple[int, int]] = []
# Held while a launch hands its ranks to workers: a renewal waits (at a launch) or skips (at
# a cell's end) rather than swap the server under a start (3.14: its address and key).
_starts = threading.Lock()


def _counted(name: str) -> bool:
    root = name.partition(".")[0]
    counted = _counted_roots.get(root)
    if counted is None:
        stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
        counted = root not in _NOT_COUNTED and root not in stdlib and root != "__main__"
        _counted_roots[root] = counted
    return counted


def stale() -> list[str]:
    """The modules imported here that the current forkserver was made without ([] where
    none was made here), standard library's and the launcher's own not counted."""
    known = _known
    if known is None:
        return []
    return sorted(n for n in sys.modules.copy() if n not in known and _counted(n))


def starting() -> threading.Lock:
    """Held while a launch starts its workers (engine.py): the server stays the same."""
    return _starts


def renew(wait: bool = False) -> bool:
    """Fork this process again as the forkserver where the current one was made without
    modules imported here since, or none runs (a script's first launch): where a zygote is
    allowed (``_zygote_allowed``). The old server is retired and its idle workers dropped;
    the pool is filled again from the new one. ``wait``: for a launch's start under way
    (else a renewal then is skipped: the next cell's end or launch does it). Whether a new
    zygote serves now."""
    _reap_retired()
    if not _zygote_allowed(scripts=True):
        return False
    running = cpython.forkserver_pid() is not None
    if running and (_known is None or not stale()):
        return False
    if not _starts.acquire(blocking=wait):
        return False
    try:
        # What the zygote would import before serving (forkserver.main's preload), imported
        # here once: every renewed zygote then serves at once (its first fork: 82 -> 37 ms
        # with transformers imported, measured), the first one paying ~50 ms here.
        for name in _PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        with contextlib.suppress(OSError):
            if _start_zygote(replace=True):
                idle_pool.renewed(context("forkserver"))
                return True
        return False
    finally:
        _starts.release()


def _after_cell(*_: Any) -> None:
    """IPython's post_run_cell: a cell that imported a library renews the zygote now, so
    that the next launch finds it (and its idle workers) ready."""
    with contextlib.suppress(Exception):  # never in the way of the notebook
        if cpython.forkserver_pid() is not None:
            renew()


def _watch_cells() -> None:
    """Have IPython call ``_after_cell`` after each cell (where this runs in a shell)."""
    shell = None
    if "IPython" in sys.modules:
        with contextlib.suppress(Exception):
            from IPython import get_ipython

            shell = get_ipython()
    events = getattr(shell, "events", None)
    if events is not None:
        with contextlib.suppress(Exception):
            events.register("post_run_cell", _after_cell)


def _children(pid: int) -> bool:
    """Whether process ``pid`` has children (their statuses are not all collected yet)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False  # gone
    try:
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                if listing.read().strip():
                    return True
        return False
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: every process's parent
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    with open(f"/proc/{entry}/stat") as stat:
                        if int(stat.read().rpartition(")")[2].split()[1]) == pid:
                            return True
        return False


def _reap_retired() -> None:
    """End the retired servers whose children have all gone (EOF on their alive pipe)."""
    for pid, alive in list(_retired):
        if not _children(pid):
            _retired.remove((pid, alive))
            with contextlib.suppress(OSError):
                os.close(alive)
            # It exits at that EOF: collect its status off the notebook's thread.
            threading.Thread(target=_collect, args=(pid,), daemon=True).start()


def _collect(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


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
    if env.warmup_disabled() or env.in_a_rank():
        return None
    with _early_lock:
        if _early is not None:
            return _early
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return None
        if main_has_file():
            return None  # a script: its launch forks it, with all it imported by then
        _watch_cells()
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


def _zygote_allowed(scripts: bool = False) -> bool:
    """Linux, torch imported, CUDA (torch_xla) not in use here, the main thread; a notebook
    (``__main__`` without a file), or a script's launch (``scripts``)."""
    return (
        sys.platform.startswith("linux")
        and "torch" in sys.modules
        and not _cuda_initialised()
        and (scripts or not main_has_file())
        and threading.current_thread() is threading.main_thread()
    )


def _start_zygote(replace: bool = False) -> bool:
    """Fork this process as the forkserver (multiprocessing's, its bookkeeping as its own
    start would leave it): it has torch imported already, so it serves at once. With
    ``replace``, in place of a running one (retired). Whether it did."""
    global _known
    with cpython.forkserver_lock() as running:
        # Python 3.14: a connection to the forkserver proves a key that its main() reads from
        # a pipe at start (authkey_r); a forkserver without that argument: the fresh one.
        if (running and not replace) or not cpython.zygote_possible():
            return False
        old = (cpython.forkserver_pid(), cpython.forkserver_alive_fd()) if running else None
        modules = frozenset(sys.modules.copy())
        cpython.start_resource_tracker()
        address = cpython.unix_listener_address()
        listener = socket.socket(socket.AF_UNIX)
        key = cpython.new_forkserver_key()
        key_r = None
        try:
            listener.bind(address)
            if not cpython.is_abstract(address):
                os.chmod(address, 0o600)
            listener.listen()
            if key is not None:
                key_r, key_w = os.pipe()
                os.write(key_w, key)  # a pipe's buffer holds it: the zygote reads it later
                os.close(key_w)
            alive_r, alive_w = os.pipe()
            with own_data.left_out():  # the notebook's own large buffers stay here
                pid = _fork_from_a_fresh_thread(
                    lambda: _zygote(listener.fileno(), alive_r, alive_w, key_r)
                )
            os.close(alive_r)
        finally:
            listener.close()
            if key_r is not None:
                os.close(key_r)
        cpython.adopt_forkserver(address, alive_w, pid, key)
        _known = modules
        if old is not None and old[0] is not None and old[1] is not None:
            _retired.append((old[0], old[1]))
    return True


def _fork_from_a_fresh_thread(child: Callable[[], NoReturn]) -> int:
    """os.fork() called from a thread started for it: the child (whose one thread it is)
    runs ``child``; the parent gets the child's pid (OSError: the fork failed).

    GNU OpenMP (libgomp: torch's and MKL's CPU parallelism) keeps its thread pool in the
    state of the thread that ran a parallel region, and a fork has none of the pool's
    threads: a child forked by a thread that used it waits forever at its first parallel
    region (seen: a worker's first matmul, after the notebook's own). A thread that never
    ran one has no pool: the zygote, and every worker forked from it, starts its own.
    """
    outcome: list[int | OSError] = []

    def fork() -> None:
        try:
            pid = os.fork()
        except OSError as exc:
            outcome.append(exc)
            return
        if pid == 0:
            child()  # never returns
        outcome.append(pid)

    forker = threading.Thread(target=fork, name="notebook-accel-zygote", daemon=True)
    forker.start()
    forker.join()
    [result] = outcome
    if isinstance(result, OSError):
        raise result
    return result


def _as_a_fresh_interpreter() -> None:
    """Undo in the zygote what a kernel installed in its interpreter, so that its workers
    start as a fresh forkserver's do: the hooks, the running event loop, IPython's shell (a
    notebook's rank gets one of ours: reporting/shell.py, which keeps the kernel shell's
    formatters), the kernel itself (its Session and sockets: a fork must not send there)."""
    sys.displayhook = sys.__displayhook__  # a session cell's last value goes through it
    sys.excepthook = sys.__excepthook__
    sys.breakpointhook = sys.__breakpointhook__
    sys.unraisablehook = sys.__unraisablehook__
    cpython.forget_running_loop()  # the kernel's event loop is running this cell: not here
    with contextlib.suppress(Exception):
        _kernel_inert()
    if "IPython" in sys.modules:  # get_ipython() is None in a worker until its shell
        import builtins

        with contextlib.suppress(Exception):
            from IPython.core.interactiveshell import InteractiveShell

            rank_shell.prepare()  # from the kernel's shell, before it goes
            InteractiveShell.clear_instance()
        for name in ("get_ipython", "display", "__IPYTHON__"):
            builtins.__dict__.pop(name, None)


def _kernel_inert() -> None:
    """The kernel of this fork is no more: nothing may reach it (ipykernel's comms and widgets
    look for ``Kernel.instance()``; jupyter_client's Session, reached from a fork, logs every
    message it refuses to send), and its own loggers stay quiet. A library's logging, through
    handlers the notebook installed, still reaches the rank's output (_rebind_log_handlers)."""
    if "ipykernel" not in sys.modules:
        return  # not a kernel
    import logging

    from traitlets.config import Application
    from traitlets.log import get_logger

    loggers: set[Any] = {get_logger()}
    singletons: list[Any] = [Application]
    kernelbase = sys.modules.get("ipykernel.kernelbase")
    if kernelbase is not None:
        singletons.append(kernelbase.Kernel)
    for singleton in singletons:
        if singleton.initialized():
            instance = singleton.instance()
            loggers.add(getattr(instance, "log", None))
            type(instance).clear_instance()  # its class's and every base's
    for logger in loggers:
        if isinstance(logger, logging.Logger) and logger is not logging.getLogger():
            logger.disabled = True


def _blank_inherited_fds(keep: set[int | None]) -> None:
    """Point every fd this fork inherited (the kernel's sockets, pipes and files) at
    /dev/null, but ``keep``: what it held is gone from here, and the numbers stay taken, so
    that an inherited object still writing to one (a log handler's file) never writes
    into an fd the worker opens later (the resource tracker's pipe, a checkpoint)."""
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep and fd != null:
                with contextlib.suppress(OSError):
                    os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _rebind_log_handlers(old: tuple[object, object]) -> None:
    """The caller's logging handlers that write to a stream (its ``sys.stdout``/``stderr``
    when the library was imported: a kernel's relay, a test runner's capture) write to this
    process's fds 1 and 2 instead, which a worker points at its output pipes: a library
    imported in the notebook logs into the rank's output, as if imported there. In-memory
    streams are left as they are."""
    logging = sys.modules.get("logging")
    if logging is None:
        return
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if not isinstance(handler, logging.StreamHandler) or isinstance(
                handler, logging.FileHandler
            ):
                continue
            stream = handler.stream
            if isinstance(stream, (io.StringIO, io.BytesIO)):
                continue
            to_stdout = stream is old[0] or stream is sys.__stdout__
            to_stdout = to_stdout or getattr(stream, "name", None) == "<stdout>"
            with contextlib.suppress(AttributeError):  # logging.lastResort: sys.stderr's
                handler.stream = sys.stdout if to_stdout else sys.stderr


def _zygote(listener: int, alive_r: int, alive_w: int, key_r: int | None) -> NoReturn:
    """The forked child: nothing of the notebook's but its memory, then forkserver.main."""
    try:
        # The notebook's objects are never collected here: a socket's finalizer would close
        # an fd number that is someone else's now.
        gc.freeze()
        own_data.reserve()
        os.close(alive_w)
        _blank_inherited_fds(keep={0, 1, 2, listener, alive_r, key_r})
        shm = sys.modules.get("notebook_accel.launch.wire.shm")
        if shm is not None:  # launches ran here before this fork: their segments' mappings
            shm.unmap_inherited()
        # The notebook's streams relay through threads that do not exist here.
        old = (sys.stdout, sys.stderr)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        with contextlib.suppress(Exception):  # a handler of another shape stays as it was
            _rebind_log_handlers(old)
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _as_a_fresh_interpreter()
        cpython.serve_forkserver(listener, alive_r, _PRELOAD, key_r)
    finally:
        os._exit(0)


@contextlib.contextmanager
def main_hidden() -> Iterator[None]:
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
