"""How this machine's workers start: multiprocessing's forkserver, started early.

    the launcher imported (warm_up_early)       a notebook's main thread, Linux, torch
                                                imported and CUDA not in use here:
                                                  the zygote: a fork of this process (its
                                                  fds closed, its heap frozen) running
                                                  multiprocessing's forkserver loop
                                                else a daemon thread: warm_up(), a fresh
                                                  interpreter importing _PRELOAD
                                                then two idle workers (idle.py)
    a launch (warm_up, context)                 the forkserver started again if it is off
                                                or died; spawn where there is none

Workers never need the caller's ``__main__`` (the function travels by value):
``main_hidden`` keeps multiprocessing from running a script again in each of them.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import socket
import sys
import threading
import types
from collections.abc import Iterator
from typing import NoReturn

from ... import env
from ...private import cpython
from .idle import idle_pool, main_has_file

__all__ = ["context", "main_hidden", "warm_up", "warm_up_early"]

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
        and not main_has_file()
        and threading.current_thread() is threading.main_thread()
    )


def _start_zygote() -> None:
    """Fork this process as the forkserver (multiprocessing's, its bookkeeping as its own
    start would leave it): it has torch imported already, so it serves at once."""
    with cpython.forkserver_lock() as running:
        # Python 3.14: a connection to the forkserver proves a key that its main() reads from
        # a pipe at start (authkey_r); a forkserver without that argument: the fresh one.
        if running or not cpython.zygote_possible():
            return
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
            pid = os.fork()
            if pid == 0:
                _zygote(listener.fileno(), alive_r, alive_w, key_r)
            os.close(alive_r)
        finally:
            listener.close()
            if key_r is not None:
                os.close(key_r)
        cpython.adopt_forkserver(address, alive_w, pid, key)


def _as_a_fresh_interpreter() -> None:
    """Undo in the zygote what a kernel installed in its interpreter, so that its workers
    start as a fresh forkserver's do: the hooks, the running event loop, IPython's shell."""
    sys.displayhook = sys.__displayhook__  # a session cell's last value goes through it
    sys.excepthook = sys.__excepthook__
    sys.breakpointhook = sys.__breakpointhook__
    sys.unraisablehook = sys.__unraisablehook__
    cpython.forget_running_loop()  # the kernel's event loop is running this cell: not here
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
