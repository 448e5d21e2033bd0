"""The stall report's look at this machine's ranks: an Engine's workers, a TPU launch's
processes.

    ask()      for each rank still at work that armed (its responder thread is in
               /proc/<pid>/task by its name, its memfd in /proc/<pid>/fd: rank/where.py):
               its CPU time read (/proc/<pid>/stat), then ANSWER to the responder thread:
               its Where comes on the message pipe
    report()   each rank: its answer, else DUMP and the memfd's new text (its Python held
               inside C code, say); its CPU share since ask(); its child processes (a
               DataLoader's workers: their own stacks, dumped one after the other into the
               same memfd: faulthandler skips a dump while another of the process runs);
               py-spy's native frames where it is installed and allowed (ptrace); the text
               from wire/where.report

Nothing here runs until a look; /proc is read only then.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ...reporting.channel import Where
from ..rank.where import ANSWER, DUMP, MEMFD, RESPONDER
from ..wire.where import Child, RankView, parse_faulthandler, report
from .engine import Engine

__all__ = ["Processes", "Process", "engine_ranks"]

_CLOCK = os.sysconf("SC_CLK_TCK")
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "uninterruptible sleep (waiting for a device or a file system)",
    "T": "stopped",
    "t": "stopped by a debugger",
    "Z": "a zombie",
}
_SETTLE = 0.05  # seconds of no growth that end a process's dump into the memfd
_DUMP_WAIT = 0.5  # seconds a child's dump may take at most
# seconds py-spy may take per process (all at once): it reads libtorch's symbols, 0.4 s on
# an idle machine, 4 s on a loaded 2-core one; the report waits no longer (stall_time + 5 s)
_PY_SPY_WAIT = 4.3
_MAX_CHILDREN = 4  # child processes of a rank whose stacks are read
_NATIVE_WIDTH = 120  # py-spy's lines shown up to this many characters (C++ names are long)
_SLOW = "(py-spy took longer than the report could wait: left out)"


@dataclass
class Process:
    """One rank's process as the look sees it (``rank``: its rank, or the first of those a
    TPU process holds; ``state``: what the launcher knows of its ending)."""

    rank: int
    pid: int | None
    state: str = "running"
    label: str = ""
    answers: bool = True  # it sends a Where when asked (a TPU process: the memfd only)
    # set by a look
    memfd: str = ""  # /proc/<pid>/fd/<n> of its memfd, "" where it has not armed
    cpu: tuple[float, float] | None = None  # (when, CPU seconds) at the look's start
    children: list[int] = field(default_factory=list)


def _proc(pid: int, *parts: str) -> Path:
    return Path("/proc", str(pid), *parts)


def _memfd(pid: int) -> str:
    """The path of ``pid``'s memfd of rank/where.py, or "" where it has none (not armed)."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(_proc(pid, "fd")):
            path = str(_proc(pid, "fd", fd))
            with contextlib.suppress(OSError):
                if MEMFD in os.readlink(path):
                    return path
    return ""


def _responder(pid: int) -> int | None:
    """The thread id of ``pid``'s responder thread (its name), or None."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(_proc(pid, "task")):
            with contextlib.suppress(OSError):
                if _proc(pid, "task", tid, "comm").read_bytes().strip() == RESPONDER:
                    return int(tid)
    return None


def _stat(pid: int) -> tuple[str, float] | None:
    """``pid``'s state letter and CPU seconds (user + system), from /proc/<pid>/stat."""
    try:
        text = _proc(pid, "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "(comm)", which may hold spaces
    return fields[0], (int(fields[11]) + int(fields[12])) / _CLOCK


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(_proc(pid, "task")):
            with contextlib.suppress(OSError):
                found += [int(c) for c in _proc(pid, "task", tid, "children").read_text().split()]
    return found


def _signal(pid: int, tid: int | None, number: int) -> None:
    """``number`` to thread ``tid`` of ``pid`` (its responder: the user's thread goes on
    undisturbed), else to the process."""
    if tid is not None:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            if ctypes.CDLL(None, use_errno=True).tgkill(pid, tid, number) == 0:
                return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, number)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as memfd:
            memfd.seek(offset)
            return memfd.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _dumped(path: str, offset: int, wait: float) -> str:
    """The text written into the memfd after ``offset`` once it stops growing (``wait`` s at
    most)."""
    end = time.monotonic() + wait
    size = _size(path)
    while time.monotonic() < end:
        time.sleep(_SETTLE)
        now = _size(path)
        if now == size and now > offset:
            break
        size = now
    return _read(path, offset)


def _dump(pid: int, memfd: str, tid: int | None, by: str = "signal") -> Where | None:
    """``pid``'s stacks as faulthandler writes them from its signal handler (the GIL or not)
    into its memfd: DUMP, then the new text once it stops growing."""
    offset = _size(memfd)
    _signal(pid, tid, DUMP)
    threads = parse_faulthandler(_dumped(memfd, offset, _DUMP_WAIT))
    return Where(threads, by=by) if threads else None


def _py_spy() -> str | None:
    """py-spy's executable (the ``py-spy`` extra), or None."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def _native(program: str, pid: int, wait: float = _PY_SPY_WAIT) -> str:
    """py-spy's dump of ``pid`` with native frames; "" where it is not allowed (it needs
    ptrace rights: the same user and ptrace_scope 0, or CAP_SYS_PTRACE in a container) or
    fails."""
    try:
        done = subprocess.run(
            [program, "dump", "--pid", str(pid), "--native"],
            capture_output=True,
            text=True,
            timeout=wait,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _SLOW
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _user_thread(text: str, where: Where | None) -> str:
    """Of py-spy's dump (threads headed ``Thread <tid> (state): "name"``, innermost frame
    first), the thread running the user's function down to the launcher's entry (hidden as
    in the report), long C++ names cut."""
    from ..wire.where import ENTRIES, entry_index

    names = [s.name for s in (where.threads if where else ()) if entry_index(s) is not None]
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("Thread "):
            blocks.append([line])
        elif blocks and line.startswith(" "):
            blocks[-1].append(line)
    chosen = next(
        (b for b in blocks if any(f': "{name}"' in b[0] for name in names)),
        blocks[0] if blocks else [],
    )
    kept = []
    for line in chosen:
        if any(f"{name} (" in line and path in line for path, name in ENTRIES):
            break  # the launcher's frames from here on
        kept.append(line if len(line) <= _NATIVE_WIDTH else line[: _NATIVE_WIDTH - 3] + "...")
    return "\n".join(kept)


class Processes:
    """The stall report's side of a launch on this machine (show/stall.Ranks).

    Args:
        processes: the ranks' processes now (called at each look: a session's ranks come and
            go, a TPU launch's processes connect as they start).
        origins: the payload's cell-defined functions and their files (payload.code_origins).
        patience: seconds to wait for answers.
    """

    def __init__(
        self,
        processes: Callable[[], Iterable[Process]],
        origins: Iterable[tuple[str, str]],
        patience: float = 1.5,
    ) -> None:
        self.processes = processes
        self.origins = tuple(origins)
        self.patience = patience
        self._looked: list[Process] = []

    def ask(self) -> set[int] | None:
        asked: set[int] = set()
        starting = False
        self._looked = list(self.processes())
        for process in self._looked:
            pid = process.pid
            starting = starting or process.state == "starting"
            if pid is None or process.state != "running":
                continue
            tid = _responder(pid)  # started last by arm(): its handlers are in place
            process.memfd = _memfd(pid) if tid is not None else ""
            if not process.memfd:
                starting = True  # not armed yet: a signal would end it
                continue
            found = _stat(pid)
            process.cpu = (time.monotonic(), found[1]) if found else None
            process.children = _children(pid)[:_MAX_CHILDREN]
            if process.answers:
                _signal(pid, tid, ANSWER)
                asked.add(process.rank)
        return None if starting else asked

    def report(self, answers: dict[int, Where], head: str, native: float | None) -> str:
        program = _py_spy() if native is not None else None
        looked = self._looked
        views = [self._view(process, answers.get(process.rank)) for process in looked]
        if program is not None and native is not None:
            wait = min(_PY_SPY_WAIT, native - time.monotonic())
            if wait > 0.5:
                views = self._with_native(program, views, wait)
        return report(views, self.origins, head)

    def _view(self, process: Process, answer: Where | None) -> RankView:
        pid = process.pid
        state = "starting" if process.state == "running" and not process.memfd else process.state
        if pid is None or state != "running":
            return RankView(process.rank, state=state, pid=pid, label=process.label)
        by = "signal" if process.answers else "dump"
        where = answer or (
            _dump(pid, process.memfd, _responder(pid), by) if process.memfd else None
        )
        found = _stat(pid)
        cpu = None
        if found is not None and process.cpu is not None:
            seconds = time.monotonic() - process.cpu[0]
            cpu = 100.0 * (found[1] - process.cpu[1]) / max(seconds, 1e-6)
        return RankView(
            process.rank,
            where=where,
            state=process.state,
            pid=pid,
            cpu=cpu,
            process=_STATES.get(found[0], found[0]) if found else "gone",
            children=tuple(self._child(process, child) for child in process.children),
            label=process.label,
        )

    def _child(self, rank: Process, pid: int) -> Child:
        """A child process of a rank; its stack where it is a fork of the rank (it shares the
        rank's memfd, and with it the signal handlers that write there)."""
        found = _stat(pid)
        state = _STATES.get(found[0], found[0]) if found else "gone"
        memfd = _memfd(pid)
        if not memfd or os.stat(memfd).st_ino != os.stat(rank.memfd).st_ino:
            return Child(pid, state)
        return Child(pid, state, None, _dump(pid, memfd, None, "dump"))

    def _with_native(self, program: str, views: list[RankView], wait: float) -> list[RankView]:
        """Each running rank's view with py-spy's frames, the processes dumped at once."""

        def dumped(view: RankView) -> RankView:
            if view.pid is None or view.state != "running":
                return view
            text = _native(program, view.pid, wait)
            if not text:
                return view
            native = text if text == _SLOW else _user_thread(text, view.where)
            return RankView(**{**view.__dict__, "native": native})

        with ThreadPoolExecutor(max_workers=max(1, min(len(views), 8))) as pool:
            return list(pool.map(dumped, views))


def engine_ranks(engine: Engine) -> Callable[[], list[Process]]:
    """The processes of ``engine``'s ranks, with what the engine knows of their endings."""

    def processes() -> list[Process]:
        found = []
        for rank in engine.ranks:
            state = "running"
            if rank.result is not None:
                state = "finished"
            elif rank.failure is not None:
                state = "failed"
            elif rank.died_at is not None or rank.exited:
                state = "died"
            found.append(Process(rank.rank, rank.process.pid, state))
        return found

    return processes
