"""The launcher inside a real Jupyter kernel (nbclient + ipykernel), as a user runs it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests import kernelspec

CELLS = [
    # 0: define the function in a cell (it can only travel by value)
    "import os, time\n"
    "from notebook_accel import notebook_launcher\n"
    "def train(n):\n"
    "    rank = int(os.environ['RANK'])\n"
    "    for i in range(n):\n"
    "        print(f'rank-says {rank} step {i:02d} ' + 'y' * 200)\n"
    "    return rank * 10",
    # 1: a launch: whole prefixed lines and the returned list
    "notebook_launcher(train, args=(20,), num_processes=2)",
    # 2: a failing rank: the original exception type in the cell
    "def bad():\n"
    "    if os.environ['RANK'] == '1':\n"
    "        raise KeyError('missing column')\n"
    "    time.sleep(60)\n"
    "notebook_launcher(bad, num_processes=2)",
    # 3: the stop button while workers run (nbclient interrupts this cell on its timeout)
    "notebook_launcher(lambda: time.sleep(120), num_processes=2)",
    # 4: after all that, the same kernel launches again and nothing was left behind
    "from tests.launch.helpers import worker_processes\n"
    "(notebook_launcher(lambda: 'ok', num_processes=2), len(worker_processes()))",
    # 5: a one-line error in a two-line function: the cell shows it, and no launcher frame
    "def two_lines():\n    return {}['missing']\nnotebook_launcher(two_lines, num_processes=2)",
]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _run_notebook() -> list[Any]:
    return kernelspec.run_cells(
        CELLS, timeout=lambda cell: 8 if "time.sleep(120)" in cell.source else 90
    )


@pytest.fixture(scope="module")
def cells() -> list[Any]:
    return _run_notebook()


def _stream_text(cell: Any, name: str = "stdout") -> str:
    return "".join(
        o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == name
    )


def _result(cell: Any) -> str:
    results = [o for o in cell.outputs if o["output_type"] == "execute_result"]
    assert results, cell.outputs
    return str(results[0]["data"]["text/plain"])


def test_cell_shows_whole_rank_prefixed_lines_and_returns_the_list(cells: list[Any]) -> None:
    text = _stream_text(cells[1])
    lines = text.splitlines()
    assert lines[0] == "Launching 2 processes on CPU (gloo)"
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        assert mine == [
            f"[rank {rank}] rank-says {rank} step {i:02d} " + "y" * 200 for i in range(20)
        ]
    assert _result(cells[1]) == "[0, 10]"


def test_error_cell_shows_the_original_exception(cells: list[Any]) -> None:
    errors = [o for o in cells[2].outputs if o["output_type"] == "error"]
    assert len(errors) == 1
    error = errors[0]
    assert error["ename"] == "KeyError"
    assert "missing column" in error["evalue"]
    trace = "\n".join(error["traceback"])
    assert "Traceback from rank 1" in trace
    assert "raise KeyError('missing column')" in trace
    assert "rank 1 of 2" in trace


def test_stop_button_then_the_kernel_launches_again(cells: list[Any]) -> None:
    errors = [o for o in cells[3].outputs if o["output_type"] == "error"]
    assert [e["ename"] for e in errors] == ["KeyboardInterrupt"]
    assert _result(cells[4]) == "(['ok', 'ok'], 0)"


def test_an_error_cell_shows_the_workers_traceback_and_the_cell_only(cells: list[Any]) -> None:
    errors = [o for o in cells[5].outputs if o["output_type"] == "error"]
    assert [e["ename"] for e in errors] == ["KeyError"]
    text = ANSI.sub("", "\n".join(errors[0]["traceback"]))
    # The worker's traceback, whole: the function's frame and its line.
    assert re.search(r"Traceback from rank [01]:", text), text
    assert "in two_lines" in text and "return {}['missing']" in text, text
    # Then the user's cell, and nothing of the launcher's insides.
    assert "notebook_launcher(two_lines, num_processes=2)" in text, text
    assert "notebook_accel" not in text.replace("[notebook_accel]", ""), text
    assert len(text) < 2500, (len(text), text)
