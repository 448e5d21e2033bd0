"""The live chart in a real browser: JupyterLab and the Notebook (7) page, headless Chromium;
and transformers' Trainer, launched from JupyterLab, drawing its progress table in the cell.

A notebook whose function logs a loss at every step is run from the page; the chart (an image
output, replaced in place) is captured twice during the launch, and the second capture's line
is longer: more pixels of the line's colour. Rank 0 pauses at each of the two steps until the
test has seen the chart there (a file the test writes), so a busy machine cannot run the chart
past the moment it is looked at. Screenshots land in
tests/artifacts/tmp/ (copies from a run are committed as tests/artifacts/live_chart_*.png).
Needs Chromium (Debian's), ``jupyterlab``/``notebook`` and ``playwright``; skipped otherwise.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests import kernelspec
from tests.browser import (
    ARTIFACTS,
    BACKGROUND_SESSION,
    BACKGROUND_SUBMIT,
    CHROMIUM,
    TOKEN,
    TRAINER_CELLS,
    check_trainer_cell,
    chromium_page,
    jupyterlab,
    run_all_lab,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium"),
]

TRAIN = """\
import os
import time

from notebook_accel import Accelerator, notebook_launcher


def train(steps: int, gate: str, pauses: tuple[int, ...]) -> float:
    accelerator = Accelerator()
    for step in range(steps):
        accelerator.log({"loss": 1.0 / (step + 1), "accuracy": step / steps}, step=step)
        if accelerator.is_main_process and step in pauses:
            # wait until the test has seen the chart at this step (it writes the file)
            while not os.path.exists(os.path.join(gate, f"seen_{step}")):
                time.sleep(0.05)
        time.sleep(0.05)
    accelerator.wait_for_everyone()
    return 1.0
"""
# Rank 0 stops at these steps until the page has shown the chart there.
PAUSES = (26, 46)
LAUNCH = (
    "notebook_launcher(train, args=(60, {gate!r}, {pauses!r}), num_processes=2)\n"
    'print("launch done")'
)


_ROOTS: dict[str, Path] = {}


def jupyter_root(url: str) -> Path:
    """The folder a test server serves (to add notebooks to it)."""
    return _ROOTS[url]


@pytest.fixture
def jupyter(tmp_path: Path) -> Iterator[str]:
    """A Jupyter server (JupyterLab and Notebook 7 pages) on loopback; yields its base URL."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "gate").mkdir()
    launch = LAUNCH.format(gate=str(root / "gate"), pauses=PAUSES)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(TRAIN), nbformat.v4.new_code_cell(launch)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(notebook, root / "live.ipynb")
    with jupyterlab(tmp_path, root) as url:
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


def _chart_at(page: Any, step: int) -> bytes:
    """The chart in the page once it shows ``step`` (rank 0 waits there for ``_release``)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        png = _chart(page)
        last = _about(png)["last_step"]
        if last == step:
            return png
        assert last < step, f"rank 0 did not wait at step {step}: the chart shows {last}"
        time.sleep(0.05)
    raise AssertionError(f"the chart never reached step {step}: {_about(_chart(page))}")


def _release(gate: Path, step: int) -> None:
    """Let rank 0 go on past ``step``."""
    (gate / f"seen_{step}").write_text("")


@pytest.mark.parametrize("ui", ["lab", "notebooks"], ids=["jupyterlab", "notebook7"])
def test_chart_grows_during_a_launch(jupyter: str, tmp_path: Path, ui: str) -> None:
    pytest.importorskip("matplotlib", reason="the chart needs matplotlib")
    url = f"{jupyter}/{'lab/tree' if ui == 'lab' else 'notebooks'}/live.ipynb?token={TOKEN}"
    gate = jupyter_root(jupyter) / "gate"
    with chromium_page(tmp_path / "profile") as page:
        try:
            run_all_lab(page, url)
            page.locator(".jp-OutputArea-output img").last.wait_for(timeout=90_000)
            # Two moments on the same step axis (0 to 50), rank 0 waiting at each until it is
            # seen: the line runs further in the second.
            first = _chart_at(page, PAUSES[0])
            page.screenshot(path=str(ARTIFACTS / f"live_chart_{ui}_1.png"))
            _release(gate, PAUSES[0])
            second = _chart_at(page, PAUSES[1])
            page.screenshot(path=str(ARTIFACTS / f"live_chart_{ui}_2.png"))
            outputs = page.locator(".jp-Notebook .jp-OutputArea").last.inner_text()
            assert "launch done" not in outputs  # still running: the chart grew live
            assert _about(second)["rows"] > _about(first)["rows"]
            assert _line_length(second) > _line_length(first) * 1.3
            _release(gate, PAUSES[1])
            page.locator(".jp-OutputArea-output", has_text="launch done").wait_for(timeout=90_000)
        finally:
            for step in PAUSES:  # a failed check must not leave rank 0 waiting
                _release(gate, step)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / f"live_chart_{ui}_end.png"))


def test_quickstart_lines_sit_under_their_bars(jupyter: str, tmp_path: Path) -> None:
    """JupyterLab showed all five ``[rank 0] epoch N: loss`` lines after all five bars."""
    quickstart = nbformat.read(kernelspec.NOTEBOOKS / "01_quickstart.ipynb", as_version=4)
    root = Path(jupyter_root(jupyter))
    nbformat.write(quickstart, root / "quickstart.ipynb")
    with chromium_page(tmp_path / "profile", height=1400) as page:
        try:
            run_all_lab(page, f"{jupyter}/lab/tree/quickstart.ipynb?token={TOKEN}")
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


MEANWHILE = 'print("meanwhile, another cell")\nPath(GATE).touch()'


def test_a_background_job_draws_in_its_own_cell_in_jupyterlab(jupyter: str, tmp_path: Path) -> None:
    """The job's lines keep arriving in the submitting cell after the next one ran and the
    kernel went idle (the kernel is killed with the server at the end, its workers with it)."""
    gate = repr(str(tmp_path / "gate"))
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(BACKGROUND_SESSION),
            nbformat.v4.new_code_cell(BACKGROUND_SUBMIT.replace("GATE", gate)),
            nbformat.v4.new_code_cell(MEANWHILE.replace("GATE", gate)),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(notebook, jupyter_root(jupyter) / "session.ipynb")
    with chromium_page(tmp_path / "profile", height=1400) as page:
        try:
            run_all_lab(page, f"{jupyter}/lab/tree/session.ipynb?token={TOKEN}")
            cells = page.locator(".jp-Notebook .jp-Cell")
            submitted = cells.nth(1).locator(".jp-OutputArea")
            submitted.locator(".jp-OutputArea-output", has_text="finished in").wait_for(
                timeout=120_000
            )
            text = submitted.inner_text()
            other = cells.nth(2).locator(".jp-OutputArea").inner_text()
            chart = cells.nth(1).locator(".jp-OutputArea-output img").count()
        finally:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "session_lab.png"), full_page=True)
    for rank in (0, 1):
        assert [f"job line {s}" for s in range(20)] == re.findall(
            rf"\[rank {rank}\] (job line \d+)", text
        ), text
    assert "meanwhile, another cell" in other and "job line" not in other
    assert chart == 1  # the live chart, in the submitting cell


@pytest.mark.skipif(find_spec("transformers") is None, reason="needs transformers")
def test_the_trainer_s_table_is_drawn_by_a_launch(jupyter: str, tmp_path: Path) -> None:
    """What a rank displays (show/rich.py) as JupyterLab draws it: the Trainer's table, rank
    0's, once, its final state (screenshot: trainer_lab.png)."""
    with_datasets = find_spec("datasets") is not None
    cells = [c.replace("WITH_DATASETS", str(with_datasets)) for c in TRAINER_CELLS]
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in cells],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(notebook, jupyter_root(jupyter) / "trainer.ipynb")
    with chromium_page(tmp_path / "profile", height=1200) as page:
        try:
            run_all_lab(page, f"{jupyter}/lab/tree/trainer.ipynb?token={TOKEN}")
            cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
            check_trainer_cell(cell, ".jp-OutputArea-output")
        finally:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "trainer_lab.png"), full_page=True)
