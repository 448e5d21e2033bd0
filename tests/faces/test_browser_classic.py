"""Colab's widget protocol in a real page: the classic Notebook 6.5, widgetsnbextension 3.6 and
ipywidgets 7.7 (what Colab's page draws), headless Chromium.

The checks the JupyterLab tests make (tests/faces/test_browser.py,
tests/launch/show/test_browser_charts.py), in that page: the panel launches and shows its
results; a launch's tqdm bars move (seen part-way, rank 0 waiting there until the test has
seen them) and finish; its live chart draws; a background job's lines and chart land in the
cell that submitted it while another cell runs; transformers' Trainer, launched, draws its
progress table in the launching cell. Runs where those versions are installed (the matrix's
colab-page job, .ci/pins/colab-page.txt), skipped elsewhere with the reason. Screenshots:
tests/artifacts/tmp/classic_*.png (copies from a run: tests/artifacts/classic_*.png).
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.browser import (
    ARTIFACTS,
    BACKGROUND_SESSION,
    BACKGROUND_SUBMIT,
    CHROMIUM,
    TOKEN,
    TRAINER_CELLS,
    check_panel_results,
    check_trainer_cell,
    chromium_page,
    free_port,
    jupyter_environ,
    serving,
)


def _major(package: str) -> int | None:
    try:
        return int(metadata.version(package).split(".")[0])
    except metadata.PackageNotFoundError:
        return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium: apt-get install chromium"),
    pytest.mark.skipif(
        _major("notebook") != 6 or _major("ipywidgets") != 7,
        reason="needs the classic Notebook 6.5 with ipywidgets 7.7 (Colab's widget protocol): "
        "the matrix's colab-page job (.ci/pins/colab-page.txt)",
    ),
]


@pytest.fixture
def classic(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The classic Notebook server on loopback; yields its base URL and the folder it serves."""
    root = tmp_path / "root"
    (root / "gate").mkdir(parents=True)
    port = free_port()
    environ = jupyter_environ(tmp_path)
    environ["NOTEBOOK_ACCEL_PANEL_AUTORUN"] = "0"  # the page clicks Launch
    command = [
        sys.executable,
        "-m",
        "notebook",
        "--no-browser",
        f"--port={port}",
        "--NotebookApp.ip=127.0.0.1",
        f"--NotebookApp.token={TOKEN}",
        f"--NotebookApp.notebook_dir={root}",
        "--NotebookApp.disable_check_xsrf=True",
        "--allow-root",
    ]
    with serving(command, port=port, log=tmp_path / "notebook.log", env=environ):
        yield f"http://127.0.0.1:{port}", root


def _write(root: Path, name: str, cells: list[str]) -> None:
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in cells],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(notebook, root / name)


def _open_and_run_all(page: Any, url: str) -> None:
    """Open a notebook in the classic page, wait for its kernel, then Cell > Run All."""
    page.goto(url, timeout=90_000)
    page.locator("#notebook .cell").first.wait_for(timeout=90_000)
    page.locator("#kernel_indicator_icon.kernel_idle_icon").wait_for(
        state="attached", timeout=90_000
    )
    page.wait_for_function("Jupyter.notebook.kernel.is_connected()", timeout=90_000)
    page.locator("#celllink").click()
    page.locator("#run_all_cells").click()


def _cell(page: Any, index: int) -> Any:
    return page.locator("#notebook .cell").nth(index)


def _shot(page: Any, name: str) -> None:
    with contextlib.suppress(Exception):
        page.screenshot(path=str(ARTIFACTS / f"classic_{name}.png"), full_page=True)


PANEL = """\
import time
import torch
from notebook_accel import LaunchPanel, tqdm

def train(steps: int) -> float:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor(float(dist.get_rank() + 1))
    for _ in tqdm(range(steps), desc="steps"):
        time.sleep(0.01)
    dist.all_reduce(value)
    print(f"sum over ranks: {value.item()}")
    return value.item()

panel = LaunchPanel(train, args=(50,))
panel.processes.value = 2
panel
"""


def test_the_panel_launches_and_shows_its_results(classic: tuple[str, Path]) -> None:
    url, root = classic
    _write(root, "panel.ipynb", [PANEL])
    with chromium_page(root.parent / "profile", height=1200) as page:
        try:
            _open_and_run_all(page, f"{url}/notebooks/panel.ipynb?token={TOKEN}")
            launch = page.locator(".notebook-accel-panel button", has_text="Launch")
            launch.wait_for(timeout=120_000)
            assert "CPU" in page.locator(".notebook-accel-panel select").first.inner_text()
            launch.click()
            check_panel_results(page)
        finally:
            _shot(page, "panel")


LAUNCH = """\
import os, time
from notebook_accel import Accelerator, notebook_launcher, tqdm

def train(steps, gate, pause):
    accelerator = Accelerator()
    for step in tqdm(range(steps), desc="train"):
        accelerator.log({"loss": 1.0 / (step + 1)}, step=step)
        if accelerator.is_main_process and step == pause:
            while not os.path.exists(os.path.join(gate, "seen")):  # the test has looked
                time.sleep(0.05)
        time.sleep(0.02)
    return step

notebook_launcher(train, args=(40, GATE, 20), num_processes=2)
print("launch done")
"""


def _bar_text(cell: Any) -> str:
    # tqdm.notebook's bar: an HBox of an HTML label, a FloatProgress and an HTML meter
    return str(cell.locator(".widget-hprogress").first.locator("xpath=..").inner_text())


def _done(bar: str) -> int:
    """The steps a bar's text says are done ("train: 50% 20/40 [...]"), -1 without any."""
    found = re.search(r"(\d+)/40", bar)
    return int(found.group(1)) if found else -1


def test_the_bars_move_and_finish_and_the_chart_draws(classic: tuple[str, Path]) -> None:
    url, root = classic
    gate = root / "gate"
    _write(root, "launch.ipynb", [LAUNCH.replace("GATE", repr(str(gate)))])
    with chromium_page(root.parent / "profile", height=1400) as page:
        try:
            _open_and_run_all(page, f"{url}/notebooks/launch.ipynb?token={TOKEN}")
            cell = _cell(page, 0)
            bar = cell.locator(".widget-hprogress").first
            bar.wait_for(timeout=120_000)
            # part-way: rank 0 waits at step 20 of 40 (20 steps done) until the test writes
            # the gate; the bar shows the last state its rank sent, at most 20
            cell.locator(".output_area img").first.wait_for(timeout=120_000)  # the chart
            deadline = time.monotonic() + 120
            while True:  # until the text and the bar's width show one part-way state
                part_way = _bar_text(cell)
                width = bar.locator(".progress-bar").get_attribute("style") or ""
                done, shown = _done(part_way), re.search(r"width:\s*([\d.]+)%", width)
                agree = shown is not None and abs(float(shown.group(1)) - 100 * done / 40) < 1
                if (0 < done <= 20 and agree) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert 0 < done <= 20 and agree, (part_way, width)
            # the launch has not ended (the cell's source says "launch done" too: its output)
            assert cell.locator(".output_area", has_text="launch done").count() == 0
            _shot(page, "bars_part_way")
            (gate / "seen").write_text("")
            cell.locator(".output_area", has_text="launch done").wait_for(timeout=120_000)
            finished = _bar_text(cell)
            assert "40/40" in finished and "100%" in finished, finished
            src = cell.locator(".output_area img").first.get_attribute("src") or ""
            assert src.startswith("data:image/png;base64,"), src[:40]
        finally:
            (gate / "seen").write_text("")
            _shot(page, "bars_finished")


# the job's second half runs while this cell does: it opens the gate, then waits for the end
MEANWHILE = """\
print("meanwhile, another cell")
Path(GATE).touch()
while not job.done():
    time.sleep(0.05)
"""


def test_a_background_job_draws_in_its_own_cell_while_another_runs(
    classic: tuple[str, Path],
) -> None:
    url, root = classic
    gate = repr(str(root / "gate" / "open"))
    _write(
        root,
        "session.ipynb",
        [
            BACKGROUND_SESSION,
            BACKGROUND_SUBMIT.replace("GATE", gate),
            MEANWHILE.replace("GATE", gate),
            "job.result(timeout=120)\nw.close()",
        ],
    )
    with chromium_page(root.parent / "profile", height=1400) as page:
        try:
            _open_and_run_all(page, f"{url}/notebooks/session.ipynb?token={TOKEN}")
            submitted = _cell(page, 1).locator(".output_wrapper")
            submitted.locator(".output_area", has_text="finished in").wait_for(timeout=120_000)
            text = submitted.inner_text()
            other = _cell(page, 2).locator(".output_wrapper").inner_text()
            last = _cell(page, 3).locator(".output_wrapper").inner_text()
            chart = _cell(page, 1).locator(".output_area img").count()
        finally:
            _shot(page, "session")
    for rank in (0, 1):
        assert [f"job line {s}" for s in range(20)] == re.findall(
            rf"\[rank {rank}\] (job line \d+)", text
        ), text
    assert "meanwhile, another cell" in other and "job line" not in other
    assert "job line" not in last
    assert chart == 1  # the live chart, in the submitting cell


def test_the_trainer_s_table_is_drawn_by_a_launch(classic: tuple[str, Path]) -> None:
    url, root = classic
    with_datasets = find_spec("datasets") is not None
    _write(
        root,
        "trainer.ipynb",
        [c.replace("WITH_DATASETS", str(with_datasets)) for c in TRAINER_CELLS],
    )
    with chromium_page(root.parent / "profile", height=1400) as page:
        try:
            _open_and_run_all(page, f"{url}/notebooks/trainer.ipynb?token={TOKEN}")
            check_trainer_cell(_cell(page, 1), ".output_area")
        finally:
            _shot(page, "trainer")
