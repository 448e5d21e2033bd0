"""A real Jupyter kernel for the benchmarks, and the memory of the processes it leads.

``Kernel`` starts this interpreter's ipykernel (this checkout importable; Unix sockets in a
private folder: no TCP port), runs cells as a notebook's, and shuts it down. ``memory``
reads the kernel and every process under it (forkservers, idle and session workers, a
resource tracker), each counted once by pid: its proportional set size without shared
memory, plus the shared-memory segments they hold (memfd files, by inode, counted once).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
HUNG = 600  # seconds after which a cell counts as hung


class Kernel:
    """A fresh kernel for a ``with`` block; ``environ``: variables added to its environment."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        self.environ = {**os.environ, "PYTHONWARNINGS": "ignore", **(environ or {})}
        self.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        self.environ.pop("NOTEBOOK_ACCEL_NO_WARMUP", None)

    def __enter__(self) -> Kernel:
        from jupyter_client.manager import KernelManager

        self._folder = tempfile.TemporaryDirectory()
        self.manager = KernelManager(
            kernel_name="python3", transport="ipc", ip=f"{self._folder.name}/kernel"
        )
        self.manager.start_kernel(cwd=str(ROOT), env=self.environ)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=HUNG)
        self.pid = int(self.cell("import os\nprint(os.getpid())"))
        return self

    def __exit__(self, *_: object) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self._folder.cleanup()

    def cell(self, code: str) -> str:
        """Run one cell; its stdout (raises with the traceback if it failed)."""
        return self.timed(code)[1]

    def timed(self, code: str) -> tuple[float, str]:
        """Run one cell; the seconds from the request to the reply (a cell's end hooks
        included: IPython's post_run_cell runs before the reply), and its stdout."""
        out: list[str] = []

        def hook(message: dict[str, Any]) -> None:
            if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
                out.append(message["content"]["text"])

        start = time.perf_counter()
        reply = self.client.execute_interactive(code, output_hook=hook, timeout=HUNG)
        seconds = time.perf_counter() - start
        if reply["content"]["status"] != "ok":
            raise RuntimeError("\n".join(reply["content"].get("traceback", [])))
        return seconds, "".join(out).strip()

    def json(self, code: str) -> Any:
        """Run one cell that prints JSON last; that value."""
        return json.loads(self.cell(code).splitlines()[-1])


def _rollup(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as lines:
        for line in lines:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0]) * 1024
    return fields


def _segments(pid: int, found: dict[int, int]) -> None:
    """The memfd segments ``pid`` holds, as fds or mappings: inode -> bytes allocated."""
    places = [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
    try:  # mapped only (a result the notebook keeps): readable with CAP_SYS_ADMIN
        places += [f"/proc/{pid}/map_files/{m}" for m in os.listdir(f"/proc/{pid}/map_files")]
    except OSError:
        pass
    for place in places:
        try:
            if "notebook-accel" in os.readlink(place):
                info = os.stat(place)
                found[info.st_ino] = info.st_blocks * 512
        except OSError:
            continue


def processes(pid: int) -> list[int]:
    """``pid`` and every process under it, each once."""
    try:
        root = psutil.Process(pid)
        return sorted({pid, *(child.pid for child in root.children(recursive=True))})
    except psutil.Error:
        return []


def memory(pid: int) -> int:
    """Bytes the processes under ``pid`` (and it) use: PSS without shared memory, each
    process once, plus their shared-memory segments, each once."""
    total = 0
    segments: dict[int, int] = {}
    for each in processes(pid):
        try:
            fields = _rollup(each)
            total += fields.get("Pss", 0) - fields.get("Pss_Shmem", 0)
            _segments(each, segments)
        except OSError:
            continue  # ended meanwhile
    return total + sum(segments.values())
