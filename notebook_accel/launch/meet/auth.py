"""Membership by proof: a TCP listener that serves only those who prove they know a key.

    member (connect)                                machine 0 (Gate)
    ----------------                                ----------------
                                        <------    frame: HELLO + nonce_h
    frame: role + nonce_m + HMAC(key[role],
        "member" role nonce_h nonce_m)  ------>    compare_digest; a wrong proof:
                                                   frame b"refused: ...", close, and
                                                   refusals() names the address
                                        <------    frame: b"ok" + HMAC(key[role],
                                                          "host" role nonce_m nonce_h)
    check the host's proof (a program that merely took the port cannot give it)
    ... framed requests and replies (table.py): bytes only, nothing is ever unpickled ...

A frame is a 4-byte big-endian length and that many bytes. A connection has 10 s to prove
itself, 64 at most are being proved at once, and one that closes before sending a byte (a
port probe) is not reported. The proof is multiprocessing.connection's idea (an HMAC
challenge, both ways) with SHA-256 and these bounds; the traffic after it is neither signed
nor encrypted (README: a private network, as gloo needs anyway).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping

from ...errors import ConfigError, LaunchError

__all__ = ["Channel", "Gate", "connect", "prove", "LAUNCHER", "WORKER", "ProofError"]

HELLO = b"notebook-accel/1 "
LAUNCHER = b"L"  # proves the job's secret
WORKER = b"W"  # proves its launch's worker key
_PROOF_TIME = 10.0
_AT_ONCE = 64
_NONCE = 32
_LIMIT = 1 << 26  # the largest frame a member may send (a store value)


class ProofError(LaunchError):
    """The other side did not prove the key (or is not a notebook_accel launch at all)."""


class _Silent(Exception):
    """The peer closed before sending anything: a probe, not worth a line in the banner."""


class Channel:
    """Frames over a connected socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.peer = _address(sock)

    def send(self, data: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(data)) + data)

    def recv(self, limit: int = _LIMIT) -> bytes:
        (size,) = struct.unpack(">I", self._exactly(4))
        if size > limit:
            raise ProofError(f"a frame of {size} bytes from {self.peer} (at most {limit})")
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            piece = self.sock.recv(n - len(data))
            if not piece:
                raise ConnectionError(f"{self.peer} closed the connection")
            data += piece
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _address(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    return str(peer[0]) if isinstance(peer, tuple) else "this machine (a unix socket)"


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


class Gate:
    """A listening socket that hands each proven connection to ``serve(channel, role)``.

    Args:
        host: the address to listen on (machine 0's address facing the others).
        port: the port (``master_port``).
        keys: the key each role proves: ``{LAUNCHER: secret, WORKER: launch_key}``.
        serve: runs on the connection's own thread once it proved ``role``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        keys: Mapping[bytes, bytes],
        serve: Callable[[Channel, bytes], None],
    ) -> None:
        self.keys = dict(keys)
        self.serve = serve
        self.note = ""  # said in the banner when the listener is wider than asked
        self.sock = self._bind(host, port)
        self._refused: list[tuple[str, str]] = []
        self._members: set[Channel] = set()
        self._lock = threading.Lock()
        self._proving = threading.BoundedSemaphore(_AT_ONCE)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="notebook-accel-gate")
        self._thread.daemon = True
        self._thread.start()

    def _bind(self, host: str, port: int) -> socket.socket:
        try:
            address = socket.gethostbyname(host)
        except OSError as exc:
            raise ConfigError("master_addr", host, "machine 0's host name or address") from exc
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                # master_addr is not an address of this machine (NAT, a published container
                # port): only every interface will do. Strangers still have to prove the key.
                sock.bind(("0.0.0.0", port))
                self.note = f"{host} is not an address of this machine: listening on all"
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise ConfigError(
                "master_port", port, "a free TCP port", f"Binding it failed: {exc}."
            ) from exc
        return sock

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def refusals(self) -> list[tuple[str, str, int]]:
        """The connections refused since the last call: ``(address, why, how many)``."""
        with self._lock:
            seen, self._refused = self._refused, []
        counts: dict[tuple[str, str], int] = {}
        for refusal in seen:
            counts[refusal] = counts.get(refusal, 0) + 1
        return [(who, why, n) for (who, why), n in counts.items()]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            if not self._proving.acquire(blocking=False):
                self._refuse(Channel(conn), "too many connections being proved at once")
                continue
            worker = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            worker.start()

    def _handle(self, conn: socket.socket) -> None:
        channel = Channel(conn)
        try:
            role = self._prove(channel)
        except _Silent:
            channel.close()
            return
        except (OSError, ConnectionError, ProofError, struct.error) as exc:
            self._refuse(channel, _why(exc))
            return
        finally:
            self._proving.release()
        with self._lock:
            if self._closed:
                channel.close()
                return
            self._members.add(channel)
        try:
            self.serve(channel, role)
        finally:
            with self._lock:
                self._members.discard(channel)
            channel.close()

    def _prove(self, channel: Channel) -> bytes:
        channel.sock.settimeout(_PROOF_TIME)
        nonce = secrets.token_bytes(_NONCE)
        try:
            channel.send(HELLO + nonce)
            if not channel.sock.recv(1, socket.MSG_PEEK):
                raise _Silent()
        except (ConnectionError, BrokenPipeError) as exc:
            raise _Silent() from exc
        try:
            proof = channel.recv(limit=1 + _NONCE + 32)
        except ProofError:  # a length no proof has: another protocol (a TCPStore client)
            raise ProofError("it does not speak notebook_accel's protocol") from None
        role, theirs, mac = proof[:1], proof[1 : 1 + _NONCE], proof[1 + _NONCE :]
        key = self.keys.get(role)
        if key is None or len(theirs) != _NONCE:
            raise ProofError("it does not speak notebook_accel's protocol")
        if not hmac.compare_digest(mac, _mac(key, b"member", role, nonce, theirs)):
            raise ProofError("wrong secret" if role == LAUNCHER else "not a worker of this launch")
        channel.send(b"ok" + _mac(key, b"host", role, theirs, nonce))
        channel.sock.settimeout(None)
        return role

    def _refuse(self, channel: Channel, why: str) -> None:
        with contextlib.suppress(OSError):
            channel.send(b"refused: " + why.encode())
        channel.close()
        with self._lock:
            self._refused.append((channel.peer, why))

    def close(self) -> None:
        """Stop listening and end every member's connection."""
        with self._lock:
            self._closed = True
            members = list(self._members)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for channel in members:
            channel.close()
        self._thread.join(timeout=5)


def _why(exc: BaseException) -> str:
    if isinstance(exc, ProofError):
        return str(exc)
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no proof within {_PROOF_TIME:g} s"
    if isinstance(exc, struct.error):
        return "it does not speak notebook_accel's protocol"
    return f"the connection failed before a proof ({exc})"


def connect(host: str, port: int, role: bytes, key: bytes, timeout: float, what: str) -> Channel:
    """Connect to machine 0's gate and prove ``key``, retrying until ``timeout`` passes
    (machine 0 may start after this machine).

    Args:
        what: the option that names the address, for messages (``"master_addr"``).

    Raises:
        LaunchError: nothing answered in time.
        ProofError: machine 0 refused the proof, or what answered is not machine 0.
    """
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=min(5.0, timeout))
        except OSError as exc:
            last = exc
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
            continue
        channel = Channel(sock)
        try:
            _answer(channel, role, key, f"{host}:{port}")
        except BaseException:
            channel.close()
            raise
        sock.settimeout(None)
        return channel
    raise LaunchError(
        f"{what}={host!r}: nothing answered at {host}:{port} within {timeout:g} s ({last}). "
        "Check that machine 0 is running the same launch, that the address and port are "
        "right, and that no firewall blocks the port."
    )


def prove(channel: Channel, role: bytes, key: bytes, where: str) -> None:
    """Prove ``key`` as ``role`` over a connected ``channel`` and check the gate's proof back
    (what ``connect`` does once connected; a unix socket's client calls it itself).

    Raises:
        ProofError: the gate refused the proof, or what answered is not a gate of ours.
    """
    _answer(channel, role, key, where)


def _answer(channel: Channel, role: bytes, key: bytes, where: str) -> None:
    try:
        hello = channel.recv(limit=len(HELLO) + _NONCE)
    except (OSError, ConnectionError, ProofError, struct.error) as exc:
        raise ProofError(f"{where} is not a notebook_accel launch ({exc})") from exc
    if not hello.startswith(HELLO) or len(hello) != len(HELLO) + _NONCE:
        raise ProofError(f"{where} is not a notebook_accel launch: another program has the port")
    theirs, mine = hello[len(HELLO) :], secrets.token_bytes(_NONCE)
    channel.send(role + mine + _mac(key, b"member", role, theirs, mine))
    try:
        reply = channel.recv(limit=256)
    except (OSError, ConnectionError) as exc:
        raise ProofError(f"{where} closed the connection during the proof ({exc})") from exc
    if reply.startswith(b"refused: "):
        raise ProofError(f"machine 0 at {where} refused this machine: {reply[9:].decode()}")
    proof = _mac(key, b"host", role, mine, theirs)
    if not (reply[:2] == b"ok" and hmac.compare_digest(reply[2:], proof)):
        raise ProofError(f"{where} did not prove the secret: it is not this job's machine 0")
