"""The job's secret: what a machine proves to join a launch that spans several machines.

    NOTEBOOK_ACCEL_SECRET set      -> its value (set the same on every machine)
    else ~/.config/notebook_accel/secret ($XDG_CONFIG_HOME/notebook_accel/secret), mode 0600
        present -> its first line; a file other users could read is refused (chmod 600)
        absent  -> secrets.token_hex(32), written to a private temporary file in the same
                   folder and linked into place: of two machines on a shared home that create
                   it at once, one wins and both read the winner's

Machines without a shared home need the same value: copy the file from machine 0 (mode 0600),
or set the variable on each. The secret proves membership only (auth.py); it never
reaches the workers, which prove a key of their own launch instead.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from ... import env
from ...errors import ConfigError

__all__ = ["job_secret", "sharing_advice"]


def sharing_advice() -> str:
    """What a user does so that every machine has the same secret."""
    return (
        f"Every machine of the job needs the same secret: set {env.SECRET_VARIABLE} to the "
        f"same value on each, or copy {env.secret_file()} from machine 0 to the others "
        "(mode 0600)."
    )


def job_secret() -> bytes:
    """This machine's secret for launches of several machines (created on first use).

    Raises:
        ConfigError: the variable is empty, or the file is readable by other users or empty.

    Example:
        >>> len(job_secret()) >= 16  # doctest: +SKIP
        True
    """
    value = env.secret_value()
    if value is not None:
        if not value.strip():
            raise ConfigError(
                env.SECRET_VARIABLE, value, "a non-empty string, the same on every machine"
            )
        return value.strip().encode()
    path = env.secret_file()
    if not path.exists():
        _create(path)
    return _read(path)


def _create(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = _private_file(path.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(secrets.token_hex(32) + "\n")
            out.flush()
            os.fsync(out.fileno())
        # link() never replaces: the first machine to link wins, the others read its secret.
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.unlink(temporary)


def _private_file(folder: Path) -> tuple[int, str]:
    while True:
        name = folder / f".secret-{secrets.token_hex(8)}"
        with contextlib.suppress(FileExistsError):
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), str(name)


def _read(path: Path) -> bytes:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(
            str(path),
            f"mode {mode:04o}",
            "a file only its owner can read (mode 0600)",
            f"Other users could read the job's secret: run chmod 600 {path}.",
        )
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise ConfigError(str(path), "empty", "a file holding the job's secret")
    return text.splitlines()[0].strip().encode()
