"""The TCPStore the Ray ranks meet in, hosted by rank 0's task on its node.

    bundle 0's task: hosted_store(node ip, port 0) -> its address in Ray's KV store
    every other rank: a TCPStore client to it

It listens on the node's address, unauthenticated, like Ray's own ports: a Ray cluster is a
trusted network by Ray's security model (README, "Who can reach a launch"), and anyone who
reaches it can run code through Ray itself. The local engine never uses it (rendezvous.py).
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ....errors import ConfigError

__all__ = ["hosted_store"]

_STORE_TIMEOUT = datetime.timedelta(minutes=30)


@contextmanager
def hosted_store(host: str, port: int, backlog: int) -> Iterator[tuple[Any, int]]:
    """A TCPStore server in this process, listening only on ``host``."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(max(128, backlog))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            "master_port",
            port,
            "a free TCP port",
            f"Binding it failed: {exc}. Pass master_port=None to let the OS pick one.",
        ) from exc
    bound = sock.getsockname()[1]
    # TCPStore binds to every interface when it opens the port itself; handing it our socket
    # keeps it on ``host``. The store owns and closes the socket.
    store = dist.TCPStore(
        host,
        bound,
        None,
        True,
        _STORE_TIMEOUT,
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
        use_libuv=True,
    )
    try:
        yield store, bound
    finally:
        del store
