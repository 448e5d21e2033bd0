"""Shared fixtures: isolate the config file and the job's secret, and check that launches
leave nothing behind."""

from __future__ import annotations

import os
import secrets
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


# One secret for the whole session, so that the "machines" a test starts (subprocesses that
# inherit the environment) agree, and no test creates ~/.config/notebook_accel/secret.
os.environ.setdefault("NOTEBOOK_ACCEL_SECRET", secrets.token_hex(16))
