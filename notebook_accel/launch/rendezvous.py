"""Where the ranks meet: torch TCPStores hosted by the launcher process, as torchrun's agent.

    one machine   each attempt: a fresh store on 127.0.0.1 at a port the OS picks
                  -> the workers' MASTER_PORT (re-runs and two notebooks never collide)
    several       machine 0, whole launch: the group store on master_port (group.py uses it
                  for restarts, failures and the exit barrier)
                  machine 0, each attempt: a fresh workers' store at a port the OS picks,
                  published in the group store as notebook_accel/port/<attempt>;
                  the other machines read the port there.

Every worker connects as a client (TORCHELASTIC_USE_AGENT_STORE=True). The store is fresh for
each attempt because torch's env:// rendezvous uses the agent store's keys as they are
(torch/distributed/rendezvous.py: "We create a new TCPStore for every retry"): a restarted
attempt meeting in the old store would read the previous attempt's gloo addresses.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..config import LaunchConfig
from ..errors import ConfigError, LaunchError

__all__ = ["group_store", "hosted_store", "workers_store"]

_PORT_KEY = "notebook_accel/port/"
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
    # keeps a single-machine launch on loopback. The store owns and closes the socket.
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


@contextmanager
def group_store(config: LaunchConfig, world_size: int) -> Iterator[tuple[Any | None, int]]:
    """Machine 0 of several hosts the group store on ``master_port``; else nothing."""
    if config.num_nodes == 1 or config.node_rank != 0:
        yield None, config.master_port or 0
        return
    with hosted_store("0.0.0.0", config.master_port or 0, world_size) as hosted:
        yield hosted


@contextmanager
def workers_store(
    config: LaunchConfig, group: Any | None, attempt: int, world_size: int
) -> Iterator[int]:
    """The port of this attempt's workers' store (hosted here on machine 0)."""
    key = f"{_PORT_KEY}{attempt}"
    if config.node_rank != 0:
        assert group is not None, "machines other than 0 always join the group store"
        try:
            port = int(bytes(group.get(key)))
        except (RuntimeError, ValueError) as exc:
            raise LaunchError(
                f"machine 0 at {config.master_addr} did not publish attempt {attempt}'s store "
                f"({exc})."
            ) from exc
        yield port
        return
    single = config.num_nodes == 1
    with hosted_store("127.0.0.1" if single else "0.0.0.0", 0, world_size) as (_store, port):
        if group is not None:
            group.set(key, str(port))
        yield port
