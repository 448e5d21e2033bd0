"""The live chart in a real browser: JupyterLab and the Notebook (7) page, headless Chromium.

A notebook whose function logs a loss every 0.25 s for half a minute is run from the page; the
chart (an image output, replaced in place) is captured twice during the launch, and the second
capture's line is longer: more pixels of the line's colour. Screenshots land in
tests/artifacts/tmp/ (copies from a run are committed as tests/artifacts/live_chart_*.png).
Needs Chromium (Debian's), ``jupyterlab``/``notebook`` and ``playwright``; skipped otherwise.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests import kernelspec
from tests.browser import ARTIFACTS, CHROMIUM, chromium_page, free_port, serving

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium"),
]

TOKEN = "notebook-accel-test"
TRAIN = """\
import time

from notebook_accel import Accelerator, notebook_launcher


def train(steps: int) -> float:
    accelerator = Accelerator()
    for step in range(steps):
        accelerator.log({"loss": 1.0 / (step + 1), "accuracy": step / steps}, step=step)
        time.sleep(0.25)
    accelerator.wait_for_everyone()
    return 1.0
"""
LAUNCH = 'notebook_launcher(train, args=(120,), num_processes=2)\nprint("launch done")'


_ROOTS: dict[str, Path] = {}


def jupyter_root(url: str) -> Path:
    """The folder a test server serves (to add notebooks to it)."""
    return _ROOTS[url]


@pytest.fixture
def jupyter(tmp_path: Path) -> Iterator[str]:
    """A Jupyter server (JupyterLab and Notebook 7 pages) on loopback; yields its base URL."""
    pytest.importorskip("jupyterlab", reason="needs jupyterlab: pip install jupyterlab")
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(TRAIN), nbformat.v4.new_code_cell(LAUNCH)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    root = tmp_path / "root"
    root.mkdir()
    nbformat.write(notebook, root / "live.ipynb")
    port = free_port()
    environ = dict(os.environ, **kernelspec.install(tmp_path / "jupyter"))
    for name, folder in (
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
    ):
        environ[name] = str(tmp_path / folder)
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
        url = f"http://127.0.0.1:{port}"
        _ROOTS[url] = root
        yield url


def _line_length(png: bytes) -> int:
    """How far the first plot's line reaches across the image, in pixels.

    The line is matplotlib's first colour; its leftmost and rightmost pixels in the left half
    (the first metric's plot) give its horizontal extent.
    """
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    blue = (0x1F, 0x77, 0xB4)
    columns = [
        x
        for x in range(width // 2)
        for y in range(height)
        if all(abs(a - b) < 40 for a, b in zip(image.getpixel((x, y)), blue, strict=True))
    ]
    return max(columns) - min(columns)


def _chart(page: Any) -> bytes:
    src = page.locator(".jp-OutputArea-output img").last.get_attribute("src")
    assert src and src.startswith("data:image/png;base64,"), src
    return base64.b64decode(src.split(",", 1)[1])


def _about(png: bytes) -> dict[str, Any]:
    """What the chart says it shows (rows, last step): a PNG text chunk."""
    from PIL import Image

    return dict(json.loads(Image.open(io.BytesIO(png)).text["Description"]))


def _chart_at(page: Any, low: int, high: int) -> bytes:
    """The chart in the page while its last step is between ``low`` and ``high``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        png = _chart(page)
        step = _about(png)["last_step"]
        if low <= step <= high:
            return png
        assert step < high, f"the chart went past step {high} before it was seen: {step}"
        time.sleep(0.05)
    raise AssertionError(f"the chart never reached step {low}: {_about(_chart(page))}")


@pytest.mark.parametrize("ui", ["lab", "notebooks"], ids=["jupyterlab", "notebook7"])
def test_chart_grows_during_a_launch(jupyter: str, tmp_path: Path, ui: str) -> None:
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib")
    url = f"{jupyter}/{'lab/tree' if ui == 'lab' else 'notebooks'}/live.ipynb?token={TOKEN}"
    with chromium_page(tmp_path / "profile") as page:
        try:
            page.goto(url, timeout=90_000)
            cells = page.locator(".jp-Notebook .jp-Cell")
            cells.nth(1).wait_for(timeout=90_000)
            # The kernel is ready when the toolbar's execution indicator says idle.
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
                timeout=90_000
            )
            time.sleep(1.0)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            page.locator(".jp-OutputArea-output img").last.wait_for(timeout=90_000)
            # Two moments on the same step axis (0 to 50; a step every 0.25 s): the line runs
            # further in the second.
            first = _chart_at(page, 21, 32)
            page.screenshot(path=str(ARTIFACTS / f"live_chart_{ui}_1.png"))
            second = _chart_at(page, 40, 50)
            page.screenshot(path=str(ARTIFACTS / f"live_chart_{ui}_2.png"))
            outputs = page.locator(".jp-Notebook .jp-OutputArea").last.inner_text()
            assert "launch done" not in outputs  # still running: the chart grew live
            assert _about(second)["rows"] > _about(first)["rows"]
            assert _line_length(second) > _line_length(first) * 1.3
            page.locator(".jp-OutputArea-output", has_text="launch done").wait_for(timeout=90_000)
        finally:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / f"live_chart_{ui}_end.png"))


def test_quickstart_lines_sit_under_their_bars(jupyter: str, tmp_path: Path) -> None:
    """JupyterLab showed all five ``[rank 0] epoch N: loss`` lines after all five bars."""
    quickstart = nbformat.read(kernelspec.NOTEBOOKS / "01_quickstart.ipynb", as_version=4)
    root = Path(jupyter_root(jupyter))
    nbformat.write(quickstart, root / "quickstart.ipynb")
    with chromium_page(tmp_path / "profile", height=1400) as page:
        try:
            page.goto(f"{jupyter}/lab/tree/quickstart.ipynb?token={TOKEN}", timeout=90_000)
            page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
                timeout=90_000
            )
            time.sleep(1.0)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            launch_cell = page.locator(".jp-Cell", has_text="losses = notebook_launcher")
            done = launch_cell.locator(".jp-OutputArea-output", has_text="rank 1 of 2 done")
            done.wait_for(timeout=120_000)
            time.sleep(1.0)
            text = launch_cell.locator(".jp-OutputArea").inner_text()
        finally:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "quickstart_lab.png"), full_page=True)
    # Each epoch's bar (its label "epoch N") comes before its line, and the line before the
    # next epoch's bar.
    order = []
    for line in text.splitlines():
        printed = re.match(r"\[rank 0\] epoch (\d+): loss", line.strip())
        # tqdm's notebook bar pads with figure spaces (U+2007)
        bar = re.match(r"epoch (\d+):\s*\d+%", line.replace("\u2007", " ").strip())
        if printed:
            order.append(f"line {printed.group(1)}")
        elif bar:
            order.append(f"bar {bar.group(1)}")
    expected = [f"{kind} {epoch}" for epoch in range(5) for kind in ("bar", "line")]
    assert order == expected, text
