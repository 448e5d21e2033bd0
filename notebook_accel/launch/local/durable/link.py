"""The line between a kernel and a durable session's supervisor: a unix socket, proven first.

    kernel (connect)                                  supervisor (Listener)
    ----------------                                  ---------------------
    connect <folder>/socket  (the folder is 0700: no other user reaches it)
                                           <------    auth.Gate's proof: HELLO + nonce
    HMAC(the user's secret, ...)           ------>    checked; then SO_PEERCRED: same uid
                                           <------    "ok" + its own HMAC (checked here)
    a request: pickle((verb, args))        ------>    unpickled only now (a proven member)
                                           <------    ("event", ...)* then ("ok", value)
                                                      or ("error", exception, its cause)
    the next request on the same connection, ...      (until the kernel closes it)

A request is answered whole before the next one on its connection; a kernel keeps one spare
connection (a proof costs ~0.7 ms) and opens another for what runs meanwhile (a job's watch,
the stop button's "interrupt" during a run). Both sides unpickle
only what came after both proofs (meet/auth.py: multiprocessing.connection's challenge, both
ways): the user's secret (meet/secret.py) is in a 0600 file of their home.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...meet import auth
from ...meet.secret import job_secret

__all__ = ["Link", "Listener", "connect", "reply_error"]

ROLE = auth.LAUNCHER  # a kernel proves the user's secret, as a launcher does
_LIMIT = 1 << 31  # the largest message (a push of large arrays travels whole)


class Link:
    """A proven connection: pickled messages as frames."""

    def __init__(self, channel: auth.Channel) -> None:
        self.channel = channel

    def send(self, message: Any) -> None:
        import cloudpickle  # a notebook's functions travel by value

        self.channel.send(cloudpickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def send_raw(self, data: bytes) -> None:
        self.channel.send(data)

    def recv(self) -> Any:
        return pickle.loads(self.channel.recv(limit=_LIMIT))  # noqa: S301  (proven peer)

    def readable(self, timeout: float) -> bool:
        """Whether a message begins to arrive within ``timeout`` s (or the peer closed)."""
        ready, _, _ = select.select([self.channel.sock], [], [], timeout)
        return bool(ready)

    def recv_raw(self) -> bytes:
        return self.channel.recv(limit=_LIMIT)

    def close(self) -> None:
        self.channel.close()


def connect(path: Path, timeout: float = 10.0) -> Link:
    """Connect to the supervisor at ``path`` and prove the user's secret (it proves it back).

    Raises:
        OSError: nothing listens there (the supervisor is gone), or this user may not reach it.
        ProofError: the supervisor refused the proof, or what answered is not ours.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        channel = auth.Channel(sock)
        auth.prove(channel, ROLE, job_secret(), str(path))
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return Link(channel)


def reply_error(link: Link, error: BaseException) -> None:
    """Send ``error`` (with its cause: a rank's traceback) as a request's outcome; one that
    does not pickle travels as its text."""
    try:
        data = pickle.dumps(("error", error, error.__cause__), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001  (an exception of the user's that does not pickle)
        text = f"{type(error).__name__}: {error}"
        data = pickle.dumps(("error", RuntimeError(text), None))
    link.send_raw(data)


def _peer_uid(sock: socket.socket) -> int | None:
    """The connecting process's uid (Linux's SO_PEERCRED), or None where there is none."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[1])


class Listener(auth.Gate):
    """auth.Gate's proof on a unix socket of mode 0600 in the session's 0700 folder; a proven
    connection of another uid (root may enter any folder) is closed before it is served."""

    def __init__(self, path: Path, serve: Callable[[Link], None]) -> None:
        self.path = path

        def proven(channel: auth.Channel, role: bytes) -> None:
            uid = _peer_uid(channel.sock)
            if uid is not None and uid != os.getuid():
                return  # closed by the gate
            serve(Link(channel))

        super().__init__(str(path), 0, {ROLE: job_secret()}, proven)

    def _bind(self, host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is made 0600: no moment of a wider mode
        try:
            sock.bind(host)
        finally:
            os.umask(old)
        sock.listen(64)
        return sock
