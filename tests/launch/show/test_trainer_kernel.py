"""transformers' Trainer and TRL's SFTTrainer (+ a PEFT LoRA) launched from a real kernel
(nbclient), as a Colab or Kaggle user runs them: ``tqdm.auto`` and ``datasets`` imported in the
notebook first, tiny models built from configs, a tokenizer built here, a synthetic dataset,
nothing from the network.

The launching cell shows the Trainer's progress table once, as one HTML output updated in place
(as when the Trainer runs in the kernel itself), no kernel message dumps, no display objects'
reprs, and stays small; the numbers are accelerate's ``notebook_launcher``'s, exactly, on the
same functions in the same kernel. A background job draws its Trainer table and a plot into the
cell that submitted it while another cell runs.
"""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from tests import kernelspec
from tests.browser import free_port

# (looked up, not imported: the kernel imports them, this process needs none of them)
_MISSING = [p for p in ("transformers", "trl", "peft", "accelerate") if find_spec(p) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)} (the dev extra)"),
]

_MAX_OUTPUT = 20_000  # bytes of the launching cell's outputs (json.dumps of them)

# What a notebook user has: tqdm.auto and datasets imported first (datasets' map bars are
# tqdm.auto's), then the launcher and the libraries, then the functions.
IMPORTS = """\
import json, os, time
os.environ["HF_HUB_OFFLINE"] = "1"
import tqdm.auto
import datasets
import torch
from notebook_accel import Workers, notebook_launcher
import transformers, trl, peft
from accelerate import notebook_launcher as accelerate_launcher
"""
# The trainers (tests/tiny_models.py: by reference, as a notebook's own module would travel),
# and a background job's function, defined in a cell (by value).
FUNCTIONS = """\
from tests.tiny_models import sft_run, trainer_run

def trainer_then_plot(folder, gate):
    import matplotlib.pyplot as plt
    plt.plot([3, 1, 2])
    plt.show()
    while not os.path.exists(gate):  # the next cell opens it
        time.sleep(0.01)
    return trainer_run(folder)
"""


def _cells(work: Path) -> dict[str, str]:
    def folder(name: str) -> str:
        return repr(str(work / name))

    port = free_port()
    return {
        "imports": IMPORTS,
        "functions": FUNCTIONS,
        "ours trainer": f"notebook_launcher(trainer_run, args=({folder('ours trainer')},), "
        "num_processes=2)",
        "ours sft": f"notebook_launcher(sft_run, args=({folder('ours sft')},), num_processes=2)",
        "accelerate trainer": f"accelerate_launcher(trainer_run, args=({folder('acc trainer')},),"
        f" num_processes=2, use_port={port})",
        "accelerate sft": f"accelerate_launcher(sft_run, args=({folder('acc sft')},),"
        f" num_processes=2, use_port={port})",
        "session": 'w = Workers(num_processes=2, hardware="cpu")',
        "submit": f"job = w.submit(trainer_then_plot, {folder('job')}, {folder('gate')})",
        "meanwhile": f"print('meanwhile', job.done())\nopen({folder('gate')}, 'w').close()",
        "result": "print(job.result(timeout=300))\nw.close()",
    }


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    work = tmp_path_factory.mktemp("trainer")
    cells = _cells(work)
    with kernelspec.selected(tmp_path_factory.mktemp("jupyter")):
        outputs = kernelspec.run_cells(list(cells.values()), timeout=lambda cell: 300)
    return dict(zip(cells, outputs, strict=True)), work


def _numbers(folder: Path) -> list[float]:
    return [json.loads((folder / str(rank)).read_text()) for rank in (0, 1)]


def _tables(cell: Any) -> list[dict[str, Any]]:
    return [
        o["data"]
        for o in cell.outputs
        if o["output_type"] == "display_data" and "<table" in o["data"].get("text/html", "")
    ]


def _clean(cell: Any) -> None:
    errors = [o for o in cell.outputs if o["output_type"] == "error"]
    assert not errors, errors
    text = json.dumps(cell.outputs)
    assert "attempted to send message from fork" not in text
    assert "comm_open" not in text and "comm_msg" not in text
    printed = "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    assert "<IPython.core.display" not in printed
    assert len(text) < _MAX_OUTPUT, len(text)


@pytest.mark.parametrize("run", ["trainer", "sft"])
def test_the_trainer_s_table_shows_once_updated_in_place(
    ran: tuple[dict[str, Any], Path], run: str
) -> None:
    cells, _ = ran
    cell = cells[f"ours {run}"]
    _clean(cell)
    [table] = _tables(cell)  # one table: rank 0's (rank 1's Trainer draws none)
    html = table["text/html"]
    # the final state: every step done, a row per logged loss (updated in place, never appended)
    assert "<progress value='8' max='8'" in html, html
    assert html.count("</tr>") == 1 + 4, html  # the header and a row each 2 of 8 steps
    assert "Training Loss" in html
    displays = [o for o in cell.outputs if o["output_type"] == "display_data"]
    widgets = [o for o in displays if "application/vnd.jupyter.widget-view+json" in o["data"]]
    assert all("0/64" in o["data"]["text/plain"] for o in widgets)  # datasets' map bars


@pytest.mark.parametrize("run", ["trainer", "sft"])
def test_the_numbers_are_accelerate_s(ran: tuple[dict[str, Any], Path], run: str) -> None:
    cells, work = ran
    ours = _numbers(work / f"ours {run}")
    theirs = _numbers(work / f"acc {run}")
    assert ours == theirs, (ours, theirs)
    assert ours[0] == ours[1] and ours[0] > 0


def test_a_background_job_draws_its_table_and_plot_in_its_cell(
    ran: tuple[dict[str, Any], Path],
) -> None:
    cells, work = ran
    submit = cells["submit"]
    displays = [o["data"] for o in submit.outputs if o["output_type"] == "display_data"]
    area = displays[3]["text/html"]  # the ranks' displays, made at submit
    assert area.count("<table") == 1 and "<progress value='8' max='8'" in area
    assert area.count("data:image/png;base64,iVBOR") == 2  # each rank's plot (output="all")
    assert "meanwhile False" in json.dumps(cells["meanwhile"].outputs)
    assert {o["output_type"] for o in cells["meanwhile"].outputs} == {"stream"}
    assert _numbers(work / "job") == _numbers(work / "ours trainer")
