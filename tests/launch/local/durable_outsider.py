"""An outsider: a process that tries to reach a durable session it does not own.

    python3 durable_outsider.py SOCKET MARKER        (any Python: the standard library only)

Tries to list the session's folder, then to connect to its socket and send, in place of a
proof, a pickle that would create MARKER if anyone unpickled it. Prints one JSON object: each
try's outcome ("refused: ..." or "accepted").
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import sys
from pathlib import Path
from typing import Any


class Planted:
    """Unpickles as ``Path(marker).touch()``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def _list(folder: str) -> str:
    try:
        os.listdir(folder)
    except OSError as exc:
        return f"refused: {type(exc).__name__}"
    return "accepted"


def _connect(path: str, marker: str) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    try:
        sock.connect(path)
        data = pickle.dumps(Planted(marker))
        sock.sendall(struct.pack(">I", len(data)) + data)
        reply = sock.recv(4096)
        while reply and b"refused" not in reply:
            more = sock.recv(4096)
            if not more:
                break
            reply += more
    except OSError as exc:
        return f"refused: {type(exc).__name__}"
    finally:
        sock.close()
    return f"refused: {reply[-80:]!r}" if b"refused" in reply or not reply else "accepted"


def main() -> None:
    path, marker = sys.argv[1], sys.argv[2]
    tries = {
        "list": _list(str(Path(path).parent.parent)),
        "connect": _connect(path, marker),
    }
    print(json.dumps(tries), flush=True)


if __name__ == "__main__":
    main()
