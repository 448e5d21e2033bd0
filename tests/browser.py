"""What the browser tests share: the system Chromium, a loopback server, a browser context.

Chromium is Debian's (``apt-get install chromium``), driven through Playwright's Python
package; nothing is downloaded. Servers bind 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import kernelspec

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "notebook-accel-test"  # the test servers' token (they listen on loopback only)
# Each run writes its screenshots here (ignored by git); tests/artifacts/*.png are copies.
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


def jupyter_environ(tmp_path: Path, *extra: tuple[str, str]) -> dict[str, str]:
    """This process's environment for a Jupyter server: the tests' kernelspec, and Jupyter's
    config, runtime and data folders (and ``extra``'s, as (variable, folder) pairs) under
    ``tmp_path``, so that nothing of the machine's own Jupyter is read or written."""
    environ = dict(os.environ, **kernelspec.install(tmp_path / "jupyter"))
    folders = (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"))
    for name, folder in (*folders, ("JUPYTER_DATA_DIR", "data"), *extra):
        environ[name] = str(tmp_path / folder)
    return environ


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def serving(
    command: list[str],
    *,
    port: int,
    log: Path,
    env: dict[str, str],
    cwd: Path | None = None,
    wait: float = 60.0,
) -> Iterator[None]:
    """Run a server until the block ends: ready once ``port`` accepts connections.

    The test fails with the server's log if it exits first. At the end it is terminated
    (killed after 10 s) and the tail of its log is printed (pytest shows it on failure).
    """
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                if server.poll() is not None:
                    pytest.fail(f"{command[2]} exited: {log.read_text()}")
                time.sleep(0.2)
            yield
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    print(log.read_text()[-3000:])


@contextlib.contextmanager
def chromium_page(profile: Path, height: int = 900) -> Iterator[Any]:
    """A page of a headless Chromium (1100 px wide, a fresh profile); closed at the end.

    Skips the test without Playwright's Python package; makes the screenshots' folder.
    """
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs pip install playwright")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1100, "height": height},
        )
        try:
            yield context.new_page()
        finally:
            context.close()


@contextlib.contextmanager
def jupyterlab(tmp_path: Path, root: Path) -> Iterator[str]:
    """A Jupyter server (JupyterLab's and Notebook 7's pages) serving ``root`` on loopback,
    its folders under ``tmp_path``; yields its base URL. Skips without jupyterlab."""
    pytest.importorskip("jupyterlab", reason="needs jupyterlab: pip install jupyterlab")
    port = free_port()
    environ = jupyter_environ(
        tmp_path,
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
    )
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={TOKEN}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=",
        "--ServerApp.disable_check_xsrf=True",
        "--ServerApp.allow_root=True",
    ]
    with serving(command, port=port, log=tmp_path / "jupyter.log", env=environ):
        yield f"http://127.0.0.1:{port}"


_RUN_ALL_TRIES = 4


def run_all_lab(page: Any, url: str) -> None:
    """Open the notebook at ``url`` in JupyterLab and run all its cells once its kernel is
    idle."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(url, timeout=90_000)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
    # The kernel is ready when the toolbar's execution indicator says idle.
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
        timeout=90_000
    )
    # A click that lands while the page is still settling (the notebook not yet the current
    # widget) runs nothing: Run All again until a cell has started, none having started yet.
    started = page.locator(".jp-Notebook .jp-InputPrompt", has_text=re.compile(r"\[(\*|\d+)\]"))
    for _ in range(_RUN_ALL_TRIES):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            started.first.wait_for(timeout=15_000)
            return
        except PlaywrightTimeout:
            page.keyboard.press("Escape")  # a menu left open
    raise AssertionError(f"Run All Cells started no cell in {_RUN_ALL_TRIES} tries")


# A background job's cells, as the browser checks of each page run them: a session, a job
# whose second half waits for a gate file (GATE: its path), and a cell that opens the gate
# while the job's output keeps landing in the cell that submitted it.
BACKGROUND_SESSION = """\
import time
from pathlib import Path
from notebook_accel import Accelerator, Workers
w = Workers(num_processes=2, hardware="cpu")
"""
BACKGROUND_SUBMIT = """\
def train(steps, gate):
    accelerator = Accelerator()
    for step in range(steps):
        if step == steps // 2:
            while not Path(gate).exists():  # the next cell opens it
                time.sleep(0.01)
        print(f"job line {step}")
        accelerator.log({"loss": 1 / (step + 1)}, step=step)
        time.sleep(0.05)
    return step
job = w.submit(train, 20, GATE)
"""


def check_panel_results(page: Any) -> None:
    """The panel's launch of the notebooks' example function finished on both ranks."""
    results = page.locator(".notebook-accel-results")
    results.wait_for(timeout=120_000)
    assert "[3.0, 3.0]" in results.inner_text()
    ranks = page.locator(".notebook-accel-rank")
    assert ranks.count() == 2 and "finished" in ranks.nth(1).inner_text()
    assert "sum over ranks: 3.0" in page.locator(".notebook-accel-log").inner_text()


# A launch of transformers' Trainer (tests/tiny_models.py), as the browser checks of each page
# run it: its progress table is drawn in the launching cell (what a rank displays).
TRAINER_CELLS = [
    "import tqdm.auto\nfrom notebook_accel import notebook_launcher\n"
    "from tests.tiny_models import trainer_run",
    "losses = notebook_launcher(trainer_run, kwargs={'with_datasets': WITH_DATASETS},"
    " num_processes=2)\nprint('launch done', losses)",
]


def check_trainer_cell(cell: Any, outputs: str) -> Any:
    """The Trainer's launching cell in a page (``outputs``: its output area's selector), once
    the launch is done: the Trainer's table drawn once (rank 0's), updated in place to its
    four rows of losses and its bar at 8 of 8 steps, and nothing of the kernel's messages.
    Returns the table, scrolled into view for the screenshot."""
    cell.locator(outputs, has_text="launch done").last.wait_for(timeout=240_000)
    table = cell.locator(f"{outputs} table.dataframe")
    assert table.count() == 1, table.count()
    assert table.locator("tbody tr").count() == 4
    assert "Training Loss" in table.locator("thead").inner_text()
    progress = table.locator("xpath=preceding::progress[1]")
    assert progress.get_attribute("value") == "8", progress.get_attribute("value")
    text = cell.inner_text()
    assert "IPython.core.display" not in text and "message from fork" not in text
    table.scroll_into_view_if_needed()
    return table
