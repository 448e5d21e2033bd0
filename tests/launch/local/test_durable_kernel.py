"""A durable session outlives its kernel: two real Jupyter kernels, the first killed.

Kernel A opens the session, pushes a value and submits a job that prints 25 lines; lines 5-24
wait for a gate file the test opens (an event, not a moment). Once kernel A showed line 4, it
is killed (SIGKILL) or shut down politely; kernel B attaches by name while the job waits, sees
lines 0-4 (kept by the supervisor) then the live ones once the gate opens, gets the result and
the namespace, closes, and nothing of kernel A's process tree is left.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests import kernelspec

pytestmark = pytest.mark.slow

OPEN = """\
import os
from notebook_accel import Workers
w = Workers(num_processes=2, hardware="cpu", durable=True, name="exp1")
w.push(offset=100)
"""

SUBMIT = """\
def count(gate):
    import time
    from pathlib import Path
    for i in range(25):
        if i == 5:
            while not Path(gate).exists():  # the test opens it once kernel A is gone
                time.sleep(0.02)
        print(f"line {{i}}", flush=True)
        if i == 2:
            from IPython.display import display
            display({{"text/plain": f"job display {{os.environ['RANK']}}"}}, raw=True)
    return offset + int(os.environ["RANK"])
job = w.submit(count, {gate!r})
"""

ATTACH = """\
import json, os
from notebook_accel import Workers, sessions
print(json.dumps([(s.name, s.state, s.ranks) for s in sessions()]))
w = Workers.attach("exp1")
job = w.jobs[0]
print(job.where())
print("done", job.done())
%load_ext notebook_accel
"""

DISTRIBUTED = """%%distributed
import os
print("cell on rank", os.environ["RANK"], offset)
"""

RESULT = """\
print(json.dumps({"result": job.result(timeout=120), "offset": w.pull("offset"),
                  "pids": w.run(os.getpid), "output": job.output}))
"""

FAILS = """\
import traceback
def fails():
    return 1 / 0  # the line that fails
try:
    w.run(fails)
except ZeroDivisionError as error:
    print("".join(traceback.format_exception(error)))
"""

CLOSE = "w.close()\nprint(json.dumps(sessions()))"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with kernelspec.selected(tmp_path_factory.mktemp("jupyter")):
        yield


def _shows(text: str) -> object:
    def seen(message: dict) -> bool:  # type: ignore[type-arg]
        return message["msg_type"] == "update_display_data" and text in json.dumps(
            message["content"]
        )

    return seen


@pytest.mark.parametrize("ending", ["SIGKILL", "shutdown"])
def test_a_job_outlives_its_kernel_and_another_kernel_attaches(
    kernel_env: None, durable_folder: Path, tmp_path: Path, ending: str
) -> None:
    gate = tmp_path / "gate"
    a = kernelspec.Kernel()
    try:
        a.run(OPEN)
        a.run(SUBMIT.format(gate=str(gate)))
        a.until(_shows("[rank 1] line 4"))  # type: ignore[arg-type]
        pid = a.manager.provisioner.process.pid  # type: ignore[union-attr]
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        status = json.loads((durable_folder / "exp1" / "status.json").read_text())
        supervisor = psutil.Process(status["pid"])
        assert supervisor in tree  # started by kernel A, in a session of its own
        assert supervisor.ppid() == pid and os.getsid(supervisor.pid) == supervisor.pid
    finally:
        if ending == "SIGKILL":
            a.manager.provisioner.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            a.manager.provisioner.process.wait()  # type: ignore[union-attr]
        a.manager.shutdown_kernel(now=ending == "SIGKILL")
        a.client.stop_channels()
        a.manager.cleanup_resources()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    b = kernelspec.Kernel()
    try:
        attached = b.run(ATTACH)
        printed = b.printed(attached)
        listed, done = printed.splitlines()[0], printed.splitlines()[-1]
        assert json.loads(listed) == [["exp1", "running", 2]] and done == "done False"
        assert "where each rank is" in printed and "in count" in printed, printed
        gate.touch()
        outcome = json.loads(b.printed(b.run(RESULT)).splitlines()[-1])
        cell = b.printed(b.run(DISTRIBUTED))
        failed = b.printed(b.run(FAILS))
        closed = b.run(CLOSE)
        shown = [
            m
            for m in b.messages
            if m["msg_type"] == "update_display_data" and "line 24" in json.dumps(m["content"])
        ]
    finally:
        b.manager.shutdown_kernel(now=True)
        b.client.stop_channels()
        b.manager.cleanup_resources()
    assert outcome["result"] == [100, 101] and outcome["offset"] == [100, 100]
    lines = outcome["output"].splitlines()
    for rank in (0, 1):
        assert [line for line in lines if line.startswith(f"[rank {rank}]")] == [
            f"[rank {rank}] line {i}" for i in range(25)
        ]
    # the attaching cell drew the job: the kept lines, then the live ones
    assert shown, "kernel B's attaching cell never showed the live lines"
    drawn = shown[-1]["content"]["data"]["text/plain"]
    assert "[rank 0] line 0" in drawn and "[rank 1] line 24" in drawn
    displays = [json.dumps(m["content"]) for m in b.messages]
    displays = [content for content in displays if "job display" in content]
    assert "job display 0" in displays[-1] and "job display 1" in displays[-1]
    assert "[rank 0] cell on rank 0 100" in cell and "[rank 1] cell on rank 1 100" in cell
    assert json.loads(b.printed(closed).splitlines()[-1]) == []
    # a rank's traceback names the kernel's cell and shows its line (sent with the function)
    assert "return 1 / 0  # the line that fails" in failed, failed
    # the workers were the supervisor's (forked by its forkserver), all of kernel A's tree ends
    for worker in outcome["pids"]:
        assert worker in {p.pid for p in tree}
    gone, alive = psutil.wait_procs([p for p in tree if p.pid != pid], timeout=60)
    assert alive == []
