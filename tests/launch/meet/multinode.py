"""Two "machines" on one host: two network namespaces joined by a veth pair.

    namespace na0-<id>  10.<x>.<y>.1/24  veth va<id>  <--->  veth vb<id>  10.<x>.<y>.2/24  na1-<id>

Each namespace has its own loopback and its own address, so nothing of one "machine" is
reachable from the other except over the veth link, as with two real hosts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Machine:
    namespace: str
    address: str

    def popen(self, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, *argv],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def skip_without_netns() -> None:
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("two network namespaces need root on Linux")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    probe = f"na-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create a network namespace here: {exc}")
    _ip("netns", "delete", probe)


@contextmanager
def two_machines() -> Iterator[tuple[Machine, Machine]]:
    """Create the namespaces and the link; remove them afterwards, whatever happened."""
    skip_without_netns()
    tag = f"{os.getpid() % 100000}"
    subnet = f"10.{77 + os.getpid() % 100}.{os.getpid() % 250}"
    names = (f"na0-{tag}", f"na1-{tag}")
    links = (f"va{tag}", f"vb{tag}")
    try:
        for name in names:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for i, (name, link) in enumerate(zip(names, links, strict=True)):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{subnet}.{i + 1}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
        yield Machine(names[0], f"{subnet}.1"), Machine(names[1], f"{subnet}.2")
    finally:
        for name in names:  # deleting a namespace deletes its end of the veth pair, and both
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=10)


def finish(procs: Sequence[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str]]:
    """Wait for every process; kill all of them if one runs past ``timeout``."""
    out: list[tuple[int, str]] = []
    try:
        for proc in procs:
            text, _ = proc.communicate(timeout=timeout)
            out.append((proc.returncode, text))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        texts = [p.communicate()[0] for p in procs]
        pytest.fail("a machine hung:\n" + "\n----\n".join(texts))
    return out


def free_port() -> str:
    """A port nobody listens on, on 127.0.0.1 (for two launchers of this host)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def two_launchers(
    argv: Callable[[int], list[str]], env: Callable[[int], dict[str, str]], timeout: float
) -> list[tuple[int, str]]:
    """Machines 0 and 1 as two processes of this host: ``argv(node)`` with ``env(node)``;
    their exit codes and output."""
    procs = [
        subprocess.Popen(
            argv(node), env=env(node), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for node in (0, 1)
    ]
    return finish(procs, timeout)
