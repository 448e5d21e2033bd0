"""Where this user's durable sessions live, and what ``notebook_accel.sessions()`` lists.

    env.durable_folder()            mode 0700, owned by this user (else refused)
      <name>/                       one session, mode 0700
        socket                      the supervisor's gate (a unix socket, mode 0600)
        status.json                 name, state, ranks, started, last line, pid (JSON only)
        supervisor.log              the supervisor's own stdout and stderr
        jobs/<n>.log, <n>.old       each job's kept output (journal.py)

Only this user (and root) can enter the folder, so only they can reach the socket; the
socket then asks for the user's secret (link.py) before anything is unpickled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .... import env
from ....errors import ConfigError

__all__ = ["SessionInfo", "folder", "listing", "session_folder", "sessions", "write_status"]


def folder() -> Path:
    """This user's folder of durable sessions, made (mode 0700) on first use.

    Raises:
        ConfigError: it belongs to another user, or other users may enter it.
    """
    path = env.durable_folder()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ConfigError(
            str(path),
            f"owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}",
            f"a folder of uid {os.getuid()} with mode 0700",
            "Durable sessions keep their sockets there: other users must not reach them.",
        )
    return path


def session_folder(name: str) -> Path:
    """The folder of the durable session ``name`` (not made here)."""
    return folder() / name


def write_status(where: Path, status: dict[str, Any]) -> None:
    """Replace ``where``'s status.json whole (a reader never sees half of it)."""
    temporary = where / f".status-{os.getpid()}.json"
    temporary.write_text(json.dumps(status), encoding="utf-8")
    os.replace(temporary, where / "status.json")


def _read_status(where: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((where / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_status(where: Path) -> dict[str, Any] | None:
    """The status of the session kept in ``where`` while its supervisor runs; a folder whose
    supervisor is gone (killed, the machine restarted) is removed and None returned."""
    status = _read_status(where)
    if status is not None and _alive(status.get("pid")):
        return status
    if status is None and time.time() - _made(where) < 60:
        return {"state": "starting"}  # a supervisor between its start and its first status
    shutil.rmtree(where, ignore_errors=True)
    return None


def _made(where: Path) -> float:
    try:
        return where.stat().st_mtime
    except OSError:
        return 0.0


@dataclass(frozen=True)
class SessionInfo:
    """One durable session of this user (``notebook_accel.sessions()``).

    Attributes:
        name: the name ``Workers.attach`` takes.
        state: ``"open"``, ``"running"`` (a job or a run), ``"closed"`` (its workers are gone:
            ``why`` in ``last_line``), or ``"starting"``.
        ranks: how many workers.
        started: when it started (seconds since the epoch).
        last_line: the last line its ranks printed (or why it closed).
    """

    name: str
    state: str
    ranks: int
    started: float
    last_line: str

    def __repr__(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return (
            f"<session {self.name!r}: {self.state}, {self.ranks} ranks, started {when}, "
            f"last line {self.last_line!r}>"
        )


def listing() -> list[SessionInfo]:
    """This user's durable sessions whose supervisor runs, by name."""
    found = []
    for where in sorted(folder().iterdir()):
        if not where.is_dir():
            continue
        status = live_status(where)
        if status is None:
            continue
        found.append(
            SessionInfo(
                name=where.name,
                state=str(status.get("state", "?")),
                ranks=int(status.get("ranks", 0)),
                started=float(status.get("started", 0.0)),
                last_line=str(status.get("last_line", "")),
            )
        )
    return found


def sessions() -> list[SessionInfo]:
    """This user's durable sessions on this machine (``Workers(..., durable=True)``): name,
    state, ranks, when started, last line. ``Workers.attach(name)`` takes one back.

    Example:
        >>> import notebook_accel
        >>> notebook_accel.sessions()  # doctest: +SKIP
        [<session 'exp1': running, 2 ranks, started 2026-12-05 21:03:11, last line 'step 7'>]
    """
    with contextlib.suppress(FileNotFoundError):
        return listing()
    return []
