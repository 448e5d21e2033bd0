"""Session latency: a kept session (Workers) beside a warm launch of ours and accelerate's.

Each figure comes from a fresh Python process that has already imported torch (as a notebook
kernel that did), 2 CPU processes, the same functions for every launcher:

    trivial      ``lambda: 1``; each launcher's median of 20 calls after a warm-up
    all-reduce   one all-reduce of one tensor (a launch: init_process_group first, as it must)
    submit       how long ``Workers.submit`` takes to return (median of 20)

each on a plain session and on a durable one (``durable=True``: the calls go through its
supervisor's socket), and on the durable one:

    attach       ``Workers.attach`` until the attached job's 10,000 kept lines (5,000 a rank,
                 printed before the attach) are all in ``job.output`` (median of 5)

and, in a real Jupyter kernel (jupyter_client, from execute_request to execute_reply):

    busy cell    a cell running a 10 ms busy Python loop, while a submitted job trains and
                 logs a metric every step (its chart drawn in the submitting cell); median,
                 95th percentile and worst of 60 such cells over ~6 s, and of 20 with no job
    %%distributed a cell with one all-reduce (median of 20)
    empty cell   ``pass``: the kernel's own request-to-reply time, the floor of both

A launcher without a session cannot run beside another cell: the kernel is blocked for the
whole launch, so the busy-cell row has no peer figure. Last, training in three cells (build;
50 steps; 50 more) is compared with one launch of 100 steps with the same seed.

    python benchmarks/session_latency.py          # needs `pip install accelerate`
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CALLS = 20
BUSY_CELLS = 60

_CHILD = """
import json, statistics, sys, time
import torch  # the notebook imported torch already
which, calls = sys.argv[1], int(sys.argv[2])

def trivial():
    return 1

def all_reduce():
    import torch, torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()

def timed(call):
    start = time.perf_counter()
    call()
    return time.perf_counter() - start

def median(call):
    call()  # warm
    return statistics.median(timed(call) for _ in range(calls))

def session_figures(w):
    out["trivial"] = median(lambda: w.run(trivial))
    out["all_reduce"] = median(lambda: w.run(all_reduce))
    submits = []
    for _ in range(calls):
        start = time.perf_counter()
        job = w.submit(trivial)
        submits.append(time.perf_counter() - start)
        job.result()
    out["submit"] = statistics.median(submits)

out = {}
if which == "session":
    from notebook_accel import Workers
    w = Workers(num_processes=2, hardware="cpu", output="none")
    session_figures(w)
    w.close()
elif which == "durable":
    import os, tempfile
    os.environ["NOTEBOOK_ACCEL_DURABLE_DIR"] = tempfile.mkdtemp()
    from notebook_accel import Workers
    w = Workers(num_processes=2, hardware="cpu", output="none", durable=True, name="bench")
    session_figures(w)

    def lines(gate):
        import time
        for i in range(5000):
            print(f"step {i}: loss 0.{i:04d}")
        while not gate.exists():
            time.sleep(0.01)

    from pathlib import Path
    gate = Path(tempfile.mkdtemp()) / "gate"
    job = w.submit(lines, gate)
    attaches = []
    for _ in range(5):
        start = time.perf_counter()
        attached = Workers.attach("bench")
        kept = attached.jobs[-1]
        while len(kept.output.splitlines()) < 10000:
            time.sleep(0.001)
        attaches.append(time.perf_counter() - start)
    out["attach"] = statistics.median(attaches)
    gate.touch()
    job.result()
    w.close()
elif which == "ours":
    from notebook_accel import notebook_launcher
    launch = lambda f: notebook_launcher(f, num_processes=2, hardware="cpu", output="none")
    out["trivial"] = median(lambda: launch(trivial))
    out["all_reduce"] = median(lambda: launch(all_reduce))
else:
    import socket
    from accelerate import notebook_launcher

    def port():  # a free one each time: 29500, its default, may be taken on a shared machine
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return str(s.getsockname()[1])

    out["trivial"] = median(lambda: notebook_launcher(trivial, num_processes=2, use_port=port()))
    out["all_reduce"] = median(
        lambda: notebook_launcher(all_reduce, num_processes=2, use_port=port())
    )
print(json.dumps(out))
"""

_JOB = """
import time
from notebook_accel import Workers
w = Workers(num_processes=2, hardware="cpu")
%load_ext notebook_accel
"""
_TRAIN = """
def train(gate):
    import os, time
    import torch
    from notebook_accel import Accelerator
    accelerator = Accelerator()
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    step = 0
    while True:
        done = torch.tensor([float(os.path.exists(gate))])
        torch.distributed.all_reduce(done)  # every rank leaves the loop at the same step
        if done.item():
            break
        loss = model(torch.randn(32, 64)).pow(2).mean()
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        accelerator.log({"loss": loss.item()}, step=step)
        step += 1
        time.sleep(0.005)
    return step
job = w.submit(train, GATE)
"""
_BUSY = """
end = time.perf_counter() + 0.010
while time.perf_counter() < end:
    pass
"""
_ALL_REDUCE = "%%distributed\nimport torch, torch.distributed as dist\nt = torch.ones(1)\n"
_ALL_REDUCE_RUN = _ALL_REDUCE + "dist.all_reduce(t)"


def _in_kernel() -> dict[str, Any]:
    from jupyter_client.manager import KernelManager

    from tests import kernelspec

    folder = Path(tempfile.mkdtemp())
    os.environ.update(kernelspec.install(folder))
    gate = folder / "stop"
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(ROOT))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)

        def cell(code: str) -> float:
            start = time.perf_counter()
            msg_id = client.execute(code)
            while True:
                reply = client.get_shell_msg(timeout=120)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            assert reply["content"]["status"] == "ok", reply["content"]
            return time.perf_counter() - start

        cell(_JOB)
        empty = [cell("pass") for _ in range(CALLS)]
        alone = [cell(_BUSY) for _ in range(CALLS)]
        cell(_ALL_REDUCE + "dist.init_process_group('gloo')")
        cell(_ALL_REDUCE_RUN)
        reduce = [cell(_ALL_REDUCE_RUN) for _ in range(CALLS)]
        cell(_TRAIN.replace("GATE", repr(str(gate))))
        time.sleep(3.0)  # the job is training and its chart is drawn
        beside = []
        for _ in range(BUSY_CELLS):  # over ~6 s: a dozen redraws of the job's chart
            beside.append(cell(_BUSY))
            time.sleep(0.08)
        gate.touch()
        cell("steps = job.result()\nw.close()")
        return {"empty": empty, "alone": alone, "beside": beside, "all_reduce": reduce}
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _equal_weights() -> bool:
    from notebook_accel import Workers, notebook_launcher

    def build() -> None:
        global model, optimizer
        import torch

        model = torch.nn.Linear(16, 16)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def train(steps: int) -> Any:
        import torch

        for _ in range(steps):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model.weight.detach().clone()

    launched = notebook_launcher(
        lambda: (build(), train(100))[1], num_processes=2, hardware="cpu", seed=3, output="none"
    )
    with Workers(num_processes=2, hardware="cpu", seed=3, output="none") as w:
        w.run(build)
        w.run(train, 50)
        kept = w.run(train, 50)
    return all(bool((a == b).all()) for a, b in zip(kept, launched, strict=True))


def _child(which: str) -> dict[str, float] | None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, which, str(CALLS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        print(f"{which} not measured:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def main() -> None:
    session, durable = _child("session"), _child("durable")
    ours, theirs = _child("ours"), _child("accelerate")
    kernel = _in_kernel()
    print(f"2 CPU processes; medians of {CALLS} (ms)")
    print(f"{'':34}{'session':>10}{'durable':>10}{'our launch':>12}{'accelerate':>12}  target")
    for key, label, target in (
        ("trivial", "run(lambda: 1)", "<= 5; durable <= 2x session"),
        ("all_reduce", "run(all-reduce)", ""),
        ("submit", "submit returns", "<= 5"),
    ):
        row = [(d or {}).get(key) for d in (session, durable, ours, theirs)]
        print(
            f"{label:34}{_ms(row[0]):>10}{_ms(row[1]):>10}{_ms(row[2]):>12}{_ms(row[3]):>12}"
            f"  {target}"
        )
    attach = (durable or {}).get("attach")
    print(f"{'attach, 10,000 lines kept':34}{'-':>10}{_ms(attach):>10}{'-':>12}{'-':>12}  <= 1000")
    alone, beside = kernel["alone"], kernel["beside"]
    print(f"{'empty cell (the kernel own)':34}{_ms(statistics.median(kernel['empty'])):>10}")
    print(
        f"{'10 ms busy cell, no job':34}{_ms(statistics.median(alone)):>10}{'':>10}"
        f"{'-':>12}{'-':>12}  (worst {_ms(max(alone))})"
    )
    p95 = statistics.quantiles(beside, n=20)[-1]
    print(
        f"{'10 ms busy cell, job training':34}{_ms(statistics.median(beside)):>10}{'':>10}"
        f"{'blocked':>12}{'blocked':>12}  <= 100 (95%: {_ms(p95)}, worst {_ms(max(beside))})"
    )
    reduce = statistics.median(kernel["all_reduce"])
    launch_reduce = [(d or {}).get("all_reduce") for d in (ours, theirs)]
    print(
        f"{'%%distributed all-reduce cell':34}{_ms(reduce):>10}{'':>10}{_ms(launch_reduce[0]):>12}"
        f"{_ms(launch_reduce[1]):>12}  <= 10"
    )
    print(f"three cells (build; 50; 50) = one launch of 100 steps, same seed: {_equal_weights()}")


if __name__ == "__main__":
    main()
