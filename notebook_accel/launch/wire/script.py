"""Run a Python script as the function of a launch (what ``notebook-accel launch`` sends).

``run_script`` lives in an importable module, so the payload pickles it by reference and
every worker imports it; only the script's path and arguments travel.
"""

from __future__ import annotations

import os
import runpy
import sys
import tempfile
from pathlib import Path

from ...errors import ConfigError

__all__ = ["checked_script", "run_script", "run_script_text"]


def checked_script(path: str) -> str:
    """The script's absolute path; workers may start in another folder, so it must be absolute.

    Raises:
        ConfigError: the file does not exist or is not a file (the message names ``script``).

    Example:
        >>> checked_script("train.py")  # doctest: +SKIP
        '/home/me/project/train.py'
    """
    full = Path(path).expanduser().resolve()
    if not full.is_file():
        what = "is a folder" if full.is_dir() else "does not exist"
        raise ConfigError("script", path, "the path of a Python script", f"{full} {what}.")
    return str(full)


def run_script(path: str, argv: list[str]) -> None:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *argv]``, as ``python path`` would.

    Example:
        >>> run_script("/home/me/train.py", ["--lr", "0.1"])  # doctest: +SKIP
    """
    sys.argv = [path, *argv]
    # `python script.py` puts the script's folder first on sys.path, so its sibling modules
    # import; do the same.
    folder = os.path.dirname(path)
    if folder not in sys.path[:1]:
        sys.path.insert(0, folder)
    runpy.run_path(path, run_name="__main__")


def run_script_text(path: str, text: str, argv: list[str]) -> None:
    """Run a script that travelled as text (a cluster's other machines may not have the file).

    Where ``path`` holds this very text (the launching machine, a shared disk) it runs from
    there, next to its sibling modules; elsewhere from a copy in a temporary folder.

    Example:
        >>> run_script_text("/home/me/train.py", "print('hi')", [])  # doctest: +SKIP
        hi
    """
    try:
        same = Path(path).read_text(encoding="utf-8") == text
    except OSError:
        same = False
    if same:
        run_script(path, argv)
        return
    with tempfile.TemporaryDirectory(prefix="notebook-accel-script-") as folder:
        copy = Path(folder) / Path(path).name
        copy.write_text(text, encoding="utf-8")
        run_script(str(copy), argv)
