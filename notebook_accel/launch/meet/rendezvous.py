"""Where the ranks meet, private to the job: no key of a launch is readable or writable by
anyone outside it (README: "Who can reach a launch").

    one machine   each attempt: a memfd in the launcher (no file, no port), which the workers
                  open as /proc/<launcher pid>/fd/<n> for torch's FileStore. Only this user
                  (and root) may open another process's fds; the memfd ends with the launcher
                  and its workers, so a SIGKILLed kernel leaves nothing behind.
    several       machine 0, the whole launch: the table (table.py) behind the gate (auth.py)
                  on master_addr:master_port. Launchers prove the job's secret (secret.py)
                  and keep in step under "group/" (group.py); workers prove the launch's worker
                  key (random per launch, group/worker_key, read by the proven launchers) and
                  meet under "attempt/<n>/".
                  machine k > 0: joins the gate as a launcher.

The workers find their store in NOTEBOOK_ACCEL_STORE (worker_store.py routes env:// there).
Each attempt meets in fresh keys (a fresh memfd or namespace), because torch's env://
rendezvous reads the keys as they are: a restarted attempt meeting in the old keys would read
the previous attempt's gloo addresses.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from ... import env
from ...config import LaunchConfig
from ...errors import LaunchError
from . import auth
from .secret import sharing_advice
from .table import Table, TableClient, serve

__all__ = ["Meeting", "meeting"]

_WORKER_KEY = "worker_key"


@dataclass
class Meeting:
    """This machine's side of a launch's rendezvous.

    Attributes:
        group: the launchers' keys (group.py); None on a single machine.
        gate: machine 0's listener, when this machine is machine 0 of several.
    """

    config: LaunchConfig
    group: TableClient | None = None
    gate: auth.Gate | None = None
    worker_key: bytes = b""
    notes: list[str] = field(default_factory=list)
    refused: dict[tuple[str, str], int] = field(default_factory=dict)

    def refusals(self, final: bool = False) -> list[str]:
        """Lines for the banner: each address and reason machine 0 refused, once; with
        ``final`` (the launch ended), how many times in all where it came back."""
        if self.gate is None:
            return []
        lines = []
        for who, why, n in self.gate.refusals():
            if (who, why) not in self.refused:
                lines.append(f"refused a connection from {who}: {why}")
            self.refused[who, why] = self.refused.get((who, why), 0) + n
        if final:
            lines += [
                f"refused {n} connections in all from {who}: {why}"
                for (who, why), n in self.refused.items()
                if n > 1
            ]
        return lines

    @contextlib.contextmanager
    def attempt(self, number: int) -> Iterator[tuple[int, list[tuple[str, str]]]]:
        """The workers' MASTER_PORT and variables for attempt ``number`` (fresh keys)."""
        config = self.config
        if self.group is None:
            with _private_file() as path:
                yield _unused_port(), [(env.STORE_VARIABLE, f"file://{path}")]
            return
        where = f"table://{config.master_addr}:{config.master_port}/{number}"
        variables = [(env.STORE_VARIABLE, where), (env.STORE_KEY_VARIABLE, self.worker_key.hex())]
        yield config.master_port or 0, variables


@contextlib.contextmanager
def _private_file() -> Iterator[str]:
    """A path that only this user can open, gone when the block ends or the process dies."""
    if hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd"):
        fd = os.memfd_create("notebook-accel-store", os.MFD_CLOEXEC)
        try:
            yield f"/proc/{os.getpid()}/fd/{fd}"
        finally:
            os.close(fd)
        return
    # No memfd (macOS): a file in a folder only this user can enter, removed at the end (a
    # killed kernel leaves it in the temporary folder).
    folder = tempfile.mkdtemp(prefix="notebook-accel-")
    try:
        yield os.path.join(folder, "store")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _unused_port() -> int:
    """A port nobody listens on, as MASTER_PORT: the store is not there, but a function that
    opts out of it (tcp://MASTER_ADDR:MASTER_PORT, its rank 0 hosting) finds the port free."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve_member(table: Table, channel: auth.Channel, role: bytes) -> None:
    if role == auth.LAUNCHER:
        serve(channel, table, b"group/")
        return
    attempt = channel.recv(limit=16)
    if not attempt.isdigit():
        return
    serve(channel, table, b"attempt/" + attempt + b"/")


@contextlib.contextmanager
def meeting(config: LaunchConfig, timeout: float, secret: bytes = b"") -> Iterator[Meeting]:
    """The rendezvous of one launch on this machine.

    Args:
        config: the launch's configuration.
        timeout: seconds a machine waits for machine 0.
        secret: the job's secret (secret.job_secret()), for several machines.
    """
    if config.num_nodes == 1:
        yield Meeting(config)
        return
    if config.node_rank != 0:
        group = _join(config, secret, timeout)
        try:
            yield Meeting(config, group, worker_key=bytes.fromhex(group.get(_WORKER_KEY).decode()))
        finally:
            group.close()
        return
    table, worker_key = Table(), secrets.token_bytes(32)
    keys = {auth.LAUNCHER: secret, auth.WORKER: worker_key}
    gate = auth.Gate(
        config.master_addr,
        config.master_port or 0,
        keys,
        lambda channel, role: _serve_member(table, channel, role),
    )
    group = TableClient.local(table, b"group/", timeout)
    group.set(_WORKER_KEY, worker_key.hex())
    try:
        yield Meeting(config, group, gate, worker_key, [gate.note] if gate.note else [])
    finally:
        table.close()
        gate.close()


def _join(config: LaunchConfig, secret: bytes, timeout: float) -> TableClient:
    try:
        channel = auth.connect(
            config.master_addr,
            config.master_port or 0,
            auth.LAUNCHER,
            secret,
            timeout,
            "master_addr",
        )
    except auth.ProofError as exc:
        where = f"master_addr={config.master_addr!r}"
        raise LaunchError(f"{where}: {exc}. {sharing_advice()}") from None
    return TableClient.over(channel, timeout)
