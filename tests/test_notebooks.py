"""Every notebook in notebooks/ runs top to bottom on a real Jupyter kernel without an error."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from . import kernelspec

NOTEBOOKS = sorted(kernelspec.NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Select the test kernel spec for this module's kernels (durable sessions in a folder of
    their own: another checkout's tests may run a notebook of the same name meanwhile)."""
    durable = tmp_path_factory.mktemp("durable") / "sessions"
    old = os.environ.get("NOTEBOOK_ACCEL_DURABLE_DIR")
    os.environ["NOTEBOOK_ACCEL_DURABLE_DIR"] = str(durable)
    try:
        with kernelspec.selected(tmp_path_factory.mktemp("jupyter")):
            yield
    finally:
        if old is None:
            os.environ.pop("NOTEBOOK_ACCEL_DURABLE_DIR", None)
        else:
            os.environ["NOTEBOOK_ACCEL_DURABLE_DIR"] = old


def _execute(client: NotebookClient, notebook: nbformat.NotebookNode) -> None:
    """Top to bottom; before a cell tagged ``restart-kernel``, the kernel is killed and a
    fresh one started, as a user's Kernel > Restart does."""
    tagged = ["restart-kernel" in c.metadata.get("tags", []) for c in notebook.cells]
    if not any(tagged):
        client.execute()
        return
    from jupyter_core.utils import run_sync

    with client.setup_kernel():
        assert client.km is not None and client.kc is not None
        for index, (cell, restart) in enumerate(zip(notebook.cells, tagged, strict=True)):
            if restart:
                run_sync(client.km.restart_kernel)(now=True)
                run_sync(client.kc.wait_for_ready)(timeout=60)
            client.execute_cell(cell, index)


def test_notebooks_exist() -> None:
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_env: None) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=180,
        startup_timeout=60,
        resources={"metadata": {"path": str(path.parent)}},
    )
    started = time.monotonic()
    try:
        _execute(client, notebook)
    except CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}")
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert not errors, errors
    # Every launch printed its banner: the workers really ran.
    text = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream"
    )
    if "notebook_launcher(" in "".join(c.source for c in notebook.cells):
        assert "Launching 2 processes on CPU" in text, text[-2000:]
    if path.stem == "01_quickstart":
        # The workers' tqdm bars were drawn by the kernel as notebook widgets.
        widgets = [
            output
            for cell in notebook.cells
            if cell.cell_type == "code"
            for output in cell.outputs
            if "application/vnd.jupyter.widget-view+json" in output.get("data", {})
        ]
        assert len(widgets) >= 5, "one tqdm.notebook bar per epoch"
    if path.stem == "06_live_metrics":
        # The live chart of accelerator.log: one image output in the launching cell.
        images = [
            output
            for cell in notebook.cells
            if cell.cell_type == "code" and "notebook_launcher(" in cell.source
            for output in cell.outputs
            if "image/png" in output.get("data", {})
        ]
        assert len(images) == 1, "the chart is one image, updated in place"
        assert "[metrics]" not in text  # a notebook gets the chart, not the terminal's line
    if path.stem == "08_sessions":
        # The background job drew in the cell that submitted it: its lines (with how it
        # ended), its bar and its chart; the cell that ran meanwhile has none of them.
        submit, meanwhile = (
            next(c for c in notebook.cells if c.cell_type == "code" and c.source.startswith(s))
            for s in ("job = w.submit", "# meanwhile")
        )
        shown = [o["data"] for o in submit.outputs if o.output_type == "display_data"]
        assert "[notebook_accel] finished in" in shown[0]["text/plain"], shown
        assert "train: 100%" in shown[1]["text/plain"] and "image/png" in shown[2]
        assert "train" not in json.dumps(meanwhile.outputs)
        assert "kept for this session" in text and "[rank 0] rank 0: 16 batches" in text
    if path.stem == "09_trainer":
        # The Trainer's progress table, drawn by rank 0 in the launching cell, updated in
        # place: one table of the epochs' losses (and one of the final evaluation's metrics).
        launch = next(c for c in notebook.cells if "notebook_launcher(" in c.source)
        tables = [
            o["data"]["text/html"]
            for o in launch.outputs
            if "<table" in o.get("data", {}).get("text/html", "")
        ]
        assert len(tables) == 2 and "Training Loss" in tables[0], tables
        assert "message from fork" not in json.dumps(launch.outputs)
    if path.stem == "10_durable_sessions":
        # The kernel was restarted with the job running; the new kernel's attaching cell
        # drew the job's kept and live lines, and its result is the whole run's.
        attach = next(c for c in notebook.cells if "Workers.attach(" in c.source)
        drawn = json.dumps(attach.outputs)
        assert "[rank 0] step 0: total 0.0" in drawn and "step 50: total 2550.0" in drawn, drawn
        assert "train: 100%" in drawn  # the job's bar, drawn by the attaching kernel
        result = next(c for c in notebook.cells if c.source == "job.result()")
        assert result.outputs[0]["data"]["text/plain"] == "[3540.0, 3540.0]"
        assert notebook.cells[-1].outputs[-1]["data"]["text/plain"] == "[]"  # after close()
    print(f"{path.name}: {time.monotonic() - started:.1f} s")
