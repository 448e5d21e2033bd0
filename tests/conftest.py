"""Shared fixtures: isolate the config file, and check that launches leave nothing behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test reads and writes its own config file, never the user's."""
    path = tmp_path_factory.mktemp("config") / "config.json"
    old = os.environ.get("NOTEBOOK_ACCEL_CONFIG_FILE")
    os.environ["NOTEBOOK_ACCEL_CONFIG_FILE"] = str(path)
    yield
    if old is None:
        os.environ.pop("NOTEBOOK_ACCEL_CONFIG_FILE", None)
    else:
        os.environ["NOTEBOOK_ACCEL_CONFIG_FILE"] = old
