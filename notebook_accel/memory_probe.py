"""How much memory this process may use: the machine's, or its container's where less.

    /proc/meminfo            MemTotal, MemAvailable (the kernel's estimate: free memory and
                             what it can reclaim without swapping)
    /proc/self/cgroup   ->   this process's memory cgroup (v2: the unified hierarchy; v1: the
    /proc/self/mountinfo     memory controller's), where it is mounted; or the folder
                             NOTEBOOK_ACCEL_CGROUP names (env.cgroup_folder)
    that folder and those    v2: memory.max, memory.current, memory.stat's inactive_file
      above it               v1: memory.limit_in_bytes (memory.stat's hierarchical_memory_limit
                             where given), memory.usage_in_bytes, total_inactive_file

    total_memory()      = min(MemTotal, the lowest limit)
    available_memory()  = min(MemAvailable, each limit - what its cgroup already uses,
                              less the file cache it could drop)

A container on Colab, Kaggle or Docker sees the host's /proc/meminfo: its limit is only in its
cgroup, and the OOM killer goes by that. One probe serves every budget: shared memory's
(launch/wire/shm.py: what a launch may copy, the cache's default limit) and a device map's CPU
budget (big_model/memory.py).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from . import env

__all__ = ["Limit", "available_memory", "container_limits", "memory_folder", "total_memory"]

_UNLIMITED = 1 << 60  # v1 writes "no limit" as a page count near 2**63


@dataclass(frozen=True)
class Limit:
    """One cgroup's limit on the memory of the processes in it.

    Attributes:
        folder: the cgroup's folder.
        limit: bytes its processes may use together.
        used: bytes charged to it now, less the file cache it could drop (inactive files).
    """

    folder: Path
    limit: int
    used: int

    @property
    def left(self) -> int:
        return max(self.limit - self.used, 0)


def _meminfo() -> dict[str, int]:
    found = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                found[name] = int(parts[0]) * 1024
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _number(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def _stat(path: Path) -> dict[str, int]:
    found = {}
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[name] = int(value)
    return found


def memory_folder(cgroup: str, mountinfo: str) -> Path | None:
    """The folder of this process's memory cgroup, from ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo`` as text: the v1 memory controller's where it is mounted, else
    the v2 hierarchy's. None where neither is mounted.

    Example:
        >>> memory_folder("0::/user.slice\\n", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 c rw\\n")
        PosixPath('/sys/fs/cgroup/user.slice')
    """
    paths: dict[str, str] = {}  # "memory" (v1) or "" (v2) -> the cgroup's path
    for line in cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            paths[""] = path
        elif "memory" in controllers.split(","):
            paths["memory"] = path
    mounts: dict[str, tuple[str, str]] = {}  # the same keys -> (mount's root, mount point)
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        kind, options = fields[dash + 1], fields[dash + 3] if len(fields) > dash + 3 else ""
        if kind == "cgroup2":
            mounts.setdefault("", (fields[3], fields[4]))
        elif kind == "cgroup" and "memory" in options.split(","):
            mounts.setdefault("memory", (fields[3], fields[4]))
    for key in ("memory", ""):
        if key in paths and key in mounts:
            root, point = mounts[key]
            path = paths[key]
            # Without a cgroup namespace the mount's root is the container's own cgroup.
            inside = os.path.relpath(path, root) if path.startswith(root) else "."
            return Path(point.replace("\\040", " ")) / inside
    return None


def _this_folder() -> Path | None:
    named = env.cgroup_folder()
    if named is not None:
        return named
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    return memory_folder(cgroup, mountinfo)


def _limit_here(folder: Path) -> Limit | None:
    """The limit set on ``folder`` itself (v2) or on it and above it (v1), if any."""
    if (folder / "memory.max").exists() or (folder / "memory.current").exists():
        limit = _number(folder / "memory.max")  # "max": None
        used = _number(folder / "memory.current")
        cache = _stat(folder / "memory.stat").get("inactive_file", 0)
    else:
        stat = _stat(folder / "memory.stat")
        limit = stat.get("hierarchical_memory_limit") or _number(folder / "memory.limit_in_bytes")
        used = _number(folder / "memory.usage_in_bytes")
        cache = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    if limit is None or limit >= _UNLIMITED:
        return None
    return Limit(folder, limit, max((used or 0) - cache, 0))


def container_limits() -> list[Limit]:
    """The limits on this process's memory cgroup and those above it (the closest first);
    [] where none is set (or no cgroup is mounted)."""
    folder = _this_folder()
    found: list[Limit] = []
    seen = set()
    while folder is not None and folder not in seen:
        seen.add(folder)
        if not any((folder / name).exists() for name in ("memory.max", "memory.stat")):
            break  # above the hierarchy's root
        limit = _limit_here(folder)
        if limit is not None:
            found.append(limit)
        folder = folder.parent
    return found


def total_memory() -> int:
    """This machine's memory, or its container's limit where lower.

    Example:
        >>> total_memory() > 0
        True
    """
    total = _meminfo().get("MemTotal") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min([total, *(limit.limit for limit in container_limits())])


def available_memory() -> int:
    """Memory this process can still take without swapping or the OOM killer: the machine's
    estimate (MemAvailable), or what its container's limit leaves where less.

    Example:
        >>> 0 < available_memory() <= total_memory()
        True
    """
    found = _meminfo()
    available = found.get("MemAvailable")
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(min([available, *(limit.left for limit in container_limits())]), 0)
