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
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import kernelspec

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Each run writes here (ignored by git); tests/artifacts/panel.png is a committed copy.
ARTIFACTS = Path(__file__).parent / "artifacts" / "tmp"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def voila(tmp_path: Path) -> Iterator[str]:
    """Voilà serving the panel notebook on loopback; yields its URL."""
    pytest.importorskip("voila", reason="needs voila: pip install voila")
    port = _free_port()
    environ = dict(os.environ, **kernelspec.install(tmp_path / "jupyter"))
    environ["NOTEBOOK_ACCEL_PANEL_AUTORUN"] = "0"  # the browser clicks Launch, not the cell
    environ["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")
    environ["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    environ["JUPYTER_DATA_DIR"] = str(tmp_path / "data")  # the signing key goes there
    log = (tmp_path / "voila.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voila",
            "04_launch_panel.ipynb",
            "--no-browser",
            f"--port={port}",
            "--Voila.ip=127.0.0.1",
            "--show_tracebacks=True",
        ],
        cwd=kernelspec.NOTEBOOKS,
        env=environ,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if server.poll() is not None:
                pytest.fail(f"voila exited: {(tmp_path / 'voila.log').read_text()}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        print((tmp_path / "voila.log").read_text()[-3000:])


def test_panel_in_a_real_browser(voila: str, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs pip install playwright")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1100, "height": 900},
        )
        try:
            page = context.new_page()
            page.goto(voila, timeout=60_000)
            launch = page.locator("button", has_text="Launch")
            launch.wait_for(timeout=90_000)
            # The controls render, with this machine's hardware and its bounds.
            hardware = page.locator(".notebook-accel-panel select").first
            assert "CPU" in hardware.inner_text()
            assert page.locator("button", has_text="Stop").is_disabled()
            launch.click()
            results = page.locator(".notebook-accel-results")
            results.wait_for(timeout=60_000)
            assert "[3.0, 3.0]" in results.inner_text()
            ranks = page.locator(".notebook-accel-rank")
            assert ranks.count() == 2 and "finished" in ranks.nth(1).inner_text()
            assert "sum over ranks: 3.0" in page.locator(".notebook-accel-log").inner_text()
        finally:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "panel.png"), full_page=True)
            context.close()
