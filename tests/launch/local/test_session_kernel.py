"""Sessions (Workers, %%distributed) in a real Jupyter kernel, cell after cell, as a user runs them.

One notebook runs top to bottom through nbclient (the module fixture); each test reads the
cells it is about. A second kernel, driven with jupyter_client, records every message of a
background job, and is then killed with its session open.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import kernelspec

pytestmark = pytest.mark.slow

SETUP = """\
import gc, json, os, time
from pathlib import Path
import torch
from notebook_accel import Workers, shared_cache_info
from tests.launch.helpers import listening_ports, worker_processes
ports_before = listening_ports()
w = Workers(num_processes=2, hardware="cpu")
%load_ext notebook_accel
"""

# Cells that ask for a gate wait on a file the test names, so that a job is still running
# while another cell runs (an event the notebook controls, not a moment in time).
CELLS = {
    "setup": SETUP,
    "build": "%%distributed\nimport os, torch\nrank = int(os.environ['RANK'])\ncounter = 0\n"
    "model = torch.nn.Linear(4, 2)",
    "kept": "%%distributed\ncounter += 1\nprint('counter', counter, type(model).__name__)",
    "ranks": "%%distributed w --ranks 1\nprint('only rank', rank)\ncounter * 10",
    "global": "model = 'the notebook has a str called model'\nscale = 3\n"
    "def uses_globals():\n"
    "    global seen\n"
    "    seen = (type(model).__name__, scale * rank)  # model: the workers'; scale: ours\n"
    "    return seen\n"
    "(w.run(uses_globals), w.pull('seen'))",
    "push_pull": "def mapped(t):\n"
    "    address = t.untyped_storage().data_ptr()\n"
    "    for line in open('/proc/self/maps'):\n"
    "        low, high = (int(x, 16) for x in line.split()[0].split('-'))\n"
    "        if low <= address < high:\n"
    "            return line.split()[-2] if len(line.split()) > 5 else ''\n"
    "X = torch.arange(64 << 20, dtype=torch.int32)  # 256 MiB\n"
    "copied = shared_cache_info().copied_bytes\n"
    "w.push(X=X)\n"
    "pushed = shared_cache_info().copied_bytes - copied\n"
    "seen = w.run(lambda: (mapped(X), X[-1].item(), X.nbytes))\n"
    "back = w.pull('X', rank=1)\n"
    "json.dumps({'pushed': pushed, 'seen': seen, 'equal': torch.equal(back, X),\n"
    "            'back': mapped(back)})",
    "fails": "def fails_on_rank_one():\n"
    "    if rank == 1:\n"
    "        raise ValueError('bad batch on rank 1')\n"
    "    return rank\n"
    "w.run(fails_on_rank_one)",
    "after_fail": "w.run(lambda: (counter, rank))",
    "interrupted": "def sleeps():\n"
    "    global interrupted\n"
    "    try:\n"
    "        time.sleep(120)\n"
    "    except KeyboardInterrupt:\n"
    "        interrupted = True\n"
    "        raise\n"
    "w.run(sleeps)",
    "after_interrupt": "(w.pull('interrupted'), w.run(lambda: counter), w.closed)",
    "killed": "def rank_one_dies():\n"
    "    if rank == 1:\n"
    "        os.kill(os.getpid(), 9)\n"
    "    time.sleep(60)\n"
    "w.run(rank_one_dies)",
    "restarted": "closed_after_death = w.closed\n"
    "w.restart()\n"
    "(closed_after_death, w.closed, w.run(lambda: 'counter' in globals()))",
    "submit": "def train(steps, gate):\n"
    "    from notebook_accel import Accelerator, tqdm\n"
    "    accelerator = Accelerator()\n"
    "    for step in tqdm(range(steps), desc='train'):\n"
    "        if step == steps // 2:\n"
    "            while not Path(gate).exists():  # the next cell opens it\n"
    "                time.sleep(0.01)\n"
    "        print(f'job line {step}')\n"
    "        accelerator.log({'loss': 1 / (step + 1)}, step=step)\n"
    "    from IPython.display import HTML, display  # the submitting cell has finished\n"
    "    display(HTML(f'<b>job display {accelerator.process_index}</b>'))\n"
    "    return accelerator.process_index\n"
    "job = w.submit(train, 20, GATE)\n"
    "job.done()",
    "meanwhile": "started = time.perf_counter()\n"
    "total = sum(range(200_000))\n"
    "print('meanwhile the kernel ran this cell; the job done:', job.done())\n"
    "Path(GATE).touch()",
    "result": "job.result(timeout=120)",
    "close": "w.close()\n"
    "del back  # the tensor pulled back maps the first session's results segment\n"
    "gc.collect()\n"
    "from notebook_accel import clear_shared_cache\n"
    "clear_shared_cache()\n"
    "fds = []\n"
    "for fd in os.listdir('/proc/self/fd'):\n"
    "    try:\n"
    "        fds.append(os.readlink(f'/proc/self/fd/{fd}'))\n"
    "    except OSError:\n"
    "        pass  # the listing's own fd, closed meanwhile\n"
    "json.dumps({'workers': len(worker_processes()),\n"
    "            'ports': sorted(listening_ports() - ports_before),\n"
    "            'segments': [f for f in fds if os.path.basename(f).removeprefix('memfd:')"
    ".startswith('notebook-accel-')]})",
}
NAMES = list(CELLS)


def _source(name: str, gate: Path) -> str:
    return CELLS[name].replace("GATE", repr(str(gate)))


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with kernelspec.selected(tmp_path_factory.mktemp("jupyter")):
        yield


@pytest.fixture(scope="module")
def cells(kernel_env: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    gate = tmp_path_factory.mktemp("gate") / "open"
    ran = kernelspec.run_cells(
        [_source(name, gate) for name in NAMES],
        # the stop button while the ranks sleep (nbclient interrupts the cell on its timeout)
        timeout=lambda cell: 8 if "time.sleep(120)" in cell.source else 180,
    )
    return dict(zip(NAMES, ran, strict=True))


def _text(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")


def _result(cell: Any) -> Any:
    results = [o for o in cell.outputs if o["output_type"] == "execute_result"]
    assert results, cell.outputs
    return results[0]["data"]["text/plain"]


def _error(cell: Any) -> Any:
    errors = [o for o in cell.outputs if o["output_type"] == "error"]
    assert len(errors) == 1, cell.outputs
    return errors[0]


def test_state_is_kept_across_cells(cells: dict[str, Any]) -> None:
    assert "kept for this session" in _text(cells["setup"])
    assert sorted(_text(cells["kept"]).splitlines()) == [
        "[rank 0] counter 1 Linear",
        "[rank 1] counter 1 Linear",
    ]


def test_distributed_names_its_session_and_ranks_and_shows_the_last_value(
    cells: dict[str, Any],
) -> None:
    assert _text(cells["ranks"]).splitlines() == ["[rank 1] only rank 1", "[rank 1] 10"]


def test_a_function_sees_the_workers_globals_and_brings_the_rest(cells: dict[str, Any]) -> None:
    values = [("Linear", 0), ("Linear", 3)]
    assert _result(cells["global"]) == repr((values, values))


def test_push_and_pull_a_256_mib_tensor_through_shared_memory(cells: dict[str, Any]) -> None:
    facts = json.loads(ast.literal_eval(_result(cells["push_pull"])))
    assert facts["pushed"] == 256 << 20  # one copy, for both workers
    for mapping, last, nbytes in facts["seen"]:
        # each worker's X is a view of the notebook's shared segment, not a pipe's copy
        assert "notebook-accel" in mapping and "data" in mapping, mapping
        assert (last, nbytes) == ((64 << 20) - 1, 256 << 20)
    assert facts["equal"]
    assert "notebook-accel" in facts["back"] and "results" in facts["back"], facts["back"]


def test_an_exception_on_rank_one_leaves_the_session_usable(cells: dict[str, Any]) -> None:
    error = _error(cells["fails"])
    assert error["ename"] == "ValueError" and "bad batch on rank 1" in error["evalue"]
    trace = "\n".join(error["traceback"])
    assert "Traceback from rank 1" in trace and "still usable" in trace
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", trace)
    assert "notebook_accel/launch" not in plain, plain  # the worker's frames and the cell
    assert _result(cells["after_fail"]) == "[(1, 0), (1, 1)]"


def test_an_interrupt_during_a_run_reaches_every_rank_and_keeps_the_session(
    cells: dict[str, Any],
) -> None:
    assert _error(cells["interrupted"])["ename"] == "KeyboardInterrupt"
    assert _result(cells["after_interrupt"]) == "([True, True], [1, 1], False)"


def test_a_sigkilled_worker_closes_the_session_and_restart_starts_fresh(
    cells: dict[str, Any],
) -> None:
    error = _error(cells["killed"])
    assert error["ename"] == "WorkerDiedError" and "rank 1 was killed by SIGKILL" in error["evalue"]
    assert "namespace is gone" in "\n".join(error["traceback"])
    assert _result(cells["restarted"]) == "(True, False, [False, False])"


def test_a_submitted_job_draws_in_its_own_cell_while_another_runs(cells: dict[str, Any]) -> None:
    submit, meanwhile = cells["submit"], cells["meanwhile"]
    assert _result(submit) == "False"  # submit returned while the job ran
    assert "the job done: False" in _text(meanwhile)
    # Every line of the job is in the submitting cell: those printed before the next cell
    # opened the gate and those after; none is in the cells that ran meanwhile.
    shown = [o for o in submit.outputs if o["output_type"] == "display_data"]
    lines = shown[0]["data"]["text/plain"].splitlines()
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] job line")]
        assert mine == [f"[rank {rank}] job line {step}" for step in range(20)]
    assert lines[-1].startswith("[notebook_accel] finished in")
    assert (
        "train: 100%" in shown[1]["data"]["text/plain"]
        and "20/20" in shown[1]["data"]["text/plain"]
    )
    assert "image/png" in shown[2]["data"]  # the live chart
    for rank in (0, 1):  # what the ranks displayed, in the display made at submit
        assert f"<b>job display {rank}</b>" in shown[3]["data"]["text/html"]
    for other in ("meanwhile", "result", "close"):
        assert "job line" not in json.dumps(cells[other].outputs)
        assert "job display" not in json.dumps(cells[other].outputs)
    assert _result(cells["result"]) == "[0, 1]"


def test_nothing_is_left_after_close(cells: dict[str, Any]) -> None:
    facts = json.loads(ast.literal_eval(_result(cells["close"])))
    assert facts == {"workers": 0, "ports": [], "segments": []}


# -- a kernel driven message by message ------------------------------------------------------


def test_a_background_job_s_messages_go_to_the_submitting_cell_and_a_killed_kernel_takes_the_workers(  # noqa: E501
    kernel_env: None, tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    kernel = kernelspec.Kernel()
    try:
        kernel.run(SETUP)
        submit = kernel.run(_source("submit", gate))
        meanwhile = kernel.run(_source("meanwhile", gate))
        result = kernel.run("print(job.result(timeout=120))\npids = w.run(os.getpid)\nprint(pids)")
    except BaseException:
        kernel.manager.shutdown_kernel(now=True)
        raise
    created = {
        m["content"]["transient"]["display_id"]
        for m in kernel.messages
        if m["msg_type"] == "display_data" and "display_id" in m["content"].get("transient", {})
    }
    job_messages = [
        m
        for m in kernel.messages
        if m["msg_type"] != "execute_input"
        and ("job line" in json.dumps(m["content"]) or "job display" in json.dumps(m["content"]))
    ]
    assert job_messages
    for message in job_messages:
        parent = message["parent_header"]["msg_id"]
        if message["msg_type"] == "update_display_data":
            # routed by the display id that the submitting cell created
            assert message["content"]["transient"]["display_id"] in created
        else:
            assert message["msg_type"] == "display_data" and parent == submit, message
    for message in kernel.messages:
        if message["msg_type"] == "display_data":
            assert message["parent_header"]["msg_id"] == submit, message  # nothing new elsewhere
        if message["msg_type"] == "stream" and message["parent_header"]["msg_id"] in (
            meanwhile,
            result,
        ):
            assert "job line" not in message["content"]["text"]
    last = [
        m
        for m in job_messages
        if m["msg_type"] == "update_display_data" and "job line" in json.dumps(m["content"])
    ][-1]
    lines = last["content"]["data"]["text/plain"].splitlines()
    assert sum(line.endswith("job line 19") for line in lines) == 2
    # what the ranks displayed: the display made at submit, updated whole (every rank's)
    shown = [json.dumps(m["content"]) for m in job_messages]
    shown = [content for content in shown if "job display" in content]
    assert "job display 0" in shown[-1] and "job display 1" in shown[-1]
    # The kernel dies with the session open: its workers go with it.
    printed = [
        m["content"]["text"]
        for m in kernel.messages
        if m["msg_type"] == "stream" and m["parent_header"]["msg_id"] == result
    ]
    pids = json.loads("".join(printed).splitlines()[-1])
    workers = [psutil.Process(pid) for pid in pids]
    os.kill(kernel.manager.provisioner.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
    gone, alive = psutil.wait_procs(workers, timeout=30)
    kernel.client.stop_channels()
    kernel.manager.cleanup_resources()
    assert alive == [], alive
