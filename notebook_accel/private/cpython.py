"""CPython's private names: multiprocessing's forkserver and pickler internals, asyncio's.

Every function here says which attribute it relies on and checks that it has the shape it
expects before using it; where it differs, a public path or a capability probe that says no
(the caller then takes the public route). Read in CPython 3.11.7, 3.12.1, 3.13.0, 3.13.5
and 3.14.8 (all as described below) and in CPython's main branch of 2026 (3.15: the key's
length is ``_authkey_len`` there).

    what                         relies on                         where it differs
    zygote (forkserver.py)       ForkServer's _lock and its        zygote_possible() says no:
      zygote_possible               _forkserver_{address,alive_fd,    the fresh forkserver
      adopt_forkserver              pid}; main(listener_fd, alive_r,  (multiprocessing's own
      serve_forkserver              preload, ...) with every other    start; the first launch
      new_forkserver_key            argument defaulted; 3.14+: the    waits for its import of
      start_resource_tracker        key (_forkserver_authkey, main's  torch, 2-4 s)
      unix_listener_address         authkey_r, _AUTHKEY_LEN or
                                    _authkey_len), both or neither
    forkserver_lock, _pid,       ForkServer's _lock, _forkserver_pid, a lock of this module;
      _alive_fd                    _forkserver_alive_fd                None
    is_abstract                  util.is_abstract_socket_namespace   a leading NUL, as Linux's
    idle pool's hand-over        context.set_spawning_popen, a        fd_hand_over_possible()
      (idle.py) dumps_with_fds     reduction.DupFd that asks the        says no: no idle pool,
                                   spawning popen, ForkingPickler       each worker forked by
                                                                        the forkserver
      send_fds, receive_fds      reduction.sendfds / recvfds          socket.send_fds / recv_fds
    dup_fd (shm.py)              reduction.DupFd                      /proc/<pid>/fd/<n>, opened
                                                                      anew by the child
    forget_running_loop          asyncio.events._set_running_loop     the fork's own reset (3.12+:
                                                                      asyncio's at-fork hook;
                                                                      3.11: the loop's pid)
    semaphore_finalizers         util._finalizer_registry, SemLock.   none found: the resource
                                   _cleanup                            tracker unlinks them
    thread_frames (rank/where.py) sys._current_frames (a dict of      {}: the stall report reads
                                   thread id -> frame)                 what faulthandler wrote
"""

from __future__ import annotations

import contextlib
import inspect
import os
import socket
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "adopt_forkserver",
    "dup_fd",
    "dumps_with_fds",
    "fd_hand_over_possible",
    "forget_running_loop",
    "forkserver_alive_fd",
    "forkserver_lock",
    "forkserver_pid",
    "new_forkserver_key",
    "receive_fds",
    "semaphore_finalizers",
    "send_fds",
    "thread_frames",
    "is_abstract",
    "serve_forkserver",
    "start_resource_tracker",
    "unix_listener_address",
    "zygote_possible",
    "zygote_refusal",
]

# ForkServer's fields that adopt_forkserver sets, as its ensure_running leaves them.
_FIELDS = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")
# forkserver.main's leading arguments, in the order serve_forkserver passes them.
_MAIN_ARGUMENTS = ("listener_fd", "alive_r", "preload")
# Where a ForkServer without a lock of its own is locked (zygote_possible says no there).
_spare_lock = threading.Lock()


def _server() -> Any:
    from multiprocessing import forkserver

    return getattr(forkserver, "_forkserver", None)


def _lock_like(lock: object) -> bool:
    return all(callable(getattr(lock, name, None)) for name in ("acquire", "release", "__enter__"))


@contextlib.contextmanager
def forkserver_lock() -> Iterator[bool]:
    """multiprocessing's forkserver lock held; yields whether its server is running.

    Relies on ``multiprocessing.forkserver._forkserver`` (the module's ForkServer) and its
    ``_lock`` and ``_forkserver_pid`` (None until a server was started). Without that lock,
    a lock of this module (and ``zygote_possible`` says no).
    """
    lock: Any = getattr(_server(), "_lock", None)
    with lock if _lock_like(lock) else _spare_lock:
        yield forkserver_pid() is not None


def forkserver_pid() -> int | None:
    """The pid of this process's forkserver, if one was started.

    Relies on ForkServer's ``_forkserver_pid`` (None where it is not an int).
    """
    pid = getattr(_server(), "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def forkserver_alive_fd() -> int | None:
    """The write end of the pipe whose EOF ends this process's forkserver, if one was started.

    Relies on ForkServer's ``_forkserver_alive_fd`` (None where it is not an int).
    """
    fd = getattr(_server(), "_forkserver_alive_fd", None)
    return fd if isinstance(fd, int) else None


def _key_length() -> int | None:
    """The length of the key a 3.14+ forkserver's main reads (and asserts)."""
    from multiprocessing import forkserver

    for name in ("_AUTHKEY_LEN", "_authkey_len"):  # 3.14; 3.15
        value = getattr(forkserver, name, None)
        if isinstance(value, int) and 0 < value <= 512:  # PIPE_BUF: one write to a pipe
            return value
    return None


def _parameters(function: object) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(function).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def zygote_refusal() -> str | None:
    """Why a server this process starts itself cannot be multiprocessing's forkserver here
    (None: it can). ``zygote_possible`` is whether this is None.

    Checks what ``adopt_forkserver`` and ``serve_forkserver`` rely on: ForkServer's lock and
    fields, ``forkserver.main``'s leading arguments (the rest defaulted), the helpers the
    start uses, and Python 3.14's key, whose field (``_forkserver_authkey``) and main's
    ``authkey_r`` must come together, with a known length.
    """
    from multiprocessing import connection, forkserver, resource_tracker

    server = _server()
    if server is None or not _lock_like(getattr(server, "_lock", None)):
        return "multiprocessing.forkserver has no ForkServer with a lock"
    missing = [name for name in _FIELDS if not hasattr(server, name)]
    if missing:
        return f"ForkServer has no {', '.join(missing)}"
    parameters = _parameters(getattr(forkserver, "main", None))
    if parameters is None:
        return "forkserver.main is not a function"
    leading = tuple(p.name for p in parameters[: len(_MAIN_ARGUMENTS)])
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if leading != _MAIN_ARGUMENTS or any(p.kind not in positional for p in parameters[:3]):
        return f"forkserver.main takes {leading}, not {_MAIN_ARGUMENTS}"
    rest = parameters[len(_MAIN_ARGUMENTS) :]
    kinds = (*positional, inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in rest if p.default is p.empty and p.kind in kinds]
    if required:
        return f"forkserver.main also requires {', '.join(required)}"
    takes_key = any(p.name == "authkey_r" and p.kind != p.VAR_POSITIONAL for p in rest)
    keyed = hasattr(server, "_forkserver_authkey")
    if keyed != takes_key:
        has = "has" if keyed else "has no"
        takes = "takes" if takes_key else "takes no"
        return f"ForkServer {has} _forkserver_authkey but forkserver.main {takes} authkey_r"
    if keyed and _key_length() is None:
        return "the length of the forkserver's key is unknown"
    helpers = (resource_tracker, "ensure_running"), (connection, "arbitrary_address")
    for module, name in helpers:
        if not callable(getattr(module, name, None)):
            return f"{module.__name__}.{name} is gone"
    return None


def zygote_possible() -> bool:
    """Whether a server this process starts itself can be multiprocessing's forkserver:
    everything ``zygote_refusal`` checks is as expected (on Python 3.14, whose connections
    prove a key, ``forkserver.main`` takes the key's pipe, ``authkey_r``).

    Relies on ForkServer's fields, ``_forkserver_authkey`` (3.14) and ``forkserver.main``'s
    signature.
    """
    return zygote_refusal() is None


def new_forkserver_key() -> bytes | None:
    """A key for the connections to a server this process starts, made as Python 3.14's
    ``ensure_running`` makes it; None where this Python's forkserver proves none.

    Relies on ForkServer's ``_forkserver_authkey`` and ``forkserver._AUTHKEY_LEN`` (3.14;
    ``_authkey_len`` in 3.15).
    """
    if not hasattr(_server(), "_forkserver_authkey"):
        return None
    return os.urandom(_key_length() or 32)


def adopt_forkserver(address: str, alive_fd: int, pid: int, key: bytes | None = None) -> None:
    """Make a server this process started multiprocessing's own, as its ``ensure_running``
    would have left it: later forkserver starts connect to ``address`` (proving ``key``).

    Relies on ForkServer's ``_forkserver_address``, ``_forkserver_alive_fd``,
    ``_forkserver_pid`` and, on 3.14, ``_forkserver_authkey``; call it with
    ``forkserver_lock`` held, where ``zygote_possible()``.
    """
    server = _server()
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_fd
    server._forkserver_pid = pid
    if key is not None:
        server._forkserver_authkey = key


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, as a forkserver start does first (the
    server's children inherit it and register their semaphores with it).

    Relies on ``multiprocessing.resource_tracker.ensure_running`` (an undocumented module;
    ``zygote_refusal`` checks it).
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def unix_listener_address() -> str:
    """A fresh AF_UNIX address, as multiprocessing's forkserver picks one.

    Relies on ``multiprocessing.connection.arbitrary_address`` (undocumented;
    ``zygote_refusal`` checks it).
    """
    from multiprocessing import connection

    return str(connection.arbitrary_address("AF_UNIX"))  # type: ignore[attr-defined]


def is_abstract(address: str) -> bool:
    """Whether ``address`` is in Linux's abstract socket namespace (no file to chmod).

    Relies on ``multiprocessing.util.is_abstract_socket_namespace``; without it, Linux's
    rule (a leading NUL).
    """
    from multiprocessing import util

    check = getattr(util, "is_abstract_socket_namespace", None)
    if callable(check):
        return bool(check(address))
    return address[:1] in ("\0", b"\0")


def serve_forkserver(
    listener: int, alive_r: int, preload: list[str], key_r: int | None = None
) -> None:
    """Run multiprocessing's forkserver loop in this process (it never returns normally);
    ``key_r``: the pipe its key comes through (Python 3.14).

    Relies on ``multiprocessing.forkserver.main(listener_fd, alive_r, preload)``, whose
    further arguments (main_path, sys_path; 3.14's sys_argv) keep their defaults: the zygote
    has them already; on 3.14, its ``authkey_r`` keyword (``zygote_refusal`` checks them).
    """
    from multiprocessing import forkserver

    keyword: dict[str, Any] = {} if key_r is None else {"authkey_r": key_r}
    forkserver.main(listener, alive_r, preload, **keyword)


def forget_running_loop() -> None:
    """Let this (forked) process start an event loop of its own: the parent's, running
    when it forked, is not running here.

    Relies on ``asyncio.events._set_running_loop``. Without it, the fork's own reset: from
    3.12 asyncio's at-fork hook clears the running loop (and the policy's loop) in a child,
    and before, a running loop is only seen by the pid that set it. The policy is reset with
    ``set_event_loop_policy`` where it exists (deprecated in 3.14, its warning kept quiet).
    """
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return
    forget = getattr(getattr(asyncio, "events", None), "_set_running_loop", None)
    if callable(forget):
        forget(None)
    reset = getattr(asyncio, "set_event_loop_policy", None)
    if callable(reset):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            reset(None)


class _CollectingPopen:
    """Stands in for a spawning Popen while pickling: collects the fds the pickle refers to
    (multiprocessing's ``DupFd`` asks the spawning popen for ``duplicate_for_child`` and wraps
    the answer in its ``DupFd`` class)."""

    def __init__(self, placeholder: type) -> None:
        self.DupFd = placeholder
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1


class _Probe:
    def __init__(self, index: int) -> None:
        self.index = index


def fd_hand_over_possible() -> bool:
    """Whether ``dumps_with_fds`` works in this Python: ``set_spawning_popen`` is there, and
    ``reduction.DupFd`` asks the spawning popen for the fd's index and wraps it in the popen's
    own ``DupFd`` (tried on fd 0, which nothing duplicates). False: no idle pool (idle.py),
    the forkserver forks each worker at its launch.

    Relies on ``multiprocessing.context.set_spawning_popen``, ``reduction.DupFd`` and
    ``reduction.ForkingPickler.dumps``.
    """
    try:
        from multiprocessing import reduction
        from multiprocessing.context import set_spawning_popen
    except ImportError:
        return False
    if not callable(getattr(reduction, "DupFd", None)):
        return False
    if not callable(getattr(getattr(reduction, "ForkingPickler", None), "dumps", None)):
        return False
    popen = _CollectingPopen(_Probe)
    try:
        set_spawning_popen(popen)  # type: ignore[arg-type]  # its DupFd role only
        try:
            found = reduction.DupFd(0)
        finally:
            set_spawning_popen(None)
    except Exception:  # noqa: BLE001 - any other behaviour is another shape
        return False
    return isinstance(found, _Probe) and found.index == 0 and popen.fds == [0]


def dumps_with_fds(obj: object, placeholder: type) -> tuple[bytes, list[int]]:
    """Pickle ``obj`` as multiprocessing's forkserver start does, each fd it holds (a
    Connection's, a ``dup_fd``'s) becoming ``placeholder(index)``: the pickle, and the fds in
    index order, to send beside it (``send_fds``). Only where ``fd_hand_over_possible()``.

    Relies on ``multiprocessing.context.set_spawning_popen`` and ``reduction.DupFd`` consulting
    the spawning popen's ``DupFd`` and ``duplicate_for_child``, and ``reduction.ForkingPickler``.
    """
    from multiprocessing import reduction
    from multiprocessing.context import set_spawning_popen

    popen = _CollectingPopen(placeholder)
    set_spawning_popen(popen)  # type: ignore[arg-type]  # its DupFd role only
    try:
        data = bytes(reduction.ForkingPickler.dumps(obj))
    finally:
        set_spawning_popen(None)
    return data, popen.fds


class _ReopenedFd:
    """An fd of the process that pickled it, by its path ``/proc/<pid>/fd/<n>``: the process
    that unpickles it opens that path (``detach``), a file description of its own on the
    same file. Linux lets the same user (and root) do that while the first process holds
    the fd, as the launch's memfd store relies on (meet/rendezvous.py)."""

    def __init__(self, fd: int) -> None:
        self.path = f"/proc/{os.getpid()}/fd/{fd}"

    def detach(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_CLOEXEC)


def dup_fd(fd: int) -> Any:
    """An object that pickles as ``fd`` for a child multiprocessing starts (the child gets
    its own copy, from ``detach()``).

    Relies on ``multiprocessing.reduction.DupFd`` (undocumented). Without it, the fd by its
    ``/proc`` path, which the child opens anew while this process holds it (a launch's
    segments are held until the launch ends).
    """
    from multiprocessing import reduction

    duplicate = getattr(reduction, "DupFd", None)
    if callable(duplicate):
        return duplicate(fd)
    return _ReopenedFd(fd)


def send_fds(sock: socket.socket, fds: list[int]) -> None:
    """Send ``fds`` over a unix socket (SCM_RIGHTS), as multiprocessing does.

    Relies on ``multiprocessing.reduction.sendfds`` (undocumented); without it,
    ``socket.send_fds`` with the same one-byte message (the count, modulo 256).
    """
    from multiprocessing import reduction

    send = getattr(reduction, "sendfds", None)
    if callable(send) and callable(getattr(reduction, "recvfds", None)):
        send(sock, fds)
        return
    socket.send_fds(sock, [bytes([len(fds) % 256])], fds)


def receive_fds(sock: socket.socket, count: int) -> list[int]:
    """The ``count`` fds ``send_fds`` sent.

    Relies on ``multiprocessing.reduction.recvfds`` (undocumented); without it,
    ``socket.recv_fds``. EOFError: the other end closed first.
    """
    from multiprocessing import reduction

    receive = getattr(reduction, "recvfds", None)
    if callable(receive) and callable(getattr(reduction, "sendfds", None)):
        return list(receive(sock, count))
    message, fds, _, _ = socket.recv_fds(sock, 1, count)
    if not message and not fds:
        raise EOFError("the sender closed the socket")
    if len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"received {len(fds)} fds, not {count}")
    return list(fds)


def semaphore_finalizers() -> list[Callable[[], Any]]:
    """The pending finalizers that would unlink this process's named semaphores at a normal
    exit (for a process that leaves with ``os._exit``).

    Relies on ``multiprocessing.util._finalizer_registry`` (a dict of Finalize objects), a
    Finalize's ``_callback``, and ``multiprocessing.synchronize.SemLock._cleanup`` (the
    callback semaphores register). Where any differs: none found, and the resource tracker
    unlinks what is left when the notebook's process exits.
    """
    from multiprocessing import synchronize, util

    registry = getattr(util, "_finalizer_registry", None)
    cleanup = getattr(getattr(synchronize, "SemLock", None), "_cleanup", None)
    if not isinstance(registry, dict) or not callable(cleanup):
        return []
    found = [f for f in list(registry.values()) if getattr(f, "_callback", None) is cleanup]
    return [f for f in found if callable(f)]


def thread_frames() -> dict[int, types.FrameType]:
    """Each Python thread's current frame, by thread id (``threading.get_ident``).

    Relies on ``sys._current_frames`` (every CPython since 2.5; its name says it is for
    debuggers). Where it is missing or answers otherwise: {} (the stall report then takes
    the stacks faulthandler writes, launch/rank/where.py).
    """
    current = getattr(sys, "_current_frames", None)
    if not callable(current):
        return {}
    try:
        frames = current()
    except Exception:  # noqa: BLE001 - a debugging aid never breaks the rank
        return {}
    if not isinstance(frames, dict):
        return {}
    return {k: v for k, v in frames.items() if isinstance(v, types.FrameType)}
