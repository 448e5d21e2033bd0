"""The panel as a page: Voilà serves the panel notebook, headless Chromium clicks Launch.

Needs the Debian packages ``chromium`` (and ``chromium-driver`` for Selenium users; this test
drives Chromium through Playwright's Python package with the system browser, nothing
downloaded) and the Python packages ``voila`` and ``playwright``. Skipped with the reason when
one is missing. The screenshot lands in tests/artifacts/tmp/panel.png (a copy from a run is
committed as tests/artifacts/panel.png).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import kernelspec
from tests.browser import (
    ARTIFACTS,
    CHROMIUM,
    check_panel_results,
    chromium_page,
    free_port,
    serving,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium"),
]


@pytest.fixture
def voila(tmp_path: Path) -> Iterator[str]:
    """Voilà serving the panel notebook on loopback; yields its URL."""
    pytest.importorskip("voila", reason="needs voila: pip install voila")
    port = free_port()
    environ = dict(os.environ, **kernelspec.install(tmp_path / "jupyter"))
    environ["NOTEBOOK_ACCEL_PANEL_AUTORUN"] = "0"  # the browser clicks Launch, not the cell
    environ["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")
    environ["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    environ["JUPYTER_DATA_DIR"] = str(tmp_path / "data")  # the signing key goes there
    command = [
        sys.executable,
        "-m",
        "voila",
        "04_launch_panel.ipynb",
        "--no-browser",
        f"--port={port}",
        "--Voila.ip=127.0.0.1",
        "--show_tracebacks=True",
    ]
    log = tmp_path / "voila.log"
    with serving(command, port=port, log=log, env=environ, cwd=kernelspec.NOTEBOOKS, wait=30):
        yield f"http://127.0.0.1:{port}/"


def test_panel_in_a_real_browser(voila: str, tmp_path: Path) -> None:
    with chromium_page(tmp_path / "profile") as page:
        try:
            page.goto(voila, timeout=60_000)
            launch = page.locator("button", has_text="Launch")
            launch.wait_for(timeout=90_000)
            # The controls render, with this machine's hardware and its bounds.
            hardware = page.locator(".notebook-accel-panel select").first
            assert "CPU" in hardware.inner_text()
            assert page.locator("button", has_text="Stop").is_disabled()
            launch.click()
            check_panel_results(page)
        finally:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "panel.png"), full_page=True)
