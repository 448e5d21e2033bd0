"""An outsider: a real process that tries to get into a launch it is not a member of.

    python -m tests.launch.meet.outsider HOST PORT MARKER

Waits until HOST:PORT accepts connections (an event, not a delay), then tries, in order:

    tcpstore   torch's TCPStore client, to plant a pickle under the keys torch's c10d
               rendezvous and our launches use (what worked against main before issue 20)
    secret     notebook_accel's own protocol with a wrong secret, as a launcher
    worker     the same as a worker, with a wrong launch key

The pickle, if anyone unpickled it, would create MARKER. Prints one JSON object: each try's
outcome ("refused: ..." or "accepted").
"""

from __future__ import annotations

import datetime
import json
import pickle
import socket
import sys
import time
from pathlib import Path
from typing import Any


class Planted:
    """Unpickles as ``Path(marker).touch()``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.marker),))


def _wait_open(host: str, port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{host}:{port} never opened")


def _tcpstore(host: str, port: int, marker: str) -> str:
    import torch.distributed as dist

    planted = pickle.dumps(Planted(marker))
    try:
        store = dist.TCPStore(
            host, port, is_master=False, timeout=datetime.timedelta(seconds=5), use_libuv=False
        )
        for key in (f"torch.rendezvous.notebook-accel-{port}", "notebook_accel/failed"):
            store.set(key, planted)
    except Exception as exc:  # noqa: BLE001 - any failure is the refusal being tested
        return f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return "accepted"


def _ours(host: str, port: int, role: bytes) -> str:
    from notebook_accel.launch.meet import auth

    try:
        channel = auth.connect(host, port, role, b"not the job's secret", 10, "outsider")
    except auth.ProofError as exc:
        return f"refused: {exc}"
    channel.close()
    return "accepted"


def main() -> None:
    host, port, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    _wait_open(host, port)
    from notebook_accel.launch.meet import auth

    tries = {
        "tcpstore": _tcpstore(host, port, marker),
        "secret": _ours(host, port, auth.LAUNCHER),
        "worker": _ours(host, port, auth.WORKER),
    }
    print(json.dumps(tries), flush=True)


if __name__ == "__main__":
    main()
