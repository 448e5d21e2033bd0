"""The stall report in a real Jupyter kernel: a launch stopped with the stop button, a
session's background job (its report in the job's output, job.where(), job.stop()), a
%%distributed cell that runs out of time, and Workers.where() on idle workers.

Every hang prints a line first; the cells wait for the report itself (in the job's output),
never for a moment in time, except the stop button's: nbclient interrupts that cell after
its timeout, which leaves the report seconds to spare.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests import kernelspec

pytestmark = pytest.mark.slow

STALL = 3
CELLS = {
    "setup": "import time\n"
    "import torch.distributed as dist\n"
    "from notebook_accel import Workers, notebook_launcher\n"
    "notebook_launcher(lambda: None, num_processes=2)  # the forkserver warm\n"
    "def mismatched():\n"
    "    import torch\n"
    "    if not dist.is_initialized():\n"
    "        dist.init_process_group('gloo')\n"
    "    tensor = torch.ones(4)\n"
    "    print('ready', flush=True)\n"
    "    if dist.get_rank() == 0:\n"
    "        dist.all_reduce(tensor)\n"
    "    else:\n"
    "        dist.broadcast(tensor, 0)\n"
    "def spins():\n"
    "    if not dist.is_initialized():\n"
    "        dist.init_process_group('gloo')\n"
    "    print('ready', flush=True)\n"
    "    if dist.get_rank() == 1:\n"
    "        while True:\n"
    "            pass\n"
    "    dist.barrier()\n",
    # the stop button (nbclient interrupts it) on a stalled launch
    "stopped": f"notebook_launcher(mismatched, num_processes=2, stall_time={STALL})",
    # a background job: its report arrives in its output while this cell waits for it
    "job": f"w = Workers(num_processes=2, stall_time={STALL})\n"
    "job = w.submit(spins)\n"
    "while 'ready' not in job.output:\n"
    "    time.sleep(0.05)\n"
    "ready = time.monotonic()\n"
    "while 'no rank has made progress' not in job.output:\n"
    "    time.sleep(0.05)\n"
    "print('waited', time.monotonic() - ready)\n"
    "print(job.where())\n"
    "job.stop()",
    "job_result": "job.result()",
    # %%distributed: a timeout's error carries where each rank was
    "distributed": "w = Workers(num_processes=2, stall_time=None)\n%load_ext notebook_accel",
    "cell": "%%distributed --timeout 4\n"
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "t = torch.ones(2)\n"
    "dist.all_reduce(t) if dist.get_rank() == 0 else dist.broadcast(t, 0)",
    "idle": "w.close()\nw = Workers(num_processes=2)\nprint(w.where())\nw.close()",
}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(scope="module")
def cells() -> dict[str, Any]:
    ran = kernelspec.run_cells(
        list(CELLS.values()),
        timeout=lambda cell: (
            10 if "stall_time" in cell.source and "launcher(mismatched" in cell.source else 120
        ),
    )
    return dict(zip(CELLS, ran, strict=True))


def _stream(cell: Any) -> str:
    return "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream")


def _error(cell: Any) -> tuple[str, str]:
    [error] = [o for o in cell.outputs if o["output_type"] == "error"]
    return error["ename"], ANSI.sub("", "\n".join(error["traceback"]))


def test_the_stop_button_after_a_stall_report(cells: dict[str, Any]) -> None:
    text = _stream(cells["stopped"])
    assert "[notebook_accel] no rank has made progress for" in text, text
    diagnosis = (
        "rank 0 in all_reduce at Cell In[1], line 12; rank 1 in broadcast at line 14: the "
        "ranks wait in different collectives."
    )
    assert diagnosis in text, text
    assert 'File "Cell In[1]", line 12, in mismatched' in text, text
    name, trace = _error(cells["stopped"])
    assert name == "KeyboardInterrupt"
    assert "[notebook_accel] stopped; where each rank was:" in trace, trace
    assert diagnosis in trace


def test_a_background_jobs_report_where_and_stop(cells: dict[str, Any]) -> None:
    text = _stream(cells["job"])
    waited = float(re.search(r"waited ([\d.]+)", text).group(1))  # type: ignore[union-attr]
    assert waited <= STALL + 5, text
    # job.where(): the job goes on, and its ranks are where the report said
    assert "[notebook_accel] where each rank is (asked with where()):" in text, text
    assert "rank 1 has not reached the collective rank 0 waits in (barrier at Cell In[1], " in text
    assert re.search(r"it is at Cell In\[1\], line 2[01]", text), text
    assert "read from its signal handler" not in text, text  # both ranks' Python answered
    name, trace = _error(cells["job_result"])
    assert name == "KeyboardInterrupt"
    assert "[notebook_accel] stopped; where each rank was:" in trace, trace


def test_a_distributed_cell_that_runs_out_of_time_says_where(cells: dict[str, Any]) -> None:
    name, trace = _error(cells["cell"])
    assert name == "LaunchTimeoutError", trace
    assert "[notebook_accel] its timeout ran out; where each rank was:" in trace, trace
    assert re.search(
        r"rank 0 in all_reduce at <distributed cell \d+>, line 4; rank 1 in broadcast at "
        r"line 4: the ranks wait in different collectives\.",
        trace,
    ), trace


def test_idle_workers_are_idle(cells: dict[str, Any]) -> None:
    text = _stream(cells["idle"])
    assert "[notebook_accel] where each rank is (asked with where()):" in text, text
    assert text.count("idle, waiting for the next task") == 2, text
