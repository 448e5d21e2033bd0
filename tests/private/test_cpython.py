"""private/cpython.py: each function checks the shape of CPython's internals it relies on,
and where one differs it takes the public path or says no. Here each other shape is made on
the real modules (restored after each test); tests/private/test_private_fallbacks.py launches
with them."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import socket
import threading
from multiprocessing import context, forkserver, reduction, synchronize, util
from typing import Any

import pytest

from notebook_accel.private import cpython


def _main_3_14(
    listener_fd: int,
    alive_r: int,
    preload: list[str],
    main_path: Any = None,
    sys_path: Any = None,
    *,
    sys_argv: Any = None,
    authkey_r: Any = None,
) -> None:
    """The signature of Python 3.14.8's forkserver.main."""


def test_this_python_s_forkserver_can_be_a_zygote() -> None:
    assert cpython.zygote_refusal() is None
    assert cpython.zygote_possible()
    assert cpython.new_forkserver_key() is None  # 3.11: no key (3.14: 32 bytes, checked there)


def test_a_key_field_without_main_s_authkey_r_refuses_the_zygote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_authkey", None, raising=False)
    why = cpython.zygote_refusal()
    assert why == "ForkServer has _forkserver_authkey but forkserver.main takes no authkey_r"
    assert not cpython.zygote_possible()


def test_main_s_authkey_r_without_the_key_field_refuses_the_zygote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forkserver, "main", _main_3_14)
    why = cpython.zygote_refusal()
    assert why == "ForkServer has no _forkserver_authkey but forkserver.main takes authkey_r"


def test_python_3_14_s_shape_and_3_15_s_key_length_make_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(forkserver, "main", _main_3_14)
    monkeypatch.setattr(forkserver._forkserver, "_forkserver_authkey", None, raising=False)
    assert cpython.zygote_refusal() == "the length of the forkserver's key is unknown"
    monkeypatch.setattr(forkserver, "_authkey_len", 24, raising=False)  # 3.15's name
    assert cpython.zygote_possible()
    key = cpython.new_forkserver_key()
    assert key is not None and len(key) == 24


@pytest.mark.parametrize(
    ("main", "reason"),
    [
        (lambda listener, alive_r, preload: None, "forkserver.main takes ('listener', "),
        (
            lambda listener_fd, alive_r, preload, handshake: None,
            "forkserver.main also requires handshake",
        ),
        (
            lambda listener_fd, alive_r, preload, *, token: None,
            "forkserver.main also requires token",
        ),
        (len, "forkserver.main takes"),  # a builtin of one argument
    ],
)
def test_a_main_with_another_signature_refuses_the_zygote(
    monkeypatch: pytest.MonkeyPatch, main: Any, reason: str
) -> None:
    monkeypatch.setattr(forkserver, "main", main)
    why = cpython.zygote_refusal()
    assert why is not None and why.startswith(reason)


def test_a_forkserver_without_a_field_or_lock_refuses_the_zygote_and_still_locks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(forkserver._forkserver, "_forkserver_alive_fd")
    assert cpython.zygote_refusal() == "ForkServer has no _forkserver_alive_fd"
    monkeypatch.delattr(forkserver._forkserver, "_lock")
    assert cpython.zygote_refusal() == "multiprocessing.forkserver has no ForkServer with a lock"
    with cpython.forkserver_lock() as running:
        assert running is (cpython.forkserver_pid() is not None)


def test_a_missing_helper_refuses_the_zygote(monkeypatch: pytest.MonkeyPatch) -> None:
    from multiprocessing import connection

    monkeypatch.delattr(connection, "arbitrary_address")
    assert cpython.zygote_refusal() == "multiprocessing.connection.arbitrary_address is gone"


def test_fd_hand_over_is_possible_where_dupfd_asks_the_spawning_popen() -> None:
    assert cpython.fd_hand_over_possible()


def test_fd_hand_over_is_refused_in_every_other_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        # A DupFd that no longer consults the spawning popen (its resource-sharer route).
        patch.setattr(reduction, "DupFd", lambda fd: ("shared", fd))
        assert not cpython.fd_hand_over_possible()
    with monkeypatch.context() as patch:
        patch.delattr(reduction, "DupFd")
        assert not cpython.fd_hand_over_possible()
    with monkeypatch.context() as patch:
        patch.delattr(context, "set_spawning_popen")
        assert not cpython.fd_hand_over_possible()
    with monkeypatch.context() as patch:
        patch.delattr(reduction.ForkingPickler, "dumps")
        assert not cpython.fd_hand_over_possible()
    assert cpython.fd_hand_over_possible()  # and no spawning popen was left behind
    assert context.get_spawning_popen() is None


def test_without_dupfd_an_fd_travels_by_its_proc_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(reduction, "DupFd")
    fd = os.memfd_create("guards-test")
    try:
        os.write(fd, b"segment")
        arrived = pickle.loads(pickle.dumps(cpython.dup_fd(fd)))
        mine = arrived.detach()
        try:
            assert os.pread(mine, 7, 0) == b"segment"
            os.pwrite(mine, b"S", 0)  # the same file, its own description
            assert os.pread(fd, 7, 0) == b"Segment"
        finally:
            os.close(mine)
    finally:
        os.close(fd)


def test_without_reduction_s_pair_fds_go_through_socket_send_fds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(reduction, "sendfds")
    monkeypatch.delattr(reduction, "recvfds")
    ours, theirs = socket.socketpair()
    read, write = os.pipe()
    received: list[int] = []
    try:
        sender = threading.Thread(target=cpython.send_fds, args=(ours, [read, write]))
        sender.start()
        received = cpython.receive_fds(theirs, 2)
        sender.join()
        os.write(received[1], b"x")  # the pipe's write end, received: our read end reads it
        assert os.read(read, 1) == b"x"
        ours.close()
        with pytest.raises(EOFError):
            cpython.receive_fds(theirs, 2)
    finally:
        for fd in (read, write, *received):
            os.close(fd)
        ours.close()
        theirs.close()


def test_abstract_addresses_are_known_without_multiprocessing_s_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(util, "is_abstract_socket_namespace")
    assert cpython.is_abstract("\0listener-1") and cpython.is_abstract(b"\0listener-1")
    assert not cpython.is_abstract("/tmp/listener-1")


def test_forgetting_the_running_loop_without_asyncio_s_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def inside() -> Any:
        cpython.forget_running_loop()
        return asyncio.events._get_running_loop()

    assert asyncio.run(inside()) is None  # today's shape: cleared by name
    monkeypatch.delattr(asyncio.events, "_set_running_loop")
    monkeypatch.delattr(asyncio, "set_event_loop_policy")
    cpython.forget_running_loop()  # nothing to call: the fork's own reset does it


def test_semaphore_finalizers_are_found_and_none_in_another_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock = multiprocessing.get_context("spawn").Lock()  # named (fork's are unlinked at once)
    name = lock._semlock.name  # type: ignore[attr-defined]
    finalizers = cpython.semaphore_finalizers()
    assert any(name in getattr(f, "_args", ()) for f in finalizers)
    with monkeypatch.context() as patch:
        patch.setattr(util, "_finalizer_registry", list(util._finalizer_registry.values()))
        assert cpython.semaphore_finalizers() == []
    with monkeypatch.context() as patch:
        patch.delattr(synchronize.SemLock, "_cleanup")
        assert cpython.semaphore_finalizers() == []
    del lock
