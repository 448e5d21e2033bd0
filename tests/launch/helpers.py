"""Helpers for the launcher tests: what processes, fds and ports this process holds."""

from __future__ import annotations

import os
import select
from multiprocessing import forkserver

import psutil


def worker_processes() -> list[psutil.Process]:
    """Every process started by the forkserver (our workers and their children), but the
    idle ones pre-forked for the next launch (engine.idle_pool: they never ran anything)."""
    from notebook_accel.launch.local.idle import idle_pool

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return []
    idle_pool.settle()
    idle = idle_pool.pids()
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [child for child in children if child.pid not in idle]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def socket_inodes(pid: int | str = "self") -> set[str]:
    """The sockets process ``pid`` (default: this one) has open, by inode."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listening_ports(pid: int | str = "self") -> set[int]:
    """TCP ports process ``pid`` (default: this one) is listening on (IPv4 and IPv6)."""
    mine = socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in mine:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def ends(pid: int, within: float = 60.0) -> bool:
    """Waits for process ``pid`` to end (its pidfd becomes readable): whether it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], within)[0])
    finally:
        os.close(fd)
