"""The tree stays lint-clean, formatted and type-checked (ruff and mypy, as configured)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "command",
    [
        ("ruff", "check", "notebook_accel", "tests", "benchmarks", "notebooks"),
        ("ruff", "format", "--check", "notebook_accel", "tests", "benchmarks", "notebooks"),
        ("mypy",),
    ],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tool_is_clean(command: tuple[str, ...]) -> None:
    tool = shutil.which(command[0], path=str(Path(sys.executable).parent))
    if tool is None:
        pytest.skip(f"{command[0]} is not installed (pip install -e '.[dev]')")
    done = _run(tool, *command[1:])
    assert done.returncode == 0, done.stdout + done.stderr
