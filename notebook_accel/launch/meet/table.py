"""The key-value table of a launch on several machines, held by machine 0's launcher.

    member (TableClient: launchers;             machine 0's launcher
            worker_store.KeyStore: workers)     --------------------
    request frame: op + fields     ------>      serve(): one thread per proven connection
                                                (auth.Gate); keys under its namespace:
                                                "group/" (launchers), "attempt/<n>/" (workers)
                                   <------      reply frame: b"+" + fields, or b"-" + why

Fields are length-prefixed bytes; numbers travel as ASCII digits. Nothing is pickled. The ops
are a torch TCPStore's (set, get waits for the key, add, check, wait, compare_set, delete,
num_keys), so gloo, NCCL and group.py use it as they would a TCPStore; but it is reachable only
through the gate, and a key is a Python dict entry in the launcher, not a socket anyone on the
machine can read.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterable

from .auth import Channel

__all__ = ["Table", "TableClient", "serve", "StoreTimeout"]


class StoreTimeout(TimeoutError):
    """A key did not appear in time."""


def _pack(*fields: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(f)) + f for f in fields)


def _unpack(data: bytes) -> list[bytes]:
    fields, at = [], 0
    while at < len(data):
        (size,) = struct.unpack_from(">I", data, at)
        fields.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return fields


def _seconds(field: bytes) -> float | None:
    ms = int(field)
    return None if ms < 0 else ms / 1000


class Table:
    """Keys and values, with waits, shared by every connection's thread."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._changed = threading.Condition()
        self._closed = False

    def _await(self, keys: Iterable[bytes], timeout: float | None) -> None:
        keys = list(keys)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not all(k in self._data for k in keys):
                if self._closed:
                    raise ConnectionError("the launch ended")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    names = ", ".join(k.decode(errors="replace") for k in keys)
                    raise StoreTimeout(f"wait timeout after {timeout:g} s for {names}")
                self._changed.wait(left if left is None else min(left, 1.0))

    def do(self, op: bytes, fields: list[bytes]) -> list[bytes]:
        """Run one request; its reply's fields."""
        if op == b"g":
            self._await(fields[:1], _seconds(fields[1]))
            with self._changed:
                return [self._data[fields[0]]]
        if op == b"w":
            self._await(fields[1:], _seconds(fields[0]))
            return []
        with self._changed:
            try:
                return self._change(op, fields)
            finally:
                self._changed.notify_all()

    def _change(self, op: bytes, fields: list[bytes]) -> list[bytes]:
        data = self._data
        if op == b"s":
            data[fields[0]] = fields[1]
            return []
        if op == b"a":
            value = int(data.get(fields[0], b"0")) + int(fields[1])
            data[fields[0]] = str(value).encode()
            return [data[fields[0]]]
        if op == b"c":
            return [b"1" if all(k in data for k in fields) else b"0"]
        if op == b"x":  # compare_set: set when the value is `expected` (or absent and empty)
            key, expected, desired = fields
            if data.get(key, b"" if not expected else None) == expected:
                data[key] = desired
            return [data.get(key, expected)]
        if op == b"d":
            return [b"1" if data.pop(fields[0], None) is not None else b"0"]
        if op == b"n":
            return [str(len(data)).encode()]
        raise ValueError(f"unknown request {op!r}")

    def close(self) -> None:
        """End every wait: the launch is over."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()


def _namespaced(op: bytes, fields: list[bytes], namespace: bytes) -> list[bytes]:
    """The request's fields with its keys under ``namespace``."""
    if op in (b"c", b"w"):
        first = 0 if op == b"c" else 1  # wait's first field is its timeout
        return fields[:first] + [namespace + k for k in fields[first:]]
    if op in (b"g", b"s", b"a", b"x", b"d"):
        return [namespace + fields[0], *fields[1:]]
    return fields


def serve(channel: Channel, table: Table, namespace: bytes) -> None:
    """Answer one member's requests until it leaves; its keys live under ``namespace``."""
    while True:
        try:
            request = channel.recv()
        except (OSError, ConnectionError):
            return
        op = request[:1]
        try:
            reply = b"+" + _pack(*table.do(op, _namespaced(op, _unpack(request[1:]), namespace)))
        except StoreTimeout as exc:
            reply = b"t" + str(exc).encode()
        except (ValueError, IndexError, KeyError, struct.error) as exc:
            reply = b"-" + f"bad request: {exc}".encode()
        except ConnectionError:
            return
        try:
            channel.send(reply)
        except OSError:
            return


class TableClient:
    """A member's view of the table: the TCPStore methods group.py and the workers use.

    Build it with :meth:`over` (a connection that proved its key, auth.connect) or
    :meth:`local` (machine 0's launcher, which holds the table).

    Args:
        ask: runs one request (op, fields) and returns the reply's fields.
        timeout: seconds ``get`` and ``wait`` wait by default.
        close: what ends the view.
    """

    def __init__(
        self,
        ask: Callable[[bytes, list[bytes]], list[bytes]],
        timeout: float,
        close: Callable[[], None] = lambda: None,
    ) -> None:
        self._ask_fields = ask
        self.timeout = timeout
        self.close = close

    @classmethod
    def over(cls, channel: Channel, timeout: float) -> TableClient:
        lock = threading.Lock()  # one request at a time on the connection

        def ask(op: bytes, fields: list[bytes]) -> list[bytes]:
            with lock:
                channel.send(op + _pack(*fields))
                reply = channel.recv()
            if reply[:1] == b"t":
                raise StoreTimeout(reply[1:].decode(errors="replace"))
            if reply[:1] != b"+":
                raise RuntimeError(reply[1:].decode(errors="replace"))
            return _unpack(reply[1:])

        return cls(ask, timeout, channel.close)

    @classmethod
    def local(cls, table: Table, namespace: bytes, timeout: float) -> TableClient:
        return cls(lambda op, fields: table.do(op, _namespaced(op, fields, namespace)), timeout)

    def _ask(self, op: bytes, *fields: bytes) -> list[bytes]:
        return self._ask_fields(op, list(fields))

    def _ms(self, timeout: float | None) -> bytes:
        seconds = self.timeout if timeout is None else timeout
        return str(int(seconds * 1000)).encode()

    def set(self, key: str, value: bytes | str) -> None:
        self._ask(b"s", _bytes(key), _bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self._ask(b"g", _bytes(key), self._ms(timeout))[0]

    def add(self, key: str, amount: int) -> int:
        return int(self._ask(b"a", _bytes(key), str(int(amount)).encode())[0])

    def check(self, keys: list[str]) -> bool:
        return self._ask(b"c", *map(_bytes, keys))[0] == b"1"

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self._ask(b"w", self._ms(timeout), *map(_bytes, keys))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self._ask(b"x", _bytes(key), _bytes(expected), _bytes(desired))[0]

    def delete_key(self, key: str) -> bool:
        return self._ask(b"d", _bytes(key))[0] == b"1"

    def num_keys(self) -> int:
        return int(self._ask(b"n")[0])


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
