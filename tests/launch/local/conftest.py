"""Durable sessions' folder for a test: its own, in a folder every user may cross (0755), so
that an outsider's refusal is our folder's (0700), not its parents'."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def durable_folder() -> Iterator[Path]:
    parent = Path(tempfile.mkdtemp(prefix="na-durable-", dir="/tmp"))
    parent.chmod(0o755)
    folder = parent / "sessions"
    old = os.environ.get("NOTEBOOK_ACCEL_DURABLE_DIR")
    os.environ["NOTEBOOK_ACCEL_DURABLE_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if old is None:
            os.environ.pop("NOTEBOOK_ACCEL_DURABLE_DIR", None)
        else:
            os.environ["NOTEBOOK_ACCEL_DURABLE_DIR"] = old
        shutil.rmtree(parent, ignore_errors=True)
