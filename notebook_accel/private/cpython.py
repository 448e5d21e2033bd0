"""CPython's private names: multiprocessing's forkserver and pickler internals, asyncio's.

Every function here says which attribute it relies on. They hold from CPython 3.11 (the
oldest Python the package supports) to 3.14, whose forkserver's connections prove a key
(``_forkserver_authkey``, read by ``forkserver.main`` from ``authkey_r``): ``zygote_possible``,
``new_forkserver_key``, ``adopt_forkserver`` and ``serve_forkserver`` handle it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "adopt_forkserver",
    "dup_fd",
    "dumps_with_fds",
    "forget_running_loop",
    "forkserver_lock",
    "forkserver_pid",
    "new_forkserver_key",
    "receive_fds",
    "semaphore_finalizers",
    "send_fds",
    "is_abstract",
    "serve_forkserver",
    "start_resource_tracker",
    "unix_listener_address",
    "zygote_possible",
]


def _server() -> Any:
    from multiprocessing import forkserver

    return forkserver._forkserver


@contextlib.contextmanager
def forkserver_lock() -> Iterator[bool]:
    """multiprocessing's forkserver lock held; yields whether its server is running.

    Relies on ``multiprocessing.forkserver._forkserver`` (the module's ForkServer) and its
    ``_lock`` and ``_forkserver_pid`` (None until a server was started).
    """
    server = _server()
    with server._lock:
        yield server._forkserver_pid is not None


def forkserver_pid() -> int | None:
    """The pid of this process's forkserver, if one was started.

    Relies on ForkServer's ``_forkserver_pid``.
    """
    pid: int | None = getattr(_server(), "_forkserver_pid", None)
    return pid


def zygote_possible() -> bool:
    """Whether a server this process starts itself can be multiprocessing's forkserver: on
    Python 3.14, whose connections prove a key, only where ``forkserver.main`` takes the key's
    pipe (``authkey_r``); always before.

    Relies on ForkServer's ``_forkserver_authkey`` (3.14) and ``forkserver.main``'s signature.
    """
    from multiprocessing import forkserver

    keyed = hasattr(_server(), "_forkserver_authkey")
    return not keyed or "authkey_r" in inspect.signature(forkserver.main).parameters


def new_forkserver_key() -> bytes | None:
    """A key for the connections to a server this process starts, made as Python 3.14's
    ``ensure_running`` makes it; None where this Python's forkserver proves none.

    Relies on ForkServer's ``_forkserver_authkey`` and ``forkserver._AUTHKEY_LEN`` (3.14).
    """
    from multiprocessing import forkserver

    if not hasattr(_server(), "_forkserver_authkey"):
        return None
    return os.urandom(getattr(forkserver, "_AUTHKEY_LEN", 32))


def adopt_forkserver(address: str, alive_fd: int, pid: int, key: bytes | None = None) -> None:
    """Make a server this process started multiprocessing's own, as its ``ensure_running``
    would have left it: later forkserver starts connect to ``address`` (proving ``key``).

    Relies on ForkServer's ``_forkserver_address``, ``_forkserver_alive_fd``,
    ``_forkserver_pid`` and, on 3.14, ``_forkserver_authkey``; call it with
    ``forkserver_lock`` held.
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

    Relies on ``multiprocessing.resource_tracker.ensure_running`` (an undocumented module).
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()


def unix_listener_address() -> str:
    """A fresh AF_UNIX address, as multiprocessing's forkserver picks one.

    Relies on ``multiprocessing.connection.arbitrary_address`` (undocumented).
    """
    from multiprocessing import connection

    return str(connection.arbitrary_address("AF_UNIX"))  # type: ignore[attr-defined]


def is_abstract(address: str) -> bool:
    """Whether ``address`` is in Linux's abstract socket namespace (no file to chmod).

    Relies on ``multiprocessing.util.is_abstract_socket_namespace``.
    """
    from multiprocessing import util

    return bool(util.is_abstract_socket_namespace(address))


def serve_forkserver(
    listener: int, alive_r: int, preload: list[str], key_r: int | None = None
) -> None:
    """Run multiprocessing's forkserver loop in this process (it never returns normally);
    ``key_r``: the pipe its key comes through (Python 3.14).

    Relies on ``multiprocessing.forkserver.main(listener_fd, alive_r, preload)``, whose
    further arguments (main_path, sys_path) keep their defaults: the zygote has both already;
    on 3.14, its ``authkey_r`` keyword.
    """
    from multiprocessing import forkserver

    keyword: dict[str, Any] = {} if key_r is None else {"authkey_r": key_r}
    forkserver.main(listener, alive_r, preload, **keyword)


def forget_running_loop() -> None:
    """Let this (forked) process start an event loop of its own: the parent's, running
    when it forked, is not running here.

    Relies on ``asyncio.events._set_running_loop``.
    """
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None:
        asyncio.events._set_running_loop(None)
        asyncio.set_event_loop_policy(None)


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


def dumps_with_fds(obj: object, placeholder: type) -> tuple[bytes, list[int]]:
    """Pickle ``obj`` as multiprocessing's forkserver start does, each fd it holds (a
    Connection's, a ``dup_fd``'s) becoming ``placeholder(index)``: the pickle, and the fds in
    index order, to send beside it (``send_fds``).

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


def dup_fd(fd: int) -> Any:
    """An object that pickles as ``fd`` for a child multiprocessing starts (the child gets
    its own copy).

    Relies on ``multiprocessing.reduction.DupFd`` (undocumented).
    """
    from multiprocessing import reduction

    return reduction.DupFd(fd)


def send_fds(sock: socket.socket, fds: list[int]) -> None:
    """Send ``fds`` over a unix socket (SCM_RIGHTS), as multiprocessing does.

    Relies on ``multiprocessing.reduction.sendfds`` (undocumented).
    """
    from multiprocessing import reduction

    reduction.sendfds(sock, fds)


def receive_fds(sock: socket.socket, count: int) -> list[int]:
    """The ``count`` fds ``send_fds`` sent.

    Relies on ``multiprocessing.reduction.recvfds`` (undocumented).
    """
    from multiprocessing import reduction

    return list(reduction.recvfds(sock, count))


def semaphore_finalizers() -> list[Callable[[], Any]]:
    """The pending finalizers that would unlink this process's named semaphores at a normal
    exit (for a process that leaves with ``os._exit``).

    Relies on ``multiprocessing.util._finalizer_registry``, a Finalize's ``_callback``, and
    ``multiprocessing.synchronize.SemLock._cleanup`` (the callback semaphores register).
    """
    from multiprocessing import synchronize, util

    registry = getattr(util, "_finalizer_registry", {})
    cleanup = getattr(synchronize.SemLock, "_cleanup", 0)
    return [f for f in list(registry.values()) if getattr(f, "_callback", None) is cleanup]
